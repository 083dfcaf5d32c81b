"""CUDA forward compatibility: an image's newer ``libcuda`` goes before the host driver's.

A CUDA image built for a newer CUDA than the host driver supports can ship the CUDA
forward-compatibility package: ``/usr/local/cuda/compat/libcuda.so.<version>`` (with its
``libcuda.so.1`` link and friends), made to run on an older kernel driver. When the image
has exactly one ``libcuda.so.<major>.<minor>[.<patch>]`` there and its major version is
higher than the host driver's, that directory is put first in the container's loader
configuration (``/etc/ld.so.conf.d/00-nvshim.conf`` and the ld.so.cache), so
``libcuda.so.1`` resolves to the compat library; otherwise the host driver's libcuda stays
first (an older or equal compat library would only shadow the real driver). The reference
reads an ELF note of the compat library first and falls back to this major comparison;
nvshim uses the comparison alone.

Everything is read inside the container rootfs through :mod:`nvshim.host.inroot`: the image
controls this directory, so its symlinks cannot lead the check (or the cache) outside.
"""

from __future__ import annotations

from nvshim.host import inroot as _inroot

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

__all__ = ["COMPAT_DIR", "compat_folder", "driver_major"]

COMPAT_DIR = "/usr/local/cuda/compat"
# compiled only for an image that has the compat dir (re costs ~6 ms to import per create)
_COMPAT_LIBCUDA = r"^libcuda\.so\.([0-9]+)\.[0-9]+(?:\.[0-9]+)?$"


def driver_major(version: str) -> Optional[int]:
    """``550`` for ``550.54.15``; None when ``version`` does not start with a number."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def compat_folder(root: _inroot.RootFd, host_driver_version: str) -> Optional[str]:
    """:data:`COMPAT_DIR` when the image's compat libcuda is newer than the host driver."""
    host = driver_major(host_driver_version)
    if host is None:
        return None
    try:
        names = _inroot.list_dir(root, COMPAT_DIR)
    except OSError:
        return None  # not a directory, a symlink loop, unreadable: no compat package
    if not names:
        return None
    import re

    majors = [int(m.group(1)) for m in (re.match(_COMPAT_LIBCUDA, n) for n in names) if m]
    if len(majors) != 1 or majors[0] <= host:
        return None
    return COMPAT_DIR
