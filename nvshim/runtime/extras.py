"""Devices next to the GPUs: IMEX channels, NVSwitch, GPUDirect Storage, MOFED, gdrcopy.

Multi-node training needs more than GPUs. What a container asks for, and what it gets:

==============  ==============================  =============================================
request          how                             injected (when the node has it)
==============  ==============================  =============================================
IMEX channels   ``NVIDIA_IMEX_CHANNELS=0,3``    ``/dev/nvidia-caps-imex-channels/channel<N>``
                (``N`` or ``channelN``), or the
                device plugin's ``/dev/null``
                mounts ``.../imex/<N>``
NVSwitch        ``NVIDIA_NVSWITCH=enabled``     ``/dev/nvidia-nvswitchctl``,
                                                ``/dev/nvidia-nvswitch<N>``
GDS             ``NVIDIA_GDS=enabled``          ``/dev/nvidia-fs*``, ``/etc/cufile.json`` (ro)
MOFED           ``NVIDIA_MOFED=enabled``        ``/dev/infiniband/uverbs*``,
                                                ``/dev/infiniband/rdma_cm``
gdrcopy         ``NVIDIA_GDRCOPY=enabled``      ``/dev/gdrdrv``
==============  ==============================  =============================================

Never otherwise, and no more: the sets are the reference's (its MOFED discoverer takes the
verbs nodes and rdma_cm, never ``umad*`` or ``issm*``, with which a process can act as the
fabric's subnet manager; its NVSwitch discoverer the switch nodes; the fabric manager's
socket comes with the ``utility`` capability, not with this flag). The feature flags apply
only to containers that were granted GPUs (or driver files); under require-allocation
only those in ``require-allocation-features`` (default GDS and gdrcopy): no allocation
covers the node's NICs or switches, so a pod holding one GPU must not reach them all by
setting a variable. IMEX channels are scarce and
allocated like GPUs: the device plugin's mounts win over the env; under require-allocation
the env counts only through the ``privileged`` allocation source (a privileged container),
and the mounts only through ``volume-mounts``. A lone ``all`` in the env is ignored, as the
reference does. Channel numbers are 0 to 2^20-1 and must exist on the node.

:func:`resolve_extras` is pure (the claim and config in, a record out);
:func:`extras_edits` reads the node (device nodes are stat'ed under the dev root).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from nvshim._record import dataclass, field, replace
from nvshim.edits import RO_BIND, DeviceNode, Edits, Mount
from nvshim.errors import HostError, RequestError
from nvshim.runtime.claim import FEATURE_ENV, IMEX_ENV

if TYPE_CHECKING:
    from nvshim.config import Config
    from nvshim.host.discovery import Host
    from nvshim.runtime.claim import Claim
    from nvshim.runtime.engine import EngineGrant
    from nvshim.runtime.request import Request

__all__ = [
    "FEATURE_ENV",
    "IMEX_DIR",
    "IMEX_ENV",
    "Extras",
    "ExtrasEdits",
    "extras_edits",
    "generate_imex_spec",
    "imex_channels",
    "resolve_extras",
    "without_env_channels",
]

IMEX_DIR = "/dev/nvidia-caps-imex-channels"
MAX_IMEX_CHANNEL = 2**20 - 1
_CHANNEL = re.compile(r"(?:channel)?([0-9]{1,7})")  # fullmatch: "$" would take "1\n"
_NVSWITCH = re.compile(r"^nvidia-nvswitch([0-9]+|ctl)$")
_NVIDIA_FS = re.compile(r"^nvidia-fs[0-9]*$")
#: The InfiniBand nodes MOFED gives (the reference's set): verbs and the RDMA connection
#: manager; ``umad<N>`` and ``issm<N>`` (management datagrams, the subnet manager's port)
#: never.
_MOFED = re.compile(r"^(uverbs[0-9]+|rdma_cm)$")


@dataclass(frozen=True)
class Extras:
    """What a container gets besides GPUs: feature names, IMEX channel numbers, why."""

    features: Tuple[str, ...] = ()
    imex_channels: Tuple[int, ...] = ()
    imex_source: str = ""
    notes: Tuple[str, ...] = field(default=())

    def __bool__(self) -> bool:
        return bool(self.features or self.imex_channels)


def _parse_channels(tokens: Sequence[str], where: str) -> Tuple[int, ...]:
    channels: Dict[int, None] = {}
    for token in tokens:
        match = _CHANNEL.fullmatch(token)
        number = int(match.group(1)) if match else -1
        if not 0 <= number <= MAX_IMEX_CHANNEL:
            raise RequestError(
                f'IMEX channel "{token}" in {where}: expected a number 0-{MAX_IMEX_CHANNEL} '
                'or "channel<N>"'
            )
        channels.setdefault(number, None)
    return tuple(channels)


def _env_channels(value: str, notes: List[str]) -> Tuple[int, ...]:
    tokens = [t.strip() for t in value.split(",") if t.strip()]
    lowered = [t.lower() for t in tokens]
    if not tokens or "void" in lowered or "none" in lowered:
        return ()
    if "all" in lowered:
        notes.append(f"{IMEX_ENV}=all ignored: IMEX channels are requested by number")
        return ()
    return _parse_channels(tokens, IMEX_ENV)


def resolve_extras(claim: Claim, config: Config, request: Request) -> Extras:
    """Decide the extras for a container that claims ``claim`` and whose GPU request
    resolved to ``request``; pure."""
    view = claim.view
    if view.sandbox:
        return Extras()
    notes: List[str] = []
    features = []
    for name, variable in FEATURE_ENV.items():
        value = view.get(variable)
        if value is None or value.strip().lower() != "enabled":
            continue
        if not request.injects:
            notes.append(f"{variable}=enabled ignored: the container was granted no GPU")
        elif config.require_allocation and name not in config.require_allocation_features:
            notes.append(
                f"{variable}=enabled ignored: require-allocation is on and {name} is "
                "not in require-allocation-features (no allocation covers the "
                f"node's {name} devices)"
            )
        else:
            features.append(name)

    channels: Tuple[int, ...] = ()
    source = ""
    mount_ids = claim.imex_mount_ids
    env_value = claim.imex_env
    mounts_ok = not config.require_allocation or "volume-mounts" in config.allocation_sources
    if mount_ids and mounts_ok:
        channels, source = _parse_channels(mount_ids, "device-plugin mounts"), "volume-mounts"
        if env_value:
            notes.append(f"{IMEX_ENV} ignored: device-plugin IMEX mounts take precedence")
    elif mount_ids:
        notes.append(
            "device-plugin IMEX mounts ignored: require-allocation is on and "
            "volume-mounts is not an allocation source"
        )
    if not source and env_value is not None:
        wanted = _env_channels(env_value, notes)
        if wanted and config.require_allocation:
            if "privileged" in config.allocation_sources and view.privileged_with_devices:
                channels, source = wanted, "privileged"
            else:
                notes.append(
                    f"{IMEX_ENV}={env_value} ignored: require-allocation is on and "
                    "no IMEX allocation was found (device-plugin imex/ mounts, or a "
                    "privileged container with the privileged source)"
                )
        elif wanted and not view.privileged and not config.accept_envvar_when_unprivileged:
            notes.append(
                f"{IMEX_ENV} ignored: container is unprivileged and "
                "accept-envvar-when-unprivileged is off"
            )
        elif wanted:
            channels, source = wanted, "env"
    return Extras(tuple(features), channels, source, tuple(notes))


def without_env_channels(extras: Extras, grant: EngineGrant, value: Optional[str]) -> Extras:
    """``extras`` without the IMEX channels image env
    (``value`` of NVIDIA_IMEX_CHANNELS) asked for beside the engine's, and a note saying so:
    image env never widens an engine grant (engine-grants: exclusive)."""
    if extras.imex_source != "env":
        return extras
    note = (
        f"NVIDIA_IMEX_CHANNELS={value} adds no IMEX channel: the engine injected channel "
        f"{', '.join(map(str, grant.imex))} into config.json, which is the container's "
        "grant; image env never widens an engine grant (engine-grants: exclusive)"
    )
    return replace(extras, imex_channels=(), imex_source="", notes=(*extras.notes, note))


def _list_dev(host: Host, directory: str) -> List[str]:
    path = host.dev_path(directory)
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise HostError(f"cannot list {path}: {exc.strerror}") from exc


def imex_channels(host: Host) -> Tuple[int, ...]:
    """The IMEX channel numbers whose nodes exist under the host's dev root."""
    found = []
    for name in _list_dev(host, IMEX_DIR):
        match = re.match(r"^channel([0-9]+)$", name)
        if match:
            found.append(int(match.group(1)))
    return tuple(sorted(found))


