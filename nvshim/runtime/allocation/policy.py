"""require-allocation beyond choosing a source: the kubelet's record and the pod's annotations.

Loaded only under ``require-allocation`` when the kubelet is to be asked or an annotation
claim must be told apart from the pod's own annotations (a default create never imports
it). :func:`ask_kubelet_if_needed` fetches what the kubelet allocated to this CRI
container, :func:`pod_annotations` reads the pod sandbox's spec, and
:func:`check_allocated` / :func:`check_imex_allocated` refuse any granted GPU, MIG device
or IMEX channel the kubelet's record lacks. :func:`check_engine_allocated` does the same
for the devices the engine injected itself (CDI through containerd 1.7+/CRI-O, Kubernetes
DRA): the kubelet lists them as device-plugin ids, or as the CDI devices of a DRA claim.
"""

from __future__ import annotations

import os

from nvshim import _jsonc
from nvshim.errors import RequestError
from nvshim.runtime.request import SANDBOX_ANNOTATION, identity_of
from nvshim.runtime.tokens import parse_visible_devices, select_gpus

TYPE_CHECKING = False  # typing costs ~4 ms to import on the create path
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

    from nvshim.config import Config
    from nvshim.runtime.request import Claim

    Plan = Any  # nvshim.runtime.create.Plan (create imports this module: no import back)

__all__ = ["ask_kubelet_if_needed", "pod_annotations", "check_allocated",
           "check_imex_allocated", "check_engine_allocated", "node_gpu_ids"]


def ask_kubelet_if_needed(claim: Claim, config: Config) -> Tuple[Any, Any, str, List[str]]:
    """(identity, allocation, verified, notes): the kubelet's record when config needs it.

    Asked only under require-allocation with ``verify-with: kubelet`` or the ``kubelet``
    source, for a CRI container that claims a GPU or an IMEX channel. Unreachable:
    ``kubelet-unreachable`` decides (fail the create, or trust the claims and say so).
    """
    identity = identity_of(claim.view.annotations)
    wants = config.verify_with == "kubelet" or "kubelet" in config.allocation_sources
    if not (config.require_allocation and wants
            and (claim.claims_gpus or claim.claims_imex)):
        return identity, None, "none", []
    from nvshim.runtime.allocation.kubelet import KubeletUnreachable, ask_kubelet

    if identity is None:
        return None, None, "none", [
            "not a CRI container (no io.kubernetes.cri.* annotations): the kubelet has no "
            "record of it, claims are judged by allocation-sources alone"
        ]
    try:
        return identity, ask_kubelet(identity, config), "kubelet", []
    except KubeletUnreachable as exc:
        if config.kubelet_unreachable == "fail":
            raise RequestError(
                f"{exc}; refusing the claim (kubelet-unreachable: fail)") from exc
        return identity, None, "unreachable", [
            f"{exc}; GPU claims trusted unverified (kubelet-unreachable: trust-claims)"
        ]


def pod_annotations(bundle: str, claim: Claim, config: Config) -> Optional[Dict[str, str]]:
    """The annotations of this CRI container's pod sandbox spec; None when unknown.

    containerd copies a pod's pass-through annotations into the sandbox's spec and into
    every container's; the device plugin's (container) annotations only into the
    container's. Under containerd's runc shim the sandbox's bundle is the sibling
    directory named by ``io.kubernetes.cri.sandbox-id``. Read only under
    require-allocation for a container that carries an annotation claim.
    """
    if not config.require_allocation or not claim.annotation_keys:
        return None  # (a sandbox's claim has no annotation keys)
    sandbox_id = claim.view.annotations.get("io.kubernetes.cri.sandbox-id", "")
    if not sandbox_id or "/" in sandbox_id or sandbox_id in (".", ".."):
        return None
    path = os.path.join(os.path.dirname(os.path.abspath(bundle)), sandbox_id, "config.json")
    try:
        with open(path, "rb") as fh:
            spec = _jsonc.loads(fh.read())
    except (OSError, ValueError):
        return None
    notes = spec.get("annotations") if isinstance(spec, dict) else None
    if not isinstance(notes, dict) or notes.get(SANDBOX_ANNOTATION) != "sandbox" \
            or notes.get("io.kubernetes.cri.sandbox-id") != sandbox_id:
        return None
    return {k: v for k, v in notes.items() if isinstance(k, str) and isinstance(v, str)}


