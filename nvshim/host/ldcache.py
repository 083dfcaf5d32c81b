"""Read and write glibc's ``ld.so.cache``, our own codec for all three layouts.

The cache maps a library name (the SONAME link, or a ``.so`` link) to a path. glibc knows
three layouts:

``new``
    What glibc >= 2.32 writes. A 48-byte header (``glibc-ld.so.cache`` + version ``1.1``,
    ``nlibs``, ``len_strings``, an endianness flag byte, ``extension_offset``), ``nlibs``
    entries of 24 bytes (``flags, key, value, osversion, hwcap``), then the string table.
    String offsets count from the start of the header, i.e. from the start of the file.
    An optional extension block (found through ``extension_offset``, which counts from
    the start of the file) names the generator and the glibc-hwcaps subdirectories.
``old``
    libc5-era ``ld.so-1.7.0``: a 16-byte header (11-byte magic, pad, ``nlibs`` at 12), then
    12-byte entries (``flags, key, value``). String offsets count from the end of the
    entries.
``compat``
    What glibc 2.2 - 2.31 wrote by default: the old header and entries, zero padding to the
    next 8-byte boundary, then a complete new-format block whose strings also serve the
    old entries. New offsets count from the new header; old offsets count from the end of
    the old entries, so an old offset = padding + new offset.

ld.so finds a name by binary search with ``_dl_cache_libcmp`` (digit runs compare as
numbers, a digit sorts above any other byte, other bytes compare as signed chars), and
the entries are sorted *descending* by that compare; :func:`build_ldcache` writes that
order. Parsing is on the container-create hot path: only ``struct``, :mod:`nvshim._record` and
``typing`` are imported, and every malformed input raises :class:`HostError`.
"""

from __future__ import annotations

import struct

from nvshim._record import dataclass
from nvshim.errors import HostError

TYPE_CHECKING = False  # typing costs ~4 ms to import on the create path
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Optional, Union

__all__ = [
    "FLAG_ELF_LIBC6",
    "FLAG_X8664_LIB64",
    "FLAG_X8664_LIBC6",
    "HWCAP_EXTENSION",
    "LAYOUTS",
    "CacheEntry",
    "LdCacheError",
    "build_ldcache",
    "cache_flags",
    "libcmp_key",
    "parse_ldcache",
    "read_ldcache",
]


class LdCacheError(HostError, ValueError):
    """What ``build_ldcache`` cannot write (a ValueError too, as callers caught before)."""


FLAG_ELF_LIBC6 = 0x0003
FLAG_X8664_LIB64 = 0x0300
FLAG_X8664_LIBC6 = FLAG_ELF_LIBC6 | FLAG_X8664_LIB64
# hwcap bit 62: the low 32 bits index the glibc-hwcaps subdirectory list in the extension.
HWCAP_EXTENSION = 1 << 62
LAYOUTS = ("new", "old", "compat")

_MAGIC_OLD = b"ld.so-1.7.0"
_MAGIC_NEW = b"glibc-ld.so.cache1.1"
_HEADER_OLD = struct.Struct("<11sxI")  # magic, pad, nlibs: 16 bytes
_ENTRY_OLD = struct.Struct("<iII")  # flags, key, value: 12 bytes
# magic+version, nlibs, len_strings, flags, 3 pad, extension_offset, 3 unused: 48 bytes
_HEADER_NEW = struct.Struct("<20sIIB3xI12x")
_ENTRY_NEW = struct.Struct("<iIIIQ")  # flags, key, value, osversion_unused, hwcap: 24 bytes
_EXT_HEADER = struct.Struct("<II")  # magic, section count
_EXT_SECTION = struct.Struct("<IIII")  # tag, flags, offset, size
_EXT_MAGIC = 0xEAA42174
_EXT_TAG_GENERATOR = 0
_ENDIAN_MASK = 3
_ENDIAN_UNSET = 0
_ENDIAN_LITTLE = 2
_GENERATOR = b"nvshim"


@dataclass(frozen=True)
class CacheEntry:
    """One cache entry: ``key`` (SONAME or file name) resolves to ``value`` (a path)."""

    key: str
    value: str
    flags: int = FLAG_X8664_LIBC6
    hwcap: int = 0


# Entry flags ld.so accepts, by (ELF class, e_machine): glibc's _DL_CACHE_DEFAULT_ID per
# architecture (FLAG_ELF_LIBC6 | the architecture's FLAG_*_LIB*).
_CLASS32, _CLASS64 = 1, 2
_ARCH_FLAGS = {
    (_CLASS64, 62): 0x0303,  # x86-64
    (_CLASS32, 62): 0x0803,  # x32
    (_CLASS32, 3): 0x0003,  # i386
    (_CLASS64, 183): 0x0A03,  # aarch64
    (_CLASS64, 21): 0x0503,  # ppc64 (le)
}


def cache_flags(elf_class: int, machine: int) -> Optional[int]:
    """The entry flags for a library of this ELF class and machine, None if unknown."""
    return _ARCH_FLAGS.get((elf_class, machine))


