"""The in-root work (nvshim.runtime.rootwork, run by the hook or by the runtime before runc):
SONAME links and ld.so.cache in the rootfs under runc's and crun's layouts, the image's
own cache, and hostile images; the glibc loader reading what was written."""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
import subprocess
from pathlib import Path

import pytest

from nvshim import hook
from nvshim.host.elf import build_shared_object
from nvshim.host.ldcache import HWCAP_EXTENSION, CacheEntry, build_ldcache, parse_ldcache
from tests.helpers.hookworld import (
    I386,
    LIBDIR,
    LINKS,
    VERSION,
    X86_64,
    cache_of,
    check_injected,
    default_args,
    hook_python,
    make_bundle,
    run_hook,
    runc_state,
    snapshot,
)

# --- the happy path under runc and crun ---------------------------------------------------


def test_runc_style_cwd_rootfs_and_no_root_in_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under runc (cwd = rootfs, rootfs from config root.path) links, conf and cache are made."""
    bundle, rootfs = make_bundle(tmp_path)
    rc, err = run_hook(monkeypatch, capsys, default_args(), runc_state(bundle), rootfs)
    assert (rc, err) == (0, "")
    check_injected(rootfs)


def test_crun_style_cwd_bundle_and_root_in_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under crun (cwd = bundle, state 'root' relative) the state's root is the one used."""
    bundle, rootfs = make_bundle(tmp_path, root_path="crun-root")
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "not-this-one"}}))
    state = {"ociVersion": "1.0", "id": "c1", "pid": 0, "root": "crun-root",
             "bundle": str(bundle), "status": "created"}  # fmt: skip
    rc, err = run_hook(monkeypatch, capsys, default_args(), state, bundle)
    assert (rc, err) == (0, "")
    check_injected(rootfs)
    assert not (bundle / "not-this-one").exists()


def test_second_run_rewrites_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Running the hook twice leaves every file it wrote untouched the second time (same inode)."""
    bundle, rootfs = make_bundle(tmp_path)
    assert run_hook(monkeypatch, capsys, default_args(), runc_state(bundle), rootfs)[0] == 0
    paths = ["etc/ld.so.cache", "etc/ld.so.conf", "etc/ld.so.conf.d/00-nvshim.conf",
             f"{LIBDIR.lstrip('/')}/libcuda.so.1"]  # fmt: skip
    inodes = [(rootfs / p).lstat().st_ino for p in paths]
    assert run_hook(monkeypatch, capsys, default_args(), runc_state(bundle), rootfs) == (0, "")
    assert [(rootfs / p).lstat().st_ino for p in paths] == inodes


def test_existing_cache_entries_are_kept_and_same_name_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The image's entries survive with their flags; an image libcuda.so.1 loses to the injected one."""
    bundle, rootfs = make_bundle(tmp_path)
    old = [
        CacheEntry("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6", X86_64),
        CacheEntry("libc.so.6", "/lib/i386-linux-gnu/libc.so.6", I386),
        CacheEntry("libcuda.so.1", "/usr/local/cuda/compat/libcuda.so.1", X86_64),
        CacheEntry("libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1", I386),
    ]
    (rootfs / "etc/ld.so.cache").write_bytes(build_ldcache(old))
    assert run_hook(monkeypatch, capsys, default_args(), runc_state(bundle), rootfs) == (0, "")
    cache = cache_of(rootfs)
    assert cache[("libc.so.6", X86_64)] == "/lib/x86_64-linux-gnu/libc.so.6"
    assert cache[("libc.so.6", I386)] == "/lib/i386-linux-gnu/libc.so.6"
    assert cache[("libcuda.so.1", X86_64)] == f"{LIBDIR}/libcuda.so.1"
    assert cache[("libcuda.so.1", I386)] == "/usr/lib/i386-linux-gnu/libcuda.so.1"
    values = [e.value for e in parse_ldcache((rootfs / "etc/ld.so.cache").read_bytes())]
    assert "/usr/local/cuda/compat/libcuda.so.1" not in values


