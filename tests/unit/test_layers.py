"""The package's shape, checked statically: layers point one way and no module imports
itself back through another.

Layers, bottom to top (docs/architecture.md draws them):

    base modules (errors, logs, _protobuf, _record, _jsonc, files, _ocistate, edits, configcheck,
                  config)
      <- host  <- cdi  <- runtime  <- agent  <- node  <- cli
         host  <- sim  <- node, cli          (the simulated node: never below node)
                          runtime  <- hook, params_hook   (the createContainer hooks' fixed
                                                           entry names)

A module may import its own package and the packages :data:`MAY_IMPORT` lists for it
(with the base modules), never one above: ``runtime`` (what a create runs) imports
neither ``node``, ``sim`` nor ``cli``. Every import counts, including those inside functions and under ``TYPE_CHECKING``: a lazy import still
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
BASE = (
    "nvshim",
    "nvshim._preload",
    "nvshim.errors",
    "nvshim.logs",
    "nvshim._protobuf",
    "nvshim._record",
    "nvshim._jsonc",
    "nvshim.files",
    "nvshim._ocistate",
    "nvshim.edits",
    "nvshim.configcheck",
    "nvshim.config",
)
#: The packages each package may import besides its own and the base modules (the
#: "may import" column of docs/architecture.md's packages table).
MAY_IMPORT = {
    "host": (),
    "sim": ("host",),
    "cdi": ("host",),
    "runtime": ("cdi", "host"),
    "hook": ("runtime", "host"),
    "params_hook": ("runtime", "host"),
    "agent": ("runtime", "cdi", "host"),
    "node": ("agent", "runtime", "sim", "cdi", "host"),
    "cli": ("node", "agent", "runtime", "sim", "cdi", "host", "hook", "params_hook"),
}
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
        if isinstance(node, ast.If) and not (
            isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        ):
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


def package_of(name: str) -> str:
    """The top-level package (``runtime``, ``sim`` …) of an nvshim module; ``""`` for the
    base modules."""
    return "" if name in BASE else name.split(".")[1]


def may_import(name: str, target: str) -> bool:
    """Whether nvshim module ``name`` may import nvshim module ``target``."""
    mine, theirs = package_of(name), package_of(target)
    if not theirs:  # a base module: packages take any, base modules only earlier ones
        return bool(mine) or BASE.index(target) < BASE.index(name)
    return theirs == mine or theirs in MAY_IMPORT.get(mine, ())


def nvshim_graph() -> Dict[str, Set[str]]:
    mods = modules()
    known = set(mods)
    return {
        name: {m for m, _, _ in imports_of(path, known) if m in known and m != name}
        for name, path in mods.items()
    }


def test_every_module_has_a_layer() -> None:
    unplaced = [
        name for name in modules() if name not in BASE and package_of(name) not in MAY_IMPORT
    ]
    assert unplaced == [], "give these a layer in test_layers.py and docs/architecture.md"


def test_imports_point_down_the_layers() -> None:
    mods = modules()
    known = set(mods)
    wrong = []
    for name, path in mods.items():
        for target, line, _ in imports_of(path, known):
            if target in known and target != name and not may_import(name, target):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {name} imports {target}")
    assert wrong == []


@pytest.mark.parametrize(
    "name,target,allowed",
    [
        ("nvshim.runtime.create", "nvshim.runtime.allocation.policy", True),
        ("nvshim.runtime.create", "nvshim.host.discovery", True),
        ("nvshim.runtime.create", "nvshim.node.compile", False),
        ("nvshim.runtime.create", "nvshim.sim.build", False),
        ("nvshim.host.discovery", "nvshim.sim.model", False),
        ("nvshim.cdi.index", "nvshim.sim.build", False),
        ("nvshim.hook", "nvshim.sim.build", False),
        ("nvshim.sim.build", "nvshim.host.elf", True),
        ("nvshim.sim.build", "nvshim.runtime.create", False),
        ("nvshim.node.demo", "nvshim.sim.build", True),
        ("nvshim.cli.main", "nvshim.sim.build", True),
        ("nvshim.files", "nvshim.errors", True),
        ("nvshim.errors", "nvshim.files", False),
    ],
)
def test_the_layer_rule(name: str, target: str, allowed: bool) -> None:
    """The rule itself: runtime imports neither node nor sim, host never the simulator,
    the simulator only host, and base modules only earlier base modules."""
    assert may_import(name, target) is allowed


def find_cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One import cycle of ``graph`` (empty when there is none)."""
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(node: str) -> List[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
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


def layout_sections(layout: str) -> Dict[str, str]:
    """The module layout block cut at each line that starts with a path: that path (as
    ``nvshim/runtime/``) → its line and the indented lines under it."""
    sections: Dict[str, str] = {}
    key = ""
    for line in layout.splitlines():
        if line and not line[0].isspace():
            key = line.split()[0]
        sections[key] = sections.get(key, "") + line + "\n"
    return sections


def missing_from_layout(layout: str, paths: List[str]) -> List[str]:
    """The module paths (``nvshim/sim/model.py``) the layout does not name under their own
    package's heading (a sub-package's folder named there too)."""
    sections = layout_sections(layout)
    missing = []
    for path in paths:
        key = max(
            (k for k in sections if k.startswith("nvshim") and path.startswith(k)),
            key=len,
            default="",
        )
        *folders, name = path[len(key) :].split("/")
        text = sections.get(key, "")
        if not key or name not in text or any(f"{f}/" not in text for f in folders):
            missing.append(path)
    return missing


def test_layout_check_sees_a_module_under_another_heading() -> None:
    """A module is looked for under its own package's heading, not anywhere in the block."""
    layout = (
        "nvshim/cdi/   x\n  model.py   specs\nnvshim/sim/   y\n  build.py\n"
        "nvshim/runtime/\n  allocation/\n    policy.py\n"
    )
    assert missing_from_layout(
        layout,
        [
            "nvshim/sim/model.py",
            "nvshim/cdi/model.py",
            "nvshim/runtime/allocation/policy.py",
            "nvshim/runtime/policy.py",
        ],
    ) == ["nvshim/sim/model.py"]
    assert (
        missing_from_layout(
            "nvshim/runtime/\n  policy.py\n", ["nvshim/runtime/allocation/policy.py"]
        )
        != []
    )


def test_architecture_names_every_module_and_every_package() -> None:
    """docs/architecture.md's module block names every module under its package's heading,
    and its package table every package."""
    architecture = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    layout = architecture.split("## Modules", 1)[1].split("```", 2)[1]
    paths = [
        str(p.relative_to(PACKAGE.parent))
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name != "__init__.py"
    ]
    assert missing_from_layout(layout, paths) == []
    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert [p for p in packages if f"`{p}/`" not in architecture] == []
    assert [p for p in packages if f"nvshim/{p}/" not in layout] == []


#: Unit test files named after a behaviour that spans modules, not after one module.
BEHAVIOURS = frozenset(
    {
        "bench_floor",
        "ci",
        "deploy",
        "dev_links",
        "device_numbers",
        "figures_home",
        "fuzz",
        "house",
        "import_guard",
        "layers",
        "machine_paths",
        "management_pods",
        "missing_config",
        "packaging",
        "shellcheck",
        "shipped_names",
        "unreferenced",
        "verify_every_device",
    }
)


def test_every_unit_test_file_names_what_it_tests() -> None:
    """tests/unit mirrors the package: ``tests/unit/<folders>/test_<name>.py`` is named after
    a module of ``nvshim/<folders>/`` or that package itself (maybe followed by
    ``_<aspect>``); one at the top after any module of nvshim or of tests/helpers
    (``<module>`` or ``<package>_<module>``, maybe with an aspect) or a behaviour that
    :data:`BEHAVIOURS` lists. None is named after a module that is gone, none lies in a
    folder without a package."""
    unit = PACKAGE.parent / "tests" / "unit"

    def named(name: str, names: Set[str]) -> bool:
        return name in names or any(name.startswith(f"{known}_") for known in names)

    everywhere: Set[str] = set()
    for path in list(PACKAGE.rglob("*.py")) + list((unit.parent / "helpers").glob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        everywhere.add(parts[-1].lstrip("_"))
        if len(parts) > 1:
            everywhere.add(f"{parts[-2]}_{parts[-1].lstrip('_')}")
    unnamed = []
    for path in sorted(unit.rglob("test_*.py")):
        name = path.stem[len("test_") :]
        folder = path.parent.relative_to(unit)
        if folder.parts:
            package = PACKAGE.joinpath(*folder.parts)
            here = {p.stem.lstrip("_") for p in package.glob("*.py") if p.stem != "__init__"}
            here |= {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
            ok = (package / "__init__.py").exists() and named(name, here | {package.name})
        else:
            ok = name in BEHAVIOURS or named(name, everywhere)
        if not ok:
            unnamed.append(str(path.relative_to(unit)))
    assert unnamed == [], "name each after the module it tests, or list it in BEHAVIOURS"
