"""compat32 end to end: nvshim-runtime → runc on a simulated node with i386 libraries.

What the process inside sees: the 32-bit files (hashing like the node's), their SONAME
links, and the container's own ``ldconfig -p`` listing them as i386 (``libc6``, not
``libc6,x86-64``) entries of its ld.so.cache; none of it without compat32; a node lacking
the 32-bit set still starts the container and ``nvshim inspect`` names what is missing.
Debian's real i386 packages: ``tests/e2e/test_real_driver.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nvshim.node.compile import compile_node
from tests.helpers.bundle import make_bundle
from tests.helpers.common import require_root, unique_id
from tests.helpers.node import write_nvshim_config

pytestmark = pytest.mark.e2e

VERSION = "550.54.15"
LIB32 = "/usr/lib/i386-linux-gnu"
LIB64 = "/usr/lib/x86_64-linux-gnu"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SCRIPT = (
    f"for f in {LIB32}/libcuda.so.{VERSION} {LIB32}/libnvidia-ml.so.{VERSION} "
    f"{LIB32}/libGLX_nvidia.so.{VERSION}; do "
    '[ -e "$f" ] && echo "FILE $f $(sha256sum < "$f" | cut -d" " -f1)"; done; '
    f'echo "LINK $(readlink {LIB32}/libcuda.so.1)"; ldconfig -p'
)


@pytest.fixture
def node(tmp_path):
    """A simulated 1-GPU node (its own: tests reshape it)."""
    require_root()
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path / "node"), gpus=1)


def run(runc, runtime: str, tmp_path: Path, node, rootfs: Path, caps: str):
    cfg = write_nvshim_config(
        tmp_path / f"cfg-{unique_id('c')}", {"driver-root": node.root, "runtimes": ["runc"]}
    )
    compile_node(str(cfg))
    env = [f"PATH={PATH}", "NVIDIA_VISIBLE_DEVICES=0", f"NVIDIA_DRIVER_CAPABILITIES={caps}"]
    bundle = make_bundle(tmp_path / unique_id("b"), rootfs, ["sh", "-c", SCRIPT], env=env)
    res = runc.run_detached(
        bundle, unique_id(), runtime=runtime, env={"NVSHIM_CONFIG": str(cfg), "PATH": PATH}
    )
    return res, cfg, bundle


def files(output: str) -> dict:
    return dict(re.findall(r"^FILE (\S+) (\S+)$", output, re.M))


def cache32(output: str) -> dict:
    """The container's ldconfig -p: i386 entries (``(libc6)``), name → path."""
    return dict(re.findall(r"^\s+(\S+) \(libc6\) => (\S+)$", output, re.M))


def sha(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_compat32_compute_utility_sees_the_i386_libcuda_and_nvml(
    runc, nvshim_runtime_bin, tmp_path, node, glibc_rootfs
):
    """compute,utility,compat32: the node's i386 libcuda and NVML at their paths, the
    libcuda.so.1 link beside them, both in the container's ld.so.cache as i386 entries;
    no 32-bit GLX (graphics was not asked); the x86-64 libcuda still listed."""
    res, _, _ = run(
        runc, nvshim_runtime_bin, tmp_path, node, glibc_rootfs, "compute,utility,compat32"
    )
    res.check()
    seen = files(res.stdout)
    for base in ("libcuda", "libnvidia-ml"):
        path = f"{LIB32}/{base}.so.{VERSION}"
        assert seen.get(path) == sha(node.root + path), res.describe()
    assert f"{LIB32}/libGLX_nvidia.so.{VERSION}" not in seen, res.describe()
    assert f"LINK libcuda.so.{VERSION}" in res.stdout, res.describe()
    entries = cache32(res.stdout)
    assert entries.get("libcuda.so.1") == f"{LIB32}/libcuda.so.1", res.describe()
    assert entries.get("libnvidia-ml.so.1") == f"{LIB32}/libnvidia-ml.so.1", res.describe()
    assert f"libcuda.so.1 (libc6,x86-64) => {LIB64}/libcuda.so.1" in res.stdout, res.describe()


def test_without_compat32_the_container_has_no_32_bit_file(
    runc, nvshim_runtime_bin, tmp_path, node, glibc_rootfs
):
    """compute,utility: no i386 file, link or cache entry in the container."""
    res, _, _ = run(runc, nvshim_runtime_bin, tmp_path, node, glibc_rootfs, "compute,utility")
    res.check()
    assert files(res.stdout) == {} and cache32(res.stdout) == {}, res.describe()
    assert re.search(r"^LINK $", res.stdout, re.M), res.describe()


def test_i386_folder_without_cache_entries_is_still_injected(
    runc, nvshim_runtime_bin, tmp_path, node, glibc_rootfs
):
    """The node's ld.so.cache has no i386 entry (no ldconfig saw the folder): the i386
    libcuda is found by its folder, and the container's cache lists it."""
    from nvshim.host.ldcache import FLAG_ELF_LIBC6, build_ldcache, read_ldcache

    cache = Path(node.root) / "etc/ld.so.cache"
    cache.write_bytes(
        build_ldcache([e for e in read_ldcache(str(cache)) if e.flags != FLAG_ELF_LIBC6])
    )
    res, _, _ = run(runc, nvshim_runtime_bin, tmp_path, node, glibc_rootfs, "compute,compat32")
    res.check()
    path = f"{LIB32}/libcuda.so.{VERSION}"
    assert files(res.stdout).get(path) == sha(node.root + path), res.describe()
    assert cache32(res.stdout).get("libcuda.so.1") == f"{LIB32}/libcuda.so.1", res.describe()


def test_node_without_the_32_bit_set_starts_and_inspect_names_it(
    runc, nvshim_runtime_bin, nvshim_bin, tmp_path, node, glibc_rootfs
):
    """A driver folder without the i386 set: compute,compat32 still starts with the 64-bit
    libcuda; `nvshim inspect` names libcuda (compat32) as missing, and `nvshim doctor`'s
    driver-files line says it was not found."""
    shutil.rmtree(Path(node.root) / LIB32.lstrip("/"))
    res, cfg, bundle = run(
        runc, nvshim_runtime_bin, tmp_path, node, glibc_rootfs, "compute,compat32"
    )
    res.check()
    assert files(res.stdout) == {} and cache32(res.stdout) == {}, res.describe()
    assert f"libcuda.so.1 (libc6,x86-64) => {LIB64}/libcuda.so.1" in res.stdout, res.describe()
    env = {**os.environ, "NVSHIM_CONFIG": str(cfg)}
    fresh = make_bundle(
        tmp_path / "inspect",
        glibc_rootfs,
        ["true"],
        env=[
            f"PATH={PATH}",
            "NVIDIA_VISIBLE_DEVICES=0",
            "NVIDIA_DRIVER_CAPABILITIES=compute,compat32",
        ],
    )
    out = subprocess.run(
        [nvshim_bin, "inspect", "--bundle", str(fresh), "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "libcuda (compat32)" in json.dumps(json.loads(out.stdout)), out.stdout
    doctor = subprocess.run(
        [nvshim_bin, "doctor", "--config", str(cfg)], env=env, capture_output=True, text=True
    )
    line = next(ln for ln in doctor.stdout.splitlines() if "driver-files" in ln)
    assert "libcuda (compat32)" in line and "FAIL" not in line, doctor.stdout
