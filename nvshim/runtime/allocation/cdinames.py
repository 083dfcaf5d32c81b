"""What each CDI name injects on this node, by device number: the record ``verify-with:
kubelet`` holds every CDI name nvshim injects to, and the DRA claims a grant came through.

A CDI name is a device-plugin id (``/var/run/nvidia-container-devices/cdi/…`` mounts, CDI
annotations) or the CDI device of a DRA claim; whatever its spec calls the device, what it
gives the container is its device nodes. Each is matched by number, as the engine's
injection is (:mod:`nvshim.runtime.engine`): a GPU or MIG device of this node, an IMEX
channel, or another node. :func:`cdi_refusal` refuses a name injected by nvshim that the
kubelet's record does not cover: its GPUs and MIG devices are checked by
:func:`nvshim.runtime.allocation.policy.check_allocated`, its IMEX channels must be the
container's, and a name that brings neither (another vendor's device, a NIC of another
pod's DRA claim in ``/var/run/cdi``) or brings a node that is no NVIDIA driver's beside
its GPU must be a CDI device of one of the container's own DRA claims.

Loaded only under require-allocation with the kubelet's record in hand.
"""

from __future__ import annotations

from nvshim._record import dataclass

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Collection, Dict, List, Optional, Sequence, Tuple, Union

    from nvshim.config import Config
    from nvshim.host.discovery import Host
    from nvshim.runtime.allocation.kubelet import Allocation
    from nvshim.runtime.identity import Identity

__all__ = ["NameDevices", "resolve_names", "cdi_refusal", "claim_gpus", "DRM_MAJOR"]

#: The DRM subsystem's major (``/dev/dri/card*``, ``renderD*``): a GPU's display and render
#: nodes, which GPU CDI specs inject beside ``/dev/nvidiaN``.
DRM_MAJOR = 226


@dataclass(frozen=True)
class NameDevices:
    """The devices one CDI name injects, matched to this node by number."""

    gpus: Tuple[Tuple[str, str], ...] = ()
    """(``GPU 0`` / ``MIG device 0:1``, UUID) of each GPU and MIG device."""
    imex: Tuple[int, ...] = ()
    """IMEX channel numbers."""
    others: Tuple[Tuple[str, int, int], ...] = ()
    """(container path, major, minor) of each node that is none of the above and no node
    of the NVIDIA driver or of DRM (another vendor's device)."""
    paths: Tuple[str, ...] = ()
    """Every device node's container path, for messages."""

    @property
    def found(self) -> Tuple[Tuple[str, str], ...]:
        """(label, key) of each GPU, MIG device (key: UUID) and IMEX channel (``channelN``)."""
        return self.gpus + tuple((f"IMEX channel {c}", f"channel{c}") for c in self.imex)


def resolve_names(
    host: Host, config: Config, names: Sequence[str]
) -> Dict[str, Union[str, NameDevices]]:
    """CDI name → its :class:`NameDevices`, or why it cannot be known (not in
    ``cdi-spec-dirs``).

    Resolved as a create resolves CDI names (the spec index), one name at a time so that
    each is judged on its own; a device node the spec gives without numbers has its host
    node's (as CDI fills them in), one it cannot stat matches nothing.
    """
    if not names:
        return {}
    from nvshim.cdi import index as cdiindex
    from nvshim.cdi.registry import resolve_devices
    from nvshim.config import cdi_index_path, config_path
    from nvshim.errors import CdiError
    from nvshim.host.discovery import Host as Probe
    from nvshim.runtime.engine import char_majors, gpus_of_numbers, nvidia_majors

    searched = ", ".join(config.cdi_spec_dirs) or "no cdi-spec-dirs"
    try:
        registry, _ = cdiindex.registry_for(
            config.cdi_spec_dirs, names, cdi_index_path(config.source or config_path()), False
        )
    except CdiError as exc:
        return {name: f"not resolved: {exc}" for name in names}
    probe = Probe("/", "/")  # CDI hostPaths are absolute host paths
    gpus = host.gpus()
    majors = char_majors(config.driver_root) or {}
    imex_major = (nvidia_majors(config.driver_root) or (None, None, None))[2]
    # the NVIDIA driver's nodes (also the GPUs' own, should /proc/devices be unreadable)
    nvidia = (
        {m for n, m in majors.items() if n.startswith("nvidia")}
        | {DRM_MAJOR}
        | {g.node.major for g in gpus if g.node is not None and g.node.major is not None}
    )
    out: Dict[str, Union[str, NameDevices]] = {}
    for name in names:
        try:
            nodes = resolve_devices(registry, [name]).device_nodes
        except CdiError:
            out[name] = f"not in cdi-spec-dirs {searched}"
            continue
        numbers = set()
        others: List[Tuple[str, int, int]] = []
        for node in nodes:
            major, minor = node.major, node.minor
            if major is None:
                probed = probe.device_node(node.source)
                major, minor = (probed.major, probed.minor) if probed else (None, None)
            if major is None or minor is None:
                continue
            numbers.add((major, minor))
            if major not in nvidia:
                others.append((node.path, major, minor))
        whole, migs = gpus_of_numbers(gpus, numbers)
        out[name] = NameDevices(
            tuple((f"GPU {g.index}", g.uuid) for g in whole)
            + tuple((f"MIG device {p.index}:{m.index}", m.uuid) for p, m in migs),
            tuple(sorted(minor for major, minor in numbers if major == imex_major)),
            tuple(others),
            tuple(dict.fromkeys(n.path for n in nodes)),
        )
    return out


