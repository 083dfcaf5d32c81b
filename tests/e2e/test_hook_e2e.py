"""The createContainer hook, end to end: what the container's own loader sees.

nvshim-runtime → runc on a simulated node, glibc rootfs (busybox + glibc loader + the
host's static ldconfig). Resolution is proved with the loader's own trace
(``tests.helpers.bundle.ld_probe_command``): ``via_cache`` means the container's
``/etc/ld.so.cache`` had the SONAME, not just that the file sits in a default directory.
"""

from __future__ import annotations

import pytest

from nvshim.node.compile import compile_node
from tests.helpers.bundle import ld_probe_command, make_bundle, parse_ld_probe
from tests.helpers.common import require_root, unique_id
from tests.helpers.node import write_nvshim_config

pytestmark = pytest.mark.e2e

LIBDIR = "/usr/lib/x86_64-linux-gnu"
VERSIONED = "libcuda.so.550.54.15"
PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A simulated 2-GPU node."""
    require_root()
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("sim") / "node"), gpus=2, shuffle_minors=True)


@pytest.fixture
def env(node, tmp_path):
    """nvshim-runtime's environment: a config pointing at the simulated node, runc below."""
    cfg = write_nvshim_config(tmp_path / "cfg", {"driver-root": node.root, "runtimes": ["runc"]})
    compile_node(str(cfg))
    return {"NVSHIM_CONFIG": str(cfg), "PATH": PATH.split("=", 1)[1]}


def run(runc, glibc_rootfs, tmp_path, nvshim_runtime_bin, env, script, image_env):
    bundle = make_bundle(tmp_path / "b", glibc_rootfs, ["/bin/sh", "-c", script], env=image_env)
    return runc.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()


def test_libcuda_resolves_through_container_ldcache(
    runc, glibc_rootfs, tmp_path, nvshim_runtime_bin, env
):
    """With GPU 0, the container's loader finds libcuda.so.1 in its own ld.so.cache at the
    multiarch path, and ldconfig -p in the container lists it."""
    script = f"{ld_probe_command('libcuda.so.1')}; echo ===; /sbin/ldconfig -p"
    res = run(
        runc, glibc_rootfs, tmp_path, nvshim_runtime_bin, env, script, ["NVIDIA_VISIBLE_DEVICES=0"]
    )
    probe_out, _, ldconfig_out = res.stdout.partition("===")
    probe = parse_ld_probe(probe_out, "libcuda.so.1")
    assert probe.path == f"{LIBDIR}/libcuda.so.1", res.describe()
    assert probe.via_cache, probe.searches
    listed = [
        line for line in ldconfig_out.splitlines() if line.strip().startswith("libcuda.so.1 ")
    ]
    assert listed and listed[0].rstrip().endswith(f"=> {LIBDIR}/libcuda.so.1"), ldconfig_out


def test_ldcache_keeps_image_entries(runc, glibc_rootfs, tmp_path, nvshim_runtime_bin, env):
    """The rewritten cache still resolves the image's own libc through the cache."""
    res = run(
        runc,
        glibc_rootfs,
        tmp_path,
        nvshim_runtime_bin,
        env,
        ld_probe_command("libc.so.6"),
        ["NVIDIA_VISIBLE_DEVICES=0"],
    )
    probe = parse_ld_probe(res.stdout, "libc.so.6")
    assert probe.path is not None and probe.via_cache, res.describe()


def test_utility_only_has_no_libcuda_and_no_uvm(
    runc, glibc_rootfs, tmp_path, nvshim_runtime_bin, env
):
    """NVIDIA_DRIVER_CAPABILITIES=utility: libcuda is not mounted, /dev/nvidia-uvm is absent,
    nvidia-smi still lists the GPU."""
    script = (
        f"grep -c {VERSIONED} /proc/self/mountinfo; "
        "test -e /dev/nvidia-uvm && echo UVM-PRESENT || echo UVM-ABSENT; "
        "grep -c libnvidia-ml.so.550.54.15 /proc/self/mountinfo; "
        "nvidia-smi -L; echo smi-rc=$?"
    )
    res = run(
        runc,
        glibc_rootfs,
        tmp_path,
        nvshim_runtime_bin,
        env,
        script,
        ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility"],
    )
    lines = res.stdout.splitlines()
    assert lines[0] == "0", res.describe()  # no libcuda mount
    assert lines[1] == "UVM-ABSENT"
    assert lines[2] == "1"  # NVML is mounted
    assert lines[3].startswith("GPU 0: ") and "smi-rc=0" in res.stdout, res.describe()


def test_default_capabilities_mount_libcuda_and_uvm(
    runc, glibc_rootfs, tmp_path, nvshim_runtime_bin, env
):
    """Without NVIDIA_DRIVER_CAPABILITIES (= compute,utility) libcuda is mounted and /dev/nvidia-uvm present."""
    script = (
        f"grep -c {VERSIONED} /proc/self/mountinfo; "
        "test -c /dev/nvidia-uvm && echo UVM-PRESENT || echo UVM-ABSENT"
    )
    res = run(
        runc, glibc_rootfs, tmp_path, nvshim_runtime_bin, env, script, ["NVIDIA_VISIBLE_DEVICES=0"]
    )
    assert res.stdout.splitlines()[:2] == ["1", "UVM-PRESENT"], res.describe()
