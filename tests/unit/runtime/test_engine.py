"""GPUs the engine already injected (CDI by containerd 1.7+/CRI-O/podman, Kubernetes DRA):
recognised by device number, granted as source ``engine``, never widened by image env,
shown by ``inspect``, journaled, and their driver files and hooks not added twice."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List

import pytest

from nvshim._record import replace
from nvshim.config import Config
from nvshim.errors import RequestError
from nvshim.host.discovery import Gpu, Host
from nvshim.node.inspection import plan_summary, render_text
from nvshim.runtime.claim import image_view, read_claim
from nvshim.runtime.create import plan_create
from nvshim.runtime.engine import EngineGrant, engine_hooks
from nvshim.runtime.request import resolve_request
from tests.helpers.bundle import copy_rootfs, default_spec, make_rootfs
from tests.helpers.engineinject import inject_like_engine, nvidia_style_hooks

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod)")

U0 = "GPU-11111111-2222-3333-4444-555555555550"
U1 = "GPU-11111111-2222-3333-4444-555555555551"
GPU1 = Gpu(1, 0, U1, "0000:02:00.0", "sim")
HELD = EngineGrant(gpus=(GPU1,))
DEVICE_LIST = "/var/run/nvidia-container-devices"


# --- the request: image env never widens what the engine injected --------------------------


def held_view(env: List[str], **spec: Any) -> Any:
    base: Dict[str, Any] = {"process": {"env": env}, **spec}
    return replace(image_view(base), engine=HELD)


WIDEN = "adds no GPU: the engine injected GPU 1 into config.json"
EXCLUSIVE = Config()
ADDITIVE = Config(engine_grants="additive")
REQ = Config(require_allocation=True)
REQ_FAIL = Config(require_allocation=True, on_missing_allocation="fail")
REQ_ADDITIVE = Config(require_allocation=True, engine_grants="additive")

TABLE = [
    # (case, env, extra spec, config, source, devices, driver files, note expected)
    (
        "off: env all adds nothing",
        ["NVIDIA_VISIBLE_DEVICES=all"],
        {},
        EXCLUSIVE,
        "engine",
        (),
        True,
        "NVIDIA_VISIBLE_DEVICES=all " + WIDEN,
    ),
    (
        "off: indices add nothing",
        ["NVIDIA_VISIBLE_DEVICES=0,1"],
        {},
        EXCLUSIVE,
        "engine",
        (),
        True,
        "NVIDIA_VISIBLE_DEVICES=0,1 " + WIDEN,
    ),
    (
        "off: legacy image adds nothing",
        ["CUDA_VERSION=12.4"],
        {},
        EXCLUSIVE,
        "engine",
        (),
        True,
        "legacy CUDA image (all GPUs) " + WIDEN,
    ),
    (
        "off: void line, capabilities asked",
        ["NVIDIA_DRIVER_CAPABILITIES=compute", "NVIDIA_VISIBLE_DEVICES=void"],
        {},
        EXCLUSIVE,
        "engine",
        (),
        True,
        None,
    ),
    ("off: nothing asked", [], {}, EXCLUSIVE, "engine", (), False, None),
    (
        "off: additive adds env's GPUs",
        ["NVIDIA_VISIBLE_DEVICES=all"],
        {},
        ADDITIVE,
        "env",
        ("all",),
        True,
        None,
    ),
    (
        "off: a device-plugin mount is granted as before",
        ["NVIDIA_VISIBLE_DEVICES=all"],
        {"mounts": [{"source": "/dev/null", "destination": f"{DEVICE_LIST}/0"}]},
        EXCLUSIVE,
        "volume-mounts",
        ("0",),
        True,
        None,
    ),
    (
        "req: env all adds nothing, no void",
        ["NVIDIA_VISIBLE_DEVICES=all"],
        {},
        REQ,
        "engine",
        (),
        True,
        "NVIDIA_VISIBLE_DEVICES=all " + WIDEN,
    ),
    (
        "req fail: the engine's grant is an allocation",
        ["NVIDIA_VISIBLE_DEVICES=all"],
        {},
        REQ_FAIL,
        "engine",
        (),
        True,
        "NVIDIA_VISIBLE_DEVICES=all " + WIDEN,
    ),
    (
        "req: env UUIDs add nothing",
        [f"NVIDIA_VISIBLE_DEVICES={U0}"],
        {},
        REQ,
        "engine",
        (),
        True,
        f"NVIDIA_VISIBLE_DEVICES={U0} " + WIDEN,
    ),
    (
        "req additive: env UUIDs granted as before",
        [f"NVIDIA_VISIBLE_DEVICES={U0}"],
        {},
        REQ_ADDITIVE,
        "envvar-uuids",
        (U0,),
        True,
        None,
    ),
    (
        "req additive: env all is no allocation",
        ["NVIDIA_VISIBLE_DEVICES=all"],
        {},
        REQ_ADDITIVE,
        "engine",
        (),
        True,
        "require-allocation takes no GPU from image env",
    ),
    (
        "req: a CDI annotation is granted as before",
        ["NVIDIA_VISIBLE_DEVICES=all"],
        {"annotations": {"cdi.k8s.io/x": "nvidia.com/gpu=0"}},
        REQ,
        "cdi-annotations",
        ("nvidia.com/gpu=0",),
        True,
        None,
    ),
]


@pytest.mark.parametrize(
    "case,env,extra,config,source,devices,files,note", TABLE, ids=[row[0] for row in TABLE]
)
def test_image_env_never_widens_an_engine_grant(
    case: str,
    env: List[str],
    extra: Dict[str, Any],
    config: Config,
    source: str,
    devices: Any,
    files: bool,
    note: Any,
) -> None:
    """With GPU 1 already in the spec, each way of asking gets the expected source and
    devices: image env (all, indices, UUIDs, a legacy image) adds none and says so once, in
    every mode; device-plugin allocations and engine-grants: additive behave as before."""
    req = resolve_request(read_claim(held_view(env, **extra), config), config)
    assert (req.source, req.devices, req.driver_files) == (source, devices, files)
    assert not req.set_void  # nvshim cannot un-inject what the engine put there
    widening = [n for n in req.notes if "adds no GPU" in n]
    assert len(widening) == (0 if note is None else 1), req.notes
    if note is not None:
        assert note in widening[0]


def test_an_engine_grant_is_a_claim_the_kubelet_is_asked_about() -> None:
    """A spec holding engine GPUs and no env claims GPUs (so verify-with asks the kubelet)."""
    assert not read_claim(image_view({"process": {"env": []}}), Config()).claims_gpus
    assert read_claim(held_view([]), Config()).claims_gpus


# --- the create road on a simulated node ----------------------------------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A 2-GPU node with swapped minors (GPU 1 is /dev/nvidia0) and 4 IMEX channels."""
    if os.geteuid() != 0:
        pytest.skip("the simulated node needs root (mknod)")
    from nvshim.sim.build import create_node

    return create_node(
        str(tmp_path_factory.mktemp("sim") / "node"), gpus=2, shuffle_minors=True, imex_channels=4
    )


