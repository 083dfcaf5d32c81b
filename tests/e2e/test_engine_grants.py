"""e2e: GPUs the engine already injected (CDI by containerd 1.7+/CRI-O/podman, DRA), through
nvshim-runtime and real runc, and through podman's own CDI injection.

containerd 1.7's injection runs twice: reproduced on a bundle run by runc
(:func:`tests.helpers.engineinject.inject_like_engine`: ``linux.devices`` for GPU 1,
nvidiactl and the UVM nodes, their cgroup allow rules, the driver mounts, the hooks, with or
without the spec's ``NVIDIA_VISIBLE_DEVICES=void`` line), and for real by Debian 13's
containerd 1.7 (``enable_cdi``) from the CRI ``CDI_devices`` field, with Debian 13's runc
1.1.15 under nvshim (:mod:`tests.helpers.debian13`); podman 4.3.1 injects for real.
Every container's image env says ``NVIDIA_VISIBLE_DEVICES=all``; what counts is what the
process inside sees, what ``nvshim inspect`` says and what the grant journal records.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import yaml

from nvshim.host.discovery import Host
from nvshim.node.cdigen import generate_spec
from nvshim.node.compile import compile_node
from nvshim.runtime.hookargs import hook_command
from tests.helpers.bundle import make_bundle, write_config
from tests.helpers.common import require_root, unique_id
from tests.helpers.engineinject import inject_like_engine, nvidia_style_hooks
from tests.helpers.node import write_nvshim_config
from tests.helpers.podman import Podman, installed_cdi_spec
from tests.helpers.runc import Runc

pytestmark = pytest.mark.e2e

VERSION = "550.54.15"
LIB_DIR = "/usr/lib/x86_64-linux-gnu"
PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROBE = (
    'for n in /dev/nvidia*; do [ -c "$n" ] && stat -c \'DEV %n %t:%T\' "$n"; done; '
    "for n in /dev/nvidia[0-9]*; do head -c0 $n 2>&1 | sed 's/^/OPEN: /'; done; "
    f"[ -L {LIB_DIR}/libcuda.so.1 ] && echo LINK-OK; "
    f"grep -c NVSHIM-SIM {LIB_DIR}/libcuda.so.{VERSION} >/dev/null && echo LIB-READABLE"
)
CONTROL = {
    "/dev/nvidiactl": (195, 255),
    "/dev/nvidia-uvm": (510, 0),
    "/dev/nvidia-uvm-tools": (510, 1),
}


def seen_devices(output: str) -> Dict[str, Tuple[int, int]]:
    """{path: (major, minor)} from the probe's DEV lines."""
    return {
        m.group(1): (int(m.group(2), 16), int(m.group(3), 16))
        for m in re.finditer(r"^DEV (\S+) ([0-9a-f]+):([0-9a-f]+)$", output, re.M)
    }


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A simulated 2-GPU node whose minors are swapped (GPU 1 is /dev/nvidia0)."""
    require_root()
    from nvshim.sim.build import create_node

    return create_node(
        str(tmp_path_factory.mktemp("sim") / "node"),
        gpus=2,
        shuffle_minors=True,
        driver_version=VERSION,
    )


@pytest.fixture(scope="module")
def cdi_spec(node: Any) -> Dict[str, Any]:
    """The node's CDI spec as ``nvshim cdi generate`` writes it (nvshim's hook, void line)."""
    spec: Dict[str, Any] = generate_spec(Host(node.root), hook_command=hook_command())
    return spec


def gpu1_only(node: Any) -> Dict[str, Tuple[int, int]]:
    minor = node.gpus[1].minor
    return {f"/dev/nvidia{minor}": (195, minor), **CONTROL}


def config_env(tmp_path: Path, node: Any, **settings: Any) -> Dict[str, str]:
    cfg = write_nvshim_config(
        tmp_path / "etc",
        {
            "runtimes": ["runc"],
            "driver-root": node.root,
            "debug-log": str(tmp_path / "debug.jsonl"),
            **settings,
        },
    )
    compile_node(str(cfg))
    return {"PATH": PATH_ENV, "NVSHIM_CONFIG": str(cfg)}


def journal(env: Dict[str, str]) -> List[Dict[str, Any]]:
    path = Path(env["NVSHIM_CONFIG"]).parent / "grants.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def engine_bundle(
    tmp_path: Path,
    rootfs: Path,
    cdi: Dict[str, Any],
    names: List[str],
    void: bool,
    args: List[str],
    name: str = "bundle",
) -> Path:
    """A bundle running ``args`` with image env NVIDIA_VISIBLE_DEVICES=all, into which the
    CDI devices ``names`` were injected as containerd 1.7 injects them."""
    bundle = make_bundle(tmp_path / name, rootfs, args, env={"NVIDIA_VISIBLE_DEVICES": "all"})
    spec = json.loads((bundle / "config.json").read_text())
    write_config(bundle, inject_like_engine(spec, cdi, names, void=void))
    return bundle


def inspect(nvshim_bin: str, bundle: Path, env: Dict[str, str]) -> str:
    res = subprocess.run(
        [nvshim_bin, "inspect", "--bundle", str(bundle), "--no-diff"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


@pytest.fixture(scope="module")
def containerd_17(
    node: Any, base_rootfs: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """Debian 13's containerd 1.7 over the module's node, injecting the CDI devices of the
    specs in ``<base>/cdi`` itself; nvshim (this checkout) runs Debian 13's runc 1.1.15."""
    from tests.e2e.test_kubelet_cri import cri_node

    with cri_node(tmp_path_factory.mktemp("cri17"), node, "1.7", base_rootfs) as n:
        yield n


