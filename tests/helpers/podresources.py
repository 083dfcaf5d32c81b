"""A kubelet PodResources API server for tests: real gRPC on a unix socket, real protobuf.

It serves ``v1.PodResourcesLister`` (``List``, ``Get``) with messages built by Google's
protobuf runtime from a descriptor written out here from kubelet's published
``pkg/apis/podresources/v1/api.proto`` (package ``v1``; field numbers as published,
including ``topology``, ``cpu_ids``, ``memory`` and a DRA claim's ``share_id``, which
nvshim must skip) — independent of nvshim's own small codec, so a codec bug cannot hide
behind a symmetric one.

``PodResourcesServer(socket).set(pods)`` replaces what the "kubelet" reports; a pod is
``(namespace, name, {container: {resource: [device ids]}})``, optionally with a fourth
item ``{container: [DraClaim, ...]}``: the ``dynamic_resources`` (DRA claims) the kubelet
lists for those containers. ``calls`` counts requests.
"""

from __future__ import annotations

from concurrent import futures
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["PodResourcesServer", "Pod", "DraClaim", "DraDevice", "dra"]


@dataclass(frozen=True)
class DraDevice:
    """One ClaimResource: a device of a claim and the CDI names the engine injects for it."""

    driver: str
    pool: str
    device: str
    cdi: Sequence[str] = ()
    share_id: Optional[str] = None


@dataclass(frozen=True)
class DraClaim:
    """One DynamicResource: a prepared claim and its devices."""

    namespace: str
    name: str
    devices: Sequence[DraDevice] = ()


def dra(
    name: str,
    *cdi: str,
    namespace: str = "team-a",
    driver: str = "gpu.nvidia.com",
    pool: str = "node-1",
) -> DraClaim:
    """A claim with one device per CDI name (device ``gpu-<n>`` for the n-th)."""
    return DraClaim(
        namespace, name, [DraDevice(driver, pool, f"gpu-{i}", [c]) for i, c in enumerate(cdi)]
    )


Containers = Mapping[str, Mapping[str, Sequence[str]]]
Pod = Union[
    Tuple[str, str, Containers], Tuple[str, str, Containers, Mapping[str, Sequence[DraClaim]]]
]

_T = descriptor_pb2.FieldDescriptorProto


def add_message(
    f: descriptor_pb2.FileDescriptorProto, name: str, *fields: Tuple[str, int, int, int, str]
) -> Any:
    """Message ``name`` added to ``f`` with ``fields`` (name, number, type, label, the
    type name of a message field or ""), as a ``.proto`` would declare it; the message."""
    message = f.message_type.add(name=name)
    for fname, number, ftype, label, type_name in fields:
        field = message.field.add(name=fname, number=number, type=ftype, label=label)
        if type_name:
            field.type_name = type_name
    return message


