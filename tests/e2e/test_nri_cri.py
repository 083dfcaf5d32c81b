"""e2e: the agent's NRI plugin in containerd 1.7.24 (Debian 13, NRI v0.6) and 2.1.9 (Debian
unstable), through their real CRI.

containerd (the same version 2 config for both; 2.1 migrates it) runs with NRI on (``io.containerd.nri.v1.nri``, ``disable = false``, a socket
in the test's tmp dir), CRI pods on host network, the busybox image imported locally.
``nvshim agent --nri-socket`` registers as the plugin; pods are created over containerd's
CRI socket as the kubelet does. The handler ``nvidia`` is nvshim's own runtime with
``require-allocation: false``, standing in for NVIDIA's (it grants from env exactly as
NVIDIA's does); the default handler ``runc`` is plain runc, the handler ``crun`` Debian
13's crun 1.21. What is asserted is what the
container sees (``ls /dev``), the error containerd returns, and ``nvshim grants``.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from tests.helpers.common import require_root, wait_until
from tests.helpers.cri import CriClient, CriError
from tests.helpers.nri import CUDA_LIKE, NriNode, nri_node

pytestmark = pytest.mark.e2e

BUSYBOX = "docker.io/nvshim-test/busybox:1"
GPU_NODE = re.compile(r"^nvidia([0-9]+)$")


@pytest.fixture(scope="module", params=["1.7", "2.1"], ids=lambda v: f"containerd-{v}")
def module_node(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, base_rootfs: Path
) -> Iterator[NriNode]:
    require_root()
    from nvshim.sim.build import create_node

    base = tmp_path_factory.mktemp("nri")
    sim = create_node(str(base / "node"), gpus=3)
    with nri_node(base, sim, base_rootfs, request.param) as n:
        yield n


@pytest.fixture
def node(module_node: NriNode) -> Iterator[NriNode]:
    """The module's node with the agent's default test config."""
    module_node.configure()
    yield module_node


def run(
    n: NriNode,
    name: str,
    handler: str = "runc",
    env: Optional[Dict[str, str]] = None,
    annotations: Optional[Dict[str, str]] = None,
    cdi_devices: Tuple[str, ...] = (),
    image: str = BUSYBOX,
    mounts: Tuple[Tuple[str, str], ...] = (),
    pod_annotations: Optional[Dict[str, str]] = None,
) -> Tuple[str, Path]:
    """A pod ``name`` whose container lists /dev, prints END and sleeps; (its id, logs).
    ``mounts``: (host path, container path) of each bind mount."""
    assert n.cri is not None
    logs = n.base / "logs" / name
    sandbox, config = n.cri.run_pod(
        name, "team-a", f"uid-{name}", logs, f"/{n.cgroup}/{name}", handler, pod_annotations
    )
    cid = n.cri.create_container(
        sandbox,
        config,
        "main",
        image,
        ["sh", "-c", "ls /dev; echo VIS=$NVIDIA_VISIBLE_DEVICES; echo END; exec sleep 1000"],
        env=env,
        annotations=annotations,
        cdi_devices=cdi_devices,
        mounts=mounts,
    )
    n.cri.start_container(cid)
    return cid, logs


def seen(n: NriNode, logs: Path) -> Tuple[List[int], str]:
    assert n.cri is not None
    out = n.cri.wait_log(logs, "main", "END")
    minors = sorted(int(m.group(1)) for m in (GPU_NODE.match(x) for x in out.split()) if m)
    vis = next((w[4:] for w in out.split() if w.startswith("VIS=")), "")
    return minors, vis


def journal(n: NriNode, *flags: str) -> List[Dict[str, Any]]:
    """The records ``nvshim grants`` (``--denied``: its denials) shows, as JSON."""
    res = subprocess.run(
        [
            shutil.which("nvshim") or "nvshim",
            "grants",
            "--journal",
            str(n.base / "grants.jsonl"),
            "--format",
            "json",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    doc = json.loads(res.stdout or "{}")
    if isinstance(doc, list):
        return doc
    return next((v for v in doc.values() if isinstance(v, list)), [])


def test_inject_under_plain_runc(node: NriNode) -> None:
    """A pod under plain runc whose allocation (device-plugin UUID env) names a GPU gets that GPU's device node from the plugin alone, journaled with its pod."""
    gpu = node.sim.gpus[1]
    _cid, logs = run(node, "inject", env={"NVIDIA_VISIBLE_DEVICES": gpu.uuid})
    minors, _vis = seen(node, logs)
    assert minors == [gpu.minor]
    mine = [g for g in journal(node) if g.get("pod") == "inject"]
    assert len(mine) == 1 and mine[0]["gpus"] == [gpu.uuid], mine


