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
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import grpc

from nvshim.runtime.allocation import podresources as _proto
from tests.helpers.containerd import containerd_private_config

__all__ = ["CriClient", "cri_containerd_config", "import_image", "IMAGE", "CriError"]

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


def cri_containerd_config(base: Path, sandbox_image: str = IMAGE,
                          cdi_spec_dirs: Sequence[str] = ()) -> str:
    """The containerd config text (version 2) with CRI set up for host-network test pods;
    ``cdi_spec_dirs``: containerd 1.7's own CDI injection on, reading only these dirs."""
    cdi = (f"    enable_cdi = true\n    cdi_spec_dirs = {json.dumps(list(cdi_spec_dirs))}\n"
           if cdi_spec_dirs else "")
    return containerd_private_config(base) + f"""\
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


def _tar_bytes(files: Sequence[Tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def image_archive(rootfs: Path, name: str = IMAGE) -> bytes:
    """A docker-archive (``docker save`` layout) of ``rootfs`` as one layer, tagged ``name``."""
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w") as tar:
        for path in sorted(rootfs.rglob("*")):
            tar.add(str(path), arcname=str(path.relative_to(rootfs)), recursive=False)
    layer = layer_buf.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["sleep", "100000"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [name.split("/", 1)[1]],
                            "Layers": ["layer/layer.tar"]}]).encode()
    return _tar_bytes([(config_name, config), ("layer/layer.tar", layer),
                       ("manifest.json", manifest)])


def import_image(containerd: Any, rootfs: Path, work: Path) -> str:
    """Import the busybox image into ``containerd``'s namespace (k8s.io for CRI); its name."""
    archive = work / "busybox-image.tar"
    archive.write_bytes(image_archive(rootfs))
    res = containerd.ctr("images", "import", str(archive), timeout=120)
    if res.rc != 0:
        raise AssertionError("ctr images import failed\n" + res.describe())
    return IMAGE


# --------------------------------------------------------------------------- messages


def _varint_field(number: int, value: int) -> bytes:
    return _proto._varint(number << 3) + _proto._varint(value) if value else b""


def _map(number: int, items: Mapping[str, str]) -> bytes:
    return b"".join(
        _proto.bytes_field(number, _proto.string_field(1, k) + _proto.string_field(2, v))
        for k, v in sorted(items.items()))


def _msg(number: int, payload: bytes) -> bytes:
    return _proto.bytes_field(number, payload)


def sandbox_config(name: str, namespace: str, uid: str, log_dir: str, cgroup_parent: str,
                   annotations: Mapping[str, str]) -> bytes:
    """PodSandboxConfig{metadata=1, log_directory=3, annotations=7, linux=8}.

    No hostname: a host-network pod shares the host's UTS namespace (the kubelet sends none).
    """
    metadata = (_proto.string_field(1, name) + _proto.string_field(2, uid)
                + _proto.string_field(3, namespace))
    namespaces = _varint_field(1, _NODE)  # NamespaceOption{network = NODE}
    security = _msg(1, namespaces)  # LinuxSandboxSecurityContext{namespace_options = 1}
    linux = _proto.string_field(1, cgroup_parent) + _msg(2, security)
    return (_msg(1, metadata) + _proto.string_field(3, log_dir)
            + _map(7, annotations) + _msg(8, linux))


def container_config(name: str, image: str, command: Sequence[str], env: Mapping[str, str],
                     mounts: Sequence[Tuple[str, str]], log_path: str,
                     annotations: Mapping[str, str],
                     devices: Sequence[Tuple[str, str]] = (),
                     cdi_devices: Sequence[str] = ()) -> bytes:
    """ContainerConfig{metadata=1, image=2, command=3, envs=6, mounts=7, devices=8,
    annotations=10, log_path=11, CDI_devices=17{name=1}} (cri-api ``api.proto``)."""
    out = _msg(1, _proto.string_field(1, name)) + _msg(2, _proto.string_field(1, image))
    out += b"".join(_proto.string_field(3, c) for c in command)
    for k, v in env.items():
        out += _msg(6, _proto.string_field(1, k) + _proto.string_field(2, v))
    for host, container in mounts:  # Mount{container_path=1, host_path=2, readonly=3}
        out += _msg(7, _proto.string_field(1, container) + _proto.string_field(2, host)
                    + _varint_field(3, 1))
    for host, container in devices:  # Device{container_path=1, host_path=2, permissions=3}
        out += _msg(8, _proto.string_field(1, container) + _proto.string_field(2, host)
                    + _proto.string_field(3, "rwm"))
    out += _map(10, annotations) + _proto.string_field(11, log_path)
    out += b"".join(_msg(17, _proto.string_field(1, name)) for name in cdi_devices)
    return out


