"""Driver files as real drivers lay them out: Debian's nested layout and its absolute
alternatives links resolved inside the driver root, a kernel module older than the files,
graphics and display files, VDPAU's folder, missing files named, the CUDA version from
libcuda. Simulated nodes reshaped by hand; ``test_real_driver`` runs Debian's real files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from nvshim.config import Config
from nvshim.host.discovery import Host
from nvshim.runtime.hostedits import driver_edits, hook_links

VERSION = "550.54.15"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
NESTED = f"{LIBDIR}/nvidia/current"


@pytest.fixture(autouse=True)
def _root():
    if os.geteuid() != 0:
        pytest.skip("simulated nodes need root (mknod)")


def make(tmp_path: Path, **kw):
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path / "node"), **kw)


def alternative(root: str, link: str, name: str, target: str) -> None:
    """``link`` -> /etc/alternatives/<name> -> ``target``: absolute, as update-alternatives
    writes them (both resolve on the host when followed there)."""
    os.makedirs(f"{root}/etc/alternatives", exist_ok=True)
    os.makedirs(os.path.dirname(root + link), exist_ok=True)
    if os.path.lexists(root + link):
        os.unlink(root + link)
    os.symlink(f"/etc/alternatives/{name}", root + link)
    os.symlink(target, f"{root}/etc/alternatives/{name}")


def debianize(root: str) -> None:
    """Reshape a simulated node into Debian's layout: versioned libraries and their SONAME
    links in …/nvidia/current, alternatives links for the SONAMEs in the library folder and
    for nvidia-smi in /usr/bin, vdpau beside the rest, an ld.so.cache naming the links."""
    from nvshim.host.ldcache import build_ldcache

    src = root + LIBDIR
    os.makedirs(root + NESTED)
    for name in sorted(os.listdir(src)):
        if name.startswith("lib") and ".so" in name:
            shutil.move(f"{src}/{name}", f"{root}{NESTED}/{name}")
    vdpau = f"libvdpau_nvidia.so.{VERSION}"
    shutil.move(f"{src}/vdpau/{vdpau}", f"{root}{NESTED}/{vdpau}")
    shutil.rmtree(f"{src}/vdpau")
    entries = []
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1"):
        alternative(
            root, f"{LIBDIR}/{soname}", f"nvidia--{soname}-x86_64-linux-gnu", f"{NESTED}/{soname}"
        )
        entries.append((soname, f"{LIBDIR}/{soname}"))
    os.makedirs(f"{root}/usr/lib/nvidia/current")
    shutil.move(f"{root}/usr/bin/nvidia-smi", f"{root}/usr/lib/nvidia/current/nvidia-smi")
    alternative(
        root, "/usr/bin/nvidia-smi", "nvidia--nvidia-smi", "/usr/lib/nvidia/current/nvidia-smi"
    )
    with open(f"{root}/etc/ld.so.cache", "wb") as fh:
        fh.write(build_ldcache(entries))


def test_debian_layout_is_resolved_inside_the_driver_root(tmp_path):
    """Absolute alternatives links are followed in the driver root, as if chrooted: libraries
    come from …/nvidia/current and /usr/bin/nvidia-smi is the root's file behind the links."""
    node = make(tmp_path, gpus=1)
    debianize(node.root)
    host = Host(node.root)
    libs = {lib.base: lib for lib in host.libraries(["compute", "utility"])}
    assert libs["libcuda"].container_path == f"{NESTED}/libcuda.so.{VERSION}"
    assert libs["libcuda"].host_path == node.root + libs["libcuda"].container_path
    smi = {f.container_path: f for f in host.binaries(["utility"])}["/usr/bin/nvidia-smi"]
    assert smi.host_path == f"{node.root}/usr/lib/nvidia/current/nvidia-smi"
    assert Host(node.root).missing(["compute", "utility"]) == ()


