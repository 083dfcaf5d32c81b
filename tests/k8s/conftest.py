"""The real one-node cluster of tests/k8s (:mod:`tests.helpers.k8s`), started once a session.

The node is set up as a GPU node of the GPU Operator's kind: a simulated node of 4 GPUs
(``nvshim sim``), nvshim's CDI spec for it in the engine's CDI dirs, containerd with NRI on
and a handler ``nvidia`` that is the containerd default (``""``): NVIDIA's own
``nvidia-container-runtime`` (toolkit v1.20.2, built from its Go module) in CDI mode on
nvshim's spec, granting from ``NVIDIA_VISIBLE_DEVICES``, CDI annotations and device-list
mounts (``accept-nvidia-visible-devices-as-volume-mounts``, as the GPU Operator sets it for
that strategy); ``nvshim`` (nvshim's runtime) and ``runc`` as handlers of their own, the
RuntimeClasses ``nvidia`` and ``runc``, the busybox image and a CUDA-like one (its ENV says
``NVIDIA_VISIBLE_DEVICES=all``) imported, and ``nvshim agent`` registered as the NRI
guard (``agent`` fixture; a test may stop and start it). Each component's version is
printed once.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from tests.helpers.common import require_root, wait_until

pytestmark = pytest.mark.e2e

BUSYBOX = "docker.io/nvshim-test/busybox:1"
CUDA_LIKE = "docker.io/nvshim-test/cuda-like:1"


class Node:
    """What the tests use: the cluster, the simulated GPUs, the agent."""

    def __init__(self, cluster: Any, sim: Any, base: Path) -> None:
        self.cluster, self.sim, self.base = cluster, sim, base
        self.agent: Any = None
        self.runc = "runc"
        """runc 1.5, built from its module: every handler's low-level runtime."""
        self.containerd = "2.4"
        """The node's containerd: ``2.4`` (from its module) or ``1.7`` (Debian 13's)."""

    def agent_config(self, **settings: Any) -> Path:
        """The agent's config (it reloads at the next create): the guard with the
        kubelet's socket, the node's GPU handlers."""
        from nvshim.node.compile import compile_node
        from tests.helpers.node import write_nvshim_config

        values: Dict[str, Any] = {
            "runtimes": [self.runc],
            "driver-root": self.sim.root,
            "grants-journal": str(self.base / "grants.jsonl"),
            "cdi-spec-dirs": [str(self.base / "cdi")],
            "require-allocation": True,
            "nri-inject": True,
            "nri-guard": True,
            "nri-verify": True,
            "nri-gpu-handlers": ["nvidia", ""],
            "nri-nvshim-handlers": ["nvshim"],
            "nri-runtime-root": str(self.base / "containerd" / "runc-root" / "k8s.io"),
            "kubelet-socket": self.cluster.pod_resources,
            "kubelet-checkpoint": self.cluster.checkpoint,
        }
        values.update({k.replace("_", "-"): v for k, v in settings.items()})
        path = write_nvshim_config(self.base / "agent", values)
        compile_node(str(path))
        return path

    def gpu_minors(self) -> list:
        return sorted(g.minor for g in self.sim.gpus)


def _images(cluster: Any, rootfs: Path, base: Path) -> None:
    from tests.helpers.cri import image_archive

    for name, env in ((BUSYBOX, []), (CUDA_LIKE, ["NVIDIA_VISIBLE_DEVICES=all"])):
        archive = base / (name.rsplit("/", 1)[1].replace(":", "-") + ".tar")
        archive.write_bytes(image_archive(rootfs, name, env))
        res = cluster.ctr("images", "import", str(archive))
        assert res.returncode == 0, res.stderr