def _align(offset: int, to: int) -> int:
    return (offset + to - 1) & ~(to - 1)


def _decode(raw: bytes) -> str:
    # The encoding os.fsdecode uses on Linux, so any file name round-trips.
    return raw.decode("utf-8", "surrogateescape")


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


class _Strings:
    """NUL-terminated string lookups in ``data`` at offsets relative to ``base``."""

    def __init__(self, data: bytes, base: int) -> None:
        self._data = data
        self._base = base
        self._seen: dict[int, str] = {}

    def get(self, offset: int, index: int, what: str) -> str:
        text = self._seen.get(offset)
        if text is not None:
            return text
        start = self._base + offset
        end = self._data.find(b"\0", start) if start < len(self._data) else -1
        if end < 0:
            raise HostError(
                f"ld.so.cache entry {index}: {what} string offset {offset} is outside the file"
            )
        text = _decode(self._data[start:end])
        self._seen[offset] = text
        return text


def _parse_new(data: bytes, base: int) -> list[CacheEntry]:
    if len(data) - base < _HEADER_NEW.size:
        raise HostError(f"ld.so.cache truncated: new-format header at {base} is cut short")
    _magic, nlibs, _len_strings, flags, _ext = _HEADER_NEW.unpack_from(data, base)
    endian = flags & _ENDIAN_MASK
    if endian not in (_ENDIAN_UNSET, _ENDIAN_LITTLE):
        raise HostError(f"ld.so.cache has the wrong endianness (flags {flags:#x})")
    first = base + _HEADER_NEW.size
    if first + nlibs * _ENTRY_NEW.size > len(data):
        raise HostError(
            f"ld.so.cache truncated: header says {nlibs} entries, file has {len(data)} bytes"
        )
    strings = _Strings(data, base)
    view = memoryview(data)[first : first + nlibs * _ENTRY_NEW.size]
    return [
        CacheEntry(strings.get(key, i, "key"), strings.get(value, i, "value"), eflags, hwcap)
        for i, (eflags, key, value, _osv, hwcap) in enumerate(_ENTRY_NEW.iter_unpack(view))
    ]


def parse_ldcache(data: bytes) -> list[CacheEntry]:
    """Return the entries of an ld.so.cache image, in file order.

    For the compat layout the new-format entries are returned (ld.so prefers them).
    Raises :class:`HostError` naming the defect for truncated or foreign data.
    """
    if data[: len(_MAGIC_NEW)] == _MAGIC_NEW:
        return _parse_new(data, 0)
    if data[: len(_MAGIC_OLD)] != _MAGIC_OLD:
        raise HostError(f"not an ld.so.cache: unknown magic {bytes(data[:20])!r}")
    if len(data) < _HEADER_OLD.size:
        raise HostError(f"ld.so.cache truncated: old-format header needs 16 bytes, got {len(data)}")
    (_magic, nlibs) = _HEADER_OLD.unpack_from(data, 0)
    end_old = _HEADER_OLD.size + nlibs * _ENTRY_OLD.size
    if end_old > len(data):
        raise HostError(
            f"ld.so.cache truncated: header says {nlibs} entries, file has {len(data)} bytes"
        )
    new_at = _align(end_old, 8)
    if data[new_at : new_at + len(_MAGIC_NEW)] == _MAGIC_NEW:
        return _parse_new(data, new_at)
    strings = _Strings(data, end_old)
    view = memoryview(data)[_HEADER_OLD.size : end_old]
    return [
        CacheEntry(strings.get(key, i, "key"), strings.get(value, i, "value"), flags, 0)
        for i, (flags, key, value) in enumerate(_ENTRY_OLD.iter_unpack(view))
    ]