@pytest.fixture(scope="module")
def cdi_spec(node: Any) -> Dict[str, Any]:
    from nvshim.node.cdigen import generate_spec
    from nvshim.runtime.hookargs import hook_command

    spec: Dict[str, Any] = generate_spec(Host(node.root), hook_command=hook_command())
    return spec


@pytest.fixture(scope="module")
def base_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_rootfs(tmp_path_factory.mktemp("rootfs") / "rootfs")


def bundle_of(tmp_path: Path, spec: Dict[str, Any], rootfs: Path) -> Path:
    """A bundle at ``tmp_path/b`` with a private copy of ``rootfs`` (the runtime writes links
    in it) and ``spec`` as its config.json."""
    bundle = tmp_path / "b"
    bundle.mkdir()
    copy_rootfs(rootfs, bundle / "rootfs")
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


def image_spec(env: List[str]) -> Dict[str, Any]:
    spec = default_spec()
    spec["process"]["env"] += env
    return spec


def gpu_nodes(spec: Dict[str, Any]) -> List[str]:
    """Paths of the GPU device nodes (major 195, minor < 254) in a spec's linux.devices."""
    return sorted(
        d["path"] for d in spec["linux"]["devices"] if d["major"] == 195 and d["minor"] < 254
    )


@needs_root
def test_a_gpu_is_recognised_by_its_number_not_its_path(
    tmp_path: Path, node: Any, base_rootfs: Path
) -> None:
    """A node at /dev/gpu-one with GPU 1's numbers is GPU 1; /dev/nvidia<GPU 0's minor> with
    another major is no GPU; inspect names the engine's grant and explains it."""
    gpu = node.gpus[1]
    spec = image_spec([])
    spec["linux"]["devices"] = [
        {"path": "/dev/gpu-one", "type": "c", "major": 195, "minor": gpu.minor},
        {
            "path": f"/dev/nvidia{node.gpus[0].minor}",
            "type": "c",
            "major": 10,
            "minor": node.gpus[0].minor,
        },
    ]
    config = Config(driver_root=node.root)
    plan = plan_create(str(bundle_of(tmp_path, spec, base_rootfs)), config)
    assert [g.uuid for g in plan.engine_gpus] == [gpu.uuid]
    assert plan.request.source == "engine" and plan.gpus == ()
    assert plan.granted_uuids == (gpu.uuid,) and plan.grant_source == "engine"
    text = render_text(plan, config).splitlines()
    assert "request from:  engine" in text
    assert f"engine GPUs:   1  {gpu.uuid}" in text
    assert (
        f"note:          GPU 1 ({gpu.uuid}) was injected by the engine (/dev/gpu-one in "
        "config.json): the container holds it"
    ) in text
    assert plan_summary(plan, config)["engine_gpus"][0]["uuid"] == gpu.uuid
    assert not plan.changed


