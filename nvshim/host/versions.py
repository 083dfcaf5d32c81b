"""The driver's versions: the userspace files', the kernel module's, and the CUDA version
libcuda supports.

Functions of the :class:`~nvshim.host.discovery.Host`, which calls them through its
methods of the same names and imports this module only then: a create answered by the
node plan cache reads no version and never loads it.
"""

from __future__ import annotations

import os

from nvshim.errors import HostError
from nvshim.host.capabilities import LIB_DIRS

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Optional

    from nvshim.host import Roots

__all__ = ["cuda_version", "files_version", "module_version"]

# Compiled on first use: ``re`` is a costly import (BENCHMARKS.md), and a create with a
# fresh node plan cache never reads the version.
_VERSION_PATTERN = r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9]+(?:\.[0-9]+)+)"


def module_version(host: Roots) -> Optional[str]:
    """The loaded kernel module's version (``/proc/driver/nvidia/version``), or None."""
    import re

    text = host.read_text("/proc/driver/nvidia/version")
    match = re.search(_VERSION_PATTERN, text) if text else None
    return match.group(1) if match else None


def files_version(host: Roots) -> Optional[str]:
    """The version of the driver's userspace files, or None when there are none.

    As the reference does: the suffix of ``libcuda.so.<version>``, else of
    ``libnvidia-ml.so.<version>`` — first the one the driver root's ld.so.cache names,
    then the first found in :data:`LIB_DIRS`.
    """
    import re

    for base in ("libcuda", "libnvidia-ml"):
        pattern = re.compile(rf"^{re.escape(base)}\.so\.([0-9]+(?:\.[0-9]+){{1,2}})$")
        for key, value in host.ldcache().items():
            if key.startswith(base + ".so"):
                resolved = host._regular_file(value)
                match = pattern.match(resolved.rsplit("/", 1)[1]) if resolved else None
                if match:
                    return match.group(1)
        for directory in LIB_DIRS:
            try:
                names = sorted(os.listdir(host.host_path(directory)))
            except OSError:
                continue
            for name in names:
                match = pattern.match(name)
                if match and host._regular_file(f"{directory}/{name}"):
                    return match.group(1)
    return None


def cuda_version(host: Roots) -> Optional[str]:
    """The newest CUDA version libcuda says it supports (``12.2``), or None.

    ``cuDriverGetVersion`` answers without a GPU or a loaded module. The library is
    loaded in a child process (``python -I``, empty environment, 10 s): a driver
    library never runs inside nvshim itself. Callers keep the answer (the node plan
    cache stores it), so it runs once per driver, never on an ordinary create.
    """
    try:
        lib = host.find_library("libcuda", "compute")
    except HostError:  # no driver version: no libcuda either
        return None
    if lib is None or not _mentions(lib.host_path, b"cuDriverGetVersion"):
        return None  # no such function to call (a stub): no child process either
    import subprocess
    import sys

    code = (
        "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); v = ctypes.c_int(0); "
        "sys.exit(3) if lib.cuDriverGetVersion(ctypes.byref(v)) else print(v.value)"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", code, lib.host_path],
            capture_output=True,
            timeout=10,
            env={},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = done.stdout.decode("ascii", "replace").strip()
    if done.returncode != 0 or not text.isdigit() or int(text) <= 0:
        return None
    raw = int(text)
    return f"{raw // 1000}.{raw % 1000 // 10}"


def _mentions(path: str, name: bytes) -> bool:
    """Whether the file holds ``name`` (a symbol name in a library's string table)."""
    import mmap

    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(name) >= 0
    except (OSError, ValueError):  # ValueError: an empty file cannot be mapped
        return False
