"""``nvshim cdi`` as a user meets it: wrong paths fail loudly, an empty result says where it
looked, ``--format json`` for scripts, ``-`` for stdin/stdout, DIR/FILE metavars, and the
absolute-path rule shared by ``cdi validate`` and a create."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml
from click.testing import CliRunner

from nvshim.cdi import index as cdiindex
from nvshim.cdi.registry import load_registry, resolve_devices
from nvshim.cdi.write import dump_spec
from nvshim.cli.cmd_cdi import cdi as cdi_group
from nvshim.cli.main import main
from nvshim.errors import CdiError
from tests.helpers.commands import nvshim_cli

REPO = Path(__file__).resolve().parents[3]


def _spec(
    kind: str = "nvidia.com/gpu",
    names: tuple = ("0",),
    path: str = "/dev/nvidia0",
) -> Dict[str, Any]:
    return {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [
            {
                "name": n,
                "containerEdits": {"deviceNodes": [{"path": path, "hostPath": "/dev/null"}]},
            }
            for n in names
        ],
    }


def _put(directory: Path, name: str, spec: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    if isinstance(spec, str):
        path.write_text(spec)
    else:
        path.write_text(dump_spec(spec, "json" if name.endswith(".json") else "yaml"))
    return path


def _nvshim(capsys: pytest.CaptureFixture, *args: str) -> tuple:
    """(exit code, stdout, stderr) of the console entry point, as a user runs it."""
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out = capsys.readouterr()
    return info.value.code, out.out, out.err


# --------------------------------------------------------------------------------------
# wrong paths fail; an empty result says where it looked


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_list_refuses_a_spec_dir_that_is_not_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture, kind: str
) -> None:
    """An explicit --spec-dir that does not exist or is a file is one error line, exit 1
    (it printed nothing and exited 0)."""
    path = tmp_path / "nowhere"
    if kind == "file":
        path.write_text("")
    rc, out, err = _nvshim(capsys, "cdi", "list", "--spec-dir", str(path))
    assert (rc, out) == (1, "")
    assert len(err.splitlines()) == 1
    assert "--spec-dir" in err and str(path) in err


def test_list_of_an_empty_spec_dir_says_so(tmp_path: Path) -> None:
    """An existing directory without specs: nothing on stdout, where it looked on stderr, exit 0."""
    empty = tmp_path / "cdi"
    empty.mkdir()
    result = CliRunner().invoke(cdi_group, ["list", "--spec-dir", str(empty)])
    assert (result.exit_code, result.stdout) == (0, "")
    assert result.stderr == f"no CDI devices found in {empty}\n"


def test_list_of_missing_configured_dirs_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The config's cdi-spec-dirs may be missing (normal before a spec is generated): exit 0,
    but stderr names them instead of printing nothing."""
    etc, run = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    config = tmp_path / "config.yaml"
    config.write_text(f"cdi-spec-dirs: [{etc}, {run}]\n")
    monkeypatch.setenv("NVSHIM_CONFIG", str(config))
    result = CliRunner().invoke(cdi_group, ["list"])
    assert (result.exit_code, result.stdout) == (0, "")
    assert result.stderr == f"no CDI devices found in {etc}, {run}\n"


def test_list_with_only_broken_specs_warns_and_says_none_found(tmp_path: Path) -> None:
    """Every spec broken: each is a warning, then the empty result is named."""
    bad = _put(tmp_path / "cdi", "bad.json", "[]")
    result = CliRunner().invoke(cdi_group, ["list", "--spec-dir", str(tmp_path / "cdi")])
    assert result.exit_code == 0
    assert result.stderr.splitlines() == [
        f"warning: {bad}: $: top level must be a mapping, got a list",
        f"no CDI devices found in {tmp_path / 'cdi'}",
    ]


def test_validate_names_a_missing_file_and_a_directory(tmp_path: Path) -> None:
    """A missing file (even one without .json/.yaml) and a directory are named for what they
    are, not as an unknown extension."""
    gone, directory = tmp_path / "gone", tmp_path / "cdi"
    directory.mkdir()
    result = CliRunner().invoke(cdi_group, ["validate", str(gone), str(directory)])
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        f"{gone}: $: cannot read: No such file or directory",
        f"{directory}: $: is a directory, not a spec file",
    ]
    assert result.stderr == "2 files, 2 problems\n"


# --------------------------------------------------------------------------------------
# --format json


