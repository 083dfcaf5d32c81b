"""What the debug log costs a GPU create: creates with ``debug-log`` off and on, in pairs.

Run as root from the repository root::

    .venv/bin/python bench/debuglog.py [--pairs 40]

Builds a simulated 2-GPU node and a busybox bundle asking for GPU 0 in a temporary
directory, two compiled configs that differ only by ``debug-log`` (low-level runtime
``/bin/true``, so only nvshim is timed), then times ``python -I -m nvshim.runtime.main
create`` with each, alternating (the order flips every pair; config.json is restored
before each create). Prints the medians and the median of the per-pair differences.
Nothing asserts on time: this is a measurement.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _config(work: Path, name: str, node_root: str, extra: str) -> Dict[str, str]:
    cfg = work / name / "config.yaml"
    cfg.parent.mkdir()
    cfg.write_text(
        f"runtimes: [/bin/true]\ndriver-root: {node_root}\ngrants-journal: null\n" + extra
    )
    subprocess.run(
        [sys.executable, "-I", "-m", "nvshim.cli.main", "config", "compile", "--config", str(cfg)],
        check=True,
        capture_output=True,
    )
    return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVSHIM_CONFIG": str(cfg)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=40)
    args = parser.parse_args()
    from nvshim.sim.build import create_node
    from tests.helpers.bundle import make_bundle, make_rootfs

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        node = create_node(str(work / "node"), gpus=2)
        bundle = make_bundle(
            work / "bundle",
            make_rootfs(work / "rootfs"),
            ["true"],
            env={"NVIDIA_VISIBLE_DEVICES": "0"},
        )
        original = (bundle / "config.json").read_bytes()
        envs = {
            "off": _config(work, "off", node.root, ""),
            "on": _config(work, "on", node.root, f"debug-log: {work}/debug.log\n"),
        }
        times: Dict[str, List[float]] = {"off": [], "on": []}
        for i in range(args.pairs + 2):  # the first two pairs warm the caches, untimed
            for label in ("off", "on") if i % 2 else ("on", "off"):
                (bundle / "config.json").write_bytes(original)
                start = time.perf_counter()
                subprocess.run(
                    [
                        sys.executable,
                        "-I",
                        "-m",
                        "nvshim.runtime.main",
                        "create",
                        "--bundle",
                        str(bundle),
                        f"c{i}",
                    ],
                    env=envs[label],
                    check=True,
                )
                if i >= 2:
                    times[label].append((time.perf_counter() - start) * 1000)
        diffs = [b - a for a, b in zip(times["off"], times["on"], strict=True)]
        print(f"GPU create, debug-log off: median {statistics.median(times['off']):.1f} ms")
        print(f"GPU create, debug-log on:  median {statistics.median(times['on']):.1f} ms")
        print(
            f"cost of the debug log: median of {len(diffs)} paired differences "
            f"{statistics.median(diffs):.1f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
