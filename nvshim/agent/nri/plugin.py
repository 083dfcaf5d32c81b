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
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Mapping, NoReturn, Optional, Tuple

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

__all__ = ["Plugin", "spec_of", "adjustment_of", "decide", "nvidia_cdi_claim"]

#: The env entry that keeps every GPU runtime from injecting anything.
VOID = "void"
_CRI = "io.kubernetes.cri."
#: In-root work kept for containers not started yet (``nri-inroot: start``), at most.
_LATER_MAX = 4096


def spec_of(pod: Pod, container: Container) -> Dict[str, Any]:
    """The OCI spec (the parts a create reads) the engine will write for ``container``.

    The identity annotations containerd writes are filled from the pod the engine reported
    when the container's annotations carry none (an engine's fields, not the pod's)."""
    annotations = dict(container.annotations)
    if not any(k.startswith("io.kubernetes.") for k in annotations) and pod.name:
        annotations.update({
            _CRI + "container-type": "container", _CRI + "sandbox-id": pod.id,
            _CRI + "sandbox-name": pod.name, _CRI + "sandbox-namespace": pod.namespace,
            _CRI + "sandbox-uid": pod.uid, _CRI + "container-name": container.name,
        })
    devices = [{"path": d.path, "type": d.type, "major": d.major, "minor": d.minor}
               for d in container.devices]
    hooks: Dict[str, List[Dict[str, Any]]] = {}
    for kind, found in container.hooks.items():
        hooks[kind] = [_hook_json(h) for h in found]
    spec: Dict[str, Any] = {
        "ociVersion": "1.0.2",
        "process": {"args": list(container.args), "env": list(container.env)},
        "mounts": [{"destination": m.destination, "type": m.type, "source": m.source,
                    "options": list(m.options)} for m in container.mounts],
        "annotations": annotations,
        "linux": {"devices": devices},
    }
    if hooks:
        spec["hooks"] = hooks
    return spec


def _hook_json(hook: Hook) -> Dict[str, Any]:
    """An NRI hook as the OCI spec writes it."""
    out: Dict[str, Any] = {"path": hook.path}
    if hook.args:
        out["args"] = list(hook.args)
    if hook.env:
        out["env"] = list(hook.env)
    if hook.timeout is not None:
        out["timeout"] = hook.timeout
    return out


def adjustment_of(before: Dict[str, Any], after: Dict[str, Any]) -> Adjustment:
    """What ``after`` (the planned spec) adds to ``before``, as NRI adjustments."""
    old_env = {e.partition("=")[0]: e for e in before["process"]["env"]}
    env: Dict[str, str] = {}
    for entry in (after.get("process") or {}).get("env") or ():
        name, _, value = entry.partition("=")
        if old_env.get(name) != entry:
            env[name] = value
    old_mounts = before["mounts"]
    mounts = tuple(
        Mount(m["destination"], m.get("type", "") or "", m.get("source", "") or "",
              tuple(m.get("options") or ()))
        for m in after.get("mounts") or () if m not in old_mounts)
    old_devices = {d["path"] for d in before["linux"]["devices"]}
    devices = tuple(
        Device(d["path"], d.get("type", "c"), int(d.get("major", 0)), int(d.get("minor", 0)),
               d.get("fileMode"), d.get("uid"), d.get("gid"))
        for d in (after.get("linux") or {}).get("devices") or ()
        if d.get("path") not in old_devices)
    hooks: Dict[str, Tuple[Hook, ...]] = {}
    old_hooks = before.get("hooks") or {}
    for kind, found in (after.get("hooks") or {}).items():
        new = tuple(Hook(h["path"], tuple(h.get("args") or ()), tuple(h.get("env") or ()),
                         h.get("timeout")) for h in found if h not in old_hooks.get(kind, ()))
        if new:
            hooks[kind] = new
    return Adjustment(mounts=mounts, env=tuple(env.items()), hooks=hooks, devices=devices)


