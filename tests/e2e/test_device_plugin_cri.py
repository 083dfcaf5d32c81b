"""e2e: the NVIDIA device plugin's pod reaches its GPUs with nvshim as containerd's default
runtime under require-allocation + verify-with: kubelet, through containerd's real CRI.

The node is set up as on a GPU Operator node: ``nvidia-ctk runtime configure`` shapes
(``imports = [".../conf.d/*.toml"]``, ``conf.d/99-nvidia.toml`` with ``nvidia``,
``nvidia-cdi``, ``nvidia-legacy``), then ``nvshim runtime configure --set-as-default``
writes its drop-in. A private containerd (the machine's 1.6, and Debian 13's 1.7 with runc
1.1.15 under nvshim: :mod:`tests.helpers.debian13`) loads those files and runs pods over its
CRI socket as the kubelet does. The device plugin asks for ``NVIDIA_VISIBLE_DEVICES=all`` and
is allocated nothing; ``management-pods: [kube-system/nvidia-device-plugin-*]`` grants it
what it asks for, matched on the ``io.kubernetes.cri.*`` annotations containerd writes.
A pod elsewhere with the same name and env gets nothing. The runtime is this checkout's,
through a trampoline rendered for it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, List

import pytest

from nvshim.node.install.trampoline import render
from tests.e2e.test_kubelet_cri import Node, pod, serving, start
from tests.helpers.common import require_binary, require_root
from tests.helpers.containerd_samples import NVIDIA_HANDLERS, nvidia_ctk_drop_in, nvidia_ctk_main
from tests.helpers.cri import cri_containerd_config
from tests.helpers.debian13 import containerd_node_engines

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
LIBDIR = "/usr/lib/x86_64-linux-gnu"
PLUGIN = "kube-system/nvidia-device-plugin-*"


@pytest.fixture(scope="module", params=["1.6", "1.7"], ids=lambda v: f"containerd-{v}")
def node(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, base_rootfs: Path
) -> Iterator[Node]:
    require_root()
    bin_dir, nvshim_runc = containerd_node_engines(request.param)
    runc = require_binary("runc")
    from nvshim.sim.build import create_node

    base = tmp_path_factory.mktemp("mgmt")
    sim = create_node(str(base / "node"), gpus=3)
    n = Node(base, sim, request.param, nvshim_runc)
    (base / "cdi").mkdir()
    n.config(management_pods=[PLUGIN])
    tramp = base / "trampoline"
    tramp.write_text(render(sys.executable))
    tramp.chmod(0o755)
    wrapper = base / "nvshim-runtime"
    wrapper.write_text(f'#!/bin/sh\nNVSHIM_CONFIG=$(cat {n.current}) exec {tramp} "$@"\n')
    wrapper.chmod(0o755)

    ctrd = base / "ctrd"
    conf_d = ctrd / "conf.d"
    conf_d.mkdir(parents=True)
    config = ctrd / "config.toml"
    config.write_text(nvidia_ctk_main(str(conf_d), cri_containerd_config(ctrd)))
    # NVIDIA's handlers, as the operator writes them (runc stands in for its runtime)
    nvidia = nvidia_ctk_drop_in(str(Path(runc).parent))
    for binary in sorted(NVIDIA_HANDLERS.values(), key=len, reverse=True):
        nvidia = nvidia.replace(binary, "runc")
    (conf_d / "99-nvidia.toml").write_text(nvidia)
    configure = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvshim.cli.main",
            "runtime",
            "configure",
            "--config",
            str(config),
            "--binary",
            str(wrapper),
            "--set-as-default",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "NVSHIM_CONFIG": n.current.read_text()},
    )
    assert configure.returncode == 0, configure.stderr
    with serving(n, ctrd, config.read_text(), bin_dir, base_rootfs):
        yield n


def _seen(n: Node, p: Any) -> List[str]:
    assert n.cri is not None
    return n.cri.wait_log(p[2], "main", "END").split()


def _gpus(names: List[str]) -> List[str]:
    return sorted(x for x in names if re.fullmatch(r"nvidia[0-9]+", x))


def test_device_plugin_pod_sees_every_gpu_and_nvml(node: Node) -> None:
    """A kube-system pod named like the device plugin, run by the default handler (nvshim) with
    NVIDIA_VISIBLE_DEVICES=all and no allocation, sees every GPU, nvidiactl and libnvidia-ml."""
    node.kubelet.set([("kube-system", "nvidia-device-plugin-daemonset-x1", {"main": {}})])
    p = pod(node, "nvidia-device-plugin-daemonset-x1", namespace="kube-system", handler="")
    start(node, p, env={"NVIDIA_VISIBLE_DEVICES": "all"}, listing=f"/dev {LIBDIR}")
    seen = _seen(node, p)
    assert _gpus(seen) == [f"nvidia{g.minor}" for g in sorted(node.sim.gpus, key=lambda g: g.minor)]
    assert "nvidiactl" in seen and "libnvidia-ml.so.1" in seen


@pytest.mark.parametrize("namespace", ["default", "team-a"])
def test_same_env_elsewhere_gets_nothing(node: Node, namespace: str) -> None:
    """The same pod name and env outside kube-system gets no GPU and no NVML (stripped)."""
    name = "nvidia-device-plugin-daemonset-x2"
    node.kubelet.set([(namespace, name, {"main": {}})])
    p = pod(node, name, namespace=namespace, handler="")
    start(node, p, env={"NVIDIA_VISIBLE_DEVICES": "all"}, listing=f"/dev {LIBDIR}")
    seen = _seen(node, p)
    assert _gpus(seen) == [] and "nvidiactl" not in seen and "libnvidia-ml.so.1" not in seen


def test_nvidia_handlers_still_run_pods(node: Node) -> None:
    """Pods with runtimeClassName nvidia, nvidia-cdi, nvidia-legacy still start: containerd
    kept NVIDIA's handlers beside nvshim's default."""
    for index, handler in enumerate(NVIDIA_HANDLERS):
        p = pod(node, f"operand-{index}", namespace="gpu-operator", handler=handler)
        start(node, p, listing="/")
        assert "END" in _seen(node, p)
