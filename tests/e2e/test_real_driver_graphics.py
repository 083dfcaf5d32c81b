# ruff: noqa: F811 — the fixtures imported from test_real_driver are parameters by name
"""What graphics, display and video workloads get from a real driver, beside the reference.

Debian's packages (:mod:`tests.helpers.realdriver`) in both layouts — ``flat`` (NVIDIA's
installer) and ``debian`` (nvidia/current + update-alternatives) — under a simulated
kernel side. Each behaviour is pinned twice: on the edits discovery builds from the real
files (shared by the runtime's injection and ``nvshim cdi generate``, both checked), and
through nvshim-runtime → runc, asserting what the process inside sees.

docs/real-gpu.md's table says, per capability, what is injected beside NVIDIA's toolkit.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Dict, List

import pytest

from nvshim.host.discovery import Host
from nvshim.node.cdigen import generate_spec
from nvshim.runtime.hookargs import parse_hook_args
from nvshim.runtime.hostedits import hook_links
from tests.e2e.test_real_driver import (  # noqa: F401  (fixtures, used by name)
    compute_packages,
    driver_needs,
    gpu_env,
    graphics_packages,
    graphics_root,
    probe,
    probe_rootfs,
    root_file,
    run_container,
    sha256,
    show_script,
    shown,
)
from tests.helpers.realdriver import DriverRoot

pytestmark = pytest.mark.e2e

ALL_CAPS = ("compute", "utility", "video", "graphics", "display", "ngx")
HOOK = ("/opt/nvshim/venv/bin/python3", "-I", "-m", "nvshim.hook")


def container_libdir(root: DriverRoot) -> str:
    """Where the driver's libraries are mounted in the container (where they lie in the root)."""
    return "/usr/lib/x86_64-linux-gnu" + ("/nvidia/current" if root.layout == "debian" else "")


def reference_links(root: DriverRoot) -> Dict[str, str]:
    """link → target of the links the reference makes beside the libraries (its
    create-symlinks hook): the unversioned ``.so`` links the driver folder has, and those it
    always makes."""
    v = root.version
    return {
        "libnvidia-ml.so": "libnvidia-ml.so.1",
        "libnvcuvid.so": "libnvcuvid.so.1",
        "libnvidia-encode.so": "libnvidia-encode.so.1",
        "libnvidia-fbc.so": "libnvidia-fbc.so.1",
        "libnvidia-ngx.so": "libnvidia-ngx.so.1",
        "libnvidia-opticalflow.so": "libnvidia-opticalflow.so.1",
        "libGLX_indirect.so.0": f"libGLX_nvidia.so.{v}",
        "libnvidia-vulkan-producer.so": f"libnvidia-vulkan-producer.so.{v}",
        "libcuda.so": "libcuda.so.1",
    }


def test_edits_make_the_links_the_reference_makes(graphics_root):
    """Runtime injection's edits and a generated CDI spec's hook both make the unversioned
    .so links the driver folder has (libnvidia-ml, libnvcuvid, libnvidia-encode,
    libnvidia-fbc, libnvidia-ngx), libnvidia-opticalflow.so, libGLX_indirect.so.0 and
    libnvidia-vulkan-producer.so, beside the libraries."""
    host = Host(str(graphics_root.root))
    libdir = container_libdir(graphics_root)
    wanted = {(target, f"{libdir}/{link}") for link, target in reference_links(graphics_root).items()}
    made = set(hook_links(host.libraries(ALL_CAPS), host.driver_files(ALL_CAPS)))
    assert wanted <= made, sorted(wanted - made)
    spec = generate_spec(host, capabilities=ALL_CAPS, hook_command=HOOK)
    hooks = spec["containerEdits"]["hooks"]
    in_spec = {pair for hook in hooks for pair in parse_hook_args(hook["args"])[0]}
    assert wanted <= in_spec, sorted(wanted - in_spec)


def test_container_sees_the_reference_links(runc, nvshim_runtime_bin, tmp_path, graphics_root,
                                            probe_rootfs):
    """graphics,video,compute,utility,ngx: each link the reference makes exists in the
    container beside the libraries and resolves to the driver root's real library."""
    libdir = container_libdir(graphics_root)
    links = reference_links(graphics_root)
    res = run_container(runc, nvshim_runtime_bin, tmp_path, graphics_root, probe_rootfs,
                        show_script(f"{libdir}/{name}" for name in links),
                        gpu_env("graphics,video,compute,utility,ngx")).check()
    seen = shown(res.stdout)
    for name, target in links.items():
        got = seen.get(f"{libdir}/{name}")
        assert got is not None, f"{name} missing\n{res.describe()}"
        real = root_file(graphics_root, f"{container_libdir(graphics_root)}/{target}")
        assert got[1] == sha256(real), f"{name}\n{res.describe()}"


