"""No path of one machine in the repository's benches, docs and tests.

A *path of one machine* names something that exists only because of how one machine was
set up or how one session worked on it, so a reader elsewhere cannot follow it:

- a home or workspace folder: ``/root/…``, ``/home/<user>/…``, ``/work/…`` (a program's
  own ``/proc/<pid>/root/`` or ``rootfs/root`` is not one: the ``/`` is preceded by a
  name or a placeholder there);
- in the benches and the docs, a scratch folder under ``/tmp`` that a recipe made by hand
  and a later step leans on (``/tmp/gort/bin``): a bench makes its folders with
  ``tempfile``/``mktemp`` and names at most a prefix of them. The tests are not held to
  this one: their ``/tmp/…`` are paths inside a container or a simulated root, or fake
  values a unit test parses.

Standard paths of other software stay (:data:`TMP_ALLOWED`, each with its reason), as do
``~/.cache/…`` (a convention, not one machine's) and the install prefix ``/opt/nvshim``
that ``install.sh --dev`` makes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator, List, Set, Tuple

REPO = Path(__file__).resolve().parents[2]
#: Where no path of one machine may appear, and where /tmp scratch folders are checked too.
TREES = ("bench", "docs", "tests")
FILES = ("BENCHMARKS.md", "README.md")
TMP_CHECKED = ("bench", "docs", "BENCHMARKS.md", "README.md")
SUFFIXES = {".py", ".md", ".sh", ".go", ".yaml", ".yml", ".toml", ".json", ".txt", ".c"}

#: ``/tmp/<name>`` that are not one machine's, with why.
TMP_ALLOWED = {
    "nvidia-mps": "NVIDIA's MPS pipe folder, the same on every node",
    "nvshim-payload": "README.md's payload folder, made by the command that names it first",
}

HOME_OR_WORKSPACE = re.compile(r"(?<![\w}>\].-])/(?:root|work|home/[A-Za-z0-9_.-]+)/")
SCRATCH = re.compile(r"(?<![\w}>\].-])/tmp/([A-Za-z0-9_.+-]+)")


def _written_by_benches() -> Set[Path]:
    """The result files the benches write into bench/, named one by one in .gitignore:
    a run's output on this machine, never committed."""
    lines = (REPO / ".gitignore").read_text().splitlines()
    return {REPO / line for line in lines if line.startswith("bench/") and "*" not in line}


def _files() -> Iterator[Path]:
    skipped = _written_by_benches()
    for tree in TREES:
        for path in sorted((REPO / tree).rglob("*")):
            if (
                path.suffix in SUFFIXES
                and path.is_file()
                and "__pycache__" not in path.parts
                and path != Path(__file__).resolve()
                and path not in skipped
            ):
                yield path
    for name in FILES:
        yield REPO / name


def machine_paths(path: Path, text: str) -> List[Tuple[int, str]]:
    """(line, path) of each path of one machine in ``text``, the file at ``path``."""
    rel = path.relative_to(REPO).as_posix()
    check_tmp = rel in TMP_CHECKED or rel.split("/", 1)[0] in TMP_CHECKED
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        found += [(number, m.group(0)) for m in HOME_OR_WORKSPACE.finditer(line)]
        if check_tmp:
            for m in SCRATCH.finditer(line):
                name = m.group(1)
                # a tempfile/mktemp prefix or template is a name of no machine
                if name not in TMP_ALLOWED and not name.endswith(("-", "XXXXXX")):
                    found.append((number, m.group(0)))
    return found


def test_no_path_of_one_machine() -> None:
    """bench/, docs/, tests/, BENCHMARKS.md and README.md name no home, workspace or hand-made
    /tmp folder of the machine they were written on."""
    bad = []
    for path in _files():
        text = path.read_text(errors="replace")
        bad += [f"{path.relative_to(REPO)}:{n}: {p}" for n, p in machine_paths(path, text)]
    assert not bad, "paths of one machine:\n" + "\n".join(bad)


def test_the_check_sees_each_kind_of_machine_path() -> None:
    """The rule catches a home, a workspace and a hand-made /tmp folder, and lets a
    program's /proc/<pid>/root/, a tempfile prefix and a standard /tmp path through."""
    doc = REPO / "docs" / "x.md"
    text = (
        "see /root/.cache/x and /work/shared/notes.md\n"
        "built under /tmp/gort/bin\n"
        "/proc/<pid>/root/ and /proc/{pid}/root/ and rootfs/root/ and ~/.cache/nvshim\n"
        "mktemp -d /tmp/nvshim-bench-XXXXXX, prefix /tmp/nvshim-bench-, /tmp/nvidia-mps\n"
    )
    assert machine_paths(doc, text) == [(1, "/root/"), (1, "/work/"), (2, "/tmp/gort")]
    assert machine_paths(REPO / "tests" / "x.py", "/tmp/gort /home/ann/x") == [(1, "/home/ann/")]
