"""The create road: config.json → request → discovery → edits → new config.json.

:func:`plan_create` computes everything without writing (``nvshim inspect`` prints the
plan); :func:`commit` writes the new config.json atomically when it differs.
Discovery is not touched for a container that asks for nothing.
"""

from __future__ import annotations

import os

from nvshim import _jsonc
from nvshim._record import dataclass, field
from nvshim.config import Config
from nvshim.edits import Edits
from nvshim.errors import HostError, RequestError, SpecError
from nvshim.runtime.apply import apply_edits
from nvshim.runtime.hookargs import hook_command
from nvshim.runtime.hostedits import driver_edits, gpu_edits, mig_edits
from nvshim.runtime.request import (
    SANDBOX_ANNOTATION,
    VISIBLE_DEVICES,
    Request,
    claims_gpus,
    identity_of,
    image_view,
    parse_visible_devices,
    resolve_request,
    select_gpus,
)

TYPE_CHECKING = False  # typing costs ~4 ms to import on the create path
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["Plan", "plan_create", "commit"]


@dataclass
class Plan:
    """What create would do to one bundle."""

    spec_path: str
    original: bytes
    spec: Dict[str, Any]
    request: Request
    edits: Edits = field(default_factory=Edits)
    new_spec: Optional[Dict[str, Any]] = None
    gpus: Tuple[Any, ...] = ()
    migs: Tuple[Tuple[Any, Any], ...] = ()
    cdi_names: Tuple[str, ...] = ()
    capabilities: Tuple[str, ...] = ()
    driver_root: str = "/"
    notes: List[str] = field(default_factory=list)
    bundle: str = ""
    rootwork: Any = None
    """The SONAME links and ld.so.cache work (:class:`nvshim.runtime.rootwork.RootWork`), if any."""
    rootwork_by: str = ""
    """Who does it: ``runtime`` (before runc), ``hook`` (createContainer), ``""`` (none)."""
    rootwork_why: str = ""
    """``runtime``: the rootfs written; ``hook``: why the runtime cannot write it."""
    warnings: List[str] = field(default_factory=list)
    plan_source: str = ""
    cdi_source: str = ""
    """Where the CDI registry came from: the spec index, or a scan (and why)."""
    """Where the node's plan came from: the plan cache, or discovery (and why)."""
    host: Any = None

    identity: Any = None
    """The Kubernetes container (:class:`nvshim.runtime.kubelet.Identity`) of a CRI container."""
    verified: str = "none"
    """``kubelet`` (every GPU checked against its record), ``unreachable`` (claims trusted), ``none``."""
    allocation: Any = None
    """What the kubelet allocated (:class:`nvshim.runtime.kubelet.Allocation`), when it was asked."""
    cdi_gpus: Tuple[Any, ...] = ()
    """Whole GPUs the granted CDI devices bring (by their device nodes)."""
    cdi_migs: Tuple[Tuple[Any, Any], ...] = ()
    """(parent GPU, MIG device) pairs the granted CDI devices bring (by their MIG caps)."""
    log_warnings: List[str] = field(default_factory=list)
    """Things an operator must hear about even though create goes on (runc --log warnings)."""
    params: Optional[Tuple[str, bytes]] = None
    """(bundle file, content): the ``ModifyDeviceFiles: 0`` copy the params hook binds."""

    @property
    def granted_uuids(self) -> Tuple[str, ...]:
        """UUIDs of every GPU and MIG device granted (the grant journal records these)."""
        out = [g.uuid for g in self.gpus] + [m.uuid for _, m in self.migs]
        out += [g.uuid for g in self.cdi_gpus] + [m.uuid for _, m in self.cdi_migs]
        return tuple(dict.fromkeys(out))

    def applied_edits(self) -> Edits:
        """The edits config.json gets: without nvshim's hook when the runtime does its work."""
        if self.rootwork_by != "runtime":
            return self.edits
        from nvshim._record import replace
        from nvshim.runtime.rootwork import is_nvshim_hook

        return replace(self.edits, hooks=tuple(h for h in self.edits.hooks if not is_nvshim_hook(h)))

    @property
    def changed(self) -> bool:
        return self.new_spec is not None and self.new_spec != self.spec

    def new_bytes(self) -> bytes:
        """The new config.json in the layout of the original (see nvshim.runtime.specjson)."""
        from nvshim.runtime.specjson import encode_spec

        assert self.new_spec is not None
        return encode_spec(self.new_spec, self.original)


