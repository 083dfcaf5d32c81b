"""The create road: config.json → claim → request → grant → rootfs decision → new config.json.

:func:`plan_create` computes everything without writing (``nvshim inspect`` prints the
plan); :func:`commit` does the in-root work, writes the new config.json atomically when it
differs, and returns what it did. Discovery is not touched for a container that asks for
nothing.

This module sequences the road. Each stage returns what it decides, a frozen record or a
value, or raises; nothing writes into a shared plan, and the :class:`Plan` is built once,
at the end, from the stages' records (:mod:`nvshim.runtime.plan` holds the records):

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
  (:func:`~nvshim.runtime.hookargs.params_hook`);
- the rootfs decision (:class:`~nvshim.runtime.plan.RootfsDecision`): who makes the SONAME
  links, the ld.so.cache and the EGL application profile (:mod:`~nvshim.runtime.rootwork`).

Messages go on two channels, in the order the stages speak: notes (every decision, shown
by ``inspect``) and warnings (what an operator must hear though the create goes on: sent
to runc's ``--log``; each warning is a note too).

What only some creates run lives where it is imported only for them: the engine's grant
(:mod:`~nvshim.runtime.engine`, a spec with character devices or Docker's ``--gpus``
hook), require-allocation (:mod:`~nvshim.runtime.allocation`), the extras, the
requirements, the debug log.
"""

from __future__ import annotations

import os

from nvshim.edits import Edits, Hook, apply_edits
from nvshim.errors import SPEC_FILE, RequestError, SpecError
from nvshim.runtime.claim import VISIBLE_DEVICES, image_view, read_claim
from nvshim.runtime.plan import Committed, Grant, Plan, RootfsDecision, applied_edits
from nvshim.runtime.request import resolve_request

TYPE_CHECKING = False  # typing costs ~4 ms to import on the create path
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

    from nvshim.config import Config
    from nvshim.host.devices import MigDevice
    from nvshim.host.discovery import Gpu, Host
    from nvshim.runtime.allocation.policy import Verification
    from nvshim.runtime.claim import Claim
    from nvshim.runtime.engine import EngineGrant, EngineHooks
    from nvshim.runtime.extras import Extras
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


def plan_spec(spec: SpecDict, config: Config, pod: Optional[Dict[str, str]],
              label: str, host: Optional[Host] = None, save_cache: bool = False) -> Plan:
    """The same road for a spec that is not in a bundle yet: what the NRI plugin
    (:mod:`nvshim.agent.nri`) sees at CreateContainer. ``pod``: the pod's annotations as
    the engine reported them (no sandbox bundle to read); ``label`` names the container in
    errors. With no ``root.path`` the in-root work is the createContainer hook's;
    ``save_cache``: rebuild a missing or stale node plan cache, as the runtime does."""
    return _plan("", config, host, None, save_cache, label, b"", spec, pod)


