"""The create road: config.json → claim → request → grant → rootfs decision → new config.json.

:func:`plan_create` computes everything without writing (``nvshim inspect`` prints the
plan); :func:`commit` does the in-root work, writes the new config.json atomically when it
differs, and returns what it did. Discovery is not touched for a container that asks for
nothing.

This module sequences the road. Each stage returns what it decides, a frozen record or a
value, or raises; nothing writes into a shared plan, and the :class:`Plan` is built once,
at the end, from the stages' records:

- the claim: what config.json claims, parsed once (:func:`~nvshim.runtime.request.read_claim`),
  with the GPUs the engine already injected (:mod:`~nvshim.runtime.engine`, only for a
  spec listing character devices);
- require-allocation's record of the kubelet
  (:class:`~nvshim.runtime.allocation.policy.Verification`, only when it is needed);
- the request: the source and the devices (:func:`~nvshim.runtime.request.resolve_request`);
- the grant (:class:`Grant`): GPUs and MIG devices (:mod:`~nvshim.runtime.tokens`), CDI
  devices (:func:`~nvshim.runtime.hostedits.inject_cdi`), the engine's devices, the
  extras (:mod:`~nvshim.runtime.extras`), the edits that give them
  (:mod:`~nvshim.runtime.hostedits`) and the params copy (:mod:`~nvshim.runtime.devparams`);
- the rootfs decision (:class:`RootfsDecision`): who makes the SONAME links, the
  ld.so.cache and the EGL application profile (:mod:`~nvshim.runtime.rootwork`).

Messages go on two channels, in the order the stages speak: notes (every decision, shown
by ``inspect``) and warnings (what an operator must hear though the create goes on: sent
to runc's ``--log``; each warning is a note too).

One module past the ~400-line mark on purpose: the road and the records it builds are one
thing, and every create imports it; records of their own module would cost every create
one more import.
"""

from __future__ import annotations

import os

from nvshim._record import dataclass, field
from nvshim.config import Config, describe_config
from nvshim.edits import Edits, Hook
from nvshim.errors import SPEC_FILE, RequestError, SpecError
from nvshim.runtime.apply import apply_edits
from nvshim.runtime.hostedits import (
    driver_edits,
    engine_stale,
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
    management_pod,
    read_claim,
    resolve_request,
)

TYPE_CHECKING = False  # typing costs ~4 ms to import on the create path
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence, Tuple

    from nvshim.host.devices import MigDevice
    from nvshim.host.discovery import Gpu, Host
    from nvshim.runtime.allocation.kubelet import Allocation
    from nvshim.runtime.allocation.policy import Verification
    from nvshim.runtime.engine import EngineGrant, EngineHooks
    from nvshim.runtime.extras import Extras
    from nvshim.runtime.logs import DebugLog
    from nvshim.runtime.request import Identity, ImageView
    from nvshim.runtime.rootwork import RootWork

    #: A decoded config.json object: JSON values of any shape (Any: nvshim keeps what it
    #: does not edit, unknown fields included, so the dict is never typed further).
    SpecDict = Dict[str, Any]
    Migs = Tuple[Tuple[Gpu, MigDevice], ...]
    """(parent GPU, MIG device) pairs."""

__all__ = ["Plan", "Grant", "RootfsDecision", "Committed", "plan_create", "commit", "REWRITTEN"]

#: The env entry that keeps anything downstream from injecting again (or strips a request).
_VOID = Edits(env=(f"{VISIBLE_DEVICES}=void",))


@dataclass(frozen=True)
class Grant:
    """What the container is given, and the edits that give it."""

    gpus: Tuple[Gpu, ...] = ()
    """Whole GPUs granted by device token (index, UUID, PCI bus id, ``all``)."""
    migs: Migs = ()
    """MIG devices granted by device token."""
    cdi_names: Tuple[str, ...] = ()
    """The CDI devices injected by nvshim."""
    cdi_gpus: Tuple[Gpu, ...] = ()
    """Whole GPUs the granted CDI devices bring (by their device nodes)."""
    cdi_migs: Migs = ()
    """MIG devices the granted CDI devices bring (by their MIG caps)."""
    engine: Optional[EngineGrant] = None
    """The GPUs, MIG devices and IMEX channels the engine already injected into config.json."""
    engine_hooks: Optional[EngineHooks] = None
    """The in-root hooks of the engine's spec."""
    edits: Edits = field(default_factory=Edits)
    """Everything added to config.json (nvshim's hook included: see :meth:`Plan.applied_edits`)."""
    base: Optional[SpecDict] = None
    """The spec the edits are applied to, when it is not config.json as read: without the
    engine's hooks whose binary this node lacks (nvshim does their work)."""
    params: Optional[Tuple[str, bytes]] = None
    """(bundle file, content): the ``ModifyDeviceFiles: 0`` copy the params hook binds."""
    missing: Tuple[str, ...] = ()
    """Essential driver files of the requested capabilities the node lacks (``inspect``)."""

    @property
    def uuids(self) -> Tuple[str, ...]:
        """UUIDs of every GPU and MIG device granted, from any source, once each: by
        token, then CDI, then the engine's."""
        engine = self.engine
        out = [g.uuid for g in self.gpus] + [m.uuid for _, m in self.migs]
        out += [g.uuid for g in self.cdi_gpus] + [m.uuid for _, m in self.cdi_migs]
        if engine is not None:
            out += [g.uuid for g in engine.gpus] + [m.uuid for _, m in engine.migs]
        return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class RootfsDecision:
    """Who makes the SONAME links and the ld.so.cache inside the rootfs, and why."""

    work: Optional[RootWork] = None
    """The work (:class:`nvshim.runtime.rootwork.RootWork`); None: there is none."""
    by: str = ""
    """``runtime`` (before runc), ``hook`` (createContainer), ``nobody`` (the rootfs is the
    host's /), ``""`` (there is no work)."""
    why: str = ""
    """``runtime``: the rootfs written; ``hook``, ``nobody``: why the runtime does not."""


