"""What the NRI plugin adds to a CRI container's CreateContainer + StartContainer.

Run as root from the repository root with a venv that has nvshim and the test extras::

    .venv/bin/python bench/nri.py [--runs 15] [--blocks 2] [--version 1.7|2.1] [--modes guard,...]
        [--out bench/nri-results.json]

It starts containerd (tests/helpers/nri.py: Debian 13's 1.7.24 or sid's 2.1.9, NRI on,
the real CRI) on a simulated 4-GPU node and times, over the CRI as the kubelet calls it,
CreateContainer + StartContainer of a busybox container (``true``) under plain runc in
blocks of ``--runs``, one block per mode per round, the order reversed every other round,
each block in a pod of its own that is removed after it (containerd's create slows as the
containers it holds grow: without the removal the modes run later in a round paid for
the earlier ones' containers, ≈ 5 ms for the guard):

- ``none``: no plugin registered (the agent stopped), the container names a GPU UUID;
- ``floor``: no plugin, the engine injecting that GPU itself from nvshim's CDI spec with
  its hooks taken out (the same devices and mounts under another kind,
  ``nvshim-floor.test/gpu``, asked for in the CRI's CDI devices): the NRI floor, what
  runc pays for the device nodes and mounts whoever injects them; ``inject`` and the
  others are also given over it (``over_floor_ms_paired_blocks``); the spec containerd
  wrote for the floor's first container must hold the GPU's node and no hook;
- ``handler``: no plugin, the same container under nvshim's runtime handler (``nvidia``,
  the runtime path injecting the same GPU), for comparison;
- ``inject``: the agent injecting that GPU (device nodes, driver mounts, the hook) with the
  default ``nri-inroot: agent`` (the static client as createContainer hook, the agent
  doing the in-root work);
- ``inject_start``: the same with ``nri-inroot: start`` (in-root work at StartContainer);
- ``guard``: the agent with only the guard on, an unallocated ``NVIDIA_VISIBLE_DEVICES=all``
  under runc (the plugin answers with ``void``);
- ``registered``: the agent registered with all three duties off (it answers every
  event with no adjustment): what NRI's round trips cost before any decision;
- ``stub``: no agent; NRI's reference plugin at its cheapest instead (``nri-stub``, our
  main.go around ``pkg/stub`` of the published ``github.com/containerd/nri`` module,
  v0.6.1, built through the Go module proxy into a cache: :mod:`tests.helpers.nristub`),
  registered on the same socket at the agent's index, subscribed to every event nvshim's
  plugin handles (CreateContainer, StartContainer, RemoveContainer: its subscription under
  ``nri-inroot: start``) and answering each at once with no adjustment: NRI's own floor,
  what any external plugin on those events pays. It is built
  (Go needed) before containerd starts; the run fails unless it answered every create of
  its block, and every start and removal too;
- ``stub_create``: the same stub subscribed to CreateContainer only, as nvshim's plugin
  is when inject is off (``guard``, ``registered``) (``stub`` less this
  is what the StartContainer subscription costs a create+start: RemoveContainer's round
  trip comes with the block's removal, which is not timed).

The modes run under ``NVIDIA_VISIBLE_DEVICES=all`` (guard, registered, the stubs) or the
GPU's UUID (the others); with no plugin injecting, runc is given the same container either
way.

Beside the wall time, the CPU time each block's timed containers cost containerd and the
registered plugin (the agent or the stub; the sum of their threads' ``schedstat``, read
before the first timed create and after the last start), per container: CPU is not
stretched by another process's load as wall time is, so the plugins' own work and what a
subscription costs containerd show through a busy machine (``containerd_cpu_ms``,
``plugin_cpu_ms``, and ``containerd_cpu_added_ms_paired_blocks`` over ``none``).

The agent's modes subscribe to what its config needs (``agent_events``: the mask its
Configure reply logged, per mode); the stubs to a fixed set, for comparison with each.

Also the agent's start to registration (process start to its ``nri registered`` line),
the stub's to its ``synchronized`` line, and the agent's resident memory after the rounds.
Medians in ms; ``added_ms`` is the difference of each mode's median and ``none``'s,
``added_ms_paired_blocks`` the median over rounds of each block's median less the ``none``
block's of the same round (steadier when the machine's speed drifts). The JSON is printed
and written to ``--out``. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

MODES = (
    "none",
    "floor",
    "handler",
    "inject",
    "inject_start",
    "guard",
    "registered",
    "stub",
    "stub_create",
)
#: each stub mode's subscription (:data:`tests.helpers.nristub.EVENTS`)
STUB_EVENTS = {"stub": "same", "stub_create": "create"}
#: the kind of the floor's spec (nvshim's spec without its hooks, beside nvshim's own)
FLOOR_KIND = "nvshim-floor.test/gpu"
REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def floor_spec(spec: Path, out: Path) -> None:
    """nvshim's CDI spec ``spec`` without its hooks, under :data:`FLOOR_KIND`, as ``out``."""
    import yaml

    doc = yaml.safe_load(spec.read_text())
    doc["kind"] = FLOOR_KIND
    for edits in [doc.get("containerEdits") or {}] + [
        d.get("containerEdits") or {} for d in doc.get("devices") or []
    ]:
        edits.pop("hooks", None)
    out.write_text(json.dumps(doc, indent=1) + "\n")


