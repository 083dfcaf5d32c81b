"""What a GPU create would cost with the driver in one tree prepared on the host, and no
in-root work (issue 44 item 5): the layout GKE nodes use and NVIDIA's CUDA images expect.

Run as root from the repository root with the installed venv's interpreter::

    /opt/nvshim/venv/bin/python bench/layout.py [--pairs 30] [--out bench/layout-results.json]

For each bundle (``1``: a 1-GPU busybox container; ``1+image``: the same with an image's
libraries and ld.so.cache, as ``bench/run.py`` makes them) it takes the config.json
nvshim's create writes (one untimed in-process create on a simulated 8-GPU node) and times,
every round, in an order rotated each round, ``runc create`` + ``delete`` of:

* ``runc``: the engine's config.json (no GPU): the baseline;
* ``today``: nvshim's config.json (device nodes, cgroup rules, one bind mount per driver
  file, the params hook): the floor of today's create, on a fresh rootfs. Neither the
  runtime nor its in-root work (the SONAME links and the merged ld.so.cache, which the
  runtime or the agent makes in the rootfs before runc: ``bench/inroot.py`` times it) is
  counted here;
* ``layout``: the same config.json with every driver library and program mount and the
  hook replaced by two read-only bind mounts of a tree made once per driver on the host
  (``<tmp>/driver/{lib64,bin}``: the driver's files hard-linked or copied, their SONAME
  links made there) at ``/usr/local/nvidia/{lib64,bin}``, and the variables CUDA
  images set (``LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64``,
  ``/usr/local/nvidia/bin`` first on ``PATH``); nothing is written in the rootfs.

Each create meets a fresh rootfs (``bench/run.py``'s restore). Before timing, one
``layout`` container is run to show what its process sees: the libraries and their links
under ``/usr/local/nvidia/lib64``, resolved inside the container. Prints the medians and
the per-round differences (layout against today, both against runc), the mounts and hooks
each config.json has, and writes them to ``--out``. Nothing here asserts on time; what
the layout breaks is in docs/benchmarks-history.md, beside its figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.run import Bench, Floor, summary, timed  # noqa: E402

#: Where the prepared tree goes in the container, as GKE and NVIDIA's CUDA images have it.
TOP = "/usr/local/nvidia"
CUDA_LIBRARY_PATH = "/usr/local/nvidia/lib:/usr/local/nvidia/lib64"


def _is_library(dest: str) -> bool:
    return os.path.basename(dest).startswith("lib") and ".so" in os.path.basename(dest)


def _is_program(dest: str) -> bool:
    return os.path.dirname(dest) in ("/usr/bin", "/bin", "/usr/sbin", "/sbin")


def layout_config(
    spec: Dict[str, Any], driver_root: str, tree: Path
) -> Tuple[Dict[str, Any], Dict[str, int]]:
    """``spec`` (nvshim's config.json) rewritten to the prepared-tree layout, the tree made
    at ``tree``; and what was taken out and put in."""
    from nvshim.runtime.hookargs import runs_nvshim_hook

    lib, bin_ = tree / "lib64", tree / "bin"
    lib.mkdir(parents=True, exist_ok=True)
    bin_.mkdir(parents=True, exist_ok=True)
    kept: List[Dict[str, Any]] = []
    moved = {"library_mounts": 0, "program_mounts": 0, "hooks": 0, "links": 0}
    for mount in spec.get("mounts", []):
        source, dest = mount.get("source", ""), mount.get("destination", "")
        into = None
        if source.startswith(driver_root.rstrip("/") + "/") and os.path.isfile(source):
            if _is_library(dest):
                into, key = lib, "library_mounts"
            elif _is_program(dest):
                into, key = bin_, "program_mounts"
        if into is None:
            kept.append(mount)
            continue
        target = into / os.path.basename(dest)
        if not target.exists():
            try:
                os.link(source, target)
            except OSError:
                shutil.copy2(source, target)
        moved[key] += 1
    from nvshim.host.elf import read_soname

    for path in sorted(lib.iterdir()):
        if path.is_symlink():
            continue
        soname = read_soname(str(path))
        if soname and soname != path.name and not (lib / soname).exists():
            os.symlink(path.name, lib / soname)  # what ldconfig (and nvshim's in-root
            moved["links"] += 1  # work) makes in the container today, made once here
    hooks = dict(spec.get("hooks", {}))
    created = []
    for hook in hooks.get("createContainer", []):
        if runs_nvshim_hook(hook.get("args", [])):
            moved["hooks"] += 1  # the links and the cache: nothing of it is needed now
        else:
            created.append(hook)  # the params hook (ModifyDeviceFiles) stays
    hooks["createContainer"] = created
    hooks = {k: v for k, v in hooks.items() if v}
    out = dict(spec)
    out["mounts"] = kept + [
        {
            "destination": f"{TOP}/{name}",
            "type": "bind",
            "source": str(tree / name),
            "options": ["rbind", "ro", "nosuid", "nodev"],
        }
        for name in ("lib64", "bin")
    ]
    if hooks:
        out["hooks"] = hooks
    else:
        out.pop("hooks", None)
    process = dict(out["process"])
    env = [e for e in process.get("env", []) if not e.startswith(("LD_LIBRARY_PATH=", "PATH="))]
    path = next((e[5:] for e in process.get("env", []) if e.startswith("PATH=")), "/usr/bin:/bin")
    process["env"] = env + [f"LD_LIBRARY_PATH={CUDA_LIBRARY_PATH}", f"PATH={TOP}/bin:{path}"]
    out["process"] = process
    return out, moved


def _counts(spec: Dict[str, Any]) -> Dict[str, int]:
    return {
        "mounts": len(spec.get("mounts", [])),
        "devices": len(spec.get("linux", {}).get("devices", [])),
        "hooks": sum(len(v) for v in spec.get("hooks", {}).values()),
    }


def _seen(b: Bench, key: str, layout: Floor) -> str:
    """What a layout container's process sees under the tree (``runc run``)."""
    spec = json.loads(layout.config)
    spec["process"] = dict(spec["process"], args=["sh", "-c", f"ls -lL {TOP}/lib64 | head -5"])
    b.restore(key, Floor(json.dumps(spec).encode(), layout.files))
    ran = subprocess.run(
        b.rt(b.runc, "run", "--bundle", str(b.bundles[key]), b.cid("seen")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return (ran.stdout + ran.stderr).strip()


def case(b: Bench, key: str, pairs: int) -> Dict[str, Any]:
    """One bundle: its configs, what a layout container sees, and the timed rounds."""
    cid = b.cid(f"w{key}")
    b.create(b.runtime, key, cid)
    today = b.floor(key)
    b.delete(b.runc, cid, force=True)
    spec = json.loads(today.config)
    tree = b.work / f"driver-{key}"
    layout_spec, moved = layout_config(spec, b.node.root, tree)
    layout = Floor(json.dumps(layout_spec).encode(), today.files)
    seen = _seen(b, key, layout)
    samples: Dict[str, List[float]] = {"runc": [], "today": [], "layout": []}

    def run(label: str) -> None:
        floor = {"runc": None, "today": today, "layout": layout}[label]
        cid = b.cid(f"{label[0]}{key}")
        b.restore(key, floor)
        b.live.append(cid)
        c, _, _ = timed(b.rt(b.runc, "create", "--bundle", str(b.bundles[key]), cid), env=b.env)
        d = b.delete(b.runc, cid)
        samples[label].append(c + d[0])

    order = ["runc", "today", "layout"]
    for i in range(pairs):
        for label in order[i % 3 :] + order[: i % 3]:
            run(label)
    b.restore(key)

    def diff(a: str, z: str) -> float:
        return statistics.median(y - x for x, y in zip(samples[a], samples[z], strict=True))

    return {
        "bundle": key,
        "configs": {
            "runc": _counts(json.loads(b.originals[key])),
            "today": _counts(spec),
            "layout": _counts(layout_spec),
        },
        "moved": moved,
        "seen": seen,
        "ms": {k: summary(v) for k, v in samples.items()},
        "today_over_runc_ms": diff("runc", "today"),
        "layout_over_runc_ms": diff("runc", "layout"),
        "layout_over_today_ms": diff("today", "layout"),
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=30, help="rounds per bundle")
    parser.add_argument("--runc", default=shutil.which("runc") or "/usr/sbin/runc")
    parser.add_argument("--out", default=str(REPO / "bench" / "layout-results.json"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/layout.py: needs root (runc containers)", file=sys.stderr)
        return 1
    from bench.run import _agent_runtime

    results: Dict[str, Any] = {
        "pairs": args.pairs,
        "load_before": os.getloadavg(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cases": [],
    }
    with tempfile.TemporaryDirectory(prefix="nvshim-bench-layout-") as tmp:
        b = Bench(Path(tmp), "", args.runc, [sys.executable, "-I", "-m", "nvshim.cli.main"])
        agents: List[subprocess.Popen[bytes]] = []
        try:
            b.setup()
            _fast, alone, agents = _agent_runtime(b)
            b.runtime = alone  # the in-process create writes the same config.json
            for key in ("1", "1+image"):
                if key in b.bundles:
                    results["cases"].append(case(b, key, args.pairs))
        finally:
            b.cleanup()
            for agent in agents:
                agent.terminate()
                agent.wait(30)
    results["load_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"{args.pairs} rounds per bundle, order rotated; load {results['load_before'][0]:.2f}")
    for c in results["cases"]:
        print(f"bundle {c['bundle']}: config.json mounts/devices/hooks {c['configs']}")
        print(f"  moved into the tree: {c['moved']}")
        for label in ("runc", "today", "layout"):
            print(f"  {label:7} create+delete median {c['ms'][label]['median']:.1f} ms")
        print(
            f"  today over runc {c['today_over_runc_ms']:+.1f} ms, layout over runc "
            f"{c['layout_over_runc_ms']:+.1f} ms, layout over today "
            f"{c['layout_over_today_ms']:+.1f} ms (per-round medians)"
        )
        print("  a layout container sees:\n    " + c["seen"].replace("\n", "\n    "))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
