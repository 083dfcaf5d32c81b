"""e2e: verify-with: kubelet through containerd's real CRI path, as the kubelet drives it.

Every test runs on two nodes: the machine's containerd 1.6 with runc 1.1.5 (Debian 12), and
Debian 13's containerd 1.7 with CDI injection on (``enable_cdi``, reading nvshim's CDI spec
dir) and runc 1.1.15 under nvshim (:mod:`tests.helpers.debian13`). Debian unstable's
containerd 2.1 (a version 3 config, runc 1.3, CDI on, NRI's socket kept private;
:mod:`tests.helpers.debiansid`)
runs the CDI tests and two others (``EVERY_NODE``). A private containerd with
its CRI plugin (host-network pods, no CNI, a locally imported busybox image as pause and
workload image) gets nvshim's runtime handlers from ``nvshim runtime configure`` itself; the test calls RunPodSandbox / CreateContainer /
StartContainer over containerd's CRI gRPC socket exactly as the kubelet would, so the
container's spec, annotations included, is what containerd writes. A PodResources server
(tests/helpers/podresources.py, real gRPC, protobuf messages) plays the kubelet's
allocation record. What is asserted is what the container sees (``ls /dev``), the error
containerd returns from StartContainer (nvshim's line from runc's --log), and
``nvshim grants``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import pytest

from nvshim.node.compile import compile_node
from nvshim.node.install.trampoline import render
from tests.helpers.common import remove_cgroup_tree, require_binary, require_root, unique_id
from tests.helpers.containerd import Containerd, private_nri
from tests.helpers.cri import (
    CriClient,
    CriError,
    cri_containerd_config,
    import_image,
    spec_annotations,
)
from tests.helpers.debian13 import containerd_node_engines
from tests.helpers.node import write_nvshim_config
from tests.helpers.podresources import PodResourcesServer, dra

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
DEVICES = "/var/run/nvidia-container-devices"
GPU_NODE = re.compile(r"^nvidia([0-9]+)$")


class Node:
    """Everything one module of tests shares: containerd, the kubelet stand-in, the GPU node.
    ``version``: containerd's ("1.6" or "1.7"); ``runc``: the runc nvshim runs."""

    def __init__(
        self, base: Path, sim: Any, version: str = "1.6", runc: Optional[str] = None
    ) -> None:
        self.base = base
        self.sim = sim
        self.version = version
        self.runc = runc or require_binary("runc")
        self.kubelet = PodResourcesServer(str(base / "kubelet.sock")).start()
        self.current = base / "current-config"
        self.containerd: Optional[Containerd] = None
        self.cri: Optional[CriClient] = None
        self.cgroup = unique_id("nvshim-cri")

    def config(self, **settings: Any) -> None:
        """Make the runtime use an nvshim config with these settings from now on."""
        name = f"cfg-{len(list(self.base.glob('cfg-*')))}"
        values: Dict[str, Any] = {
            "runtimes": [self.runc],
            "driver-root": self.sim.root,
            "require-allocation": True,
            "verify-with": "kubelet",
            "kubelet-socket": str(self.base / "kubelet.sock"),
            "kubelet-checkpoint": None,
            "grants-journal": str(self.base / "grants.jsonl"),
            "cdi-spec-dirs": [str(self.base / "cdi")],
        }
        values.update({k.replace("_", "-"): v for k, v in settings.items()})
        path = write_nvshim_config(self.base / name, values)
        compile_node(str(path))
        self.current.write_text(str(path))


