"""verify-with: kubelet covers every device node a claim injects, whatever it is called;
privileged containers are journaled, never failed for the GPUs they hold; a DRA claim the
kubelet lists for several containers is shared, not a conflict.

The create road (:func:`nvshim.runtime.create.plan_create`) runs against a simulated node
with a real gRPC PodResources server standing in for the kubelet
(tests/helpers/podresources.py), CDI specs written into the test's own spec directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, Iterator, List

import pytest

from nvshim.config import Config
from nvshim.errors import RequestError
from nvshim.host.discovery import Host
from nvshim.node.holders import Holder, conflicts, render_table
from nvshim.runtime.create import plan_create
from nvshim.runtime.grants import Grant, parse_record
from tests.helpers.podresources import PodResourcesServer, dra
from tests.unit.runtime.allocation.test_kubelet import bundle, cri, mount

GPU = "nvidia.com/gpu"
IMEX = "nvidia.com/imex-channel"
NIC_MAJOR = 231  # infiniband_verbs: no NVIDIA driver's


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A 2-GPU node with 4 IMEX channels, its GPU and IMEX CDI specs, and a NIC vendor's
    spec (a node with the infiniband major, as another pod's DRA claim leaves in /var/run/cdi)."""
    if os.geteuid() != 0:
        pytest.skip("the simulated GPU node needs root (mknod)")
    from nvshim.cdi.write import write_spec
    from nvshim.node.cdigen import generate_spec
    from nvshim.runtime.extras import generate_imex_spec
    from nvshim.runtime.hookargs import hook_command
    from nvshim.sim.build import create_node

    base = tmp_path_factory.mktemp("verify")
    sim = create_node(str(base / "n"), gpus=2, shuffle_minors=True, imex_channels=4)
    cdi = base / "cdi"
    cdi.mkdir()
    host = Host(sim.root)
    write_spec(str(cdi / "nvidia.json"), generate_spec(host, hook_command=hook_command()))
    write_spec(str(cdi / "imex.json"), generate_imex_spec(host))
    nic = base / "uverbs0"
    os.mknod(nic, 0o600 | 0o020000, os.makedev(NIC_MAJOR, 192))
    (cdi / "nic.json").write_text(
        json.dumps(
            {
                "cdiVersion": "0.5.0",
                "kind": "vendor.example/nic",
                "devices": [
                    {
                        "name": "claim-nic0",
                        "containerEdits": {
                            "deviceNodes": [
                                {"path": "/dev/infiniband/uverbs0", "hostPath": str(nic)}
                            ]
                        },
                    }
                ],
            }
        )
    )
    return SimpleNamespace(root=sim.root, gpus=sim.gpus, cdi_dir=str(cdi))


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[PodResourcesServer]:
    server = PodResourcesServer(str(tmp_path / "kubelet.sock")).start()
    yield server
    server.stop()


def config(node: Any, tmp_path: Path, **kw: Any) -> Config:
    base: Dict[str, Any] = dict(
        require_allocation=True,
        verify_with="kubelet",
        driver_root=node.root,
        kubelet_socket=str(tmp_path / "kubelet.sock"),
        kubelet_checkpoint=None,
        grants_journal=None,
        cdi_spec_dirs=(node.cdi_dir,),
    )
    base.update(kw)
    return Config(**base)


def cdi_mount(name: str) -> Dict[str, Any]:
    """The device plugin's volume-mounts spelling of a CDI name (``cdi/<vendor>/<class>/<dev>``)."""
    kind, _, device = name.partition("=")
    return mount(f"cdi/{kind}/{device}")


def node_paths(plan: Any) -> List[str]:
    return sorted(n.path for n in plan.edits.device_nodes)


# --- item: CDI names that inject no GPU -------------------------------------------------------


