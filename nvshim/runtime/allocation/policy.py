"""require-allocation beyond choosing a source: the kubelet's record and the pod's annotations.

Loaded only under ``require-allocation`` when the kubelet is to be asked or an annotation
claim must be told apart from the pod's own annotations (a default create never imports
it). :func:`ask_kubelet_if_needed` fetches what the kubelet allocated to this CRI
container, :func:`pod_annotations` reads the pod sandbox's spec, and
:func:`check_allocated` / :func:`check_imex_allocated` refuse any granted GPU, MIG device
or IMEX channel the kubelet's record lacks. :func:`check_engine_allocated` does the same
for the devices the engine injected itself (CDI through containerd 1.7+/CRI-O, Kubernetes
DRA): the kubelet lists them as device-plugin ids, or as the CDI devices of a DRA claim.

Why one module: every function here answers one question, whether the kubelet's record (or
the pod's annotations) backs what a create grants, for each kind of grant (GPUs and MIG
devices, IMEX channels, the engine's own devices), with one refusal wording and one id
matching (:class:`KubeletIds`). require-allocation loads it whole or not at all, so a split
would add an import to every create it checks and save none.
"""

from __future__ import annotations

import os

from nvshim import _jsonc
from nvshim._record import dataclass, replace
from nvshim.config import describe_config
from nvshim.errors import RequestError
from nvshim.host.devices import parse_visible_devices, select_gpus
from nvshim.runtime.identity import (
    CRIO_ANNOTATIONS,
    SANDBOX_ANNOTATION,
    cri_engine,
    read_identity,
)

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Dict, Mapping, Optional, Sequence, Set, Tuple, Union

    from nvshim.config import Config
    from nvshim.host.devices import GpuRef, MigDevice
    from nvshim.host.discovery import Gpu, Host
    from nvshim.runtime.allocation.kubelet import Allocation
    from nvshim.runtime.claim import Claim
    from nvshim.runtime.engine import EngineGrant
    from nvshim.runtime.extras import Extras
    from nvshim.runtime.identity import Identity
    from nvshim.runtime.request import Request

    #: What a CDI name injects on this node: (label, key) of each GPU, MIG device and IMEX
    #: channel, or why that cannot be known.
    Found = Union[str, Tuple[Tuple[str, str], ...]]

__all__ = [
    "KubeletIds",
    "Verification",
    "ask_kubelet_if_needed",
    "pod_annotations",
    "name_ids",
    "with_named",
    "check_allocated",
    "check_granted",
    "check_imex_allocated",
    "check_engine_allocated",
]


@dataclass(frozen=True)
class KubeletIds:
    """The device ids the kubelet lists for a container, each parsed once and matched to
    this node's GPUs and MIG devices (:func:`name_ids`); every check reads this."""

    ids: Tuple[str, ...] = ()
    tokens: Tuple[Tuple[str, ...], ...] = ()
    """Per id, its device tokens (the NVIDIA_VISIBLE_DEVICES grammar)."""
    uuids: Tuple[Tuple[str, ...], ...] = ()
    """Per id, the UUIDs of the GPUs and MIG devices it names on this node; ``()`` for an
    id that names none (another resource's device, an SR-IOV NIC's PCI address, …)."""

    @property
    def gpu_ids(self) -> Tuple[str, ...]:
        """The ids that name GPUs or MIG devices of this node.

        ``kubelet-resource-prefixes`` (``nvidia.com/``) also takes in NVIDIA's other
        resources, such as the network operator's SR-IOV NICs: their ids are not GPUs.
        """
        return tuple(i for i, named in zip(self.ids, self.uuids, strict=True) if named)

    @property
    def other_ids(self) -> Tuple[str, ...]:
        """The ids that name no GPU of this node."""
        return tuple(i for i, named in zip(self.ids, self.uuids, strict=True) if not named)

    @property
    def gpu_tokens(self) -> Tuple[str, ...]:
        """The device tokens of :attr:`gpu_ids`, in order, repeats collapsed: what the
        ``kubelet`` allocation source grants."""
        return tuple(
            dict.fromkeys(
                t
                for tokens, named in zip(self.tokens, self.uuids, strict=True)
                if named
                for t in tokens
            )
        )

    @property
    def by_uuid(self) -> Dict[str, str]:
        """UUID → the first id naming it, for every GPU and MIG device the ids name."""
        out: Dict[str, str] = {}
        for ident, named in zip(self.ids, self.uuids, strict=True):
            for uuid in named:
                out.setdefault(uuid, ident)
        return out