@contextlib.contextmanager
def cri_node(base: Path, sim: Any, version: str, rootfs: Path) -> Iterator[Node]:
    """A running :class:`Node` under ``base`` for the simulated node ``sim``: containerd
    ``version`` ("1.6", or "1.7" with its CDI injection reading ``base/cdi``), nvshim's
    handlers ``nvshim`` and ``nvshim-podcdi`` (this checkout's runtime), the busybox image
    from ``rootfs``, ``base/cdi/nvidia.yaml`` from ``nvshim cdi generate``."""
    bin_dir, runc = containerd_node_engines(version)
    n = Node(base, sim, version, runc)
    (base / "cdi").mkdir()
    gen = subprocess.run(
        [
            shutil.which("nvshim") or "nvshim",
            "cdi",
            "generate",
            "--driver-root",
            sim.root,
            "--output",
            str(base / "cdi" / "nvidia.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert gen.returncode == 0, gen.stderr
    n.config()
    tramp = base / "trampoline"  # this checkout's nvshim, as install.sh renders it
    tramp.write_text(render(sys.executable))
    tramp.chmod(0o755)
    wrapper = base / "nvshim-runtime"
    wrapper.write_text(f'#!/bin/sh\nNVSHIM_CONFIG=$(cat {n.current}) exec {tramp} "$@"\n')
    wrapper.chmod(0o755)

    config = base / "containerd.toml"
    config.write_text(
        cri_containerd_config(
            base,
            cdi_spec_dirs=[str(base / "cdi")] if version != "1.6" else (),
            version=3 if version == "2.1" else 2,
        )
        + (private_nri(base) if version == "2.1" else "")
    )
    nvshim = [
        shutil.which("nvshim") or "nvshim",
        "runtime",
        "configure",
        "--runtime",
        "containerd",
        "--config",
        str(config),
        "--drop-in",
        "",
        "--binary",
        str(wrapper),
    ]
    for extra in ([], ["--name", "nvshim-podcdi", "--pod-cdi-annotations"]):
        res = subprocess.run(
            nvshim + extra, capture_output=True, text=True, timeout=60, check=False
        )
        assert res.returncode == 0, res.stderr
    with serving(n, base, config.read_text(), bin_dir, rootfs):
        yield n


@contextlib.contextmanager
def serving(
    n: Node, base: Path, config_text: str, bin_dir: Optional[Path], rootfs: Path
) -> Iterator[Node]:
    """``n`` with containerd running ``config_text`` under ``base`` (binaries from
    ``bin_dir``), the busybox image from ``rootfs`` imported and a CRI client; on the way
    out every pod removed, containerd, the fake kubelet and the cgroups gone."""
    n.containerd = Containerd(base, namespace="k8s.io", config_text=config_text, bin_dir=bin_dir)
    try:
        n.containerd.start()
        import_image(n.containerd, rootfs, base)
        n.cri = CriClient(n.containerd.address)
        yield n
    finally:
        if n.cri is not None:
            n.cri.remove_pods()
        if n.containerd is not None:
            n.containerd.stop()
        n.kubelet.stop()
        remove_cgroup_tree(n.cgroup)


@pytest.fixture(scope="module", params=["1.6", "1.7"], ids=lambda v: f"containerd-{v}")
def node(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, base_rootfs: Path
) -> Iterator[Node]:
    require_root()
    from nvshim.sim.build import create_node

    base = tmp_path_factory.mktemp("cri")
    sim = create_node(str(base / "node"), gpus=4, shuffle_minors=True, imex_channels=3)
    with cri_node(base, sim, request.param, base_rootfs) as n:
        yield n


@pytest.fixture
def cri(node: Node) -> Iterator[Node]:
    """The node with the default config (verify-with kubelet); pods removed afterwards."""
    node.config()
    node.kubelet.set([])
    yield node
    assert node.cri is not None
    node.cri.remove_pods()
    node.cri = CriClient(node.containerd.address)  # type: ignore[union-attr]


def pod(
    n: Node,
    name: str,
    namespace: str = "team-a",
    handler: str = "nvshim",
    annotations: Optional[Mapping[str, str]] = None,
) -> Tuple[str, bytes, Path]:
    assert n.cri is not None
    logs = n.base / "logs" / name
    sandbox, config = n.cri.run_pod(
        name, namespace, f"uid-{name}", logs, f"/{n.cgroup}/{name}", handler, annotations
    )
    return sandbox, config, logs


def start(
    n: Node,
    p: Tuple[str, bytes, Path],
    env: Optional[Mapping[str, str]] = None,
    mounts: Sequence[Tuple[str, str]] = (),
    name: str = "main",
    listing: str = "/dev",
    devices: Sequence[Tuple[str, str]] = (),
    annotations: Optional[Mapping[str, str]] = None,
    cdi_devices: Sequence[str] = (),
) -> str:
    """Create and start a container that lists ``listing``, prints END and stays up; its CRI id."""
    assert n.cri is not None
    sandbox, config, _ = p
    cid = n.cri.create_container(
        sandbox,
        config,
        name,
        "docker.io/nvshim-test/busybox:1",
        ["sh", "-c", f"ls {listing}; echo END; exec sleep 1000"],
        env=env,
        mounts=mounts,
        devices=devices,
        annotations=annotations,
        cdi_devices=cdi_devices,
    )
    n.cri.start_container(cid)
    return cid


def gpu_minors(n: Node, p: Tuple[str, bytes, Path], name: str = "main") -> List[int]:
    assert n.cri is not None
    out = n.cri.wait_log(p[2], name, "END")
    return sorted(int(m.group(1)) for m in (GPU_NODE.match(x) for x in out.split()) if m)


def grants(n: Node, *flags: str) -> Tuple[int, Dict[str, Any]]:
    res = subprocess.run(
        [
            shutil.which("nvshim") or "nvshim",
            "grants",
            "--journal",
            str(n.base / "grants.jsonl"),
            "--format",
            "json",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return res.returncode, json.loads(res.stdout)


EVERY_NODE = pytest.mark.parametrize(
    "node",
    ["1.6", "1.7", "2.1"],
    indirect=True,
    ids=["containerd-1.6", "containerd-1.7", "containerd-2.1"],
)
"""containerd 1.6, 1.7 and Debian unstable's 2.1 (the others run on 1.6 and 1.7, 2.1 runs
those of the CDI section below besides)."""


@EVERY_NODE
def test_real_allocation_is_granted_and_journaled(cri: Node) -> None:
    """The GPU the kubelet allocated (device plugin env) is granted: only its node, recorded with the pod's identity."""
    gpu = cri.sim.gpus[2]
    cri.kubelet.set([("team-a", "alloc", {"main": {GPU: [gpu.uuid]}})])
    p = pod(cri, "alloc")
    cid = start(cri, p, env={"NVIDIA_VISIBLE_DEVICES": gpu.uuid})
    assert gpu_minors(cri, p) == [gpu.minor]
    notes = spec_annotations(cri.base / "state", cid)
    assert {
        k: notes.get(k)
        for k in (
            "io.kubernetes.cri.sandbox-name",
            "io.kubernetes.cri.sandbox-namespace",
            "io.kubernetes.cri.sandbox-uid",
            "io.kubernetes.cri.container-name",
        )
    } == {
        "io.kubernetes.cri.sandbox-name": "alloc",
        "io.kubernetes.cri.sandbox-namespace": "team-a",
        "io.kubernetes.cri.sandbox-uid": "uid-alloc",
        "io.kubernetes.cri.container-name": "main",
    }
    rc, doc = grants(cri)
    mine = [g for g in doc["grants"] if g["pod"] == "alloc"]
    assert rc == 0 and len(mine) == 1
    assert (
        mine[0]["namespace"],
        mine[0]["container"],
        mine[0]["gpus"],
        mine[0]["verified"],
        mine[0]["status"],
    ) == ("team-a", "main", [gpu.uuid], "kubelet", "running")


def test_forged_uuid_env_is_refused(cri: Node) -> None:
    """A pod without a GPU naming another tenant's GPU UUID in its env fails to start, the error naming the GPU and its holder."""
    victim = cri.sim.gpus[1]
    cri.kubelet.set(
        [("team-b", "victim", {"train": {GPU: [victim.uuid]}}), ("team-a", "thief", {"main": {}})]
    )
    p = pod(cri, "thief")
    with pytest.raises(CriError) as info:
        start(cri, p, env={"NVIDIA_VISIBLE_DEVICES": victim.uuid})
    assert (
        f"nvshim: GPU 1 ({victim.uuid}) is not this container's allocation: the kubelet "
        "gave it to team-b/victim/train"
    ) in info.value.details


def test_forged_hostpath_mount_is_refused(cri: Node) -> None:
    """A hostPath /dev/null mount under /var/run/nvidia-container-devices naming a GPU is refused."""
    target = cri.sim.gpus[3]
    cri.kubelet.set([("team-a", "mounter", {"main": {}})])
    p = pod(cri, "mounter")
    with pytest.raises(CriError) as info:
        start(cri, p, mounts=[("/dev/null", f"{DEVICES}/{target.uuid}")])
    assert (
        f"GPU 3 ({target.uuid}) is not this container's allocation: the kubelet allocated "
        "no GPU to team-a/mounter/main"
    ) in info.value.details


IMEX = "nvidia.com/imex-channel"
IMEX_DIR = "/dev/nvidia-caps-imex-channels"


def test_allocated_imex_channel_is_granted(cri: Node) -> None:
    """The device plugin's imex/<N> mount for a channel the kubelet lists for this container
    (no GPU claimed) gives the container that channel's node and no other."""
    cri.kubelet.set([("team-a", "imex", {"main": {IMEX: ["channel1"]}})])
    p = pod(cri, "imex")
    start(cri, p, mounts=[("/dev/null", f"{DEVICES}/imex/1")], listing=IMEX_DIR)
    assert cri.cri.wait_log(p[2], "main", "END").split()[:-1] == ["channel1"]  # type: ignore


def test_forged_imex_mount_is_refused(cri: Node) -> None:
    """A hostPath /dev/null mount at imex/<N> the kubelet did not allocate fails to start,
    the error naming the channel."""
    cri.kubelet.set(
        [("team-b", "owner", {"train": {IMEX: ["2"]}}), ("team-a", "imexthief", {"main": {}})]
    )
    p = pod(cri, "imexthief")
    with pytest.raises(CriError) as info:
        start(cri, p, mounts=[("/dev/null", f"{DEVICES}/imex/2")], listing=IMEX_DIR)
    assert (
        "nvshim: IMEX channel 2 is not this container's allocation: the kubelet gave it "
        "to team-b/owner/train (claimed through volume-mounts, checked via podresources)"
    ) in info.value.details


def test_kubelet_down_fails_by_default(cri: Node) -> None:
    """With the kubelet unreachable a GPU claim fails, saying what was tried and the policy."""
    cri.config(kubelet_socket=str(cri.base / "absent.sock"))
    p = pod(cri, "down")
    with pytest.raises(CriError) as info:
        start(cri, p, env={"NVIDIA_VISIBLE_DEVICES": cri.sim.gpus[0].uuid})
    assert (
        "cannot ask the kubelet what team-a/down/main was allocated (tried PodResources "
        f"socket {cri.base / 'absent.sock'})"
    ) in info.value.details
    assert "kubelet-unreachable: fail" in info.value.details


def test_kubelet_down_trust_claims_grants_and_records_it(cri: Node) -> None:
    """kubelet-unreachable: trust-claims grants the claim and the journal says it was not verified."""
    cri.config(kubelet_socket=str(cri.base / "absent.sock"), kubelet_unreachable="trust-claims")
    gpu = cri.sim.gpus[0]
    p = pod(cri, "trusting")
    start(cri, p, env={"NVIDIA_VISIBLE_DEVICES": gpu.uuid})
    assert gpu_minors(cri, p) == [gpu.minor]
    _, doc = grants(cri)
    assert [g["verified"] for g in doc["grants"] if g["pod"] == "trusting"] == ["unreachable"]


@EVERY_NODE
def test_pod_annotation_claim_is_refused(cri: Node) -> None:
    """A pod's cdi.k8s.io annotation grants nothing: the default handler does not pass it, a handler that does (where containerd's CDI is off) gets it recognised as the pod's; a CDI annotation outside the kubelet's record is refused."""
    claim = {"cdi.k8s.io/claim": "nvidia.com/gpu=0"}
    cri.kubelet.set([("team-a", "annotated", {"main": {}}), ("team-a", "annotated2", {"main": {}})])
    p = pod(cri, "annotated", annotations=claim)
    cid = start(cri, p)
    assert gpu_minors(cri, p) == []
    assert "cdi.k8s.io/claim" not in spec_annotations(cri.base / "state", cid)

    p2 = pod(cri, "annotated2", handler="nvshim-podcdi", annotations=claim)
    cid = start(cri, p2)
    passed = spec_annotations(cri.base / "state", cid).get("cdi.k8s.io/claim")
    # where containerd injects CDI itself (1.7, 2.1 here), configure passes nvshim no
    # cdi.k8s.io/* at all, --pod-cdi-annotations included
    assert passed == ("nvidia.com/gpu=0" if cri.version == "1.6" else None)
    assert gpu_minors(cri, p2) == []

    assert cri.cri is not None
    cid = cri.cri.create_container(
        p2[0],
        p2[1],
        "second",
        "docker.io/nvshim-test/busybox:1",
        ["true"],
        annotations={"cdi.k8s.io/nvidia-device-plugin": "nvidia.com/gpu=0"},
    )
    with pytest.raises(CriError) as info:
        cri.cri.start_container(cid)
    gpu = cri.sim.gpus[0]
    if cri.version == "1.6":  # nvshim injects what the annotation names
        said = (
            f"GPU 0 ({gpu.uuid}) is not this container's allocation: the kubelet allocated"
            " no GPU to team-a/annotated2/second (claimed through cdi-annotations"
        )
    else:  # containerd 1.7 or 2.1 (enable_cdi) injected it before nvshim ran
        said = (
            f"GPU 0 ({gpu.uuid}), injected by the engine, is not this container's "
            "allocation: the kubelet listed no device-plugin GPU and no DRA claim for "
            "team-a/annotated2/second (checked via podresources)"
        )
    assert said in info.value.details


def test_pod_annotation_is_no_allocation_even_without_the_kubelet(cri: Node) -> None:
    """Through a handler configured to pass pod annotations, with verify-with none: the pod's cdi.k8s.io claim grants nothing (in the sandbox spec too, or not passed where containerd injects CDI), the device plugin's container annotation grants its GPU."""
    cri.config(verify_with="none")
    p = pod(
        cri,
        "podclaim",
        handler="nvshim-podcdi",
        annotations={"cdi.k8s.io/claim": "nvidia.com/gpu=0"},
    )
    assert cri.cri is not None
    cid = start(cri, p)
    passed = spec_annotations(cri.base / "state", cid).get("cdi.k8s.io/claim")
    # containerd 1.7 here injects CDI itself: configure passes nvshim no cdi.k8s.io/* at all
    assert passed == ("nvidia.com/gpu=0" if cri.version == "1.6" else None)
    assert gpu_minors(cri, p) == []

    dp = cri.sim.gpus[2]
    cid = cri.cri.create_container(
        p[0],
        p[1],
        "second",
        "docker.io/nvshim-test/busybox:1",
        ["sh", "-c", "ls /dev; echo END; exec sleep 1000"],
        annotations={"cdi.k8s.io/nvidia-device-plugin": "nvidia.com/gpu=2"},
    )
    cri.cri.start_container(cid)
    assert gpu_minors(cri, p, "second") == [dp.minor]


def test_time_slicing_replicas_shared_by_two_pods_are_allowed(cri: Node) -> None:
    """Two pods given replicas of one GPU both get it, and nvshim grants shows it shared, not a conflict."""
    gpu = cri.sim.gpus[3]
    cri.kubelet.set(
        [
            ("team-a", "rep-a", {"main": {GPU: [f"{gpu.uuid}::1"]}}),
            ("team-b", "rep-b", {"main": {GPU: [f"{gpu.uuid}::2"]}}),
        ]
    )
    pa = pod(cri, "rep-a")
    pb = pod(cri, "rep-b", namespace="team-b")
    start(cri, pa, env={"NVIDIA_VISIBLE_DEVICES": f"{gpu.uuid}::1"})
    start(cri, pb, env={"NVIDIA_VISIBLE_DEVICES": f"{gpu.uuid}::2"})
    assert gpu_minors(cri, pa) == gpu_minors(cri, pb) == [gpu.minor]
    rc, doc = grants(cri)
    assert rc == 0 and gpu.uuid not in doc["conflicts"]
    assert sorted(g["pod"] for g in doc["grants"] if gpu.uuid in g["gpus"]) == ["rep-a", "rep-b"]


def test_two_pods_claiming_one_unshared_gpu_are_flagged(cri: Node) -> None:
    """Without verification two pods claiming the same GPU both get it; nvshim grants flags the conflict."""
    cri.config(verify_with="none")
    gpu = cri.sim.gpus[1]
    pa = pod(cri, "dup-a")
    pb = pod(cri, "dup-b")
    start(cri, pa, env={"NVIDIA_VISIBLE_DEVICES": gpu.uuid})
    start(cri, pb, env={"NVIDIA_VISIBLE_DEVICES": gpu.uuid})
    assert gpu_minors(cri, pa) == gpu_minors(cri, pb) == [gpu.minor]
    rc, doc = grants(cri)
    assert rc == 1
    holders = {g["container_id"]: g["pod"] for g in doc["grants"]}
    assert sorted(holders[c] for c in doc["conflicts"][gpu.uuid]) == ["dup-a", "dup-b"]


# --- GPUs the engine injected (DRA, engine-side CDI) ----------------------------------------


def injected(n: Node, gpu: Any) -> Tuple[str, str]:
    """(host path, container path) of a GPU's device node: containerd puts it in the spec
    (``linux.devices`` by the host node's numbers, and its cgroup rule) before nvshim runs,
    as containerd 1.7 does for the CDI devices the kubelet names for a DRA claim."""
    return os.path.join(n.sim.root, f"dev/nvidia{gpu.minor}"), f"/dev/nvidia{gpu.minor}"


def test_engine_gpu_listed_under_a_dra_claim_is_accepted(cri: Node) -> None:
    """A GPU the engine injected that the kubelet lists under this container's DRA claim
    (its CDI device nvidia.com/gpu=N) starts with that GPU alone, image env "all"
    notwithstanding, and is journaled as verified by the kubelet."""
    gpu = cri.sim.gpus[2]
    cri.kubelet.set(
        [("team-a", "drapod", {}, {"main": [dra("gpu", f"nvidia.com/gpu={gpu.index}")]})]
    )
    p = pod(cri, "drapod")
    start(cri, p, env={"NVIDIA_VISIBLE_DEVICES": "all"}, devices=[injected(cri, gpu)])
    assert gpu_minors(cri, p) == [gpu.minor]
    rc, doc = grants(cri)
    mine = [g for g in doc["grants"] if g["pod"] == "drapod"]
    assert rc == 0 and [(g["gpus"], g["verified"]) for g in mine] == [([gpu.uuid], "kubelet")]


def test_engine_gpu_the_kubelet_did_not_list_is_refused(cri: Node) -> None:
    """A GPU the engine injected into a CUDA image's container (NVIDIA_VISIBLE_DEVICES=all)
    that the kubelet does not list for it is refused: the container does not start, the
    error naming the GPU and the claim the kubelet did list."""
    gpu = cri.sim.gpus[1]
    cri.kubelet.set([("team-a", "draforged", {}, {"main": [dra("gpu", "nvidia.com/gpu=0")]})])
    p = pod(cri, "draforged")
    with pytest.raises(CriError) as info:
        start(cri, p, env={"NVIDIA_VISIBLE_DEVICES": "all"}, devices=[injected(cri, gpu)])
    assert (
        f"nvshim: GPU 1 ({gpu.uuid}), injected by the engine, is not this container's "
        "allocation: the kubelet listed no device-plugin GPU and DRA claim team-a/gpu "
        "(nvidia.com/gpu=0: GPU 0) for team-a/draforged/main (checked via podresources)"
    ) in info.value.details


def test_engine_gpu_of_another_pods_dra_claim_is_refused_naming_it(cri: Node) -> None:
    """An engine-injected GPU that the kubelet lists under another pod's DRA claim is refused,
    the error naming that pod's container, in a container whose env names no GPU at all."""
    gpu = cri.sim.gpus[3]
    cri.kubelet.set(
        [
            ("team-b", "owner", {}, {"train": [dra("t", "nvidia.com/gpu=3", namespace="team-b")]}),
            ("team-a", "drathief", {"main": {}}),
        ]
    )
    p = pod(cri, "drathief")
    with pytest.raises(CriError) as info:
        start(cri, p, devices=[injected(cri, gpu)])
    assert (
        f"nvshim: GPU 3 ({gpu.uuid}), injected by the engine, is not this container's "
        "allocation: the kubelet gave it to team-b/owner/train (checked via podresources)"
    ) in info.value.details


def test_container_with_an_empty_name_is_refused(cri: Node) -> None:
    """A container containerd's CRI creates with an empty name has no kubelet identity: its claim on another pod's GPU fails to start, never trusted unverified."""
    victim = cri.sim.gpus[1]
    cri.kubelet.set([("team-b", "victim", {"train": {GPU: [victim.uuid]}})])
    p = pod(cri, "noname")
    with pytest.raises(CriError) as info:
        start(cri, p, env={"NVIDIA_VISIBLE_DEVICES": victim.uuid}, name="")
    assert (
        "nvshim: the container's kubelet identity is unusable: containerd made it but "
        "io.kubernetes.cri.container-name is missing or empty"
    ) in info.value.details


# --- every device a claim injects, shared DRA claims ------------------------------------------


def test_an_imex_channel_named_by_a_cdi_mount_is_refused(cri: Node) -> None:
    """A hostPath /dev/null at .../cdi/nvidia.com/imex-channel/2 (a CDI name that injects
    no GPU) is held to the kubelet's record: the channel is another pod's, the container
    does not start, the error naming the channel, the CDI name and the holder."""
    from nvshim.cdi.write import write_spec
    from nvshim.host.discovery import Host
    from nvshim.runtime.extras import generate_imex_spec

    write_spec(str(cri.base / "cdi" / "imex.json"), generate_imex_spec(Host(cri.sim.root)))
    cri.kubelet.set(
        [("team-b", "owner", {"train": {IMEX: ["2"]}}), ("team-a", "cdiimex", {"main": {}})]
    )
    p = pod(cri, "cdiimex")
    with pytest.raises(CriError) as info:
        start(cri, p, mounts=[("/dev/null", f"{DEVICES}/cdi/{IMEX}/2")], listing=IMEX_DIR)
    assert (
        f'nvshim: IMEX channel 2 (CDI device "{IMEX}=2") is not this container\'s '
        "allocation: the kubelet gave it to team-b/owner/train (claimed through "
        "volume-mounts, checked via podresources)"
    ) in info.value.details


def test_one_dra_claim_listed_for_two_pods_is_shared_not_a_conflict(cri: Node) -> None:
    """The engine injected GPU 2 into two pods whose containers the kubelet lists with the
    same DRA claim: both start with it, and nvshim grants reports it shared through that
    claim, exit 0, no conflict."""
    gpu = cri.sim.gpus[2]
    claim = dra("shared", f"nvidia.com/gpu={gpu.index}")
    cri.kubelet.set(
        [("team-a", "sha", {}, {"main": [claim]}), ("team-a", "shb", {}, {"main": [claim]})]
    )
    pa, pb = pod(cri, "sha"), pod(cri, "shb")
    start(cri, pa, devices=[injected(cri, gpu)])
    start(cri, pb, devices=[injected(cri, gpu)])
    assert gpu_minors(cri, pa) == gpu_minors(cri, pb) == [gpu.minor]
    rc, doc = grants(cri)
    assert rc == 0 and gpu.uuid not in doc["conflicts"]
    mine = sorted((g["pod"], g["claims"]) for g in doc["grants"] if gpu.uuid in g["gpus"])
    assert mine == [("sha", {"team-a/shared": [gpu.uuid]}), ("shb", {"team-a/shared": [gpu.uuid]})]


# --- containerd 1.7 and 2.1 inject CDI devices themselves (enable_cdi) ----------------------

CONTAINERD_17 = pytest.mark.parametrize(
    "node", ["1.7", "2.1"], indirect=True, ids=["containerd-1.7", "containerd-2.1"]
)
VIA = pytest.mark.parametrize("via", ["CDI_devices", "annotation", "both"])


def cdi_claim(via: str, name: str) -> Dict[str, Any]:
    """How the kubelet hands containerd a CDI device: the CRI ContainerConfig's CDI_devices
    field (DRA since Kubernetes 1.28, the device plugin's cdi-cri strategy), a ``cdi.k8s.io/``
    container annotation (the device plugin's cdi-annotations strategy, DRA in 1.27), or
    both (DRA in 1.28-1.31: containerd 1.7 then injects from the field)."""
    out: Dict[str, Any] = {}
    if via != "annotation":
        out["cdi_devices"] = [name]
    if via != "CDI_devices":
        out["annotations"] = {"cdi.k8s.io/gpu.nvidia.com_claim-uid": name}
    return out


@CONTAINERD_17
@VIA
@pytest.mark.parametrize("allocation", ["device-plugin", "dra"])
def test_cdi_device_containerd_injects_for_the_kubelets_allocation_is_granted(
    cri: Node, via: str, allocation: str
) -> None:
    """The CDI device the kubelet allocated, injected by containerd 1.7 itself (CDI_devices, a
    cdi.k8s.io/ annotation or both; device plugin or DRA claim): the container sees that GPU
    alone, image env "all" notwithstanding, and the journal holds the engine's grant verified
    by the kubelet (nvshim's handler is not passed the annotation: containerd injects it)."""
    gpu = cri.sim.gpus[2]
    name = f"cdi-{via.lower().replace('_', '')}-{allocation}"
    if allocation == "dra":
        device = f"nvidia.com/gpu={gpu.index}"
        cri.kubelet.set([("team-a", name, {}, {"main": [dra("gpu", device)]})])
    else:
        device = f"nvidia.com/gpu={gpu.uuid}"
        cri.kubelet.set([("team-a", name, {"main": {GPU: [gpu.uuid]}})])
    p = pod(cri, name)
    start(cri, p, env={"NVIDIA_VISIBLE_DEVICES": "all"}, **cdi_claim(via, device))
    assert gpu_minors(cri, p) == [gpu.minor]
    rc, doc = grants(cri)
    mine = [g for g in doc["grants"] if g["pod"] == name]
    assert rc == 0 and [(g["source"], g["gpus"], g["verified"], g["container"]) for g in mine] == [
        ("engine", [gpu.uuid], "kubelet", "main")
    ]


@CONTAINERD_17
@VIA
def test_cdi_device_containerd_injects_outside_the_kubelets_record_is_refused(
    cri: Node, via: str
) -> None:
    """A CDI device the kubelet did not allocate to this container (another pod's DRA
    claim), injected by containerd 1.7 itself: the container does not start, containerd's
    error carries one nvshim line naming the GPU, this container and the holder, and
    ``nvshim grants --denied`` records the refusal."""
    gpu = cri.sim.gpus[3]
    name = f"cdithief-{via.lower().replace('_', '')}"
    cri.kubelet.set(
        [
            (
                "team-b",
                "owner",
                {},
                {"train": [dra("t", f"nvidia.com/gpu={gpu.index}", namespace="team-b")]},
            ),
            ("team-a", name, {"main": {}}),
        ]
    )
    p = pod(cri, name)
    with pytest.raises(CriError) as info:
        start(cri, p, **cdi_claim(via, f"nvidia.com/gpu={gpu.index}"))
    said = info.value.details
    assert (
        f"nvshim: GPU 3 ({gpu.uuid}), injected by the engine, is not this container's "
        "allocation: the kubelet gave it to team-b/owner/train (checked via podresources)"
    ) in said
    assert said.count("nvshim:") == 1 and "\n" not in said and "Traceback" not in said
    _, doc = grants(cri, "--denied")
    mine = [d for d in doc["denied"] if d["pod"] == name]
    assert [(d["action"], d["container"]) for d in mine] == [("refused", "main")]
    assert gpu.uuid in mine[0]["reason"]
