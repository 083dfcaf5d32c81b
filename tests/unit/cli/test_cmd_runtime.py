"""``nvshim runtime configure`` on the command line: where each file goes, the --dry-run
summary, ``--format json`` and the option metavars, for containerd, CRI-O and Docker.

Every test that writes first checks, with a dry run, that each path lies under its tmp dir:
on a CLI that still sent a drop-in to /etc it fails there, before anything is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
from click.testing import CliRunner

from nvshim.cli.cmd_runtime import runtime
from nvshim.errors import NvshimError
from nvshim.node.engines import containerd, crio

LIVE_DIRS = ("/etc/containerd", "/etc/crio", "/etc/docker")
DROP_INS = {
    "containerd": ("config.toml", "conf.d/99-nvshim.toml"),
    "crio": ("crio.conf", "crio.conf.d/99-nvshim.toml"),
}


def _invoke(args: List[str]) -> Any:
    """As the ``nvshim`` entry point runs the group: an NvshimError comes back as the exception."""
    return CliRunner().invoke(runtime, ["configure", *args], standalone_mode=False)


def _live() -> Dict[str, Optional[bytes]]:
    """The engines' live config directories, to show they are left alone."""
    out: Dict[str, Optional[bytes]] = {}
    for root in LIVE_DIRS:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                out[path] = Path(path).read_bytes() if os.path.isfile(path) else None
    return out


