"""One home for every number: BENCHMARKS.md's current-figures table.

The docs (README.md, docs/*.md but the dated history) and nvshim's docstrings and comments
do not restate a measured time: they name a row of the table by its key (``figures:
`python.start```). Checked here, where it can be: every time in milliseconds they write
is a number the table's value column holds, and every key they cite is a row of the
table. A duration that is a setting, not a measurement, is written in seconds (``every 10
s``), as the config keys take it. ``bench/table.py`` rewrites the table; its pure part is tested here too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator, List, Set, Tuple

from bench.table import BEGIN, END, SOURCES, parse_table, regenerate, values

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "BENCHMARKS.md"
#: The dated runs, kept as they were measured: the one doc allowed its own figures.
HISTORY = REPO / "docs" / "benchmarks-history.md"

#: A time in ms, or a range of them: "≈ 11 ms", "5-30 ms", "2.15 ms".
FIGURE = re.compile(
    r"(?<![\w.])(\d+(?:\.\d+)?)(?:\s*[-–]\s*(\d+(?:\.\d+)?))?\s*"
    r"(?:ms|milliseconds)\b"
)
#: A key a doc cites on a line that names the figures: `python.start`, `create.gpu=1`.
KEY = re.compile(r"`([a-z][a-z0-9-]*\.[a-z0-9=+.-]+)`")
NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _docs() -> Iterator[Path]:
    yield REPO / "README.md"
    yield from (p for p in sorted((REPO / "docs").glob("*.md")) if p != HISTORY)
    yield from (p for p in sorted((REPO / "nvshim").rglob("*.py")) if "_pb2" not in p.name)


def _table() -> Tuple[Set[str], Set[str]]:
    """The table's keys, and every number its value column holds."""
    held = values(BENCHMARKS.read_text())
    return set(held), {n for v in held.values() for n in NUMBER.findall(v)}


def figures_in(text: str) -> List[Tuple[int, str]]:
    """(line, number) of every time in ms ``text`` writes."""
    return [
        (i, n)
        for i, line in enumerate(text.splitlines(), 1)
        for m in FIGURE.finditer(line)
        for n in m.groups()
        if n
    ]


def cited_keys(text: str, prefixes: Set[str]) -> List[Tuple[int, str]]:
    """(line, key) of every table key ``text`` cites: a backticked ``prefix.rest`` whose
    prefix is one of the table's, on a line that says ``figures``."""
    return [
        (i, k)
        for i, line in enumerate(text.splitlines(), 1)
        if "figures" in line
        for k in KEY.findall(line)
        if k.split(".", 1)[0] in prefixes
    ]


def test_every_figure_in_the_docs_is_one_the_table_holds() -> None:
    """A millisecond figure in the docs or the code's docstrings and comments that the
    current-figures table does not hold fails, naming the file and line."""
    _, numbers = _table()
    bad = []
    for path in _docs():
        rel = path.relative_to(REPO).as_posix()
        bad += [f"{rel}:{i}: {n} ms" for i, n in figures_in(path.read_text()) if n not in numbers]
    assert not bad, (
        "figures the table does not hold (cite a row of BENCHMARKS.md's current "
        "figures by its key instead):\n" + "\n".join(bad)
    )


def test_every_cited_key_is_a_row_of_the_table() -> None:
    """A doc that points at a row by a key the table lacks (renamed, dropped) fails."""
    keys, _ = _table()
    prefixes = {k.split(".", 1)[0] for k in keys} | {
        "python",
        "import",
        "create",
        "go",
        "nri",
        "agent",
        "passthrough",
    }
    bad = []
    for path in _docs():
        rel = path.relative_to(REPO).as_posix()
        bad += [
            f"{rel}:{i}: `{k}`" for i, k in cited_keys(path.read_text(), prefixes) if k not in keys
        ]
    assert not bad, "keys the current-figures table has no row for:\n" + "\n".join(bad)


def test_the_check_sees_a_restated_figure() -> None:
    """The patterns find a figure and a range, and a cited key, and skip a version."""
    text = "starts in ≈ 11 ms, 5-30 ms per start\nsee figures: `python.start`, v1.20.2\n"
    assert figures_in(text) == [(1, "11"), (1, "5"), (1, "30")]
    assert cited_keys(text, {"python"}) == [(2, "python.start")]


def test_regenerate_replaces_a_measured_source_and_keeps_the_rest() -> None:
    """The rows of a bench with a result file are rewritten, with its date, machine and
    load; a row no result file makes stays as written."""
    text = (
        f"intro\n{BEGIN}\n| key | figure | value | measured |\n|---|---|---|---|\n"
        "| `python.start` | old | 9.00 ms | long ago |\n"
        "| `realgpu.create` | by hand | 65 ms | once |\n"
        f"{END}\ntail\n"
    )
    figures = {
        "runs": 3,
        "nproc": 2,
        "date_utc": "2026-12-07T15:00:00Z",
        "load_before": [1.5, 1, 1],
        "load_after": [0.5, 1, 1],
        "rows_ms": {"bare start, -I -S -c pass (from outside)": [7.0, 8.0, 9.0]},
    }
    new = regenerate(text, {"figures-results.json": figures})
    rows = parse_table(new)
    assert list(rows) == ["python.start", "realgpu.create"]
    assert "7.00 ms min, 8.00 median" in rows["python.start"]
    assert "2026-12-07 15:00 UTC, 2 vCPU, load 1.5, 3 runs each" in rows["python.start"]
    assert rows["realgpu.create"] == "| `realgpu.create` | by hand | 65 ms | once |"
    assert new.startswith("intro\n") and new.endswith(f"{END}\ntail\n")
    assert regenerate(new, {}) == new


def test_the_table_names_its_sources() -> None:
    """bench/table.py's docstring lists every result file it reads (what makes a row)."""
    import bench.table

    assert all(name in (bench.table.__doc__ or "") for name in SOURCES)