def name_ids(ids: Sequence[str], gpus: Sequence[Gpu]) -> KubeletIds:
    """Parse each kubelet device id once and match it to the node's ``gpus``."""
    refs = tuple(g.ref() for g in gpus)
    tokens = tuple(parse_visible_devices(ident) for ident in ids)
    return KubeletIds(tuple(ids), tokens, tuple(_devices_of(t, refs) for t in tokens))


def _devices_of(tokens: Tuple[str, ...], refs: Sequence[GpuRef]) -> Tuple[str, ...]:
    """UUIDs of the GPUs and MIG devices one id's ``tokens`` name on this node."""
    if not tokens or tokens[0] in ("all", "none"):
        return ()
    try:
        chosen, migs = select_gpus(tokens, refs)
    except RequestError:
        return ()
    return tuple(r.uuid for r in chosen) + tuple(m.uuid for m in migs)


def _holders(allocation: Allocation, gpus: Sequence[Gpu]) -> Dict[str, str]:
    """UUID → the other container the kubelet gave it to (parsed only for a refusal)."""
    return {
        uuid: allocation.others[i]
        for uuid, i in name_ids(list(allocation.others), gpus).by_uuid.items()
    }


@dataclass(frozen=True)
class Verification:
    """What require-allocation knows of the kubelet's record for one container
    (:func:`ask_kubelet_if_needed`; the checks return a new one when they ask again)."""

    identity: Optional[Identity] = None
    """The Kubernetes container of a CRI container."""
    allocation: Optional[Allocation] = None
    """What the kubelet allocated, when asked and reachable."""
    verified: str = "none"
    """``kubelet`` (every GPU checked against its record), ``unreachable`` (claims
    trusted), ``unidentified`` (not a CRI container: claims judged by allocation-sources),
    ``privileged`` (a privileged container: not asked), ``none``."""
    notes: Tuple[str, ...] = ()
    named: Optional[KubeletIds] = None
    """The allocation's ids matched to this node, once a check or the ``kubelet`` source
    needed them (:func:`with_named`)."""

    privileged: bool = False
    """A privileged container (every device allowed): its GPUs are not checked, it holds
    every GPU node already (its IMEX channels are, when it names some)."""

    @property
    def warnings(self) -> Tuple[str, ...]:
        """What an operator must hear though create goes on: claims trusted unverified."""
        return self.notes if self.verified in ("unreachable", "unidentified") else ()


_PRIVILEGED = (
    "privileged container: it holds every GPU node already (its device cgroup "
    "allows all), so its GPUs are not checked against the kubelet's record"
)


def ask_kubelet_if_needed(claim: Claim, config: Config) -> Verification:
    """The kubelet's record when config needs it.

    Asked only under require-allocation with ``verify-with: kubelet`` or the ``kubelet``
    source, for a CRI container that claims a GPU or an IMEX channel. Unreachable:
    ``kubelet-unreachable`` decides (fail the create, or trust the claims and say so).
    """
    identity, problem = read_identity(claim.view.annotations)
    wants = config.verify_with == "kubelet" or "kubelet" in config.allocation_sources
    if not (config.require_allocation and wants and (claim.claims_gpus or claim.claims_imex)):
        return Verification(identity)
    privileged = claim.view.privileged_with_devices
    if privileged and not claim.claims_imex:
        return Verification(identity, verified="privileged", notes=(_PRIVILEGED,), privileged=True)
    if identity is None:
        return _unidentified(problem, config)
    from nvshim.runtime.allocation.kubelet import KubeletUnreachable, ask_kubelet

    try:
        return Verification(
            identity, ask_kubelet(identity, config), "kubelet", privileged=privileged
        )
    except KubeletUnreachable as exc:
        if config.kubelet_unreachable == "fail":
            raise RequestError(f"{exc}; refusing the claim (kubelet-unreachable: fail)") from exc
        return Verification(
            identity,
            None,
            "unreachable",
            (f"{exc}; GPU claims trusted unverified (kubelet-unreachable: trust-claims)",),
        )


