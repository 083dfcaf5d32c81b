"""e2e: the grant journal and ``nvshim grants`` against real runc containers.

Containers are created (not started: they sit in runc's ``created`` state, holding their
devices) through the installed nvshim-runtime with a private runc ``--root``; liveness is
what ``runc state`` says when ``nvshim grants`` reads the journal.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Dict

import pytest

from nvshim.node.compile import compile_node
from tests.helpers.bundle import make_bundle
from tests.helpers.common import require_binary
from tests.helpers.node import write_nvshim_config
from tests.helpers.runc import Runc


@pytest.fixture
def setup(tmp_path: Path, runc: Runc, base_rootfs: Path, nvshim_runtime_bin: str) -> Dict[str, Any]:
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=2)
    cfg = write_nvshim_config(
        tmp_path / "etc",
        {
            "runtimes": [require_binary("runc")],
            "driver-root": node.root,
        },
    )
    compile_node(str(cfg))
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVSHIM_CONFIG": str(cfg)}
    return {
        "node": node,
        "env": env,
        "journal": cfg.parent / "grants.jsonl",
        "rootfs": base_rootfs,
        "runtime": nvshim_runtime_bin,
        "tmp": tmp_path,
    }


def create(runc: Runc, s: Dict[str, Any], cid: str, visible: str) -> None:
    bundle = make_bundle(
        s["tmp"] / cid, s["rootfs"], ["sleep", "30"], env={"NVIDIA_VISIBLE_DEVICES": visible}
    )
    res = runc.create(bundle, cid, runtime=s["runtime"], env=s["env"])
    assert res.rc == 0, res.describe()


def grants(nvshim_bin: str, s: Dict[str, Any], *extra: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(
        [nvshim_bin, "grants", "--journal", str(s["journal"]), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env=s["env"],
        check=False,
    )


def test_two_containers_on_one_gpu_are_flagged_until_one_is_deleted(
    runc: Runc,
    setup: Dict[str, Any],
    nvshim_bin: str,
    tmp_path: Path,
) -> None:
    """Two live containers granted GPU 0 are a conflict (exit 1, in JSON, table and textfile), each row naming GPU 0 by index and UUID; deleting one clears it."""
    gpu0 = setup["node"].gpus[0].uuid
    create(runc, setup, "holder-a", "0")
    create(runc, setup, "holder-b", gpu0)
    res = grants(nvshim_bin, setup, "--format", "json", "--prometheus", str(tmp_path / "g.prom"))
    assert res.returncode == 1, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["conflicts"] == {gpu0: ["holder-a", "holder-b"]}
    assert {g["container_id"]: g["status"] for g in doc["grants"]} == {
        "holder-a": "created",
        "holder-b": "created",
    }
    assert [g["gpu_indices"] for g in doc["grants"]] == [["0"], ["0"]]  # as nvidia-smi numbers it
    prom = (tmp_path / "g.prom").read_text()
    assert prom.count(f'nvshim_gpu_grants{{gpu="{gpu0}"') == 2
    assert f'nvshim_gpu_grant_conflicts{{gpu="{gpu0}"}} 2' in prom
    table = grants(nvshim_bin, setup)
    assert "CONFLICT" in table.stdout and table.returncode == 1
    assert [row.split()[:2] for row in table.stdout.splitlines()[1:3]] == [["0", gpu0]] * 2

    assert runc.delete("holder-b", force=True).rc == 0
    res = grants(nvshim_bin, setup, "--format", "json")
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["conflicts"] == {}
    assert [g["container_id"] for g in doc["grants"]] == ["holder-a"]


def test_time_slicing_replicas_share_a_gpu_without_a_conflict(
    runc: Runc,
    setup: Dict[str, Any],
    nvshim_bin: str,
) -> None:
    """Two containers granted replicas of GPU 1 (<uuid>::1, <uuid>::2) are listed as shared, not flagged."""
    gpu1 = setup["node"].gpus[1].uuid
    create(runc, setup, "rep-a", f"{gpu1}::1")
    create(runc, setup, "rep-b", f"{gpu1}::2")
    res = grants(nvshim_bin, setup, "--format", "json")
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["conflicts"] == {}
    assert sorted((g["container_id"], g["shared"]) for g in doc["grants"]) == [
        ("rep-a", True),
        ("rep-b", True),
    ]
    assert "shared (replica)" in grants(nvshim_bin, setup).stdout