def _plan(bundle: str, config: Config, host: Optional[Host], log: Optional[DebugLog],
          save_cache: bool, spec_path: str, raw: bytes, spec: SpecDict,
          pod_override: Optional[Dict[str, str]] = None) -> Plan:
    notes: List[str] = []  # the two channels, filled from what each stage returns
    warnings: List[str] = []

    view = image_view(spec)
    out = spec  # the spec the edits go onto: without Docker's --gpus hook
    if view.docker_hooks:
        from nvshim.runtime.engine import without_hooks

        out = without_hooks(spec, [("prestart", h) for h in view.docker_hooks])
        notes += [f"docker run --gpus: Docker's prestart hook {h['path']} removed from "
                  "config.json (nvshim gives the container its GPUs itself)"
                  for h in view.docker_hooks]
    plan_source = ""
    engine: Optional[EngineGrant] = None
    if view.char_devices and not view.sandbox:
        # GPUs the engine injected (CDI, DRA), by number; a privileged container's are the
        # host's every device: held and journaled, no grant
        from nvshim._record import replace
        from nvshim.runtime.engine import find_engine_grant

        engine, host, plan_source = find_engine_grant(
            view.char_devices, config, host, save_cache, view.privileged_with_devices)
        if engine is not None and not engine.privileged:
            view = replace(view, engine=engine)
    claim = read_claim(view, config)

    found: Optional[Verification] = None  # require-allocation's record of the kubelet
    pod: Optional[Dict[str, str]] = None
    kubelet_tokens: Tuple[str, ...] = ()
    kubelet_ids: Tuple[str, ...] = ()
    if _needs_allocation_module(claim, config):
        from nvshim.runtime.allocation import policy

        found = policy.ask_kubelet_if_needed(claim, config)
        pod = (policy.pod_annotations(bundle, claim, config) if pod_override is None
               else pod_override)
        notes += found.notes
        warnings += found.warnings
        if found.allocation is not None and found.allocation.ids \
                and "kubelet" in config.allocation_sources:
            # the kubelet source grants these ids as GPUs: only those that are GPUs of this node
            if host is None:
                from nvshim.runtime.plancache import host_for

                host, plan_source = host_for(config, save_cache)
            found = policy.with_named(found, host.gpus())
            assert found.named is not None
            kubelet_tokens, kubelet_ids = found.named.gpu_tokens, found.named.gpu_ids
            notes += [f'kubelet device id "{i}" names no GPU of this node (another '
                      "resource's device): not granted" for i in found.named.other_ids]
    request = resolve_request(claim, config, pod, kubelet_tokens, kubelet_ids)
    if plan_source and log is not None:
        log.event("plan", source=plan_source)
    hooks: Optional[EngineHooks] = None
    if engine is not None:
        from nvshim.runtime.engine import engine_hooks

        notes += engine.notes
        hooks = engine_hooks(spec)
        notes += hooks.notes
        assert host is not None  # the engine's grant was matched against it
        from nvshim.runtime.cdiedits import engine_stale

        stale = engine_stale(spec, config, host)
        notes += stale
        warnings += stale
    notes += request.notes
    if log is not None:
        log.event(
            "request",
            bundle=bundle,
            source=request.source,
            devices=list(request.devices),
            capabilities=list(request.capabilities),
            notes=list(request.notes),
            **({"engine": [g.uuid for g in engine.gpus] + [m.uuid for _, m in engine.migs],
                "engine_imex": list(engine.imex)} if engine is not None else {}),
        )
    if engine is not None and found is not None and found.allocation is not None:
        from nvshim.runtime.allocation.policy import check_engine_allocated

        assert host is not None  # the engine's grant was matched against it
        found, note = check_engine_allocated(found, host, engine, config)
        notes.append(note)

    extras = _extras(claim, config, request)
    if extras is not None:
        if engine is not None and engine.imex and config.engine_grants == "exclusive":
            from nvshim.runtime.extras import without_env_channels

            extras = without_env_channels(extras, engine, claim.imex_env)
        notes += extras.notes
        if extras.imex_channels and found is not None and found.allocation is not None:
            from nvshim.runtime.allocation.policy import check_imex_allocated

            found, note = check_imex_allocated(found, extras, config)
            notes.append(note)

    def plan(grant: Grant, new_spec: Optional[SpecDict],
             rootfs: Optional[RootfsDecision] = None, cdi_source: str = "",
             host: Optional[Host] = None) -> Plan:
        """The plan, built once from the stages' records."""
        return Plan(spec_path, raw, spec, claim, request, grant, rootfs or RootfsDecision(),
                    found.identity if found is not None else view.identity,
                    found.verified if found is not None else "none",
                    found.allocation if found is not None else None,
                    tuple(notes), tuple(warnings), plan_source, cdi_source, host, bundle,
                    new_spec)

    replacing = hooks is not None and bool(hooks.replaced)
    if not request.injects and not extras and not replacing:
        bare = None if out is spec else out
        new_spec = bare
        if request.set_void:
            new_spec = apply_edits(out, _VOID)
        return plan(Grant(engine=engine, engine_hooks=hooks, base=bare), new_spec,
                    host=host if engine is not None else None)
    _refuse_host_root(spec, bundle)
    # what gives the container anything: not loaded for a create that gets nothing
    from nvshim.runtime.hostedits import GpuInjection, gpus_of_edits, inject_gpus

    if host is None:
        from nvshim.runtime.plancache import host_for

        host, plan_source = host_for(config, save_cache)
        if log is not None:
            log.event("plan", source=plan_source)

    edits = Edits()
    cdi_source = ""
    cdi_names = request.cdi_names
    if cdi_names:
        from nvshim.runtime.cdiedits import inject_cdi

        cdi = inject_cdi(cdi_names, config, request.capabilities, host, save_cache)
        cdi_source = cdi.source
        if log is not None:
            log.event("cdi", source=cdi.source)
        notes += cdi.warnings
        warnings += cdi.warnings
        edits = cdi.edits

    tokens = request.gpu_tokens
    node = GpuInjection()
    params = False
    if cdi_names:  # a generated spec's params hook: the runtime's own does it cheaper
        from nvshim.runtime.hookargs import without_spec_hooks

        edits, params = without_spec_hooks(edits)
        params = params and config.disable_device_node_modification
    if tokens or (request.driver_files and not cdi_names):
        node = inject_gpus(host, request, tokens, claim, config)
        notes += node.notes
        warnings += node.warnings
        edits = edits + node.edits
        params = config.disable_device_node_modification
    cdi_gpus: Tuple[Gpu, ...] = ()
    cdi_migs: Migs = ()
    if cdi_names and (config.grants_journal or (found is not None
                                                and found.allocation is not None)):
        cdi_gpus, cdi_migs = gpus_of_edits(host, edits)
    if found is not None and found.allocation is not None \
            and request.source not in ("kubelet", "engine"):
        from nvshim.runtime.allocation.policy import check_granted

        found, said = check_granted(found, host, node.gpus + cdi_gpus, node.migs + cdi_migs,
                                    request, config)
        notes += said

    if extras:
        from nvshim.runtime.extras import extras_edits

        more = extras_edits(host, extras)
        edits = edits + more.edits
        notes += more.notes
        if request.set_void:
            edits = edits + _VOID
    base: Optional[SpecDict] = None if out is spec else out
    if hooks is not None:
        from nvshim.runtime.engine import fit_edits

        edits, fitted = fit_edits(out, edits, hooks)
        base = base if fitted is None else fitted
        params = params or (hooks.params and config.disable_device_node_modification)
    copy: Optional[Tuple[str, bytes]] = None
    if params:
        shown = _params(spec, bundle, host.driver_root)
        if shown is not None:
            hook, copy = shown
            edits = edits + Edits(hooks=(hook,))
            notes.append("the container's /proc/driver/nvidia/params will say "
                         "ModifyDeviceFiles: 0")
    grant = Grant(node.gpus, node.migs, cdi_names, cdi_gpus, cdi_migs, engine, hooks, edits,
                  base, copy, node.missing)
    rootfs = _decide_rootwork(spec, bundle, host, grant)
    applied = applied_edits(edits, rootfs.by)
    if log is not None:
        log.event("edits", edits=applied.to_cdi())
    return plan(grant, apply_edits(spec if base is None else base, applied), rootfs,
                cdi_source, host)


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
    raise RequestError(f"the container's rootfs {shown} is the host's /: nvshim injects no "
                       f"driver files into the host (bundle {where})")


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