def _unidentified(problem: str, config: Config) -> Verification:
    """A container claiming GPUs that the kubelet cannot be asked about: refused under
    ``verify-with: kubelet`` when a CRI engine made it (``problem``: its identity is not
    usable) or when ``unidentified-containers: fail``; else judged by allocation-sources,
    with a warning (``verified: unidentified``). Without verify (the ``kubelet`` source
    alone) it only gets nothing from that source."""
    what = (
        f"the container's kubelet identity is unusable: {problem}"
        if problem
        else (
            "not a CRI container (neither containerd's io.kubernetes.cri.* nor CRI-O's "
            "io.kubernetes.cri-o.* annotations): the kubelet has no record of it"
        )
    )
    if config.verify_with != "kubelet":
        return Verification(notes=(f"{what}; the kubelet allocation source grants nothing",))
    if problem:
        raise RequestError(
            f"{what}; refusing its GPU claims (verify-with: kubelet in {describe_config(config)})"
        )
    if config.unidentified_containers == "fail":
        raise RequestError(
            f"{what}, so verify-with: kubelet cannot check its GPU claims; "
            f"refusing them (unidentified-containers: fail in "
            f"{describe_config(config)})"
        )
    return Verification(
        None,
        None,
        "unidentified",
        (
            f"{what}; GPU claims judged by allocation-sources alone, unverified "
            "(unidentified-containers: allocation-sources)",
        ),
    )


def with_named(found: Verification, gpus: Sequence[Gpu]) -> Verification:
    """``found`` with its allocation's ids matched to the node's ``gpus``: done once, kept
    until the allocation is asked again."""
    if found.named is not None or found.allocation is None:
        return found
    return replace(found, named=name_ids(found.allocation.ids, gpus))


def _asked_again(found: Verification, config: Config) -> Verification:
    """``found`` with the PodResources API's answer, which has the last word over the
    checkpoint's (and names the container holding a disputed device)."""
    from nvshim.runtime.allocation.kubelet import ask_kubelet

    assert found.identity is not None
    return replace(found, allocation=ask_kubelet(found.identity, config, fresh=True), named=None)


def pod_annotations(bundle: str, claim: Claim, config: Config) -> Optional[Dict[str, str]]:
    """The annotations of this CRI container's pod sandbox spec; None when unknown (under
    CRI-O: :func:`_crio_pod_annotations`).

    containerd copies a pod's pass-through annotations into the sandbox's spec and into
    every container's; the device plugin's (container) annotations only into the
    container's. Under containerd's runc shim the sandbox's bundle is the sibling
    directory named by ``io.kubernetes.cri.sandbox-id``. Read only under
    require-allocation for a container that carries an annotation claim.
    """
    if not config.require_allocation or not claim.annotation_keys:
        return None  # (a sandbox's claim has no annotation keys)
    if cri_engine(claim.view.annotations) == "cri-o":
        return _crio_pod_annotations(claim)
    sandbox_id = claim.view.annotations.get("io.kubernetes.cri.sandbox-id", "")
    if not sandbox_id or "/" in sandbox_id or sandbox_id in (".", ".."):
        return None
    path = os.path.join(os.path.dirname(os.path.abspath(bundle)), sandbox_id, "config.json")
    from nvshim.errors import SpecError
    from nvshim.runtime.specjson import runc_keys

    try:
        with open(path, "rb") as fh:
            spec = runc_keys(_jsonc.loads(fh.read()))  # its keys as runc reads them
    except (OSError, ValueError, SpecError):
        return None
    notes = spec.get("annotations") if isinstance(spec, dict) else None
    if (
        not isinstance(notes, dict)
        or notes.get(SANDBOX_ANNOTATION) != "sandbox"
        or notes.get("io.kubernetes.cri.sandbox-id") != sandbox_id
    ):
        return None
    return {k: v for k, v in notes.items() if isinstance(k, str) and isinstance(v, str)}


