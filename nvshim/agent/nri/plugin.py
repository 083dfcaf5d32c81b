"""The NRI plugin's decisions: the runtime's create road, run on what the engine reports.

At CreateContainer the engine sends the pod (namespace, name, uid, annotations, runtime
handler) and the container (annotations, env, mounts, devices, hooks). :func:`spec_of`
writes them as the OCI spec they will become, and :func:`nvshim.runtime.create.plan_spec`
plans it exactly as ``nvshim-runtime create`` would (one claim, one request, one grant):
the plugin only turns the plan into NRI's answer and journals it with the runtime's own
journal writers, so ``nvshim grants`` shows both paths' records.

Per container, by its pod's runtime handler (config ``nri-*``):

- a handler in ``nri-nvshim-handlers`` runs nvshim-runtime, which enforces the config
  itself: left alone (no second decision, no second record);
- **verify** (``nri-verify``): a plan that raises a request error (devices the engine
  injected that no allocation covers, an annotation claim the kubelet does not back) is
  an error reply: the engine fails the create with ``nvshim: pod <ns>/<pod> container
  <name>: <why>``, journaled as ``refused``;
- **guard** (``nri-guard``): planned under require-allocation; a container that claims
  GPUs with no allocation gets ``NVIDIA_VISIBLE_DEVICES=void``, loses its
  ``annotation-prefixes`` annotations and has its device-list mounts replaced by an empty
  tmpfs, journaled as ``stripped``; a claim the engine would keep whatever the adjustment
  says (the variable set twice, a destination mounted twice) is refused (:func:`_guard`);
- **NVIDIA's NRI plugin** (guard or verify): the CDI names of a pod's own
  ``nvidia.cdi.k8s.io`` annotation, which that plugin injects unchecked, are held to the
  allocation under every handler: outside it, the create is refused
  (:func:`nvidia_cdi_claim`);
- **inject** (``nri-inject``): under a handler not in ``nri-gpu-handlers``, a grant's
  device nodes, mounts, env and hooks (a createContainer hook does the in-root work: no
  rootfs exists at CreateContainer; under ``nri-inroot: agent`` the hook is the static
  client asking this agent, :mod:`nvshim.agent.hookwork`) are the adjustment, journaled
  as a grant.

nvshim's own failures (a config that does not load, a host it cannot read) never fail a
create: one log line and no adjustment, as if the plugin were absent. A denial or grant
that cannot be journaled does: record or fail, as on the runtime path.

The road of one CreateContainer: :meth:`Plugin.handle` finds its handler in
:attr:`Plugin.handlers` (the table Configure's event mask is computed from, as in
containerd/nri's ``pkg/stub``); :meth:`Plugin.create_container` decodes it and calls
:func:`decide`, which asks :func:`verify` (the plan, or the :class:`Verdict` that ends
there: a refusal), :func:`guard` (a stripped claim) and :func:`inject` (the grant's
adjustment, or a grant let through), takes the first verdict and journals it in one place.

Why one module: it is one CreateContainer's road, read top to bottom: the handler table,
then verify, guard and inject, each returning a verdict that one place journals. The stages
share the spec the engine reported, the plan and the verdict type; split, the order that is
the plugin's behaviour (refuse before strip, strip before inject, journal once) would be
read across files. The messages (api.py), the transport and the agent-served hook work
(agent/hookwork.py) already live elsewhere.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, List, Literal, Mapping, Optional, Tuple, Union

from nvshim._protobuf import WireError
from nvshim.agent.nri.api import (
    Adjustment,
    Container,
    Device,
    Event,
    Hook,
    Mount,
    Pod,
    decode_configure,
    decode_event,
    decode_pod_container,
    decode_state_change,
    encode_configure_reply,
    encode_create_reply,
    encode_sync_reply,
    event_mask,
)
from nvshim.agent.nri.transport import UNIMPLEMENTED, RpcError
from nvshim.config import Config
from nvshim.errors import NvshimError, RequestError

if TYPE_CHECKING:
    from nvshim.agent.hookwork import PendingWork
    from nvshim.agent.state import AgentState
    from nvshim.logs import Log
    from nvshim.runtime.plan import Plan, SpecDict
    from nvshim.runtime.rootwork import RootWork

__all__ = [
    "Plugin",
    "Verdict",
    "spec_of",
    "adjustment_of",
    "decide",
    "verify",
    "guard",
    "inject",
    "nvidia_cdi_claim",
]

#: The env entry that keeps every GPU runtime from injecting anything.
VOID = "void"
_CRI = "io.kubernetes.cri."
#: In-root work kept for containers not started yet (``nri-inroot: start``), at most.
_LATER_MAX = 4096


def spec_of(pod: Pod, container: Container) -> SpecDict:
    """The OCI spec (the parts a create reads) the engine will write for ``container``.

    The identity annotations containerd writes are filled from the pod the engine reported
    when the container's annotations carry none (an engine's fields, not the pod's)."""
    annotations = dict(container.annotations)
    if not any(k.startswith("io.kubernetes.") for k in annotations) and pod.name:
        annotations.update(
            {
                _CRI + "container-type": "container",
                _CRI + "sandbox-id": pod.id,
                _CRI + "sandbox-name": pod.name,
                _CRI + "sandbox-namespace": pod.namespace,
                _CRI + "sandbox-uid": pod.uid,
                _CRI + "container-name": container.name,
            }
        )
    devices = [
        {"path": d.path, "type": d.type, "major": d.major, "minor": d.minor}
        for d in container.devices
    ]
    hooks: Dict[str, List[Dict[str, object]]] = {}
    for kind, found in container.hooks.items():
        hooks[kind] = [_hook_json(h) for h in found]
    spec: SpecDict = {
        "ociVersion": "1.0.2",
        "process": {"args": list(container.args), "env": list(container.env)},
        "mounts": [
            {
                "destination": m.destination,
                "type": m.type,
                "source": m.source,
                "options": list(m.options),
            }
            for m in container.mounts
        ],
        "annotations": annotations,
        "linux": {"devices": devices},
    }
    if hooks:
        spec["hooks"] = hooks
    return spec


