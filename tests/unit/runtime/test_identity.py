"""A CRI container's identity, read from containerd's or CRI-O's annotations, and what
``verify-with: kubelet`` and ``management-pods`` do with it.

CRI-O's keys are those of its source (``pkg/annotations/internal.go``: ``ContainerType``,
``SandboxID``, ``Labels``…; ``internal/factory/container``: the kubelet's labels written as
annotations after the pod sandbox's annotations are copied in). The create road
(:func:`nvshim.runtime.create.plan_create`) runs against the simulated 4-GPU node and the
real gRPC PodResources server of tests/unit/runtime/allocation/test_kubelet.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Optional

import pytest

from nvshim.errors import RequestError
from nvshim.runtime.create import plan_create
from nvshim.runtime.identity import (
    Identity,
    cri_engine,
    is_sandbox,
    management_pod,
    read_identity,
)
from tests.helpers.podresources import PodResourcesServer
from tests.unit.runtime.allocation import test_kubelet as _kubelet_tests
from tests.unit.runtime.allocation.test_kubelet import GPU, bundle, cdi_config, config, cri

node = _kubelet_tests.node  # the fixtures: the simulated node, the PodResources server
kubelet = _kubelet_tests.kubelet


def crio(
    pod: str = "mine",
    container: str = "main",
    namespace: str = "team-a",
    uid: str = "uid-mine",
    kind: str = "container",
    pod_annotations: Optional[Dict[str, str]] = None,
) -> Dict[str, str]:
    """The annotations CRI-O writes on a container's spec: the pod sandbox's annotations
    first (a pod author's), then its own keys, then the kubelet's labels."""
    labels = {
        "io.kubernetes.container.name": container,
        "io.kubernetes.pod.name": pod,
        "io.kubernetes.pod.namespace": namespace,
        "io.kubernetes.pod.uid": uid,
    }
    out = dict(pod_annotations or {})
    out.update(
        {
            "io.kubernetes.cri-o.ContainerType": kind,
            "io.kubernetes.cri-o.SandboxID": "5b1e" * 16,
            "io.kubernetes.cri-o.SandboxName": f"k8s_POD_{pod}_{namespace}_{uid}_0",
            "io.kubernetes.cri-o.Name": f"k8s_{container}_{pod}_{namespace}_{uid}_0",
            "io.kubernetes.cri-o.Metadata": json.dumps({"name": container}),
            "io.kubernetes.cri-o.Labels": json.dumps(labels),
            "io.kubernetes.cri-o.Annotations": json.dumps({"io.kubernetes.container.hash": "1"}),
            "io.container.manager": "cri-o",
        }
    )
    out.update(labels)
    return out


# --- the reader -----------------------------------------------------------------------


def test_crio_identity_is_read_from_the_kubelets_labels() -> None:
    """A CRI-O container is namespace/pod/container (and pod UID) from the kubelet's labels CRI-O records."""
    assert cri_engine(crio()) == "cri-o"
    assert read_identity(crio()) == (Identity("team-a", "mine", "uid-mine", "main"), "")
    assert read_identity(cri()) == (Identity("team-a", "mine", "uid-mine", "main"), "")
    assert read_identity({"org.opencontainers.image.title": "x"}) == (None, "")


@pytest.mark.parametrize(
    ("annotations", "why"),
    [
        (
            {**cri(), "io.kubernetes.cri.container-name": ""},
            "io.kubernetes.cri.container-name is missing or empty",
        ),
        (
            {k: v for k, v in cri().items() if k != "io.kubernetes.cri.sandbox-name"},
            "io.kubernetes.cri.sandbox-name is missing",
        ),
        (
            crio(pod_annotations={"io.kubernetes.cri.sandbox-name": "victim"}),
            "both containerd's io.kubernetes.cri.* and CRI-O's",
        ),
        (
            {**crio(), "io.kubernetes.pod.name": "victim"},
            "annotation io.kubernetes.pod.name='victim' contradicts CRI-O's io.kubernetes.cri-o.Labels",
        ),
        ({**crio(), "io.kubernetes.cri-o.Labels": "{not json"}, "is not a JSON object"),
        (crio(container=""), "io.kubernetes.container.name is missing or empty"),
    ],
)
def test_an_unusable_cri_identity_says_why(annotations: Dict[str, str], why: str) -> None:
    """A spec a CRI engine made whose names are empty, missing, doubled or contradicted has no identity, and the reason says which key."""
    identity, problem = read_identity(annotations)
    assert identity is None and why in problem and "\n" not in problem


def test_crio_sandbox_is_recognised_by_crios_own_marker() -> None:
    """CRI-O's pause container (ContainerType sandbox) is a sandbox; a containerd key a pod wrote into a CRI-O spec makes none."""
    assert is_sandbox(crio(kind="sandbox")) and not is_sandbox(crio())
    forged = crio(pod_annotations={"io.kubernetes.cri.container-type": "sandbox"})
    assert not is_sandbox(forged)


def test_management_pods_match_crio_identities_and_never_forged_ones() -> None:
    """management-pods matches a CRI-O device plugin by the kubelet's labels; containerd keys a CRI-O pod wrote itself match nothing."""
    patterns = ["kube-system/nvidia-device-plugin-*"]
    plugin = crio(pod="nvidia-device-plugin-x1", namespace="kube-system", container="plugin")
    assert management_pod(plugin, patterns) == patterns[0]
    forged = crio(
        pod_annotations={
            "io.kubernetes.cri.sandbox-namespace": "kube-system",
            "io.kubernetes.cri.sandbox-name": "nvidia-device-plugin-x1",
            "io.kubernetes.cri.container-name": "plugin",
        }
    )
    assert management_pod(forged, patterns) is None


# --- verify-with: kubelet under CRI-O -----------------------------------------------------


def test_crio_container_naming_another_tenants_gpu_is_refused(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """Under CRI-O a pod that got no GPU naming another tenant's GPU UUID fails, naming the GPU and its holder."""
    victim = node.gpus[1]
    kubelet.set(
        [("team-b", "victim", {"train": {GPU: [victim.uuid]}}), ("team-a", "mine", {"main": {}})]
    )
    with pytest.raises(RequestError) as info:
        plan_create(
            bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={victim.uuid}"], crio()),
            config(node, tmp_path),
        )
    msg = str(info.value)
    assert msg.startswith(f"GPU 1 ({victim.uuid}) is not this container's allocation")
    assert "team-b/victim/train" in msg and kubelet.calls["List"] == 1


def test_crio_container_gets_its_allocated_gpu_verified(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """Under CRI-O the GPU the kubelet allocated to this very container is granted and recorded as verified by the kubelet."""
    gpu = node.gpus[2]
    kubelet.set([("team-a", "mine", {"main": {GPU: [gpu.uuid]}})])
    plan = plan_create(
        bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}"], crio()), config(node, tmp_path)
    )
    assert [g.uuid for g in plan.gpus] == [gpu.uuid] and plan.verified == "kubelet"
    assert plan.identity == Identity("team-a", "mine", "uid-mine", "main")


def test_crio_pod_posing_as_another_pod_with_containerd_keys_is_refused(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """CRI-O copies pod annotations into the spec: io.kubernetes.cri.* keys naming the victim make the identity unusable, and the claim is refused."""
    victim = node.gpus[3]
    kubelet.set(
        [("team-b", "victim", {"train": {GPU: [victim.uuid]}}), ("team-a", "mine", {"main": {}})]
    )
    forged = crio(
        pod_annotations={
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.sandbox-name": "victim",
            "io.kubernetes.cri.sandbox-namespace": "team-b",
            "io.kubernetes.cri.sandbox-uid": "uid-victim",
            "io.kubernetes.cri.container-name": "train",
        }
    )
    with pytest.raises(RequestError, match="identity is unusable: its spec carries both"):
        plan_create(
            bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={victim.uuid}"], forged),
            config(node, tmp_path),
        )


def test_containerd_container_with_an_empty_name_is_refused(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """A containerd spec whose container name is empty is no identity to verify: its GPU claim is refused, never trusted."""
    kubelet.set([("team-b", "victim", {"train": {GPU: [node.gpus[1].uuid]}})])
    annotations = {**cri(), "io.kubernetes.cri.container-name": ""}
    with pytest.raises(RequestError) as info:
        plan_create(
            bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={node.gpus[1].uuid}"], annotations),
            config(node, tmp_path),
        )
    assert "io.kubernetes.cri.container-name is missing or empty" in str(info.value)
    assert "verify-with: kubelet" in str(info.value)


def test_non_cri_container_is_refused_unless_the_config_judges_it(
    node: Any, tmp_path: Path
) -> None:
    """Under verify a container no CRI engine made fails by default; unidentified-containers: allocation-sources grants its claim with a warning and journals it unidentified."""
    spec = bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={node.gpus[0].uuid}"], annotations={})
    with pytest.raises(RequestError, match="not a CRI container.*unidentified-containers: fail"):
        plan_create(spec, config(node, tmp_path))
    plan = plan_create(spec, config(node, tmp_path, unidentified_containers="allocation-sources"))
    assert [g.index for g in plan.gpus] == [0] and plan.verified == "unidentified"
    assert any("not a CRI container" in w and "unverified" in w for w in plan.warnings)


def test_crio_management_pod_gets_what_it_asks_for(node: Any, tmp_path: Path) -> None:
    """A device plugin pod under CRI-O listed in management-pods gets every GPU its env asks for, without a kubelet record."""
    annotations = crio(pod="nvidia-device-plugin-x1", namespace="kube-system", container="plugin")
    cfg = config(node, tmp_path, management_pods=("kube-system/nvidia-device-plugin-*",))
    plan = plan_create(bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"], annotations), cfg)
    assert len(plan.gpus) == 4 and plan.request.source == "management-pod"


def test_crio_pod_annotation_is_no_cdi_allocation(node: Any, tmp_path: Path) -> None:
    """Under CRI-O a cdi.k8s.io/ annotation the pod wrote (absent from CRI-O's record of the kubelet's container annotations) grants nothing; the device plugin's does."""
    cfg = cdi_config(node, tmp_path)
    claim = {"cdi.k8s.io/claim": "nvidia.com/gpu=1"}
    forged = crio(pod_annotations=claim)
    plan = plan_create(bundle(tmp_path, [], forged), cfg)
    assert plan.gpus == () and plan.request.cdi_names == ()
    assert any("annotation cdi.k8s.io/claim ignored: it is the pod's" in n for n in plan.notes)
    allocated = {**forged, **claim, "io.kubernetes.cri-o.Annotations": json.dumps(claim)}
    plan = plan_create(bundle(tmp_path, [], allocated), cfg)
    assert plan.request.source == "cdi-annotations"
    assert plan.request.devices == ("nvidia.com/gpu=1",)


def test_every_identity_key_starts_with_the_prefix_that_gates_loading_it() -> None:
    """Every annotation key nvshim.runtime.identity reads starts with claim.KUBERNETES_PREFIX:
    a spec without such a key is no sandbox and has no identity, so a create never imports
    that module for it."""
    from nvshim.runtime import identity
    from nvshim.runtime.claim import KUBERNETES_PREFIX, image_view

    keys = [getattr(identity, name) for name in identity.__all__ if name.isupper()]
    assert keys and all(k.startswith(KUBERNETES_PREFIX) for k in keys), keys
    plain = image_view({"annotations": {"org.example/x": "sandbox"}})
    assert (plain.cri, plain.sandbox, plain.identity) == (False, False, None)
    sandbox = image_view({"annotations": containerd_sandbox()})
    assert sandbox.cri and sandbox.sandbox


# --- the sandbox marker counts only with its engine's identity ------------------------------


def containerd_sandbox(**kw: str) -> Dict[str, str]:
    """What containerd's CRI plugin writes on a pod sandbox: the marker, its id and the pod's
    name, namespace and UID (no container name)."""
    out = {k: v for k, v in cri(**kw).items() if k != "io.kubernetes.cri.container-name"}
    out["io.kubernetes.cri.container-type"] = "sandbox"
    return out


@pytest.mark.parametrize(
    "annotations",
    [
        {"io.kubernetes.cri.container-type": "sandbox"},
        {"io.kubernetes.cri-o.ContainerType": "sandbox"},
        {k: v for k, v in containerd_sandbox().items() if k != "io.kubernetes.cri.sandbox-uid"},
        {**containerd_sandbox(), "io.kubernetes.cri.sandbox-id": ""},
        {k: v for k, v in crio(kind="sandbox").items() if k != "io.kubernetes.cri-o.Labels"},
        {k: v for k, v in crio(kind="sandbox").items() if k != "io.kubernetes.cri-o.SandboxID"},
        crio(kind="sandbox", uid=""),
    ],
    ids=[
        "containerd-marker-alone",
        "crio-marker-alone",
        "containerd-no-uid",
        "containerd-empty-id",
        "crio-no-labels",
        "crio-no-sandbox-id",
        "crio-empty-uid",
    ],
)
def test_a_sandbox_marker_without_its_engines_identity_is_no_sandbox(
    annotations: Dict[str, str],
) -> None:
    """A sandbox marker (docker/podman --annotation) without the rest of that engine's sandbox identity makes no sandbox."""
    assert not is_sandbox(annotations)


def test_a_sandbox_with_its_engines_identity_is_one() -> None:
    """containerd's and CRI-O's pause containers, as each engine writes them, are sandboxes."""
    assert is_sandbox(containerd_sandbox()) and is_sandbox(crio(kind="sandbox"))


def gpu_device(node: Any, index: int) -> Dict[str, Any]:
    """GPU ``index``'s node in linux.devices, as an engine's CDI injection writes it."""
    minor = node.gpus[index].minor
    return {"path": f"/dev/nvidia{minor}", "type": "c", "major": 195, "minor": minor}


@pytest.mark.parametrize(
    "annotations",
    [
        {"io.kubernetes.cri.container-type": "sandbox"},
        {"io.kubernetes.cri-o.ContainerType": "sandbox"},
        containerd_sandbox(),
    ],
    ids=["containerd-marker", "crio-marker", "containerd-identity"],
)
def test_a_sandbox_marker_never_passes_an_engine_injected_gpu(
    node: Any, tmp_path: Path, annotations: Dict[str, str]
) -> None:
    """A container marked sandbox that holds a GPU the engine injected is judged, not passed through: refused under unidentified-containers: fail, or as no pause container."""
    path = bundle(tmp_path, [], annotations)
    spec = json.loads(Path(path, "config.json").read_text())
    spec["linux"] = {"devices": [gpu_device(node, 1)]}
    Path(path, "config.json").write_text(json.dumps(spec))
    with pytest.raises(RequestError) as info:
        plan_create(path, config(node, tmp_path, unidentified_containers="fail"))
    assert "\n" not in str(info.value)