def _crio_pod_annotations(claim: Claim) -> Dict[str, str]:
    """Under CRI-O: the annotation claims that are not the kubelet's container annotations.

    CRI-O copies every pod annotation into each container's spec, and records the kubelet's
    own container annotations (the device plugin's among them) as JSON under
    ``io.kubernetes.cri-o.Annotations``, a key no user input overwrites. A claim whose key
    and value that record lacks was written by the pod (no record at all: every claim is)."""
    notes = claim.view.annotations
    try:
        kubelet = _jsonc.loads(notes.get(CRIO_ANNOTATIONS, ""))
    except (ValueError, RecursionError):
        kubelet = None
    if not isinstance(kubelet, dict):
        kubelet = {}
    return {k: notes[k] for k in claim.annotation_keys if kubelet.get(k) != notes[k]}


def check_allocated(
    found: Verification,
    host: Host,
    gpus: Sequence[Gpu],
    migs: Sequence[Tuple[Gpu, MigDevice]],
    source: str,
    config: Config,
) -> Tuple[Verification, str]:
    """(the record checked against, the note saying so) when every granted GPU (``gpus``)
    and MIG device (``migs``, with their parents) is in the kubelet's record for this
    container: named by one of its device-plugin ids, or injected by a CDI device of one of
    its DRA claims (a kubelet before 1.32 also hands a claim's CDI devices over as
    ``cdi.k8s.io/`` annotations); else RequestError naming the first that is not, and who
    holds it.

    A refusal read from the checkpoint is asked again of the PodResources API, which has the
    last word (and names the container that holds the GPU).
    """
    found = with_named(found, host.gpus())
    refused = _refusal(found, host, gpus, migs, source, config)
    if refused and found.allocation is not None and found.allocation.via == "checkpoint":
        found = with_named(_asked_again(found, config), host.gpus())
        refused = _refusal(found, host, gpus, migs, source, config)
    if refused:
        raise RequestError(refused)
    assert found.allocation is not None
    return found, f"every granted GPU is in the kubelet's record ({found.allocation.via})"


def check_granted(
    found: Verification,
    host: Host,
    gpus: Sequence[Gpu],
    migs: Sequence[Tuple[Gpu, MigDevice]],
    request: Request,
    config: Config,
) -> Tuple[Verification, Tuple[str, ...]]:
    """(the record checked against, the notes saying so) when everything nvshim grants
    from ``request`` is in the kubelet's record: every GPU and MIG device
    (:func:`check_allocated`) and every device node of each CDI name it injects
    (:func:`nvshim.runtime.allocation.cdinames.cdi_refusal`); else RequestError naming
    the first that is not, the container and the record. A privileged container's GPUs
    are not checked: failing it would protect nothing (it holds every GPU node)."""
    if found.privileged:
        return replace(found, verified="privileged"), (_PRIVILEGED,)
    found, note = check_allocated(found, host, gpus, migs, request.source, config)
    names = request.cdi_names
    if not names:
        return found, (note,)
    from nvshim.runtime.allocation.cdinames import cdi_refusal, resolve_names

    resolved = resolve_names(host, config, names)
    assert found.allocation is not None
    refused = cdi_refusal(found.identity, found.allocation, names, resolved, request.source)
    if refused and found.allocation.via == "checkpoint":
        found = with_named(_asked_again(found, config), host.gpus())
        assert found.allocation is not None
        refused = cdi_refusal(found.identity, found.allocation, names, resolved, request.source)
    if refused:
        raise RequestError(refused)
    return found, (
        note,
        f"every device node of the CDI devices {', '.join(names)} is in the kubelet's record",
    )


