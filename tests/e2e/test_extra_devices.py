"""e2e: IMEX channels, NVSwitch, GDS, MOFED and gdrcopy devices through nvshim-runtime → runc.

The simulated node has all five (``nvshim sim create --imex-channels 3 --nvswitches 2 --gds
--mofed --gdrcopy``). Each test runs a container and asserts what it sees in /dev (and
/etc/cufile.json, the fabric manager socket), and that opening an injected node reaches
the (absent) driver, ENXIO — the device cgroup allows it — rather than EPERM.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from nvshim.node.compile import compile_node
from tests.helpers.bundle import make_bundle
from tests.helpers.common import require_root, unique_id
from tests.helpers.node import write_nvshim_config

pytestmark = pytest.mark.e2e

PROBE = (
    "for d in /dev /dev/infiniband /dev/nvidia-caps-imex-channels; do "
    '[ -d $d ] && ls $d | sed "s|^|$d/|"; done; '
    "for n in /dev/gdrdrv /dev/nvidia-fs0 /dev/infiniband/uverbs0 /dev/nvidia-nvswitch0 "
    "/dev/nvidia-caps-imex-channels/channel*; do [ -e $n ] && head -c0 $n 2>&1 | "
    "sed 's/^/OPEN: /'; done; "
    "cat /etc/cufile.json 2>/dev/null; "
    "[ -S /run/nvidia-fabricmanager/socket ] && echo FM-SOCKET; true"
)
EXTRA_NAMES = ("nvidia-fs", "infiniband", "nvswitch", "gdrdrv", "imex-channels")
ALL_ON = {
    "NVIDIA_GDS": "enabled",
    "NVIDIA_MOFED": "enabled",
    "NVIDIA_NVSWITCH": "enabled",
    "NVIDIA_GDRCOPY": "enabled",
}
DEVICE_LIST = "/var/run/nvidia-container-devices"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    require_root()
    from nvshim.sim.build import create_node

    return create_node(
        str(tmp_path_factory.mktemp("sim") / "node"),
        gpus=2,
        imex_channels=3,
        nvswitches=2,
        gds=True,
        mofed=True,
        gdrcopy=True,
    )


def env_for(tmp_path: Path, node: Any, **settings: Any) -> Dict[str, str]:
    cfg = write_nvshim_config(
        tmp_path / "cfg",
        {
            "driver-root": node.root,
            "runtimes": ["runc"],
            **{k.replace("_", "-"): v for k, v in settings.items()},
        },
    )
    compile_node(str(cfg))
    return {"NVSHIM_CONFIG": str(cfg), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def run(
    runc: Any,
    rootfs: Path,
    tmp_path: Path,
    runtime: str,
    env: Dict[str, str],
    container_env: Dict[str, str],
    **kw: Any,
) -> Any:
    bundle = make_bundle(
        tmp_path / unique_id("b"), rootfs, ["sh", "-c", PROBE], env=container_env, **kw
    )
    return runc.run_detached(bundle, unique_id(), runtime=runtime, env=env)


def seen(output: str) -> List[str]:
    return [line for line in output.splitlines() if line.startswith("/dev/")]


def extras_seen(output: str) -> List[str]:
    """The extra device nodes listed (not their directories)."""
    dirs = ("/dev/infiniband", "/dev/nvidia-caps-imex-channels")
    return [p for p in seen(output) if any(name in p for name in EXTRA_NAMES) and p not in dirs]


def test_all_features_and_one_imex_channel(
    runc: Any, node: Any, rootfs: Path, tmp_path: Path, nvshim_runtime_bin: str
) -> None:
    """GPU 0 plus every feature flag and NVIDIA_IMEX_CHANNELS=1: each class's nodes, channel 1
    only, cufile.json and the fabric manager socket; every injected node is allowed."""
    res = run(
        runc,
        rootfs,
        tmp_path,
        nvshim_runtime_bin,
        env_for(tmp_path, node),
        {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_IMEX_CHANNELS": "1", **ALL_ON},
    ).check()
    devs = seen(res.stdout)
    for path in (
        "/dev/gdrdrv",
        "/dev/nvidia-fs0",
        "/dev/nvidia-fs3",
        "/dev/nvidia-nvswitchctl",
        "/dev/nvidia-nvswitch1",
        "/dev/infiniband/uverbs0",
        "/dev/infiniband/rdma_cm",
        "/dev/nvidia-caps-imex-channels/channel1",
    ):
        assert path in devs, res.describe()
    assert "/dev/nvidia-caps-imex-channels/channel0" not in devs
    assert "/dev/nvidia-caps-imex-channels/channel2" not in devs
    assert "/dev/infiniband/umad0" not in devs and "/dev/infiniband/issm0" not in devs, devs
    assert "NVSHIM-SIM" in res.stdout and "FM-SOCKET" in res.stdout
    opened = [line for line in res.stdout.splitlines() if line.startswith("OPEN: ")]
    assert len(opened) == 5 and all("No such device or address" in x for x in opened), opened


def test_nothing_extra_unless_asked(
    runc: Any, node: Any, rootfs: Path, tmp_path: Path, nvshim_runtime_bin: str
) -> None:
    """A GPU container without the flags gets no extra device; ``=disabled`` is not enabled."""
    res = run(
        runc,
        rootfs,
        tmp_path,
        nvshim_runtime_bin,
        env_for(tmp_path, node),
        {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_GDS": "disabled"},
    ).check()
    assert extras_seen(res.stdout) == [], res.stdout
    gpus = {p for p in seen(res.stdout) if p.startswith("/dev/nvidia") and p[11:].isdigit()}
    assert gpus == {f"/dev/nvidia{node.gpus[0].minor}"}, res.stdout  # GPU 0, no other


def test_features_need_a_gpu_grant(
    runc: Any, node: Any, rootfs: Path, tmp_path: Path, nvshim_runtime_bin: str
) -> None:
    """NVIDIA_VISIBLE_DEVICES=void with every flag on: not a GPU container, nothing injected."""
    res = run(
        runc,
        rootfs,
        tmp_path,
        nvshim_runtime_bin,
        env_for(tmp_path, node),
        {"NVIDIA_VISIBLE_DEVICES": "void", **ALL_ON},
    ).check()
    assert [
        p for p in seen(res.stdout) if "nvidia" in p or "gdrdrv" in p or "infiniband" in p
    ] == []


def test_require_allocation_governs_imex_channels(
    runc: Any, node: Any, rootfs: Path, tmp_path: Path, nvshim_runtime_bin: str
) -> None:
    """Under require-allocation the image's NVIDIA_IMEX_CHANNELS grants nothing; the device
    plugin's imex/<N> mount grants exactly channel N."""
    env = env_for(tmp_path, node, require_allocation=True)
    uuid = node.gpus[1].uuid
    image_only = run(
        runc,
        rootfs,
        tmp_path,
        nvshim_runtime_bin,
        env,
        {"NVIDIA_VISIBLE_DEVICES": uuid, "NVIDIA_IMEX_CHANNELS": "0,1,2"},
    ).check()
    assert f"/dev/nvidia{node.gpus[1].minor}" in seen(image_only.stdout)
    assert extras_seen(image_only.stdout) == [], image_only.stdout
    mount = {
        "destination": f"{DEVICE_LIST}/imex/2",
        "type": "bind",
        "source": "/dev/null",
        "options": ["bind", "ro"],
    }
    allocated = run(
        runc,
        rootfs,
        tmp_path,
        nvshim_runtime_bin,
        env,
        {"NVIDIA_VISIBLE_DEVICES": uuid, "NVIDIA_IMEX_CHANNELS": "0"},
        mounts=[mount],
    ).check()
    assert extras_seen(allocated.stdout) == ["/dev/nvidia-caps-imex-channels/channel2"], (
        allocated.stdout
    )


