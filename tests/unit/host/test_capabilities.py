"""NVIDIA_DRIVER_CAPABILITIES → which driver files and device nodes a container gets.

The expected sets are written out from the reference facts (nvidia-toolkit.md §2.4 and §3)
and restricted to what a simulated node ships (``nvshim.sim.model.SIM_LIBRARIES`` plus
``vdpau/libvdpau_nvidia``); they are not computed by the code under test. Each case runs
the whole create plan (``plan_create``) on a bundle and reads the rewritten config.json.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, FrozenSet, Optional, Sequence, Tuple

import pytest

from nvshim.config import Config
from nvshim.errors import RequestError
from nvshim.runtime.create import plan_create

VERSION = "550.54.15"

# §3, per capability, intersected with the simulated node's libraries.
UTILITY_LIBS = {"libnvidia-ml", "libnvidia-cfg"}
COMPUTE_LIBS = {
    "libcuda",
    "libcudadebugger",
    "libnvidia-opencl",
    "libnvidia-gpucomp",
    "libnvidia-ptxjitcompiler",
    "libnvidia-allocator",
    "libnvidia-nvvm",
}
VIDEO_LIBS = {"libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid"}
GRAPHICS_LIBS = {
    "libnvidia-eglcore",
    "libnvidia-glcore",
    "libnvidia-tls",
    "libnvidia-fbc",
    "libGLX_nvidia",
    "libEGL_nvidia",
    # GBM's backend <libdir>/gbm/nvidia-drm_gbm.so is a link to it (as the reference's
    # graphics discoverer makes it), so graphics brings it as well as compute
    "libnvidia-allocator",
}
NGX_LIBS = {"libnvidia-ngx"}
UTILITY_BINS = {"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"}
COMPUTE_BINS = {"nvidia-cuda-mps-control", "nvidia-cuda-mps-server"}
COMPUTE_NODES = {"nvidia-uvm", "nvidia-uvm-tools"}
# GPU 0's DRM card and render nodes (the simulator numbers them by GPU index): graphics and
# display get them, as the reference's graphics modifier gives them
DRM_NODES = {"card0", "renderD128"}

# (libraries, binaries, device nodes besides nvidiactl and the GPU's) per single capability
# (§2.4).
PER_CAP: Dict[str, Tuple[set, set, set]] = {
    "utility": (UTILITY_LIBS, UTILITY_BINS, set()),
    "compute": (COMPUTE_LIBS, COMPUTE_BINS, COMPUTE_NODES),
    "video": (VIDEO_LIBS | COMPUTE_LIBS, set(), set()),
    "graphics": (GRAPHICS_LIBS, set(), DRM_NODES),
    "display": (GRAPHICS_LIBS, set(), {"nvidia-modeset"} | DRM_NODES),
    "ngx": (NGX_LIBS, set(), set()),
    "compat32": (set(), set(), set()),
}


def expected(caps: Sequence[str]) -> Tuple[FrozenSet[str], FrozenSet[str], FrozenSet[str]]:
    libs: set = set()
    bins: set = set()
    nodes: set = {"nvidiactl"}
    for cap in caps:
        cap_libs, cap_bins, cap_nodes = PER_CAP[cap]
        libs |= cap_libs
        bins |= cap_bins
        nodes |= cap_nodes
    return frozenset(libs), frozenset(bins), frozenset(nodes)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A simulated 2-GPU node (minors shuffled, so GPU 0 is not /dev/nvidia0)."""
    if os.geteuid() != 0:
        pytest.skip("creating a simulated node needs root (mknod)")
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("sim") / "node"), gpus=2, shuffle_minors=True)


