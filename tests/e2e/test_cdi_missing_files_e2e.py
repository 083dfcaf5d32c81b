"""A create that would bind-mount a file a CDI spec names and the node no longer has (the old
driver's libraries after an upgrade) fails before runc with nvshim's own line naming the
spec, the file and the fix, whatever ``stale-cdi-spec`` says; after ``nvshim cdi refresh``
the same create gives the container the new driver's libraries.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import pytest

from nvshim.cdi.write import dump_spec
from nvshim.host.discovery import Host
from nvshim.node.cdigen import generate_spec
from nvshim.node.compile import compile_node
from tests.helpers.bundle import make_bundle
from tests.helpers.common import require_root, unique_id
from tests.helpers.node import write_nvshim_config
from tests.helpers.runc import Runc

OLD, NEW = "550.54.15", "560.35.03"
LIBDIR = "usr/lib/x86_64-linux-gnu"
PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: LIB <mount point> for every driver library bind-mounted into the container
PROBE = (
    "awk '$5 ~ /^\\/usr\\/lib\\/x86_64-linux-gnu\\/.*\\.so\\./ {print \"LIB \" $5}' "
    "/proc/self/mountinfo"
)


@pytest.fixture
def upgraded(tmp_path: Path) -> Dict[str, Any]:
    """A node whose spec (cdi/nvidia.yaml, nvshim's hook) was made for driver 550, and
    whose driver was then replaced by 560: the spec's libraries are gone."""
    require_root()
    from nvshim.runtime.hookargs import hook_command
    from nvshim.sim.build import create_node

    root = str(tmp_path / "node")
    old = create_node(root, gpus=2, driver_version=OLD)
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    spec = spec_dir / "nvidia.yaml"
    spec.write_text(dump_spec(generate_spec(Host(old.root), hook_command=hook_command())))
    shutil.rmtree(root)
    create_node(root, gpus=2, driver_version=NEW)
    return {"root": root, "spec": spec, "spec_dir": spec_dir}


def env_for(tmp_path: Path, upgraded: Dict[str, Any], policy: str, kept: bool) -> Dict[str, str]:
    refresh = [f"--output {upgraded['spec']}"] if kept else []
    cfg = write_nvshim_config(
        tmp_path / "cfg",
        {
            "driver-root": upgraded["root"],
            "runtimes": ["runc"],
            "cdi-spec-dirs": [str(upgraded["spec_dir"])],
            "stale-cdi-spec": policy,
            "cdi-refresh": refresh,
        },
    )
    compile_node(str(cfg))
    return {"NVSHIM_CONFIG": str(cfg), "PATH": PATH_ENV}


def libraries(output: str) -> List[str]:
    return sorted(re.findall(r"^LIB \S+/(lib[^/\s]+)$", output, re.M))


@pytest.mark.parametrize("policy", ["warn", "refuse"])
@pytest.mark.parametrize("kept", [True, False], ids=["kept", "not-kept"])
def test_create_mounting_a_file_the_node_lost_fails_before_runc(
    runc: Runc,
    rootfs: Path,
    tmp_path: Path,
    nvshim_runtime_bin: str,
    upgraded: Dict[str, Any],
    policy: str,
    kept: bool,
) -> None:
    """nvidia.com/gpu=0 from a spec whose libcuda.so.550 is gone exits 1 with one line (stderr
    and runc's --log) naming the spec, the first missing file, how many more, and the fix:
    `nvshim cdi refresh` when cdi-refresh keeps the spec, `nvshim cdi generate --output`
    otherwise; under stale-cdi-spec warn and refuse alike; config.json byte-identical."""
    env = env_for(tmp_path, upgraded, policy, kept)
    bundle = make_bundle(
        tmp_path / "b", rootfs, ["true"], env=["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0"]
    )
    before = (bundle / "config.json").read_bytes()
    res = runc.create(
        bundle, unique_id(), runtime=nvshim_runtime_bin, env=env, log=tmp_path / "log.json"
    )
    lines = [res.refusal()]
    assert (bundle / "config.json").read_bytes() == before
    spec = upgraded["spec"]
    fix = (
        "run nvshim cdi refresh"
        if kept
        else f"regenerate it with nvshim cdi generate --output {spec}"
    )
    assert re.fullmatch(
        f"nvshim: CDI spec {re.escape(str(spec))} mounts "
        f"{re.escape(upgraded['root'])}/{LIBDIR}/lib[a-z-]+\\.so\\.{re.escape(OLD)}, which this "
        f"node does not have \\(and [0-9]+ more\\): the spec is older than the driver; "
        f"{re.escape(fix)}",
        lines[0],
    ), lines[0]
    assert "no such file or directory" not in res.stderr.lower()


def test_after_refresh_the_same_create_gets_the_new_driver(
    runc: Runc,
    rootfs: Path,
    tmp_path: Path,
    nvshim_runtime_bin: str,
    nvshim_bin: str,
    upgraded: Dict[str, Any],
) -> None:
    """The fix the line names works: after `nvshim cdi refresh` the container asking for
    nvidia.com/gpu=0 runs and sees libcuda.so.560 mounted, and no 550 library."""
    env = env_for(tmp_path, upgraded, "warn", True)
    done = subprocess.run(
        [nvshim_bin, "cdi", "refresh"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    bundle = make_bundle(
        tmp_path / "b", rootfs, ["sh", "-c", PROBE], env=["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0"]
    )
    res = runc.run_detached(
        bundle, unique_id(), runtime=nvshim_runtime_bin, env=env, log=tmp_path / "log.json"
    ).check()
    seen = libraries(res.stdout)
    assert f"libcuda.so.{NEW}" in seen, res.describe()
    assert not any(OLD in lib for lib in seen), seen
    assert [x for x in res.log_lines if x.get("level") == "warning"] == [], res.describe()
