"""What the kubelet allocated to a container: its PodResources API, or its device checkpoint.

Loaded only when ``verify-with: kubelet`` (or the ``kubelet`` allocation source) needs an
answer for a CRI container that claims GPUs; nothing else on the create path imports it,
and ``grpc`` is imported inside :func:`_ask_podresources`.

The PodResources API (kubelet ``v1``, unix socket, gRPC service ``v1.PodResourcesLister``)
is the authority, asked with ``List``: every kubelet since 1.20 serves it (``Get`` needs a feature
gate on older ones), and its answer also names the container a disputed GPU went to. The messages
are few and small, so they are encoded and decoded here, with nvshim's own wire format
(:mod:`nvshim._protobuf`, the NRI plugin's too), rather than generated: no protobuf runtime
to import; their bytes from the socket are read leniently (a field of an unexpected type
skipped, text not UTF-8 replaced), a malformed message is a
:class:`~nvshim._protobuf.WireError` (a host error). The device manager's checkpoint file
(root-written JSON, keyed by pod UID) is read first and grants what it lists for this
container without a gRPC call; see :func:`ask_kubelet` for why that is safe.

IMEX channels: a resource matching ``kubelet-resource-prefixes`` whose name (after the
last ``/``) contains ``imex`` (``nvidia.com/imex-channel``, ``nvidia.com/imex``) holds IMEX
channels, not GPUs; its device ids ``N`` or ``channelN`` name channel ``N`` (other ids are
skipped). They never count as GPU ids, so a channel ``0`` is not GPU 0.

DRA: ``List`` also names each container's ``dynamic_resources`` (Kubernetes Dynamic
Resource Allocation): the claims the kubelet prepared for it, each device with its driver,
pool, device name and CDI device names. They are recorded whatever the driver (the checks
in :mod:`nvshim.runtime.allocation` decide what a claim proves) and are never filtered by
``kubelet-resource-prefixes``, which name device-plugin resources. The checkpoint is the
device manager's and has no DRA claims.

Why one module: it is the kubelet client, and every part serves one answer
(:func:`ask_kubelet`): the PodResources records with their codec beside them (no other
reader), the checkpoint read first, the IMEX rule on resource names, the gRPC call. Loaded
only when the kubelet is asked, it costs no other create anything.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from nvshim._protobuf import Value, by_number, message_field, string_field
from nvshim._record import dataclass, field
from nvshim.errors import HostError
from nvshim.runtime.identity import (
    CONTAINER_NAME,
    SANDBOX_NAME,
    SANDBOX_NAMESPACE,
    SANDBOX_UID,
    Identity,
    identity_of,
)

__all__ = [
    "Identity",
    "Allocation",
    "Claim",
    "ClaimDevice",
    "KubeletUnreachable",
    "identity_of",
    "ask_kubelet",
    "is_imex_resource",
    "SANDBOX_NAME",
    "SANDBOX_NAMESPACE",
    "SANDBOX_UID",
    "CONTAINER_NAME",
    "LIST_METHOD",
    "decode_list_response",
    "encode_list_response",
]

LIST_METHOD = "/v1.PodResourcesLister/List"


class KubeletUnreachable(HostError):
    """Neither the PodResources socket nor the checkpoint gave an answer."""


@dataclass(frozen=True)
class ClaimDevice:
    """One device of a DRA claim: ``driver``/``pool``/``device`` name it at the DRA level,
    ``cdi_devices`` are the fully qualified CDI names the engine injects for it."""

    driver: str
    pool: str
    device: str
    cdi_devices: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Claim:
    """A DRA resource claim the kubelet prepared for a container."""

    namespace: str
    name: str
    devices: Tuple[ClaimDevice, ...] = ()

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def cdi_devices(self) -> Tuple[str, ...]:
        return tuple(dict.fromkeys(n for d in self.devices for n in d.cdi_devices))


@dataclass(frozen=True)
class Allocation:
    """The device ids the kubelet gave this container, and whom it gave other ids to."""

    ids: Tuple[str, ...]
    via: str
    """``podresources`` or ``checkpoint``."""
    others: Mapping[str, str] = field(default_factory=dict)
    """device id → ``namespace/pod/container`` of another container holding it (when known)."""
    imex: Tuple[int, ...] = ()
    """The IMEX channels the kubelet gave this container (resources named ``*imex*``)."""
    imex_others: Mapping[int, str] = field(default_factory=dict)
    """IMEX channel → the other container holding it (when known)."""
    claims: Tuple[Claim, ...] = ()
    """The DRA claims the kubelet lists for this container, every driver's (the API only)."""
    cdi_others: Mapping[str, str] = field(default_factory=dict)
    """CDI device name of another container's DRA claim → that container."""

    @property
    def cdi_devices(self) -> Tuple[str, ...]:
        """The CDI device names of this container's DRA claims, in the kubelet's order."""
        return tuple(dict.fromkeys(n for c in self.claims for n in c.cdi_devices))


