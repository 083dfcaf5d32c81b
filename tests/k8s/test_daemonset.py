"""deploy/'s DaemonSet on the real cluster: installed (nvshim as containerd's default
runtime), rolled to a new image while a Deployment of 20 GPU pods scales up and containerd
restarts, then deleted (uninstall).

The cluster's node here is a node of its own (``Cluster(own_node=True)``): a PID namespace
whose PID 1 is the node's init, so that the installer's ``nsenter -t 1`` enters the node;
containerd 2.4 started again whenever it exits (the installer's ``signal`` restart mode, as
systemd's ``Restart=always`` would); ``/opt``, ``/usr/local``, ``/etc`` and ``/run/nvshim``
overlaid, so that what the installer writes lands under the test's directory. Its
containerd config starts with runc alone; nvshim's handler is the installer's.

The manifests are deploy/'s, with what an operator of this node changes: the ConfigMap's
``driver-root`` (the simulated node) and ``kubelet-socket`` (this kubelet's
``--root-dir``), the installer's ``NVSHIM_RESTART_MODE=signal`` (no systemd) and the
paths of this node's containerd, and ``hostNetwork`` (the node runs no CNI plugin). The
installer image is deploy/Containerfile's (tests/helpers/installer_image.py), imported
under its tag and again as the upgrade's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
import yaml

from nvshim.agent import AGENT_SOCKET
from tests.helpers.common import pids_with_arg, require_root, wait_until
from tests.k8s.conftest import BUSYBOX, CUDA_LIKE
from tests.k8s.test_guard import GPU_NODE, LIST, pod

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
NS = "nvshim-system"
UPGRADE = "localhost/nvshim-installer:0.1.1-upgrade"
REPLICAS = 5  # each of the 4 GPUs advertised 5 times: 20 pods of one GPU each


class DsNode:
    def __init__(self, cluster: Any, sim: Any, base: Path, image: str, config: Path) -> None:
        self.cluster, self.sim, self.base, self.image = cluster, sim, base, image
        self.config = config
        self.config_before = config.read_bytes()


def docs(path: Path) -> List[Dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def configmap(node_root: str, pod_resources: str) -> str:
    (cm,) = docs(DEPLOY / "configmap.yaml")
    text, n = re.subn(
        r"(?m)^driver-root: /$", f"driver-root: {node_root}", cm["data"]["config.yaml"]
    )
    assert n == 1, "configmap.yaml no longer sets driver-root: / (update this test)"
    cm["data"]["config.yaml"] = text + f"kubelet-socket: {pod_resources}\n"
    return json.dumps(cm)


def daemonset(env: Dict[str, str]) -> str:
    (ds,) = docs(DEPLOY / "daemonset.yaml")
    spec = ds["spec"]["template"]["spec"]
    spec["hostNetwork"] = True
    for container in spec["containers"]:
        have = container.setdefault("env", [])
        names = {e["name"] for e in have}
        for e in have:
            if e["name"] in env:
                e["value"] = env[e["name"]]
        have += [{"name": k, "value": v} for k, v in env.items() if k not in names]
    return json.dumps(ds)


def gpu_deployment(replicas: int) -> str:
    labels = {"app": "gpu-burst"}
    return json.dumps(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "gpu-burst"},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "runtimeClassName": "nvshim",
                        "hostNetwork": True,
                        "automountServiceAccountToken": False,
                        "terminationGracePeriodSeconds": 1,
                        "containers": [
                            {
                                "name": "main",
                                "image": BUSYBOX,
                                "imagePullPolicy": "Never",
                                "command": ["sh", "-c", LIST],
                                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                            }
                        ],
                    },
                },
            },
        }
    )


@pytest.fixture(scope="module")
def ds_node(tmp_path_factory: pytest.TempPathFactory, base_rootfs: Path) -> Iterator[DsNode]:
    require_root()
    from nvshim.sim.build import create_node
    from tests.helpers.cri import cri_containerd_config, image_archive
    from tests.helpers.gobuild import go_programs
    from tests.helpers.installer_image import BuildError, installer_image_archive
    from tests.helpers.k8s import Cluster

    base = tmp_path_factory.mktemp("k8s-ds")
    (ds,) = docs(DEPLOY / "daemonset.yaml")
    image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
    try:
        build = installer_image_archive(image)
    except BuildError as exc:
        pytest.fail(str(exc))
    runc = str(go_programs("runc") / "runc")
    sim = create_node(str(base / "sim"), gpus=4)
    cd = base / "containerd"
    cd.mkdir()
    text = cri_containerd_config(cd, version=3)
    root_line = f'        Root = "{cd}/runc-root"\n'
    config = cd / "config.toml"
    config.write_text(text.replace(root_line, root_line + f'        BinaryName = "{runc}"\n'))
    cluster = Cluster(
        base,
        go_programs("kubernetes"),
        go_programs("etcd"),
        go_programs("containerd"),
        "",
        own_node=True,
    )
    cluster.containerd_config = config.read_text()
    try:
        cluster.start()
        archive = base / "busybox.tar"
        archive.write_bytes(image_archive(base_rootfs, BUSYBOX, []))
        cuda = base / "cuda-like.tar"
        cuda.write_bytes(image_archive(base_rootfs, CUDA_LIKE, ["NVIDIA_VISIBLE_DEVICES=all"]))
        for path in (archive, cuda, build.archive):
            res = cluster.ctr("images", "import", str(path))
            assert res.returncode == 0, res.stderr
        res = cluster.ctr("images", "tag", image, UPGRADE)
        assert res.returncode == 0, res.stderr
        cluster.kubectl(
            "label", "node", "--all", "nvidia.com/gpu.present=true", "nvshim.io/install=true"
        )
        yield DsNode(cluster, sim, base, image, config)
    finally:
        cluster.stop()


def _installer_ready(node: DsNode, image: str) -> bool:
    res = node.cluster.kubectl("-n", NS, "get", "pods", "-o", "json", check=False, timeout=30)
    if res.returncode != 0:
        return False
    pods = json.loads(res.stdout)["items"]
    return (
        len(pods) == 1
        and all(c["image"] == image for c in pods[0]["spec"]["containers"])
        and all(c.get("ready") for c in pods[0].get("status", {}).get("containerStatuses", [{}]))
    )


def agents(node: DsNode) -> List[int]:
    """Processes running ``nvshim agent`` inside this node."""
    inside = (node.base / "node.mntns").read_text().strip()
    found = []
    for pid in pids_with_arg(AGENT_SOCKET):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"agent" in argv and os.readlink(f"/proc/{pid}/ns/mnt") == inside:
                found.append(pid)
        except OSError:
            continue  # gone meanwhile
    return found


# What the kubelet says while containerd itself is down (the test restarts it): the
# engine's window, not nvshim's; anything else failing a create is.
ENGINE_DOWN = re.compile(
    r"code = Unavailable|error reading from server: EOF|connection refused"
    r"|transport is closing|containerd\.sock: connect"
)


def handler_configured(node: DsNode) -> bool:
    """containerd's config on the node imports install.sh's drop-in and the drop-in runs
    nvshim-runtime (the handler the next containerd start loads)."""
    drop_in = node.config.parent / "conf.d" / "99-nvshim.toml"
    try:
        return str(drop_in) in node.config.read_text() and b"nvshim-runtime" in drop_in.read_bytes()
    except FileNotFoundError:
        return False


def failures(node: DsNode) -> "tuple[List[str], List[str]]":
    """Events that say a pod or container could not be created or started: (those while
    containerd was down, the others)."""
    res = node.cluster.kubectl("get", "events", "-A", "-o", "json")
    bad = (
        "Failed",
        "FailedCreatePodSandBox",
        "FailedCreatePodContainer",
        "UnexpectedAdmissionError",
        "CreateContainerError",
        "BackOff",
        "FailedKillPod",
    )
    found = [
        f"{e['involvedObject'].get('name')}: {e.get('reason')}: {e.get('message')}"
        for e in json.loads(res.stdout)["items"]
        if e.get("reason") in bad
    ]
    down = [f for f in found if ENGINE_DOWN.search(f)]
    return down, [f for f in found if f not in down]


def test_install_roll_and_uninstall_with_gpu_pods(ds_node: DsNode) -> None:
    """deploy/'s DaemonSet installs nvshim on the node as containerd's default runtime (containerd restarted with the nvshim handler, the agent running); a Deployment of GPU pods (runtimeClassName: nvshim, one nvidia.com/gpu each, 4 GPUs advertised 5 times) scales from 10 to 20 while the DaemonSet rolls to a new image and containerd is restarted mid-way: every pod runs and sees exactly one GPU, and no create fails. Pods that ask for no GPU under the default runtime get none (a CUDA image, the variable set again in the spec, a hostPath device-list mount). Deleting the DaemonSet uninstalls: containerd's config is back byte for byte, no agent runs, and a pod still starts."""
    from tests.helpers.deviceplugin import DevicePlugin

    node, cluster = ds_node, ds_node.cluster
    env = {
        "NVSHIM_SET_AS_DEFAULT": "true",
        "NVSHIM_RESTART_MODE": "signal",
        "NVSHIM_CONTAINERD_CONFIG": str(node.config),
        "NVSHIM_CONTAINERD_SOCKET": cluster.containerd_socket,
        "NVSHIM_RESTART_TIMEOUT": "120",
    }
    for path in ("namespace.yaml", "runtimeclass.yaml"):
        cluster.kubectl("apply", "-f", str(DEPLOY / path))
    cluster.apply(configmap(node.sim.root, cluster.pod_resources))
    starts = cluster.containerd_starts()
    cluster.apply(daemonset(env))
    wait_until(lambda: _installer_ready(node, node.image), 300, "the installer pod to be Ready")
    assert cluster.containerd_starts() > starts, "the install did not restart containerd"
    assert handler_configured(node)
    wait_until(lambda: bool(agents(node)), 60, "the DaemonSet's agent")

    dp = DevicePlugin(
        cluster.device_plugins, [g.uuid for g in node.sim.gpus], "volume-mounts", replicas=REPLICAS
    ).start()
    try:
        cluster.apply(gpu_deployment(10))
        cluster.kubectl("rollout", "status", "deployment/gpu-burst", "--timeout=300s", timeout=320)
        # the upgrade, the scale-up and a containerd restart, all at once; meanwhile
        # containerd's config is read every 0.1 s: the handler must never be gone
        before_roll = cluster.containerd_starts()
        without: List[float] = []
        watching = threading.Event()

        def watch_handler() -> None:
            start = time.monotonic()
            while not watching.wait(0.1):
                if not handler_configured(node):
                    without.append(round(time.monotonic() - start, 1))

        watcher = threading.Thread(target=watch_handler, daemon=True)
        watcher.start()
        cluster.kubectl(
            "-n",
            NS,
            "set",
            "image",
            "daemonset/nvshim-installer",
            f"installer={UPGRADE}",
            f"agent={UPGRADE}",
        )
        cluster.apply(gpu_deployment(20))
        wait_until(
            lambda: (
                cluster.kubectl("-n", NS, "get", "pods", "-o", "json", check=False).stdout.count(
                    UPGRADE
                )
                > 0
            ),
            120,
            "the rollout to start",
        )
        for pid in containerd_pids(node):
            os.kill(pid, signal.SIGTERM)
        cluster.kubectl(
            "-n",
            NS,
            "rollout",
            "status",
            "daemonset/nvshim-installer",
            "--timeout=600s",
            timeout=620,
        )
        wait_until(lambda: _installer_ready(node, UPGRADE), 300, "the upgraded installer")
        watching.set()
        watcher.join(10)
        assert without == [], (
            f"containerd's config had no nvshim handler in {len(without)} "
            f"samples, {without[0]} s to {without[-1]} s into the rollout"
        )
        # the test's own restart only: the new pod's install did not change containerd's
        # config (same handler), the old pod did not uninstall
        assert cluster.containerd_starts() == before_roll + 1
        cluster.kubectl("rollout", "status", "deployment/gpu-burst", "--timeout=600s", timeout=620)
        pods = json.loads(
            cluster.kubectl("get", "pods", "-l", "app=gpu-burst", "-o", "json").stdout
        )["items"]
        assert len(pods) == 20
        by_minor = {g.minor for g in node.sim.gpus}
        for item in pods:
            name = item["metadata"]["name"]
            out = cluster.wait_log(name, "END")
            minors = [int(m.group(1)) for m in (GPU_NODE.match(x) for x in out.split()) if m]
            assert len(minors) == 1 and minors[0] in by_minor, (name, out)
            restarts = [c.get("restartCount", 0) for c in item["status"]["containerStatuses"]]
            assert restarts == [0], (name, restarts)
        engine_down, others = failures(node)
        print(
            f"creates refused while containerd restarted: {len(engine_down)}",
            *engine_down,
            sep="\n  ",
        )
        assert others == []
        assert len(agents(node)) == 1

        # nvshim-runtime is containerd's default now (NVSHIM_SET_AS_DEFAULT): pods that ask
        # for no GPU get none, whatever their image, their spec or a hostPath mount says
        unallocated: Dict[str, Dict[str, Any]] = {
            "default-cuda-image": {},
            "default-env-again": {"env": {"NVIDIA_VISIBLE_DEVICES": "all"}},
            "default-device-list-mount": {
                "image": BUSYBOX,
                "hostpath_mount": "/var/run/nvidia-container-devices/all",
            },
        }
        for name, kw in unallocated.items():
            cluster.apply(pod(name, **kw))
        for name in unallocated:
            out = cluster.wait_log(name, "END")
            assert not [x for x in out.split() if GPU_NODE.match(x)], (name, out)
            assert "nvidiactl" not in out.split(), (name, out)

        # uninstall
        cluster.kubectl(
            "delete", "deployment", "gpu-burst", "--wait=true", "--timeout=120s", timeout=140
        )
        cluster.kubectl(
            "-n",
            NS,
            "delete",
            "daemonset",
            "nvshim-installer",
            "--wait=true",
            "--timeout=300s",
            timeout=320,
        )
        wait_until(
            lambda: (
                not json.loads(cluster.kubectl("-n", NS, "get", "pods", "-o", "json").stdout)[
                    "items"
                ]
            ),
            300,
            "the installer pod to go",
        )
        assert node.config.read_bytes() == node.config_before
        assert not (node.config.parent / "conf.d" / "99-nvshim.toml").exists()
        # pods created through nvshim-runtime (the default runtime, the installer's own
        # pod too) outlived it: a forwarder stands in its place, and they can be stopped
        forwarder = node.base / "node" / "usr-local" / "upper" / "bin" / "nvshim-runtime"
        assert forwarder.read_text().splitlines()[1] == "# nvshim-runtime-forwarder"
        cluster.kubectl("delete", "pod", *unallocated, "--wait=true", "--timeout=120s", timeout=140)
        wait_until(
            lambda: (
                not json.loads(cluster.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]
            ),
            120,
            "every pod to go",
        )
        wait_until(lambda: not agents(node), 60, "the agent to stop")
        cluster.apply(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "after-uninstall"},
                    "spec": {
                        "hostNetwork": True,
                        "restartPolicy": "Never",
                        "automountServiceAccountToken": False,
                        "containers": [
                            {
                                "name": "main",
                                "image": BUSYBOX,
                                "imagePullPolicy": "Never",
                                "command": ["sh", "-c", LIST],
                            }
                        ],
                    },
                }
            )
        )
        assert "END" in cluster.wait_log("after-uninstall", "END")
    finally:
        dp.stop()


def containerd_pids(node: DsNode) -> List[int]:
    """The node's containerd (its command line names the node's config)."""
    found = []
    for pid in pids_with_arg(str(node.config)):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "containerd":
                found.append(pid)
        except OSError:
            continue  # gone meanwhile
    return found
