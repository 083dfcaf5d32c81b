"""Run a Kubernetes pod spec through a node's CRI as the kubelet does (no per-field glue in tests).

* :func:`pod_template` / :func:`configmap` read ``deploy/daemonset.yaml`` and
  ``deploy/configmap.yaml`` (the DaemonSet's pod template; a ConfigMap's ``data``);
  :func:`with_env` sets an env var in every container of a pod spec, as
  ``kubectl set env`` would.
* :func:`sandbox_spec` and :func:`container_spec` translate a pod spec into the CRI messages
  (:class:`~tests.helpers.cri.SandboxSpec`, :class:`~tests.helpers.cri.ContainerSpec`) the
  kubelet sends: namespaces from ``hostPID``/``hostNetwork``/``hostIPC``; the pod's and the
  container's ``securityContext`` merged (``privileged``, ``runAsUser``/``runAsGroup``,
  ``runAsNonRoot`` checked as the kubelet does, ``readOnlyRootFilesystem``,
  ``allowPrivilegeEscalation: false`` → no_new_privs, ``capabilities``, the kubelet's
  default masked/read-only /proc paths for unprivileged containers); ``command``/``args``,
  ``workingDir``; ``env`` (``value``, ``fieldRef``, ``configMapKeyRef``) and ``envFrom``;
  ``volumeMounts`` (``readOnly``, ``subPath``, ``mountPropagation``); ``resources`` as CPU
  shares/quota, memory limit and the kubelet's OOM score (QoS class, node-critical pods).
  What it does not know (another volume type, ``valueFrom`` kind …) raises ``ValueError``
  naming the field: a manifest change shows up as a failure here, never as a silent skip.
* :class:`Kubelet` runs such a pod on a :class:`~tests.helpers.k8snode.K8sNode`:
  volumes prepared in the node (``hostPath`` with its ``type``; ``configMap`` written in
  the kubelet's atomic layout, ``<dir>/..<stamp>/<key>``, ``..data`` → ``..<stamp>``,
  ``<key>`` → ``..data/<key>``; ``emptyDir``), RunPodSandbox with the runtime class's
  handler, each init container created, started and waited for (exit 0, else the error
  says which and shows its log), then the containers, then the exec readiness probes
  polled until they pass. :meth:`Kubelet.stop_pod` runs ``preStop`` exec hooks, then
  StopContainer with ``terminationGracePeriodSeconds`` (SIGTERM, SIGKILL after it).
"""

from __future__ import annotations

import copy
import re
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar

import grpc
import yaml

from tests.helpers.cri import (
    CONTAINER,
    EXITED,
    NODE,
    POD,
    ContainerSpec,
    CriClient,
    CriError,
    CriMount,
    Namespaces,
    Resources,
    SandboxSpec,
    SecurityContext,
)
from tests.helpers.k8snode import K8sNode

__all__ = [
    "Kubelet",
    "RunningPod",
    "configmap",
    "container_spec",
    "pod_template",
    "quantity",
    "sandbox_spec",
    "with_env",
]

T = TypeVar("T")

# the kubelet's defaults for an unprivileged container (pkg/securitycontext)
MASKED_PATHS = (
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
)
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
_PROPAGATION = {None: 0, "None": 0, "HostToContainer": 1, "Bidirectional": 2}
_CRITICAL = ("system-node-critical", "system-cluster-critical")


# --------------------------------------------------------------------------- manifests


def pod_template(daemonset: Path) -> Dict[str, Any]:
    """The pod spec (``spec.template``: ``metadata`` + ``spec``) of a DaemonSet manifest."""
    doc = yaml.safe_load(daemonset.read_text())
    if doc.get("kind") != "DaemonSet":
        raise ValueError(f"{daemonset}: kind is {doc.get('kind')!r}, not DaemonSet")
    return dict(doc["spec"]["template"])


def configmap(path: Path) -> Tuple[str, Dict[str, str]]:
    """A ConfigMap manifest's (name, data)."""
    doc = yaml.safe_load(path.read_text())
    if doc.get("kind") != "ConfigMap":
        raise ValueError(f"{path}: kind is {doc.get('kind')!r}, not ConfigMap")
    return doc["metadata"]["name"], dict(doc.get("data") or {})


