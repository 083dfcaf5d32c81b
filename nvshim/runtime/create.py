"""The create road: config.json → claim → request → grant → rootfs decision → new config.json.

:func:`plan_create` computes everything without writing (``nvshim inspect`` prints the
plan); :func:`commit` does the in-root work, writes the new config.json atomically when it
differs, and returns what it did. Discovery is not touched for a container that asks for
nothing.

This module sequences the road. Each stage returns what it decides, a frozen record or a
value, or raises; nothing writes into a shared plan, and the :class:`Plan` is built once,
at the end, from the stages' records (:mod:`nvshim.runtime.plan` holds the records).
``_plan`` calls them in this order, one function each: ``_claim_stage``,
``_kubelet_stage``, :func:`~nvshim.runtime.request.resolve_request`, ``_engine_stage``,
``_extras_stage``, then, for a container that gets anything, ``_grant_stage`` (with
``_cdi_stage`` and ``_check_grant``) and ``_decide_rootwork``:

- the claim: what config.json claims, parsed once (:func:`~nvshim.runtime.claim.read_claim`),
  with the GPUs the engine already injected (:mod:`~nvshim.runtime.engine`, only for a
  spec listing character devices);
- require-allocation's record of the kubelet
  (:class:`~nvshim.runtime.allocation.policy.Verification`, only when it is needed);
- the request: the source and the devices (:func:`~nvshim.runtime.request.resolve_request`);
- the grant (:class:`~nvshim.runtime.plan.Grant`): GPUs and MIG devices by device token
  (:func:`~nvshim.runtime.hostedits.inject_gpus`, over :mod:`~nvshim.host.devices`), CDI
  devices (:func:`~nvshim.runtime.cdiedits.inject_cdi`), the engine's devices, the
  extras (:mod:`~nvshim.runtime.extras`), the edits that give them
  (:mod:`~nvshim.runtime.hostedits`) and the params copy
  (:func:`~nvshim.runtime.devparams.params_hook`);
- the rootfs decision (:class:`~nvshim.runtime.plan.RootfsDecision`): who makes the SONAME
  links, the ld.so.cache and the EGL application profile (:mod:`~nvshim.runtime.rootwork`).

Messages go on two channels, in the order the stages speak: notes (every decision, shown
by ``inspect``) and warnings (what an operator must hear though the create goes on: sent
to runc's ``--log``; each warning is a note too).

What only some creates run lives where it is imported only for them: the engine's grant
(:mod:`~nvshim.runtime.engine`, a spec with character devices or Docker's ``--gpus``
hook), require-allocation (:mod:`~nvshim.runtime.allocation`), the extras, the
requirements, the debug log.

Why one module: it is the road's order and nothing else. Each stage is a short function that
calls the module owning its decision and returns a record; the order is the behaviour (the
kubelet's record before the request, the grant before the rootfs decision, nothing written
before the plan is whole), and split across files it could no longer be read in one place.
"""

from __future__ import annotations

import os

from nvshim.edits import Edits, Hook, apply_edits
from nvshim.errors import SPEC_FILE, RequestError, SpecError
from nvshim.runtime.claim import VISIBLE_DEVICES, image_view, read_claim
from nvshim.runtime.plan import Committed, Grant, Plan, RootfsDecision, applied_edits
from nvshim.runtime.request import resolve_request

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence, Tuple

    from nvshim.config import Config
    from nvshim.host.devices import MigDevice
    from nvshim.host.discovery import Gpu, Host
    from nvshim.runtime.allocation.policy import Verification
    from nvshim.runtime.claim import Claim
    from nvshim.runtime.engine import EngineGrant, EngineHooks
    from nvshim.runtime.extras import Extras
    from nvshim.runtime.hostedits import GpuInjection
    from nvshim.runtime.logs import DebugLog
    from nvshim.runtime.request import Request

    #: A decoded config.json object: JSON values of any shape (Any: nvshim keeps what it
    #: does not edit, unknown fields included, so the dict is never typed further).
    SpecDict = Dict[str, Any]
    Migs = Tuple[Tuple[Gpu, MigDevice], ...]
    """(parent GPU, MIG device) pairs."""

__all__ = ["plan_create", "commit", "REWRITTEN", "SERVED_BY"]

