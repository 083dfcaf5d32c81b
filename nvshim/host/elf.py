"""The ELF shared-object facts nvshim needs: read a DT_SONAME, write a tiny loadable .so.

:func:`read_soname` is used by discovery (it reads a few hundred bytes with ``pread``, so a
30 MB libcuda costs the same as a stub). :func:`build_shared_object` writes the stub
libraries of a simulated node (:mod:`nvshim.sim.build`) without a compiler: one read-write
``PT_LOAD`` segment holding the dynamic string table, an empty symbol table, a one-bucket
``DT_HASH`` and the ``PT_DYNAMIC`` array, plus ``PT_GNU_STACK`` so the loader keeps the
stack non-executable. glibc's ``dlopen`` loads it and ``ldconfig`` reads its SONAME. The
dynamic section sits in the writable segment because ld.so relocates its pointers in place.
"""

from __future__ import annotations

import os
import struct

from nvshim.errors import HostError

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["build_shared_object", "read_soname", "read_soname_fd"]

_PT_LOAD = 1
_PT_DYNAMIC = 2
_PT_GNU_STACK = 0x6474E551
_PF_W = 2
_PF_R = 4
_DT_NULL = 0
_DT_NEEDED = 1
_DT_HASH = 4
_DT_STRTAB = 5
_DT_SYMTAB = 6
_DT_STRSZ = 10
_DT_SYMENT = 11
_DT_SONAME = 14
_EM_X86_64 = 62
_EM_386 = 3
_ET_DYN = 3

_EHDR64 = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR64 = struct.Struct("<IIQQQQQQ")
_DYN64 = struct.Struct("<qQ")
_SYM64_SIZE = 24
# What build_shared_object packs, per ELF class: the ELF header, a program header, a
# dynamic entry (ELF32: the same fields as ELF64, words of 4 bytes, p_flags moved last).
_BUILD = {
    1: (struct.Struct("<16sHHIIIIIHHHHHH"), struct.Struct("<IIIIIIII"), struct.Struct("<iI")),
    2: (_EHDR64, _PHDR64, _DYN64),
}

# Per ELF class (1 = 32-bit, 2 = 64-bit): program header format, dynamic entry format, offsets
# of e_phoff and of e_phentsize (e_phnum follows it) in the ELF header.
_LAYOUT = {
    1: ("IIIIIIII", "iI", 28, 42),  # p_type, p_offset, p_vaddr, p_paddr, p_filesz, ...
    2: ("IIQQQQQQ", "qQ", 32, 54),  # p_type, p_flags, p_offset, p_vaddr, ...
}


def _align(offset: int, to: int) -> int:
    return (offset + to - 1) & ~(to - 1)


def build_shared_object(
    soname: str, marker: str = "", needed: Sequence[str] = (), i386: bool = False
) -> bytes:
    """Return a minimal ELF64 x86-64 shared object whose DT_SONAME is ``soname``.

    ``marker`` is stored as a readable NUL-terminated string (``grep`` finds it); each
    name in ``needed`` becomes a DT_NEEDED entry. ``i386``: an ELF32 i386 object instead
    (the 32-bit libraries of a simulated node), laid out the same way.
    """
    elf_class = 1 if i386 else 2
    ehdr, phdr, dyn = _BUILD[elf_class]
    sym_size = 16 if i386 else _SYM64_SIZE
    strtab = bytearray(b"\0")
    name_at = {}
    for text in (soname, *needed, marker):
        if text and text not in name_at:
            name_at[text] = len(strtab)
            strtab += text.encode() + b"\0"
    phnum = 3
    strtab_at = ehdr.size + phnum * phdr.size
    symtab_at = _align(strtab_at + len(strtab), 8)
    hash_at = symtab_at + sym_size
    dynamic_at = _align(hash_at + 16, 8)
    dynamic = [(_DT_NEEDED, name_at[name]) for name in needed]
    dynamic += [
        (_DT_HASH, hash_at),
        (_DT_STRTAB, strtab_at),
        (_DT_SYMTAB, symtab_at),
        (_DT_STRSZ, len(strtab)),
        (_DT_SYMENT, sym_size),
        (_DT_SONAME, name_at[soname]),
        (_DT_NULL, 0),
    ]
    dynamic_size = len(dynamic) * dyn.size
    total = dynamic_at + dynamic_size
    ident = b"\x7fELF" + bytes([elf_class, 1, 1, 0, 0]) + bytes(7)  # LSB, v1, SysV ABI
    out = bytearray(total)
    ehdr.pack_into(
        out, 0, ident, _ET_DYN, _EM_386 if i386 else _EM_X86_64, 1, 0, ehdr.size, 0, 0,
        ehdr.size, phdr.size, phnum, 40 if i386 else 64, 0, 0,
    )  # fmt: skip
    rw = _PF_R | _PF_W
    if i386:  # p_type, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_flags, p_align
        phdrs = [
            (_PT_LOAD, 0, 0, 0, total, total, rw, 0x1000),
            (_PT_DYNAMIC, dynamic_at, dynamic_at, dynamic_at, dynamic_size, dynamic_size, rw, 4),
            (_PT_GNU_STACK, 0, 0, 0, 0, 0, rw, 16),
        ]
    else:  # p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align
        phdrs = [
            (_PT_LOAD, rw, 0, 0, 0, total, total, 0x1000),
            (_PT_DYNAMIC, rw, dynamic_at, dynamic_at, dynamic_at, dynamic_size, dynamic_size, 8),
            (_PT_GNU_STACK, rw, 0, 0, 0, 0, 0, 16),
        ]
    for i, fields in enumerate(phdrs):
        phdr.pack_into(out, ehdr.size + i * phdr.size, *fields)
    out[strtab_at : strtab_at + len(strtab)] = strtab
    # Symbol 0 is the all-zero null symbol; hash: nbucket=1, nchain=1, bucket[0]=chain[0]=0.
    struct.pack_into("<IIII", out, hash_at, 1, 1, 0, 0)
    for i, (tag, value) in enumerate(dynamic):
        dyn.pack_into(out, dynamic_at + i * dyn.size, tag, value)
    return bytes(out)


