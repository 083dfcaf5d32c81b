"""CUDA forward compatibility (nvshim.runtime.rootcache): when an image's compat libcuda goes
first (tables on temp rootfs trees)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import pytest

from nvshim.host import inroot as _inroot
from nvshim.runtime.hookargs import build_hook_args, parse_host_driver_version
from nvshim.runtime.rootcache import COMPAT_DIR, compat_folder, driver_major


def rootfs_with(tmp_path: Path, names: List[str]) -> Path:
    root = tmp_path / "rootfs"
    compat = root / COMPAT_DIR.lstrip("/")
    compat.mkdir(parents=True)
    for name in names:
        (compat / name).write_bytes(b"\x7fELF")
    return root


@pytest.mark.parametrize(
    ("names", "host", "expected"),
    [
        (["libcuda.so.575.57.08", "libcuda.so.1"], "550.54.15", COMPAT_DIR),
        (["libcuda.so.575.57"], "550.54.15", COMPAT_DIR),
        (["libcuda.so.550.90.07"], "550.54.15", None),  # same major: the driver stays
        (["libcuda.so.535.104.05"], "550.54.15", None),
        (["libcuda.so.575.57.08", "libcuda.so.580.1.2"], "550.54.15", None),  # not exactly one
        (["libcuda.so.1", "libnvidia-ptxjitcompiler.so.575.57.08"], "550.54.15", None),
        (["libcuda.so.575.57.08"], "garbage", None),
    ],
)
def test_compat_folder(
    tmp_path: Path, names: List[str], host: str, expected: Optional[str]
) -> None:
    root = _inroot.open_root(str(rootfs_with(tmp_path, names)))
    with root:
        assert compat_folder(root, host) == expected


def test_image_symlink_cannot_point_at_the_host(tmp_path: Path) -> None:
    """A compat dir that is a symlink to an absolute host path is resolved inside the rootfs."""
    host_compat = tmp_path / "host" / "compat"
    host_compat.mkdir(parents=True)
    (host_compat / "libcuda.so.999.1.1").write_bytes(b"\x7fELF")
    root_dir = tmp_path / "rootfs"
    (root_dir / "usr/local/cuda").mkdir(parents=True)
    os.symlink(str(host_compat), root_dir / "usr/local/cuda/compat")
    with _inroot.open_root(str(root_dir)) as root:
        assert compat_folder(root, "550.54.15") is None


def test_no_compat_dir_and_majors() -> None:
    assert driver_major("550.54.15") == 550 and driver_major("x.1") is None


def test_hook_args_carry_the_host_driver_version() -> None:
    """The runtime writes --host-driver-version; the in-root work reads it back."""
    args = [
        "python",
        "-c",
        "...nvshim.hook...",
        *build_hook_args([("libcuda.so.1", "/usr/lib/libcuda.so")], ["/usr/lib"], "550.54.15"),
    ]
    assert parse_host_driver_version(args) == "550.54.15"
    assert parse_host_driver_version(build_hook_args([], ["/usr/lib"])) is None
