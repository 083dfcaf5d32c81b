"""BENCHMARKS.md's current figures, rewritten from the benches' result files.

Run from the repository root after the benches you re-measured (each writes its JSON into
``bench/``; none needs this script)::

    python bench/table.py [--results bench] [--file BENCHMARKS.md] [--check]

The table between the ``current-figures`` markers of BENCHMARKS.md is the one home of
every figure nvshim's docs and docstrings lean on: they name a row by its key (``figures:
`python.start```) instead of restating its value. Each row says when, on what and under
what load it was measured, and by which command. A row whose bench left a result file is
rewritten from it; a row whose bench did not run keeps its line as it stands, date and
conditions included; a row no bench writes (a figure measured by hand, say on a real GPU
node) is kept as written. ``--check`` rewrites nothing and exits 1 when the file is not
what the result files make it.

Sources (result file: the command that writes it):

- ``results.json``: ``bench/run.py --agent --cases state,delete,create``
- ``gocompare-results.json``: ``bench/gocompare.py``
- ``nri-results.json``: ``bench/nri.py``
- ``agent-results.json``: ``bench/agent.py``
- ``figures-results.json``: ``bench/figures.py``
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
BEGIN = "<!-- current-figures: begin (bench/table.py rewrites this block) -->"
END = "<!-- current-figures: end -->"
HEAD = "| key | figure | value | measured (when, where, load, how many) |\n|---|---|---|---|"

Row = Tuple[str, str, str]
"""(key, what the figure is, its value)."""


# --------------------------------------------------------------------------- conditions


def _when(date: str, nproc: Any, load: Optional[List[float]], sample: str, by: str) -> str:
    """The measured column: day and time, the machine's CPUs, the load, samples, command."""
    day = date.replace("T", " ")[:16] + " UTC" if date else "?"
    load_text = f"load {load[0]:.1f}" if load else "load not recorded"
    return f"{day}, {nproc} vCPU, {load_text}, {sample}; `{by}`"


def _load(results: Dict[str, Any]) -> Optional[List[float]]:
    before, after = results.get("load_before"), results.get("load_after")
    if before and after:
        return [max(before[0], after[0])]
    return before or after or results.get("load")


def _ms(x: float) -> str:
    return f"{x:.1f} ms"


def _plus(x: float) -> str:
    return f"{x:+.1f} ms".replace("-", "−")


# --------------------------------------------------------------------------- sources


#: bench/run.py's create cases, in words.
GPU_CASES = {
    "none": "no GPU request",
    "1": "1 GPU (`NVIDIA_VISIBLE_DEVICES=0`)",
    "8": "8 GPUs (`=all`)",
    "cdi": "1 GPU by CDI name",
    "1+image": "1 GPU, the rootfs holding an image's 300 libraries and ld.so.cache",
}


def rows_run(r: Dict[str, Any]) -> Tuple[List[Row], str]:
    """bench/run.py: each create case against runc and its floor; the passthroughs."""
    rows: List[Row] = []
    for case in r["cases"]:
        name = case["case"]
        if name.startswith("create+delete gpu="):
            gpu = name.split("=", 1)[1]
            value = (
                f"runc {_ms(case['runc_ms']['median'])}; nvshim-runtime "
                f"{_plus(case['overhead_ms_median'])} ({case['ratio_median']:.2f}×)"
            )
            if "floor_ms" in case:
                value += (
                    f"; floor {_plus(case['floor_over_runc_ms_median'])}; over its "
                    f"floor {_plus(case['over_floor_ms_median'])}"
                )
            rows.append(
                (
                    f"create.gpu={gpu}",
                    f"create+delete, {GPU_CASES.get(gpu, gpu)}, "
                    "through the fast path, over runc, per pair",
                    value,
                )
            )
        elif name.startswith(("state", "delete")):
            key = "passthrough." + name.split()[0]
            rows.append(
                (
                    key,
                    f"`{name.split()[0]}` through the trampoline, over runc's",
                    _plus(case["overhead_ms_median"]),
                )
            )
    m = r["machine"]
    return rows, _when(
        m.get("date_utc", ""),
        m.get("nproc"),
        _load(r),
        f"{r['pairs']} pairs",
        "bench/run.py --agent",
    )


GO_NAMES = {
    "nvshim fast": "fast",
    "nvshim fast cdi": "fast-cdi",
    "nvshim in-process": "in-process",
    "go cdi": "nvidia",
}


