"""e2e: one staleness judgement and one fix text for a CDI spec (issue 37 item 3).

``nvshim cdi generate --driver-root SIM --output D/nvidia.yaml`` on a simulated node, a
config with ``cdi-spec-dirs: [D]`` and ``driver-root: SIM``: right after, ``doctor`` and
``cdi generate --check`` both say current. Once the node's driver moves on, both say stale,
with the same fix text, which the create's ``stale-cdi-spec`` line ends with too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from tests.helpers.common import require_root

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def _nvshim(*args: str, config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvshim.cli.main", *args], cwd=REPO,
                          capture_output=True, text=True,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                               "NVSHIM_CONFIG": str(config)})


def _cdi_findings(tmp_path: Path, config: Path) -> List[Dict[str, Any]]:
    done = _nvshim("doctor", "--format", "json", "--config", str(config),
                   "--containerd-config", str(tmp_path / "none"),
                   "--docker-config", str(tmp_path / "none"),
                   "--crio-config", str(tmp_path / "none"),
                   "--trampoline", str(tmp_path / "nvshim-runtime"), config=config)
    return [f for f in json.loads(done.stdout) if f["check"] == "cdi-specs"]


def test_generated_spec_is_current_everywhere_and_stale_says_one_fix(tmp_path: Path) -> None:
    """A spec cdi generate just wrote is current for doctor and --check; stale, both give one fix."""
    require_root()
    from nvshim.sim.build import create_node

    sim = create_node(str(tmp_path / "sim"), gpus=2, driver_version="550.54.15")
    spec_dir = tmp_path / "cdi"
    spec = spec_dir / "nvidia.yaml"
    config = tmp_path / "config.yaml"
    config.write_text(f"driver-root: {sim.root}\ncdi-spec-dirs: [{spec_dir}]\n")
    done = _nvshim("cdi", "generate", "--driver-root", sim.root, "--output", str(spec),
                   config=config)
    assert done.returncode == 0, done.stderr

    check = _nvshim("cdi", "generate", "--driver-root", sim.root, "--check", str(spec),
                    config=config)
    assert check.returncode == 0, check.stderr
    found = _cdi_findings(tmp_path, config)
    assert [f["status"] for f in found] == ["ok"], found

    newer = create_node(str(tmp_path / "sim2"), gpus=2, driver_version="560.35.03")
    config.write_text(f"driver-root: {newer.root}\ncdi-spec-dirs: [{spec_dir}]\n")
    check = _nvshim("cdi", "generate", "--driver-root", newer.root, "--check", str(spec),
                    config=config)
    assert check.returncode == 1
    found = _cdi_findings(tmp_path, config)
    assert [f["status"] for f in found] == ["fail"], found
    fix = found[0]["fix"]
    assert fix == f"regenerate it with nvshim cdi generate --output {spec}", fix
    assert check.stderr.rstrip().endswith(fix), check.stderr
