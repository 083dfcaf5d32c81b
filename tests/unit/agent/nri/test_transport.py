"""Unit tests of the NRI plugin's wire: protobuf, the multiplexer, ttrpc, bad input."""

from __future__ import annotations

import socket
import struct
import threading
from typing import Any, List, Tuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvshim import _protobuf as proto
from nvshim._protobuf import WireError
from nvshim.agent.nri import api, transport
from tests.helpers.agent import RecordingLog as Log

text = st.text(max_size=20)


@given(st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1))
def test_varint_round_trip(value: int) -> None:
    """Every int64/uint64 survives a varint field round trip."""
    data = proto.varint_field(1, value)
    got = proto.read_int(proto.by_number(data), 1, signed=value < 0)
    assert got == value


@given(st.binary(max_size=200))
def test_fields_never_raise_anything_but_wire_error(data: bytes) -> None:
    """Arbitrary bytes decode or raise WireError, never another exception."""
    try:
        list(proto.fields(data))
        api.decode_pod_container(data)
    except WireError:
        pass
    for method in ("StateChange", "StartContainer", "RemoveContainer"):
        try:
            api.decode_event(method, data)
        except WireError:
            pass


@given(st.integers(min_value=1, max_value=(1 << 29) - 1), st.binary(max_size=400))
def test_length_fields_round_trip_at_any_size(number: int, value: bytes) -> None:
    """A length-delimited field reads back whole whether its key and length take one
    varint byte (the decoder's inline path) or several."""
    assert list(proto.fields(proto.message_field(number, value))) == [(number, 2, value)]


@given(text, st.integers(min_value=0, max_value=(1 << 32) - 1), st.binary(max_size=300))
def test_start_remove_and_state_change_decode_the_container_id_and_pid(
    cid: str, pid: int, rest: bytes
) -> None:
    """decode_event reads the container's id and pid of a StartContainer/RemoveContainer
    request (container at 2) and a StateChangeEvent (event 1, container at 3) as the whole
    decode does, the pod and the container's other fields (here any bytes) skipped."""
    ctr = proto.string_field(1, cid) + proto.bytes_field(90, rest) + proto.varint_field(12, pid)
    pod = proto.string_field(2, "p") + proto.bytes_field(91, rest)
    request = proto.message_field(1, pod) + proto.message_field(2, ctr)
    _pod, whole = api.decode_pod_container(request)
    assert (whole.id, whole.pid) == (cid, pid)
    assert api.decode_event("StartContainer", request) == (api.Event.START_CONTAINER, cid, pid)
    assert api.decode_event("RemoveContainer", request) == (api.Event.REMOVE_CONTAINER, cid, pid)
    change = (
        proto.varint_field(1, api.Event.START_CONTAINER)
        + proto.message_field(2, pod)
        + proto.message_field(3, ctr)
    )
    assert api.decode_event("StateChange", change) == (api.Event.START_CONTAINER, cid, pid)
    assert api.decode_event("StartContainer", b"") == (api.Event.START_CONTAINER, "", 0)


@given(
    text,
    text,
    text,
    st.dictionaries(text, text, max_size=4),
    text,
    st.lists(text, max_size=4),
    st.lists(st.tuples(text, text, text, st.lists(text, max_size=3)), max_size=3),
    st.binary(max_size=30),
)
def test_pod_and_container_round_trip(
    pid: str, name: str, ns: str, notes: dict, handler: str, env: list, mounts: list, unknown: bytes
) -> None:
    """A CreateContainerRequest encoded as the engine does decodes to the same pod and
    container, with an unknown field (number 99) skipped."""
    pod = (
        proto.string_field(1, pid)
        + proto.string_field(2, name)
        + proto.string_field(4, ns)
        + proto.map_field(6, notes)
        + proto.string_field(7, handler)
        + proto.bytes_field(99, unknown)
    )
    ctr = proto.strings_field(8, env) + b"".join(
        proto.message_field(9, api.Mount(d, t, s, tuple(o)).encode()) for d, t, s, o in mounts
    )
    got_pod, got_ctr = api.decode_pod_container(
        proto.message_field(1, pod) + proto.message_field(2, ctr)
    )
    assert (
        got_pod.id,
        got_pod.name,
        got_pod.namespace,
        got_pod.annotations,
        got_pod.runtime_handler,
    ) == (pid, name, ns, notes, handler)
    assert got_ctr.env == tuple(env)
    assert got_ctr.mounts == tuple(api.Mount(d, t, s, tuple(o)) for d, t, s, o in mounts)


