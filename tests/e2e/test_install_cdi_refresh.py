"""install.sh's CDI refresh units: the systemd path and service units and the udev rule that
run ``nvshim cdi refresh`` when the driver changes, written where asked, valid for systemd,
recorded in the manifest and removed by --uninstall.

The units go to NVSHIM_SYSTEMD_DIR / NVSHIM_UDEV_DIR temp dirs (nothing is enabled there);
``systemd-analyze verify`` checks them when it is installed, ``udevadm verify`` the rule
when this udev has it (systemd 254+), and a strict reading of the rule's syntax always.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List

from tests.helpers.common import require_root
from tests.helpers.payload import payload_dir

REPO = Path(__file__).resolve().parents[2]
UNIT = "nvshim-cdi-refresh"
RULE = "99-nvshim-cdi-refresh.rules"


def snapshot(root: Path) -> Dict[str, object]:
    out: Dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = p.read_bytes() if p.is_file() else None
    return out


def install(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        NVSHIM_PREFIX=str(tmp / "opt"),
        NVSHIM_BINDIR=str(tmp / "bin"),
        NVSHIM_ETCDIR=str(tmp / "etc" / "nvshim"),
        NVSHIM_SKIP_APT="1",
        NVSHIM_CONTAINERD_CONFIG=str(tmp / "etc" / "containerd" / "config.toml"),
        NVSHIM_SYSTEMD_DIR=str(tmp / "etc" / "systemd" / "system"),
        NVSHIM_UDEV_DIR=str(tmp / "etc" / "udev" / "rules.d"),
    )
    # the cached self-contained payload (plain install.sh would build one each time)
    source = [] if "--uninstall" in args else ["--from", str(payload_dir())]
    return subprocess.run(
        ["sh", str(REPO / "install.sh"), *source, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def unit_lines(path: Path) -> List[str]:
    return [line for line in path.read_text().splitlines() if line and not line.startswith("#")]


#: One udev rule key: NAME or NAME{attr}, an operator, a double-quoted value.
_UDEV_KEY = re.compile(r'([A-Z_]+(?:\{[^}]+\})?)(==|!=|\+=|-=|:=|=)"([^"]*)"')


def udev_pairs(line: str) -> List[tuple]:
    """The (key, operator, value) triples of one rule line; AssertionError when any part of
    the line is not ``KEY<op>"value"`` separated by ``, ``."""
    pairs = []
    for part in line.split(", "):
        match = _UDEV_KEY.fullmatch(part)
        assert match is not None, f"not a udev key: {part!r} in {line!r}"
        pairs.append(match.groups())
    return pairs


def test_install_writes_valid_refresh_units_and_uninstall_removes_them(tmp_path: Path) -> None:
    """install.sh writes nvshim-cdi-refresh.path (PathChanged on the running kernel's
    modules.dep, libcuda.so.1 in the driver's library folders, the config, the nvshim
    command), the oneshot service running `nvshim cdi refresh` with bounded restarts, and
    the udev rule on the nvidia module's add; all valid, recorded in the manifest, the same
    bytes on a second install, and gone after --uninstall."""
    require_root()
    (tmp_path / "bin").mkdir()
    (tmp_path / "etc").mkdir()
    before = snapshot(tmp_path)
    done = install(tmp_path)
    assert done.returncode == 0, done.stderr
    units = tmp_path / "etc" / "systemd" / "system"
    rules = tmp_path / "etc" / "udev" / "rules.d"
    etc, bindir = tmp_path / "etc" / "nvshim", tmp_path / "bin"
    assert (
        f"wrote {units}/{UNIT}.path and {UNIT}.service and {rules}/{RULE} (not enabled"
        in done.stderr
    )

    path_unit = unit_lines(units / f"{UNIT}.path")
    changed = [line.split("=", 1)[1] for line in path_unit if line.startswith("PathChanged=")]
    assert changed[:2] == ["/lib/modules/%v/modules.dep", "/lib/modules/%v/modules.dep.bin"]
    for path in (
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
        f"{etc}/config.yaml",
        f"{bindir}/nvshim",
    ):
        assert path in changed, changed
    assert not any("/proc/" in p for p in changed), changed
    assert f"Unit={UNIT}.service" in path_unit and "WantedBy=multi-user.target" in path_unit

    service = unit_lines(units / f"{UNIT}.service")
    for line in (
        "Type=oneshot",
        f"ExecStart={bindir}/nvshim cdi refresh --config {etc}/config.yaml",
        "Restart=on-failure",
        "StartLimitIntervalSec=600",
        "StartLimitBurst=10",
        "ConditionPathExists=|/sys/module/nvidia",
        "ConditionPathExists=|/sys/module/nvidia_current",
        "WantedBy=multi-user.target",
    ):
        assert line in service, service
    assert not any(line.startswith("RemainAfterExit=") for line in service)

    rule = unit_lines(rules / RULE)
    assert len(rule) == 1
    pairs = udev_pairs(rule[0])
    assert pairs[:3] == [
        ("ACTION", "==", "add"),
        ("SUBSYSTEM", "==", "module"),
        ("KERNEL", "==", "nvidia|nvidia_current"),
    ]
    assert pairs[3][:2] == ("RUN", "+=") and pairs[3][2].endswith(
        f"systemctl --no-block start {UNIT}.service"
    )
    assert pairs[3][2].startswith("/")

    manifest = (tmp_path / "opt" / "install-manifest").read_text().splitlines()
    for name in (f"{units}/{UNIT}.path", f"{units}/{UNIT}.service", f"{rules}/{RULE}"):
        assert f"file {name}" in manifest
    assert not any(line.startswith("systemd-enabled ") for line in manifest)

    if shutil.which("systemd-analyze"):

        def verify(*paths: Path) -> subprocess.CompletedProcess:
            return subprocess.run(
                ["systemd-analyze", "verify", "--man=no", *map(str, paths)],
                capture_output=True,
                text=True,
                timeout=60,
            )

        checked = verify(units / f"{UNIT}.service", units / f"{UNIT}.path")
        assert checked.returncode == 0 and checked.stderr == "", checked.stderr
        # the check can fail: an unknown key is said on stderr (exit 0), a missing command fails
        broken = tmp_path / f"{UNIT}-broken.service"
        broken.write_text(
            (units / f"{UNIT}.service")
            .read_text()
            .replace("Type=oneshot", "Type=oneshot\nBogus=1")
            .replace(f"{bindir}/nvshim", "/nonexistent")
        )
        checked = verify(broken)
        broken.unlink()
        assert checked.returncode != 0 and "Bogus" in checked.stderr, checked.stderr
    if (
        shutil.which("udevadm")
        and subprocess.run(["udevadm", "verify", "--help"], capture_output=True).returncode == 0
    ):
        verify = subprocess.run(
            ["udevadm", "verify", str(rules / RULE)], capture_output=True, text=True, timeout=60
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr

    files = {
        p: p.read_bytes() for p in (units / f"{UNIT}.path", units / f"{UNIT}.service", rules / RULE)
    }
    inodes = {p: p.stat().st_ino for p in files}
    again = install(tmp_path)
    assert again.returncode == 0, again.stderr
    assert {p: p.read_bytes() for p in files} == files
    assert {p: p.stat().st_ino for p in files} == inodes  # not rewritten

    gone = install(tmp_path, "--uninstall")
    assert gone.returncode == 0, gone.stderr
    assert snapshot(tmp_path) == before
