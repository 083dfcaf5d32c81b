"""NRI's transport: a connection multiplexer carrying two ttrpc connections on one socket.

Multiplexer frame (NRI ``pkg/net/multiplex``): connection id (u32 big-endian), payload
length (u32 big-endian, at most :data:`MAX_FRAME`), payload. Connection
:data:`PLUGIN_CONN` carries the *Plugin* service, which the engine calls and this side
serves; :data:`RUNTIME_CONN` the *Runtime* service this side calls (RegisterPlugin). Each
connection is a byte stream: a ttrpc message may span frames, or share one. Frames this
side writes are at most :data:`WRITE_CHUNK` bytes, as the engine's reader needs.

ttrpc message: a 10-byte header (payload length u32 BE, stream id u32 BE, type u8: 1
request, 2 response; flags u8) and a protobuf payload of at most :data:`MAX_MESSAGE`:
``Request{service 1, method 2, payload 3, timeout_nano 4, metadata 5}`` and
``Response{status 1 (google.rpc.Status{code 1, message 2}), payload 2}``.

Requests are served one at a time, in their order, on the thread that reads the socket:
containerd and CRI-O take one lock around every NRI call, so a plugin never has two
requests of the engine in flight, and a hand-off to a worker thread would only add its
wake-up (and the GIL's) to every event.

Bad input never ends the session with a traceback: an oversized frame is skipped, a frame
for an unknown connection dropped, an oversized or undecodable ttrpc message answered with
an error status (when it was a request) and skipped, each with one log line. Only a
socket error or a stream that cannot be resynchronised ends the session (the caller
reconnects).
"""

from __future__ import annotations

import socket
import struct
import threading
from typing import Any, Callable, Dict, Tuple

from nvshim._protobuf import (
    WireError,
    by_number,
    bytes_field,
    message_field,
    messages,
    read_int,
    read_string,
    string_field,
    varint_field,
)

__all__ = [
    "MAX_FRAME",
    "MAX_MESSAGE",
    "PLUGIN_CONN",
    "RUNTIME_CONN",
    "RpcError",
    "Session",
    "frame",
    "ttrpc_message",
    "encode_request",
    "decode_request",
    "encode_response",
    "decode_response",
    "peer_uid",
]

MAX_FRAME = 16 << 20
MAX_MESSAGE = 4 << 20
#: The largest frame this side writes. NRI's multiplexer hands each frame to one ``Read``
#: of the connection and fails it with ENOMEM when the reader's buffer is smaller: Go
#: ttrpc reads through a 4096-byte ``bufio.Reader`` (and writes frames of at most that).
WRITE_CHUNK = 4096
#: The most one read takes: under the allocator's mmap threshold (a 1 MiB buffer was an
#: mmap and an munmap or mremap per read), over the engine's largest frame.
READ_CHUNK = 64 << 10
PLUGIN_CONN = 1
RUNTIME_CONN = 2
REQUEST, RESPONSE = 1, 2
_MUX = struct.Struct(">II")
_TTRPC = struct.Struct(">IIBB")
#: google.rpc codes used in replies
UNKNOWN, INVALID_ARGUMENT, UNIMPLEMENTED, RESOURCE_EXHAUSTED = 2, 3, 12, 8


class RpcError(Exception):
    """An error reply: ``code`` (google.rpc) and the one-line message the engine shows."""

    def __init__(self, message: str, code: int = UNKNOWN) -> None:
        super().__init__(message)
        self.code = code


def frame(conn: int, payload: bytes) -> bytes:
    """One multiplexer frame."""
    return _MUX.pack(conn, len(payload)) + payload


def ttrpc_message(stream: int, kind: int, payload: bytes) -> bytes:
    return _TTRPC.pack(len(payload), stream, kind, 0) + payload


def encode_request(service: str, method: str, payload: bytes, timeout_ns: int = 0) -> bytes:
    return (
        string_field(1, service)
        + string_field(2, method)
        + bytes_field(3, payload)
        + varint_field(4, timeout_ns)
    )


def decode_request(data: bytes) -> Tuple[str, str, bytes]:
    v = by_number(data)
    raw = v.get(3)
    payload = raw[-1] if raw else b""
    if not isinstance(payload, bytes):
        raise WireError("request payload is not bytes")
    return read_string(v, 1), read_string(v, 2), payload