OUTPUTCLASS = "/usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf"
XORG = ("/usr/lib/xorg/modules/drivers/nvidia_drv.so",
        "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so")
VULKAN = ("/etc/vulkan/icd.d/nvidia_icd.json", "/etc/vulkan/implicit_layer.d/nvidia_layers.json")


def _host_vulkan(root: DriverRoot, container_path: str) -> Path:
    """The root's file for a Vulkan JSON: /etc/vulkan (flat) or /usr/share/vulkan (Debian)."""
    for prefix in ("/etc/vulkan/", "/usr/share/vulkan/"):
        candidate = prefix + container_path[len("/etc/vulkan/"):]
        if (root.root / candidate.lstrip("/")).exists():
            return root_file(root, candidate)
    raise AssertionError(f"{container_path}: not in {root.root}")


def test_edits_put_graphics_and_display_files_where_the_reference_does(graphics_root):
    """graphics: the Xorg modules, the Vulkan ICD and layer JSONs under /etc/vulkan whatever
    the host's folder; display: nvidia-drm-outputclass.conf too; compute,utility: none of
    them — in the runtime's files and in a generated CDI spec."""
    host = Host(str(graphics_root.root))
    version = graphics_root.version

    def files(caps: List[str]) -> Dict[str, str]:
        return {f.container_path: f.host_path for f in host.driver_files(caps)}

    xorg = {XORG[0], f"{XORG[1]}.{version}"}
    graphics = files(["graphics"])
    assert xorg | set(VULKAN) <= set(graphics)
    assert OUTPUTCLASS not in graphics
    for path in VULKAN:
        assert Path(graphics[path]) == _host_vulkan(graphics_root, path)
    display = files(["display"])
    assert {OUTPUTCLASS} | xorg | set(VULKAN) <= set(display)
    assert Path(display[OUTPUTCLASS]) == root_file(graphics_root, OUTPUTCLASS)
    assert not (xorg | set(VULKAN) | {OUTPUTCLASS}) & set(files(["compute", "utility"]))
    spec = generate_spec(host, capabilities=ALL_CAPS, hook_command=HOOK)
    mounted = {m["containerPath"] for m in spec["containerEdits"]["mounts"]}
    assert xorg | set(VULKAN) | {OUTPUTCLASS} <= mounted


def test_container_sees_graphics_and_display_files(runc, nvshim_runtime_bin, tmp_path,
                                                   graphics_root, probe_rootfs):
    """In the container, graphics alone gives the Xorg modules and the Vulkan JSONs in
    /etc/vulkan while an image's own /usr/share/vulkan/icd.d/nvidia_icd.json stays as the
    image has it; display adds nvidia-drm-outputclass.conf."""
    rootfs = tmp_path / "image"
    shutil.copytree(probe_rootfs, rootfs, symlinks=True)
    own = rootfs / "usr/share/vulkan/icd.d/nvidia_icd.json"
    own.parent.mkdir(parents=True, exist_ok=True)
    own.write_text('{"image": "own"}\n')
    paths = [*XORG, *VULKAN, OUTPUTCLASS, "/usr/share/vulkan/icd.d/nvidia_icd.json"]
    res = run_container(runc, nvshim_runtime_bin, tmp_path, graphics_root, rootfs,
                        show_script(paths), gpu_env("graphics")).check()
    seen = shown(res.stdout)
    for path in XORG:
        got = seen.get(path)
        assert got is not None and got[1] == sha256(root_file(graphics_root, path)), \
            f"{path}\n{res.describe()}"
    for path in VULKAN:
        got = seen.get(path)
        assert got is not None and got[1] == sha256(_host_vulkan(graphics_root, path)), \
            f"{path}\n{res.describe()}"
    assert seen.get("/usr/share/vulkan/icd.d/nvidia_icd.json", ("", ""))[1] == sha256(own), \
        res.describe()
    assert seen.get(OUTPUTCLASS) is None, res.describe()
    res = run_container(runc, nvshim_runtime_bin, tmp_path, graphics_root, rootfs,
                        show_script([OUTPUTCLASS]), gpu_env("display")).check()
    got = shown(res.stdout).get(OUTPUTCLASS)
    assert got is not None and got[1] == sha256(root_file(graphics_root, OUTPUTCLASS)), \
        res.describe()