def _hook_json(hook: Hook) -> Dict[str, object]:
    """An NRI hook as the OCI spec writes it."""
    out: Dict[str, object] = {"path": hook.path}
    if hook.args:
        out["args"] = list(hook.args)
    if hook.env:
        out["env"] = list(hook.env)
    if hook.timeout is not None:
        out["timeout"] = hook.timeout
    return out


def adjustment_of(before: SpecDict, after: SpecDict) -> Adjustment:
    """What ``after`` (the planned spec) adds to ``before``, as NRI adjustments."""
    old_env = {e.partition("=")[0]: e for e in before["process"]["env"]}
    env: Dict[str, str] = {}
    for entry in (after.get("process") or {}).get("env") or ():
        name, _, value = entry.partition("=")
        if old_env.get(name) != entry:
            env[name] = value
    old_mounts = before["mounts"]
    mounts = tuple(
        Mount(
            m["destination"],
            m.get("type", "") or "",
            m.get("source", "") or "",
            tuple(m.get("options") or ()),
        )
        for m in after.get("mounts") or ()
        if m not in old_mounts
    )
    old_devices = {d["path"] for d in before["linux"]["devices"]}
    devices = tuple(
        Device(
            d["path"],
            d.get("type", "c"),
            int(d.get("major", 0)),
            int(d.get("minor", 0)),
            d.get("fileMode"),
            d.get("uid"),
            d.get("gid"),
        )
        for d in (after.get("linux") or {}).get("devices") or ()
        if d.get("path") not in old_devices
    )
    hooks: Dict[str, Tuple[Hook, ...]] = {}
    old_hooks = before.get("hooks") or {}
    for kind, found in (after.get("hooks") or {}).items():
        new = tuple(
            Hook(h["path"], tuple(h.get("args") or ()), tuple(h.get("env") or ()), h.get("timeout"))
            for h in found
            if h not in old_hooks.get(kind, ())
        )
        if new:
            hooks[kind] = new
    return Adjustment(mounts=mounts, env=tuple(env.items()), hooks=hooks, devices=devices)


def _who(pod: Pod, container: Container) -> str:
    return f"pod {pod.namespace}/{pod.name} container {container.name}"


@dataclass(frozen=True)
class Verdict:
    """One container's answer: the adjustment, what the journal records of it and the log
    line that says it. Each duty returns one; :func:`decide` journals it, in one place.

    ``record``: ``""`` (nothing), ``grant`` (injected), ``through`` (a grant let through to
    a handler that injects GPUs itself), ``stripped`` or ``refused`` (a denial, ``reason``
    its reason; ``refused`` fails the create)."""

    adjust: Adjustment = field(default_factory=Adjustment)
    record: Literal["", "grant", "through", "stripped", "refused"] = ""
    reason: str = ""
    plan: Optional[Plan] = None
    level: Literal["info", "warning"] = "info"
    event: str = ""
    fields: Tuple[Tuple[str, object], ...] = ()


#: The verdicts whose log line says how long the decision took.
_TIMED = frozenset({"grant", "through", "stripped"})