def _file() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(
        name="nvshim_test_podresources_v1.proto", package="v1", syntax="proto3"
    )

    def msg(name: str, *fields: Tuple[str, int, int, int, str]) -> None:
        add_message(f, name, *fields)

    opt, rep = _T.LABEL_OPTIONAL, _T.LABEL_REPEATED
    msg("ListPodResourcesRequest")
    msg("ListPodResourcesResponse", ("pod_resources", 1, _T.TYPE_MESSAGE, rep, ".v1.PodResources"))
    msg(
        "PodResources",
        ("name", 1, _T.TYPE_STRING, opt, ""),
        ("namespace", 2, _T.TYPE_STRING, opt, ""),
        ("containers", 3, _T.TYPE_MESSAGE, rep, ".v1.ContainerResources"),
    )
    msg(
        "ContainerResources",
        ("name", 1, _T.TYPE_STRING, opt, ""),
        ("devices", 2, _T.TYPE_MESSAGE, rep, ".v1.ContainerDevices"),
        ("cpu_ids", 3, _T.TYPE_INT64, rep, ""),
        ("memory", 4, _T.TYPE_MESSAGE, rep, ".v1.ContainerMemory"),
        ("dynamic_resources", 5, _T.TYPE_MESSAGE, rep, ".v1.DynamicResource"),
    )
    # DynamicResource's field 1 (class_name) was removed in Kubernetes 1.31
    msg(
        "DynamicResource",
        ("claim_name", 2, _T.TYPE_STRING, opt, ""),
        ("claim_namespace", 3, _T.TYPE_STRING, opt, ""),
        ("claim_resources", 4, _T.TYPE_MESSAGE, rep, ".v1.ClaimResource"),
    )
    msg(
        "ClaimResource",
        ("cdi_devices", 1, _T.TYPE_MESSAGE, rep, ".v1.CDIDevice"),
        ("driver_name", 2, _T.TYPE_STRING, opt, ""),
        ("pool_name", 3, _T.TYPE_STRING, opt, ""),
        ("device_name", 4, _T.TYPE_STRING, opt, ""),
        ("share_id", 5, _T.TYPE_STRING, opt, ""),
    )
    claim_resource = f.message_type[-1]  # share_id is proto3 "optional": a synthetic oneof
    claim_resource.oneof_decl.add(name="_share_id")
    claim_resource.field[-1].oneof_index = 0
    claim_resource.field[-1].proto3_optional = True
    msg("CDIDevice", ("name", 1, _T.TYPE_STRING, opt, ""))
    msg(
        "ContainerMemory",
        ("memory_type", 1, _T.TYPE_STRING, opt, ""),
        ("size", 2, _T.TYPE_UINT64, opt, ""),
        ("topology", 3, _T.TYPE_MESSAGE, opt, ".v1.TopologyInfo"),
    )
    msg(
        "ContainerDevices",
        ("resource_name", 1, _T.TYPE_STRING, opt, ""),
        ("device_ids", 2, _T.TYPE_STRING, rep, ""),
        ("topology", 3, _T.TYPE_MESSAGE, opt, ".v1.TopologyInfo"),
    )
    msg("TopologyInfo", ("nodes", 1, _T.TYPE_MESSAGE, rep, ".v1.NUMANode"))
    msg("NUMANode", ("ID", 1, _T.TYPE_INT64, opt, ""))
    msg(
        "GetPodResourcesRequest",
        ("pod_name", 1, _T.TYPE_STRING, opt, ""),
        ("pod_namespace", 2, _T.TYPE_STRING, opt, ""),
    )
    msg("GetPodResourcesResponse", ("pod_resources", 1, _T.TYPE_MESSAGE, opt, ".v1.PodResources"))
    return f


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())
_M = {
    name: message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"v1.{name}"))
    for name in (
        "ListPodResourcesRequest",
        "ListPodResourcesResponse",
        "PodResources",
        "GetPodResourcesRequest",
        "GetPodResourcesResponse",
    )
}


class PodResourcesServer:
    """A gRPC server on ``socket`` answering like the kubelet's PodResources v1 service."""

    def __init__(self, socket: str) -> None:
        self.socket = socket
        self.pods: List[Pod] = []
        self.calls: Dict[str, int] = {"List": 0, "Get": 0}
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers = {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list,
                request_deserializer=_M["ListPodResourcesRequest"].FromString,
                response_serializer=lambda m: m.SerializeToString(),
            ),
            "Get": grpc.unary_unary_rpc_method_handler(
                self._get,
                request_deserializer=_M["GetPodResourcesRequest"].FromString,
                response_serializer=lambda m: m.SerializeToString(),
            ),
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("v1.PodResourcesLister", handlers),)
        )
        if self._server.add_insecure_port(f"unix://{socket}") == 0:
            raise AssertionError(f"cannot listen on unix://{socket}")

    def start(self) -> "PodResourcesServer":
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None).wait()

    def set(self, pods: Sequence[Pod]) -> None:
        self.pods = list(pods)

    def _pod(self, pod: Pod) -> Any:
        namespace, name, containers = pod[0], pod[1], pod[2]
        claims: Mapping[str, Sequence[DraClaim]] = pod[3] if len(pod) == 4 else {}
        msg = _M["PodResources"](name=name, namespace=namespace)
        for cname in dict.fromkeys([*containers, *claims]):
            c = msg.containers.add(name=cname, cpu_ids=[0, 1])
            c.memory.add(memory_type="memory", size=1 << 30).topology.nodes.add(ID=0)
            for resource, ids in containers.get(cname, {}).items():
                d = c.devices.add(resource_name=resource, device_ids=list(ids))
                d.topology.nodes.add(ID=0)
            for claim in claims.get(cname, ()):
                r = c.dynamic_resources.add(claim_name=claim.name, claim_namespace=claim.namespace)
                for device in claim.devices:
                    res = r.claim_resources.add(
                        driver_name=device.driver, pool_name=device.pool, device_name=device.device
                    )
                    for cdi in device.cdi:
                        res.cdi_devices.add(name=cdi)
                    if device.share_id is not None:
                        res.share_id = device.share_id
        return msg

    def _list(self, request: Any, context: Any) -> Any:
        self.calls["List"] += 1
        return _M["ListPodResourcesResponse"](pod_resources=[self._pod(p) for p in self.pods])

    def _get(self, request: Any, context: Any) -> Any:
        self.calls["Get"] += 1
        for pod in self.pods:
            if (pod[0], pod[1]) == (request.pod_namespace, request.pod_name):
                return _M["GetPodResourcesResponse"](pod_resources=self._pod(pod))
        context.abort(
            grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found"
        )
