"""``nvshim cdi generate`` on simulated nodes: valid, minimal-version specs with the right
devices, atomic output, and staleness after a driver upgrade.

Building a simulated node needs root (mknod); these tests skip without it.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from nvshim.cdi.schema import validate_spec
from nvshim.cdi.version import required_version
from nvshim.host.discovery import Host
from nvshim.node.cdigen import generate_spec, stale_reasons

HOOK = ("/opt/nvshim/venv/bin/python3", "-I", "-m", "nvshim.hook")


def _require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("building a simulated GPU node needs root (mknod)")


@pytest.fixture(scope="module")
def two_gpu(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A simulated 2-GPU node whose minors are shuffled."""
    _require_root()
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("gen") / "n2"), gpus=2, shuffle_minors=True)


@pytest.fixture(scope="module")
def mig_node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A simulated 1-GPU node with MIG enabled (GPU instances 1 and 2)."""
    _require_root()
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("gen") / "mig"), gpus=1, mig=True)


def _nvshim(nvshim_bin: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([nvshim_bin, *args], capture_output=True, text=True, timeout=60)


def _names(spec: Dict[str, Any]) -> List[str]:
    return [d["name"] for d in spec["devices"]]


def _all_edit_sets(spec: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [spec.get("containerEdits") or {}] + [d["containerEdits"] for d in spec["devices"]]


def test_two_gpu_spec_is_valid_and_minimal(two_gpu: Any) -> None:
    """A 2-GPU spec validates with no problems and declares exactly the version it needs (≤ 0.5.0)."""
    spec = generate_spec(Host(two_gpu.root), hook_command=HOOK)
    assert validate_spec(spec) == []
    assert spec["cdiVersion"] == required_version(spec)
    assert tuple(map(int, spec["cdiVersion"].split("."))) <= (0, 5, 0)
    assert spec["kind"] == "nvidia.com/gpu"


def test_two_gpu_device_names(two_gpu: Any) -> None:
    """Devices are named by index, by UUID, and `all`; each index device holds its own GPU's node."""
    spec = generate_spec(Host(two_gpu.root), hook_command=HOOK)
    uuids = [g.uuid for g in two_gpu.gpus]
    assert sorted(_names(spec)) == sorted(["0", "1", *uuids, "all"])
    by_name = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    for gpu in two_gpu.gpus:
        for name in (str(gpu.index), gpu.uuid):
            nodes = by_name[name]["deviceNodes"]
            assert [(n["path"], n["minor"]) for n in nodes] == [
                (f"/dev/nvidia{gpu.minor}", gpu.minor)
            ]
    assert {n["minor"] for n in by_name["all"]["deviceNodes"]} == {g.minor for g in two_gpu.gpus}


def test_every_node_and_mount_is_complete(two_gpu: Any) -> None:
    """Every deviceNode carries type/major/minor and every mount has the bind or rbind option."""
    spec = generate_spec(Host(two_gpu.root), hook_command=HOOK)
    nodes = [n for e in _all_edit_sets(spec) for n in e.get("deviceNodes") or []]
    mounts = [m for e in _all_edit_sets(spec) for m in e.get("mounts") or []]
    assert nodes and mounts
    for node in nodes:
        assert (
            node["type"] == "c"
            and isinstance(node["major"], int)
            and isinstance(node["minor"], int)
        ), node
    for mount in mounts:
        assert {"bind", "rbind"} & set(mount["options"]), mount


def test_spec_level_env_is_void(two_gpu: Any) -> None:
    """The spec-level edits set NVIDIA_VISIBLE_DEVICES=void, so no nested injection happens."""
    spec = generate_spec(Host(two_gpu.root), hook_command=HOOK)
    assert "NVIDIA_VISIBLE_DEVICES=void" in spec["containerEdits"]["env"]


def test_hook_command_is_embedded(two_gpu: Any) -> None:
    """The createContainer hook runs exactly the hook command given."""
    spec = generate_spec(Host(two_gpu.root), hook_command=HOOK)
    hooks = spec["containerEdits"]["hooks"]
    assert hooks and all(
        h["path"] == HOOK[0] and h["args"][: len(HOOK)] == list(HOOK) for h in hooks
    )


def test_mig_devices_and_cap_nodes(mig_node: Any) -> None:
    """A MIG node yields `<gpu>:<mig>` and MIG-UUID devices that hold the GPU node and both
    nvidia-cap nodes (GPU instance and compute instance access)."""
    spec = generate_spec(Host(mig_node.root, nvml_facts=mig_node.nvml_facts), hook_command=HOOK)
    assert validate_spec(spec) == []
    gpu = mig_node.gpus[0]
    by_name = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert sorted(by_name) == sorted(
        ["0", gpu.uuid, "0:0", "0:1", *(m.uuid for m in gpu.mig), "all"]
    )
    for index, mig in enumerate(gpu.mig):
        for name in (f"0:{index}", mig.uuid):
            paths = {n["path"]: (n["major"], n["minor"]) for n in by_name[name]["deviceNodes"]}
            assert paths == {
                f"/dev/nvidia{gpu.minor}": (195, gpu.minor),
                f"/dev/nvidia-caps/nvidia-cap{mig.gi_cap_minor}": (237, mig.gi_cap_minor),
                f"/dev/nvidia-caps/nvidia-cap{mig.ci_cap_minor}": (237, mig.ci_cap_minor),
            }, name


def test_output_json_is_atomic_and_0644(two_gpu: Any, tmp_path: Path, nvshim_bin: str) -> None:
    """--output x.json writes JSON mode 0644 by replacing the file: a reader holding the old
    file still reads the old bytes, and no temporary file is left."""
    out = tmp_path / "specs" / "x.json"
    res = _nvshim(
        nvshim_bin, "cdi", "generate", "--driver-root", two_gpu.root, "--output", str(out)
    )
    assert res.returncode == 0, res.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    first = json.loads(out.read_text())
    assert validate_spec(first) == []
    with open(out, "rb") as old:
        before = old.read()
        old.seek(0)
        res = _nvshim(
            nvshim_bin,
            "cdi",
            "generate",
            "--driver-root",
            two_gpu.root,
            "--driver-capabilities",
            "utility",
            "--output",
            str(out),
        )
        assert res.returncode == 0, res.stderr
        assert old.read() == before
    assert out.read_bytes() != before
    assert os.listdir(out.parent) == ["x.json"]


def test_format_json_to_stdout(two_gpu: Any, nvshim_bin: str) -> None:
    """--format json prints the spec as JSON on stdout; the default is YAML starting with ---."""
    res = _nvshim(nvshim_bin, "cdi", "generate", "--driver-root", two_gpu.root, "--format", "json")
    assert res.returncode == 0, res.stderr
    as_json = json.loads(res.stdout)
    res = _nvshim(nvshim_bin, "cdi", "generate", "--driver-root", two_gpu.root)
    assert res.returncode == 0 and res.stdout.startswith("---\n")
    assert yaml.safe_load(res.stdout) == as_json


def test_procfs_under_non_root_driver_root(two_gpu: Any, nvshim_bin: str) -> None:
    """--gpu-source procfs reads GPUs from <driver root>/proc and maps host paths under it."""
    res = _nvshim(
        nvshim_bin,
        "cdi",
        "generate",
        "--driver-root",
        two_gpu.root,
        "--gpu-source",
        "procfs",
        "--format",
        "json",
    )
    assert res.returncode == 0, res.stderr
    spec = json.loads(res.stdout)
    assert sorted(_names(spec)) == sorted(["0", "1", "all", *(g.uuid for g in two_gpu.gpus)])
    host_paths = [
        x["hostPath"]
        for e in _all_edit_sets(spec)
        for x in (e.get("deviceNodes") or []) + (e.get("mounts") or [])
    ]
    assert host_paths and all(p.startswith(two_gpu.root + "/") for p in host_paths)


def test_zero_gpus_is_one_line_error(tmp_path: Path, nvshim_bin: str) -> None:
    """A node without GPUs gives exit 1 and a single error line naming the driver root."""
    _require_root()
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "n0"), gpus=0)
    res = _nvshim(nvshim_bin, "cdi", "generate", "--driver-root", node.root)
    assert res.returncode == 1 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "no GPUs" in lines[0] and node.root in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def test_check_current_then_stale_after_upgrade(tmp_path: Path, nvshim_bin: str) -> None:
    """--check says current for a fresh spec, and after the node's driver is upgraded exits 1
    naming the new driver version and the old library."""
    _require_root()
    from nvshim.sim.build import create_node

    root = tmp_path / "node"
    create_node(str(root), gpus=2, driver_version="550.54.15")
    spec = tmp_path / "spec.yaml"
    gen = ["cdi", "generate", "--driver-root", str(root)]
    assert _nvshim(nvshim_bin, *gen, "--output", str(spec)).returncode == 0
    res = _nvshim(nvshim_bin, *gen, "--check", str(spec))
    assert res.returncode == 0 and "current" in res.stderr, res.stderr
    shutil.rmtree(root)
    create_node(str(root), gpus=2, driver_version="560.35.03")  # same seed: same GPUs
    res = _nvshim(nvshim_bin, *gen, "--check", str(spec))
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "stale" in lines[0] and "560.35.03" in lines[0], res.stderr
    assert "550.54.15" in lines[0]


def test_stale_reasons_names_new_devices(two_gpu: Any, tmp_path: Path) -> None:
    """A spec from a 2-GPU node checked against a 3-GPU node lists the device names that differ."""
    _require_root()
    from nvshim.sim.build import create_node

    old = generate_spec(Host(two_gpu.root), hook_command=HOOK)
    bigger = create_node(str(tmp_path / "n3"), gpus=3, shuffle_minors=True)
    host = Host(bigger.root)
    fresh = generate_spec(host, hook_command=HOOK)
    reasons = stale_reasons(old, fresh, host)
    assert any("devices differ" in r and "2" in r for r in reasons), reasons
    assert stale_reasons(fresh, fresh, host) == []


def test_generate_help(nvshim_bin: str) -> None:
    """`nvshim cdi generate --help` exits 0 and documents --output and --check."""
    res = _nvshim(nvshim_bin, "cdi", "generate", "--help")
    assert res.returncode == 0, res.stderr
    assert "--output" in res.stdout and "--check" in res.stdout and "--driver-root" in res.stdout