def test_compat_layout_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An image whose cache is in the old+new compat layout (glibc < 2.32) gets that layout back."""
    bundle, rootfs = make_bundle(tmp_path)
    old = [CacheEntry("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6", X86_64)]
    (rootfs / "etc/ld.so.cache").write_bytes(build_ldcache(old, layout="compat"))
    assert run_hook(monkeypatch, capsys, default_args(), runc_state(bundle), rootfs) == (0, "")
    data = (rootfs / "etc/ld.so.cache").read_bytes()
    assert data.startswith(b"ld.so-1.7.0")
    assert ("libcuda.so.1", X86_64) in cache_of(rootfs)


def test_glibc_hwcaps_entries_are_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """glibc-hwcaps entries (hwcap bit 62) are dropped, since their subdirectory table is not kept."""
    bundle, rootfs = make_bundle(tmp_path)
    old = [
        CacheEntry("libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1", X86_64),
        CacheEntry("libm.so.6", "/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libm.so.6", X86_64),
    ]
    data = bytearray(build_ldcache(old))
    index = [e.key for e in parse_ldcache(bytes(data))].index("libm.so.6")
    struct.pack_into("<Q", data, 48 + index * 24 + 16, HWCAP_EXTENSION)  # entry's hwcap field
    (rootfs / "etc/ld.so.cache").write_bytes(bytes(data))
    assert run_hook(monkeypatch, capsys, default_args(), runc_state(bundle), rootfs) == (0, "")
    cache = cache_of(rootfs)
    assert ("libm.so.6", X86_64) not in cache
    assert cache[("libz.so.1", X86_64)] == "/lib/x86_64-linux-gnu/libz.so.1"


@pytest.mark.parametrize("field", [4, 8])  # the entry's key offset, its value offset
def test_image_cache_entries_with_an_empty_name_are_dropped(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    field: int,
) -> None:
    """An image cache entry whose key or path is the empty string (ld.so reads such a cache)
    is dropped, not carried into a cache nvshim then cannot write: the create goes on."""
    bundle, rootfs = make_bundle(tmp_path)
    old = [
        CacheEntry("libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1", X86_64),
        CacheEntry("libm.so.6", "/lib/x86_64-linux-gnu/libm.so.6", X86_64),
    ]
    data = bytearray(build_ldcache(old))
    index = [e.key for e in parse_ldcache(bytes(data))].index("libm.so.6")
    empty = data.index(b"\0", 48 + len(old) * 24)  # the NUL ending the first string
    struct.pack_into("<I", data, 48 + index * 24 + field, empty)
    assert "" in {v for e in parse_ldcache(bytes(data)) for v in (e.key, e.value)}
    (rootfs / "etc/ld.so.cache").write_bytes(bytes(data))
    assert run_hook(monkeypatch, capsys, default_args(), runc_state(bundle), rootfs) == (0, "")
    cache = cache_of(rootfs)
    assert all(key and value for (key, _), value in cache.items())
    assert cache[("libz.so.1", X86_64)] == "/lib/x86_64-linux-gnu/libz.so.1"
    check_injected(rootfs)


def test_image_cache_over_the_hooks_size_bound_is_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The hook reads an image ld.so.cache of up to LDCACHE_HOOK_MAX_BYTES (past the
    runtime's 4 MiB: the runtime hands such a cache to it); one byte more fails in one line
    naming the file before anything is parsed (millions of tiny entries would cost a create
    tens of seconds and gigabytes), and the image's file is left as it was."""
    from nvshim.runtime.rootcache import LDCACHE_HOOK_MAX_BYTES, LDCACHE_MAX_BYTES

    bundle, rootfs = make_bundle(tmp_path)
    old = build_ldcache([CacheEntry("libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1", X86_64)])
    over_runtime = old + b"\0" * (LDCACHE_MAX_BYTES + 1 - len(old))  # bytes ld.so ignores
    (rootfs / "etc/ld.so.cache").write_bytes(over_runtime)
    assert run_hook(monkeypatch, capsys, default_args(), runc_state(bundle), rootfs) == (0, "")
    assert cache_of(rootfs)[("libz.so.1", X86_64)] == "/lib/x86_64-linux-gnu/libz.so.1"

    at_bound = old + b"\0" * (LDCACHE_HOOK_MAX_BYTES - len(old))
    (rootfs / "etc/ld.so.cache").write_bytes(at_bound + b"\0")
    rc, err = run_hook(monkeypatch, capsys, default_args(), runc_state(bundle), rootfs)
    assert rc == 1
    assert err == (
        f"nvshim hook: cannot update the ld.so.cache in {rootfs}: /etc/ld.so.cache: "
        f"larger than {LDCACHE_HOOK_MAX_BYTES} bytes\n"
    )
    assert (rootfs / "etc/ld.so.cache").read_bytes() == at_bound + b"\0"


