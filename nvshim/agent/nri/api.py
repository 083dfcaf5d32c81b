"""The messages of NRI's ``pkg/api/api.proto`` (package ``nri.pkg.api.v1alpha1``) nvshim uses,
as plain values.

The wire format is protoc's: :mod:`.api_pb2` is generated from the api.proto of the NRI tag
``tests/go/nri-proto/go.mod`` pins (``python -m tests.helpers.nriproto`` regenerates it; a test
fails when it drifts from that tag). This module only maps those messages to the frozen values
the plugin reads (:class:`Pod`, :class:`Container`) and from the ones it answers
(:class:`Adjustment`), so a field NRI adds is a regeneration, and a line here only once the
plugin uses it. Field numbers are the same in NRI v0.6 (containerd 1.7) and the later
versions containerd 2.x vendors (proto3 never renumbers); fields a version lacks are absent
on the wire and read as their default, fields nvshim does not know are skipped. A message
that is not well-formed protobuf (a string that is not UTF-8 included) is a
:class:`~nvshim._protobuf.WireError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from google.protobuf.message import DecodeError

from nvshim._protobuf import WireError
from nvshim.agent.nri import api_pb2 as pb

__all__ = [
    "SERVICE_PLUGIN",
    "SERVICE_RUNTIME",
    "Event",
    "Pod",
    "Mount",
    "Device",
    "Hook",
    "Container",
    "Adjustment",
    "decode_pod",
    "decode_container",
    "decode_event",
    "decode_pod_container",
    "decode_configure",
    "decode_state_change",
    "encode_register",
    "encode_sync_reply",
    "encode_configure_reply",
    "encode_create_reply",
    "event_mask",
]

SERVICE_PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
SERVICE_RUNTIME = "nri.pkg.api.v1alpha1.Runtime"


class Event:
    """NRI's ``Event`` enum (the events nvshim names): a plugin subscribes with bit
    ``event - 1``."""

    RUN_POD_SANDBOX: int = pb.RUN_POD_SANDBOX
    STOP_POD_SANDBOX: int = pb.STOP_POD_SANDBOX
    REMOVE_POD_SANDBOX: int = pb.REMOVE_POD_SANDBOX
    CREATE_CONTAINER: int = pb.CREATE_CONTAINER
    POST_CREATE_CONTAINER: int = pb.POST_CREATE_CONTAINER
    START_CONTAINER: int = pb.START_CONTAINER
    POST_START_CONTAINER: int = pb.POST_START_CONTAINER
    UPDATE_CONTAINER: int = pb.UPDATE_CONTAINER
    POST_UPDATE_CONTAINER: int = pb.POST_UPDATE_CONTAINER
    STOP_CONTAINER: int = pb.STOP_CONTAINER
    REMOVE_CONTAINER: int = pb.REMOVE_CONTAINER


def event_mask(*events: int) -> int:
    """The ``ConfigureResponse.events`` bitmask subscribing to ``events``."""
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return mask


@dataclass(frozen=True)
class Pod:
    id: str = ""
    name: str = ""
    uid: str = ""
    namespace: str = ""
    annotations: Dict[str, str] = field(default_factory=dict)
    runtime_handler: str = ""


@dataclass(frozen=True)
class Mount:
    destination: str
    type: str = ""
    source: str = ""
    options: Tuple[str, ...] = ()

    def encode(self) -> bytes:
        return bytes(_pb_mount(self).SerializeToString())


@dataclass(frozen=True)
class Device:
    path: str
    type: str
    major: int
    minor: int
    file_mode: Optional[int] = None
    uid: Optional[int] = None
    gid: Optional[int] = None

    def encode(self) -> bytes:
        return bytes(_pb_device(self).SerializeToString())


@dataclass(frozen=True)
class Hook:
    path: str
    args: Tuple[str, ...] = ()
    env: Tuple[str, ...] = ()
    timeout: Optional[int] = None

    def encode(self) -> bytes:
        return bytes(_pb_hook(self).SerializeToString())


#: ``Hooks`` fields by OCI hook name.
HOOK_FIELDS = {
    "prestart": "prestart",
    "createRuntime": "create_runtime",
    "createContainer": "create_container",
    "startContainer": "start_container",
    "poststart": "poststart",
    "poststop": "poststop",
}


@dataclass(frozen=True)
class Container:
    id: str = ""
    pod_sandbox_id: str = ""
    name: str = ""
    annotations: Dict[str, str] = field(default_factory=dict)
    args: Tuple[str, ...] = ()
    env: Tuple[str, ...] = ()
    mounts: Tuple[Mount, ...] = ()
    hooks: Dict[str, Tuple[Hook, ...]] = field(default_factory=dict)
    devices: Tuple[Device, ...] = ()
    pid: int = 0
    cdi_devices: Tuple[str, ...] = ()
    #: ``linux.cgroups_path`` as the engine set it (cgroupfs path or systemd
    #: ``slice:prefix:name``): where the container's processes will run
    cgroups_path: str = ""


@dataclass(frozen=True)
class Adjustment:
    """A ``ContainerAdjustment``: what the plugin adds (or, keys prefixed ``-``, removes)."""

    annotations: Dict[str, str] = field(default_factory=dict)
    mounts: Tuple[Mount, ...] = ()
    env: Tuple[Tuple[str, str], ...] = ()
    hooks: Dict[str, Tuple[Hook, ...]] = field(default_factory=dict)
    devices: Tuple[Device, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.annotations or self.mounts or self.env or self.hooks or self.devices)

    def encode(self) -> bytes:
        return bytes(_pb_adjustment(self).SerializeToString())


def _pb_mount(m: Mount) -> Any:
    return pb.Mount(destination=m.destination, type=m.type, source=m.source, options=m.options)


def _pb_device(d: Device) -> Any:
    optional = {
        name: kind(value=value)
        for name, kind, value in (
            ("file_mode", pb.OptionalFileMode, d.file_mode),
            ("uid", pb.OptionalUInt32, d.uid),
            ("gid", pb.OptionalUInt32, d.gid),
        )
        if value is not None
    }  # present even when 0
    return pb.LinuxDevice(path=d.path, type=d.type, major=d.major, minor=d.minor, **optional)


def _pb_hook(h: Hook) -> Any:
    timeout = {} if h.timeout is None else {"timeout": pb.OptionalInt(value=h.timeout)}
    return pb.Hook(path=h.path, args=h.args, env=h.env, **timeout)


def _pb_adjustment(a: Adjustment) -> Any:
    out = pb.ContainerAdjustment()
    _fill_adjustment(out, a)
    return out


def _fill_adjustment(out: Any, a: Adjustment) -> None:
    """``a`` written into the empty ContainerAdjustment ``out``, each entry made in place
    (``add``): a message built apart and then put in is copied, twice the work."""
    if a.annotations:
        out.annotations.update(a.annotations)
    mounts = out.mounts
    for m in a.mounts:
        mounts.add(destination=m.destination, type=m.type, source=m.source, options=m.options)
    env = out.env
    for key, value in a.env:
        env.add(key=key, value=value)
    if a.hooks:  # present when a kind is named, even with no hook
        out.hooks.SetInParent()
        for kind, hooks in a.hooks.items():
            found = getattr(out.hooks, HOOK_FIELDS[kind])
            for h in hooks:
                hook = found.add(path=h.path, args=h.args, env=h.env)
                if h.timeout is not None:
                    hook.timeout.value = h.timeout
                    hook.timeout.SetInParent()
    if a.devices:
        devices = out.linux.devices
        for d in a.devices:
            device = devices.add(path=d.path, type=d.type, major=d.major, minor=d.minor)
            for name, number in (("file_mode", d.file_mode), ("uid", d.uid), ("gid", d.gid)):
                if number is not None:  # present even when 0
                    wrapper = getattr(device, name)
                    wrapper.value = number
                    wrapper.SetInParent()


def _parse(kind: Any, data: bytes) -> Any:
    """``data`` as the generated message ``kind``; WireError when it is not one."""
    try:
        return kind.FromString(data)
    except DecodeError as exc:
        raise WireError(f"undecodable {kind.DESCRIPTOR.name} ({len(data)} bytes)") from exc


def _pod(m: Any) -> Pod:
    return Pod(
        id=m.id,
        name=m.name,
        uid=m.uid,
        namespace=m.namespace,
        annotations=dict(m.annotations),
        runtime_handler=m.runtime_handler,
    )


def _optional(m: Any, name: str) -> Optional[int]:
    return int(getattr(m, name).value) if m.HasField(name) else None


def _hook(m: Any) -> Hook:
    return Hook(m.path, tuple(m.args), tuple(m.env), _optional(m, "timeout"))


def _device(m: Any) -> Device:
    return Device(
        m.path,
        m.type,
        m.major,
        m.minor,
        _optional(m, "file_mode"),
        _optional(m, "uid"),
        _optional(m, "gid"),
    )


def _container(m: Any) -> Container:
    hooks = {
        kind: tuple(_hook(h) for h in getattr(m.hooks, name))
        for kind, name in HOOK_FIELDS.items()
        if getattr(m.hooks, name)
    }
    return Container(
        id=m.id,
        pod_sandbox_id=m.pod_sandbox_id,
        name=m.name,
        annotations=dict(m.annotations),
        args=tuple(m.args),
        env=tuple(m.env),
        mounts=tuple(Mount(x.destination, x.type, x.source, tuple(x.options)) for x in m.mounts),
        hooks=hooks,
        devices=tuple(_device(d) for d in m.linux.devices),
        pid=m.pid,
        cdi_devices=tuple(d.name for d in m.CDI_devices),
        cgroups_path=m.linux.cgroups_path,
    )


def decode_pod(data: bytes) -> Pod:
    """A PodSandbox."""
    return _pod(_parse(pb.PodSandbox, data))


def decode_container(data: bytes) -> Container:
    """A Container."""
    return _container(_parse(pb.Container, data))


def decode_pod_container(data: bytes) -> Tuple[Pod, Container]:
    """The (pod, container) of a Create/Start/...ContainerRequest (the same two fields)."""
    request = _parse(pb.CreateContainerRequest, data)
    return _pod(request.pod), _container(request.container)


def decode_state_change(data: bytes) -> Tuple[int, Pod, Container]:
    """(event, pod, container) of a StateChangeEvent."""
    change = _parse(pb.StateChangeEvent, data)
    return int(change.event), _pod(change.pod), _container(change.container)


def decode_event(method: str, data: bytes) -> Tuple[int, str, int]:
    """(event, container id, container pid) of a StartContainer or RemoveContainer request
    or a StateChangeEvent, no Pod or Container value built: what the plugin needs to find
    work it holds for the container, paid on every container's start and removal
    (:func:`decode_pod_container` and :func:`decode_state_change` for the whole)."""
    if method == "StateChange":
        message = _parse(pb.StateChangeEvent, data)
        event = int(message.event)
    elif method == "StartContainer":
        message, event = _parse(pb.StartContainerRequest, data), Event.START_CONTAINER
    else:
        message, event = _parse(pb.RemoveContainerRequest, data), Event.REMOVE_CONTAINER
    return event, str(message.container.id), int(message.container.pid)


def decode_configure(data: bytes) -> Dict[str, str]:
    """The ConfigureRequest's runtime name and version and NRI version."""
    request = _parse(pb.ConfigureRequest, data)
    return {
        "runtime": str(request.runtime_name),
        "version": str(request.runtime_version),
        "nri": str(request.NRI_version),
    }


def encode_sync_reply(request: bytes) -> bytes:
    """The SynchronizeResponse to ``request``: no updates, and ``more`` echoing the
    request's, as a plugin that takes a state split over several messages must (the engine
    closes one that does not)."""
    more = _parse(pb.SynchronizeRequest, request).more
    return bytes(pb.SynchronizeResponse(more=more).SerializeToString())


def encode_register(name: str, index: str) -> bytes:
    """A RegisterPluginRequest."""
    return bytes(pb.RegisterPluginRequest(plugin_name=name, plugin_idx=index).SerializeToString())


def encode_configure_reply(events: int) -> bytes:
    """A ConfigureResponse subscribing to the ``events`` mask (:func:`event_mask`)."""
    return bytes(pb.ConfigureResponse(events=events).SerializeToString())


def encode_create_reply(adjust: Adjustment) -> bytes:
    """A CreateContainerResponse with ``adjust``; nothing at all when it adjusts nothing."""
    if not adjust:
        return b""
    reply = pb.CreateContainerResponse()
    _fill_adjustment(reply.adjust, adjust)
    return bytes(reply.SerializeToString())