def _refusal(
    found: Verification,
    host: Host,
    gpus: Sequence[Gpu],
    migs: Sequence[Tuple[Gpu, MigDevice]],
    source: str,
    config: Config,
) -> Optional[str]:
    """The line refusing the first granted device the allocation lacks; None when all are in it."""
    allocation, named = found.allocation, found.named
    assert allocation is not None and named is not None
    node = host.gpus()
    mine = named.by_uuid
    by_uuid = {g.uuid: g for g in node}
    granted = [(str(g.index), g.uuid, g.uuid) for g in gpus]
    granted += [(f"{p.index}:{m.index}", m.uuid, p.uuid) for p, m in migs]
    unlisted = [g for g in granted if g[1] not in mine and g[2] not in mine]
    claimed = _claimed(host, config, allocation) if unlisted and allocation.claims else set()
    for label, uuid, parent in unlisted:
        if uuid in claimed or parent in claimed:
            continue
        what = "GPU" if uuid == parent else "MIG device"
        theirs = _holders(allocation, node)
        holder = (
            theirs.get(uuid)
            or theirs.get(parent)
            or _claim_holder(host, config, allocation.cdi_others, (uuid, parent))
        )
        if holder:
            why = f"the kubelet gave it to {holder}"
        else:
            own = (
                ", ".join(f"GPU {by_uuid[u].index}" if u in by_uuid else u for u in mine)
                or "no GPU"
            )
            why = f"the kubelet allocated {own} to {found.identity}"
        return (
            f"{what} {label} ({uuid}) is not this container's allocation: {why} "
            f"(claimed through {source}, checked via {allocation.via})"
        )
    return None


def check_engine_allocated(
    found: Verification, host: Host, engine: EngineGrant, config: Config
) -> Tuple[Verification, str]:
    """(the record checked against, the note saying so) when every GPU, MIG device and
    IMEX channel the engine injected (``engine``) is listed by the kubelet for this
    container; else RequestError naming the first that is not.

    Listed means: named by one of its device-plugin ids (as for :func:`check_allocated` and
    :func:`check_imex_allocated`), or injected by a CDI device of one of its DRA claims, the
    CDI names resolved through ``cdi-spec-dirs`` and matched to the node's devices by
    number (the engine injected from those specs). The claims are read only when the
    device-plugin ids do not cover everything. A refusal read from the checkpoint, which
    has no DRA claims, is asked again of the PodResources API.
    """
    found = with_named(found, host.gpus())
    refused = _engine_refusal(found, host, engine, config)
    if refused and found.allocation is not None and found.allocation.via == "checkpoint":
        found = with_named(_asked_again(found, config), host.gpus())
        refused = _engine_refusal(found, host, engine, config)
    if refused:
        raise RequestError(refused)
    assert found.allocation is not None
    return found, (
        f"everything the engine injected is in the kubelet's record ({found.allocation.via})"
    )


def _engine_refusal(
    found: Verification, host: Host, engine: EngineGrant, config: Config
) -> Optional[str]:
    """The line refusing the first engine-injected device the kubelet does not list for
    this container; None when it lists all of them.

    Devices are keyed by UUID (GPUs, MIG devices: a MIG device is also covered by its
    whole parent GPU) or ``channelN`` (IMEX channels)."""
    allocation, named = found.allocation, found.named
    assert allocation is not None and named is not None
    gpus = host.gpus()
    mine = named.by_uuid
    mine_keys = set(mine) | {f"channel{c}" for c in allocation.imex}
    granted = [(f"GPU {g.index}", g.uuid, g.uuid) for g in engine.gpus]
    granted += [(f"MIG device {p.index}:{m.index}", m.uuid, p.uuid) for p, m in engine.migs]
    granted += [(f"IMEX channel {c}", f"channel{c}", f"channel{c}") for c in engine.imex]
    unlisted = [g for g in granted if g[1] not in mine_keys and g[2] not in mine_keys]
    if not unlisted:
        return None
    by_name = _cdi_devices_of(host, config, allocation.cdi_devices)
    claimed = _keys_of(by_name)
    theirs = _holders(allocation, gpus)
    theirs.update((f"channel{c}", holder) for c, holder in allocation.imex_others.items())
    for label, key, parent in unlisted:
        if key in claimed or parent in claimed:
            continue
        holder = (
            theirs.get(key)
            or theirs.get(parent)
            or _claim_holder(host, config, allocation.cdi_others, (key, parent))
        )
        if holder:
            why = f"the kubelet gave it to {holder}"
        else:
            listed = _listing(gpus, mine, allocation, by_name)
            why = f"the kubelet listed {listed} for {found.identity}"
        shown = label if key.startswith("channel") else f"{label} ({key})"
        return (
            f"{shown}, injected by the engine, is not this container's allocation: "
            f"{why} (checked via {allocation.via})"
        )
    return None