def decide(
    config: Config,
    pod: Pod,
    container: Container,
    log: Log,
    later: Optional[Later] = None,
    pending: Optional[PendingWork] = None,
) -> Adjustment:
    """The adjustment for ``container`` of ``pod`` (see the module docstring); RpcError
    for a refusal. :func:`verify` plans, :func:`guard` strips, :func:`inject` adds; the
    verdict is journaled here and nowhere else (record or fail). With ``nri-inroot:
    start`` the in-root work is left out of the adjustment and put in ``later`` under
    the container's id, for :func:`start_work` (``later`` None: no StartContainer is
    subscribed, the work stays with a hook); with ``agent`` it waits in ``pending`` and the
    hook is the client's (:func:`agent_hook`)."""
    if not (config.nri_inject or config.nri_guard or config.nri_verify):
        return Adjustment()
    started = time.perf_counter()
    verdict = _verdict(config, pod, container, later, pending)
    unrecorded = _journal(config, pod, container, verdict)
    who = _who(pod, container)
    if verdict.record == "refused":
        message = f"nvshim: {who}: {verdict.reason}"
        if unrecorded is not None:
            message = f"{message} (not recorded: {unrecorded})"
        log.info("nri refused", who=who, reason=verdict.reason)
        raise RpcError(message)
    if unrecorded is not None:  # record or fail
        if verdict.record == "stripped":
            log.error("nri refused: denial not recorded", who=who, error=str(unrecorded))
            raise RpcError(
                f"nvshim: {who}: {verdict.reason}; the container is refused: "
                f"its denial cannot be recorded ({unrecorded})"
            ) from unrecorded
        log.error("nri refused: grant not recorded", who=who, error=str(unrecorded))
        gpus = ", ".join(verdict.plan.granted_uuids) if verdict.plan is not None else ""
        raise RpcError(
            f"nvshim: {who}: the grant of {gpus} cannot be recorded ({unrecorded})"
        ) from unrecorded
    if verdict.event:
        fields: Dict[str, object] = {"who": who, **dict(verdict.fields)}
        if verdict.record in _TIMED:
            fields["ms"] = round((time.perf_counter() - started) * 1e3, 2)
        say = log.warning if verdict.level == "warning" else log.info
        say(verdict.event, **fields)
    return verdict.adjust


def _verdict(
    config: Config,
    pod: Pod,
    container: Container,
    later: Optional[Later],
    pending: Optional[PendingWork],
) -> Verdict:
    """verify, then guard, then inject: the first that answers decides."""
    nvidia = nvidia_cdi_claim(pod.annotations, container.name)
    ours = pod.runtime_handler in config.nri_nvshim_handlers
    if ours and nvidia is None:
        return Verdict()
    spec = spec_of(pod, container)
    planned = verify(config, pod, container, spec, nvidia, ours)
    if isinstance(planned, Verdict):
        return planned
    if ours:  # nvshim-runtime decides the rest, and records it
        return Verdict()
    stripped = guard(config, container, planned)
    if stripped is not None:
        return stripped
    return inject(config, pod, container, spec, planned, later, pending)


def verify(
    config: Config,
    pod: Pod,
    container: Container,
    spec: SpecDict,
    nvidia: Optional[Tuple[str, Tuple[str, ...]]],
    ours: bool,
) -> Union[Plan, Verdict]:
    """``spec`` planned as ``nvshim-runtime create`` would (under require-allocation for
    the guard and for NVIDIA's annotation, which is held to the allocation): the plan,
    or the verdict that ends the decision there (a refusal, a refusal not enforced, a
    plan that failed on nvshim's side: no adjustment)."""
    from nvshim._record import replace
    from nvshim.runtime.create import plan_spec

    held = config.nri_guard or nvidia is not None
    planned = replace(config, require_allocation=True) if held else config
    label = f"nri:{pod.namespace}/{pod.name}/{container.name}"
    try:
        try:
            plan = plan_spec(spec, planned, dict(pod.annotations), label, save_cache=not ours)
        except RequestError as exc:
            plan = _without_kubelet(exc, spec, planned, pod, label, ours)
        if nvidia is not None and (config.nri_guard or config.nri_verify):
            _check_nvidia_claim(plan, planned, nvidia)
    except RequestError as exc:
        if not (config.nri_verify or (nvidia is not None and config.nri_guard)):
            return Verdict(
                level="warning",
                event="nri refusal not enforced (nri-verify: false)",
                fields=(("reason", str(exc)),),
            )
        return Verdict(record="refused", reason=str(exc))
    except NvshimError as exc:
        return Verdict(
            level="warning",
            event="nri plan failed (container created without nvshim's adjustment)",
            fields=(("error", str(exc)),),
        )
    return plan


