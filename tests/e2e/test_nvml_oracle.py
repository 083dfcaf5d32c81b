"""NVIDIA's generator as an oracle: ``nvidia-ctk cdi generate`` (toolkit v1.20.2, built from
its Go module) on a simulated node, whose libnvidia-ml answers NVML from the node's model,
beside ``nvshim cdi generate`` on the same node.

What is compared is what a container gets per device name: the device names and each
device's device nodes (whole GPUs, MIG devices, ``all``). Every difference is listed in
docs/development.md ("NVIDIA's generator on a simulated node") with its reason, and each
is asserted here as exactly that difference, so a new one fails. The files both specs
mount differ by design (nvshim's driver capabilities, NVIDIA's graphics set) and are
compared by ``bench/refcompare.py``, not here.

Both run as on a host whose driver is loaded (:mod:`tests.helpers.driverhost`): nvshim
asks a driver root's NVML only there, and NVIDIA's MIG discovery reads the host's
``/proc/driver/nvidia-caps/mig-minors`` whatever its ``--driver-root``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import yaml

from tests.helpers.common import require_root
from tests.helpers.driverhost import as_driver_host

pytestmark = pytest.mark.e2e

LIB = "usr/lib/x86_64-linux-gnu"


@pytest.fixture(scope="module")
def ctk() -> Path:
    from tests.helpers.gobuild import go_programs

    return go_programs("nvidia-toolkit") / "nvidia-ctk"


def nvidia_spec(ctk: Path, root: str, out: Path, mig: bool) -> Dict[str, List[str]]:
    """NVIDIA's spec of the node, as {device name: its device nodes}."""
    argv = [
        str(ctk),
        "cdi",
        "generate",
        "--mode",
        "nvml",
        "--driver-root",
        root,
        "--disable-hooks",
        "all",
        "--output",
        str(out),
    ]
    env = {**os.environ, "LD_LIBRARY_PATH": f"{root}/{LIB}"}
    res = subprocess.run(
        as_driver_host(argv, root if mig else None),
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return devices(out)


def nvshim_spec(root: str, out: Path) -> Dict[str, List[str]]:
    res = subprocess.run(
        as_driver_host(
            [
                shutil.which("nvshim") or "nvshim",
                "cdi",
                "generate",
                "--driver-root",
                root,
                "--output",
                str(out),
            ]
        ),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return devices(out)


def devices(path: Path) -> Dict[str, List[str]]:
    spec = yaml.safe_load(path.read_text())
    return {
        d["name"]: sorted(n["path"] for n in d["containerEdits"].get("deviceNodes", []))
        for d in spec["devices"]
    }


@pytest.mark.parametrize(
    "gpus,mig",
    [(1, False), (8, False), (256, False), (3, True)],
    ids=["1-gpu", "8-gpus", "256-gpus", "mig"],
)
def test_nvidias_generator_and_nvshims_agree(
    tmp_path: Path, ctk: Path, gpus: int, mig: bool
) -> None:
    """On a simulated node of 1, 8 and 256 GPUs and one with MIG devices, NVIDIA's nvidia-ctk cdi generate (asking the node's NVML) and nvshim cdi generate name the same devices with the same device nodes: every index and UUID, every MIG device (<gpu>:<mig> and its UUID, with its two capability nodes) and all. The one difference: NVIDIA leaves a MIG-enabled GPU out as a whole device, nvshim keeps it (docs/development.md)."""
    require_root()
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=gpus, mig=mig)
    theirs = nvidia_spec(ctk, node.root, tmp_path / "nvidia.yaml", mig)
    ours = nvshim_spec(node.root, tmp_path / "nvshim.yaml")
    whole_mig: List[Tuple[str, List[str]]] = []
    for gpu in node.gpus:
        if gpu.mig:
            whole_mig += [(str(gpu.index), ours[str(gpu.index)]), (gpu.uuid, ours[gpu.uuid])]
            assert ours[str(gpu.index)] == [f"/dev/nvidia{gpu.minor}"]
    assert {k: v for k, v in ours.items() if k not in dict(whole_mig)} == theirs
    migs = [m for g in node.gpus for m in g.mig]
    assert len([k for k in theirs if k.startswith("MIG-")]) == len(migs) == (2 if mig else 0)
    expected = (
        {str(g.index) for g in node.gpus}
        | {g.uuid for g in node.gpus}
        | {"all"}
        | {m.uuid for m in migs}
        | {f"{g.index}:{j}" for g in node.gpus for j in range(len(g.mig))}
    )
    assert set(ours) == expected
