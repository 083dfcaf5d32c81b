"""What the ModifyDeviceFiles: 0 hook costs a GPU container, through runc.

Run as root from the repository root with the installed venv's interpreter::

    /opt/nvshim/venv/bin/python bench/devparams.py [--pairs 20]

A simulated 1-GPU node and a busybox bundle asking for GPU 0; the bundle carries a
createContainer hook standing in for the kernel module (a tmpfs over the container's
``/proc/driver`` with ``nvidia/params`` saying ``ModifyDeviceFiles: 1``, as in
tests/e2e/test_devparams_e2e.py), so nvshim's hook really binds its copy. Each pair times
``nvshim-runtime run`` (create, start, wait, runc's delete of its own state) of a
container running ``true`` with ``disable-device-node-modification`` on and off, in
alternating order; config.json is restored before every run. Prints medians and the
median per-pair difference. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

FAKE_DRIVER = (
    'r=$1; mount -t tmpfs -o mode=755 tmpfs "$r/proc/driver" && '
    'mkdir "$r/proc/driver/nvidia" && '
    'printf "ModifyDeviceFiles: 1\\n" > "$r/proc/driver/nvidia/params"'
)
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--runtime", default="/usr/local/bin/nvshim-runtime")
    args = parser.parse_args()

    from nvshim.node.compile import compile_config
    from nvshim.sim.build import create_node
    from tests.helpers.bundle import make_bundle, make_rootfs

    with tempfile.TemporaryDirectory(prefix="nvshim-bench-params-") as tmp:
        work = Path(tmp)
        node = create_node(str(work / "node"), gpus=1)
        base = make_rootfs(work / "base")
        bundle = make_bundle(
            work / "b",
            base,
            ["true"],
            env={"NVIDIA_VISIBLE_DEVICES": "0"},
            hooks={
                "createContainer": [
                    {
                        "path": "/bin/sh",
                        "env": [f"PATH={PATH}"],
                        "args": ["sh", "-c", FAKE_DRIVER, "fake", str(work / "b" / "rootfs")],
                    }
                ]
            },
        )
        pristine = (bundle / "config.json").read_bytes()
        envs = {}
        for arm, on in (("on", True), ("off", False)):
            cfg = work / f"{arm}.yaml"
            cfg.write_text(
                f"driver-root: {node.root}\nruntimes: [runc]\ngrants-journal: null\n"
                f"disable-device-node-modification: {str(on).lower()}\n"
            )
            compile_config(str(cfg))
            envs[arm] = {"NVSHIM_CONFIG": str(cfg), "PATH": PATH}
        root = work / "runc-root"
        times = {"on": [], "off": []}
        for i in range(args.pairs + 1):
            order = ("on", "off") if i % 2 == 0 else ("off", "on")
            for arm in order:
                (bundle / "config.json").write_bytes(pristine)
                cid = f"bench-params-{i}-{arm}"
                start = time.perf_counter()
                res = subprocess.run(
                    [args.runtime, "--root", str(root), "run", "--bundle", str(bundle), cid],
                    env=envs[arm],
                    capture_output=True,
                )
                took = (time.perf_counter() - start) * 1000
                subprocess.run(
                    ["runc", "--root", str(root), "delete", "-f", cid], capture_output=True
                )
                if res.returncode != 0:
                    sys.stderr.write(res.stderr.decode())
                    return 1
                if i:  # the first pair warms caches
                    times[arm].append(took)
        shutil.rmtree(root, ignore_errors=True)
    on, off = times["on"], times["off"]
    diffs = [a - b for a, b in zip(on, off, strict=True)]
    print(f"pairs: {len(on)}")
    print(f"run with the hook (on):   median {statistics.median(on):7.1f} ms")
    print(f"run without it (off):     median {statistics.median(off):7.1f} ms")
    print(f"per-pair difference:      median {statistics.median(diffs):+7.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
