"""The in-process GPU create of two revisions of nvshim, side by side in one run.

Run as root from the repository root with the installed venv's interpreter::

    /opt/nvshim/venv/bin/python bench/trees.py --before REV [--after REV] [--pairs 60]
        [--cases 1,cdi]

Each revision (``--after`` defaults to this checkout's working tree) is exported with
``git archive`` into a temporary folder, compiles its own copy of the same config with its
own CLI (a compiled config's format belongs to its revision), and gets a trampoline
rendered by its own ``render`` (the module moved with issue 36: both places are tried),
with an agent socket nobody serves, so every create is the in-process path: the
interpreter starts, imports and plans. The low-level runtime is ``/bin/true``, as in
``bench/run.py``'s ``shim stage`` rows: what nvshim itself costs. Bundles, simulated node
and CDI spec are ``bench/run.py``'s; before every create its bundle is restored as an
engine makes it. Pairs alternate the two trees, the order flipped every pair. Prints each
tree's median wall and CPU ms and the median per-pair difference (after - before).
Nothing here asserts on time; this is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.run import Bench, paired, timed  # noqa: E402

RENDER = """
import sys
sys.path[0:0] = [sys.argv[1]]
try:
    from nvshim.node.install.trampoline import render
except ImportError:
    from nvshim.node.trampoline import render
import inspect
extra = {}
if "agent_socket" in inspect.signature(render).parameters:  # a tree with the agent
    extra["agent_socket"] = sys.argv[4]
print(render(sys.executable, paths=[sys.argv[1], sys.argv[2]], config=sys.argv[3], **extra),
      end="")
"""


def export(rev: str, dest: Path) -> Path:
    """``rev`` of this repository (``""``: the working tree's nvshim/) unpacked at ``dest``."""
    dest.mkdir(parents=True)
    if not rev:
        subprocess.run(["cp", "-a", str(REPO / "nvshim"), str(dest)], check=True)
        return dest
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "nvshim"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def prepare(b: Bench, name: str, rev: str) -> Dict[str, str]:
    """The tree of ``rev``: its compiled config and trampoline; the env its creates get."""
    tree = export(rev, b.work / f"tree-{name}")
    site = sysconfig.get_paths()["purelib"]
    cfg = b.work / f"{name}.yaml"
    cfg.write_text(
        (b.work / "nvshim" / "noop.yaml")
        .read_text()
        .replace("noop-grants.jsonl", f"{name}-grants.jsonl")
    )
    compile_code = (
        "import sys; sys.path[0:0] = [sys.argv.pop(1)]; from nvshim.cli.main import main; main()"
    )
    subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            compile_code,
            str(tree),
            "config",
            "compile",
            "--config",
            str(cfg),
        ],
        check=True,
        capture_output=True,
    )
    script = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            RENDER,
            str(tree),
            site,
            str(cfg),
            str(b.work / "nobody.sock"),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    tramp = b.work / f"nvshim-runtime-{name}"
    tramp.write_text(script)
    tramp.chmod(0o755)
    env = dict(b.noop_env, NVSHIM_CONFIG=str(cfg))
    return {"tramp": str(tramp), **{f"env:{k}": v for k, v in env.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="a git revision")
    parser.add_argument("--after", default="", help="a git revision (default: working tree)")
    parser.add_argument("--pairs", type=int, default=60)
    parser.add_argument("--cases", default="1,cdi")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/trees.py: needs root (runc bundles, mknod)", file=sys.stderr)
        return 1
    cli = [sys.executable, "-I", "-m", "nvshim.cli.main"]
    with tempfile.TemporaryDirectory(prefix="nvshim-bench-trees-") as tmp:
        b = Bench(Path(tmp), "", "/bin/true", cli)
        b.setup()
        trees = {
            name: prepare(b, name, rev)
            for name, rev in (("before", args.before), ("after", args.after))
        }

        def create(name: str, key: str) -> tuple:
            tree = trees[name]
            env = {k[4:]: v for k, v in tree.items() if k.startswith("env:")}
            b.restore(key)
            ms, _, cpu = timed(
                [tree["tramp"], "create", "--bundle", str(b.bundles[key]), b.cid(name)], env=env
            )
            return ms, cpu

        rows: List[str] = []
        for key in args.cases.split(","):
            for name in trees:  # one untimed create each: caches warm, both trees work
                create(name, key)
            r = paired(
                key,
                args.pairs,
                lambda i, k=key: create("before", k),
                lambda i, k=key: create("after", k),
            )
            rows.append(
                f"shim stage gpu={key:<4} before {r['runc_ms']['median']:6.2f} ms "
                f"(cpu {r['runc_cpu_ms']['median']:5.2f})  after "
                f"{r['nvshim_ms']['median']:6.2f} ms (cpu "
                f"{r['nvshim_cpu_ms']['median']:5.2f})  per pair "
                f"{r['overhead_ms_median']:+.2f} ms (cpu "
                f"{r['cpu_overhead_ms_median']:+.2f})"
            )
        load = os.getloadavg()[0]
        print(
            f"{args.pairs} pairs per case, order flipped each pair; before "
            f"{args.before}, after {args.after or 'the working tree'}; load {load:.2f}"
        )
        print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
