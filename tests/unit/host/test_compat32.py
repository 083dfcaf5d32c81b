"""compat32: the 32-bit (i386) driver libraries, found on each layout a node has.

Simulated nodes (their i386 copies in /usr/lib/i386-linux-gnu, listed in the cache as
i386 entries) reshaped by hand into Debian's alternatives layout, NVIDIA's installer's
/usr/lib32 and roots whose cache or folder lacks them; the plan cache's 32-bit section;
CDI specs cut to compat32. ``tests/e2e/test_compat32_e2e.py`` runs containers on them and
``test_real_driver`` on Debian's real i386 packages.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from nvshim.edits import RO_BIND, Edits, Mount
from nvshim.host.compat32 import LIB32_DIRS, is_i386_elf
from nvshim.host.discovery import Host
from nvshim.host.elf import build_shared_object
from nvshim.host.ldcache import FLAG_ELF_LIBC6, CacheEntry, build_ldcache, read_ldcache
from nvshim.runtime.cdiedits import restrict_to_capabilities
from nvshim.runtime.hostedits import driver_edits, hook_links

VERSION = "550.54.15"
LIB32 = "/usr/lib/i386-linux-gnu"
NESTED32 = f"{LIB32}/nvidia/current"


@pytest.fixture(autouse=True)
def _root():
    if os.geteuid() != 0:
        pytest.skip("simulated nodes need root (mknod)")


def make(tmp_path: Path) -> str:
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path / "node"), gpus=1).root


def libs32(host: Host, caps: str) -> dict:
    """container path → capability of every compat32 library ``caps`` gives."""
    return {
        lib.container_path: lib.capability
        for lib in host.libraries(caps.split(","))
        if lib.capability == "compat32"
    }


def without_i386_cache_entries(root: str) -> None:
    """Rewrite the root's ld.so.cache with its x86-64 entries only."""
    path = f"{root}/etc/ld.so.cache"
    kept = [e for e in read_ldcache(path) if e.flags != FLAG_ELF_LIBC6]
    Path(path).write_bytes(build_ldcache(kept))


def test_compat32_adds_the_i386_copies_of_the_other_capabilities_libraries(tmp_path):
    """compat32,compute gives the i386 libcuda, ptxjitcompiler, nvvm, OpenCL and allocator
    (capability compat32, where they lie); compat32,graphics the GLX/EGL libraries and GL
    cores; the 64-bit set is unchanged; no 32-bit NVML without utility."""
    host = Host(make(tmp_path))
    compute = libs32(host, "compat32,compute")
    assert set(compute) == {
        f"{LIB32}/{b}.so.{VERSION}"
        for b in (
            "libcuda",
            "libnvidia-ptxjitcompiler",
            "libnvidia-nvvm",
            "libnvidia-opencl",
            "libnvidia-allocator",
        )
    }
    graphics = libs32(host, "compat32,graphics")
    for base in (
        "libGLX_nvidia",
        "libEGL_nvidia",
        "libnvidia-glcore",
        "libnvidia-eglcore",
        "libnvidia-tls",
    ):
        assert f"{LIB32}/{base}.so.{VERSION}" in graphics
    assert f"{LIB32}/libnvidia-ml.so.{VERSION}" in libs32(host, "compat32,utility")
    assert not any("libnvidia-ml" in p for p in compute)
    sixty_four = [lib.host_path for lib in host.libraries(["compute"])]
    assert [
        lib.host_path
        for lib in host.libraries(["compute", "compat32"])
        if lib.capability != "compat32"
    ] == sixty_four
    for lib in host.libraries(["compute", "compat32"]):
        assert is_i386_elf(lib.host_path) == (lib.capability == "compat32"), lib


def test_without_compat32_nothing_32_bit_is_looked_up(tmp_path):
    """compute,utility (and compat32 alone) give no i386 library: with the 32-bit folder
    made unreadable garbage the lookup would notice, nothing changes."""
    root = make(tmp_path)
    host = Host(root)
    assert libs32(host, "compute,utility") == {} and libs32(host, "compat32") == {}
    assert host.libraries(["compat32"]) == ()
    Path(f"{root}/etc/ld.so.cache").write_bytes(b"not a cache")  # x86-64 lookup: fails too
    fresh = Host(root)
    assert fresh._ldcache32 is None
    with pytest.raises(Exception, match="ld.so.cache"):
        fresh.libraries(["compute"])
    assert fresh._ldcache32 is None  # the i386 entries were never read