def guard(config: Config, container: Container, plan: Plan) -> Optional[Verdict]:
    """Under ``nri-guard``, a container that claims GPUs with no allocation: stripped
    (:func:`_guard`), or refused when NRI cannot strip its claim; None for any other."""
    if not (config.nri_guard and not plan.granted_uuids and _claims(plan)):
        return None
    from nvshim.runtime.denials import strip_reason

    reason = strip_reason(plan) or "no allocation"
    try:
        adjust = _guard(container, plan.claim.annotation_keys)
    except RequestError as exc:  # what NRI cannot strip is refused
        return Verdict(
            record="refused", plan=plan, reason=f"{reason}; the guard cannot strip the claim: {exc}"
        )
    return Verdict(
        adjust, "stripped", reason, plan, event="nri guard", fields=(("reason", reason),)
    )


def inject(
    config: Config,
    pod: Pod,
    container: Container,
    spec: SpecDict,
    plan: Plan,
    later: Optional[Later],
    pending: Optional[PendingWork],
) -> Verdict:
    """A granted container: under a handler not in ``nri-gpu-handlers`` (``nri-inject``)
    the grant's edits as the adjustment; under one that injects GPUs itself, on a guard
    node, let through with its variable narrowed to the grant (:func:`_narrowed`);
    nothing for a container granted nothing."""
    handler = pod.runtime_handler
    gpus = list(plan.granted_uuids)
    if plan.granted_uuids and config.nri_inject and handler not in config.nri_gpu_handlers:
        assert plan.new_spec is not None
        new_spec = plan.new_spec
        work = plan.rootfs.work
        if config.nri_inroot == "start" and work is not None and later is not None:
            from nvshim.runtime.plan import RootfsDecision

            new_spec = plan.render(RootfsDecision(work, "runtime", "/proc/<pid>/root"))
            later.put(container.id, work)
        elif work is not None and pending is not None:  # agent, or start with no start event
            new_spec = agent_hook(new_spec, container, work, pending)
        return Verdict(
            adjustment_of(spec, new_spec),
            "grant",
            plan=plan,
            event="nri inject",
            fields=(("gpus", gpus), ("plan", plan.plan_source)),
        )
    if not (plan.granted_uuids and config.nri_guard):
        return Verdict()
    # the handler injects GPUs itself (NVIDIA's runtime) from the env's last entry: an
    # allocated pod that sets the variable again in its own env must not widen it; the
    # record covers this node's GPUs as nvshim's runtime's would
    try:
        narrowed = _narrowed(container, plan.granted_uuids)
    except RequestError as exc:
        return Verdict(record="refused", reason=str(exc), plan=plan)
    return Verdict(
        narrowed,
        "through",
        plan=plan,
        event="nri let through",
        fields=(("gpus", gpus), ("handler", handler), ("narrowed", bool(narrowed))),
    )


def _journal(
    config: Config, pod: Pod, container: Container, verdict: Verdict
) -> Optional[NvshimError]:
    """Write ``verdict``'s record (a grant or a denial) to the journal; the error when it
    cannot be written (None: written, or nothing to write)."""
    try:
        if verdict.record in ("grant", "through") and verdict.plan is not None:
            _grant(config, pod, container, verdict.plan, through=verdict.record == "through")
        elif verdict.record in ("stripped", "refused"):
            _deny(config, pod, container, verdict.record, verdict.reason, verdict.plan)
    except NvshimError as exc:
        return exc
    return None


def _entries(container: Container, name: str) -> List[str]:
    """The values of every env entry of ``name``, in order: the engine keeps all of them,
    and a GPU runtime reads the last."""
    prefix = name + "="
    return [e[len(prefix) :] for e in container.env if e.startswith(prefix)]


def _narrowed(container: Container, granted: Tuple[str, ...]) -> Adjustment:
    """``NVIDIA_VISIBLE_DEVICES`` set to the ``granted`` UUIDs when the value the engine
    keeps (the env's last entry) names anything else (``all``, another GPU); no adjustment
    when it names only what was granted (or nothing). RequestError when the variable is
    set more than once: NRI can rewrite only the first entry (see :func:`_guard`)."""
    from nvshim.runtime.claim import VISIBLE_DEVICES

    values = _entries(container, VISIBLE_DEVICES)
    if not values:
        return Adjustment()
    named = {t.strip() for t in values[-1].split(",") if t.strip()}
    if named <= set(granted) | {VOID, "none"}:
        return Adjustment()
    if len(values) > 1:
        raise RequestError(
            f"{VISIBLE_DEVICES}={values[-1][:64]!r}, the last of the {len(values)} entries "
            f"in its env, names more than its allocation ({', '.join(granted)}): NRI can "
            "rewrite only the first entry, and the engine keeps the last"
        )
    return Adjustment(env=((VISIBLE_DEVICES, ",".join(granted)),))


