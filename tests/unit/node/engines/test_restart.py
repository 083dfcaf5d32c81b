"""nvshim.node.engines.restart: who owns a socket, whether containerd answers, restart modes.

The restart of a real containerd (signal mode under a supervisor, a containerd that does not
come back) is pinned by tests/e2e/test_installer.py; these pin the parts around it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from nvshim.errors import HostError, UsageError
from nvshim.node.engines import restart as engine_restart


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[str]:
    """A unix socket this process listens on, that accepts and closes (not gRPC)."""
    path = str(tmp_path / "s.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path
    stop.set()
    thread.join()
    server.close()


@pytest.mark.parametrize(
    "name, expected",
    [
        ("SIGHUP", signal.SIGHUP),
        ("HUP", signal.SIGHUP),
        ("hup", signal.SIGHUP),
        ("SIGTERM", signal.SIGTERM),
        ("15", signal.SIGTERM),
        (" sigterm ", signal.SIGTERM),
    ],
)
def test_parse_signal_accepts_names_and_numbers(name: str, expected: signal.Signals) -> None:
    """A signal is given by name, with or without SIG, any case, or by number."""
    assert engine_restart.parse_signal(name) is expected


@pytest.mark.parametrize("name", ["SIGNOPE", "", "999", "-1"])
def test_parse_signal_refuses_unknown_ones_in_one_line(name: str) -> None:
    """An unknown signal is a usage error naming it."""
    with pytest.raises(UsageError, match=f'unknown signal "{name}"'):
        engine_restart.parse_signal(name)


def test_socket_owner_is_the_listening_process(listener: str) -> None:
    """The owner of a listening socket is the pid that listens (SO_PEERCRED)."""
    assert engine_restart.socket_owner(listener) == os.getpid()


def test_socket_owner_is_none_without_a_listener(tmp_path: Path) -> None:
    """No file, or a socket file left behind by a process that is gone: no owner."""
    assert engine_restart.socket_owner(str(tmp_path / "missing.sock")) is None
    stale = str(tmp_path / "stale.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(stale)
    dead.close()
    assert Path(stale).exists() and engine_restart.socket_owner(stale) is None


def test_answers_only_for_a_grpc_server(tmp_path: Path, listener: str) -> None:
    """A missing path, a regular file and a socket that speaks no gRPC do not answer."""
    (tmp_path / "file").write_text("")
    assert not engine_restart.answers(str(tmp_path / "missing.sock"), 0.5)
    assert not engine_restart.answers(str(tmp_path / "file"), 0.5)
    assert not engine_restart.answers(listener, 0.5)


def test_check_names_the_socket_that_does_not_answer(tmp_path: Path) -> None:
    """The pre-change check fails with one line naming the socket and the setting."""
    path = str(tmp_path / "c.sock")
    with pytest.raises(HostError) as info:
        engine_restart.check_answers(path, timeout=0.5)
    assert str(info.value) == (
        f"containerd does not answer on {path}: is it running, and is "
        "that its socket (NVSHIM_CONTAINERD_SOCKET, --socket)?"
    )


def test_mode_none_restarts_nothing(tmp_path: Path) -> None:
    """Mode none returns a line at once and waits for no socket."""
    line = engine_restart.restart_containerd("none", str(tmp_path / "none.sock"), timeout=0.5)
    assert line.startswith("did not restart containerd (restart mode none)")


def test_unknown_mode_is_a_usage_error() -> None:
    """A mode other than systemd, signal and none is refused by name."""
    with pytest.raises(UsageError, match='unknown restart mode "reboot"'):
        engine_restart.restart_containerd("reboot")


def test_signal_with_nothing_coming_back_names_the_socket(tmp_path: Path) -> None:
    """Signal mode with no process on the socket signals nobody, waits the timeout for a
    supervisor, then fails with one line naming the socket."""
    path = str(tmp_path / "gone.sock")
    with pytest.raises(HostError) as info:
        engine_restart.restart_containerd("signal", path, timeout=0.5)
    assert str(info.value) == (
        f"containerd did not answer on {path} within 0.5s after the restart "
        f"(nothing owned {path} to signal; waited for its supervisor)"
    )


@contextlib.contextmanager
def owner_of(path: Path, ignore_sighup: bool = False) -> Iterator["subprocess.Popen[bytes]"]:
    """A process listening on ``path`` (not gRPC), reaped as a supervisor would reap it,
    killed on the way out; ``ignore_sighup``: started as under nohup."""
    code = (
        "import signal, socket, sys, time\n"
        + ("signal.signal(signal.SIGHUP, signal.SIG_IGN)\n" if ignore_sighup else "")
        + "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(1)\n"
        "print('up', flush=True); time.sleep(60)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE)
    try:
        assert owner.stdout is not None and owner.stdout.readline() == b"up\n"
        reaper = threading.Thread(target=owner.wait, daemon=True)
        reaper.start()
        yield owner
        reaper.join(5)
    finally:
        owner.kill()
        owner.wait()


def test_signal_mode_signals_the_owner_and_waits_for_it_to_go(tmp_path: Path) -> None:
    """The socket's owner gets the signal; it must exit before an answer counts (this one
    is not gRPC, so the wait then times out naming the socket)."""
    path = tmp_path / "owner.sock"
    with owner_of(path) as owner:
        with pytest.raises(
            HostError,
            match=f"did not answer on {path} within 1s after the "
            rf"restart \(SIGTERM to pid {owner.pid}\)",
        ):
            engine_restart.restart_containerd("signal", str(path), signal_name="TERM", timeout=1)
    assert owner.returncode == -signal.SIGTERM


def test_an_owner_that_ignores_sighup_gets_sigterm(tmp_path: Path) -> None:
    """A containerd started under nohup ignores SIGHUP (Go keeps an inherited ignore): the
    restart sends SIGTERM instead, says so, and the process goes."""
    path = tmp_path / "nohup.sock"
    with owner_of(path, ignore_sighup=True) as owner:
        with pytest.raises(
            HostError,
            match=rf"\(SIGTERM to pid {owner.pid} \(it ignores "
            r"SIGHUP\)\)",
        ):
            engine_restart.restart_containerd("signal", str(path), timeout=1)
    assert owner.returncode == -signal.SIGTERM


def test_cli_check_is_one_line_and_exit_1(tmp_path: Path) -> None:
    """`nvshim runtime restart --check` on a socket nothing answers on: one line, exit 1."""
    path = str(tmp_path / "c.sock")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from nvshim.cli.main import main; main()",
            "runtime",
            "restart",
            "--check",
            "--socket",
            path,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert (
        done.stderr == f"nvshim: containerd does not answer on {path}: is it running, "
        "and is that its socket (NVSHIM_CONTAINERD_SOCKET, --socket)?\n"
    )
