"""MIG devices: token resolution and the device nodes a MIG device brings.

A simulated 2-GPU node with MIG on GPU 0 (GPU instances 1 and 2, one compute instance
each) and shuffled minors, so GPU 0 is not ``/dev/nvidia0``. Expectations come from the
node's own files: the MIG UUIDs from ``nvshim-sim.json`` (what NVML would say), the
capability minors from ``proc/driver/nvidia-caps/mig-minors`` (parsed here, not by
``nvshim.host.mig``). MIG index ``j`` of a GPU is the j-th (gi, ci) pair in order.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from nvshim.config import Config
from nvshim.errors import RequestError
from nvshim.runtime.create import plan_create

CAPS_MAJOR = 237


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A simulated 2-GPU node, MIG enabled on GPU 0, minors shuffled."""
    if os.geteuid() != 0:
        pytest.skip("creating a simulated node needs root (mknod)")
    from nvshim.sim.build import create_node

    made = create_node(
        str(tmp_path_factory.mktemp("sim") / "node"), gpus=2, mig=True, shuffle_minors=True
    )
    assert made.gpus[0].minor != 0, "shuffled minors must move GPU 0 off /dev/nvidia0"
    return made


@pytest.fixture(scope="module")
def facts(node) -> Dict[str, object]:
    """What the node's files say: GPU minors, MIG (gi, ci, uuid) per GPU, mig-minors."""
    meta = json.loads(Path(node.root, "nvshim-sim.json").read_text())
    minors_text = Path(node.root, "proc/driver/nvidia-caps/mig-minors").read_text()
    cap_minors = {}
    for line in minors_text.splitlines():
        name, value = line.split()
        cap_minors[name] = int(value)
    gpus = sorted(meta["gpus"], key=lambda g: g["index"])
    migs = {
        g["index"]: sorted((m["gi"], m["ci"], m["uuid"]) for m in g.get("mig", [])) for g in gpus
    }
    return {"minor": {g["index"]: g["minor"] for g in gpus}, "migs": migs, "caps": cap_minors}


def mig_nodes(facts, gpu: int, mig: int) -> List[Tuple[str, int, int]]:
    """(path, major, minor) of the nodes MIG device ``gpu:mig`` needs, from the node's files."""
    minor = facts["minor"][gpu]
    gi, ci, _ = facts["migs"][gpu][mig]
    gi_cap = facts["caps"][f"gpu{minor}/gi{gi}/access"]
    ci_cap = facts["caps"][f"gpu{minor}/gi{gi}/ci{ci}/access"]
    return [
        (f"/dev/nvidia{minor}", 195, minor),
        (f"/dev/nvidia-caps/nvidia-cap{gi_cap}", CAPS_MAJOR, gi_cap),
        (f"/dev/nvidia-caps/nvidia-cap{ci_cap}", CAPS_MAJOR, ci_cap),
    ]


def write_bundle(path: Path, visible: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    spec = {
        "ociVersion": "1.0.2",
        "process": {
            "args": ["sh"],
            "env": ["PATH=/usr/bin:/bin", f"NVIDIA_VISIBLE_DEVICES={visible}"],
            "cwd": "/",
        },
        "root": {"path": "rootfs"},
        "linux": {},
    }
    (path / "config.json").write_text(json.dumps(spec) + "\n")
    return path


def gpu_nodes(node, tmp_path: Path, visible: str) -> List[Tuple[str, int, int]]:
    """GPU and capability nodes (not the control nodes) in the planned config.json."""
    config = Config(driver_root=node.root, nvml_facts=node.nvml_facts)
    plan = plan_create(str(write_bundle(tmp_path / "bundle", visible)), config)
    assert plan.new_spec is not None
    out = []
    for dev in plan.new_spec["linux"].get("devices", []):
        name = dev["path"].rsplit("/", 1)[1]
        if name[len("nvidia") :].isdigit() or dev["path"].startswith("/dev/nvidia-caps/"):
            out.append((dev["path"], dev["major"], dev["minor"]))
    return out


def allowed_rules(node, tmp_path: Path, visible: str) -> List[Tuple[str, int, int]]:
    config = Config(driver_root=node.root, nvml_facts=node.nvml_facts)
    plan = plan_create(str(write_bundle(tmp_path / "bundle", visible)), config)
    rules = plan.new_spec["linux"]["resources"]["devices"]
    return [(r["type"], r["major"], r["minor"]) for r in rules if r.get("allow")]


@pytest.mark.parametrize("mig", [0, 1])
def test_pair_token_gives_parent_and_both_caps(node, facts, tmp_path, mig):
    """0:<j> injects the parent's /dev/nvidia<minor> and the GI and CI access nodes named by mig-minors."""
    assert sorted(gpu_nodes(node, tmp_path, f"0:{mig}")) == sorted(mig_nodes(facts, 0, mig))


def test_mig_devices_are_allowed_in_the_cgroup(node, facts, tmp_path):
    """Each injected capability node also gets a cgroup allow rule with its own minor."""
    rules = allowed_rules(node, tmp_path, "0:1")
    for _, major, minor in mig_nodes(facts, 0, 1):
        assert ("c", major, minor) in rules


@pytest.mark.parametrize("case", [str.lower, str.upper, lambda u: u])
def test_mig_uuid_token_any_case(node, facts, tmp_path, case):
    """MIG-<uuid> selects the same device as its <gpu>:<mig> pair, whatever the case of the hex digits."""
    uuid = facts["migs"][0][1][2]
    token = "MIG-" + case(uuid[len("MIG-") :])
    assert sorted(gpu_nodes(node, tmp_path, token)) == sorted(mig_nodes(facts, 0, 1))


def test_mig_mixed_with_full_gpu(node, facts, tmp_path):
    """A MIG device and a full GPU together give the full GPU's node plus the MIG device's three nodes."""
    minor1 = facts["minor"][1]
    got = set(gpu_nodes(node, tmp_path, "1,0:0"))
    want = {(f"/dev/nvidia{minor1}", 195, minor1), *mig_nodes(facts, 0, 0)}
    assert got == want


def test_both_migs_share_one_parent_node(node, facts, tmp_path):
    """Two MIG devices of one GPU list the parent's node once and four distinct capability nodes."""
    got = gpu_nodes(node, tmp_path, "0:0,0:1")
    want = set(mig_nodes(facts, 0, 0)) | set(mig_nodes(facts, 0, 1))
    assert sorted(set(got)) == sorted(want)
    assert len(got) == len(set(got)) == 5


def test_mig_caps_are_only_the_selected_ones(node, facts, tmp_path):
    """Selecting 0:0 does not bring 0:1's capability nodes."""
    other = {p for p, _, _ in mig_nodes(facts, 0, 1)[1:]}
    assert not other & {p for p, _, _ in gpu_nodes(node, tmp_path, "0:0")}


@pytest.mark.parametrize(
    "token",
    ["0:5", "1:0", "MIG-00000000-0000-0000-0000-000000000000"],
)
def test_unknown_mig_is_an_error_naming_it(node, tmp_path, token):
    """An unknown MIG pair or UUID fails with an error naming it and listing the node's MIG devices."""
    with pytest.raises(RequestError) as info:
        gpu_nodes(node, tmp_path, token)
    text = str(info.value)
    assert f'unknown device "{token}"' in text
    assert "0:0" in text and "0:1" in text
