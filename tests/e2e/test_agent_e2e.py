"""e2e: GPU creates through the node agent's fast path, and through the in-process fallback
when the agent is gone, with real runc, crun, podman, Docker and containerd's CRI: the
machine's (Debian 12), Debian 13's and Debian unstable's (runc 1.3.6, crun 1.28, podman
5.8.6, Docker 28.5.2, containerd 2.1.9: :mod:`tests.helpers.debiansid`).

The runtime is this checkout's trampoline rendered with a private agent socket and the C
client built from this checkout; the agent is a real ``nvshim agent`` process. What is
asserted is what the container sees (its GPU device nodes) and which path served the
create (config.json's ``nvshim.io/served-by``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from nvshim.node.compile import compile_node
from nvshim.node.install.trampoline import render
from tests.helpers.agent import AgentProcess, built_client, nvshim_bin
from tests.helpers.bundle import make_bundle
from tests.helpers.common import require_binary, require_root, unique_id
from tests.helpers.runc import Runc

pytestmark = pytest.mark.e2e

LISTING = ["sh", "-c", "ls -1 /dev"]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_client(tmp_path_factory.mktemp("client"))


def _gpus(out: str) -> List[str]:
    return sorted(x for x in out.split() if re.fullmatch(r"nvidia[0-9]+", x))


def _served_by(bundle: Path) -> str:
    notes = json.loads((bundle / "config.json").read_text()).get("annotations", {})
    return str(notes.get("nvshim.io/served-by", "runtime"))


def _low_runtime(engine: str, crunw: Path, tmp_path: Path) -> str:
    """The machine's runc or crun (1.1.5, 1.8.1), Debian 13's (1.1.15, 1.21) or Debian
    unstable's (1.3.6, 1.28; each with its suite's own glibc)."""
    from tests.helpers import debian13, debiansid
    from tests.helpers.runc import make_crun_wrapper

    if engine == "runc":
        return require_binary("runc")
    if engine == "crun":
        return str(crunw)
    or_skip, fetch, what = {
        "runc-debian13": (debian13.engine_or_skip, debian13.runc_debian13, "runc 1.1.15"),
        "crun-debian13": (debian13.engine_or_skip, debian13.crun_debian13, "crun 1.21"),
        "runc-sid": (debiansid.engine_or_skip, debiansid.runc_sid, "runc 1.3"),
        "crun-sid": (debiansid.engine_or_skip, debiansid.crun_sid, "crun 1.28"),
    }[engine]
    low = str(or_skip(fetch, what))
    if engine.startswith("runc"):
        return low
    (tmp_path / "crunw-low").mkdir()
    return str(make_crun_wrapper(tmp_path / "crunw-low", low))


@pytest.mark.parametrize(
    "engine", ["runc", "crun", "runc-debian13", "crun-debian13", "runc-sid", "crun-sid"]
)
def test_gpu_container_through_the_agent_and_through_the_fallback(
    engine: str, tmp_path: Path, base_rootfs: Path, client: Path, crunw: Path
) -> None:
    """With the agent up the create is the agent's and the container sees exactly its GPU;
    after SIGKILL to the agent the next create falls back to the in-process create and the
    container still sees exactly its GPU (never an unedited config.json); on this machine's
    runc and crun, on Debian 13's and on Debian unstable's (runc 1.3, crun 1.28)."""
    require_root()
    from nvshim.sim.build import create_node

    low = _low_runtime(engine, crunw, tmp_path)
    node = create_node(str(tmp_path / "node"), gpus=2)
    cfg = tmp_path / "etc" / "config.yaml"
    cfg.parent.mkdir()
    cfg.write_text(
        f"runtimes: [{low}]\ndriver-root: {node.root}\ngrants-journal: {tmp_path}/grants.jsonl\n"
    )
    compile_node(str(cfg))
    sock = tmp_path / "agent.sock"
    tramp = tmp_path / "nvshim-runtime"
    tramp.write_text(render(sys.executable, agent_socket=str(sock), client=str(client)))
    tramp.chmod(0o755)
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "NVSHIM_CONFIG": str(cfg),
    }
    r = Runc(tmp_path / "root", tramp, env=env)
    agent = AgentProcess(sock, cfg, tmp_path / "agent.log").start()
    seen: Dict[str, Tuple[str, List[str]]] = {}
    try:
        for step, gpu in agent.then_killed(1, 0):
            bundle = make_bundle(
                tmp_path / step, base_rootfs, LISTING, env={"NVIDIA_VISIBLE_DEVICES": str(gpu)}
            )
            res = r.run_detached(bundle, unique_id(step))
            assert res.rc == 0, res.describe()
            seen[step] = (_served_by(bundle), _gpus(res.stdout))
    finally:
        agent.stop()
        r.cleanup()
    assert seen == {
        "agent": ("agent", [f"nvidia{node.gpus[1].minor}"]),
        "fallback": ("runtime", [f"nvidia{node.gpus[0].minor}"]),
    }


# --- containerd's CRI -------------------------------------------------------------------


@pytest.fixture(scope="module", params=["1.6", "1.7", "2.1"], ids=lambda v: f"containerd-{v}")
def cri_node(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    base_rootfs: Path,
    client: Path,
) -> Iterator[Any]:
    """containerd's CRI (the machine's 1.6; Debian 13's 1.7 with runc 1.1.15; Debian
    unstable's 2.1 with runc 1.3, its version 3 config) with nvshim's handler running the
    trampoline rendered for the agent's socket; the node's config under require-allocation,
    verify-with kubelet."""
    require_root()
    from nvshim.sim.build import create_node
    from tests.e2e.test_kubelet_cri import Node, serving
    from tests.helpers.containerd import private_nri
    from tests.helpers.cri import cri_containerd_config
    from tests.helpers.debian13 import containerd_node_engines

    bin_dir, runc = containerd_node_engines(request.param)
    base = tmp_path_factory.mktemp("agentcri")
    sim = create_node(str(base / "node"), gpus=2)
    n = Node(base, sim, request.param, runc)
    (base / "cdi").mkdir()
    n.config()
    tramp = base / "trampoline"
    tramp.write_text(
        render(sys.executable, agent_socket=str(base / "agent.sock"), client=str(client))
    )
    tramp.chmod(0o755)
    wrapper = base / "nvshim-runtime"
    wrapper.write_text(f'#!/bin/sh\nNVSHIM_CONFIG=$(cat {n.current}) exec {tramp} "$@"\n')
    wrapper.chmod(0o755)
    config = base / "containerd.toml"
    v2 = request.param == "2.1"
    config.write_text(
        cri_containerd_config(base, version=3 if v2 else 2) + (private_nri(base) if v2 else "")
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
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    with serving(n, base, config.read_text(), bin_dir, base_rootfs):
        yield n


def test_cri_pod_through_the_agent_and_through_the_fallback(cri_node: Any) -> None:
    """Through containerd's CRI: a pod whose GPU the kubelet allocated gets exactly that GPU
    with its create served by the agent; with the agent killed, the next pod's create runs
    in-process and it gets exactly its GPU too."""
    from tests.e2e.test_kubelet_cri import GPU, gpu_minors, pod, start
    from tests.helpers.cri import spec_annotations

    n = cri_node
    sock = n.base / "agent.sock"
    agent = AgentProcess(sock, Path(n.current.read_text()), n.base / "agent.log").start()
    served: Dict[str, str] = {}
    try:
        for step, gpu in agent.then_killed(n.sim.gpus[1], n.sim.gpus[0]):
            name = f"pod-{step}"
            n.kubelet.set([("team-a", name, {"main": {GPU: [gpu.uuid]}})])
            p = pod(n, name)
            cid = start(n, p, env={"NVIDIA_VISIBLE_DEVICES": gpu.uuid})
            assert gpu_minors(n, p) == [gpu.minor]
            served[step] = spec_annotations(n.base / "state", cid).get(
                "nvshim.io/served-by", "runtime"
            )
    finally:
        agent.stop()
    assert served == {"agent": "agent", "fallback": "runtime"}


# --- podman and Docker --------------------------------------------------------------------


class _Node:
    """A 2-GPU node, its config (with a debug log that says which path served each create),
    the trampoline for a private agent socket, and a wrapper naming the config (podman and
    dockerd pass the runtime their own environment, not the caller's)."""

    def __init__(self, base: Path, client: Path, low: str = "runc") -> None:
        """``low``: the runc under nvshim."""
        from nvshim.sim.build import create_node

        self.base = base
        self.sim = create_node(str(base / "node"), gpus=2)
        self.config = base / "etc" / "config.yaml"
        self.config.parent.mkdir()
        self.debug = base / "debug.log"
        self.config.write_text(
            f"runtimes: [{low}]\ndriver-root: {self.sim.root}\n"
            f"grants-journal: {base}/grants.jsonl\n"
            f"debug-log: {self.debug}\n"
        )
        compile_node(str(self.config))
        self.socket = base / "agent.sock"
        tramp = base / "trampoline"
        tramp.write_text(render(sys.executable, agent_socket=str(self.socket), client=str(client)))
        tramp.chmod(0o755)
        self.wrapper = base / "nvshim-runtime"
        self.wrapper.write_text(f'#!/bin/sh\nNVSHIM_CONFIG={self.config} exec {tramp} "$@"\n')
        self.wrapper.chmod(0o755)

    def last_served_by(self) -> str:
        events = [json.loads(line) for line in self.debug.read_text().splitlines()]
        return str([e for e in events if e.get("event") == "create"][-1]["served_by"])


def _both_paths(
    node: _Node, run: Any, prefix: Optional[List[str]] = None
) -> Dict[str, Tuple[str, List[str]]]:
    """``run(gpu)`` (the container's ``ls /dev``) with the agent up (started after
    ``prefix``), then after SIGKILL."""
    agent = AgentProcess(node.socket, node.config, node.base / "agent.log", prefix=prefix).start()
    seen: Dict[str, Tuple[str, List[str]]] = {}
    try:
        for step, gpu in agent.then_killed(1, 0):
            out = run(gpu)
            seen[step] = (node.last_served_by(), _gpus(out))
    finally:
        agent.stop()
    return seen


@pytest.fixture(params=["4", "5.8"], ids=lambda v: f"podman-{v}")
def podman_engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Tuple[Any, str]]:
    """(podman, the runc under nvshim): the machine's podman 4.3 over runc 1.1.5, or Debian
    unstable's podman 5.8 over its runc 1.3."""
    if request.param == "4":
        yield request.getfixturevalue("podman"), "runc"
        return
    require_root()
    require_binary("conmon")
    from tests.helpers import debiansid
    from tests.helpers.podman import Podman

    binary, env = debiansid.engine_or_skip(debiansid.podman_5, "podman 5.8")
    low = debiansid.engine_or_skip(debiansid.runc_sid, "runc 1.3")
    podman = Podman(
        tmp_path_factory.mktemp("podman5"),
        binary=binary,
        env=env,
        host_paths=debiansid.PODMAN_5_HOST_PATHS,
    )
    try:
        yield podman, low
    finally:
        podman.cleanup()


