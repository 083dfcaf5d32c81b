"""The simulated node's user-space driver files: versioned libraries (tiny loadable ELF
objects with the real SONAMEs) with their links and ``ld.so.cache``, a labelled simulated
``nvidia-smi`` (a POSIX sh script kept in ``nvshim/data/sim-nvidia-smi.sh``) and stubs of
the other programs, GSP firmware, and the daemons' UNIX sockets.
"""

from __future__ import annotations

import os
import socket

from nvshim.host.elf import build_shared_object
from nvshim.host.ldcache import FLAG_ELF_LIBC6, CacheEntry, build_ldcache
from nvshim.sim.model import (
    DRIVER_BINARIES,
    LIB32_DIR,
    LIB_DIR,
    SIM_LIBRARIES32,
    SimNode,
    write_bytes,
    write_text,
)

__all__ = ["write_binaries", "write_daemon_files", "write_firmware", "write_libraries"]

_SMI_SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "sim-nvidia-smi.sh"
)


def _library(
    directory: str, base: str, suffix: str | None, version: str, i386: bool = False
) -> str:
    """Write ``<base>.so.<version>`` and its SONAME link; return the SONAME."""
    file_name = f"{base}.so.{version}"
    soname = f"{base}{suffix}" if suffix else file_name
    marker = f"NVSHIM-SIM {'i386 ' if i386 else ''}{file_name} {version}"
    # An i386 library names libc.so.6, as NVIDIA's do: ldconfig then flags it libc6 (3)
    # rather than plain ELF (1), as the cache written below says.
    needed = ("libc.so.6",) if i386 else ()
    write_bytes(
        os.path.join(directory, file_name),
        build_shared_object(soname, marker, needed, i386=i386),
        0o644,
    )
    if soname != file_name:
        os.symlink(file_name, os.path.join(directory, soname))
    return soname


def write_libraries(node: SimNode) -> None:
    """The driver branch's libraries (:attr:`SimNode.libraries`) with their links, the vdpau
    one, ld.so.cache/conf; the 32-bit copies (:data:`SIM_LIBRARIES32`) in :data:`LIB32_DIR`,
    listed in the cache as i386 entries."""
    libdir = os.path.join(node.root, LIB_DIR)
    libdir32 = os.path.join(node.root, LIB32_DIR)
    os.makedirs(libdir, exist_ok=True)
    cache: list[tuple[str, str] | CacheEntry] = []
    for base, suffix, dev_link in node.libraries:
        soname = _library(libdir, base, suffix, node.driver_version)
        cache.append((soname, f"/{LIB_DIR}/{soname}"))
        if dev_link:
            os.symlink(soname, os.path.join(libdir, f"{base}.so"))
            cache.append((f"{base}.so", f"/{LIB_DIR}/{base}.so"))
        if base in SIM_LIBRARIES32:
            soname = _library(libdir32, base, suffix, node.driver_version, i386=True)
            cache.append(CacheEntry(soname, f"/{LIB32_DIR}/{soname}", FLAG_ELF_LIBC6))
    _library(os.path.join(libdir, "vdpau"), "libvdpau_nvidia", ".so.1", node.driver_version)
    etc = os.path.join(node.root, "etc")
    write_bytes(os.path.join(etc, "ld.so.cache"), build_ldcache(cache, "new"))
    write_text(os.path.join(etc, "ld.so.conf"), "include /etc/ld.so.conf.d/*.conf\n")
    write_text(os.path.join(etc, "ld.so.conf.d", "x86_64-linux-gnu.conf"), f"/{LIB_DIR}\n")
    write_text(os.path.join(etc, "ld.so.conf.d", "i386-linux-gnu.conf"), f"/{LIB32_DIR}\n")


_STUB = """#!/bin/sh
# SIMULATED {name} (nvshim sim): a labelled stub, not NVIDIA's program.
echo "SIMULATED {name} (nvshim sim): stub of driver {version}, does nothing" >&2
exit 0
"""


def _smi_table(node: SimNode) -> str:
    rows = []
    for gpu in node.gpus:
        rows.append(f"gpu|{gpu.minor}|{gpu.uuid}|{gpu.pci_bus_id}|{gpu.model}")
        for m in gpu.mig:
            rows.append(f"mig|{m.gi_cap_minor}|{m.ci_cap_minor}|{m.uuid}|{m.profile}")
    return "\n".join(rows)


def write_binaries(node: SimNode) -> None:
    """``usr/bin/nvidia-smi`` (simulated, labelled) and a labelled stub of each other program."""
    bindir = os.path.join(node.root, "usr", "bin")
    with open(_SMI_SCRIPT, encoding="utf-8") as fh:
        smi = fh.read()
    script = (
        smi.replace("@DRIVER@", node.driver_version)
        .replace("@CUDA@", node.cuda_version)
        .replace("@TABLE@", _smi_table(node))
        .replace("@RULE@", "+" + "-" * 93 + "+")
    )
    write_text(os.path.join(bindir, "nvidia-smi"), script, 0o755)
    for name in DRIVER_BINARIES:
        stub = _STUB.format(name=name, version=node.driver_version)
        write_text(os.path.join(bindir, name), stub, 0o755)


def write_firmware(node: SimNode) -> None:
    """The GSP firmware files under ``lib/firmware/nvidia/<version>/``."""
    firmware = os.path.join(node.root, "lib", "firmware", "nvidia", node.driver_version)
    for name in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        write_text(os.path.join(firmware, name), f"NVSHIM-SIM {name} {node.driver_version}\n")


def write_daemon_files(node: SimNode) -> None:
    """The persistenced (and fabric manager) socket, the MPS dir, cufile.json (with GDS)."""
    _bind_socket(os.path.join(node.root, "run", "nvidia-persistenced"))
    os.makedirs(os.path.join(node.root, "var"), exist_ok=True)
    os.symlink("../run", os.path.join(node.root, "var", "run"))
    os.makedirs(os.path.join(node.root, "tmp", "nvidia-mps"), exist_ok=True)
    if node.nvswitches:
        _bind_socket(os.path.join(node.root, "run", "nvidia-fabricmanager"))
    if node.gds:
        write_text(
            os.path.join(node.root, "etc", "cufile.json"),
            '{"NVSHIM-SIM": "cufile.json", "logging": {"level": "ERROR"}}\n',
        )


def _bind_socket(directory: str) -> None:
    """A listening-less UNIX socket ``<directory>/socket``, bound through /proc/self/fd so a
    deep root does not hit the 108-byte sun_path limit."""
    os.makedirs(directory, exist_ok=True)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.bind(f"/proc/self/fd/{dir_fd}/socket")
    finally:
        os.close(dir_fd)
