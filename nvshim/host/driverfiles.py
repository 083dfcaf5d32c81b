"""Where the driver's files are found in the driver root: libraries, programs, data files,
firmware.

What each capability asks for is :mod:`nvshim.host.capabilities`' tables; these functions
look for it through the driver root's ld.so.cache and the standard folders, following
Debian's alternatives links inside the root. :class:`~nvshim.host.discovery.Host` calls
them through its methods of the same names and imports this module only then: a create
answered by the node plan cache never loads it.
"""

from __future__ import annotations

import os

from nvshim.host.capabilities import (
    BIN_DIRS,
    BINARIES,
    DATA_FILES,
    LIB_DIRS,
    OWN_VERSION_LIBRARIES,
    DriverFile,
    Library,
    system_libdir,
)

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Dict, Iterable, List, Optional, Tuple

    from nvshim.host import Roots

__all__ = ["binaries", "data_files", "find_library", "find_library32", "firmware", "ldcache"]


def ldcache(host: Roots) -> Dict[str, str]:
    """SONAME/file name → path (as the driver root sees it), x86-64 entries only."""
    from nvshim.host.ldcache import read_ldcache

    entries: Dict[str, str] = {}
    for entry in read_ldcache(host.host_path("/etc/ld.so.cache")):
        # 0x0300 = x86-64 libc6 library; keep the first (preferred) entry of a key.
        if entry.flags & 0xFF00 == 0x0300 or entry.flags == 0x0303:
            entries.setdefault(entry.key, entry.value)
    return entries


def _library_paths(host: Roots, base: str, filename: str) -> List[str]:
    """Where ``filename`` may be, in order: beside (and behind) the ld.so.cache's entries
    for ``base``, then :data:`~nvshim.host.capabilities.LIB_DIRS`."""
    candidates: List[str] = []
    for key, value in host.ldcache().items():
        if key == filename or key.startswith(base + ".so"):
            candidates.append(os.path.join(os.path.dirname(value), filename))
            resolved = host.resolve(value)  # Debian: libcuda.so.1 -> …/nvidia/current/
            if resolved is not None:
                candidates.append(os.path.join(os.path.dirname(resolved), filename))
    candidates.extend(os.path.join(d, filename) for d in LIB_DIRS)
    candidates.extend(os.path.join(d, "vdpau", filename) for d in LIB_DIRS[:2])
    return list(dict.fromkeys(candidates))


def _library_at(host: Roots, base: str, resolved: str, capability: str) -> Library:
    """The :class:`Library` whose file is ``resolved`` (an in-root path, links followed)."""
    from nvshim.host.elf import read_soname

    path = host.host_path(resolved)
    directory, filename = resolved.rsplit("/", 1)
    container = resolved
    if base == "libvdpau_nvidia":  # libvdpau looks in <libdir>/vdpau/ only
        container = f"{system_libdir(directory)}/vdpau/{filename}"
    soname = read_soname(path)
    return Library(
        base,
        path,
        container,
        soname,
        capability,
        _dev_link(path.rsplit("/", 1)[0], soname or filename),
    )


def find_library(host: Roots, base: str, capability: str) -> Optional[Library]:
    """Locate ``<base>.so.<driver version>`` (or, for the libraries the driver ships with
    their own version, the file behind their SONAME) inside the driver root.

    The file mounted is the one every link resolves to in the root; its container path is
    where it lies there (VDPAU's is moved into ``<libdir>/vdpau/``).
    """
    name = OWN_VERSION_LIBRARIES.get(base) or f"{base}.so.{host.driver_version()}"
    for candidate in _library_paths(host, base, name):
        resolved = host._regular_file(candidate)
        if resolved is not None:
            return _library_at(host, base, resolved, capability)
    return None


def find_library32(host: Roots, base: str, ldcache32: Dict[str, str]) -> Optional[Library]:
    """The 32-bit (i386) copy of ``base`` in the root, a ``compat32`` :class:`Library`, or
    None (the rules: :mod:`nvshim.host.compat32`; ``ldcache32``: its i386 cache entries)."""
    from nvshim.host import compat32

    name = OWN_VERSION_LIBRARIES.get(base) or f"{base}.so.{host.driver_version()}"
    for candidate in compat32.candidates32(host.resolve, ldcache32, base, name):
        resolved = host._regular_file(candidate)
        if resolved is not None and compat32.is_i386_elf(host.host_path(resolved)):
            return _library_at(host, base, resolved, compat32.CAPABILITY)
    return None


def _is_elf(path: str) -> bool:
    """Whether ``path`` starts like an ELF file (a program, not a script)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


def binaries(host: Roots, capabilities: Iterable[str]) -> Tuple[DriverFile, ...]:
    """The driver's programs of ``capabilities``, mounted where they were found in
    :data:`~nvshim.host.capabilities.BIN_DIRS` (the file behind Debian's alternatives
    links, in the root)."""
    out = []
    for cap in sorted(capabilities):
        for name in BINARIES.get(cap, ()):
            found = [
                (directory, resolved)
                for directory in BIN_DIRS
                if (resolved := host._regular_file(f"{directory}/{name}")) is not None
            ]
            if not found:
                continue
            # a wrapper script that execs the program by a host path would fail in the
            # container: the program itself (ELF), at the first place the name was found
            program = next((r for _, r in found if _is_elf(host.host_path(r))), found[0][1])
            at = found[0][0] if found[0][0] != "/usr/local/nvidia/bin" else "/usr/bin"
            out.append(DriverFile(host.host_path(program), f"{at}/{name}", cap, "binary"))
    return tuple(out)


def data_files(host: Roots, capabilities: Iterable[str]) -> Tuple[DriverFile, ...]:
    """The driver's configuration and data files of ``capabilities``
    (:data:`~nvshim.host.capabilities.DATA_FILES`): ICD and vendor JSONs, the OpenCL ICD,
    ``nvoptix.bin``, the Xorg modules."""
    caps = set(capabilities)
    version: Optional[str] = None
    out = []
    for cap, container_path, candidates in DATA_FILES:
        if cap not in caps:
            continue
        if "{version}" in container_path:
            version = version or host.driver_version()
            container_path = container_path.format(version=version)
            candidates = tuple(c.format(version=version) for c in candidates)
        for candidate in candidates:
            resolved = host._regular_file(candidate)
            if resolved is not None:
                target = container_path or candidate
                out.append(DriverFile(host.host_path(resolved), target, cap, "data"))
                break
    return tuple(out)


def firmware(host: Roots) -> Tuple[DriverFile, ...]:
    """The GSP firmware of the driver version
    (:meth:`~nvshim.host.discovery.Host.driver_version`)."""
    version = host.driver_version()
    directory = f"/lib/firmware/nvidia/{version}"
    resolved_dir = host.resolve(directory)
    if resolved_dir is None:
        return ()
    try:
        names = sorted(os.listdir(host.host_path(resolved_dir)))
    except OSError:
        return ()
    out = []
    for name in names:
        if name.startswith("gsp") and name.endswith(".bin"):
            resolved = host._regular_file(f"{resolved_dir}/{name}")
            if resolved is not None:
                out.append(
                    DriverFile(host.host_path(resolved), f"{directory}/{name}", None, "firmware")
                )
    return tuple(out)


def _dev_link(host_directory: str, name: str) -> Optional[str]:
    """``libx.so`` when ``name`` (``libx.so.1``) has that unversioned link in the folder (as
    the reference: only where the driver's folder has one, a link and not a file)."""
    cut = name.find(".so.")
    if cut < 0:
        return None
    link = name[: cut + 3]
    return link if os.path.islink(f"{host_directory}/{link}") else None