def test_require_allocation_keeps_fabric_devices_out(
    runc: Any, node: Any, rootfs: Path, tmp_path: Path, nvshim_runtime_bin: str
) -> None:
    """Under require-allocation a container holding one allocated GPU gets no InfiniBand or
    NVSwitch node from NVIDIA_MOFED/NVIDIA_NVSWITCH=enabled in its env; with
    require-allocation-features: [mofed] it gets the verbs node and rdma_cm, never umad or
    issm, and still no NVSwitch."""
    uuid = node.gpus[0].uuid
    flags = {
        "NVIDIA_VISIBLE_DEVICES": uuid,
        "NVIDIA_MOFED": "enabled",
        "NVIDIA_NVSWITCH": "enabled",
    }
    strict = run(
        runc,
        rootfs,
        tmp_path,
        nvshim_runtime_bin,
        env_for(tmp_path, node, require_allocation=True),
        flags,
    ).check()
    assert f"/dev/nvidia{node.gpus[0].minor}" in seen(strict.stdout), strict.describe()
    assert extras_seen(strict.stdout) == [], strict.stdout
    allowed = run(
        runc,
        rootfs,
        tmp_path,
        nvshim_runtime_bin,
        env_for(tmp_path, node, require_allocation=True, require_allocation_features=["mofed"]),
        flags,
    ).check()
    assert extras_seen(allowed.stdout) == ["/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0"], (
        allowed.stdout
    )


def test_unknown_imex_channel_fails_with_one_line(
    runc: Any, node: Any, rootfs: Path, tmp_path: Path, nvshim_runtime_bin: str
) -> None:
    """A channel the node lacks fails the create naming it and the node's channels; the
    bundle's config.json stays byte-identical."""
    bundle = make_bundle(
        tmp_path / "b",
        rootfs,
        ["true"],
        env={"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_IMEX_CHANNELS": "7"},
    )
    before = (bundle / "config.json").read_bytes()
    res = runc.create(
        bundle,
        unique_id(),
        runtime=nvshim_runtime_bin,
        env=env_for(tmp_path, node),
        log=tmp_path / "log.json",
    )
    assert res.rc == 1
    assert res.stderr.strip().splitlines() == [
        "nvshim: IMEX channel 7 (from env) does not exist: this node has channels 0, 1, 2 "
        f"under {node.dev_root}/dev/nvidia-caps-imex-channels"
    ], res.describe()
    assert res.log_errors and "IMEX channel 7" in res.log_errors[-1]
    assert (bundle / "config.json").read_bytes() == before


def test_cdi_imex_channel_spec_from_cdi_generate(
    runc: Any, node: Any, rootfs: Path, tmp_path: Path, nvshim_runtime_bin: str, nvshim_bin: str
) -> None:
    """`nvshim cdi generate --class imex-channel` writes a spec whose
    nvidia.com/imex-channel=1 gives a container exactly channel 1."""
    import subprocess

    cdi_dir = tmp_path / "cdi"
    done = subprocess.run(
        [
            nvshim_bin,
            "cdi",
            "generate",
            "--driver-root",
            node.root,
            "--class",
            "imex-channel",
            "--output",
            str(cdi_dir / "imex.yaml"),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    env = env_for(tmp_path, node, cdi_spec_dirs=[str(cdi_dir)])
    res = run(
        runc,
        rootfs,
        tmp_path,
        nvshim_runtime_bin,
        env,
        {"NVIDIA_VISIBLE_DEVICES": "nvidia.com/imex-channel=1"},
    ).check()
    assert extras_seen(res.stdout) == ["/dev/nvidia-caps-imex-channels/channel1"], res.stdout
    assert "No such device or address" in res.stdout