@dataclass(frozen=True)
class Plan:
    """What create would do to one bundle: the stages' records, and the new config.json."""

    spec_path: str
    original: bytes
    spec: SpecDict
    claim: Claim
    request: Request
    grant: Grant = field(default_factory=Grant)
    rootfs: RootfsDecision = field(default_factory=RootfsDecision)
    identity: Optional[Identity] = None
    """The Kubernetes container of a CRI container."""
    verified: str = "none"
    """``kubelet`` (every GPU checked against its record), ``unreachable`` (claims
    trusted), ``unidentified`` (not a CRI container, judged by allocation-sources),
    ``none``."""
    allocation: Optional[Allocation] = None
    """What the kubelet allocated, if asked."""
    notes: Tuple[str, ...] = ()
    """Every decision, in the order made (``inspect`` shows them)."""
    warnings: Tuple[str, ...] = ()
    """What an operator must hear though create goes on (runc ``--log``); notes too."""
    plan_source: str = ""
    """Where the node's plan came from: the plan cache, or discovery (and why)."""
    cdi_source: str = ""
    """Where the CDI registry came from: the spec index, or a scan (and why)."""
    host: Optional[Host] = None
    bundle: str = ""
    new_spec: Optional[SpecDict] = None
    """config.json after create; None when it is left as it is."""

    # the grant's devices and edits, read by inspect, the journal and the tests
    @property
    def view(self) -> ImageView:
        return self.claim.view

    @property
    def gpus(self) -> Tuple[Gpu, ...]:
        return self.grant.gpus

    @property
    def migs(self) -> Migs:
        return self.grant.migs

    @property
    def cdi_names(self) -> Tuple[str, ...]:
        return self.grant.cdi_names

    @property
    def cdi_gpus(self) -> Tuple[Gpu, ...]:
        return self.grant.cdi_gpus

    @property
    def cdi_migs(self) -> Migs:
        return self.grant.cdi_migs

    @property
    def engine_gpus(self) -> Tuple[Gpu, ...]:
        return self.grant.engine.gpus if self.grant.engine is not None else ()

    @property
    def engine_migs(self) -> Migs:
        return self.grant.engine.migs if self.grant.engine is not None else ()

    @property
    def engine_imex(self) -> Tuple[int, ...]:
        return self.grant.engine.imex if self.grant.engine is not None else ()

    @property
    def edits(self) -> Edits:
        return self.grant.edits

    @property
    def granted_uuids(self) -> Tuple[str, ...]:
        """UUIDs of every GPU and MIG device granted (the grant journal records these)."""
        return self.grant.uuids

    @property
    def grant_source(self) -> str:
        """The journal's source: the request's, ``+engine`` when the engine injected GPUs
        besides what another source granted (``+privileged``: a privileged container's)."""
        source, engine = self.request.source, self.grant.engine
        extra = "privileged" if engine is not None and engine.privileged else "engine"
        if (self.engine_gpus or self.engine_migs) and source != extra:
            return extra if source == "none" else f"{source}+{extra}"
        return source

    def applied_edits(self, rootfs: Optional[RootfsDecision] = None) -> Edits:
        """The edits config.json gets under ``rootfs`` (this plan's decision by default):
        without nvshim's hook when the runtime does its work or nobody does (the rootfs is
        the host's /)."""
        return _applied(self.grant.edits, (rootfs or self.rootfs).by)

    @property
    def changed(self) -> bool:
        return self.new_spec is not None and self.new_spec != self.spec

    def render(self, rootfs: Optional[RootfsDecision] = None) -> SpecDict:
        """The new config.json under ``rootfs`` (this plan's decision by default): the
        applied edits on :attr:`Grant.base` or the spec (pure)."""
        base = self.spec if self.grant.base is None else self.grant.base
        return apply_edits(base, self.applied_edits(rootfs))

    def new_bytes(self, new_spec: Optional[SpecDict] = None) -> bytes:
        """``new_spec`` (this plan's by default) in the layout of the original (see
        nvshim.runtime.specjson)."""
        from nvshim.runtime.specjson import encode_spec

        spec = self.new_spec if new_spec is None else new_spec
        assert spec is not None
        return encode_spec(spec, self.original)


