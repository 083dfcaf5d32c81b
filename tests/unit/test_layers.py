"""The package's shape, checked statically: layers point one way and no module imports
itself back through another.

Layers, bottom to top (docs/architecture.md draws them):

    base modules (errors, _record, _jsonc, files, config, edits)
      <- host  <- cdi  <- runtime  <- node  <- cli
                                   <- hook (the createContainer hook's fixed entry name)

A module may import its own package and any layer below it, never one above. Every import
counts, including those inside functions and under ``TYPE_CHECKING``: a lazy import still
ties the modules together. The heavy libraries (click, structlog, yaml, jsonschema, pynvml,
tomlkit) may appear at module level only in ``node`` and ``cli``; below them they are
imported inside the function that needs them, so the create path never pays for them.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "nvshim"

#: Base modules in their own order: each may import only those before it.
BASE = ("nvshim", "nvshim.errors", "nvshim._record", "nvshim._jsonc", "nvshim.files",
        "nvshim.edits", "nvshim.config")
RANK = {"host": 1, "cdi": 2, "runtime": 3, "node": 4, "hook": 4, "cli": 5}
HEAVY = ("click", "structlog", "yaml", "jsonschema", "pynvml", "tomlkit")


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> Dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, known: Set[str]) -> List[Tuple[str, int, bool]]:
    """(imported module, line, run at import) for every import statement in ``path``.

    "Run at import": at module level and not under ``if TYPE_CHECKING``.

    ``from nvshim.x import y`` counts as importing ``nvshim.x.y`` when that is a module.
    """
    tree = ast.parse(path.read_text(), str(path))
    top = {id(node) for node in tree.body}
    # statements directly under a module-level `if` (TYPE_CHECKING, platform checks) are
    # module level too
    for node in tree.body:
        if isinstance(node, ast.If) and not (isinstance(node.test, ast.Name)
                                             and node.test.id == "TYPE_CHECKING"):
            top.update(id(n) for n in node.body + node.orelse)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno, id(node) in top) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.append((sub if sub in known else node.module, node.lineno, id(node) in top))
    return out


def layer(name: str) -> Tuple[int, int]:
    """(rank, position among the base modules) of an nvshim module."""
    if name in BASE:
        return 0, BASE.index(name)
    parts = name.split(".")
    return RANK[parts[1]], 0


def nvshim_graph() -> Dict[str, Set[str]]:
    mods = modules()
    known = set(mods)
    return {name: {m for m, _, _ in imports_of(path, known) if m in known and m != name}
            for name, path in mods.items()}


def test_every_module_has_a_layer() -> None:
    unplaced = [name for name in modules() if name not in BASE and name.split(".")[1] not in RANK]
    assert unplaced == [], "give these a layer in test_layers.py and docs/architecture.md"


def test_imports_point_down_the_layers() -> None:
    mods = modules()
    known = set(mods)
    wrong = []
    for name, path in mods.items():
        mine = layer(name)
        for target, line, _ in imports_of(path, known):
            if target not in known or target == name:
                continue
            theirs = layer(target)
            same_package = name.split(".")[:2] == target.split(".")[:2] and mine[0] > 0
            if same_package:
                continue
            if theirs > mine or (mine[0] == 0 and theirs[0] == 0 and theirs[1] >= mine[1]):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {name} imports {target}")
    assert wrong == []


def find_cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One import cycle of ``graph`` (empty when there is none)."""
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(node: str) -> List[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_no_import_cycles() -> None:
    assert find_cycle(nvshim_graph()) == []


def test_cycle_finder_sees_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("package", ["nvshim", "nvshim.host", "nvshim.cdi", "nvshim.runtime"])
def test_heavy_libraries_are_imported_lazily_below_node(package: str) -> None:
    mods = modules()
    eager = []
    for name, path in mods.items():
        owner = name if name in BASE else ".".join(name.split(".")[:2])
        if owner != package and not (package == "nvshim" and name in BASE):
            continue
        for target, line, top in imports_of(path, set(mods)):
            if top and target.split(".")[0] in HEAVY:
                eager.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {target}")
    assert eager == []


def test_readme_layout_names_every_module_and_the_architecture_every_package() -> None:
    """The README's layout block and docs/architecture.md describe the tree as it is."""
    readme = (PACKAGE.parent / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("```", 2)[1]
    missing = [str(p.relative_to(PACKAGE.parent)) for p in sorted(PACKAGE.rglob("*.py"))
               if p.name != "__init__.py" and p.name not in layout]
    assert missing == []
    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    architecture = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    assert [p for p in packages if f"`{p}/`" not in architecture] == []
    assert [p for p in packages if f"nvshim/{p}/" not in layout] == []
