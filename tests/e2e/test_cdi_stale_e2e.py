"""e2e through real runc: ``stale-cdi-spec: refuse`` holds for every shape of stale spec, on
both injection roads.

Node A had driver 535 and its CDI spec was generated there; the node now runs driver 550
(node B) while A's files linger, so nothing the spec mounts is missing and only its
versions tell it is stale. Under ``refuse`` each create below fails before runc with one
line naming the spec and the reason, config.json byte-identical; under ``warn`` it runs and
runc's ``--log`` carries the line:

- nvshim injects ``nvidia.com/gpu=0`` from a spec without any libcuda/libnvidia-ml mount
  (its other driver libraries are 535's);
- nvshim injects a device of a spec that mounts 535's library folder whole;
- the engine injected the 535 spec itself (as containerd 1.7 does, reproduced on the bundle
  by :func:`tests.helpers.engineinject.inject_like_engine`) before nvshim runs.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any, Dict, List

import pytest

from nvshim.cdi.write import dump_spec
from nvshim.host.discovery import Host
from nvshim.node.cdigen import generate_spec
from nvshim.node.compile import compile_node
from tests.helpers.bundle import make_bundle, write_config
from tests.helpers.common import require_root, unique_id
from tests.helpers.engineinject import inject_like_engine
from tests.helpers.node import write_nvshim_config
from tests.helpers.runc import Runc

pytestmark = pytest.mark.e2e

OLD, NEW = "535.104.05", "550.54.15"
LIBDIR = "usr/lib/x86_64-linux-gnu"
PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """Node A (driver 535, kept on disk) and node B (550, the driver the config names), and
    A's generated spec with nvshim's hook."""
    require_root()
    from nvshim.runtime.hookargs import hook_command
    from nvshim.sim.build import create_node

    base = tmp_path_factory.mktemp("nodes")
    old = create_node(str(base / "a"), gpus=2, driver_version=OLD)
    new = create_node(str(base / "b"), gpus=2, driver_version=NEW)
    spec = generate_spec(Host(old.root), hook_command=hook_command())
    return {"old": old, "new": new, "spec": spec}


def without_nvml_and_libcuda(spec: Dict[str, Any]) -> Dict[str, Any]:
    out = copy.deepcopy(spec)
    edits = out["containerEdits"]
    edits["mounts"] = [
        m
        for m in edits.get("mounts", [])
        if not m["hostPath"].rsplit("/", 1)[-1].startswith(("libcuda.so", "libnvidia-ml.so"))
    ]
    return out


def folder_spec(nodes: Dict[str, Any]) -> Dict[str, Any]:
    """Node B's own spec plus A's whole library folder mounted at /usr/lib/nvidia-old."""
    out = generate_spec(Host(nodes["new"].root))
    out["containerEdits"].setdefault("mounts", []).append(
        {
            "hostPath": f"{nodes['old'].root}/{LIBDIR}",
            "containerPath": "/usr/lib/nvidia-old",
            "options": ["ro", "nosuid", "nodev", "bind"],
        }
    )
    return out


def setup(
    tmp_path: Path, nodes: Dict[str, Any], doc: Dict[str, Any], policy: str
) -> Dict[str, Any]:
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir(exist_ok=True)
    spec = spec_dir / "nvidia.yaml"
    spec.write_text(dump_spec(doc))
    cfg = write_nvshim_config(
        tmp_path / "cfg",
        {
            "driver-root": nodes["new"].root,
            "runtimes": ["runc"],
            "cdi-spec-dirs": [str(spec_dir)],
            "stale-cdi-spec": policy,
        },
    )
    compile_node(str(cfg))
    return {"spec": spec, "env": {"NVSHIM_CONFIG": str(cfg), "PATH": PATH_ENV}}


@pytest.mark.parametrize("shape", ["no-libcuda-no-nvml", "old-folder-whole"])
@pytest.mark.parametrize("policy", ["refuse", "warn"])
def test_nvshim_injection_of_a_stale_spec(
    runc: Runc,
    rootfs: Path,
    tmp_path: Path,
    nvshim_runtime_bin: str,
    nodes: Dict[str, Any],
    shape: str,
    policy: str,
) -> None:
    """nvidia.com/gpu=0 from a 535 spec without libcuda/libnvidia-ml mounts, or from a spec
    mounting 535's library folder whole: refuse fails in one line naming the spec and
    the 535 file; warn runs the container and says the same in runc's --log."""
    doc = (
        without_nvml_and_libcuda(nodes["spec"])
        if shape == "no-libcuda-no-nvml"
        else folder_spec(nodes)
    )
    made = setup(tmp_path, nodes, doc, policy)
    spec = made["spec"]
    bundle = make_bundle(
        tmp_path / "b", rootfs, ["true"], env=["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0"]
    )
    before = (bundle / "config.json").read_bytes()
    reason = (
        f"it mounts lib[a-z-]+\\.so\\.{re.escape(OLD)}, the node's driver is {NEW}"
        if shape == "no-libcuda-no-nvml"
        else re.escape(
            f"it mounts {nodes['old'].root}/{LIBDIR} whole, whose libcuda.so.1 is "
            f"libcuda.so.{OLD}, the node's driver is {NEW}"
        )
    )
    res = runc.create(
        bundle, unique_id(), runtime=nvshim_runtime_bin, env=made["env"], log=tmp_path / "log.json"
    )
    if policy == "refuse":
        lines = [res.refusal()]
        assert lines[0].startswith(f"nvshim: CDI spec {spec} does not match this node ("), lines
        assert re.search(reason, lines[0]), lines
        assert lines[0].endswith("(stale-cdi-spec: refuse)"), lines
        assert (bundle / "config.json").read_bytes() == before
        return
    assert res.rc == 0, res.describe()
    warned = [x["msg"] for x in res.log_lines if x.get("level") == "warning"]
    assert any(re.search(reason, w) and w.endswith("(stale-cdi-spec: warn)") for w in warned), (
        warned
    )