def test_a_wrapper_script_gives_way_to_the_program_it_runs(tmp_path):
    """A driver kept under /usr/local/nvidia (GKE/COS installers; seen on a real H100 node):
    /usr/bin/nvidia-smi is a script that execs /usr/local/nvidia/bin/nvidia-smi, a path the
    container lacks; the ELF program is mounted at /usr/bin/nvidia-smi instead."""
    node = make(tmp_path, gpus=1)
    real = Path(node.root, "usr/local/nvidia/bin/nvidia-smi")
    real.parent.mkdir(parents=True)
    shutil.copy("/bin/true", real)  # an ELF program
    wrapper = Path(node.root, "usr/bin/nvidia-smi")
    wrapper.write_text('#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi "$@"\n')
    smi = [
        f for f in Host(node.root).binaries(["utility"]) if f.container_path.endswith("/nvidia-smi")
    ]
    assert [(f.host_path, f.container_path) for f in smi] == [(str(real), "/usr/bin/nvidia-smi")]
    os.unlink(wrapper)  # only under /usr/local/nvidia/bin: still where a container's PATH finds it
    smi = [
        f for f in Host(node.root).binaries(["utility"]) if f.container_path.endswith("/nvidia-smi")
    ]
    assert [(f.host_path, f.container_path) for f in smi] == [(str(real), "/usr/bin/nvidia-smi")]


def test_a_link_out_of_the_root_never_reaches_the_host(tmp_path):
    """A driver-root link whose absolute target exists only on the host (or that climbs out
    with ..) is not injected: the host's file never becomes a driver file."""
    assert os.path.isfile("/usr/bin/env")
    node = make(tmp_path, gpus=1)
    bindir = f"{node.root}/usr/bin"
    os.unlink(f"{bindir}/nvidia-debugdump")
    os.symlink("/usr/bin/env", f"{bindir}/nvidia-debugdump")
    os.unlink(f"{bindir}/nvidia-persistenced")
    os.symlink("../../../../../../../../../../usr/bin/env", f"{bindir}/nvidia-persistenced")
    host = Host(node.root)
    names = {f.container_path for f in host.binaries(["utility"])}
    assert names == {"/usr/bin/nvidia-smi"}
    assert host.resolve("/usr/bin/nvidia-persistenced") is None  # no /usr/bin/env in the root
    assert all(f.host_path.startswith(node.root + "/") for f in host.files(["utility"]))


def test_resolve_follows_relative_and_absolute_links_and_stops_on_loops(tmp_path):
    """resolve() is a chroot's path walk: .. never climbs above the root, a loop is None."""
    root = tmp_path / "r"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f").write_text("x")
    os.symlink("/a/b", root / "abs")
    os.symlink("b/../b/f", root / "a" / "rel")
    os.symlink("loop2", root / "loop1")
    os.symlink("loop1", root / "loop2")
    host = Host(str(root))
    assert host.resolve("/abs/f") == "/a/b/f"
    assert host.resolve("/a/rel") == "/a/b/f"
    assert host.resolve("/../../abs/./f") == "/a/b/f"
    assert host.resolve("/loop1") is None
    assert host.resolve("/a/b/f/x") is None
    assert host.resolve("/missing/f") is None


def test_version_skew_injects_the_files_version_and_says_so(tmp_path):
    """Module 550.40.07 loaded, files 550.54.15 installed: the files' libraries and firmware
    are found (not none), and the skew is one warning naming both versions."""
    from nvshim.runtime.create import plan_create

    node = make(tmp_path, gpus=1)
    version_file = Path(node.root, "proc/driver/nvidia/version")
    version_file.write_text(version_file.read_text().replace(VERSION, "550.40.07"))
    host = Host(node.root)
    assert (host.module_version(), host.driver_version()) == ("550.40.07", VERSION)
    assert host.version_skew() == ("550.40.07", VERSION)
    assert {lib.base for lib in host.libraries(["compute"])} >= {"libcuda"}
    assert host.firmware()
    bundle = write_bundle(tmp_path / "bundle", ["NVIDIA_VISIBLE_DEVICES=0"])
    plan = plan_create(str(bundle), Config(driver_root=node.root, nvml_facts=node.nvml_facts))
    mounts = {m["destination"] for m in plan.new_spec["mounts"]}
    assert f"{LIBDIR}/libcuda.so.{VERSION}" in mounts
    assert len(plan.warnings) == 1
    assert "kernel module is 550.40.07" in plan.warnings[0]
    assert f"files are {VERSION}" in plan.warnings[0]


