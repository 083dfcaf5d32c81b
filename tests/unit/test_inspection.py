"""runtime/inspection: what `nvshim inspect` shows of a create plan, as library functions."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nvshim.config import Config
from nvshim.runtime.create import plan_create
from nvshim.runtime.inspection import env_set, plan_diff, plan_summary, render_text

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod)")


def bundle_with(tmp_path: Path, env: list) -> Path:
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    spec = {"ociVersion": "1.0.2", "process": {"env": env, "cwd": "/"},
            "root": {"path": "rootfs"}}
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


@needs_root
def test_a_granted_gpu_is_summarised_rendered_and_diffed(tmp_path: Path) -> None:
    """A request for GPU 1 of two: the summary grants index 1 by its minor, the text lists it
    and says config.json would be rewritten, and the diff adds its device node."""
    from nvshim.host.sim import create_node

    sim = create_node(str(tmp_path / "node"), gpus=2)
    gpu = sim.gpus[1]
    bundle = bundle_with(tmp_path, ["NVIDIA_VISIBLE_DEVICES=1"])
    config = Config(driver_root=sim.root)
    plan = plan_create(str(bundle), config)
    summary = plan_summary(plan, config)
    assert summary["requested"] == ["1"]
    assert [g["index"] for g in summary["granted_gpus"]] == [1]
    assert summary["granted_gpus"][0]["minor"] == gpu.minor
    assert f"/dev/nvidia{gpu.minor}" in summary["device_nodes"]
    assert summary["changes_config"] is True
    assert summary["env_set"] == env_set(plan) == ["NVIDIA_VISIBLE_DEVICES=void"]
    json.dumps(summary)  # plain JSON values only
    lines = render_text(plan, config).splitlines()
    assert lines[0] == f"bundle:        {bundle / 'config.json'}"
    assert f"  1  /dev/nvidia{gpu.minor}  {gpu.uuid}  {gpu.pci_bus_id}  {gpu.model}" in lines
    assert lines[-1] == "config.json:   would be rewritten"
    diff = plan_diff(plan)
    assert diff.startswith("--- config.json\n+++ config.json (after nvshim)\n")
    assert f'"/dev/nvidia{gpu.minor}"' in diff


def test_a_bundle_that_asks_for_nothing_shows_no_change(tmp_path: Path) -> None:
    """No request: nothing granted, no env set, an empty diff, and the text says config.json
    stays byte-identical."""
    bundle = bundle_with(tmp_path, ["PATH=/bin"])
    config = Config(driver_root=str(tmp_path / "no-driver"))
    plan = plan_create(str(bundle), config)
    summary = plan_summary(plan, config)
    assert summary["granted_gpus"] == [] and summary["changes_config"] is False
    assert env_set(plan) == [] and plan_diff(plan) == ""
    text = render_text(plan, config)
    assert "requested:     -" in text.splitlines()
    assert text.endswith("config.json:   unchanged (byte-identical)")
