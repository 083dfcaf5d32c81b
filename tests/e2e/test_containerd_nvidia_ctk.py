"""e2e: nvshim installed over a containerd that ``nvidia-ctk runtime configure`` set up keeps
every handler, as the real containerd loads the files (``containerd --config X config dump``).

nvidia-ctk writes ``imports = ["<dir>/conf.d/*.toml"]`` into the main file and its handlers
(``nvidia``; the GPU Operator adds ``nvidia-cdi`` and ``nvidia-legacy``, binaries under
``/usr/local/nvidia/toolkit``) into ``conf.d/99-nvidia.toml``, which carries a copy of the
whole CRI table. containerd 1.6 and 1.7 replace an earlier file's CRI table with a later
one's, so nvshim's ``99-nvshim.toml`` (sorting after it) must carry NVIDIA's handlers too.
containerd 1.6 is the machine's; 1.7 is Debian 13's, fetched into a cache
(:mod:`tests.helpers.debian13`). ``config dump`` starts no daemon and writes nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest
import tomlkit

from tests.helpers.containerd_samples import (
    NVIDIA_HANDLERS,
    OPERATOR_TOOLKIT,
    RUNC_CONFIG,
    nvidia_ctk_drop_in,
    nvidia_ctk_main,
)

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CRI = "io.containerd.grpc.v1.cri"
BINARY = "/opt/nvshim/bin/nvshim-runtime"


def _nvshim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nvshim.cli.main", *args], cwd=REPO, capture_output=True, text=True
    )


def _dump(containerd_bin: str, config: Path) -> Dict[str, Any]:
    done = subprocess.run(
        [containerd_bin, "--config", str(config), "config", "dump"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return tomlkit.parse(done.stdout).unwrap()


def _snapshot(root: Path) -> Dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _node(root: Path, etc: str = "etc/containerd", **drop_in: Any) -> Path:
    """A node's containerd files after ``nvidia-ctk runtime configure``; the main file."""
    config_dir = root / etc
    conf_d = config_dir / "conf.d"
    conf_d.mkdir(parents=True)
    config = config_dir / "config.toml"
    config.write_text(nvidia_ctk_main(str(conf_d), RUNC_CONFIG))
    (conf_d / "99-nvidia.toml").write_text(nvidia_ctk_drop_in(runc=True, **drop_in))
    return config


def _runtimes(merged: Dict[str, Any]) -> Dict[str, Any]:
    runtimes: Dict[str, Any] = merged["plugins"][CRI]["containerd"]["runtimes"]
    return runtimes


@pytest.mark.parametrize(
    ("nvidia_default", "nvshim_default", "etc"),
    [
        (False, False, "etc/containerd"),
        (True, True, "etc/containerd"),
        (True, False, "etc/containerd"),
        (False, True, "var/lib/rancher/k3s/agent/etc/containerd"),
    ],
    ids=["glob-import", "both-default", "nvidia-default", "custom-config-path"],
)
def test_nvidia_ctk_handlers_survive_nvshim(
    containerd_bin: str, tmp_path: Path, nvidia_default: bool, nvshim_default: bool, etc: str
) -> None:
    """After configure, containerd's merged config has nvidia, nvidia-cdi, nvidia-legacy, runc
    and nvshim with their options and the right default; --revert restores every byte."""
    config = _node(tmp_path, etc, set_as_default=nvidia_default)
    before = _snapshot(tmp_path)
    flags = ["--set-as-default", "--force"] if nvshim_default else []
    done = _nvshim("runtime", "configure", "--config", str(config), "--binary", BINARY, *flags)
    assert done.returncode == 0, done.stderr

    merged = _dump(containerd_bin, config)
    runtimes = _runtimes(merged)
    assert set(runtimes) == {"runc", "nvshim", *NVIDIA_HANDLERS}
    for name, binary in NVIDIA_HANDLERS.items():
        assert runtimes[name]["options"]["BinaryName"] == f"{OPERATOR_TOOLKIT}/{binary}"
        assert runtimes[name]["options"]["SystemdCgroup"] is True
    assert runtimes["nvshim"]["options"]["BinaryName"] == BINARY
    assert runtimes["nvshim"]["options"]["SystemdCgroup"] is True
    assert runtimes["runc"]["options"]["SystemdCgroup"] is True
    assert merged["plugins"][CRI]["sandbox_image"] == "mirror.local/pause:3.6"
    default = "nvshim" if nvshim_default else ("nvidia" if nvidia_default else "runc")
    assert merged["plugins"][CRI]["containerd"]["default_runtime_name"] == default

    done = _nvshim("runtime", "configure", "--config", str(config), "--revert")
    assert done.returncode == 0, done.stderr
    assert _snapshot(tmp_path) == before