def test_debian_alternatives_layout_mounts_the_file_behind_the_links(tmp_path):
    """Debian's i386 packages: files in …/i386-linux-gnu/nvidia/current, the i386 cache
    naming /usr/lib/i386-linux-gnu/libcuda.so.1 → /etc/alternatives/… (absolute, resolved
    inside the root): the nested file is mounted at its own path, its SONAME beside it."""
    root = make(tmp_path)
    os.makedirs(root + NESTED32)
    for name in sorted(os.listdir(root + LIB32)):
        if name.startswith("lib") and name != "nvidia":
            shutil.move(f"{root}{LIB32}/{name}", f"{root}{NESTED32}/{name}")
    os.makedirs(f"{root}/etc/alternatives", exist_ok=True)
    os.symlink(
        "/etc/alternatives/nvidia--libcuda.so.1-i386-linux-gnu", f"{root}{LIB32}/libcuda.so.1"
    )
    os.symlink(
        f"{NESTED32}/libcuda.so.1", f"{root}/etc/alternatives/nvidia--libcuda.so.1-i386-linux-gnu"
    )
    host = Host(root)
    libcuda = next(
        lib
        for lib in host.libraries(["compute", "compat32"])
        if lib.capability == "compat32" and lib.base == "libcuda"
    )
    assert libcuda.container_path == f"{NESTED32}/libcuda.so.{VERSION}"
    assert libcuda.host_path == f"{root}{NESTED32}/libcuda.so.{VERSION}"
    assert libcuda.soname == "libcuda.so.1"
    edits = driver_edits((), [libcuda], (), ("/hook",))
    assert (f"libcuda.so.{VERSION}", f"{NESTED32}/libcuda.so.1") in hook_links([libcuda])
    assert f"--folder={NESTED32}" in "=".join(edits.hooks[0].args)


def test_installer_lib32_without_cache_entries_is_found_by_its_folder(tmp_path):
    """NVIDIA's installer's /usr/lib32 and an ld.so.cache with no i386 entry (no ldconfig
    has seen the folder): the libraries are still found there."""
    root = make(tmp_path)
    os.rename(root + LIB32, root + "/usr/lib32")
    without_i386_cache_entries(root)
    got = libs32(Host(root), "compat32,compute,utility")
    assert f"/usr/lib32/libcuda.so.{VERSION}" in got
    assert f"/usr/lib32/libnvidia-ml.so.{VERSION}" in got


def test_a_64_bit_file_in_a_32_bit_folder_is_never_taken(tmp_path):
    """A 64-bit libcuda.so.<v> in /usr/lib32 (and in /usr/lib, where Fedora keeps i386):
    not a 32-bit library, not mounted; the i386 one still is."""
    root = make(tmp_path)
    for folder in ("/usr/lib32", "/usr/lib"):
        os.makedirs(root + folder, exist_ok=True)
        Path(f"{root}{folder}/libnvidia-ml.so.{VERSION}").write_bytes(
            build_shared_object("libnvidia-ml.so.1")
        )
    os.unlink(f"{root}{LIB32}/libnvidia-ml.so.{VERSION}")
    got = libs32(Host(root), "compat32,compute,utility")
    assert not any("libnvidia-ml" in p for p in got)
    assert f"{LIB32}/libcuda.so.{VERSION}" in got


def test_missing_32_bit_set_is_named_and_the_rest_still_given(tmp_path):
    """A driver folder without the 32-bit set: the 64-bit libraries are still given and
    missing() names what compat32 asked for and did not find, per capability asked."""
    root = make(tmp_path)
    shutil.rmtree(root + LIB32)
    host = Host(root)
    assert libs32(host, "compat32,compute,utility,graphics") == {}
    assert any(lib.base == "libcuda" for lib in host.libraries(["compute", "compat32"]))
    missing = host.missing(["compat32", "compute", "utility", "graphics"])
    for name in ("libcuda", "libnvidia-ml", "libGLX_nvidia", "libEGL_nvidia"):
        assert f"{name} (compat32)" in missing
    assert not any(m.endswith(("(compute)", "(utility)", "(graphics)")) for m in missing)
    assert host.missing(["compute", "utility"]) == ()


def test_the_32_bit_allocator_never_takes_the_gbm_link(tmp_path):
    """graphics,compat32: <libdir>/gbm/nvidia-drm_gbm.so points at the 64-bit allocator
    even though the i386 one comes after it."""
    host = Host(make(tmp_path))
    libs = host.libraries(["graphics", "compat32"])
    assert any(lib.base == "libnvidia-allocator" and lib.capability == "compat32" for lib in libs)
    gbm = [pair for pair in hook_links(libs) if pair[1].endswith("/nvidia-drm_gbm.so")]
    assert gbm == [
        ("../libnvidia-allocator.so.1", "/usr/lib/x86_64-linux-gnu/gbm/nvidia-drm_gbm.so")
    ]