def test_adjustment_encoding_field_numbers() -> None:
    """An adjustment puts env (4) as KeyValue, mounts (3), hooks (5) and linux.devices (6.1)
    at the numbers of NRI's api.proto."""
    adj = api.Adjustment(
        env=(("NVIDIA_VISIBLE_DEVICES", "void"),),
        mounts=(api.Mount("/x", "bind", "/y"),),
        hooks={"createContainer": (api.Hook("/bin/h", ("h",)),)},
        devices=(api.Device("/dev/nvidia0", "c", 195, 0, 0o666, 0, 0),),
    )
    v = proto.by_number(adj.encode())
    kv = proto.by_number(v[4][0])  # type: ignore[arg-type]
    assert proto.read_string(kv, 1) == "NVIDIA_VISIBLE_DEVICES"
    assert proto.read_string(proto.by_number(v[3][0]), 1) == "/x"  # type: ignore[arg-type]
    hooks = proto.by_number(v[5][0])  # type: ignore[arg-type]
    assert proto.read_string(proto.by_number(hooks[3][0]), 1) == "/bin/h"  # type: ignore[arg-type]
    dev = proto.by_number(proto.by_number(v[6][0])[1][0])  # type: ignore[arg-type]
    assert (proto.read_string(dev, 1), proto.read_int(dev, 3)) == ("/dev/nvidia0", 195)


def test_event_mask() -> None:
    """CreateContainer (event 4) is bit 3 of the subscription mask."""
    assert api.event_mask(api.Event.CREATE_CONTAINER) == 8


class FakeEngine:
    """The engine's side of a socketpair: sends Plugin requests on connection 1 and reads
    the replies."""

    def __init__(self, handler: Any) -> None:
        self.ours, theirs = socket.socketpair()
        self.log = Log()
        self.session = transport.Session(theirs, handler, self.log)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.session.run, args=(self.stop,))
        self.thread.start()
        self.stream = 1
        self.buf = b""

    def send_raw(self, data: bytes) -> None:
        self.ours.sendall(data)

    def request(self, method: str, payload: bytes = b"", service: str = api.SERVICE_PLUGIN) -> int:
        stream = self.stream
        self.stream += 2
        msg = transport.encode_request(service, method, payload)
        self.send_raw(transport.frame(1, transport.ttrpc_message(stream, 1, msg)))
        return stream

    def reply(self) -> Tuple[int, int, str, bytes]:
        """(stream, code, message, payload) of the next reply."""
        self.ours.settimeout(10)
        while True:
            if len(self.buf) >= 8:
                conn, size = struct.unpack(">II", self.buf[:8])
                if len(self.buf) >= 8 + size:
                    body, self.buf = self.buf[8 : 8 + size], self.buf[8 + size :]
                    length, stream, _kind, _flags = struct.unpack(">IIBB", body[:10])
                    code, message, payload = transport.decode_response(body[10 : 10 + length])
                    return stream, code, message, payload
            self.buf += self.ours.recv(65536)

    def close(self) -> None:
        self.stop.set()
        self.ours.close()
        self.thread.join(5)


@pytest.fixture
def engine() -> Any:
    def handler(method: str, body: bytes) -> bytes:
        if method == "Fail":
            raise transport.RpcError("refused here")
        if method == "Boom":
            raise KeyError("x")
        if method == "Echo":
            return body
        api.decode_pod_container(body)
        return body[:4]

    e = FakeEngine(handler)
    yield e
    e.close()


def test_bad_input_one_line_each_and_serving(engine: FakeEngine) -> None:
    """Oversized frames, unknown connections, oversized and undecodable ttrpc messages,
    unknown services, internal errors: each one log line (or an error reply), and the
    session still answers the next request."""
    engine.send_raw(struct.pack(">II", 7, 3) + b"abc")  # unknown connection
    big = transport.MAX_FRAME + 1
    engine.send_raw(struct.pack(">II", 1, big))  # oversized frame: skipped
    engine.send_raw(b"\0" * big)
    too_long = transport.MAX_MESSAGE + 10  # ttrpc message over 4 MiB, across frames
    body = transport.ttrpc_message(99, 1, b"\0" * too_long)
    for i in range(0, len(body), 1 << 20):
        engine.send_raw(transport.frame(1, body[i : i + (1 << 20)]))
    assert engine.reply()[:2] == (99, transport.RESOURCE_EXHAUSTED)
    engine.send_raw(transport.frame(1, transport.ttrpc_message(101, 1, b"\xff\xff")))
    assert engine.reply()[:2] == (101, transport.INVALID_ARGUMENT)
    s = engine.request("CreateContainer", b"\x0a\x05abc")  # truncated pod message
    assert engine.reply()[:2] == (s, transport.INVALID_ARGUMENT)
    s = engine.request("CreateContainer", service="nri.pkg.api.v9.Plugin")
    assert engine.reply()[:2] == (s, transport.UNIMPLEMENTED)
    s = engine.request("Fail")
    assert engine.reply()[:3] == (s, transport.UNKNOWN, "refused here")
    s = engine.request("Boom")
    assert engine.reply()[:2] == (s, transport.UNKNOWN)
    pod = proto.message_field(1, proto.map_field(6, {"big": "x" * (1 << 20)}))
    s = engine.request("CreateContainer", pod)  # a pod with a 1 MB annotation
    assert engine.reply()[:2] == (s, 0)
    warnings = [line for line in engine.log.lines if line[0] in ("warning", "error")]
    assert len(warnings) == 6, warnings
    assert engine.thread.is_alive()


