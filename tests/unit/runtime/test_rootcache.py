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


# --- the runtime's cache: the image's own entries and the planned ones (issue 44 item 4) ---


def _runtime_image(tmp_path: Path) -> Path:
    """A rootfs with image libraries in the driver folder (one in the image's cache, one
    not), a stale image libcuda.so.1 link, and the image's own cache."""
    from nvshim.host.elf import build_shared_object
    from nvshim.host.ldcache import CacheEntry, build_ldcache
    from tests.helpers.hookworld import LIBDIR, X86_64

    rootfs = tmp_path / "rootfs"
    lib = rootfs / LIBDIR.lstrip("/")
    lib.mkdir(parents=True)
    (rootfs / "etc").mkdir()
    (lib / "libcached.so.1.0").write_bytes(build_shared_object("libcached.so.1"))
    (lib / "libcached.so.1").symlink_to("libcached.so.1.0")
    (lib / "libuncached.so.2.0").write_bytes(build_shared_object("libuncached.so.2"))
    (lib / "libuncached.so.2").symlink_to("libuncached.so.2.0")
    (lib / "libcuda.so.1").symlink_to("libcuda.so.470.1.1")  # the image's stale link
    image = [
        CacheEntry("libcached.so.1", f"{LIBDIR}/libcached.so.1", X86_64),
        CacheEntry("libc.so.6", f"{LIBDIR}/libc.so.6", X86_64),
        CacheEntry("libcuda.so.1", "/usr/local/lib/libcuda.so.1", X86_64),  # a driver SONAME
    ]
    (rootfs / "etc/ld.so.cache").write_bytes(build_ldcache(image))
    return rootfs


def _planned() -> dict:  # type: ignore[type-arg]
    """What runc will mount in the folder and the SONAME links nvshim makes there."""
    from tests.helpers.hookworld import LIBDIR, VERSION, X86_64

    return {
        LIBDIR: {
            f"libcuda.so.{VERSION}": (X86_64, "libcuda.so.1"),
            "libcuda.so.1": (X86_64, None),
            "libcuda.so": (X86_64, None),
            f"libnvidia-ml.so.{VERSION}": (X86_64, "libnvidia-ml.so.1"),
            "libnvidia-ml.so.1": (X86_64, None),
        }
    }


def test_runtime_cache_is_the_images_own_plus_the_planned_names(tmp_path: Path) -> None:
    """With a plan the written cache is the image's own entries plus one per planned name
    (and SONAME): an image library in the folder that the image's cache does not list gets
    no entry, one it lists keeps the image's path, and a driver SONAME the image's cache
    lists elsewhere is replaced by the planned one."""
    from nvshim.host.ldcache import parse_ldcache
    from nvshim.runtime.rootcache import update_ldcache
    from tests.helpers.hookworld import LIBDIR, VERSION, X86_64

    rootfs = _runtime_image(tmp_path)
    with _inroot.open_root(str(rootfs)) as root:
        assert update_ldcache(root, [LIBDIR], _planned()) == []
    got = sorted((e.key, e.value) for e in parse_ldcache((rootfs / "etc/ld.so.cache").read_bytes()))
    assert got == sorted(
        [
            ("libcached.so.1", f"{LIBDIR}/libcached.so.1"),
            ("libc.so.6", f"{LIBDIR}/libc.so.6"),
            ("libcuda.so.1", f"{LIBDIR}/libcuda.so.1"),
            ("libcuda.so", f"{LIBDIR}/libcuda.so"),
            (f"libcuda.so.{VERSION}", f"{LIBDIR}/libcuda.so.{VERSION}"),
            ("libnvidia-ml.so.1", f"{LIBDIR}/libnvidia-ml.so.1"),
            (f"libnvidia-ml.so.{VERSION}", f"{LIBDIR}/libnvidia-ml.so.{VERSION}"),
        ]
    )
    assert {e.flags for e in parse_ldcache((rootfs / "etc/ld.so.cache").read_bytes())} == {X86_64}