def _cdi_devices_of(host: Host, config: Config, names: Sequence[str]) -> Dict[str, Found]:
    """CDI name → ((label, key) of each GPU, MIG device and IMEX channel of this node it
    injects), or the reason it injects none that can be known (not in ``cdi-spec-dirs``);
    see :func:`nvshim.runtime.allocation.cdinames.resolve_names`."""
    from nvshim.runtime.allocation.cdinames import resolve_names

    return {
        name: found if isinstance(found, str) else found.found
        for name, found in resolve_names(host, config, names).items()
    }


def _keys_of(by_name: Mapping[str, Found]) -> Set[str]:
    """The keys (UUID, ``channelN``) of every device the resolved CDI names inject."""
    return {key for found in by_name.values() if not isinstance(found, str) for _, key in found}


def _claimed(host: Host, config: Config, allocation: Allocation) -> Set[str]:
    """The keys of the devices the CDI devices of the container's DRA claims inject."""
    return _keys_of(_cdi_devices_of(host, config, allocation.cdi_devices))


def _claim_holder(
    host: Host, config: Config, cdi_others: Mapping[str, str], keys: Sequence[str]
) -> str:
    """The other container whose DRA claim injects one of ``keys``; "" when none does
    (only asked on a refusal: it resolves the other containers' CDI names)."""
    for name, found in _cdi_devices_of(host, config, list(cdi_others)).items():
        if not isinstance(found, str) and any(key in keys for _, key in found):
            return cdi_others[name]
    return ""


def _listing(
    gpus: Sequence[Gpu], mine: Dict[str, str], allocation: Allocation, by_name: Dict[str, Found]
) -> str:
    """What the kubelet lists for the container, for a refusal: its device-plugin GPUs
    (and IMEX channels), then each DRA claim with its CDI devices and what they inject."""
    by_uuid = {g.uuid: g for g in gpus}
    parts = [
        ", ".join(f"GPU {by_uuid[u].index}" if u in by_uuid else u for u in mine)
        or "no device-plugin GPU"
    ]
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


def check_imex_allocated(
    found: Verification, extras: Extras, config: Config
) -> Tuple[Verification, str]:
    """(the record checked against, the note saying so) when every granted IMEX channel is
    in the kubelet's record for this container; else RequestError naming the first that is
    not.

    The kubelet lists a channel under a resource named ``*imex*`` (see
    nvshim.runtime.allocation.kubelet);
    a channel it gave no one, or gave another container, is refused. As for GPUs, a
    refusal read from the checkpoint is asked again of the PodResources API.
    """
    refused = _imex_refusal(found, extras)
    if refused and found.allocation is not None and found.allocation.via == "checkpoint":
        found = _asked_again(found, config)
        refused = _imex_refusal(found, extras)
    if refused:
        raise RequestError(refused)
    assert found.allocation is not None
    return found, f"every granted IMEX channel is in the kubelet's record ({found.allocation.via})"


def _imex_refusal(found: Verification, extras: Extras) -> Optional[str]:
    allocation = found.allocation
    assert allocation is not None
    for channel in extras.imex_channels:
        if channel in allocation.imex:
            continue
        holder = allocation.imex_others.get(channel)
        if holder:
            why = f"the kubelet gave it to {holder}"
        else:
            own = ", ".join(map(str, allocation.imex)) or "none"
            why = f"the kubelet allocated IMEX channels {own} to {found.identity}"
        return (
            f"IMEX channel {channel} is not this container's allocation: {why} "
            f"(claimed through {extras.imex_source}, checked via {allocation.via})"
        )
    return None
