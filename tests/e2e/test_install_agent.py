"""install.sh's node agent: the payload's fast-path client, the installed trampoline that
uses it, and nvshim-agent.service written where asked, valid for systemd, removed by
--uninstall (nothing is enabled in a temp dir)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_install_cdi_refresh import install, snapshot, unit_lines
from tests.helpers.common import require_root

pytestmark = pytest.mark.e2e


def test_install_ships_the_client_and_the_agent_unit(tmp_path: Path) -> None:
    """The installed prefix has libexec/nvshim-agent-client (static, it runs), the installed
    nvshim-runtime hands GPU creates to it on /run/nvshim/agent.sock, install.sh writes
    nvshim-agent.service running `nvshim agent` for the installed config, and --uninstall
    leaves the tree as it was."""
    require_root()
    (tmp_path / "bin").mkdir()
    (tmp_path / "etc").mkdir()
    before = snapshot(tmp_path)
    done = install(tmp_path)
    assert done.returncode == 0, done.stderr
    client = tmp_path / "opt" / "libexec" / "nvshim-agent-client"
    assert subprocess.run([str(client)], capture_output=True).returncode == 2  # not served
    assert b"ld-linux" not in client.read_bytes()[:4096]  # static: no interpreter
    tramp = (tmp_path / "bin" / "nvshim-runtime").read_text()
    assert f"[ -x {client} ]" in tramp and "/run/nvshim/agent.sock" in tramp
    units = tmp_path / "etc" / "systemd" / "system"
    service = unit_lines(units / "nvshim-agent.service")
    etc, bindir = tmp_path / "etc" / "nvshim", tmp_path / "bin"
    assert (f"ExecStart={bindir}/nvshim agent --config {etc}/config.yaml --socket "
            "/run/nvshim/agent.sock --nri-socket none") in service
    assert "Restart=always" in service and "WantedBy=multi-user.target" in service
    assert f"wrote {units}/nvshim-agent.service (not enabled" in done.stderr
    if shutil.which("systemd-analyze"):
        checked = subprocess.run(["systemd-analyze", "verify", "--man=no",
                                  str(units / "nvshim-agent.service")],
                                 capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0 and checked.stderr == "", checked.stderr
    gone = install(tmp_path, "--uninstall")
    assert gone.returncode == 0, gone.stderr
    assert snapshot(tmp_path) == before


def test_agent_unit_off_removes_the_unit_an_earlier_install_wrote(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVSHIM_AGENT_UNIT=off (what the DaemonSet's installer passes: its agent container is
    the node's agent) writes no nvshim-agent.service and takes out the one an earlier install
    wrote, so two agents never serve one socket; a value other than auto/off installs nothing."""
    require_root()
    (tmp_path / "bin").mkdir()
    (tmp_path / "etc").mkdir()
    before = snapshot(tmp_path)
    monkeypatch.setenv("NVSHIM_AGENT_UNIT", "sometimes")
    refused = install(tmp_path)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1].endswith(
        "NVSHIM_AGENT_UNIT=sometimes is neither auto nor off")
    assert snapshot(tmp_path) == before
    monkeypatch.delenv("NVSHIM_AGENT_UNIT")
    assert install(tmp_path).returncode == 0
    unit = tmp_path / "etc" / "systemd" / "system" / "nvshim-agent.service"
    assert unit.is_file()
    monkeypatch.setenv("NVSHIM_AGENT_UNIT", "off")
    again = install(tmp_path)
    assert again.returncode == 0, again.stderr
    assert not unit.exists()
    assert "removed nvshim-agent.service (NVSHIM_AGENT_UNIT=off" in again.stderr
    assert "nvshim-agent" not in (tmp_path / "opt" / "install-manifest").read_text()
    gone = install(tmp_path, "--uninstall")
    assert gone.returncode == 0, gone.stderr
    assert snapshot(tmp_path) == before
