"""The CDI package's shape (issue 14): one exception tree, one owner of the spec-dir
default, the published spec-dir listing, and what a CDI-name create loads of it."""

from __future__ import annotations

import ast
import inspect
import json
import os
from pathlib import Path
from typing import Any, Dict, List

import pytest
from click.testing import CliRunner

from nvshim.cdi import index as cdiindex
from nvshim.cdi.load import load_spec_file, read_document
from nvshim.cdi.registry import load_registry, resolve_devices, spec_files
from nvshim.cdi.schema import validate_file
from nvshim.config import DEFAULT_CDI_SPEC_DIRS, Config
from nvshim.errors import CdiError, CdiProblem, CdiSpecError, NvshimError

PACKAGE = Path(__file__).resolve().parents[3] / "nvshim"


def _spec(kind: str = "acme.com/fpga", name: str = "f0", env: str = "F=0") -> str:
    return json.dumps(
        {
            "cdiVersion": "0.5.0",
            "kind": kind,
            "devices": [{"name": name, "containerEdits": {"env": [env]}}],
        }
    )


# --------------------------------------------------------------------------------------
# errors: one tree, nothing bare escapes


def test_cdi_exceptions_live_in_the_one_tree() -> None:
    """CdiSpecError is an NvshimError defined in nvshim.errors, and no module of nvshim/cdi
    defines an exception class of its own."""
    assert issubclass(CdiSpecError, CdiError) and issubclass(CdiError, NvshimError)
    assert CdiSpecError.__module__ == CdiProblem.__module__ == "nvshim.errors"
    classes = []
    for path in sorted((PACKAGE / "cdi").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b) for b in node.bases]
                if any(b.endswith(("Error", "Exception")) for b in bases):
                    classes.append(f"{path.name}: {node.name}({', '.join(bases)})")
    assert classes == []


def test_problem_is_an_immutable_value() -> None:
    """CdiProblem compares and hashes by its fields and cannot be changed."""
    a = CdiProblem("a.json", "$.kind", "bad")
    assert a == CdiProblem("a.json", "$.kind", "bad") and len({a, CdiProblem(*"xyz")}) == 2
    assert a != CdiProblem("a.json", "$.kind", "worse")
    with pytest.raises(AttributeError):
        a.message = "other"  # type: ignore[misc]
    error = CdiSpecError([a, CdiProblem("a.json", "$", "second")])
    assert str(error) == "a.json: $.kind: bad (and 1 more)" and error.problems[1].json_path == "$"


@pytest.mark.parametrize(
    "scalar, why",
    [
        ("1" * 5000, "Exceeds the limit"),  # an integer over Python's digit limit
        ("2024-13-45", "month must be in 1..12"),  # a date yaml cannot build
    ],
)
def test_yaml_scalar_that_cannot_convert_is_a_problem_of_the_file(
    tmp_path: Path, scalar: str, why: str
) -> None:
    """A YAML value yaml's constructor fails on is one problem naming the file, in every
    reader (load, validate, registry, index), never a bare ValueError."""
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    bad = spec_dir / "a.yaml"
    bad.write_text(
        "cdiVersion: 0.5.0\nkind: acme.com/fpga\ndevices:\n"
        f"- name: f1\n  containerEdits:\n    env: [A=1]\n  annotations: {{x: {scalar}}}\n"
    )
    (spec_dir / "b.json").write_text(_spec())
    with pytest.raises(CdiSpecError) as caught:
        load_spec_file(str(bad))
    assert str(caught.value).startswith(f"{bad}: $: invalid YAML: ") and why in str(caught.value)
    assert [p.json_path for p in validate_file(str(bad))] == ["$"]
    registry = load_registry([str(spec_dir)])
    assert [p.path for p in registry.problems] == [str(bad)]
    assert resolve_devices(registry, ["acme.com/fpga=f0"]).env == ("F=0",)
    indexed, _ = cdiindex.registry_for(
        [str(spec_dir)], ["acme.com/fpga=f0"], str(tmp_path / "index.json"), True
    )
    assert indexed.problems == registry.problems


def test_symlink_loop_in_a_spec_dir_is_skipped_by_the_index(tmp_path: Path) -> None:
    """A spec-dir entry that cannot be stat'ed (a symlink loop) is skipped with the same
    problem the full scan records, instead of failing every CDI create with OSError."""
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    os.symlink("loop.json", spec_dir / "loop.json")
    (spec_dir / "z.json").write_text(_spec())
    index = str(tmp_path / "index.json")
    full = load_registry([str(spec_dir)])
    assert [str(p) for p in full.problems] == [
        f"{spec_dir}/loop.json: $: cannot read: Too many levels of symbolic links"
    ]
    for _ in range(2):  # a fresh scan, then from the index it wrote
        registry, source = cdiindex.registry_for([str(spec_dir)], ["acme.com/fpga=f0"], index, True)
        assert registry.problems == full.problems
        assert resolve_devices(registry, ["acme.com/fpga=f0"]).env == ("F=0",)
    assert source == f"CDI index {index}"


