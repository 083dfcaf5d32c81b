"""``nvshim system create-device-nodes`` / ``create-dev-char-symlinks`` on simulated nodes.

Everything is written under temp dev roots, never the real /dev.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Dict, Tuple

import pytest
from click.testing import CliRunner

from nvshim.cli.cmd_system import system
from nvshim.errors import HostError
from nvshim.host.system import plan_device_nodes, read_proc_devices
from tests.helpers.commands import run_cli

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")


def char_nodes(dev: Path) -> Dict[str, Tuple[int, int, int]]:
    """relative path → (major, minor, mode) of every char device under ``dev``."""
    found = {}
    for path in dev.rglob("*"):
        st = path.lstat()
        if stat.S_ISCHR(st.st_mode):
            found[str(path.relative_to(dev))] = (
                os.major(st.st_rdev),
                os.minor(st.st_rdev),
                stat.S_IMODE(st.st_mode),
            )
    return found


@pytest.fixture
def node(tmp_path: Path) -> Any:
    """A node whose /dev holds the NVIDIA driver's nodes only: no nvidia-drm (its /dev/dri
    nodes are the kernel's DRM subsystem's, which nvidia-modprobe never makes)."""
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path / "node"), gpus=3, shuffle_minors=True, mig=True, drm=False)


def test_read_proc_devices_takes_only_character_devices() -> None:
    text = (
        "Character devices:\n  1 mem\n195 nvidia-frontend\n510 nvidia-uvm\n195 nvidia\n\n"
        "Block devices:\n259 blkext\n  8 sd\n"
    )
    assert read_proc_devices(text) == {
        "mem": 1,
        "nvidia-frontend": 195,
        "nvidia-uvm": 510,
        "nvidia": 195,
    }


def test_creates_the_nodes_the_driver_serves(
    node: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """From the node's procfs alone, the same nodes (major, minor, mode) the sim made;
    a second run creates nothing."""
    dev_root = tmp_path / "devroot"
    rc, out, _ = run_cli(
        ["system", "create-device-nodes", "--driver-root", node.root, "--dev-root", str(dev_root)],
        capsys,
    )
    assert rc == 0, out
    made = char_nodes(dev_root / "dev")
    assert made == char_nodes(Path(node.root) / "dev")
    assert f"nvidia{node.gpus[2].minor}" in made
    assert "nvidia-caps/nvidia-cap1" in made and made["nvidia-caps/nvidia-cap1"][2] == 0o400
    rc, out, _ = run_cli(
        [
            "system",
            "create-device-nodes",
            "--driver-root",
            node.root,
            "--dev-root",
            str(dev_root),
            "--format",
            "json",
        ],
        capsys,
    )
    assert rc == 0
    actions = {o["action"] for o in json.loads(out)["outcomes"]}
    assert actions == {"exists"}


def test_dry_run_creates_nothing(
    node: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = run_cli(
        [
            "system",
            "create-device-nodes",
            "--driver-root",
            node.root,
            "--dev-root",
            str(tmp_path / "d"),
            "--dry-run",
        ],
        capsys,
    )
    assert rc == 0 and "would-create" in out and "/dev/nvidiactl" in out
    assert not (tmp_path / "d").exists()


def test_conflicting_node_is_left_alone_and_exits_1(
    node: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A /dev/nvidiactl with another major:minor is reported, not replaced; exit 1."""
    dev = tmp_path / "d" / "dev"
    dev.mkdir(parents=True)
    os.mknod(dev / "nvidiactl", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    rc, out, _ = run_cli(
        [
            "system",
            "create-device-nodes",
            "--driver-root",
            node.root,
            "--dev-root",
            str(tmp_path / "d"),
        ],
        capsys,
    )
    assert rc == 1
    assert "conflict" in out and "char 1:3" in out
    assert os.stat(dev / "nvidiactl").st_rdev == os.makedev(1, 3)
    assert (dev / "nvidia-uvm").exists()  # the others are still made


def test_params_mode_and_missing_uvm(node: Any) -> None:
    """DeviceFileMode/GID from params apply to GPU and control nodes; no nvidia-uvm in
    /proc/devices means no UVM nodes and a note."""
    params = Path(node.root) / "proc/driver/nvidia/params"
    params.chmod(0o644)
    params.write_text(
        "ModifyDeviceFiles: 1\nDeviceFileUID: 0\nDeviceFileGID: 44\nDeviceFileMode: 432\n"
    )
    devices = Path(node.root) / "proc/devices"
    devices.chmod(0o644)
    devices.write_text(devices.read_text().replace("510 nvidia-uvm\n", ""))
    nodes, notes = plan_device_nodes(node.root)
    by_path = {n.path: n for n in nodes}
    assert by_path["/dev/nvidiactl"].mode == 0o660 and by_path["/dev/nvidiactl"].gid == 44
    assert "/dev/nvidia-uvm" not in by_path
    assert any("nvidia-uvm" in note for note in notes)


def test_no_driver_is_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "devices").write_text("Character devices:\n  1 mem\n")
    with pytest.raises(HostError, match="no NVIDIA driver"):
        plan_device_nodes(str(tmp_path))
    rc, _, err = run_cli(["system", "create-device-nodes", "--driver-root", str(tmp_path)], capsys)
    assert rc == 1 and err.startswith("nvshim: no NVIDIA driver") and err.count("\n") == 1