def test_runtime_scans_a_compat_folder_of_at_most_the_bound_of_image_libraries(
    tmp_path: Path,
) -> None:
    """On the runtime path (host root, in the engine's cgroup) the one image folder still
    scanned is a newer CUDA compat folder, and only up to MAX_FOLDER_LIBS of its libraries
    (a million lib*.so files held a create for a minute); past it none of them is opened,
    the planned driver files and the image's own cache entries are still listed, and one
    warning line says why. The library folder itself is never scanned there."""
    from nvshim.host import inroot
    from nvshim.runtime.rootcache import COMPAT_DIR, MAX_FOLDER_LIBS, update_ldcache

    _, rootfs = make_bundle(tmp_path)
    libdir = rootfs / LIBDIR.lstrip("/")
    compat = rootfs / COMPAT_DIR.lstrip("/")
    compat.mkdir(parents=True)
    planned = {
        LIBDIR: {
            f"libcuda.so.{VERSION}": (X86_64, "libcuda.so.1"),
            f"libnvidia-ml.so.{VERSION}": (X86_64, "libnvidia-ml.so.1"),
        }
    }
    (libdir / "libimage.so.1").write_bytes(build_shared_object("libimage.so.1"))
    (compat / "libcuda.so.575.57.08").write_bytes(build_shared_object("libcuda.so.1"))
    for i in range(MAX_FOLDER_LIBS - 1):  # with the compat libcuda: exactly at the bound
        (compat / f"libfill{i}.so").write_bytes(b"")
    (compat / "not-a-lib").write_bytes(b"")  # names ldconfig would not consider do not count
    image_cache = build_ldcache(
        [CacheEntry("libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1", X86_64)]
    )
    (rootfs / "etc/ld.so.cache").write_bytes(image_cache)
    with inroot.open_root(str(rootfs)) as root:
        assert update_ldcache(root, [LIBDIR], planned, VERSION) == []
    cache = cache_of(rootfs)
    assert cache[("libcuda.so.575.57.08", X86_64)] == f"{COMPAT_DIR}/libcuda.so.575.57.08"
    assert ("libimage.so.1", X86_64) not in cache  # the image's cache does not list it

    (rootfs / "etc/ld.so.cache").write_bytes(image_cache)
    (compat / "libfill-one-more.so").write_bytes(b"")
    with inroot.open_root(str(rootfs)) as root:
        warnings = update_ldcache(root, [LIBDIR], planned, VERSION)
    assert warnings == [
        f"{COMPAT_DIR} holds {MAX_FOLDER_LIBS + 1} of the image's libraries, more "
        f"than the {MAX_FOLDER_LIBS} read: only the image's own ld.so.cache "
        "lists them"
    ]
    cache = cache_of(rootfs)
    assert ("libcuda.so.575.57.08", X86_64) not in cache
    assert cache[("libz.so.1", X86_64)] == "/lib/x86_64-linux-gnu/libz.so.1"
    assert cache[("libcuda.so.1", X86_64)] == f"{LIBDIR}/libcuda.so.{VERSION}"
    assert cache[(f"libnvidia-ml.so.{VERSION}", X86_64)] == f"{LIBDIR}/libnvidia-ml.so.{VERSION}"


