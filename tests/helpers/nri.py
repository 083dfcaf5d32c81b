"""A containerd node with NRI on and ``nvshim agent`` as its NRI plugin, for tests and bench.

:func:`nri_node` runs containerd 1.7.24 (Debian 13) or 2.1.9 (Debian unstable) with its CRI
(host-network pods, the busybox image imported), NRI on with its socket in ``base``, CDI
on reading ``base/cdi`` (nvshim's generated spec for the simulated node), a handler
``nvidia`` that is nvshim's runtime with ``require-allocation: false`` (NVIDIA's stand-in)
and containerd's default runtime (``runc`` stays a handler; ``crun`` is a handler running
Debian 13's crun 1.21 through :func:`~tests.helpers.runc.make_crun_wrapper`), the busybox
image and one
saying ``NVIDIA_VISIBLE_DEVICES=all`` (:data:`CUDA_LIKE`),
a PodResources server as the kubelet, and the agent registered as the plugin. On the way
out: pods removed, agent, containerd and the kubelet stopped, cgroups gone.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

from nvshim.node.compile import compile_node
from tests.helpers.agent import AgentProcess
from tests.helpers.common import remove_cgroup_tree, unique_id, wait_until
from tests.helpers.containerd import Containerd
from tests.helpers.cri import CriClient, cri_containerd_config, image_archive, import_image
from tests.helpers.debian13 import containerd_node_engines, crun_debian13
from tests.helpers.debiansid import containerd_2_dir, engine_or_skip
from tests.helpers.node import runtime_wrapper, write_nvshim_config
from tests.helpers.podresources import PodResourcesServer
from tests.helpers.runc import make_crun_wrapper

__all__ = ["NriNode", "nri_node", "nri_section", "CUDA_LIKE"]

#: An image whose config says ``NVIDIA_VISIBLE_DEVICES=all``, as CUDA images do.
CUDA_LIKE = "docker.io/nvshim-test/cuda-like:1"


def nri_section(base: Path) -> str:
    return f"""\
  [plugins."io.containerd.nri.v1.nri"]
    disable = false
    socket_path = "{base}/nri.sock"
    plugin_path = "{base}/nri-plugins"
    plugin_config_path = "{base}/nri-conf"
"""


def crun_handler(base: Path, crunw: Path) -> str:
    """The CRI handler ``crun``: containerd's runc shim running ``crunw``."""
    table = '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun]'
    return f"""\
  {table}
    runtime_type = "io.containerd.runc.v2"
  {table[:-1]}.options]
    BinaryName = "{crunw}"
    Root = "{base}/crun-root"
"""


class NriNode:
    def __init__(self, base: Path, sim: Any) -> None:
        self.base, self.sim = base, sim
        self.cgroup = unique_id("nvshim-nri")
        self.containerd: Optional[Containerd] = None
        self.cri: Optional[CriClient] = None
        self.agent: Optional[AgentProcess] = None
        self.kubelet: Optional[PodResourcesServer] = None

    def write_config(self, name: str, **settings: Any) -> Path:
        values: Dict[str, Any] = {
            "runtimes": [self.runc],
            "driver-root": self.sim.root,
            "grants-journal": str(self.base / "grants.jsonl"),
            "cdi-spec-dirs": [str(self.base / "cdi")],
        }
        values.update({k.replace("_", "-"): v for k, v in settings.items()})
        path = write_nvshim_config(self.base / name, values)
        compile_node(str(path))
        return path

    runc = "runc"
    crunw = "crun"
    """The wrapper running Debian 13's crun (handler ``crun``, its ``--root`` base/crun-root)."""
    version = "1.7"

    def configure(self, **settings: Any) -> None:
        """Rewrite the agent's config (it reloads at the next CreateContainer)."""
        values: Dict[str, Any] = dict(
            require_allocation=True,
            nri_inject=True,
            nri_guard=True,
            nri_verify=True,
            nri_gpu_handlers=["nvidia", ""],
            nri_nvshim_handlers=[],
            nri_runtime_root=str(self.base / "runc-root" / "k8s.io"),
            kubelet_socket=str(self.base / "kubelet.sock"),
            kubelet_checkpoint=None,
        )
        values.update(settings)
        self.write_config("agent", **values)


@contextlib.contextmanager
def nri_node(base: Path, sim: Any, rootfs: Path, version: str) -> Iterator[NriNode]:
    bin_dir, runc = containerd_node_engines("1.7")  # (Debian 13's runc for both)
    if version == "2.1":
        bin_dir = engine_or_skip(containerd_2_dir, "containerd 2.1")
    n = NriNode(base, sim)
    n.runc = runc
    (base / "crunw").mkdir()
    n.crunw = str(make_crun_wrapper(base / "crunw", crun_debian13()))
    n.version = version
    (base / "cdi").mkdir()
    nvidia_cfg = n.write_config("nvidia-like", require_allocation=False)
    wrapper = runtime_wrapper(base / "nvidia-runtime", nvidia_cfg)
    gen = subprocess.run(
        [
            shutil.which("nvshim") or "nvshim",
            "cdi",
            "generate",
            "--driver-root",
            sim.root,
            "--output",
            str(base / "cdi" / "nvidia.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert gen.returncode == 0, gen.stderr
    config = base / "containerd.toml"
    config.write_text(
        cri_containerd_config(base, cdi_spec_dirs=[str(base / "cdi")])
        + crun_handler(base, Path(n.crunw))
        + nri_section(base)
    )
    res = subprocess.run(
        [
            shutil.which("nvshim") or "nvshim",
            "runtime",
            "configure",
            "--runtime",
            "containerd",
            "--config",
            str(config),
            "--drop-in",
            "",
            "--binary",
            str(wrapper),
            "--name",
            "nvidia",
            "--set-as-default",
            "--force",
        ],  # unsafe on purpose: NVIDIA's default, stood in
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    n.configure()
    agent_cfg = base / "agent" / "config.yaml"
    kubelet = PodResourcesServer(str(base / "kubelet.sock")).start()
    n.kubelet = kubelet
    n.containerd = Containerd(
        base, namespace="k8s.io", config_text=config.read_text(), bin_dir=bin_dir
    )
    try:
        n.containerd.start()
        import_image(n.containerd, rootfs, base)
        archive = base / "cuda-like-image.tar"  # an image saying NVIDIA_VISIBLE_DEVICES=all
        archive.write_bytes(image_archive(rootfs, CUDA_LIKE, ["NVIDIA_VISIBLE_DEVICES=all"]))
        res = n.containerd.ctr("images", "import", str(archive), timeout=120)
        assert res.rc == 0, res.describe()
        n.cri = CriClient(n.containerd.address)
        n.agent = AgentProcess(
            base / "agent.sock", agent_cfg, base / "agent.log", str(base / "nri.sock")
        ).start()
        wait_until(
            lambda: "nri registered" in (base / "agent.log").read_text(),
            20,
            "the agent's NRI registration",
        )
        yield n
    finally:
        if n.cri is not None:
            n.cri.remove_pods()
        if n.agent is not None and n.agent.proc is not None:
            n.agent.stop()
        if n.containerd is not None:
            n.containerd.stop()
        kubelet.stop()
        remove_cgroup_tree(n.cgroup)
