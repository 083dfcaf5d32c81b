"""nvshim.agent.server's socket: it appears only once it answers, 0600, and never replaces
another agent's."""

from __future__ import annotations

import os
import socket
import stat
import tempfile
import threading
from pathlib import Path

import pytest

from nvshim.agent.server import _bind
from nvshim.errors import HostError


def test_the_socket_appears_listening_with_its_final_mode(tmp_path: Path) -> None:
    """Once the path exists a client connects (no window between bind and listen) and its
    mode is 0600 from the start; no temporary name is left beside it."""
    path = tmp_path / "run" / "agent.sock"
    sock, made = _bind(str(path))
    try:
        assert made == str(path.parent)
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        client.connect(str(path))
        client.close()
        assert os.listdir(path.parent) == ["agent.sock"]
    finally:
        sock.close()


def test_a_live_agent_keeps_its_socket_and_a_stale_one_is_replaced(tmp_path: Path) -> None:
    """A second agent on a served path is refused in one line; a socket nobody listens on
    (a killed agent's) is replaced."""
    path = str(tmp_path / "agent.sock")
    first, _ = _bind(path)
    try:
        with pytest.raises(HostError, match="another agent is serving it"):
            _bind(path)
        assert sorted(os.listdir(tmp_path)) == ["agent.sock"]
    finally:
        first.close()
    second, _ = _bind(path)  # first closed: its file is stale now
    second.close()


def test_a_client_that_finds_the_path_is_never_refused() -> None:
    """A client spinning until the path exists, then connecting at once, always connects:
    the path appears only after listen (bound at the path itself, about one start in five
    here met ECONNREFUSED, and the trampoline fell back to Python for it)."""
    refused = []
    for _ in range(100):
        folder = tempfile.mkdtemp(prefix="nvshim-agent-race-")
        path = os.path.join(folder, "agent.sock")

        def connect(path: str = path) -> None:
            while not os.path.exists(path):
                pass
            client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                client.connect(path)
            except OSError as exc:
                refused.append(exc.errno)
            finally:
                client.close()

        spinner = threading.Thread(target=connect, daemon=True)
        spinner.start()
        sock, _ = _bind(path)
        spinner.join(10)
        sock.close()
        os.unlink(path)
        os.rmdir(folder)
    assert refused == []
