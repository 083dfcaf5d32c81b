"""A one-node Kubernetes cluster the tests start themselves (tests/k8s, docs/kubernetes.md).

Every component is the real one, built from its published Go module by
:mod:`tests.helpers.gobuild` (``tests/go/<group>``): etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, the kubelet and kubectl of one Kubernetes release,
and containerd and runc under the kubelet. Everything listens on loopback; certificates
(a CA, the API server's serving certificate, the service-account key) are made here with
``openssl``; the clients authenticate with static tokens (``--token-auth-file``), the
API server authorizes with Node and RBAC.

The node (containerd and the kubelet) runs inside a private mount namespace (``unshare -m
--propagation private``): its launcher proves it (the namespace read inside differs from
the one read outside) before anything mounts, and mounts tmpfs over the host paths the
kubelet and containerd write whatever their configuration says (``/var/log``, for
``/var/log/containers``, and ``/run/containerd``), and an overlay over ``/var/lib`` whose
upper layer is in the cluster's directory (the kubelet's device manager keeps its socket
and checkpoint in ``/var/lib/kubelet/device-plugins`` whatever ``--root-dir`` says), so
nothing they mount or write there reaches the host. The kubelet runs
with real cgroups under a cgroup root of its own (removed at stop), ``failCgroupV1:
false`` (these machines run cgroup v1), containerd's CRI socket, its device-plugin
directory and PodResources socket under its ``--root-dir``. Pods are host-network (no
CNI runs; containerd only needs a CNI config to call the network ready). The kernel
tunables the kubelet sets (``vm.overcommit_memory``, ``kernel.panic``…) are put back at stop.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from tests.helpers.common import remove_cgroup_tree, unique_id, wait_until

__all__ = ["Cluster", "free_port", "KERNEL_TUNABLES"]

#: What the kubelet sets when they differ (``protectKernelDefaults: false``); put back at stop.
KERNEL_TUNABLES = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)

NODE = "nvshim-node"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openssl(*args: str, cwd: Path) -> None:
    res = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert res.returncode == 0, f"openssl {' '.join(args)}: {res.stderr}"


class Cluster:
    """The cluster under ``base`` (call :meth:`start`, then :meth:`stop`).

    ``k8s``: the Kubernetes group's programs; ``etcd``: etcd's; ``containerd``: the
    directory of ``containerd``, ``containerd-shim-runc-v2`` and ``ctr``; ``runc``: the
    runc containerd's ``runc`` handler runs; ``containerd_config``: the CRI part of
    containerd's config (its handlers), from :func:`tests.helpers.cri.cri_containerd_config`.
    """

    def __init__(
        self,
        base: Path,
        k8s: Path,
        etcd: Path,
        containerd: Path,
        containerd_config: str,
        own_node: bool = False,
    ) -> None:
        self.base, self.k8s, self.etcd_dir, self.containerd_dir = base, k8s, etcd, containerd
        self.containerd_config = containerd_config
        self.own_node = own_node
        """The node as a DaemonSet sees it (:meth:`_node`): a PID namespace whose PID 1 is
        the node's init (``nsenter -t 1`` from a hostPID pod enters the node), containerd
        started again whenever it exits (as systemd's ``Restart=always``), and the paths an
        installer writes (``/opt``, ``/usr/local``, ``/etc``, ``/run/nvshim``) overlaid so
        that writes land under ``base``."""
        self.cgroup_root = "/" + unique_id("nvshim-k8s")
        self.procs: Dict[str, subprocess.Popen[bytes]] = {}
        self.ports: Dict[str, int] = {}
        self.tunables: Dict[str, str] = {}
        self.root_dir = base / "kubelet"
        self.pod_logs = base / "pod-logs"
        self.crictl_bin = "crictl"

    # --- paths --------------------------------------------------------------------------

    @property
    def admin(self) -> Path:
        return self.base / "pki" / "admin.kubeconfig"

    @property
    def containerd_socket(self) -> str:
        return str(self.base / "containerd" / "containerd.sock")

    @property
    def device_plugins(self) -> Path:
        """The kubelet's device-plugin directory (its ``kubelet.sock`` registration socket):
        ``/var/lib/kubelet/device-plugins`` whatever ``--root-dir`` says, which the node
        binds from here (the same directory inside its mount namespace and out)."""
        return self.base / "device-plugins"

    @property
    def pod_resources(self) -> str:
        return str(self.root_dir / "pod-resources" / "kubelet.sock")

    @property
    def checkpoint(self) -> str:
        return str(self.device_plugins / "kubelet_internal_checkpoint")

    # --- life ---------------------------------------------------------------------------

    def start(self) -> None:
        for name in ("pki", "logs", "etcd", "containerd", "pod-logs", "kubelet"):
            (self.base / name).mkdir(parents=True, exist_ok=True)
        self._certs()
        self._etcd()
        self._apiserver()
        self._controllers()
        self._node()

    def stop(self) -> None:
        if "node" in self.procs and self.procs["node"].poll() is None:
            subprocess.run(
                [
                    str(self.k8s / "kubectl"),
                    "--kubeconfig",
                    str(self.admin),
                    "delete",
                    "pods",
                    "--all",
                    "--all-namespaces",
                    "--wait=true",
                    "--timeout=60s",
                    "--grace-period=1",
                ],
                capture_output=True,
                timeout=90,
                check=False,
            )
        for name in ("node", "scheduler", "controller-manager", "apiserver", "etcd"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            with _suppress():
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with _suppress():
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        self._kill_leftovers()
        remove_cgroup_tree(self.cgroup_root)
        for made, path in (
            ("made-run-containerd", "/run/containerd"),
            ("made-run-nvshim", "/run/nvshim"),
        ):
            if (self.base / made).exists():
                with _suppress():
                    os.rmdir(path)
        for key, value in self.tunables.items():
            with _suppress():
                Path("/proc/sys", key).write_text(value)

    def _kill_leftovers(self) -> None:
        """Shims and containers that outlived their parents (they hold the node's mount
        namespace and cgroups): every process in the cgroup root, and every process whose
        arguments name this cluster's directory."""
        pids = set()
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            top = hierarchy / self.cgroup_root.strip("/")
            if top.is_dir():
                for procs in top.rglob("cgroup.procs"):
                    with _suppress():
                        pids.update(int(p) for p in procs.read_text().split())
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with _suppress():
                    if str(self.base).encode() in (entry / "cmdline").read_bytes():
                        pids.add(int(entry.name))
        pids.discard(os.getpid())
        for pid in pids:
            with _suppress():
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pids and time.monotonic() < deadline:
            pids = {
                p
                for p in pids
                if Path(f"/proc/{p}").exists()
                and "State:\tZ" not in _read(Path(f"/proc/{p}/status"))
            }
            time.sleep(0.1)

    def _spawn(
        self, name: str, argv: Sequence[str], env: Optional[Dict[str, str]] = None
    ) -> subprocess.Popen[bytes]:
        with open(self.base / "logs" / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        self.procs[name] = proc
        return proc

    def _alive(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            tail = _read(self.base / "logs" / f"{name}.log")[-3000:]
            raise AssertionError(f"{name} exited with {proc.returncode}:\n{tail}")

    def log(self, name: str) -> str:
        """The named component's output so far (``etcd``, ``apiserver``, ``kubelet``…)."""
        return _read(self.base / "logs" / f"{name}.log")

    # --- certificates and kubeconfigs ---------------------------------------------------

    def _certs(self) -> None:
        pki = self.base / "pki"
        _openssl(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=nvshim-test-ca",
            cwd=pki,
        )
        (pki / "san.cnf").write_text(
            "[req]\ndistinguished_name=dn\n[dn]\n[ext]\nsubjectAltName=IP:127.0.0.1,"
            "IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc\n"
            "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        )
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "apiserver.key",
            "-out",
            "apiserver.csr",
            "-subj",
            "/CN=kube-apiserver",
            cwd=pki,
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            "apiserver.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "apiserver.crt",
            "-days",
            "2",
            "-extfile",
            "san.cnf",
            "-extensions",
            "ext",
            cwd=pki,
        )
        _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
        _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
        self.ports["apiserver"] = free_port()
        users = {
            "admin": ("admin", "system:masters"),
            "controller-manager": ("system:kube-controller-manager", ""),
            "scheduler": ("system:kube-scheduler", ""),
            "kubelet": (f"system:node:{NODE}", "system:nodes"),
        }
        lines = []
        for i, (name, (user, group)) in enumerate(users.items()):
            token = os.urandom(16).hex()
            lines.append(f"{token},{user},uid-{i}" + (f',"{group}"' if group else ""))
            self._kubeconfig(pki / f"{name}.kubeconfig", token)
        (pki / "tokens.csv").write_text("\n".join(lines) + "\n")
        for path in pki.iterdir():
            path.chmod(0o600)

    def _kubeconfig(self, path: Path, token: str) -> None:
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "test",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {
                        "server": f"https://127.0.0.1:{self.ports['apiserver']}",
                        "certificate-authority": str(self.base / "pki" / "ca.crt"),
                    },
                }
            ],
            "users": [{"name": "test", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        }
        path.write_text(json.dumps(doc))

    # --- control plane ------------------------------------------------------------------

    def _etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.ports["etcd"] = client
        self._spawn(
            "etcd",
            [
                str(self.etcd_dir / "etcd"),
                "--name",
                "default",
                "--data-dir",
                str(self.base / "etcd" / "data"),
                "--listen-client-urls",
                f"http://127.0.0.1:{client}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{client}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{peer}",
                "--listen-metrics-urls",
                "",
                "--log-level",
                "warn",
            ],
        )

    def _apiserver(self) -> None:
        pki = self.base / "pki"
        self._spawn(
            "apiserver",
            [
                str(self.k8s / "kube-apiserver"),
                "--etcd-servers",
                f"http://127.0.0.1:{self.ports['etcd']}",
                "--bind-address",
                "127.0.0.1",
                "--advertise-address",
                "127.0.0.1",
                "--secure-port",
                str(self.ports["apiserver"]),
                "--tls-cert-file",
                str(pki / "apiserver.crt"),
                "--tls-private-key-file",
                str(pki / "apiserver.key"),
                "--client-ca-file",
                str(pki / "ca.crt"),
                "--token-auth-file",
                str(pki / "tokens.csv"),
                "--authorization-mode",
                "Node,RBAC",
                "--service-cluster-ip-range",
                "10.96.0.0/24",
                "--service-account-issuer",
                "https://kubernetes.default.svc",
                "--service-account-key-file",
                str(pki / "sa.pub"),
                "--service-account-signing-key-file",
                str(pki / "sa.key"),
                "--allow-privileged=true",
                "--cert-dir",
                str(self.base / "apiserver-certs"),
                "--kubelet-preferred-address-types",
                "InternalIP",
                "--endpoint-reconciler-type",
                "none",
                "--profiling=false",
                "--v=1",
            ],
        )
        wait_until(lambda: self._ready_api(), 120, "kube-apiserver's /readyz")

    def _ready_api(self) -> bool:
        self._alive("apiserver")
        self._alive("etcd")
        res = self.kubectl("get", "--raw", "/readyz", check=False, timeout=10)
        return res.returncode == 0 and res.stdout.strip() == "ok"

    def _controllers(self) -> None:
        pki = self.base / "pki"
        self._spawn(
            "controller-manager",
            [
                str(self.k8s / "kube-controller-manager"),
                "--kubeconfig",
                str(pki / "controller-manager.kubeconfig"),
                "--service-account-private-key-file",
                str(pki / "sa.key"),
                "--root-ca-file",
                str(pki / "ca.crt"),
                "--leader-elect=false",
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(free_port()),
                "--use-service-account-credentials=true",
                "--controllers",
                "*,-nodeipam",
                "--v=1",
            ],
        )
        self._spawn(
            "scheduler",
            [
                str(self.k8s / "kube-scheduler"),
                "--kubeconfig",
                str(pki / "scheduler.kubeconfig"),
                "--leader-elect=false",
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(free_port()),
                "--v=1",
            ],
        )

    # --- the node -----------------------------------------------------------------------

    def _node(self) -> None:
        for key in KERNEL_TUNABLES:
            with _suppress():
                self.tunables[key] = Path("/proc/sys", key).read_text().strip()
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            if (
                hierarchy.is_dir()
                and not hierarchy.is_symlink()
                and (hierarchy / "cgroup.procs").exists()
            ):
                with _suppress():
                    (hierarchy / self.cgroup_root.strip("/")).mkdir(exist_ok=True)
        cd = self.base / "containerd"
        (cd / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
        (cd / "cni" / "bin").mkdir(parents=True, exist_ok=True)
        # a network config lets containerd call the pod network ready; host-network pods
        # never run a CNI plugin
        (cd / "cni" / "net.d" / "10-hostonly.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "nvshim-test",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": "nvshim-never",
                            "ipam": {"type": "host-local", "subnet": "10.250.0.0/24"},
                        }
                    ],
                }
            )
        )
        (cd / "config.toml").write_text(self.containerd_config)
        self.ports["kubelet"] = free_port()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": "127.0.0.1",
            "port": self.ports["kubelet"],
            "readOnlyPort": 0,
            "healthzPort": 0,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "failSwapOn": False,
            "podLogsDir": str(self.pod_logs),
            "resolvConf": "",
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "registerNode": True,
            "syncFrequency": "5s",
            "nodeStatusUpdateFrequency": "5s",
            "fileCheckFrequency": "5s",
            "volumeStatsAggPeriod": "0s",
        }
        kubelet_config = self.base / "kubelet-config.json"
        kubelet_config.write_text(json.dumps(config))
        outside = os.readlink("/proc/self/ns/mnt")
        script = self.base / "node.sh"
        script.write_text(f"""\
set -eu
[ "$(readlink /proc/self/ns/mnt)" != "{outside}" ] || {{
    echo "node: not in a private mount namespace: nothing started" >&2; exit 1; }}
readlink /proc/self/ns/mnt > "{self.base}/node.mntns"
# the host paths containerd and the kubelet write whatever they are told: private tmpfs
# (/run/containerd made first when the host has none: removed again at stop), and
# /var/lib seen through an overlay whose writes land in this directory (the device
# manager's /var/lib/kubelet/device-plugins is not under --root-dir)
mount -t tmpfs -o mode=0755 nvshim-k8s /var/log
mkdir -p "{self.base}/varlib/upper" "{self.base}/varlib/work"
mount -t overlay nvshim-k8s -o "lowerdir=/var/lib,upperdir={self.base}/varlib/upper,workdir={self.base}/varlib/work" /var/lib
# ...and its device-plugin directory bound from here: the same inodes inside and out, so
# a device plugin outside the namespace reaches the kubelet's socket and the reverse
mkdir -p /var/lib/kubelet/device-plugins "{self.device_plugins}"
mount --bind "{self.device_plugins}" /var/lib/kubelet/device-plugins
mkdir -p /var/log/containers /var/log/pods
[ -d /run/containerd ] || {{ mkdir /run/containerd && : > "{self.base}/made-run-containerd"; }}
mount -t tmpfs -o mode=0711 nvshim-k8s /run/containerd
{self._own_node_mounts()}PATH="{self.containerd_dir}:$PATH"; export PATH
{self._containerd_line(cd)}
i=0
while [ ! -S "{self.containerd_socket}" ] && [ "$i" -lt 300 ]; do sleep 0.1; i=$((i+1)); done
# the kubelet, started again whenever it exits (a test restarts it by killing it)
while :; do
    "{self.k8s}/kubelet" --config "{kubelet_config}" \\
        --kubeconfig "{self.base}/pki/kubelet.kubeconfig" --root-dir "{self.root_dir}" \\
        --cert-dir "{self.base}/kubelet-pki" --hostname-override {NODE} --node-ip 127.0.0.1 \\
        --v=1 >> "{self.base}/logs/kubelet.log" 2>&1 || :
    echo "kubelet exited: starting it again" >> "{self.base}/logs/kubelet.log"
    sleep 0.5
done
""")
        pid = ["-p", "--fork", "--mount-proc"] if self.own_node else []
        self._spawn("node", ["unshare", "-m", *pid, "--propagation", "private", "sh", str(script)])
        wait_until(lambda: self._node_ready(), 180, f"node {NODE} to be Ready")
        inside = _read(self.base / "node.mntns").strip()
        assert inside and inside != outside, "the node ran in the host's mount namespace"
        wait_until(
            lambda: (
                self._node_ready()
                and self.kubectl(
                    "get", "serviceaccount", "default", check=False, timeout=10
                ).returncode
                == 0
            ),
            60,
            "the default namespace's service account",
        )

    def _own_node_mounts(self) -> str:
        """The node's init script lines that overlay the installer's paths (own_node)."""
        if not self.own_node:
            return ""
        lines = []
        for path in ("/opt", "/usr/local", "/etc"):
            name = path.strip("/").replace("/", "-")
            upper, work = self.base / "node" / name / "upper", self.base / "node" / name / "work"
            lines += [
                f'mkdir -p "{upper}" "{work}"',
                f'mount -t overlay nvshim-k8s -o "lowerdir={path},upperdir={upper},'
                f'workdir={work}" {path}',
            ]
        # a node nvshim was never installed on: the machine's own install (install.sh --dev
        # ran before the tests) hidden, in the overlays only
        lines += ["rm -rf /opt/nvshim /etc/nvshim /usr/local/bin/nvshim /usr/local/bin/nvshim-*"]
        lines += [
            f'[ -d /run/nvshim ] || {{ mkdir /run/nvshim && : > "{self.base}/made-run-nvshim"; }}',
            "mount -t tmpfs -o mode=0755 nvshim-k8s /run/nvshim",
        ]
        return "\n".join(lines) + "\n"

    def _containerd_line(self, cd: Path) -> str:
        run = f'containerd --config "{cd}/config.toml" >> "{self.base}/logs/containerd.log" 2>&1'
        if not self.own_node:
            return run + " &"
        # started again whenever it exits (an installer's signal restart), each start noted
        return (
            f'while :; do echo "start $(date +%s.%N)" >> "{self.base}/containerd.starts"; '
            f"{run} || :; sleep 0.2; done &"
        )

    def containerd_starts(self) -> int:
        """How many times the node's containerd has started (own_node)."""
        return len(_read(self.base / "containerd.starts").splitlines())

    def _node_ready(self) -> bool:
        for name in ("node", "apiserver", "controller-manager", "scheduler"):
            self._alive(name)
        res = self.kubectl("get", "node", NODE, "-o", "json", check=False, timeout=10)
        if res.returncode != 0:
            return False
        conditions = json.loads(res.stdout).get("status", {}).get("conditions", [])
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def restart_kubelet(self) -> None:
        """SIGTERM the kubelet (the node starts it again) and wait until it serves: a new
        process, the node Ready, its PodResources and device-plugin sockets back."""
        old = self._kubelet_pids()
        assert old, "no kubelet runs"
        for pid in old:
            with _suppress():
                os.kill(pid, signal.SIGTERM)
        wait_until(
            lambda: bool(self._kubelet_pids()) and not set(self._kubelet_pids()) & set(old),
            60,
            "a new kubelet process",
        )
        wait_until(
            lambda: (
                _listening(self.pod_resources)
                and _listening(str(self.device_plugins / "kubelet.sock"))
                and self._node_ready()
            ),
            120,
            "the restarted kubelet",
        )

    def _kubelet_pids(self) -> List[int]:
        out = []
        binary = str(self.k8s / "kubelet").encode()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with _suppress():
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                    if argv and argv[0] == binary and str(self.base).encode() in b" ".join(argv):
                        out.append(int(entry.name))
        return out

    # --- using it -----------------------------------------------------------------------

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 120, stdin: Optional[str] = None
    ) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [str(self.k8s / "kubectl"), "--kubeconfig", str(self.admin), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check:
            assert res.returncode == 0, f"kubectl {' '.join(args)}: {res.stderr}"
        return res

    def apply(self, manifest: str) -> None:
        self.kubectl("apply", "-f", "-", stdin=manifest)

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                str(self.containerd_dir / "ctr"),
                "--address",
                self.containerd_socket,
                "--namespace",
                "k8s.io",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def crictl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """crictl (``self.crictl_bin``, cri-tools built from its module) on the node's CRI
        socket."""
        return subprocess.run(
            [self.crictl_bin, "--runtime-endpoint", f"unix://{self.containerd_socket}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def runtime_spec(self, pod: str, container: str = "main") -> Dict[str, Any]:
        """The OCI spec containerd wrote for ``container`` of ``pod`` (``crictl inspect``'s
        ``info.runtimeSpec``): NRI's adjustments are in it, the handler's edits are not."""
        pods = self.crictl("pods", "--name", f"^{pod}$", "-q")
        assert pods.returncode == 0 and pods.stdout.split(), pods.stderr
        ids = self.crictl(
            "ps", "-a", "--pod", pods.stdout.split()[0], "--name", f"^{container}$", "-q"
        )
        assert ids.returncode == 0 and ids.stdout.split(), ids.stderr
        res = self.crictl("inspect", ids.stdout.split()[0])
        assert res.returncode == 0, res.stderr
        spec: Dict[str, Any] = json.loads(res.stdout)["info"]["runtimeSpec"]
        return spec

    def pod(self, name: str, namespace: str = "default") -> Dict[str, Any]:
        doc: Dict[str, Any] = json.loads(
            self.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout
        )
        return doc

    def container_log(self, name: str, namespace: str = "default", container: str = "main") -> str:
        """What the pod's container wrote so far, as ``kubectl logs`` shows it: read from
        the kubelet's ``podLogsDir`` (CRI log lines ``<time> <stream> <tag> <text>``). The
        API server cannot reach a kubelet whose only address is loopback."""
        lines = []
        for path in sorted(self.pod_logs.glob(f"{namespace}_{name}_*/{container}/*.log")):
            for line in _read(path).splitlines():
                parts = line.split(" ", 3)
                if len(parts) == 4:
                    lines.append(parts[3])
        return "\n".join(lines)

    def wait_log(
        self, name: str, marker: str, namespace: str = "default", timeout: float = 120
    ) -> str:
        """The pod's container's log once it holds ``marker``; AssertionError with the
        pod's status when it never does."""
        out: List[str] = [""]

        def logged() -> bool:
            out[0] = self.container_log(name, namespace)
            return marker in out[0]

        try:
            wait_until(logged, timeout, f"pod {namespace}/{name} to log {marker}", interval=0.5)
        except AssertionError as exc:
            status = self.kubectl(
                "get", "pod", name, "-n", namespace, "-o", "json", check=False
            ).stdout
            state = json.loads(status or "{}").get("status", {})
            raise AssertionError(f"{exc}\npod status: {json.dumps(state)[-3000:]}") from exc
        return out[0]

    def waiting_reason(self, name: str, namespace: str = "default", timeout: float = 120) -> str:
        """``reason: message`` of the pod's first container while it waits on an error
        (``CreateContainerError``…), once it does."""
        found: List[str] = [""]

        def waiting() -> bool:
            statuses = self.pod(name, namespace).get("status", {}).get("containerStatuses") or []
            state = (statuses[0].get("state") or {}).get("waiting") if statuses else None
            if state and state.get("reason") not in (None, "ContainerCreating"):
                found[0] = f"{state.get('reason')}: {state.get('message', '')}"
                return True
            return False

        wait_until(waiting, timeout, f"pod {namespace}/{name} to wait on an error", interval=0.5)
        return found[0]

    def versions(self) -> Dict[str, str]:
        """Each component's own version line."""

        def first(argv: Sequence[str]) -> str:
            res = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=60, check=False
            )
            return (res.stdout or res.stderr).strip().splitlines()[0]

        return {
            "kube-apiserver": first([str(self.k8s / "kube-apiserver"), "--version"]),
            "kubelet": first([str(self.k8s / "kubelet"), "--version"]),
            "kubectl": first([str(self.k8s / "kubectl"), "version", "--client"]),
            "etcd": first([str(self.etcd_dir / "etcd"), "--version"]),
            "containerd": first([str(self.containerd_dir / "containerd"), "--version"]),
        }


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return exc[0] is not None and issubclass(exc[0], OSError)


def _listening(path: str) -> bool:
    """Whether a unix socket at ``path`` accepts a connection (a stale file does not)."""
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