@pytest.fixture
def cri17(containerd_17: Any) -> Iterator[Any]:
    """containerd 1.7's node for one test; its pods removed afterwards."""
    from tests.helpers.cri import CriClient

    yield containerd_17
    containerd_17.cri.remove_pods()
    containerd_17.cri = CriClient(containerd_17.containerd.address)


def through_containerd_17(
    n: Any, cdi: Dict[str, Any], void: bool, name: str, devices: List[str]
) -> Tuple[str, Dict[str, Any]]:
    """Run PROBE in a CRI container of a new pod ``name`` whose CDI_devices are ``devices``
    and image env NVIDIA_VISIBLE_DEVICES=all, containerd injecting them from ``cdi`` (its
    NVIDIA_VISIBLE_DEVICES=void line dropped unless ``void``): the container's output and
    its config.json as the runtime left it."""
    cdi = json.loads(json.dumps(cdi))
    if not void:
        edits = cdi["containerEdits"]
        edits["env"] = [e for e in edits.get("env", []) if e != "NVIDIA_VISIBLE_DEVICES=void"]
    spec = n.base / "cdi" / "nvidia.yaml"  # replaces the generated spec: one nvidia.com/gpu
    spec.with_suffix(".tmp").write_text(yaml.safe_dump(cdi))
    os.replace(spec.with_suffix(".tmp"), spec)
    logs = n.base / "logs" / name
    sandbox, config = n.cri.run_pod(
        name, "team-a", f"uid-{name}", logs, f"/{n.cgroup}/{name}", "nvshim"
    )
    cid = n.cri.create_container(
        sandbox,
        config,
        "main",
        "docker.io/nvshim-test/busybox:1",
        ["sh", "-c", PROBE + "; echo END; exec sleep 1000"],
        env={"NVIDIA_VISIBLE_DEVICES": "all"},
        cdi_devices=devices,
    )
    n.cri.start_container(cid)
    out = str(n.cri.wait_log(logs, "main", "END"))
    [config_json] = n.base.glob(f"state/io.containerd.runtime.v2.task/*/{cid}/config.json")
    return out, json.loads(config_json.read_text())


