"""The node plan cache, through nvshim-runtime: fresh when the node changes, rebuilt when
broken, and safe when many first creates race.

The low-level runtime is ``/bin/true``: what is checked is the config.json the runtime
wrote (device nodes, mounts) and the SONAME links it made in the rootfs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from nvshim.config import load_config, plan_path
from nvshim.host.elf import build_shared_object
from nvshim.node.compile import compile_node
from nvshim.runtime import plancache
from tests.helpers.bundle import make_bundle, read_config
from tests.helpers.common import require_root, unique_id
from tests.helpers.node import write_nvshim_config

pytestmark = pytest.mark.e2e

LIBDIR = "usr/lib/x86_64-linux-gnu"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture
def node(tmp_path):
    """A fresh simulated 2-GPU node per test (tests change it)."""
    require_root()
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path / "node"), gpus=2)


@pytest.fixture
def cfg(node, tmp_path) -> Path:
    path = write_nvshim_config(
        tmp_path / "cfg", {"driver-root": node.root, "runtimes": ["/bin/true"]}
    )
    compile_node(str(path))
    return path


def create(nvshim_runtime_bin: str, bundle: Path, cfg: Path) -> subprocess.CompletedProcess:
    env = {"NVSHIM_CONFIG": str(cfg), "PATH": PATH}
    return subprocess.run(
        [nvshim_runtime_bin, "create", "--bundle", str(bundle), unique_id()],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def fresh_bundle(tmp_path: Path, rootfs: Path, name: str, visible: str = "all") -> Path:
    return make_bundle(tmp_path / name, rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": visible})


def gpu_nodes(bundle: Path) -> list:
    return sorted(
        d["path"]
        for d in read_config(bundle)["linux"]["devices"]
        if d["path"][len("/dev/nvidia") :].isdigit()
    )


def mount_sources(bundle: Path) -> list:
    return [m["source"] for m in read_config(bundle)["mounts"] if "/node/" in m["source"]]


def cache_is_valid(cfg: Path, node) -> bool:
    cached, _ = plancache.load(plan_path(str(cfg)), node.root, node.root)
    return cached is not None


def test_compile_writes_a_valid_plan_and_creates_use_it(
    node, cfg, rootfs, tmp_path, nvshim_runtime_bin
):
    """``nvshim config compile`` leaves a valid plan next to the compiled config; a create
    with it plans exactly what live discovery plans."""
    assert cache_is_valid(cfg, node)
    from nvshim.runtime.create import plan_create

    bundle = fresh_bundle(tmp_path, rootfs, "b")
    config = load_config(str(cfg))
    cached = plan_create(str(bundle), config)
    assert cached.plan_source.startswith("cache ")
    os.unlink(plan_path(str(cfg)))
    live = plan_create(str(bundle), config)
    assert live.plan_source.startswith("discovery (no plan cache")
    assert cached.new_spec == live.new_spec
    assert cached.rootfs.work.planned == live.rootfs.work.planned


def test_gpu_removed_and_added_is_seen_by_the_next_create(
    node, cfg, rootfs, tmp_path, nvshim_runtime_bin
):
    """Removing GPU 1 (procfs entry and device node) and adding it back changes what
    NVIDIA_VISIBLE_DEVICES=all gets on the very next create."""
    gpus_dir = Path(node.root, "proc/driver/nvidia/gpus")
    entries = sorted(gpus_dir.iterdir())
    assert create(nvshim_runtime_bin, fresh_bundle(tmp_path, rootfs, "b1"), cfg).returncode == 0
    assert gpu_nodes(tmp_path / "b1") == ["/dev/nvidia0", "/dev/nvidia1"]

    saved = tmp_path / "gpu1"
    shutil.move(str(entries[1]), saved)
    dev = Path(node.root, "dev/nvidia1")
    st = dev.stat()
    dev.unlink()
    res = create(nvshim_runtime_bin, fresh_bundle(tmp_path, rootfs, "b2"), cfg)
    assert res.returncode == 0, res.stderr
    assert gpu_nodes(tmp_path / "b2") == ["/dev/nvidia0"]

    shutil.move(str(saved), entries[1])
    os.mknod(dev, st.st_mode, st.st_rdev)
    res = create(nvshim_runtime_bin, fresh_bundle(tmp_path, rootfs, "b3"), cfg)
    assert res.returncode == 0, res.stderr
    assert gpu_nodes(tmp_path / "b3") == ["/dev/nvidia0", "/dev/nvidia1"]
    assert cache_is_valid(cfg, node)


def test_driver_version_change_is_seen_by_the_next_create(
    node, cfg, rootfs, tmp_path, nvshim_runtime_bin
):
    """A new driver (the node rebuilt with another version at the same path) gets its own
    libraries mounted on the next create, not the cached old ones."""
    from nvshim.sim.build import create_node

    assert (
        create(nvshim_runtime_bin, fresh_bundle(tmp_path, rootfs, "b1", "0"), cfg).returncode == 0
    )
    assert any(s.endswith("libcuda.so.550.54.15") for s in mount_sources(tmp_path / "b1"))
    shutil.rmtree(node.root)
    create_node(node.root, gpus=2, driver_version="560.35.03")
    res = create(nvshim_runtime_bin, fresh_bundle(tmp_path, rootfs, "b2", "0"), cfg)
    assert res.returncode == 0, res.stderr
    sources = mount_sources(tmp_path / "b2")
    assert any(s.endswith("libcuda.so.560.35.03") for s in sources), sources
    assert not any("550.54.15" in s for s in sources), sources


def test_replaced_library_is_seen_by_the_next_create(
    node, cfg, rootfs, tmp_path, nvshim_runtime_bin
):
    """A driver library replaced by one with another SONAME changes the link the next create
    makes (the cached SONAME is not reused)."""
    lib = Path(node.root, LIBDIR, "libcuda.so.550.54.15")
    assert (
        create(nvshim_runtime_bin, fresh_bundle(tmp_path, rootfs, "b1", "0"), cfg).returncode == 0
    )
    assert os.readlink(tmp_path / "b1/rootfs" / LIBDIR / "libcuda.so.1") == lib.name
    new = lib.with_name(".replacement")
    new.write_bytes(build_shared_object("libcuda.so.2", marker="NVSHIM-SIM replaced"))
    os.replace(new, lib)
    res = create(nvshim_runtime_bin, fresh_bundle(tmp_path, rootfs, "b2", "0"), cfg)
    assert res.returncode == 0, res.stderr
    assert os.readlink(tmp_path / "b2/rootfs" / LIBDIR / "libcuda.so.2") == lib.name
    assert not os.path.lexists(tmp_path / "b2/rootfs" / LIBDIR / "libcuda.so.1")


@pytest.mark.parametrize(
    "garbage", [b"", b"{not json", b'{"format": 1, "key": 3}', b"[]", b'{"format": 1}']
)
def test_corrupted_cache_is_rebuilt(node, cfg, rootfs, tmp_path, nvshim_runtime_bin, garbage):
    """A plan file that is empty, not JSON, or not a plan is never trusted: the create
    succeeds with what discovery finds and leaves a valid cache behind."""
    Path(plan_path(str(cfg))).write_bytes(garbage)
    assert not cache_is_valid(cfg, node)
    bundle = fresh_bundle(tmp_path, rootfs, "b", "1")
    res = create(nvshim_runtime_bin, bundle, cfg)
    assert res.returncode == 0, res.stderr
    assert gpu_nodes(bundle) == ["/dev/nvidia1"]
    assert cache_is_valid(cfg, node)


def test_unwritable_cache_never_fails_a_create(node, cfg, rootfs, tmp_path, nvshim_runtime_bin):
    """A plan path that cannot be written (a directory is in the way) costs discovery, not
    the create."""
    os.unlink(plan_path(str(cfg)))
    os.mkdir(plan_path(str(cfg)))
    bundle = fresh_bundle(tmp_path, rootfs, "b", "0")
    res = create(nvshim_runtime_bin, bundle, cfg)
    assert res.returncode == 0, res.stderr
    assert gpu_nodes(bundle) == ["/dev/nvidia0"]


def test_fifty_parallel_cold_creates_all_succeed_and_leave_one_valid_cache(
    node, cfg, rootfs, tmp_path, nvshim_runtime_bin
):
    """50 creates started together on a node without a plan cache all succeed with the right
    GPU, and leave exactly one valid plan file and no temporary files."""
    os.unlink(plan_path(str(cfg)))
    bundles = [fresh_bundle(tmp_path, rootfs, f"b{i}", str(i % 2)) for i in range(50)]
    env = {"NVSHIM_CONFIG": str(cfg), "PATH": PATH}
    procs = [
        subprocess.Popen(
            [nvshim_runtime_bin, "create", "--bundle", str(b), unique_id()],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for b in bundles
    ]
    errors = [(p.wait(timeout=300), p.stderr.read().decode()) for p in procs]
    for p in procs:
        p.stderr.close()
    assert [e for e in errors if e[0] != 0] == []
    for i, bundle in enumerate(bundles):
        assert gpu_nodes(bundle) == [f"/dev/nvidia{i % 2}"]
    assert cache_is_valid(cfg, node)
    json.loads(Path(plan_path(str(cfg))).read_text())
    leftovers = [p.name for p in cfg.parent.iterdir() if ".nvshim-" in p.name]
    assert leftovers == []