def write_bundle(path: Path, env: Sequence[str]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    spec = {
        "ociVersion": "1.0.2",
        "process": {"args": ["sh"], "env": ["PATH=/usr/bin:/bin", *env], "cwd": "/"},
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "linux": {},
    }
    (path / "config.json").write_text(json.dumps(spec, indent="\t") + "\n")
    return path


def injected(
    node, tmp_path: Path, caps: Optional[str], extra_env: Sequence[str] = ()
) -> Tuple[FrozenSet[str], FrozenSet[str], FrozenSet[str]]:
    """(library bases, binary names, /dev node names) the new config.json adds for GPU 0."""
    env = ["NVIDIA_VISIBLE_DEVICES=0", *extra_env]
    if caps is not None:
        env.append(f"NVIDIA_DRIVER_CAPABILITIES={caps}")
    bundle = write_bundle(tmp_path / "bundle", env)
    plan = plan_create(str(bundle), Config(driver_root=node.root, nvml_facts=node.nvml_facts))
    assert plan.new_spec is not None
    libs, bins = set(), set()
    for mount in plan.new_spec.get("mounts", []):
        dest = mount["destination"]
        name = dest.rsplit("/", 1)[1]
        if name.endswith(f".so.{VERSION}"):
            libs.add(name[: -len(f".so.{VERSION}")])
        elif dest.startswith("/usr/bin/"):
            bins.add(name)
    nodes = {d["path"].rsplit("/", 1)[1] for d in plan.new_spec["linux"].get("devices", [])}
    gpu_node = f"nvidia{node.gpus[0].minor}"
    assert gpu_node in nodes, f"GPU 0's node {gpu_node} missing: {sorted(nodes)}"
    nodes.discard(gpu_node)
    return frozenset(libs), frozenset(bins), frozenset(nodes)


@pytest.mark.parametrize(
    "value, caps",
    [
        ("utility", ["utility"]),
        ("compute", ["compute"]),
        ("video", ["video"]),
        ("graphics", ["graphics"]),
        ("display", ["display"]),
        ("ngx", ["ngx"]),
        ("compat32", ["compat32"]),
        ("compute,utility", ["compute", "utility"]),
        (" Video , UTILITY ,", ["video", "utility"]),
        ("all", list(PER_CAP)),
        ("utility,all", list(PER_CAP)),
        (None, ["compute", "utility"]),
        ("", ["compute", "utility"]),
    ],
)
def test_capability_selects_files_and_nodes(node, tmp_path, value, caps):
    """Each capability value injects exactly its libraries, binaries, control nodes and (graphics, display) GPU 0's DRM nodes (unset/empty = compute,utility)."""
    assert injected(node, tmp_path, value) == expected(caps)


def test_utility_alone_has_no_cuda_and_no_uvm(node, tmp_path):
    """utility gives NVML and nvidia-smi but neither libcuda nor /dev/nvidia-uvm."""
    libs, bins, nodes = injected(node, tmp_path, "utility")
    assert {"libnvidia-ml", "libnvidia-cfg"} <= libs and "nvidia-smi" in bins
    assert "libcuda" not in libs and "nvidia-uvm" not in nodes


def test_video_brings_compute_libraries_but_not_uvm(node, tmp_path):
    """video pulls in the compute libraries (libcuda) as well as its own, not the compute-only nodes."""
    libs, _, nodes = injected(node, tmp_path, "video")
    assert {"libnvcuvid", "libnvidia-encode", "libcuda"} <= libs
    assert not nodes & COMPUTE_NODES


def test_display_brings_modeset_and_graphics(node, tmp_path):
    """display adds /dev/nvidia-modeset and the graphics libraries."""
    libs, _, nodes = injected(node, tmp_path, "display")
    assert "nvidia-modeset" in nodes and "libGLX_nvidia" in libs


def test_legacy_image_unset_means_all(node, tmp_path):
    """A legacy CUDA image (CUDA_VERSION set, no NVIDIA_REQUIRE_CUDA) with the variable unset gets every capability."""
    got = injected(node, tmp_path, None, extra_env=["CUDA_VERSION=12.0"])
    assert got == expected(list(PER_CAP))


@pytest.mark.parametrize("value, name", [("compute,bogus", "bogus"), ("COMPUTE, Gfx", "Gfx")])
def test_unknown_capability_is_an_error_naming_it(node, tmp_path, value, name):
    """An unknown capability name fails the create with an error naming it."""
    bundle = write_bundle(
        tmp_path / "bundle", ["NVIDIA_VISIBLE_DEVICES=0", f"NVIDIA_DRIVER_CAPABILITIES={value}"]
    )
    with pytest.raises(RequestError) as info:
        plan_create(str(bundle), Config(driver_root=node.root, nvml_facts=node.nvml_facts))
    assert f'"{name}"' in str(info.value)
    assert "NVIDIA_DRIVER_CAPABILITIES" in str(info.value)


def test_unsupported_capability_is_an_error(node, tmp_path):
    """A known capability outside supported-driver-capabilities fails naming it."""
    bundle = write_bundle(
        tmp_path / "bundle", ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=graphics"]
    )
    config = Config(
        driver_root=node.root,
        nvml_facts=node.nvml_facts,
        supported_driver_capabilities=("compute", "utility"),
    )
    with pytest.raises(RequestError, match='"graphics"'):
        plan_create(str(bundle), config)


def test_the_capability_list_has_one_owner() -> None:
    """config.ALL_CAPABILITIES is the one list of driver capabilities and DEFAULT_CAPABILITIES
    the one default: the request grammar, discovery's tables, the config schema's enum, and
    cdi generate's default (function and CLI) all say the same."""
    import inspect as pyinspect

    from nvshim.cli.cmd_cdi import generate
    from nvshim.config import ALL_CAPABILITIES, DEFAULT_CAPABILITIES
    from nvshim.host.discovery import LIBRARIES, LIBRARY_SETS
    from nvshim.node.cdigen import generate_spec
    from nvshim.runtime.request import parse_capabilities

    assert parse_capabilities("all", ("all",), False) == ALL_CAPABILITIES
    assert parse_capabilities(None, ("all",), False) == DEFAULT_CAPABILITIES
    assert set(LIBRARY_SETS) == set(LIBRARIES) == set(ALL_CAPABILITIES)
    root = Path(__file__).resolve().parents[3]
    for schema in (root / "config/nvshim.schema.json", root / "nvshim/data/config-schema.json"):
        doc = json.loads(schema.read_text())
        enum = doc["properties"]["supported-driver-capabilities"]["items"]["enum"]
        assert sorted(enum) == sorted([*ALL_CAPABILITIES, "all"]), schema
    default = pyinspect.signature(generate_spec).parameters["capabilities"].default
    assert default == DEFAULT_CAPABILITIES
    option = next(p for p in generate.params if p.name == "driver_capabilities")
    assert option.default == ",".join(DEFAULT_CAPABILITIES)