@needs_root
@pytest.mark.parametrize("require", [False, True], ids=["require-allocation off", "on"])
@pytest.mark.parametrize("void", [True, False], ids=["void line", "no void line"])
def test_a_containerd_injected_gpu_is_all_image_env_all_gets(
    tmp_path: Path,
    node: Any,
    cdi_spec: Dict[str, Any],
    base_rootfs: Path,
    require: bool,
    void: bool,
) -> None:
    """A spec as containerd 1.7 leaves it after injecting nvidia.com/gpu=1, with image env
    NVIDIA_VISIBLE_DEVICES=all: the new config.json holds GPU 1's node and no other, no
    mount destination or device twice, no second cgroup rule; the grant is the engine's."""
    gpu = node.gpus[1]
    spec = inject_like_engine(
        image_spec(["NVIDIA_VISIBLE_DEVICES=all"]), cdi_spec, ["1"], void=void
    )
    config = Config(driver_root=node.root, require_allocation=require)
    plan = plan_create(str(bundle_of(tmp_path, spec, base_rootfs)), config)
    new = plan.new_spec if plan.new_spec is not None else plan.spec
    assert gpu_nodes(new) == [f"/dev/nvidia{gpu.minor}"]
    assert plan.granted_uuids == (gpu.uuid,) and plan.request.source == "engine"
    destinations = [m["destination"] for m in new["mounts"]]
    assert len(destinations) == len(set(destinations))
    paths = [d["path"] for d in new["linux"]["devices"]]
    assert len(paths) == len(set(paths))
    rules = [
        (r.get("major"), r.get("minor"))
        for r in new["linux"]["resources"]["devices"]
        if r.get("allow")
    ]
    assert len(rules) == len(set(rules))


@needs_root
def test_a_spec_without_nvidia_devices_loads_no_node_plan(
    tmp_path: Path, node: Any, base_rootfs: Path
) -> None:
    """A character device of another driver (/dev/fuse) costs one /proc/devices read: no
    node plan, no grant."""
    spec = image_spec([])
    spec["linux"]["devices"] = [{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}]
    plan = plan_create(str(bundle_of(tmp_path, spec, base_rootfs)), Config(driver_root=node.root))
    assert plan.host is None and plan.plan_source == ""
    assert plan.request.source == "none" and plan.engine_gpus == ()


