"""The self-contained runtime beside a PyInstaller one-folder build of the same runtime.

Run as root from the repository root with the venv's interpreter (PyInstaller comes from
PyPI into a throw-away venv; nothing is installed on the machine)::

    .venv/bin/python bench/packaging.py [--runs 20]

It builds ``install.sh --payload`` (the cached test payload) and ``pyinstaller --onedir``
of ``nvshim.runtime.main`` from this checkout with the same CPython, then prints, for each:
size and file count, the newest glibc symbol version its ELF files need (the oldest glibc
a node may have), its ELF interpreter, a bare start (``pass``) and a 1-GPU ``create`` on a
simulated node (``runtimes: [/bin/true]``, plan cache fresh): the first run of a freshly
copied tree, then the median and minimum of ``--runs`` alternating runs, each on a fresh
bundle. docs/architecture.md ("Alternatives considered") records the outcome.

Nothing here asserts on time; this is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ENTRY = "from nvshim.runtime.main import main\nmain()\n"


def build_pyinstaller(work: Path, python: str) -> Dict[str, Path]:
    """A throw-away venv with PyInstaller and this checkout; the runtime and a bare app."""
    venv = work / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "pyinstaller", str(REPO)], check=True)
    out = {}
    for name, code in (("nvshim-runtime", ENTRY), ("bare", "pass\n")):
        (work / f"{name}.py").write_text(code)
        subprocess.run(
            [
                str(venv / "bin" / "pyinstaller"),
                "--onedir",
                "--noconfirm",
                "--log-level",
                "WARN",
                "--name",
                name,
                "--distpath",
                str(work / "dist"),
                "--workpath",
                str(work / "build"),
                "--specpath",
                str(work),
                str(work / f"{name}.py"),
            ],
            check=True,
        )
        out[name] = work / "dist" / name
    return out


def tree_facts(top: Path) -> Dict[str, str]:
    files = [p for p in top.rglob("*") if p.is_file() and not p.is_symlink()]
    size = sum(p.stat().st_size for p in files)
    versions = set()
    interp = ""
    for p in files:
        with open(p, "rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
        res = subprocess.run(
            ["readelf", "-V", "-l", "--wide", str(p)], capture_output=True, text=True
        )
        versions |= set(re.findall(r"GLIBC_(\d+\.\d+(?:\.\d+)?)", res.stdout))
        found = re.search(r"program interpreter: ([^\]]+)\]", res.stdout)
        interp = interp or (found.group(1) if found else "")
    newest = max(versions, key=lambda v: tuple(int(x) for x in v.split(".")), default="-")
    # a tree that ships libc.so.6 and its loader is started through them (the node's glibc
    # does not matter); one that does not runs on the node's, which must be this new
    bundled = any(p.name == "libc.so.6" for p in files)
    return {
        "size": f"{size / 1e6:.0f} MB",
        "files": str(len(files)),
        "node glibc": f"any (bundles glibc {newest} and its loader)"
        if bundled
        else f">= {newest} (through {interp or '?'})",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--python", default=os.environ.get("NVSHIM_PYTHON", "/usr/bin/python3"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("packaging.py: run as root (the simulated node makes device nodes)")
    from nvshim._preload import FILE_NAME
    from nvshim.node.install.prefix import launch_argv
    from nvshim.sim.build import create_node
    from tests.helpers.bundle import make_bundle, make_rootfs
    from tests.helpers.payload import payload_dir

    with tempfile.TemporaryDirectory(prefix="nvshim-packaging-") as tmp_name:
        tmp = Path(tmp_name)
        built = build_pyinstaller(tmp / "pyi", args.python)
        node = create_node(str(tmp / "node"), gpus=2)
        cfg = tmp / "nvshim" / "config.yaml"
        cfg.parent.mkdir()
        cfg.write_text(f"runtimes: [/bin/true]\ndriver-root: {node.root}\ngrants-journal: null\n")
        subprocess.run(
            [
                sys.executable,
                "-I",
                "-m",
                "nvshim.cli.main",
                "config",
                "compile",
                "--config",
                str(cfg),
            ],
            check=True,
            capture_output=True,
        )
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVSHIM_CONFIG": str(cfg)}
        # fresh copies: the first create is the first run of a tree just installed
        pyi = tmp / "pyi-installed"
        shutil.copytree(built["nvshim-runtime"], pyi, symlinks=True)
        sc = tmp / "sc-installed"
        shutil.copytree(payload_dir() / "opt" / "nvshim", sc, symlinks=True)
        site = str(sc / "site")
        boot = (
            f"import sys; sys.path[0:0] = [{site!r}]; import nvshim._preload as p; "
            f"p.install({site + '/' + FILE_NAME!r}); "
        )
        kinds = {
            "self-contained (install.sh --payload)": (
                sc,
                [
                    *launch_argv(str(sc)),
                    "-I",
                    "-S",
                    "-c",
                    boot + "from nvshim.runtime.main import main; main()",
                ],
                [*launch_argv(str(sc)), "-I", "-S", "-c", "pass"],
            ),
            "PyInstaller --onedir": (
                pyi,
                [str(pyi / "nvshim-runtime")],
                [str(built["bare"] / "bare")],
            ),
        }
        count = 0

        def create(argv: List[str]) -> float:
            nonlocal count
            count += 1
            bundle = make_bundle(
                tmp / f"b{count}",
                make_rootfs(tmp / f"r{count}"),
                ["true"],
                env={"NVIDIA_VISIBLE_DEVICES": "0"},
            )
            t0 = time.perf_counter()
            res = subprocess.run(
                [*argv, "create", "--bundle", str(bundle), f"c{count}"],
                env=env,
                cwd=bundle,
                capture_output=True,
                text=True,
            )
            took = time.perf_counter() - t0
            assert res.returncode == 0, res.stderr[-1500:]
            spec = json.loads((bundle / "config.json").read_text())
            assert "/dev/nvidia0" in [d["path"] for d in spec["linux"]["devices"]]
            shutil.rmtree(bundle)
            shutil.rmtree(tmp / f"r{count}")
            return took

        def start(argv: List[str]) -> float:
            t0 = time.perf_counter()
            subprocess.run(argv, check=True, env=env)
            return time.perf_counter() - t0

        first = {name: create(k[1]) for name, k in kinds.items()}
        warm: Dict[str, List[float]] = {name: [] for name in kinds}
        bare: Dict[str, List[float]] = {name: [] for name in kinds}
        for i in range(args.runs):
            for name in list(kinds) if i % 2 else list(reversed(kinds)):
                warm[name].append(create(kinds[name][1]))
                bare[name].append(start(kinds[name][2]))
        for name, (top, _, _) in kinds.items():
            facts = tree_facts(top)
            print(
                f"{name}: {facts['size']}, {facts['files']} files, node glibc {facts['node glibc']}"
            )
            print(
                f"  bare start {statistics.median(bare[name]) * 1e3:.1f} ms "
                f"[min {min(bare[name]) * 1e3:.1f}]; 1-GPU create: first "
                f"{first[name] * 1e3:.1f} ms, then {statistics.median(warm[name]) * 1e3:.1f} "
                f"[min {min(warm[name]) * 1e3:.1f}] ({args.runs} runs)"
            )


if __name__ == "__main__":
    main()
