"""ModifyDeviceFiles: 0 inside the container: when the hook is planned, and what it binds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, List

import pytest

from nvshim.config import Config
from nvshim.runtime.create import plan_create
from nvshim.runtime.devparams import BUNDLE_FILE, modified_params

PARAMS = "proc/driver/nvidia/params"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if os.geteuid() != 0:
        pytest.skip("the simulated GPU node needs root (mknod)")
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("params") / "n"), gpus=2)


def bundle(tmp_path: Path, env: List[str]) -> str:
    b = tmp_path / f"bundle-{time.monotonic_ns()}"
    (b / "rootfs").mkdir(parents=True)
    spec = {"process": {"env": ["PATH=/bin"] + env}, "root": {"path": "rootfs"}, "mounts": []}
    (b / "config.json").write_text(json.dumps(spec))
    return str(b)


def params_hooks(plan: Any) -> List[Any]:
    return [h for h in plan.edits.hooks if "nvshim-params" in h.args]


def test_sim_node_params_look_like_the_kernel_modules(node: Any) -> None:
    """nvshim sim writes proc/driver/nvidia/params as the driver does (ModifyDeviceFiles: 1)."""
    text = Path(node.root, PARAMS).read_text()
    assert "ModifyDeviceFiles: 1\n" in text and "DeviceFileMode: 438\n" in text


def test_copy_is_the_hosts_with_modification_off(node: Any, tmp_path: Path) -> None:
    """Only the ModifyDeviceFiles line changes; 0 on the host, or no file, means no copy."""
    host = Path(node.root, PARAMS).read_bytes()
    off_line = host.replace(b"ModifyDeviceFiles: 1", b"ModifyDeviceFiles: 0")
    assert modified_params(node.root) == off_line
    off = tmp_path / "off"
    (off / "proc/driver/nvidia").mkdir(parents=True)
    (off / PARAMS).write_bytes(host.replace(b"ModifyDeviceFiles: 1", b"ModifyDeviceFiles: 0"))
    assert modified_params(str(off)) is None
    assert modified_params(str(tmp_path / "none")) is None


def test_gpu_create_plans_the_sh_hook_and_writes_the_copy(node: Any, tmp_path: Path) -> None:
    """A GPU container gets one sh hook (no Python) binding the bundle copy; commit writes
    it 0444."""
    from nvshim.runtime.create import commit

    b = bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0"])
    plan = plan_create(b, Config(driver_root=node.root, grants_journal=None))
    (hook,) = params_hooks(plan)
    copy = os.path.join(b, BUNDLE_FILE)
    assert hook.hook_name == "createContainer" and hook.path == "/bin/sh"
    assert hook.args[-2:] == (os.path.join(b, "rootfs"), copy)
    assert not any("python" in a for a in hook.args) and hook.env
    assert commit(plan).written
    assert Path(copy).read_bytes() == modified_params(node.root)
    assert os.stat(copy).st_mode & 0o777 == 0o444
    spec = json.loads(Path(b, "config.json").read_text())
    assert any(h.get("args", [])[-1:] == [copy] for h in spec["hooks"]["createContainer"])


def test_hook_gets_absolute_paths_for_a_relative_bundle(
    node: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """runtime create --bundle with a relative path: the hook still gets the absolute rootfs
    and copy (runc does not run hooks in the bundle directory)."""
    b = bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0"])
    monkeypatch.chdir(tmp_path)
    plan = plan_create(os.path.basename(b), Config(driver_root=node.root, grants_journal=None))
    (hook,) = params_hooks(plan)
    assert hook.args[-2:] == (os.path.join(b, "rootfs"), os.path.join(b, BUNDLE_FILE))


@pytest.mark.parametrize("env", [["FOO=1"], ["NVIDIA_VISIBLE_DEVICES=void"]])
def test_no_gpu_no_hook_no_copy(node: Any, tmp_path: Path, env: List[str]) -> None:
    b = bundle(tmp_path, env)
    plan = plan_create(b, Config(driver_root=node.root, grants_journal=None))
    assert params_hooks(plan) == [] and plan.grant.params is None


def test_config_off_means_no_hook(node: Any, tmp_path: Path) -> None:
    b = bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0"])
    cfg = Config(driver_root=node.root, grants_journal=None, disable_device_node_modification=False)
    plan = plan_create(b, cfg)
    assert params_hooks(plan) == [] and plan.grant.params is None


def _run_hook(rootfs: Path, copy: Path) -> "subprocess.CompletedProcess[str]":
    """The hook's script, run as runc would (explicit env), in a private mount namespace;
    afterwards the same namespace prints what the container's params path shows."""
    from nvshim.runtime.devparams import HOOK_SCRIPT

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    probe = (
        'sh -c "$0" nvshim-params "$1" "$2"; rc=$?; cat "$1/proc/driver/nvidia/params"; exit $rc'
    )
    return subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            probe,
            HOOK_SCRIPT,
            str(rootfs),
            str(copy),
        ],
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize("link", ["proc", "proc/driver", "proc/driver/nvidia", PARAMS])
@pytest.mark.parametrize("absolute", [True, False])
def test_hook_never_binds_through_an_image_symlink(
    tmp_path: Path, link: str, absolute: bool
) -> None:
    """An image symlink anywhere on the params path, absolute (it would resolve on the host
    before pivot_root) or relative out of the rootfs, makes the hook bind nothing."""
    outside = tmp_path / "host"
    (outside / "driver" / "nvidia").mkdir(parents=True)
    (outside / "driver" / "nvidia" / "params").write_text("host file\n")
    rootfs = tmp_path / "rootfs"
    (rootfs / PARAMS).parent.mkdir(parents=True)
    (rootfs / PARAMS).write_text("ModifyDeviceFiles: 1\n")
    victim = {
        "proc": tmp_path / "host-proc",
        "proc/driver": outside / "driver",
        "proc/driver/nvidia": outside / "driver" / "nvidia",
        PARAMS: outside / "driver" / "nvidia" / "params",
    }[link]
    if link == "proc":
        (victim / "driver").mkdir(parents=True)
        (victim / "driver" / "nvidia").symlink_to(outside / "driver" / "nvidia")
    placed = rootfs / link
    if placed.is_dir():
        shutil.rmtree(placed)
    else:
        placed.unlink()
    placed.symlink_to(victim if absolute else os.path.relpath(victim, placed.parent))
    copy = tmp_path / "copy"
    copy.write_text("ModifyDeviceFiles: 0\n")
    done = _run_hook(rootfs, copy)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "host file\n", "the hook bound over a path an image symlink chose"
    assert (outside / "driver" / "nvidia" / "params").read_text() == "host file\n"