@pytest.fixture(scope="session", params=["2.4", "1.7"], ids=lambda v: f"containerd-{v}")
def node(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, base_rootfs: Path
) -> Iterator[Node]:
    """The cluster, its node running containerd 2.4.2 (built from its module) or Debian 13's
    1.7.24 (NRI v0.6), with runc 1.5.3 under both."""
    require_root()
    from nvshim.sim.build import create_node
    from tests.helpers.cri import cri_containerd_config
    from tests.helpers.gobuild import go_programs
    from tests.helpers.k8s import Cluster
    from tests.helpers.node import runtime_wrapper, write_nvshim_config
    from tests.helpers.nri import nri_section

    base = tmp_path_factory.mktemp("k8s")
    k8s, etcd = go_programs("kubernetes"), go_programs("etcd")
    runc = str(go_programs("runc") / "runc")
    if request.param == "1.7":
        from tests.helpers.debian13 import containerd_17_dir, engine_or_skip

        containerd = engine_or_skip(containerd_17_dir, "containerd 1.7")
    else:
        containerd = go_programs("containerd")
    sim = create_node(str(base / "sim"), gpus=4)
    (base / "cdi").mkdir()
    nvshim = shutil.which("nvshim") or "nvshim"
    gen = subprocess.run(
        [
            nvshim,
            "cdi",
            "generate",
            "--driver-root",
            sim.root,
            "--output",
            str(base / "cdi" / "nvidia.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert gen.returncode == 0, gen.stderr
    toolkit = go_programs("nvidia-toolkit")
    wrapper = nvidia_runtime(base / "nvidia-toolkit", toolkit, runc, base / "cdi")
    cd = base / "containerd"
    cd.mkdir()
    config = cd / "config.toml"
    text = cri_containerd_config(
        cd, cdi_spec_dirs=[str(base / "cdi")], version=2 if request.param == "1.7" else 3
    )
    root_line = f'        Root = "{cd}/runc-root"\n'
    assert root_line in text
    config.write_text(
        text.replace(root_line, root_line + f'        BinaryName = "{runc}"\n') + nri_section(cd)
    )
    cluster = Cluster(base, k8s, etcd, containerd, "")
    cluster.crictl_bin = str(go_programs("crictl") / "crictl")
    # nvshim's own runtime: require-allocation, each grant held to the real kubelet's record
    nvshim_cfg = write_nvshim_config(
        base / "nvshim-handler",
        {
            "runtimes": [runc],
            "driver-root": sim.root,
            "require-allocation": True,
            "verify-with": "kubelet",
            "kubelet-socket": cluster.pod_resources,
            "kubelet-checkpoint": cluster.checkpoint,
            "grants-journal": str(base / "grants.jsonl"),
            "cdi-spec-dirs": [str(base / "cdi")],
        },
    )
    from nvshim.node.compile import compile_node

    compile_node(str(nvshim_cfg))
    nvshim_wrapper = runtime_wrapper(base / "nvshim-runtime", nvshim_cfg)
    for name, binary, default in (("nvidia", wrapper, True), ("nvshim", nvshim_wrapper, False)):
        res = subprocess.run(
            [
                nvshim,
                "runtime",
                "configure",
                "--runtime",
                "containerd",
                "--config",
                str(config),
                "--drop-in",
                "",
                "--binary",
                str(binary),
                "--name",
                name,
                "--force",
            ]
            + (["--set-as-default"] if default else []),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert res.returncode == 0, res.stderr
    cluster.containerd_config = config.read_text()
    n = Node(cluster, sim, base)
    try:
        cluster.start()
        versions = cluster.versions()
        for tool, argv in (
            ("runc", [runc, "--version"]),
            ("crictl", [cluster.crictl_bin, "--version"]),
            ("nvidia-container-runtime", [str(toolkit / "nvidia-container-runtime"), "--version"]),
        ):
            versions[tool] = subprocess.run(
                argv, capture_output=True, text=True, timeout=60
            ).stdout.splitlines()[0]
        for component, version in versions.items():
            print(f"k8s: {component}: {version}")
        _images(cluster, base_rootfs, base)
        cluster.apply(RUNTIME_CLASSES)
        from tests.helpers.agent import AgentProcess

        n.runc, n.containerd = runc, request.param
        n.agent = AgentProcess(
            base / "agent.sock", n.agent_config(), base / "agent.log", str(cd / "nri.sock")
        ).start()
        wait_until(
            lambda: "nri registered" in (base / "agent.log").read_text(),
            30,
            "the agent's NRI registration",
        )
        yield n
    finally:
        if n.agent is not None and n.agent.proc is not None and n.agent.proc.poll() is None:
            n.agent.stop()
        cluster.stop()


def nvidia_runtime(where: Path, toolkit: Path, runc: str, cdi: Path) -> Path:
    """NVIDIA's runtime as the GPU Operator's CDI mode sets it: its config.toml (found
    through ``NVIDIA_CTK_CONFIG_FILE_PATH``, which the returned wrapper sets: containerd
    passes a runtime no env of its own), CDI mode on ``cdi``, runc 1.5 below it."""
    where.mkdir()
    config = where / "config.toml"
    config.write_text(f"""\
accept-nvidia-visible-devices-as-volume-mounts = true
accept-nvidia-visible-devices-envvar-when-unprivileged = true

[nvidia-container-runtime]
mode = "cdi"
runtimes = ["{runc}"]
log-level = "info"
debug = "{where}/nvidia-container-runtime.log"

[nvidia-container-runtime.modes.cdi]
spec-dirs = ["{cdi}"]
default-kind = "nvidia.com/gpu"
annotation-prefixes = ["cdi.k8s.io/"]

[nvidia-ctk]
path = "{toolkit}/nvidia-ctk"
""")
    wrapper = where / "nvidia-container-runtime"
    wrapper.write_text(
        f"#!/bin/sh\nNVIDIA_CTK_CONFIG_FILE_PATH={config} "
        f'exec {toolkit}/nvidia-container-runtime "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


RUNTIME_CLASSES = """\
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: nvidia}
handler: nvidia
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: nvshim}
handler: nvshim
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: runc}
handler: runc
"""


@pytest.fixture(scope="session")
def base_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The busybox rootfs the images are made of."""
    from tests.helpers.bundle import make_rootfs

    if shutil.which("busybox") is None:
        pytest.skip("busybox is not installed (apt-get install busybox-static)")
    return make_rootfs(tmp_path_factory.mktemp("base") / "rootfs")
