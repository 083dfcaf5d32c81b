"""e2e: CUDA forward compatibility. An image's /usr/local/cuda/compat/libcuda newer than the
host driver is what the container's loader finds for libcuda.so.1; an older one is not.
Checked with the glibc loader's own trace inside the container, for the in-root work done
by the runtime and by the createContainer hook (read-only rootfs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict

import pytest

from nvshim.host.elf import build_shared_object
from nvshim.node.compile import compile_node
from tests.e2e.test_security import rootwork_by, work_by
from tests.helpers.bundle import ld_probe_args, make_bundle, parse_ld_probe
from tests.helpers.common import require_root, unique_id
from tests.helpers.node import write_nvshim_config

pytestmark = pytest.mark.e2e

COMPAT = "/usr/local/cuda/compat"
DRIVER_LIBDIR = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    require_root()
    from nvshim.sim.build import create_node

    return create_node(
        str(tmp_path_factory.mktemp("sim") / "node"), gpus=1, driver_version="550.54.15"
    )


@pytest.fixture
def env(node: Any, tmp_path: Path) -> Dict[str, str]:
    cfg = write_nvshim_config(
        tmp_path / "cfg",
        {"driver-root": node.root, "runtimes": ["runc"], "debug-log": str(tmp_path / "debug.log")},
    )
    compile_node(str(cfg))
    return {"NVSHIM_CONFIG": str(cfg), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def add_compat(rootfs: Path, version: str) -> None:
    """The image's compat package: libcuda.so.<version> (SONAME libcuda.so.1) and its link."""
    compat = rootfs / COMPAT.lstrip("/")
    compat.mkdir(parents=True)
    (compat / f"libcuda.so.{version}").write_bytes(
        build_shared_object("libcuda.so.1", f"COMPAT {version}")
    )
    os.symlink(f"libcuda.so.{version}", compat / "libcuda.so.1")


@pytest.mark.parametrize("by", ["runtime", "hook"])
@pytest.mark.parametrize(
    ("compat", "expected_dir"), [("575.57.08", COMPAT), ("535.104.05", DRIVER_LIBDIR)]
)
def test_loader_picks_newer_compat_libcuda(
    runc: Any,
    glibc_rootfs: Path,
    tmp_path: Path,
    nvshim_runtime_bin: str,
    env: Dict[str, str],
    by: str,
    compat: str,
    expected_dir: str,
) -> None:
    """Host driver 550: a 575 compat libcuda is found first; a 535 one is ignored."""
    add_compat(glibc_rootfs, compat)
    bundle = make_bundle(
        tmp_path / "b",
        glibc_rootfs,
        ld_probe_args("libcuda.so.1"),
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
    )
    with work_by(by, bundle, env):
        res = runc.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env)
    res.check()
    assert rootwork_by(tmp_path / "debug.log") == [by]
    probe = parse_ld_probe(res.stdout, "libcuda.so.1")
    assert probe.via_cache, probe.output
    assert probe.path == f"{expected_dir}/libcuda.so.1", probe.output
