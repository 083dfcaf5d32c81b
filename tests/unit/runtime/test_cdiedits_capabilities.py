"""CDI-mode injection honours NVIDIA_DRIVER_CAPABILITIES (the reference injects everything)."""

from __future__ import annotations

import json
import os

import pytest

from nvshim.cdi.write import write_spec
from nvshim.config import Config
from nvshim.host.discovery import Host
from nvshim.node.cdigen import generate_spec
from nvshim.runtime.create import plan_create

HOOK = ("/opt/nvshim/venv/bin/python3", "-I", "-m", "nvshim.hook")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root (mknod)")
    from nvshim.sim.build import create_node

    base = tmp_path_factory.mktemp("cdicaps")
    node = create_node(str(base / "node"), gpus=2)
    spec = generate_spec(
        Host(node.root), capabilities=("compute", "utility", "video"), hook_command=HOOK
    )
    write_spec(str(base / "cdi" / "nvidia.yaml"), spec)
    return node, Config(driver_root=node.root, cdi_spec_dirs=(str(base / "cdi"),))


def plan(tmp_path, config, env):
    bundle = tmp_path / "b"
    bundle.mkdir(exist_ok=True)
    (bundle / "config.json").write_text(json.dumps({"process": {"env": env}, "mounts": []}))
    return plan_create(str(bundle), config)


def names(p):
    mounts = {m.container_path.rsplit("/", 1)[1].split(".so")[0] for m in p.edits.mounts}
    nodes = {n.path for n in p.edits.device_nodes}
    links = [a for a in p.edits.hooks[0].args if "::" in a] if p.edits.hooks else []
    return mounts, nodes, links


def test_utility_only_drops_compute_files(setup, tmp_path):
    """nvidia.com/gpu=0 with utility: no libcuda, no uvm nodes, no link to libcuda."""
    _, config = setup
    p = plan(
        tmp_path,
        config,
        ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0", "NVIDIA_DRIVER_CAPABILITIES=utility"],
    )
    mounts, nodes, links = names(p)
    assert "libcuda" not in mounts and "libnvidia-ml" in mounts and "nvidia-smi" in mounts
    assert "libnvcuvid" not in mounts
    assert "/dev/nvidia-uvm" not in nodes and "/dev/nvidiactl" in nodes
    assert links and not any("libcuda" in link for link in links)


def test_default_keeps_compute_and_utility_only(setup, tmp_path):
    """The default (compute,utility) drops the spec's video libraries but keeps libcuda and its links."""
    _, config = setup
    p = plan(tmp_path, config, ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0"])
    mounts, nodes, links = names(p)
    assert {"libcuda", "libnvidia-ml"} <= mounts and "libnvcuvid" not in mounts
    assert "/dev/nvidia-uvm" in nodes
    assert "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so" in links


def test_video_keeps_everything_generated(setup, tmp_path):
    """video asks for video and compute libraries, so nothing from this spec is dropped."""
    _, config = setup
    p = plan(
        tmp_path,
        config,
        ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0", "NVIDIA_DRIVER_CAPABILITIES=video,utility"],
    )
    mounts, _, _ = names(p)
    assert {"libcuda", "libnvcuvid", "libnvidia-encode", "libnvidia-ml"} <= mounts
