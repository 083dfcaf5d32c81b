"""The NRI plugin's own time per event, in-process: from a request's bytes to its reply's.

Run from the repository root with a venv that has nvshim and the test extras::

    .venv/bin/python bench/nriplugin.py [--calls 300] [--profile EVENT] [--out FILE]

No engine: it builds the requests containerd 1.7 sends for a busybox container of a
Kubernetes pod (the pod's and the container's CRI annotations, 15 env entries, the eleven
mounts containerd gives, the default devices, namespaces, resources and cgroups path) with
protoc's messages, and passes each, framed as the engine frames it, through
:class:`nvshim.agent.nri.transport.Session` to :class:`nvshim.agent.nri.plugin.Plugin` on a
socket pair, the reply read back on the engine's side. Per event, on a simulated 4-GPU node
with the config ``tests/helpers/nri.py`` gives the agent (a PodResources server as the
kubelet, reporting nothing, as in ``bench/nri.py``):

- ``create.registered``: CreateContainer, all three duties off;
- ``create.guard``: CreateContainer of an unallocated ``NVIDIA_VISIBLE_DEVICES=all`` under
  runc, the guard on (answered ``void``, journaled as stripped);
- ``create.inject``: CreateContainer naming one GPU's UUID under runc, injected with
  ``nri-inroot: agent`` (journaled as a grant);
- ``start``, ``remove``: StartContainer and RemoveContainer with no work held;
- ``handle.*``: the same requests to :meth:`Plugin.handle` directly (no transport).

Each is timed ``--calls`` times, the events interleaved, and after each call a pass over
8 MiB (the caches another process leaves): medians and 90th percentiles of the wall time
(the socket's end to end: the reader's wake-up, the hand-off to a worker thread, the
reply's write and the engine-side read) and of the handling thread's CPU time
(``time.thread_time_ns``, ``handle.*`` only). ``--profile EVENT`` prints cProfile's top
functions of ``handle.EVENT``. The JSON is printed and written to ``--out``. Nothing
asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ENV = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOSTNAME=bench-0",
    "LANG=C.UTF-8",
    "HOME=/root",
    "TERM=xterm",
    "APP_MODE=bench",
    "LOG_LEVEL=info",
    "KUBERNETES_SERVICE_HOST=10.96.0.1",
    "KUBERNETES_SERVICE_PORT=443",
    "KUBERNETES_SERVICE_PORT_HTTPS=443",
    "KUBERNETES_PORT=tcp://10.96.0.1:443",
    "KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443",
    "KUBERNETES_PORT_443_TCP_PROTO=tcp",
    "KUBERNETES_PORT_443_TCP_PORT=443",
)


def request(pb: Any, kind: str, gpu_env: str, cid: str, pid: int = 0) -> bytes:
    """The ``kind`` request (``Create``/``Start``/``Remove``ContainerRequest) containerd
    1.7 sends for a busybox container ``cid`` whose env ends with ``gpu_env``."""
    sandbox = "5" * 64
    pod = pb.PodSandbox(
        id=sandbox,
        name="bench-0",
        uid="uid-bench-0",
        namespace="bench",
        labels={"io.kubernetes.pod.name": "bench-0", "io.kubernetes.pod.namespace": "bench"},
        annotations={
            "io.kubernetes.cri.container-type": "sandbox",
            "io.kubernetes.cri.sandbox-id": sandbox,
            "io.kubernetes.cri.sandbox-name": "bench-0",
            "io.kubernetes.cri.sandbox-namespace": "bench",
            "io.kubernetes.cri.sandbox-uid": "uid-bench-0",
            "io.kubernetes.cri.sandbox-log-directory": "/var/log/pods/bench_bench-0_uid",
            "io.kubernetes.cri.sandbox-cpu-period": "100000",
            "io.kubernetes.cri.sandbox-cpu-quota": "0",
            "io.kubernetes.cri.sandbox-cpu-shares": "2",
            "io.kubernetes.cri.sandbox-memory": "0",
        },
        runtime_handler="runc",
        linux=pb.LinuxPodSandbox(
            cgroup_parent="/kubepods/besteffort/poduid-bench-0",
            cgroups_path="/kubepods/besteffort/poduid-bench-0/" + sandbox,
        ),
        pid=4242,
    )
    mounts = [
        ("/proc", "proc", "proc", ("nosuid", "noexec", "nodev")),
        ("/dev", "tmpfs", "tmpfs", ("nosuid", "strictatime", "mode=755", "size=65536k")),
        ("/dev/pts", "devpts", "devpts", ("nosuid", "noexec", "newinstance", "gid=5")),
        ("/dev/mqueue", "mqueue", "mqueue", ("nosuid", "noexec", "nodev")),
        ("/sys", "sysfs", "sysfs", ("nosuid", "noexec", "nodev", "ro")),
        ("/sys/fs/cgroup", "cgroup", "cgroup", ("nosuid", "noexec", "nodev", "relatime", "ro")),
        ("/etc/hosts", "bind", "/var/lib/containerd/sandboxes/hosts", ("rbind", "rprivate", "rw")),
        ("/dev/termination-log", "bind", "/var/lib/kubelet/pods/term", ("rbind", "rw")),
        ("/etc/hostname", "bind", "/var/lib/containerd/sandboxes/hostname", ("rbind", "rw")),
        ("/etc/resolv.conf", "bind", "/var/lib/containerd/sandboxes/resolv", ("rbind", "rw")),
        ("/dev/shm", "bind", "/run/containerd/sandboxes/shm", ("rbind", "rprivate", "rw")),
    ]
    devices = [
        ("/dev/null", 1, 3),
        ("/dev/zero", 1, 5),
        ("/dev/full", 1, 7),
        ("/dev/random", 1, 8),
        ("/dev/urandom", 1, 9),
        ("/dev/tty", 5, 0),
    ]
    container = pb.Container(
        id=cid,
        pod_sandbox_id=sandbox,
        name="c0",
        state=pb.CONTAINER_CREATED if kind != "Create" else pb.CONTAINER_UNKNOWN,
        labels={"io.kubernetes.container.name": "c0", "io.kubernetes.pod.name": "bench-0"},
        annotations={
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.container-name": "c0",
            "io.kubernetes.cri.image-name": "docker.io/nvshim-test/busybox:1",
            "io.kubernetes.cri.sandbox-id": sandbox,
            "io.kubernetes.cri.sandbox-name": "bench-0",
            "io.kubernetes.cri.sandbox-namespace": "bench",
            "io.kubernetes.cri.sandbox-uid": "uid-bench-0",
        },
        args=["true"],
        env=[*ENV, gpu_env],
        mounts=[
            pb.Mount(destination=d, type=t, source=s, options=list(o)) for d, t, s, o in mounts
        ],
        linux=pb.LinuxContainer(
            namespaces=[
                pb.LinuxNamespace(type=t, path=p)
                for t, p in (
                    ("pid", ""),
                    ("ipc", "/proc/4242/ns/ipc"),
                    ("uts", "/proc/4242/ns/uts"),
                    ("mount", ""),
                    ("network", "/proc/4242/ns/net"),
                )
            ],
            devices=[
                pb.LinuxDevice(
                    path=p,
                    type="c",
                    major=ma,
                    minor=mi,
                    file_mode=pb.OptionalFileMode(value=0o666),
                    uid=pb.OptionalUInt32(value=0),
                    gid=pb.OptionalUInt32(value=0),
                )
                for p, ma, mi in devices
            ],
            resources=pb.LinuxResources(
                cpu=pb.LinuxCPU(
                    shares=pb.OptionalUInt64(value=2), period=pb.OptionalUInt64(value=100000)
                ),
                memory=pb.LinuxMemory(limit=pb.OptionalInt64(value=0)),
            ),
            oom_score_adj=pb.OptionalInt(value=1000),
            cgroups_path="/kubepods/besteffort/poduid-bench-0/" + cid,
        ),
        pid=pid,
    )
    message = getattr(pb, f"{kind}ContainerRequest")(pod=pod, container=container)
    return bytes(message.SerializeToString())


def percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Engine:
    """The engine's end of a socket pair whose other end a :class:`Session` serves."""

    def __init__(self, handler: Callable[[str, bytes], bytes], log: Any) -> None:
        from nvshim.agent.nri.transport import Session

        self.ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.session = Session(theirs, handler, log)
        self.stop = threading.Event()
        self.reader = threading.Thread(target=self.session.run, args=(self.stop,), daemon=True)
        self.reader.start()
        self.stream = 1

    def call(self, method: str, body: bytes) -> bytes:
        from nvshim.agent.nri import transport as t

        self.stream += 2
        message = t.encode_request("nri.pkg.api.v1alpha1.Plugin", method, body, 2_000_000_000)
        data = t.ttrpc_message(self.stream, t.REQUEST, message)
        self.ours.sendall(
            b"".join(
                t.frame(t.PLUGIN_CONN, data[i : i + t.WRITE_CHUNK])
                for i in range(0, len(data), t.WRITE_CHUNK)
            )
        )
        buf = b""
        want = -1
        while want < 0 or len(buf) < want:
            buf += self.ours.recv(1 << 16)
            if want < 0 and len(buf) >= 18:
                want = 18 + int.from_bytes(buf[8:12], "big")
        code, text, payload = t.decode_response(buf[18:want])
        if code:
            raise RuntimeError(f"{method}: error reply {code}: {text}")
        return payload

    def close(self) -> None:
        self.stop.set()
        self.session.close()
        self.reader.join()
        self.ours.close()


