"""NVIDIA's toolkit (v1.20.2, built from its Go module) on the node's spec: what NVIDIA's
runtime in CDI mode resolves is what nvshim generated and lists."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.helpers.gobuild import go_programs
from tests.k8s.conftest import Node

pytestmark = pytest.mark.e2e


def test_nvidia_ctk_lists_the_devices_nvshim_lists(node: Node) -> None:
    """nvidia-ctk cdi list reads the CDI spec nvshim generated for the node and lists exactly the qualified names nvshim cdi list does (every index, every UUID, all): the names NVIDIA's runtime resolves NVIDIA_VISIBLE_DEVICES to in CDI mode."""
    spec_dir = str(node.base / "cdi")
    ctk = subprocess.run(
        [str(go_programs("nvidia-toolkit") / "nvidia-ctk"), "cdi", "list", "--spec-dir", spec_dir],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    ours = subprocess.run(
        [shutil.which("nvshim") or "nvshim", "cdi", "list", "--spec-dir", spec_dir],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (ctk.returncode, ours.returncode) == (0, 0), ctk.stderr + ours.stderr
    names = sorted(ours.stdout.split())
    expected = (
        {f"nvidia.com/gpu={g.index}" for g in node.sim.gpus}
        | {f"nvidia.com/gpu={g.uuid}" for g in node.sim.gpus}
        | {"nvidia.com/gpu=all"}
    )
    assert set(names) == expected, names
    assert sorted(ctk.stdout.split()) == names, ctk.stdout