def engine_bundle(tmp_path: Path, rootfs: Path, cdi: Dict[str, Any], names: List[str]) -> Path:
    bundle = make_bundle(tmp_path / "b", rootfs, ["true"])
    spec = json.loads((bundle / "config.json").read_text())
    write_config(bundle, inject_like_engine(spec, cdi, names))
    return bundle


@pytest.mark.parametrize("policy", ["refuse", "warn"])
def test_a_stale_spec_the_engine_injected_is_judged_too(
    runc: Runc,
    rootfs: Path,
    tmp_path: Path,
    nvshim_runtime_bin: str,
    nodes: Dict[str, Any],
    policy: str,
) -> None:
    """GPU 0 of the 535 spec, injected by the engine before nvshim runs: refuse fails in one
    line naming the spec (found in cdi-spec-dirs), the 535 libcuda and the fix; warn runs
    the container and says it in runc's --log."""
    made = setup(tmp_path, nodes, nodes["spec"], policy)
    spec = made["spec"]
    bundle = engine_bundle(tmp_path, rootfs, nodes["spec"], ["0"])
    before = (bundle / "config.json").read_bytes()
    res = runc.create(
        bundle, unique_id(), runtime=nvshim_runtime_bin, env=made["env"], log=tmp_path / "log.json"
    )
    head = f"CDI spec {spec}, which the engine injected, does not match this node (it mounts "
    fix = f"regenerate it with nvshim cdi generate --output {spec}"
    if policy == "refuse":
        lines = [res.refusal()]
        assert lines[0].startswith("nvshim: " + head), lines
        assert f".so.{OLD}, the node's driver is {NEW}" in lines[0]
        assert lines[0].endswith(f"{fix} (stale-cdi-spec: refuse)"), lines
        assert (bundle / "config.json").read_bytes() == before
        return
    assert res.rc == 0, res.describe()
    warned = [x["msg"] for x in res.log_lines if x.get("level") == "warning"]
    assert any(head in w and w.endswith("(stale-cdi-spec: warn)") for w in warned), warned