def test_doctor_fails_a_version_skew_and_missing_default_files(tmp_path):
    """doctor's driver-files check: ok on a whole node, FAIL on a skew (both versions named)
    and on a node without libcuda or nvidia-smi (each named with its capability)."""
    from nvshim.config import ALL_CAPABILITIES
    from nvshim.node.doctor.host import check_driver_files

    node = make(tmp_path, gpus=1)
    ok = check_driver_files(Host(node.root), ALL_CAPABILITIES)
    assert ok.status == "ok", ok
    assert "nvidia_drv.so (display)" in ok.message  # named, not failed: a headless node
    version_file = Path(node.root, "proc/driver/nvidia/version")
    original = version_file.read_text()
    version_file.write_text(original.replace(VERSION, "550.40.07"))
    skew = check_driver_files(Host(node.root), ALL_CAPABILITIES)
    assert skew.status == "fail" and "550.40.07" in skew.message and VERSION in skew.message
    assert "reboot" in skew.fix
    version_file.write_text(original)
    for name in (f"libcuda.so.{VERSION}", "libcuda.so.1"):
        os.unlink(f"{node.root}{LIBDIR}/{name}")
    os.unlink(f"{node.root}/usr/bin/nvidia-smi")
    missing = check_driver_files(Host(node.root), ALL_CAPABILITIES)
    assert missing.status == "fail", missing
    assert "libcuda (compute)" in missing.message and "nvidia-smi (utility)" in missing.message


def test_inspect_lists_missing_files_of_the_requested_capabilities(tmp_path):
    """inspect (text and JSON) names the essential files a container's capabilities lack."""
    from nvshim.node.inspection import plan_summary, render_text
    from nvshim.runtime.create import plan_create

    node = make(tmp_path, gpus=1)
    os.unlink(f"{node.root}/usr/bin/nvidia-smi")
    bundle = write_bundle(
        tmp_path / "bundle",
        ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"],
    )
    config = Config(driver_root=node.root, nvml_facts=node.nvml_facts)
    plan = plan_create(str(bundle), config)
    assert plan_summary(plan, config)["missing_files"] == ["nvidia-smi (utility)"]
    assert "missing:       nvidia-smi (utility)" in render_text(plan, config)
    whole = write_bundle(
        tmp_path / "whole", ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute"]
    )
    assert plan_summary(plan_create(str(whole), config), config)["missing_files"] == []


def place(root: str, path: str, text: str = "{}\n") -> None:
    os.makedirs(os.path.dirname(root + path), exist_ok=True)
    Path(root + path).write_text(text)


def test_graphics_display_and_opencl_files_follow_their_capability(tmp_path):
    """EGL vendor, Vulkan ICD/layer (under /etc/vulkan, wherever the host has them), EGL
    platform JSONs, nvoptix.bin and the Xorg modules come with graphics; the OpenCL ICD with
    compute; xorg.conf with display, which brings graphics' files too; in CDI specs too."""
    from nvshim.node.cdigen import generate_spec

    node = make(tmp_path, gpus=1)
    graphics = [
        "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
        "/etc/vulkan/icd.d/nvidia_icd.json",
        "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
        "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
        "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
        "/usr/share/nvidia/nvoptix.bin",
    ]
    for path in graphics + [
        "/etc/OpenCL/vendors/nvidia.icd",
        "/usr/share/X11/xorg.conf.d/10-nvidia.conf",
    ]:
        place(node.root, path)
    # Debian keeps the Xorg modules in /usr/lib/nvidia/current (alternatives links aside)
    place(node.root, "/usr/lib/nvidia/current/nvidia_drv.so", "ELF")
    place(node.root, f"/usr/lib/nvidia/current/libglxserver_nvidia.so.{VERSION}", "ELF")
    host = Host(node.root)

    def paths(caps):
        return {f.container_path for f in host.data_files(caps)}

    xorg = {
        "/usr/lib/xorg/modules/drivers/nvidia_drv.so",
        f"/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{VERSION}",
    }
    in_container = set(graphics) - {"/usr/share/vulkan/implicit_layer.d/nvidia_layers.json"} | {
        "/etc/vulkan/implicit_layer.d/nvidia_layers.json"
    }
    assert paths(["graphics"]) == in_container | xorg
    assert paths(["compute"]) == {"/etc/OpenCL/vendors/nvidia.icd"}
    assert paths(["display"]) == {"/usr/share/X11/xorg.conf.d/10-nvidia.conf"}
    display = {f.container_path for f in host.driver_files(["display"]) if f.kind == "data"}
    assert display == in_container | xorg | {"/usr/share/X11/xorg.conf.d/10-nvidia.conf"}
    assert paths(["utility"]) == set()
    drv = {f.container_path: f for f in host.data_files(["graphics"])}
    assert (
        drv["/usr/lib/xorg/modules/drivers/nvidia_drv.so"].host_path
        == f"{node.root}/usr/lib/nvidia/current/nvidia_drv.so"
    )
    assert (
        drv["/etc/vulkan/implicit_layer.d/nvidia_layers.json"].host_path
        == f"{node.root}/usr/share/vulkan/implicit_layer.d/nvidia_layers.json"
    )
    links = hook_links((), host.data_files(["graphics"]))
    assert (
        f"libglxserver_nvidia.so.{VERSION}",
        "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so",
    ) in links
    spec = generate_spec(host, "nvidia.com", "gpu", ("index",), ("graphics", "compute"))
    mounted = {m["containerPath"] for m in spec["containerEdits"]["mounts"]}
    assert in_container | xorg | {"/etc/OpenCL/vendors/nvidia.icd"} <= mounted


