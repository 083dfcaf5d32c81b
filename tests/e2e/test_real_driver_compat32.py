# ruff: noqa: F811 — the fixtures imported from test_real_driver are parameters by name
"""compat32 on a real driver's files: Debian's i386 packages, end to end through runc.

The driver roots (:mod:`tests.helpers.realdriver`, :mod:`tests.helpers.realdriver32`)
hold Debian's x86-64 compute set and its i386 libraries in both layouts — ``flat``
(NVIDIA's installer: ``/usr/lib/i386-linux-gnu``) and ``debian`` (``…/i386-linux-gnu/
nvidia/current`` behind the alternatives links) — under a simulated kernel side. What the
process inside sees: the real i386 libcuda and NVML (hashing like the root's), their SONAME
links, the container's ld.so.cache listing them as i386 (``libc6``) entries, and a real
32-bit program (tests/probe/cudaprobe32.c, run by the i386 loader the test image gets from
libc6:i386) that dlopen()s ``libcuda.so.1`` and gets the real driver's answers
(``cuDriverGetVersion`` = the files' CUDA version, ``cuInit`` = 100 without a kernel
module). The simulator's i386 stubs: tests/e2e/test_compat32_e2e.py.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Dict, List

import pytest

from tests.e2e.test_real_driver import (  # noqa: F401  (fixtures, used by name)
    CUDA_ERROR_NO_DEVICE,
    _packages,
    compute_packages,
    driver_needs,
    gpu_env,
    probe,
    probe_rootfs,
    run_container,
    sha256,
    show_script,
    shown,
)
from tests.helpers.bundle import copy_rootfs
from tests.helpers.realdriver import (
    LAYOUTS,
    DriverPackages,
    DriverRoot,
    cuda_driver_version_of_debs,
    make_driver_root,
    parse_probe,
)
from tests.helpers.realdriver32 import COMPAT32_PACKAGES, add_i386_loader, build_probe32

pytestmark = pytest.mark.e2e

LIB32 = "/usr/lib/i386-linux-gnu"
BASES = ("libcuda", "libnvidia-ml")


@pytest.fixture(scope="session")
def compat32_packages() -> DriverPackages:
    """The compute packages, their i386 libraries and libc6:i386 (cached between runs)."""
    return _packages(COMPAT32_PACKAGES)


@pytest.fixture(scope="module", params=LAYOUTS)
def compat32_root(
    request: pytest.FixtureRequest,
    compat32_packages: DriverPackages,
    tmp_path_factory: pytest.TempPathFactory,
) -> DriverRoot:
    """A one-GPU driver root with the x86-64 compute set and the i386 libraries."""
    return make_driver_root(
        tmp_path_factory.mktemp(f"compat32-{request.param}") / "root",
        compat32_packages,
        request.param,
    )


@pytest.fixture(scope="session")
def rootfs32(
    probe_rootfs: Path, compat32_packages: DriverPackages, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The probe rootfs plus libc6:i386 (/lib/ld-linux.so.2) and the 32-bit probe at
    /usr/bin/cudaprobe32; copy before use."""
    base = tmp_path_factory.mktemp("rootfs32")
    root = copy_rootfs(probe_rootfs, base / "rootfs")
    shutil.copy2(build_probe32(base, compat32_packages), root / "usr/bin/cudaprobe32")
    add_i386_loader(root, compat32_packages)
    return root


def container_dir32(root: DriverRoot) -> str:
    """Where the i386 libraries lie in the root, and so in the container."""
    return LIB32 + ("/nvidia/current" if root.layout == "debian" else "")


def cache32(output: str) -> Dict[str, str]:
    """The container's ``ldconfig -p`` i386 entries: name → path."""
    return dict(re.findall(r"^\s+(\S+) \(libc6\) => (\S+)$", output, re.M))


def script(root: DriverRoot) -> str:
    libdir = container_dir32(root)
    paths: List[str] = []
    for base in BASES:
        paths += [f"{libdir}/{base}.so.{root.version}", f"{libdir}/{base}.so.1"]
    return (
        show_script(paths) + 'echo "PROBE32 $(cudaprobe32 2>&1)"; '
        "ldconfig -p | grep '(libc6)' || true"
    )


def test_compat32_injects_the_real_i386_libcuda_and_nvml(
    runc, nvshim_runtime_bin, tmp_path, compat32_root, rootfs32, compat32_packages
):
    """compat32,compute,utility on Debian's i386 packages (both layouts): the real i386
    libcuda and libnvidia-ml with their SONAME links where they lie in the root, i386
    ld.so.cache entries for both, and a real 32-bit program that finds libcuda.so.1 through
    that cache and gets the driver's CUDA version and CUDA_ERROR_NO_DEVICE."""
    res = run_container(
        runc,
        nvshim_runtime_bin,
        tmp_path,
        compat32_root,
        rootfs32,
        script(compat32_root),
        gpu_env("compat32,compute,utility"),
    ).check()
    seen = shown(res.stdout)
    libdir = container_dir32(compat32_root)
    for base in BASES:
        real = sha256(compat32_root.library32(base))
        for name in (f"{base}.so.{compat32_root.version}", f"{base}.so.1"):
            got = seen.get(f"{libdir}/{name}")
            assert got is not None and got[1] == real, f"{name}\n{res.describe()}"
        assert cache32(res.stdout).get(f"{base}.so.1") == f"{libdir}/{base}.so.1", res.describe()
    line = re.search(r"^PROBE32 (.*)$", res.stdout, re.M)
    assert line, res.describe()
    probe32 = parse_probe(line.group(1))
    assert probe32.libcuda == f"{libdir}/libcuda.so.1", res.describe()
    assert probe32.values.get("cuDriverGetVersion") == 0, res.describe()
    assert probe32.values.get("version") == cuda_driver_version_of_debs(compat32_packages)
    assert probe32.values.get("cuInit") == CUDA_ERROR_NO_DEVICE, res.describe()


def test_without_compat32_a_32_bit_program_finds_no_libcuda(
    runc, nvshim_runtime_bin, tmp_path, compat32_root, rootfs32
):
    """compute,utility on the same root: no i386 driver file or cache entry, and the 32-bit
    program's dlopen of libcuda.so.1 fails (the 64-bit one is no use to it)."""
    res = run_container(
        runc,
        nvshim_runtime_bin,
        tmp_path,
        compat32_root,
        rootfs32,
        script(compat32_root),
        gpu_env("compute,utility"),
    ).check()
    assert not any(shown(res.stdout).values()), res.describe()
    assert not any(k.startswith(BASES) for k in cache32(res.stdout)), res.describe()
    assert "PROBE32 dlopen libcuda.so.1 failed: " in res.stdout, res.describe()