def test_corrupt_image_cache_is_replaced_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cache ld.so could not read anyway is rebuilt from the folders, with one warning line."""
    bundle, rootfs = make_bundle(tmp_path)
    (rootfs / "etc/ld.so.cache").write_bytes(b"garbage that is no cache")
    rc, err = run_hook(monkeypatch, capsys, default_args(), runc_state(bundle), rootfs)
    assert rc == 0
    assert err.startswith("nvshim hook: warning: ignoring the image's /etc/ld.so.cache")
    assert err.count("\n") == 1
    check_injected(rootfs)


def test_folder_scan_labels_and_filters_libraries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """32-bit ELF gets i386 flags; linker scripts, FIFOs, dangling links and non-lib names get none."""
    bundle, rootfs = make_bundle(tmp_path)
    libdir = rootfs / LIBDIR.lstrip("/")
    elf32 = b"\x7fELF\x01\x01\x01" + bytes(9) + struct.pack("<HH", 3, 3) + bytes(32)
    (libdir / "libold32.so.1").write_bytes(elf32)
    (libdir / "libc.so").write_bytes(b"/* GNU ld script */\nGROUP ( libc.so.6 )\n")
    os.mkfifo(libdir / "libfifo.so.1")
    (libdir / "libgone.so.1").symlink_to("libgone.so.1.0")
    (libdir / "notalib.so").write_bytes(build_shared_object("notalib.so"))
    (libdir / "libnosoname.so.2").write_bytes(build_shared_object("libnosoname.so.2"))
    assert run_hook(monkeypatch, capsys, default_args(), runc_state(bundle), rootfs) == (0, "")
    keys = {key for key, _ in cache_of(rootfs)}
    assert ("libold32.so.1", I386) in cache_of(rootfs)
    assert {"libc.so", "libfifo.so.1", "libgone.so.1", "notalib.so"}.isdisjoint(keys)
    assert "libnosoname.so.2" in keys


def test_folder_scan_resolves_every_kind_of_link_as_the_root_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The scan answers a same-folder link from the file it names (chains included) and
    resolves any other link in the root: each link gets the flags of the library it
    reaches, or no entry when it reaches none (loop, directory, ".", "..", dangling)."""
    bundle, rootfs = make_bundle(tmp_path)
    libdir = rootfs / LIBDIR.lstrip("/")
    elf32 = b"\x7fELF\x01\x01\x01" + bytes(9) + struct.pack("<HH", 3, 3) + bytes(32)
    (libdir / "libz.so.1.2.13").write_bytes(build_shared_object("libz.so.1"))
    (libdir / "libz.so.1").symlink_to("libz.so.1.2.13")  # the common case
    (libdir / "libz.so").symlink_to("libz.so.1")  # a chain in the folder
    (libdir / "libold32.so.1.0").write_bytes(elf32)
    (libdir / "libold32.so.1").symlink_to("./libold32.so.1.0")  # a "/": resolved in the root
    other = rootfs / "opt/lib"
    other.mkdir(parents=True)
    (other / "libx.so.3.0").write_bytes(build_shared_object("libx.so.3"))
    (libdir / "libx.so.3").symlink_to("/opt/lib/libx.so.3.0")  # absolute: in the root
    (libdir / "liby.so.1").symlink_to("../../../opt/lib/libx.so.3.0")  # relative, elsewhere
    (libdir / "libloop.so.1").symlink_to("libloop.so.2")
    (libdir / "libloop.so.2").symlink_to("libloop.so.1")
    (libdir / "libdir.so.1").mkdir()
    (libdir / "libtodir.so.1").symlink_to("libdir.so.1")
    (libdir / "libdot.so.1").symlink_to(".")
    (libdir / "libdotdot.so.1").symlink_to("..")
    (libdir / "libgone.so.1").symlink_to("libgone.so.1.0")
    (libdir / "libhost.so.1").symlink_to("/etc/passwd")  # the root's /etc/passwd: absent
    assert run_hook(monkeypatch, capsys, default_args(), runc_state(bundle), rootfs) == (0, "")
    cache = cache_of(rootfs)
    for name in ("libz.so.1.2.13", "libz.so.1", "libz.so", "libx.so.3", "liby.so.1"):
        assert cache[(name, X86_64)] == f"{LIBDIR}/{name}", name
    assert cache[("libold32.so.1", I386)] == f"{LIBDIR}/libold32.so.1"
    keys = {key for key, _ in cache}
    assert {
        "libloop.so.1",
        "libloop.so.2",
        "libdir.so.1",
        "libtodir.so.1",
        "libdot.so.1",
        "libdotdot.so.1",
        "libgone.so.1",
        "libhost.so.1",
    }.isdisjoint(keys)


