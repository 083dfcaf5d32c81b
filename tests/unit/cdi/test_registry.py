"""CDI registry (spec directories, priority, conflicts), resolution, writing, import cost."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from click.testing import CliRunner

from nvshim.cdi.load import load_spec_file
from nvshim.cdi.model import Registry
from nvshim.cdi.registry import load_registry, resolve_devices
from nvshim.cdi.write import dump_spec, spec_to_dict, write_spec
from nvshim.cli.cmd_cdi import cdi as cdi_group
from nvshim.edits import DeviceNode, Edits
from nvshim.errors import CdiError

REPO = Path(__file__).resolve().parents[3]


def _spec(
    kind: str = "nvidia.com/gpu",
    devices: Optional[Dict[str, List[str]]] = None,
    env: Optional[List[str]] = None,
) -> Dict[str, Any]:
    """A valid spec dict; each device sets the env entries given for it."""
    devices = devices if devices is not None else {"0": ["DEV=0"]}
    out: Dict[str, Any] = {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [{"name": n, "containerEdits": {"env": e}} for n, e in devices.items()],
    }
    if env:
        out["containerEdits"] = {"env": env}
    return out


def _put(directory: Path, name: str, spec: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    if isinstance(spec, str):
        path.write_text(spec)
    elif name.endswith(".json"):
        path.write_text(json.dumps(spec))
    else:
        path.write_text(dump_spec(spec, "yaml"))
    return path


def _env_of(registry: Registry, name: str) -> tuple:
    return registry.devices[name].device.edits.env


def test_loads_json_and_yaml_and_lists_sorted_names(tmp_path: Path) -> None:
    """Devices of .json and .yaml files are registered under qualified names, listed sorted."""
    d = tmp_path / "etc"
    _put(d, "b.yaml", _spec(devices={"1": ["X=1"], "0": ["X=0"]}))
    _put(d, "a.json", _spec(kind="acme.com/fpga", devices={"f0": ["F=0"]}))
    registry = load_registry([str(d)])
    assert registry.names() == ["acme.com/fpga=f0", "nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    assert registry.problems == []
    assert [s.path for s in registry.specs] == [str(d / "a.json"), str(d / "b.yaml")]


def test_ignores_other_extensions_and_subdirectories(tmp_path: Path) -> None:
    """Only .json/.yaml entries directly in the directory are read (.yml and subdirs are not)."""
    d = tmp_path / "etc"
    _put(d, "x.yml", _spec(devices={"yml": ["A=1"]}))
    _put(d / "sub", "y.yaml", _spec(devices={"sub": ["A=1"]}))
    (d / "dir.yaml").mkdir()
    _put(d, "z.yaml.nvshim-1", _spec(devices={"tmp": ["A=1"]}))
    _put(d, "ok.yaml", _spec(devices={"ok": ["A=1"]}))
    registry = load_registry([str(d)])
    assert registry.names() == ["nvidia.com/gpu=ok"]
    assert registry.problems == []


def test_missing_directory_is_skipped(tmp_path: Path) -> None:
    """A spec directory that does not exist is skipped silently."""
    d = tmp_path / "run"
    _put(d, "a.yaml", _spec())
    registry = load_registry([str(tmp_path / "nope"), str(d)])
    assert registry.names() == ["nvidia.com/gpu=0"]
    assert registry.problems == []


def test_later_directory_overrides_silently(tmp_path: Path) -> None:
    """The same device in a later directory wins without a warning."""
    etc, run = tmp_path / "etc", tmp_path / "run"
    _put(etc, "z.yaml", _spec(devices={"0": ["FROM=etc"], "1": ["FROM=etc"]}))
    _put(run, "a.yaml", _spec(devices={"0": ["FROM=run"]}))
    registry = load_registry([str(etc), str(run)])
    assert _env_of(registry, "nvidia.com/gpu=0") == ("FROM=run",)
    assert _env_of(registry, "nvidia.com/gpu=1") == ("FROM=etc",)
    assert registry.problems == []
    reverse = load_registry([str(run), str(etc)])
    assert _env_of(reverse, "nvidia.com/gpu=0") == ("FROM=etc",)


def test_same_directory_conflict_drops_device_and_names_both_files(tmp_path: Path) -> None:
    """A device in two files of one directory is dropped, even if a later dir defines it."""
    etc, run = tmp_path / "etc", tmp_path / "run"
    a = _put(etc, "a.yaml", _spec(devices={"0": ["A=1"], "1": ["A=1"]}))
    b = _put(etc, "b.json", _spec(devices={"0": ["A=1"]}))
    _put(run, "c.yaml", _spec(devices={"0": ["C=1"]}))
    registry = load_registry([str(etc), str(run)])
    assert registry.names() == ["nvidia.com/gpu=1"]
    assert [str(p) for p in registry.problems] == [
        f'{b}: $.devices[0].name: conflicting device "nvidia.com/gpu=0" '
        f'(specs "{a}", "{b}"): device dropped'
    ]


def test_conflict_in_higher_priority_directory_drops_device(tmp_path: Path) -> None:
    """Two files of the later directory conflicting also drop a device the earlier dir had."""
    etc, run = tmp_path / "etc", tmp_path / "run"
    _put(etc, "a.yaml", _spec(devices={"0": ["A=1"]}))
    _put(run, "b.yaml", _spec(devices={"0": ["B=1"]}))
    _put(run, "c.yaml", _spec(devices={"0": ["C=1"]}))
    registry = load_registry([str(etc), str(run)])
    assert registry.names() == []
    assert len(registry.problems) == 1


def test_same_kind_split_across_files_is_fine(tmp_path: Path) -> None:
    """Different devices of one kind may live in different files of the same directory."""
    d = tmp_path / "etc"
    _put(d, "a.yaml", _spec(devices={"0": ["A=1"]}))
    _put(d, "b.yaml", _spec(devices={"1": ["A=1"]}))
    registry = load_registry([str(d)])
    assert registry.names() == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    assert registry.problems == []


def test_broken_file_is_skipped_and_recorded(tmp_path: Path) -> None:
    """A file that fails to load is recorded with its reason; the others still load."""
    d = tmp_path / "etc"
    bad_kind = _put(d, "a.yaml", _spec(kind="badkind", devices={"x": ["A=1"]}))
    syntax = _put(d, "b.yaml", "kind: [\n")
    _put(d, "c.json", _spec(devices={"0": ["A=1"]}))
    registry = load_registry([str(d)])
    assert registry.names() == ["nvidia.com/gpu=0"]
    assert [str(p) for p in registry.problems] == [
        f'{bad_kind}: $.kind: kind "badkind" must be <vendor>/<class>, like nvidia.com/gpu',
        f"{syntax}: $: invalid YAML at line 2, column 1: while parsing a flow node: "
        "expected the node content, but found '<stream end>'",
    ]


def test_spec_dir_that_is_a_file_is_recorded(tmp_path: Path) -> None:
    """A spec directory path that is a regular file is reported, not a traceback."""
    f = tmp_path / "file"
    f.write_text("")
    registry = load_registry([str(f)])
    assert [str(p) for p in registry.problems] == [f"{f}: $: spec directory is not a directory"]


# --------------------------------------------------------------------------------------
# resolution


def _two_spec_registry(tmp_path: Path) -> Registry:
    d = tmp_path / "etc"
    _put(d, "gpu.yaml", _spec(devices={"0": ["DEV=0"], "1": ["DEV=1"]}, env=["SPEC=gpu"]))
    _put(d, "fpga.json", _spec(kind="acme.com/fpga", devices={"f": ["DEV=f"]}, env=["SPEC=fpga"]))
    return load_registry([str(d)])


def test_resolve_adds_spec_edits_once_per_spec(tmp_path: Path) -> None:
    """Spec-level edits come once, before the first device of that spec, in request order."""
    registry = _two_spec_registry(tmp_path)
    edits = resolve_devices(registry, ["nvidia.com/gpu=1", "acme.com/fpga=f", "nvidia.com/gpu=0"])
    assert edits.env == ("SPEC=gpu", "DEV=1", "SPEC=fpga", "DEV=f", "DEV=0")


def test_resolve_collapses_repeated_names(tmp_path: Path) -> None:
    """A name requested twice contributes its edits once (first occurrence)."""
    registry = _two_spec_registry(tmp_path)
    edits = resolve_devices(registry, ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=0"])
    assert edits.env == ("SPEC=gpu", "DEV=0", "DEV=1")


def test_resolve_nothing_is_no_edits(tmp_path: Path) -> None:
    """Resolving an empty request gives the empty Edits."""
    assert resolve_devices(_two_spec_registry(tmp_path), []) == Edits()


def test_resolve_unknown_names_lists_all_and_dirs(tmp_path: Path) -> None:
    """Unknown names fail the whole request, naming each one and the directories searched."""
    registry = load_registry(["/etc/cdi-nvshim-test-missing", "/var/run/cdi-nvshim-missing"])
    with pytest.raises(CdiError) as info:
        resolve_devices(registry, ["nvidia.com/gpu=7", "acme.com/gpu=0", "nvidia.com/gpu=7"])
    assert str(info.value) == (
        "unresolvable CDI devices nvidia.com/gpu=7, acme.com/gpu=0 "
        "(searched /etc/cdi-nvshim-test-missing, /var/run/cdi-nvshim-missing)"
    )


def test_resolve_error_text_matches_cdi(tmp_path: Path) -> None:
    """The error reads like podman's: unresolvable CDI devices <name> (searched <dirs>)."""
    registry = _two_spec_registry(tmp_path)
    with pytest.raises(CdiError) as info:
        resolve_devices(registry, ["nvidia.com/gpu=0", "nvidia.com/gpu=7"])
    assert str(info.value) == (
        f"unresolvable CDI devices nvidia.com/gpu=7 (searched {tmp_path / 'etc'})"
    )


