"""A device plugin for the real kubelet: its published ``v1beta1`` API over real gRPC.

It advertises GPUs (by UUID, as NVIDIA's k8s-device-plugin does) as one resource
(``nvidia.com/gpu``), registers with the kubelet's ``kubelet.sock`` in its device-plugin
directory and answers ``Allocate`` in one of NVIDIA's device-list strategies:

- ``envvar``: ``NVIDIA_VISIBLE_DEVICES=<uuid>,…``;
- ``volume-mounts``: ``/dev/null`` mounted at ``/var/run/nvidia-container-devices/<uuid>``;
- ``cdi-annotations``: the annotation ``cdi.k8s.io/nvidia-device-plugin_<n>`` naming
  ``nvidia.com/gpu=<uuid>``;
- ``cdi-cri``: the response's CDI devices (``nvidia.com/gpu=<uuid>``).

``replicas`` > 1 advertises each GPU that many times (``<uuid>::<n>``, time-slicing);
the allocation then names the GPU itself. Messages are built by Google's protobuf runtime
from a descriptor written out here from the kubelet's published
``pkg/apis/deviceplugin/v1beta1/api.proto`` (package ``v1beta1``, field numbers as
published), independent of nvshim's own codec.
"""

from __future__ import annotations

import itertools
import threading
from concurrent import futures
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from tests.helpers.podresources import add_message

__all__ = ["DevicePlugin", "STRATEGIES", "DEVICE_LIST_DIR", "ask_plugin"]

STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
#: Each server's socket gets a name of its own: gRPC unlinks a stopped server's socket
#: path when it lets the server go, which may be after a new server bound the same path.
_ENDPOINTS = itertools.count()
DEVICE_LIST_DIR = "/var/run/nvidia-container-devices"
_T = descriptor_pb2.FieldDescriptorProto


def _file() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(
        name="nvshim_test_deviceplugin_v1beta1.proto", package="v1beta1", syntax="proto3"
    )
    opt, rep = _T.LABEL_OPTIONAL, _T.LABEL_REPEATED
    s, b, i64, m = _T.TYPE_STRING, _T.TYPE_BOOL, _T.TYPE_INT64, _T.TYPE_MESSAGE

    def msg(name: str, *fields: Tuple[str, int, int, int, str]) -> Any:
        return add_message(f, name, *fields)

    def string_map(parent: Any, entry: str) -> None:
        nested = parent.nested_type.add(name=entry)
        nested.options.map_entry = True
        nested.field.add(name="key", number=1, type=s, label=opt)
        nested.field.add(name="value", number=2, type=s, label=opt)

    msg(
        "DevicePluginOptions",
        ("pre_start_required", 1, b, opt, ""),
        ("get_preferred_allocation_available", 2, b, opt, ""),
    )
    msg(
        "RegisterRequest",
        ("version", 1, s, opt, ""),
        ("endpoint", 2, s, opt, ""),
        ("resource_name", 3, s, opt, ""),
        ("options", 4, m, opt, ".v1beta1.DevicePluginOptions"),
    )
    msg("Empty")
    msg("ListAndWatchResponse", ("devices", 1, m, rep, ".v1beta1.Device"))
    msg("TopologyInfo", ("nodes", 1, m, rep, ".v1beta1.NUMANode"))
    msg("NUMANode", ("ID", 1, i64, opt, ""))
    msg(
        "Device",
        ("ID", 1, s, opt, ""),
        ("health", 2, s, opt, ""),
        ("topology", 3, m, opt, ".v1beta1.TopologyInfo"),
    )
    msg("PreStartContainerRequest", ("devices_ids", 1, s, rep, ""))
    msg("PreStartContainerResponse")
    msg(
        "PreferredAllocationRequest",
        ("container_requests", 1, m, rep, ".v1beta1.ContainerPreferredAllocationRequest"),
    )
    msg(
        "ContainerPreferredAllocationRequest",
        ("available_deviceIDs", 1, s, rep, ""),
        ("must_include_deviceIDs", 2, s, rep, ""),
        ("allocation_size", 3, _T.TYPE_INT32, opt, ""),
    )
    msg(
        "PreferredAllocationResponse",
        ("container_responses", 1, m, rep, ".v1beta1.ContainerPreferredAllocationResponse"),
    )
    msg("ContainerPreferredAllocationResponse", ("deviceIDs", 1, s, rep, ""))
    msg("AllocateRequest", ("container_requests", 1, m, rep, ".v1beta1.ContainerAllocateRequest"))
    msg("ContainerAllocateRequest", ("devices_ids", 1, s, rep, ""))
    msg("CDIDevice", ("name", 1, s, opt, ""))
    msg(
        "AllocateResponse", ("container_responses", 1, m, rep, ".v1beta1.ContainerAllocateResponse")
    )
    car = msg(
        "ContainerAllocateResponse",
        ("envs", 1, m, rep, ".v1beta1.ContainerAllocateResponse.EnvsEntry"),
        ("mounts", 2, m, rep, ".v1beta1.Mount"),
        ("devices", 3, m, rep, ".v1beta1.DeviceSpec"),
        ("annotations", 4, m, rep, ".v1beta1.ContainerAllocateResponse.AnnotationsEntry"),
        ("cdi_devices", 5, m, rep, ".v1beta1.CDIDevice"),
    )
    string_map(car, "EnvsEntry")
    string_map(car, "AnnotationsEntry")
    msg(
        "Mount",
        ("container_path", 1, s, opt, ""),
        ("host_path", 2, s, opt, ""),
        ("read_only", 3, b, opt, ""),
    )
    msg(
        "DeviceSpec",
        ("container_path", 1, s, opt, ""),
        ("host_path", 2, s, opt, ""),
        ("permissions", 3, s, opt, ""),
    )
    return f


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())
_M = {
    name: message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"v1beta1.{name}"))
    for name in (
        "DevicePluginOptions",
        "RegisterRequest",
        "Empty",
        "ListAndWatchResponse",
        "PreStartContainerRequest",
        "PreStartContainerResponse",
        "PreferredAllocationRequest",
        "PreferredAllocationResponse",
        "AllocateRequest",
        "AllocateResponse",
    )
}