@needs_root
def test_a_privileged_containers_devices_are_no_grant(
    tmp_path: Path, node: Any, base_rootfs: Path
) -> None:
    """A privileged container (SYS_ADMIN, every device allowed) lists the host's devices,
    GPUs included: that is no engine grant (the request is none, image env is not held to
    it), but what it holds, journaled as source privileged."""
    spec = image_spec([])
    spec["process"]["capabilities"]["bounding"].append("CAP_SYS_ADMIN")
    spec["linux"]["resources"]["devices"] = [{"allow": True, "access": "rwm"}]
    spec["linux"]["devices"] = [
        {"path": f"/dev/nvidia{g.minor}", "type": "c", "major": 195, "minor": g.minor}
        for g in node.gpus
    ]
    plan = plan_create(str(bundle_of(tmp_path, spec, base_rootfs)), Config(driver_root=node.root))
    assert plan.request.source == "none" and plan.view.engine is None
    assert plan.grant.engine is not None and plan.grant.engine.privileged
    assert plan.grant_source == "privileged"


@needs_root
def test_a_dra_spec_with_only_device_nodes_gets_the_driver_files_asked_for(
    tmp_path: Path, node: Any, base_rootfs: Path
) -> None:
    """A DRA driver's spec carrying only GPU 1's node, image env asking compute,utility: nvshim
    adds the driver's files and control nodes, not GPU 1's node again, and no other GPU."""
    gpu = node.gpus[1]
    spec = image_spec(["NVIDIA_DRIVER_CAPABILITIES=compute,utility"])
    spec["linux"]["devices"] = [
        {
            "path": f"/dev/nvidia{gpu.minor}",
            "type": "c",
            "major": 195,
            "minor": gpu.minor,
            "fileMode": 0o666,
        }
    ]
    spec["linux"]["resources"]["devices"].append(
        {"allow": True, "type": "c", "major": 195, "minor": gpu.minor, "access": "rw"}
    )
    plan = plan_create(str(bundle_of(tmp_path, spec, base_rootfs)), Config(driver_root=node.root))
    assert plan.request.source == "engine"
    assert plan.new_spec is not None
    assert gpu_nodes(plan.new_spec) == [f"/dev/nvidia{gpu.minor}"]
    assert "/dev/nvidiactl" in [d["path"] for d in plan.new_spec["linux"]["devices"]]
    dests = [m["destination"] for m in plan.new_spec["mounts"]]
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15" in dests
    gpu_rules = [
        r
        for r in plan.new_spec["linux"]["resources"]["devices"]
        if r.get("major") == 195 and r.get("minor") == gpu.minor
    ]
    assert gpu_rules == [
        {"allow": True, "type": "c", "major": 195, "minor": gpu.minor, "access": "rw"}
    ]  # the engine's rule, not a second one


@needs_root
def test_hooks_whose_binary_is_missing_are_replaced_by_nvshims_work(
    tmp_path: Path, node: Any, cdi_spec: Dict[str, Any], base_rootfs: Path
) -> None:
    """NVIDIA's create-symlinks/update-ldcache hooks whose binary this node lacks are dropped
    from config.json (runc would fail on them) and their links are planned by nvshim."""
    missing = str(tmp_path / "absent" / "nvidia-cdi-hook")
    spec = inject_like_engine(image_spec([]), nvidia_style_hooks(cdi_spec, missing), ["1"])
    plan = plan_create(str(bundle_of(tmp_path, spec, base_rootfs)), Config(driver_root=node.root))
    assert plan.new_spec is not None
    paths = [h["path"] for h in plan.new_spec.get("hooks", {}).get("createContainer", [])]
    assert missing not in paths
    assert plan.rootfs.by == "runtime"
    assert ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so") in plan.rootfs.work.links
    assert "/usr/lib/x86_64-linux-gnu" in plan.rootfs.work.folders
    assert any(f"{missing} update-ldcache is not on this node" in n for n in plan.notes)