def _devices_of(ident: str, refs: Sequence[Any]) -> Tuple[str, ...]:
    """UUIDs of the GPUs and MIG devices one kubelet device id names on this node; ``()`` for
    an id that names none (another resource's device, an SR-IOV NIC's PCI address, …)."""
    tokens = parse_visible_devices(ident)
    if not tokens or tokens[0] in ("all", "none"):
        return ()
    try:
        chosen, migs = select_gpus(tokens, refs)
    except RequestError:
        return ()
    return tuple(r.uuid for r in chosen) + tuple(m.uuid for m in migs)


def _allowed(gpus: Sequence[Any], ids: Sequence[str]) -> Dict[str, str]:
    """UUID → id for every GPU/MIG device the device ids name (unknown ids are skipped)."""
    refs = tuple(g.ref() for g in gpus)
    out: Dict[str, str] = {}
    for ident in ids:
        for uuid in _devices_of(ident, refs):
            out.setdefault(uuid, ident)
    return out


def node_gpu_ids(ids: Sequence[str],
                 gpus: Sequence[Any]) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """(the kubelet device ids that name GPUs or MIG devices of this node, the others).

    ``kubelet-resource-prefixes`` (``nvidia.com/``) also takes in NVIDIA's other resources,
    such as the network operator's SR-IOV NICs: their ids are not GPUs, as
    :func:`check_allocated` already treats them.
    """
    refs = tuple(g.ref() for g in gpus)
    kept: List[str] = []
    others: List[str] = []
    for ident in ids:
        (kept if _devices_of(ident, refs) else others).append(ident)
    return tuple(kept), tuple(others)


def check_allocated(plan: Plan, host: Any, config: Config) -> None:
    """Every granted GPU and MIG device must be in the kubelet's record for this container.

    A refusal read from the checkpoint is asked again of the PodResources API, which has the
    last word (and names the container that holds the GPU).
    """
    refused = _refusal(plan, host)
    if refused and plan.allocation.via == "checkpoint":
        from nvshim.runtime.allocation.kubelet import ask_kubelet

        plan.allocation = ask_kubelet(plan.identity, config, fresh=True)
        refused = _refusal(plan, host)
    if refused:
        raise RequestError(refused)
    plan.notes.append(f"every granted GPU is in the kubelet's record ({plan.allocation.via})")


def _refusal(plan: Plan, host: Any) -> Optional[str]:
    """The line refusing the first granted device the allocation lacks; None when all are in it."""
    allocation = plan.allocation
    gpus = host.gpus()
    mine = _allowed(gpus, allocation.ids)
    theirs = {uuid: allocation.others[i]
              for uuid, i in _allowed(gpus, list(allocation.others)).items()}
    by_uuid = {g.uuid: g for g in gpus}
    granted = [(g.index, g.uuid, g.uuid) for g in plan.gpus + plan.cdi_gpus]
    granted += [(f"{p.index}:{m.index}", m.uuid, p.uuid) for p, m in plan.migs + plan.cdi_migs]
    for label, uuid, parent in granted:
        if uuid in mine or parent in mine:
            continue
        what = "GPU" if uuid == parent else "MIG device"
        holder = theirs.get(uuid) or theirs.get(parent)
        if holder:
            why = f"the kubelet gave it to {holder}"
        else:
            own = ", ".join(
                f"GPU {by_uuid[u].index}" if u in by_uuid else u for u in mine
            ) or "no GPU"
            why = f"the kubelet allocated {own} to {plan.identity}"
        return (f"{what} {label} ({uuid}) is not this container's allocation: {why} "
                f"(claimed through {plan.request.source}, checked via {allocation.via})")
    return None