def test_an_imex_channel_by_cdi_name_is_held_to_the_kubelets_record(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """A hostPath /dev/null at .../cdi/nvidia.com/imex-channel/2 beside the pod's real GPU
    is refused, naming the channel, the CDI name, the container and the record."""
    gpu = node.gpus[1]
    kubelet.set([("team-a", "mine", {"main": {GPU: [gpu.uuid]}})])
    spec = bundle(tmp_path, [], mounts=[mount(gpu.uuid), cdi_mount(f"{IMEX}=2")])
    with pytest.raises(RequestError) as info:
        plan_create(spec, config(node, tmp_path))
    assert str(info.value) == (
        f'IMEX channel 2 (CDI device "{IMEX}=2") is not this container\'s allocation: the '
        "kubelet allocated IMEX channels none to team-a/mine/main (claimed through "
        "volume-mounts, checked via podresources)"
    )


def test_an_imex_channel_by_cdi_name_the_kubelet_allocated_is_granted(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """The same CDI name for a channel the kubelet lists under an imex resource is granted."""
    kubelet.set([("team-a", "mine", {"main": {IMEX: ["channel2"]}})])
    plan = plan_create(
        bundle(tmp_path, [], mounts=[cdi_mount(f"{IMEX}=2")]), config(node, tmp_path)
    )
    assert "/dev/nvidia-caps-imex-channels/channel2" in node_paths(plan)
    assert any("every device node of the CDI devices" in n for n in plan.notes)


def test_another_vendors_cdi_device_is_refused_unless_a_claim_of_the_container_has_it(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """A NIC of another pod's DRA claim in the spec dirs, named by a hostPath mount, is
    refused naming its node and that pod; listed under the container's own claim, granted."""
    gpu = node.gpus[0]
    name = "vendor.example/nic=claim-nic0"
    kubelet.set(
        [
            (
                "team-b",
                "owner",
                {},
                {"train": [dra("nics", name, namespace="team-b", driver="nic.example")]},
            ),
            ("team-a", "mine", {"main": {GPU: [gpu.uuid]}}),
        ]
    )
    spec = bundle(tmp_path, [], mounts=[mount(gpu.uuid), cdi_mount(name)])
    with pytest.raises(RequestError) as info:
        plan_create(spec, config(node, tmp_path))
    assert str(info.value) == (
        f'CDI device "{name}" injects /dev/infiniband/uverbs0 ({NIC_MAJOR}:192), no device of '
        "the NVIDIA driver, and is not this container's allocation: the kubelet gave it to "
        "team-b/owner/train (claimed through volume-mounts, checked via podresources)"
    )
    kubelet.set(
        [
            (
                "team-a",
                "mine",
                {"main": {GPU: [gpu.uuid]}},
                {"main": [dra("nics", name, driver="nic.example")]},
            )
        ]
    )
    plan = plan_create(spec, config(node, tmp_path))
    assert "/dev/infiniband/uverbs0" in node_paths(plan)
    assert [g.uuid for g in plan.gpus] == [gpu.uuid]


def test_a_gpu_by_cdi_name_is_still_checked_as_a_gpu(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """nvidia.com/gpu=1 by CDI mount, allocated: granted, its control nodes and all."""
    gpu = node.gpus[1]
    kubelet.set([("team-a", "mine", {"main": {GPU: [gpu.uuid]}})])
    plan = plan_create(bundle(tmp_path, [], mounts=[cdi_mount(f"{GPU}=1")]), config(node, tmp_path))
    assert [g.uuid for g in plan.cdi_gpus] == [gpu.uuid]
    assert "/dev/nvidiactl" in node_paths(plan)


@pytest.mark.parametrize("by", ["index", "uuid"])
def test_a_cdi_annotation_for_the_containers_own_dra_claim_is_granted(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer, by: str
) -> None:
    """A kubelet before 1.32 also passes a DRA claim's CDI devices as cdi.k8s.io/
    annotations: the GPU the container's own claim lists is granted (not checked against
    the device-plugin ids alone), and another pod's claim's GPU is refused naming it."""
    gpu = node.gpus[1]
    name = f"{GPU}={gpu.index if by == 'index' else gpu.uuid}"
    notes = {**cri(), "cdi.k8s.io/gpu.nvidia.com_claim-uid": name}
    kubelet.set([("team-a", "mine", {}, {"main": [dra("gpu", name)]})])
    plan = plan_create(bundle(tmp_path, [], annotations=notes), config(node, tmp_path))
    assert [g.uuid for g in plan.cdi_gpus] == [gpu.uuid]
    assert (plan.request.source, plan.verified) == ("cdi-annotations", "kubelet")
    kubelet.set(
        [
            ("team-b", "owner", {}, {"train": [dra("t", name, namespace="team-b")]}),
            ("team-a", "mine", {"main": {}}),
        ]
    )
    with pytest.raises(RequestError) as info:
        plan_create(bundle(tmp_path, [], annotations=notes), config(node, tmp_path))
    assert str(info.value) == (
        f"GPU 1 ({gpu.uuid}) is not this container's allocation: the kubelet gave it to "
        "team-b/owner/train (claimed through cdi-annotations, checked via podresources)"
    )


# --- item: privileged containers --------------------------------------------------------------


def privileged_bundle(tmp_path: Path, node: Any, env: List[str]) -> str:
    """A privileged CRI container as containerd makes one: SYS_ADMIN, allow-all cgroup, and
    the host's devices (every GPU node) in linux.devices."""
    path = bundle(tmp_path, env)
    spec = json.loads(Path(path, "config.json").read_text())
    spec["process"]["capabilities"]["bounding"] = ["CAP_SYS_ADMIN"]
    spec["linux"] = {
        "resources": {"devices": [{"allow": True, "access": "rwm"}]},
        "devices": [
            {"path": f"/dev/nvidia{g.minor}", "type": "c", "major": 195, "minor": g.minor}
            for g in node.gpus
        ],
    }
    Path(path, "config.json").write_text(json.dumps(spec))
    return path


DAEMONSET = dict(
    allocation_sources=("volume-mounts", "cdi-annotations", "envvar-uuids", "privileged"),
    kubelet_unreachable="fail",
)


def test_a_privileged_gpu_pod_starts_under_the_daemonsets_config(node: Any, tmp_path: Path) -> None:
    """Image env all in a privileged container, with privileged among the sources and the
    kubelet down: granted every GPU (source privileged, verified privileged), not failed."""
    plan = plan_create(
        privileged_bundle(tmp_path, node, ["NVIDIA_VISIBLE_DEVICES=all"]),
        config(node, tmp_path, **DAEMONSET),
    )
    assert plan.request.source == "privileged" and plan.verified == "privileged"
    assert sorted(plan.granted_uuids) == sorted(g.uuid for g in node.gpus)
    assert plan.grant_source == "privileged"


def test_a_privileged_pod_asking_a_gpu_it_was_not_allocated_is_not_failed(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """A privileged container naming an unallocated GPU UUID (envvar-uuids) starts: it
    holds that GPU's node already."""
    kubelet.set([("team-a", "mine", {"main": {}})])
    gpu = node.gpus[0]
    plan = plan_create(
        privileged_bundle(tmp_path, node, [f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}"]),
        config(node, tmp_path, **DAEMONSET),
    )
    assert plan.verified == "privileged" and gpu.uuid in plan.granted_uuids


def test_a_privileged_pod_is_stripped_not_failed_by_on_missing_allocation_fail(
    node: Any, tmp_path: Path
) -> None:
    """Without the privileged source and with on-missing-allocation: fail, a privileged
    container's NVIDIA_VISIBLE_DEVICES=all is stripped; the GPUs it holds are journaled."""
    plan = plan_create(
        privileged_bundle(tmp_path, node, ["NVIDIA_VISIBLE_DEVICES=all"]),
        config(node, tmp_path, on_missing_allocation="fail", allocation_sources=("volume-mounts",)),
    )
    assert plan.request.source == "none" and plan.request.set_void
    assert plan.grant_source == "privileged"
    assert sorted(plan.granted_uuids) == sorted(g.uuid for g in node.gpus)


def test_a_privileged_pod_asking_nothing_is_journaled_as_holding_every_gpu(
    node: Any, tmp_path: Path
) -> None:
    """A privileged container with no NVIDIA_ env at all: its GPU nodes are its holding."""
    plan = plan_create(privileged_bundle(tmp_path, node, []), Config(driver_root=node.root))
    assert plan.grant_source == "privileged"
    assert sorted(plan.granted_uuids) == sorted(g.uuid for g in node.gpus)
    assert not plan.changed


def holder(cid: str, gpus: List[str], **kw: Any) -> Holder:
    return Holder(
        Grant(
            time=1.0,
            container_id=cid,
            root="/run/runc",
            runtime="runc",
            bundle=f"/b/{cid}",
            source=kw.pop("source", "volume-mounts"),
            gpus=tuple(gpus),
            **kw,
        ),
        "running",
        1,
    )


def test_a_privileged_holder_is_listed_but_no_conflict() -> None:
    """A privileged pod holding GPU-A beside the pod allocated GPU-A: no CONFLICT, the
    table says privileged."""
    holders = [holder("priv", ["GPU-A", "GPU-B"], source="privileged"), holder("pod", ["GPU-A"])]
    assert conflicts(holders) == {}
    assert "privileged (holds every device)" in render_table(holders)


# --- item: shared DRA claims ------------------------------------------------------------------


def test_one_dra_claim_listed_for_two_containers_is_shared_not_a_conflict() -> None:
    """Two live holders of GPU-A that both got it through claim team-a/shared: no conflict;
    a third holder of GPU-A through no claim makes it one."""
    claim = (("team-a/shared", ("GPU-A",)),)
    holders = [
        holder("a", ["GPU-A"], claims=claim, source="engine"),
        holder("b", ["GPU-A"], claims=claim, source="engine"),
    ]
    assert conflicts(holders) == {}
    assert "shared (DRA claim team-a/shared)" in render_table(holders)
    assert set(conflicts(holders + [holder("c", ["GPU-A"])])) == {"GPU-A"}
    other = (("team-b/other", ("GPU-A",)),)
    assert set(conflicts([holders[0], holder("d", ["GPU-A"], claims=other)])) == {"GPU-A"}


def test_a_grants_claims_survive_the_journal() -> None:
    """A record's claims are written and read back; a record without them has none."""
    grant = holder("a", ["GPU-A"], claims=(("ns/c", ("GPU-A",)),)).grant
    assert parse_record(grant.to_line()) == grant
    plain = holder("b", ["GPU-A"]).grant
    assert b"claims" not in plain.to_line() and parse_record(plain.to_line()) == plain


def test_the_claim_a_shared_gpu_came_through_is_found_for_the_journal(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """Two containers the kubelet lists with one DRA claim for GPU 1, the engine having
    injected it into both: each create passes verification and names the claim for its
    journal record, so ``nvshim grants`` sees no conflict."""
    from nvshim.runtime.allocation.cdinames import claim_gpus

    gpu = node.gpus[1]
    claim = dra("shared", f"{GPU}=1")
    kubelet.set([("team-a", "pa", {}, {"main": [claim]}), ("team-a", "pb", {}, {"main": [claim]})])
    holders = []
    for pod in ("pa", "pb"):
        path = bundle(tmp_path, [], annotations=cri(pod=pod, uid=f"uid-{pod}"))
        spec = json.loads(Path(path, "config.json").read_text())
        spec["linux"] = {
            "devices": [
                {"path": f"/dev/nvidia{gpu.minor}", "type": "c", "major": 195, "minor": gpu.minor}
            ]
        }
        Path(path, "config.json").write_text(json.dumps(spec))
        cfg = config(node, tmp_path)
        plan = plan_create(path, cfg)
        assert plan.granted_uuids == (gpu.uuid,) and plan.verified == "kubelet"
        assert plan.host is not None and plan.allocation is not None
        claims = claim_gpus(plan.host, cfg, plan.allocation, plan.granted_uuids)
        assert claims == (("team-a/shared", (gpu.uuid,)),)
        holders.append(holder(pod, [gpu.uuid], claims=claims, source="engine"))
    assert conflicts(holders) == {}