@pytest.mark.parametrize("engine", ["simulated", "containerd-1.7"])
@pytest.mark.parametrize("require", [False, True], ids=["require-allocation off", "on"])
@pytest.mark.parametrize("void", [True, False], ids=["void line", "no void line"])
def test_containerd_injected_gpu_is_all_the_container_sees(
    runc: Runc,
    node: Any,
    cdi_spec: Dict[str, Any],
    base_rootfs: Path,
    tmp_path: Path,
    nvshim_runtime_bin: str,
    nvshim_bin: str,
    require: bool,
    void: bool,
    engine: str,
    request: pytest.FixtureRequest,
) -> None:
    """An NVIDIA-generated spec for nvidia.com/gpu=1, injected as containerd 1.7 does (on a
    bundle, and by containerd 1.7 itself from CDI_devices), whose nvidia-cdi-hook is not on
    this node: the container sees GPU 1's node (opens it: the cgroup allows it) and the
    control nodes, no other GPU; nvshim made the links the hook would have; inspect, the
    debug log and the grant journal name the engine's grant."""
    gpu = node.gpus[1]
    absent = str(tmp_path / "absent" / "nvidia-cdi-hook")
    cdi = nvidia_style_hooks(cdi_spec, absent)
    if engine == "containerd-1.7":
        n = request.getfixturevalue("cri17")
        debug = tmp_path / "debug.jsonl"
        n.config(require_allocation=require, verify_with="none", debug_log=str(debug))
        name = f"eg-{'void' if void else 'novoid'}-{'req' if require else 'noreq'}"
        stdout, _ = through_containerd_17(n, cdi, void, name, ["nvidia.com/gpu=1"])
        records = [json.loads(line) for line in (n.base / "grants.jsonl").read_text().splitlines()]
        records = [r for r in records if r["pod"] == name]
    else:
        bundle = engine_bundle(tmp_path, base_rootfs, cdi, ["1"], void, ["sh", "-c", PROBE])
        env = config_env(tmp_path, node, **{"require-allocation": require})
        debug = tmp_path / "debug.jsonl"
        shown = inspect(nvshim_bin, bundle, env).splitlines()
        assert "request from:  engine" in shown
        assert f"engine GPUs:   1  {gpu.uuid}" in shown
        assert (
            f"note:          GPU 1 ({gpu.uuid}) was injected by the engine "
            f"(/dev/nvidia{gpu.minor} in config.json): the container holds it"
        ) in shown
        res = runc.run(bundle, unique_id("engine"), runtime=nvshim_runtime_bin, env=env)
        assert res.rc == 0, res.describe()
        stdout = res.stdout
        records = journal(env)
    assert seen_devices(stdout) == gpu1_only(node), stdout
    assert "No such device or address" in stdout, stdout  # ENXIO: allowed
    assert "LINK-OK" in stdout and "LIB-READABLE" in stdout, stdout
    assert [(g["source"], g["gpus"]) for g in records] == [("engine", [gpu.uuid])]
    events = [json.loads(line) for line in debug.read_text().splitlines()]
    request_ = next(e for e in events if e["event"] == "request" and e.get("engine"))
    assert (request_["source"], request_["engine"]) == ("engine", [gpu.uuid])


@pytest.mark.parametrize("engine", ["simulated", "containerd-1.7"])
def test_nvshims_own_spec_without_void_line_gets_no_second_gpu(
    runc: Runc,
    node: Any,
    cdi_spec: Dict[str, Any],
    base_rootfs: Path,
    tmp_path: Path,
    nvshim_runtime_bin: str,
    engine: str,
    request: pytest.FixtureRequest,
) -> None:
    """nvshim's own spec (its hook runnable here) injected without the void line (on a
    bundle, and by containerd 1.7 itself): image env NVIDIA_VISIBLE_DEVICES=all still gets
    GPU 1 alone, its driver files mounted once."""
    if engine == "containerd-1.7":
        n = request.getfixturevalue("cri17")
        n.config(require_allocation=False, verify_with="none")
        stdout, spec = through_containerd_17(n, cdi_spec, False, "own-spec", ["nvidia.com/gpu=1"])
    else:
        bundle = engine_bundle(tmp_path, base_rootfs, cdi_spec, ["1"], False, ["sh", "-c", PROBE])
        env = config_env(tmp_path, node)
        res = runc.run(bundle, unique_id("engine"), runtime=nvshim_runtime_bin, env=env)
        assert res.rc == 0, res.describe()
        stdout = res.stdout
        spec = json.loads((bundle / "config.json").read_text())
    assert seen_devices(stdout) == gpu1_only(node), stdout
    assert "LINK-OK" in stdout and "LIB-READABLE" in stdout, stdout
    destinations = [m["destination"] for m in spec["mounts"]]
    assert len(destinations) == len(set(destinations))