def with_env(pod: Mapping[str, Any], env: Mapping[str, str]) -> Dict[str, Any]:
    """A copy of ``pod`` with ``env`` set in every (init) container, replacing same names."""
    out = copy.deepcopy(dict(pod))
    for c in [*out["spec"].get("initContainers", []), *out["spec"]["containers"]]:
        kept = [e for e in c.get("env", []) if e["name"] not in env]
        c["env"] = kept + [{"name": k, "value": v} for k, v in env.items()]
    return out


_SUFFIX = {
    "": 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
}


def quantity(value: Any) -> float:
    """A Kubernetes quantity ("100m", "128Mi", "1") as a number."""
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value))
    if m is None or m.group(2) not in _SUFFIX:
        raise ValueError(f"resource quantity {value!r} is not understood")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


# --------------------------------------------------------------------------- translation


@dataclass(frozen=True)
class PodIdentity:
    """Who the pod is on this node (what the API server would have filled in)."""

    name: str
    namespace: str
    uid: str
    node_name: str
    host_ip: str = "127.0.0.1"


def _namespaces(spec: Mapping[str, Any]) -> Namespaces:
    pid = NODE if spec.get("hostPID") else POD if spec.get("shareProcessNamespace") else CONTAINER
    return Namespaces(
        network=NODE if spec.get("hostNetwork") else POD,
        pid=pid,
        ipc=NODE if spec.get("hostIPC") else POD,
    )


def sandbox_spec(pod: Mapping[str, Any], who: PodIdentity, cgroup_parent: str) -> SandboxSpec:
    """The PodSandboxConfig the kubelet sends for ``pod`` (a ``metadata`` + ``spec`` dict)."""
    spec = pod["spec"]
    meta = pod.get("metadata") or {}
    containers = [*spec.get("initContainers", []), *spec["containers"]]
    labels = {
        **(meta.get("labels") or {}),
        "io.kubernetes.pod.name": who.name,
        "io.kubernetes.pod.namespace": who.namespace,
        "io.kubernetes.pod.uid": who.uid,
    }
    return SandboxSpec(
        name=who.name,
        namespace=who.namespace,
        uid=who.uid,
        log_directory=f"/var/log/pods/{who.namespace}_{who.name}_{who.uid}",
        cgroup_parent=f"{cgroup_parent}/pod{who.uid}",
        namespaces=_namespaces(spec),
        hostname="" if spec.get("hostNetwork") else who.name,
        privileged=any((c.get("securityContext") or {}).get("privileged") for c in containers),
        run_as_user=(spec.get("securityContext") or {}).get("runAsUser"),
        labels=labels,
        annotations=dict(meta.get("annotations") or {}),
    )


def _env(
    c: Mapping[str, Any], who: PodIdentity, configmaps: Mapping[str, Mapping[str, str]]
) -> List[Tuple[str, str]]:
    fields = {
        "metadata.name": who.name,
        "metadata.namespace": who.namespace,
        "metadata.uid": who.uid,
        "spec.nodeName": who.node_name,
        "status.hostIP": who.host_ip,
    }
    out: Dict[str, str] = {}
    for source in c.get("envFrom", []):
        if set(source) - {"configMapRef", "prefix"}:
            raise ValueError(f"container {c['name']}: envFrom {source} is not supported")
        data = configmaps[source["configMapRef"]["name"]]
        out.update({source.get("prefix", "") + k: v for k, v in data.items()})
    for e in c.get("env", []):
        if "valueFrom" not in e:
            out[e["name"]] = str(e.get("value", ""))
            continue
        ref = e["valueFrom"]
        if "fieldRef" in ref and ref["fieldRef"]["fieldPath"] in fields:
            out[e["name"]] = fields[ref["fieldRef"]["fieldPath"]]
        elif "configMapKeyRef" in ref:
            key = ref["configMapKeyRef"]
            out[e["name"]] = configmaps[key["name"]][key["key"]]
        else:
            raise ValueError(
                f"container {c['name']}: env {e['name']} valueFrom {ref} is not supported"
            )
    return list(out.items())


