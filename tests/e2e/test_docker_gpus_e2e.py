"""e2e: ``docker run --gpus`` with nvshim as Docker's runtime: Debian 12's docker.io 20.10
and Debian unstable's Docker 28.5 (:mod:`tests.helpers.debiansid`; also its native CDI,
``--device nvidia.com/gpu=N``).

A private dockerd (tests/helpers/docker.py) reads a ``daemon.json`` that ``nvshim runtime
configure --runtime docker`` wrote twice: runtime ``nvshim`` (require-allocation off) and
runtime ``nvshim-strict`` (require-allocation on) as Docker's default. Each configure put
nvshim's ``nvidia-container-runtime-hook`` beside its ``--binary``; dockerd's PATH holds the
default runtime's folder, so dockerd registers its ``nvidia`` device driver and ``--gpus``
adds the hook. The runtime is the trampoline rendered for this checkout behind a wrapper
that sets ``NVSHIM_CONFIG``. The image is a busybox rootfs whose env says, like a CUDA
image, ``NVIDIA_VISIBLE_DEVICES=all`` and ``NVIDIA_DRIVER_CAPABILITIES=compute,utility``.
The node is simulated, 4 GPUs with shuffled minors. What is asserted is what the container's
process sees: ``ls /dev``, the driver libraries, ``nvidia-smi -L``, ``env``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from nvshim.node.compile import compile_node
from nvshim.node.engines.docker import DOCKERD_PATH, GPUS_HOOK
from tests.helpers.common import make_env_wrapper, require_root
from tests.helpers.docker import Dockerd
from tests.helpers.node import write_nvshim_config

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
IMAGE = "nvshim-e2e/cuda-like:local"
GPU_NODE = re.compile(r"^nvidia([0-9]+)$")
LIBDIR = "/usr/lib/x86_64-linux-gnu"
PROBE = f"ls /dev; echo ---; ls {LIBDIR} 2>/dev/null; echo ---; nvidia-smi -L; echo ---; env"
STAND_IN = (
    "nvshim: docker run --gpus needs --runtime nvshim-strict (or nvshim-strict as "
    "Docker's default runtime): this container's runtime is not nvshim-strict, so it "
    "would start without GPUs"
)


def sections(stdout: str) -> Dict[str, Any]:
    """What PROBE printed: GPU minors under /dev, /dev entries, libraries, nvidia-smi lines, env."""
    dev, libs, smi, env = (stdout.split("---\n") + ["", "", "", ""])[:4]
    return {
        "minors": sorted(int(m.group(1)) for m in (GPU_NODE.match(x) for x in dev.split()) if m),
        "dev": dev.split(),
        "libs": libs.split(),
        "smi": [line for line in smi.splitlines() if line.startswith("GPU ")],
        "env": dict(line.split("=", 1) for line in env.splitlines() if "=" in line),
    }


def configure(*args: str, nvshim_config: Path) -> subprocess.CompletedProcess:
    """``nvshim runtime configure --runtime docker ARGS`` from this checkout."""
    env = dict(os.environ, NVSHIM_CONFIG=str(nvshim_config))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "nvshim.cli.main",
            "runtime",
            "configure",
            "--runtime",
            "docker",
            *args,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module", params=["20.10", "28"], ids=lambda v: f"docker-{v}")
def setup(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, base_rootfs: Path
) -> Iterator[Any]:
    """The simulated node, both runtimes registered by configure, dockerd started: Debian 12's
    docker.io 20.10 over runc 1.1.5, or Debian unstable's 28.5 with its containerd 2.1 over
    runc 1.3 (:mod:`tests.helpers.debiansid`; skipped, under CI failed, when unavailable)."""
    require_root()
    bin_dirs: Tuple[Path, ...] = ()
    low = "runc"
    if request.param == "28":
        from tests.helpers import debiansid

        bin_dirs = debiansid.engine_or_skip(debiansid.docker_28_dirs, "Docker 28")
        low = debiansid.engine_or_skip(debiansid.runc_sid, "runc 1.3")
    if shutil.which(GPUS_HOOK, path=os.pathsep.join(DOCKERD_PATH)):
        pytest.skip(f"this host has its own {GPUS_HOOK} on dockerd's PATH: configure keeps it")
    from nvshim.node.install.trampoline import render
    from nvshim.sim.build import create_node

    base = tmp_path_factory.mktemp("dgpus")
    node = create_node(str(base / "node"), gpus=4, shuffle_minors=True)
    assert [g.minor for g in node.gpus] != [0, 1, 2, 3], "minors not shuffled: proves less"
    tramp = base / "nvshim-runtime"
    tramp.write_text(render(sys.executable))
    tramp.chmod(0o755)
    daemon_json = base / "etc-docker" / "daemon.json"
    daemon_json.parent.mkdir()
    settings: Dict[str, Any] = {"log-level": "warn"}
    if request.param == "28":  # native CDI, reading only nvshim's spec for this node
        settings["cdi-spec-dirs"] = [str(base / "cdi")]
        gen = subprocess.run(
            [
                sys.executable,
                "-m",
                "nvshim.cli.main",
                "cdi",
                "generate",
                "--driver-root",
                node.root,
                "--output",
                str(base / "cdi" / "nvidia.yaml"),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert gen.returncode == 0, gen.stderr
    daemon_json.write_text(json.dumps(settings, indent=2) + "\n")
    dirs = {}
    for name, require in (("nvshim", False), ("nvshim-strict", True)):
        config = write_nvshim_config(
            base / name,
            {"require-allocation": require, "driver-root": node.root, "runtimes": [low]},
        )
        compile_node(str(config))
        wrapper = make_env_wrapper(
            base / name / "nvshim-runtime", tramp, {"NVSHIM_CONFIG": str(config)}
        )
        flags = ["--set-as-default"] if require else []
        done = configure(
            "--config",
            str(daemon_json),
            "--name",
            name,
            "--binary",
            str(wrapper),
            *flags,
            nvshim_config=config,
        )
        assert done.returncode == 0, done.stderr
        assert (base / name / GPUS_HOOK).is_file(), done.stderr
        dirs[name] = base / name
    # dockerd finds the default runtime's stand-in first on its PATH
    env = dict(os.environ, PATH=f"{dirs['nvshim-strict']}:{os.environ.get('PATH', '/usr/bin')}")
    dockerd = Dockerd(daemon_json, base, env=env, bin_dirs=bin_dirs)
    try:
        dockerd.start()
        dockerd.import_rootfs(
            base_rootfs,
            IMAGE,
            env=[
                "PATH=/bin:/usr/bin",
                "NVIDIA_VISIBLE_DEVICES=all",
                "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
            ],
        )
        yield {"node": node, "dockerd": dockerd, "dirs": dirs, "version": request.param}
    finally:
        dockerd.stop()


def run(setup: Any, *flags: str) -> Any:
    """``docker run --rm --network none FLAGS IMAGE sh -c PROBE``; what it saw."""
    result = setup["dockerd"].docker(
        "run", "--rm", "--network", "none", *flags, IMAGE, "sh", "-c", PROBE
    )
    assert result.rc == 0, result.describe()
    return sections(result.stdout)


FORMS = [
    # (--gpus value, GPU indices seen, compute libraries present)
    ("all", [0, 1, 2, 3], True),
    ("2", [0, 1], True),
    ("device=1", [1], True),
    ('"device=0,2"', [0, 2], True),
    ("all,capabilities=utility", [0, 1, 2, 3], False),
]


@pytest.mark.parametrize("gpus,indices,compute", FORMS, ids=[f[0] for f in FORMS])
def test_gpus_gives_exactly_what_it_names(
    setup: Any, gpus: str, indices: List[int], compute: bool
) -> None:
    """docker run --gpus X through nvshim as Docker's default runtime under
    require-allocation: the container sees exactly the GPUs X names (by their shuffled
    minors and in nvidia-smi -L), the driver libraries of the capabilities asked for, and
    no more (capabilities=utility: NVML but no libcuda, no nvidia-uvm)."""
    node = setup["node"]
    seen = run(setup, "--gpus", gpus)
    assert seen["minors"] == sorted(node.gpus[i].minor for i in indices), seen
    assert [line.split("UUID: ")[1].rstrip(")") for line in seen["smi"]] == [
        node.gpus[i].uuid for i in sorted(indices)
    ], seen["smi"]
    assert any(lib.startswith("libnvidia-ml.so.") for lib in seen["libs"]), seen["libs"]
    assert any(lib.startswith("libcuda.so.") for lib in seen["libs"]) == compute, seen["libs"]
    assert ("nvidia-uvm" in seen["dev"]) == compute, seen["dev"]


def test_gpus_with_require_allocation_off_runtime(setup: Any) -> None:
    """--runtime nvshim (require-allocation off) --gpus device=1: GPU 1 only, though the
    image says all."""
    node = setup["node"]
    seen = run(setup, "--runtime", "nvshim", "--gpus", "device=1")
    assert seen["minors"] == [node.gpus[1].minor], seen


def test_without_gpus_the_image_all_gets_nothing(setup: Any) -> None:
    """No --gpus: the image's NVIDIA_VISIBLE_DEVICES=all is refused under require-allocation
    as before (void in the env, no GPU, no driver library)."""
    seen = run(setup)
    assert seen["minors"] == [] and not seen["smi"], seen
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert not any(lib.startswith("libnvidia-ml") for lib in seen["libs"])


def test_runc_with_gpus_fails_with_nvshims_line(setup: Any) -> None:
    """--runtime runc --gpus all: runc runs nvshim's stand-in hook, which fails the
    container with nvshim's line instead of letting it start without GPUs."""
    result = setup["dockerd"].docker(
        "run", "--rm", "--network", "none", "--runtime", "runc", "--gpus", "all", IMAGE, "true"
    )
    assert result.rc == 125, result.describe()
    assert STAND_IN in result.stderr, result.stderr


