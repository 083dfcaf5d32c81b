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

import json
import re
import shutil
from pathlib import Path
from typing import Dict, List

import pytest

from nvshim.host.discovery import Host
from nvshim.node.cdigen import generate_spec
from nvshim.runtime.hookargs import hook_command, parse_graphics_args, parse_hook_args
from nvshim.runtime.hostedits import hook_links
from tests.e2e.test_real_driver import (  # noqa: F401  (fixtures, used by name)
    compute_packages,
    driver_needs,
    gpu_env,
    graphics_packages,
    graphics_root,
    node_config,
    probe,
    probe_rootfs,
    root_file,
    run_container,
    sha256,
    show_script,
    shown,
)
from tests.helpers.realdriver import LAYOUTS, DriverPackages, DriverRoot, make_driver_root

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
    wanted = {
        (target, f"{libdir}/{link}") for link, target in reference_links(graphics_root).items()
    }
    made = set(hook_links(host.libraries(ALL_CAPS), host.driver_files(ALL_CAPS)))
    assert wanted <= made, sorted(wanted - made)
    spec = generate_spec(host, capabilities=ALL_CAPS, hook_command=HOOK)
    hooks = spec["containerEdits"]["hooks"]
    in_spec = {pair for hook in hooks for pair in parse_hook_args(hook["args"])[0]}
    assert wanted <= in_spec, sorted(wanted - in_spec)


def test_container_sees_the_reference_links(
    runc, nvshim_runtime_bin, tmp_path, graphics_root, probe_rootfs
):
    """graphics,video,compute,utility,ngx: each link the reference makes exists in the
    container beside the libraries and resolves to the driver root's real library."""
    libdir = container_libdir(graphics_root)
    links = reference_links(graphics_root)
    res = run_container(
        runc,
        nvshim_runtime_bin,
        tmp_path,
        graphics_root,
        probe_rootfs,
        show_script(f"{libdir}/{name}" for name in links),
        gpu_env("graphics,video,compute,utility,ngx"),
    ).check()
    seen = shown(res.stdout)
    for name, target in links.items():
        got = seen.get(f"{libdir}/{name}")
        assert got is not None, f"{name} missing\n{res.describe()}"
        real = root_file(graphics_root, f"{container_libdir(graphics_root)}/{target}")
        assert got[1] == sha256(real), f"{name}\n{res.describe()}"


OUTPUTCLASS = "/usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf"
XORG = (
    "/usr/lib/xorg/modules/drivers/nvidia_drv.so",
    "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so",
)
VULKAN = ("/etc/vulkan/icd.d/nvidia_icd.json", "/etc/vulkan/implicit_layer.d/nvidia_layers.json")


def _host_vulkan(root: DriverRoot, container_path: str) -> Path:
    """The root's file for a Vulkan JSON: /etc/vulkan (flat) or /usr/share/vulkan (Debian)."""
    for prefix in ("/etc/vulkan/", "/usr/share/vulkan/"):
        candidate = prefix + container_path[len("/etc/vulkan/") :]
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


def test_container_sees_graphics_and_display_files(
    runc, nvshim_runtime_bin, tmp_path, graphics_root, probe_rootfs
):
    """In the container, graphics alone gives the Xorg modules and the Vulkan JSONs in
    /etc/vulkan while an image's own /usr/share/vulkan/icd.d/nvidia_icd.json stays as the
    image has it; display adds nvidia-drm-outputclass.conf."""
    rootfs = tmp_path / "image"
    shutil.copytree(probe_rootfs, rootfs, symlinks=True)
    own = rootfs / "usr/share/vulkan/icd.d/nvidia_icd.json"
    own.parent.mkdir(parents=True, exist_ok=True)
    own.write_text('{"image": "own"}\n')
    paths = [*XORG, *VULKAN, OUTPUTCLASS, "/usr/share/vulkan/icd.d/nvidia_icd.json"]
    res = run_container(
        runc,
        nvshim_runtime_bin,
        tmp_path,
        graphics_root,
        rootfs,
        show_script(paths),
        gpu_env("graphics"),
    ).check()
    seen = shown(res.stdout)
    for path in XORG:
        got = seen.get(path)
        assert got is not None and got[1] == sha256(root_file(graphics_root, path)), (
            f"{path}\n{res.describe()}"
        )
    for path in VULKAN:
        got = seen.get(path)
        assert got is not None and got[1] == sha256(_host_vulkan(graphics_root, path)), (
            f"{path}\n{res.describe()}"
        )
    assert seen.get("/usr/share/vulkan/icd.d/nvidia_icd.json", ("", ""))[1] == sha256(own), (
        res.describe()
    )
    assert seen.get(OUTPUTCLASS) is None, res.describe()
    res = run_container(
        runc,
        nvshim_runtime_bin,
        tmp_path,
        graphics_root,
        rootfs,
        show_script([OUTPUTCLASS]),
        gpu_env("display"),
    ).check()
    got = shown(res.stdout).get(OUTPUTCLASS)
    assert got is not None and got[1] == sha256(root_file(graphics_root, OUTPUTCLASS)), (
        res.describe()
    )


# ------------------------------------------------- the EGL application profile, by-path links

PROFILE = "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf"
PROFILE_PROBE = (
    f"printf 'PROFILE '; cat {PROFILE} 2>/dev/null; echo; "
    'for l in /dev/dri/by-path/*; do [ -L "$l" ] && '
    'echo "LINK $l $(readlink $l) $(stat -L -c %t:%T $l)"; done'
)


