"""What a create decides, as records: the :class:`Plan` and the stages' records in it.

:func:`nvshim.runtime.create.plan_create` runs the stages; each returns a frozen record or
a value, and the :class:`Plan` is built once, at the end, from them: the claim
(:class:`~nvshim.runtime.claim.Claim`), the request
(:class:`~nvshim.runtime.request.Request`), the :class:`Grant` (what the container is
given and the edits that give it) and the :class:`RootfsDecision` (who makes the SONAME
links and the ld.so.cache). :func:`nvshim.runtime.create.commit` carries a plan out and
returns :class:`Committed`. ``nvshim inspect``, the grant journal and the denial journal
read these records; pure, nothing here touches the filesystem.
"""

from __future__ import annotations

from nvshim._record import dataclass, field
from nvshim.edits import Edits, apply_edits

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Any, Dict, Optional, Tuple

    from nvshim.host.devices import MigDevice
    from nvshim.host.discovery import Gpu, Host
    from nvshim.runtime.allocation.kubelet import Allocation
    from nvshim.runtime.claim import Claim, ImageView
    from nvshim.runtime.engine import EngineGrant, EngineHooks
    from nvshim.runtime.identity import Identity
    from nvshim.runtime.request import Request
    from nvshim.runtime.rootwork import RootWork

    #: A decoded config.json object: JSON values of any shape (Any: nvshim keeps what it
    #: does not edit, unknown fields included, so the dict is never typed further).
    SpecDict = Dict[str, Any]
    Migs = Tuple[Tuple[Gpu, MigDevice], ...]
    """(parent GPU, MIG device) pairs."""

__all__ = ["Plan", "Grant", "RootfsDecision", "Committed", "applied_edits"]


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
        return applied_edits(self.grant.edits, (rootfs or self.rootfs).by)

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


def applied_edits(edits: Edits, by: str) -> Edits:
    """``edits`` without nvshim's hook when the in-root work is done ``by`` the runtime
    (but for its ``/dev`` links: runc makes ``/dev`` after the runtime) or by nobody."""
    if by not in ("runtime", "nobody"):
        return edits
    from nvshim._record import replace
    from nvshim.runtime.hookargs import dev_links_only, is_nvshim_hook

    hooks = []
    for hook in edits.hooks:
        if not is_nvshim_hook(hook):
            hooks.append(hook)
        elif by == "runtime":
            args = dev_links_only(hook.args)
            if args is not None:
                hooks.append(replace(hook, args=tuple(args)))
    return replace(edits, hooks=tuple(hooks))


@dataclass(frozen=True)
class Committed:
    """What :func:`nvshim.runtime.create.commit` did: the rootfs decision it ended with
    (the plan's, or ``hook`` when the rootfs turned out not to be writable), the
    config.json it wrote, whether it wrote one, and the in-root work's warnings."""

    rootfs: RootfsDecision
    new_spec: Optional[SpecDict]
    written: bool
    warnings: Tuple[str, ...] = ()
