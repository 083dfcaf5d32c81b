"""require-allocation beyond choosing a source: the kubelet's record and the pod's annotations.

Loaded only under ``require-allocation`` when the kubelet is to be asked or an annotation
claim must be told apart from the pod's own annotations (a default create never imports
it). :func:`ask_kubelet_if_needed` fetches what the kubelet allocated to this CRI
container, :func:`pod_annotations` reads the pod sandbox's spec, and
:func:`check_allocated` / :func:`check_imex_allocated` refuse any granted GPU, MIG device
or IMEX channel the kubelet's record lacks.
"""

from __future__ import annotations

import os

from nvshim import _jsonc
from nvshim.errors import RequestError
from nvshim.runtime.request import (
    SANDBOX_ANNOTATION,
    claims_gpus,
    identity_of,
)
from nvshim.runtime.tokens import parse_visible_devices, select_gpus

TYPE_CHECKING = False  # typing costs ~4 ms to import on the create path
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence, Tuple

    from nvshim.config import Config
    from nvshim.runtime.request import ImageView

    Plan = Any  # nvshim.runtime.create.Plan (create imports this module: no import back)

__all__ = ["ask_kubelet_if_needed", "pod_annotations", "check_allocated",
           "check_imex_allocated", "node_gpu_ids"]


def ask_kubelet_if_needed(view: ImageView, config: Config) -> Tuple[Any, Any, str, List[str]]:
    """(identity, allocation, verified, notes): the kubelet's record when config needs it.

    Asked only under require-allocation with ``verify-with: kubelet`` or the ``kubelet``
    source, for a CRI container that claims a GPU or an IMEX channel. Unreachable:
    ``kubelet-unreachable`` decides (fail the create, or trust the claims and say so).
    """
    identity = identity_of(view.annotations)
    wants = config.verify_with == "kubelet" or "kubelet" in config.allocation_sources
    if not (config.require_allocation and wants
            and (claims_gpus(view, config) or _claims_imex(view))):
        return identity, None, "none", []
    from nvshim.runtime.kubelet import KubeletUnreachable, ask_kubelet

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


def pod_annotations(bundle: str, view: ImageView, config: Config) -> Optional[Dict[str, str]]:
    """The annotations of this CRI container's pod sandbox spec; None when unknown.

    containerd copies a pod's pass-through annotations into the sandbox's spec and into
    every container's; the device plugin's (container) annotations only into the
    container's. Under containerd's runc shim the sandbox's bundle is the sibling
    directory named by ``io.kubernetes.cri.sandbox-id``. Read only under
    require-allocation for a container that carries an annotation claim.
    """
    if not config.require_allocation or view.sandbox:
        return None
    prefixes = config.annotation_prefixes
    if not any(any(k.startswith(p) for p in prefixes) for k in view.annotations):
        return None
    sandbox_id = view.annotations.get("io.kubernetes.cri.sandbox-id", "")
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
        from nvshim.runtime.kubelet import ask_kubelet

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


def check_imex_allocated(plan: Plan, extras: Any, config: Config) -> None:
    """Every granted IMEX channel must be in the kubelet's record for this container.

    The kubelet lists a channel under a resource named ``*imex*`` (see nvshim.runtime.kubelet);
    a channel it gave no one, or gave another container, is refused. As for GPUs, a
    refusal read from the checkpoint is asked again of the PodResources API.
    """
    refused = _imex_refusal(plan, extras)
    if refused and plan.allocation.via == "checkpoint":
        from nvshim.runtime.kubelet import ask_kubelet

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




def _claims_imex(view: ImageView) -> bool:
    """Whether the container names an IMEX channel (device-plugin mount or env); cheap."""
    if view.sandbox:
        return False
    value = view.get("NVIDIA_IMEX_CHANNELS")
    return bool(value and value.strip()) or any(
        "/imex/" in str(m.get("destination", "")) for m in view.mounts)