def _without_kubelet(
    exc: RequestError, spec: SpecDict, config: Config, pod: Pod, label: str, ours: bool
) -> Plan:
    """The plan without the kubelet, when ``exc`` says it could not be asked and the guard
    would strip the container anyway: stripping needs no allocation record, so a pod
    whose image says ``all`` is stripped, not refused, while the kubelet's socket is gone.
    ``exc`` again when the kubelet was reachable, or when the container would be granted
    something without it (that grant is what the kubelet had to confirm)."""
    from nvshim.runtime.allocation.kubelet import KubeletUnreachable

    if not (config.nri_guard and isinstance(exc.__cause__, KubeletUnreachable)) or ours:
        raise exc
    from nvshim._record import replace
    from nvshim.runtime.create import plan_spec

    alone = replace(
        config,
        verify_with="none",
        allocation_sources=tuple(s for s in config.allocation_sources if s != "kubelet"),
    )
    plan = plan_spec(spec, alone, dict(pod.annotations), label)
    if plan.granted_uuids or not _claims(plan):
        raise exc
    return plan


def _claims(plan: Plan) -> bool:
    """Whether the container claims a GPU in a way some GPU runtime acts on: its env or
    image (``set_void``), a device-list mount (NVIDIA's runtime reads those first), or an
    annotation under ``annotation-prefixes``."""
    claim = plan.claim
    return bool(plan.request.set_void or claim.mount_raw or claim.annotation_keys)


#: The pod annotation NVIDIA's own NRI plugin (the GPU Operator's NRI mode) injects CDI
#: devices from, with no allocation checked: NRI's effective annotation, the first of
#: ``<key>/container.<name>``, ``<key>/pod`` and ``<key>``.
NVIDIA_CDI_ANNOTATION = "nvidia.cdi.k8s.io"


def nvidia_cdi_claim(
    annotations: Mapping[str, str], container: str
) -> Optional[Tuple[str, Tuple[str, ...]]]:
    """(the key, the CDI names) NVIDIA's NRI plugin would inject into ``container`` from
    its pod's ``annotations``; None when no such key is set."""
    key = NVIDIA_CDI_ANNOTATION
    for found in (f"{key}/container.{container}", f"{key}/pod", key):
        if found in annotations:
            names = tuple(n.strip() for n in annotations[found].split(",") if n.strip())
            return found, names
    return None


def _check_nvidia_claim(plan: Plan, config: Config, nvidia: Tuple[str, Tuple[str, ...]]) -> None:
    """RequestError unless every CDI name of NVIDIA's annotation (``nvidia``) brings only
    GPUs and MIG devices this container was allocated (``plan``'s grant under
    require-allocation): it is the pod's own annotation, which any pod author can write. A
    name that cannot be resolved is refused too: what it would inject is not known. A
    ``management-pods`` container is let through, as for its env."""
    key, names = nvidia
    if not names:
        return
    view = plan.claim.view
    if config.management_pods and view.management_pod(config.management_pods):
        return
    from nvshim.runtime.allocation.cdinames import resolve_names

    host = plan.host
    if host is None:
        from nvshim.runtime.plancache import host_for

        host, _source = host_for(config, False)
    granted = set(plan.granted_uuids)
    parents = {m.uuid: g.uuid for g in host.gpus() for m in g.mig}
    holds = ", ".join(granted) if granted else "no GPU"
    for name, found in resolve_names(host, config, names).items():
        if isinstance(found, str):
            raise RequestError(
                f"annotation {key} names CDI device {name}, {found}: "
                "NVIDIA's NRI plugin would inject it from the pod's own "
                "annotation"
            )
        for label, uuid in found.gpus:
            if uuid not in granted and parents.get(uuid) not in granted:
                raise RequestError(
                    f"annotation {key} names CDI device {name}, which brings {label} "
                    f"({uuid}): not this container's allocation (it holds {holds}); "
                    "NVIDIA's NRI plugin would inject it from the pod's own annotation"
                )
        for channel in found.imex:
            if channel not in plan.engine_imex:
                raise RequestError(
                    f"annotation {key} names CDI device {name}, which brings IMEX channel "
                    f"{channel}: not this container's allocation; NVIDIA's NRI plugin "
                    "would inject it from the pod's own annotation"
                )


