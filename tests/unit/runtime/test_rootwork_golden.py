"""The in-root work's output, byte for byte: the SONAME links, the loader files and the merged
ld.so.cache that :func:`nvshim.runtime.rootwork.prepare_in` leaves in several images, pinned
by digests recorded before the work was made cheaper (issue 44 item 4), and the written
cache read back by glibc's own ``ldconfig -p``. The runtime's cases were recorded again when
its cache came to take the image's libraries from the image's own cache (item 4): their
driver entries, links and loader files are as before, the image's files its cache does not
list are no longer added (:func:`test_runtime_cache_is_the_images_cache_and_the_plan`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from nvshim.host import inroot
from nvshim.host.elf import build_shared_object
from nvshim.host.ldcache import HWCAP_EXTENSION, CacheEntry, build_ldcache, parse_ldcache
from nvshim.runtime import rootwork
from nvshim.runtime.rootcache import update_ldcache

LIB = "/usr/lib/x86_64-linux-gnu"
VERSION = "550.54.15"
X86_64, I386 = 0x0303, 0x0003
DRIVER = [
    ("libcuda.so", "libcuda.so.1"),
    ("libnvidia-ml.so", "libnvidia-ml.so.1"),
    ("libnvidia-ptxjitcompiler.so", "libnvidia-ptxjitcompiler.so.1"),
    ("libcudadebugger.so", "libcudadebugger.so.1"),
]


def _image(root: Path, layout: Optional[str], compat_major: int, driver_files: bool) -> None:
    """An image: a library folder of files, link chains, odd entries; its own cache."""
    lib = root / LIB.lstrip("/")
    lib.mkdir(parents=True)
    (root / "lib").symlink_to("usr/lib")
    for i in range(30):
        name = f"libimg{i}.so.{i % 4}.{i}.{i * 7}"
        soname = f"libimg{i}.so.{i % 4}" if i % 5 else f"libother{i}.so.9"
        (lib / name).write_bytes(build_shared_object(soname, needed=("libc.so.6",) * (i % 2)))
        if i % 3:
            (lib / f"libimg{i}.so.{i % 4}").symlink_to(name)
        if i % 4 == 0:
            (lib / f"libimg{i}.so").symlink_to(f"libimg{i}.so.{i % 4}" if i % 3 else name)
    (lib / "libx32.so.1").write_bytes(build_shared_object("libx32.so.1", i386=True))
    (lib / "libjunk.so").write_bytes(b"not an elf file at all")
    (lib / "libdir.so").mkdir()
    os.mkfifo(lib / "libfifo.so.1")
    (lib / "libdangling.so.1").symlink_to("libnothere.so.1")
    (lib / "libloop.so.1").symlink_to("libloop.so.1")
    (lib / "libabs.so.1").symlink_to("/lib/x86_64-linux-gnu/libimg1.so.1.1.7")
    (lib / "libup.so.2").symlink_to("../x86_64-linux-gnu/libimg2.so.2.2.14")
    (lib / "libelse.so.1").symlink_to("/usr/local/cuda/compat/libcuda.so.1")  # elsewhere
    (lib / "libabsfifo.so.1").symlink_to("/lib/x86_64-linux-gnu/libfifo.so.1")
    (lib / "libabsloop.so.1").symlink_to("/lib/x86_64-linux-gnu/libabsloop.so.1")
    (lib / "libabsgone.so.1").symlink_to("/lib/x86_64-linux-gnu/libgone.so.1")
    (lib / "libabschain.so").symlink_to("/lib/x86_64-linux-gnu/libimg4.so")
    (lib / "libdotdot.so.1").symlink_to("/usr/lib/..")
    (lib / "libescape.so.3").symlink_to("../../../../../usr/lib/x86_64-linux-gnu/libimg3.so.3")
    (lib / "README").write_text("not a library\n")
    (lib / "libcuda.so.1").symlink_to("libcuda.so.470.1.1")  # the image's stale link
    if driver_files:  # runc has mounted the driver's files
        for stem, _so in DRIVER:
            (lib / f"{stem}.{VERSION}").write_bytes(build_shared_object(_so))
    compat = root / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    (compat / f"libcuda.so.{compat_major}.57.08").write_bytes(build_shared_object("libcuda.so.1"))
    (compat / "libcuda.so.1").symlink_to(f"libcuda.so.{compat_major}.57.08")
    if layout is None:
        return
    (root / "etc").mkdir()
    entries = [
        CacheEntry(f"libimg{i}.so.{i % 4}", f"{LIB}/libimg{i}.so.{i % 4}", X86_64)
        for i in range(0, 30, 2)
    ]
    entries += [
        CacheEntry("libcuda.so.1", f"{LIB}/libcuda.so.1", X86_64),
        CacheEntry("libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1", I386),
        CacheEntry("libstdc++.so.6", f"{LIB}/libstdc++.so.6", X86_64),
        CacheEntry("libc.so.6", f"{LIB}/libc.so.6", X86_64),
        CacheEntry("libcudart.so.12", "/usr/local/cuda/lib64/libcudart.so.12", X86_64),
    ]
    if layout == "new":
        entries.append(
            CacheEntry(
                "libc.so.6",
                "/usr/lib/glibc-hwcaps/x86-64-v3/libc.so.6",
                X86_64,
                HWCAP_EXTENSION | 1,
            )
        )
        data = build_ldcache([e for e in entries if not e.hwcap], "new")
        data = _with_hwcap_entry(data, entries[-1])
    else:
        data = build_ldcache(entries, layout)
    (root / "etc/ld.so.cache").write_bytes(data)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")


def _with_hwcap_entry(data: bytes, entry: CacheEntry) -> bytes:
    """``data`` (a new-layout cache) with its first entry's hwcap set to ``entry``'s: an
    image cache with a glibc-hwcaps entry, which the merge drops."""
    at = 48 + 16  # the first entry's hwcap field
    return data[:at] + entry.hwcap.to_bytes(8, "little") + data[at + 8 :]


def _work(minors: Optional[Tuple[int, ...]], driver_files: bool) -> rootwork.RootWork:
    links = [(f"{stem}.{VERSION}", f"{LIB}/{so}") for stem, so in DRIVER]
    links += [
        ("libcuda.so.1", f"{LIB}/libcuda.so"),
        ("libnvidia-ml.so.1", f"{LIB}/libnvidia-ml.so"),
    ]
    planned: Dict[str, Any] = {LIB: {}}
    for stem, so in DRIVER:
        planned[LIB][f"{stem}.{VERSION}"] = (X86_64, so)
        planned[LIB][so] = (X86_64, None)
    planned[LIB]["libcuda.so"] = (X86_64, None)
    planned[LIB]["libnvidia-ml.so"] = (X86_64, None)
    return rootwork.RootWork(links, [LIB], planned, VERSION, minors)


def _snapshot(root: Path) -> Dict[str, List[Any]]:
    out: Dict[str, List[Any]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath, name)
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                what = "->" + os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                what = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                what = ""
            out[str(path.relative_to(root))] = [oct(st.st_mode), what]
    return dict(sorted(out.items()))


def _digest(snapshot: Dict[str, List[Any]]) -> str:
    return hashlib.sha256(json.dumps(snapshot, sort_keys=True).encode()).hexdigest()[:20]


CASES = {
    # name: (image cache layout, compat libcuda major, driver files mounted, EGL minors, by)
    "agent-new-cache": ("new", 545, True, (0, 2), "prepare_in"),
    "runtime-compat-cache-newer-compat": ("compat", 575, False, None, "prepare_in"),
    "runtime-old-cache": ("old", 550, False, None, "prepare_in"),
    "no-cache-no-etc": (None, 545, True, (1,), "prepare_in"),
    "hook-new-cache": ("new", 575, True, None, "hook"),
}

#: _digest of each case's rootfs after the work, recorded with the code before issue 44
#: item 4 made it cheaper (same bytes, same links, same modes); the prepare_in cases again
#: once their cache is the image's own plus the planned names (the hook's is unchanged).
GOLDEN = {
    "agent-new-cache": "376100e5faedf5a82235",
    "runtime-compat-cache-newer-compat": "db3bbc19c6148cf255e9",
    "runtime-old-cache": "7e7cecfae45158c0fb3a",
    "no-cache-no-etc": "d0497c461edbc569dc2a",
    "hook-new-cache": "95880889e7467354b4c6",
}


def _run(tmp_path: Path, case: str) -> Path:
    layout, major, driver_files, minors, by = CASES[case]
    root = tmp_path / "rootfs"
    _image(root, layout, major, driver_files)
    work = _work(minors, driver_files)
    with inroot.open_root(str(root)) as fd:
        if by == "hook":  # the Python hook: the folders read, nothing planned
            rootwork.apply_links(fd, str(root), work.links)
            update_ldcache(fd, work.folders, None, VERSION)
        else:
            rootwork.prepare_in(fd, work)
    return root


@pytest.mark.parametrize("case", sorted(CASES))
def test_in_root_output_is_the_recorded_one(tmp_path: Path, case: str) -> None:
    """Each image's rootfs after the in-root work (links, ld.so.conf files, merged cache,
    EGL profile: bytes, link texts and modes) is exactly what it was before the work was
    made cheaper, and a second run leaves it as it is."""
    root = _run(tmp_path, case)
    first = _snapshot(root)
    assert _digest(first) == GOLDEN[case], json.dumps(first, indent=1)
    with inroot.open_root(str(root)) as fd:
        rootwork.prepare_in(fd, _work(CASES[case][3], CASES[case][2]))
    assert _snapshot(root) == first


@pytest.mark.skipif(shutil.which("ldconfig") is None, reason="no ldconfig")
@pytest.mark.parametrize("case", sorted(CASES))
def test_glibc_reads_the_merged_cache_as_nvshim_wrote_it(tmp_path: Path, case: str) -> None:
    """``ldconfig -p`` (glibc's reader) lists the written cache's entries, name and path,
    in the order nvshim's parser gives them."""
    root = _run(tmp_path, case)
    cache = root / "etc/ld.so.cache"
    res = subprocess.run(
        ["ldconfig", "-p", "-C", str(cache)], capture_output=True, text=True, check=True
    )
    listed = [
        (m.group(1), m.group(2))
        for m in (re.match(r"^\s+(\S+) \(.*\) => (\S+)$", ln) for ln in res.stdout.splitlines())
        if m
    ]
    ours = [(e.key, e.value) for e in parse_ldcache(cache.read_bytes())]
    assert listed == ours and len(ours) > 9


@pytest.mark.parametrize("case", [c for c in sorted(CASES) if CASES[c][4] == "prepare_in"])
def test_runtime_cache_is_the_images_cache_and_the_plan(tmp_path: Path, case: str) -> None:
    """On the runtime path the written cache is exactly the image's own entries (less the
    glibc-hwcaps ones and those a planned name replaces: same name and flags) plus the
    plan's (each planned name, each planned file's SONAME) and, for a newer compat folder,
    that folder's libraries: none of the image's files in the library folder is added."""
    from nvshim.runtime.rootcache import COMPAT_DIR

    layout, major, driver_files, minors, _by = CASES[case]
    image = tmp_path / "image"
    _image(image, layout, major, driver_files)
    before = image / "etc/ld.so.cache"
    own = parse_ldcache(before.read_bytes()) if before.exists() else []
    root = _run(tmp_path, case)
    work = _work(minors, driver_files)
    plan = set()
    for name, (flags, soname) in work.planned[LIB].items():
        plan.add((name, f"{LIB}/{name}", flags))
        if soname and soname != name:
            plan.add((soname, f"{LIB}/{soname}", flags))
    if major > 550:  # the compat libcuda is newer than the driver: its folder first
        plan |= {
            (f"libcuda.so.{major}.57.08", f"{COMPAT_DIR}/libcuda.so.{major}.57.08", X86_64),
            ("libcuda.so.1", f"{COMPAT_DIR}/libcuda.so.1", X86_64),
        }
    replaced = {(key, flags) for key, _path, flags in plan}
    kept = {
        (e.key, e.value, e.flags)
        for e in own
        if not e.hwcap & HWCAP_EXTENSION and (e.key, e.flags) not in replaced
    }
    written = {
        (e.key, e.value, e.flags) for e in parse_ldcache((root / "etc/ld.so.cache").read_bytes())
    }
    assert written == kept | plan


def test_threads_doing_the_work_at_once_each_get_their_own_images_output(tmp_path: Path) -> None:
    """The agent serves hooks on several threads that share the per-process memos (sort
    keys, parsed image caches, merged caches): images worked on at once, each twice,
    all come out exactly as when worked on alone."""
    import threading

    cases = sorted(CASES) * 2
    roots: List[Path] = []
    for i, case in enumerate(cases):
        layout, major, driver_files, _minors, _by = CASES[case]
        roots.append(tmp_path / f"{i}" / "rootfs")
        _image(roots[-1], layout, major, driver_files)
    errors: List[BaseException] = []
    start = threading.Barrier(len(cases))

    def work(case: str, root: Path) -> None:
        try:
            start.wait()
            layout, major, driver_files, minors, by = CASES[case]
            with inroot.open_root(str(root)) as fd:
                if by == "hook":
                    w = _work(minors, driver_files)
                    rootwork.apply_links(fd, str(root), w.links)
                    update_ldcache(fd, w.folders, None, VERSION)
                else:
                    rootwork.prepare_in(fd, _work(minors, driver_files))
        except BaseException as exc:  # reported below, with the case
            errors.append(exc)

    threads = [
        threading.Thread(target=work, args=(c, r)) for c, r in zip(cases, roots, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert [_digest(_snapshot(r)) for r in roots] == [GOLDEN[c] for c in cases]


@pytest.mark.skipif(
    shutil.which("ldconfig") is None or os.geteuid() != 0, reason="ldconfig -r needs root"
)
def test_runtime_and_hook_agree_for_an_image_whose_cache_is_up_to_date(tmp_path: Path) -> None:
    """For an image whose ld.so.cache its own ldconfig wrote over its current folder, the
    runtime's cache (the image's cache and the plan) and the hook's (the folder scanned)
    resolve every name the runtime's lists alike: the hook's only adds names ldconfig does
    not list (a library's full file name, its ``.so`` link)."""
    trees = {}
    for by in ("runtime", "hook"):
        root = tmp_path / by
        lib = root / LIB.lstrip("/")
        lib.mkdir(parents=True)
        (root / "etc/ld.so.conf.d").mkdir(parents=True)
        (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
        (root / "etc/ld.so.conf.d/multiarch.conf").write_text(f"{LIB}\n")
        for i in range(6):
            (lib / f"libimg{i}.so.{i}.0.1").write_bytes(build_shared_object(f"libimg{i}.so.{i}"))
            if i % 2:
                (lib / f"libimg{i}.so").symlink_to(f"libimg{i}.so.{i}")
        subprocess.run(["ldconfig", "-r", str(root)], check=True, capture_output=True)
        work = _work(None, by == "hook")
        with inroot.open_root(str(root)) as fd:
            if by == "hook":
                for stem, so in DRIVER:  # runc has mounted the driver's files
                    (lib / f"{stem}.{VERSION}").write_bytes(build_shared_object(so))
                rootwork.apply_links(fd, str(root), work.links)
                update_ldcache(fd, work.folders, None, VERSION)
            else:
                rootwork.prepare_in(fd, work)
        trees[by] = {
            (e.key, e.flags, e.value)
            for e in parse_ldcache((root / "etc/ld.so.cache").read_bytes())
        }
    assert len(trees["runtime"]) >= 16
    assert trees["runtime"] <= trees["hook"]
    assert {key for key, _f, _v in trees["hook"] - trees["runtime"]} == {
        f"libimg{i}.so.{i}.0.1" for i in range(6)
    } | {f"libimg{i}.so" for i in (1, 3, 5)}