def test_hook_binds_under_a_rootfs_path_with_host_symlinks(tmp_path: Path) -> None:
    """The rootfs path itself may pass through host symlinks (a relocated /var/lib): the
    hook compares physical paths, so it still binds; the copy stays in the bundle."""
    real = tmp_path / "real"
    (real / "rootfs" / PARAMS).parent.mkdir(parents=True)
    (real / "rootfs" / PARAMS).write_text("ModifyDeviceFiles: 1\n")
    (tmp_path / "via").symlink_to(real)
    copy = tmp_path / "copy"
    copy.write_text("ModifyDeviceFiles: 0\n")
    done = _run_hook(tmp_path / "via" / "rootfs", copy)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ModifyDeviceFiles: 0\n"
    assert copy.read_text() == "ModifyDeviceFiles: 0\n"


def test_hook_runs_no_command_but_mount() -> None:
    """Only sh builtins decide (stat and rm were two fork+execs per GPU create)."""
    from nvshim.runtime.devparams import HOOK_SCRIPT

    words = {line.split()[0] for line in HOOK_SCRIPT.splitlines() if line.strip()}
    assert "stat" not in HOOK_SCRIPT and "rm " not in HOOK_SCRIPT and "$(" not in HOOK_SCRIPT
    assert words <= {"r=$1", "cd", "R=$PWD", "[", "mount", "echo"}, words
