"""A check over a whole test run: no NVIDIA-looking file appears in the host's driver folders,
and nothing is written under ``/var/lib/containers``.

A GPU create whose mounts or in-root work miss the container's rootfs (a rootfs that is the
host's ``/``, a path resolved on the host) leaves files where a driver installs its own:
runc makes each mount target as an empty file in the host's ``/usr/bin``, library folder,
``/lib/firmware``. ``tests/conftest.py`` takes a :func:`snapshot` at session start and fails
the run when :func:`new_files` finds any at the end.

Only NVIDIA-looking names count (:func:`nvidia_looking`): other processes may install
packages during a developer's run, and their files are none of the tests' doing. ``host`` is
the directory standing for the host's ``/`` (a temp dir in the helper's own tests).

Under ``/var/lib/containers`` (:data:`STATE`) every entry counts, new or rewritten (its
mtime is part of what is compared): podman and skopeo run as root write their blob info
cache there (``cache/blob-info-cache-v1.boltdb``) whatever ``--root`` says, so the tests
give them a private one (:func:`tests.helpers.podman.private_image_cache`).
"""

from __future__ import annotations

import fnmatch
import os
from typing import Iterable, List, Set

__all__ = ["FLAT", "RECURSIVE", "STATE", "guard_message", "new_files", "nvidia_looking", "snapshot"]

LIBDIR = "usr/lib/x86_64-linux-gnu"
#: Folders whose own entries are listed (not their subfolders): big, driver files at the top.
#: ``dev``: the real driver's libraries and nvidia-smi, run as root on the host, make
#: ``/dev/nvidiactl``, ``/dev/nvidia0`` … when missing (a probe run outside a container).
FLAT = (
    "usr/bin",
    "usr/sbin",
    LIBDIR,
    f"{LIBDIR}/vdpau",
    f"{LIBDIR}/gbm",
    "etc/alternatives",
    "dev",
)
#: Folders walked to the bottom: small, driver files in subfolders (``icd.d/``, ``<version>/``).
RECURSIVE = (
    f"{LIBDIR}/nvidia",
    "usr/lib/firmware/nvidia",
    "lib/firmware/nvidia",
    "usr/lib/xorg/modules",
    "usr/share/glvnd",
    "usr/share/vulkan",
    "usr/share/egl",
    "usr/share/nvidia",
    "etc/OpenCL",
    "etc/vulkan",
    "etc/glvnd",
)
#: Folders whose every entry (any name, files and folders) counts, new or rewritten: the
#: state of podman/skopeo run as root, which the tests keep in private roots.
STATE = ("var/lib/containers", "var/lib/containers/cache")
#: Names of driver files without "nvidia" in them (any name with it counts).
_PATTERNS = ("libcuda*", "libnvcuvid*", "libnvoptix*", "nvoptix*", "gsp*.bin")


def nvidia_looking(path: str) -> bool:
    """Whether a host path looks like one of the driver's files (``nvidia`` anywhere in it,
    ``libcuda*``, ``libnvcuvid*``, ``libnvoptix*``, ``gsp*.bin``)."""
    if "nvidia" in path.lower():
        return True
    name = os.path.basename(path)
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in _PATTERNS)


def _entries(directory: str, recursive: bool) -> Iterable[str]:
    """Paths of everything but folders in ``directory`` (symlinks not followed); nothing for
    a folder that is missing or unreadable."""
    try:
        with os.scandir(directory) as it:
            entries = list(it)
    except OSError:
        return
    for entry in entries:
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            continue
        if not is_dir:
            yield entry.path
        elif recursive:
            yield from _entries(entry.path, True)


def snapshot(host: str = "/") -> Set[str]:
    """The NVIDIA-looking files in the host's driver folders, as host paths (``/usr/bin/x``)."""
    found: Set[str] = set()
    seen: Set[str] = set()
    for folders, recursive in ((FLAT, False), (RECURSIVE, True)):
        for folder in folders:
            directory = os.path.join(host, folder)
            real = os.path.realpath(directory)  # /lib is /usr/lib on merged-/usr systems
            if real in seen:
                continue
            seen.add(real)
            for path in _entries(directory, recursive):
                shown = "/" + os.path.relpath(path, host)
                if nvidia_looking(shown):
                    found.add(shown)
    for folder in STATE:
        directory = os.path.join(host, folder)
        try:
            with os.scandir(directory) as it:
                entries = [(e.path, e.stat(follow_symlinks=False).st_mtime_ns) for e in it]
        except OSError:
            continue
        for path, mtime in entries:
            found.add(f"/{os.path.relpath(path, host)} (mtime {mtime})")
    return found


def new_files(before: Set[str], after: Set[str]) -> List[str]:
    """The paths in ``after`` and not in ``before``, sorted."""
    return sorted(after - before)


def guard_message(new: List[str], shown: int = 5) -> str:
    """The line that fails the run, naming up to ``shown`` of the ``new`` paths."""
    more = f" and {len(new) - shown} more" if len(new) > shown else ""
    return (
        f"FAILED: the tests left {len(new)} file(s) on the host (NVIDIA-looking ones in "
        "its driver folders: a mount target or in-root write that missed a container "
        "rootfs?; or podman/skopeo state under /var/lib/containers: a run without a "
        f"private image cache?): {', '.join(new[:shown])}{more}"
    )
