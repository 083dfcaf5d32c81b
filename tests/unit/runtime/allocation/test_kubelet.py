"""verify-with: kubelet — claims are granted only where the kubelet's record has them.

A real gRPC PodResources server (tests/helpers/podresources.py, messages from Google's
protobuf runtime) stands in for the kubelet on a unix socket; nvshim's create road
(:func:`nvshim.runtime.create.plan_create`) runs against a simulated 4-GPU node with the
``io.kubernetes.cri.*`` annotations containerd writes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from nvshim.config import Config
from nvshim.errors import RequestError
from nvshim.runtime.allocation.kubelet import decode_list_response
from nvshim.runtime.create import plan_create
from tests.helpers.podresources import DraClaim, DraDevice, PodResourcesServer, dra

GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if os.geteuid() != 0:
        pytest.skip("the simulated GPU node needs root (mknod)")
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("node") / "n"), gpus=4, shuffle_minors=True)


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[PodResourcesServer]:
    server = PodResourcesServer(str(tmp_path / "kubelet.sock")).start()
    yield server
    server.stop()


def cri(
    pod: str = "mine", container: str = "main", namespace: str = "team-a", uid: str = "uid-mine"
) -> Dict[str, str]:
    return {
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.sandbox-id": "0123abcd",
        "io.kubernetes.cri.sandbox-name": pod,
        "io.kubernetes.cri.sandbox-namespace": namespace,
        "io.kubernetes.cri.sandbox-uid": uid,
        "io.kubernetes.cri.container-name": container,
    }


def bundle(
    tmp_path: Path,
    env: List[str],
    annotations: Optional[Dict[str, str]] = None,
    mounts: Optional[List[Dict[str, Any]]] = None,
) -> str:
    b = tmp_path / f"bundle-{time.monotonic_ns()}"
    b.mkdir()
    spec = {
        "process": {"env": ["PATH=/bin"] + env, "capabilities": {"bounding": ["CAP_CHOWN"]}},
        "root": {"path": "rootfs"},
        "mounts": mounts or [],
        "annotations": cri() if annotations is None else annotations,
    }
    (b / "config.json").write_text(json.dumps(spec, indent=2))
    return str(b)


def config(node: Any, tmp_path: Path, **kw: Any) -> Config:
    base: Dict[str, Any] = dict(
        require_allocation=True,
        verify_with="kubelet",
        driver_root=node.root,
        nvml_facts=node.nvml_facts,
        kubelet_socket=str(tmp_path / "kubelet.sock"),
        kubelet_checkpoint=str(tmp_path / "no-checkpoint"),
        grants_journal=None,
    )
    base.update(kw)
    return Config(**base)


def cdi_config(node: Any, tmp_path: Path) -> Config:
    """:func:`config` (verify-with none) whose spec dir holds the node's generated CDI spec."""
    from click.testing import CliRunner

    from nvshim.cli.cmd_cdi import generate

    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir()
    res = CliRunner().invoke(
        generate, ["--driver-root", node.root, "--output", str(cdi_dir / "nvidia.yaml")]
    )
    assert res.exit_code == 0, res.output
    return config(node, tmp_path, verify_with="none", cdi_spec_dirs=(str(cdi_dir),))


def mount(ident: str) -> Dict[str, Any]:
    return {
        "source": "/dev/null",
        "destination": f"/var/run/nvidia-container-devices/{ident}",
        "type": "bind",
        "options": ["bind", "ro"],
    }


def test_codec_reads_protobuf_runtime_messages_and_skips_newer_fields(
    kubelet: PodResourcesServer,
) -> None:
    """nvshim's decoder reads what protobuf encodes, ignoring topology, cpu_ids and memory."""
    kubelet.set([("ns", "p", {"c": {GPU: ["GPU-a", "GPU-b::2"], "example.com/nic": ["n0"]}})])
    wire = kubelet._list(None, None).SerializeToString()
    assert decode_list_response(wire) == [
        ("p", "ns", [("c", [(GPU, ("GPU-a", "GPU-b::2")), ("example.com/nic", ("n0",))], ())])
    ]


def test_allocated_gpu_is_granted(node: Any, tmp_path: Path, kubelet: PodResourcesServer) -> None:
    """A UUID claim (device plugin envvar strategy) for the GPU the kubelet allocated is granted."""
    gpu = node.gpus[2]
    kubelet.set([("team-a", "mine", {"main": {GPU: [gpu.uuid]}})])
    plan = plan_create(
        bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}"]), config(node, tmp_path)
    )
    assert [g.uuid for g in plan.gpus] == [gpu.uuid]
    assert plan.verified == "kubelet" and plan.request.source == "envvar-uuids"
    assert kubelet.calls["List"] == 1


def test_a_replica_the_kubelet_allocated_makes_the_grant_shared(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """NVIDIA's device plugin hands a time-sliced GPU over as its bare UUID (env or mount), the kubelet's record names the replica (<uuid>::1): the grant is marked shared, so nvshim grants does not call two such pods a conflict; a whole-GPU allocation stays unshared."""
    gpu = node.gpus[1]
    kubelet.set([("team-a", "mine", {"main": {GPU: [f"{gpu.uuid}::1"]}})])
    plan = plan_create(
        bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}"]), config(node, tmp_path)
    )
    assert [g.uuid for g in plan.gpus] == [gpu.uuid] and plan.request.shared
    kubelet.set([("team-a", "mine", {"main": {GPU: [gpu.uuid]}})])
    plan = plan_create(
        bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}"]), config(node, tmp_path)
    )
    assert [g.uuid for g in plan.gpus] == [gpu.uuid] and not plan.request.shared