def check_engine_allocated(plan: Plan, host: Any, config: Config) -> None:
    """Every GPU, MIG device and IMEX channel the engine injected (``plan.engine_gpus``,
    ``plan.engine_migs``, ``plan.engine_imex``) must be listed by the kubelet for this
    container.

    Listed means: named by one of its device-plugin ids (as for :func:`check_allocated` and
    :func:`check_imex_allocated`), or injected by a CDI device of one of its DRA claims, the
    CDI names resolved through ``cdi-spec-dirs`` and matched to the node's devices by
    number (the engine injected from those specs). The claims are read only when the
    device-plugin ids do not cover everything. A refusal read from the checkpoint, which
    has no DRA claims, is asked again of the PodResources API.
    """
    refused = _engine_refusal(plan, host, config)
    if refused and plan.allocation.via == "checkpoint":
        from nvshim.runtime.allocation.kubelet import ask_kubelet

        plan.allocation = ask_kubelet(plan.identity, config, fresh=True)
        refused = _engine_refusal(plan, host, config)
    if refused:
        raise RequestError(refused)
    plan.notes.append("everything the engine injected is in the kubelet's record "
                      f"({plan.allocation.via})")


def _engine_refusal(plan: Plan, host: Any, config: Config) -> Optional[str]:
    """The line refusing the first engine-injected device the kubelet does not list for
    this container; None when it lists all of them.

    Devices are keyed by UUID (GPUs, MIG devices: a MIG device is also covered by its
    whole parent GPU) or ``channelN`` (IMEX channels)."""
    allocation = plan.allocation
    gpus = host.gpus()
    mine = _allowed(gpus, allocation.ids)
    mine_keys = set(mine) | {f"channel{c}" for c in allocation.imex}
    granted = [(f"GPU {g.index}", g.uuid, g.uuid) for g in plan.engine_gpus]
    granted += [(f"MIG device {p.index}:{m.index}", m.uuid, p.uuid)
                for p, m in plan.engine_migs]
    granted += [(f"IMEX channel {c}", f"channel{c}", f"channel{c}")
                for c in plan.engine_imex]
    unlisted = [g for g in granted if g[1] not in mine_keys and g[2] not in mine_keys]
    if not unlisted:
        return None
    by_name = _cdi_devices_of(host, config, allocation.cdi_devices)
    claimed = {key for found in by_name.values() if not isinstance(found, str)
               for _, key in found}
    theirs = {u: allocation.others[i] for u, i in _allowed(gpus, list(allocation.others)).items()}
    theirs.update((f"channel{c}", holder) for c, holder in allocation.imex_others.items())
    for label, key, parent in unlisted:
        if key in claimed or parent in claimed:
            continue
        holder = theirs.get(key) or theirs.get(parent) or _claim_holder(
            host, config, allocation.cdi_others, (key, parent))
        if holder:
            why = f"the kubelet gave it to {holder}"
        else:
            listed = _listing(gpus, mine, allocation, by_name)
            why = f"the kubelet listed {listed} for {plan.identity}"
        shown = label if key.startswith("channel") else f"{label} ({key})"
        return (f"{shown}, injected by the engine, is not this container's allocation: "
                f"{why} (checked via {allocation.via})")
    return None


def _cdi_devices_of(host: Any, config: Config,
                    names: Sequence[str]) -> Dict[str, Any]:
    """CDI name → ((label, key) of each GPU, MIG device and IMEX channel of this node it
    injects), or the reason it injects none that can be known (not in ``cdi-spec-dirs``).

    Resolved as a create resolves CDI names (the spec index), one name at a time so that
    each is judged on its own, and matched to the node by device numbers as the engine's
    injection is (:mod:`nvshim.runtime.engine`); a device node the spec gives without
    numbers has its host node's (as CDI fills them in), one it cannot stat matches nothing.
    """
    if not names:
        return {}
    from nvshim.cdi import index as cdiindex
    from nvshim.cdi.registry import resolve_devices
    from nvshim.config import cdi_index_path, config_path
    from nvshim.errors import CdiError
    from nvshim.host.discovery import Host
    from nvshim.runtime.engine import gpus_of_numbers, nvidia_majors

    searched = ", ".join(config.cdi_spec_dirs) or "no cdi-spec-dirs"
    try:
        registry, _ = cdiindex.registry_for(
            config.cdi_spec_dirs, names, cdi_index_path(config.source or config_path()), False)
    except CdiError as exc:
        return {name: f"not resolved: {exc}" for name in names}
    probe = Host("/", "/")  # CDI hostPaths are absolute host paths
    gpus = host.gpus()
    imex_major = (nvidia_majors(config.driver_root) or (None, None, None))[2]
    out: Dict[str, Any] = {}
    for name in names:
        try:
            nodes = resolve_devices(registry, [name]).device_nodes
        except CdiError:
            out[name] = f"not in cdi-spec-dirs {searched}"
            continue
        numbers = set()
        for node in nodes:
            if node.major is None:
                node = probe.device_node(node.source) or node
            if node.major is not None and node.minor is not None:
                numbers.add((node.major, node.minor))
        whole, migs = gpus_of_numbers(gpus, numbers)
        out[name] = tuple((f"GPU {g.index}", g.uuid) for g in whole) + tuple(
            (f"MIG device {p.index}:{m.index}", m.uuid) for p, m in migs) + tuple(
            (f"IMEX channel {minor}", f"channel{minor}")
            for major, minor in sorted(numbers) if major == imex_major)
    return out