def test_list_json_names_each_devices_spec_file_and_the_problems(tmp_path: Path) -> None:
    """`cdi list --format json`: every device with its kind, name and the file it comes from
    (the higher-priority file when two directories define it), plus the load problems."""
    etc, run = tmp_path / "etc", tmp_path / "run"
    low = _put(etc, "a.yaml", _spec(names=("0", "1")))
    high = _put(run, "b.json", _spec(names=("1",)))
    bad = _put(run, "c.json", "[]")
    result = CliRunner().invoke(
        cdi_group, ["list", "--spec-dir", str(etc), "--spec-dir", str(run), "--format", "json"]
    )
    assert (result.exit_code, result.stderr) == (0, "")
    assert json.loads(result.stdout) == {
        "spec_dirs": [str(etc), str(run)],
        "devices": [
            {
                "name": "nvidia.com/gpu=0",
                "kind": "nvidia.com/gpu",
                "device": "0",
                "spec_file": str(low),
            },
            {
                "name": "nvidia.com/gpu=1",
                "kind": "nvidia.com/gpu",
                "device": "1",
                "spec_file": str(high),
            },
        ],
        "problems": [
            {
                "file": str(bad),
                "json_path": "$",
                "message": "top level must be a mapping, got a list",
            }
        ],
    }


def test_list_json_of_nothing_is_an_empty_document(tmp_path: Path) -> None:
    """No devices in JSON form is still a document naming the directories searched."""
    result = CliRunner().invoke(
        cdi_group, ["list", "--spec-dir", str(tmp_path), "--format", "json"]
    )
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {
        "spec_dirs": [str(tmp_path)],
        "devices": [],
        "problems": [],
    }


def test_validate_json_reports_each_file(tmp_path: Path) -> None:
    """`cdi validate --format json`: per file ok and its problems; exit 1 if any is bad."""
    good = _put(tmp_path, "good.yaml", _spec())
    bad = _put(tmp_path, "bad.yaml", _spec(path="dev/nvidia0"))
    result = CliRunner().invoke(cdi_group, ["validate", "--format", "json", str(good), str(bad)])
    assert result.exit_code == 1
    assert result.stderr == ""
    assert json.loads(result.stdout) == {
        "files": [
            {"file": str(good), "ok": True, "problems": []},
            {
                "file": str(bad),
                "ok": False,
                "problems": [
                    {
                        "file": str(bad),
                        "json_path": "$.devices[0].containerEdits.deviceNodes[0].path",
                        "message": 'container path "dev/nvidia0" is not absolute '
                        '(did you mean "/dev/nvidia0"?)',
                    }
                ],
            },
        ],
        "ok": False,
    }
    ok = CliRunner().invoke(cdi_group, ["validate", "--format", "json", str(good)])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["ok"] is True


# --------------------------------------------------------------------------------------
# relative container paths: refused by validate and by a create alike


def test_a_create_skips_a_spec_with_a_relative_container_path(tmp_path: Path) -> None:
    """The create's resolution (the index's registry, as nvshim-runtime builds it) refuses the
    same spec `cdi validate` refuses, naming the file and the field."""
    spec = _put(tmp_path / "cdi", "gpu.json", _spec(path="dev/nvidia0"))
    for registry in (
        load_registry([str(tmp_path / "cdi")]),
        cdiindex.registry_for([str(tmp_path / "cdi")], ["nvidia.com/gpu=0"], None, False)[0],
    ):
        with pytest.raises(CdiError) as info:
            resolve_devices(registry, ["nvidia.com/gpu=0"])
        assert (
            f"{spec}: $.devices[0].containerEdits.deviceNodes[0].path: container path "
            '"dev/nvidia0" is not absolute'
        ) in str(info.value)


# --------------------------------------------------------------------------------------
# - is stdin / stdout

DRIVER = "/run/nvidia/driver"


