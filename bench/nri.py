"""What the NRI plugin adds to a CRI container's CreateContainer + StartContainer.

Run as root from the repository root with a venv that has nvshim and the test extras::

    .venv/bin/python bench/nri.py [--runs 15] [--version 1.7|2.1]

It starts containerd (tests/helpers/nri.py: Debian 13's 1.7.24 or sid's 2.1.9, NRI on,
the real CRI) on a simulated 4-GPU node and times, over the CRI as the kubelet calls it,
CreateContainer + StartContainer of a busybox container (``true``) under plain runc in
blocks, alternating:

- ``none``: no plugin registered (the agent stopped), the container names a GPU UUID;
- ``handler``: no plugin, the same container under nvshim's runtime handler (``nvidia``,
  the runtime path injecting the same GPU), for comparison;
- ``inject``: the agent injecting that GPU (device nodes, driver mounts, the hook) with the
  default ``nri-inroot: agent`` (the static client as createContainer hook, the agent
  doing the in-root work);
- ``inject_hook``: the same with ``nri-inroot: hook`` (nvshim's Python createContainer hook);
- ``inject_start``: the same with ``nri-inroot: start`` (in-root work at StartContainer);
- ``guard``: the agent with only the guard on, an unallocated ``NVIDIA_VISIBLE_DEVICES=all``
  under runc (the plugin answers with ``void``).

Also the agent's start to registration (process start to its ``nri registered`` line)
and its resident memory after the rounds. Medians in ms; nothing asserts on time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--version", default="1.7", choices=["1.7", "2.1"])
    args = parser.parse_args()
    from nvshim.sim.build import create_node
    from tests.helpers.bundle import make_rootfs
    from tests.helpers.nri import nri_node

    times: Dict[str, List[float]] = {"none": [], "handler": [], "inject": [],
                                     "inject_hook": [], "inject_start": [], "guard": []}
    ready: List[float] = []
    rss_kb = 0
    handling: List[float] = []
    hook_ms: List[float] = []
    with tempfile.TemporaryDirectory(prefix="nvshim-bench-nri-") as tmp:
        base = Path(tmp)
        sim = create_node(str(base / "node"), gpus=4)
        rootfs = make_rootfs(base / "rootfs")
        with nri_node(base, sim, rootfs, args.version) as n:
            assert n.cri is not None and n.agent is not None
            cri, gpu = n.cri, sim.gpus[1]
            log = base / "agent.log"

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

            def rounds(mode: str, env: Dict[str, str], handler: str = "runc") -> None:
                name = f"{mode}-{len(times[mode])}"
                sandbox, config = cri.run_pod(name, "bench", f"uid-{name}", base / "logs" / name,
                                              f"/{n.cgroup}/{name}", handler, None)
                for i in range(args.runs):
                    t0 = time.perf_counter()
                    cid = cri.create_container(sandbox, config, f"c{i}",
                                               "docker.io/nvshim-test/busybox:1", ["true"],
                                               env=env)
                    cri.start_container(cid)
                    times[mode].append((time.perf_counter() - t0) * 1e3)

            for _ in range(args.blocks):
                n.agent.stop()
                rounds("none", {"NVIDIA_VISIBLE_DEVICES": gpu.uuid})
                rounds("handler", {"NVIDIA_VISIBLE_DEVICES": gpu.uuid}, "nvidia")
                restart()
                rounds("inject", {"NVIDIA_VISIBLE_DEVICES": gpu.uuid})
                restart(nri_inroot="hook")
                rounds("inject_hook", {"NVIDIA_VISIBLE_DEVICES": gpu.uuid})
                restart(nri_inroot="start")
                rounds("inject_start", {"NVIDIA_VISIBLE_DEVICES": gpu.uuid})
                restart(nri_inject=False)
                rounds("guard", {"NVIDIA_VISIBLE_DEVICES": "all"})
            assert n.agent.proc is not None
            status = Path(f"/proc/{n.agent.proc.pid}/status").read_text()
            rss_kb = int(next(line.split()[1] for line in status.splitlines()
                              if line.startswith("VmRSS:")))
            handling = [json.loads(line)["ms"] for line in log.read_text().splitlines()
                        if '"nri inject"' in line and '"ms"' in line]
            hook_ms = [json.loads(line)["ms"] for line in log.read_text().splitlines()
                       if '"nri in-root work"' in line and '"agent hook"' in line]
    med = {k: statistics.median(v) for k, v in times.items()}
    print(json.dumps({
        "containerd": args.version, "runs_per_mode": len(times["none"]),
        "create_start_ms": {k: round(v, 2) for k, v in med.items()},
        "added_ms": {"inject": round(med["inject"] - med["none"], 2),
                     "inject_hook": round(med["inject_hook"] - med["none"], 2),
                     "inject_start": round(med["inject_start"] - med["none"], 2),
                     "runtime_handler": round(med["handler"] - med["none"], 2),
                     "guard": round(med["guard"] - med["none"], 2)},
        "plugin_inject_handling_ms": round(statistics.median(handling), 2) if handling else None,
        "agent_hook_work_ms": round(statistics.median(hook_ms), 2) if hook_ms else None,
        "agent_start_to_registered_ms": round(statistics.median(ready), 1),
        "agent_rss_mb": round(rss_kb / 1024, 1),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