def test_injected_volume_mounts_pod_sees_void(node: NriNode) -> None:
    """A pod under plain runc whose allocation is a device-plugin volume mount (the volume-mounts strategy) gets its GPU from the plugin and sees NVIDIA_VISIBLE_DEVICES=void, as docs/container-env.md says of every container nvshim gave GPUs."""
    gpu = node.sim.gpus[0]
    _cid, logs = run(
        node, "vm-inject", mounts=(("/dev/null", f"/var/run/nvidia-container-devices/{gpu.uuid}"),)
    )
    assert seen(node, logs) == ([gpu.minor], "void")


def test_guard_under_nvidia_like_default_runtime(node: NriNode) -> None:
    """An unallocated pod whose image says NVIDIA_VISIBLE_DEVICES=all, under the NVIDIA-like default runtime, gets no GPU: the plugin set void, and a denial is journaled."""
    _cid, logs = run(node, "guard", handler="", image=CUDA_LIKE)
    minors, vis = seen(node, logs)
    assert (minors, vis) == ([], "void")
    denials = [d for d in journal(node, "--denied") if d.get("pod") == "guard"]
    assert denials and denials[0]["action"] == "stripped", denials


def test_guard_refuses_visible_devices_set_twice(node: NriNode) -> None:
    """An unallocated pod whose image and own env both say NVIDIA_VISIBLE_DEVICES=all (containerd keeps both entries, and NRI voids only the first) is refused in one line naming the pod, never handed every GPU; journaled as refused."""
    with pytest.raises(CriError) as info:
        run(node, "twice", handler="", image=CUDA_LIKE, env={"NVIDIA_VISIBLE_DEVICES": "all"})
    said = info.value.details
    assert "nvshim: pod team-a/twice container main:" in said, said
    assert "NVIDIA_VISIBLE_DEVICES is set 2 times" in said, said
    denials = [d for d in journal(node, "--denied") if d.get("pod") == "twice"]
    assert denials and denials[0]["action"] == "refused", denials


@pytest.mark.parametrize(
    "dest",
    ["/var/run/nvidia-container-devices/all", "/var/run//nvidia-container-devices/all"],
    ids=["plain", "double-slash"],
)
def test_guard_strips_a_device_list_mount_claim(node: NriNode, dest: str) -> None:
    """An unallocated pod whose only claim is /dev/null mounted under the device-list directory, under the NVIDIA-like default runtime (which reads such mounts first), gets no GPU: the plugin removed the mount and set void; a denial is journaled."""
    name = f"mount-{'plain' if '//' not in dest else 'slashes'}"
    _cid, logs = run(node, name, handler="", mounts=(("/dev/null", dest),))
    minors, vis = seen(node, logs)
    assert (minors, vis) == ([], "void")
    denials = [d for d in journal(node, "--denied") if d.get("pod") == name]
    assert denials and denials[0]["action"] == "stripped", denials


