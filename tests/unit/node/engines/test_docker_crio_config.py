"""Unit tests for nvshim.node.engines.docker, nvshim.node.engines.crio and ``nvshim runtime configure --runtime docker|crio``.

The CRI-O drop-in is checked structurally against the keys crio.conf(5) documents for a
runtime handler table (CRI-O is not packaged here; Docker's e2e is tests/e2e/test_docker.py).
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path
from typing import Any, List, Optional

import pytest
from click.testing import CliRunner

from nvshim.cli.cmd_runtime import runtime
from nvshim.errors import ConfigError, UsageError
from nvshim.node.engines import crio, docker

BINARY = "/usr/local/bin/nvshim-runtime"

DAEMON_JSON = """\
{
  "log-driver": "journald",
  "storage-driver": "overlay2",
  "runtimes": {
    "kata": {"path": "/usr/bin/kata-runtime", "runtimeArgs": ["--debug"]}
  },
  "registry-mirrors": ["https://mirror.local"]
}
"""

# Documented in crio.conf(5) / CRI-O's config template for [crio.runtime.runtimes.<handler>].
CRIO_DOCUMENTED_HANDLER_KEYS = {
    "runtime_path": str,
    "runtime_type": str,
    "runtime_root": str,
    "runtime_config_path": str,
    "inherit_default_runtime": bool,
    "monitor_path": str,
    "monitor_cgroup": str,
    "monitor_exec_cgroup": str,
    "monitor_env": list,
    "privileged_without_host_devices": bool,
    "allowed_annotations": list,
    "platform_runtime_paths": dict,
    "container_min_memory": str,
    "no_sync_log": bool,
    "default_annotations": dict,
    "stream_websockets": bool,
}
CRIO_RUNTIME_TYPES = {"oci", "vm", "pod"}

CRIO_CONF = """\
# distro crio.conf
[crio.runtime]
cgroup_manager = "systemd"
conmon_cgroup = "system.slice"