@pytest.fixture(scope="module", params=LAYOUTS)
def graphics_root2(
    request: pytest.FixtureRequest,
    graphics_packages: DriverPackages,
    tmp_path_factory: pytest.TempPathFactory,
) -> DriverRoot:
    """A two-GPU driver root (with nvidia-drm's nodes) with the graphics packages."""
    return make_driver_root(
        tmp_path_factory.mktemp(f"graphics2-{request.param}") / "root",
        graphics_packages,
        request.param,
        gpus=2,
    )


def _profile(*minors: int) -> str:
    mask = sum(1 << m for m in minors)
    return (
        '{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",'
        f'{mask:#x}]}}],"rules":[{{"pattern":[],"profile":"_container_"}}]}}'
    )


def _gpu1(root: DriverRoot) -> Dict[str, object]:
    """GPU 1's minor and its by-path links as the container should see them."""
    gpu = next(g for g in Host(str(root.root)).gpus() if g.index == 1)
    bus = gpu.pci_bus_id
    return {
        "minor": gpu.node.minor if gpu.node else None,
        "links": {
            f"/dev/dri/by-path/pci-{bus}-card": ("../card1", "e2:1"),
            f"/dev/dri/by-path/pci-{bus}-render": ("../renderD129", "e2:81"),
        },
    }


def _seen(output: str) -> Dict[str, object]:
    profile = re.search(r"^PROFILE (.*)$", output, re.M)
    links = {m[0]: (m[1], m[2]) for m in re.findall(r"^LINK (\S+) (\S+) (\S+)$", output, re.M)}
    return {"profile": profile.group(1) if profile else "", "links": links}


def test_edits_ask_for_the_profile_and_the_by_path_links(graphics_root2):
    """On real files, graphics: the runtime's hook and a generated CDI spec's hook carry
    --egl-profile and the GPUs' by-path links (the spec every GPU's, for the hook to pick
    those the container got); compute,utility: neither."""
    host = Host(str(graphics_root2.root))
    spec = generate_spec(host, capabilities=ALL_CAPS, hook_command=HOOK)
    (hook,) = spec["containerEdits"]["hooks"]
    dev_links, egl = parse_graphics_args(hook["args"])
    assert egl
    wanted = {link for g in host.gpus() for link in host.drm(g).links}
    assert len(wanted) == 4 and set(dev_links) == wanted
    plain = generate_spec(host, capabilities=("compute", "utility"), hook_command=HOOK)
    assert parse_graphics_args(plain["containerEdits"]["hooks"][0]["args"]) == ([], False)


@pytest.mark.parametrize("via", ["index", "cdi"])
def test_container_sees_the_profile_and_links_of_its_gpu_only(
    runc, nvshim_runtime_bin, tmp_path, graphics_root2, probe_rootfs, via
):
    """GPU 1 with graphics, by index (the runtime's injection) or by the CDI name from
    nvshim cdi generate's spec: the container's 10-container.conf names GPU 1's minor only
    (the reference's bytes) and /dev/dri/by-path has GPU 1's card and render links,
    resolving to its nodes (226:1, 226:129), and none of GPU 0's."""
    from nvshim.cdi.write import write_spec

    settings: Dict[str, object] = {}
    if via == "cdi":
        spec = generate_spec(
            Host(str(graphics_root2.root)), capabilities=ALL_CAPS, hook_command=hook_command()
        )
        write_spec(str(tmp_path / "cdi" / "nvidia.json"), spec)
        settings["cdi-spec-dirs"] = [str(tmp_path / "cdi")]
    cfg = node_config(tmp_path, graphics_root2, **settings)
    visible = "1" if via == "index" else "nvidia.com/gpu=1"
    res = run_container(
        runc,
        nvshim_runtime_bin,
        tmp_path,
        graphics_root2,
        probe_rootfs,
        PROFILE_PROBE,
        [
            f"NVIDIA_VISIBLE_DEVICES={visible}",
            "NVIDIA_DRIVER_CAPABILITIES=graphics,compute,utility",
        ],
        cfg=cfg,
    ).check()
    want = _gpu1(graphics_root2)
    seen = _seen(res.stdout)
    assert seen["profile"] == _profile(int(str(want["minor"]))), res.describe()
    assert seen["links"] == want["links"], res.describe()
    assert json.loads(re.sub(r"0x[0-9a-f]+", "0", str(seen["profile"])))["rules"] == [
        {"pattern": [], "profile": "_container_"}
    ]


def test_the_opencl_icd_comes_with_compute_not_with_graphics_alone(graphics_root):
    """/etc/OpenCL/vendors/nvidia.icd names libnvidia-opencl.so.1, a compute library: compute
    gets it (with or without graphics), graphics alone does not (its library would not be
    there), in the runtime's files and in a generated CDI spec cut to graphics."""
    host = Host(str(graphics_root.root))
    icd = "/etc/OpenCL/vendors/nvidia.icd"
    assert (graphics_root.root / icd.lstrip("/")).is_file()
    assert icd in {f.container_path for f in host.driver_files(["compute"])}
    assert icd in {f.container_path for f in host.driver_files(["compute", "graphics"])}
    assert icd not in {f.container_path for f in host.driver_files(["graphics"])}
    assert icd not in {f.container_path for f in host.driver_files(["display"])}
    spec = generate_spec(host, capabilities=("graphics",), hook_command=HOOK)
    assert icd not in {m["containerPath"] for m in spec["containerEdits"]["mounts"]}
