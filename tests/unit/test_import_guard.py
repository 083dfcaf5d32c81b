"""What the runtime's hot paths import, measured in a real subprocess.

``nvshim-runtime`` runs for every container on a node; click, structlog, yaml, jsonschema
and pynvml each cost tens of milliseconds to import, so the create path (with and without a
GPU request), the Python passthrough and the createContainer hook must never load them;
grpc (~75 ms) loads only when ``verify-with: kubelet`` must ask the kubelet.
Each test runs ``python -I -X importtime -m nvshim.runtime.main ...`` exactly as the trampoline
does, with a compiled config whose low-level runtime is ``/bin/true`` (so nothing is
started), and reads the interpreter's own import log from stderr. What the allowed
modules cost is a budget in time, measured on the shipped runtime by
tests/e2e/test_import_budget.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Sequence

import pytest

from tests.helpers.bundle import make_bundle, make_rootfs

#: google: protobuf, which only the resident agent's NRI messages import
FORBIDDEN = ("click", "structlog", "yaml", "jsonschema", "pynvml", "tomlkit", "google")
#: What a GPU create avoids on top (each costs 1-6 ms to import here): the create path is
#: the interpreter's start-up modules, struct, errno, _json and nvshim's hot modules.
SLOW = (
    "re",
    "typing",
    "enum",
    "json",
    "copy",
    "contextlib",
    "collections",
    "functools",
    "dataclasses",
    "argparse",
    "weakref",
    "inspect",
    "ctypes",
    "hashlib",
)


def imported_modules(stderr: str) -> List[str]:
    """Module names from ``-X importtime`` lines (``import time: self | cumulative | name``)."""
    names = []
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line.split("|")
        if len(parts) == 3 and parts[2].strip() and "imported package" not in parts[2]:
            names.append(parts[2].strip())
    return names


def forbidden_in(modules: Sequence[str]) -> List[str]:
    return sorted({m.split(".")[0] for m in modules if m.split(".")[0] in FORBIDDEN})


def run_python(args: Sequence[str], env: Dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """``<this interpreter> -I -X importtime <args>`` as the trampoline starts it."""
    return subprocess.run(
        [sys.executable, "-I", "-X", "importtime", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=60,
    )


def run_like_trampoline(
    args: Sequence[str], env: Dict[str, str], cwd: Path
) -> subprocess.CompletedProcess:
    """The runtime started exactly as the installed trampoline starts it (``-I -S``, explicit
    sys.path), with ``-X importtime``."""
    from nvshim.node.install.trampoline import default_paths

    boot = (
        f"import sys; sys.path[0:0] = {json.dumps(default_paths())}; "
        "from nvshim.runtime.main import main; main()"
    )
    return subprocess.run(
        [sys.executable, "-I", "-S", "-X", "importtime", "-c", boot, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=60,
    )


def slow_in(modules: Sequence[str]) -> List[str]:
    return sorted({m for m in modules if m.split(".")[0] in FORBIDDEN + SLOW})


def compiled_config(tmp_path: Path, driver_root: str = "/", extra: str = "") -> Dict[str, str]:
    """A config with runtimes [/bin/true], compiled so the runtime takes its JSON hot path
    (with its node plan cache and CDI index)."""
    cfg = tmp_path / "nvshim" / "config.yaml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(
        f"runtimes: [/bin/true]\ndriver-root: {driver_root}\n"
        f"grants-journal: {tmp_path}/grants.jsonl\n" + extra
    )
    res = subprocess.run(
        [sys.executable, "-I", "-m", "nvshim.cli.main", "config", "compile", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert (cfg.parent / "config.compiled.json").exists()
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVSHIM_CONFIG": str(cfg)}
    return env


def report(modules: Sequence[str]) -> str:
    nvshim = sorted(m for m in modules if m.startswith("nvshim"))
    return f"forbidden: {forbidden_in(modules)}\nnvshim modules: {nvshim}\nall: {sorted(modules)}"


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    return make_rootfs(tmp_path / "rootfs")


def test_create_without_gpu_request_loads_no_heavy_module(tmp_path: Path, rootfs: Path) -> None:
    """create for a container that asks for no GPU imports none of click, structlog, yaml, jsonschema, pynvml (nor discovery)."""
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["true"])
    before = (bundle / "config.json").read_bytes()
    env = compiled_config(tmp_path)
    res = run_python(
        ["-m", "nvshim.runtime.main", "create", "--bundle", str(bundle), "c0"], env, bundle
    )
    assert res.returncode == 0, res.stderr[-2000:]
    modules = imported_modules(res.stderr)
    assert "nvshim.runtime.create" in modules, report(modules)  # the create path really ran
    assert forbidden_in(modules) == [], report(modules)
    assert "nvshim.host.discovery" not in modules, report(modules)
    # no device named: the token grammar and the require-allocation checks stay unloaded
    assert "nvshim.host.devices" not in modules, report(modules)
    assert "nvshim.runtime.allocation" not in modules, report(modules)
    assert "nvshim.runtime.hookargs" not in modules, report(modules)
    # nothing is given: the edits' builders stay unloaded, and a spec no CRI engine
    # annotated never loads the Kubernetes identity reader
    assert "nvshim.runtime.hostedits" not in modules, report(modules)
    assert "nvshim.runtime.identity" not in modules, report(modules)
    assert (bundle / "config.json").read_bytes() == before


def test_create_with_one_gpu_loads_no_heavy_module(tmp_path: Path, rootfs: Path) -> None:
    """create with NVIDIA_VISIBLE_DEVICES=0 on a simulated node injects the GPU and imports none of the heavy modules."""
    if os.geteuid() != 0:
        pytest.skip("the simulated GPU node needs root (mknod)")
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=2)
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "0"})
    env = compiled_config(tmp_path, node.root)
    res = run_python(
        [
            "-m",
            "nvshim.runtime.main",
            "--log",
            str(tmp_path / "log.json"),
            "--log-format",
            "json",
            "create",
            "--bundle",
            str(bundle),
            "c1",
        ],
        env,
        bundle,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    spec = json.loads((bundle / "config.json").read_text())
    paths = [d["path"] for d in spec["linux"]["devices"]]
    assert "/dev/nvidia0" in paths  # the GPU path really ran
    modules = imported_modules(res.stderr)
    assert forbidden_in(modules) == [], report(modules)
    assert "grpc" not in modules and "nvshim.runtime.allocation.kubelet" not in modules, report(
        modules
    )
    assert "nvshim.runtime.grants" in modules, report(modules)  # the grant was journaled
    assert "nvshim.runtime.extras" not in modules, report(modules)  # no IMEX/NVSwitch/GDS asked for
    # the journal's readers (nvshim grants) and require-allocation's checks never load here
    assert "nvshim.node.holders" not in modules, report(modules)
    assert "nvshim.runtime.allocation" not in modules, report(modules)


def test_grpc_loads_only_when_the_kubelet_is_asked(tmp_path: Path, rootfs: Path) -> None:
    """verify-with: kubelet imports grpc for a CRI container claiming a GPU, and for nothing else."""
    if os.geteuid() != 0:
        pytest.skip("the simulated GPU node needs root (mknod)")
    from nvshim.sim.build import create_node
    from tests.helpers.podresources import PodResourcesServer

    node = create_node(str(tmp_path / "node"), gpus=1)
    env = compiled_config(
        tmp_path,
        node.root,
        extra=(
            f"require-allocation: true\nverify-with: kubelet\nkubelet-checkpoint: null\n"
            # "plain" (no CRI engine made it) is judged, not refused: grpc must not load for it
            f"unidentified-containers: allocation-sources\n"
            f"kubelet-socket: {tmp_path}/kubelet.sock\n"
        ),
    )
    server = PodResourcesServer(str(tmp_path / "kubelet.sock")).start()
    server.set([("ns", "p", {"c": {"nvidia.com/gpu": [node.gpus[0].uuid]}})])
    cri = {
        "io.kubernetes.cri.sandbox-name": "p",
        "io.kubernetes.cri.sandbox-namespace": "ns",
        "io.kubernetes.cri.container-name": "c",
    }
    try:
        seen = {}
        for name, visible, annotations in (
            ("plain", "0", {}),
            ("cri-none", None, cri),
            ("cri-gpu", node.gpus[0].uuid, cri),
        ):
            bundle = make_bundle(
                tmp_path / name,
                rootfs,
                ["true"],
                env={"NVIDIA_VISIBLE_DEVICES": visible} if visible else {},
            )
            spec = json.loads((bundle / "config.json").read_text())
            spec["annotations"] = annotations
            (bundle / "config.json").write_text(json.dumps(spec))
            res = run_python(
                ["-m", "nvshim.runtime.main", "create", "--bundle", str(bundle), name], env, bundle
            )
            assert res.returncode == 0, res.stderr[-2000:]
            seen[name] = imported_modules(res.stderr)
    finally:
        server.stop()
    assert "grpc" not in seen["plain"] and "grpc" not in seen["cri-none"]
    # grpc is imported while fd 2 points at /dev/null (its C core must not log into the
    # container's stderr), so -X importtime cannot show it: the List call proves it ran.
    assert "nvshim.runtime.allocation.kubelet" in seen["cri-gpu"] and server.calls["List"] == 1
    assert all(forbidden_in(m) == [] for m in seen.values())


def test_gpu_create_imports_nothing_but_startup_modules_and_nvshim(
    tmp_path: Path, rootfs: Path
) -> None:
    """A 1-GPU create started as the trampoline starts it (plan cache fresh) imports none of
    re, typing, enum, json, copy, contextlib, collections … and still injects the GPU and
    makes the SONAME links itself."""
    if os.geteuid() != 0:
        pytest.skip("the simulated GPU node needs root (mknod)")
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=2)
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "0"})
    env = compiled_config(tmp_path, node.root)
    res = run_like_trampoline(["create", "--bundle", str(bundle), "c2"], env, bundle)
    assert res.returncode == 0, res.stderr[-2000:]
    spec = json.loads((bundle / "config.json").read_text())
    assert "/dev/nvidia0" in [d["path"] for d in spec["linux"]["devices"]]
    assert os.path.islink(bundle / "rootfs/usr/lib/x86_64-linux-gnu/libcuda.so.1")
    modules = imported_modules(res.stderr)
    assert "nvshim.runtime.plancache" in modules, report(modules)
    assert slow_in(modules) == [], report(modules)
    # a spec no CRI engine annotated (runc, Docker, podman) has no Kubernetes identity to read
    assert "nvshim.runtime.identity" not in modules, report(modules)
    # the create road stays inside its packages: never node administration, the CLI or the
    # simulator, nor require-allocation's package when nothing asks for it
    outside = [
        m
        for m in modules
        if m.startswith(("nvshim.node", "nvshim.cli", "nvshim.sim", "nvshim.runtime.allocation"))
    ]
    assert outside == [], report(modules)
    # debug-log is off: its module is not even imported (nor its events built)
    assert "nvshim.runtime.logs" not in modules, report(modules)
    # the plan cache answers: the finders (GPUs, driver files, versions) never load
    finders = [
        m
        for m in modules
        if m
        in (
            "nvshim.host.gpus",
            "nvshim.host.driverfiles",
            "nvshim.host.versions",
            "nvshim.host.drm",
            "nvshim.host.compat32",
            "nvshim.host.elf",
        )
    ]
    assert finders == [], report(modules)
    # what the modules it does load cost, in time on the shipped runtime, not in a count:
    # tests/e2e/test_import_budget.py


def test_cuda_image_create_imports_no_typing(tmp_path: Path, rootfs: Path) -> None:
    """A 1-GPU create of a CUDA image (CUDA_VERSION and NVIDIA_REQUIRE_CUDA set, so the
    requirements are checked) does not import typing: every real CUDA image takes this path."""
    if os.geteuid() != 0:
        pytest.skip("the simulated GPU node needs root (mknod)")
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=2)
    bundle = make_bundle(
        tmp_path / "bundle",
        rootfs,
        ["true"],
        env={
            "NVIDIA_VISIBLE_DEVICES": "0",
            "CUDA_VERSION": "12.2.0",
            "NVIDIA_REQUIRE_CUDA": "cuda>=12.0",
        },
    )
    env = compiled_config(tmp_path, node.root, f"nvml-facts: {node.nvml_facts}\n")
    res = run_like_trampoline(["create", "--bundle", str(bundle), "c3"], env, bundle)
    assert res.returncode == 0, res.stderr[-2000:]
    modules = imported_modules(res.stderr)
    assert "nvshim.runtime.requirements" in modules, report(modules)
    assert "typing" not in modules, report(modules)


def test_gpu_create_with_the_debug_log_on_imports_no_heavy_module(
    tmp_path: Path, rootfs: Path
) -> None:
    """Issue 28 item 14: with debug-log on, a 1-GPU create writes its records without
    importing structlog (~60 ms of every GPU create) or any of the slow modules."""
    if os.geteuid() != 0:
        pytest.skip("the simulated GPU node needs root (mknod)")
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=2)
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "0"})
    debug = tmp_path / "debug.log"
    env = compiled_config(tmp_path, node.root, extra=f"debug-log: {debug}\n")
    res = run_like_trampoline(["create", "--bundle", str(bundle), "c3"], env, bundle)
    assert res.returncode == 0, res.stderr[-2000:]
    modules = imported_modules(res.stderr)
    assert "nvshim.runtime.logs" in modules, report(modules)  # the log really was on
    assert slow_in(modules) == [], report(modules)
    events = [json.loads(line)["event"] for line in debug.read_text().splitlines()]
    assert "request" in events and "create" in events


def test_runtime_runs_without_the_cyclic_gc() -> None:
    """Importing the runtime entry turns the cyclic GC off: a create lives ~15 ms and the
    collector only ran while modules loaded (≈ 0.6 ms per create)."""
    res = subprocess.run(
        [sys.executable, "-I", "-c", "import gc, nvshim.runtime.main; print(gc.isenabled())"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_cdi_name_create_with_a_yaml_spec_imports_no_yaml(tmp_path: Path, rootfs: Path) -> None:
    """A create asking for nvidia.com/gpu=0 while the spec dir holds a YAML spec resolves it
    from the CDI index: no yaml, and none of the slow modules either."""
    if os.geteuid() != 0:
        pytest.skip("the simulated GPU node needs root (mknod)")
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=2)
    spec_dir = tmp_path / "cdi"
    res = subprocess.run(
        [
            sys.executable,
            "-I",
            "-m",
            "nvshim.cli.main",
            "cdi",
            "generate",
            "--driver-root",
            node.root,
            "--output",
            str(spec_dir / "nvidia.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    (spec_dir / "other.json").write_text(
        json.dumps(
            {
                "cdiVersion": "0.5.0",
                "kind": "acme.com/fpga",
                "devices": [{"name": "f0", "containerEdits": {"env": ["F=0"]}}],
            }
        )
    )
    bundle = make_bundle(
        tmp_path / "bundle", rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "nvidia.com/gpu=0"}
    )
    env = compiled_config(tmp_path, node.root, f"cdi-spec-dirs: [{spec_dir}]\n")
    res = run_like_trampoline(["create", "--bundle", str(bundle), "c3"], env, bundle)
    assert res.returncode == 0, res.stderr[-2000:]
    spec = json.loads((bundle / "config.json").read_text())
    assert "/dev/nvidia0" in [d["path"] for d in spec["linux"]["devices"]]
    modules = imported_modules(res.stderr)
    assert "nvshim.cdi.index" in modules, report(modules)
    assert slow_in(modules) == [], report(modules)


def test_python_passthrough_loads_no_heavy_module(tmp_path: Path) -> None:
    """A passthrough command that reaches Python (e.g. the trampoline found no runtime list) imports none of the heavy modules."""
    env = compiled_config(tmp_path)
    res = run_python(
        ["-m", "nvshim.runtime.main", "--root", str(tmp_path), "state", "x"], env, tmp_path
    )
    assert res.returncode == 0, res.stderr[-2000:]
    modules = imported_modules(res.stderr)
    assert "nvshim.runtime.main" in modules or "nvshim.runtime.argv" in modules, report(modules)
    assert forbidden_in(modules) == [], report(modules)
    assert "nvshim.runtime.create" not in modules, report(modules)


def test_hook_module_loads_no_heavy_module(tmp_path: Path) -> None:
    """Importing the createContainer hook (started by runc for every GPU container) loads none of the heavy modules."""
    res = run_python(["-c", "import nvshim.hook"], {"PATH": "/usr/bin:/bin"}, tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    modules = imported_modules(res.stderr)
    assert "nvshim.hook" in modules
    assert forbidden_in(modules) == [], report(modules)


def test_importtime_parser_sees_a_forbidden_module(tmp_path: Path) -> None:
    """The import-log reader does flag yaml when a process imports it (the guard can fail)."""
    res = run_python(["-c", "import yaml"], {"PATH": "/usr/bin:/bin"}, tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert forbidden_in(imported_modules(res.stderr)) == ["yaml"]