def test_grants_flags_an_engine_grant_and_a_device_plugin_grant_of_one_gpu(
    runc: Runc,
    node: Any,
    cdi_spec: Dict[str, Any],
    base_rootfs: Path,
    tmp_path: Path,
    nvshim_runtime_bin: str,
    nvshim_bin: str,
) -> None:
    """GPU 0 injected by the engine into one live container and granted to another through a
    device-plugin mount: `nvshim grants` names both sources and flags GPU 0 (exit 1)."""
    gpu0 = node.gpus[0].uuid
    env = config_env(tmp_path, node)
    held = engine_bundle(
        tmp_path, base_rootfs, cdi_spec, ["0"], True, ["sleep", "30"], name="by-engine"
    )
    assert runc.create(held, "by-engine", runtime=nvshim_runtime_bin, env=env).rc == 0
    plugin = make_bundle(
        tmp_path / "by-plugin",
        base_rootfs,
        ["sleep", "30"],
        mounts=[
            {
                "source": "/dev/null",
                "destination": f"/var/run/nvidia-container-devices/{gpu0}",
                "type": "bind",
                "options": ["bind", "ro"],
            }
        ],
    )
    res = runc.create(plugin, "by-plugin", runtime=nvshim_runtime_bin, env=env)
    assert res.rc == 0, res.describe()
    out = subprocess.run(
        [nvshim_bin, "grants", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["conflicts"] == {gpu0: ["by-engine", "by-plugin"]}
    assert {g["container_id"]: g["source"] for g in doc["grants"]} == {
        "by-engine": "engine",
        "by-plugin": "volume-mounts",
    }


# --- podman's own CDI injection -----------------------------------------------------------


def write_wrapper(path: Path, config: str, runtime: str) -> Path:
    """podman drops NVSHIM_CONFIG: a --runtime wrapper sets it (as docs/engines.md says)."""
    path.write_text(f'#!/bin/sh\nexport NVSHIM_CONFIG={config}\nexec {runtime} "$@"\n')
    path.chmod(0o755)
    return path


def generated_spec(nvshim_bin: str, node: Any, void: bool) -> str:
    """`nvshim cdi generate` for the node (cdiVersion 0.5.0: podman 4.3.1 reads it), without
    its NVIDIA_VISIBLE_DEVICES=void line when ``void`` is False."""
    res = subprocess.run(
        [nvshim_bin, "cdi", "generate", "--driver-root", node.root],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    doc = yaml.safe_load(res.stdout)
    assert doc["cdiVersion"] == "0.5.0"
    if not void:
        env = doc["containerEdits"]["env"]
        env.remove("NVIDIA_VISIBLE_DEVICES=void")
        if not env:
            del doc["containerEdits"]["env"]
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.mark.parametrize("void", [True, False], ids=["void line", "no void line"])
def test_podman_cdi_injection_is_the_engines_grant(
    podman: Podman,
    node: Any,
    rootfs: Path,
    tmp_path: Path,
    nvshim_runtime_bin: str,
    nvshim_bin: str,
    void: bool,
) -> None:
    """podman --device nvidia.com/gpu=1 -e NVIDIA_VISIBLE_DEVICES=all with nvshim as its
    runtime: only GPU 1's node exists in the container, and the journal records the grant
    as the engine's."""
    env = config_env(tmp_path, node)
    wrapper = write_wrapper(
        tmp_path / "nvshim-runtime-sim", env["NVSHIM_CONFIG"], nvshim_runtime_bin
    )
    with installed_cdi_spec(
        generated_spec(nvshim_bin, node, void), f"nvshim-e2e-{unique_id()}.yaml"
    ):
        res = podman.podman_run(
            rootfs,
            ["sh", "-c", PROBE],
            devices=["nvidia.com/gpu=1"],
            env={"NVIDIA_VISIBLE_DEVICES": "all"},
            runtime=wrapper,
            podman_env={"PATH": PATH_ENV},
        )
    assert res.rc == 0, res.describe()
    assert seen_devices(res.stdout) == gpu1_only(node), res.describe()
    assert [(g["source"], g["gpus"]) for g in journal(env)] == [("engine", [node.gpus[1].uuid])]


@pytest.mark.parametrize(
    "marker", ["io.kubernetes.cri-o.ContainerType", "io.kubernetes.cri.container-type"]
)
def test_podman_sandbox_annotation_does_not_pass_an_engine_gpu(
    podman: Podman,
    node: Any,
    rootfs: Path,
    tmp_path: Path,
    nvshim_runtime_bin: str,
    nvshim_bin: str,
    marker: str,
) -> None:
    """podman --annotation <CRI sandbox marker>=sandbox --device nvidia.com/gpu=1 under
    require-allocation with unidentified-containers: fail is refused, not passed through
    as a pod sandbox, and the refusal is journaled."""
    env = config_env(
        tmp_path,
        node,
        **{"require-allocation": True, "verify-with": "kubelet", "unidentified-containers": "fail"},
    )
    wrapper = write_wrapper(
        tmp_path / "nvshim-runtime-sim", env["NVSHIM_CONFIG"], nvshim_runtime_bin
    )
    with installed_cdi_spec(
        generated_spec(nvshim_bin, node, True), f"nvshim-e2e-{unique_id()}.yaml"
    ):
        res = podman.podman_run(
            rootfs,
            ["sh", "-c", PROBE],
            devices=["nvidia.com/gpu=1"],
            annotations={marker: "sandbox"},
            runtime=wrapper,
            podman_env={"PATH": PATH_ENV},
        )
    assert res.rc != 0 and "DEV " not in res.stdout, res.describe()
    assert "nvshim: " in res.stderr and "refusing" in res.stderr, res.describe()
    denied = Path(env["NVSHIM_CONFIG"]).parent / "grants.denied.jsonl"
    assert [d["action"] for d in map(json.loads, denied.read_text().splitlines())] == ["refused"]
