"""Just enough of the protobuf wire format for the kubelet's PodResources messages.

Encoding: length-delimited fields (strings, nested messages). Decoding: every wire type,
so fields nvshim does not read (topology, cpu_ids, memory, a claim's share_id, whatever a
newer kubelet adds) are skipped, never misread. Malformed input raises :class:`ProtoError`.
"""

from __future__ import annotations

from typing import Dict, List, Tuple, Union

from nvshim.errors import HostError

__all__ = ["ProtoError", "decode", "string_field", "bytes_field", "first_str", "all_str",
           "all_bytes"]

Fields = Dict[int, List[Union[int, bytes]]]


class ProtoError(HostError):
    """Bytes from the kubelet's socket that are not a valid protobuf message."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def bytes_field(number: int, payload: bytes) -> bytes:
    """Field ``number`` with wire type 2 (length-delimited)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def string_field(number: int, text: str) -> bytes:
    """A proto3 string field; the empty string is the default and is not written."""
    return bytes_field(number, text.encode("utf-8")) if text else b""


def _read_varint(buf: bytes, pos: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ProtoError("truncated or oversized varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def decode(buf: bytes) -> Fields:
    """field number → values (ints for varint/fixed, bytes for length-delimited)."""
    fields: Fields = {}
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: Union[int, bytes]
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 1:
            if pos + 8 > len(buf):
                raise ProtoError("truncated fixed64")
            value, pos = int.from_bytes(buf[pos:pos + 8], "little"), pos + 8
        elif wire == 2:
            length, pos = _read_varint(buf, pos)
            if pos + length > len(buf):
                raise ProtoError("truncated length-delimited field")
            value, pos = bytes(buf[pos:pos + length]), pos + length
        elif wire == 5:
            if pos + 4 > len(buf):
                raise ProtoError("truncated fixed32")
            value, pos = int.from_bytes(buf[pos:pos + 4], "little"), pos + 4
        else:
            raise ProtoError(f"unsupported wire type {wire}")
        if number == 0:
            raise ProtoError("field number 0")
        fields.setdefault(number, []).append(value)
    return fields


def all_bytes(fields: Fields, number: int) -> List[bytes]:
    return [v for v in fields.get(number, []) if isinstance(v, bytes)]


def all_str(fields: Fields, number: int) -> List[str]:
    return [v.decode("utf-8", errors="replace") for v in all_bytes(fields, number)]


def first_str(fields: Fields, number: int) -> str:
    values = all_str(fields, number)
    return values[-1] if values else ""  # proto3: the last occurrence of a scalar wins