#: The env entry that keeps anything downstream from injecting again (or strips a request).
_VOID = Edits(env=(f"{VISIBLE_DEVICES}=void",))


def plan_create(
    bundle: str,
    config: Config,
    host: Optional[Host] = None,
    log: Optional[DebugLog] = None,
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


class _Node:
    """The node's :class:`Host`, looked up at most once per create and only when a stage
    needs it (the plan cache, else discovery); ``source`` says where its plan came from
    (``""``: given by the caller, or not looked up)."""

    __slots__ = ("config", "save_cache", "host", "source")

    def __init__(self, config: Config, save_cache: bool, host: Optional[Host]) -> None:
        self.config, self.save_cache, self.host, self.source = config, save_cache, host, ""

    def get(self) -> Host:
        if self.host is None:
            from nvshim.runtime.plancache import host_for

            self.host, self.source = host_for(self.config, self.save_cache)
        return self.host


def plan_spec(
    spec: SpecDict,
    config: Config,
    pod: Optional[Dict[str, str]],
    label: str,
    host: Optional[Host] = None,
    save_cache: bool = False,
) -> Plan:
    """The same road for a spec that is not in a bundle yet: what the NRI plugin
    (:mod:`nvshim.agent.nri`) sees at CreateContainer. ``pod``: the pod's annotations as
    the engine reported them (no sandbox bundle to read); ``label`` names the container in
    errors. With no ``root.path`` the in-root work is the createContainer hook's;
    ``save_cache``: rebuild a missing or stale node plan cache, as the runtime does."""
    return _plan("", config, host, None, save_cache, label, b"", spec, pod)


def _plan(
    bundle: str,
    config: Config,
    host: Optional[Host],
    log: Optional[DebugLog],
    save_cache: bool,
    spec_path: str,
    raw: bytes,
    spec: SpecDict,
    pod_override: Optional[Dict[str, str]] = None,
) -> Plan:
    """The road's stages in order. Each takes the records the stages before it returned
    and returns its own with what it said (notes; warnings are notes too); only this
    function collects what they said, and the :class:`Plan` is built once, at the end."""
    node = _Node(config, save_cache, host)
    claim, out, engine, notes = _claim_stage(spec, config, node)
    found, pod, kubelet_tokens, kubelet_ids, said = _kubelet_stage(
        bundle, claim, config, node, pod_override
    )
    notes += said
    warnings = list(found.warnings) if found is not None else []
    request = resolve_request(claim, config, pod, kubelet_tokens, kubelet_ids)
    if found is not None and found.allocation is not None and not request.shared:
        request = _shared_by_kubelet(request, found.allocation.ids)
    if node.source and log is not None:
        log.event("plan", source=node.source)
    hooks, said, stale = _engine_stage(spec, config, node.host, engine)
    notes += said + list(request.notes)
    warnings += stale
    if log is not None:
        _log_request(log, bundle, request, engine)
    if engine is not None and found is not None and found.allocation is not None:
        from nvshim.runtime.allocation.policy import check_engine_allocated

        assert node.host is not None  # the engine's grant was matched against it
        found, note = check_engine_allocated(found, node.host, engine, config)
        notes.append(note)
    extras, found, said = _extras_stage(claim, config, request, engine, found)
    notes += said

    grant = Grant(engine=engine, engine_hooks=hooks, base=None if out is spec else out)
    rootfs, cdi_source = RootfsDecision(), ""
    plan_host = node.host if engine is not None else None
    new_spec = grant.base
    if request.injects or extras or (hooks is not None and bool(hooks.replaced)):
        _refuse_host_root(spec, bundle)
        looked = node.host is None
        plan_host = node.get()
        if looked and log is not None:
            log.event("plan", source=node.source)
        grant, found, cdi_source, said, warned = _grant_stage(
            bundle, spec, claim, config, request, extras, grant, found, plan_host, save_cache, log
        )
        notes += said
        warnings += warned
        rootfs = _decide_rootwork(spec, bundle, plan_host, grant)
        applied = applied_edits(grant.edits, rootfs.by)
        if log is not None:
            log.event("edits", edits=applied.to_cdi())
        new_spec = apply_edits(spec if grant.base is None else grant.base, applied)
    elif request.set_void:
        new_spec = apply_edits(out, _VOID)
    return Plan(
        spec_path,
        raw,
        spec,
        claim,
        request,
        grant,
        rootfs,
        found.identity if found is not None else claim.view.identity,
        found.verified if found is not None else "none",
        found.allocation if found is not None else None,
        tuple(notes),
        tuple(warnings),
        node.source,
        cdi_source,
        plan_host,
        bundle,
        new_spec,
    )


def _shared_by_kubelet(request: Request, ids: Sequence[str]) -> Request:
    """``request`` marked shared when the kubelet allocated the container time-slicing
    replicas (``<uuid>::N``): NVIDIA's device plugin hands the container the bare UUID in
    its env or mounts, so only the kubelet's record says the GPU is shared."""
    if not request.injects or not ids:
        return request
    from nvshim.host.devices import names_replicas

    if not names_replicas(ids):
        return request
    from nvshim._record import replace

    return replace(request, shared=True)


def _claim_stage(
    spec: SpecDict, config: Config, node: _Node
) -> Tuple[Claim, SpecDict, Optional[EngineGrant], List[str]]:
    """(the claim, the spec the edits go onto, the engine's grant, notes): what config.json
    claims, parsed once, with the GPUs the engine already injected (CDI, DRA) and without
    Docker's ``--gpus`` hook (nvshim gives those GPUs itself)."""
    notes: List[str] = []
    view = image_view(spec)
    out = spec
    if view.docker_hooks:
        from nvshim.runtime.engine import without_hooks

        out = without_hooks(spec, [("prestart", h) for h in view.docker_hooks])
        notes += [
            f"docker run --gpus: Docker's prestart hook {h['path']} removed from "
            "config.json (nvshim gives the container its GPUs itself)"
            for h in view.docker_hooks
        ]
    engine: Optional[EngineGrant] = None
    if view.char_devices:
        # GPUs the engine injected (CDI, DRA), by number; a privileged container's are the
        # host's every device: held and journaled, no grant
        from nvshim._record import replace
        from nvshim.runtime.engine import find_engine_grant

        engine, node.host, node.source = find_engine_grant(
            view.char_devices, config, node.host, node.save_cache, view.privileged_with_devices
        )
        if engine is not None and not engine.privileged:
            if view.sandbox:  # a pause container never holds a GPU: the marker is forged
                from nvshim.errors import RequestError

                raise RequestError(
                    f"a CRI sandbox (pause) container holds {engine.summary or 'an IMEX channel'}"
                    " the engine injected; a sandbox never holds NVIDIA devices, so its "
                    "sandbox annotations are not its engine's: refusing it"
                )
            view = replace(view, engine=engine)
    return read_claim(view, config), out, engine, notes


def _kubelet_stage(
    bundle: str,
    claim: Claim,
    config: Config,
    node: _Node,
    pod_override: Optional[Dict[str, str]] = None,
) -> Tuple[
    Optional[Verification], Optional[Dict[str, str]], Tuple[str, ...], Tuple[str, ...], List[str]
]:
    """(require-allocation's record of the kubelet, the pod's annotations, the kubelet's
    GPU tokens and ids for the ``kubelet`` source, notes); nothing, without importing
    :mod:`nvshim.runtime.allocation`, when require-allocation needs neither.
    ``pod_override``: the pod's annotations as the NRI engine reported them (no sandbox
    bundle to read them from)."""
    if not _needs_allocation_module(claim, config):
        return None, None, (), (), []
    from nvshim.runtime.allocation import policy

    found = policy.ask_kubelet_if_needed(claim, config)
    pod = policy.pod_annotations(bundle, claim, config) if pod_override is None else pod_override
    notes = list(found.notes)
    if (
        found.allocation is None
        or not found.allocation.ids
        or "kubelet" not in config.allocation_sources
    ):
        return found, pod, (), (), notes
    # the kubelet source grants these ids as GPUs: only those that are GPUs of this node
    found = policy.with_named(found, node.get().gpus())
    assert found.named is not None
    notes += [
        f'kubelet device id "{i}" names no GPU of this node (another '
        "resource's device): not granted"
        for i in found.named.other_ids
    ]
    return found, pod, found.named.gpu_tokens, found.named.gpu_ids, notes


def _engine_stage(
    spec: SpecDict, config: Config, host: Optional[Host], engine: Optional[EngineGrant]
) -> Tuple[Optional[EngineHooks], List[str], List[str]]:
    """(the in-root hooks of the engine's spec, notes, warnings): what the engine's grant
    brings besides its devices, and whether the CDI spec it injected from is stale."""
    if engine is None:
        return None, [], []
    from nvshim.runtime.cdiedits import engine_stale
    from nvshim.runtime.engine import engine_hooks

    hooks = engine_hooks(spec)
    assert host is not None  # the engine's grant was matched against it
    stale = list(engine_stale(spec, config, host))
    return hooks, list(engine.notes) + list(hooks.notes) + stale, stale


def _log_request(
    log: DebugLog, bundle: str, request: Request, engine: Optional[EngineGrant]
) -> None:
    log.event(
        "request",
        bundle=bundle,
        source=request.source,
        devices=list(request.devices),
        capabilities=list(request.capabilities),
        notes=list(request.notes),
        **(
            {
                "engine": [g.uuid for g in engine.gpus] + [m.uuid for _, m in engine.migs],
                "engine_imex": list(engine.imex),
            }
            if engine is not None
            else {}
        ),
    )


def _extras_stage(
    claim: Claim,
    config: Config,
    request: Request,
    engine: Optional[EngineGrant],
    found: Optional[Verification],
) -> Tuple[Optional[Extras], Optional[Verification], List[str]]:
    """(IMEX channels and NVSwitch/GDS/MOFED/gdrcopy devices asked for, the kubelet's
    record after checking the channels, notes); None without importing
    :mod:`nvshim.runtime.extras` when the spec names none of them."""
    if not claim.asks_for_extras:
        return None, found, []
    from nvshim.runtime.extras import resolve_extras

    extras = resolve_extras(claim, config, request)
    if engine is not None and engine.imex and config.engine_grants == "exclusive":
        from nvshim.runtime.extras import without_env_channels

        extras = without_env_channels(extras, engine, claim.imex_env)
    notes = list(extras.notes)
    if extras.imex_channels and found is not None and found.allocation is not None:
        from nvshim.runtime.allocation.policy import check_imex_allocated

        found, note = check_imex_allocated(found, extras, config)
        notes.append(note)
    return extras, found, notes


def _grant_stage(
    bundle: str,
    spec: SpecDict,
    claim: Claim,
    config: Config,
    request: Request,
    extras: Optional[Extras],
    held: Grant,
    found: Optional[Verification],
    host: Host,
    save_cache: bool,
    log: Optional[DebugLog],
) -> Tuple[Grant, Optional[Verification], str, List[str], List[str]]:
    """(the grant, the kubelet's record after checking it, where the CDI registry came
    from, notes, warnings): the edits of the CDI names, of the device tokens and of the
    extras, fitted to what the engine injected, and the params hook. ``held`` is what the
    stages before gave: the engine's grant and hooks, the spec without Docker's hook."""
    # what gives the container anything: not loaded for a create that gets nothing
    from nvshim.runtime.hostedits import GpuInjection, inject_gpus

    edits, cdi_source, warnings, params = _cdi_stage(request, config, host, save_cache, log)
    notes = list(warnings)
    tokens = request.gpu_tokens
    node = GpuInjection()
    if tokens or (request.driver_files and not request.cdi_names):
        node = inject_gpus(host, request, tokens, claim, config)
        notes += node.notes
        warnings += node.warnings
        edits = edits + node.edits
        params = config.disable_device_node_modification
    found, cdi_gpus, cdi_migs, said = _check_grant(found, host, request, config, node, edits)
    notes += said
    if extras:
        from nvshim.runtime.extras import extras_edits

        more = extras_edits(host, extras)
        edits = edits + more.edits
        notes += more.notes
        if request.set_void:
            edits = edits + _VOID
    base, hooks = held.base, held.engine_hooks
    if hooks is not None:
        from nvshim.runtime.engine import fit_edits

        edits, fitted = fit_edits(spec if base is None else base, edits, hooks)
        base = base if fitted is None else fitted
        params = params or (hooks.params and config.disable_device_node_modification)
    copy: Optional[Tuple[str, bytes]] = None
    shown = _params(spec, bundle, host.driver_root) if params else None
    if shown is not None:
        hook, copy = shown
        edits = edits + Edits(hooks=(hook,))
        notes.append("the container's /proc/driver/nvidia/params will say ModifyDeviceFiles: 0")
    grant = Grant(
        node.gpus,
        node.migs,
        request.cdi_names,
        cdi_gpus,
        cdi_migs,
        held.engine,
        hooks,
        edits,
        base,
        copy,
        node.missing,
    )
    return grant, found, cdi_source, notes, warnings


def _cdi_stage(
    request: Request, config: Config, host: Host, save_cache: bool, log: Optional[DebugLog]
) -> Tuple[Edits, str, List[str], bool]:
    """(the edits of the create's CDI names, cut to the capabilities asked for; where the
    registry came from; its warnings; whether a generated spec's params hook was dropped,
    since the runtime's own does it cheaper)."""
    if not request.cdi_names:
        return Edits(), "", [], False
    from nvshim.runtime.cdiedits import inject_cdi
    from nvshim.runtime.devparams import without_spec_hooks

    cdi = inject_cdi(request.cdi_names, config, request.capabilities, host, save_cache)
    if log is not None:
        log.event("cdi", source=cdi.source)
    edits, params = without_spec_hooks(cdi.edits)
    return edits, cdi.source, list(cdi.warnings), params and config.disable_device_node_modification


def _check_grant(
    found: Optional[Verification],
    host: Host,
    request: Request,
    config: Config,
    node: GpuInjection,
    edits: Edits,
) -> Tuple[Optional[Verification], Tuple[Gpu, ...], Migs, List[str]]:
    """(the kubelet's record after checking the grant, the GPUs and MIG devices the CDI
    names bring, notes): under require-allocation every granted GPU must be the
    container's allocation."""
    cdi_gpus: Tuple[Gpu, ...] = ()
    cdi_migs: Migs = ()
    allocated = found is not None and found.allocation is not None
    if request.cdi_names and (config.grants_journal or allocated):
        from nvshim.runtime.hostedits import gpus_of_edits

        cdi_gpus, cdi_migs = gpus_of_edits(host, edits)
    if not allocated or request.source in ("kubelet", "engine"):
        return found, cdi_gpus, cdi_migs, []
    from nvshim.runtime.allocation.policy import check_granted

    assert found is not None
    found, said = check_granted(
        found, host, node.gpus + cdi_gpus, node.migs + cdi_migs, request, config
    )
    return found, cdi_gpus, cdi_migs, list(said)


def _refuse_host_root(spec: SpecDict, bundle: str) -> None:
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
    raise RequestError(
        f"the container's rootfs {shown} is the host's /: nvshim injects no "
        f"driver files into the host (bundle {where})"
    )


def _needs_allocation_module(claim: Claim, config: Config) -> bool:
    """Whether require-allocation must ask the kubelet or read the pod's annotations
    (:mod:`nvshim.runtime.allocation.policy`, not imported otherwise); cheap."""
    if not config.require_allocation or claim.view.sandbox:
        return False
    if claim.view.management_pod(config.management_pods) is not None:
        return False  # granted what it asks for: no allocation to verify
    if config.verify_with == "kubelet" or "kubelet" in config.allocation_sources:
        return True
    return bool(claim.annotation_keys)


def _params(
    spec: SpecDict, bundle: str, driver_root: str
) -> Optional[Tuple[Hook, Tuple[str, bytes]]]:
    """(the hook showing ``ModifyDeviceFiles: 0``, (the bundle file it binds, its content))
    when the host's params say 1 (:mod:`nvshim.runtime.devparams`); None otherwise."""
    from nvshim.runtime.devparams import BUNDLE_FILE, modified_params, params_hook

    content = modified_params(driver_root)
    if content is None:
        return None
    from nvshim.runtime.rootwork import rootfs_path

    # absolute, as runc resolves it: the hook runs in whatever directory runc gives it
    rootfs = rootfs_path(spec, os.path.abspath(bundle))
    if rootfs is None:
        return None
    copy = os.path.join(os.path.abspath(bundle), BUNDLE_FILE)
    return params_hook(rootfs, copy), (copy, content)


def _decide_rootwork(spec: SpecDict, bundle: str, host: Host, grant: Grant) -> RootfsDecision:
    """Who makes the SONAME links and the ld.so.cache: the runtime (now) or the hook."""
    from nvshim.runtime import rootwork
    from nvshim.runtime.plancache import CachedHost
    from nvshim.runtime.rootcache import elf_info

    # the plan cache knows the driver libraries' ELF facts; live discovery reads them
    info = host.elf_info if isinstance(host, CachedHost) else elf_info
    mounts = grant.edits.mounts
    if grant.engine is not None:
        from nvshim.runtime.engine import spec_mounts

        mounts = mounts + spec_mounts(spec)  # the libraries the engine mounts
    work = rootwork.work_from_hooks(
        grant.edits.hooks,
        mounts,
        info,
        grant.edits.device_nodes,
        spec if grant.base is None else grant.base,
    )
    if work is None:
        return RootfsDecision()
    by, why = rootwork.decide(spec, bundle, work)
    return RootfsDecision(work, by, why)


def _live(log: Optional[DebugLog]) -> Optional[DebugLog]:
    """``log`` when it records anything, else None: a disabled debug log (the default) must
    not cost the arguments of its events (the edits' CDI form, lists) on every create."""
    return log if log is not None and log.enabled else None


def commit(plan: Plan, log: Optional[DebugLog] = None, served_by: str = "runtime") -> Committed:
    """Do the in-root work (when the runtime does it), then write config.json atomically.

    Writes nothing when config.json would not change. When the rootfs turns out not to be
    writable the hook does the work instead: the result says so (``rootfs.by`` ``hook``)
    and holds the config.json written with the hook.
    """
    log = _live(log)
    from nvshim.files import check_executable

    for hook in plan.grant.edits.hooks:  # nvshim's, the params hook, CDI specs': run as root
        check_executable(hook.path, "hook")
    rootfs, new_spec = plan.rootfs, plan.new_spec
    warnings: Tuple[str, ...] = ()
    if rootfs.by == "runtime":
        from nvshim.runtime import rootwork

        assert rootfs.work is not None
        try:
            warnings = tuple(rootwork.prepare(rootfs.why, rootfs.work))
        except rootwork.Fallback as exc:
            rootfs = RootfsDecision(rootfs.work, "hook", exc.reason)
            try:
                new_spec = plan.render(rootfs)
            except SpecError as error:  # e.g. hooks of the wrong type, met only now
                if error.file != SPEC_FILE:
                    raise
                raise error.in_file(plan.spec_path) from error
        if log is not None:
            log.event("rootfs", by=rootfs.by, detail=rootfs.why, warnings=list(warnings))
    elif rootfs.by and log is not None:
        log.event("rootfs", by=rootfs.by, detail=rootfs.why)
    if new_spec is None or new_spec == plan.spec:
        return Committed(rootfs, new_spec, False, warnings)
    from nvshim.files import write_atomic

    if plan.grant.params is not None:
        write_atomic(plan.grant.params[0], plan.grant.params[1], 0o444, durable=False)
    new_spec = _marked(new_spec, plan, served_by)
    # No fsync: config.json is the engine's, regenerated for every create (bundles live in
    # /run for containerd); the rename makes the write atomic for runc, which reads it next.
    write_atomic(plan.spec_path, plan.new_bytes(new_spec), durable=False)
    return Committed(rootfs, new_spec, True, warnings)


#: The annotation a config.json nvshim-runtime rewrote carries (value: the grant's source,
#: ``stripped``, or the request's source): ``nvshim inspect`` reads a live bundle by it
#: instead of planning the rewritten spec again. Nothing in create trusts it.
REWRITTEN = "nvshim.io/rewritten"

#: Set to ``agent`` when the resident agent's fast path (:mod:`nvshim.agent`) rewrote it;
#: absent when nvshim-runtime's own Python did: ``nvshim inspect`` shows which.
SERVED_BY = "nvshim.io/served-by"


def _marked(spec: SpecDict, plan: Plan, served_by: str = "runtime") -> SpecDict:
    """``spec`` with the :data:`REWRITTEN` and :data:`SERVED_BY` annotations (unless its
    annotations are not an object: then as it is)."""
    annotations = spec.get("annotations")
    if annotations is not None and not isinstance(annotations, dict):
        return spec
    mark = (
        plan.grant_source
        if plan.granted_uuids
        else ("stripped" if plan.request.set_void else plan.request.source)
    )
    marks = {REWRITTEN: mark}
    if served_by != "runtime":  # the runtime's own rewrite stays as it always was
        marks[SERVED_BY] = served_by
    return dict(spec, annotations=dict(annotations or {}, **marks))