def test_duplicate_json_key_is_one_problem(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text('{"kind": "a/b", "kind": "c/d"}')
    with pytest.raises(CdiSpecError) as caught:
        read_document(str(path))
    assert caught.value.problems == [
        CdiProblem(str(path), "$", 'invalid JSON: duplicate key "kind"')
    ]


# --------------------------------------------------------------------------------------
# the spec-dir default: written once, in config


def test_default_spec_dirs_are_written_once_in_config() -> None:
    """("/etc/cdi", "/var/run/cdi") is a literal only in nvshim/config.py; the config
    default, the registry's default, containerd's --enable-cdi value and both --help texts
    come from it."""
    from nvshim.cli.cmd_cdi import cdi as cdi_group
    from nvshim.cli.cmd_runtime import runtime
    from nvshim.node.engines import containerd

    assert DEFAULT_CDI_SPEC_DIRS == ("/etc/cdi", "/var/run/cdi")
    assert Config().cdi_spec_dirs is DEFAULT_CDI_SPEC_DIRS
    assert containerd.CDI_SPEC_DIRS is DEFAULT_CDI_SPEC_DIRS
    default = inspect.signature(load_registry).parameters["spec_dirs"].default
    assert default is DEFAULT_CDI_SPEC_DIRS
    writers = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if '"/var/run/cdi"' in p.read_text() or "'/var/run/cdi'" in p.read_text()
    )
    assert writers == ["config.py"]
    runner = CliRunner()
    listing = runner.invoke(cdi_group, ["list", "--help"], terminal_width=200)
    assert "(/etc/cdi, /var/run/cdi unless configured)" in " ".join(listing.output.split())
    configure = runner.invoke(runtime, ["configure", "--help"], terminal_width=200)
    assert 'cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"] unless set' in " ".join(
        configure.output.split()
    )


# --------------------------------------------------------------------------------------
# spec_files: the one listing rule


def test_spec_files_lists_json_and_yaml_files_in_name_order(tmp_path: Path) -> None:
    """Files ending in .json or .yaml, sorted by name; directories (even named x.json),
    other extensions and subdirectories' files are not listed; a symlink is listed."""
    for name in ("b.yaml", "a.json", "c.yml", "d.json.bak", ".e.json"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "dir.json" / "inner.json").write_text("{}")
    os.symlink("a.json", tmp_path / "link.json")
    problems: List[CdiProblem] = []
    assert spec_files(str(tmp_path), problems) == [
        str(tmp_path / n) for n in (".e.json", "a.json", "b.yaml", "link.json")
    ]
    assert problems == []


def test_spec_files_of_a_missing_dir_and_a_file(tmp_path: Path) -> None:
    """A missing directory has no files and no problem; a file in its place is a problem."""
    problems: List[CdiProblem] = []
    assert spec_files(str(tmp_path / "missing"), problems) == [] and problems == []
    (tmp_path / "file").write_text("")
    assert spec_files(str(tmp_path / "file"), problems) == []
    assert problems == [
        CdiProblem(str(tmp_path / "file"), "$", "spec directory is not a directory")
    ]


# --------------------------------------------------------------------------------------
# the create path loads only what resolution needs

RESOLUTION = {
    "nvshim.cdi",
    "nvshim.cdi.names",
    "nvshim.cdi.model",
    "nvshim.cdi.version",
    "nvshim.cdi.check",
    "nvshim.cdi.load",
    "nvshim.cdi.registry",
    "nvshim.cdi.index",
    "nvshim.cdi.stale",
}


def test_cdi_name_create_loads_only_the_resolution_modules(tmp_path: Path) -> None:
    """A create asking for a CDI name imports the cdi modules resolution needs and not the
    schema layer, the writer or the transform."""
    from tests.helpers.bundle import make_bundle, make_rootfs
    from tests.unit.test_import_guard import (
        compiled_config,
        imported_modules,
        report,
        run_like_trampoline,
    )

    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / "fpga.json").write_text(_spec())
    bundle = make_bundle(
        tmp_path / "bundle",
        make_rootfs(tmp_path / "rootfs"),
        ["true"],
        env={"NVIDIA_VISIBLE_DEVICES": "acme.com/fpga=f0"},
    )
    env: Dict[str, Any] = compiled_config(tmp_path, extra=f"cdi-spec-dirs: [{spec_dir}]\n")
    res = run_like_trampoline(["create", "--bundle", str(bundle), "c-cdi"], env, bundle)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "F=0" in json.loads((bundle / "config.json").read_text())["process"]["env"]
    modules = imported_modules(res.stderr)
    assert {m for m in modules if m.startswith("nvshim.cdi")} == RESOLUTION, report(modules)