def _extras(claim: Claim, config: Config, request: Request) -> Optional[Extras]:
    """IMEX channels and NVSwitch/GDS/MOFED/gdrcopy devices asked for (see nvshim.runtime.extras);
    None, without importing that module, when the spec names none of them."""
    if not claim.asks_for_extras:
        return None
    from nvshim.runtime.extras import resolve_extras

    return resolve_extras(claim, config, request)


def _params(spec: SpecDict, bundle: str,
            driver_root: str) -> Optional[Tuple[Hook, Tuple[str, bytes]]]:
    """(the hook showing ``ModifyDeviceFiles: 0``, (the bundle file it binds, its content))
    when the host's params say 1 (:mod:`nvshim.runtime.hookargs`); None otherwise."""
    from nvshim.runtime.hookargs import BUNDLE_FILE, modified_params, params_hook

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
    work = rootwork.work_from_hooks(grant.edits.hooks, mounts, info, grant.edits.device_nodes,
                                    spec if grant.base is None else grant.base)
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
    mark = plan.grant_source if plan.granted_uuids else (
        "stripped" if plan.request.set_void else plan.request.source)
    marks = {REWRITTEN: mark}
    if served_by != "runtime":  # the runtime's own rewrite stays as it always was
        marks[SERVED_BY] = served_by
    return dict(spec, annotations=dict(annotations or {}, **marks))