def rows_gocompare(r: Dict[str, Any]) -> Tuple[List[Row], str]:
    """bench/gocompare.py: each runtime over runc and over its own floor; nvshim / Go."""
    rows: List[Row] = []
    subj = r["subjects"]
    rows.append(
        (
            "go.runc",
            "runc create+delete of the 1-GPU bundle (the baseline)",
            _ms(subj["runc"]["lifecycle_ms"]),
        )
    )
    for name, slug in GO_NAMES.items():
        s = subj[name]
        value = f"{_plus(s['lifecycle_added_ms'])} ({s['lifecycle_ratio']:.2f}×)"
        if "floor_lifecycle_over_runc_ms" in s:
            value += (
                f"; floor {_plus(s['floor_lifecycle_over_runc_ms'])}; over its floor "
                f"{_plus(s['lifecycle_over_floor_ms'])}"
            )
        rows.append((f"go.{slug}", f"{name}: create+delete over runc, per round", value))
    go = subj["go cdi"]
    for name in ("nvshim fast", "nvshim in-process"):
        s = subj[name]
        parts = []
        if go["lifecycle_added_ms"]:
            parts.append(
                f"{s['lifecycle_added_ms'] / go['lifecycle_added_ms']:.2f}× of Go's added time"
            )
        if go.get("lifecycle_over_floor_ms") and "lifecycle_over_floor_ms" in s:
            parts.append(
                f"{s['lifecycle_over_floor_ms'] / go['lifecycle_over_floor_ms']:.2f}× "
                "of Go's time over its floor"
            )
        rows.append(
            (
                f"go.{GO_NAMES[name]}-vs-nvidia",
                f"{name} against NVIDIA's Go runtime",
                "; ".join(parts) or "n/a",
            )
        )
    m = r.get("machine", {})
    return rows, _when(
        m.get("date_utc", ""),
        m.get("nproc"),
        _load(r),
        f"{r['rounds']} rounds",
        "bench/gocompare.py",
    )


NRI_LABELS = {
    "floor": "the engine's own CDI injection, no hooks (the NRI floor)",
    "runtime_handler": "nvshim's runtime handler injecting the GPU",
    "inject": "the plugin injecting, `nri-inroot: agent` (default)",
    "inject_start": "the plugin injecting, `nri-inroot: start`",
    "guard": "the plugin, guard only (`void`)",
    "registered": "the plugin registered, every duty off",
    "stub": "NRI's own floor: a Go `pkg/stub` plugin, nvshim's three events, no adjustment",
    "stub_create": "NRI's own floor: a Go `pkg/stub` plugin, CreateContainer only",
}


def rows_nri(r: Dict[str, Any]) -> Tuple[List[Row], str]:
    """bench/nri.py: each mode over no plugin (paired blocks) and over the floor."""
    rows: List[Row] = [
        (
            "nri.none",
            f"CRI create+start, no plugin (containerd {r['containerd']})",
            _ms(r["create_start_ms"]["none"]),
        )
    ]
    over_floor = r.get("over_floor_ms_paired_blocks", {})
    for mode, label in NRI_LABELS.items():
        if mode not in r["added_ms_paired_blocks"]:
            continue
        value = _plus(r["added_ms_paired_blocks"][mode])
        if mode in over_floor:
            value += f"; over the floor {_plus(over_floor[mode])}"
        rows.append((f"nri.{mode.replace('_', '-')}", label + ", over no plugin", value))
    for key, label, field in (
        (
            "nri.plugin-inject",
            "the plugin's own handling of an injecting create (logged)",
            "plugin_inject_handling_ms",
        ),
        (
            "nri.plugin-guard",
            "the plugin's own handling of a guarded create (logged)",
            "plugin_guard_handling_ms",
        ),
    ):
        if r.get(field) is not None:
            rows.append((key, label, f"{r[field]:.2f} ms"))
    rows.append(
        (
            "nri.agent-rss",
            "the agent's resident memory after the rounds",
            f"{r['agent_rss_mb']:.1f} MiB",
        )
    )
    rows.append(
        (
            "nri.agent-start",
            "the agent's start to NRI registration",
            _ms(r["agent_start_to_registered_ms"]),
        )
    )
    m = r.get("machine", {})
    return rows, _when(
        m.get("date_utc", ""),
        m.get("nproc"),
        _load(r),
        f"{r['runs_per_mode']} per mode",
        "bench/nri.py",
    )


AGENT_LABELS = {
    "sh": "the trampoline's sh and the client's scan, a spec asking nothing (no-op runtime)",
    "client": "the C client and its socket round trip",
    "agent": "the agent's create of a 1-GPU container",
    "fast": "the fast path's shim stage (sh, client, agent)",
    "python": "the in-process shim stage (Python starts)",
    "mounts": "runc's extra mounts and device nodes",
    "hooks": "runc running nvshim's createContainer hook",
    "delete": "delete through the trampoline, over runc's",
}