def agent_hook(
    spec: SpecDict, container: Container, work: RootWork, pending: PendingWork
) -> SpecDict:
    """``spec`` whose nvshim createContainer hook is the client's, asking the agent
    (``nri-inroot: agent``), with ``work`` (and the hook's ``/dev`` links) left in
    ``pending`` for it, bound to the container's cgroups path (only a hook that runs
    there may take it); ``spec`` as it is when the client is not here."""
    from nvshim.runtime.hookargs import parse_graphics_args, runs_nvshim_hook

    hooks = (spec.get("hooks") or {}).get("createContainer") or []
    ours = [h for h in hooks if runs_nvshim_hook(h.get("args") or ())]
    if len(ours) != 1:
        return spec
    entry = pending.hook_entry(ours[0])
    if entry is None:
        return spec
    dev_links, _egl = parse_graphics_args(ours[0]["args"])
    pending.put(container.id, work, tuple(dev_links), container.cgroups_path)
    new_hooks = dict(spec["hooks"])
    new_hooks["createContainer"] = [entry if h is ours[0] else h for h in hooks]
    return {**spec, "hooks": new_hooks}


def _guard(container: Container, keys: Tuple[str, ...]) -> Adjustment:
    """``NVIDIA_VISIBLE_DEVICES=void``, the claim's annotations removed (NRI removes what
    is named with a ``-`` prefix) and each device-list mount replaced by an empty read-only
    tmpfs at its destination (NRI v0.6, containerd 1.7's, never hands a mount removal to the
    engine; a mount at the same destination replaces it in every version); RequestError
    for a claim the engine would keep whatever the adjustment says.

    containerd applies an env adjustment to the first entry of a name and then re-adds
    every later entry over it (NRI's ``AdjustEnv``), and replaces one mount per
    destination: a variable set twice (image ENV and pod env, say) or a destination
    mounted twice cannot be stripped, only refused."""
    from nvshim.runtime.claim import VISIBLE_DEVICES, device_list_id

    values = _entries(container, VISIBLE_DEVICES)
    if len(values) > 1 and values[-1] != VOID:
        raise RequestError(
            f"{VISIBLE_DEVICES} is set {len(values)} times in its env (the image's and the "
            f"pod's, say): NRI can void only the first, the engine keeps the last "
            f"({VISIBLE_DEVICES}={values[-1][:64]!r})"
        )
    listed = [
        m.destination
        for m in container.mounts
        if device_list_id({"source": m.source, "destination": m.destination}) is not None
    ]
    twice = sorted({d for d in listed if listed.count(d) > 1})
    if twice:
        raise RequestError(
            f"device-list mount {twice[0][:200]!r} is mounted "
            f"{listed.count(twice[0])} times: NRI removes only one"
        )
    env = () if values and values[-1] == VOID else ((VISIBLE_DEVICES, VOID),)
    return Adjustment(
        annotations={"-" + k: "" for k in keys},
        mounts=tuple(Mount(d, "tmpfs", "tmpfs", _EMPTY) for d in dict.fromkeys(listed)),
        env=env,
    )


#: The options of the tmpfs that takes a device-list mount's place: nothing in it, nothing
#: to write or run.
_EMPTY = ("ro", "nosuid", "nodev", "noexec", "size=4k")


def _runtime(config: Config) -> str:
    return config.runtimes[0] if config.runtimes else "runc"


def _grant(
    config: Config, pod: Pod, container: Container, plan: Plan, through: bool = False
) -> None:
    """Journal ``plan``'s grant: injected by the plugin (source ``nri:<source>``), or let
    through to a handler that injects GPUs itself (``through``: ``nri-guard:<source>``)."""
    if not config.grants_journal:
        return
    from nvshim.runtime.grants import Grant, append_grant

    by = "nri-guard" if through else "nri"
    grant = Grant(
        time=time.time(),
        container_id=container.id,
        root=config.nri_runtime_root,
        runtime=_runtime(config),
        bundle="",
        source=f"{by}:{plan.grant_source}",
        gpus=plan.granted_uuids,
        shared=plan.request.shared,
        verified=plan.verified,
        namespace=pod.namespace,
        pod=pod.name,
        pod_uid=pod.uid,
        container=container.name,
    )
    append_grant(config.grants_journal, grant, config.grants_journal_max_bytes)


def _deny(
    config: Config, pod: Pod, container: Container, action: str, reason: str, plan: Optional[Plan]
) -> None:
    if not config.grants_journal:
        return
    from nvshim.runtime.denials import Denial, append_denial, asked_of, denials_path

    denial = Denial(
        time=time.time(),
        container_id=container.id,
        root=config.nri_runtime_root,
        runtime=_runtime(config),
        bundle="",
        action=action,
        reason=reason,
        asked=asked_of(plan.claim) if plan is not None else (),
        namespace=pod.namespace,
        pod=pod.name,
        pod_uid=pod.uid,
        container=container.name,
    )
    append_denial(denials_path(config.grants_journal), denial, config.grants_journal_max_bytes)


