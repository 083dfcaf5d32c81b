"""install.sh's node agent: the payload's fast-path client, the installed trampoline that
uses it, and nvshim-agent.service written where asked, valid for systemd, removed by
--uninstall (nothing is enabled in a temp dir)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_install_cdi_refresh import install, snapshot, unit_lines
from tests.helpers.common import require_root, wait_until

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
    assert (
        f"ExecStart={bindir}/nvshim agent --config {etc}/config.yaml --socket "
        "/run/nvshim/agent.sock --nri-socket none"
    ) in service
    assert "Restart=always" in service and "WantedBy=multi-user.target" in service
    assert f"wrote {units}/nvshim-agent.service (not enabled" in done.stderr
    if shutil.which("systemd-analyze"):
        checked = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", str(units / "nvshim-agent.service")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert checked.returncode == 0 and checked.stderr == "", checked.stderr
    gone = install(tmp_path, "--uninstall")
    assert gone.returncode == 0, gone.stderr
    assert snapshot(tmp_path) == before


def test_agent_unit_off_removes_the_unit_an_earlier_install_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .endswith("NVSHIM_AGENT_UNIT=sometimes is neither auto nor off")
    )
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


def test_uninstall_stops_an_agent_started_by_hand(tmp_path: Path) -> None:
    """An `nvshim agent` started from the installed command (no unit: systemd does not run it) is stopped by --uninstall with SIGTERM and says so by pid, so no agent serves from the removed prefix; an agent of another prefix is left alone."""
    import signal
    import sys

    require_root()
    (tmp_path / "bin").mkdir()
    (tmp_path / "etc").mkdir()
    assert install(tmp_path).returncode == 0
    mine = subprocess.Popen(
        [
            str(tmp_path / "bin" / "nvshim"),
            "agent",
            "--socket",
            str(tmp_path / "agent.sock"),
            "--nri-socket",
            "none",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # another install's agent: the checkout's, its interpreter outside the prefix
    other = subprocess.Popen(
        [
            sys.executable,
            "-I",
            "-m",
            "nvshim.cli.main",
            "agent",
            "--socket",
            str(tmp_path / "other.sock"),
            "--nri-socket",
            "none",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    try:
        wait_until(
            lambda: (tmp_path / "agent.sock").exists() and (tmp_path / "other.sock").exists(),
            60,
            "both agents' sockets",
        )
        gone = install(tmp_path, "--uninstall")
        assert gone.returncode == 0, gone.stderr
        assert f"stopped the node agent (pid {mine.pid})" in gone.stderr, gone.stderr
        assert mine.wait(timeout=10) == 0
        assert other.poll() is None
    finally:
        for proc in (mine, other):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=20)


def test_reinstall_stops_the_agent_running_the_replaced_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """install.sh over an install, as the DaemonSet's new installer runs it (NVSHIM_AGENT_UNIT=off, its agent container being the node's agent), stops the agent still running the code it replaced and says so by pid: the container's restart brings it back on the new code, and no agent mixes the two."""
    require_root()
    (tmp_path / "bin").mkdir()
    (tmp_path / "etc").mkdir()
    monkeypatch.setenv("NVSHIM_AGENT_UNIT", "off")
    assert install(tmp_path).returncode == 0
    agent = subprocess.Popen(
        [
            str(tmp_path / "bin" / "nvshim"),
            "agent",
            "--socket",
            str(tmp_path / "agent.sock"),
            "--nri-socket",
            "none",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: (tmp_path / "agent.sock").exists(), 60, "the agent's socket")
        again = install(tmp_path)
        assert again.returncode == 0, again.stderr
        assert (
            f"stopped the node agent (pid {agent.pid}): it ran the code this install replaced"
        ) in again.stderr, again.stderr
        assert agent.wait(timeout=10) == 0
    finally:
        if agent.poll() is None:
            agent.terminate()
            agent.wait(timeout=20)
    assert install(tmp_path, "--uninstall").returncode == 0


def test_nri_without_containerd_is_refused_in_one_line(tmp_path: Path) -> None:
    """install.sh --nri without --containerd exits 1 with one line saying what it goes with (it used to exit 0 and leave NRI off), and installs nothing."""
    require_root()
    (tmp_path / "bin").mkdir()
    (tmp_path / "etc").mkdir()
    before = snapshot(tmp_path)
    refused = install(tmp_path, "--nri")
    assert refused.returncode == 1
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "--nri turns containerd's NRI on in nvshim's containerd drop-in: it goes with "
            "--containerd (CRI-O has NRI on by default from 1.30: [crio.nri] enable_nri = true)"
        )
    )
    assert snapshot(tmp_path) == before


def test_a_config_written_beside_a_kubelet_verifies_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a kubelet's PodResources socket listens, the config install.sh writes says verify-with: kubelet (and where the socket is), and the install says so; without one it stays verify-with: none."""
    import socket as sockets

    require_root()
    (tmp_path / "bin").mkdir()
    (tmp_path / "etc").mkdir()
    kubelet = tmp_path / "kubelet.sock"
    monkeypatch.setenv("NVSHIM_KUBELET_SOCKET", str(kubelet))
    assert install(tmp_path).returncode == 0
    config = tmp_path / "etc" / "nvshim" / "config.yaml"
    assert "\nverify-with: none\n" in config.read_text()
    assert install(tmp_path, "--uninstall").returncode == 0
    with sockets.socket(sockets.AF_UNIX) as listening:
        listening.bind(str(kubelet))
        listening.listen()
        done = install(tmp_path)
    assert done.returncode == 0, done.stderr
    text = config.read_text()
    assert "\nverify-with: kubelet\n" in text and f"\nkubelet-socket: {kubelet}\n" in text
    assert (
        f"(verify-with: kubelet: the kubelet's PodResources socket is at {kubelet})" in done.stderr
    )
    assert install(tmp_path, "--uninstall").returncode == 0
