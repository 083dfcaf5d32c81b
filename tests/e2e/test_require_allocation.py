"""e2e: require-allocation through a real containerd 1.6 (``ctr run --rootfs``, no image pulls).

The node is simulated (4 GPUs, device minors shuffled so that a GPU's minor is not its
index); nvshim runs as ``/usr/local/bin/nvshim-runtime`` (the installed sh trampoline)
behind a wrapper that sets ``NVSHIM_CONFIG``, since containerd starts the runtime with the
daemon's environment, not ctr's. What is asserted is what the container sees (``ls /dev``,
``env``) or what ctr reports.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping

import pytest

from nvshim.node.compile import compile_node
from tests.helpers.common import make_env_wrapper, unique_id
from tests.helpers.containerd import Containerd
from tests.helpers.node import write_nvshim_config

pytestmark = pytest.mark.e2e

TRAMPOLINE = Path("/usr/local/bin/nvshim-runtime")
DEVICE_LIST_DIR = "/var/run/nvidia-container-devices"
MISSING = "require-allocation: the image asks for GPUs but no device-plugin allocation was found"
GPU_NODE = re.compile(r"^nvidia([0-9]+)$")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A simulated node with 4 GPUs whose minors are not their indices."""
    if os.geteuid() != 0:
        pytest.skip("simulated nodes need root (mknod)")
    from nvshim.sim.build import create_node

    sim = create_node(str(tmp_path_factory.mktemp("sim") / "node"), gpus=4, shuffle_minors=True)
    assert sim.gpus[2].minor != 2, "shuffle_minors left GPU 2 on minor 2: the test proves nothing"
    return sim


@pytest.fixture(scope="module")
def runtime() -> Path:
    """The installed nvshim-runtime trampoline (``./install.sh``)."""
    if not (TRAMPOLINE.is_file() and os.access(TRAMPOLINE, os.X_OK)):
        pytest.skip(f"{TRAMPOLINE} is not installed (run ./install.sh --dev)")
    if shutil.which("runc") is None:
        pytest.skip("runc is not installed")
    return TRAMPOLINE


def nvshim_wrapper(directory: Path, runtime: Path, node: Any, **settings: Any) -> Path:
    """A compiled nvshim config for ``node`` plus a wrapper that runs ``runtime`` with it."""
    config = write_nvshim_config(
        directory,
        {
            "require-allocation": True,
            "driver-root": node.root,
            "runtimes": ["runc"],
            **{k.replace("_", "-"): v for k, v in settings.items()},
        },
    )
    compile_node(str(config))
    return make_env_wrapper(directory / "nvshim-runtime", runtime, {"NVSHIM_CONFIG": str(config)})


def spy_wrapper(directory: Path, runtime: Path) -> Path:
    """Runs ``runtime``; on create keeps the bundle's config.json before and after it."""
    path = directory / "spy-runtime"
    path.write_text(
        "#!/bin/sh\n"
        "# containerd runs the runtime in the bundle directory\n"
        'case " $* " in *" create "*)\n'
        f"    cp config.json {directory}/before.json\n"
        f'    {runtime} "$@"; rc=$?\n'
        f"    cp config.json {directory}/after.json\n"
        "    exit $rc ;;\n"
        "esac\n"
        f'exec {runtime} "$@"\n'
    )
    path.chmod(0o755)
    return path


@pytest.fixture
def ctr_ids(containerd: Containerd) -> Iterator[List[str]]:
    """Container ids a test used; any left in containerd (a failed create) are deleted."""
    ids: List[str] = []
    yield ids
    for cid in ids:
        containerd.ctr("tasks", "delete", "--force", cid, timeout=30)
        containerd.ctr("containers", "delete", cid, timeout=30)


def run(
    containerd: Containerd,
    ids: List[str],
    rootfs: Path,
    wrapper: Path,
    env: Mapping[str, str],
    **kw: Any,
) -> Any:
    """``ls /dev; env`` in a fresh container run through ``wrapper``."""
    cid = unique_id("reqalloc")
    ids.append(cid)
    return containerd.ctr_run(
        rootfs, cid, ["sh", "-c", "ls /dev; env"], env=env, runc_binary=wrapper, **kw
    )


def gpu_nodes(output: str) -> List[int]:
    """Minors of the ``/dev/nvidia<N>`` entries ``ls /dev`` printed."""
    return sorted(int(m.group(1)) for m in (GPU_NODE.match(x) for x in output.split()) if m)


def env_of(output: str) -> Dict[str, str]:
    """The ``NAME=value`` lines ``env`` printed."""
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