def test_dev_char_links_resolve_to_every_nvidia_node(
    node: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every NVIDIA node gets dev/char/<major>:<minor>, a relative link that resolves to it;
    other devices get none; a second run creates nothing."""
    dev_root = Path(node.dev_root)
    os.mknod(dev_root / "dev" / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    rc, out, _ = run_cli(
        ["system", "create-dev-char-symlinks", "--dev-root", str(dev_root)], capsys
    )
    assert rc == 0, out
    char = dev_root / "dev" / "char"
    nodes = char_nodes(dev_root / "dev")
    nodes.pop("null")
    assert sorted(os.listdir(char)) == sorted(f"{ma}:{mi}" for ma, mi, _ in nodes.values())
    for name, (major, minor, _mode) in nodes.items():
        link = char / f"{major}:{minor}"
        assert not os.readlink(link).startswith("/")
        assert os.path.realpath(link) == str((dev_root / "dev" / name).resolve())
    rc, out, _ = run_cli(
        ["system", "create-dev-char-symlinks", "--dev-root", str(dev_root), "--format", "json"],
        capsys,
    )
    assert {o["action"] for o in json.loads(out)["outcomes"]} == {"exists"}


def test_dev_char_conflict_and_dry_run(node: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A link pointing elsewhere is left alone (exit 1); --dry-run writes nothing."""
    dev_root = Path(node.dev_root)
    rc, out, _ = run_cli(
        ["system", "create-dev-char-symlinks", "--dev-root", str(dev_root), "--dry-run"], capsys
    )
    assert rc == 0 and "would-create" in out and not (dev_root / "dev" / "char").exists()
    (dev_root / "dev" / "char").mkdir()
    os.symlink("../null", dev_root / "dev" / "char" / "195:255")
    rc, out, _ = run_cli(
        ["system", "create-dev-char-symlinks", "--dev-root", str(dev_root)], capsys
    )
    assert rc == 1 and "conflict" in out
    assert os.readlink(dev_root / "dev" / "char" / "195:255") == "../null"


def test_help_explains_systemd_reason() -> None:
    """--help of both commands; the links' help names systemd and daemon-reload."""
    runner = CliRunner()
    links = runner.invoke(system, ["create-dev-char-symlinks", "--help"], terminal_width=200)
    assert links.exit_code == 0
    for text in ("systemd", "daemon-reload", "/dev/char/<major>:<minor>", "--dry-run", "--format"):
        assert text in links.output
    nodes = runner.invoke(system, ["create-device-nodes", "--help"], terminal_width=200)
    assert nodes.exit_code == 0 and "/proc/devices" in nodes.output and "--dry-run" in nodes.output


def test_dev_char_links_wrong_dev_root_and_no_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dev root without dev/ is a one-line error; one without NVIDIA nodes is a note, rc 0."""
    rc, _, err = run_cli(
        ["system", "create-dev-char-symlinks", "--dev-root", str(tmp_path / "nope")], capsys
    )
    assert rc == 1 and err.count("\n") == 1 and "wrong --dev-root" in err
    (tmp_path / "empty" / "dev").mkdir(parents=True)
    rc, out, err = run_cli(
        ["system", "create-dev-char-symlinks", "--dev-root", str(tmp_path / "empty")], capsys
    )
    assert rc == 0 and out == "" and "nothing to link" in err


def test_quiet_drops_the_notes_not_the_outcomes_or_errors(
    node: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`nvshim --quiet system …` prints no notes on stderr; the outcome lines (the result)
    and a one-line error still print."""
    (tmp_path / "empty" / "dev").mkdir(parents=True)
    empty = ["system", "create-dev-char-symlinks", "--dev-root", str(tmp_path / "empty")]
    assert run_cli(["--quiet", *empty], capsys) == (0, "", "")
    assert "nothing to link" in run_cli(empty, capsys)[2]
    rc, out, err = run_cli(
        ["--quiet", "system", "create-dev-char-symlinks", "--dev-root", node.root], capsys
    )
    assert rc == 0 and err == "" and "/dev/char/" in out
    rc, _, err = run_cli(
        ["--quiet", "system", "create-dev-char-symlinks", "--dev-root", str(tmp_path / "nope")],
        capsys,
    )
    assert rc == 1 and err.count("\n") == 1 and "wrong --dev-root" in err


def test_help_shows_dir_for_the_roots() -> None:
    """--driver-root and --dev-root take directories and say DIR."""
    runner = CliRunner()
    nodes = runner.invoke(system, ["create-device-nodes", "--help"], terminal_width=200)
    links = runner.invoke(system, ["create-dev-char-symlinks", "--help"], terminal_width=200)
    assert "--driver-root DIR " in nodes.output and "--dev-root DIR " in nodes.output
    assert "--dev-root DIR " in links.output and "DIRECTORY" not in nodes.output + links.output


@pytest.mark.parametrize("damage", ["minor", "major", "uid"])
def test_numbers_linux_cannot_have_are_one_line_errors(
    node: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    """A damaged procfs copy (a minor or major past dev_t, a uid past 32 bits) ended in an
    OverflowError traceback from mknod/chown; now one line naming what is wrong, and
    nothing is created."""
    import re

    root = Path(node.root)
    if damage == "minor":
        info = sorted((root / "proc/driver/nvidia/gpus").glob("*/information"))[0]
        info.write_text(
            re.sub(r"(?m)^Device Minor:.*$", "Device Minor: 99999999999999999999", info.read_text())
        )
        expected = r"99999999999999999999, which is not a Linux device number"
    elif damage == "major":
        devices = root / "proc/devices"
        devices.write_text(
            re.sub(r"(?m)^\s*\d+ (nvidia-frontend|nvidia)$", r"70000 \1", devices.read_text())
        )
        expected = r"would be 70000:\d+, which is not a Linux device number"
    else:
        params = root / "proc/driver/nvidia/params"
        params.write_text(params.read_text() + "DeviceFileUID: 4294967296\n")
        expected = "DeviceFileUID 4294967296 is not a user or group id"
    with pytest.raises(HostError, match=expected):
        plan_device_nodes(str(root))
    dev_root = tmp_path / "devroot"
    rc, out, err = run_cli(
        ["system", "create-device-nodes", "--driver-root", str(root), "--dev-root", str(dev_root)],
        capsys,
    )
    assert rc == 1 and err.count("\n") == 1 and err.startswith("nvshim: ")
    assert not dev_root.exists() or not char_nodes(dev_root / "dev")
