"""Shipped text names only modules and files that exist.

Comments, docstrings, the README, docs and the installed trampoline name nvshim's modules
(``nvshim.runtime.argv``, ``nvshim/runtime/argv.py``); a module that moves leaves those
names behind unless something checks them. This does: every ``nvshim/…py`` path must be a
file of the checkout, and every dotted ``nvshim.a.b`` must import as a module, with any
rest an attribute of it.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]

# what ships: the package, what installs it, what documents it
SHIPPED = ("nvshim", "docs", "deploy", "config", "cdi-specs", "bench")
SHIPPED_FILES = ("README.md", "BENCHMARKS.md", "install.sh", "pyproject.toml")
SUFFIXES = {".py", ".sh", ".md", ".yaml", ".yml", ".toml", ".json", ".txt", ""}

PATH_NAME = re.compile(r"\bnvshim/[A-Za-z0-9_/]+\.py\b")
# a dotted name not inside a longer word or path (runtimes.nvshim.path, 99-nvshim.toml),
# nor the Kubernetes label domain nvshim.io/ (nvshim.io/install=true)
DOTTED_NAME = re.compile(r"(?<![\w.\-/])nvshim(?!\.io/)(?:\.[A-Za-z_]\w*)+")
# file names that look dotted: nvshim.toml, nvshim.yaml, nvshim.schema.json …
FILE_SUFFIX = re.compile(r"\.(toml|ya?ml|json|conf|log|prom|fish|bash|zsh|sh|dev|md|txt)$")
# names that are meant to be gone from this checkout: bench/trees.py measures older
# revisions, and imports the trampoline from where a revision before issue 36 had it
HISTORICAL = {("bench/trees.py", "nvshim.node.trampoline")}


def shipped_text() -> Iterator[Tuple[str, int, str]]:
    paths: List[Path] = [REPO / name for name in SHIPPED_FILES]
    for top in SHIPPED:
        paths += [
            p
            for p in (REPO / top).rglob("*")
            if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts
        ]
    for path in paths:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            yield str(path.relative_to(REPO)), number, line
    from nvshim.node.install.trampoline import render

    script = render("/opt/nvshim/venv/bin/python")
    for number, line in enumerate(script.splitlines(), 1):
        yield "<rendered trampoline>", number, line


def dotted_exists(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def stale_names() -> List[str]:
    stale = []
    for where, number, line in shipped_text():
        for name in PATH_NAME.findall(line):
            if not (REPO / name).is_file():
                stale.append(f"{where}:{number}: {name}")
        for name in DOTTED_NAME.findall(line):
            if (where, name) in HISTORICAL:
                continue
            if not FILE_SUFFIX.search(name) and not dotted_exists(name):
                stale.append(f"{where}:{number}: {name}")
    return stale


def test_shipped_text_names_no_stale_module() -> None:
    assert stale_names() == []


@pytest.mark.parametrize(
    "name,exists",
    [
        ("nvshim.runtime.argv", True),
        ("nvshim.runtime.argv.parse_argv", True),
        ("nvshim.runtime.argv.no_such_function", False),
        ("nvshim.runtime.no_such_module", False),
        ("nvshim._argv", False),
    ],
)
def test_a_moved_module_is_seen(name: str, exists: bool) -> None:
    assert dotted_exists(name) is exists


def test_the_patterns_find_paths_and_dotted_names_but_not_file_names() -> None:
    line = "see nvshim/_argv.py and :mod:`nvshim.runtime.argv`; runtimes.nvshim.path, nvshim.toml"
    assert PATH_NAME.findall(line) == ["nvshim/_argv.py"]
    found = [n for n in DOTTED_NAME.findall(line) if not FILE_SUFFIX.search(n)]
    assert found == ["nvshim.runtime.argv"]