def test_runtime_cache_opens_no_image_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime path opens none of the image's files in the injected folder (its
    libraries come from its own cache): no open of a library name, no ELF read."""
    from nvshim.runtime.rootcache import update_ldcache
    from tests.helpers.hookworld import LIBDIR

    rootfs = _runtime_image(tmp_path)
    opened: List[str] = []
    real_open, real_pread = os.open, os.pread

    def spy_open(path: object, *args: object, **kw: object) -> int:
        opened.append(str(path))
        return real_open(path, *args, **kw)  # type: ignore[arg-type]

    def spy_pread(fd: int, n: int, at: int) -> bytes:
        opened.append(f"pread {os.readlink(f'/proc/self/fd/{fd}')}")
        return real_pread(fd, n, at)

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "pread", spy_pread)
    with _inroot.open_root(str(rootfs)) as root:
        update_ldcache(root, [LIBDIR], _planned())
    monkeypatch.undo()
    assert opened, "the spy saw the cache's own reads"
    assert [p for p in opened if p.startswith(("pread", "lib")) and ".so" in p] == []


def test_runtime_cache_keeps_an_image_dev_link_to_a_planned_name(tmp_path: Path) -> None:
    """An image's ``.so`` link naming a planned name of the same folder (by its bare name,
    by the folder's path, or by another path to that folder) gets an entry with the
    planned flags, answered from the plan (readlinks, no file read); one naming an image
    file, or a planned name in another folder, gets none."""
    from nvshim.host.ldcache import parse_ldcache
    from nvshim.runtime.rootcache import update_ldcache
    from tests.helpers.hookworld import LIBDIR, VERSION, X86_64

    rootfs = _runtime_image(tmp_path)
    (rootfs / "lib").symlink_to("usr/lib")
    lib = rootfs / LIBDIR.lstrip("/")
    planned = _planned()
    del planned[LIBDIR]["libcuda.so"]  # not made by nvshim here: the image's link
    for stem, soname in (
        ("libnvidia-cfg", "libnvidia-cfg.so.1"),
        ("libnvidia-x", "libnvidia-x.so.1"),
    ):
        planned[LIBDIR][f"{stem}.so.{VERSION}"] = (X86_64, soname)
        planned[LIBDIR][soname] = (X86_64, None)
    planned[LIBDIR]["libnvidia-opencl.so.1"] = (X86_64, None)
    (lib / "libcuda.so").symlink_to("libcuda.so.1")
    (lib / "libnvidia-ml.so").symlink_to(f"{LIBDIR}/libnvidia-ml.so.1")
    (lib / "libnvidia-cfg.so").symlink_to("/lib/x86_64-linux-gnu/libnvidia-cfg.so.1")
    (lib / "libnvidia-x.so").symlink_to("/usr/local/lib/libnvidia-x.so.1")
    (lib / "libnvidia-opencl.so").symlink_to("libnvidia-opencl.so.535.1")  # an image file
    with _inroot.open_root(str(rootfs)) as root:
        update_ldcache(root, [LIBDIR], planned)
    entries = parse_ldcache((rootfs / "etc/ld.so.cache").read_bytes())
    cache = {(e.key, e.flags): e.value for e in entries}
    for name in ("libcuda.so", "libnvidia-ml.so", "libnvidia-cfg.so"):
        assert cache[(name, X86_64)] == f"{LIBDIR}/{name}", name
    assert ("libnvidia-x.so", X86_64) not in cache
    assert ("libnvidia-opencl.so", X86_64) not in cache


def test_runtime_cache_without_an_image_cache_lists_the_planned_names(tmp_path: Path) -> None:
    """An image without an ld.so.cache gets one listing only the planned names (its own
    libraries stay found through glibc's default directories, as without nvshim)."""
    from nvshim.host.ldcache import parse_ldcache
    from nvshim.runtime.rootcache import update_ldcache
    from tests.helpers.hookworld import LIBDIR

    rootfs = _runtime_image(tmp_path)
    (rootfs / "etc/ld.so.cache").unlink()
    with _inroot.open_root(str(rootfs)) as root:
        assert update_ldcache(root, [LIBDIR], _planned()) == []
    keys = {e.key for e in parse_ldcache((rootfs / "etc/ld.so.cache").read_bytes())}
    assert keys == {n for n in _planned()[LIBDIR]} | {"libcuda.so.1", "libnvidia-ml.so.1"}


def test_runtime_cache_puts_a_newer_compat_folder_first(tmp_path: Path) -> None:
    """On the runtime path an image's newer CUDA compat folder (the image's own, listed
    in the root) still goes first: the loader's first libcuda.so.1 is the compat one."""
    from nvshim.host.elf import build_shared_object
    from nvshim.host.ldcache import parse_ldcache
    from nvshim.runtime.rootcache import update_ldcache
    from tests.helpers.hookworld import LIBDIR, VERSION, X86_64

    rootfs = _runtime_image(tmp_path)
    compat = rootfs / COMPAT_DIR.lstrip("/")
    compat.mkdir(parents=True)
    (compat / "libcuda.so.575.57.08").write_bytes(build_shared_object("libcuda.so.1"))
    (compat / "libcuda.so.1").symlink_to("libcuda.so.575.57.08")
    with _inroot.open_root(str(rootfs)) as root:
        update_ldcache(root, [LIBDIR], _planned(), VERSION)
    entries = parse_ldcache((rootfs / "etc/ld.so.cache").read_bytes())
    first = next(e for e in entries if e.key == "libcuda.so.1" and e.flags == X86_64)
    assert first.value == f"{COMPAT_DIR}/libcuda.so.1"
    assert (rootfs / "etc/ld.so.conf.d/00-nvshim.conf").read_text().splitlines()[1:] == [
        COMPAT_DIR,
        LIBDIR,
    ]


def test_runtime_cache_with_an_image_file_shadowed_by_a_driver_mount(tmp_path: Path) -> None:
    """An image file where runc will mount a driver library of the same name (an image
    built with a driver installed) is never read: the planned entries replace the image
    cache's entries of the same name and flags, and its entries of other flags stay as
    they are, as today."""
    from nvshim.host.ldcache import CacheEntry, build_ldcache, parse_ldcache
    from nvshim.runtime.rootcache import update_ldcache
    from tests.helpers.hookworld import I386, LIBDIR, VERSION, X86_64

    rootfs = _runtime_image(tmp_path)
    lib = rootfs / LIBDIR.lstrip("/")
    (lib / f"libcuda.so.{VERSION}").write_bytes(b"not even an ELF file")  # runc mounts over
    image = [
        CacheEntry(f"libcuda.so.{VERSION}", f"{LIBDIR}/libcuda.so.{VERSION}", I386),
        CacheEntry(f"libcuda.so.{VERSION}", "/opt/old/libcuda.so", X86_64),
    ]
    (rootfs / "etc/ld.so.cache").write_bytes(build_ldcache(image))
    with _inroot.open_root(str(rootfs)) as root:
        assert update_ldcache(root, [LIBDIR], _planned()) == []
    entries = parse_ldcache((rootfs / "etc/ld.so.cache").read_bytes())
    named = sorted((e.flags, e.value) for e in entries if e.key == f"libcuda.so.{VERSION}")
    assert named == [
        (I386, f"{LIBDIR}/libcuda.so.{VERSION}"),
        (X86_64, f"{LIBDIR}/libcuda.so.{VERSION}"),
    ]