def _first_string(data: bytes) -> str:
    return _proto.first_str(_proto.decode(data), 1)


class CriClient:
    """The kubelet side of CRI, for one containerd socket."""

    def __init__(self, socket: str, timeout: float = 60) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.timeout = timeout
        self.sandboxes: List[str] = []

    def call(self, method: str, request: bytes) -> bytes:
        stub = self.channel.unary_unary(_SERVICE + method, request_serializer=lambda b: b,
                                        response_deserializer=lambda b: b)
        try:
            response: bytes = stub(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise CriError(method, exc.code(), exc.details() or "") from None
        return response

    def run_pod(self, name: str, namespace: str, uid: str, log_dir: Path, cgroup_parent: str,
                handler: str, annotations: Optional[Mapping[str, str]] = None) -> Tuple[str, bytes]:
        """RunPodSandbox → (sandbox id, the PodSandboxConfig sent, for CreateContainer)."""
        log_dir.mkdir(parents=True, exist_ok=True)
        config = sandbox_config(name, namespace, uid, str(log_dir), cgroup_parent,
                                annotations or {})
        reply = self.call("RunPodSandbox", _msg(1, config) + _proto.string_field(2, handler))
        sandbox = _first_string(reply)
        self.sandboxes.append(sandbox)
        return sandbox, config

    def create_container(self, sandbox: str, pod_config: bytes, name: str, image: str,
                         command: Sequence[str], env: Optional[Mapping[str, str]] = None,
                         mounts: Sequence[Tuple[str, str]] = (),
                         annotations: Optional[Mapping[str, str]] = None,
                         devices: Sequence[Tuple[str, str]] = (),
                         cdi_devices: Sequence[str] = ()) -> str:
        """CreateContainer (containerd writes the OCI spec; no runtime runs yet) → container id.
        ``devices``: (host path, container path) of device nodes containerd puts in the spec
        (``linux.devices`` and a cgroup rule), as it does for CDI devices it injects.
        ``cdi_devices``: fully qualified CDI names, as the kubelet sends a DRA claim's or a
        device plugin's (``cdi-cri``) devices; containerd 1.7 injects them itself."""
        config = container_config(name, image, command, env or {}, mounts, f"{name}.log",
                                  annotations or {}, devices, cdi_devices)
        request = _proto.string_field(1, sandbox) + _msg(2, config) + _msg(3, pod_config)
        return _first_string(self.call("CreateContainer", request))

    def start_container(self, container: str) -> None:
        """StartContainer: the shim runs the runtime's create and start (nvshim runs here)."""
        self.call("StartContainer", _proto.string_field(1, container))

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

    def remove_pods(self) -> None:
        """StopPodSandbox + RemovePodSandbox for every pod this client started."""
        for sandbox in self.sandboxes:
            for method in ("StopPodSandbox", "RemovePodSandbox"):
                try:
                    self.call(method, _proto.string_field(1, sandbox))
                except CriError:
                    pass  # teardown: the containerd stop that follows removes what is left
        self.sandboxes = []
        self.channel.close()


def spec_annotations(state_dir: Path, container: str) -> Dict[str, str]:
    """The annotations of a container's OCI spec as containerd wrote it (bundle config.json)."""
    for path in state_dir.glob(f"io.containerd.runtime.v2.task/*/{container}/config.json"):
        spec = json.loads(path.read_text())
        return dict(spec.get("annotations") or {})
    raise AssertionError(f"no bundle for {container} under {state_dir}")
