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
- **guard** (``nri-guard``): planned under require-allocation; a container whose claim is
  stripped (no allocation) gets ``NVIDIA_VISIBLE_DEVICES=void`` and loses its
  ``annotation-prefixes`` annotations and device-list mounts, journaled as ``stripped``;
- **inject** (``nri-inject``): under a handler not in ``nri-gpu-handlers``, a grant's
  device nodes, mounts, env and hooks (a createContainer hook does the in-root work: no
  rootfs exists at CreateContainer; under ``nri-inroot: agent`` the hook is the static
  client asking this agent, :mod:`nvshim.agent.hookwork`) are the adjustment, journaled
  as a grant.

nvshim's own failures (a config that does not load, a host it cannot read) never fail a
create: one log line and no adjustment, as if the plugin were absent.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

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

__all__ = ["Plugin", "spec_of", "adjustment_of", "decide"]

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
           journal: bool = True, later: Optional[Dict[str, Any]] = None,
           pending: Optional[Any] = None) -> Adjustment:
    """The adjustment for ``container`` of ``pod`` (see the module docstring); RpcError
    for a refusal. With ``nri-inroot: start`` the in-root work is left out of the
    adjustment and put in ``later`` under the container's id, for :func:`start_work`;
    with ``agent`` it waits in ``pending`` (:class:`nvshim.agent.hookwork.PendingWork`)
    and the hook is the client's (:func:`agent_hook`)."""
    handler = pod.runtime_handler
    if handler in config.nri_nvshim_handlers:
        return Adjustment()
    if not (config.nri_inject or config.nri_guard or config.nri_verify):
        return Adjustment()
    started = time.perf_counter()
    spec = spec_of(pod, container)
    from nvshim._record import replace
    from nvshim.runtime.create import plan_spec

    planned = replace(config, require_allocation=True) if config.nri_guard else config
    label = f"nri:{pod.namespace}/{pod.name}/{container.name}"
    try:
        plan = plan_spec(spec, planned, dict(pod.annotations), label,
                         save_cache=journal)
    except RequestError as exc:
        if not config.nri_verify:
            log.warning("nri refusal not enforced (nri-verify: false)", who=_who(pod, container),
                        reason=str(exc))
            return Adjustment()
        if journal:
            _deny(config, pod, container, "refused", str(exc), None)
        log.info("nri refused", who=_who(pod, container), reason=str(exc))
        raise RpcError(f"nvshim: {_who(pod, container)}: {exc}") from exc
    except NvshimError as exc:
        log.warning("nri plan failed (container created without nvshim's adjustment)",
                    who=_who(pod, container), error=str(exc))
        return Adjustment()
    if plan.request.set_void and config.nri_guard and not plan.granted_uuids:
        from nvshim.runtime.denials import strip_reason

        reason = strip_reason(plan) or "no allocation"
        if journal and plan.claim.claims_gpus:
            _deny(config, pod, container, "stripped", reason, plan)
        log.info("nri guard", who=_who(pod, container), reason=reason,
                 ms=round((time.perf_counter() - started) * 1e3, 2))
        return _guard(config, container, plan.claim.annotation_keys)
    if plan.granted_uuids and config.nri_inject and handler not in config.nri_gpu_handlers:
        assert plan.new_spec is not None
        new_spec = plan.new_spec
        work = plan.rootfs.work
        if config.nri_inroot == "start" and work is not None and later is not None:
            from nvshim.runtime.plan import RootfsDecision

            new_spec = plan.render(RootfsDecision(work, "runtime", "/proc/<pid>/root"))
            if len(later) >= _LATER_MAX:  # starts or removals missed (a reconnect): oldest out
                del later[next(iter(later))]
            later[container.id] = work
        elif config.nri_inroot == "agent" and work is not None and pending is not None:
            new_spec = agent_hook(new_spec, container.id, work, pending)
        adjust = adjustment_of(spec, new_spec)
        if journal:
            _grant(config, pod, container, plan)
        log.info("nri inject", who=_who(pod, container), gpus=list(plan.granted_uuids),
                 plan=plan.plan_source, ms=round((time.perf_counter() - started) * 1e3, 2))
        return adjust
    return Adjustment()