def _tree(root: Path) -> List[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _json(args: List[str]) -> Dict[str, Any]:
    result = _invoke([*args, "--format", "json"])
    assert result.exception is None, result.exception
    assert result.stderr == ""
    document: Dict[str, Any] = json.loads(result.stdout)
    return document


def _plan(result: Any) -> List[str]:
    """The lines after "a real run would:" in a --dry-run's stderr."""
    lines = result.stderr.splitlines()
    return [
        " ".join(line.split())
        for line in lines[lines.index("dry run: nothing written; a real run would:") + 1 :]
    ]


@pytest.mark.parametrize("engine", ["containerd", "crio"])
def test_drop_in_goes_beside_config_and_revert_finds_it(tmp_path: Path, engine: str) -> None:
    """With --config and no --drop-in, the drop-in goes beside --config (as install.sh puts
    it), not into the live /etc/containerd/conf.d or /etc/crio/crio.conf.d; revert without
    --drop-in finds it there and leaves the directory as it was."""
    main_name, drop_name = DROP_INS[engine]
    config = tmp_path / main_name
    drop_in = tmp_path / drop_name
    args = ["--runtime", engine, "--config", str(config)]
    live = _live()
    dry = _invoke([*args, "--dry-run"])
    assert dry.exception is None, dry.exception
    assert f"# --- {drop_in} ---" in dry.stdout.splitlines()
    assert f"create {drop_in} (drop-in)" in _plan(dry)
    assert not any(line.startswith("# --- /etc/") for line in dry.stdout.splitlines())
    assert _tree(tmp_path) == []

    result = _invoke(args)
    assert result.exception is None, result.exception
    assert drop_in.is_file() and "runtimes.nvshim" in drop_in.read_text()
    assert str(drop_in) in result.stderr
    assert _live() == live
    if engine == "containerd":
        assert f'imports = ["{drop_in}"]' in config.read_text()

    reverted = _invoke([*args, "--revert"])
    assert reverted.exception is None, reverted.exception
    assert _tree(tmp_path) == []
    assert _live() == live


@pytest.mark.parametrize("engine", ["containerd", "crio"])
def test_revert_without_backup_looks_beside_config(tmp_path: Path, engine: str) -> None:
    """Without the backup, revert removes nvshim's drop-in beside --config (it looked for it
    in the live /etc directory and left this one behind)."""
    main_name, drop_name = DROP_INS[engine]
    args = ["--runtime", engine, "--config", str(tmp_path / main_name)]
    dry = _json([*args, "--dry-run"])
    assert all(row["path"].startswith(f"{tmp_path}/") for row in dry["files"])
    assert _invoke(args).exception is None
    os.unlink(tmp_path / (main_name + ".nvshim-orig.json"))
    result = _invoke([*args, "--revert"])
    assert result.exception is None, result.exception
    assert not (tmp_path / drop_name).exists()
    assert f"removed {tmp_path / drop_name}" in result.stderr


def test_explicit_drop_in_still_wins(tmp_path: Path) -> None:
    """--drop-in names the drop-in whatever --config is; --drop-in "" edits in place."""
    config = tmp_path / "config.toml"
    elsewhere = tmp_path / "other" / "n.toml"
    rows = _json(["--config", str(config), "--drop-in", str(elsewhere), "--dry-run"])["files"]
    assert [r["path"] for r in rows] == [str(elsewhere), str(config), f"{config}.nvshim-orig.json"]
    rows = _json(["--config", str(config), "--drop-in", "", "--dry-run"])["files"]
    assert [r["path"] for r in rows] == [str(config), f"{config}.nvshim-orig.json"]


@pytest.mark.parametrize("engine", ["containerd", "crio"])
def test_without_config_the_live_defaults_stay(engine: str) -> None:
    """No --config: the live paths, as before (a dry run of this host's files: nothing is
    written; a version 1 containerd config has no drop-in row)."""
    module: Any = containerd if engine == "containerd" else crio
    assert module.default_drop_in(module.DEFAULT_CONFIG) == module.DEFAULT_DROP_IN
    result = _invoke(["--runtime", engine, "--dry-run", "--format", "json"])
    if isinstance(result.exception, NvshimError):
        pytest.skip(f"this host's {module.DEFAULT_CONFIG} cannot be configured: {result.exception}")
    assert result.exception is None, result.exception
    document = json.loads(result.stdout)
    assert document["config"] == module.DEFAULT_CONFIG
    roles = {row["role"]: row["path"] for row in document["files"]}
    assert roles.get("drop-in", module.DEFAULT_DROP_IN) == module.DEFAULT_DROP_IN
    assert roles.get("backup", module.DEFAULT_CONFIG + ".nvshim-orig.json") == (
        module.DEFAULT_CONFIG + ".nvshim-orig.json"
    )


def test_an_earlier_drop_in_in_etc_is_named(tmp_path: Path) -> None:
    """A config that still imports the drop-in an earlier nvshim put in /etc/containerd/conf.d
    for it gets a warning naming that file and the --drop-in that keeps using it."""
    config = tmp_path / "config.toml"
    config.write_text(f'version = 2\nimports = ["{containerd.DEFAULT_DROP_IN}"]\n')
    warnings = [
        w
        for w in _json(["--config", str(config), "--dry-run"])["warnings"]
        if "does not exist" not in w
    ]  # that import is missing here, said apart
    assert len(warnings) == 1
    assert f"also imports {containerd.DEFAULT_DROP_IN}" in warnings[0]
    assert f"--drop-in {containerd.DEFAULT_DROP_IN}" in warnings[0]


def test_dry_run_text_names_every_path_and_what_happens(tmp_path: Path) -> None:
    """--dry-run keeps the files on stdout and says on stderr what a real run does to each
    path: drop-in, main config and the backup of the originals."""
    config = tmp_path / "config.toml"
    config.write_text("version = 2\n")
    result = _invoke(["--config", str(config), "--dry-run"])
    assert result.exception is None, result.exception
    assert _plan(result) == [
        f"create {tmp_path}/conf.d/99-nvshim.toml (drop-in)",
        f"modify {config} (main config)",
        f"create {config}.nvshim-orig.json (backup of the originals, for --revert)",
    ]
    assert _tree(tmp_path) == ["config.toml"]


def test_json_dry_run_then_real_run_then_revert(tmp_path: Path) -> None:
    """--format json says what is (or would be) written where: each file's path, role,
    action, the backup keeping its original and its new text; then what a revert does."""
    config = tmp_path / "config.toml"
    config.write_text("version = 2\n")
    drop_in = str(tmp_path / "conf.d" / "99-nvshim.toml")
    backup = f"{config}.nvshim-orig.json"
    args = ["--config", str(config)]
    dry = _json([*args, "--dry-run"])
    assert {
        k: dry[k]
        for k in ("engine", "operation", "dry_run", "config", "name", "written", "warnings")
    } == {
        "engine": "containerd",
        "operation": "configure",
        "dry_run": True,
        "config": str(config),
        "name": "nvshim",
        "written": [],
        "warnings": [],
    }
    shape = [(r["path"], r["role"], r["action"], r["backup"]) for r in dry["files"]]
    assert shape == [
        (drop_in, "drop-in", "create", backup),
        (str(config), "config", "modify", backup),
        (backup, "backup", "create", None),
    ]
    assert _tree(tmp_path) == ["config.toml"]

    real = _json(args)
    assert real["dry_run"] is False and real["written"] == [drop_in, str(config)]
    assert [r["content"] for r in real["files"][:2]] == [
        Path(drop_in).read_text(),
        config.read_text(),
    ]
    assert [(r["path"], r["action"]) for r in real["files"]] == [(p, a) for p, _, a, _ in shape]

    again = _json(args)
    assert [(r["action"], r["backup"]) for r in again["files"]] == [
        ("unchanged", None),
        ("unchanged", None),
    ]
    assert again["written"] == []

    undo = _json([*args, "--revert"])
    assert undo["operation"] == "revert"
    assert [(r["path"], r["role"], r["action"]) for r in undo["files"]] == [
        (str(config), "config", "modify"),
        (drop_in, "drop-in", "remove"),
        (backup, "backup", "remove"),
    ]
    assert _tree(tmp_path) == ["config.toml"] and config.read_text() == "version = 2\n"


def test_json_for_docker_has_one_file_its_hook_and_its_backup(tmp_path: Path) -> None:
    """Docker (no drop-ins): daemon.json, the --gpus hook beside --binary and the backup,
    nothing else; still written."""
    config = tmp_path / "daemon.json"
    binary = tmp_path / "bin" / "nvshim-runtime"
    rows = _json(["--runtime", "docker", "--config", str(config), "--binary", str(binary)])
    assert [(r["path"], r["role"], r["action"]) for r in rows["files"]] == [
        (str(config), "config", "create"),
        (str(binary.parent / "nvidia-container-runtime-hook"), "hook", "create"),
        (f"{config}.nvshim-orig.json", "backup", "create"),
    ]
    assert json.loads(config.read_text())["runtimes"]["nvshim"]["path"] == str(binary)


def test_json_warnings_stay_out_of_stderr(tmp_path: Path) -> None:
    """With --format json a warning is in the document only: stdout parses, stderr is empty."""
    config = tmp_path / "daemon.json"
    config.write_text('{"default-runtime": "nvshim"}\n')
    document = _json(["--runtime", "docker", "--config", str(config), "--dry-run"])
    assert document["warnings"] == [
        f'removed "default-runtime": "nvshim" from {config} (pass --set-as-default to keep it)'
    ]


def test_help_shows_file_and_name_metavars() -> None:
    """Options that take a file show FILE, the runtime name NAME (not TEXT or PATH)."""
    result = CliRunner().invoke(runtime, ["configure", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for option in (
        "--config FILE",
        "--drop-in FILE",
        "--binary FILE",
        "--name NAME",
        "--format [text|json]",
    ):
        assert option in result.output
    assert "TEXT" not in result.output and "PATH" not in result.output


def _main(args: List[str], capsys: pytest.CaptureFixture[str]) -> Tuple[int, str, str]:
    """``nvshim ARGS`` through the console entry point: (exit code, stdout, stderr)."""
    from nvshim.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return (exc.value.code if isinstance(exc.value.code, int) else 1), out, err


def test_quiet_drops_the_summary_but_not_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`nvshim --quiet runtime configure` prints no "wrote …" line and no dry-run summary;
    a warning still prints, and the files are written."""
    config = tmp_path / "daemon.json"
    config.write_text('{"default-runtime": "nvshim"}\n')
    args = [
        "--quiet",
        "runtime",
        "configure",
        "--runtime",
        "docker",
        "--config",
        str(config),
        "--binary",
        str(tmp_path / "nvshim-runtime"),
    ]
    code, out, err = _main([*args, "--dry-run"], capsys)
    assert code == 0 and out.startswith(f"# --- {config} ---\n")
    # the warnings: the default removed, the --gpus hook's folder not on dockerd's PATH
    assert err.startswith("nvshim: warning: removed") and err.count("\n") == 2
    code, out, err = _main(args, capsys)
    assert code == 0 and out == ""
    assert err.startswith("nvshim: warning: removed") and err.count("\n") == 2
    assert "nvshim" in json.loads(config.read_text())["runtimes"]
