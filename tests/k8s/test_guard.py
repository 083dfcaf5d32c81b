"""The default-runtime pitfall on a real cluster, and the agent's guard closing it.

NVIDIA's own runtime (toolkit v1.20.2, CDI mode, see conftest) is containerd's default; every pod here asks
for no ``nvidia.com/gpu``. What is asserted is what the container itself lists in
``/dev`` and its ``NVIDIA_VISIBLE_DEVICES``, read back through ``kubectl logs``, or the
reason the kubelet reports when the create is refused.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from tests.helpers.common import wait_until
from tests.k8s.conftest import BUSYBOX, CUDA_LIKE, Node

pytestmark = pytest.mark.e2e

GPU_NODE = re.compile(r"^nvidia([0-9]+)$")
LIST = "ls /dev; echo VIS=$NVIDIA_VISIBLE_DEVICES; echo END; exec sleep 3600"


def pod(
    name: str,
    image: str = CUDA_LIKE,
    env: Optional[Dict[str, str]] = None,
    annotations: Optional[Dict[str, str]] = None,
    hostpath_mount: Optional[str] = None,
    runtime_class: Optional[str] = None,
) -> str:
    """A one-container host-network pod manifest (JSON is YAML) that lists /dev."""
    import json

    container: Dict[str, Any] = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", LIST],
        "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
    }
    spec: Dict[str, Any] = {
        "hostNetwork": True,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 1,
        "containers": [container],
    }
    if hostpath_mount:
        container["volumeMounts"] = [{"name": "claim", "mountPath": hostpath_mount}]
        spec["volumes"] = [{"name": "claim", "hostPath": {"path": "/dev/null"}}]
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": spec,
        }
    )


def seen(node: Node, name: str) -> Tuple[List[int], str]:
    out = node.cluster.wait_log(name, "END")
    minors = sorted(int(m.group(1)) for m in (GPU_NODE.match(x) for x in out.split()) if m)
    vis = next((w[4:] for w in out.split() if w.startswith("VIS=")), "")
    return minors, vis


def run(node: Node, name: str, **kw: Any) -> str:
    node.cluster.apply(pod(name, **kw))
    return name


def grants(node: Node) -> List[Dict[str, Any]]:
    """What ``nvshim grants`` says of the node's journal (every grant, JSON)."""
    import json
    import shutil
    import subprocess

    res = subprocess.run(
        [
            shutil.which("nvshim") or "nvshim",
            "grants",
            "--journal",
            str(node.base / "grants.jsonl"),
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    doc = json.loads(res.stdout or "{}")
    return (
        doc if isinstance(doc, list) else next((v for v in doc.values() if isinstance(v, list)), [])
    )


def denials(node: Node, name: str) -> List[Dict[str, Any]]:
    import json
    import shutil
    import subprocess

    res = subprocess.run(
        [
            shutil.which("nvshim") or "nvshim",
            "grants",
            "--journal",
            str(node.base / "grants.jsonl"),
            "--format",
            "json",
            "--denied",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    doc = json.loads(res.stdout or "{}")
    records = (
        doc if isinstance(doc, list) else next((v for v in doc.values() if isinstance(v, list)), [])
    )
    return [d for d in records if d.get("pod") == name]


@contextlib.contextmanager
def without_agent_for(node: Node) -> Iterator[Node]:
    """The agent stopped for the body, registered again after it."""
    node.agent.stop()
    try:
        yield node
    finally:
        node.agent.start_registered()


@pytest.fixture
def without_agent(node: Node) -> Iterator[Node]:
    """The agent stopped for the test, registered again after it."""
    with without_agent_for(node):
        yield node


def test_the_pitfall_reproduced_without_the_guard(without_agent: Node) -> None:
    """Seed 000's pitfall on a real kubelet: with NVIDIA's runtime as containerd's default and no guard, a pod that requests no nvidia.com/gpu but whose CUDA image says NVIDIA_VISIBLE_DEVICES=all sees every GPU."""
    node = without_agent
    name = run(node, "pitfall")
    assert seen(node, name)[0] == node.gpu_minors()


def test_the_guard_strips_an_unallocated_cuda_image(node: Node) -> None:
    """With nvshim's agent as the NRI guard, the same pod sees no GPU and NVIDIA_VISIBLE_DEVICES=void, and nvshim grants --denied names it as stripped."""
    name = run(node, "guarded")
    assert seen(node, name) == ([], "void")
    found = denials(node, name)
    assert found and found[0]["action"] == "stripped", found


def test_the_guard_refuses_a_pod_that_sets_the_variable_again(node: Node) -> None:
    """A pod whose spec sets env NVIDIA_VISIBLE_DEVICES=all over its CUDA image's (containerd keeps both entries) is never started: the kubelet reports CreateContainerError with nvshim's one line naming the pod."""
    name = run(node, "env-twice", env={"NVIDIA_VISIBLE_DEVICES": "all"})
    said = node.cluster.waiting_reason(name)
    assert said.startswith("CreateContainerError"), said
    assert "nvshim: pod default/env-twice container main:" in said, said
    assert "NVIDIA_VISIBLE_DEVICES is set 2 times" in said, said


def test_the_guard_strips_a_hostpath_device_list_mount(node: Node) -> None:
    """A pod that mounts the host's /dev/null at /var/run/nvidia-container-devices/all (a hostPath volume any pod author can write), its image naming no GPU, sees no GPU under NVIDIA's default runtime, and is journaled as stripped; crictl inspect shows the spec containerd wrote with an empty tmpfs at that destination and NVIDIA_VISIBLE_DEVICES=void."""
    name = run(
        node, "mount-claim", image=BUSYBOX, hostpath_mount="/var/run/nvidia-container-devices/all"
    )
    assert seen(node, name) == ([], "void")
    found = denials(node, name)
    assert found and found[0]["action"] == "stripped", found
    spec = node.cluster.runtime_spec(name)  # what NRI's adjustment left in containerd's spec
    at = [m for m in spec["mounts"] if m["destination"] == "/var/run/nvidia-container-devices/all"]
    assert [(m["type"], m["source"]) for m in at] == [("tmpfs", "tmpfs")], at
    assert "NVIDIA_VISIBLE_DEVICES=void" in spec["process"]["env"]


def test_nvidia_nri_annotation_is_held_to_the_allocation(node: Node) -> None:
    """With NVIDIA's own NRI plugin (toolkit v1.20.2's, built from its module) registered beside the guard, a pod that requests no GPU but is annotated nvidia.cdi.k8s.io/container.main: nvidia.com/gpu=all is never started: the kubelet reports CreateContainerError with nvshim's line naming the annotation. Without nvshim's agent, the same pod sees every GPU through NVIDIA's plugin on containerd 2.4 (1.7's NRI v0.6 drops CDI-device adjustments)."""
    import subprocess

    from tests.helpers.gobuild import go_programs

    plugin = go_programs("nvidia-toolkit") / "nvidia-nri"
    log = node.base / "nvidia-nri.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(plugin), str(node.base / "containerd" / "nri.sock"), "20"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    annotated = {"nvidia.cdi.k8s.io/container.main": "nvidia.com/gpu=all"}
    try:
        wait_until(
            lambda: "Started plugin" in log.read_text(), 30, "NVIDIA's NRI plugin's registration"
        )
        name = run(node, "nv-annotated", image=BUSYBOX, annotations=annotated, runtime_class="runc")
        said = node.cluster.waiting_reason(name)
        assert said.startswith("CreateContainerError"), said
        assert (
            "nvshim: pod default/nv-annotated container main: annotation "
            "nvidia.cdi.k8s.io/container.main names CDI device nvidia.com/gpu=all"
        ) in said
        found = denials(node, name)
        assert found and found[0]["action"] == "refused", found
        node.agent.stop()
        try:
            name = run(
                node, "nv-unguarded", image=BUSYBOX, annotations=annotated, runtime_class="runc"
            )
            # containerd 1.7's NRI v0.6 drops CDI-device adjustments: NVIDIA's plugin
            # injects nothing there
            assert seen(node, name)[0] == (node.gpu_minors() if node.containerd != "1.7" else [])
        finally:
            node.agent.start_registered()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