def _who(pod: Pod, container: Container) -> str:
    return f"pod {pod.namespace}/{pod.name} container {container.name}"


def decide(config: Config, pod: Pod, container: Container, log: Any,
           journal: bool = True, later: Optional[Later] = None,
           pending: Optional[Any] = None) -> Adjustment:
    """The adjustment for ``container`` of ``pod`` (see the module docstring); RpcError
    for a refusal. With ``nri-inroot: start`` the in-root work is left out of the
    adjustment and put in ``later`` under the container's id, for :func:`start_work`;
    with ``agent`` it waits in ``pending`` (:class:`nvshim.agent.hookwork.PendingWork`)
    and the hook is the client's (:func:`agent_hook`)."""
    if not (config.nri_inject or config.nri_guard or config.nri_verify):
        return Adjustment()
    handler = pod.runtime_handler
    nvidia = nvidia_cdi_claim(pod.annotations, container.name)
    ours = handler in config.nri_nvshim_handlers
    if ours and nvidia is None:
        return Adjustment()
    started = time.perf_counter()
    spec = spec_of(pod, container)
    from nvshim._record import replace
    from nvshim.runtime.create import plan_spec

    # NVIDIA's annotation is held to the allocation: planned under require-allocation
    held = config.nri_guard or nvidia is not None
    planned = replace(config, require_allocation=True) if held else config
    label = f"nri:{pod.namespace}/{pod.name}/{container.name}"
    try:
        try:
            plan = plan_spec(spec, planned, dict(pod.annotations), label,
                             save_cache=journal and not ours)
        except RequestError as exc:
            plan = _without_kubelet(exc, spec, planned, pod, label, ours)
        if nvidia is not None and (config.nri_guard or config.nri_verify):
            _check_nvidia_claim(plan, planned, nvidia)
    except RequestError as exc:
        if not (config.nri_verify or (nvidia is not None and config.nri_guard)):
            log.warning("nri refusal not enforced (nri-verify: false)", who=_who(pod, container),
                        reason=str(exc))
            return Adjustment()
        _refuse(config, pod, container, str(exc), log, journal)
    except NvshimError as exc:
        log.warning("nri plan failed (container created without nvshim's adjustment)",
                    who=_who(pod, container), error=str(exc))
        return Adjustment()
    if ours:  # nvshim-runtime decides the rest, and records it
        return Adjustment()
    if config.nri_guard and not plan.granted_uuids and _claims(plan):
        from nvshim.runtime.denials import strip_reason

        reason = strip_reason(plan) or "no allocation"
        try:
            adjust = _guard(container, plan.claim.annotation_keys)
        except RequestError as exc:  # what NRI cannot strip is refused
            _refuse(config, pod, container, f"{reason}; the guard cannot strip the claim: "
                    f"{exc}", log, journal, plan)
        if journal:
            try:
                _deny(config, pod, container, "stripped", reason, plan)
            except NvshimError as exc:  # record or fail
                log.error("nri refused: denial not recorded", who=_who(pod, container),
                          error=str(exc))
                raise RpcError(f"nvshim: {_who(pod, container)}: {reason}; the container "
                               f"is refused: its denial cannot be recorded ({exc})") from exc
        log.info("nri guard", who=_who(pod, container), reason=reason,
                 ms=round((time.perf_counter() - started) * 1e3, 2))
        return adjust
    if plan.granted_uuids and config.nri_inject and handler not in config.nri_gpu_handlers:
        assert plan.new_spec is not None
        new_spec = plan.new_spec
        work = plan.rootfs.work
        if config.nri_inroot == "start" and work is not None and later is not None:
            from nvshim.runtime.plan import RootfsDecision

            new_spec = plan.render(RootfsDecision(work, "runtime", "/proc/<pid>/root"))
            later.put(container.id, work)
        elif config.nri_inroot == "agent" and work is not None and pending is not None:
            new_spec = agent_hook(new_spec, container, work, pending)
        adjust = adjustment_of(spec, new_spec)
        if journal:
            _record_grant(config, pod, container, plan, log)
        log.info("nri inject", who=_who(pod, container), gpus=list(plan.granted_uuids),
                 plan=plan.plan_source, ms=round((time.perf_counter() - started) * 1e3, 2))
        return adjust
    narrowed = Adjustment()
    if plan.granted_uuids and config.nri_guard:
        # the handler injects GPUs itself (NVIDIA's runtime) from the env's last entry: an
        # allocated pod that sets the variable again in its own env must not widen it
        try:
            narrowed = _narrowed(container, plan.granted_uuids)
        except RequestError as exc:
            _refuse(config, pod, container, str(exc), log, journal, plan)
    if plan.granted_uuids and config.nri_guard and journal:
        # let through to the handler that injects GPUs itself (NVIDIA's runtime): the
        # record covers this node's GPUs as nvshim's runtime's would
        _record_grant(config, pod, container, plan, log, through=True)
        log.info("nri let through", who=_who(pod, container), gpus=list(plan.granted_uuids),
                 handler=handler, narrowed=bool(narrowed),
                 ms=round((time.perf_counter() - started) * 1e3, 2))
    return narrowed