def test_egl_platform_libraries_keep_their_own_version(tmp_path):
    """libnvidia-egl-gbm/-wayland are versioned apart from the driver: found by SONAME."""
    from nvshim.host.elf import build_shared_object

    node = make(tmp_path, gpus=1)
    for name, soname in (
        ("libnvidia-egl-gbm.so.1.1.0", "libnvidia-egl-gbm.so.1"),
        ("libnvidia-egl-wayland.so.1.1.10", "libnvidia-egl-wayland.so.1"),
    ):
        Path(node.root + f"{LIBDIR}/{name}").write_bytes(build_shared_object(soname))
        os.symlink(name, node.root + f"{LIBDIR}/{soname}")
    host = Host(node.root)
    libs = {lib.base: lib for lib in host.libraries(["graphics"])}
    assert libs["libnvidia-egl-gbm"].container_path == f"{LIBDIR}/libnvidia-egl-gbm.so.1.1.0"
    assert libs["libnvidia-egl-wayland"].soname == "libnvidia-egl-wayland.so.1"
    # a spec mounting them is not "stale" for their version differing from the driver's
    from nvshim.node.cdigen import generate_spec, stale_reasons

    spec = generate_spec(host, "nvidia.com", "gpu", ("index",), ("graphics",))
    assert stale_reasons(spec, spec, host) == []


def test_gbm_backend_links_to_the_allocator_in_debian_and_flat_layouts(tmp_path):
    """With graphics, <libdir>/gbm/nvidia-drm_gbm.so links to libnvidia-allocator's SONAME,
    relative, in the system library folder (not in Debian's nvidia/current)."""
    node = make(tmp_path, gpus=1)
    flat = hook_links(Host(node.root).libraries(["graphics"]))
    assert ("../libnvidia-allocator.so.1", f"{LIBDIR}/gbm/nvidia-drm_gbm.so") in flat
    assert not any("gbm" in link for _, link in hook_links(Host(node.root).libraries(["compute"])))
    debianize(node.root)
    nested = hook_links(Host(node.root).libraries(["graphics"]))
    assert (
        "../nvidia/current/libnvidia-allocator.so.1",
        f"{LIBDIR}/gbm/nvidia-drm_gbm.so",
    ) in nested


def test_vdpau_lands_in_the_vdpau_folder_in_debian_layout(tmp_path):
    """Debian keeps libvdpau_nvidia beside the other libraries; it is mounted into
    <libdir>/vdpau/, where libvdpau looks, and that folder is not an ld.so.cache folder."""
    node = make(tmp_path, gpus=1)
    debianize(node.root)
    host = Host(node.root)
    libs = {lib.base: lib for lib in host.libraries(["video"])}
    vdpau = libs["libvdpau_nvidia"]
    assert vdpau.host_path == f"{node.root}{NESTED}/libvdpau_nvidia.so.{VERSION}"
    assert vdpau.container_path == f"{LIBDIR}/vdpau/libvdpau_nvidia.so.{VERSION}"
    edits = driver_edits((), tuple(libs.values()), (), ("/hook",))
    args = edits.hooks[0].args
    assert f"{LIBDIR}/vdpau" not in args and NESTED in " ".join(args)


