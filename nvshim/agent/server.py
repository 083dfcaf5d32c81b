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
import errno
import os
import queue
import socket
import stat
import struct
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

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
#: How long a connection may stay silent before its request: the client sends it at once.
REQUEST_WAIT = 2.0
#: Connections held while their request has not arrived, at most (each is one fd).
MAX_WAITING = 256
BACKLOG = 1024


class SocketBusy(HostError):
    """Another agent serves the socket's path (or won the race to link it)."""


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
            raise SocketBusy(f"agent socket {path}: another agent is serving it")
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
        if exc.errno == errno.EEXIST:  # another agent linked it between the probe and here
            raise SocketBusy(f"agent socket {path}: another agent is serving it") from exc
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
        self._queue: "queue.SimpleQueue[socket.socket]" = queue.SimpleQueue()
        self._workers = 0
        self._idle = 0
        self._inflight = 0
        """Requests handed to the workers and not answered yet (queued or running)."""
        self._done = threading.Condition()
        self.serving = False
        self._busy_said = 0.0

    def serve(
        self,
        stop: threading.Event,
        wake_fd: Optional[int] = None,
        tick: Optional[Callable[[], object]] = None,
    ) -> None:
        """Accept until ``stop`` is set (``wake_fd`` readable wakes the loop at once: the
        signal handlers write to it); ``tick`` runs about once a second.

        A connection gets a worker only once its request has arrived: until then this loop
        holds it (at most :data:`MAX_WAITING`, each for :data:`REQUEST_WAIT` s), so peers
        that connect and say nothing never hold up accepting, reloading or stopping."""
        import selectors
        import time

        self.serving = True
        waiting: Dict[socket.socket, float] = {}  # connection -> when it must have asked
        ticked = time.monotonic()
        with selectors.DefaultSelector() as selector:
            selector.register(self.sock, selectors.EVENT_READ)
            if wake_fd is not None:
                selector.register(wake_fd, selectors.EVENT_READ)
            try:
                while not stop.is_set():
                    now = time.monotonic()
                    soonest = min(waiting.values(), default=now + 1.0)
                    events = selector.select(max(0.0, min(1.0, soonest - now)))
                    for key, _mask in events:
                        if key.fileobj is self.sock:
                            self._accept(selector, waiting)
                        elif key.fileobj == wake_fd:
                            with contextlib.suppress(BlockingIOError):
                                os.read(wake_fd, 512)
                        elif isinstance(key.fileobj, socket.socket):
                            conn = key.fileobj
                            selector.unregister(conn)
                            del waiting[conn]
                            self._dispatch(conn)
                    now = time.monotonic()
                    for conn in [c for c, deadline in waiting.items() if deadline <= now]:
                        selector.unregister(conn)  # silent too long: nothing to answer
                        del waiting[conn]
                        conn.close()
                    if tick is not None and now - ticked >= 1.0:
                        ticked = now
                        tick()
            finally:
                self.serving = False
                self.close()
                for conn in waiting:  # never asked: nothing in flight to finish
                    conn.close()
                self.drain()

    def _accept(self, selector: Any, waiting: Dict[socket.socket, float]) -> None:
        """Take one connection: to the workers at once when its request is already there
        (the client sends it right after connecting: no second turn of the loop), else
        into ``waiting`` (closed at once past :data:`MAX_WAITING`)."""
        import selectors
        import time

        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        try:
            conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)  # a message, its end, an error
        except (BlockingIOError, InterruptedError):
            pass  # not sent yet: the loop waits for it
        except OSError:
            self._dispatch(conn)  # the worker meets the error and says so, as from the loop
            return
        else:
            self._dispatch(conn)
            return
        if len(waiting) >= MAX_WAITING:
            self._busy(conn, "too many connections waiting for their request")
            return
        waiting[conn] = time.monotonic() + REQUEST_WAIT
        selector.register(conn, selectors.EVENT_READ)

    def _dispatch(self, conn: socket.socket) -> None:
        """``conn``, whose request has arrived, to the :data:`MAX_THREADS` workers (queued
        while they are busy: a burst of creates is served, not refused); closed at once when
        :data:`MAX_WAITING` more already wait (the client falls back to its own create)."""
        with self._done:
            if self._inflight >= MAX_THREADS + MAX_WAITING:
                full = True
            else:
                full = False
                self._inflight += 1
        if full:
            self._busy(conn, "every worker is busy and the queue is full")
            return
        with self._done:  # a worker more while none is idle for it, up to MAX_THREADS
            start = self._queue.qsize() >= self._idle and self._workers < MAX_THREADS
            if start:
                self._workers += 1
        if start:  # daemon threads: a request stuck past drain never holds the exit
            threading.Thread(target=self._work, daemon=True).start()
        self._queue.put(conn)

    def _work(self) -> None:
        """One worker: serve the queued connections, one at a time, for the agent's life."""
        while True:
            with self._done:
                self._idle += 1
            conn = self._queue.get()
            with self._done:
                self._idle -= 1
            self._serve_one(conn)

    def _busy(self, conn: socket.socket, why: str) -> None:
        """Close ``conn`` unanswered (its client falls back); said at most every 10 s."""
        import time

        conn.close()
        now = time.monotonic()
        if now - self._busy_said >= 10.0:
            self._busy_said = now
            self.log.warning(f"connection refused: {why}", workers=MAX_THREADS, waiting=MAX_WAITING)

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait up to ``timeout`` s for the requests in flight (a create is left to finish,
        not cut mid-way); True when none is left."""
        with self._done:
            return self._done.wait_for(lambda: self._inflight == 0, timeout)

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
            with self._done:
                self._inflight -= 1
                self._done.notify_all()


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


def ask(path: str, payload: bytes, fds: Optional[List[int]] = None, timeout: float = 10.0) -> bytes:
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
