"""The real kubelet's own behaviour under nvshim: time-slicing replicas, and a kubelet
restart (its device manager and PodResources API come back, its checkpoint stays)."""

from __future__ import annotations

import json
from typing import Iterator

import pytest

from tests.helpers.common import wait_until
from tests.helpers.deviceplugin import DevicePlugin
from tests.k8s.conftest import Node
from tests.k8s.test_allocation import gpu_pod
from tests.k8s.test_guard import grants, seen

pytestmark = pytest.mark.e2e


def advertised(node: Node, count: int) -> None:
    def ready() -> bool:
        doc = json.loads(node.cluster.kubectl("get", "node", "-o", "json").stdout)
        return doc["items"][0]["status"].get("allocatable", {}).get("nvidia.com/gpu") == str(count)

    wait_until(ready, 60, f"the node to advertise {count} nvidia.com/gpu")


@pytest.fixture
def one_gpu_twice(node: Node) -> Iterator[DevicePlugin]:
    """The device plugin advertising one GPU as two replicas (time-slicing)."""
    dp = DevicePlugin(
        node.cluster.device_plugins, [node.sim.gpus[3].uuid], "envvar", replicas=2
    ).start()
    advertised(node, 2)
    yield dp
    dp.stop()


def test_time_slicing_gives_two_pods_the_same_gpu(node: Node, one_gpu_twice: DevicePlugin) -> None:
    """One GPU advertised as two replicas: two pods limited to one nvidia.com/gpu each, under RuntimeClass nvshim (verify-with: kubelet), both see that GPU, and nvshim grants journals both pods with it, marked shared."""
    gpu = node.sim.gpus[3]
    names = ["slice-a", "slice-b"]
    for name in names:
        node.cluster.apply(gpu_pod(name, 1, "nvshim"))
    for name in names:
        assert seen(node, name)[0] == [gpu.minor]
    assert sorted(one_gpu_twice.allocations) == sorted([[f"{gpu.uuid}::0"], [f"{gpu.uuid}::1"]])
    mine = [g for g in grants(node) if g.get("pod") in names]
    assert sorted(g["pod"] for g in mine) == names, mine
    assert all(g["gpus"] == [gpu.uuid] and g.get("shared") for g in mine), mine
    for name in names:
        node.cluster.kubectl("delete", "pod", name, "--wait=true", "--timeout=60s")


def test_verify_with_kubelet_after_a_kubelet_restart(node: Node) -> None:
    """A pod allocated before the kubelet restarts, and one allocated after, each under RuntimeClass nvshim with verify-with: kubelet, see exactly their GPU: the restarted kubelet's PodResources API and its device-plugin checkpoint answer for both."""
    dp = DevicePlugin(
        node.cluster.device_plugins, [g.uuid for g in node.sim.gpus[:2]], "envvar"
    ).start()
    try:
        advertised(node, 2)
        by_uuid = {g.uuid: g.minor for g in node.sim.gpus}
        node.cluster.apply(gpu_pod("before-restart", 1, "nvshim"))
        assert seen(node, "before-restart")[0] == [by_uuid[dp.allocations[0][0]]]
        node.cluster.restart_kubelet()
        dp.restart()
        advertised(node, 2)
        node.cluster.apply(gpu_pod("after-restart", 1, "nvshim"))
        minors, _vis = seen(node, "after-restart")
        assert len(dp.allocations) == 2 and dp.allocations[1] != dp.allocations[0]
        assert minors == [by_uuid[dp.allocations[1][0]]]
        checkpoint = json.loads(open(node.cluster.checkpoint).read())
        held = json.dumps(checkpoint)
        assert dp.allocations[0][0] in held and dp.allocations[1][0] in held
        for name in ("before-restart", "after-restart"):
            node.cluster.kubectl("delete", "pod", name, "--wait=true", "--timeout=60s")
    finally:
        dp.stop()


def test_an_allocated_pod_cannot_widen_its_gpus_through_its_own_env(node: Node) -> None:
    """A pod allocated one GPU by the device plugin's env (envvar strategy) that also sets env NVIDIA_VISIBLE_DEVICES=all in its spec: the kubelet puts the plugin's value first and the pod's last, so NVIDIA's default runtime would give it every GPU. Beside the guard the create is refused (CreateContainerError naming its allocation); without the agent the pod sees every GPU."""
    import json as jsonlib

    from tests.k8s.test_guard import without_agent_for

    dp = DevicePlugin(node.cluster.device_plugins, [node.sim.gpus[0].uuid], "envvar").start()
    # the guard reads the allocation from the kubelet: its plan grants the one GPU
    node.agent_config(
        verify_with="kubelet",
        allocation_sources=["kubelet", "volume-mounts", "cdi-annotations", "envvar-uuids"],
    )
    try:
        advertised(node, 1)
        spec = jsonlib.loads(gpu_pod("widen", 1))
        spec["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
        node.cluster.apply(jsonlib.dumps(spec))
        said = node.cluster.waiting_reason("widen")
        assert said.startswith("CreateContainerError"), said
        assert "names more than its allocation" in said, said
        node.cluster.kubectl("delete", "pod", "widen", "--wait=true", "--timeout=60s")
        with without_agent_for(node):
            spec["metadata"]["name"] = "widen-unguarded"
            node.cluster.apply(jsonlib.dumps(spec))
            assert seen(node, "widen-unguarded")[0] == node.gpu_minors()
            node.cluster.kubectl("delete", "pod", "widen-unguarded", "--wait=true", "--timeout=60s")
    finally:
        node.agent_config()
        dp.stop()