def _driver_spec() -> Dict[str, Any]:
    spec = _spec()
    spec["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] = f"{DRIVER}/dev/nvidia0"
    return spec


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_transform_reads_stdin_and_writes_stdout(fmt: str) -> None:
    """`--input -` reads the spec from stdin (JSON or YAML, sniffed) and `--output -` writes
    stdout, in the input's format."""
    text = dump_spec(_driver_spec(), fmt)
    result = CliRunner().invoke(
        cdi_group,
        ["transform", "root", "--from", DRIVER, "--to", "/", "--input", "-", "--output", "-"],
        input=text,
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout) if fmt == "json" else yaml.safe_load(result.stdout)
    assert out["devices"][0]["containerEdits"]["deviceNodes"][0] == {"path": "/dev/nvidia0"}
    assert result.stderr == f"moved 1 path from {DRIVER} to /\n"


def test_transform_stdin_problems_name_stdin() -> None:
    """A broken spec on stdin is refused naming <stdin>."""
    result = CliRunner().invoke(
        cdi_group,
        ["transform", "root", "--from", DRIVER, "--to", "/", "--input", "-"],
        input="{not json",
    )
    assert result.exit_code == 1
    assert str(result.exception).startswith("<stdin>: $: invalid JSON at line 1")


def test_validate_reads_stdin() -> None:
    """`cdi validate -` checks the spec on stdin, problems naming <stdin>."""
    good = CliRunner().invoke(cdi_group, ["validate", "-"], input=dump_spec(_spec(), "yaml"))
    assert (good.exit_code, good.stdout, good.stderr) == (0, "", "1 file, 0 problems\n")
    bad = CliRunner().invoke(cdi_group, ["validate", "-"], input=json.dumps(_spec(path="x")))
    assert bad.exit_code == 1
    assert bad.stdout.startswith("<stdin>: $.devices[0].containerEdits.deviceNodes[0].path: ")


# --------------------------------------------------------------------------------------
# --help: DIR for directories, FILE for files


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["list"], ["--spec-dir DIR"]),
        (["validate"], ["FILE..."]),
        (
            ["generate"],
            ["--driver-root DIR", "--dev-root DIR", "-o, --output FILE", "--check FILE"],
        ),
        (["transform", "root"], ["--from DIR", "--to DIR", "--input FILE", "-o, --output FILE"]),
    ],
)
def test_help_shows_dir_and_file_metavars(args: List[str], shown: List[str]) -> None:
    """Path options say DIR or FILE in --help, never TEXT."""
    result = CliRunner().invoke(cdi_group, [*args, "--help"])
    assert result.exit_code == 0
    for text in shown:
        assert text in result.stdout
    for line in result.stdout.splitlines():
        if any(
            o in line
            for o in ("--spec-dir", "--driver-root", "--dev-root", "--input", "--output", "--check")
        ):
            assert "TEXT" not in line, line


@pytest.mark.parametrize("option", ["--driver-root", "--dev-root"])
def test_generate_refuses_a_missing_root(
    tmp_path: Path, capsys: pytest.CaptureFixture, option: str
) -> None:
    """A --driver-root/--dev-root that does not exist is named (not "no GPUs found")."""
    rc, out, err = _nvshim(capsys, "cdi", "generate", option, str(tmp_path / "nowhere"))
    assert (rc, out) == (1, "")
    assert len(err.splitlines()) == 1
    assert option in err and str(tmp_path / "nowhere") in err and "does not exist" in err


@pytest.mark.skipif(os.geteuid() != 0, reason="simulated nodes need root (mknod)")
def test_generate_output_dash_is_stdout(tmp_path: Path) -> None:
    """`cdi generate -o -` prints the spec instead of writing a file named "-"."""
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=1)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        result = CliRunner().invoke(
            cdi_group, ["generate", "--driver-root", node.root, "-o", "-", "--format", "json"]
        )
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["kind"] == "nvidia.com/gpu"
    assert not (tmp_path / "-").exists()


def test_dash_with_stdin_closed_is_one_clear_line(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-` with stdin closed (`<&-`: Python has no sys.stdin) names that, not a traceback."""
    import sys

    monkeypatch.setattr(sys, "stdin", None)
    rc, out, err = _nvshim(
        capsys, "cdi", "transform", "root", "--from", DRIVER, "--to", "/", "--input", "-"
    )
    assert (rc, out) == (1, "")
    assert err == "nvshim: <stdin>: $: cannot read: standard input is closed\n"
    rc, out, _ = _nvshim(capsys, "cdi", "validate", "-")
    assert (rc, out) == (1, "<stdin>: $: cannot read: standard input is closed\n")


def test_cdi_list_reads_the_configs_cdi_spec_dirs(tmp_path: Path) -> None:
    """Issue 12 item 12: `nvshim cdi list` without --spec-dir lists the devices of the config's
    cdi-spec-dirs, as the runtime resolves them."""
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "nvidia.yaml").write_text(
        (REPO / "cdi-specs" / "examples" / "nvidia-2gpu.yaml").read_text()
    )
    config = tmp_path / "config.yaml"
    config.write_text(f"cdi-spec-dirs: [{specs}]\n")
    res = nvshim_cli("cdi", "list", env=dict(os.environ, NVSHIM_CONFIG=str(config)))
    assert res.returncode == 0, res.stderr
    assert "nvidia.com/gpu=0" in res.stdout.splitlines()