def _record_grant(config: Config, pod: Pod, container: Container, plan: Any, log: Any,
                  through: bool = False) -> None:
    """:func:`_grant`, or RpcError when it cannot be journaled: record or fail."""
    try:
        _grant(config, pod, container, plan, through)
    except NvshimError as exc:
        log.error("nri refused: grant not recorded", who=_who(pod, container), error=str(exc))
        raise RpcError(f"nvshim: {_who(pod, container)}: the grant of "
                       f"{', '.join(plan.granted_uuids)} cannot be recorded ({exc})") from exc


def _entries(container: Container, name: str) -> List[str]:
    """The values of every env entry of ``name``, in order: the engine keeps all of them,
    and a GPU runtime reads the last."""
    prefix = name + "="
    return [e[len(prefix):] for e in container.env if e.startswith(prefix)]


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
            "rewrite only the first entry, and the engine keeps the last")
    return Adjustment(env=((VISIBLE_DEVICES, ",".join(granted)),))


def _without_kubelet(exc: RequestError, spec: Dict[str, Any], config: Config, pod: Pod,
                     label: str, ours: bool) -> Any:
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

    alone = replace(config, verify_with="none", allocation_sources=tuple(
        s for s in config.allocation_sources if s != "kubelet"))
    plan = plan_spec(spec, alone, dict(pod.annotations), label)
    if plan.granted_uuids or not _claims(plan):
        raise exc
    return plan


def _claims(plan: Any) -> bool:
    """Whether the container claims a GPU in a way some GPU runtime acts on: its env or
    image (``set_void``), a device-list mount (NVIDIA's runtime reads those first), or an
    annotation under ``annotation-prefixes``."""
    claim = plan.claim
    return bool(plan.request.set_void or claim.mount_raw or claim.annotation_keys)


def _refuse(config: Config, pod: Pod, container: Container, reason: str, log: Any,
            journal: bool, plan: Optional[Any] = None) -> NoReturn:
    """Fail the create with one line naming the pod and ``reason``, journaled as
    ``refused`` (record or fail: a refusal that cannot be recorded says so)."""
    message = f"nvshim: {_who(pod, container)}: {reason}"
    if journal:
        try:
            _deny(config, pod, container, "refused", reason, plan)
        except NvshimError as exc:
            message = f"{message} (not recorded: {exc})"
    log.info("nri refused", who=_who(pod, container), reason=reason)
    raise RpcError(message)


#: The pod annotation NVIDIA's own NRI plugin (the GPU Operator's NRI mode) injects CDI
#: devices from, with no allocation checked: NRI's effective annotation, the first of
#: ``<key>/container.<name>``, ``<key>/pod`` and ``<key>``.
NVIDIA_CDI_ANNOTATION = "nvidia.cdi.k8s.io"