def encode_response(payload: bytes = b"", code: int = 0, message: str = "") -> bytes:
    out = b""
    if code:
        out += message_field(1, varint_field(1, code) + string_field(2, message))
    return out + bytes_field(2, payload)


def decode_response(data: bytes) -> Tuple[int, str, bytes]:
    """(status code, status message, payload)."""
    v = by_number(data)
    code, message = 0, ""
    for status in messages(v, 1):
        sv = by_number(status)
        code, message = read_int(sv, 1), read_string(sv, 2)
    raw = v.get(2)
    payload = raw[-1] if raw else b""
    if not isinstance(payload, bytes):
        raise WireError("response payload is not bytes")
    return code, message, payload


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of the unix socket ``sock``."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[2])


Handler = Callable[[str, bytes], bytes]
"""(method, request payload) → reply payload; raises :class:`RpcError` for an error reply."""


class Session:
    """One connected NRI socket: serves the Plugin service with ``handler`` (on the thread
    that runs :meth:`run`, one request at a time: see the module docstring), calls the
    Runtime service with :meth:`call` (from another thread). :meth:`run` reads until the
    socket closes (:meth:`close` included) or, at its next read, ``stop`` is set."""

    def __init__(self, sock: socket.socket, handler: Handler, log: Any) -> None:
        self.sock = sock
        self.handler = handler
        self.log = log
        self._write = threading.Lock()
        self._buffers: Dict[int, bytearray] = {PLUGIN_CONN: bytearray(), RUNTIME_CONN: bytearray()}
        self._skip: Dict[int, int] = {PLUGIN_CONN: 0, RUNTIME_CONN: 0}
        self._next_stream = 1
        self._waiting: Dict[int, Tuple[threading.Event, list]] = {}  # type: ignore[type-arg]
        self._calls = threading.Lock()
        self.closed = threading.Event()

    # --- writing ---------------------------------------------------------------------

    def send(self, conn: int, stream: int, kind: int, payload: bytes) -> None:
        message = ttrpc_message(stream, kind, payload)
        data = b"".join(
            frame(conn, message[i : i + WRITE_CHUNK]) for i in range(0, len(message), WRITE_CHUNK)
        )
        with self._write:
            self.sock.sendall(data)

    def call(self, service: str, method: str, payload: bytes, timeout: float = 5.0) -> bytes:
        """Call ``service.method`` on the engine (connection 2); RpcError on an error
        status, TimeoutError when no reply comes."""
        with self._calls:
            stream = self._next_stream
            self._next_stream += 2  # a client's streams are odd
            done = threading.Event()
            slot: list = []  # type: ignore[type-arg]
            self._waiting[stream] = (done, slot)
        self.send(
            RUNTIME_CONN,
            stream,
            REQUEST,
            encode_request(service, method, payload, int(timeout * 1e9)),
        )
        if not done.wait(timeout):
            with self._calls:
                self._waiting.pop(stream, None)
            raise TimeoutError(f"no reply to {method} within {timeout:g} s")
        code, message, reply = slot[0]
        if code:
            raise RpcError(message, code)
        return bytes(reply)

    # --- reading ---------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Read frames until EOF (:meth:`close` shuts the socket down), a socket error or,
        seen after a read, ``stop``; then close. The reads block (no timeout: a socket
        with one polls before every read and every write)."""
        self.sock.settimeout(None)
        pending = bytearray()
        try:
            while not stop.is_set():
                chunk = self.sock.recv(READ_CHUNK)
                if not chunk:
                    if not stop.is_set():
                        self.log.info("nri connection closed by the engine")
                    return
                pending += chunk
                self._frames(pending)
        except OSError as exc:
            if not stop.is_set():
                self.log.warning("nri connection lost", error=exc.strerror or str(exc))
        finally:
            self.closed.set()
            with self._calls:
                for done, slot in self._waiting.values():
                    slot.append((UNKNOWN, "connection closed", b""))
                    done.set()
                self._waiting.clear()
            try:
                self.sock.close()
            except OSError:
                pass

    def _frames(self, pending: bytearray) -> None:
        """Consume every whole frame (or the part of an oversized one) in ``pending``."""
        while True:
            conn = None
            if self._oversized:
                take = min(self._oversized, len(pending))
                del pending[:take]
                self._oversized -= take
                if self._oversized:
                    return
            if len(pending) < _MUX.size:
                return
            conn, size = _MUX.unpack_from(pending)
            if size > MAX_FRAME:
                self.log.warning(
                    "nri frame dropped",
                    conn=conn,
                    length=size,
                    reason=f"longer than {MAX_FRAME} bytes",
                )
                del pending[: _MUX.size]
                self._oversized = size
                continue
            if len(pending) < _MUX.size + size:
                return
            payload = bytes(pending[_MUX.size : _MUX.size + size])
            del pending[: _MUX.size + size]
            if conn not in self._buffers:
                self.log.warning(
                    "nri frame dropped", conn=conn, length=size, reason="unknown connection id"
                )
                continue
            self._buffers[conn] += payload
            self._messages(conn)

    _oversized = 0

    def _messages(self, conn: int) -> None:
        buf = self._buffers[conn]
        while True:
            if self._skip[conn]:
                take = min(self._skip[conn], len(buf))
                del buf[:take]
                self._skip[conn] -= take
                if self._skip[conn]:
                    return
            if len(buf) < _TTRPC.size:
                return
            size, stream, kind, _flags = _TTRPC.unpack_from(buf)
            if size > MAX_MESSAGE:
                self.log.warning(
                    "nri message dropped",
                    conn=conn,
                    stream=stream,
                    length=size,
                    reason=f"longer than {MAX_MESSAGE} bytes",
                )
                del buf[: _TTRPC.size]
                self._skip[conn] = size
                if conn == PLUGIN_CONN and kind == REQUEST:
                    self._reply_error(
                        stream, RESOURCE_EXHAUSTED, f"message of {size} bytes is over {MAX_MESSAGE}"
                    )
                continue
            if len(buf) < _TTRPC.size + size:
                return
            payload = bytes(buf[_TTRPC.size : _TTRPC.size + size])
            del buf[: _TTRPC.size + size]
            if conn == PLUGIN_CONN and kind == REQUEST:
                self._serve(stream, payload)
            elif conn == RUNTIME_CONN and kind == RESPONSE:
                self._answered(stream, payload)
            else:
                self.log.warning(
                    "nri message dropped",
                    conn=conn,
                    stream=stream,
                    type=kind,
                    reason="unexpected message type",
                )

    def _answered(self, stream: int, payload: bytes) -> None:
        try:
            result = decode_response(payload)
        except WireError as exc:
            result = (UNKNOWN, f"undecodable response: {exc}", b"")
        with self._calls:
            waiting = self._waiting.pop(stream, None)
        if waiting is None:
            self.log.warning("nri response dropped", stream=stream, reason="no such call")
            return
        waiting[1].append(result)
        waiting[0].set()

    def _reply_error(self, stream: int, code: int, message: str) -> None:
        try:
            self.send(PLUGIN_CONN, stream, RESPONSE, encode_response(code=code, message=message))
        except OSError as exc:
            self.log.warning("nri reply not sent", stream=stream, error=str(exc))

    def _serve(self, stream: int, payload: bytes) -> None:
        method = "?"
        try:
            service, method, body = decode_request(payload)
            if service != "nri.pkg.api.v1alpha1.Plugin":
                raise RpcError(f"unknown service {service!r}", UNIMPLEMENTED)
            reply = encode_response(self.handler(method, body))
        except RpcError as exc:
            reply = encode_response(code=exc.code, message=str(exc))
        except WireError as exc:
            self.log.warning("nri request refused", method=method, reason=str(exc))
            reply = encode_response(code=INVALID_ARGUMENT, message=f"bad message: {exc}")
        except Exception as exc:  # noqa: BLE001 - one line, never a traceback; keep serving
            self.log.error(
                "nri request failed", method=method, error=f"{type(exc).__name__}: {exc}"
            )
            reply = encode_response(code=UNKNOWN, message=f"nvshim: internal error: {exc}")
        try:
            self.send(PLUGIN_CONN, stream, RESPONSE, reply)
        except OSError as exc:
            self.log.warning("nri reply not sent", method=method, error=str(exc))

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def connect(path: str, timeout: float = 5.0) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock
