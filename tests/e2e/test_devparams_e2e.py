"""ModifyDeviceFiles: 0 inside a GPU container, through runc and nvshim-runtime.

This VM has no NVIDIA driver, so the container's procfs has no ``/proc/driver/nvidia``.
The test stands in for the kernel module with a createContainer hook of its own that runs
before nvshim's (hooks run in spec order): it mounts a tmpfs over the container's
``/proc/driver`` (in the container's mount namespace, as runc's masked paths are mounted)
and writes ``nvidia/params`` saying ``ModifyDeviceFiles: 1``. nvshim's hook then finds the
file inside the container's procfs and binds the host's params (the simulated node's)
with ``ModifyDeviceFiles: 0`` over it. The container's own ``cat`` is the assertion.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nvshim.node.compile import compile_node
from tests.helpers.bundle import make_bundle, read_config
from tests.helpers.common import require_root, unique_id
from tests.helpers.node import write_nvshim_config

pytestmark = pytest.mark.e2e

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FAKE_DRIVER = (
    'r=$1; mount -t tmpfs -o mode=755 tmpfs "$r/proc/driver" && '
    'mkdir "$r/proc/driver/nvidia" && '
    'printf "RmLogonRC: 1\\nModifyDeviceFiles: 1\\n" > "$r/proc/driver/nvidia/params"'
)
PROBE = (
    "cat /proc/driver/nvidia/params; "
    "if (echo x > /proc/driver/nvidia/params) 2>/dev/null; then echo WRITABLE; fi"
)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    require_root()
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("sim") / "node"), gpus=1)


def config_env(node, tmp_path: Path, runtime: str = "runc", **extra) -> dict:
    cfg = write_nvshim_config(
        tmp_path / "cfg",
        {"driver-root": node.root, "runtimes": [runtime], "grants-journal": None, **extra},
    )
    compile_node(str(cfg))
    return {"NVSHIM_CONFIG": str(cfg), "PATH": PATH}


def gpu_bundle(tmp_path: Path, rootfs: Path, env: dict) -> Path:
    target = str(tmp_path / "b" / "rootfs")
    hooks = {
        "createContainer": [
            {
                "path": "/bin/sh",
                "args": ["sh", "-c", FAKE_DRIVER, "fake", target],
                "env": [f"PATH={PATH}"],
            }
        ]
    }
    return make_bundle(tmp_path / "b", rootfs, ["sh", "-c", PROBE], env=env, hooks=hooks)


@pytest.fixture(params=["runc", "crun"])
def engine(request, crunw):
    """(driver, low-level runtime for nvshim's config) for runc and for crun."""
    if request.param == "runc":
        return request.getfixturevalue("runc"), "runc"
    return request.getfixturevalue("crun"), str(crunw)


def test_container_sees_modify_device_files_0(engine, node, rootfs, tmp_path, nvshim_runtime_bin):
    """A GPU container's /proc/driver/nvidia/params is the host's with ModifyDeviceFiles: 0,
    read-only, through a hook that runs no command but mount (runc and crun)."""
    driver, low = engine
    env = config_env(node, tmp_path, low)
    bundle = gpu_bundle(tmp_path, rootfs, {"NVIDIA_VISIBLE_DEVICES": "0"})
    res = driver.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
    host = Path(node.root, "proc/driver/nvidia/params").read_text()
    wanted = host.replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0")
    assert res.stdout == wanted, res.describe()
    assert (bundle / ".nvshim-nvidia-params").read_text() == wanted
    hooks = read_config(bundle)["hooks"]["createContainer"]
    assert [h["args"][-3] for h in hooks[1:]] == ["nvshim-params"]


def test_without_a_gpu_the_drivers_params_are_untouched(
    runc, node, rootfs, tmp_path, nvshim_runtime_bin
):
    """A container granted nothing gets no hook: it sees the (fake) driver's file as it is."""
    env = config_env(node, tmp_path)
    bundle = gpu_bundle(tmp_path, rootfs, {"FOO": "1"})
    before = (bundle / "config.json").read_bytes()
    res = runc.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
    assert res.stdout.startswith("RmLogonRC: 1\nModifyDeviceFiles: 1\n"), res.describe()
    assert (bundle / "config.json").read_bytes() == before


def test_config_off_leaves_the_drivers_params(runc, node, rootfs, tmp_path, nvshim_runtime_bin):
    env = config_env(node, tmp_path, **{"disable-device-node-modification": False})
    bundle = gpu_bundle(tmp_path, rootfs, {"NVIDIA_VISIBLE_DEVICES": "0"})
    res = runc.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
    assert "ModifyDeviceFiles: 1\n" in res.stdout, res.describe()
    assert len(read_config(bundle)["hooks"]["createContainer"]) == 1


def test_no_params_in_the_container_is_a_no_op(runc, node, rootfs, tmp_path, nvshim_runtime_bin):
    """Without the driver's file in the container's procfs (this VM), the hook binds nothing,
    and the container starts."""
    env = config_env(node, tmp_path)
    bundle = make_bundle(
        tmp_path / "b",
        rootfs,
        ["sh", "-c", "ls /proc/driver/nvidia 2>&1 || echo ABSENT"],
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
    )
    res = runc.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
    assert "ABSENT" in res.stdout, res.describe()
    assert json.loads((bundle / "config.json").read_text())["hooks"]["createContainer"]
    assert os.path.isdir(bundle / "rootfs")
