"""The real-GPU proof: nvshim-runtime → runc on this machine's own driver (driver root /).

Skipped unless ``NVSHIM_REAL_GPU=1`` and ``/dev/nvidia0`` exists, so the normal suite skips
it with that reason; ``tests/gpu/run.sh`` runs it (docs/real-gpu.md). The same probe and
rootfs as tests/e2e/test_real_driver.py, but with a kernel module to talk to: inside the
container ``nvidia-smi -L`` lists exactly the granted GPU, ``cuInit`` returns 0 and a 1 MiB
``cuMemAlloc``/``cuMemFree`` on the primary context succeeds; ``void`` sees no GPU; and
nvshim's two discovery paths (NVML, procfs) agree on every GPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Iterator, List

import pytest

from nvshim.host.discovery import Host
from nvshim.node.compile import compile_node
from tests.helpers.bundle import make_bundle, make_glibc_rootfs
from tests.helpers.common import RunResult, require_binary, require_root, unique_id
from tests.helpers.node import write_nvshim_config
from tests.helpers.realdriver import (
    add_driver_dependencies,
    build_probe,
    cuda_driver_version,
    ldcache_entry,
    parse_probe,
)
from tests.helpers.runc import Runc

_ASKED = os.environ.get("NVSHIM_REAL_GPU") == "1"
_HAS_GPU = os.path.exists("/dev/nvidia0")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not (_ASKED and _HAS_GPU),
        reason="real-GPU proof: needs NVSHIM_REAL_GPU=1 and an NVIDIA GPU (/dev/nvidia0); "
        "run tests/gpu/run.sh on a GPU machine"
        + ("" if _HAS_GPU else " — this machine has no /dev/nvidia0"),
    ),
]

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture(scope="module")
def host_gpus() -> List[str]:
    """UUIDs of this machine's GPUs in nvshim's index order (procfs, PCI bus id order)."""
    require_root()
    gpus = Host("/").gpus("procfs")
    assert gpus, "no GPU under /proc/driver/nvidia/gpus although /dev/nvidia0 exists"
    return [g.uuid for g in gpus]


@pytest.fixture(scope="module")
def gpu_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """busybox + glibc + the C libraries the host's nvidia-smi and libcuda need + the probe
    at /usr/bin/cudaprobe; copy before use (make_bundle copies)."""
    require_root()
    work = tmp_path_factory.mktemp("gpu-rootfs")
    probe = build_probe(work)
    root = make_glibc_rootfs(work / "rootfs")
    shutil.copy2(probe, root / "usr/bin/cudaprobe")
    smi = shutil.which("nvidia-smi")
    libcuda = ldcache_entry(Path("/"), "libcuda.so.1")
    assert smi and libcuda, f"the host's driver: nvidia-smi={smi} libcuda.so.1={libcuda}"
    add_driver_dependencies(
        root, [probe, Path(os.path.realpath(smi)), Path(os.path.realpath(libcuda))]
    )
    return root


@pytest.fixture
def runc(tmp_path: Path) -> Iterator[Runc]:
    """runc with a private --root; leftovers force-deleted at teardown."""
    driver = Runc(tmp_path / "runc-root", require_binary("runc"))
    yield driver
    driver.cleanup()


def run_gpu(
    runc: Runc,
    runtime: str,
    tmp_path: Path,
    rootfs: Path,
    script: str,
    visible: str,
    caps: str = "compute,utility",
) -> RunResult:
    """``sh -c script`` through nvshim-runtime with driver root / and the given request."""
    cfg = write_nvshim_config(tmp_path / unique_id("cfg"), {"runtimes": ["runc"]})
    compile_node(str(cfg))
    bundle = make_bundle(
        tmp_path / unique_id("b"),
        rootfs,
        ["sh", "-c", script],
        env=[f"NVIDIA_VISIBLE_DEVICES={visible}", f"NVIDIA_DRIVER_CAPABILITIES={caps}"],
    )
    return runc.run_detached(
        bundle, unique_id(), runtime=runtime, env={"NVSHIM_CONFIG": str(cfg), "PATH": PATH}
    )


def test_nvidia_smi_lists_exactly_the_granted_gpu(
    runc, nvshim_runtime_bin, tmp_path, gpu_rootfs, host_gpus
):
    """NVIDIA_VISIBLE_DEVICES=<i>: `nvidia-smi -L` inside lists one GPU, GPU i's UUID."""
    for index, uuid in list(enumerate(host_gpus))[:2]:
        res = run_gpu(
            runc,
            nvshim_runtime_bin,
            tmp_path,
            gpu_rootfs,
            "nvidia-smi -L",
            str(index),
            caps="utility",
        ).check()
        listed = re.findall(r"^GPU \d+: .*\(UUID: (GPU-[0-9a-f-]+)\)", res.stdout, re.M)
        assert listed == [uuid], res.describe()


def test_cuda_initialises_and_allocates(runc, nvshim_runtime_bin, tmp_path, gpu_rootfs):
    """compute: the probe loads the host's libcuda (its CUDA version), cuInit returns 0, one
    device is visible, and cuMemAlloc/cuMemFree of 1 MiB on its primary context succeed."""
    res = run_gpu(runc, nvshim_runtime_bin, tmp_path, gpu_rootfs, "cudaprobe --alloc", "0").check()
    got = parse_probe(res.stdout)
    libcuda = ldcache_entry(Path("/"), "libcuda.so.1")
    assert libcuda is not None
    assert got.values.get("version") == cuda_driver_version(os.path.realpath(libcuda)), (
        res.describe()
    )
    assert got.values.get("cuInit") == 0, res.describe()
    assert got.values.get("devices") == 1, res.describe()
    assert got.values.get("cuMemAlloc") == 0 and got.values.get("cuMemFree") == 0, res.describe()


def test_void_sees_no_gpu(runc, nvshim_runtime_bin, tmp_path, gpu_rootfs):
    """NVIDIA_VISIBLE_DEVICES=void: no /dev/nvidia0 and no libcuda in the container."""
    res = run_gpu(
        runc, nvshim_runtime_bin, tmp_path, gpu_rootfs, "ls /dev/nvidia0 2>&1; cudaprobe", "void"
    ).check()
    assert "No such file or directory" in res.stdout, res.describe()
    assert parse_probe(res.stdout).libcuda is None, res.describe()


def test_nvml_and_procfs_find_the_same_gpus():
    """nvshim's NVML discovery and its procfs discovery agree on every GPU's UUID, device
    minor and PCI bus id, in the same order."""
    require_root()

    def facts(method: str) -> list:
        return [(g.uuid, g.minor, g.pci_bus_id) for g in Host("/").gpus(method)]

    nvml, procfs = facts("nvml"), facts("procfs")
    assert nvml and nvml == procfs, f"nvml:   {nvml}\nprocfs: {procfs}"


def test_host_nvidia_smi_agrees(host_gpus):
    """The host's own `nvidia-smi -L` lists the same UUIDs in the same order."""
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True)
    listed = re.findall(r"^GPU \d+: .*\(UUID: (GPU-[0-9a-f-]+)\)", out.stdout, re.M)
    assert listed == host_gpus, out.stdout