# --- PodResources messages (field numbers from kubelet's pkg/apis/podresources/v1/api.proto)

Fields = Mapping[int, List[Value]]


def _all_bytes(fields: Fields, number: int) -> List[bytes]:
    return [v for v in fields.get(number, []) if isinstance(v, bytes)]


def _all_str(fields: Fields, number: int) -> List[str]:
    return [v.decode("utf-8", errors="replace") for v in _all_bytes(fields, number)]


def _first_str(fields: Fields, number: int) -> str:
    values = _all_str(fields, number)
    return values[-1] if values else ""  # proto3: the last occurrence of a scalar wins


Devices = List[Tuple[str, Tuple[str, ...]]]
"""(resource name, device ids) per ContainerDevices."""
ContainerRecord = Tuple[str, Devices, Tuple[Claim, ...]]
"""(container name, device-plugin devices, DRA claims)."""
PodRecord = Tuple[str, str, List[ContainerRecord]]
"""(pod name, namespace, containers)."""


def _container_devices(buf: bytes) -> Tuple[str, Tuple[str, ...]]:
    """ContainerDevices{resource_name = 1, repeated device_ids = 2, topology = 3}."""
    f = by_number(buf)
    return _first_str(f, 1), tuple(_all_str(f, 2))


def _claim_device(buf: bytes) -> ClaimDevice:
    """ClaimResource{repeated CDIDevice cdi_devices = 1, driver_name = 2, pool_name = 3,
    device_name = 4, optional share_id = 5}; CDIDevice{name = 1}."""
    f = by_number(buf)
    names = tuple(_first_str(by_number(b), 1) for b in _all_bytes(f, 1))
    return ClaimDevice(
        _first_str(f, 2), _first_str(f, 3), _first_str(f, 4), tuple(n for n in names if n)
    )


def _claim(buf: bytes) -> Claim:
    """DynamicResource{claim_name = 2, claim_namespace = 3, repeated claim_resources = 4}
    (1 was class_name, removed in Kubernetes 1.31)."""
    f = by_number(buf)
    return Claim(
        _first_str(f, 3), _first_str(f, 2), tuple(_claim_device(b) for b in _all_bytes(f, 4))
    )


def _container(buf: bytes) -> ContainerRecord:
    """ContainerResources{name = 1, repeated devices = 2, cpu_ids = 3, memory = 4,
    repeated dynamic_resources = 5}."""
    f = by_number(buf)
    return (
        _first_str(f, 1),
        [_container_devices(b) for b in _all_bytes(f, 2)],
        tuple(_claim(b) for b in _all_bytes(f, 5)),
    )


def _pod(buf: bytes) -> PodRecord:
    """PodResources{name = 1, namespace = 2, repeated containers = 3}."""
    f = by_number(buf)
    containers = [_container(b) for b in _all_bytes(f, 3)]
    return _first_str(f, 1), _first_str(f, 2), containers


def decode_list_response(buf: bytes) -> List[PodRecord]:
    """ListPodResourcesResponse{repeated pod_resources = 1}."""
    return [_pod(b) for b in _all_bytes(by_number(buf), 1)]


def encode_list_response(pods: Sequence[PodRecord]) -> bytes:
    """The inverse of :func:`decode_list_response` (test servers speak the real API with it)."""
    return b"".join(message_field(1, _encode_pod(p)) for p in pods)


def _encode_pod(pod: PodRecord) -> bytes:
    name, namespace, containers = pod
    out = string_field(1, name) + string_field(2, namespace)
    for cname, devices, claims in containers:
        inner = string_field(1, cname)
        for resource, ids in devices:
            dev = string_field(1, resource)
            # repeated: an empty id is an element, written (string_field skips proto3 defaults)
            dev += b"".join(message_field(2, i.encode("utf-8")) for i in ids)
            inner += message_field(2, dev)
        inner += b"".join(message_field(5, _encode_claim(c)) for c in claims)
        out += message_field(3, inner)
    return out