def test_cdi_mounts_in_32_bit_folders_need_compat32():
    """A CDI spec made with compat32 mounts both libcuda files; a container asking for
    compute alone keeps only the 64-bit one and no link into the 32-bit folder."""
    from nvshim.runtime.hookargs import build_hook_args, parse_hook_args

    m64 = Mount(
        f"/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}",
        f"/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}",
        None,
        RO_BIND,
    )
    m32 = Mount(f"{LIB32}/libcuda.so.{VERSION}", f"{LIB32}/libcuda.so.{VERSION}", None, RO_BIND)
    from nvshim.edits import HOOK_ENV, Hook
    from nvshim.runtime.hookargs import hook_command

    links = [
        (f"libcuda.so.{VERSION}", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        (f"libcuda.so.{VERSION}", f"{LIB32}/libcuda.so.1"),
    ]
    command = hook_command()
    hook = Hook(
        "createContainer",
        command[0],
        (*command, *build_hook_args(links, ["/usr/lib/x86_64-linux-gnu", LIB32])),
        HOOK_ENV,
    )
    edits = Edits(mounts=(m64, m32), hooks=(hook,))
    compute = restrict_to_capabilities(edits, ["compute"])
    assert compute.mounts == (m64,)
    assert parse_hook_args(compute.hooks[0].args)[0] == [links[0]]
    both = restrict_to_capabilities(edits, ["compute", "compat32"])
    assert both.mounts == (m64, m32)
    assert parse_hook_args(both.hooks[0].args)[0] == links


def test_plan_cache_answers_compat32_and_checks_its_paths_only_when_asked(tmp_path):
    """The plan cache holds the 32-bit section: a compute,utility create's plan stays fresh
    when an i386 file changes (its paths are not checked), a compat32 lookup sees the change
    (rediscovered live) and otherwise answers from the plan."""
    from nvshim.runtime.planbuild import build
    from nvshim.runtime.plancache import CachedHost, load, stamp

    root = make(tmp_path)
    host = Host(root)
    doc = build(host)
    doc.update(stamp(host))
    assert doc["libraries32"]["libcuda"]["container_path"] == f"{LIB32}/libcuda.so.{VERSION}"
    assert doc["libraries32"]["libnvidia-cfg"] is None
    assert all(path.startswith(root) for path, _ in doc["watch32"])
    assert not any(LIB32 in path for path, _ in doc["watch"])
    plan = tmp_path / "plan.json"
    plan.write_text(__import__("json").dumps(doc))
    cached, why = load(str(plan), root, root)
    assert isinstance(cached, CachedHost), why
    assert f"{LIB32}/libcuda.so.{VERSION}" in libs32(cached, "compute,compat32")

    os.unlink(f"{root}{LIB32}/libcuda.so.{VERSION}")  # the i386 libcuda goes
    cached, why = load(str(plan), root, root)
    assert isinstance(cached, CachedHost), why  # compute,utility: the plan still answers
    assert len(cached.libraries(["compute", "utility"])) == len(
        host.libraries(["compute", "utility"])
    )
    got = libs32(cached, "compute,compat32")
    assert f"{LIB32}/libcuda.so.{VERSION}" not in got  # rediscovered: it is gone
    assert f"{LIB32}/libnvidia-opencl.so.{VERSION}" in got


def test_lib32_dirs_name_every_layout():
    """The folders searched cover the multiarch, Debian nested, lib32 and Fedora layouts."""
    assert LIB32_DIRS[:3] == (LIB32, NESTED32, "/usr/lib32") and "/usr/lib" in LIB32_DIRS


def test_i386_entries_are_read_from_the_cache(tmp_path):
    """An i386 cache entry pointing to a folder the search list lacks is followed."""
    root = make(tmp_path)
    os.makedirs(f"{root}/opt/nv32")
    for name in os.listdir(root + LIB32):
        shutil.move(f"{root}{LIB32}/{name}", f"{root}/opt/nv32/{name}")
    path = f"{root}/etc/ld.so.cache"
    entries = [e for e in read_ldcache(path) if e.flags != FLAG_ELF_LIBC6]
    entries.append(CacheEntry("libcuda.so.1", "/opt/nv32/libcuda.so.1", FLAG_ELF_LIBC6))
    Path(path).write_bytes(build_ldcache(entries))
    got = libs32(Host(root), "compat32,compute")
    assert set(got) == {f"/opt/nv32/libcuda.so.{VERSION}"}