def plan_create(
    bundle: str,
    config: Config,
    host: Any = None,
    log: Any = None,
    save_cache: bool = False,
) -> Plan:
    """Compute what create does to ``bundle``.

    Nothing is written, except the node plan cache when ``save_cache`` (the runtime) finds
    it missing or stale.
    """
    from nvshim.runtime.specjson import read_spec

    spec_path, raw, spec = read_spec(bundle)
    try:
        view = image_view(spec)
    except SpecError as exc:
        raise SpecError(f"{spec_path}: {str(exc).replace('config.json: ', '')}") from exc
    identity, allocation, verified, early_notes = _ask_kubelet_if_needed(view, config)
    request = resolve_request(view, config, allocation.ids if allocation is not None else None,
                              _pod_annotations(bundle, view, config))
    plan = Plan(spec_path, raw, spec, request, capabilities=request.capabilities)
    plan.identity, plan.allocation, plan.verified = identity, allocation, verified
    plan.notes.extend(early_notes)
    if verified == "unreachable":
        plan.log_warnings.extend(early_notes)
    plan.notes.extend(request.notes)
    if log is not None:
        log.event(
            "request",
            bundle=bundle,
            source=request.source,
            devices=list(request.devices),
            capabilities=list(request.capabilities),
            notes=list(request.notes),
        )

    extras = _extras(view, config, request)
    if extras is not None:
        plan.notes.extend(extras.notes)
        if extras.imex_channels and plan.allocation is not None:
            check_imex_allocated(plan, extras, config)
    if not request.injects and not extras:
        if request.set_void:
            plan.new_spec = apply_edits(spec, Edits(env=(f"{VISIBLE_DEVICES}=void",)))
        return plan

    if host is None:
        from nvshim.runtime.plancache import host_for

        host, plan.plan_source = host_for(config, save_cache)
        if log is not None:
            log.event("plan", source=plan.plan_source)
    plan.host = host
    plan.driver_root = host.driver_root

    edits = Edits()
    cdi_names = request.cdi_names
    if cdi_names:
        from nvshim.cdi import index as cdiindex
        from nvshim.cdi.registry import resolve_devices
        from nvshim.config import cdi_index_path, config_path
        from nvshim.runtime.hostedits import restrict_to_capabilities

        registry, plan.cdi_source = cdiindex.registry_for(
            config.cdi_spec_dirs, cdi_names, cdi_index_path(config.source or config_path()),
            save_cache,
        )
        if log is not None:
            log.event("cdi", source=plan.cdi_source)

        edits = edits + resolve_devices(registry, cdi_names)
        edits = restrict_to_capabilities(_fill_device_nodes(edits), request.capabilities)
        plan.cdi_names = cdi_names

    tokens = request.gpu_tokens
    if tokens or (request.driver_files and not cdi_names):
        edits = edits + _node_edits(host, request, tokens, plan, config)
        if config.disable_device_node_modification:
            edits = edits + _params_edits(plan, bundle, host.driver_root)
    if cdi_names and (config.grants_journal or plan.allocation is not None):
        plan.cdi_gpus, plan.cdi_migs = _gpus_of_nodes(host, edits)
    if plan.allocation is not None and request.source != "kubelet":
        check_allocated(plan, host, config)

    if extras:
        from nvshim.runtime.extras import extras_edits

        edits = edits + extras_edits(host, extras, plan.notes)
        if request.set_void:
            edits = edits + Edits(env=(f"{VISIBLE_DEVICES}=void",))
    plan.edits = edits
    plan.bundle = bundle
    _decide_rootwork(plan)
    if log is not None:
        log.event("edits", edits=plan.applied_edits().to_cdi())
    plan.new_spec = apply_edits(spec, plan.applied_edits())
    return plan


