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

Then the big nodes (issue 44 item 7), beside NVIDIA's ``nvidia-ctk`` (``--nvidia-ctk PATH``;
by default the one ``tests/go/nvidia-toolkit`` builds, from the tests' cache): for each
``--gpus`` count (8 and 256), a simulated node, the spec the first command generates for
it in a spec dir, and a config naming that dir, compiled (so it has a CDI index). Each
round runs, for every command, ``cdi generate --output`` (a fresh file), ``cdi list
--spec-dir DIR`` (no index) and ``cdi list`` (the config's dirs, through the index), and
``nvidia-ctk cdi list --spec-dir DIR`` on the same files, and the bare interpreter start,
interleaved. The table gives medians and each ``cdi list`` as a multiple of nvidia-ctk's
in the same run; the lines after it say whether item 7's targets hold (``cdi generate``
under 100 ms for 256 GPUs; ``cdi list``, indexed or not, no slower than nvidia-ctk's).
Building nvidia-ctk needs the tests' helpers: run with the dev venv's python, or pass
``--nvidia-ctk``; ``--gpus ''`` skips this part.
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
from typing import Dict, List, Sequence, Tuple

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
    meta = dict(
        line.split("=", 1)
        for line in Path(payload, ".nvshim-payload").read_text().splitlines()
        if "=" in line
    )
    prefix, bindir = meta["prefix"], meta["bindir"]
    text = Path(payload + bindir, "nvshim").read_text()
    line = next(line for line in text.splitlines() if line.startswith("exec "))
    words = shlex.split(line.replace(prefix, payload + prefix))[1:]
    return [w for w in words if w != "$@"]


def run_ms(argv: Sequence[str], env: Dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    return (time.perf_counter() - start) * 1000.0


def default_nvidia_ctk() -> str:
    """The nvidia-ctk ``tests/go/nvidia-toolkit`` builds (built now unless cached); "" when
    there is no Go toolchain to build it."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    try:
        from tests.helpers.gobuild import go_programs

        return str(go_programs("nvidia-toolkit") / "nvidia-ctk")
    except BaseException as exc:  # pytest.skip (no Go) is no Exception
        print(f"no nvidia-ctk: {exc}")
        return ""


#: Item 7's target for ``cdi generate`` on a node of BIG_NODE GPUs: under this many ms.
GENERATE_TARGET_MS = 100.0
BIG_NODE = 256


def big_nodes(
    commands: Dict[str, List[str]],
    ctk: str,
    counts: Sequence[int],
    rounds: int,
    base_env: Dict[str, str],
) -> None:
    """Item 7: ``cdi generate`` and ``cdi list`` on nodes of ``counts`` GPUs beside
    nvidia-ctk, interleaved rounds; prints the table and whether the targets hold."""
    first = next(iter(commands.values()))
    with tempfile.TemporaryDirectory(prefix="nvshim-bench-cli-nodes.") as tmp:
        runs: Dict[Tuple[int, str, str], List[str]] = {}
        envs: Dict[int, Dict[str, str]] = {0: base_env}  # by GPU count (0: the bare start)
        for n in counts:
            node, spec_dir, config = f"{tmp}/node{n}", f"{tmp}/cdi{n}", Path(tmp, f"c{n}.yaml")
            os.mkdir(spec_dir)
            config.write_text(f"driver-root: {node}\ncdi-spec-dirs: [{spec_dir}]\n")
            env = envs[n] = dict(base_env, NVSHIM_CONFIG=str(config))
            subprocess.run(
                first + ["--quiet", "sim", "create", node, "--gpus", str(n)], env=env, check=True
            )
            subprocess.run(
                first
                + ["cdi", "generate", "--driver-root", node, "--output", f"{spec_dir}/nvidia.yaml"],
                env=env,
                check=True,
            )
            subprocess.run(
                first + ["config", "compile", "--config", str(config)],
                env=env,
                check=True,
                capture_output=True,
            )
            for name, argv in commands.items():
                out = f"{tmp}/out{n}-{len(runs)}.yaml"
                runs[(n, name, "generate")] = argv + [
                    "cdi",
                    "generate",
                    "--driver-root",
                    node,
                    "--output",
                    out,
                ]
                runs[(n, name, "list --spec-dir")] = argv + ["cdi", "list", "--spec-dir", spec_dir]
                runs[(n, name, "list (indexed)")] = argv + ["cdi", "list"]
            if ctk:
                runs[(n, "nvidia-ctk", "list --spec-dir")] = [
                    ctk,
                    "cdi",
                    "list",
                    "--spec-dir",
                    spec_dir,
                ]
        runs[(0, "bare", "")] = BARE
        samples: Dict[Tuple[int, str, str], List[float]] = {key: [] for key in runs}
        for _ in range(rounds):
            for key, argv in runs.items():
                if key[2] == "generate":  # a fresh file each time: generate writes it
                    try:
                        os.unlink(argv[-1])
                    except FileNotFoundError:
                        pass
                samples[key].append(run_ms(argv, envs[key[0]]))
    med = {key: statistics.median(values) for key, values in samples.items()}
    print(
        f"\nBig nodes (issue 44 item 7), medians of {rounds} interleaved rounds "
        f"(python3 -I -S -c pass: {med[(0, 'bare', '')]:.1f} ms, the floor of any nvshim "
        "command):"
    )
    print(
        "| GPUs | command | `cdi generate` ms | `cdi list --spec-dir` ms (× nvidia-ctk) "
        "| `cdi list` indexed ms (× nvidia-ctk) |"
    )
    print("|---|---|---|---|---|")
    verdicts = []
    for n in counts:
        ref = med.get((n, "nvidia-ctk", "list --spec-dir"))
        if ref is not None:
            print(f"| {n} | `nvidia-ctk` | – | {ref:.1f} (1.0×) | – |")
        for name in commands:
            gen = med[(n, name, "generate")]
            cells = []
            for case in ("list --spec-dir", "list (indexed)"):
                ms = med[(n, name, case)]
                cells.append(f"{ms:.1f}" + (f" ({ms / ref:.2f}×)" if ref else ""))
                if ref:
                    verdicts.append(
                        (
                            f"{name}: `cdi {case}` on {n} GPUs no slower than "
                            f"nvidia-ctk ({ms:.1f} vs {ref:.1f} ms)",
                            ms <= ref,
                        )
                    )
            if n >= BIG_NODE:
                verdicts.append(
                    (
                        f"{name}: `cdi generate` on {n} GPUs under "
                        f"{GENERATE_TARGET_MS:.0f} ms ({gen:.1f} ms)",
                        gen < GENERATE_TARGET_MS,
                    )
                )
            print(f"| {n} | {name} | {gen:.1f} | " + " | ".join(cells) + " |")
    for text, held in verdicts:
        print(f"{'holds' if held else 'FAILS'}: {text}")


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--payload", action="append", default=[], metavar="DIR")
    parser.add_argument("--command", action="append", default=[], metavar="PATH")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--gpus",
        default="8,256",
        metavar="N,N",
        help="GPU counts of the big-node part (empty: skip it)",
    )
    parser.add_argument(
        "--nvidia-ctk",
        default=None,
        metavar="PATH",
        help="nvidia-ctk to compare with (default: tests/go's build)",
    )
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
        config.write_text(
            f"driver-root: {node}\ncdi-spec-dirs: [{spec_dir}]\n"
            f"grants-journal: {tmp}/grants.jsonl\n"
        )
        Path(tmp, "grants.jsonl").write_text("")
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "NVSHIM_CONFIG": str(config),
            "COLUMNS": "80",
        }
        subprocess.run(
            first + ["--quiet", "sim", "create", node, "--gpus", "2"], env=env, check=True
        )
        spec = f"{spec_dir}/nvidia.yaml"
        subprocess.run(
            first + ["cdi", "generate", "--driver-root", node, "--output", spec],
            env=env,
            check=True,
        )
        # compiled, as install.sh leaves a node's config: no YAML parser on these paths
        subprocess.run(
            first + ["config", "compile", "--config", str(config)],
            env=env,
            check=True,
            capture_output=True,
        )
        fill = {"{spec}": spec, "{node}": node}
        runs = {
            (name, case): [fill.get(a, a) for a in case_args]
            for name in commands
            for case, case_args in CASES.items()
        }
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
    counts = [int(n) for n in args.gpus.split(",") if n]
    if counts:
        ctk = args.nvidia_ctk if args.nvidia_ctk is not None else default_nvidia_ctk()
        big_nodes(
            commands,
            ctk,
            counts,
            args.rounds,
            {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "COLUMNS": "80"},
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
