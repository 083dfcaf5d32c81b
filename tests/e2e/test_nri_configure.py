"""e2e: `nvshim runtime configure --enable-nri` as containerd 1.7.24 and 2.1.9 read it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest
import tomlkit

from tests.helpers.debian13 import containerd_node_engines
from tests.helpers.debiansid import containerd_2_dir, engine_or_skip

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NRI = "io.containerd.nri.v1.nri"


def _nvshim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nvshim.cli.main", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _dump(binary: Path, config: Path) -> Dict[str, Any]:
    done = subprocess.run(
        [str(binary), "--config", str(config), "config", "dump"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    doc: Dict[str, Any] = tomlkit.parse(done.stdout).unwrap()
    return doc


def _snapshot(root: Path) -> Dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_enable_nri_on_containerd_17_and_revert(tmp_path: Path) -> None:
    """containerd 1.7's NRI (off by default) is on through nvshim's drop-in, the main file's NRI keys kept; --revert restores every byte."""
    bin_dir, _runc = containerd_node_engines("1.7")
    assert bin_dir is not None
    config = tmp_path / "config.toml"
    config.write_text(
        'version = 2\n[plugins."io.containerd.nri.v1.nri"]\n  socket_path = "/run/x/nri.sock"\n'
    )
    before = _snapshot(tmp_path)
    assert _dump(bin_dir / "containerd", config)["plugins"][NRI]["disable"] is True
    done = _nvshim(
        "runtime",
        "configure",
        "--config",
        str(config),
        "--binary",
        "/opt/nvshim/bin/nvshim-runtime",
        "--enable-nri",
    )
    assert done.returncode == 0, done.stderr
    nri = _dump(bin_dir / "containerd", config)["plugins"][NRI]
    assert (nri["disable"], nri["socket_path"]) == (False, "/run/x/nri.sock")
    done = _nvshim("runtime", "configure", "--config", str(config), "--revert")
    assert done.returncode == 0, done.stderr
    assert _snapshot(tmp_path) == before


def test_enable_nri_changes_nothing_on_containerd_2(tmp_path: Path) -> None:
    """On containerd 2.1's own (version 3) config, --enable-nri changes no NRI key (NRI is on by default) and says so."""
    bin_dir = engine_or_skip(containerd_2_dir, "containerd 2.1")
    config = tmp_path / "config.toml"
    done = subprocess.run(
        [str(bin_dir / "containerd"), "config", "default"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    config.write_text(done.stdout)
    nri_before = _dump(bin_dir / "containerd", config)["plugins"][NRI]
    assert nri_before["disable"] is False
    done = _nvshim(
        "runtime",
        "configure",
        "--config",
        str(config),
        "--binary",
        "/opt/nvshim/bin/nvshim-runtime",
        "--enable-nri",
    )
    assert done.returncode == 0, done.stderr
    assert "--enable-nri: nothing changed" in done.stderr + done.stdout
    assert _dump(bin_dir / "containerd", config)["plugins"][NRI] == nri_before