def test_soname_without_link_points_at_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A library whose SONAME link is not made still gets a SONAME entry, pointing at the file."""
    bundle, rootfs = make_bundle(tmp_path)
    args = hook.build_hook_args([], [LIBDIR])
    assert run_hook(monkeypatch, capsys, args, runc_state(bundle), rootfs) == (0, "")
    assert cache_of(rootfs)[("libcuda.so.1", X86_64)] == f"{LIBDIR}/libcuda.so.{VERSION}"


def test_rootfs_without_etc_gets_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A scratch image without /etc gets /etc (0755) made in the root, and the cache in it."""
    bundle, rootfs = make_bundle(tmp_path)
    (rootfs / "etc").rmdir()
    assert run_hook(monkeypatch, capsys, default_args(), runc_state(bundle), rootfs) == (0, "")
    assert stat.S_IMODE((rootfs / "etc").stat().st_mode) == 0o755
    check_injected(rootfs)


def test_links_only_touches_no_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --folder the hook makes the links and leaves /etc alone."""
    bundle, rootfs = make_bundle(tmp_path)
    args = hook.build_hook_args(LINKS, [])
    assert run_hook(monkeypatch, capsys, args, runc_state(bundle), rootfs) == (0, "")
    assert os.readlink(rootfs / LIBDIR.lstrip("/") / "libcuda.so.1") == f"libcuda.so.{VERSION}"
    assert list((rootfs / "etc").iterdir()) == []


# --- hostile images -----------------------------------------------------------------------


def test_libdir_symlink_to_host_dir_stays_in_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An image whose lib dir is a symlink to an absolute host dir gets links inside the root only."""
    bundle, rootfs = make_bundle(tmp_path)
    host = tmp_path / "host-libdir"
    host.mkdir()
    (host / "keep").write_text("host")
    libdir = rootfs / LIBDIR.lstrip("/")
    shutil.rmtree(libdir)
    libdir.symlink_to(host)
    before = snapshot(host)
    rc, err = run_hook(monkeypatch, capsys, default_args(), runc_state(bundle), rootfs)
    assert (rc, err) == (0, "")
    assert snapshot(host) == before
    inside = rootfs / str(host).lstrip("/")
    assert os.readlink(inside / "libcuda.so.1") == f"libcuda.so.{VERSION}"


def test_ld_so_conf_d_symlink_to_host_dir_stays_in_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """/etc/ld.so.conf.d, ld.so.cache and ld.so.conf linking to the host never get written there."""
    bundle, rootfs = make_bundle(tmp_path)
    host_conf, host_etc = tmp_path / "host-conf.d", tmp_path / "host-etc"
    host_conf.mkdir()
    host_etc.mkdir()
    (host_etc / "ld.so.cache").write_bytes(b"host cache")
    (rootfs / "etc/ld.so.conf.d").symlink_to(host_conf)
    (rootfs / "etc/ld.so.cache").symlink_to(host_etc / "ld.so.cache")
    (rootfs / "etc/ld.so.conf").symlink_to("../../../host-etc/ld.so.conf")  # dangling: to create
    before = snapshot(tmp_path / "host-conf.d"), snapshot(host_etc)
    rc, err = run_hook(monkeypatch, capsys, default_args(), runc_state(bundle), rootfs)
    assert (rc, err) == (0, "")
    assert (snapshot(tmp_path / "host-conf.d"), snapshot(host_etc)) == before
    assert (rootfs / str(host_conf).lstrip("/") / "00-nvshim.conf").is_file()
    assert ("libcuda.so.1", X86_64) in cache_of(rootfs)
    conf = rootfs / "etc/ld.so.conf"  # the dangling link is replaced, not written through
    assert not conf.is_symlink() and conf.read_text().startswith("include ")