def test_concurrent_requests(engine: FakeEngine) -> None:
    """200 CreateContainer requests in flight at once are each answered once."""
    streams = {engine.request("CreateContainer", b"") for _ in range(200)}
    got = [engine.reply() for _ in range(200)]
    assert {g[0] for g in got} == streams and all(g[1] == 0 for g in got)


def test_peer_uid_is_ours() -> None:
    """peer_uid reads SO_PEERCRED of a unix socket."""
    import os

    a, b = socket.socketpair()
    try:
        assert transport.peer_uid(a) == os.getuid()
    finally:
        a.close()
        b.close()


def test_replies_are_cut_into_frames_the_engine_can_read(engine: FakeEngine) -> None:
    """A reply longer than 4096 bytes goes out as frames of at most 4096 bytes (the engine's
    multiplexer fails a frame larger than its reader's buffer)."""
    s = engine.request("Echo", b"\x12" + proto.varint(9000) + b"y" * 9000)
    engine.ours.settimeout(10)
    sizes = []
    data = b""
    while sum(sizes) < 10 + 9004:
        while len(data) < 8:
            data += engine.ours.recv(65536)
        _conn, size = struct.unpack(">II", data[:8])
        while len(data) < 8 + size:
            data += engine.ours.recv(65536)
        sizes.append(size)
        data = data[8 + size :]
    assert s == 1 and max(sizes) <= 4096 and len(sizes) > 1


def test_run_nri_refuses_a_socket_not_served_by_root(tmp_path: Any) -> None:
    """An NRI socket whose server is not root (nor the agent's user) is refused: one log line, no registration."""
    import os
    import time

    if os.getuid() != 0:
        pytest.skip("needs root to serve the socket as another user")
    from nvshim.agent.nri import run_nri

    path = str(tmp_path / "nri.sock")
    pid = os.fork()
    if pid == 0:  # the child: nobody's server, accepting and holding connections
        try:
            srv = socket.socket(socket.AF_UNIX)
            srv.bind(path)  # as root; the peer credentials are those at listen()
            os.setgid(65534)
            os.setuid(65534)
            srv.listen(4)
            held = []
            while True:
                held.append(srv.accept()[0])
        finally:
            os._exit(0)
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)

        class State:
            log = Log()
            config = None

        stop = threading.Event()
        registered: List[bool] = []
        t = threading.Thread(target=run_nri, args=(State(), path, stop, registered.append))
        t.start()
        deadline = time.monotonic() + 10
        refused = []
        while not refused and time.monotonic() < deadline:
            time.sleep(0.01)
            refused = [line for line in State.log.lines if line[1] == "nri peer refused"]
        stop.set()
        t.join(15)
        assert not t.is_alive()
        assert refused and refused[0][0] == "error" and refused[0][2]["uid"] == 65534
        assert registered == []
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def test_split_synchronize_is_acknowledged() -> None:
    """A SynchronizeRequest with more=true is answered more=true (the engine closes a plugin that does not), the last one more=false."""
    assert proto.read_int(proto.by_number(api.encode_sync_reply(proto.varint_field(3, 1))), 2) == 1
    assert api.encode_sync_reply(proto.message_field(1, b"")) == b""


def test_requests_are_served_one_at_a_time_in_their_order() -> None:
    """Requests are answered in the order they came, one handler call at a time (the
    engines serialize their NRI calls: serving on the reading thread costs no wait)."""
    import time

    inside: list = []
    overlap: list = []

    def handler(method: str, body: bytes) -> bytes:
        if inside:
            overlap.append(method)
        inside.append(method)
        time.sleep(0.002)
        inside.pop()
        return body

    e = FakeEngine(handler)
    try:
        streams = [e.request("Echo", b"\x12\x01" + bytes([i])) for i in range(30)]
        assert [e.reply()[0] for _ in streams] == streams
        assert overlap == []
    finally:
        e.close()
