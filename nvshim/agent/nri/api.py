"""The messages of NRI's ``pkg/api/api.proto`` (package ``nri.pkg.api.v1alpha1``) nvshim uses.

Field numbers are the same in NRI v0.6 (containerd 1.7) and the later versions containerd
2.x vendors (proto3 never renumbers); fields a version lacks are absent on the wire and
read as their default, fields nvshim does not know are skipped. Only what the plugin
reads (the pod, the container) is decoded and only what it answers is encoded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from nvshim._protobuf import (
    by_number,
    map_field,
    message_field,
    messages,
    read_int,
    read_map,
    read_string,
    read_strings,
    string_field,
    strings_field,
    varint_field,
)

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
    """NRI's ``Event`` enum: a plugin subscribes with bit ``event - 1``."""

    RUN_POD_SANDBOX = 1
    STOP_POD_SANDBOX = 2
    REMOVE_POD_SANDBOX = 3
    CREATE_CONTAINER = 4
    POST_CREATE_CONTAINER = 5
    START_CONTAINER = 6
    POST_START_CONTAINER = 7
    UPDATE_CONTAINER = 8
    POST_UPDATE_CONTAINER = 9
    STOP_CONTAINER = 10
    REMOVE_CONTAINER = 11


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
        return (string_field(1, self.destination) + string_field(2, self.type)
                + string_field(3, self.source)
                + strings_field(4, self.options))


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
        out = (string_field(1, self.path) + string_field(2, self.type)
               + varint_field(3, self.major) + varint_field(4, self.minor))
        for number, value in ((5, self.file_mode), (6, self.uid), (7, self.gid)):
            if value is not None:  # Optional* wrappers: present even when 0
                out += message_field(number, varint_field(1, value))
        return out


@dataclass(frozen=True)
class Hook:
    path: str
    args: Tuple[str, ...] = ()
    env: Tuple[str, ...] = ()
    timeout: Optional[int] = None

    def encode(self) -> bytes:
        out = (string_field(1, self.path) + strings_field(2, self.args)
               + strings_field(3, self.env))
        if self.timeout is not None:
            out += message_field(4, varint_field(1, self.timeout))
        return out


#: ``Hooks`` field numbers by OCI hook name.
HOOK_FIELDS = {"prestart": 1, "createRuntime": 2, "createContainer": 3, "startContainer": 4,
               "poststart": 5, "poststop": 6}


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
        out = map_field(2, self.annotations)
        out += b"".join(message_field(3, m.encode()) for m in self.mounts)
        out += b"".join(message_field(4, string_field(1, k) + string_field(2, v))
                        for k, v in self.env)
        if self.hooks:
            hooks = b"".join(message_field(HOOK_FIELDS[kind], h.encode())
                             for kind, hs in self.hooks.items() for h in hs)
            out += message_field(5, hooks)
        if self.devices:
            out += message_field(6, b"".join(message_field(1, d.encode())
                                             for d in self.devices))
        return out


def _optional(values: Dict[int, list], number: int) -> Optional[int]:  # type: ignore[type-arg]
    for inner in messages(values, number):
        return read_int(by_number(inner), 1, signed=False)
    return None


def decode_pod(data: bytes) -> Pod:
    v = by_number(data)
    return Pod(id=read_string(v, 1), name=read_string(v, 2), uid=read_string(v, 3),
               namespace=read_string(v, 4), annotations=read_map(v, 6),
               runtime_handler=read_string(v, 7))


def _mount(data: bytes) -> Mount:
    v = by_number(data)
    return Mount(read_string(v, 1), read_string(v, 2), read_string(v, 3), read_strings(v, 4))


def _device(data: bytes) -> Device:
    v = by_number(data)
    return Device(read_string(v, 1), read_string(v, 2), read_int(v, 3), read_int(v, 4),
                  _optional(v, 5), _optional(v, 6), _optional(v, 7))


def _hook(data: bytes) -> Hook:
    v = by_number(data)
    timeout = None
    for inner in messages(v, 4):
        timeout = read_int(by_number(inner), 1)
    return Hook(read_string(v, 1), read_strings(v, 2), read_strings(v, 3), timeout)


def decode_container(data: bytes) -> Container:
    v = by_number(data)
    hooks: Dict[str, Tuple[Hook, ...]] = {}
    for raw in messages(v, 10):
        hv = by_number(raw)
        for kind, number in HOOK_FIELDS.items():
            found = tuple(_hook(h) for h in messages(hv, number))
            if found:
                hooks[kind] = found
    devices: Tuple[Device, ...] = ()
    cgroups_path = ""
    for raw in messages(v, 11):
        linux = by_number(raw)
        devices += tuple(_device(d) for d in messages(linux, 2))
        cgroups_path = read_string(linux, 5) or cgroups_path
    return Container(
        id=read_string(v, 1), pod_sandbox_id=read_string(v, 2), name=read_string(v, 3),
        annotations=read_map(v, 6), args=read_strings(v, 7), env=read_strings(v, 8),
        mounts=tuple(_mount(m) for m in messages(v, 9)), hooks=hooks, devices=devices,
        pid=read_int(v, 12, signed=False),
        cdi_devices=tuple(read_string(by_number(d), 1) for d in messages(v, 20)),
        cgroups_path=cgroups_path,
    )


def decode_pod_container(data: bytes) -> Tuple[Pod, Container]:
    """The (pod 1, container 2) of a Create/Start/...ContainerRequest."""
    v = by_number(data)
    pod = next((decode_pod(p) for p in messages(v, 1)), Pod())
    container = next((decode_container(c) for c in messages(v, 2)), Container())
    return pod, container


def decode_state_change(data: bytes) -> Tuple[int, Pod, Container]:
    """(event 1, pod 2, container 3) of a StateChangeEvent."""
    v = by_number(data)
    pod = next((decode_pod(p) for p in messages(v, 2)), Pod())
    container = next((decode_container(c) for c in messages(v, 3)), Container())
    return read_int(v, 1), pod, container


def decode_event(method: str, data: bytes) -> Tuple[int, str, int]:
    """(event, container id, container pid) of a StartContainer or RemoveContainer request
    or a StateChangeEvent, the pod and the rest of the container left undecoded: what the
    plugin needs to find work it holds for the container, paid on every container's start
    and removal (:func:`decode_pod_container` and :func:`decode_state_change` for the
    whole)."""
    v = by_number(data)
    if method == "StateChange":
        event, number = read_int(v, 1), 3
    else:
        event = Event.START_CONTAINER if method == "StartContainer" else Event.REMOVE_CONTAINER
        number = 2
    for raw in messages(v, number):
        c = by_number(raw)
        return event, read_string(c, 1), read_int(c, 12, signed=False)
    return event, "", 0


def decode_configure(data: bytes) -> Dict[str, str]:
    """The ConfigureRequest's runtime name (2), version (3) and NRI version (6)."""
    v = by_number(data)
    return {"runtime": read_string(v, 2), "version": read_string(v, 3),
            "nri": read_string(v, 6)}


def encode_sync_reply(request: bytes) -> bytes:
    """The SynchronizeResponse to ``request``: no updates, and ``more`` (2) echoing the
    request's ``more`` (3), as a plugin that takes a state split over several messages
    must (the engine closes one that does not)."""
    return varint_field(2, read_int(by_number(request), 3))


def encode_register(name: str, index: str) -> bytes:
    return string_field(1, name) + string_field(2, index)


def encode_configure_reply(events: int) -> bytes:
    return varint_field(2, events)


def encode_create_reply(adjust: Adjustment) -> bytes:
    return message_field(1, adjust.encode()) if adjust else b""