[crio.runtime.runtimes.runc]
runtime_path = ""
runtime_type = "oci"
runtime_root = "/run/runc-k8s"
monitor_path = "/usr/libexec/crio/conmon"
monitor_env = ["PATH=/usr/local/bin:/usr/bin:/bin"]
"""


def _invoke(args: List[str]) -> Any:
    return CliRunner().invoke(runtime, args, standalone_mode=False)


# --------------------------------------------------------------------------- docker


@pytest.mark.parametrize("text", [None, "", "  \n", "{}"])
def test_docker_new_file_has_runtime_path_with_four_space_indent(text: Optional[str]) -> None:
    """A missing/blank daemon.json becomes {"runtimes": {"nvshim": {"path": ...}}}, 4-space JSON."""
    plan = docker.plan_configure(text, binary=BINARY)
    after = plan.files[0].after
    assert after is not None
    assert json.loads(after) == {"runtimes": {"nvshim": {"path": BINARY}}}
    assert after.endswith("}\n") and '\n    "runtimes"' in after


def test_docker_keeps_unknown_keys_their_order_and_indent() -> None:
    """Other keys, their order, other runtimes and their runtimeArgs survive; indent is kept."""
    plan = docker.plan_configure(DAEMON_JSON, binary=BINARY)
    after = plan.files[0].after
    assert after is not None
    data = json.loads(after)
    assert list(data) == ["log-driver", "storage-driver", "runtimes", "registry-mirrors"]
    assert list(data["runtimes"]) == ["kata", "nvshim"]
    assert data["runtimes"]["kata"] == {"path": "/usr/bin/kata-runtime", "runtimeArgs": ["--debug"]}
    assert data["runtimes"]["nvshim"] == {"path": BINARY}
    assert '\n  "log-driver"' in after  # two spaces, as the file had


def test_docker_existing_entry_keeps_its_args_and_gets_the_path() -> None:
    """An existing runtimes.nvshim keeps runtimeArgs; only path changes."""
    text = '{"runtimes": {"nvshim": {"path": "/old", "runtimeArgs": ["--debug"]}}}'
    after = docker.plan_configure(text, binary=BINARY).files[0].after
    assert json.loads(after or "") == {
        "runtimes": {"nvshim": {"path": BINARY, "runtimeArgs": ["--debug"]}}
    }
    assert "\n" not in (after or "").rstrip("\n")  # a one-line file stays one line


def test_docker_unchanged_file_is_not_rewritten() -> None:
    """A daemon.json that already says it all keeps its exact bytes (no change to write)."""
    text = '{\n"runtimes":{"nvshim":{"path":"/usr/local/bin/nvshim-runtime"}}}'
    plan = docker.plan_configure(text, binary=BINARY)
    assert not plan.files[0].changed


def test_docker_set_as_default_guard() -> None:
    """default-runtime needs require-allocation (or --force, which warns)."""
    with pytest.raises(UsageError, match="require-allocation"):
        docker.plan_configure(None, set_as_default=True)
    forced = docker.plan_configure(None, set_as_default=True, force=True)
    assert json.loads(forced.files[0].after or "")["default-runtime"] == "nvshim"
    assert any("every GPU" in w for w in forced.warnings)
    allowed = docker.plan_configure(None, set_as_default=True, require_allocation=True)
    assert json.loads(allowed.files[0].after or "")["default-runtime"] == "nvshim"
    assert allowed.warnings == ()


def test_docker_without_set_as_default_our_default_is_removed() -> None:
    """Configuring without --set-as-default drops a default-runtime naming nvshim, and says so."""
    text = '{"default-runtime": "nvshim", "runtimes": {"nvshim": {"path": "/x"}}}'
    plan = docker.plan_configure(text, binary=BINARY)
    assert "default-runtime" not in json.loads(plan.files[0].after or "")
    assert any("default-runtime" in w for w in plan.warnings)


def test_docker_enable_cdi() -> None:
    """--enable-cdi sets features.cdi and keeps other features."""
    text = '{"features": {"buildkit": true}}'
    data = json.loads(docker.plan_configure(text, enable_cdi=True).files[0].after or "")
    assert data["features"] == {"buildkit": True, "cdi": True}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "invalid JSON"),
        ("[]", "not a JSON object"),
        ('{"runtimes": []}', "runtimes is not an object"),
        ('{"runtimes": {"nvshim": "x"}}', "runtimes.nvshim is not an object"),
        ("[" * 100000 + "]" * 100000, "invalid JSON: nested too deeply"),  # was a traceback
        # were taken, and written back as the non-JSON Infinity / NaN
        ('{"x": NaN}', "invalid JSON: NaN is not a JSON value"),
        ('{"x": -Infinity}', "invalid JSON: -Infinity is not a JSON value"),
        ('{"x": 1e400}', "invalid JSON: number 1e400 is out of range"),
    ],
)
def test_docker_bad_files_are_config_errors(text: str, message: str) -> None:
    """A broken daemon.json is one ConfigError naming the file and what is wrong."""
    with pytest.raises(ConfigError, match=message) as info:
        docker.plan_configure(text, config_path="/etc/docker/daemon.json")
    assert "/etc/docker/daemon.json" in str(info.value)


def test_docker_refuses_the_reserved_name_runc() -> None:
    """--name runc wrote a daemon.json dockerd refuses to start with ("runtime name 'runc'
    is reserved", checked with dockerd 20.10 here); it is refused before anything is
    written."""
    with pytest.raises(UsageError, match='"runc" is reserved by Docker'):
        docker.plan_configure("{}", name="runc")


def test_docker_relative_binary_is_usage_error() -> None:
    with pytest.raises(UsageError, match="absolute"):
        docker.plan_configure(None, binary="nvshim-runtime")


@pytest.mark.parametrize("original", [None, DAEMON_JSON, '{"runtimes":{}}'])
def test_docker_revert_restores_bytes_and_mode(tmp_path: Path, original: Optional[str]) -> None:
    """configure (twice) then revert gives back the original bytes and mode, or no file."""
    etc = tmp_path / "etc" / "docker"
    config = etc / "daemon.json"
    if original is not None:
        etc.mkdir(parents=True)
        config.write_text(original)
        config.chmod(0o600)
    binary = str(tmp_path / "bin" / "nvshim-runtime")  # the --gpus hook goes beside it
    docker.configure(str(config), binary=binary)
    docker.configure(str(config), binary=binary, set_as_default=True, force=True)
    assert json.loads(config.read_text())["default-runtime"] == "nvshim"
    result = docker.revert(str(config))
    assert result.used_backup
    assert not (tmp_path / "bin").exists(), "the hook and the folder made for it are gone"
    if original is None:
        assert not config.exists()
        assert not etc.exists(), "the directories configure created are gone too"
    else:
        assert config.read_text() == original
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert not Path(str(config) + ".nvshim-orig.json").exists()


def test_docker_revert_after_hand_edit_removes_only_ours(tmp_path: Path) -> None:
    """An edit made after configure survives revert; nvshim's runtime and default go."""
    config = tmp_path / "daemon.json"
    config.write_text(DAEMON_JSON)
    docker.configure(
        str(config),
        binary=str(tmp_path / "nvshim-runtime"),
        set_as_default=True,
        force=True,
        enable_cdi=True,
    )
    data = json.loads(config.read_text())
    data["debug"] = True
    config.write_text(json.dumps(data, indent=2))
    result = docker.revert(str(config))
    assert any("changed since" in w for w in result.warnings)
    after = json.loads(config.read_text())
    assert after["debug"] is True
    assert "nvshim" not in after["runtimes"] and "kata" in after["runtimes"]
    assert "default-runtime" not in after and "features" not in after


def test_docker_revert_with_a_deeply_nested_backup_is_one_error(tmp_path: Path) -> None:
    """A backup nested past the JSON decoder's recursion limit is one ConfigError naming
    it (it was a RecursionError traceback), and daemon.json is left as it is."""
    config = tmp_path / "daemon.json"
    config.write_text('{"runtimes": {}}')
    backup = Path(str(config) + ".nvshim-orig.json")
    backup.write_text(
        '{"format": "nvshim-docker-backup/1", "files": ' + "[" * 100000 + "]" * 100000 + "}"
    )
    with pytest.raises(ConfigError, match="invalid backup: nested too deeply") as info:
        docker.revert(str(config))
    assert str(backup) in str(info.value)
    assert config.read_text() == '{"runtimes": {}}'


def test_docker_revert_without_backup(tmp_path: Path) -> None:
    """Without a backup only runtimes.nvshim and a default naming it are removed."""
    config = tmp_path / "daemon.json"
    config.write_text(
        '{"default-runtime": "nvshim", "runtimes": {"nvshim": {"path": "/x"}}, "debug": true}'
    )
    result = docker.revert(str(config))
    assert not result.used_backup
    assert json.loads(config.read_text()) == {"debug": True}


def test_docker_read_runtimes(tmp_path: Path) -> None:
    """read_runtimes reports names, paths and the default (runc when unset)."""
    config = tmp_path / "daemon.json"
    config.write_text(DAEMON_JSON)
    seen = docker.read_runtimes(str(config))
    assert seen.runtimes == {"kata": "/usr/bin/kata-runtime"}
    assert seen.default_runtime == "runc"


def test_cli_docker_dry_run_and_write(tmp_path: Path) -> None:
    """The CLI with --runtime docker: dry run prints the file; a run writes it and says so."""
    config = tmp_path / "daemon.json"
    result = _invoke(["configure", "--runtime", "docker", "--config", str(config), "--dry-run"])
    assert result.exception is None, result.exception
    assert result.stdout.startswith(f"# --- {config} ---\n{{\n")
    assert not config.exists()
    binary = str(tmp_path / "nvshim-runtime")
    result = _invoke(
        ["configure", "--runtime", "docker", "--config", str(config), "--binary", binary]
    )
    assert result.exception is None
    assert "restart dockerd" in result.stderr
    assert json.loads(config.read_text())["runtimes"]["nvshim"]["path"] == binary


def test_cli_docker_refuses_drop_in(tmp_path: Path) -> None:
    result = _invoke(
        [
            "configure",
            "--runtime",
            "docker",
            "--config",
            str(tmp_path / "d.json"),
            "--drop-in",
            str(tmp_path / "x"),
        ]
    )
    assert isinstance(result.exception, UsageError)
    assert "Docker has no drop-ins" in str(result.exception)


# --------------------------------------------------------------------------- crio


def _crio_drop_in(main: Optional[str] = None, **kwargs: Any) -> Any:
    plan = crio.plan_configure(main, None, config_path="/etc/crio/crio.conf", **kwargs)
    assert plan.files[0].path == crio.DEFAULT_DROP_IN
    return tomllib.loads(plan.files[0].after or "")


def test_crio_default_drop_in_sits_beside_the_config() -> None:
    """A crio.conf outside /etc/crio gets its drop-in in crio.conf.d beside it (install.sh's
    rule), not in /etc/crio/crio.conf.d."""
    plan = crio.plan_configure(None, None, config_path="/srv/crio/crio.conf")
    assert [change.path for change in plan.files] == ["/srv/crio/crio.conf.d/99-nvshim.toml"]


@pytest.mark.parametrize("main", [None, "", CRIO_CONF])
def test_crio_drop_in_uses_only_documented_keys(main: Optional[str]) -> None:
    """The drop-in's handler table has only documented keys, with documented types."""
    data = _crio_drop_in(main, binary=BINARY)
    assert set(data) == {"crio"} and set(data["crio"]) == {"runtime"}
    assert set(data["crio"]["runtime"]) == {"runtimes"}
    handler = data["crio"]["runtime"]["runtimes"]["nvshim"]
    assert set(handler) <= set(CRIO_DOCUMENTED_HANDLER_KEYS)
    assert set(handler) <= crio.HANDLER_KEYS <= set(CRIO_DOCUMENTED_HANDLER_KEYS)
    for key, value in handler.items():
        assert isinstance(value, CRIO_DOCUMENTED_HANDLER_KEYS[key]), key
    assert handler["runtime_path"] == BINARY
    assert handler["runtime_type"] in CRIO_RUNTIME_TYPES and handler["runtime_type"] == "oci"
    assert os.path.isabs(handler["runtime_root"])
    assert handler["monitor_cgroup"]
    assert all("=" in entry for entry in handler["monitor_env"])


def test_crio_defaults_without_a_runc_handler() -> None:
    """No main file: runc's default root, monitor cgroup "pod", CRI-O's default PATH."""
    handler = _crio_drop_in(None)["crio"]["runtime"]["runtimes"]["nvshim"]
    assert handler["runtime_root"] == "/run/runc"
    assert handler["monitor_cgroup"] == "pod"
    assert handler["monitor_env"][0].startswith("PATH=")
    assert "monitor_path" not in handler  # CRI-O finds conmon itself


def test_crio_copies_runc_root_and_monitor_settings() -> None:
    """runtime_root and monitor_* come from the runc handler; monitor_cgroup from conmon_cgroup."""
    handler = _crio_drop_in(CRIO_CONF)["crio"]["runtime"]["runtimes"]["nvshim"]
    assert handler["runtime_root"] == "/run/runc-k8s"
    assert handler["monitor_path"] == "/usr/libexec/crio/conmon"
    assert handler["monitor_env"] == ["PATH=/usr/local/bin:/usr/bin:/bin"]
    assert handler["monitor_cgroup"] == "system.slice"


def test_crio_set_as_default_guard_and_key() -> None:
    """--set-as-default writes crio.runtime.default_runtime, under the require-allocation guard."""
    with pytest.raises(UsageError, match="require-allocation"):
        _crio_drop_in(None, set_as_default=True)
    data = _crio_drop_in(None, set_as_default=True, require_allocation=True)
    assert data["crio"]["runtime"]["default_runtime"] == "nvshim"


TAKEOVER = "default runtime: nvshim-runtime under that name would run every container"


@pytest.mark.parametrize(
    "main, name",
    [
        (None, "runc"),
        (None, "crun"),
        ('[crio.runtime]\ndefault_runtime = "kata"\n', "kata"),
    ],
)
def test_crio_name_of_the_default_runtime_is_refused(main: Optional[str], name: str) -> None:
    """A drop-in handler named like CRI-O's default runtime overrides that handler's
    runtime_path, so every container ran through nvshim without --set-as-default and its
    require-allocation guard; now refused unless --set-as-default (with the guard)."""
    with pytest.raises(UsageError, match=f'runtime name "{name}" is CRI-O\'s {TAKEOVER}'):
        _crio_drop_in(main, name=name)
    with pytest.raises(UsageError, match="require-allocation"):
        _crio_drop_in(main, name=name, set_as_default=True)
    data = _crio_drop_in(main, name=name, set_as_default=True, require_allocation=True)
    assert data["crio"]["runtime"]["runtimes"][name]["runtime_path"] == crio.DEFAULT_BINARY
    # another name is fine while the default is kata
    assert "other" in _crio_drop_in(main, name="other")["crio"]["runtime"]["runtimes"]


@pytest.mark.parametrize("revert", [False, True])
def test_crio_empty_drop_in_is_refused_not_the_default(tmp_path: Path, revert: bool) -> None:
    """`--drop-in ""` (containerd's "in place") has no CRI-O meaning; configure and revert
    took it as "the default", /etc/crio/crio.conf.d/99-nvshim.toml, whatever --config
    said, so the refusal plan_configure has for it never ran."""
    conf = str(tmp_path / "crio.conf")
    with pytest.raises(UsageError, match="--drop-in cannot be empty"):
        if revert:
            crio.revert(conf, drop_in="", dry_run=True)
        else:
            crio.configure(conf, drop_in="", dry_run=True)


def test_crio_bad_inputs() -> None:
    """Invalid TOML, a bad handler name, a relative binary: one error each, naming the value."""
    with pytest.raises(ConfigError, match="/etc/crio/crio.conf: invalid TOML"):
        _crio_drop_in("[crio\n")
    with pytest.raises(UsageError, match="DNS label"):
        _crio_drop_in(None, name="Bad_Name")
    with pytest.raises(UsageError, match="absolute"):
        _crio_drop_in(None, binary="nvshim-runtime")
    with pytest.raises(ConfigError, match="crio.runtime is not a table"):
        _crio_drop_in("crio = {runtime = 1}\n")


@pytest.mark.parametrize("existing", [None, "# someone else's drop-in\n"])
def test_crio_revert_restores_drop_in_bytes(tmp_path: Path, existing: Optional[str]) -> None:
    """configure then revert: the drop-in is gone again (or its old bytes are back); the main
    file is never touched and the backup lives outside crio.conf.d."""
    config = tmp_path / "crio.conf"
    config.write_text(CRIO_CONF)
    drop_in = tmp_path / "crio.conf.d" / "99-nvshim.toml"
    if existing is not None:
        drop_in.parent.mkdir()
        drop_in.write_text(existing)
    crio.configure(str(config), drop_in=str(drop_in), binary=BINARY)
    assert "[crio.runtime.runtimes.nvshim]" in drop_in.read_text()
    assert sorted(os.listdir(drop_in.parent)) == ["99-nvshim.toml"]
    assert config.read_text() == CRIO_CONF
    crio.revert(str(config), drop_in=str(drop_in))
    assert config.read_text() == CRIO_CONF
    if existing is None:
        assert not drop_in.parent.exists()
    else:
        assert drop_in.read_text() == existing
    assert sorted(os.listdir(tmp_path)) == ["crio.conf"] + (["crio.conf.d"] if existing else [])


def test_crio_revert_without_backup(tmp_path: Path) -> None:
    """Without a backup the drop-in goes only when it holds our handler."""
    config = tmp_path / "crio.conf"
    drop_in = tmp_path / "crio.conf.d" / "99-nvshim.toml"
    drop_in.parent.mkdir()
    drop_in.write_text('[crio.runtime.runtimes.other]\nruntime_path = "/x"\n')
    result = crio.revert(str(config), drop_in=str(drop_in))
    assert drop_in.exists() and any("has no runtime" in w for w in result.warnings)
    drop_in.write_text('[crio.runtime.runtimes.nvshim]\nruntime_path = "/x"\n')
    crio.revert(str(config), drop_in=str(drop_in))
    assert not drop_in.exists()


def test_crio_read_handlers_merges_drop_ins(tmp_path: Path) -> None:
    """read_handlers applies drop-ins in name order over the main file."""
    config = tmp_path / "crio.conf"
    config.write_text(CRIO_CONF)
    crio.configure(
        str(config),
        drop_in=str(tmp_path / "crio.conf.d" / "99-nvshim.toml"),
        binary=BINARY,
        set_as_default=True,
        force=True,
    )
    seen = crio.read_handlers(str(config))
    assert seen.handlers == {"runc": None, "nvshim": BINARY}
    assert seen.default_runtime == "nvshim"


def test_cli_crio_dry_run(tmp_path: Path) -> None:
    """--runtime crio --dry-run prints the drop-in under its path and writes nothing."""
    drop_in = tmp_path / "d" / "99-nvshim.toml"
    result = _invoke(
        [
            "configure",
            "--runtime",
            "crio",
            "--config",
            str(tmp_path / "crio.conf"),
            "--drop-in",
            str(drop_in),
            "--dry-run",
        ]
    )
    assert result.exception is None, result.exception
    assert result.stdout.startswith(f"# --- {drop_in} ---\n# Written by")
    assert "[crio.runtime.runtimes.nvshim]" in result.stdout
    assert not drop_in.parent.exists()


def test_cli_crio_refuses_enable_cdi(tmp_path: Path) -> None:
    result = _invoke(
        ["configure", "--runtime", "crio", "--config", str(tmp_path / "c"), "--enable-cdi"]
    )
    assert isinstance(result.exception, UsageError)


def test_help_names_all_three_engines() -> None:
    """``configure --help`` names containerd, docker and crio and their files."""
    result = CliRunner().invoke(runtime, ["configure", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for text in (
        "containerd",
        "docker",
        "crio",
        "/etc/docker/daemon.json",
        "/etc/crio/crio.conf.d/99-nvshim.toml",
        "daemon.json",
    ):
        assert text in result.output