def _nodes(host: Host, paths: List[str]) -> Tuple[DeviceNode, ...]:
    out = []
    for path in paths:
        node = host.device_node(path)
        if node is not None:
            out.append(node)
    return tuple(out)


def _feature_edits(host: Host, feature: str) -> Edits:
    if feature == "nvswitch":
        names = [n for n in _list_dev(host, "/dev") if _NVSWITCH.match(n)]
        return Edits(device_nodes=_nodes(host, [f"/dev/{n}" for n in names]))
    if feature == "gds":
        names = [n for n in _list_dev(host, "/dev") if _NVIDIA_FS.match(n)]
        cufile: Tuple[Mount, ...] = ()
        if os.path.isfile(host.host_path("/etc/cufile.json")):
            cufile = (Mount(host.host_path("/etc/cufile.json"), "/etc/cufile.json", None, RO_BIND),)
        return Edits(device_nodes=_nodes(host, [f"/dev/{n}" for n in names]), mounts=cufile)
    if feature == "mofed":
        names = [n for n in _list_dev(host, "/dev/infiniband") if _MOFED.match(n)]
        return Edits(device_nodes=_nodes(host, [f"/dev/infiniband/{n}" for n in names]))
    return Edits(device_nodes=_nodes(host, ["/dev/gdrdrv"]))


