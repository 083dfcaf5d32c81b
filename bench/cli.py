"""Benchmark the ``nvshim`` commands operators run in loops, beside a bare interpreter start.

Run as root (the simulated node uses mknod) from the repository root::

    python3 bench/cli.py --payload BEFORE --payload AFTER [--rounds 15]

Each ``--payload`` is a tree ``install.sh --payload DIR`` built (the self-contained runtime,
the way nodes run it): its ``nvshim`` command is run from DIR by rewriting the prefix in the
command's ``exec`` line, so nothing is installed. ``--command PATH`` adds an installed
``nvshim`` (a venv's, say) the same way. One temp dir holds a simulated 2-GPU node, a config
naming it (``driver-root``, ``cdi-spec-dirs``, ``grants-journal``), a CDI spec generated for it
and an empty grant journal; the config is compiled (``nvshim config compile``) as ``install.sh``
leaves it on a node. Every round runs each case once for every command, in turn, and
``python3 -I -S -c pass`` before them, so a busy machine slows all alike; the table gives each
median in ms and as a multiple of the bare start of the same run.

Cases: ``--version``, ``--help``, ``grants``, ``cdi list``, ``cdi generate --check`` (the spec
is current) and ``doctor`` (exit status not checked: this machine is no GPU node).
Nothing here asserts on time; this is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence

BARE = ["/usr/bin/python3", "-I", "-S", "-c", "pass"]
CASES = {
    "--version": ["--version"],
    "--help": ["--help"],
    "grants": ["grants"],
    "cdi list": ["cdi", "list"],
    "cdi generate --check": ["cdi", "generate", "--check", "{spec}", "--driver-root", "{node}"],
    "doctor": ["doctor"],
}


def payload_command(payload: str) -> List[str]:
    """The argv of DIR's ``nvshim`` command, with its prefix moved under DIR."""
    meta = dict(line.split("=", 1) for line in
                Path(payload, ".nvshim-payload").read_text().splitlines() if "=" in line)
    prefix, bindir = meta["prefix"], meta["bindir"]
    text = Path(payload + bindir, "nvshim").read_text()
    line = next(line for line in text.splitlines() if line.startswith("exec "))
    words = shlex.split(line.replace(prefix, payload + prefix))[1:]
    return [w for w in words if w != "$@"]


def run_ms(argv: Sequence[str], env: Dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env=env)
    return (time.perf_counter() - start) * 1000.0


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--payload", action="append", default=[], metavar="DIR")
    parser.add_argument("--command", action="append", default=[], metavar="PATH")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(list(argv) or None)
    commands = {f"payload {p}": payload_command(p) for p in args.payload}
    commands.update({c: [c] for c in args.command})
    if not commands:
        parser.error("give at least one --payload DIR or --command PATH")
    first = next(iter(commands.values()))
    with tempfile.TemporaryDirectory(prefix="nvshim-bench-cli.") as tmp:
        node, spec_dir = f"{tmp}/node", f"{tmp}/cdi"
        os.mkdir(spec_dir)
        config = Path(tmp, "config.yaml")
        config.write_text(f"driver-root: {node}\ncdi-spec-dirs: [{spec_dir}]\n"
                          f"grants-journal: {tmp}/grants.jsonl\n")
        Path(tmp, "grants.jsonl").write_text("")
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVSHIM_CONFIG": str(config),
               "COLUMNS": "80"}
        subprocess.run(first + ["--quiet", "sim", "create", node, "--gpus", "2"], env=env,
                       check=True)
        spec = f"{spec_dir}/nvidia.yaml"
        subprocess.run(first + ["cdi", "generate", "--driver-root", node, "--output", spec],
                       env=env, check=True)
        # compiled, as install.sh leaves a node's config: no YAML parser on these paths
        subprocess.run(first + ["config", "compile", "--config", str(config)], env=env,
                       check=True, capture_output=True)
        fill = {"{spec}": spec, "{node}": node}
        runs = {(name, case): [fill.get(a, a) for a in case_args]
                for name in commands for case, case_args in CASES.items()}
        samples: Dict[object, List[float]] = {"bare": []}
        for key in runs:
            samples[key] = []
        for _ in range(args.rounds):
            samples["bare"].append(run_ms(BARE, env))
            for (name, case), case_args in runs.items():
                samples[(name, case)].append(run_ms(commands[name] + case_args, env))
    bare = statistics.median(samples["bare"])
    print(f"python3 -I -S -c pass: {bare:.1f} ms (median of {args.rounds})")
    names = list(commands)
    print("| command | " + " | ".join(f"{n}: ms (× bare)" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for case in CASES:
        cells = []
        for name in names:
            ms = statistics.median(samples[(name, case)])
            cells.append(f"{ms:.1f} ({ms / bare:.1f}×)")
        print(f"| `nvshim {case}` | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