def test_soname_link_path_symlinked_to_host_file_is_replaced_in_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pre-planted libcuda.so.1 and conf file linking to host files are replaced, hosts untouched."""
    bundle, rootfs = make_bundle(tmp_path)
    victim = tmp_path / "host-victim"
    victim.write_bytes(b"precious")
    (rootfs / LIBDIR.lstrip("/") / "libcuda.so.1").symlink_to(victim)
    (rootfs / "etc/ld.so.conf.d").mkdir()
    (rootfs / "etc/ld.so.conf.d/00-nvshim.conf").symlink_to(victim)
    rc, err = run_hook(monkeypatch, capsys, default_args(), runc_state(bundle), rootfs)
    assert (rc, err) == (0, "")
    assert victim.read_bytes() == b"precious"
    assert not (rootfs / "etc/ld.so.conf.d/00-nvshim.conf").is_symlink()
    assert os.readlink(rootfs / LIBDIR.lstrip("/") / "libcuda.so.1") == f"libcuda.so.{VERSION}"


def test_dotdot_in_link_path_stays_in_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """'..' in a --link path is clamped at the rootfs like '/..' in a chroot."""
    bundle, rootfs = make_bundle(tmp_path)
    args = hook.build_hook_args([("t", "/../../../../escaped-link")], [])
    assert run_hook(monkeypatch, capsys, args, runc_state(bundle), rootfs) == (0, "")
    assert not (tmp_path / "escaped-link").is_symlink()
    assert not (bundle / "escaped-link").is_symlink()
    assert os.readlink(rootfs / "escaped-link") == "t"


def test_symlink_loop_fails_with_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A lib dir that is a symlink loop fails the create with one line naming the link."""
    bundle, rootfs = make_bundle(tmp_path)
    libdir = rootfs / LIBDIR.lstrip("/")
    shutil.rmtree(libdir)
    libdir.symlink_to("x86_64-linux-gnu")
    rc, err = run_hook(monkeypatch, capsys, default_args(), runc_state(bundle), rootfs)
    assert rc == 1
    assert err.count("\n") == 1
    assert err.startswith(f"nvshim hook: cannot link {LIBDIR}/libcuda.so.1 -> libcuda.so.{VERSION}")
    assert "symbolic links" in err


# --- the real loader ----------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a private mount namespace")
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_glibc_loader_finds_library_through_written_cache(tmp_path: Path) -> None:
    """The real ld.so, given the hook's cache as /etc/ld.so.cache, dlopens a lib by its SONAME."""
    libdir = tmp_path / "libs"  # same path on the 'host' and in the rootfs
    bundle = tmp_path / "bundle"
    rootfs = bundle / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    inside = rootfs / str(libdir).lstrip("/")
    inside.mkdir(parents=True)
    libdir.symlink_to(inside)
    (inside / "libnvshimtest.so.1.2.3").write_bytes(
        build_shared_object("libnvshimtest.so.1", marker="nvshim-test-lib")
    )
    if Path("/etc/ld.so.cache").is_file():
        shutil.copyfile("/etc/ld.so.cache", rootfs / "etc/ld.so.cache")
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}}))
    args = hook.build_hook_args(
        [("libnvshimtest.so.1.2.3", f"{libdir}/libnvshimtest.so.1")], [str(libdir)]
    )
    proc = subprocess.run(
        [hook_python(), "-I", "-m", "nvshim.hook", *args],
        input=json.dumps(runc_state(bundle)), env={"LC_ALL": "C"}, cwd=rootfs,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (proc.returncode, proc.stderr) == (0, "")
    probe = (
        "import ctypes, sys; ctypes.CDLL('libnvshimtest.so.1'); "
        "print([l.split()[-1] for l in open('/proc/self/maps') if 'nvshimtest' in l][0])"
    )
    script = f'mount --bind "$1" /etc/ld.so.cache && exec /usr/bin/python3 -I -c "{probe}"'
    loaded = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
         str(rootfs / "etc/ld.so.cache")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == str(inside / "libnvshimtest.so.1.2.3")


def test_soname_read_from_a_given_head_matches_a_fresh_read(tmp_path: Path) -> None:
    """The folder scan hands read_soname_fd the 4 KiB it already read: the answer is the
    one a read of its own gives, for whole libraries and for files cut anywhere (a cut
    inside the program headers is no SONAME either way)."""
    from nvshim.host.elf import read_soname_fd

    whole = build_shared_object("libcut.so.7")
    for cut in sorted({len(whole), 4096, 600, 200, 120, 100, 64, 52, 20, 0}):
        path = tmp_path / f"lib{cut}.so"
        path.write_bytes(whole[:cut])
        fd = os.open(path, os.O_RDONLY)
        try:
            fresh = read_soname_fd(fd)
            assert read_soname_fd(fd, head=os.pread(fd, 4096, 0)) == fresh, cut
        finally:
            os.close(fd)
        if cut == len(whole):
            assert fresh == "libcut.so.7"
