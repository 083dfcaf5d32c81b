"""e2e: two nvshim handlers side by side in one engine config (issue 37 item 1).

``nvshim runtime configure`` with a second ``--name`` must add that handler beside the first,
never rewrite the shared file with only the second; ``--revert --name`` takes out that one
handler and leaves the others. containerd is checked through what it really loads
(``containerd --config X config dump``: the machine's 1.6 and Debian 13's 1.7, no daemon);
Docker's daemon.json and CRI-O's drop-in through nvshim's readers of the merged files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest
import tomlkit

from tests.helpers.containerd_samples import DEBIAN_CONFIG

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CRI = "io.containerd.grpc.v1.cri"
BINARY = "/opt/nvshim/bin/nvshim-runtime"
BINARY_RA = "/opt/nvshim-ra/bin/nvshim-runtime"


def _nvshim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nvshim.cli.main", "runtime", "configure", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
    )


def _ok(*args: str) -> str:
    done = _nvshim(*args)
    assert done.returncode == 0, done.stderr
    return done.stderr


def _handlers(containerd_bin: str, config: Path) -> Dict[str, Any]:
    done = subprocess.run(
        [containerd_bin, "--config", str(config), "config", "dump"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    merged = tomlkit.parse(done.stdout).unwrap()
    return {
        name: table.get("options", {}).get("BinaryName")
        for name, table in merged["plugins"][CRI]["containerd"]["runtimes"].items()
    }


def test_containerd_second_handler_keeps_the_first(containerd_bin: str, tmp_path: Path) -> None:
    """A second containerd handler is added beside the first, and reverting one leaves the other."""
    config = tmp_path / "config.toml"
    config.write_text(DEBIAN_CONFIG)
    _ok("--config", str(config), "--binary", BINARY)
    said = _ok("--config", str(config), "--name", "nvshim-ra", "--binary", BINARY_RA)
    assert '"nvshim-ra"' in said and '"nvshim"' in said, said
    handlers = _handlers(containerd_bin, config)
    assert handlers["nvshim"] == BINARY and handlers["nvshim-ra"] == BINARY_RA

    _ok("--config", str(config), "--revert", "--name", "nvshim-ra")
    handlers = _handlers(containerd_bin, config)
    assert handlers.get("nvshim") == BINARY and "nvshim-ra" not in handlers

    _ok("--config", str(config), "--revert")
    assert config.read_text() == DEBIAN_CONFIG
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["config.toml"]


def test_docker_second_runtime_keeps_the_first(tmp_path: Path) -> None:
    """A second Docker runtime is added beside the first; reverting one leaves the other."""
    from nvshim.node.engines.docker import read_runtimes

    config = tmp_path / "daemon.json"
    original = '{\n    "log-level": "warn"\n}\n'
    config.write_text(original)
    bindir = tmp_path / "bin"
    _ok(
        "--runtime",
        "docker",
        "--config",
        str(config),
        "--binary",
        str(bindir / "a" / "nvshim-runtime"),
    )
    _ok(
        "--runtime",
        "docker",
        "--config",
        str(config),
        "--name",
        "nvshim-ra",
        "--binary",
        str(bindir / "b" / "nvshim-runtime"),
    )
    assert read_runtimes(str(config)).runtimes == {
        "nvshim": str(bindir / "a" / "nvshim-runtime"),
        "nvshim-ra": str(bindir / "b" / "nvshim-runtime"),
    }
    _ok("--runtime", "docker", "--config", str(config), "--revert", "--name", "nvshim-ra")
    assert read_runtimes(str(config)).runtimes == {"nvshim": str(bindir / "a" / "nvshim-runtime")}
    assert json.loads(config.read_text())["log-level"] == "warn"
    _ok("--runtime", "docker", "--config", str(config), "--revert")
    assert config.read_text() == original


def test_crio_second_handler_keeps_the_first(tmp_path: Path) -> None:
    """A second CRI-O handler is added to nvshim's drop-in beside the first; revert leaves the other."""
    from nvshim.node.engines.crio import read_handlers

    config = tmp_path / "crio.conf"
    config.write_text('[crio.runtime]\ndefault_runtime = "runc"\n')
    _ok("--runtime", "crio", "--config", str(config), "--binary", BINARY)
    _ok("--runtime", "crio", "--config", str(config), "--name", "nvshim-ra", "--binary", BINARY_RA)
    handlers = read_handlers(str(config)).handlers
    assert handlers["nvshim"] == BINARY and handlers["nvshim-ra"] == BINARY_RA
    _ok("--runtime", "crio", "--config", str(config), "--revert", "--name", "nvshim-ra")
    handlers = read_handlers(str(config)).handlers
    assert handlers.get("nvshim") == BINARY and "nvshim-ra" not in handlers
    _ok("--runtime", "crio", "--config", str(config), "--revert")
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["crio.conf"]


def test_doctor_notices_a_configured_handler_containerd_lost(
    containerd_bin: str, tmp_path: Path
) -> None:
    """doctor fails when containerd no longer loads a handler runtime configure recorded."""
    config = tmp_path / "config.toml"
    config.write_text(DEBIAN_CONFIG)
    _ok("--config", str(config), "--binary", BINARY)
    _ok("--config", str(config), "--name", "nvshim-ra", "--binary", BINARY_RA)
    drop_in = tmp_path / "conf.d" / "99-nvshim.toml"
    doc = tomlkit.parse(drop_in.read_text())
    del doc["plugins"][CRI]["containerd"]["runtimes"]["nvshim"]  # as the old configure did
    drop_in.write_text(tomlkit.dumps(doc))
    assert "nvshim" not in _handlers(containerd_bin, config)

    def configured() -> list:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "nvshim.cli.main",
                "doctor",
                "--format",
                "json",
                "--containerd-config",
                str(config),
                "--docker-config",
                str(tmp_path / "none"),
                "--crio-config",
                str(tmp_path / "none"),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        return [f for f in json.loads(done.stdout) if f["check"] == "configured"]

    found = configured()
    assert [f["status"] for f in found] == ["fail"], found
    assert 'runtime "nvshim" ' in found[0]["message"], found
    _ok("--config", str(config), "--binary", BINARY)
    assert configured() == []