def test_resolve_error_points_at_first_spec_problem(tmp_path: Path) -> None:
    """When some spec failed to load, the error says so (podman hides the reason)."""
    d = tmp_path / "etc"
    bad = _put(d, "gpu.yaml", _spec(devices={"0": []}))
    registry = load_registry([str(d)])
    with pytest.raises(CdiError) as info:
        resolve_devices(registry, ["nvidia.com/gpu=0"])
    assert str(info.value) == (
        f"unresolvable CDI devices nvidia.com/gpu=0 (searched {d}; 1 spec problem, first: "
        f'{bad}: $.devices[0].containerEdits: device "0" has empty containerEdits)'
    )


# --------------------------------------------------------------------------------------
# writing


def test_write_spec_is_atomic_0644_and_loadable(tmp_path: Path) -> None:
    """write_spec creates the directory, writes mode 0644 and leaves no temp file."""
    spec = spec_to_dict(
        "nvidia.com/gpu",
        [("0", Edits(device_nodes=(DeviceNode("/dev/nvidia0", type="c", major=195, minor=0),)))],
        Edits(),
    )
    for name in ("nvidia.yaml", "nvidia.json"):
        path = tmp_path / "run" / "cdi" / name
        write_spec(str(path), spec)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
        assert load_spec_file(str(path)).devices[0].name == "0"
    assert sorted(os.listdir(tmp_path / "run" / "cdi")) == ["nvidia.json", "nvidia.yaml"]
    assert (tmp_path / "run" / "cdi" / "nvidia.yaml").read_text().startswith("---\n")
    assert (tmp_path / "run" / "cdi" / "nvidia.json").read_text().startswith("{")