def cdi_refusal(
    identity: Optional[Identity],
    allocation: Allocation,
    names: Sequence[str],
    resolved: Dict[str, Union[str, NameDevices]],
    source: str,
) -> Optional[str]:
    """The line refusing the first CDI name (of ``names``, injected by nvshim) the
    kubelet's record for this container does not cover; None when it covers all.

    Covered: a CDI device of one of the container's DRA claims, or a name whose IMEX
    channels the kubelet allocated to it and that brings a GPU or MIG device
    (:func:`~nvshim.runtime.allocation.policy.check_allocated` checks those) or an IMEX
    channel, and no other vendor's node.
    """
    own = set(allocation.cdi_devices)
    via = f"claimed through {source}, checked via {allocation.via}"
    for name in names:
        if name in own:
            continue
        found = resolved.get(name, "not resolved")
        if isinstance(found, str):
            return (
                f'CDI device "{name}" cannot be matched to this node\'s devices ({found}): '
                f"the kubelet's record for {identity} cannot cover it ({via})"
            )
        for channel in found.imex:
            if channel in allocation.imex:
                continue
            holder = allocation.imex_others.get(channel)
            why = (
                f"the kubelet gave it to {holder}"
                if holder
                else f"the kubelet allocated IMEX channels "
                f"{', '.join(map(str, allocation.imex)) or 'none'} to {identity}"
            )
            return (
                f'IMEX channel {channel} (CDI device "{name}") is not this container\'s '
                f"allocation: {why} ({via})"
            )
        holder = allocation.cdi_others.get(name)
        if found.others or not (found.gpus or found.imex):
            if found.others:
                path, major, minor = found.others[0]
                what = f"{path} ({major}:{minor}), no device of the NVIDIA driver" + (
                    f", beside {found.gpus[0][0]}" if found.gpus else ""
                )
            else:
                what = (
                    f"{', '.join(found.paths) or 'no device node'}: no GPU, MIG device or "
                    "IMEX channel"
                )
            why = (
                f"the kubelet gave it to {holder}"
                if holder
                else f"no DRA claim the kubelet lists for {identity} has it"
            )
            return (
                f'CDI device "{name}" injects {what}, and is not this container\'s '
                f"allocation: {why} ({via})"
            )
    return None


def claim_gpus(
    host: Host, config: Config, allocation: Allocation, granted: Collection[str]
) -> Tuple[Tuple[str, Tuple[str, ...]], ...]:
    """(``namespace/claim``, the ``granted`` UUIDs its CDI devices inject) for each DRA
    claim of the container that injects one: the grant journal records them, and a GPU
    that every live holder got through one shared claim is no conflict."""
    if not allocation.claims:
        return ()
    resolved = resolve_names(host, config, allocation.cdi_devices)
    out = []
    for claim in allocation.claims:
        uuids = [
            uuid
            for name in claim.cdi_devices
            for found in (resolved.get(name),)
            if isinstance(found, NameDevices)
            for _, uuid in found.gpus
            if uuid in granted
        ]
        if uuids:
            out.append((str(claim), tuple(dict.fromkeys(uuids))))
    return tuple(out)