def test_forged_uuid_env_of_another_pods_gpu_is_refused(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """A pod that got no GPU naming another tenant's GPU UUID fails, the error naming the GPU and its holder."""
    victim = node.gpus[1]
    kubelet.set(
        [("team-b", "victim", {"train": {GPU: [victim.uuid]}}), ("team-a", "mine", {"main": {}})]
    )
    with pytest.raises(RequestError) as info:
        plan_create(
            bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={victim.uuid}"]), config(node, tmp_path)
        )
    msg = str(info.value)
    assert msg.startswith(f"GPU 1 ({victim.uuid}) is not this container's allocation")
    assert "team-b/victim/train" in msg and "\n" not in msg


def test_forged_hostpath_mount_is_refused(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """A /dev/null mount under /var/run/nvidia-container-devices the kubelet did not make is refused."""
    kubelet.set([("team-a", "mine", {"main": {GPU: [node.gpus[0].uuid]}})])
    with pytest.raises(
        RequestError,
        match=r"GPU 3 \(.*\) is not this container's allocation: "
        r"the kubelet allocated GPU 0 to team-a/mine/main",
    ):
        plan_create(bundle(tmp_path, [], mounts=[mount(node.gpus[3].uuid)]), config(node, tmp_path))


def test_claim_by_index_is_checked_by_gpu_not_by_text(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """Kubelet ids are UUIDs, claims may be indices: both map to GPUs before comparing."""
    kubelet.set([("team-a", "mine", {"main": {GPU: [node.gpus[3].uuid]}})])
    plan = plan_create(bundle(tmp_path, [], mounts=[mount("3")]), config(node, tmp_path))
    assert [g.index for g in plan.gpus] == [3]


def test_kubelet_source_grants_exactly_the_allocation(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """allocation-sources: [kubelet] gives an image asking for all GPUs only what the kubelet allocated."""
    kubelet.set([("team-a", "mine", {"main": {GPU: [f"{node.gpus[2].uuid}::1"]}})])
    plan = plan_create(
        bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"]),
        config(node, tmp_path, allocation_sources=("kubelet",), verify_with="none"),
    )
    assert [g.index for g in plan.gpus] == [2]
    assert plan.request.source == "kubelet" and plan.request.shared


def test_kubelet_source_skips_ids_of_other_nvidia_resources(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """An SR-IOV NIC from nvidia.com/ (the network operator's prefix) next to a GPU is not a
    GPU: the kubelet source grants the GPU and notes the NIC's id instead of failing on it;
    a NIC alone grants nothing."""
    nic = "nvidia.com/sriov_rdma"
    kubelet.set([("team-a", "mine", {"main": {GPU: [node.gpus[2].uuid], nic: ["0000:3b:00.2"]}})])
    cfg = config(node, tmp_path, allocation_sources=("kubelet",), verify_with="none")
    plan = plan_create(bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"]), cfg)
    assert [g.index for g in plan.gpus] == [2] and plan.request.source == "kubelet"
    assert any('"0000:3b:00.2" names no GPU of this node' in n for n in plan.notes)
    kubelet.set([("team-a", "mine", {"main": {nic: ["0000:3b:00.2"]}})])
    plan = plan_create(bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"]), cfg)
    assert plan.gpus == () and not plan.request.injects and plan.request.set_void


def test_kubelet_ids_are_parsed_once_per_create(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each device id the kubelet lists is parsed once, into the map of the node's GPUs it
    names (KubeletIds), and the kubelet source grants from that map: the ids are not parsed
    again to build the request or to tell GPUs from other resources."""
    import nvshim.host.devices as tokens
    import nvshim.runtime.allocation.policy as policy

    parsed: List[str] = []
    real = tokens.parse_visible_devices

    def counting(value: str) -> Any:
        parsed.append(value)
        return real(value)

    monkeypatch.setattr(tokens, "parse_visible_devices", counting)
    monkeypatch.setattr(policy, "parse_visible_devices", counting)
    gpu, nic = f"{node.gpus[2].uuid}::1", "0000:3b:00.2"
    kubelet.set([("team-a", "mine", {"main": {GPU: [gpu], "nvidia.com/sriov_rdma": [nic]}})])
    cfg = config(node, tmp_path, allocation_sources=("kubelet",), verify_with="kubelet")
    plan = plan_create(bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"]), cfg)
    assert [g.index for g in plan.gpus] == [2] and plan.request.shared
    assert sorted(v for v in parsed if node.gpus[2].uuid in v or nic in v) == sorted([gpu, nic])


def test_kubelet_ids_name_the_nodes_devices() -> None:
    """KubeletIds: which ids name GPUs or MIG devices of the node (by UUID), their tokens
    once each, and which ids are another resource's."""
    from nvshim.host.devices import GpuRef, MigRef
    from nvshim.runtime.allocation.policy import name_ids

    class G:  # the discovery record's one method name_ids reads
        def __init__(self, ref: GpuRef) -> None:
            self._ref = ref

        def ref(self) -> GpuRef:
            return self._ref

    u0, u1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"
    m1 = "MIG-22222222-2222-2222-2222-222222222222"
    gpus = [G(GpuRef(0, u0, "0000:18:00.0")), G(GpuRef(1, u1, "0000:3b:00.0", (MigRef(1, 0, m1),)))]
    named = name_ids([f"{u0}::1", f"{u0}::2", "1:0", "0000:3b:00.2", "all"], gpus)  # type: ignore[arg-type]
    assert named.gpu_ids == (f"{u0}::1", f"{u0}::2", "1:0")
    assert named.other_ids == ("0000:3b:00.2", "all")
    assert named.gpu_tokens == (u0, "1:0")
    assert named.by_uuid == {u0: f"{u0}::1", m1: "1:0"}


def test_kubelet_down_fails_by_default(node: Any, tmp_path: Path) -> None:
    """No socket, no checkpoint: the claim fails with a line naming what was tried."""
    with pytest.raises(
        RequestError,
        match=r"cannot ask the kubelet what team-a/mine/main was "
        r"allocated \(tried PodResources socket .*kubelet-unreachable: fail",
    ):
        plan_create(
            bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={node.gpus[0].uuid}"]),
            config(node, tmp_path),
        )


def test_kubelet_down_trust_claims_grants_and_warns(node: Any, tmp_path: Path) -> None:
    """kubelet-unreachable: trust-claims grants the claim, with a warning and verified=unreachable."""
    plan = plan_create(
        bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={node.gpus[0].uuid}"]),
        config(node, tmp_path, kubelet_unreachable="trust-claims"),
    )
    assert [g.index for g in plan.gpus] == [0]
    assert plan.verified == "unreachable"
    assert any("trust-claims" in w for w in plan.warnings)


def test_checkpoint_answers_when_the_socket_does_not(node: Any, tmp_path: Path) -> None:
    """With the socket gone, the device manager checkpoint (keyed by pod UID) is the record."""
    ckpt = tmp_path / "kubelet_internal_checkpoint"
    ckpt.write_text(
        json.dumps(
            {
                "Data": {
                    "PodDeviceEntries": [
                        {
                            "PodUID": "uid-mine",
                            "ContainerName": "main",
                            "ResourceName": GPU,
                            "DeviceIDs": {"0": [node.gpus[1].uuid]},
                            "AllocResp": "",
                        },
                        {
                            "PodUID": "uid-other",
                            "ContainerName": "x",
                            "ResourceName": GPU,
                            "DeviceIDs": {"-1": [node.gpus[2].uuid]},
                            "AllocResp": "",
                        },
                    ],
                    "RegisteredDevices": {},
                },
                "Checksum": 1,
            }
        )
    )
    cfg = config(node, tmp_path, kubelet_checkpoint=str(ckpt))
    plan = plan_create(bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={node.gpus[1].uuid}"]), cfg)
    assert [g.index for g in plan.gpus] == [1] and plan.allocation.via == "checkpoint"
    with pytest.raises(
        RequestError,
        match="not this container's allocation: the kubelet gave it to pod uid-other/x",
    ):
        plan_create(bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={node.gpus[2].uuid}"]), cfg)


def test_container_claiming_nothing_does_not_ask_the_kubelet(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """No GPU claim, no question: the kubelet is not called (and grpc not needed)."""
    plan = plan_create(bundle(tmp_path, ["FOO=1"]), config(node, tmp_path))
    assert not plan.request.injects and kubelet.calls["List"] == 0


def test_mount_all_needs_accept_all_from_mounts(node: Any, tmp_path: Path) -> None:
    """Under require-allocation a mount named "all" grants nothing unless accept-all-from-mounts is on."""
    cfg = config(node, tmp_path, verify_with="none")
    plan = plan_create(bundle(tmp_path, [], mounts=[mount("all")]), cfg)
    assert plan.gpus == () and any("accept-all-from-mounts is off" in n for n in plan.notes)
    plan = plan_create(
        bundle(tmp_path, [], mounts=[mount("all")]),
        config(node, tmp_path, verify_with="none", accept_all_from_mounts=True),
    )
    assert len(plan.gpus) == 4


def test_forged_none_mount_gets_no_driver_files_or_extras(
    tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """A pod the kubelet gave no GPU, mounting /dev/null at .../none, gets no control nodes,
    driver files or GDS/MOFED devices: "none" holds no GPU the kubelet check could refuse."""
    from nvshim.sim.build import create_node

    extra = create_node(str(tmp_path / "n"), gpus=2, gds=True, mofed=True)
    kubelet.set(
        [
            ("team-b", "victim", {"train": {GPU: [extra.gpus[0].uuid]}}),
            ("team-a", "mine", {"main": {}}),
        ]
    )
    plan = plan_create(
        bundle(tmp_path, ["NVIDIA_GDS=enabled", "NVIDIA_MOFED=enabled"], mounts=[mount("none")]),
        config(extra, tmp_path),
    )
    assert not plan.request.injects and not plan.changed
    assert any("/none ignored" in n for n in plan.notes)


def test_mig_device_allocated_by_the_kubelet_is_granted_and_its_parent_is_not(
    tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """A MIG UUID in the kubelet's record grants that MIG device; a claim of its whole parent GPU is refused."""
    if os.geteuid() != 0:
        pytest.skip("the simulated GPU node needs root (mknod)")
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "mig-node"), gpus=2, mig=True)
    mig = node.gpus[0].mig[1]
    kubelet.set([("team-a", "mine", {"main": {"nvidia.com/mig-3g.40gb": [mig.uuid]}})])
    cfg = config(node, tmp_path)
    plan = plan_create(bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={mig.uuid}"]), cfg)
    assert [m.uuid for _, m in plan.migs] == [mig.uuid] and plan.gpus == ()
    with pytest.raises(RequestError, match=r"GPU 0 \(.*\) is not this container's allocation"):
        plan_create(bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={node.gpus[0].uuid}"]), cfg)


def test_inspect_shows_the_kubelet_check(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """nvshim inspect reports the container identity and that the grant was checked against the kubelet."""
    from nvshim.cli.main import main

    gpu = node.gpus[0]
    kubelet.set([("team-a", "mine", {"main": {GPU: [gpu.uuid]}})])
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(
        f"require-allocation: true\nverify-with: kubelet\ndriver-root: {node.root}\n"
        f"kubelet-socket: {tmp_path}/kubelet.sock\nkubelet-checkpoint: null\n"
    )
    b = bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}"])
    with pytest.raises(SystemExit) as exc:
        main(["inspect", "--bundle", b, "--config", str(cfg_path)])
    out = capsys.readouterr().out
    assert exc.value.code == 0
    assert "container:     team-a/mine/main" in out
    assert "verified:      kubelet (podresources): allocated " + gpu.uuid in out


def test_inspect_shows_the_dra_claims_the_kubelet_listed(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The DRA claims the kubelet lists for the container are named by inspect with their
    CDI devices (text and JSON), beside the device-plugin ids."""
    from nvshim.cli.main import main

    gpu = node.gpus[0]
    kubelet.set(
        [
            (
                "team-a",
                "mine",
                {"main": {GPU: [gpu.uuid]}},
                {"main": [dra("gpu", "nvidia.com/gpu=1")]},
            )
        ]
    )
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(
        f"require-allocation: true\nverify-with: kubelet\ndriver-root: {node.root}\n"
        f"kubelet-socket: {tmp_path}/kubelet.sock\nkubelet-checkpoint: null\n"
    )
    b = bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}"])
    with pytest.raises(SystemExit):
        main(["inspect", "--bundle", b, "--config", str(cfg_path), "--no-diff"])
    out = capsys.readouterr().out
    assert f"allocated {gpu.uuid}, DRA claim team-a/gpu (nvidia.com/gpu=1)" in out, out
    with pytest.raises(SystemExit):
        main(["inspect", "--bundle", b, "--config", str(cfg_path), "--format", "json"])
    summary = json.loads(capsys.readouterr().out)
    assert summary["kubelet_claims"] == [
        {
            "claim": "team-a/gpu",
            "devices": [
                {
                    "driver": "gpu.nvidia.com",
                    "pool": "node-1",
                    "device": "gpu-0",
                    "cdi_devices": ["nvidia.com/gpu=1"],
                }
            ],
        }
    ]


def test_pod_annotation_is_told_from_the_device_plugins(node: Any, tmp_path: Path) -> None:
    """Under require-allocation a cdi.k8s.io annotation also in the pod sandbox's spec is the pod's and grants nothing; the device plugin's does."""
    tasks = tmp_path / "io.containerd.runtime.v2.task" / "k8s.io"
    sandbox = tasks / "sandbox123"
    sandbox.mkdir(parents=True)
    pod_claim = {"cdi.k8s.io/claim": "nvidia.com/gpu=0"}
    (sandbox / "config.json").write_text(
        json.dumps(
            {
                "annotations": {
                    "io.kubernetes.cri.container-type": "sandbox",
                    "io.kubernetes.cri.sandbox-id": "sandbox123",
                    **pod_claim,
                }
            }
        )
    )
    cfg = cdi_config(node, tmp_path)

    def container(annotations: Dict[str, str]) -> Any:
        b = tasks / f"c{time.monotonic_ns()}"
        b.mkdir()
        spec = {
            "process": {"env": ["PATH=/bin"]},
            "root": {"path": "rootfs"},
            "annotations": {**cri(), "io.kubernetes.cri.sandbox-id": "sandbox123", **annotations},
        }
        (b / "config.json").write_text(json.dumps(spec))
        return plan_create(str(b), cfg)

    plan = container(pod_claim)
    assert not plan.request.injects
    assert any("annotation cdi.k8s.io/claim ignored: it is the pod's" in n for n in plan.notes)
    plan = container({**pod_claim, "cdi.k8s.io/nvidia-device-plugin": "nvidia.com/gpu=1"})
    assert plan.request.source == "cdi-annotations"
    assert plan.request.devices == ("nvidia.com/gpu=1",)


def test_cdi_mig_device_is_checked_as_a_mig_device(
    tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """A CDI annotation naming a MIG device is matched by its MIG caps: granted when the kubelet allocated that MIG device, refused for another one."""
    if os.geteuid() != 0:
        pytest.skip("the simulated GPU node needs root (mknod)")
    from click.testing import CliRunner

    from nvshim.cli.cmd_cdi import generate
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "mig-node"), gpus=2, mig=True)
    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir()
    node_config = tmp_path / "node.yaml"  # MIG UUIDs: what NVML would say, from nvml-facts
    node_config.write_text(f"driver-root: {node.root}\nnvml-facts: {node.nvml_facts}\n")
    res = CliRunner().invoke(
        generate,
        ["--output", str(cdi_dir / "nvidia.yaml")],
        env={"NVSHIM_CONFIG": str(node_config)},
    )
    assert res.exit_code == 0, res.output
    mine, other = node.gpus[0].mig[0], node.gpus[0].mig[1]
    kubelet.set([("team-a", "mine", {"main": {"nvidia.com/mig-1g.10gb": [mine.uuid]}})])
    cfg = config(node, tmp_path, cdi_spec_dirs=(str(cdi_dir),))

    def claim(name: str) -> Any:
        return plan_create(
            bundle(
                tmp_path,
                [],
                annotations={**cri(), "cdi.k8s.io/nvidia-device-plugin": f"nvidia.com/gpu={name}"},
            ),
            cfg,
        )

    plan = claim("0:0")
    assert [m.uuid for _, m in plan.cdi_migs] == [mine.uuid] and plan.cdi_gpus == ()
    assert plan.granted_uuids == (mine.uuid,)
    with pytest.raises(RequestError, match=r"MIG device 0:1 \(MIG-.*\) is not this container's"):
        claim("0:1")
    assert other.uuid != mine.uuid


def _checkpoint(tmp_path: Path, entries: List[Dict[str, Any]]) -> str:
    path = tmp_path / "kubelet_internal_checkpoint"
    path.write_text(
        json.dumps(
            {
                "Data": {
                    "PodDeviceEntries": [
                        {
                            "PodUID": uid,
                            "ContainerName": c,
                            "ResourceName": GPU,
                            "DeviceIDs": {"0": ids},
                            "AllocResp": "",
                        }
                        for uid, c, ids in entries
                    ],
                    "RegisteredDevices": {},
                },
                "Checksum": 1,
            }
        )
    )
    return str(path)


def test_checkpoint_entry_of_this_container_grants_without_a_grpc_call(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """A claim the checkpoint lists for this pod UID and container is granted; List is not called."""
    gpu = node.gpus[1]
    kubelet.set([("team-a", "mine", {"main": {GPU: [gpu.uuid]}})])
    ckpt = _checkpoint(tmp_path, [("uid-mine", "main", [gpu.uuid])])
    plan = plan_create(
        bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}"]),
        config(node, tmp_path, kubelet_checkpoint=ckpt),
    )
    assert [g.uuid for g in plan.gpus] == [gpu.uuid]
    assert plan.allocation.via == "checkpoint"
    assert kubelet.calls["List"] == 0


def test_claim_beyond_the_checkpoint_is_refused_by_the_api_naming_the_holder(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """A forged claim next to a real one: the checkpoint does not cover it, the API refuses it."""
    mine, theirs = node.gpus[1], node.gpus[3]
    kubelet.set(
        [
            ("team-a", "mine", {"main": {GPU: [mine.uuid]}}),
            ("team-b", "victim", {"train": {GPU: [theirs.uuid]}}),
        ]
    )
    ckpt = _checkpoint(
        tmp_path, [("uid-mine", "main", [mine.uuid]), ("uid-victim", "train", [theirs.uuid])]
    )
    with pytest.raises(
        RequestError,
        match=r"GPU 3 \(.*\) is not this container's allocation: "
        r"the kubelet gave it to team-b/victim/train .*checked via podresources",
    ):
        plan_create(
            bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={mine.uuid},{theirs.uuid}"]),
            config(node, tmp_path, kubelet_checkpoint=ckpt),
        )
    assert kubelet.calls["List"] == 1


def test_api_has_the_last_word_when_the_checkpoint_is_behind(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """The checkpoint lacks a GPU the API says is this container's: granted, via podresources."""
    gpu = node.gpus[2]
    kubelet.set([("team-a", "mine", {"main": {GPU: [node.gpus[0].uuid, gpu.uuid]}})])
    ckpt = _checkpoint(tmp_path, [("uid-mine", "main", [node.gpus[0].uuid])])
    plan = plan_create(
        bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}"]),
        config(node, tmp_path, kubelet_checkpoint=ckpt),
    )
    assert [g.uuid for g in plan.gpus] == [gpu.uuid] and plan.allocation.via == "podresources"


def test_checkpoint_without_this_container_asks_the_api(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """No entry for this pod UID in the checkpoint: the API is asked and its record decides."""
    gpu = node.gpus[0]
    kubelet.set([("team-a", "mine", {"main": {GPU: [gpu.uuid]}})])
    ckpt = _checkpoint(tmp_path, [("uid-other", "x", [node.gpus[3].uuid])])
    plan = plan_create(
        bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}"]),
        config(node, tmp_path, kubelet_checkpoint=ckpt),
    )
    assert [g.uuid for g in plan.gpus] == [gpu.uuid] and plan.allocation.via == "podresources"
    assert kubelet.calls["List"] == 1


# --- IMEX channels ------------------------------------------------------------------------

IMEX = "nvidia.com/imex-channel"


@pytest.fixture(scope="module")
def imex_node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if os.geteuid() != 0:
        pytest.skip("the simulated GPU node needs root (mknod)")
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("imex") / "n"), gpus=2, imex_channels=4)


def imex_paths(plan: Any) -> List[str]:
    return sorted(n.path for n in plan.edits.device_nodes if "imex" in n.path)


@pytest.mark.parametrize("ident", ["2", "channel2"])
def test_imex_mount_allocated_by_the_kubelet_is_granted(
    imex_node: Any, tmp_path: Path, kubelet: PodResourcesServer, ident: str
) -> None:
    """An imex/<N> mount for a channel the kubelet lists (as N or channelN) is granted, with no GPU claim at all."""
    kubelet.set([("team-a", "mine", {"main": {IMEX: [ident]}})])
    plan = plan_create(bundle(tmp_path, [], mounts=[mount("imex/2")]), config(imex_node, tmp_path))
    assert imex_paths(plan) == ["/dev/nvidia-caps-imex-channels/channel2"]
    assert kubelet.calls["List"] == 1
    assert any("every granted IMEX channel is in the kubelet's record" in n for n in plan.notes)


def test_forged_imex_mount_is_refused(
    imex_node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """A pod whose kubelet record has no IMEX channel claiming one by mount fails, naming the channel."""
    kubelet.set([("team-a", "mine", {"main": {GPU: [imex_node.gpus[0].uuid]}})])
    with pytest.raises(RequestError) as info:
        plan_create(
            bundle(
                tmp_path,
                [f"NVIDIA_VISIBLE_DEVICES={imex_node.gpus[0].uuid}"],
                mounts=[mount("imex/3")],
            ),
            config(imex_node, tmp_path),
        )
    msg = str(info.value)
    assert msg == (
        "IMEX channel 3 is not this container's allocation: the kubelet allocated "
        "IMEX channels none to team-a/mine/main (claimed through volume-mounts, "
        "checked via podresources)"
    )


def test_imex_channel_of_another_pod_is_refused_naming_its_holder(
    imex_node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """Claiming channel 1 that the kubelet gave another pod fails naming that pod; an own channel does not cover it."""
    kubelet.set(
        [
            ("team-b", "victim", {"train": {IMEX: ["channel1"]}}),
            ("team-a", "mine", {"main": {IMEX: ["0"]}}),
        ]
    )
    with pytest.raises(
        RequestError,
        match=r"^IMEX channel 1 is not this container's allocation: "
        r"the kubelet gave it to team-b/victim/train",
    ):
        plan_create(
            bundle(tmp_path, [], mounts=[mount("imex/0"), mount("imex/1")]),
            config(imex_node, tmp_path),
        )


def test_imex_ids_are_not_gpu_ids(
    imex_node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """Channel id "1" under an imex resource does not allocate GPU 1."""
    kubelet.set([("team-a", "mine", {"main": {IMEX: ["1"]}})])
    with pytest.raises(RequestError, match=r"^GPU 1 \(.*\) is not this container's allocation"):
        plan_create(
            bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=1"], mounts=[mount("1")]),
            config(imex_node, tmp_path),
        )


def test_privileged_imex_env_is_checked_too(
    imex_node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """NVIDIA_IMEX_CHANNELS granted through the privileged source is still held to the kubelet's record."""
    kubelet.set([("team-a", "mine", {"main": {IMEX: ["0"]}})])
    cfg = config(imex_node, tmp_path, allocation_sources=("volume-mounts", "privileged"))
    path = bundle(tmp_path, ["NVIDIA_IMEX_CHANNELS=0"])
    spec = json.loads(Path(path, "config.json").read_text())
    spec["process"]["capabilities"]["bounding"] = ["CAP_SYS_ADMIN"]
    spec["linux"] = {"resources": {"devices": [{"allow": True, "access": "rwm"}]}}  # privileged
    Path(path, "config.json").write_text(json.dumps(spec))
    assert imex_paths(plan_create(path, cfg)) == ["/dev/nvidia-caps-imex-channels/channel0"]
    spec["process"]["env"] = ["NVIDIA_IMEX_CHANNELS=2"]
    Path(path, "config.json").write_text(json.dumps(spec))
    with pytest.raises(
        RequestError,
        match=r"^IMEX channel 2 is not this container's allocation.*"
        r"claimed through privileged",
    ):
        plan_create(path, cfg)


def test_imex_channels_from_the_checkpoint(imex_node: Any, tmp_path: Path) -> None:
    """With the socket down, the checkpoint's imex resource entries are the record."""
    ckpt = tmp_path / "kubelet_internal_checkpoint"
    ckpt.write_text(
        json.dumps(
            {
                "Data": {
                    "PodDeviceEntries": [
                        {
                            "PodUID": "uid-mine",
                            "ContainerName": "main",
                            "ResourceName": IMEX,
                            "DeviceIDs": {"-1": ["channel1"]},
                            "AllocResp": "",
                        },
                    ],
                    "RegisteredDevices": {},
                },
                "Checksum": 1,
            }
        )
    )
    cfg = config(imex_node, tmp_path, kubelet_checkpoint=str(ckpt))
    plan = plan_create(bundle(tmp_path, [], mounts=[mount("imex/1")]), cfg)
    assert imex_paths(plan) == ["/dev/nvidia-caps-imex-channels/channel1"]
    with pytest.raises(RequestError, match=r"^IMEX channel 2 .*checked via checkpoint"):
        plan_create(bundle(tmp_path, [], mounts=[mount("imex/2")]), cfg)


def test_imex_id_with_a_trailing_newline_names_no_channel(tmp_path: Path) -> None:
    """A kubelet IMEX id "1<newline>" is skipped like any id that is not N or channelN."""
    from nvshim.runtime.allocation.kubelet import Identity, read_checkpoint

    ckpt = tmp_path / "kubelet_internal_checkpoint"
    ckpt.write_text(
        json.dumps(
            {
                "Data": {
                    "PodDeviceEntries": [
                        {
                            "PodUID": "uid-mine",
                            "ContainerName": "main",
                            "ResourceName": IMEX,
                            "DeviceIDs": {"-1": ["1\n", "channel2"]},
                            "AllocResp": "",
                        },
                    ]
                }
            }
        )
    )
    found = read_checkpoint(
        str(ckpt), Identity("team-a", "mine", "uid-mine", "main"), ("nvidia.com/",)
    )
    assert found is not None and found.imex == (2,)


def test_imex_claim_with_kubelet_down_fails_by_default(imex_node: Any, tmp_path: Path) -> None:
    """An IMEX-only claim asks the kubelet; unreachable fails like a GPU claim."""
    with pytest.raises(RequestError, match=r"cannot ask the kubelet .*refusing the claim"):
        plan_create(bundle(tmp_path, [], mounts=[mount("imex/0")]), config(imex_node, tmp_path))


def test_imex_refusal_from_the_checkpoint_is_asked_again_of_the_api(
    imex_node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """The checkpoint (read first) lacks the channel; the PodResources API, which has the last word, lists it."""
    gpu = imex_node.gpus[0]
    ckpt = tmp_path / "kubelet_internal_checkpoint"
    ckpt.write_text(
        json.dumps(
            {
                "Data": {
                    "PodDeviceEntries": [
                        {
                            "PodUID": "uid-mine",
                            "ContainerName": "main",
                            "ResourceName": GPU,
                            "DeviceIDs": {"0": [gpu.uuid]},
                            "AllocResp": "",
                        }
                    ],
                    "RegisteredDevices": {},
                },
                "Checksum": 1,
            }
        )
    )
    kubelet.set([("team-a", "mine", {"main": {GPU: [gpu.uuid], IMEX: ["1"]}})])
    plan = plan_create(
        bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}"], mounts=[mount("imex/1")]),
        config(imex_node, tmp_path, kubelet_checkpoint=str(ckpt)),
    )
    assert imex_paths(plan) == ["/dev/nvidia-caps-imex-channels/channel1"]
    assert plan.allocation.via == "podresources" and kubelet.calls["List"] == 1


@pytest.mark.parametrize(
    "text",
    [
        '{"Data": null}',
        '{"Data": []}',
        '{"Data": "x"}',
        "[1]",
        '"x"',
        '{"Data": {"PodDeviceEntries": null}}',
        "[" * 100000 + "]" * 100000,
    ],
)
def test_a_damaged_checkpoint_is_no_checkpoint(tmp_path: Path, text: str) -> None:
    """A checkpoint whose Data is not an object (or nested past the recursion limit) made
    read_checkpoint raise AttributeError/RecursionError, an 'internal error' line on every
    verified create; it is now treated like a missing checkpoint (the API is asked)."""
    from nvshim.runtime.allocation.kubelet import Identity, read_checkpoint

    path = tmp_path / "kubelet_internal_checkpoint"
    path.write_text(text)
    who = Identity(namespace="ns", pod="p", pod_uid="uid-1", container="main")
    assert read_checkpoint(str(path), who, ("nvidia.com/",)) is None


def test_grpc_logging_never_reaches_the_container_stderr(tmp_path: Path) -> None:
    """During a create the runtime's fd 2 is the container's stderr (containerd hands runc
    the container's stdio), so nothing gRPC's core logs may be written there - with
    GRPC_VERBOSITY=DEBUG in the engine's environment it logs hundreds of lines. Our own
    stderr works again afterwards, and the answer is the server's."""
    import subprocess
    import sys

    server = PodResourcesServer(str(tmp_path / "kubelet.sock")).start()
    try:
        server.set([("ns", "p", {"main": {"nvidia.com/gpu": ["GPU-1"]}})])
        code = (
            "import sys\n"
            "from nvshim.runtime.allocation.kubelet import _ask_podresources\n"
            f"pods = _ask_podresources({str(tmp_path / 'kubelet.sock')!r}, 10.0)\n"
            "print(sorted(p[0] for p in pods))\n"
            "import os\n"
            "print(os.environ.get('GRPC_VERBOSITY'), os.environ.get('GRPC_TRACE'))\n"
            "sys.stderr.write('after\\n')\n"
        )
        env = dict(os.environ, GRPC_VERBOSITY="DEBUG", GRPC_TRACE="all")
        res = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=True,
        )
    finally:
        server.stop()
    assert res.stdout.splitlines() == ["['p']", "DEBUG all"]  # the environment runc gets
    assert res.stderr == "after\n"


# --- DRA claims (PodResources dynamic_resources) ------------------------------------------


def test_codec_reads_dra_claims_and_encodes_them_back(kubelet: PodResourcesServer) -> None:
    """dynamic_resources as protobuf encodes them (share_id included) decode to claims with
    driver, pool, device and CDI names; encode_list_response writes the same message back."""
    from nvshim.runtime.allocation.kubelet import Claim, ClaimDevice, encode_list_response
    from tests.helpers.podresources import _M

    kubelet.set(
        [
            (
                "ns",
                "p",
                {"c": {GPU: ["GPU-a"]}, "side": {}},
                {
                    "c": [
                        DraClaim(
                            "ns",
                            "gpus",
                            [
                                DraDevice(
                                    "gpu.nvidia.com",
                                    "node-1",
                                    "gpu-0",
                                    ["k8s.gpu.nvidia.com/claim=u1-gpu-0"],
                                    share_id="3f1c",
                                ),
                                DraDevice(
                                    "gpu.nvidia.com", "node-1", "gpu-1", ["a.com/x=1", "a.com/x=2"]
                                ),
                            ],
                        ),
                        DraClaim("other-ns", "nic", [DraDevice("nic.example.com", "p2", "eth1")]),
                    ],
                    "side": [dra("shared", "nvidia.com/gpu=3", namespace="ns")],
                },
            )
        ]
    )
    message = kubelet._list(None, None)
    pods = decode_list_response(message.SerializeToString())
    assert pods == [
        (
            "p",
            "ns",
            [
                (
                    "c",
                    [(GPU, ("GPU-a",))],
                    (
                        Claim(
                            "ns",
                            "gpus",
                            (
                                ClaimDevice(
                                    "gpu.nvidia.com",
                                    "node-1",
                                    "gpu-0",
                                    ("k8s.gpu.nvidia.com/claim=u1-gpu-0",),
                                ),
                                ClaimDevice(
                                    "gpu.nvidia.com", "node-1", "gpu-1", ("a.com/x=1", "a.com/x=2")
                                ),
                            ),
                        ),
                        Claim("other-ns", "nic", (ClaimDevice("nic.example.com", "p2", "eth1"),)),
                    ),
                ),
                (
                    "side",
                    [],
                    (
                        Claim(
                            "ns",
                            "shared",
                            (
                                ClaimDevice(
                                    "gpu.nvidia.com", "node-1", "gpu-0", ("nvidia.com/gpu=3",)
                                ),
                            ),
                        ),
                    ),
                ),
            ],
        )
    ]
    assert pods[0][2][0][2][0].cdi_devices == (
        "k8s.gpu.nvidia.com/claim=u1-gpu-0",
        "a.com/x=1",
        "a.com/x=2",
    )
    again = _M["ListPodResourcesResponse"].FromString(encode_list_response(pods))
    for pod in message.pod_resources:  # what nvshim does not read is not written back
        for c in pod.containers:
            del c.cpu_ids[:]
            del c.memory[:]
            for d in c.devices:
                d.ClearField("topology")
            for r in c.dynamic_resources:
                for res in r.claim_resources:
                    res.ClearField("share_id")
    assert again == message


def _pod_records() -> Any:
    """Strategy: ListPodResourcesResponse contents as decode_list_response returns them."""
    from hypothesis import strategies as st

    from nvshim.runtime.allocation.kubelet import Claim, ClaimDevice

    text = st.text(max_size=8)
    names = st.text(min_size=1, max_size=8)  # a CDIDevice always has a name
    device = st.builds(ClaimDevice, text, text, text, st.tuples(names) | st.tuples(names, names))
    claim = st.builds(Claim, text, text, st.lists(device, max_size=2).map(tuple))
    devices = st.lists(st.tuples(text, st.lists(text, max_size=3).map(tuple)), max_size=2)
    container = st.tuples(text, devices, st.lists(claim, max_size=2).map(tuple))
    return st.lists(st.tuples(text, text, st.lists(container, max_size=2)), max_size=2)


def test_codec_round_trips_any_pods_with_claims() -> None:
    """decode_list_response(encode_list_response(pods)) == pods, claims included."""
    from hypothesis import given, settings

    from nvshim.runtime.allocation.kubelet import encode_list_response

    @settings(max_examples=200, deadline=None, derandomize=True)
    @given(_pod_records())
    def round_trip(pods: Any) -> None:
        assert decode_list_response(encode_list_response(pods)) == pods

    round_trip()


def _identity(container: str = "main") -> Any:
    from nvshim.runtime.allocation.kubelet import Identity

    return Identity("team-a", "mine", "uid-mine", container)


def test_allocation_lists_this_containers_claims_of_every_driver(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """ask_kubelet records this container's DRA claims whatever their driver (no resource
    prefix applies) and maps the CDI names of other containers' claims to their holders."""
    from nvshim.runtime.allocation.kubelet import ask_kubelet

    kubelet.set(
        [
            (
                "team-a",
                "mine",
                {"main": {GPU: [node.gpus[0].uuid]}, "side": {}},
                {
                    "main": [
                        dra("gpus", "nvidia.com/gpu=1"),
                        dra("nic", "nic.example.com/vf=0", driver="nic.example.com"),
                    ],
                    "side": [dra("side", "nvidia.com/gpu=2")],
                },
            ),
            ("team-b", "victim", {}, {"train": [dra("t", "nvidia.com/gpu=3", namespace="team-b")]}),
        ]
    )
    allocation = ask_kubelet(_identity(), config(node, tmp_path))
    assert allocation.ids == (node.gpus[0].uuid,) and allocation.via == "podresources"
    assert [str(c) for c in allocation.claims] == ["team-a/gpus", "team-a/nic"]
    assert allocation.claims[1].devices[0].driver == "nic.example.com"
    assert allocation.cdi_devices == ("nvidia.com/gpu=1", "nic.example.com/vf=0")
    assert dict(allocation.cdi_others) == {
        "nvidia.com/gpu=2": "team-a/mine/side",
        "nvidia.com/gpu=3": "team-b/victim/train",
    }


# --- GPUs the engine injected (check_engine_allocated) --------------------------------------


@pytest.fixture(scope="module")
def cdi_dir(node: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """nvshim's CDI spec for the 4-GPU node: what the engine injects ``nvidia.com/gpu=N`` from."""
    from click.testing import CliRunner

    from nvshim.cli.cmd_cdi import generate

    out = tmp_path_factory.mktemp("cdi")
    res = CliRunner().invoke(
        generate, ["--driver-root", node.root, "--output", str(out / "nvidia.yaml")]
    )
    assert res.exit_code == 0, res.output
    return str(out)


def engine_plan(cfg: Config) -> Any:
    """The kubelet's record check_engine_allocated checks against, asked as a create asks it."""
    from nvshim.runtime.allocation.kubelet import ask_kubelet
    from nvshim.runtime.allocation.policy import Verification

    who = _identity()
    return Verification(who, ask_kubelet(who, cfg), "kubelet")


def check_engine(cfg: Config, gpus: Any = (), migs: Any = (), imex: Any = ()) -> Any:
    """check_engine_allocated for GPUs (indices), MIG devices ((GPU, MIG) indices) and IMEX
    channels the engine injected; what it returned (``allocation``: the record it checked
    against, ``notes``: its note)."""
    from types import SimpleNamespace

    from nvshim.runtime.allocation.policy import check_engine_allocated
    from nvshim.runtime.engine import EngineGrant
    from nvshim.runtime.plancache import host_for

    host, _ = host_for(cfg, False)
    by_index = {g.index: g for g in host.gpus()}
    engine = EngineGrant(
        tuple(by_index[i] for i in gpus),
        tuple((by_index[g], by_index[g].mig[m]) for g, m in migs),
        tuple(imex),
    )
    found, note = check_engine_allocated(engine_plan(cfg), host, engine, cfg)
    return SimpleNamespace(allocation=found.allocation, notes=[note])


@pytest.mark.parametrize("listed", ["device-plugin", "dra"])
def test_engine_gpu_the_kubelet_lists_is_accepted(
    node: Any, tmp_path: Path, cdi_dir: str, kubelet: PodResourcesServer, listed: str
) -> None:
    """A GPU the engine injected is accepted when the kubelet lists it for this container:
    as a device-plugin UUID, or as the CDI device of one of its DRA claims."""
    gpu = node.gpus[2]
    if listed == "device-plugin":
        kubelet.set([("team-a", "mine", {"main": {GPU: [gpu.uuid]}})])
    else:
        kubelet.set([("team-a", "mine", {}, {"main": [dra("gpu", "nvidia.com/gpu=2")]})])
    plan = check_engine(config(node, tmp_path, cdi_spec_dirs=(cdi_dir,)), gpus=[2])
    assert plan.notes == [
        "everything the engine injected is in the kubelet's record (podresources)"
    ]


def test_engine_gpu_the_kubelet_did_not_list_is_refused(
    node: Any, tmp_path: Path, cdi_dir: str, kubelet: PodResourcesServer
) -> None:
    """An engine-injected GPU that neither the device-plugin ids nor the claims' CDI devices
    name is refused with one line naming the GPU and what the kubelet listed."""
    kubelet.set(
        [
            (
                "team-a",
                "mine",
                {"main": {GPU: [node.gpus[0].uuid]}},
                {"main": [dra("gpu", "nvidia.com/gpu=2")]},
            )
        ]
    )
    with pytest.raises(RequestError) as info:
        check_engine(config(node, tmp_path, cdi_spec_dirs=(cdi_dir,)), gpus=[2, 1])
    assert str(info.value) == (
        f"GPU 1 ({node.gpus[1].uuid}), injected by the engine, is not this container's "
        "allocation: the kubelet listed GPU 0 and DRA claim team-a/gpu (nvidia.com/gpu=2: "
        "GPU 2) for team-a/mine/main (checked via podresources)"
    )


def test_engine_gpu_with_nothing_listed_is_refused(
    node: Any, tmp_path: Path, cdi_dir: str, kubelet: PodResourcesServer
) -> None:
    """A container the kubelet lists nothing for gets its engine-injected GPU refused."""
    kubelet.set([("team-a", "mine", {"main": {}})])
    with pytest.raises(
        RequestError,
        match=r"^GPU 3 \(GPU-[^)]*\), injected by the engine, is not "
        r"this container's allocation: the kubelet listed no device-plugin GPU "
        r"and no DRA claim for team-a/mine/main \(checked via podresources\)$",
    ):
        check_engine(config(node, tmp_path, cdi_spec_dirs=(cdi_dir,)), gpus=[3])


@pytest.mark.parametrize("how", ["device-plugin", "dra"])
def test_engine_gpu_of_another_container_names_its_holder(
    node: Any, tmp_path: Path, cdi_dir: str, kubelet: PodResourcesServer, how: str
) -> None:
    """An engine-injected GPU the kubelet gave another container, by device plugin or DRA
    claim, is refused naming that container."""
    victim = node.gpus[1]
    held = (
        ({"train": {GPU: [victim.uuid]}}, {})
        if how == "device-plugin"
        else ({}, {"train": [dra("t", "nvidia.com/gpu=1", namespace="team-b")]})
    )
    kubelet.set([("team-b", "victim", *held), ("team-a", "mine", {"main": {}})])
    with pytest.raises(RequestError) as info:
        check_engine(config(node, tmp_path, cdi_spec_dirs=(cdi_dir,)), gpus=[1])
    assert str(info.value) == (
        f"GPU 1 ({victim.uuid}), injected by the engine, is not this container's allocation: "
        "the kubelet gave it to team-b/victim/train (checked via podresources)"
    )


def test_claim_cdi_device_outside_cdi_spec_dirs_proves_nothing(
    node: Any, tmp_path: Path, cdi_dir: str, kubelet: PodResourcesServer
) -> None:
    """A claim whose CDI device no spec in cdi-spec-dirs defines cannot be matched to a GPU:
    the engine GPU is refused, the line saying where nvshim looked; a claim of another
    driver's device (a NIC) does not cover a GPU either."""
    kubelet.set(
        [
            (
                "team-a",
                "mine",
                {},
                {
                    "main": [
                        dra("gpu", "k8s.gpu.nvidia.com/claim=u1-gpu-0"),
                        dra("nic", "nic.example.com/vf=0", driver="nic.example.com"),
                    ]
                },
            )
        ]
    )
    empty = tmp_path / "empty-cdi"
    empty.mkdir()
    with pytest.raises(RequestError) as info:
        check_engine(config(node, tmp_path, cdi_spec_dirs=(str(empty), cdi_dir)), gpus=[0])
    assert (
        "the kubelet listed no device-plugin GPU, DRA claim team-a/gpu "
        f"(k8s.gpu.nvidia.com/claim=u1-gpu-0: not in cdi-spec-dirs {empty}, {cdi_dir}) and "
        f"DRA claim team-a/nic (nic.example.com/vf=0: not in cdi-spec-dirs {empty}, "
        f"{cdi_dir}) for team-a/mine/main"
    ) in str(info.value)


def test_engine_gpu_only_a_claim_covers_is_asked_of_the_api_past_the_checkpoint(
    node: Any, tmp_path: Path, cdi_dir: str, kubelet: PodResourcesServer
) -> None:
    """The checkpoint (device manager only, no DRA) lists GPU 0 for this container and is
    the allocation first; GPU 2 that only a DRA claim covers is asked again of the API and
    accepted; with the API down the checkpoint's answer refuses it."""
    kubelet.set(
        [
            (
                "team-a",
                "mine",
                {"main": {GPU: [node.gpus[0].uuid]}},
                {"main": [dra("gpu", "nvidia.com/gpu=2")]},
            )
        ]
    )
    ckpt = _checkpoint(tmp_path, [("uid-mine", "main", [node.gpus[0].uuid])])
    cfg = config(node, tmp_path, cdi_spec_dirs=(cdi_dir,), kubelet_checkpoint=ckpt)
    assert engine_plan(cfg).allocation.via == "checkpoint"
    plan = check_engine(cfg, gpus=[0, 2])
    assert plan.allocation.via == "podresources" and kubelet.calls["List"] == 1
    down = config(
        node,
        tmp_path,
        cdi_spec_dirs=(cdi_dir,),
        kubelet_checkpoint=ckpt,
        kubelet_socket=str(tmp_path / "absent.sock"),
    )
    with pytest.raises(
        RequestError,
        match=r"^GPU 2 .*listed GPU 0 and no DRA claim .*"
        r"checked via checkpoint\)$",
    ):
        check_engine(down, gpus=[0, 2])


def test_engine_mig_device_is_matched_by_its_claims_mig_caps(
    tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """A MIG device the engine injected is accepted when a claim's CDI device is that MIG
    device; another MIG device of the same GPU is refused, named as a MIG device."""
    if os.geteuid() != 0:
        pytest.skip("the simulated GPU node needs root (mknod)")
    from click.testing import CliRunner

    from nvshim.cli.cmd_cdi import generate
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "mig-node"), gpus=2, mig=True)
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    node_config = tmp_path / "node.yaml"  # MIG UUIDs: what NVML would say, from nvml-facts
    node_config.write_text(f"driver-root: {node.root}\nnvml-facts: {node.nvml_facts}\n")
    res = CliRunner().invoke(
        generate, ["--output", str(cdi / "nvidia.yaml")], env={"NVSHIM_CONFIG": str(node_config)}
    )
    assert res.exit_code == 0, res.output
    kubelet.set([("team-a", "mine", {}, {"main": [dra("mig", "nvidia.com/gpu=0:0")]})])
    cfg = config(node, tmp_path, cdi_spec_dirs=(str(cdi),))
    assert check_engine(cfg, migs=[(0, 0)]).notes
    other = node.gpus[0].mig[1]
    with pytest.raises(
        RequestError,
        match=rf"^MIG device 0:1 \({other.uuid}\), injected by the "
        r"engine, .*DRA claim team-a/mig \(nvidia.com/gpu=0:0: MIG device 0:0\)",
    ):
        check_engine(cfg, migs=[(0, 1)])
    with pytest.raises(RequestError, match=r"^GPU 0 .*injected by the engine"):
        check_engine(cfg, gpus=[0])  # a claim of one MIG device is not its whole GPU


@pytest.fixture(scope="module")
def imex_cdi(imex_node: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """nvshim's CDI spec of the IMEX node's channels (nvidia.com/imex-channel=N)."""
    from click.testing import CliRunner

    from nvshim.cli.cmd_cdi import generate

    out = tmp_path_factory.mktemp("imex-cdi")
    res = CliRunner().invoke(
        generate,
        [
            "--driver-root",
            imex_node.root,
            "--class",
            "imex-channel",
            "--output",
            str(out / "imex.yaml"),
        ],
    )
    assert res.exit_code == 0, res.output
    return str(out)


@pytest.mark.parametrize("listed", ["device-plugin", "dra"])
def test_engine_imex_channel_the_kubelet_lists_is_accepted(
    imex_node: Any, tmp_path: Path, imex_cdi: str, kubelet: PodResourcesServer, listed: str
) -> None:
    """An IMEX channel the engine injected is accepted when the kubelet lists it for this
    container: under an imex device-plugin resource, or as a DRA claim's CDI device
    (matched by the channel node's numbers)."""
    if listed == "device-plugin":
        kubelet.set([("team-a", "mine", {"main": {IMEX: ["channel2"]}})])
    else:
        kubelet.set(
            [
                (
                    "team-a",
                    "mine",
                    {},
                    {
                        "main": [
                            dra(
                                "domain",
                                "nvidia.com/imex-channel=2",
                                driver="compute-domain.nvidia.com",
                            )
                        ]
                    },
                )
            ]
        )
    plan = check_engine(config(imex_node, tmp_path, cdi_spec_dirs=(imex_cdi,)), imex=[2])
    assert plan.notes == [
        "everything the engine injected is in the kubelet's record (podresources)"
    ]


def test_engine_imex_channel_the_kubelet_did_not_list_is_refused(
    imex_node: Any, tmp_path: Path, imex_cdi: str, kubelet: PodResourcesServer
) -> None:
    """An engine-injected IMEX channel no claim or device-plugin id covers is refused,
    naming the channel and what the kubelet listed; one another pod holds names its holder."""
    kubelet.set(
        [
            ("team-b", "victim", {"train": {IMEX: ["3"]}}),
            (
                "team-a",
                "mine",
                {"main": {IMEX: ["0"]}},
                {"main": [dra("domain", "nvidia.com/imex-channel=1")]},
            ),
        ]
    )
    cfg = config(imex_node, tmp_path, cdi_spec_dirs=(imex_cdi,))
    with pytest.raises(RequestError) as info:
        check_engine(cfg, imex=[1, 2])
    assert str(info.value) == (
        "IMEX channel 2, injected by the engine, is not this container's allocation: the "
        "kubelet listed no device-plugin GPU, IMEX channels 0 and DRA claim team-a/domain "
        "(nvidia.com/imex-channel=1: IMEX channel 1) for team-a/mine/main (checked via "
        "podresources)"
    )
    with pytest.raises(
        RequestError,
        match=r"^IMEX channel 3, injected by the engine, is not "
        r"this container's allocation: the kubelet gave it to team-b/victim/train",
    ):
        check_engine(cfg, imex=[3])


def test_a_resident_process_asks_the_kubelet_without_changing_process_state(
    kubelet: PodResourcesServer,
) -> None:
    """Eight threads asking the PodResources API at once in a resident process (the agent) leave fd 2 and the gRPC variables of the environment as they were at every moment (sampled while the calls run): a one-shot create may point fd 2 at /dev/null around the call, a daemon's thread may not."""
    import threading

    from nvshim.runtime.allocation import kubelet as client

    kubelet.set([("team-a", "mine", {"main": {"nvidia.com/gpu": ["GPU-x"]}})])
    before = (os.readlink("/proc/self/fd/2"), os.environ.get("GRPC_VERBOSITY"))
    seen = set()
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            seen.add((os.readlink("/proc/self/fd/2"), os.environ.get("GRPC_VERBOSITY")))

    def ask() -> None:
        for _ in range(5):
            assert client._ask_podresources(kubelet.socket, 5.0)

    client.set_resident(True)
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        askers = [threading.Thread(target=ask) for _ in range(8)]
        for t in askers:
            t.start()
        for t in askers:
            t.join()
    finally:
        done.set()
        sampler.join()
        client.set_resident(False)
    assert seen == {before}