@needs_root
def test_runnable_hooks_are_left_to_do_their_work(
    tmp_path: Path, node: Any, cdi_spec: Dict[str, Any], base_rootfs: Path
) -> None:
    """With NVIDIA's hooks runnable on this node and every driver file already mounted,
    nvshim adds no in-root work of its own and keeps the engine's hooks."""
    binary = tmp_path / "bin" / "nvidia-cdi-hook"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    spec = inject_like_engine(
        image_spec(["NVIDIA_VISIBLE_DEVICES=all"]),
        nvidia_style_hooks(cdi_spec, str(binary)),
        ["1"],
        void=False,
    )
    assert engine_hooks(spec).runnable
    plan = plan_create(str(bundle_of(tmp_path, spec, base_rootfs)), Config(driver_root=node.root))
    assert plan.rootfs.work is None and plan.grant.base is None
    assert plan.new_spec is not None
    assert [
        h["path"]
        for h in plan.new_spec["hooks"]["createContainer"]
        if "nvidia-cdi-hook" in h["path"]
    ] == [str(binary)] * 2


@needs_root
def test_an_injected_imex_channel_is_held_and_env_adds_none(
    tmp_path: Path, node: Any, base_rootfs: Path
) -> None:
    """IMEX channel 2 in linux.devices (by its major) is the engine's; image env asking
    channels 0,1 adds none and says so."""
    from nvshim.runtime.engine import nvidia_majors

    imex_major = nvidia_majors(node.root)[2]
    spec = image_spec(["NVIDIA_IMEX_CHANNELS=0,1"])
    spec["linux"]["devices"] = [
        {
            "path": "/dev/nvidia-caps-imex-channels/channel2",
            "type": "c",
            "major": imex_major,
            "minor": 2,
        }
    ]
    plan = plan_create(str(bundle_of(tmp_path, spec, base_rootfs)), Config(driver_root=node.root))
    assert plan.engine_imex == (2,)
    assert any(n.startswith("NVIDIA_IMEX_CHANNELS=0,1 adds no IMEX channel") for n in plan.notes)
    new = plan.new_spec if plan.new_spec is not None else plan.spec
    assert [d["path"] for d in new["linux"]["devices"]] == [
        "/dev/nvidia-caps-imex-channels/channel2"
    ]


@needs_root
def test_an_injected_mig_device_is_held_as_a_mig_device(tmp_path: Path, base_rootfs: Path) -> None:
    """The parent's node plus both capability nodes of MIG device 0:1 are that MIG device,
    not a whole GPU 0."""
    from nvshim.sim.build import create_node

    sim = create_node(str(tmp_path / "mig"), gpus=1, mig=True)
    config = Config(driver_root=sim.root, nvml_facts=sim.nvml_facts)
    host = Host(sim.root, nvml_facts=sim.nvml_facts)
    parent = host.gpus()[0]
    mig = parent.mig[1]
    spec = image_spec(["NVIDIA_VISIBLE_DEVICES=all"])
    spec["linux"]["devices"] = [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]
    spec["linux"]["devices"] += [
        {"path": c.path, "type": "c", "major": c.major, "minor": c.minor} for c in mig.cap_nodes
    ]
    plan = plan_create(str(bundle_of(tmp_path, spec, base_rootfs)), config)
    assert [(p.index, m.uuid) for p, m in plan.engine_migs] == [(0, mig.uuid)]
    assert plan.engine_gpus == () and plan.migs == () and plan.gpus == ()
    assert plan.granted_uuids == (mig.uuid,)
    assert f"engine MIG:    0:1  {mig.uuid}" in render_text(plan, config).splitlines()


@needs_root
def test_verify_with_kubelet_asks_about_an_engine_grant(
    tmp_path: Path, node: Any, base_rootfs: Path
) -> None:
    """Under verify-with: kubelet a CRI container holding an engine GPU and asking nothing
    else is checked: with the kubelet unreachable the create fails (kubelet-unreachable: fail)."""
    gpu = node.gpus[1]
    spec = image_spec([])
    spec["annotations"] = {
        "io.kubernetes.cri.sandbox-name": "p",
        "io.kubernetes.cri.sandbox-namespace": "ns",
        "io.kubernetes.cri.container-name": "c",
    }
    spec["linux"]["devices"] = [
        {"path": f"/dev/nvidia{gpu.minor}", "type": "c", "major": 195, "minor": gpu.minor}
    ]
    config = Config(
        driver_root=node.root,
        require_allocation=True,
        verify_with="kubelet",
        kubelet_socket=str(tmp_path / "no-kubelet.sock"),
        kubelet_checkpoint=None,
    )
    with pytest.raises(RequestError, match="kubelet-unreachable: fail"):
        plan_create(str(bundle_of(tmp_path, spec, base_rootfs)), config)


