"""The 32-bit (i386) driver libraries: what ``compat32`` adds and where it is found.

``NVIDIA_DRIVER_CAPABILITIES`` ``compat32`` asks for the 32-bit copies of the libraries the
container's other capabilities select (``compat32,compute``: the i386 libcuda,
ptxjitcompiler, nvvm, OpenCL, allocator; ``compat32,graphics``: GLX/EGL/GLES and the GL
cores …), as NVIDIA's legacy libnvidia-container does. ``compat32`` alone adds nothing.
Steam, Wine/Proton and any 32-bit GL, Vulkan or CUDA program need them.

Where. A driver root keeps them in one of three folders:

- ``/usr/lib/i386-linux-gnu`` — NVIDIA's ``.run`` installer on a multiarch distribution;
- ``/usr/lib32`` — the same installer elsewhere (and Ubuntu's ``lib32`` copies);
- ``/usr/lib/i386-linux-gnu/nvidia/current`` — Debian's packages, reached through the
  update-alternatives links in ``/usr/lib/i386-linux-gnu`` (followed inside the root).

The driver root's ld.so.cache is read for its i386 entries (flags ``0x0003``, which the
x86-64 lookup skips); when it has none (an i386 folder no ``ldconfig`` has seen) the
folders above are searched in that order. Every file found must be an ELF32 i386 object
(read from its header): a 64-bit file in ``/usr/lib`` is never mounted as a 32-bit one.

Each library is mounted where it lies in the root, like the 64-bit ones, with its
SONAME link beside it; the container's ld.so.cache gets its folder, and ld.so tells the
entries apart by their flags (the in-root writer labels each library by its ELF header).
NVIDIA's legacy library puts them in the image's own 32-bit folder instead (Debian-based
images ``/usr/lib/i386-linux-gnu``, others ``/usr/lib32`` or ``/usr/lib``); nvshim keeps the
host's path for both word sizes, as CDI does for 64-bit, and the cache makes either found.

The records are :class:`~nvshim.host.driverfiles.Library` with capability ``compat32``,
found by :func:`~nvshim.host.driverfiles.find_library32` with these rules.
Nothing here runs unless a container asks for ``compat32``: a ``compute,utility`` create
never reads an i386 cache entry or folder. The node plan cache keeps the answer
(:mod:`nvshim.runtime.plancache`, section ``libraries32``, checked only when asked).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

__all__ = [
    "CAPABILITY",
    "I386_FLAGS",
    "LIB32_DIRS",
    "bases32",
    "candidates32",
    "is_i386_elf",
    "is_lib32_path",
    "ldcache32",
]

#: The capability that asks for the 32-bit libraries.
CAPABILITY = "compat32"
#: ld.so.cache flags of an i386 library: glibc's FLAG_ELF_LIBC6 (what ldconfig writes for a
#: library linked with libc.so.6), and plain FLAG_ELF (one that names no libc), both of
#: which the i386 loader accepts and the x86-64 one skips.
I386_FLAGS = (0x0003, 0x0001)
#: Folders searched, in order, when the ld.so.cache has no i386 entry for a library.
LIB32_DIRS = (
    "/usr/lib/i386-linux-gnu",
    "/usr/lib/i386-linux-gnu/nvidia/current",
    "/usr/lib32",
    "/lib/i386-linux-gnu",
    "/lib32",
    "/usr/lib",
)
_ELFCLASS32, _EM_386 = 1, 3
# Folders only 32-bit libraries live in (``/usr/lib`` is 64-bit's on Debian-like nodes).
_ONLY32 = ("/usr/lib/i386-linux-gnu/", "/usr/lib32/", "/lib/i386-linux-gnu/", "/lib32/")


def is_lib32_path(path: str) -> bool:
    """Whether ``path`` lies in a folder only 32-bit libraries use (a CDI spec's mount of
    such a file is kept only for ``compat32``)."""
    return path.startswith(_ONLY32)


def is_i386_elf(path: str) -> bool:
    """Whether the file at ``path`` (a host path) is a little-endian ELF32 i386 object."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(20)
    except OSError:
        return False
    return (
        len(head) == 20
        and head[:4] == b"\x7fELF"
        and head[4] == _ELFCLASS32
        and head[5] == 1
        and int.from_bytes(head[18:20], "little") == _EM_386
    )


def ldcache32(path: str) -> Dict[str, str]:
    """The i386 entries of the ld.so.cache at ``path``: name → path, the preferred first."""
    from nvshim.host.ldcache import read_ldcache

    entries: Dict[str, str] = {}
    for entry in read_ldcache(path):
        if entry.flags in I386_FLAGS:
            entries.setdefault(entry.key, entry.value)
    return entries


def bases32(
    capabilities: Iterable[str],
    libraries: Mapping[str, Sequence[str]],
    library_sets: Mapping[str, Sequence[str]],
) -> Dict[str, str]:
    """Library base name → its library set, for the 32-bit copies ``capabilities`` ask for:
    the libraries (``libraries``, per set) of the sets (``library_sets``) of the other
    capabilities; empty without ``compat32``."""
    caps = sorted(set(capabilities))
    wanted: Dict[str, str] = {}
    if CAPABILITY not in caps:
        return wanted
    for cap in caps:
        for libset in library_sets.get(cap, ()):
            for base in libraries[libset]:
                wanted.setdefault(base, libset)
    return wanted


def candidates32(
    resolve: Callable[[str], Optional[str]], cache: Mapping[str, str], base: str, filename: str
) -> List[str]:
    """Where the i386 ``filename`` (of library ``base``) may be, in order: beside (and
    behind, through ``resolve``: links followed in the root) the i386 cache entries of
    ``base``, then :data:`LIB32_DIRS` and their ``vdpau/`` folders. The caller keeps the
    first that is a regular file and :func:`is_i386_elf`."""
    out: List[str] = []
    for key, value in cache.items():
        if key == filename or key.startswith(base + ".so"):
            out.append(os.path.join(os.path.dirname(value), filename))
            resolved = resolve(value)  # Debian: …/i386-linux-gnu/nvidia/current/
            if resolved is not None:
                out.append(os.path.join(os.path.dirname(resolved), filename))
    out.extend(os.path.join(d, filename) for d in LIB32_DIRS)
    out.extend(os.path.join(d, "vdpau", filename) for d in LIB32_DIRS[:3])
    return list(dict.fromkeys(out))