def start_work(work: RootWork, pid: int, who: str, log: Log) -> None:
    """The in-root work of ``nri-inroot: start``, in the container's root as its process
    ``pid`` sees it (before its program runs). A rootfs that cannot be written (read-only)
    is one error line: the container starts without the links and cache."""
    from nvshim.runtime import rootwork

    started = time.perf_counter()
    try:
        # the trailing slash: prepare opens its rootfs O_NOFOLLOW, and /proc/<pid>/root is
        # a (magic) symlink to be followed
        warnings = rootwork.prepare(f"/proc/{pid}/root/", work)
    except (rootwork.Fallback, NvshimError) as exc:
        log.error("nri in-root work not done", who=who, error=str(exc))
        return
    log.info(
        "nri in-root work",
        who=who,
        warnings=list(warnings),
        ms=round((time.perf_counter() - started) * 1e3, 2),
    )


class Later:
    """In-root work waiting for its container's start (``nri-inroot: start``), by container
    id: at most :data:`_LATER_MAX` (starts or removals missed across a reconnect: the
    oldest goes). Shared by the plugin's request threads, so every access takes its lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._work: Dict[str, RootWork] = {}

    def put(self, container_id: str, work: RootWork) -> None:
        with self._lock:
            if len(self._work) >= _LATER_MAX and container_id not in self._work:
                del self._work[next(iter(self._work))]
            self._work[container_id] = work

    def pop(self, container_id: str) -> Optional[RootWork]:
        """The work held for ``container_id`` (None: none), taken: nobody else gets it."""
        with self._lock:
            return self._work.pop(container_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._work)


#: NRI's Plugin-service methods that report one event, and the event (NRI's ``Event``).
EVENT_METHODS: Dict[str, int] = {
    "RunPodSandbox": Event.RUN_POD_SANDBOX,
    "StopPodSandbox": Event.STOP_POD_SANDBOX,
    "RemovePodSandbox": Event.REMOVE_POD_SANDBOX,
    "CreateContainer": Event.CREATE_CONTAINER,
    "PostCreateContainer": Event.POST_CREATE_CONTAINER,
    "StartContainer": Event.START_CONTAINER,
    "PostStartContainer": Event.POST_START_CONTAINER,
    "UpdateContainer": Event.UPDATE_CONTAINER,
    "PostUpdateContainer": Event.POST_UPDATE_CONTAINER,
    "StopContainer": Event.STOP_CONTAINER,
    "RemoveContainer": Event.REMOVE_CONTAINER,
}
#: Methods answered with nothing whatever the plugin handles: NRI's newer pod events
#: (no ``Event`` number in v0.6) and the engine's goodbye.
_ANSWERED_EMPTY = frozenset({"Shutdown", "UpdatePodSandbox", "PostUpdatePodSandbox"})
#: The methods (and StateChange's events) :func:`nvshim.agent.nri.api.decode_event` reads
#: the container's id and pid of.
_ID_DECODED = frozenset({"StateChange", "StartContainer", "RemoveContainer"})
_START = event_mask(Event.START_CONTAINER)


def wanted(event: int, config: Optional[Config]) -> bool:
    """Whether Configure subscribes to ``event`` (of the handler table) under ``config``:
    StartContainer only when in-root work waits for it (``nri-inject`` with ``nri-inroot:
    start``), RemoveContainer only when work can be held for a container (``nri-inject``),
    each of them a round trip the engine pays per container, locked against every other
    NRI call; any other event always. With no config loaded, every event: the
    subscription lasts the connection, and a config that loads later may need it."""
    if config is None:
        return True
    if event == Event.START_CONTAINER:
        return config.nri_inject and config.nri_inroot == "start"
    if event == Event.REMOVE_CONTAINER:
        return config.nri_inject
    return True


@dataclass(frozen=True)
class Call:
    """One request for an event handler: the method, its body and, for a container's start
    or removal, the container's id and pid (read once, by the dispatch)."""

    method: str
    body: bytes
    container_id: str = ""
    pid: int = 0


#: An event's handler: the request in, the reply's payload out.
Handler = Callable[[Call], bytes]