def rows_agent(r: Dict[str, Any]) -> Tuple[List[Row], str]:
    """bench/agent.py: where a 1-GPU create's time goes; concurrency; memory."""
    rows: List[Row] = []
    for key, label in AGENT_LABELS.items():
        row = r["breakdown"][key]
        rows.append((f"agent.{key}", label, f"{_ms(row['ms'])} (CPU {_ms(row['cpu'])})"))
    c = r["concurrent"]
    rows.append(
        (
            "agent.concurrent",
            f"{c['n']} creates at once through one agent",
            f"median {_ms(c['median_ms'])}, p99/median {c['p99_over_median']:.2f}",
        )
    )
    rss = r["rss_256_gpus_kib"]["VmRSS"] / 1024
    rows.append(("agent.rss", "the agent's resident memory, 256 simulated GPUs", f"{rss:.1f} MiB"))
    return rows, _when(
        r.get("date_utc", ""), r.get("nproc"), _load(r), f"{r['rounds']} rounds", "bench/agent.py"
    )


def _slug(label: str) -> str:
    """A figures.py row's key: ``import json (brings re)`` → ``import.json``."""
    if label.startswith("bare start"):
        return "python.start"
    if label.startswith("import "):
        return "import." + label.split()[1].rstrip(",")
    if label.startswith("define one"):
        return "define." + label.split()[2].lower()
    if " of a config.json" in label:
        return "copy." + ("deepcopy" if label.startswith("copy.") else "nvshim")
    if label.startswith("nvshim."):
        return "import." + label.split()[0].rsplit(".", 1)[1]
    return "write." + ("fsync" if "fsync" in label else "plain")


def rows_figures(r: Dict[str, Any]) -> Tuple[List[Row], str]:
    """bench/figures.py: what one import, one class, one copy, one write costs."""
    rows: List[Row] = []
    for label, samples in r["rows_ms"].items():
        value = (
            f"{min(samples):.2f} ms min, {statistics.median(samples):.2f} median"
            if samples
            else "not installed for the interpreter"
        )
        rows.append((_slug(label), label, value))
    return rows, _when(
        r.get("date_utc", ""),
        r.get("nproc"),
        _load(r),
        f"{r['runs']} runs each",
        "bench/figures.py",
    )


SOURCES: Dict[str, Callable[[Dict[str, Any]], Tuple[List[Row], str]]] = {
    "results.json": rows_run,
    "gocompare-results.json": rows_gocompare,
    "nri-results.json": rows_nri,
    "agent-results.json": rows_agent,
    "figures-results.json": rows_figures,
}


# --------------------------------------------------------------------------- the table


def line(key: str, figure: str, value: str, measured: str) -> str:
    return f"| `{key}` | {figure} | {value} | {measured} |"


def parse_table(text: str) -> Dict[str, str]:
    """The current-figures rows of a BENCHMARKS.md text: key → its whole line, in order."""
    block = text[text.index(BEGIN) + len(BEGIN) : text.index(END)]
    rows: Dict[str, str] = {}
    for row in block.splitlines():
        m = re.match(r"\| `([^`]+)` \|", row)
        if m:
            rows[m.group(1)] = row
    return rows


def values(text: str) -> Dict[str, str]:
    """key → the value column of each current-figures row."""
    return {key: row.split(" | ")[2] for key, row in parse_table(text).items()}


def regenerate(text: str, results: Dict[str, Dict[str, Any]]) -> str:
    """``text`` with its current-figures block rewritten from ``results`` (file name →
    its JSON): rows of a source given are replaced (new ones appended), the rest kept."""
    rows = parse_table(text)
    for name, make in SOURCES.items():
        if name in results:
            made, measured = make(results[name])
            for key, figure, value in made:
                rows[key] = line(key, figure, value, measured)
    block = "\n".join([BEGIN, HEAD, *rows.values(), END])
    return text[: text.index(BEGIN)] + block + text[text.index(END) + len(END) :]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--results",
        default=str(REPO / "bench"),
        help="folder holding the benches' result files (default bench/)",
    )
    parser.add_argument("--file", default=str(REPO / "BENCHMARKS.md"))
    parser.add_argument(
        "--check", action="store_true", help="rewrite nothing; exit 1 if the file is not up to date"
    )
    args = parser.parse_args(argv)
    path = Path(args.file)
    text = path.read_text()
    if BEGIN not in text or END not in text:
        print(f"bench/table.py: no current-figures markers in {path}", file=sys.stderr)
        return 1
    results = {}
    for name in SOURCES:
        found = Path(args.results) / name
        if found.is_file():
            results[name] = json.loads(found.read_text())
    new = regenerate(text, results)
    used = ", ".join(results) or "none: every row kept"
    if args.check:
        if new != text:
            print(
                f"bench/table.py: {path} is not what the result files make it ({used})",
                file=sys.stderr,
            )
            return 1
        return 0
    path.write_text(new)
    print(f"bench/table.py: {path} rewritten from {used}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