def build_libcuda(directory: Path, version: str, cuda: int) -> None:
    """A stand-in libcuda.so.<version> whose cuDriverGetVersion answers ``cuda``."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed (install.sh --dev installs it)")
    source = directory / "cuda.c"
    source.write_text(f"int cuDriverGetVersion(int *v) {{ *v = {cuda}; return 0; }}\n")
    target = directory / f"libcuda.so.{version}"
    target.unlink()
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(target), str(source)],
        check=True,
    )


def write_bundle(path: Path, env) -> Path:
    path.mkdir(parents=True)
    (path / "rootfs").mkdir()
    spec = {
        "ociVersion": "1.0.2",
        "root": {"path": "rootfs"},
        "process": {"args": ["sh"], "env": ["PATH=/bin", *env], "cwd": "/"},
    }
    (path / "config.json").write_text(json.dumps(spec))
    return path


def test_cuda_version_comes_from_libcuda_without_nvml_or_facts(tmp_path):
    """No NVML, no nvml-facts file: a CUDA image's requirement is judged by libcuda's own
    cuDriverGetVersion, asked once and kept in the plan cache."""
    from nvshim.errors import RequestError
    from nvshim.runtime import planbuild
    from nvshim.runtime.create import plan_create

    node = make(tmp_path, gpus=1, driver_version="535.104.05")
    build_libcuda(Path(node.root + LIBDIR), "535.104.05", 12020)
    host = Host(node.root)
    assert host.cuda_version() == "12.2"
    doc = planbuild.build(host)
    assert doc["cuda-version"] == "12.2"
    config = Config(driver_root=node.root)  # no nvml-facts
    env = ["NVIDIA_VISIBLE_DEVICES=0", "CUDA_VERSION=12.0.0"]
    ok = write_bundle(tmp_path / "ok", env + ["NVIDIA_REQUIRE_CUDA=cuda>=12.0"])
    assert plan_create(str(ok), config).new_spec is not None
    too_new = write_bundle(tmp_path / "new", env + ["NVIDIA_REQUIRE_CUDA=cuda>=12.4"])
    with pytest.raises(RequestError, match=r"cuda>=12\.4.*12\.2"):
        plan_create(str(too_new), config)


def test_cuda_version_is_none_when_libcuda_cannot_answer(tmp_path):
    """A libcuda that does not load (the simulator's stubs) gives no CUDA version, no error."""
    node = make(tmp_path, gpus=1)
    assert Host(node.root).cuda_version() is None


def test_device_node_and_socket_links_stay_in_their_roots(tmp_path):
    """A dev-root /dev/nvidia-uvm that links to /dev/null, or a driver-root persistenced
    socket that links to a host path, is looked up in its own root, never on the host."""
    node = make(tmp_path, gpus=1)
    uvm = f"{node.root}/dev/nvidia-uvm"
    os.unlink(uvm)
    os.symlink("/dev/null", uvm)
    assert not os.path.exists(f"{node.root}/dev/null")
    host = Host(node.root)
    assert "/dev/nvidia-uvm" not in {n.path for n in host.control_nodes(["compute"])}
    run = f"{node.root}/run/nvidia-persistenced"
    os.makedirs(run, exist_ok=True)
    if os.path.lexists(f"{run}/socket"):
        os.unlink(f"{run}/socket")
    import socket

    outside = socket.socket(socket.AF_UNIX)
    outside.bind(str(tmp_path / "host.sock"))  # a socket on the host, not in the root
    os.symlink(str(tmp_path / "host.sock"), f"{run}/socket")
    assert all(f.host_path.startswith(node.root) for f in host.ipc(["utility", "compute"]))
    assert "/run/nvidia-persistenced/socket" not in {
        f.container_path for f in host.ipc(["utility"])
    }
    outside.close()