def agent_hook(spec: Dict[str, Any], container_id: str, work: Any,
               pending: Any) -> Dict[str, Any]:
    """``spec`` whose nvshim createContainer hook is the client's, asking the agent
    (``nri-inroot: agent``), with ``work`` (and the hook's ``/dev`` links) left in
    ``pending`` for it; ``spec`` as it is when the client is not here."""
    from nvshim.runtime.hookargs import parse_graphics_args, runs_nvshim_hook

    hooks = (spec.get("hooks") or {}).get("createContainer") or []
    ours = [h for h in hooks if runs_nvshim_hook(h.get("args") or ())]
    if len(ours) != 1:
        return spec
    entry = pending.hook_entry(ours[0])
    if entry is None:
        return spec
    dev_links, _egl = parse_graphics_args(ours[0]["args"])
    pending.put(container_id, work, tuple(dev_links))
    new_hooks = dict(spec["hooks"])
    new_hooks["createContainer"] = [entry if h is ours[0] else h for h in hooks]
    return {**spec, "hooks": new_hooks}


def _guard(config: Config, container: Container, keys: Tuple[str, ...]) -> Adjustment:
    """``NVIDIA_VISIBLE_DEVICES=void``, the claim's annotations and device-list mounts
    removed (NRI removes what is named with a ``-`` prefix)."""
    from nvshim.runtime.claim import DEVICE_LIST_DIR, VISIBLE_DEVICES

    mounts = tuple(Mount("-" + m.destination) for m in container.mounts
                   if m.source == "/dev/null"
                   and m.destination.startswith(DEVICE_LIST_DIR + "/"))
    return Adjustment(annotations={"-" + k: "" for k in keys}, mounts=mounts,
                      env=((VISIBLE_DEVICES, VOID),))


def _runtime(config: Config) -> str:
    return config.runtimes[0] if config.runtimes else "runc"


def _grant(config: Config, pod: Pod, container: Container, plan: Any) -> None:
    if not config.grants_journal:
        return
    from nvshim.runtime.grants import Grant, append_grant

    grant = Grant(
        time=time.time(), container_id=container.id, root=config.nri_runtime_root,
        runtime=_runtime(config), bundle="", source=f"nri:{plan.grant_source}",
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
    try:
        append_denial(denials_path(config.grants_journal), denial,
                      config.grants_journal_max_bytes)
    except NvshimError:
        pass


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


class Plugin:
    """The Plugin service: Configure, Synchronize, CreateContainer, the rest answered."""

    def __init__(self, state: Any, pending: Optional[Any] = None) -> None:
        self.state = state
        self.pending = pending
        """Where ``nri-inroot: agent`` leaves in-root work for the agent's hook."""
        self.log = state.log
        self.configured: Dict[str, str] = {}
        self.later: Dict[str, Any] = {}
        """In-root work waiting for its container's start (``nri-inroot: start``)."""

    def handle(self, method: str, body: bytes) -> bytes:
        if method == "CreateContainer":
            pod, container = decode_pod_container(body)
            self.state.reload_if_changed()
            config = self.state.config
            if config is None:
                self.log.warning("nri create not adjusted: no config",
                                 error=self.state.config_error)
                return b""
            return encode_create_reply(decide(config, pod, container, self.log,
                                              later=self.later, pending=self.pending))
        if method == "Configure":
            self.configured = decode_configure(body)
            self.log.info("nri configured", **self.configured)
            return encode_configure_reply(event_mask(
                Event.CREATE_CONTAINER, Event.START_CONTAINER, Event.REMOVE_CONTAINER))
        if method in ("StateChange", "StartContainer", "RemoveContainer"):
            event, cid, pid = decode_event(method, body)
            if event == Event.REMOVE_CONTAINER and self.pending is not None:
                self.pending.drop(cid)  # a create whose hook never ran
            work = self.later.pop(cid, None)
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