def _params_edits(plan: Plan, bundle: str, driver_root: str) -> Edits:
    """The hook showing ``ModifyDeviceFiles: 0`` (nvshim.runtime.devparams), when the host's is 1."""
    from nvshim.runtime import devparams

    content = devparams.modified_params(driver_root)
    if content is None:
        return Edits()
    from nvshim.runtime.rootwork import rootfs_path

    rootfs = rootfs_path(plan.spec, bundle)
    if rootfs is None:
        return Edits()
    copy = os.path.join(os.path.abspath(bundle), devparams.BUNDLE_FILE)
    plan.params = (copy, content)
    plan.notes.append("the container's /proc/driver/nvidia/params will say ModifyDeviceFiles: 0")
    return Edits(hooks=(devparams.params_hook(rootfs, copy),))


def _decide_rootwork(plan: Plan) -> None:
    """Who makes the SONAME links and the ld.so.cache: the runtime (now) or the hook."""
    from nvshim.runtime import rootwork

    info = getattr(plan.host, "elf_info", rootwork.elf_info)
    work = rootwork.work_from_hooks(plan.edits.hooks, plan.edits.mounts, info)
    if work is None:
        return
    plan.rootwork = work
    plan.rootwork_by, plan.rootwork_why = rootwork.decide(plan.spec, plan.bundle, work)


def _node_edits(
    host: Any, request: Request, tokens: Sequence[str], plan: Plan, config: Config
) -> Edits:
    """Edits for this node's GPUs (discovery), shared with ``nvshim cdi generate``."""
    gpus = host.gpus()
    refs = tuple(g.ref() for g in gpus)
    chosen_refs, chosen_migs = select_gpus(tokens, refs) if tokens else ((), ())
    by_index = {g.index: g for g in gpus}
    chosen = tuple(by_index[r.index] for r in chosen_refs)
    migs: List[Tuple[Any, Any]] = []
    for m in chosen_migs:
        parent = by_index[m.gpu_index]
        migs.append((parent, next(x for x in parent.mig if x.uuid == m.uuid)))
    plan.gpus = chosen
    plan.migs = tuple(migs)

    caps = request.capabilities
    env = (view := image_view(plan.spec)).env
    if "CUDA_VERSION" in env or any(name.startswith("NVIDIA_REQUIRE_") for name in env):
        # only then can there be a requirement (the module costs ~2 ms to import)
        from nvshim.runtime.requirements import check_requirements

        selected = plan.gpus + tuple(parent for parent, _ in plan.migs)
        check_requirements(view, host, selected, plan.notes, config.disable_require)

    files = host.binaries(caps) + host.ipc(caps) + host.firmware()
    edits = driver_edits(host.control_nodes(caps), host.libraries(caps), files, hook_command())
    for gpu in chosen:
        edits = edits + gpu_edits(gpu)
    for parent, mig in migs:
        edits = edits + mig_edits(parent, mig)
    return edits


def _ask_kubelet_if_needed(view: Any, config: Config) -> Tuple[Any, Any, str, List[str]]:
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


def _pod_annotations(bundle: str, view: Any, config: Config) -> Optional[Dict[str, str]]:
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


def _allowed(gpus: Sequence[Any], ids: Sequence[str]) -> Dict[str, str]:
    """UUID → id for every GPU/MIG device the device ids name (unknown ids are skipped)."""
    refs = tuple(g.ref() for g in gpus)
    out: Dict[str, str] = {}
    for ident in ids:
        tokens = parse_visible_devices(ident)
        if not tokens or tokens[0] in ("all", "none"):
            continue
        try:
            chosen, migs = select_gpus(tokens, refs)
        except RequestError:
            continue
        for ref in chosen:
            out.setdefault(ref.uuid, ident)
        for mig in migs:
            out.setdefault(mig.uuid, ident)
    return out


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


