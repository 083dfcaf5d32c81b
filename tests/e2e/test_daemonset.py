"""e2e: the DaemonSet of deploy/ has run, on a node in a box, as the kubelet runs it.

The installer image is built from ``deploy/Containerfile`` without a registry (a Debian 12
base made by mmdebstrap, ``podman import``, ``podman build``; cached, see
tests/helpers/installer_image.py) and imported into the node's containerd. The node
(tests/helpers/k8snode.py) has its own PID, mount, network and UTS namespaces, an init as
PID 1 that supervises containerd 1.6 with its CRI plugin, the paths a GPU node has (bound
over temp dirs inside its mount namespace only) and a simulated driver at
``/run/nvidia/driver``. The DaemonSet's pod template and the ConfigMap are read from
deploy/ and translated to CRI calls (tests/helpers/podspec.py) the way the kubelet makes
them: hostPID, volumes, env, securityContext, init containers then containers.

What the operator changes, and this test with them: the ConfigMap's ``driver-root`` (the
documented setting for a driver that is not at ``/``) and ``NVSHIM_RESTART_MODE=signal``
(the box has no systemd; its PID 1 brings containerd back, as systemd's Restart= does).

Then, through the same node's CRI, the examples of deploy/examples/ run with
``runtimeClassName: nvshim`` (from a local CUDA-like image: busybox with
``NVIDIA_VISIBLE_DEVICES=all``): the one with a device-plugin allocation (a /dev/null mount
at /var/run/nvidia-container-devices/<uuid>, and the same GPU in the kubelet's PodResources
answer) sees exactly its GPU; the one without sees none. Last, the DaemonSet's pod is
stopped (SIGTERM with its grace period): containerd's config is byte for byte what it was,
nvshim's files are gone, and the restarted containerd no longer knows the handler.
The tests of this module run in order on one node; the last one starts a second node whose
``/usr`` is read-only, for the DaemonSet with ``NVSHIM_BINDIR=/opt/bin`` set once.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
import yaml

from tests.helpers.common import require_binary, require_root
from tests.helpers.cri import CriError, CriMount, SandboxSpec, image_archive
from tests.helpers.installer_image import BuildError, installer_image_archive
from tests.helpers.k8snode import DRIVER_ROOT, K8sNode
from tests.helpers.podresources import PodResourcesServer
from tests.helpers.podspec import Kubelet, RunningPod, configmap, pod_template, with_env

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CUDA_LIKE = "localhost/nvshim-test/cuda-like:1"
PAUSE = "registry.k8s.io/pause:3.9"  # the node config's sandbox_image
GPU = "nvidia.com/gpu"
DEVICES = "/var/run/nvidia-container-devices"
LISTING = 'ls /dev/nvidia[0-9]* 2>/dev/null || echo "no GPU devices"; echo "NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"'
NVSHIM_PATHS = ("/opt", "/usr/local/bin", "/etc/nvshim", "/etc/cdi", "/var/lib/nvshim")
"""The node's own directories nvshim's installer may write besides containerd's config; any
other write to the node's /etc and /var lands in their overlays' upper dirs, compared too."""


def files_under(root: Path) -> Dict[str, bytes]:
    """Every file and symlink under ``root``: relative path → bytes (link: its target)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = b"-> " + os.readlink(path).encode()
        elif path.is_file():
            out[rel] = path.read_bytes()
    return out


def node_files(node: K8sNode) -> Dict[str, Dict[str, bytes]]:
    """What the node has written where nvshim could write: containerd's config dir, the
    directories of :data:`NVSHIM_PATHS`, and the /etc and /var overlays' upper dirs."""
    out = {p: files_under(node.path(p)) for p in ("/etc/containerd", *NVSHIM_PATHS)}
    out.update({f"{p} (overlay)": files_under(node.upper(p)) for p in ("/etc", "/var")})
    return out


class Cluster:
    """The node, its kubelet stand-ins and what was there before the DaemonSet ran."""

    def __init__(
        self,
        node: K8sNode,
        kubelet: Kubelet,
        podresources: PodResourcesServer,
        template: Dict[str, Any],
    ) -> None:
        self.node = node
        self.kubelet = kubelet
        self.podresources = podresources
        self.template = template
        self.before = node_files(node)
        self.installer: RunningPod | None = None


def node_configmap() -> Dict[str, Dict[str, str]]:
    """The ConfigMap of deploy/, with driver-root where this node's driver is."""
    name, data = configmap(DEPLOY / "configmap.yaml")
    text, n = re.subn(r"(?m)^driver-root: /$", f"driver-root: {DRIVER_ROOT}", data["config.yaml"])
    assert n == 1, "configmap.yaml no longer sets driver-root: / (update this test)"
    return {name: {**data, "config.yaml": text}}


