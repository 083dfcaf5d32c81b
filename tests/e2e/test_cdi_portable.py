"""e2e: CDI specs that travel (``--hook-path``, ``cdi transform root``) and IPC mounts that keep
host submounts (``rbind,rprivate``), through nvshim-runtime → runc on simulated nodes.
What is asserted is what the container sees."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict

import pytest

from nvshim.node.compile import compile_node
from tests.helpers.bundle import make_bundle
from tests.helpers.common import require_root, unique_id
from tests.helpers.node import write_nvshim_config

pytestmark = pytest.mark.e2e

LIBDIR = "/usr/lib/x86_64-linux-gnu"
PROBE = (
    f"ls /dev | grep '^nvidia[0-9]'; readlink {LIBDIR}/libcuda.so.1; "
    f"grep -c NVSHIM-SIM {LIBDIR}/libcuda.so.550.54.15"
)


def nvshim_env(tmp_path: Path, **settings: Any) -> Dict[str, str]:
    cfg = write_nvshim_config(
        tmp_path / "cfg",
        {"runtimes": ["runc"], **{k.replace("_", "-"): v for k, v in settings.items()}},
    )
    compile_node(str(cfg))
    return {"NVSHIM_CONFIG": str(cfg), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def cli(nvshim_bin: str, *args: str) -> None:
    done = subprocess.run([nvshim_bin, *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_spec_with_hook_path_runs_the_installed_nvshim(
    runc: Any, glibc_rootfs: Path, tmp_path: Path, nvshim_runtime_bin: str, nvshim_bin: str
) -> None:
    """A spec from `cdi generate --hook-path <nvshim>` names no venv interpreter, and its hook
    (`nvshim hook …`, run by runc) still makes the SONAME link in the container."""
    require_root()
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=2)
    spec_dir = tmp_path / "cdi"
    cli(
        nvshim_bin,
        "cdi",
        "generate",
        "--driver-root",
        node.root,
        "--hook-path",
        nvshim_bin,
        "--output",
        str(spec_dir / "nvidia.yaml"),
    )
    text = (spec_dir / "nvidia.yaml").read_text()
    assert "python" not in text and f"path: {nvshim_bin}" in text
    env = nvshim_env(tmp_path, driver_root=node.root, cdi_spec_dirs=[str(spec_dir)])
    bundle = make_bundle(
        tmp_path / "b",
        glibc_rootfs,
        ["sh", "-c", PROBE],
        env={"NVIDIA_VISIBLE_DEVICES": "nvidia.com/gpu=1"},
    )
    res = runc.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
    lines = res.stdout.split()
    assert lines[0] == f"nvidia{node.gpus[1].minor}" and "libcuda.so.550.54.15" in lines, (
        res.describe()
    )


def test_transformed_spec_works_from_the_new_root(
    runc: Any, rootfs: Path, tmp_path: Path, nvshim_runtime_bin: str, nvshim_bin: str
) -> None:
    """A spec generated for a driver under A, moved with `cdi transform root --from A --to B`,
    gives a container GPU and libraries from B (A is gone)."""
    require_root()
    from nvshim.sim.build import create_node

    old = tmp_path / "driver-old"
    node = create_node(str(old), gpus=2)
    cli(
        nvshim_bin,
        "cdi",
        "generate",
        "--driver-root",
        node.root,
        "--output",
        str(tmp_path / "old.yaml"),
    )
    new = tmp_path / "driver-new"
    subprocess.run(["cp", "-a", str(old), str(new)], check=True)
    shutil.rmtree(old)
    spec_dir = tmp_path / "cdi"
    cli(
        nvshim_bin,
        "cdi",
        "transform",
        "root",
        "--from",
        str(old),
        "--to",
        str(new),
        "--input",
        str(tmp_path / "old.yaml"),
        "--output",
        str(spec_dir / "nvidia.yaml"),
    )
    assert str(old) not in (spec_dir / "nvidia.yaml").read_text()
    env = nvshim_env(tmp_path, driver_root=str(new), cdi_spec_dirs=[str(spec_dir)])
    bundle = make_bundle(
        tmp_path / "b",
        rootfs,
        ["sh", "-c", PROBE],
        env={"NVIDIA_VISIBLE_DEVICES": "nvidia.com/gpu=0"},
    )
    res = runc.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
    lines = res.stdout.split()
    assert lines[0] == f"nvidia{node.gpus[0].minor}" and lines[-1] == "1", res.describe()


def test_mps_dir_mount_carries_host_submounts(
    runc: Any, rootfs: Path, tmp_path: Path, nvshim_runtime_bin: str
) -> None:
    """The MPS pipe directory is mounted rbind: a filesystem mounted below it on the host
    is visible in the container (a plain bind would show an empty directory)."""
    require_root()
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=1)
    sub = Path(node.root) / "tmp" / "nvidia-mps" / "pipes"
    sub.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "nvshim-e2e-mps", str(sub)], check=True
    )
    try:
        (sub / "control").write_text("mps-pipe\n")
        env = nvshim_env(tmp_path, driver_root=node.root)
        bundle = make_bundle(
            tmp_path / "b",
            rootfs,
            ["sh", "-c", "cat /tmp/nvidia-mps/pipes/control"],
            env={"NVIDIA_VISIBLE_DEVICES": "0"},
        )
        res = runc.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env)
        assert res.check().stdout.strip() == "mps-pipe", res.describe()
    finally:
        subprocess.run(["umount", str(sub)], check=True)