def _applied(edits: Edits, by: str) -> Edits:
    """``edits`` without nvshim's hook when the in-root work is done ``by`` the runtime
    (but for its ``/dev`` links: runc makes ``/dev`` after the runtime) or by nobody."""
    if by not in ("runtime", "nobody"):
        return edits
    from nvshim._record import replace
    from nvshim.runtime.hookargs import dev_links_only, is_nvshim_hook

    hooks: List[Hook] = []
    for hook in edits.hooks:
        if not is_nvshim_hook(hook):
            hooks.append(hook)
        elif by == "runtime":
            args = dev_links_only(hook.args)
            if args is not None:
                hooks.append(replace(hook, args=tuple(args)))
    return replace(edits, hooks=tuple(hooks))


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


def _plan(bundle: str, config: Config, host: Optional[Host], log: Optional[DebugLog],
          save_cache: bool, spec_path: str, raw: bytes, spec: SpecDict) -> Plan:
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
        pod = policy.pod_annotations(bundle, claim, config)
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
                    found.identity if found is not None else identity_of(view.annotations),
                    found.verified if found is not None else "none",
                    found.allocation if found is not None else None,
                    tuple(notes), tuple(warnings), plan_source, cdi_source, host, bundle,
                    new_spec)

    replacing = hooks is not None and bool(hooks.replaced)
    if not request.injects and not extras and not replacing:
        bare = None if out is spec else out
        return plan(Grant(engine=engine, engine_hooks=hooks, base=bare),
                    apply_edits(out, _VOID) if request.set_void else bare,
                    host=host if engine is not None else None)
    _refuse_host_root(spec, bundle)

    if host is None:
        from nvshim.runtime.plancache import host_for

        host, plan_source = host_for(config, save_cache)
        if log is not None:
            log.event("plan", source=plan_source)

    edits = Edits()
    cdi_source = ""
    cdi_names = request.cdi_names
    if cdi_names:
        cdi = inject_cdi(cdi_names, config, request.capabilities, host, save_cache)
        cdi_source = cdi.source
        if log is not None:
            log.event("cdi", source=cdi.source)
        notes += cdi.warnings
        warnings += cdi.warnings
        edits = cdi.edits

    tokens = request.gpu_tokens
    node = _NodeGrant()
    params = False
    if cdi_names:  # a generated spec's params hook: the runtime's own does it cheaper
        from nvshim.runtime.devparams import without_spec_hooks

        edits, params = without_spec_hooks(edits)
        params = params and config.disable_device_node_modification
    if tokens or (request.driver_files and not cdi_names):
        node = _node_grant(host, request, tokens, claim, config)
        notes += node.notes
        warnings += node.warnings
        edits = edits + node.edits
        params = config.disable_device_node_modification
    cdi_gpus: Tuple[Gpu, ...] = ()
    cdi_migs: Migs = ()
    if cdi_names and (config.grants_journal or (found is not None
                                                and found.allocation is not None)):
        cdi_gpus, cdi_migs = _gpus_of_nodes(host, edits)
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
    applied = _applied(edits, rootfs.by)
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
    if config.management_pods and management_pod(claim.view.annotations,
                                                 config.management_pods) is not None:
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
    when the host's params say 1 (:mod:`nvshim.runtime.devparams`); None otherwise."""
    from nvshim.runtime import devparams

    content = devparams.modified_params(driver_root)
    if content is None:
        return None
    from nvshim.runtime.rootwork import rootfs_path

    # absolute, as runc resolves it: the hook runs in whatever directory runc gives it
    rootfs = rootfs_path(spec, os.path.abspath(bundle))
    if rootfs is None:
        return None
    copy = os.path.join(os.path.abspath(bundle), devparams.BUNDLE_FILE)
    return devparams.params_hook(rootfs, copy), (copy, content)


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


@dataclass(frozen=True)
class _NodeGrant:
    """What the node's GPUs give a container asking by device token (or for driver files)."""

    gpus: Tuple[Gpu, ...] = ()
    migs: Migs = ()
    edits: Edits = field(default_factory=Edits)
    missing: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()
    warnings: Tuple[str, ...] = ()


