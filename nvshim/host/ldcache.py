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
order. Parsing and writing are on the container-create hot path, once per entry of the
image's cache (an Ubuntu-based CUDA image has 300-600): entries are plain tuples and the
sort key is one ``bytes`` object built with C-level scans, which makes a rewrite of such a
cache about four times cheaper than records and tuple keys did. Only ``struct`` is imported,
and every malformed input raises :class:`HostError`.

Why one module: it is a codec. Parsing and building the three layouts share the header
constants, the string table and libcmp's order; a reader and a writer kept apart drift
apart, and a create that rewrites an image's cache needs both.
"""

from __future__ import annotations

import struct

from nvshim.errors import HostError

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any, Optional, Union

__all__ = [
    "FLAG_ELF_LIBC6",
    "FLAG_X8664_LIB64",
    "FLAG_X8664_LIBC6",
    "HWCAP_EXTENSION",
    "LAYOUTS",
    "CacheEntry",
    "LdCacheError",
    "MEMO_BYTES",
    "MEMO_MAX",
    "build_ldcache",
    "cache_flags",
    "libcmp_key",
    "parse_ldcache",
    "read_ldcache",
    "remember",
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


class CacheEntry(tuple):  # type: ignore[type-arg]
    """One cache entry: ``key`` (SONAME or file name) resolves to ``value`` (a path).

    An immutable ``(key, value, flags, hwcap)`` tuple with those names: a parse makes one
    per entry of the image's cache, and a tuple costs a fraction of a record to make."""

    __slots__ = ()

    def __new__(
        cls, key: str, value: str, flags: int = FLAG_X8664_LIBC6, hwcap: int = 0
    ) -> CacheEntry:
        return tuple.__new__(cls, (key, value, flags, hwcap))

    @property
    def key(self) -> str:
        result: str = self[0]
        return result

    @property
    def value(self) -> str:
        result: str = self[1]
        return result

    @property
    def flags(self) -> int:
        result: int = self[2]
        return result

    @property
    def hwcap(self) -> int:
        result: int = self[3]
        return result

    def __repr__(self) -> str:
        return (
            f"CacheEntry(key={self[0]!r}, value={self[1]!r}, flags={self[2]!r}, hwcap={self[3]!r})"
        )


_entry = tuple.__new__  # _entry(CacheEntry, (key, value, flags, hwcap)): no __new__ call


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
    get = strings.get
    return [
        _entry(CacheEntry, (get(key, i, "key"), get(value, i, "value"), eflags, hwcap))
        for i, (eflags, key, value, _osv, hwcap) in enumerate(_ENTRY_NEW.iter_unpack(view))
    ]


#: The last caches parsed, their bytes → their entries: every create of an image reads the
#: same ld.so.cache, and the resident agent parses it once. A pure function of the key and
#: an immutable value (a tuple of tuples), so threads share the dict without a lock (a race
#: parses twice, never wrongly); at most MEMO_MAX caches of at most MEMO_BYTES each (an
#: image chooses its cache).
_PARSED: dict[bytes, tuple[CacheEntry, ...]] = {}
MEMO_MAX = 8
MEMO_BYTES = 1 << 20


def remember(memo: dict[Any, Any], key: Any, value: Any, most: int = MEMO_MAX) -> None:
    """``memo[key] = value`` in a memo of at most ``most`` entries (emptied when full:
    one step, safe beside other threads, where an eviction loop is not)."""
    if len(memo) >= most:
        memo.clear()
    memo[key] = value


def parse_ldcache(data: bytes) -> list[CacheEntry]:
    """Return the entries of an ld.so.cache image, in file order.

    For the compat layout the new-format entries are returned (ld.so prefers them).
    Raises :class:`HostError` naming the defect for truncated or foreign data.
    """
    if type(data) is not bytes or len(data) > MEMO_BYTES:
        return _parse(data)
    found = _PARSED.get(data)
    if found is None:
        found = tuple(_parse(data))
        remember(_PARSED, data, found)
    return list(found)


