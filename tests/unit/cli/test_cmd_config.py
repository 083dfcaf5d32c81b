"""nvshim config compile / show on the command line: refusals in one line, JSON output, --help."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List

import pytest

from nvshim.config import Config
from tests.helpers.commands import nvshim_cli, run_cli


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def written_beside(config: Path) -> List[str]:
    """What compile left next to ``config`` (the YAML itself aside)."""
    return sorted(p.name for p in config.parent.iterdir() if p != config)


@pytest.mark.parametrize("key", ["driver-root", "dev-root"])
def test_compile_refuses_a_root_that_does_not_exist(
    tmp_path: Path, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`config compile` of a config whose driver-root or dev-root is missing exits 1 with one
    line naming the key, the path and the file, and writes nothing the runtime would read."""
    root = tmp_path / "run" / "nvidia" / "driver"
    config = write(tmp_path, f"{key}: {root}\n")
    code, out, err = run_cli(["config", "compile", "--config", str(config)], capsys)
    assert (code, out) == (1, "")
    assert err == (
        f'nvshim: config {config}: "{key}" is "{root}", which does not exist on this node\n'
    )
    assert written_beside(config) == []


def test_compile_refuses_a_root_that_is_a_file_and_names_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A root that is a file is no directory; both roots wrong are both named, in one line."""
    afile = tmp_path / "driver"
    afile.write_text("")
    config = write(tmp_path, f"driver-root: {afile}\ndev-root: {tmp_path}/nope\n")
    code, _, err = run_cli(["config", "compile", "--config", str(config)], capsys)
    assert code == 1 and err.count("\n") == 1
    assert err == (
        f'nvshim: config {config}: 2 problems: "driver-root" is "{afile}", which is '
        f'not a directory; "dev-root" is "{tmp_path}/nope", which does not exist on '
        "this node\n"
    )


def test_compile_of_roots_that_exist_still_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Existing roots (an empty directory is not checked for a driver) compile as before."""
    root = tmp_path / "root"
    root.mkdir()
    config = write(tmp_path, f"driver-root: {root}\ndev-root: {root}\n")
    code, _, err = run_cli(["config", "compile", "--config", str(config)], capsys)
    assert code == 0, err
    assert "config.compiled.json" in written_beside(config)


@pytest.mark.parametrize("command", ["compile", "show"])
def test_a_missing_config_file_fails_in_one_line(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`config compile|show --config <missing>` exits 1 with one line naming the file."""
    missing = tmp_path / "nope.yaml"
    code, out, err = run_cli(["config", command, "--config", str(missing)], capsys)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and err.startswith(f"nvshim: config {missing} does not exist")
    assert list(tmp_path.iterdir()) == []


def test_explicitly_named_missing_config_is_an_error(tmp_path: Path) -> None:
    """Issue 12 item 10: `nvshim config show --config /nonexistent` (and inspect) fail in one line
    instead of showing defaults."""
    missing = str(tmp_path / "nonexistent.yaml")
    res = nvshim_cli("config", "show", "--config", missing)
    assert res.returncode == 1, res.stdout
    assert res.stderr == f"nvshim: config {missing} does not exist\n"
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.json").write_text("{}")
    res = nvshim_cli("inspect", "--bundle", str(tmp_path / "b"), "--config", missing)
    assert res.returncode == 1 and res.stderr == f"nvshim: config {missing} does not exist\n"
    # the runtime's default (NVSHIM_CONFIG unset/missing) still means defaults
    env = dict(os.environ, NVSHIM_CONFIG=missing)
    assert nvshim_cli("config", "show", env=env).returncode == 0


@pytest.mark.parametrize("command", ["compile", "show"])
def test_a_directory_as_config_fails_in_one_line(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--config DIR` is refused by the option itself, in one line naming the directory."""
    code, out, err = run_cli(["config", command, "--config", str(tmp_path)], capsys)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and str(tmp_path) in err and "is a directory" in err


def test_show_json_gives_the_values_and_their_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`config show --format json` prints one JSON object: the source file and every
    effective value (defaults filled in), the same values the text form shows."""
    config = write(tmp_path, "require-allocation: true\nruntimes: [crun]\n")
    code, out, err = run_cli(
        ["config", "show", "--config", str(config), "--format", "json"], capsys
    )
    assert code == 0, err
    doc = json.loads(out)
    expected = Config(require_allocation=True, runtimes=("crun",)).to_mapping()
    assert doc == {"source": str(config), "config": expected}


def test_show_json_of_the_defaults_has_no_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a config file the source is null and the values are the built-in defaults."""
    monkeypatch.setenv("NVSHIM_CONFIG", str(tmp_path / "absent.yaml"))
    code, out, err = run_cli(["config", "show", "--format", "json"], capsys)
    assert code == 0, err
    assert json.loads(out) == {"source": None, "config": Config().to_mapping()}


def test_show_text_is_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The default form stays a comment naming the file, then YAML."""
    config = write(tmp_path, "require-allocation: true\n")
    code, out, _ = run_cli(["config", "show", "--config", str(config)], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"# effective config from {config}"
    assert "require-allocation: true" in lines


@pytest.mark.parametrize("command", [["config", "compile"], ["config", "show"], ["grants"]])
def test_help_shows_config_as_a_file(
    command: List[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Every --config option reads `--config FILE` in --help."""
    code, out, _ = run_cli([*command, "--help"], capsys)
    assert code == 0
    assert "--config FILE" in out
    if command == ["config", "show"]:
        assert "--format [text|json]" in out


def test_show_names_the_missing_file_it_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --config, a $NVSHIM_CONFIG that names no file means the built-in defaults;
    the header says which file was looked for, so a typo in the variable shows."""
    missing = tmp_path / "typo.yaml"
    monkeypatch.setenv("NVSHIM_CONFIG", str(missing))
    code, out, _ = run_cli(["config", "show"], capsys)
    assert code == 0
    assert out.splitlines()[0] == f"# effective config from built-in defaults (no config {missing})"