@pytest.fixture(scope="module")
def nvidia_nri(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """NVIDIA's own NRI plugin (nvidia-container-toolkit v1.20's, the GPU Operator's NRI
    mode), built from its Go module."""
    from tests.helpers.gobuild import build_go

    return build_go("nvidia-toolkit", "nvidia-nri", tmp_path_factory.mktemp("go") / "nvidia-nri")


def test_nvidia_nri_plugin_annotation_held_to_the_allocation(
    node: NriNode, nvidia_nri: Path
) -> None:
    """Beside NVIDIA's own NRI plugin, an unallocated pod annotated nvidia.cdi.k8s.io/pod: nvidia.com/gpu=all is refused by nvshim's plugin in one line naming the annotation (journaled); with nvshim's agent away, containerd 2.1 gives that pod every GPU through NVIDIA's plugin (containerd 1.7's NRI v0.6 drops CDI adjustments). doctor names NVIDIA's plugin by pid: ok beside the registered agent, a failure without it."""
    assert node.agent is not None
    annotated = {"nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=all"}
    log = node.base / "nvidia-nri.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(nvidia_nri), str(node.base / "nri.sock"), "20"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(
            lambda: "Started plugin" in log.read_text(), 30, "NVIDIA's NRI plugin's registration"
        )
        found = doctor_nri(node)
        assert found.status == "ok" and f"nvidia-nri (pid {proc.pid})" in found.message, found
        node.agent.stop()
        try:
            found = doctor_nri(node)
            assert found.status == "fail" and "any pod can take every GPU" in found.message, found
            _cid, logs = run(node, "nv-alone", pod_annotations=annotated)
            every = sorted(g.minor for g in node.sim.gpus)
            assert seen(node, logs)[0] == (every if node.version != "1.7" else [])
        finally:
            node.agent.start_registered()
        with pytest.raises(CriError) as info:
            run(node, "nv-annotated", pod_annotations=annotated)
        said = info.value.details
        assert (
            "nvshim: pod team-a/nv-annotated container main: annotation "
            "nvidia.cdi.k8s.io/pod names CDI device nvidia.com/gpu=all" in said
        ), said
        denials = [d for d in journal(node, "--denied") if d.get("pod") == "nv-annotated"]
        assert denials and denials[0]["action"] == "refused", denials
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_nvidia_like_runtime_alone_grants_env(node: NriNode) -> None:
    """Control: the same handler without the guard's void (a GPU allocated by UUID) injects what the env names, so the guard test's empty /dev is the plugin's doing; the plugin injected nothing itself but journaled the grant it let through, so nvshim grants names the pod."""
    gpu = node.sim.gpus[2]
    _cid, logs = run(
        node, "nvidia-alloc", handler="nvidia", env={"NVIDIA_VISIBLE_DEVICES": gpu.uuid}
    )
    minors, _vis = seen(node, logs)
    assert minors == [gpu.minor]
    # the journal's own lines: the stand-in (nvshim's runtime) journals its grant too, and
    # nvshim grants shows one row per container
    lines = (node.base / "grants.jsonl").read_text().splitlines()
    mine = [r for r in map(json.loads, lines) if r.get("pod") == "nvidia-alloc"]
    assert not [r for r in mine if str(r.get("source", "")).startswith("nri:")], mine
    through = [r for r in mine if str(r.get("source", "")).startswith("nri-guard:")]
    assert len(through) == 1 and through[0]["gpus"] == [gpu.uuid], mine


def test_no_claim_no_adjustment(node: NriNode) -> None:
    """A pod that names no GPU under plain runc is created as it is: no device, no env."""
    _cid, logs = run(node, "plain")
    assert seen(node, logs) == ([], "")


def test_agent_down_fails_open(node: NriNode) -> None:
    """With the agent stopped, containerd creates the container without the plugin (fail open: the CUDA-like image under the NVIDIA-like default gets every GPU); restarted, the agent registers again and guards."""
    assert node.agent is not None
    node.agent.stop()
    try:
        fail_open(node)
    finally:
        node.agent.start_registered()
    _cid, logs = run(node, "back", handler="", image=CUDA_LIKE)
    assert seen(node, logs) == ([], "void")