def read_soname(path: str) -> str | None:
    """Return the DT_SONAME of the ELF file at ``path`` (symlinks followed).

    None when the file is not ELF, is malformed, or has no SONAME; :class:`HostError` when
    it cannot be opened or read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise HostError(f"cannot read ELF file {path}: {exc.strerror}") from exc
    try:
        return read_soname_fd(fd, path)
    finally:
        os.close(fd)


def read_soname_fd(fd: int, name: str = "ELF file", head: bytes = b"") -> str | None:
    """:func:`read_soname` for an already open file (the hook opens files in-root).

    *head*, when given, is what the caller already read from offset 0 (a scan reads 4 KiB
    once for the ELF header, the program headers and its own flags): the headers are taken
    from it when they fit, saving two reads per library."""
    try:
        return _soname_from_fd(fd, head)
    except OSError as exc:
        raise HostError(f"cannot read {name}: {exc.strerror}") from exc
    except (struct.error, OverflowError):
        return None


#: (ELF class, byte order) → (program header, dynamic entry, e_phoff word) structs, made
#: once: a folder scan reads hundreds of libraries.
_STRUCTS: dict[tuple[int, str], tuple[struct.Struct, struct.Struct, struct.Struct]] = {}


def _structs(elf_class: int, end: str) -> tuple[struct.Struct, struct.Struct, struct.Struct]:
    key = (elf_class, end)
    found = _STRUCTS.get(key)
    if found is None:
        phdr_fmt, dyn_fmt = _LAYOUT[elf_class][:2]
        found = _STRUCTS[key] = (
            struct.Struct(end + phdr_fmt),
            struct.Struct(end + dyn_fmt),
            struct.Struct(end + ("I" if elf_class == 1 else "Q")),
        )
    return found


def _soname_from_fd(fd: int, head: bytes = b"") -> str | None:
    ident = head if len(head) >= 64 else os.pread(fd, 64, 0)
    if len(ident) < 52 or ident[:4] != b"\x7fELF" or ident[4] not in _LAYOUT:
        return None
    end = {1: "<", 2: ">"}.get(ident[5])
    if end is None:
        return None
    elf_class = ident[4]
    phoff_at, phentsize_at = _LAYOUT[elf_class][2:]
    phdr, dyn, word = _structs(elf_class, end)
    (phoff,) = word.unpack_from(ident, phoff_at)
    phentsize, phnum = struct.unpack_from(end + "HH", ident, phentsize_at)
    if phentsize != phdr.size or phnum == 0 or phnum > 4096:
        return None
    size = phentsize * phnum
    table = head[phoff : phoff + size] if phoff + size <= len(head) else os.pread(fd, size, phoff)
    if len(table) < size:
        return None  # the file ends inside its own program headers
    loads = []
    dynamic = None
    for fields in phdr.iter_unpack(table[: len(table) - len(table) % phentsize]):
        if elf_class == 1:
            p_type, p_offset, p_vaddr, _pa, p_filesz = fields[:5]
        else:
            p_type, _flags, p_offset, p_vaddr, _pa, p_filesz = fields[:6]
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None or dynamic[1] > 1 << 20:
        return None
    raw = os.pread(fd, dynamic[1], dynamic[0])
    strtab = soname = None
    for tag, value in dyn.iter_unpack(raw[: len(raw) - len(raw) % dyn.size]):
        if tag == _DT_NULL:
            break
        if tag == _DT_STRTAB:
            strtab = value
        elif tag == _DT_SONAME:
            soname = value
    if strtab is None or soname is None:
        return None
    for vaddr, offset, filesz in loads:
        if vaddr <= strtab < vaddr + filesz:
            text = os.pread(fd, 4096, offset + strtab - vaddr + soname)
            cut = text.find(b"\0")
            return os.fsdecode(text[:cut]) if cut > 0 else None
    return None