def _oom_score_adj(pod: Mapping[str, Any], c: Mapping[str, Any], memory_capacity: int) -> int:
    spec = pod["spec"]
    if spec.get("priorityClassName") in _CRITICAL:
        return -997
    everything = [*spec.get("initContainers", []), *spec["containers"]]
    res = [x.get("resources") or {} for x in everything]
    if not any(r.get("requests") or r.get("limits") for r in res):
        return 1000  # BestEffort
    if all(
        r.get("limits", {}).get(k) is not None
        and (r.get("requests") or r["limits"]).get(k) == r["limits"][k]
        for r in res
        for k in ("cpu", "memory")
    ):
        return -997  # Guaranteed
    request = quantity(((c.get("resources") or {}).get("requests") or {}).get("memory", 0))
    return int(min(999, max(3, 1000 - 1000 * request // memory_capacity)))


def _resources(pod: Mapping[str, Any], c: Mapping[str, Any], memory_capacity: int) -> Resources:
    r = c.get("resources") or {}
    requests, limits = r.get("requests") or {}, r.get("limits") or {}
    unknown = {
        k
        for k in [*requests, *limits]
        if k not in ("cpu", "memory") and not k.startswith(("nvidia.com/", "ephemeral-storage"))
    }
    if unknown:
        raise ValueError(f"container {c['name']}: resources {sorted(unknown)} not supported")
    cpu_request = requests.get("cpu", limits.get("cpu"))
    shares = max(2, int(quantity(cpu_request) * 1024)) if cpu_request is not None else 2
    quota = int(quantity(limits["cpu"]) * 100000) if "cpu" in limits else 0
    return Resources(
        cpu_period=100000 if quota else 0,
        cpu_quota=quota,
        cpu_shares=shares,
        memory_limit=int(quantity(limits["memory"])) if "memory" in limits else 0,
        oom_score_adj=_oom_score_adj(pod, c, memory_capacity),
    )


def _security(pod: Mapping[str, Any], c: Mapping[str, Any]) -> SecurityContext:
    known = {
        "privileged",
        "runAsUser",
        "runAsGroup",
        "runAsNonRoot",
        "readOnlyRootFilesystem",
        "allowPrivilegeEscalation",
        "capabilities",
        "seccompProfile",
    }
    sc = c.get("securityContext") or {}
    if set(sc) - known:
        raise ValueError(
            f"container {c['name']}: securityContext {sorted(set(sc) - known)} not supported"
        )
    pod_sc = pod["spec"].get("securityContext") or {}
    merged = {**{k: v for k, v in pod_sc.items() if k in known}, **sc}
    user = merged.get("runAsUser")
    if merged.get("runAsNonRoot") and (user is None or user == 0):
        # the kubelet refuses such a container (CreateContainerConfigError); without a
        # runAsUser it would look at the image's user, which these tests never leave unset
        raise ValueError(f"container {c['name']}: runAsNonRoot with runAsUser {user}")
    profile = (merged.get("seccompProfile") or {}).get("type", "Unconfined")
    if profile != "Unconfined":
        raise ValueError(f"container {c['name']}: seccompProfile {profile} not supported")
    privileged = bool(merged.get("privileged"))
    caps = merged.get("capabilities") or {}
    return SecurityContext(
        namespaces=_namespaces(pod["spec"]),
        privileged=privileged,
        run_as_user=user,
        run_as_group=merged.get("runAsGroup"),
        readonly_rootfs=bool(merged.get("readOnlyRootFilesystem")),
        no_new_privs=merged.get("allowPrivilegeEscalation") is False and not privileged,
        add_capabilities=tuple(caps.get("add", ())),
        drop_capabilities=tuple(caps.get("drop", ())),
        masked_paths=() if privileged else MASKED_PATHS,
        readonly_paths=() if privileged else READONLY_PATHS,
    )


def container_spec(
    pod: Mapping[str, Any],
    c: Mapping[str, Any],
    who: PodIdentity,
    volumes: Mapping[str, str],
    configmaps: Mapping[str, Mapping[str, str]],
    memory_capacity: int,
    extra_mounts: Sequence[CriMount] = (),
    attempt: int = 0,
) -> ContainerSpec:
    """The ContainerConfig the kubelet sends for container ``c`` of ``pod``; ``volumes``:
    volume name → its path on the node; ``extra_mounts``: what a device plugin's Allocate
    answered (the kubelet adds its mounts to the container's)."""
    known = {
        "name",
        "image",
        "imagePullPolicy",
        "command",
        "args",
        "workingDir",
        "env",
        "envFrom",
        "volumeMounts",
        "securityContext",
        "resources",
        "readinessProbe",
        "livenessProbe",
        "startupProbe",
        "lifecycle",
        "restartPolicy",
        "terminationMessagePath",
        "terminationMessagePolicy",
        "ports",
    }
    if set(c) - known:
        raise ValueError(f"container {c['name']}: {sorted(set(c) - known)} not supported")
    mounts = []
    for m in c.get("volumeMounts", []):
        if m.get("subPathExpr"):
            raise ValueError(f"container {c['name']}: subPathExpr not supported")
        host = volumes[m["name"]]
        if m.get("subPath"):
            host = f"{host}/{m['subPath']}"
        mounts.append(
            CriMount(
                m["mountPath"],
                host,
                bool(m.get("readOnly")),
                _PROPAGATION[m.get("mountPropagation")],
            )
        )
    return ContainerSpec(
        name=c["name"],
        image=c["image"],
        command=tuple(c.get("command", ())),
        args=tuple(c.get("args", ())),
        working_dir=c.get("workingDir", ""),
        envs=tuple(_env(c, who, configmaps)),
        mounts=tuple(mounts) + tuple(extra_mounts),
        labels={
            "io.kubernetes.container.name": c["name"],
            "io.kubernetes.pod.name": who.name,
            "io.kubernetes.pod.namespace": who.namespace,
            "io.kubernetes.pod.uid": who.uid,
        },
        annotations={"io.kubernetes.container.restartCount": str(attempt)},
        log_path=f"{c['name']}/{attempt}.log",
        security=_security(pod, c),
        resources=_resources(pod, c, memory_capacity),
    )


# --------------------------------------------------------------------------- the kubelet


@dataclass
class RunningPod:
    """A pod the :class:`Kubelet` started: its sandbox and container ids by name."""

    who: PodIdentity
    spec: Dict[str, Any]
    sandbox: str
    log_directory: Path
    containers: Dict[str, str] = field(default_factory=dict)
    init_containers: Dict[str, str] = field(default_factory=dict)

    def log(self, name: str) -> str:
        """Container ``name``'s output (CRI log format stripped)."""
        path = self.log_directory / name / "0.log"
        if not path.exists():
            return ""
        return "\n".join(
            line.split(" ", 3)[3]
            for line in path.read_text(errors="replace").splitlines()
            if line.count(" ") >= 3
        )


def _memory_capacity() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


class Kubelet:
    """The kubelet's pod workers for one node, over the node's CRI socket."""

    def __init__(
        self,
        node: K8sNode,
        configmaps: Optional[Mapping[str, Mapping[str, str]]] = None,
        runtime_classes: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.node = node
        self.cri = CriClient(node.socket, timeout=120)
        self.configmaps = dict(configmaps or {})
        self.runtime_classes = dict(runtime_classes or {})
        """RuntimeClass name → handler (what the API server's RuntimeClass objects say)."""
        self.memory_capacity = _memory_capacity()

    def _retry(self, what: str, call: Callable[[], T], timeout: float = 90) -> T:
        """``call()``, again while containerd is away (the installer restarts it): its socket
        gone (UNAVAILABLE), or back before its CRI plugin ("server is not initialized yet")."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return call()
            except CriError as exc:
                away = exc.code == grpc.StatusCode.UNAVAILABLE or (
                    exc.code == grpc.StatusCode.UNKNOWN
                    and "server is not initialized yet" in exc.details
                )
                if not away or time.monotonic() > deadline:
                    raise
            time.sleep(0.3)

    # ------------------------------------------------------------------ volumes

    def _volumes(self, pod: Mapping[str, Any], who: PodIdentity) -> Dict[str, str]:
        out = {}
        for v in pod["spec"].get("volumes", []):
            name = v["name"]
            kinds = set(v) - {"name"}
            if kinds == {"hostPath"}:
                out[name] = self._host_path(v["hostPath"], name)
            elif kinds == {"configMap"}:
                out[name] = self._configmap_volume(v["configMap"], name, who)
            elif kinds == {"emptyDir"}:
                path = f"/var/lib/kubelet/pods/{who.uid}/volumes/kubernetes.io~empty-dir/{name}"
                self.node.path(path).mkdir(parents=True, exist_ok=True)
                out[name] = path
            else:
                raise ValueError(f"volume {name}: {sorted(kinds)} not supported")
        return out

    def _host_path(self, source: Mapping[str, Any], name: str) -> str:
        path, kind = source["path"], source.get("type", "")
        checks = {
            "": "true",
            "DirectoryOrCreate": f"mkdir -p -m 0755 '{path}'",
            "Directory": f"test -d '{path}'",
            "FileOrCreate": f"touch '{path}'",
            "File": f"test -f '{path}'",
            "Socket": f"test -S '{path}'",
            "CharDevice": f"test -c '{path}'",
        }
        if kind not in checks:
            raise ValueError(f"volume {name}: hostPath type {kind} not supported")
        res = self.node.run(["sh", "-c", checks[kind]])
        if res.rc != 0:
            raise AssertionError(
                f"volume {name}: hostPath {path} is not a {kind}: " + res.describe()
            )
        return str(path)

    def _configmap_volume(self, source: Mapping[str, Any], name: str, who: PodIdentity) -> str:
        data = self.configmaps[source["name"]]
        items = source.get("items") or [{"key": k, "path": k} for k in data]
        mode = source.get("defaultMode", 0o644)
        path = f"/var/lib/kubelet/pods/{who.uid}/volumes/kubernetes.io~configmap/{name}"
        top = self.node.path(path)
        stamp = "..%s" % time.strftime("%Y_%m_%d_%H_%M_%S.0", time.gmtime())
        (top / stamp).mkdir(parents=True)
        for item in items:
            target = top / stamp / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(data[item["key"]])
            target.chmod(item.get("mode", mode))
        (top / "..data").symlink_to(stamp)
        for item in items:
            first = item["path"].split("/")[0]
            if not (top / first).is_symlink():
                (top / first).symlink_to(f"..data/{first}")
        return path

    # ------------------------------------------------------------------ pods

    def run_pod(
        self,
        pod: Mapping[str, Any],
        name: str,
        namespace: str = "default",
        allocations: Optional[Mapping[str, Sequence[CriMount]]] = None,
        ready_timeout: float = 300,
    ) -> RunningPod:
        """Start ``pod`` (``metadata`` + ``spec``) as the kubelet would; ``allocations``:
        container name → the device plugin's mounts for it."""
        spec = pod["spec"]
        who = PodIdentity(name, namespace, str(uuid.uuid4()), "gpu-node-1")
        volumes = self._volumes(pod, who)
        sandbox = sandbox_spec(pod, who, self.node.cgroup_parent)
        log_dir = self.node.path(sandbox.log_directory)
        handler = self.runtime_classes.get(spec.get("runtimeClassName", ""), "")
        if spec.get("runtimeClassName") and not handler:
            raise ValueError(f"runtimeClassName {spec['runtimeClassName']} is not known")
        sandbox_id, config = self._retry(
            "RunPodSandbox", lambda: self.cri.run_sandbox(sandbox, handler)
        )
        running = RunningPod(who, dict(pod), sandbox_id, log_dir)

        def create(c: Mapping[str, Any]) -> str:
            log_dir.joinpath(c["name"]).mkdir(parents=True, exist_ok=True)
            cs = container_spec(
                pod,
                c,
                who,
                volumes,
                self.configmaps,
                self.memory_capacity,
                (allocations or {}).get(c["name"], ()),
            )
            cid = self._retry("CreateContainer", lambda: self.cri.create(sandbox_id, config, cs))
            self._retry("StartContainer", lambda: self.cri.start_container(cid))
            return cid

        for c in spec.get("initContainers", []):
            cid = running.init_containers[c["name"]] = create(c)
            if c.get("restartPolicy") == "Always":
                continue  # a sidecar: runs beside the containers
            self._wait_exit(running, c["name"], cid, ready_timeout)
        for c in spec["containers"]:
            running.containers[c["name"]] = create(c)
        for c in spec["containers"]:
            probe = (c.get("readinessProbe") or {}).get("exec")
            if probe:
                self._wait_ready(running, c["name"], probe["command"], ready_timeout)
        return running

    def _wait_exit(self, pod: RunningPod, name: str, cid: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            state = self._retry("ContainerStatus", lambda: self.cri.status(cid))
            if state.state == EXITED:
                if state.exit_code != 0:
                    raise AssertionError(
                        f"init container {name} exited with {state.exit_code} "
                        f"({state.reason}: {state.message}); its log:\n{pod.log(name)[-3000:]}"
                    )
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"init container {name} still running after {timeout}s; "
                    f"its log:\n{pod.log(name)[-3000:]}"
                )
            time.sleep(0.3)

    def _wait_ready(
        self, pod: RunningPod, name: str, command: Sequence[str], timeout: float
    ) -> None:
        cid = pod.containers[name]
        deadline = time.monotonic() + timeout
        while True:
            state = self._retry("ContainerStatus", lambda: self.cri.status(cid))
            if state.state == EXITED:
                raise AssertionError(
                    f"container {name} exited with {state.exit_code} before "
                    f"it was ready; its log:\n{pod.log(name)[-3000:]}"
                )
            rc, _, _ = self._retry("ExecSync", lambda: self.cri.exec_sync(cid, command))
            if rc == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"container {name} not ready after {timeout}s "
                    f"({' '.join(command)}: {rc}); its log:\n"
                    f"{pod.log(name)[-3000:]}"
                )
            time.sleep(0.5)

    def wait_exit(self, pod: RunningPod, name: str, timeout: float = 60) -> int:
        """Until container ``name`` has exited; its exit code."""
        cid = pod.containers[name]
        deadline = time.monotonic() + timeout
        while True:
            state = self._retry("ContainerStatus", lambda: self.cri.status(cid))
            if state.state == EXITED:
                return state.exit_code
            if time.monotonic() > deadline:
                raise AssertionError(f"container {name} still running after {timeout}s")
            time.sleep(0.2)

    def stop_pod(self, pod: RunningPod) -> Dict[str, int]:
        """Stop the pod as a deletion does: preStop exec hooks, then StopContainer with the
        grace period (SIGTERM, SIGKILL after it); then StopPodSandbox. Each container's
        exit code."""
        grace = int(pod.spec["spec"].get("terminationGracePeriodSeconds", 30))
        codes = {}
        for c in pod.spec["spec"]["containers"]:
            cid = pod.containers[c["name"]]
            pre = ((c.get("lifecycle") or {}).get("preStop") or {}).get("exec")
            if pre:
                self._retry("ExecSync", partial(self.cri.exec_sync, cid, pre["command"], grace))
            self._retry("StopContainer", partial(self.cri.stop_container, cid, grace))
            codes[c["name"]] = self._retry(
                "ContainerStatus", partial(self.cri.status, cid)
            ).exit_code
        self._retry(
            "StopPodSandbox", lambda: self.cri.call("StopPodSandbox", _sandbox_request(pod.sandbox))
        )
        return codes

    def close(self) -> None:
        self.cri.remove_pods()


def _sandbox_request(sandbox: str) -> bytes:
    from nvshim._protobuf import string_field

    return string_field(1, sandbox)
