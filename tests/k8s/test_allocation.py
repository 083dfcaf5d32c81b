"""Allocated pods on the real kubelet: the tests' device plugin (v1beta1 over real gRPC)
advertises the simulated GPUs as ``nvidia.com/gpu`` and answers ``Allocate`` in each of
NVIDIA's device-list strategies; a pod asking ``limits: nvidia.com/gpu: 1`` sees exactly
the GPU the kubelet allocated under every handler: nvshim's runtime (``verify-with:
kubelet`` against the real PodResources API), plain runc with the agent injecting, and
NVIDIA's default runtime beside the guard."""

from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Optional

import pytest

from tests.helpers.common import wait_until
from tests.helpers.deviceplugin import STRATEGIES, DevicePlugin
from tests.k8s.conftest import BUSYBOX, Node
from tests.k8s.test_guard import LIST, grants, seen

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", params=STRATEGIES)
def plugin(request: pytest.FixtureRequest, node: Node) -> Iterator[DevicePlugin]:
    """The device plugin in one strategy, registered until the module's strategy changes."""
    dp = DevicePlugin(
        node.cluster.device_plugins, [g.uuid for g in node.sim.gpus], request.param
    ).start()

    def advertised() -> bool:
        doc = json.loads(node.cluster.kubectl("get", "node", "-o", "json").stdout)
        status = doc["items"][0]["status"]
        return status.get("allocatable", {}).get("nvidia.com/gpu") == str(len(dp.uuids))

    wait_until(advertised, 60, "the node to advertise nvidia.com/gpu")
    yield dp
    dp.stop()


def gpu_pod(name: str, count: int = 1, runtime_class: Optional[str] = None) -> str:
    container: Dict[str, Any] = {
        "name": "main",
        "image": BUSYBOX,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", LIST],
        "resources": {"limits": {"nvidia.com/gpu": str(count)}},
    }
    spec: Dict[str, Any] = {
        "hostNetwork": True,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 1,
        "containers": [container],
    }
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


@pytest.mark.parametrize("handler", ["nvshim", "runc", "nvidia"])
def test_an_allocated_pod_sees_exactly_its_gpus(
    node: Node, plugin: DevicePlugin, handler: str
) -> None:
    """A pod limited to one nvidia.com/gpu (then two) sees the device nodes of exactly the GPUs the kubelet allocated to it, in this strategy and under this handler, and NVIDIA_VISIBLE_DEVICES=void; nvshim grants names the pod with those GPUs; the pod is deleted after, freeing them."""
    for count in (1, 2):
        name = f"alloc-{plugin.strategy}-{handler}-{count}"
        before = len(plugin.allocations)
        node.cluster.apply(gpu_pod(name, count, None if handler == "nvidia" else handler))
        minors, vis = seen(node, name)
        allocated: List[str] = (
            plugin.allocations[before] if len(plugin.allocations) > before else []
        )
        by_uuid = {g.uuid: g.minor for g in node.sim.gpus}
        assert len(allocated) == count, plugin.allocations
        assert minors == sorted(by_uuid[u] for u in allocated), (minors, allocated)
        assert vis == "void"  # docs/container-env.md: every container nvshim gave GPUs
        # the record names the pod and its GPUs on every path: the runtime's grant, the
        # agent's injection, and the guard letting NVIDIA's runtime through
        mine = [g for g in grants(node) if g.get("pod") == name]
        assert mine and sorted(mine[-1]["gpus"]) == sorted(allocated), (mine, allocated)
        node.cluster.kubectl("delete", "pod", name, "--wait=true", "--timeout=60s")