# --- what it costs on the create path -------------------------------------------------------


@needs_root
def test_ordinary_creates_never_load_the_engine_module_and_engine_creates_stay_light(
    tmp_path: Path, node: Any, cdi_spec: Dict[str, Any], base_rootfs: Path
) -> None:
    """Started as the trampoline starts it: a create whose linux.devices holds no character
    device (one asking GPU 0 by env) never imports nvshim.runtime.engine; a create holding
    the engine's GPU 1 imports it and still none of re, typing, json … (the SLOW list)."""
    from tests.unit.test_import_guard import (
        compiled_config,
        imported_modules,
        report,
        run_like_trampoline,
        slow_in,
    )

    env = compiled_config(tmp_path, node.root)
    seen = {}
    for name, spec in (
        ("by-env", image_spec(["NVIDIA_VISIBLE_DEVICES=0"])),
        (
            "by-engine",
            inject_like_engine(
                image_spec(["NVIDIA_VISIBLE_DEVICES=all"]), cdi_spec, ["1"], void=False
            ),
        ),
    ):
        bundle = tmp_path / name
        bundle.mkdir()
        copy_rootfs(base_rootfs, bundle / "rootfs")
        (bundle / "config.json").write_text(json.dumps(spec))
        res = run_like_trampoline(["create", "--bundle", str(bundle), name], env, bundle)
        assert res.returncode == 0, res.stderr[-2000:]
        seen[name] = imported_modules(res.stderr)
    assert "nvshim.runtime.plancache" in seen["by-env"], report(seen["by-env"])
    assert "nvshim.runtime.engine" not in seen["by-env"], report(seen["by-env"])
    assert "nvshim.runtime.engine" in seen["by-engine"], report(seen["by-engine"])
    assert slow_in(seen["by-engine"]) == [], report(seen["by-engine"])
    journal = [json.loads(line) for line in (tmp_path / "grants.jsonl").read_text().splitlines()]
    assert [(g["id"], g["source"]) for g in journal] == [("by-env", "env"), ("by-engine", "engine")]


@needs_root
def test_the_trampoline_hands_an_engine_injected_spec_to_python(tmp_path: Path, node: Any) -> None:
    """A spec whose only trace of a GPU is the engine's /dev/nvidia node (no NVIDIA_ env,
    another vendor's DRA spec on a plain image) still reaches nvshim, which journals it."""
    import subprocess
    import sys

    from nvshim.node.compile import compile_node
    from nvshim.node.install.trampoline import render

    recorder = tmp_path / "fake-runc"
    recorder.write_text("#!/bin/sh\nexit 0\n")
    recorder.chmod(0o755)
    config = tmp_path / "etc" / "config.yaml"
    config.parent.mkdir()
    config.write_text(
        f"runtimes: [{recorder}]\ndriver-root: {node.root}\n"
        f"grants-journal: {tmp_path / 'grants.jsonl'}\n"
    )
    compile_node(str(config))
    tramp = tmp_path / "nvshim-runtime"
    tramp.write_text(render(sys.executable))
    tramp.chmod(0o755)
    gpu = node.gpus[1]
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    spec = {
        "process": {"env": ["PATH=/bin"]},
        "linux": {
            "devices": [
                {"path": f"/dev/nvidia{gpu.minor}", "type": "c", "major": 195, "minor": gpu.minor}
            ]
        },
    }
    (bundle / "config.json").write_text(json.dumps(spec, indent="\t"))
    res = subprocess.run(
        [str(tramp), "create", "--bundle", str(bundle), "held"],
        env={"PATH": "/usr/bin:/bin", "NVSHIM_CONFIG": str(config)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    records = [json.loads(line) for line in (tmp_path / "grants.jsonl").read_text().splitlines()]
    assert [(r["source"], r["gpus"]) for r in records] == [("engine", [gpu.uuid])]