def read_ldcache(path: str) -> list[CacheEntry]:
    """Parse the cache file at ``path``; a missing file is an empty cache."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise HostError(f"cannot read ld.so.cache {path}: {exc.strerror}") from exc
    try:
        return parse_ldcache(data)
    except HostError as exc:
        raise HostError(f"{path}: {exc}") from exc


def libcmp_key(name: str) -> tuple[tuple[int, int], ...]:
    """A sort key that orders names as glibc's ``_dl_cache_libcmp`` does (ascending).

    Digit runs become ``(1, value)`` (value wrapped to a C int, as glibc computes it),
    other bytes ``(0, signed byte)``, and the end of the name ``(0, 0)``.
    """
    raw = _encode(name)
    out: list[tuple[int, int]] = []
    i, n = 0, len(raw)
    while i < n:
        byte = raw[i]
        if 48 <= byte <= 57:
            value = 0
            while i < n and 48 <= raw[i] <= 57:
                value = (value * 10 + raw[i] - 48) & 0xFFFFFFFF
                i += 1
            out.append((1, value - (1 << 32) if value >= 1 << 31 else value))
        else:
            out.append((0, byte - 256 if byte >= 128 else byte))
            i += 1
    out.append((0, 0))
    return tuple(out)


if TYPE_CHECKING:
    _EntryLike = Union[tuple[str, str], CacheEntry]


def _normalise(entries: Iterable[_EntryLike]) -> list[CacheEntry]:
    out = []
    for item in entries:
        entry = item if isinstance(item, CacheEntry) else CacheEntry(item[0], item[1])
        for text in (entry.key, entry.value):
            if not text or "\0" in text:
                raise LdCacheError(f"ld.so.cache name {text!r} is empty or contains a NUL byte")
        if entry.hwcap & HWCAP_EXTENSION:
            raise LdCacheError(
                f"ld.so.cache entry {entry.key!r} is a glibc-hwcaps entry, which cannot be "
                "written: drop entries with hwcap & HWCAP_EXTENSION"
            )
        out.append(entry)
    # ld.so binary-searches descending _dl_cache_libcmp order; for equal names ldconfig
    # puts higher flags, then higher hwcap first. reverse=True keeps the sort stable.
    out.sort(key=lambda e: (libcmp_key(e.key), e.flags, e.hwcap), reverse=True)
    return out


def _string_table(entries: Sequence[CacheEntry], start: int) -> tuple[bytes, dict[str, int]]:
    """Lay out each distinct string once; offsets count from ``start`` bytes before the table.

    Values come first; a key that ends its own value shares the value's bytes, as ldconfig
    does.
    """
    table = bytearray()
    offsets: dict[str, int] = {}
    for entry in entries:
        if entry.value not in offsets:
            offsets[entry.value] = start + len(table)
            table += _encode(entry.value) + b"\0"
    for entry in entries:
        if entry.key in offsets:
            continue
        if entry.value.endswith(entry.key):
            # The key is usually the path's base name: point into the value's tail.
            tail = len(_encode(entry.value)) - len(_encode(entry.key))
            offsets[entry.key] = offsets[entry.value] + tail
        else:
            offsets[entry.key] = start + len(table)
            table += _encode(entry.key) + b"\0"
    return bytes(table), offsets


def _new_block(entries: Sequence[CacheEntry], with_extension: bool) -> bytes:
    """A complete new-format cache: header, entries, strings, optional generator extension."""
    head = _HEADER_NEW.size + len(entries) * _ENTRY_NEW.size
    table, offsets = _string_table(entries, head)
    ext_offset = 0
    extension = b""
    if with_extension:
        ext_offset = _align(head + len(table), 4)
        data_at = ext_offset + _EXT_HEADER.size + _EXT_SECTION.size
        extension = (
            b"\0" * (ext_offset - head - len(table))
            + _EXT_HEADER.pack(_EXT_MAGIC, 1)
            + _EXT_SECTION.pack(_EXT_TAG_GENERATOR, 0, data_at, len(_GENERATOR))
            + _GENERATOR
        )
    parts = [_HEADER_NEW.pack(_MAGIC_NEW, len(entries), len(table), _ENDIAN_LITTLE, ext_offset)]
    parts += [
        _ENTRY_NEW.pack(e.flags, offsets[e.key], offsets[e.value], 0, e.hwcap) for e in entries
    ]
    parts += [table, extension]
    return b"".join(parts)


def build_ldcache(entries: Sequence[_EntryLike], layout: str = "new") -> bytes:
    """Return an ld.so.cache image listing ``entries`` in the order ld.so searches.

    Each entry is a ``(key, path)`` pair for an x86-64 glibc library (flags
    :data:`FLAG_X8664_LIBC6`) or a :class:`CacheEntry` whose flags and hwcap are kept.
    ``layout`` is ``"new"`` (glibc >= 2.32, with a generator extension naming nvshim),
    ``"old"`` (``ld.so-1.7.0`` only) or ``"compat"`` (old entries, then a new block).
    Raises ValueError for an unknown layout, an empty name or one with a NUL byte, and for
    glibc-hwcaps entries (hwcap bit 62), whose subdirectory table is not carried over.
    """
    if layout not in LAYOUTS:
        raise LdCacheError(f"unknown ld.so.cache layout {layout!r}: expected one of {LAYOUTS}")
    ordered = _normalise(entries)
    if layout == "new":
        return _new_block(ordered, with_extension=True)
    end_old = _HEADER_OLD.size + len(ordered) * _ENTRY_OLD.size
    if layout == "old":
        # A leading NUL keeps the string table from ever starting with the new magic at the
        # aligned offset, which a reader would take for a compat layout.
        table, offsets = _string_table(ordered, 1)
        table = b"\0" + table
        pad = 0
    else:
        pad = _align(end_old, 8) - end_old
        block = _new_block(ordered, with_extension=False)
        head = _HEADER_NEW.size + len(ordered) * _ENTRY_NEW.size
        _table, offsets = _string_table(ordered, head)
        offsets = {text: pad + offset for text, offset in offsets.items()}
        table = b"\0" * pad + block
    parts = [_HEADER_OLD.pack(_MAGIC_OLD, len(ordered))]
    parts += [_ENTRY_OLD.pack(e.flags, offsets[e.key], offsets[e.value]) for e in ordered]
    parts.append(table)
    return b"".join(parts)