def _gpus_of_nodes(host: Any, edits: Edits) -> Tuple[Tuple[Any, ...], Tuple[Tuple[Any, Any], ...]]:
    """(whole GPUs, (parent, MIG device) pairs) whose device nodes the edits inject.

    A MIG device is granted when all its capability nodes are; its parent's node then
    belongs to the MIG device, not to a whole-GPU grant.
    """
    numbers = {(n.major, n.minor) for n in edits.device_nodes}
    gpus = host.gpus()
    migs = [(g, m) for g in gpus for m in g.mig
            if m.cap_nodes and all((c.major, c.minor) in numbers for c in m.cap_nodes)]
    mig_parents = {g.index for g, _ in migs}
    whole = tuple(g for g in gpus if g.node is not None and g.index not in mig_parents
                  and (g.node.major, g.node.minor) in numbers)
    return whole, tuple(migs)


def _fill_device_nodes(edits: Edits) -> Edits:
    """CDI device nodes without type/major get them from the host node (as CDI does)."""
    from nvshim._record import replace
    from nvshim.host.discovery import Host

    probe = Host("/", "/")  # CDI hostPaths are absolute host paths
    nodes = []
    for node in edits.device_nodes:
        if node.type is not None and (node.major is not None or node.type == "p"):
            nodes.append(node)
            continue
        stat_node = probe.device_node(node.source)
        if stat_node is None:
            raise HostError(f'CDI device node host path "{node.source}" does not exist')
        if node.type is not None and node.type != stat_node.type:
            raise RequestError(
                f'CDI device node {node.path}: type "{node.type}" does not match the host '
                f'node {node.source} ("{stat_node.type}")'
            )
        nodes.append(
            replace(
                node,
                type=stat_node.type,
                major=stat_node.major,
                minor=stat_node.minor,
                file_mode=node.file_mode if node.file_mode is not None else stat_node.file_mode,
            )
        )
    return replace(edits, device_nodes=tuple(nodes))


def commit(plan: Plan, log: Any = None) -> bool:
    """Do the in-root work (when the runtime does it), then write config.json atomically.

    Returns False (no write) when config.json would not change. When the rootfs turns out
    not to be writable the hook is added instead (``plan.rootwork_by`` becomes ``hook``).
    """
    if plan.rootwork_by == "runtime":
        from nvshim.runtime import rootwork

        try:
            plan.warnings.extend(rootwork.prepare(plan.rootwork_why, plan.rootwork))
        except rootwork.Fallback as exc:
            plan.rootwork_by, plan.rootwork_why = "hook", exc.reason
            plan.new_spec = apply_edits(plan.spec, plan.applied_edits())
        if log is not None:
            log.event("rootfs", by=plan.rootwork_by, detail=plan.rootwork_why,
                      warnings=list(plan.warnings))
    elif plan.rootwork_by and log is not None:
        log.event("rootfs", by=plan.rootwork_by, detail=plan.rootwork_why)
    if not plan.changed:
        return False
    from nvshim.files import write_atomic

    if plan.params is not None:
        write_atomic(plan.params[0], plan.params[1], 0o444, durable=False)
    # No fsync: config.json is the engine's, regenerated for every create (bundles live in
    # /run for containerd); the rename makes the write atomic for runc, which reads it next.
    write_atomic(plan.spec_path, plan.new_bytes(), durable=False)
    return True


#: The env names nvshim.runtime.extras reads (a test keeps this equal to its own lists).
EXTRAS_ENV = ("NVIDIA_IMEX_CHANNELS", "NVIDIA_NVSWITCH", "NVIDIA_GDS", "NVIDIA_MOFED",
              "NVIDIA_GDRCOPY")


def _claims_imex(view: Any) -> bool:
    """Whether the container names an IMEX channel (device-plugin mount or env); cheap."""
    if view.sandbox:
        return False
    value = view.get("NVIDIA_IMEX_CHANNELS")
    return bool(value and value.strip()) or any(
        "/imex/" in str(m.get("destination", "")) for m in view.mounts)


def _extras(view: Any, config: Config, request: Request) -> Any:
    """IMEX channels and NVSwitch/GDS/MOFED/gdrcopy devices asked for (see nvshim.runtime.extras);
    None, without importing that module, when the spec names none of them."""
    if not any(name in view.env for name in EXTRAS_ENV) and not any(
        "/imex/" in str(m.get("destination", "")) for m in view.mounts
    ):
        return None
    from nvshim.runtime.extras import resolve_extras

    return resolve_extras(view, config, request)