def test_podman_through_the_agent_and_through_the_fallback(
    tmp_path: Path, rootfs: Path, podman_engine: Tuple[Any, str], client: Path
) -> None:
    """podman --runtime (the trampoline), podman 4 and 5.8: the agent serves the create with
    the agent up, the in-process create without it; each container sees exactly its GPU."""
    podman, low = podman_engine
    node = _Node(tmp_path, client, low)

    def run(gpu: int) -> str:
        res = podman.podman_run(
            rootfs, LISTING, env={"NVIDIA_VISIBLE_DEVICES": str(gpu)}, runtime=node.wrapper
        )
        assert res.rc == 0, res.describe()
        return str(res.stdout)

    assert _both_paths(node, run) == {
        "agent": ("agent", [f"nvidia{node.sim.gpus[1].minor}"]),
        "fallback": ("runtime", [f"nvidia{node.sim.gpus[0].minor}"]),
    }


DOCKER_FORMS = {"20.10": ["env"], "28": ["gpus", "cdi"]}
"""How each Docker asks for GPU N: ``-e NVIDIA_VISIBLE_DEVICES=N``; ``--gpus device=N``
(dockerd's ``nvidia`` driver: nvshim's hook stand-in on dockerd's PATH); its native CDI
``--device nvidia.com/gpu=N`` (nvshim's spec in ``cdi-spec-dirs``)."""