@dataclass(frozen=True)
class ExtrasEdits:
    """What :func:`extras_edits` gives: the edits, and a note per feature the node lacks."""

    edits: Edits = field(default_factory=Edits)
    notes: Tuple[str, ...] = ()


def extras_edits(host: Host, extras: Extras) -> ExtrasEdits:
    """The device nodes (and mounts) for ``extras`` on ``host``.

    A requested IMEX channel the node lacks is a :class:`RequestError`; a feature whose
    devices the node lacks adds a note and nothing else.
    """
    edits = Edits()
    if extras.imex_channels:
        present = imex_channels(host)
        for channel in extras.imex_channels:
            if channel not in present:
                have = ", ".join(map(str, present)) if present else "none"
                raise RequestError(
                    f"IMEX channel {channel} (from {extras.imex_source}) does not exist: this "
                    f"node has channels {have} under {host.dev_path(IMEX_DIR)}"
                )
        edits = edits + Edits(
            device_nodes=_nodes(host, [f"{IMEX_DIR}/channel{c}" for c in extras.imex_channels])
        )
    notes = []
    for feature in extras.features:
        found = _feature_edits(host, feature)
        if not found.device_nodes:
            notes.append(f"{FEATURE_ENV[feature]}=enabled: this node has no {feature} devices")
        edits = edits + found
    return ExtrasEdits(edits, tuple(notes))


def generate_imex_spec(host: Host, vendor: str = "nvidia.com") -> Dict[str, Any]:
    # Any: a CDI spec document, JSON values of every shape
    """A CDI spec of kind ``<vendor>/imex-channel``: one device per channel on the node."""
    from nvshim.cdi.write import spec_to_dict
    from nvshim.errors import CdiError

    channels = imex_channels(host)
    if not channels:
        raise CdiError(
            f"no IMEX channels under {host.dev_path(IMEX_DIR)}: nothing to put in a CDI spec"
        )
    devices = [
        (str(c), Edits(device_nodes=_nodes(host, [f"{IMEX_DIR}/channel{c}"]))) for c in channels
    ]
    return spec_to_dict(f"{vendor}/imex-channel", devices, Edits())
