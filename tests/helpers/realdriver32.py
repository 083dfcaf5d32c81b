"""Debian's i386 NVIDIA packages: ``compat32`` on a real driver's files, and a 32-bit probe.

Debian 12 ships the 32-bit driver libraries as ``<package>:i386`` at the same version as
the x86-64 ones (535.309.01 when this was written). :data:`COMPAT32_PACKAGES` is the
compute set (:data:`tests.helpers.realdriver.COMPUTE_PACKAGES`) plus
:data:`I386_PACKAGES` (≈ 10.6 MB: libcuda, NVML, GLX/EGL/GLES, NVENC/NVDEC, allocator,
OpenCL, VDPAU, optical flow, FBC) plus ``libc6:i386`` (2.6 MB, the 32-bit loader and C
library of a test container; never laid into a driver root). They are fetched and cached
like the rest (:func:`tests.helpers.realdriver.driver_packages`: a private apt run with
i386 as an extra architecture of that run only; see
:func:`~tests.helpers.realdriver.debian_sources_list` for the i386 source lines).

:func:`tests.helpers.realdriver.make_driver_root` lays the i386 files out like the x86-64
ones: Debian's ``/usr/lib/i386-linux-gnu/nvidia/current`` with the alternatives links the
postinst makes for the i386 triplet, or the installer's ``/usr/lib/i386-linux-gnu``; the
root's ld.so.cache then has i386 (``libc6``) entries for them.

:func:`add_i386_loader` gives a glibc test rootfs ``/lib/ld-linux.so.2`` and the i386 C
library; :func:`build_probe32` compiles ``tests/probe/cudaprobe32.c`` with the host's
``gcc -m32`` against that C library (no gcc-multilib needed); its output reads like the
64-bit probe's first line (:func:`tests.helpers.realdriver.parse_probe`).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Tuple

from tests.helpers.bundle import update_ld_cache
from tests.helpers.realdriver import (
    COMPUTE_PACKAGES,
    CONTAINER_PACKAGES,
    DriverPackages,
)

__all__ = [
    "COMPAT32_PACKAGES",
    "I386_PACKAGES",
    "LOADER32",
    "PROBE32_SOURCE",
    "add_i386_loader",
    "build_probe32",
]

I386_PACKAGES: Tuple[str, ...] = tuple(
    f"{name}:i386"
    for name in (
        "libcuda1",
        "libnvidia-ml1",
        "libglx-nvidia0",
        "libegl-nvidia0",
        "libgles-nvidia1",
        "libgles-nvidia2",
        "libnvidia-encode1",
        "libnvcuvid1",
        "libnvidia-allocator1",
        "nvidia-opencl-icd",
        "nvidia-vdpau-driver",
        "libnvidia-opticalflow1",
        "libnvidia-fbc1",
    )
)
COMPAT32_PACKAGES: Tuple[str, ...] = COMPUTE_PACKAGES + I386_PACKAGES + CONTAINER_PACKAGES
LOADER32 = "/lib/ld-linux.so.2"
PROBE32_SOURCE = Path(__file__).resolve().parent.parent / "probe" / "cudaprobe32.c"
_LIBC32 = "libc6:i386"


def _extract(deb: Path, dest: Path) -> None:
    subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True, capture_output=True)


def add_i386_loader(rootfs: Path, packages: DriverPackages) -> None:
    """Unpack libc6:i386 into a (non-merged-/usr) glibc rootfs — ``/lib/ld-linux.so.2``,
    ``/lib/i386-linux-gnu``, its ``ld.so.conf.d`` file — and regenerate its ld.so.cache."""
    _extract(packages.debs[_LIBC32], rootfs)
    if not (rootfs / LOADER32.lstrip("/")).exists():
        raise AssertionError(f"{packages.debs[_LIBC32]} gave {rootfs} no {LOADER32}")
    update_ld_cache(rootfs)


def build_probe32(dest_dir: Path, packages: DriverPackages) -> Path:
    """Compile the 32-bit probe into ``dest_dir`` with the host's ``gcc -m32``, linked
    against libc6:i386's libc.so.6 (unpacked in a temporary folder); return the binary."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise AssertionError("gcc is not installed: the 32-bit probe is built at test time")
    out = Path(dest_dir) / "cudaprobe32"
    with tempfile.TemporaryDirectory(prefix="libc6-i386-", dir=dest_dir) as tmp:
        _extract(packages.debs[_LIBC32], Path(tmp))
        libdir = Path(tmp) / "lib/i386-linux-gnu"
        proc = subprocess.run(
            [
                gcc,
                "-m32",
                "-O2",
                "-Wall",
                "-fno-pie",
                "-no-pie",
                "-fno-stack-protector",
                "-nostdlib",
                "-nostartfiles",
                "-o",
                str(out),
                str(PROBE32_SOURCE),
                str(libdir / "libc.so.6"),
                f"-Wl,-rpath-link,{libdir}",
                f"-Wl,-dynamic-linker,{LOADER32}",
            ],
            capture_output=True,
            text=True,
        )
    if proc.returncode != 0:
        raise AssertionError(f"building {PROBE32_SOURCE} with gcc -m32 failed:\n{proc.stderr}")
    return out
