"""The costs nvshim's comments lean on, measured again: BENCHMARKS.md's current figures.

Run from the repository root with the venv's interpreter (root is not needed)::

    .venv/bin/python bench/figures.py [--runs 15] [--python /usr/bin/python3]
        [--out bench/figures-results.json]

Each import figure is the median (and minimum) over ``--runs`` fresh processes of the
interpreter the runtime is built from, started as the runtime is (``-I -S``), of the time
one ``import`` takes inside the process, timed with ``perf_counter`` around it: the
module's own import plus whatever it pulls in that the bare start has not loaded. The
interpreter's bare start is timed from outside (``-c pass``). The others: defining a
``NamedTuple`` and a ``dataclass`` (per class, after the import), ``copy.deepcopy`` of a
config.json-sized document against nvshim's ``_copy``, and a small file's write with and
without fsync (file and directory) in a temporary directory on this disk.

Every row's samples (ms) go to ``--out`` with the date, the machine and its load, for
``bench/table.py``'s current figures. Nothing here asserts on time; this is a
measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

REPO = Path(__file__).resolve().parent.parent

#: (figure, code run before the clock starts, code timed): one line of the table each
IMPORTS: List[Tuple[str, str, str]] = [
    ("import typing", "", "import typing"),
    ("import re", "", "import re"),
    ("import json (brings re)", "", "import json"),
    ("import enum, functools, collections", "", "import enum, functools, collections"),
    ("import contextlib", "", "import contextlib"),
    ("import dataclasses (brings inspect)", "", "import dataclasses"),
    ("import hashlib", "", "import hashlib"),
    ("import ctypes", "", "import ctypes"),
    ("import copy", "", "import copy"),
    ("import importlib (not frozen)", "", "import importlib"),
    ("import subprocess", "", "import subprocess"),
    ("import yaml (PyYAML)", "", "import yaml"),
    ("import grpc", "", "import grpc"),
    ("import structlog", "", "import structlog"),
    (
        "define one NamedTuple (typing loaded)",
        "import typing",
        "typing.NamedTuple('A', [('a', int), ('b', str), ('c', int)])",
    ),
    (
        "define one dataclass (dataclasses loaded)",
        "import dataclasses",
        "dataclasses.dataclass(frozen=True)(type('A', (), {'__annotations__': "
        "{'a': 'int', 'b': 'str', 'c': 'int'}}))",
    ),
    (
        "nvshim.runtime.requirements (imports beyond a GPU create's)",
        "import nvshim.runtime.create",
        "import nvshim.runtime.requirements",
    ),
]


def timed_in_process(python: str, setup: str, code: str, runs: int) -> List[float]:
    """Seconds ``code`` takes in each of ``runs`` fresh ``-I -S`` processes."""
    # -S leaves site-packages out: this process's (PyYAML, grpc) go after the checkout
    paths = [str(REPO)] + [p for p in sys.path if p.endswith("site-packages")]
    script = (
        f"import sys; sys.path[0:0] = {paths!r}; {setup}\n"
        f"import time; t0 = time.perf_counter()\n{code}\n"
        "print(time.perf_counter() - t0)"
    )
    out = []
    for _ in range(runs):
        res = subprocess.run([python, "-I", "-S", "-c", script], capture_output=True, text=True)
        if res.returncode != 0:
            return []  # not installed for this interpreter: the row says so
        out.append(float(res.stdout))
    return out


def bare_start(python: str, runs: int) -> List[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([python, "-I", "-S", "-c", "pass"], check=True)
        out.append(time.perf_counter() - t0)
    return out


def deepcopy_against_copy(runs: int) -> Dict[str, List[float]]:
    """A config.json-sized document (a few hundred keys) copied both ways, in this process."""
    import copy

    sys.path.insert(0, str(REPO))
    from nvshim.edits import _copy

    doc = {
        "ociVersion": "1.1.0",
        "process": {"env": [f"K{i}=v{i}" for i in range(40)], "args": ["sh"]},
        "mounts": [
            {
                "destination": f"/m{i}",
                "type": "bind",
                "source": f"/s{i}",
                "options": ["rbind", "ro"],
            }
            for i in range(60)
        ],
        "linux": {
            "devices": [
                {"path": f"/dev/x{i}", "type": "c", "major": 195, "minor": i} for i in range(16)
            ]
        },
    }
    result: Dict[str, List[float]] = {"copy.deepcopy": [], "nvshim.edits._copy": []}
    for _ in range(runs):
        for name, fn in (("copy.deepcopy", copy.deepcopy), ("nvshim.edits._copy", _copy)):
            t0 = time.perf_counter()
            fn(doc)
            result[name].append(time.perf_counter() - t0)
    return result


def write_with_and_without_fsync(runs: int) -> Dict[str, List[float]]:
    out: Dict[str, List[float]] = {"write + rename": [], "write + fsync file and dir + rename": []}
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/var/tmp")) as tmp:
        for i in range(runs):
            for name, durable in (
                ("write + rename", False),
                ("write + fsync file and dir + rename", True),
            ):
                path = os.path.join(tmp, f"f{i}{durable}")
                t0 = time.perf_counter()
                fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT, 0o644)
                os.write(fd, b"x" * 300)
                if durable:
                    os.fsync(fd)
                os.close(fd)
                os.replace(path + ".tmp", path)
                if durable:
                    dfd = os.open(tmp, os.O_RDONLY)
                    os.fsync(dfd)
                    os.close(dfd)
                out[name].append(time.perf_counter() - t0)
    return out


def row(name: str, samples: List[float]) -> str:
    if not samples:
        return f"| {name} | not installed for this interpreter |"
    return f"| {name} | {statistics.median(samples) * 1e3:.2f} ms (min {min(samples) * 1e3:.2f}) |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--out", default=str(REPO / "bench" / "figures-results.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()
    print(f"interpreter {args.python}, {args.runs} runs each, load {load_before[0]:.1f}")
    rows: Dict[str, List[float]] = {
        "bare start, -I -S -c pass (from outside)": bare_start(args.python, args.runs)
    }
    for name, setup, code in IMPORTS:
        rows[name] = timed_in_process(args.python, setup, code, args.runs)
    for name, samples in deepcopy_against_copy(args.runs).items():
        rows[f"{name} of a config.json-sized document"] = samples
    for name, samples in write_with_and_without_fsync(args.runs).items():
        rows[f"a 300-byte file: {name}"] = samples
    print("| figure | median (min) |\n|---|---|")
    for name, samples in rows.items():
        print(row(name, samples))
    Path(args.out).write_text(
        json.dumps(
            {
                "runs": args.runs,
                "python": args.python,
                "load_before": load_before,
                "load_after": os.getloadavg(),
                "nproc": os.cpu_count(),
                "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "rows_ms": {k: [round(x * 1e3, 4) for x in v] for k, v in rows.items()},
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