def test_rerun_picks_up_nvidia_ctk_changes(containerd_bin: str, tmp_path: Path) -> None:
    """nvidia-ctk rewriting its drop-in after nvshim (CDI on, a handler gone, one added) shows
    in doctor as a stale copy; configure again carries the change, a third run writes nothing,
    and --revert still restores the node's original bytes."""
    config = _node(tmp_path)
    original = _snapshot(tmp_path)
    args = ["runtime", "configure", "--config", str(config), "--binary", BINARY]
    assert _nvshim(*args).returncode == 0
    nvidia = config.parent / "conf.d" / "99-nvidia.toml"
    nvidia.write_text(
        nvidia_ctk_drop_in(runc=True, enable_cdi=True, handlers=("nvidia", "nvidia-cdi"))
    )
    stale = _nvshim(
        "doctor",
        "--containerd-config",
        str(config),
        "--format",
        "json",
        "--docker-config",
        str(tmp_path / "none"),
        "--crio-config",
        str(tmp_path / "none"),
    )
    drift = [f for f in json.loads(stale.stdout) if f["check"] == "containerd-drop-in"]
    assert drift and drift[0]["status"] == "fail", stale.stdout
    assert f"--binary {BINARY}" in drift[0]["detail"]

    done = _nvshim(*args)
    assert done.returncode == 0, done.stderr
    merged = _dump(containerd_bin, config)
    assert set(_runtimes(merged)) == {"runc", "nvshim", "nvidia", "nvidia-cdi"}
    if "enable_cdi" in merged["plugins"][CRI]:  # 1.7's key; 1.6 has no CDI and drops it
        assert merged["plugins"][CRI]["enable_cdi"] is True
    ours = tomlkit.parse((config.parent / "conf.d" / "99-nvshim.toml").read_text()).unwrap()
    assert ours["plugins"][CRI]["enable_cdi"] is True
    after = _snapshot(tmp_path)
    done = _nvshim(*args)
    assert done.returncode == 0, done.stderr
    assert _snapshot(tmp_path) == after

    nvidia.write_bytes(original["etc/containerd/conf.d/99-nvidia.toml"])
    assert _nvshim("runtime", "configure", "--config", str(config), "--revert").returncode == 0
    assert _snapshot(tmp_path) == original


def test_doctor_names_the_handler_an_old_drop_in_hides(containerd_bin: str, tmp_path: Path) -> None:
    """A drop-in that copied only the main file's table (what nvshim wrote before) hides
    NVIDIA's handlers from the real containerd; doctor fails naming each, with a fix that keeps
    --set-as-default and --binary, and that fix makes containerd see them again."""
    config = _node(tmp_path)
    ours = config.parent / "conf.d" / "99-nvshim.toml"
    ours.write_text(
        "# Written by `nvshim runtime configure`; `nvshim runtime configure --revert` removes "
        "it.\n" + RUNC_CONFIG + f'[plugins."{CRI}".containerd]\n'
        'default_runtime_name = "nvshim"\n'
        f'[plugins."{CRI}".containerd.runtimes.nvshim]\nruntime_type = "io.containerd.runc.v2"\n'
        f'container_annotations = ["cdi.k8s.io/*"]\n'
        f'[plugins."{CRI}".containerd.runtimes.nvshim.options]\nBinaryName = "{BINARY}"\n'
    )
    assert set(_runtimes(_dump(containerd_bin, config))) == {"runc", "nvshim"}

    done = _nvshim(
        "doctor",
        "--containerd-config",
        str(config),
        "--format",
        "json",
        "--docker-config",
        str(tmp_path / "none"),
        "--crio-config",
        str(tmp_path / "none"),
    )
    found = {f["check"]: f for f in json.loads(done.stdout)}
    lost = found["containerd-handlers"]
    assert lost["status"] == "fail" and done.returncode == 1
    for name in NVIDIA_HANDLERS:
        assert f'"{name}"' in lost["message"]
    fix = lost["fix"]
    assert "--set-as-default" in fix and f"--binary {BINARY}" in fix
    command = fix.split(" (")[0].split()
    assert command[:3] == ["nvshim", "runtime", "configure"]
    assert _nvshim(*command[1:], "--force").returncode == 0
    assert set(_runtimes(_dump(containerd_bin, config))) == {"runc", "nvshim", *NVIDIA_HANDLERS}
