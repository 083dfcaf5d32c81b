"""e2e: the newest engines (Debian unstable's, :mod:`tests.helpers.debiansid`) reach nvshim.

Each engine is fetched into the test cache on first use; without the network a test skips,
naming why, and under ``CI`` it fails: CI never loses these engines silently.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest
import tomlkit

from tests.helpers.debiansid import containerd_2_dir, engine_or_skip

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BINARY = "/opt/nvshim/bin/nvshim-runtime"
CRI_V3 = "io.containerd.cri.v1.runtime"


@pytest.fixture(scope="module")
def containerd_2() -> Path:
    """sid's containerd 2 bin dir (containerd, its shim, ctr)."""
    return engine_or_skip(containerd_2_dir, "containerd 2.1")


def _containerd(bin_dir: Path, *args: str) -> str:
    done = subprocess.run([str(bin_dir / "containerd"), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _nvshim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvshim.cli.main", *args], cwd=REPO,
                          capture_output=True, text=True)


def _snapshot(root: Path) -> Dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_containerd_2_loads_v3_handler_and_revert_restores(containerd_2: Path,
                                                           tmp_path: Path) -> None:
    """containerd 2's own default (version 3) config, configured by nvshim, loads with the
    handler and CDI on in ``io.containerd.cri.v1.runtime``; --revert restores the bytes."""
    assert _containerd(containerd_2, "--version").split()[2].lstrip("v").startswith("2.")
    config = tmp_path / "config.toml"
    config.write_text(_containerd(containerd_2, "config", "default"))
    assert tomlkit.parse(config.read_text()).unwrap()["version"] == 3
    before = _snapshot(tmp_path)
    done = _nvshim("runtime", "configure", "--config", str(config), "--binary", BINARY,
                   "--enable-cdi")
    assert done.returncode == 0, done.stderr
    merged: Dict[str, Any] = tomlkit.parse(
        _containerd(containerd_2, "--config", str(config), "config", "dump")).unwrap()
    cri = merged["plugins"][CRI_V3]
    handler = cri["containerd"]["runtimes"]["nvshim"]
    assert handler["options"]["BinaryName"] == BINARY
    assert handler["runtime_type"] == "io.containerd.runc.v2"
    assert cri["enable_cdi"] is True
    assert "runc" in cri["containerd"]["runtimes"]  # the default's own handler survives
    done = _nvshim("runtime", "configure", "--config", str(config), "--revert")
    assert done.returncode == 0, done.stderr
    assert _snapshot(tmp_path) == before
