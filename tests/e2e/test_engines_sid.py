"""e2e: the newest engines (Debian unstable's, :mod:`tests.helpers.debiansid`) reach nvshim.

Here: containerd 2.1's version 3 config (configure, dump, revert) and podman 5.8 (env and its
own CDI injection, sid's runc 1.3 under nvshim). Elsewhere, beside the older engines: runc 1.3
and crun 1.28 in test_runtime.py, containerd 2.1's CRI in test_kubelet_cri.py, Docker 28.5 in
test_docker_gpus_e2e.py. Each engine is fetched into the test cache on first use; without the network a test skips,
naming why, and under ``CI`` it fails: CI never loses these engines silently.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import tomlkit

from nvshim.node.compile import compile_node
from tests.helpers.common import require_binary, require_root
from tests.helpers.debiansid import (
    PODMAN_5_HOST_PATHS,
    containerd_2_dir,
    engine_or_skip,
    podman_5,
    runc_sid,
)
from tests.helpers.node import write_nvshim_config
from tests.helpers.podman import Podman

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BINARY = "/opt/nvshim/bin/nvshim-runtime"
CRI_V3 = "io.containerd.cri.v1.runtime"
PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROBE = 'for n in /dev/nvidia*; do [ -c "$n" ] && echo "DEV $n"; done; env'


@pytest.fixture(scope="module")
def containerd_2() -> Path:
    """sid's containerd 2 bin dir (containerd, its shim, ctr)."""
    return engine_or_skip(containerd_2_dir, "containerd 2.1")


def _containerd(bin_dir: Path, *args: str) -> str:
    done = subprocess.run([str(bin_dir / "containerd"), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _nvshim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nvshim.cli.main", *args], cwd=REPO, capture_output=True, text=True
    )


def _snapshot(root: Path) -> Dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_containerd_2_loads_v3_handler_and_revert_restores(
    containerd_2: Path, tmp_path: Path
) -> None:
    """containerd 2's own default (version 3) config, configured by nvshim, loads with the
    handler and CDI on in ``io.containerd.cri.v1.runtime``; --revert restores the bytes."""
    assert _containerd(containerd_2, "--version").split()[2].lstrip("v").startswith("2.")
    config = tmp_path / "config.toml"
    config.write_text(_containerd(containerd_2, "config", "default"))
    assert tomlkit.parse(config.read_text()).unwrap()["version"] == 3
    before = _snapshot(tmp_path)
    done = _nvshim(
        "runtime", "configure", "--config", str(config), "--binary", BINARY, "--enable-cdi"
    )
    assert done.returncode == 0, done.stderr
    merged: Dict[str, Any] = tomlkit.parse(
        _containerd(containerd_2, "--config", str(config), "config", "dump")
    ).unwrap()
    cri = merged["plugins"][CRI_V3]
    handler = cri["containerd"]["runtimes"]["nvshim"]
    assert handler["options"]["BinaryName"] == BINARY
    assert handler["runtime_type"] == "io.containerd.runc.v2"
    assert cri["enable_cdi"] is True
    assert "runc" in cri["containerd"]["runtimes"]  # the default's own handler survives
    done = _nvshim("runtime", "configure", "--config", str(config), "--revert")
    assert done.returncode == 0, done.stderr
    assert _snapshot(tmp_path) == before


@pytest.fixture(scope="module")
def podman5(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[Podman, Any, Path]]:
    """(sid's podman 5 with private storage reading CDI specs from one private dir, the
    simulated 2-GPU node with swapped minors, that dir holding nvshim's spec for it)."""
    require_root()
    require_binary("conmon")
    from nvshim.sim.build import create_node

    binary, env = engine_or_skip(podman_5, "podman 5.8")
    base = tmp_path_factory.mktemp("podman5")
    node = create_node(str(base / "node"), gpus=2, shuffle_minors=True)
    cdi = base / "cdi"
    gen = _nvshim(
        "cdi", "generate", "--driver-root", node.root, "--output", str(cdi / "nvidia.yaml")
    )
    assert gen.returncode == 0, gen.stderr
    podman = Podman(
        base / "storage",
        binary=binary,
        env=env,
        cdi_spec_dirs=[cdi],
        host_paths=PODMAN_5_HOST_PATHS,
    )
    try:
        yield podman, node, base
    finally:
        podman.cleanup()


def _podman5_run(
    podman5: Tuple[Podman, Any, Path],
    tmp_path: Path,
    rootfs: Path,
    require: bool = True,
    **run: Any,
) -> Tuple[List[str], Path]:
    """PROBE in a podman 5 container through nvshim (``require``-allocation, sid's runc 1.3
    below it, the README's wrapper setting NVSHIM_CONFIG): the GPU nodes it saw, the journal."""
    podman, node, _ = podman5
    low = engine_or_skip(runc_sid, "runc 1.3")
    cfg = write_nvshim_config(
        tmp_path / "cfg",
        {"driver-root": node.root, "runtimes": [low], "require-allocation": require},
    )
    compile_node(str(cfg))
    wrapper = tmp_path / "nvshim-runtime"
    wrapper.write_text(
        f"#!/bin/sh\nexport NVSHIM_CONFIG={cfg}\n"
        f'exec {sys.executable} -m nvshim.runtime.main "$@"\n'
    )
    wrapper.chmod(0o755)
    res = podman.podman_run(
        rootfs,
        ["sh", "-c", PROBE],
        runtime=wrapper,
        podman_env={"PATH": PATH_ENV, "PYTHONPATH": str(REPO)},
        **run,
    )
    assert res.rc == 0, res.describe()
    return sorted(re.findall(r"^DEV /dev/(nvidia[0-9]+)$", res.stdout, re.M)), (
        cfg.parent / "grants.jsonl"
    )


def test_podman_5_env_gpu_is_exactly_that_gpu_and_none_without(
    podman5: Tuple[Podman, Any, Path], rootfs: Path, tmp_path: Path
) -> None:
    """podman 5.8 through nvshim: NVIDIA_VISIBLE_DEVICES=1 (require-allocation off) shows GPU
    1's node alone; under require-allocation an unallocated "all" shows none."""
    _, node, _ = podman5
    seen, _ = _podman5_run(
        podman5, tmp_path / "open", rootfs, require=False, env={"NVIDIA_VISIBLE_DEVICES": "1"}
    )
    assert seen == [f"nvidia{node.gpus[1].minor}"]
    seen, _ = _podman5_run(
        podman5, tmp_path / "strict", rootfs, env={"NVIDIA_VISIBLE_DEVICES": "all"}
    )
    assert seen == []


def test_podman_5_cdi_device_is_exactly_that_gpu_and_journaled(
    podman5: Tuple[Podman, Any, Path], rootfs: Path, tmp_path: Path
) -> None:
    """podman 5.8's own CDI injection (``--device nvidia.com/gpu=1`` from nvshim's spec in
    its ``--cdi-spec-dir``) under require-allocation, image env "all": GPU 1 alone, journaled
    as the engine's grant."""
    _, node, _ = podman5
    seen, journal = _podman5_run(
        podman5,
        tmp_path,
        rootfs,
        devices=["nvidia.com/gpu=1"],
        env={"NVIDIA_VISIBLE_DEVICES": "all"},
    )
    assert seen == [f"nvidia{node.gpus[1].minor}"]
    grants = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [(g["source"], g["gpus"]) for g in grants] == [("engine", [node.gpus[1].uuid])]
