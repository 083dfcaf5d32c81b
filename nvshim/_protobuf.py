"""Protocol buffers' wire format, by hand: the few shapes ttrpc's envelope
(:mod:`nvshim.agent.nri.transport`) and the kubelet's PodResources messages
(:mod:`nvshim.runtime.allocation.kubelet`, on the create path) use; no protobuf runtime, no
generated code, so a create never imports protobuf. NRI's own messages are protoc's
(:mod:`nvshim.agent.nri.api_pb2`, read by the resident agent only).

:func:`fields` splits a message into (field number, wire type, value) triples: varints as
ints, length-delimited fields as bytes, fixed 32/64-bit fields as ints; every field is
returned, so a reader takes the numbers it knows and unknown ones are skipped by not being
asked for. :class:`WireError` (a HostError and a ValueError) for any malformed input: a
truncated varint or field, a length past the end, a wire type protobuf does not define (3
and 4, the groups of proto2, included: NRI's and the kubelet's proto3 messages have none).

The writers (:func:`varint_field`, :func:`bytes_field`, :func:`string_field`,
:func:`message_field`, :func:`map_field`) emit what a proto3 encoder emits, default values
left out.
"""

from __future__ import annotations

from typing import Dict, Iterable, Iterator, List, Mapping, Tuple, Union

from nvshim.errors import HostError

__all__ = [
    "WireError",
    "Value",
    "fields",
    "by_number",
    "varint",
    "varint_field",
    "bytes_field",
    "string_field",
    "message_field",
    "strings_field",
    "map_field",
    "read_string",
    "read_int",
]

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
_MAX_VARINT_BYTES = 10


class WireError(HostError, ValueError):
    """A message that is not well-formed protobuf (from the kubelet's socket, a host error
    the create reports in one line; from the engine's NRI socket, one log line or an error
    reply)."""


Value = Union[int, bytes]


def varint(value: int) -> bytes:
    """``value`` as a varint (negative int64s as their two's complement, as protobuf does)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> Tuple[int, int]:
    result = 0
    for i in range(_MAX_VARINT_BYTES):
        if pos + i >= len(data):
            raise WireError("truncated varint")
        byte = data[pos + i]
        result |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return result & ((1 << 64) - 1), pos + i + 1
    raise WireError("varint longer than 10 bytes")


def fields(data: bytes) -> Iterator[Tuple[int, int, Value]]:
    """(number, wire type, value) of each field of the message ``data``, in order."""
    pos, end = 0, len(data)
    while pos < end:
        key = data[pos]  # one-byte keys and lengths (most of them) without a call
        if key < 0x80:
            pos += 1
        else:
            key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        value: Value
        if wire == LENGTH:
            if pos < end and data[pos] < 0x80:
                size, pos = data[pos], pos + 1
            else:
                size, pos = _read_varint(data, pos)
            if size > end - pos:
                raise WireError(f"field {number}: length {size} past the end of the message")
            value, pos = data[pos : pos + size], pos + size
        elif wire == VARINT:
            value, pos = _read_varint(data, pos)
        elif wire == FIXED64:
            if pos + 8 > end:
                raise WireError(f"field {number}: truncated fixed64")
            value, pos = int.from_bytes(data[pos : pos + 8], "little"), pos + 8
        elif wire == FIXED32:
            if pos + 4 > end:
                raise WireError(f"field {number}: truncated fixed32")
            value, pos = int.from_bytes(data[pos : pos + 4], "little"), pos + 4
        else:
            raise WireError(f"field {number}: wire type {wire} is not supported")
        yield number, wire, value


def by_number(data: bytes) -> Dict[int, List[Value]]:
    """Every value of each field number of ``data`` (repeated fields in order)."""
    out: Dict[int, List[Value]] = {}
    for number, _wire, value in fields(data):
        out.setdefault(number, []).append(value)
    return out


def _key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def varint_field(number: int, value: int) -> bytes:
    """An int/bool/enum field; nothing for 0 (proto3's default)."""
    return _key(number, VARINT) + varint(int(value)) if value else b""


def bytes_field(number: int, value: bytes) -> bytes:
    """A bytes field; nothing when empty."""
    return _key(number, LENGTH) + varint(len(value)) + value if value else b""


def string_field(number: int, value: str) -> bytes:
    """A string field; nothing when empty."""
    return bytes_field(number, value.encode())


def strings_field(number: int, values: Iterable[str]) -> bytes:
    """A repeated string field: every element written, empty ones included."""
    return b"".join(message_field(number, v.encode()) for v in values)


def message_field(number: int, value: bytes) -> bytes:
    """An embedded message, written even when empty (presence matters for messages)."""
    return _key(number, LENGTH) + varint(len(value)) + value


def map_field(number: int, items: Mapping[str, str]) -> bytes:
    """A ``map<string, string>``: one entry message (key 1, value 2) per item."""
    return b"".join(
        message_field(number, string_field(1, k) + string_field(2, v)) for k, v in items.items()
    )


def read_string(values: Mapping[int, List[Value]], number: int) -> str:
    """The last value of string field ``number`` ("" when absent); invalid UTF-8 is a
    WireError."""
    raw = values.get(number)
    if not raw:
        return ""
    return _text(raw[-1], number)


def read_int(values: Mapping[int, List[Value]], number: int, signed: bool = True) -> int:
    """The last value of varint field ``number`` (0 when absent), as int64 when ``signed``."""
    raw = values.get(number)
    if not raw:
        return 0
    value = raw[-1]
    if not isinstance(value, int):
        raise WireError(f"field {number}: expected a varint")
    if signed and value >= 1 << 63:
        value -= 1 << 64
    return value


def messages(values: Mapping[int, List[Value]], number: int) -> Iterable[bytes]:
    """The embedded messages of field ``number``."""
    for value in values.get(number, ()):
        if not isinstance(value, bytes):
            raise WireError(f"field {number}: expected a message")
        yield value


def _text(value: Value, number: int) -> str:
    if not isinstance(value, bytes):
        raise WireError(f"field {number}: expected a string")
    try:
        return value.decode()
    except UnicodeDecodeError as exc:
        raise WireError(f"field {number}: not UTF-8") from exc