def test_write_spec_replaces_existing_file(tmp_path: Path) -> None:
    """Writing over an existing spec replaces its content."""
    path = tmp_path / "gpu.yaml"
    write_spec(str(path), _spec(devices={"0": ["V=1"]}))
    write_spec(str(path), _spec(devices={"0": ["V=2"]}))
    assert load_spec_file(str(path)).devices[0].edits.env == ("V=2",)


def test_write_spec_rejects_unknown_extension(tmp_path: Path) -> None:
    """A target not ending in .json/.yaml is refused (runtimes would never read it)."""
    with pytest.raises(CdiError, match=r"the name must end in \.json or \.yaml"):
        write_spec(str(tmp_path / "gpu.yml"), _spec())
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------------------
# CLI list


def test_cli_list_prints_names_and_warnings(tmp_path: Path) -> None:
    """`cdi list` prints names on stdout, warnings on stderr, and exits 0."""
    etc, run = tmp_path / "etc", tmp_path / "run"
    _put(etc, "a.yaml", _spec(devices={"0": ["A=1"], "1": ["A=1"]}))
    bad = _put(run, "bad.json", "[]")
    result = CliRunner().invoke(cdi_group, ["list", "--spec-dir", str(etc), "--spec-dir", str(run)])
    assert result.exit_code == 0
    assert result.stdout == "nvidia.com/gpu=0\nnvidia.com/gpu=1\n"
    assert result.stderr == f"warning: {bad}: $: top level must be a mapping, got a list\n"


