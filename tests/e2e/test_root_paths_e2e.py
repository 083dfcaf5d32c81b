"""e2e: issue 35's rules for what nvshim-runtime hands runc as root, through real runc.

- runc keeps a device number's low 32 bits, so ``195 + 2**32`` in config.json makes a GPU
  node 195:N (pinned on plain runc); nvshim-runtime refuses such a spec in one line and no
  container is created.
- A ``runtimes:`` entry another user owns is never executed: every command fails in one
  line naming it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from nvshim.node.compile import compile_node
from tests.helpers.bundle import char_device, device_rule, make_bundle
from tests.helpers.common import require_binary, require_root, unique_id
from tests.helpers.node import write_nvshim_config
from tests.helpers.runc import Runc

pytestmark = pytest.mark.e2e

PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ALIAS = 195 + 2**32
PROBE = "stat -c 'NODE %t:%T' /dev/gpu1"


def aliased_bundle(path: Path, rootfs: Path) -> Path:
    """A bundle whose /dev/gpu1 is major 195 + 2**32, minor 1 (the cgroup rule allows 195:1)."""
    return make_bundle(
        path,
        rootfs,
        ["sh", "-c", PROBE],
        devices=[char_device("/dev/gpu1", ALIAS, 1)],
        device_rules=[device_rule(195, 1)],
    )


def test_runc_makes_an_out_of_range_major_a_gpu_node(
    runc: Runc, rootfs: Path, tmp_path: Path
) -> None:
    """Plain runc turns major 195 + 2**32 into the GPU major 195 (c3 in hex): the aliasing nvshim guards against."""
    res = runc.run(aliased_bundle(tmp_path / "b", rootfs), unique_id("alias"))
    assert "NODE c3:1" in res.stdout, res.describe()


def test_nvshim_refuses_an_out_of_range_major(
    runc: Runc, rootfs: Path, tmp_path: Path, nvshim_runtime_bin: str
) -> None:
    """nvshim-runtime refuses that spec in one line naming the field and the value runc would use; no container is made and config.json is unchanged."""
    config = write_nvshim_config(tmp_path / "cfg", {"runtimes": ["runc"]})
    compile_node(str(config))
    bundle = aliased_bundle(tmp_path / "b", rootfs)
    before = (bundle / "config.json").read_bytes()
    res = runc.run(
        bundle,
        unique_id("alias"),
        runtime=nvshim_runtime_bin,
        env={"PATH": PATH_ENV, "NVSHIM_CONFIG": str(config)},
    )
    assert res.rc == 1 and "NODE" not in res.stdout, res.describe()
    assert f"linux.devices[0].major is {ALIAS}" in res.stderr and "would use 195" in res.stderr
    assert len(res.stderr.splitlines()) == 1, res.describe()
    assert (bundle / "config.json").read_bytes() == before


def test_a_runtime_another_user_owns_is_never_executed(
    runc: Runc, rootfs: Path, tmp_path: Path, nvshim_runtime_bin: str
) -> None:
    """A runtimes: entry (a copy of runc) owned by uid 65534 fails run and state in one line naming it, and runs nothing."""
    require_root()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    copy = bindir / "runc"
    shutil.copy2(require_binary("runc"), copy)
    os.chown(copy, 65534, 65534)
    config = write_nvshim_config(tmp_path / "cfg", {"runtimes": [str(copy)]})
    # not compiled: nvshim config compile refuses it too (tests/unit/test_exec_trust.py)
    env = {"PATH": PATH_ENV, "NVSHIM_CONFIG": str(config)}
    bundle = make_bundle(tmp_path / "b", rootfs, ["sh", "-c", "echo RAN"])
    cid = unique_id("untrusted")
    res = runc.run(bundle, cid, runtime=nvshim_runtime_bin, env=env)
    assert res.rc == 1 and "RAN" not in res.stdout, res.describe()
    assert f"runtime {copy} is owned by uid 65534, not root" in res.stderr, res.describe()
    assert len(res.stderr.splitlines()) == 1
    state = runc.state(cid, runtime=nvshim_runtime_bin, env=env)
    assert state.rc == 1 and f"runtime {copy}" in state.stderr