@pytest.mark.parametrize("version", list(DOCKER_FORMS), ids=lambda v: f"docker-{v}")
def test_docker_through_the_agent_and_through_the_fallback(
    version: str, tmp_path_factory: pytest.TempPathFactory, base_rootfs: Path, client: Path
) -> None:
    """docker run --runtime nvshim (Debian 12's 20.10 with NVIDIA_VISIBLE_DEVICES; Debian
    unstable's 28.5 with --gpus and its native CDI): an agent in another mount namespace than
    dockerd's serves nothing (the in-process create runs); one in dockerd's serves the
    create; after SIGKILL the in-process create runs again; each container sees exactly its
    GPU."""
    require_root()
    from nvshim.node.engines.docker import DOCKERD_PATH, GPUS_HOOK
    from tests.e2e.test_docker_gpus_e2e import configure
    from tests.helpers import debiansid
    from tests.helpers.docker import Dockerd

    bin_dirs: Tuple[Path, ...] = ()
    low = "runc"
    if version == "28":
        bin_dirs = debiansid.engine_or_skip(debiansid.docker_28_dirs, "Docker 28")
        low = debiansid.engine_or_skip(debiansid.runc_sid, "runc 1.3")
        if shutil.which(GPUS_HOOK, path=os.pathsep.join(DOCKERD_PATH)):
            pytest.skip(f"this host has its own {GPUS_HOOK} on dockerd's PATH")
    else:
        require_binary("dockerd")
    tmp_path = tmp_path_factory.mktemp("dk")  # short: dockerd's socket paths must fit
    node = _Node(tmp_path, client, low)
    daemon_json = tmp_path / "etc-docker" / "daemon.json"
    daemon_json.parent.mkdir()
    daemon_json.write_text("{}")
    if "cdi" in DOCKER_FORMS[version]:
        daemon_json.write_text(json.dumps({"cdi-spec-dirs": [str(tmp_path / "cdi")]}))
        gen = subprocess.run(
            [
                *nvshim_bin(),
                "cdi",
                "generate",
                "--driver-root",
                node.sim.root,
                "--output",
                str(tmp_path / "cdi" / "nvidia.yaml"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert gen.returncode == 0, gen.stderr
    # runtime nvshim, and nvshim's hook stand-in beside the wrapper (dockerd's --gpus)
    done = configure(
        "--config",
        str(daemon_json),
        "--name",
        "nvshim",
        "--binary",
        str(node.wrapper),
        nvshim_config=node.config,
    )
    assert done.returncode == 0, done.stderr
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ.get('PATH', '/usr/bin')}")
    dockerd = Dockerd(daemon_json, tmp_path, env=env, bin_dirs=bin_dirs)

    def runner(form: str) -> Any:
        def run(gpu: int) -> str:
            ask = {
                "env": ["-e", f"NVIDIA_VISIBLE_DEVICES={gpu}"],
                "gpus": ["--gpus", f"device={gpu}"],
                "cdi": ["--device", f"nvidia.com/gpu={gpu}"],
            }[form]
            res = dockerd.docker(
                "run",
                "--rm",
                "--network",
                "none",
                "--runtime",
                "nvshim",
                *ask,
                "nvshim-e2e/agent:local",
                *LISTING,
            )
            assert res.rc == 0, res.describe()
            return str(res.stdout)

        return run

    seen: Dict[str, Dict[str, Tuple[str, List[str]]]] = {}
    try:
        dockerd.start()
        dockerd.import_rootfs(base_rootfs, "nvshim-e2e/agent:local", env=["PATH=/bin:/usr/bin"])
        # the test's dockerd has a mount namespace of its own
        elsewhere = _both_paths(node, runner(DOCKER_FORMS[version][0]))
        pid = int(dockerd.pidfile.read_text())
        for form in DOCKER_FORMS[version]:
            node.socket.unlink(missing_ok=True)  # the killed agent's
            seen[form] = _both_paths(
                node, runner(form), prefix=["nsenter", "-t", str(pid), "-m", "--"]
            )
    finally:
        dockerd.stop()
    both = {
        "agent": ("agent", [f"nvidia{node.sim.gpus[1].minor}"]),
        "fallback": ("runtime", [f"nvidia{node.sim.gpus[0].minor}"]),
    }
    assert elsewhere == {"agent": ("runtime", both["agent"][1]), "fallback": both["fallback"]}
    assert "the caller is in another mount namespace" in (tmp_path / "agent.log").read_text()
    assert seen == {form: both for form in DOCKER_FORMS[version]}
