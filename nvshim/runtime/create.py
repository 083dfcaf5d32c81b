"""The create road: config.json → request → discovery → edits → new config.json.

:func:`plan_create` computes everything without writing (``nvshim inspect`` prints the
plan); :func:`commit` writes the new config.json atomically when it differs.
Discovery is not touched for a container that asks for nothing.

This module sequences the road; each step's rules live with their job and load only when
the spec needs them: reading config.json (:mod:`~nvshim.runtime.specjson`), what the engine
already injected (:mod:`~nvshim.runtime.engine`, only for a spec listing character
devices), the request (:mod:`~nvshim.runtime.request`, :mod:`~nvshim.runtime.tokens`),
require-allocation's
kubelet check (:mod:`~nvshim.runtime.allocation`), the edits
(:mod:`~nvshim.runtime.hostedits`, :mod:`~nvshim.runtime.extras`), the hook's command
line (:mod:`~nvshim.runtime.hookargs`) and the in-root work
(:mod:`~nvshim.runtime.rootwork`).
"""

from __future__ import annotations

import os

from nvshim._record import dataclass, field
from nvshim.config import Config, describe_config
from nvshim.edits import Edits
from nvshim.errors import SPEC_FILE, RequestError, SpecError
from nvshim.runtime.apply import apply_edits
from nvshim.runtime.hostedits import (
    driver_edits,
    gpu_edits,
    inject_cdi,
    mig_edits,
    skew_message,
)
from nvshim.runtime.request import (
    VISIBLE_DEVICES,
    Claim,
    Request,
    identity_of,
    image_view,
    read_claim,
    resolve_request,
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
    """Who does it: ``runtime`` (before runc), ``hook`` (createContainer), ``nobody`` (the
    rootfs is the host's /), ``""`` (there is none)."""
    rootwork_why: str = ""
    """``runtime``: the rootfs written; ``hook``, ``nobody``: why the runtime does not."""
    warnings: List[str] = field(default_factory=list)
    plan_source: str = ""
    """Where the node's plan came from: the plan cache, or discovery (and why)."""
    cdi_source: str = ""
    """Where the CDI registry came from: the spec index, or a scan (and why)."""
    host: Any = None
    view: Any = None
    """The request view of config.json (:class:`nvshim.runtime.request.ImageView`), parsed once."""

    identity: Any = None
    """The Kubernetes container (:class:`nvshim.runtime.allocation.kubelet.Identity`) of a CRI
    container."""
    verified: str = "none"
    """``kubelet`` (every GPU checked against its record), ``unreachable`` (claims
    trusted), ``none``."""
    allocation: Any = None
    """What the kubelet allocated (:class:`nvshim.runtime.allocation.kubelet.Allocation`), if
    asked."""
    cdi_gpus: Tuple[Any, ...] = ()
    """Whole GPUs the granted CDI devices bring (by their device nodes)."""
    cdi_migs: Tuple[Tuple[Any, Any], ...] = ()
    """(parent GPU, MIG device) pairs the granted CDI devices bring (by their MIG caps)."""
    missing: Tuple[str, ...] = ()
    """Essential driver files of the requested capabilities the node lacks (``inspect``)."""
    log_warnings: List[str] = field(default_factory=list)
    """Things an operator must hear about even though create goes on (runc --log warnings)."""
    params: Optional[Tuple[str, bytes]] = None
    """(bundle file, content): the ``ModifyDeviceFiles: 0`` copy the params hook binds."""
    engine_gpus: Tuple[Any, ...] = ()
    """Whole GPUs the engine already injected into config.json (:mod:`nvshim.runtime.engine`)."""
    engine_migs: Tuple[Tuple[Any, Any], ...] = ()
    """(parent GPU, MIG device) pairs the engine already injected."""
    engine_imex: Tuple[int, ...] = ()
    """IMEX channels the engine already injected."""
    engine_hooks: Any = None
    """The in-root hooks of the engine's spec (:class:`nvshim.runtime.engine.EngineHooks`)."""
    base: Optional[Dict[str, Any]] = None
    """The spec the edits are applied to, when it is not ``spec``: without the engine's
    hooks whose binary this node lacks (nvshim does their work)."""

    @property
    def granted_uuids(self) -> Tuple[str, ...]:
        """UUIDs of every GPU and MIG device granted (the grant journal records these)."""
        out = [g.uuid for g in self.gpus] + [m.uuid for _, m in self.migs]
        out += [g.uuid for g in self.cdi_gpus] + [m.uuid for _, m in self.cdi_migs]
        out += [g.uuid for g in self.engine_gpus] + [m.uuid for _, m in self.engine_migs]
        return tuple(dict.fromkeys(out))

    @property
    def grant_source(self) -> str:
        """The journal's source: the request's, ``+engine`` when the engine injected GPUs
        besides what another source granted."""
        source = self.request.source
        if (self.engine_gpus or self.engine_migs) and source != "engine":
            return f"{source}+engine"
        return source

    def applied_edits(self) -> Edits:
        """The edits config.json gets: without nvshim's hook when the runtime does its work
        or nobody does (the rootfs is the host's /)."""
        if self.rootwork_by not in ("runtime", "nobody"):
            return self.edits
        from nvshim._record import replace
        from nvshim.runtime.hookargs import is_nvshim_hook

        hooks = tuple(h for h in self.edits.hooks if not is_nvshim_hook(h))
        return replace(self.edits, hooks=hooks)

    @property
    def changed(self) -> bool:
        return self.new_spec is not None and self.new_spec != self.spec

    def render(self) -> Dict[str, Any]:
        """The new config.json: :meth:`applied_edits` applied to :attr:`base` (pure)."""
        return apply_edits(self.spec if self.base is None else self.base, self.applied_edits())

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
    it missing or stale. A SpecError about the file names the bundle's config.json.
    """
    from nvshim.runtime.specjson import read_spec

    spec_path, raw, spec = read_spec(bundle)
    try:
        return _plan(bundle, config, host, _live(log), save_cache, spec_path, raw, spec)
    except SpecError as exc:
        if exc.file != SPEC_FILE:
            raise
        # the pure readers' "config.json" made this bundle's: which container's spec is wrong
        raise exc.in_file(spec_path) from exc


def _plan(bundle: str, config: Config, host: Any, log: Any, save_cache: bool,
          spec_path: str, raw: bytes, spec: Dict[str, Any]) -> Plan:
    view = image_view(spec)
    plan_source = ""
    if view.char_devices and not view.sandbox and not view.privileged_with_devices:
        # GPUs the engine injected (CDI, DRA), by number; a privileged container's are the
        # host's every device, no grant
        from nvshim._record import replace
        from nvshim.runtime.engine import find_engine_grant

        held, host, plan_source = find_engine_grant(view.char_devices, config, host, save_cache)
        if held is not None:
            view = replace(view, engine=held)
    claim = read_claim(view, config)
    engine: Any = view.engine
    identity: Any = identity_of(view.annotations)
    allocation: Any = None
    verified = "none"
    early_notes: List[str] = []
    pod: Optional[Dict[str, str]] = None
    found: Any = None
    kubelet_tokens: Tuple[str, ...] = ()
    kubelet_ids: Tuple[str, ...] = ()
    if _needs_allocation_module(claim, config):
        from nvshim.runtime.allocation import policy

        found = policy.ask_kubelet_if_needed(claim, config)
        identity, allocation, verified = found.identity, found.allocation, found.verified
        early_notes = list(found.notes)
        pod = policy.pod_annotations(bundle, claim, config)
        if allocation is not None and allocation.ids \
                and "kubelet" in config.allocation_sources:
            # the kubelet source grants these ids as GPUs: only those that are GPUs of this node
            if host is None:
                from nvshim.runtime.plancache import host_for

                host, plan_source = host_for(config, save_cache)
            found = policy.with_named(found, host.gpus())
            kubelet_tokens, kubelet_ids = found.named.gpu_tokens, found.named.gpu_ids
            early_notes = early_notes + [
                f'kubelet device id "{i}" names no GPU of this node (another resource\'s '
                "device): not granted" for i in found.named.other_ids]
    request = resolve_request(claim, config, pod, kubelet_tokens, kubelet_ids)
    plan = Plan(spec_path, raw, spec, request, capabilities=request.capabilities)
    plan.plan_source = plan_source
    if plan_source and log is not None:
        log.event("plan", source=plan_source)
    plan.identity, plan.allocation, plan.verified = identity, allocation, verified
    plan.view = view
    plan.notes.extend(early_notes)
    if verified == "unreachable":
        plan.log_warnings.extend(early_notes)
    hooks: Any = None
    if engine is not None:
        plan.host = host
        plan.engine_gpus, plan.engine_migs, plan.engine_imex = engine.gpus, engine.migs, engine.imex
        plan.notes.extend(engine.notes)
        from nvshim.runtime.engine import engine_hooks

        hooks = plan.engine_hooks = engine_hooks(spec)
        plan.notes.extend(hooks.notes)
    plan.notes.extend(request.notes)
    if log is not None:
        log.event(
            "request",
            bundle=bundle,
            source=request.source,
            devices=list(request.devices),
            capabilities=list(request.capabilities),
            notes=list(request.notes),
            **({"engine": [g.uuid for g in plan.engine_gpus]
                + [m.uuid for _, m in plan.engine_migs],
                "engine_imex": list(plan.engine_imex)} if engine is not None else {}),
        )
    if engine is not None and plan.allocation is not None:
        from nvshim.runtime.allocation.policy import check_engine_allocated

        found, note = check_engine_allocated(found, host, engine, config)
        plan.allocation = found.allocation
        plan.notes.append(note)

    extras = _extras(claim, config, request)
    if extras is not None:
        if engine is not None and engine.imex and config.engine_grants == "exclusive":
            from nvshim.runtime.extras import without_env_channels

            extras = without_env_channels(extras, engine, claim.imex_env)
        plan.notes.extend(extras.notes)
        if extras.imex_channels and plan.allocation is not None:
            from nvshim.runtime.allocation.policy import check_imex_allocated

            found, note = check_imex_allocated(found, extras, config)
            plan.allocation = found.allocation
            plan.notes.append(note)
    replacing = hooks is not None and bool(hooks.replaced)
    if not request.injects and not extras and not replacing:
        if request.set_void:
            plan.new_spec = apply_edits(spec, Edits(env=(f"{VISIBLE_DEVICES}=void",)))
        return plan
    _refuse_host_root(spec, bundle)

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
        cdi = inject_cdi(cdi_names, config, request.capabilities, host, save_cache)
        plan.cdi_source = cdi.source
        if log is not None:
            log.event("cdi", source=cdi.source)
        plan.notes.extend(cdi.warnings)
        plan.log_warnings.extend(cdi.warnings)
        edits = cdi.edits
        plan.cdi_names = cdi_names

    tokens = request.gpu_tokens
    params = False
    if tokens or (request.driver_files and not cdi_names):
        edits = edits + _node_edits(host, request, tokens, plan, config)
        params = config.disable_device_node_modification
    if cdi_names and (config.grants_journal or plan.allocation is not None):
        plan.cdi_gpus, plan.cdi_migs = _gpus_of_nodes(host, edits)
    if plan.allocation is not None and request.source not in ("kubelet", "engine"):
        from nvshim.runtime.allocation.policy import check_allocated

        found, note = check_allocated(found, host, plan.gpus + plan.cdi_gpus,
                                      plan.migs + plan.cdi_migs, request.source, config)
        plan.allocation = found.allocation
        plan.notes.append(note)

    if extras:
        from nvshim.runtime.extras import extras_edits

        more = extras_edits(host, extras)
        edits = edits + more.edits
        plan.notes.extend(more.notes)
        if request.set_void:
            edits = edits + Edits(env=(f"{VISIBLE_DEVICES}=void",))
    if hooks is not None:
        from nvshim.runtime.engine import fit_edits

        edits, plan.base = fit_edits(spec, edits, hooks)
        params = params or (hooks.params and config.disable_device_node_modification)
    if params:
        edits = edits + _params_edits(plan, bundle, host.driver_root)
    plan.edits = edits
    plan.bundle = bundle
    _decide_rootwork(plan)
    if log is not None:
        log.event("edits", edits=plan.applied_edits().to_cdi())
    plan.new_spec = plan.render()
    return plan


def _refuse_host_root(spec: Dict[str, Any], bundle: str) -> None:
    """RequestError when the container's rootfs is the host's ``/`` (by any name).

    nvshim writes nothing there itself, but runc creates every mount target (empty files in
    the host's /usr/bin, library folder, /lib/firmware) before its ``pivot_root`` fails, so
    a create that would inject anything is refused with no mount added. One ``stat`` of the
    rootfs (``"/"`` itself needs none; the host root's own is kept per process).
    """
    from nvshim.runtime.rootwork import is_host_root, rootfs_path

    rootfs = rootfs_path(spec, bundle)
    if rootfs is None or not is_host_root(rootfs):
        return
    where = os.path.abspath(bundle)
    shown = rootfs_path(spec, where)
    raise RequestError(f"the container's rootfs {shown} is the host's /: nvshim injects no "
                       f"driver files into the host (bundle {where})")


def _needs_allocation_module(claim: Claim, config: Config) -> bool:
    """Whether require-allocation must ask the kubelet or read the pod's annotations
    (:mod:`nvshim.runtime.allocation.policy`, not imported otherwise); cheap."""
    if not config.require_allocation or claim.view.sandbox:
        return False
    if config.verify_with == "kubelet" or "kubelet" in config.allocation_sources:
        return True
    return bool(claim.annotation_keys)


def _params_edits(plan: Plan, bundle: str, driver_root: str) -> Edits:
    """The hook showing ``ModifyDeviceFiles: 0`` (nvshim.runtime.devparams) when the
    host's is 1."""
    from nvshim.runtime import devparams

    content = devparams.modified_params(driver_root)
    if content is None:
        return Edits()
    from nvshim.runtime.rootwork import rootfs_path

    # absolute, as runc resolves it: the hook runs in whatever directory runc gives it
    rootfs = rootfs_path(plan.spec, os.path.abspath(bundle))
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
    mounts = plan.edits.mounts
    if plan.view is not None and plan.view.engine is not None:
        from nvshim.runtime.engine import spec_mounts

        mounts = mounts + spec_mounts(plan.spec)  # the libraries the engine mounts
    work = rootwork.work_from_hooks(plan.edits.hooks, mounts, info)
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
    from nvshim.runtime.tokens import select_gpus

    try:
        chosen_refs, chosen_migs = (select_gpus(tokens, refs, _looked_under(config, host))
                                    if tokens else ((), ()))
    except RequestError as exc:
        if refs or os.path.isdir(host.driver_root):
            raise
        # no GPU at all under a driver root that is not there: most likely a typo
        raise RequestError(f"{exc}; driver root {host.driver_root} does not exist") from None
    by_index = {g.index: g for g in gpus}
    chosen = tuple(by_index[r.index] for r in chosen_refs)
    migs: List[Tuple[Any, Any]] = []
    for m in chosen_migs:
        parent = by_index[m.gpu_index]
        migs.append((parent, next(x for x in parent.mig if x.uuid == m.uuid)))
    plan.gpus = chosen
    plan.migs = tuple(migs)

    caps = request.capabilities
    view = plan.view
    env = view.env
    if "CUDA_VERSION" in env or any(name.startswith("NVIDIA_REQUIRE_") for name in env):
        # only then can there be a requirement (the module costs ~2 ms to import)
        from nvshim.runtime.requirements import check_requirements

        selected = plan.gpus + tuple(parent for parent, _ in plan.migs)
        check_requirements(view, host, selected, plan.notes, config.disable_require)

    from nvshim.runtime.hookargs import hook_command  # a create naming no device never loads it

    skew = host.version_skew()
    if skew is not None:
        warning = skew_message(*skew)
        plan.notes.append(warning)
        plan.log_warnings.append(warning)
    libraries, files = host.libraries(caps), host.driver_files(caps)
    from nvshim.host.discovery import missing_files

    plan.missing = missing_files(caps, libraries, files)
    edits = driver_edits(host.control_nodes(caps), libraries, files, hook_command())
    for gpu in chosen:
        edits = edits + gpu_edits(gpu)
    for parent, mig in migs:
        edits = edits + mig_edits(parent, mig)
    return edits


def _looked_under(config: Config, host: Any) -> str:
    """Where a create looked for GPUs: ``under driver root / (config /etc/nvshim/config.yaml)``."""
    return f"under driver root {host.driver_root} ({describe_config(config)})"


def _gpus_of_nodes(host: Any, edits: Edits) -> Tuple[Tuple[Any, ...], Tuple[Tuple[Any, Any], ...]]:
    """(whole GPUs, (parent, MIG device) pairs) whose device nodes the edits inject.

    A MIG device is granted when all its capability nodes are; its parent's node then
    belongs to the MIG device, not to a whole-GPU grant.
    """
    from nvshim.runtime.engine import gpus_of_numbers

    numbers = {(n.major, n.minor or 0) for n in edits.device_nodes if n.major is not None}
    return gpus_of_numbers(host.gpus(), numbers)


def _live(log: Any) -> Any:
    """``log`` when it records anything, else None: a disabled debug log (the default) must
    not cost the arguments of its events (the edits' CDI form, lists) on every create."""
    return log if log is not None and getattr(log, "enabled", True) else None


def commit(plan: Plan, log: Any = None) -> bool:
    """Do the in-root work (when the runtime does it), then write config.json atomically.

    Returns False (no write) when config.json would not change. When the rootfs turns out
    not to be writable the hook is added instead (``plan.rootwork_by`` becomes ``hook``).
    """
    log = _live(log)
    if plan.rootwork_by == "runtime":
        from nvshim.runtime import rootwork

        try:
            plan.warnings.extend(rootwork.prepare(plan.rootwork_why, plan.rootwork))
        except rootwork.Fallback as exc:
            plan.rootwork_by, plan.rootwork_why = "hook", exc.reason
            try:
                plan.new_spec = plan.render()
            except SpecError as error:  # e.g. hooks of the wrong type, met only now
                if error.file != SPEC_FILE:
                    raise
                raise error.in_file(plan.spec_path) from error
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


def _extras(claim: Claim, config: Config, request: Request) -> Any:
    """IMEX channels and NVSwitch/GDS/MOFED/gdrcopy devices asked for (see nvshim.runtime.extras);
    None, without importing that module, when the spec names none of them."""
    if not claim.asks_for_extras:
        return None
    from nvshim.runtime.extras import resolve_extras

    return resolve_extras(claim, config, request)
