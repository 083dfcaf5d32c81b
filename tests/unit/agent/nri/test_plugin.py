"""Unit tests of the NRI plugin's decisions, on a simulated node (no engine)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from nvshim._record import replace
from nvshim.agent.nri import plugin
from nvshim.agent.nri.api import Container, Mount, Pod
from nvshim.agent.nri.transport import RpcError
from nvshim.config import Config
from tests.helpers.agent import RecordingLog as Log


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("nri") / "node"), gpus=2)


def config(sim: Any, tmp: Path, **kw: Any) -> Config:
    return replace(Config(driver_root=sim.root, grants_journal=str(tmp / "grants.jsonl"),
                          runtimes=("runc",), nri_inject=True), **kw)


POD = Pod("sb", "train", "uid-1", "team-a", {}, "")


def test_guard_voids_unallocated_and_removes_claims(sim: Any, tmp_path: Path) -> None:
    """An unallocated container asking for every GPU gets NVIDIA_VISIBLE_DEVICES=void, its device-list mount and CDI annotation removed."""
    ctr = Container(id="c", name="main", env=("NVIDIA_VISIBLE_DEVICES=all",),
                    annotations={"cdi.k8s.io/x": "nvidia.com/gpu=9"},
                    mounts=(Mount("/var/run/nvidia-container-devices/all", "bind", "/dev/null"),))
    adj = plugin.decide(config(sim, tmp_path, annotation_prefixes=("nope/",)),
                        dataclasses.replace(POD, runtime_handler="nvidia"), ctr, Log())
    assert adj.env == (("NVIDIA_VISIBLE_DEVICES", "void"),)
    assert adj.mounts == (Mount("-/var/run/nvidia-container-devices/all"),)


def test_verify_refusal_is_an_error_naming_the_pod(sim: Any, tmp_path: Path) -> None:
    """A plan the runtime would refuse (on-missing-allocation: fail) is an error reply naming the pod and container, journaled as refused."""
    ctr = Container(id="c", name="main", env=("NVIDIA_VISIBLE_DEVICES=all",))
    cfg = config(sim, tmp_path, on_missing_allocation="fail")
    with pytest.raises(RpcError, match=r"^nvshim: pod team-a/train container main: "):
        plugin.decide(cfg, POD, ctr, Log())
    assert '"refused"' in (tmp_path / "grants.denied.jsonl").read_text()


def test_inject_gives_the_allocated_gpu_only(sim: Any, tmp_path: Path) -> None:
    """Under plain runc an allocated UUID gets its device node (and the control nodes), nothing for the other GPU."""
    gpu = sim.gpus[1]
    ctr = Container(id="c", name="main", env=(f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}",))
    adj = plugin.decide(config(sim, tmp_path), POD, ctr, Log())
    paths = {d.path for d in adj.devices}
    assert f"/dev/nvidia{gpu.minor}" in paths and f"/dev/nvidia{sim.gpus[0].minor}" not in paths
    assert "createContainer" in adj.hooks
    assert gpu.uuid in (tmp_path / "grants.jsonl").read_text()


def test_gpu_and_nvshim_handlers_are_not_injected(sim: Any, tmp_path: Path) -> None:
    """A handler that injects GPUs itself gets no injection; one running nvshim-runtime is left alone."""
    gpu = sim.gpus[0]
    ctr = Container(id="c", name="main", env=(f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}",))
    cfg = config(sim, tmp_path)
    assert not plugin.decide(cfg, dataclasses.replace(POD, runtime_handler="nvidia"), ctr, Log())
    bare = Container(id="c", name="main", env=("NVIDIA_VISIBLE_DEVICES=all",))
    assert not plugin.decide(cfg, dataclasses.replace(POD, runtime_handler="nvshim"), bare, Log())


def test_sandbox_and_no_claim_are_untouched(sim: Any, tmp_path: Path) -> None:
    """A container that names no GPU gets no adjustment and no record."""
    assert not plugin.decide(config(sim, tmp_path), POD, Container(id="c", name="main"), Log())
    assert not (tmp_path / "grants.jsonl").exists()