def _encode_claim(claim: Claim) -> bytes:
    out = string_field(2, claim.name) + string_field(3, claim.namespace)
    for device in claim.devices:
        inner = b"".join(message_field(1, string_field(1, n)) for n in device.cdi_devices)
        inner += (
            string_field(2, device.driver)
            + string_field(3, device.pool)
            + string_field(4, device.device)
        )
        out += message_field(4, inner)
    return out


# --- asking -------------------------------------------------------------------------------


_CHANNEL_ID = re.compile(r"(?:channel)?([0-9]{1,7})")  # fullmatch: "$" would take "1\n"


def is_imex_resource(resource: str) -> bool:
    """Whether a kubelet resource name holds IMEX channels rather than GPUs."""
    return "imex" in resource.rsplit("/", 1)[-1].lower()


class _Collect:
    """Device ids sorted into this container's and other containers', GPUs and IMEX channels."""

    def __init__(self, prefixes: Sequence[str]) -> None:
        self.prefixes = prefixes
        self.mine: List[str] = []
        self.others: Dict[str, str] = {}
        self.imex: List[int] = []
        self.imex_others: Dict[int, str] = {}
        self.claims: List[Claim] = []
        self.cdi_others: Dict[str, str] = {}

    def add_claims(self, claims: Sequence[Claim], mine: bool, holder: str) -> None:
        """DRA claims: every driver's (no prefix filter: they are not device-plugin resources)."""
        if mine:
            self.claims.extend(claims)
            return
        for claim in claims:
            for name in claim.cdi_devices:
                self.cdi_others.setdefault(name, holder)

    def add(self, resource: str, ids: Sequence[str], mine: bool, holder: str) -> None:
        if not any(resource.startswith(p) for p in self.prefixes):
            return
        if not is_imex_resource(resource):
            if mine:
                self.mine.extend(ids)
            else:
                for i in ids:
                    self.others.setdefault(i, holder)
            return
        for i in ids:
            match = _CHANNEL_ID.fullmatch(i)
            if match is None:
                continue
            channel = int(match.group(1))
            if mine:
                self.imex.append(channel)
            else:
                self.imex_others.setdefault(channel, holder)

    def allocation(self, via: str) -> Allocation:
        return Allocation(
            tuple(dict.fromkeys(self.mine)),
            via,
            self.others,
            tuple(dict.fromkeys(self.imex)),
            self.imex_others,
            tuple(dict.fromkeys(self.claims)),
            self.cdi_others,
        )


def _from_pods(
    pods: Sequence[PodRecord], who: Identity, prefixes: Sequence[str], via: str
) -> Allocation:
    found = _Collect(prefixes)
    for name, namespace, containers in pods:
        for cname, devices, claims in containers:
            mine = (namespace, name, cname) == (who.namespace, who.pod, who.container)
            holder = f"{namespace}/{name}/{cname}"
            for resource, ids in devices:
                found.add(resource, ids, mine, holder)
            found.add_claims(claims, mine, holder)
    return found.allocation(via)


#: Whether this process is resident (``nvshim agent``, set by
#: :func:`nvshim.agent.daemon.run_agent` before its threads start): see :func:`set_resident`.
_RESIDENT = [False]


def set_resident(resident: bool) -> None:
    """Say that this process is resident (a daemon serving creates from its threads) or
    a one-shot create. A resident process's calls leave fd 2 and the environment alone:
    a thread of a daemon changes no process state, and its fd 2 is its own log, where
    gRPC's lines belong."""
    _RESIDENT[0] = resident


