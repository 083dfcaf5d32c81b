"""DRM card and render nodes, end to end: nvshim-runtime → runc on a simulated node.

The simulator gives each GPU nvidia-drm's nodes (``/dev/dri/card<i>`` 226:<i>,
``/dev/dri/renderD<128+i>``) and the sysfs folder ``sys/bus/pci/devices/<bus id>/drm`` that
says which are whose; ``drm=False`` is a headless node. Assertions are what the process
inside sees (``/dev/dri`` and opening a node), what ``inspect`` says, and the CDI spec.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from nvshim.host.discovery import Host
from nvshim.node.cdigen import generate_spec
from nvshim.node.compile import compile_node
from nvshim.runtime.cdiedits import restrict_to_capabilities
from tests.helpers.bundle import make_bundle
from tests.helpers.common import require_root, unique_id
from tests.helpers.node import write_nvshim_config

pytestmark = pytest.mark.e2e

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROBE = (
    "ls -l /dev/dri 2>&1 | sed -n 's/^c.* \\([0-9]*\\), *\\([0-9]*\\) .* \\(\\S*\\)$/NODE \\3 \\1:\\2/p'; "
    "for n in /dev/dri/*; do [ -c $n ] && head -c0 $n 2>&1 | sed 's/^/OPEN: /'; done; "
    "[ -e /dev/dri ] || echo NO-DRI"
)


def _node(tmp_path_factory: pytest.TempPathFactory, **kwargs: object):
    require_root()
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("sim") / "node"), gpus=2, **kwargs)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A simulated 2-GPU node with nvidia-drm's nodes."""
    return _node(tmp_path_factory)


@pytest.fixture(scope="module")
def headless(tmp_path_factory):
    """A simulated 2-GPU node without nvidia-drm: no /dev/dri, no sysfs drm folder."""
    return _node(tmp_path_factory, drm=False)


def _config(tmp_path: Path, root: str) -> dict:
    cfg = write_nvshim_config(
        tmp_path / unique_id("cfg"), {"driver-root": root, "runtimes": ["runc"]}
    )
    compile_node(str(cfg))
    return {"NVSHIM_CONFIG": str(cfg), "PATH": PATH}


def _run(runc, runtime, tmp_path, rootfs, env, caps, visible="1"):
    bundle = make_bundle(
        tmp_path / unique_id("b"),
        rootfs,
        ["sh", "-c", PROBE],
        env=[f"NVIDIA_VISIBLE_DEVICES={visible}", f"NVIDIA_DRIVER_CAPABILITIES={caps}"],
    )
    return bundle, runc.run_detached(bundle, unique_id(), runtime=runtime, env=env).check()


def _seen(output: str) -> dict:
    return {
        line.split()[1]: line.split()[2] for line in output.splitlines() if line.startswith("NODE ")
    }


@pytest.mark.parametrize("caps", ["graphics", "display", "compute,graphics"])
def test_graphics_gets_the_granted_gpus_drm_nodes(
    runc, nvshim_runtime_bin, tmp_path, node, rootfs, caps
):
    """graphics or display with GPU 1: /dev/dri/card1 (226:1) and renderD129 (226:129)
    only, not GPU 0's, and the cgroup lets the container open them (no EPERM)."""
    _, res = _run(runc, nvshim_runtime_bin, tmp_path, rootfs, _config(tmp_path, node.root), caps)
    assert _seen(res.stdout) == {"card1": "226:1", "renderD129": "226:129"}, res.describe()
    assert "OPEN:" in res.stdout and "Operation not permitted" not in res.stdout, res.describe()


def test_compute_utility_gets_no_dri(runc, nvshim_runtime_bin, tmp_path, node, rootfs):
    """compute,utility: no /dev/dri at all (and no DRM lookup: the plan cache has it anyway)."""
    _, res = _run(
        runc, nvshim_runtime_bin, tmp_path, rootfs, _config(tmp_path, node.root), "compute,utility"
    )
    assert "NO-DRI" in res.stdout, res.describe()


def test_headless_gpu_starts_and_inspect_names_the_missing_nodes(
    runc, nvshim_runtime_bin, nvshim_bin, tmp_path, headless, rootfs
):
    """A GPU without nvidia-drm: the graphics container starts with what exists (no
    /dev/dri), and inspect names the card and render nodes graphics asked for."""
    env = _config(tmp_path, headless.root)
    bundle, res = _run(runc, nvshim_runtime_bin, tmp_path, rootfs, env, "graphics", "0")
    assert "NO-DRI" in res.stdout, res.describe()
    again = make_bundle(
        tmp_path / "again",
        rootfs,
        ["true"],
        env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=graphics"],
    )
    out = subprocess.run(
        [nvshim_bin, "inspect", "--bundle", str(again), "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    missing = json.loads(out)["missing_files"]
    assert "/dev/dri card node of GPU 0 (graphics)" in missing, out
    assert "/dev/dri render node of GPU 0 (graphics)" in missing, out


def test_doctor_names_missing_drm_nodes_of_a_headless_node(headless, node):
    """Host.missing (what doctor reports) names each GPU's absent card and render node
    for graphics/display, and nothing for compute or on a node with nvidia-drm."""
    missing = Host(headless.root).missing(["graphics"])
    assert {
        f"/dev/dri {kind} node of GPU {i} (graphics)" for i in (0, 1) for kind in ("card", "render")
    } <= set(missing)
    assert not [m for m in Host(headless.root).missing(["compute"]) if "/dev/dri" in m]
    assert not [m for m in Host(node.root).missing(["graphics"]) if "/dev/dri" in m]


def test_cdi_spec_with_graphics_gives_each_gpu_its_drm_nodes(node):
    """nvshim cdi generate with graphics puts each GPU's card and render node in its device
    (and in all); injecting that device for compute,utility drops them again."""
    spec = generate_spec(Host(node.root), capabilities=("graphics", "compute", "utility"))
    devices = {
        d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in spec["devices"]
    }
    assert {"/dev/dri/card1", "/dev/dri/renderD129"} <= set(devices["1"])
    assert not {"/dev/dri/card0", "/dev/dri/renderD128"} & set(devices["1"])
    assert {"/dev/dri/card0", "/dev/dri/card1"} <= set(devices["all"])
    plain = generate_spec(Host(node.root), capabilities=("compute", "utility"))
    assert not [
        p
        for d in plain["devices"]
        for n in d["containerEdits"]["deviceNodes"]
        for p in [n["path"]]
        if p.startswith("/dev/dri/")
    ]
    from nvshim.edits import DeviceNode, Edits

    edits = Edits(device_nodes=tuple(DeviceNode(path=p) for p in devices["1"]))
    kept = {n.path for n in restrict_to_capabilities(edits, ["compute", "utility"]).device_nodes}
    assert not {p for p in kept if p.startswith("/dev/dri/")}
    kept = {n.path for n in restrict_to_capabilities(edits, ["display"]).device_nodes}
    assert {"/dev/dri/card1", "/dev/dri/renderD129"} <= kept