def fail_open(node: NriNode) -> None:
    """The creates of test_agent_down_fails_open while no plugin is registered."""
    _cid, logs = run(node, "open", env={"NVIDIA_VISIBLE_DEVICES": node.sim.gpus[0].uuid})
    assert seen(node, logs) == ([], node.sim.gpus[0].uuid)
    _cid, logs = run(node, "open-all", handler="", image=CUDA_LIKE)
    assert seen(node, logs)[0] == sorted(g.minor for g in node.sim.gpus)


def test_verify_refuses_engine_injected_cdi_device(node: NriNode) -> None:
    """A CDI device containerd injected (device-plugin CDI annotation) that the kubelet's record does not hold fails CreateContainer with one line naming the pod and the GPU, journaled as refused."""
    node.configure(verify_with="kubelet")
    assert node.kubelet is not None
    node.kubelet.set([("team-a", "verify", {"main": {}})])
    with pytest.raises(CriError) as info:
        run(node, "verify", annotations={"cdi.k8s.io/nvidia-device-plugin": "nvidia.com/gpu=0"})
    said = info.value.details
    assert "nvshim: pod team-a/verify container main:" in said, said
    assert node.sim.gpus[0].uuid in said, said
    denials = [d for d in journal(node, "--denied") if d.get("pod") == "verify"]
    assert denials and denials[0]["action"] == "refused", denials


def test_verify_holds_cri_cdi_devices_to_the_kubelet(node: NriNode) -> None:
    """A GPU containerd injected from the CRI ``CDI_devices`` field (a DRA claim's or a
    ``cdi-cri`` device plugin's names) is held to the kubelet's record like an annotation's:
    refused in one line naming the pod when the record does not hold it, seen by the
    container when it does."""
    node.configure(verify_with="kubelet")
    assert node.kubelet is not None
    node.kubelet.set([("team-a", "cri-field", {"main": {}})])
    with pytest.raises(CriError) as info:
        run(node, "cri-field", cdi_devices=("nvidia.com/gpu=1",))
    said = info.value.details
    assert "nvshim: pod team-a/cri-field container main:" in said, said
    assert node.sim.gpus[1].uuid in said, said
    node.kubelet.set(
        [("team-a", "cri-held", {"main": {"nvidia.com/gpu": [node.sim.gpus[1].uuid]}})]
    )
    _cid, logs = run(node, "cri-held", cdi_devices=("nvidia.com/gpu=1",))
    assert seen(node, logs)[0] == [node.sim.gpus[1].minor]