def test_cli_list_empty(tmp_path: Path) -> None:
    """`cdi list` over an empty directory prints no names, says where it looked, succeeds."""
    result = CliRunner().invoke(cdi_group, ["list", "--spec-dir", str(tmp_path)])
    assert (result.exit_code, result.stdout) == (0, "")
    assert result.stderr == f"no CDI devices found in {tmp_path}\n"


def test_cli_list_skips_what_is_not_a_regular_file(tmp_path: Path) -> None:
    """A FIFO, a symlink to /dev/zero and an oversized file in a spec dir are one warning
    each, never read: reading the first two hung `cdi list` (and create) forever. Run in a
    subprocess so that a regression fails on the timeout instead of hanging the suite."""
    from nvshim.cdi.load import MAX_SPEC_BYTES

    etc = tmp_path / "etc"
    _put(etc, "a.yaml", _spec(devices={"0": ["A=1"]}))
    os.mkfifo(etc / "b.yaml")
    os.symlink("/dev/zero", etc / "c.json")
    (etc / "d.json").write_bytes(b" " * (MAX_SPEC_BYTES + 1))
    out = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); "
            "from nvshim.cli.main import main; main(sys.argv[2:])",
            str(REPO),
            "cdi",
            "list",
            "--spec-dir",
            str(etc),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (out.returncode, out.stdout) == (0, "nvidia.com/gpu=0\n"), out.stderr
    assert out.stderr.splitlines() == [
        f"warning: {etc / 'b.yaml'}: $: not a regular file",
        f"warning: {etc / 'c.json'}: $: not a regular file",
        f"warning: {etc / 'd.json'}: $: larger than 16 MiB: not a CDI spec",
    ]


# --------------------------------------------------------------------------------------
# import cost (the runtime resolves CDI names on the create path)

_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[2])
from nvshim.cdi.registry import load_registry, resolve_devices
before = sorted(m for m in ("yaml", "jsonschema", "click", "structlog", "pynvml") if m in sys.modules)
registry = load_registry([sys.argv[1]])
edits = resolve_devices(registry, ["nvidia.com/gpu=0"])
after = sorted(m for m in ("yaml", "jsonschema", "click", "structlog", "pynvml") if m in sys.modules)
print(json.dumps([before, after, list(edits.env)]))
"""


def _probe(directory: Path) -> Any:
    out = subprocess.run(
        [sys.executable, "-I", "-c", _PROBE, str(directory), str(REPO)],
        cwd=str(directory),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def test_json_registry_loads_without_heavy_imports(tmp_path: Path) -> None:
    """Importing nvshim.cdi.registry and resolving from JSON specs imports no yaml/jsonschema/click."""
    _put(tmp_path, "gpu.json", _spec(devices={"0": ["A=1"]}))
    assert _probe(tmp_path) == [[], [], ["A=1"]]


def test_yaml_registry_imports_only_yaml(tmp_path: Path) -> None:
    """Reading a .yaml spec in nvshim's own plain style imports nothing heavy; one in
    another style (a comment here) imports yaml, and still not jsonschema."""
    _put(tmp_path / "plain", "gpu.yaml", _spec(devices={"0": ["A=1"]}))
    assert _probe(tmp_path / "plain") == [[], [], ["A=1"]]
    _put(
        tmp_path / "other",
        "gpu.yaml",
        "# written by hand\n" + dump_spec(_spec(devices={"0": ["A=1"]}), "yaml"),
    )
    assert _probe(tmp_path / "other") == [[], ["yaml"], ["A=1"]]