def test_the_created_spec_has_no_nvidia_hook(setup: Any) -> None:
    """The config.json runc got for a --gpus container holds no nvidia-container-runtime-hook
    (20.10: beside Docker's own prestart hook; 28 with --network none adds none), and GPU
    1's node."""
    dockerd = setup["dockerd"]
    started = dockerd.docker(
        "run", "-d", "--network", "none", "--gpus", "device=1", IMAGE, "sleep", "60"
    )
    assert started.rc == 0, started.describe()
    cid = started.stdout.strip()
    try:
        bundles = list((dockerd.base / "exec").glob(f"containerd/**/{cid}/config.json"))
        assert len(bundles) == 1, list((dockerd.base / "exec").rglob("config.json"))
        spec = json.loads(bundles[0].read_text())
        hooks = spec.get("hooks", {})
        assert hooks.get("prestart") or setup["version"] != "20.10", hooks
        assert not [h for kind in hooks.values() for h in kind if GPUS_HOOK in h["path"]], hooks
        minors = [
            d["minor"]
            for d in spec["linux"]["devices"]
            if d["path"].startswith("/dev/nvidia") and d["major"] == 195
        ]
        assert setup["node"].gpus[1].minor in minors
    finally:
        dockerd.docker("rm", "-f", cid)


@pytest.mark.parametrize("setup", ["28"], indirect=True, ids=["docker-28"])
def test_docker_28_native_cdi_device_is_exactly_that_gpu(setup: Any) -> None:
    """Docker 28's own CDI injection (``--device nvidia.com/gpu=1``, nvshim's generated spec)
    under require-allocation: the container sees GPU 1 alone though the image says all, and
    nvshim's journal records it as the engine's grant."""
    node = setup["node"]
    seen = run(setup, "--device", "nvidia.com/gpu=1")
    assert seen["minors"] == [node.gpus[1].minor], seen
    journal = setup["dirs"]["nvshim-strict"] / "grants.jsonl"
    grants = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [(g["source"], g["gpus"]) for g in grants][-1:] == [("engine", [node.gpus[1].uuid])]