def _not_warmed_up() -> List[str]:
    """The modules of nvshim that a warmed-up agent has not imported yet (its warm-up
    imports what a GPU create needs: these come later, if at all)."""
    code = (
        "import pkgutil, sys; from nvshim.agent.daemon import _warm_up; "
        "import nvshim, nvshim.agent.nri.plugin, nvshim.agent.nri.transport; "
        "_warm_up(); print(*(m.name for m in pkgutil.walk_packages(nvshim.__path__, 'nvshim.') "
        "if not m.ispkg and m.name not in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_an_agent_whose_install_breaks_never_fails_a_create(node: NriNode, tmp_path: Path) -> None:
    """An agent serving from a copy of nvshim whose modules are then deleted (an uninstall or upgrade under it) never fails a create: with every module its warm-up did not import gone, it still serves a plain pod and a GPU pod under runc (the GPU pod with its GPU: a create imports nothing more from the install); with the whole package gone it answers with no adjustment and one log line (the GPU pod starts without its GPU, as with no plugin). An import failing inside a create is test_plugin.py's."""
    import sys

    from tests.helpers.agent import AgentProcess

    assert node.agent is not None
    copy = tmp_path / "site"
    shutil.copytree(
        Path(__file__).resolve().parents[2] / "nvshim",
        copy / "nvshim",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    log = tmp_path / "agent.log"
    broken = AgentProcess(
        node.base / "agent.sock",
        node.base / "agent" / "config.yaml",
        log,
        str(node.base / "nri.sock"),
    )
    broken.args = [
        sys.executable,
        "-I",
        "-c",
        "import sys; sys.path.insert(0, sys.argv.pop(1)); from nvshim.cli.main import main; main()",
        str(copy),
    ] + broken.args[broken.args.index("agent") :]
    node.agent.stop()
    try:
        broken.start()
        wait_until(lambda: "nri registered" in log.read_text(), 20, "the copy's registration")
        lazy = _not_warmed_up()
        assert "nvshim.cli.cmd_cdi" in lazy  # the check sees modules the warm-up leaves
        for name in lazy:
            (copy / Path(*name.split("."))).with_suffix(".py").unlink()
        gpu = node.sim.gpus[0]
        _cid, logs = run(node, "broken-plain")
        assert seen(node, logs) == ([], "")
        _cid, logs = run(node, "broken-gpu", env={"NVIDIA_VISIBLE_DEVICES": gpu.uuid})
        assert seen(node, logs) == ([gpu.minor], "void")
        said = log.read_text()
        assert "not adjusted" not in said, said
        shutil.rmtree(copy / "nvshim")
        _cid, logs = run(node, "gone-gpu", env={"NVIDIA_VISIBLE_DEVICES": gpu.uuid})
        assert seen(node, logs) == ([], gpu.uuid)
        assert "nvshim's install is gone" in log.read_text()
    finally:
        if broken.proc is not None:
            broken.stop()
        node.agent.start_registered()


def test_agent_restart_during_50_creates(node: NriNode) -> None:
    """The agent restarted while 50 GPU pods are created: no create fails, no container is journaled twice, every journal line is whole."""
    if node.version != "1.7":
        pytest.skip("one engine is enough for the restart burst (CI time)")
    from concurrent.futures import ThreadPoolExecutor

    assert node.cri is not None and node.agent is not None
    cri, gpu = node.cri, node.sim.gpus[0]
    done: List[str] = []

    def one(i: int) -> str:
        name = f"burst{i}"
        sandbox, config = cri.run_pod(
            name,
            "team-a",
            f"uid-{name}",
            node.base / "logs" / name,
            f"/{node.cgroup}/{name}",
            "runc",
            None,
        )
        cid = cri.create_container(
            sandbox,
            config,
            "main",
            "docker.io/nvshim-test/busybox:1",
            ["true"],
            env={"NVIDIA_VISIBLE_DEVICES": gpu.uuid},
        )
        done.append(cid)
        return cid

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(one, i) for i in range(50)]
        wait_until(lambda: len(done) >= 10, 120, "the first ten creates")
        node.agent.stop()
        node.agent.start()
        ids = [f.result() for f in futures]  # a failed create raises here
    assert len(set(ids)) == 50
    lines = (node.base / "grants.jsonl").read_bytes().split(b"\n")
    records = [json.loads(line) for line in lines if line.strip()]
    burst = [r["id"] for r in records if str(r.get("pod", "")).startswith("burst")]
    assert len(burst) == len(set(burst)) and set(burst) <= set(ids)
    cri.remove_pods()  # closes the client's channel: a new one for the tests after this
    assert node.containerd is not None
    node.cri = CriClient(node.containerd.address)


def doctor_nri(node: NriNode) -> Any:
    """doctor's nri finding for the node's containerd and agent."""
    from nvshim.node.doctor.nri import check_nri

    assert node.containerd is not None
    binary = (
        str(node.containerd.bin_dir / "containerd") if node.containerd.bin_dir else "containerd"
    )
    return check_nri(str(node.base / "containerd.toml"), binary, str(node.base / "agent.sock"))


def test_doctor_calls_nvidias_default_guarded_while_the_agent_guards(node: NriNode) -> None:
    """With NVIDIA's runtime (stood in) as containerd's default, doctor's default-runtime check is ok and names the agent's NRI guard while the agent is registered with nri-guard on, and fails (exit 1, the pitfall) once the agent is stopped."""
    assert node.agent is not None

    def default_runtime() -> Tuple[int, str]:
        absent = node.base / "absent"
        res = subprocess.run(
            [
                shutil.which("nvshim") or "nvshim",
                "doctor",
                "--config",
                str(node.base / "agent" / "config.yaml"),
                "--containerd-config",
                str(node.base / "containerd.toml"),
                "--agent-socket",
                str(node.base / "agent.sock"),
                "--trampoline",
                str(absent / "trampoline"),
                "--driver-root",
                node.sim.root,
                "--docker-config",
                str(absent / "docker"),
                "--crio-config",
                str(absent / "crio"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        line = next((x for x in res.stdout.splitlines() if " default-runtime: " in x), "")
        return res.returncode, line

    _rc, line = default_runtime()
    assert (
        line.startswith("ok    default-runtime: ")
        and "guarded by the nvshim agent's NRI guard" in line
    ), line
    node.agent.stop()
    try:
        rc, line = default_runtime()
        assert rc == 1 and line.startswith("FAIL  default-runtime: "), line
    finally:
        node.agent.start_registered()


def test_doctor_sees_the_registered_agent(node: NriNode) -> None:
    """doctor's nri check says ok while the agent is registered on containerd's NRI socket, and gives the fix once it is gone; on a node whose config turns nri-inject on, the agent gone is a failure saying GPU pods start without their GPUs."""
    from nvshim.node.doctor.nri import check_nri

    assert node.containerd is not None and node.agent is not None
    binary = (
        str(node.containerd.bin_dir / "containerd") if node.containerd.bin_dir else "containerd"
    )
    config, sock = str(node.base / "containerd.toml"), str(node.base / "agent.sock")
    inject = str(node.base / "agent" / "config.yaml")
    found = check_nri(config, binary, sock)
    assert found.status == "ok", found
    assert check_nri(config, binary, sock, inject=inject).status == "ok"
    node.agent.stop()
    try:
        found = check_nri(config, binary, sock)
        assert found.status == "skip" and "nvshim agent --nri-socket" in found.fix, found
        found = check_nri(config, binary, sock, inject=inject)
        assert found.status == "fail" and "start without their GPUs" in found.message, found
    finally:
        node.agent.start_registered()


INROOT = (
    "(: >/.probe) 2>/dev/null && echo RW || echo RO; "
    "ls /usr/lib/x86_64-linux-gnu/; grep -c libcuda.so.1 /etc/ld.so.cache; "
    "echo END; exec sleep 1000"
)


def inroot(
    node: NriNode,
    name: str,
    readonly: bool,
    between: Optional[Callable[[], None]] = None,
    handler: str = "runc",
) -> Tuple[str, List[str]]:
    """(the container's id, what INROOT prints in a GPU container under plain runc, or
    ``handler``); ``readonly``: its rootfs; ``between``: run after CreateContainer (the
    plugin's plan), before StartContainer (``runc create`` and its hooks)."""
    from tests.helpers.cri import NODE, ContainerSpec, Namespaces, SecurityContext

    assert node.cri is not None
    logs = node.base / "logs" / name
    sandbox, config = node.cri.run_pod(
        name, "team-a", f"uid-{name}", logs, f"/{node.cgroup}/{name}", handler, None
    )
    spec = ContainerSpec(
        "main",
        BUSYBOX,
        ["sh", "-c", INROOT],
        log_path="main.log",
        envs=[("NVIDIA_VISIBLE_DEVICES", node.sim.gpus[0].uuid)],
        security=SecurityContext(namespaces=Namespaces(network=NODE), readonly_rootfs=readonly),
    )
    cid = node.cri.create(sandbox, config, spec)
    if between is not None:
        between()
    node.cri.start_container(cid)
    out: List[str] = node.cri.wait_log(logs, "main", "END").split()
    return cid, out


def has_links(out: List[str]) -> bool:
    """libcuda.so.1 is in the container and its ld.so.cache names it."""
    return "libcuda.so.1" in out and out[out.index("END") - 1] != "0"


def served_by_agent(node: NriNode, cid: str) -> bool:
    """The agent's log says its createContainer hook did ``cid``'s in-root work."""
    return any(
        f'"id": "{cid}"' in line and '"by": "agent hook"' in line
        for line in (node.base / "agent.log").read_text().splitlines()
    )


def configure_inroot(node: NriNode, mode: str) -> None:
    """``nri-inroot: mode``; for ``start``, the agent registered again: the engine sends
    StartContainer only to a plugin that subscribed to it at its registration."""
    node.configure(nri_inroot=mode)
    if mode == "start":
        assert node.agent is not None
        node.agent.stop()
        node.agent.start_registered()


@pytest.mark.parametrize("mode", ["agent", "start"])
def test_inject_in_root_work(node: NriNode, mode: str) -> None:
    """Under plain runc the injected driver's SONAME links and ld.so.cache are in the container, made by the agent asked by the static client as createContainer hook (nri-inroot: agent, the default) or by the agent through /proc/<pid>/root at StartContainer (start)."""
    configure_inroot(node, mode)
    cid, out = inroot(node, f"inroot-{mode}", readonly=False)
    assert has_links(out), out
    assert served_by_agent(node, cid) == (mode == "agent")
    if mode == "start":
        assert '"nri in-root work"' in (node.base / "agent.log").read_text()


def test_read_only_rootfs(node: NriNode) -> None:
    """A read-only rootfs gets the links and cache from the agent's createContainer hook (nri-inroot: agent: runc runs it before the rootfs is made read-only); under start the container still starts, without them, and the agent logs one error line."""
    node.configure(nri_inroot="agent")
    cid, out = inroot(node, "ro-agent", readonly=True)
    assert has_links(out) and served_by_agent(node, cid), out
    configure_inroot(node, "start")
    _cid, out = inroot(node, "ro-start", readonly=True)
    assert "libcuda.so.1" not in out and "libcuda.so.550.54.15" in out, out
    assert '"nri in-root work not done"' in (node.base / "agent.log").read_text()


def test_read_only_rootfs_under_crun(node: NriNode) -> None:
    """Under crun (Debian 13's 1.21 makes a read-only rootfs read-only before the hooks) nri-inroot: agent still gives a readOnlyRootFilesystem container the links and cache: the agent cannot write and says so in one line, the client execs nvshim's Python hook, which does, and the rootfs stays read-only."""
    node.configure(
        nri_inroot="agent",
        runtimes=[node.crunw],
        nri_runtime_root=str(node.base / "crun-root" / "k8s.io"),
    )
    cid, out = inroot(node, "ro-crun", readonly=True, handler="crun")
    assert has_links(out) and not served_by_agent(node, cid) and out[0] == "RO", out
    refused = [
        line
        for line in (node.base / "agent.log").read_text().splitlines()
        if f'"id": "{cid}"' in line
    ]
    assert len(refused) == 1 and "read-only file system" in refused[0], refused
    assert '"nri in-root work not served (the Python hook does it)"' in refused[0]


def test_agent_hook_falls_back_to_the_python_hook(node: NriNode) -> None:
    """nri-inroot: agent fails closed: the agent killed between CreateContainer and the hook (read-only rootfs), or restarted in between (its planned work gone), and the client's Python hook still makes the links and cache."""
    assert node.agent is not None
    agent, log = node.agent, node.base / "agent.log"

    def restart(kill: bool) -> Callable[[], None]:
        def between() -> None:
            before = log.read_text().count("nri registered")
            agent.stop(signal.SIGKILL if kill else signal.SIGTERM)
            if not kill:
                agent.start()
                wait_until(
                    lambda: log.read_text().count("nri registered") > before, 20, "re-registration"
                )

        return between

    try:
        cid, out = inroot(node, "fb-killed", readonly=True, between=restart(True))
        assert has_links(out) and not served_by_agent(node, cid), out
    finally:
        agent.start_registered()
    cid, out = inroot(node, "fb-restarted", readonly=False, between=restart(False))
    assert has_links(out) and not served_by_agent(node, cid), out
    assert f"no in-root work waits for container {cid}" in log.read_text()
