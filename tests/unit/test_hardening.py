"""Defects found trying nvshim as an operator and as an attacker (issue 12), one test each.

Each test names its item number; the fuzz classes live in ``test_fuzz.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod, ownership)")


def nvshim_cli(*args: str, env: dict | None = None, cwd: str | None = None) -> subprocess.CompletedProcess:
    """``nvshim ARGS`` from this checkout, as a user runs it."""
    return subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); "
                           "from nvshim.cli import main; main()", str(REPO), *args],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


# --- 15: large simulated nodes -------------------------------------------------------------


@needs_root
def test_15_sim_creates_large_nodes_with_valid_minors_and_bus_ids(tmp_path: Path) -> None:
    """`nvshim sim create --gpus 256` builds a node discovery reads back: 256 GPUs, distinct
    minors that skip nvidia-modeset (254) and nvidiactl (255), valid ascending PCI bus ids."""
    res = nvshim_cli("sim", "create", str(tmp_path / "n"), "--gpus", "256")
    assert res.returncode == 0, res.stderr
    from nvshim.discovery import Host

    gpus = Host(str(tmp_path / "n")).gpus()
    assert len(gpus) == 256
    minors = [g.minor for g in gpus]
    assert len(set(minors)) == 256 and not {254, 255} & set(minors)
    assert [g.index for g in gpus] == list(range(256))
    buses = [g.pci_bus_id for g in gpus]
    assert buses == sorted(buses) and all(len(b) == 12 for b in buses)
    assert nvshim_cli("sim", "create", str(tmp_path / "m"), "--gpus", "64", "--mig").returncode == 0


# --- 8, 10: the config file ------------------------------------------------------------------


def test_08_duplicate_yaml_key_is_refused(tmp_path: Path) -> None:
    """A key given twice (`require-allocation: true` then `false`) is an error naming the key and both lines."""
    from nvshim.config import load_config
    from nvshim.errors import ConfigError

    path = tmp_path / "config.yaml"
    path.write_text("require-allocation: true\ndebug-log: /tmp/x\nrequire-allocation: false\n")
    with pytest.raises(ConfigError, match=r'line 3: duplicate key "require-allocation" \(first on line 1\)'):
        load_config(str(path))
    res = nvshim_cli("config", "show", "--config", str(path))
    assert res.returncode == 1 and res.stderr.count("\n") == 1 and "duplicate key" in res.stderr


def test_10_explicitly_named_missing_config_is_an_error(tmp_path: Path) -> None:
    """`nvshim config show --config /nonexistent` (and inspect) fail in one line instead of showing defaults."""
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


# --- 12: cdi list ------------------------------------------------------------------------------


def test_12_cdi_list_reads_the_configs_cdi_spec_dirs(tmp_path: Path) -> None:
    """`nvshim cdi list` without --spec-dir lists the devices of the config's cdi-spec-dirs, as the runtime resolves them."""
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "nvidia.yaml").write_text((REPO / "cdi-specs" / "examples" / "nvidia-2gpu.yaml").read_text())
    config = tmp_path / "config.yaml"
    config.write_text(f"cdi-spec-dirs: [{specs}]\n")
    res = nvshim_cli("cdi", "list", env=dict(os.environ, NVSHIM_CONFIG=str(config)))
    assert res.returncode == 0, res.stderr
    assert "nvidia.com/gpu=0" in res.stdout.splitlines()
