"""NVIDIA's own k8s-device-plugin (v0.17.4, built from its Go module) on the simulated
node, registered with the real kubelet, in its ``envvar``, ``volume-mounts``,
``cdi-annotations`` and ``cdi-cri`` device-list strategies: what it allocates (the
kubelet's checkpoint says) is exactly what a pod sees under every handler.

The plugin asks NVML, the simulated node's library (``nvshim sim``'s libnvidia-ml, found
through ``LD_LIBRARY_PATH``), and puts its socket at ``/var/lib/kubelet/device-plugins/``
and its CDI spec at ``/var/run/cdi/`` whatever it is told: it runs in a private mount
namespace of its own (proved so before anything is mounted) where the cluster's
device-plugin and CDI folders are bound there. Outside a container, the driver root it
sees (``--driver-root-ctr-path``) is the node's own, and its spec's hooks are the
toolkit's ``nvidia-cdi-hook``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Iterator, List

import pytest

from tests.helpers.common import wait_until
from tests.helpers.gobuild import go_programs
from tests.k8s.conftest import Node
from tests.k8s.test_allocation import gpu_pod
from tests.k8s.test_guard import seen
from tests.k8s.test_kubelet import advertised

pytestmark = pytest.mark.e2e

LIB_DIR = "usr/lib/x86_64-linux-gnu"


class NvidiaDevicePlugin:
    """NVIDIA's device plugin in one strategy, until :meth:`stop`."""

    def __init__(self, node: Node, strategy: str) -> None:
        self.node, self.strategy = node, strategy
        self.log = node.base / f"nvidia-device-plugin-{strategy}.log"
        self.proc: "subprocess.Popen[bytes] | None" = None

    def start(self) -> "NvidiaDevicePlugin":
        binary = go_programs("nvidia-device-plugin") / "nvidia-device-plugin"
        sim, plugins = self.node.sim, self.node.cluster.device_plugins
        outside = os.readlink("/proc/self/ns/mnt")
        script = (
            f'[ "$(readlink /proc/self/ns/mnt)" != "{outside}" ] || '
            '{ echo "not in a private mount namespace: nothing started" >&2; exit 99; }\n'
            # the host's /var/lib and /run are never written: private tmpfs hold the
            # paths, and its CDI spec (/var/run/cdi, whatever it is told) lands in the
            # cluster's CDI folder, which containerd, nvshim and NVIDIA's runtime read
            "mount -t tmpfs -o size=64k nvshim-dp /var/lib\n"
            "mkdir -p /var/lib/kubelet/device-plugins\n"
            f"mount --bind {plugins} /var/lib/kubelet/device-plugins\n"
            "mount -t tmpfs -o size=64k nvshim-dp /run\n"
            f"mkdir -p /run/cdi && mount --bind {self.node.base / 'cdi'} /run/cdi\n"
            'exec "$@"\n'
        )
        # not in a container: the driver root is where the plugin itself sees it, and the
        # spec's hooks are the toolkit's nvidia-cdi-hook built beside NVIDIA's runtime
        hook = go_programs("nvidia-toolkit") / "nvidia-cdi-hook"
        argv = [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            str(binary),
            "--driver-root",
            sim.root,
            "--dev-root",
            sim.root,
            "--driver-root-ctr-path",
            sim.root,
            "--nvidia-cdi-hook-path",
            str(hook),
            "--device-list-strategy",
            self.strategy,
            "--fail-on-init-error=true",
        ]
        env = {**os.environ, "LD_LIBRARY_PATH": f"{sim.root}/{LIB_DIR}"}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=env,
                start_new_session=True,
            )
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        # the spec it wrote in the CDI strategies: the next tests read that folder too
        (self.node.base / "cdi" / "k8s.device-plugin.nvidia.com-gpu.json").unlink(missing_ok=True)


@pytest.fixture(scope="module", params=["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"])
def nvidia_plugin(request: pytest.FixtureRequest, node: Node) -> Iterator[NvidiaDevicePlugin]:
    dp = NvidiaDevicePlugin(node, request.param).start()
    try:
        wait_until(
            lambda: (
                dp.proc is not None
                and (dp.proc.poll() is not None or "Registered device plugin" in dp.log.read_text())
            ),
            60,
            "NVIDIA's device plugin to register",
        )
        assert dp.proc is not None and dp.proc.poll() is None, dp.log.read_text()[-3000:]
        advertised(node, len(node.sim.gpus))
        yield dp
    finally:
        dp.stop()


def allocated(node: Node, pod: str) -> List[str]:
    """The device ids the kubelet's checkpoint records for ``pod``'s container."""
    uid = node.cluster.kubectl("get", "pod", pod, "-o", "jsonpath={.metadata.uid}").stdout
    doc = json.loads(Path(node.cluster.checkpoint).read_text())
    ids: List[str] = []
    for entry in doc["Data"]["PodDeviceEntries"]:
        if entry["PodUID"] == uid and entry["ResourceName"] == "nvidia.com/gpu":
            for per_numa in entry["DeviceIDs"].values():
                ids += per_numa
    return sorted(ids)


@pytest.mark.parametrize("handler", ["nvshim", "runc", "nvidia"])
def test_a_pod_sees_what_nvidias_plugin_allocated(
    node: Node, nvidia_plugin: NvidiaDevicePlugin, handler: str
) -> None:
    """NVIDIA's device plugin, asking the simulated node's NVML, advertises its GPUs to the real kubelet; a pod limited to one nvidia.com/gpu (then two) sees the device nodes of exactly the GPUs the kubelet's checkpoint records for it: under RuntimeClass nvshim (verify-with: kubelet), plain runc with the agent injecting, and NVIDIA's default runtime beside the guard."""
    by_uuid = {g.uuid: g.minor for g in node.sim.gpus}
    for count in (1, 2):
        name = f"nvdp-{nvidia_plugin.strategy}-{handler}-{count}"
        node.cluster.apply(gpu_pod(name, count, None if handler == "nvidia" else handler))
        minors, vis = seen(node, name)
        ids = allocated(node, name)
        assert len(ids) == count and set(ids) <= set(by_uuid), ids
        assert minors == sorted(by_uuid[u] for u in ids), (minors, ids)
        assert vis == "void"
        node.cluster.kubectl("delete", "pod", name, "--wait=true", "--timeout=60s")