def _parse(data: bytes) -> list[CacheEntry]:
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
    get = strings.get
    return [
        _entry(CacheEntry, (get(key, i, "key"), get(value, i, "value"), flags, 0))
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


# libcmp_key's alphabet. Each non-digit byte becomes its rank (0..245) among the 246
# non-digit bytes in signed-char order; a digit run becomes 0xFF (above every rank: a digit
# sorts above any other byte) and its value as a C int, biased to 4 unsigned big-endian
# bytes. Two keys then compare bytewise exactly as _dl_cache_libcmp compares the names:
# equal prefixes line up element by element, and the first differing element decides.
# In signed-char order the non-digits are 0x80..0xFF (-128..-1), then 0x00..0x2F, then
# 0x3A..0x7F; digits (0x30..0x39) never go through the table. Written out, not computed:
# this runs at every create's import (a test recomputes it from that definition).
_RANK_TABLE = bytes(range(128, 176)) + bytes(10) + bytes(range(176, 246)) + bytes(range(0, 128))
_END = b"\x80"  # the terminating NUL: rank 128
_DIGIT_CLASS = b"a" * 48 + b"0" * 10 + b"a" * 198  # digit "0", other "a", per byte


def _c_int(digits: bytes) -> int:
    """The unsigned 32 bits of glibc's ``val = val * 10 + digit`` loop over ``digits``
    (int() alone refuses runs past 4300 digits, which an image's cache may hold)."""
    if len(digits) <= 18:
        return int(digits) & 0xFFFFFFFF
    value = 0
    for at in range(0, len(digits), 18):
        chunk = digits[at : at + 18]
        value = (value * 10 ** len(chunk) + int(chunk)) & 0xFFFFFFFF
    return value


#: libcmp_key's answers by name. The names of a node's creates repeat (the driver's
#: libraries, an image's ~500): the resident agent computes each once. A key is a pure
#: function of its name, so threads may share the dict without a lock (a race computes a
#: key twice, never a wrong one); bounded, as an image chooses its names.
_KEYS: dict[str, bytes] = {}
_KEYS_MAX = 1 << 16


def libcmp_key(name: str) -> bytes:
    """A sort key that orders names as glibc's ``_dl_cache_libcmp`` does (ascending).

    Digit runs compare as numbers (wrapped to a C int, as glibc computes them), a digit
    sorts above any other byte, other bytes compare as signed chars, and a name sorts
    below its own extensions. Built from C-level scans: one Python step per digit run;
    each name's key once per process (:data:`_KEYS`).
    """
    key = _KEYS.get(name)
    if key is None:
        key = _libcmp_key(name)
        remember(_KEYS, name, key, _KEYS_MAX)
    return key


def _libcmp_key(name: str) -> bytes:
    raw = _encode(name)
    classes = raw.translate(_DIGIT_CLASS)
    i = classes.find(b"0")
    if i < 0:
        return raw.translate(_RANK_TABLE) + _END
    parts = []
    n = len(raw)
    start = 0
    while i >= 0:
        parts.append(raw[start:i].translate(_RANK_TABLE))
        end = classes.find(b"a", i)
        if end < 0:
            end = n
        value = _c_int(raw[i:end])
        parts.append(b"\xff" + (value ^ 0x80000000).to_bytes(4, "big"))
        start = end
        i = classes.find(b"0", end)
    parts.append(raw[start:].translate(_RANK_TABLE))
    parts.append(_END)
    return b"".join(parts)


if TYPE_CHECKING:
    _EntryLike = Union[tuple[str, str], CacheEntry]


def _normalise(entries: Iterable[_EntryLike]) -> list[CacheEntry]:
    out = []
    for item in entries:
        entry = item if isinstance(item, CacheEntry) else CacheEntry(item[0], item[1])
        key, value, _flags, hwcap = entry
        if not key or not value or "\0" in key or "\0" in value:
            text = key if not key or "\0" in key else value
            raise LdCacheError(f"ld.so.cache name {text!r} is empty or contains a NUL byte")
        if hwcap & HWCAP_EXTENSION:
            raise LdCacheError(
                f"ld.so.cache entry {key!r} is a glibc-hwcaps entry, which cannot be "
                "written: drop entries with hwcap & HWCAP_EXTENSION"
            )
        out.append(entry)
    # ld.so binary-searches descending _dl_cache_libcmp order; for equal names ldconfig
    # puts higher flags, then higher hwcap first. reverse=True keeps the sort stable.
    out.sort(key=lambda e: (libcmp_key(e[0]), e[2], e[3]), reverse=True)
    return out


def _string_table(entries: Sequence[CacheEntry], start: int) -> tuple[bytes, dict[str, int]]:
    """Lay out each distinct string once; offsets count from ``start`` bytes before the table.

    Values come first; a key that ends its own value shares the value's bytes, as ldconfig
    does.
    """
    table = bytearray()
    offsets: dict[str, int] = {}
    encoded: dict[str, bytes] = {}
    for entry in entries:
        value = entry[1]
        if value not in offsets:
            offsets[value] = start + len(table)
            raw = encoded[value] = value.encode("utf-8", "surrogateescape")
            table += raw
            table.append(0)
    for entry in entries:
        key, value = entry[0], entry[1]
        if key in offsets:
            continue
        raw = key.encode("utf-8", "surrogateescape")
        if value.endswith(key):
            # The key is usually the path's base name: point into the value's tail.
            offsets[key] = offsets[value] + len(encoded[value]) - len(raw)
        else:
            offsets[key] = start + len(table)
            table += raw
            table.append(0)
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
    pack = _ENTRY_NEW.pack
    parts += [
        pack(flags, offsets[key], offsets[value], 0, hwcap) for key, value, flags, hwcap in entries
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
    pack = _ENTRY_OLD.pack
    parts += [pack(flags, offsets[key], offsets[value]) for key, value, flags, _hw in ordered]
    parts.append(table)
    return b"".join(parts)