def cpu_ms(pid: Optional[int]) -> float:
    """The CPU time process ``pid``'s live threads have used so far, in ms (the sum of
    their ``schedstat``, kept in ns: /proc's utime and stime count clock ticks); 0 for no
    process."""
    if pid is None:
        return 0.0
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # a thread gone meanwhile
            pass
    return total / 1e6


def paired_blocks(mine: List[float], base: List[float]) -> float:
    """The median over rounds of a block's median less ``base``'s block of the same round."""
    return round(statistics.median(a - b for a, b in zip(mine, base, strict=True)), 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--version", default="1.7", choices=["1.7", "2.1"])
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help="comma-separated modes to run, of "
        + ", ".join(MODES)
        + " (none, the baseline, always runs)",
    )
    parser.add_argument("--out", default=str(REPO / "bench" / "nri-results.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()
    modes = ["none"] + [m for m in args.modes.split(",") if m and m != "none"]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}: choose from {', '.join(MODES)}")
    from nvshim.sim.build import create_node
    from tests.helpers.bundle import make_rootfs
    from tests.helpers.nri import nri_node
    from tests.helpers.nristub import NriStub, stub_binary

    # built (or found in the cache) before containerd starts: the build is no round's
    stub_bin = stub_binary() if any(m in STUB_EVENTS for m in modes) else None

    times: Dict[str, List[float]] = {m: [] for m in modes}
    block_medians: Dict[str, List[float]] = {m: [] for m in modes}
    # per block, per timed container: containerd's CPU ms, and the plugin's
    cpu_engine: Dict[str, List[float]] = {m: [] for m in modes}
    cpu_plugin: Dict[str, List[float]] = {m: [] for m in modes}
    ready: List[float] = []
    stub_ready: List[float] = []
    # the event mask the agent's Configure reply subscribed with, per agent mode
    agent_events: Dict[str, Any] = {}
    rss_kb = 0
    handling: List[float] = []
    hook_ms: List[float] = []
    guard_ms: List[float] = []
    with tempfile.TemporaryDirectory(prefix="nvshim-bench-nri-") as tmp:
        base = Path(tmp)
        sim = create_node(str(base / "node"), gpus=4)
        rootfs = make_rootfs(base / "rootfs")
        with nri_node(base, sim, rootfs, args.version) as n:
            assert n.cri is not None and n.agent is not None
            cri, gpu = n.cri, sim.gpus[1]
            log = base / "agent.log"
            stub = (
                NriStub(stub_bin, base / "nri.sock", base / "nri-stub.log")
                if stub_bin is not None
                else None
            )

            def restart(**settings: object) -> None:
                assert n.agent is not None
                n.configure(**settings)
                if n.agent.proc is not None and n.agent.proc.poll() is None:
                    n.agent.stop()
                before = log.read_text().count("nri registered")
                t0 = time.perf_counter()
                n.agent.start()
                while log.read_text().count("nri registered") <= before:
                    time.sleep(0.002)
                ready.append((time.perf_counter() - t0) * 1e3)

            def rounds(
                mode: str, env: Dict[str, str], handler: str = "runc", cdi: Sequence[str] = ()
            ) -> None:
                name = f"{mode}-{len(times[mode])}"
                sandbox, config = cri.run_pod(
                    name,
                    "bench",
                    f"uid-{name}",
                    base / "logs" / name,
                    f"/{n.cgroup}/{name}",
                    handler,
                    None,
                )
                assert n.containerd is not None and n.agent is not None
                plugin = next(
                    (
                        p.pid
                        for p in (stub.proc if stub is not None else None, n.agent.proc)
                        if p is not None and p.poll() is None
                    ),
                    None,
                )
                cpu0 = (0.0, 0.0)
                # one untimed container first in every block: a just started agent's first
                # create imports the planning modules, and its start-up work settles
                for i in range(-1, args.runs):
                    if i == 0:
                        cpu0 = (cpu_ms(n.containerd.pid), cpu_ms(plugin))
                    t0 = time.perf_counter()
                    cid = cri.create_container(
                        sandbox,
                        config,
                        f"c{i + 1}",
                        "docker.io/nvshim-test/busybox:1",
                        ["true"],
                        env=env,
                        cdi_devices=cdi,
                    )
                    cri.start_container(cid)
                    if i >= 0:
                        times[mode].append((time.perf_counter() - t0) * 1e3)
                    elif cdi:  # the floor's first container: did the engine inject it?
                        check_floor(cid)
                block_medians[mode].append(statistics.median(times[mode][-args.runs :]))
                cpu_engine[mode].append((cpu_ms(n.containerd.pid) - cpu0[0]) / args.runs)
                cpu_plugin[mode].append((cpu_ms(plugin) - cpu0[1]) / args.runs)
                if n.agent.proc is not None and plugin == n.agent.proc.pid:
                    configured = [
                        json.loads(line)
                        for line in log.read_text().splitlines()
                        if '"nri configured"' in line
                    ]
                    agent_events[mode] = configured[-1].get("events") if configured else None
                # each block on a containerd holding no earlier block's containers: create
                # time grows with their number, which would favour the modes run first
                cri.remove_pods(close=False)

            gpu_env = {"NVIDIA_VISIBLE_DEVICES": gpu.uuid}

            def check_floor(cid: str) -> None:
                """The spec containerd wrote for a floor container holds the GPU's node
                and no hook, or the floor measured nothing."""
                assert n.containerd is not None
                res = n.containerd.ctr("containers", "info", cid, timeout=30)
                spec = json.loads(res.stdout)["Spec"] if res.rc == 0 else {}
                devices = [d.get("path") for d in (spec.get("linux") or {}).get("devices") or []]
                if f"/dev/nvidia{gpu.minor}" not in devices or spec.get("hooks"):
                    raise SystemExit(
                        f"bench/nri.py: containerd did not inject the floor's CDI "
                        f"device (devices {devices}, hooks {spec.get('hooks')})"
                    )

            floor_spec(base / "cdi" / "nvidia.yaml", base / "cdi" / "nvshim-floor.json")

            def run_mode(mode: str) -> None:
                if mode in ("none", "handler", "floor"):
                    assert n.agent is not None
                    n.agent.stop()
                    if mode == "floor":
                        rounds(mode, gpu_env, cdi=[f"{FLOOR_KIND}={gpu.uuid}"])
                    else:
                        rounds(mode, gpu_env, "nvidia" if mode == "handler" else "runc")
                elif mode.startswith("inject"):
                    restart(**({"nri_inroot": mode.split("_")[1]} if "_" in mode else {}))
                    rounds(mode, gpu_env)
                elif mode == "guard":
                    restart(nri_inject=False)
                    rounds(mode, {"NVIDIA_VISIBLE_DEVICES": "all"})
                elif mode in STUB_EVENTS:  # NRI's own floor: the stub instead of the agent
                    assert n.agent is not None and stub is not None
                    n.agent.stop()
                    stub_ready.append(stub.start(STUB_EVENTS[mode]))
                    try:
                        rounds(mode, {"NVIDIA_VISIBLE_DEVICES": "all"})
                    finally:
                        answered = stub.stop()
                    # every create of the block (the untimed one too) went through the stub,
                    # and the starts and removals too where it subscribed to them
                    made = args.runs + 1
                    want = {"create": made} | (
                        {"start": made, "remove": made}
                        if STUB_EVENTS[mode] == "same"
                        else {"start": 0, "remove": 0}
                    )
                    if answered != want:
                        raise SystemExit(
                            f"bench/nri.py: the stub ({mode}) answered {answered}, not {want}"
                        )
                else:  # registered
                    restart(nri_inject=False, nri_guard=False, nri_verify=False)
                    rounds(mode, {"NVIDIA_VISIBLE_DEVICES": "all"})

            for block in range(args.blocks):  # the order reversed every other block
                for mode in modes if block % 2 == 0 else modes[::-1]:
                    run_mode(mode)
            if n.agent.proc is None or n.agent.proc.poll() is not None:
                restart()
            assert n.agent.proc is not None
            status = Path(f"/proc/{n.agent.proc.pid}/status").read_text()
            rss_kb = int(
                next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))
            )
            handling = [
                json.loads(line)["ms"]
                for line in log.read_text().splitlines()
                if '"nri inject"' in line and '"ms"' in line
            ]
            guard_ms = [
                json.loads(line)["ms"]
                for line in log.read_text().splitlines()
                if '"nri guard"' in line and '"ms"' in line
            ]
            hook_ms = [
                json.loads(line)["ms"]
                for line in log.read_text().splitlines()
                if '"nri in-root work"' in line and '"agent hook"' in line
            ]
    med = {k: statistics.median(v) for k, v in times.items()}
    results: Dict[str, Any] = {
        "containerd": args.version,
        "runs_per_mode": len(times["none"]),
        "create_start_ms": {k: round(v, 2) for k, v in med.items()},
        "added_ms": {
            ("runtime_handler" if k == "handler" else k): round(v - med["none"], 2)
            for k, v in med.items()
            if k != "none"
        },
        # each block against the no-plugin block of the same round: slow drift cancels
        "added_ms_paired_blocks": {
            ("runtime_handler" if k == "handler" else k): paired_blocks(v, block_medians["none"])
            for k, v in block_medians.items()
            if k != "none"
        },
        # each injecting mode (and the handler) over the floor's block of the same round
        "over_floor_ms_paired_blocks": {
            ("runtime_handler" if k == "handler" else k): paired_blocks(v, block_medians["floor"])
            for k, v in block_medians.items()
            if "floor" in block_medians and (k.startswith("inject") or k == "handler")
        },
        "block_medians_ms": {k: [round(x, 1) for x in v] for k, v in block_medians.items()},
        # CPU per timed container, medians over blocks: containerd's, the plugin's
        "containerd_cpu_ms": {k: round(statistics.median(v), 2) for k, v in cpu_engine.items()},
        "plugin_cpu_ms": {k: round(statistics.median(v), 2) for k, v in cpu_plugin.items()},
        "containerd_cpu_added_ms_paired_blocks": {
            ("runtime_handler" if k == "handler" else k): paired_blocks(v, cpu_engine["none"])
            for k, v in cpu_engine.items()
            if k != "none"
        },
        "containerd_cpu_block_ms": {k: [round(x, 2) for x in v] for k, v in cpu_engine.items()},
        "plugin_cpu_block_ms": {k: [round(x, 2) for x in v] for k, v in cpu_plugin.items()},
        "plugin_inject_handling_ms": round(statistics.median(handling), 2) if handling else None,
        "plugin_guard_handling_ms": round(statistics.median(guard_ms), 2) if guard_ms else None,
        "agent_hook_work_ms": round(statistics.median(hook_ms), 2) if hook_ms else None,
        "agent_start_to_registered_ms": round(statistics.median(ready), 1),
        "agent_rss_mb": round(rss_kb / 1024, 1),
        # what the agent subscribed to in each of its modes (NRI's mask: 8 CreateContainer,
        # 32 StartContainer, 1024 RemoveContainer), as its Configure reply logged it
        "agent_events": agent_events,
        "stub_start_to_synchronized_ms": (
            round(statistics.median(stub_ready), 1) if stub_ready else None
        ),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "machine": {
            "nproc": os.cpu_count(),
            "kernel": platform.release(),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    }
    text = json.dumps(results, indent=2)
    print(text)
    if "inject" in modes and not hook_ms:
        from nvshim.agent.client import client_path

        print(
            f"bench/nri.py: the agent did no in-root work for an injection's hook (no "
            f"{client_path(sys.executable)}?): inject's figure is the Python hook's",
            file=sys.stderr,
        )
    Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