def _unary(fn: Any, request: str) -> Any:
    return grpc.unary_unary_rpc_method_handler(
        fn,
        request_deserializer=_M[request].FromString,
        response_serializer=lambda m: m.SerializeToString(),
    )


class DevicePlugin:
    """``nvidia.com/gpu`` on the kubelet whose device-plugin directory is ``plugin_dir``."""

    def __init__(
        self,
        plugin_dir: Path,
        uuids: Sequence[str],
        strategy: str = "envvar",
        replicas: int = 1,
        resource: str = "nvidia.com/gpu",
    ) -> None:
        assert strategy in STRATEGIES, strategy
        self.plugin_dir, self.uuids, self.strategy = plugin_dir, list(uuids), strategy
        self.replicas, self.resource = replicas, resource
        self._stem = f"nvshim-test-{resource.replace('/', '-')}"
        self.endpoint = f"{self._stem}-{next(_ENDPOINTS)}.sock"
        self.allocations: List[List[str]] = []
        """The device ids of each container the kubelet asked to allocate, in order."""
        self._stop = threading.Event()
        self._server: Any = None
        self._count = 0
        self._lock = threading.Lock()

    @property
    def device_ids(self) -> List[str]:
        if self.replicas == 1:
            return list(self.uuids)
        return [f"{u}::{n}" for u in self.uuids for n in range(self.replicas)]

    def start(self) -> "DevicePlugin":
        socket = self.plugin_dir / self.endpoint
        if socket.exists():
            socket.unlink()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        handlers = {
            "GetDevicePluginOptions": _unary(self._options, "Empty"),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                self._list_and_watch,
                request_deserializer=_M["Empty"].FromString,
                response_serializer=lambda m: m.SerializeToString(),
            ),
            "GetPreferredAllocation": _unary(self._preferred, "PreferredAllocationRequest"),
            "Allocate": _unary(self._allocate, "AllocateRequest"),
            "PreStartContainer": _unary(self._prestart, "PreStartContainerRequest"),
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("v1beta1.DevicePlugin", handlers),)
        )
        if self._server.add_insecure_port(f"unix://{socket}") == 0:
            raise AssertionError(f"cannot listen on unix://{socket}")
        self._server.start()
        self.register()
        return self

    def register(self, timeout: float = 60) -> None:
        """Register with the kubelet (again after a kubelet restart), retrying while its
        registration socket refuses, as NVIDIA's plugin does: a kubelet that has just
        started may not serve it yet."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            try:
                with grpc.insecure_channel(f"unix://{self.plugin_dir / 'kubelet.sock'}") as channel:
                    call = channel.unary_unary(
                        "/v1beta1.Registration/Register",
                        request_serializer=lambda m: m.SerializeToString(),
                        response_deserializer=_M["Empty"].FromString,
                    )
                    call(
                        _M["RegisterRequest"](
                            version="v1beta1",
                            endpoint=self.endpoint,
                            resource_name=self.resource,
                            options=_M["DevicePluginOptions"](),
                        ),
                        timeout=10,
                    )
                return
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    def restart(self) -> "DevicePlugin":
        """Serve and register again, as a plugin does when the kubelet restarted (it
        removes every socket in its directory, the plugin's too). The new server listens
        on a socket of a new name (every plugin's is new: :data:`_ENDPOINTS`), and starts
        over while the kubelet cannot dial it."""
        failure: Any = None
        for _ in range(5):
            self.stop()
            self._stop = threading.Event()
            self.endpoint = f"{self._stem}-{next(_ENDPOINTS)}.sock"
            try:
                return self.start()
            except grpc.RpcError as exc:
                # a kubelet just started clears its directory once more after it listens:
                # it could not dial this socket (the registration failed); start over
                failure = exc
        raise AssertionError(f"the kubelet never took the device plugin: {failure}")

    # --- the service ----------------------------------------------------------------

    def _options(self, request: Any, context: Any) -> Any:
        return _M["DevicePluginOptions"]()

    def _list_and_watch(self, request: Any, context: Any) -> Any:
        yield _M["ListAndWatchResponse"](
            devices=[{"ID": d, "health": "Healthy"} for d in self.device_ids]
        )
        while not self._stop.wait(1.0) and context.is_active():
            pass

    def _preferred(self, request: Any, context: Any) -> Any:
        return _M["PreferredAllocationResponse"]()

    def _prestart(self, request: Any, context: Any) -> Any:
        return _M["PreStartContainerResponse"]()

    def _allocate(self, request: Any, context: Any) -> Any:
        responses = []
        for container in request.container_requests:
            ids = list(container.devices_ids)
            self.allocations.append(ids)
            uuids = list(dict.fromkeys(i.split("::", 1)[0] for i in ids))
            responses.append(self._response(uuids))
        return _M["AllocateResponse"](container_responses=responses)

    def _response(self, uuids: List[str]) -> Dict[str, Any]:
        if self.strategy == "envvar":
            return {"envs": {"NVIDIA_VISIBLE_DEVICES": ",".join(uuids)}}
        if self.strategy == "volume-mounts":
            return {
                "mounts": [
                    {
                        "container_path": f"{DEVICE_LIST_DIR}/{u}",
                        "host_path": "/dev/null",
                        "read_only": True,
                    }
                    for u in uuids
                ]
            }
        names = ",".join(f"nvidia.com/gpu={u}" for u in uuids)
        if self.strategy == "cdi-annotations":
            with self._lock:
                self._count += 1
                key = f"cdi.k8s.io/nvidia-device-plugin_{self._count}"
            return {"annotations": {key: names}}
        return {"cdi_devices": [{"name": f"nvidia.com/gpu={u}"} for u in uuids]}


def ask_plugin(
    socket: Path, allocate: Sequence[str] = (), timeout: float = 30
) -> Tuple[List[Tuple[str, str]], Dict[str, Any]]:
    """What a device plugin serving on ``socket`` says, asked as the kubelet asks it: the
    first ListAndWatch answer as (device id, health) pairs, and (when ``allocate`` names
    device ids) the Allocate answer for one container holding them (envs, mounts,
    annotations, CDI device names)."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        watch = channel.unary_stream(
            "/v1beta1.DevicePlugin/ListAndWatch",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=_M["ListAndWatchResponse"].FromString,
        )
        stream = watch(_M["Empty"](), timeout=timeout)
        first = next(iter(stream))
        devices = [(d.ID, d.health) for d in first.devices]
        stream.cancel()
        answer: Dict[str, Any] = {}
        if allocate:
            call = channel.unary_unary(
                "/v1beta1.DevicePlugin/Allocate",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=_M["AllocateResponse"].FromString,
            )
            reply = call(
                _M["AllocateRequest"](container_requests=[{"devices_ids": list(allocate)}]),
                timeout=timeout,
            )
            (c,) = reply.container_responses
            answer = {
                "envs": dict(c.envs),
                "annotations": dict(c.annotations),
                "mounts": [(m.container_path, m.host_path) for m in c.mounts],
                "cdi_devices": [d.name for d in c.cdi_devices],
            }
    return devices, answer
