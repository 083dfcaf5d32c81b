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