class Plugin:
    """The Plugin service, in the shape of containerd/nri's ``pkg/stub``: one table,
    :attr:`handlers`, maps each event nvshim handles to its handler; :meth:`handle` (the
    transport's dispatch) calls through it, and the Configure reply subscribes to those
    of its events the config needs (:meth:`events`). An event method with no handler, or a
    StateChange carrying such an event, is answered with nothing; a method NRI does not
    have is ``UNIMPLEMENTED``."""

    def __init__(self, state: AgentState, pending: Optional[PendingWork] = None) -> None:
        self.state = state
        self.pending = pending
        """Where ``nri-inroot: agent`` leaves in-root work for the agent's hook."""
        self.log: Log = state.log
        self.configured: Dict[str, str] = {}
        self.later = Later()
        """In-root work waiting for its container's start (``nri-inroot: start``)."""
        self.subscribed = 0
        """The event mask of the last Configure reply: what the engine sends."""
        self._warned_start = False
        self.handlers: Dict[int, Handler] = {
            Event.CREATE_CONTAINER: self.create_container,
            Event.START_CONTAINER: self.start_container,
            Event.REMOVE_CONTAINER: self.remove_container,
        }
        """Each event nvshim handles, and its handler: what Configure subscribes to."""

    def events(self) -> int:
        """The Configure reply's event mask: the events of :attr:`handlers` the config
        loaded now needs (:func:`wanted`)."""
        config = self.state.config
        return event_mask(*(e for e in self.handlers if wanted(e, config)))

    def handle(self, method: str, body: bytes) -> bytes:
        """The reply to one Plugin-service request (RpcError: the engine's error reply)."""
        if method == "Configure":
            self.configured = decode_configure(body)
            self.state.reload_if_changed()
            self.subscribed = self.events()
            self._warned_start = False
            self.log.info("nri configured", events=self.subscribed, **self.configured)
            return encode_configure_reply(self.subscribed)
        if method == "Synchronize":
            return encode_sync_reply(body)
        if method in _ID_DECODED:
            event, cid, pid = decode_event(method, body)
            call = Call(method, body, cid, pid)
        elif method in EVENT_METHODS:
            event, call = EVENT_METHODS[method], Call(method, body)
        elif method in _ANSWERED_EMPTY:
            return b""
        else:
            raise RpcError(f"method {method} is not implemented by nvshim", UNIMPLEMENTED)
        handler = self.handlers.get(event)
        return handler(call) if handler is not None else b""

    def create_container(self, call: Call) -> bytes:
        """CreateContainer: :func:`decide`'s adjustment; nothing when nvshim itself cannot
        decide (its install changed, no config, an internal error), an error reply for its
        refusal. The request is decoded only when a duty is on."""
        from nvshim.agent.state import install_changed

        changed = install_changed()
        if changed:
            self.log.error("nri create not adjusted", reason=changed)
            return b""
        who = ""
        try:
            self.state.reload_if_changed()
            config = self.state.config
            if config is None:
                self.log.warning(
                    "nri create not adjusted: no config", error=self.state.config_error
                )
                return b""
            if not (config.nri_inject or config.nri_guard or config.nri_verify):
                return b""
            pod, container = decode_pod_container(call.body)
            who = _who(pod, container)
            later = self.later if self.subscribed & _START else None
            if later is None and config.nri_inject and config.nri_inroot == "start":
                self._unsubscribed_start()
            return encode_create_reply(
                decide(config, pod, container, self.log, later=later, pending=self.pending)
            )
        except (RpcError, WireError):
            raise  # nvshim's decision (a refusal), or a request that is not one
        except Exception as exc:  # noqa: BLE001 - nvshim's own failure never fails a create
            self.log.error(
                "nri create not adjusted: internal error",
                **({"who": who} if who else {}),
                error=f"{type(exc).__name__}: {exc}",
            )
            return b""

    def _unsubscribed_start(self) -> None:
        """One warning per registration: ``nri-inroot: start`` loaded after the engine
        configured the plugin without StartContainer; the work stays with the hook."""
        if self._warned_start:
            return
        self._warned_start = True
        self.log.warning(
            "nri-inroot: start waits for the next registration (restart the agent)",
            reason="the engine was told no StartContainer at Configure: the createContainer "
            "hook does the in-root work until then",
        )

    def start_container(self, call: Call) -> bytes:
        """StartContainer: the in-root work held for the container (``nri-inroot:
        start``), done in its root before its program runs."""
        work = self.later.pop(call.container_id)
        if work is not None and call.pid:
            if call.method == "StateChange":
                _event, pod, container = decode_state_change(call.body)
            else:
                pod, container = decode_pod_container(call.body)
            start_work(work, call.pid, _who(pod, container), self.log)
        return b""

    def remove_container(self, call: Call) -> bytes:
        """RemoveContainer: the work still held for a container whose hook or start never
        came, dropped."""
        if self.pending is not None:
            self.pending.drop(call.container_id)
        self.later.pop(call.container_id)
        return b""