@contextlib.contextmanager
def running_cluster(
    base: Path, base_rootfs: Path, env: Dict[str, str], read_only_usr: bool = False
) -> Iterator[Cluster]:
    """A node (``read_only_usr``: its /usr read-only) with the images imported, the
    PodResources server and the kubelet, and the DaemonSet's pod template with ``env`` set in
    every container (as an operator edits daemonset.yaml); all stopped afterwards."""
    require_root()
    for tool in ("containerd", "ctr", "runc", "podman", "mmdebstrap", "unshare", "nsenter"):
        require_binary(tool)
    template = with_env(pod_template(DEPLOY / "daemonset.yaml"), env)
    spec = template["spec"]
    images = {c["image"] for c in [*spec.get("initContainers", []), *spec["containers"]]}
    assert len(images) == 1, f"the DaemonSet runs one image, not {sorted(images)}"
    try:
        build = installer_image_archive(images.pop())
    except BuildError as exc:
        pytest.fail(str(exc))
    node = K8sNode(base / "n", read_only_usr=read_only_usr)
    podresources = None
    kubelet = None
    try:
        node.start()
        node.import_image(build.archive)
        for name, image_env in (
            (PAUSE, []),
            (
                CUDA_LIKE,
                ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"],
            ),
        ):
            archive = base / (name.replace("/", "_") + ".tar")
            archive.write_bytes(image_archive(base_rootfs, name, image_env))
            node.import_image(archive)
        sock = node.path("/var/lib/kubelet/pod-resources/kubelet.sock")
        sock.parent.mkdir(parents=True)
        podresources = PodResourcesServer(str(sock)).start()
        classes = yaml.safe_load((DEPLOY / "runtimeclass.yaml").read_text())
        kubelet = Kubelet(node, node_configmap(), {classes["metadata"]["name"]: classes["handler"]})
        yield Cluster(node, kubelet, podresources, template)
    finally:
        if kubelet is not None:
            kubelet.close()
        node.stop()
        if podresources is not None:
            podresources.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, base_rootfs: Path) -> Iterator[Cluster]:
    with running_cluster(
        tmp_path_factory.mktemp("ds"), base_rootfs, {"NVSHIM_RESTART_MODE": "signal"}
    ) as running:
        yield running


def run_example(cluster: Cluster, example: str, name: str, gpus: List[Any]) -> str:
    """Run deploy/examples/<example> (image: the CUDA-like one; command: list the GPU
    nodes) with ``gpus`` allocated by the device plugin; what its container printed."""
    pod = yaml.safe_load((DEPLOY / "examples" / example).read_text())
    (c,) = pod["spec"]["containers"]
    c.update(image=CUDA_LIKE, command=["/bin/sh", "-c"], args=[LISTING])
    uuids = [g.uuid for g in gpus]
    cluster.podresources.set([("default", name, {c["name"]: {GPU: uuids} if uuids else {}})])
    mounts = [CriMount(f"{DEVICES}/{u}", "/dev/null", readonly=True) for u in uuids]
    running = cluster.kubelet.run_pod(pod, name, allocations={c["name"]: mounts})
    rc = cluster.kubelet.wait_exit(running, c["name"])
    out = running.log(c["name"])
    assert rc == 0, out
    # its sandbox too: a pod still running through nvshim-runtime at uninstall keeps a
    # forwarder in its place (tests/k8s/test_daemonset.py), which these tests do not want
    cluster.kubelet.stop_pod(running)
    return out


def test_installer_pod_runs_to_ready(cluster: Cluster) -> None:
    """The DaemonSet's pod template, run through the node's CRI as the kubelet runs it,
    gets to Ready and leaves containerd restarted with the runtime handler nvshim."""
    starts = len(cluster.node.containerd_starts())
    cluster.installer = cluster.kubelet.run_pod(
        cluster.template, "nvshim-installer-x7k2p", namespace="nvshim-system"
    )
    assert len(cluster.node.containerd_starts()) > starts, "containerd was not restarted"
    cluster.node.wait_containerd()
    config = cluster.node.run(["containerd", "config", "dump"])
    assert config.rc == 0, config.describe()
    assert "runtimes.nvshim]" in config.stdout
    assert os.access(cluster.node.path("/usr/local/bin/nvshim-runtime"), os.X_OK)


