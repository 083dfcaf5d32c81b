"""e2e: Docker (Debian's docker.io 20.10) runs containers through nvshim-runtime.

A private dockerd (tests/helpers/docker.py: own data root, exec root, socket, cgroup parent,
its own containerd; no iptables, no bridge) reads a ``daemon.json`` written by
``nvshim runtime configure --runtime docker``. The runtime is the installed trampoline
behind a wrapper that sets ``NVSHIM_CONFIG`` (dockerd → containerd → shim → runtime pass
the daemon's environment, not the client's). The image is a busybox rootfs imported with
``docker import`` (no registry) whose env says ``NVIDIA_VISIBLE_DEVICES=all``, like CUDA
images. What is asserted is what ``ls /dev`` and ``env`` print inside the container.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from nvshim.node.compile import compile_node
from tests.helpers.common import make_env_wrapper, require_root
from tests.helpers.docker import Dockerd
from tests.helpers.node import write_nvshim_config

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TRAMPOLINE = Path("/usr/local/bin/nvshim-runtime")
IMAGE = "nvshim-e2e/busybox:local"
GPU_NODE = re.compile(r"^nvidia([0-9]+)$")
ORIGINAL_DAEMON_JSON = '{\n  "log-level": "warn",\n  "debug": false\n}\n'


def gpu_minors(output: str) -> List[int]:
    """Minors of the ``/dev/nvidia<N>`` entries ``ls /dev`` printed."""
    return sorted(int(m.group(1)) for m in (GPU_NODE.match(x) for x in output.split()) if m)


def env_of(output: str) -> Dict[str, str]:
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


def configure(*args: str, nvshim_config: Path) -> subprocess.CompletedProcess:
    """``nvshim runtime configure --runtime docker ARGS`` with ``NVSHIM_CONFIG`` set."""
    env = dict(os.environ, NVSHIM_CONFIG=str(nvshim_config))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "nvshim.cli.main",
            "runtime",
            "configure",
            "--runtime",
            "docker",
            *args,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, base_rootfs: Path) -> Iterator[Any]:
    """A simulated 4-GPU node, two nvshim configs (require-allocation off / on) with their
    runtime wrappers, daemon.json from `nvshim runtime configure`, a started dockerd."""
    require_root()
    if not (TRAMPOLINE.is_file() and os.access(TRAMPOLINE, os.X_OK)):
        pytest.skip(f"{TRAMPOLINE} is not installed (run ./install.sh --dev)")
    from nvshim.sim.build import create_node

    base = tmp_path_factory.mktemp("docker")
    node = create_node(str(base / "node"), gpus=4, shuffle_minors=True)
    assert node.gpus[1].minor != 1, "shuffle_minors left GPU 1 on minor 1: the test proves less"
    wrappers = {}
    configs = {}
    for label, require in (("open", False), ("strict", True)):
        config = write_nvshim_config(
            base / label,
            {
                "require-allocation": require,
                "driver-root": node.root,
                "runtimes": ["runc"],
            },
        )
        compile_node(str(config))
        configs[label] = config
        wrappers[label] = make_env_wrapper(
            base / label / "nvshim-runtime", TRAMPOLINE, {"NVSHIM_CONFIG": str(config)}
        )
    daemon_json = base / "etc-docker" / "daemon.json"
    daemon_json.parent.mkdir()
    daemon_json.write_text(ORIGINAL_DAEMON_JSON)
    done = configure(
        "--config",
        str(daemon_json),
        "--binary",
        str(wrappers["open"]),
        nvshim_config=configs["open"],
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(daemon_json.read_text())["runtimes"]["nvshim"]["path"] == str(
        wrappers["open"]
    )
    dockerd = Dockerd(daemon_json, base)
    try:
        dockerd.start()
        dockerd.import_rootfs(
            base_rootfs, IMAGE, env=["PATH=/bin:/usr/bin", "NVIDIA_VISIBLE_DEVICES=all"]
        )
        yield {
            "node": node,
            "dockerd": dockerd,
            "daemon_json": daemon_json,
            "configs": configs,
            "wrappers": wrappers,
        }
    finally:
        dockerd.stop()


def test_docker_knows_the_configured_runtime(setup: Any) -> None:
    """dockerd loaded runtimes.nvshim from the daemon.json nvshim wrote; runc stays default."""
    info = setup["dockerd"].docker("info", "--format", "{{json .Runtimes}} {{.DefaultRuntime}}")
    info.check()
    runtimes, default = info.stdout.rsplit(" ", 1)
    assert json.loads(runtimes)["nvshim"]["path"] == str(setup["wrappers"]["open"])
    assert default.strip() == "runc"


def test_runtime_nvshim_gpu_1_sees_exactly_gpu_1(setup: Any) -> None:
    """docker run --runtime nvshim -e NVIDIA_VISIBLE_DEVICES=1: only GPU 1's node (its minor)."""
    result = setup["dockerd"].run(
        IMAGE,
        ["sh", "-c", "ls /dev; head -c0 /dev/nvidia*; env"],
        runtime="nvshim",
        env={"NVIDIA_VISIBLE_DEVICES": "1"},
    )
    assert result.rc in (0, 1), result.describe()  # head's ENXIO on the fake node is rc 1
    assert gpu_minors(result.stdout) == [setup["node"].gpus[1].minor], result.describe()
    assert "nvidiactl" in result.stdout.split()
    # the device cgroup allows the node: opening it reaches the (absent) driver, not EPERM
    assert "No such device or address" in result.stderr, result.describe()
    assert "Operation not permitted" not in result.stderr


