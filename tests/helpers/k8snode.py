"""A Kubernetes GPU node in a box: its own PID, mount, network and UTS namespaces, an init
as PID 1 that supervises containerd 1.6 (CRI plugin on), a simulated driver, runc.

:class:`K8sNode` starts ``unshare --pid --mount --net --uts --fork --mount-proc`` with
:mod:`tests.helpers.nodeinit` as PID 1. Inside, the node has the paths a GPU node has, each
a directory of the test's (under ``base``) bound over the real path in the node's mount
namespace only, so nothing touches the host's: ``/etc/containerd`` (:data:`NODE_CONFIG`, the
config a node's containerd starts with), ``/etc/nvshim``, ``/etc/cdi``, ``/etc/cni``
(a bridge network for pods without ``hostNetwork``), ``/opt``, ``/usr/local/bin`` (empty:
no nvshim), ``/run`` (``/var/run`` is its link), ``/var/lib/{containerd,kubelet,nvshim,cni}``
and ``/var/log/pods``; ``/etc`` and ``/var`` themselves are overlays whose writes land under
``base`` too. With ``read_only_usr`` the node's ``/usr`` (and its ``/usr/local/bin``) is then
bound read-only, as Container-Optimized OS, Flatcar and Talos mount it. The simulated driver (:func:`nvshim.sim.build.create_node`) sits at
``/run/nvidia/driver``, where a containerised driver (GPU operator) puts it. ``/usr``, the
binaries (containerd, runc, nsenter, CNI plugins) and ``/tmp`` are the host's.

containerd runs with its default paths (``/etc/containerd/config.toml``,
``/run/containerd/containerd.sock``, ``/var/lib/containerd``), which the test reaches through
:meth:`K8sNode.path` (the backing directory of a node path) and :meth:`K8sNode.run`
(``nsenter`` into the node's namespaces). :meth:`K8sNode.containerd_starts` counts the
daemon's starts (restarts show there). :meth:`K8sNode.stop` ends PID 1: the kernel ends
everything left in the node and its mounts go with it; pod cgroups under
:attr:`K8sNode.cgroup_parent` are removed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List, Optional, Sequence

from tests.helpers.common import (
    RunResult,
    execute,
    remove_cgroup_tree,
    require_binary,
    unique_id,
    wait_until,
)

__all__ = ["K8sNode", "NODE_CONFIG", "DRIVER_ROOT", "CNI_CONFIG"]

DRIVER_ROOT = "/run/nvidia/driver"

NODE_CONFIG = """\
version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.9"
    # this VM's root lacks CAP_SYS_RESOURCE: the pause container's oom_score_adj -998 fails
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
"""
"""/etc/containerd/config.toml as the node starts (a kubeadm-style config, cgroupfs: no
systemd in the box)."""

CNI_CONFIG = {
    "cniVersion": "0.4.0",
    "name": "pods",
    "plugins": [
        {
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": True,
            "ipMasq": False,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": "10.88.0.0/24"}]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        }
    ],
}
"""The pod network (inside the node's network namespace only)."""

_OVERLAID = ("/etc", "/var")
_BOUND = (
    "/run",
    "/opt",
    "/usr/local/bin",
    "/etc/containerd",
    "/etc/nvshim",
    "/etc/cdi",
    "/etc/cni",
    "/var/lib/containerd",
    "/var/lib/kubelet",
    "/var/lib/nvshim",
    "/var/lib/cni",
    "/var/log/pods",
)


class K8sNode:
    """The node under ``base`` (call :meth:`start`, then :meth:`stop`)."""

    def __init__(self, base: Path, gpus: int = 4, read_only_usr: bool = False) -> None:
        self.base = Path(base)
        self.gpus = gpus
        self.read_only_usr = read_only_usr
        """``/usr`` (its ``/usr/local/bin`` too) read-only, as on COS, Flatcar or Talos."""
        self.cgroup_parent = "/" + unique_id("nvshim-node")
        """Where the test's kubelet puts pod cgroups (removed by :meth:`stop`)."""
        self.sim: Any = None
        self.pid: Optional[int] = None
        """PID 1 of the node, as the host sees it."""
        self._proc: Optional["subprocess.Popen[bytes]"] = None

    # ------------------------------------------------------------------ paths

    def path(self, node_path: str) -> Path:
        """The test's directory behind ``node_path`` (which must lie in a bound path)."""
        best = max(
            (p for p in _BOUND if node_path == p or node_path.startswith(p + "/")),
            key=len,
            default=None,
        )
        if best is None:
            raise ValueError(f"{node_path} is not in one of the node's own directories")
        return self.base / "fs" / best.strip("/") / os.path.relpath(node_path, best)

    def upper(self, node_path: str) -> Path:
        """Where the node's writes to ``node_path`` (``/etc`` or ``/var``, an overlay over the
        host's) land: its overlay's upper directory."""
        if node_path not in _OVERLAID:
            raise ValueError(f"{node_path} is not one of the node's overlays {_OVERLAID}")
        return self.base / "overlay" / node_path.strip("/")

    @property
    def socket(self) -> str:
        """containerd's CRI socket as the test reaches it."""
        return str(self.path("/run/containerd/containerd.sock"))

    @property
    def log_path(self) -> Path:
        return self.base / "containerd.log"

    # ------------------------------------------------------------------ life

    def start(self, timeout: float = 60) -> "K8sNode":
        require_binary("containerd")
        require_binary("runc")
        require_binary("unshare")
        require_binary("nsenter")
        from nvshim.sim.build import create_node

        binds = []
        for p in _BOUND:
            src = self.path(p)
            src.mkdir(parents=True, exist_ok=True)
            binds.append([str(src), p])
        overlays = []
        for p in _OVERLAID:
            upper, work = self.upper(p), self.base / "work" / p.strip("/")
            upper.mkdir(parents=True)
            work.mkdir(parents=True)
            overlays.append([p, str(upper), str(work)])
        self.path("/etc/containerd/config.toml").write_text(NODE_CONFIG)
        net = self.path("/etc/cni/net.d")
        net.mkdir(parents=True)
        (net / "10-pods.conflist").write_text(json.dumps(CNI_CONFIG, indent=2) + "\n")
        self.path(DRIVER_ROOT).parent.mkdir(parents=True)
        self.sim = create_node(str(self.path(DRIVER_ROOT)), gpus=self.gpus, shuffle_minors=True)
        spec = self.base / "node.json"
        spec.write_text(
            json.dumps(
                {
                    "hostname": "gpu-node-1",
                    "overlays": overlays,
                    "binds": binds,
                    "read_only": ["/usr", "/usr/local/bin"] if self.read_only_usr else [],
                    "caller_mnt_ns": os.readlink("/proc/self/ns/mnt"),
                    "containerd": [shutil.which("containerd")],
                    "log": str(self.log_path),
                    "status": str(self.base / "containerd.status"),
                }
            )
        )
        init = Path(__file__).with_name("nodeinit.py")
        self._proc = subprocess.Popen(
            [
                "unshare",
                "--pid",
                "--mount",
                "--net",
                "--uts",
                "--fork",
                "--propagation",
                "private",
                "--mount-proc",
                sys.executable,
                "-I",
                str(init),
                str(spec),
            ],
            stdin=subprocess.DEVNULL,
            stdout=open(self.base / "init.log", "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(self._find_init, 10, "the node's PID 1")
        wait_until(self._up, timeout, "the node's containerd to answer", interval=0.2)
        return self

    def _find_init(self) -> bool:
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise AssertionError(
                "the node exited at once: " + (self.base / "init.log").read_text(errors="replace")
            )
        try:
            children = Path(f"/proc/{self._proc.pid}/task/{self._proc.pid}/children")
            pids = children.read_text().split()
        except OSError:
            return False
        self.pid = int(pids[0]) if pids else None
        return self.pid is not None

    def _up(self) -> bool:
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise AssertionError(
                "the node exited: " + (self.base / "init.log").read_text(errors="replace")
            )
        return self.ctr("version", timeout=10).rc == 0

    def containerd_starts(self) -> List[int]:
        """The PIDs (node's view) of every containerd the init has started, in order."""
        status = self.base / "containerd.status"
        lines = status.read_text().splitlines() if status.exists() else []
        return [int(x.split()[1]) for x in lines if x.startswith("start ")]

    def wait_containerd(self, timeout: float = 60) -> None:
        """Until containerd answers again (after a restart)."""
        wait_until(self._up, timeout, "the node's containerd to answer", interval=0.2)

    def run(self, argv: Sequence[str], timeout: float = 120) -> RunResult:
        """``argv`` inside the node (its mount, PID, network and UTS namespaces)."""
        assert self.pid is not None
        return execute(
            ["nsenter", "-t", str(self.pid), "-m", "-p", "-n", "-u", "--", *argv], timeout=timeout
        )

    def ctr(self, *args: str, timeout: float = 120) -> RunResult:
        """``ctr -n k8s.io *args`` inside the node."""
        return self.run(["ctr", "--namespace", "k8s.io", *args], timeout=timeout)

    def import_image(self, archive: Path) -> None:
        """``ctr -n k8s.io images import -`` reading the archive on stdin, as deploy/README.md's
        ``podman save … | ctr -n k8s.io images import -`` does (what a pull leaves: an
        unpacked image)."""
        res = self.run(
            ["sh", "-c", 'exec ctr --namespace k8s.io images import - < "$1"', "sh", str(archive)],
            timeout=600,
        )
        if res.rc != 0:
            raise AssertionError(f"importing {archive} into the node failed\n{res.describe()}")

    def stop(self, timeout: float = 30) -> None:
        """End PID 1 (SIGTERM: it stops containerd), then everything left in the node."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if self.pid is not None:
            try:
                os.kill(self.pid, 15)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            if self.pid is not None:
                try:
                    os.kill(self.pid, 9)
                except ProcessLookupError:
                    pass
            proc.wait(timeout)
        deadline = time.monotonic() + timeout
        while self.pid is not None and Path(f"/proc/{self.pid}").exists():
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        remove_cgroup_tree(self.cgroup_parent.strip("/"))