def nvidia_cdi_claim(annotations: Mapping[str, str],
                     container: str) -> Optional[Tuple[str, Tuple[str, ...]]]:
    """(the key, the CDI names) NVIDIA's NRI plugin would inject into ``container`` from
    its pod's ``annotations``; None when no such key is set."""
    key = NVIDIA_CDI_ANNOTATION
    for found in (f"{key}/container.{container}", f"{key}/pod", key):
        if found in annotations:
            names = tuple(n.strip() for n in annotations[found].split(",") if n.strip())
            return found, names
    return None


def _check_nvidia_claim(plan: Any, config: Config,
                        nvidia: Tuple[str, Tuple[str, ...]]) -> None:
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
            raise RequestError(f"annotation {key} names CDI device {name}, {found}: "
                               "NVIDIA's NRI plugin would inject it from the pod's own "
                               "annotation")
        for label, uuid in found.gpus:
            if uuid not in granted and parents.get(uuid) not in granted:
                raise RequestError(
                    f"annotation {key} names CDI device {name}, which brings {label} "
                    f"({uuid}): not this container's allocation (it holds {holds}); "
                    "NVIDIA's NRI plugin would inject it from the pod's own annotation")
        for channel in found.imex:
            if channel not in plan.engine_imex:
                raise RequestError(
                    f"annotation {key} names CDI device {name}, which brings IMEX channel "
                    f"{channel}: not this container's allocation; NVIDIA's NRI plugin "
                    "would inject it from the pod's own annotation")


def agent_hook(spec: Dict[str, Any], container: Container, work: Any,
               pending: Any) -> Dict[str, Any]:
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
            f"({VISIBLE_DEVICES}={values[-1][:64]!r})")
    listed = [m.destination for m in container.mounts
              if device_list_id({"source": m.source, "destination": m.destination})
              is not None]
    twice = sorted({d for d in listed if listed.count(d) > 1})
    if twice:
        raise RequestError(f"device-list mount {twice[0][:200]!r} is mounted "
                           f"{listed.count(twice[0])} times: NRI removes only one")
    env = () if values and values[-1] == VOID else ((VISIBLE_DEVICES, VOID),)
    return Adjustment(annotations={"-" + k: "" for k in keys},
                      mounts=tuple(Mount(d, "tmpfs", "tmpfs", _EMPTY)
                                   for d in dict.fromkeys(listed)), env=env)


#: The options of the tmpfs that takes a device-list mount's place: nothing in it, nothing
#: to write or run.
_EMPTY = ("ro", "nosuid", "nodev", "noexec", "size=4k")


def _runtime(config: Config) -> str:
    return config.runtimes[0] if config.runtimes else "runc"


def _grant(config: Config, pod: Pod, container: Container, plan: Any,
           through: bool = False) -> None:
    """Journal ``plan``'s grant: injected by the plugin (source ``nri:<source>``), or let
    through to a handler that injects GPUs itself (``through``: ``nri-guard:<source>``)."""
    if not config.grants_journal:
        return
    from nvshim.runtime.grants import Grant, append_grant

    by = "nri-guard" if through else "nri"
    grant = Grant(
        time=time.time(), container_id=container.id, root=config.nri_runtime_root,
        runtime=_runtime(config), bundle="", source=f"{by}:{plan.grant_source}",
        gpus=plan.granted_uuids, shared=plan.request.shared, verified=plan.verified,
        namespace=pod.namespace, pod=pod.name, pod_uid=pod.uid, container=container.name)
    append_grant(config.grants_journal, grant, config.grants_journal_max_bytes)