def _claim_holder(host: Any, config: Config, cdi_others: Mapping[str, str],
                  keys: Sequence[str]) -> str:
    """The other container whose DRA claim injects one of ``keys``; "" when none does
    (only asked on a refusal: it resolves the other containers' CDI names)."""
    for name, found in _cdi_devices_of(host, config, list(cdi_others)).items():
        if not isinstance(found, str) and any(key in keys for _, key in found):
            return cdi_others[name]
    return ""


def _listing(gpus: Sequence[Any], mine: Dict[str, str], allocation: Any,
             by_name: Dict[str, Any]) -> str:
    """What the kubelet lists for the container, for a refusal: its device-plugin GPUs
    (and IMEX channels), then each DRA claim with its CDI devices and what they inject."""
    by_uuid = {g.uuid: g for g in gpus}
    parts = [", ".join(f"GPU {by_uuid[u].index}" if u in by_uuid else u for u in mine)
             or "no device-plugin GPU"]
    if allocation.imex:
        parts.append(f"IMEX channels {', '.join(map(str, allocation.imex))}")
    if not allocation.claims:
        parts.append("no DRA claim")
    for claim in allocation.claims:
        devices = []
        for name in claim.cdi_devices:
            found = by_name.get(name, "")
            if isinstance(found, str):
                shown = found or "not resolved"
            else:
                shown = ", ".join(label for label, _ in found) or "no GPU of this node"
            devices.append(f"{name}: {shown}")
        parts.append(f"DRA claim {claim} ({'; '.join(devices) or 'no CDI device'})")
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def check_imex_allocated(plan: Plan, extras: Any, config: Config) -> None:
    """Every granted IMEX channel must be in the kubelet's record for this container.

    The kubelet lists a channel under a resource named ``*imex*`` (see
    nvshim.runtime.allocation.kubelet);
    a channel it gave no one, or gave another container, is refused. As for GPUs, a
    refusal read from the checkpoint is asked again of the PodResources API.
    """
    refused = _imex_refusal(plan, extras)
    if refused and plan.allocation.via == "checkpoint":
        from nvshim.runtime.allocation.kubelet import ask_kubelet

        plan.allocation = ask_kubelet(plan.identity, config, fresh=True)
        refused = _imex_refusal(plan, extras)
    if refused:
        raise RequestError(refused)
    plan.notes.append(
        f"every granted IMEX channel is in the kubelet's record ({plan.allocation.via})")


def _imex_refusal(plan: Plan, extras: Any) -> Optional[str]:
    allocation = plan.allocation
    for channel in extras.imex_channels:
        if channel in allocation.imex:
            continue
        holder = allocation.imex_others.get(channel)
        if holder:
            why = f"the kubelet gave it to {holder}"
        else:
            own = ", ".join(map(str, allocation.imex)) or "none"
            why = f"the kubelet allocated IMEX channels {own} to {plan.identity}"
        return (f"IMEX channel {channel} is not this container's allocation: {why} "
                f"(claimed through {extras.imex_source}, checked via {allocation.via})")
    return None
