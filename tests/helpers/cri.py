"""Drive containerd's CRI plugin as the kubelet does: RunPodSandbox, CreateContainer, StartContainer.

* :func:`cri_containerd_config` — a private containerd (1.6 or 1.7) config whose CRI plugin
  runs host-network pods without CNI, uses a locally imported image as its sandbox (pause)
  image, and gets nvshim's runtime handler from ``nvshim runtime configure`` itself; with
  ``cdi_spec_dirs`` (containerd 1.7) it injects CDI devices itself (``enable_cdi``), those a
  container's ``cdi.k8s.io/`` annotations and its CRI ``CDI_devices`` name.
* :func:`import_image` — a busybox image (docker-archive tar built here from the host's
  busybox-static rootfs; there is no registry) imported into the ``k8s.io`` namespace.
* :class:`CriClient` — the ``runtime.v1.RuntimeService`` calls a kubelet makes, over gRPC on
  containerd's socket, messages encoded from the published ``k8s.io/cri-api`` ``api.proto``
  field numbers (with nvshim's small protobuf codec for the wire format).

Host network (``NamespaceOption.network = NODE``) keeps CNI out of it. Container output goes
to the CRI log file (``<log_directory>/<log_path>``, CRI log format), read by
:meth:`CriClient.wait_log`.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import grpc

from nvshim import _protobuf as _proto
from tests.helpers.containerd import containerd_private_config

__all__ = [
    "CriClient",
    "cri_containerd_config",
    "import_image",
    "IMAGE",
    "CriError",
    "ContainerSpec",
    "ContainerState",
    "CriMount",
    "Namespaces",
    "Resources",
    "SandboxSpec",
    "SecurityContext",
    "image_archive",
    "CONTAINER",
    "NODE",
    "POD",
    "CREATED",
    "RUNNING",
    "EXITED",
    "UNKNOWN",
]

IMAGE = "docker.io/nvshim-test/busybox:1"
_SERVICE = "/runtime.v1.RuntimeService/"
_NODE = 2  # NamespaceMode.NODE


class CriError(Exception):
    """A CRI call failed; ``details`` is what containerd said (the runtime's error included)."""

    def __init__(self, method: str, code: Any, details: str) -> None:
        super().__init__(f"{method}: {code}: {details}")
        self.method = method
        self.code = code
        self.details = details


def cri_containerd_config(
    base: Path, sandbox_image: str = IMAGE, cdi_spec_dirs: Sequence[str] = (), version: int = 2
) -> str:
    """The containerd config text with CRI set up for host-network test pods;
    ``cdi_spec_dirs``: containerd 1.7+'s own CDI injection on, reading only these dirs.
    ``version`` 3 (containerd 2) splits CRI into ``io.containerd.cri.v1.images`` (the sandbox
    image) and ``io.containerd.cri.v1.runtime`` (the rest), as containerd 2's own default does."""
    cdi = (
        f"    enable_cdi = true\n    cdi_spec_dirs = {json.dumps(list(cdi_spec_dirs))}\n"
        if cdi_spec_dirs
        else ""
    )
    if version == 3:
        runtime = "io.containerd.cri.v1.runtime"
        return (
            containerd_private_config(base).replace("version = 2", "version = 3", 1)
            + f"""\
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{sandbox_image}"
  [plugins."{runtime}"]
{cdi}    restrict_oom_score_adj = true
    disable_apparmor = true
    [plugins."{runtime}".cni]
      bin_dir = "{base}/cni/bin"
      conf_dir = "{base}/cni/net.d"
    [plugins."{runtime}".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."{runtime}".containerd.runtimes.runc.options]
        Root = "{base}/runc-root"
"""
        )
    return (
        containerd_private_config(base)
        + f"""\
  [plugins."io.containerd.grpc.v1.cri"]
{cdi}    sandbox_image = "{sandbox_image}"
    restrict_oom_score_adj = true
    disable_apparmor = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "{base}/cni/bin"
      conf_dir = "{base}/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{base}/runc-root"
"""
    )


def _tar_bytes(files: Sequence[Tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def image_archive(rootfs: Path, name: str = IMAGE, env: Sequence[str] = ()) -> bytes:
    """A docker-archive (``docker save`` layout) of ``rootfs`` as one layer, tagged ``name``,
    whose config sets PATH and ``env`` (``K=V``), as an image's ``ENV`` lines do."""
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w") as tar:
        for path in sorted(rootfs.rglob("*")):
            tar.add(str(path), arcname=str(path.relative_to(rootfs)), recursive=False)
    layer = layer_buf.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", *env],
                "Cmd": ["sleep", "100000"],
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    tag = name[len("docker.io/") :] if name.startswith("docker.io/") else name
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": [tag], "Layers": ["layer/layer.tar"]}]
    ).encode()
    return _tar_bytes(
        [(config_name, config), ("layer/layer.tar", layer), ("manifest.json", manifest)]
    )


def import_image(containerd: Any, rootfs: Path, work: Path) -> str:
    """Import the busybox image into ``containerd``'s namespace (k8s.io for CRI); its name."""
    archive = work / "busybox-image.tar"
    archive.write_bytes(image_archive(rootfs))
    res = containerd.ctr("images", "import", str(archive), timeout=120)
    if res.rc != 0:
        raise AssertionError("ctr images import failed\n" + res.describe())
    return IMAGE


# --------------------------------------------------------------------------- messages


_varint_field = _proto.varint_field


def _all_bytes(fields: Mapping[int, List[_proto.Value]], number: int) -> List[bytes]:
    return [v for v in fields.get(number, []) if isinstance(v, bytes)]


def _first_str(fields: Mapping[int, List[_proto.Value]], number: int) -> str:
    values = _all_bytes(fields, number)
    return values[-1].decode(errors="replace") if values else ""


def _map(number: int, items: Mapping[str, str]) -> bytes:
    return b"".join(
        _proto.message_field(number, _proto.string_field(1, k) + _proto.string_field(2, v))
        for k, v in sorted(items.items())
    )


def _msg(number: int, payload: bytes) -> bytes:
    return _proto.message_field(number, payload)


def sandbox_config(
    name: str,
    namespace: str,
    uid: str,
    log_dir: str,
    cgroup_parent: str,
    annotations: Mapping[str, str],
) -> bytes:
    """PodSandboxConfig{metadata=1, log_directory=3, annotations=7, linux=8}.

    No hostname: a host-network pod shares the host's UTS namespace (the kubelet sends none).
    """
    metadata = (
        _proto.string_field(1, name)
        + _proto.string_field(2, uid)
        + _proto.string_field(3, namespace)
    )
    namespaces = _varint_field(1, _NODE)  # NamespaceOption{network = NODE}
    security = _msg(1, namespaces)  # LinuxSandboxSecurityContext{namespace_options = 1}
    linux = _proto.string_field(1, cgroup_parent) + _msg(2, security)
    return (
        _msg(1, metadata) + _proto.string_field(3, log_dir) + _map(7, annotations) + _msg(8, linux)
    )


def container_config(
    name: str,
    image: str,
    command: Sequence[str],
    env: Mapping[str, str],
    mounts: Sequence[Tuple[str, str]],
    log_path: str,
    annotations: Mapping[str, str],
    devices: Sequence[Tuple[str, str]] = (),
    cdi_devices: Sequence[str] = (),
) -> bytes:
    """ContainerConfig{metadata=1, image=2, command=3, envs=6, mounts=7, devices=8,
    annotations=10, log_path=11, CDI_devices=17{name=1}} (cri-api ``api.proto``)."""
    out = _msg(1, _proto.string_field(1, name)) + _msg(2, _proto.string_field(1, image))
    out += b"".join(_proto.string_field(3, c) for c in command)
    for k, v in env.items():
        out += _msg(6, _proto.string_field(1, k) + _proto.string_field(2, v))
    for host, container in mounts:  # Mount{container_path=1, host_path=2, readonly=3}
        out += _msg(
            7,
            _proto.string_field(1, container) + _proto.string_field(2, host) + _varint_field(3, 1),
        )
    for host, container in devices:  # Device{container_path=1, host_path=2, permissions=3}
        out += _msg(
            8,
            _proto.string_field(1, container)
            + _proto.string_field(2, host)
            + _proto.string_field(3, "rwm"),
        )
    out += _map(10, annotations) + _proto.string_field(11, log_path)
    out += b"".join(_msg(17, _proto.string_field(1, name)) for name in cdi_devices)
    return out


# ------------------------------------------------------------- the kubelet's full messages

POD, CONTAINER, NODE = 0, 1, 2  # NamespaceMode
CREATED, RUNNING, EXITED, UNKNOWN = 0, 1, 2, 3  # ContainerState


@dataclass(frozen=True)
class CriMount:
    """Mount{container_path=1, host_path=2, readonly=3, propagation=5}."""

    container_path: str
    host_path: str
    readonly: bool = False
    propagation: int = 0  # PRIVATE, HOST_TO_CONTAINER, BIDIRECTIONAL


@dataclass(frozen=True)
class Namespaces:
    """NamespaceOption{network=1, pid=2, ipc=3} (POD / CONTAINER / NODE)."""

    network: int = POD
    pid: int = CONTAINER
    ipc: int = POD

    def encode(self) -> bytes:
        return (
            _varint_field(1, self.network) + _varint_field(2, self.pid) + _varint_field(3, self.ipc)
        )


@dataclass(frozen=True)
class SandboxSpec:
    """PodSandboxConfig, the fields a kubelet fills for a Linux pod."""

    name: str
    namespace: str
    uid: str
    log_directory: str
    cgroup_parent: str
    namespaces: Namespaces = Namespaces()
    hostname: str = ""
    privileged: bool = False
    run_as_user: Optional[int] = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        """PodSandboxConfig{metadata=1, hostname=2, log_directory=3, labels=6,
        annotations=7, linux=8{cgroup_parent=1, security_context=2{namespace_options=1,
        run_as_user=3, privileged=6}}}."""
        metadata = (
            _proto.string_field(1, self.name)
            + _proto.string_field(2, self.uid)
            + _proto.string_field(3, self.namespace)
        )
        security = _msg(1, self.namespaces.encode()) + _varint_field(6, int(self.privileged))
        if self.run_as_user is not None:
            security += _msg(3, _varint_field(1, self.run_as_user))
        linux = _proto.string_field(1, self.cgroup_parent) + _msg(2, security)
        return (
            _msg(1, metadata)
            + _proto.string_field(2, self.hostname)
            + _proto.string_field(3, self.log_directory)
            + _map(6, self.labels)
            + _map(7, self.annotations)
            + _msg(8, linux)
        )


@dataclass(frozen=True)
class SecurityContext:
    """LinuxContainerSecurityContext."""

    namespaces: Namespaces = Namespaces()
    privileged: bool = False
    run_as_user: Optional[int] = None
    run_as_group: Optional[int] = None
    readonly_rootfs: bool = False
    no_new_privs: bool = False
    add_capabilities: Sequence[str] = ()
    drop_capabilities: Sequence[str] = ()
    masked_paths: Sequence[str] = ()
    readonly_paths: Sequence[str] = ()

    def encode(self) -> bytes:
        """{capabilities=1{add=1, drop=2}, privileged=2, namespace_options=3, run_as_user=5,
        readonly_rootfs=7, no_new_privs=11, run_as_group=12, masked_paths=13,
        readonly_paths=14}."""
        caps = b"".join(_proto.string_field(1, c) for c in self.add_capabilities) + b"".join(
            _proto.string_field(2, c) for c in self.drop_capabilities
        )
        out = (_msg(1, caps) if caps else b"") + _varint_field(2, int(self.privileged))
        out += _msg(3, self.namespaces.encode())
        if self.run_as_user is not None:
            out += _msg(5, _varint_field(1, self.run_as_user))
        out += _varint_field(7, int(self.readonly_rootfs))
        out += _varint_field(11, int(self.no_new_privs))
        if self.run_as_group is not None:
            out += _msg(12, _varint_field(1, self.run_as_group))
        out += b"".join(_proto.string_field(13, p) for p in self.masked_paths)
        out += b"".join(_proto.string_field(14, p) for p in self.readonly_paths)
        return out


@dataclass(frozen=True)
class Resources:
    """LinuxContainerResources{cpu_period=1, cpu_quota=2, cpu_shares=3,
    memory_limit_in_bytes=4, oom_score_adj=5}."""

    cpu_period: int = 0
    cpu_quota: int = 0
    cpu_shares: int = 0
    memory_limit: int = 0
    oom_score_adj: int = 0

    def encode(self) -> bytes:
        oom = self.oom_score_adj  # int64: a negative value is ten bytes of two's complement
        return (
            _varint_field(1, self.cpu_period)
            + _varint_field(2, self.cpu_quota)
            + _varint_field(3, self.cpu_shares)
            + _varint_field(4, self.memory_limit)
            + _varint_field(5, oom if oom >= 0 else oom + (1 << 64))
        )


@dataclass(frozen=True)
class ContainerSpec:
    """ContainerConfig, the fields a kubelet fills for a Linux container."""

    name: str
    image: str
    command: Sequence[str] = ()
    args: Sequence[str] = ()
    working_dir: str = ""
    envs: Sequence[Tuple[str, str]] = ()
    mounts: Sequence[CriMount] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    log_path: str = ""
    security: SecurityContext = SecurityContext()
    resources: Resources = Resources()

    def encode(self) -> bytes:
        """ContainerConfig{metadata=1, image=2, command=3, args=4, working_dir=5, envs=6,
        mounts=7, labels=9, annotations=10, log_path=11, linux=15{resources=1,
        security_context=2}}."""
        out = _msg(1, _proto.string_field(1, self.name)) + _msg(
            2, _proto.string_field(1, self.image)
        )
        out += b"".join(_proto.string_field(3, c) for c in self.command)
        out += b"".join(_proto.string_field(4, a) for a in self.args)
        out += _proto.string_field(5, self.working_dir)
        for k, v in self.envs:
            out += _msg(6, _proto.string_field(1, k) + _proto.string_field(2, v))
        for m in self.mounts:
            out += _msg(
                7,
                _proto.string_field(1, m.container_path)
                + _proto.string_field(2, m.host_path)
                + _varint_field(3, int(m.readonly))
                + _varint_field(5, m.propagation),
            )
        out += _map(9, self.labels) + _map(10, self.annotations)
        out += _proto.string_field(11, self.log_path)
        out += _msg(15, _msg(1, self.resources.encode()) + _msg(2, self.security.encode()))
        return out


@dataclass(frozen=True)
class ContainerState:
    """What ContainerStatus says: state=3, exit_code=7, reason=10, message=11."""

    state: int
    exit_code: int
    reason: str
    message: str


def _first_string(data: bytes) -> str:
    return _first_str(_proto.by_number(data), 1)


class CriClient:
    """The kubelet side of CRI, for one containerd socket."""

    def __init__(self, socket: str, timeout: float = 60) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.timeout = timeout
        self.sandboxes: List[str] = []

    def call(self, method: str, request: bytes) -> bytes:
        stub = self.channel.unary_unary(
            _SERVICE + method, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        try:
            response: bytes = stub(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise CriError(method, exc.code(), exc.details() or "") from None
        return response

    def run_pod(
        self,
        name: str,
        namespace: str,
        uid: str,
        log_dir: Path,
        cgroup_parent: str,
        handler: str,
        annotations: Optional[Mapping[str, str]] = None,
    ) -> Tuple[str, bytes]:
        """RunPodSandbox → (sandbox id, the PodSandboxConfig sent, for CreateContainer)."""
        log_dir.mkdir(parents=True, exist_ok=True)
        config = sandbox_config(
            name, namespace, uid, str(log_dir), cgroup_parent, annotations or {}
        )
        reply = self.call("RunPodSandbox", _msg(1, config) + _proto.string_field(2, handler))
        sandbox = _first_string(reply)
        self.sandboxes.append(sandbox)
        return sandbox, config

    def create_container(
        self,
        sandbox: str,
        pod_config: bytes,
        name: str,
        image: str,
        command: Sequence[str],
        env: Optional[Mapping[str, str]] = None,
        mounts: Sequence[Tuple[str, str]] = (),
        annotations: Optional[Mapping[str, str]] = None,
        devices: Sequence[Tuple[str, str]] = (),
        cdi_devices: Sequence[str] = (),
    ) -> str:
        """CreateContainer (containerd writes the OCI spec; no runtime runs yet) → container id.
        ``devices``: (host path, container path) of device nodes containerd puts in the spec
        (``linux.devices`` and a cgroup rule), as it does for CDI devices it injects.
        ``cdi_devices``: fully qualified CDI names, as the kubelet sends a DRA claim's or a
        device plugin's (``cdi-cri``) devices; containerd 1.7 injects them itself."""
        config = container_config(
            name,
            image,
            command,
            env or {},
            mounts,
            f"{name}.log",
            annotations or {},
            devices,
            cdi_devices,
        )
        request = _proto.string_field(1, sandbox) + _msg(2, config) + _msg(3, pod_config)
        return _first_string(self.call("CreateContainer", request))

    def start_container(self, container: str) -> None:
        """StartContainer: the shim runs the runtime's create and start (nvshim runs here)."""
        self.call("StartContainer", _proto.string_field(1, container))

    def run_sandbox(self, spec: SandboxSpec, handler: str = "") -> Tuple[str, bytes]:
        """RunPodSandbox for a full :class:`SandboxSpec` → (sandbox id, the config sent)."""
        config = spec.encode()
        reply = self.call("RunPodSandbox", _msg(1, config) + _proto.string_field(2, handler))
        sandbox = _first_string(reply)
        self.sandboxes.append(sandbox)
        return sandbox, config

    def create(self, sandbox: str, pod_config: bytes, spec: ContainerSpec) -> str:
        """CreateContainer for a full :class:`ContainerSpec` → container id."""
        request = _proto.string_field(1, sandbox) + _msg(2, spec.encode()) + _msg(3, pod_config)
        return _first_string(self.call("CreateContainer", request))

    def status(self, container: str) -> ContainerState:
        """ContainerStatus{container_id=1} → its state, exit code, reason and message."""
        reply = _proto.by_number(self.call("ContainerStatus", _proto.string_field(1, container)))
        status = _proto.by_number(_all_bytes(reply, 1)[-1])

        def number(n: int) -> int:
            values = [v for v in status.get(n, []) if isinstance(v, int)]
            value = values[-1] if values else 0
            return value - (1 << 64) if value >= 1 << 63 else value

        return ContainerState(number(3), number(7), _first_str(status, 10), _first_str(status, 11))

    def stop_container(self, container: str, timeout: int) -> None:
        """StopContainer{container_id=1, timeout=2}: SIGTERM (the image's stop signal), then
        SIGKILL after ``timeout`` seconds."""
        self.call("StopContainer", _proto.string_field(1, container) + _varint_field(2, timeout))

    def exec_sync(
        self, container: str, cmd: Sequence[str], timeout: int = 10
    ) -> Tuple[int, str, str]:
        """ExecSync{container_id=1, cmd=2, timeout=3} → (exit code, stdout, stderr)."""
        request = (
            _proto.string_field(1, container)
            + b"".join(_proto.string_field(2, c) for c in cmd)
            + _varint_field(3, timeout)
        )
        reply = _proto.by_number(self.call("ExecSync", request))
        codes = [v for v in reply.get(3, []) if isinstance(v, int)]
        out = b"".join(_all_bytes(reply, 1)).decode(errors="replace")
        err = b"".join(_all_bytes(reply, 2)).decode(errors="replace")
        return (codes[-1] if codes else 0), out, err

    def wait_log(self, log_dir: Path, name: str, marker: str, timeout: float = 60) -> str:
        """The container's stdout lines (CRI log format stripped) once ``marker`` appears."""
        path = log_dir / f"{name}.log"
        deadline = time.monotonic() + timeout
        while True:
            lines = []
            if path.exists():
                for raw in path.read_text(errors="replace").splitlines():
                    parts = raw.split(" ", 3)  # <time> <stream> <P|F> <text>
                    if len(parts) == 4:
                        lines.append(parts[3])
            if marker in lines:
                return "\n".join(lines)
            if time.monotonic() > deadline:
                raise AssertionError(f"no {marker!r} in {path} after {timeout}s: {lines[-20:]}")
            time.sleep(0.1)

    def remove_pods(self, close: bool = True) -> None:
        """StopPodSandbox + RemovePodSandbox for every pod this client started; then the
        channel is closed unless ``close`` is false."""
        for sandbox in self.sandboxes:
            for method in ("StopPodSandbox", "RemovePodSandbox"):
                try:
                    self.call(method, _proto.string_field(1, sandbox))
                except CriError:
                    pass  # teardown: the containerd stop that follows removes what is left
        self.sandboxes = []
        if close:
            self.channel.close()


def spec_annotations(state_dir: Path, container: str) -> Dict[str, str]:
    """The annotations of a container's OCI spec as containerd wrote it (bundle config.json)."""
    for path in state_dir.glob(f"io.containerd.runtime.v2.task/*/{container}/config.json"):
        spec = json.loads(path.read_text())
        return dict(spec.get("annotations") or {})
    raise AssertionError(f"no bundle for {container} under {state_dir}")
