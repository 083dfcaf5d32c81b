"""The agent's Unix socket: bound, peers checked (root only), one thread per request.

A ``SOCK_SEQPACKET`` socket (:mod:`nvshim.agent.protocol`): each request is one message
and may carry a descriptor. On stop the socket goes first (new creates run in-process),
then the requests in flight get up to 10 s to finish. The socket file is created mode 0600
in a 0755 directory and removed on stop when it is still the one this process bound. A
peer that is not uid 0 (``SO_PEERCRED``) is answered ``fallback`` and its request is not
parsed.
"""

from __future__ import annotations

import array
import contextlib
import os
import select
import socket
import stat
import struct
import threading
from typing import Any, Callable, List, Optional, Tuple

from nvshim.agent.protocol import (
    MAX_MESSAGE,
    ProtocolError,
    Request,
    encode_reply,
    parse_request,
)
from nvshim.errors import HostError

__all__ = ["AgentServer", "Peer", "Handler", "peer_of", "ask"]

#: Requests served at once; more wait in the listen backlog.
MAX_THREADS = 64
BACKLOG = 1024


class Peer:
    """Who is on the other end (``SO_PEERCRED``): pid 0 when not visible from here."""

    __slots__ = ("pid", "uid", "gid")

    def __init__(self, pid: int, uid: int, gid: int) -> None:
        self.pid, self.uid, self.gid = pid, uid, gid


#: (request, the descriptors it came with, the peer) -> (status, message)
Handler = Callable[[Request, List[int], Peer], Tuple[str, str]]


def peer_of(conn: socket.socket) -> Peer:
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid, uid, gid)


def _bind(path: str) -> Tuple[socket.socket, Optional[str]]:
    """A listening socket at ``path`` and the directory made for it (None: it was there);
    a stale socket file is replaced, a live one (another agent answering) or any other file
    is an error."""
    folder = os.path.dirname(path) or "."
    made = None if os.path.isdir(folder) else folder
    os.makedirs(folder, mode=0o755, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise HostError(f"agent socket {path} exists and is not a socket: remove it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # nobody listens: a socket a killed agent left
        else:
            raise HostError(f"agent socket {path}: another agent is serving it")
        finally:
            probe.close()
    # bound and listening under a temporary name, then linked into place: the path
    # appears only once it answers (a client that finds it never meets ECONNREFUSED, and
    # nothing changes its mode after it appeared)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    temp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}")
    old = os.umask(0o177)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)  # this pid's own leftover (a pid reused after a crash)
        sock.bind(temp)
        sock.listen(BACKLOG)
        os.link(temp, path)  # never replaces: an agent that won a start race keeps its path
        os.unlink(temp)
    except OSError as exc:
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise HostError(f"cannot bind agent socket {path}: {exc.strerror}") from exc
    finally:
        os.umask(old)
    return sock, made


class AgentServer:
    """Serve ``handler`` on ``path`` until :meth:`serve`'s stop event is set."""

    def __init__(self, path: str, handler: Handler, log: Any) -> None:
        self.path = path
        self.handler = handler
        self.log = log
        self.sock, self._made = _bind(path)
        self._ino = os.stat(path).st_ino
        self._slots = threading.BoundedSemaphore(MAX_THREADS)
        self.serving = False

    def serve(self, stop: threading.Event, wake_fd: Optional[int] = None,
              tick: Optional[Callable[[], object]] = None) -> None:
        """Accept until ``stop`` is set (``wake_fd`` readable wakes the loop at once: the
        signal handlers write to it); ``tick`` runs about once a second."""
        self.serving = True
        waits: List[Any] = [self.sock] + ([wake_fd] if wake_fd is not None else [])
        try:
            while not stop.is_set():
                ready, _, _ = select.select(waits, [], [], 1.0)
                if wake_fd is not None and wake_fd in ready:
                    try:
                        os.read(wake_fd, 512)
                    except BlockingIOError:
                        pass
                if tick is not None:
                    tick()
                if self.sock not in ready or stop.is_set():
                    continue
                try:
                    conn, _ = self.sock.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                self._slots.acquire()
                threading.Thread(target=self._serve_one, args=(conn,), daemon=True).start()
        finally:
            self.serving = False
            self.close()
            self.drain()

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait up to ``timeout`` s for the requests in flight (a create is left to finish,
        not cut mid-way); True when none is left."""
        import time

        deadline = time.monotonic() + timeout
        taken = 0
        try:
            while taken < MAX_THREADS:
                if not self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    return False
                taken += 1
            return True
        finally:
            for _ in range(taken):
                self._slots.release()

    def close(self) -> None:
        """Stop listening; remove the socket file when it is still ours, and the directory
        made for it when nothing else is in it."""
        self.sock.close()
        try:
            if os.lstat(self.path).st_ino == self._ino:
                os.unlink(self.path)
        except OSError:
            pass
        if self._made is not None:
            try:
                os.rmdir(self._made)
            except OSError:
                pass  # not empty (another process's files) or gone: left as it is

    def _serve_one(self, conn: socket.socket) -> None:
        fds: List[int] = []
        try:
            conn.settimeout(10.0)
            peer = peer_of(conn)
            data, fds = _receive(conn)  # taken off the socket either way: unread, the
            # peer's recv would see a reset instead of the reply
            if peer.uid != 0:
                self.log.warning("peer refused", pid=peer.pid, uid=peer.uid)
                conn.sendall(encode_reply("fallback", f"peer uid {peer.uid} is not root"))
                return
            try:
                request = parse_request(data, len(fds))
            except ProtocolError as exc:
                self.log.warning("bad request", pid=peer.pid, error=str(exc))
                conn.sendall(encode_reply("fallback", str(exc)))
                return
            status, message = self.handler(request, fds, peer)
            conn.sendall(encode_reply(status, message))
        except OSError as exc:
            self.log.warning("connection failed", error=str(exc))
        except Exception as exc:  # noqa: BLE001 - one line per failure, the agent keeps serving
            self.log.error("request failed", error=f"{type(exc).__name__}: {exc}")
            try:
                conn.sendall(encode_reply("fallback", f"internal error: {type(exc).__name__}"))
            except OSError:
                pass
        finally:
            for fd in fds:
                os.close(fd)
            conn.close()
            self._slots.release()


def _receive(conn: socket.socket) -> Tuple[bytes, List[int]]:
    """One message and the descriptors it carried (at most 4 are taken; all are closed
    by the caller)."""
    fds = array.array("i")
    data, ancdata, flags, _ = conn.recvmsg(MAX_MESSAGE + 1, socket.CMSG_SPACE(4 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    out = list(fds)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in out:
            os.close(fd)
        return b"", []  # parse_request says "not NUL-terminated"
    return data, out


def ask(path: str, payload: bytes, fds: Optional[List[int]] = None,
        timeout: float = 10.0) -> bytes:
    """Send one request to the agent at ``path``; its reply (for the CLI and tests)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        sock.sendmsg([payload], anc)
        return sock.recv(MAX_MESSAGE)
    finally:
        sock.close()