def test_allocated_pod_sees_exactly_its_gpu(cluster: Cluster) -> None:
    """A runtimeClassName: nvshim pod with one GPU allocated by the device plugin
    (volume-mounts) and confirmed by the kubelet sees that GPU's device node and no other."""
    gpu = cluster.node.sim.gpus[2]
    out = run_example(cluster, "pod-gpu.yaml", "gpu-pod", [gpu])
    assert re.findall(r"/dev/nvidia(\d+)", out) == [str(gpu.minor)], out


def test_unallocated_cuda_pod_sees_no_gpu(cluster: Cluster) -> None:
    """A runtimeClassName: nvshim pod from a CUDA-like image (NVIDIA_VISIBLE_DEVICES=all)
    with no allocation sees no GPU, its NVIDIA_VISIBLE_DEVICES made void."""
    out = run_example(cluster, "pod-no-gpu.yaml", "no-gpu-pod", [])
    assert out.splitlines() == ["no GPU devices", "NVIDIA_VISIBLE_DEVICES=void"], out


def test_sigterm_reverts_the_node(cluster: Cluster) -> None:
    """Stopping the DaemonSet's pod (SIGTERM, its grace period) leaves containerd's config
    byte-identical to before, none of nvshim's files, and a containerd without the handler."""
    if cluster.installer is None:
        cluster.installer = cluster.kubelet.run_pod(
            cluster.template, "nvshim-installer-x7k2p", namespace="nvshim-system"
        )
    started = time.monotonic()
    codes = cluster.kubelet.stop_pod(cluster.installer)
    stopped_in = time.monotonic() - started
    grace = int(cluster.template["spec"].get("terminationGracePeriodSeconds", 30))
    assert stopped_in < grace, f"the installer ignored SIGTERM (killed after {stopped_in:.1f}s)"
    assert 137 not in codes.values(), codes  # 128 + SIGKILL
    cluster.node.wait_containerd()
    after = node_files(cluster.node)
    assert after["/etc/containerd"] == cluster.before["/etc/containerd"]
    for p in after:
        assert after[p] == cluster.before[p], (
            f"left in {p}: {sorted(set(after[p]) - set(cluster.before[p]))}"
        )
    probe = SandboxSpec(
        "after",
        "default",
        "uid-after",
        "/var/log/pods/after",
        cluster.node.cgroup_parent + "/after",
    )
    with pytest.raises(CriError) as info:
        cluster.kubelet.cri.run_sandbox(probe, "nvshim")
    assert "nvshim" in info.value.details


def test_read_only_usr_node_with_the_bin_dir_set_once(
    tmp_path_factory: pytest.TempPathFactory, base_rootfs: Path
) -> None:
    """On a node whose /usr is read-only, the DaemonSet with NVSHIM_BINDIR=/opt/bin in the
    installer's env only (deploy/README.md's read-only /usr section; the agent container
    reads the installer's /run/nvshim/node-paths) gets Ready, the agent serves, containerd's handler
    runs /opt/bin/nvshim-runtime, an allocated pod sees exactly its GPU, and stopping the
    pod leaves the node's files as they were."""
    env = {"NVSHIM_RESTART_MODE": "signal", "NVSHIM_BINDIR": "/opt/bin"}
    with running_cluster(
        tmp_path_factory.mktemp("ds-ro"), base_rootfs, env, read_only_usr=True
    ) as ro:
        probe = ro.node.run(["touch", "/usr/local/bin/probe"])
        assert probe.rc != 0 and "Read-only file system" in probe.stderr, probe.describe()
        for c in ro.template["spec"]["containers"]:  # the setting in the installer's env only
            if c["name"] != "installer":
                c["env"] = [e for e in c.get("env", []) if e["name"] != "NVSHIM_BINDIR"]
        ro.installer = ro.kubelet.run_pod(
            ro.template, "nvshim-installer-r0usr", namespace="nvshim-system"
        )
        ro.node.wait_containerd()
        dump = ro.node.run(["containerd", "config", "dump"])
        assert 'BinaryName = "/opt/bin/nvshim-runtime"' in dump.stdout, dump.describe()
        gpu = ro.node.sim.gpus[1]
        out = run_example(ro, "pod-gpu.yaml", "gpu-pod-ro", [gpu])
        assert re.findall(r"/dev/nvidia(\d+)", out) == [str(gpu.minor)], out
        codes = ro.kubelet.stop_pod(ro.installer)
        assert 137 not in codes.values(), codes
        ro.node.wait_containerd()
        after = node_files(ro.node)
        for p in after:
            assert after[p] == ro.before[p], (
                f"left in {p}: {sorted(set(after[p]) ^ set(ro.before[p]))}"
            )