def test_image_env_all_without_allocation_gets_no_gpu(
    containerd: Containerd,
    ctr_ids: List[str],
    rootfs: Path,
    tmp_path: Path,
    runtime: Path,
    node: Any,
) -> None:
    """NVIDIA_VISIBLE_DEVICES=all alone gets no GPU node and sees the value rewritten to void."""
    wrapper = nvshim_wrapper(tmp_path / "nvshim", runtime, node)
    res = run(containerd, ctr_ids, rootfs, wrapper, {"NVIDIA_VISIBLE_DEVICES": "all"})
    assert res.rc == 0, res.describe()
    assert gpu_nodes(res.stdout) == [], res.stdout
    assert "nvidiactl" not in res.stdout.split()
    assert env_of(res.stdout)["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_device_plugin_mount_grants_exactly_that_gpu(
    containerd: Containerd,
    ctr_ids: List[str],
    rootfs: Path,
    tmp_path: Path,
    runtime: Path,
    node: Any,
) -> None:
    """A /dev/null mount naming GPU 2's UUID gives only /dev/nvidia<GPU 2's minor>, not nvidia2."""
    gpu = node.gpus[2]
    wrapper = nvshim_wrapper(tmp_path / "nvshim", runtime, node)
    res = run(
        containerd,
        ctr_ids,
        rootfs,
        wrapper,
        {"NVIDIA_VISIBLE_DEVICES": "all"},
        mounts=[("/dev/null", f"{DEVICE_LIST_DIR}/{gpu.uuid}")],
    )
    assert res.rc == 0, res.describe()
    assert gpu_nodes(res.stdout) == [gpu.minor], res.stdout
    assert "nvidiactl" in res.stdout.split()


def test_missing_allocation_fail_reaches_ctr(
    containerd: Containerd,
    ctr_ids: List[str],
    rootfs: Path,
    tmp_path: Path,
    runtime: Path,
    node: Any,
) -> None:
    """on-missing-allocation: fail makes ctr report nvshim's message from the runtime's --log."""
    wrapper = nvshim_wrapper(tmp_path / "nvshim", runtime, node, on_missing_allocation="fail")
    res = run(containerd, ctr_ids, rootfs, wrapper, {"NVIDIA_VISIBLE_DEVICES": "all"})
    assert res.rc != 0, res.describe()
    assert MISSING in res.stderr, res.describe()


def test_sandbox_container_passes_through_byte_identical(
    containerd: Containerd,
    ctr_ids: List[str],
    rootfs: Path,
    tmp_path: Path,
    runtime: Path,
    node: Any,
) -> None:
    """A CRI sandbox (ctr --annotation) keeps NVIDIA_VISIBLE_DEVICES=all; config.json unchanged."""
    spy_dir = tmp_path / "spy"
    spy_dir.mkdir()
    wrapper = spy_wrapper(spy_dir, nvshim_wrapper(tmp_path / "nvshim", runtime, node))
    env = {"NVIDIA_VISIBLE_DEVICES": "all"}

    control = run(containerd, ctr_ids, rootfs, wrapper, env)
    assert control.rc == 0, control.describe()
    assert (spy_dir / "before.json").read_bytes() != (spy_dir / "after.json").read_bytes()

    res = run(
        containerd,
        ctr_ids,
        rootfs,
        wrapper,
        env,
        annotations={
            "io.kubernetes.cri.container-type": "sandbox",
            "io.kubernetes.cri.sandbox-id": "0123abcd",
            "io.kubernetes.cri.sandbox-name": "pod",
            "io.kubernetes.cri.sandbox-namespace": "team-a",
            "io.kubernetes.cri.sandbox-uid": "uid-pod",
        },
    )
    assert res.rc == 0, res.describe()
    assert env_of(res.stdout)["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert gpu_nodes(res.stdout) == []
    assert (spy_dir / "before.json").read_bytes() == (spy_dir / "after.json").read_bytes()


def test_sys_admin_is_not_privileged_but_privileged_is(
    containerd: Containerd,
    ctr_ids: List[str],
    rootfs: Path,
    tmp_path: Path,
    runtime: Path,
    node: Any,
) -> None:
    """Through the privileged source, NVIDIA_VISIBLE_DEVICES=all gets every GPU for
    ``ctr run --privileged`` but none for a container that only adds CAP_SYS_ADMIN (what a
    pod's capabilities.add can do): its device cgroup does not allow every device."""
    wrapper = nvshim_wrapper(tmp_path / "nvshim", runtime, node)
    env = {"NVIDIA_VISIBLE_DEVICES": "all"}
    res = run(containerd, ctr_ids, rootfs, wrapper, env, extra_flags=["--cap-add", "CAP_SYS_ADMIN"])
    assert res.rc == 0, res.describe()
    assert gpu_nodes(res.stdout) == [], res.stdout
    assert env_of(res.stdout)["NVIDIA_VISIBLE_DEVICES"] == "void"

    res = run(containerd, ctr_ids, rootfs, wrapper, env, extra_flags=["--privileged"])
    assert res.rc == 0, res.describe()
    assert gpu_nodes(res.stdout) == sorted(g.minor for g in node.gpus), res.stdout