def _node_grant(host: Host, request: Request, tokens: Sequence[str], claim: Claim,
                config: Config) -> _NodeGrant:
    """The GPUs and MIG devices ``tokens`` name on this node, and their edits (discovery's,
    shared with ``nvshim cdi generate``); the requirements checked against them."""
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
    migs = []
    for m in chosen_migs:
        parent = by_index[m.gpu_index]
        migs.append((parent, next(x for x in parent.mig if x.uuid == m.uuid)))

    notes: List[str] = []
    caps = request.capabilities
    env = claim.view.env
    if "CUDA_VERSION" in env or any(name.startswith("NVIDIA_REQUIRE_") for name in env):
        # only then can there be a requirement (the module costs ~2 ms to import)
        from nvshim.runtime.requirements import check_requirements

        selected = chosen + tuple(parent for parent, _ in migs)
        check_requirements(claim.view, host, selected, notes, config.disable_require)

    from nvshim.runtime.hookargs import hook_command  # a create naming no device never loads it

    skew = host.version_skew()
    warnings = (skew_message(*skew),) if skew is not None else ()
    libraries, files = host.libraries(caps), host.driver_files(caps)
    from nvshim.host.discovery import missing_files
    from nvshim.host.gpus import drm_capabilities

    drm = drm_capabilities(caps)  # DRM nodes only for the capabilities that get them
    nodes_of = {gpu.index: host.drm(gpu) for gpu in chosen} if drm else {}
    dev_links = tuple(link for nodes in nodes_of.values() for link in nodes.links)
    edits = driver_edits(host.control_nodes(caps), libraries, files, hook_command(),
                         dev_links=dev_links, egl_profile=bool(drm))
    missing = missing_files(caps, libraries, files)
    for gpu in chosen:
        nodes = nodes_of.get(gpu.index)
        edits = edits + gpu_edits(gpu, nodes)
        if nodes is not None:  # a headless GPU: the container starts, inspect says so
            from nvshim.host.drm import missing_drm

            missing += missing_drm(drm, ((gpu.index, nodes),))
    for parent, mig in migs:
        edits = edits + mig_edits(parent, mig)
    return _NodeGrant(chosen, tuple(migs), edits, missing,
                      (*notes, *warnings), warnings)


def _looked_under(config: Config, host: Host) -> str:
    """Where a create looked for GPUs: ``under driver root / (config /etc/nvshim/config.yaml)``."""
    return f"under driver root {host.driver_root} ({describe_config(config)})"


def _gpus_of_nodes(host: Host, edits: Edits) -> Tuple[Tuple[Gpu, ...], Migs]:
    """(whole GPUs, (parent, MIG device) pairs) whose device nodes the edits inject.

    A MIG device is granted when all its capability nodes are; its parent's node then
    belongs to the MIG device, not to a whole-GPU grant.
    """
    from nvshim.runtime.engine import gpus_of_numbers

    numbers = {(n.major, n.minor or 0) for n in edits.device_nodes if n.major is not None}
    return gpus_of_numbers(host.gpus(), numbers)


def _live(log: Optional[DebugLog]) -> Optional[DebugLog]:
    """``log`` when it records anything, else None: a disabled debug log (the default) must
    not cost the arguments of its events (the edits' CDI form, lists) on every create."""
    return log if log is not None and log.enabled else None


@dataclass(frozen=True)
class Committed:
    """What :func:`commit` did: the rootfs decision it ended with (the plan's, or ``hook``
    when the rootfs turned out not to be writable), the config.json it wrote, whether it
    wrote one, and the in-root work's warnings."""

    rootfs: RootfsDecision
    new_spec: Optional[SpecDict]
    written: bool
    warnings: Tuple[str, ...] = ()


def commit(plan: Plan, log: Optional[DebugLog] = None) -> Committed:
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
    new_spec = _marked(new_spec, plan)
    # No fsync: config.json is the engine's, regenerated for every create (bundles live in
    # /run for containerd); the rename makes the write atomic for runc, which reads it next.
    write_atomic(plan.spec_path, plan.new_bytes(new_spec), durable=False)
    return Committed(rootfs, new_spec, True, warnings)


#: The annotation a config.json nvshim-runtime rewrote carries (value: the grant's source,
#: ``stripped``, or the request's source): ``nvshim inspect`` reads a live bundle by it
#: instead of planning the rewritten spec again. Nothing in create trusts it.
REWRITTEN = "nvshim.io/rewritten"


def _marked(spec: SpecDict, plan: Plan) -> SpecDict:
    """``spec`` with the :data:`REWRITTEN` annotation (unless its annotations are not an
    object: then as it is)."""
    annotations = spec.get("annotations")
    if annotations is not None and not isinstance(annotations, dict):
        return spec
    mark = plan.grant_source if plan.granted_uuids else (
        "stripped" if plan.request.set_void else plan.request.source)
    return dict(spec, annotations=dict(annotations or {}, **{REWRITTEN: mark}))