def _ask_podresources(socket: str, timeout: float) -> Optional[List[PodRecord]]:
    """Every pod's resources from ``List``; None when the kubelet does not answer."""
    import os

    if not os.path.exists(socket):
        return None
    if _RESIDENT[0]:
        return _list_pods(socket, timeout)
    # gRPC's C core logs to fd 2 (errors always; everything with GRPC_VERBOSITY/GRPC_TRACE
    # in the engine's environment), also from its own threads after the channel is closed.
    # During a create, fd 2 is the container's stderr: the engine hands runc the
    # container's stdio, so a log line would land in the container's log. gRPC reads its
    # settings once, when it starts: it starts with logging off (GRPC_VERBOSITY=NONE, no
    # GRPC_TRACE) and with fd 2 on /dev/null; both are put back before we go on, so runc
    # gets the environment and stderr we were given. Only a one-shot process does this.
    env = {name: os.environ.get(name) for name in ("GRPC_VERBOSITY", "GRPC_TRACE")}
    os.environ["GRPC_VERBOSITY"] = "NONE"
    os.environ.pop("GRPC_TRACE", None)
    quiet = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    saved = os.dup(2)  # non-inheritable: never reaches runc
    os.dup2(quiet, 2)
    try:
        return _list_pods(socket, timeout)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(quiet)
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _list_pods(socket: str, timeout: float) -> Optional[List[PodRecord]]:
    """PodResources ``List`` over gRPC; None when the kubelet does not answer."""
    import grpc

    with grpc.insecure_channel(f"unix://{socket}") as channel:
        lister = channel.unary_unary(
            LIST_METHOD, request_serializer=_same, response_deserializer=decode_list_response
        )
        try:
            listed: List[PodRecord] = lister(b"", timeout=timeout)
        except grpc.RpcError:
            return None
        return listed


def _same(data: bytes) -> bytes:
    return data


def read_checkpoint(path: str, who: Identity, prefixes: Sequence[str]) -> Optional[Allocation]:
    """The device manager checkpoint's entries; None when the file is missing or unreadable.

    ``Data.PodDeviceEntries[]{PodUID, ContainerName, ResourceName, DeviceIDs}`` where
    DeviceIDs maps NUMA node → ids (older kubelets: a plain list). The checksum is the
    kubelet's hash of its Go structure and is not checked: the file is root-written.
    """
    try:
        with open(path, "rb") as fh:
            doc = json.load(fh)
    except (OSError, ValueError, RecursionError):  # RecursionError: nested past the limit
        return None
    data = doc.get("Data") if isinstance(doc, dict) else None
    entries = data.get("PodDeviceEntries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None
    found = _Collect(prefixes)
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        resource = entry.get("ResourceName")
        if not isinstance(resource, str):
            continue
        raw = entry.get("DeviceIDs")
        groups: List[Any] = list(raw.values()) if isinstance(raw, dict) else [raw]
        ids = [i for g in groups if isinstance(g, list) for i in g if isinstance(i, str)]
        mine = entry.get("PodUID") == who.pod_uid and entry.get("ContainerName") == who.container
        found.add(resource, ids, mine, f"pod {entry.get('PodUID')}/{entry.get('ContainerName')}")
    return found.allocation("checkpoint")


def ask_kubelet(who: Identity, config: Any, *, fresh: bool = False) -> Allocation:
    """This container's GPU device ids and IMEX channels: the checkpoint when it has them,
    else the PodResources API.

    The checkpoint is read first (a small JSON file): when it lists devices for this
    very container (pod UID and container name) they are its allocation, and no gRPC call is
    made — ``import grpc`` alone is costly (BENCHMARKS.md). The kubelet writes those
    entries when it
    allocates, before the container is created, and a pod UID is never reused, so an entry
    can only be this container's own. The checkpoint proves grants; it never has the last
    word on a refusal: with ``fresh`` (a claim the checkpoint did not cover), or when it has
    no entry for the container, the PodResources API is asked, and the checkpoint answers
    only when the socket does not. DRA claims are the API's alone (the checkpoint is the
    device manager's): a GPU only a claim covers is such a refusal, asked again with ``fresh``.
    """
    prefixes = tuple(config.kubelet_resource_prefixes)
    saved = None
    if config.kubelet_checkpoint and who.pod_uid:
        saved = read_checkpoint(config.kubelet_checkpoint, who, prefixes)
        if saved is not None and (saved.ids or saved.imex) and not fresh:
            return saved
    pods = _ask_podresources(config.kubelet_socket, float(config.kubelet_timeout))
    if pods is not None:
        return _from_pods(pods, who, prefixes, "podresources")
    if saved is not None:
        return saved
    tried = f"PodResources socket {config.kubelet_socket}"
    if config.kubelet_checkpoint:
        tried += f", checkpoint {config.kubelet_checkpoint}"
    raise KubeletUnreachable(f"cannot ask the kubelet what {who} was allocated (tried {tried})")