def trash(buf: bytearray) -> None:
    """A pass over ``buf``: the caches another process would leave."""
    buf[::64] = bytes(len(buf[::64]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--profile", default="")
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    from nvshim.agent.client import build_client
    from nvshim.agent.hookwork import PendingWork
    from nvshim.agent.nri import api_pb2 as pb
    from nvshim.agent.nri.plugin import Plugin
    from nvshim.agent.state import AgentState
    from nvshim.logs import configure
    from nvshim.node.compile import compile_node
    from nvshim.sim.build import create_node
    from tests.helpers.node import write_nvshim_config
    from tests.helpers.podresources import PodResourcesServer

    with tempfile.TemporaryDirectory(prefix="nvshim-bench-nriplugin-") as tmp:
        base = Path(tmp)
        sim = create_node(str(base / "node"), gpus=4)
        kubelet = PodResourcesServer(str(base / "kubelet.sock")).start()
        common: Dict[str, Any] = {
            "runtimes": ["runc"],
            "driver-root": sim.root,
            "grants-journal": str(base / "grants.jsonl"),
            "require-allocation": True,
            "nri-gpu-handlers": ["nvidia", ""],
            "nri-nvshim-handlers": [],
            "nri-runtime-root": str(base / "runc-root"),
            "kubelet-socket": str(base / "kubelet.sock"),
            "kubelet-checkpoint": None,
        }
        modes = {
            "registered": {"nri-inject": False, "nri-guard": False, "nri-verify": False},
            "guard": {"nri-inject": False, "nri-guard": True, "nri-verify": True},
            "inject": {"nri-inject": True, "nri-guard": True, "nri-verify": True},
        }
        # the agent's static client as the createContainer hook (nri-inroot: agent)
        client = build_client(str(base / "nvshim-agent-client"))
        plugins: Dict[str, Plugin] = {}
        engines: Dict[str, Engine] = {}
        log = configure(open(base / "agent.log", "a", buffering=1))  # as the agent logs
        for mode, settings in modes.items():
            path = write_nvshim_config(base / mode, {**common, **settings})
            compile_node(str(path))
            pending = PendingWork(str(base / "agent.sock"), client)
            plugins[mode] = Plugin(AgentState(str(path), log), pending)
            engines[mode] = Engine(plugins[mode].handle, log)
        gpu = sim.gpus[1]
        calls: Dict[str, Tuple[str, str, bytes]] = {
            "create.registered": (
                "registered",
                "CreateContainer",
                request(pb, "Create", "NVIDIA_VISIBLE_DEVICES=all", "a" * 64),
            ),
            "create.guard": (
                "guard",
                "CreateContainer",
                request(pb, "Create", "NVIDIA_VISIBLE_DEVICES=all", "b" * 64),
            ),
            "create.inject": (
                "inject",
                "CreateContainer",
                request(pb, "Create", f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}", "c" * 64),
            ),
            "start": (
                "inject",
                "StartContainer",
                request(pb, "Start", f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}", "c" * 64, 5151),
            ),
            "remove": (
                "inject",
                "RemoveContainer",
                request(pb, "Remove", f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}", "c" * 64, 5151),
            ),
        }
        sizes = {name: len(body) for name, (_m, _x, body) in calls.items()}
        replies = {}
        for name, (mode, method, body) in calls.items():  # warm: imports, caches
            for _ in range(3):
                replies[name] = len(plugins[mode].handle(method, body))
                engines[mode].call(method, body)
        if args.profile:
            import cProfile
            import pstats

            mode, method, body = calls[args.profile]
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.calls):
                plugins[mode].handle(method, body)
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
        wall: Dict[str, List[float]] = {f"socket.{n}": [] for n in calls}
        cpu: Dict[str, List[float]] = {f"handle.{n}": [] for n in calls}
        wall.update({f"handle.{n}": [] for n in calls})
        junk = bytearray(8 << 20)
        for _ in range(args.calls):
            for name, (mode, method, body) in calls.items():
                trash(junk)
                c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
                plugins[mode].handle(method, body)
                t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
                cpu[f"handle.{name}"].append((c1 - c0) / 1e6)
                wall[f"handle.{name}"].append((t1 - t0) / 1e6)
                trash(junk)
                t0 = time.perf_counter_ns()
                engines[mode].call(method, body)
                wall[f"socket.{name}"].append((time.perf_counter_ns() - t0) / 1e6)
        for engine in engines.values():
            engine.close()
        kubelet.stop()
    results: Dict[str, Any] = {
        "calls": args.calls,
        "request_bytes": sizes,
        "reply_bytes": replies,
        "wall_ms_median": {k: round(statistics.median(v), 3) for k, v in wall.items()},
        "wall_ms_p90": {k: round(percentile(v, 0.9), 3) for k, v in wall.items()},
        "cpu_ms_median": {k: round(statistics.median(v), 3) for k, v in cpu.items()},
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
    }
    print(json.dumps(results, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