def test_runtime_nvshim_void_sees_no_gpu(setup: Any) -> None:
    """NVIDIA_VISIBLE_DEVICES=void: no NVIDIA node at all."""
    result = setup["dockerd"].run(
        IMAGE, ["ls", "/dev"], runtime="nvshim", env={"NVIDIA_VISIBLE_DEVICES": "void"}
    )
    result.check()
    assert not [x for x in result.stdout.split() if x.startswith("nvidia")], result.stdout


def test_runc_default_ignores_the_image_env(setup: Any) -> None:
    """Without --runtime (runc is the default), the image's NVIDIA_VISIBLE_DEVICES=all gives
    nothing."""
    result = setup["dockerd"].run(IMAGE, ["ls", "/dev"])
    result.check()
    assert gpu_minors(result.stdout) == []


def test_default_runtime_with_require_allocation_strips_image_all(setup: Any) -> None:
    """nvshim as Docker's default runtime: refused while require-allocation is off; with it on,
    an image saying NVIDIA_VISIBLE_DEVICES=all gets no GPU; --revert restores daemon.json."""
    dockerd, daemon_json = setup["dockerd"], setup["daemon_json"]
    refused = configure(
        "--config",
        str(daemon_json),
        "--binary",
        str(setup["wrappers"]["open"]),
        "--set-as-default",
        nvshim_config=setup["configs"]["open"],
    )
    assert refused.returncode == 1
    assert "require-allocation" in refused.stderr and len(refused.stderr.splitlines()) == 1
    done = configure(
        "--config",
        str(daemon_json),
        "--binary",
        str(setup["wrappers"]["strict"]),
        "--set-as-default",
        nvshim_config=setup["configs"]["strict"],
    )
    assert done.returncode == 0, done.stderr
    try:
        dockerd.reload(expect_default="nvshim")
        result = dockerd.run(IMAGE, ["sh", "-c", "ls /dev; env"])
        result.check()
        assert gpu_minors(result.stdout) == [], result.stdout
        assert env_of(result.stdout)["NVIDIA_VISIBLE_DEVICES"] == "void"
        # the same daemon, explicit allocation by full UUID (the device plugin's envvar form)
        uuid = setup["node"].gpus[2].uuid
        granted = dockerd.run(IMAGE, ["ls", "/dev"], env={"NVIDIA_VISIBLE_DEVICES": uuid})
        granted.check()
        assert gpu_minors(granted.stdout) == [setup["node"].gpus[2].minor]
    finally:
        reverted = configure(
            "--config", str(daemon_json), "--revert", nvshim_config=setup["configs"]["strict"]
        )
        assert reverted.returncode == 0, reverted.stderr
    assert daemon_json.read_text() == ORIGINAL_DAEMON_JSON
    # SIGHUP does not reset keys that left the file: a reverted daemon.json needs a restart
    fresh = Dockerd(daemon_json, daemon_json.parent)
    try:
        fresh.start()
        info = fresh.docker("info", "--format", "{{json .Runtimes}} {{.DefaultRuntime}}")
        runtimes, default = info.check().stdout.rsplit(" ", 1)
        assert "nvshim" not in json.loads(runtimes) and default.strip() == "runc"
    finally:
        fresh.stop()