def _deny(config: Config, pod: Pod, container: Container, action: str, reason: str,
          plan: Optional[Any]) -> None:
    if not config.grants_journal:
        return
    from nvshim.runtime.denials import Denial, append_denial, asked_of, denials_path

    denial = Denial(
        time=time.time(), container_id=container.id, root=config.nri_runtime_root,
        runtime=_runtime(config), bundle="", action=action, reason=reason,
        asked=asked_of(plan.claim) if plan is not None else (),
        namespace=pod.namespace, pod=pod.name, pod_uid=pod.uid, container=container.name)
    append_denial(denials_path(config.grants_journal), denial,
                  config.grants_journal_max_bytes)


def start_work(work: Any, pid: int, who: str, log: Any) -> None:
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
    log.info("nri in-root work", who=who, warnings=list(warnings),
             ms=round((time.perf_counter() - started) * 1e3, 2))


class Later:
    """In-root work waiting for its container's start (``nri-inroot: start``), by container
    id: at most :data:`_LATER_MAX` (starts or removals missed across a reconnect: the
    oldest goes). Shared by the plugin's request threads, so every access takes its lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._work: Dict[str, Any] = {}

    def put(self, container_id: str, work: Any) -> None:
        with self._lock:
            if len(self._work) >= _LATER_MAX and container_id not in self._work:
                del self._work[next(iter(self._work))]
            self._work[container_id] = work

    def pop(self, container_id: str) -> Any:
        """The work held for ``container_id`` (None: none), taken: nobody else gets it."""
        with self._lock:
            return self._work.pop(container_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._work)


class Plugin:
    """The Plugin service: Configure, Synchronize, CreateContainer, the rest answered."""

    def __init__(self, state: Any, pending: Optional[Any] = None) -> None:
        self.state = state
        self.pending = pending
        """Where ``nri-inroot: agent`` leaves in-root work for the agent's hook."""
        self.log = state.log
        self.configured: Dict[str, str] = {}
        self.later = Later()
        """In-root work waiting for its container's start (``nri-inroot: start``)."""

    def handle(self, method: str, body: bytes) -> bytes:
        if method == "CreateContainer":
            pod, container = decode_pod_container(body)
            from nvshim.agent.state import install_changed

            changed = install_changed()
            if changed:
                self.log.error("nri create not adjusted", reason=changed)
                return b""
            try:
                self.state.reload_if_changed()
                config = self.state.config
                if config is None:
                    self.log.warning("nri create not adjusted: no config",
                                     error=self.state.config_error)
                    return b""
                return encode_create_reply(decide(config, pod, container, self.log,
                                                  later=self.later, pending=self.pending))
            except RpcError:
                raise  # nvshim's decision: a refusal
            except Exception as exc:  # noqa: BLE001 - nvshim's own failure never fails a create
                self.log.error("nri create not adjusted: internal error",
                               who=_who(pod, container),
                               error=f"{type(exc).__name__}: {exc}")
                return b""
        if method == "Configure":
            self.configured = decode_configure(body)
            self.log.info("nri configured", **self.configured)
            return encode_configure_reply(event_mask(
                Event.CREATE_CONTAINER, Event.START_CONTAINER, Event.REMOVE_CONTAINER))
        if method in ("StateChange", "StartContainer", "RemoveContainer"):
            event, cid, pid = decode_event(method, body)
            if event == Event.REMOVE_CONTAINER and self.pending is not None:
                self.pending.drop(cid)  # a create whose hook never ran
            work = self.later.pop(cid)
            if work is not None and event == Event.START_CONTAINER and pid:
                if method == "StateChange":
                    _event, pod, container = decode_state_change(body)
                else:
                    pod, container = decode_pod_container(body)
                start_work(work, pid, _who(pod, container), self.log)
            return b""
        if method == "Synchronize":
            return encode_sync_reply(body)
        if method in ("Shutdown", "UpdateContainer",
                      "StopContainer", "RunPodSandbox", "StopPodSandbox",
                      "RemovePodSandbox", "PostCreateContainer",
                      "PostStartContainer", "PostUpdateContainer",
                      "UpdatePodSandbox", "PostUpdatePodSandbox"):
            return b""
        raise RpcError(f"method {method} is not implemented by nvshim", UNIMPLEMENTED)
