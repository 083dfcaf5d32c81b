"""What one createContainer hook costs runc's create, whatever the hook is.

Run as root from the repository root with a venv that has nvshim and the test extras::

    .venv/bin/python bench/hookcost.py [--pairs 40] [--runc PATH]

A busybox bundle (tests/helpers/bundle.py) is created and deleted with runc, its
config.json taking turns, the order flipped every round:

- ``none``: no hook;
- ``sh``: nvshim's params hook as a GPU create carries it (``/bin/sh -c`` the script of
  :data:`nvshim.runtime.devparams.HOOK_SCRIPT`, on a node without ``/proc/driver/nvidia``
  it leaves at its first ``cd``, as it does on this VM);
- ``static``: a statically linked program that returns 0 at once (built here with ``cc
  -static``; skipped when there is no C compiler), the least any hook can be.

Printed: the median ``runc create`` wall time of each, and the median per-round difference
from ``none``. The question it answers (issue 34): would a compiled params hook make a GPU
create cheaper? Only if ``static`` comes out clearly below ``sh``. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def static_true(where: Path) -> Optional[str]:
    """A static ``return 0`` program in ``where``; None without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    source, binary = where / "true.c", where / "static-true"
    source.write_text("int main(void) { return 0; }\n")
    res = subprocess.run(
        [cc, "-O2", "-static", "-o", str(binary), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    return str(binary) if res.returncode == 0 else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--runc", default=shutil.which("runc") or "/usr/sbin/runc")
    args = parser.parse_args()
    from nvshim.runtime.devparams import HOOK_SCRIPT
    from tests.helpers.bundle import make_rootfs

    with tempfile.TemporaryDirectory(prefix="nvshim-bench-hook-") as tmp:
        base = Path(tmp)
        bundle = base / "bundle"
        bundle.mkdir()
        make_rootfs(bundle / "rootfs")
        subprocess.run([args.runc, "spec"], cwd=bundle, check=True)
        spec: Dict[str, Any] = json.loads((bundle / "config.json").read_text())
        spec["process"]["terminal"] = False
        spec["process"]["args"] = ["true"]
        hooks: Dict[str, Optional[Dict[str, Any]]] = {
            "none": None,
            "sh": {
                "path": "/bin/sh",
                "args": [
                    "sh",
                    "-c",
                    HOOK_SCRIPT,
                    "nvshim-params",
                    str(bundle / "rootfs"),
                    str(bundle / ".nvshim-nvidia-params"),
                ],
            },
        }
        binary = static_true(base)
        if binary is not None:
            hooks["static"] = {"path": binary, "args": ["static-true"]}
        times: Dict[str, List[float]] = {k: [] for k in hooks}
        for i in range(args.pairs):
            for name in list(hooks) if i % 2 == 0 else list(hooks)[::-1]:
                variant = copy.deepcopy(spec)
                hook = hooks[name]
                if hook is not None:
                    variant["hooks"] = {"createContainer": [hook]}
                (bundle / "config.json").write_text(json.dumps(variant))
                cid = f"nvshim-bench-hook-{i}-{name}"
                t0 = time.perf_counter()
                subprocess.run(
                    [args.runc, "create", cid],
                    cwd=bundle,
                    check=True,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                )
                times[name].append((time.perf_counter() - t0) * 1e3)
                subprocess.run([args.runc, "delete", "-f", cid], check=True)
    print(f"{args.pairs} rounds; runc create, ms: median; +ms: median per-round difference")
    for name, values in times.items():
        diff = statistics.median(a - b for a, b in zip(values, times["none"], strict=True))
        print(f"  {name:8} {statistics.median(values):8.2f}  {diff:+7.2f}")
    if "static" not in times:
        print("  static: skipped (no C compiler)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
