"""A real ``nvshim agent`` process for tests: started on a socket in a tmp dir, stopped
by the test that started it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple, TypeVar

from tests.helpers.common import wait_until

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]


class RecordingLog:
    """A structlog-shaped logger that records its calls: ``lines`` of (level, event,
    fields)."""

    def __init__(self) -> None:
        self.lines: List[Tuple[str, str, Any]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.lines.append((level, event, kw))


def built_client(where: Path) -> Path:
    """The C client built from this checkout's source into ``where``; the test is
    skipped where there is no C compiler, and fails where client.c does not build."""
    import pytest

    from nvshim.agent.client import build_client, compiler_of

    if compiler_of() is None:
        pytest.skip("no C compiler (gcc, cc, $CC) to build the agent's client")
    return Path(build_client(str(where / "nvshim-agent-client")))


def nvshim_bin() -> List[str]:
    """``$NVSHIM_BIN``, else this checkout's ``nvshim`` run by this interpreter."""
    exe = os.environ.get("NVSHIM_BIN")
    return (
        [exe]
        if exe
        else [
            sys.executable,
            "-I",
            "-c",
            "import sys; sys.path.insert(0, sys.argv.pop(1)); "
            "from nvshim.cli.main import main; main()",
            str(REPO),
        ]
    )


class AgentProcess:
    def __init__(
        self,
        socket: Path,
        config: Optional[Path],
        log: Path,
        nri_socket: str = "none",
        env: Optional[dict] = None,
        prefix: Optional[List[str]] = None,
    ) -> None:
        """``prefix``: words before the command (``nsenter -t PID -m --``)."""
        self.socket, self.config, self.log = socket, config, log
        args = (
            list(prefix or [])
            + nvshim_bin()
            + ["agent", "--socket", str(socket), "--nri-socket", nri_socket]
        )
        if config is not None:
            args += ["--config", str(config)]
        self.args = args
        self.env = env
        self.proc: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> "AgentProcess":
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=self.env,
            )
        proc = self.proc
        wait_until(
            lambda: self.socket.exists() or proc.poll() is not None,
            60,
            f"the agent's socket {self.socket}",
        )
        assert self.proc.poll() is None, self.log.read_text()
        return self

    def start_registered(self, timeout: float = 30) -> "AgentProcess":
        """:meth:`start`, then wait until its log says it registered with the engine's NRI
        socket once more than before."""
        before = self.log.read_text().count("nri registered") if self.log.exists() else 0
        self.start()
        wait_until(
            lambda: self.log.read_text().count("nri registered") > before,
            timeout,
            "the agent's NRI registration",
        )
        return self

    def then_killed(self, served: T, fallback: T) -> Iterator[Tuple[str, T]]:
        """``("agent", served)`` while this agent runs; then SIGKILL it and ``("fallback",
        fallback)``: the two steps of a test that pins both paths."""
        yield "agent", served
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        yield "fallback", fallback

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@contextlib.contextmanager
def running_agent(
    tmp: Path, config: Optional[Path], name: str = "agent", nri_socket: str = "none"
) -> Iterator[AgentProcess]:
    agent = AgentProcess(tmp / f"{name}.sock", config, tmp / f"{name}.log", nri_socket)
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


def fake_agent(path: Path, reply: Optional[bytes]) -> Tuple[threading.Thread, List[Any]]:
    """A one-shot agent socket at ``path`` for the C client's tests: records (the request,
    the stat of each descriptor it got), answers ``reply`` (None: closes without
    answering)."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(str(path))
    srv.listen(1)
    seen: List[Any] = []

    def serve() -> None:
        conn, _ = srv.accept()
        data, anc, _, _ = conn.recvmsg(70000, socket.CMSG_SPACE(16))
        fds = [
            int.from_bytes(p[i : i + 4], sys.byteorder)
            for _, _, p in anc
            for i in range(0, len(p), 4)
        ]
        seen.append((data, [os.fstat(fd) for fd in fds]))
        for fd in fds:
            os.close(fd)
        if reply is not None:
            conn.send(reply)
        conn.close()
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t, seen
