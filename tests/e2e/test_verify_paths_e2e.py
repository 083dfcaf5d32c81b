"""e2e, real runc behind nvshim-runtime (the sh trampoline rendered from this checkout): a
GPU the engine put at another container path is found by its number, verified and
journaled; a second ``"Linux"`` key cannot hide one from nvshim while runc creates it; a
privileged GPU container starts under the DaemonSet's config and shows in the journal.

What is asserted is what the process inside sees (``ls -l`` of the node, opening it: ENXIO
means the cgroup allows it), what runc reports, and the grant journal.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from nvshim.node.compile import compile_node
from nvshim.node.install.trampoline import render
from tests.helpers.bundle import char_device, device_rule, make_bundle, write_config
from tests.helpers.common import require_binary, require_root, unique_id
from tests.helpers.node import write_nvshim_config
from tests.helpers.runc import Runc

pytestmark = pytest.mark.e2e

PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROBE = "ls -l /dev/gpu1 2>&1; head -c0 /dev/gpu1 2>&1; echo END"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A simulated 2-GPU node whose minors are swapped (GPU 1 is /dev/nvidia0)."""
    require_root()
    require_binary("runc")
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("sim") / "node"), gpus=2, shuffle_minors=True)


@pytest.fixture
def runtime(tmp_path: Path) -> Path:
    """nvshim-runtime as install.sh writes it, for this checkout's nvshim."""
    path = tmp_path / "nvshim-runtime"
    path.write_text(render(sys.executable))
    path.chmod(0o755)
    return path


def config_env(tmp_path: Path, node: Any, **settings: Any) -> Dict[str, str]:
    cfg = write_nvshim_config(
        tmp_path / "etc",
        {"runtimes": [require_binary("runc")], "driver-root": node.root, **settings},
    )
    compile_node(str(cfg))
    return {"PATH": PATH_ENV, "NVSHIM_CONFIG": str(cfg)}


def journal(env: Dict[str, str]) -> List[Dict[str, Any]]:
    path = Path(env["NVSHIM_CONFIG"]).parent / "grants.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def gpu1_bundle(tmp_path: Path, rootfs: Path, node: Any) -> Path:
    """A plain image (no NVIDIA_ text) into which the engine injected GPU 1 at /dev/gpu1."""
    gpu = node.gpus[1]
    return make_bundle(
        tmp_path / "b",
        rootfs,
        ["sh", "-c", PROBE],
        devices=[char_device("/dev/gpu1", 195, gpu.minor)],
        device_rules=[device_rule(195, gpu.minor)],
    )


def test_an_engine_gpu_at_another_path_is_journaled(
    runc: Runc, node: Any, base_rootfs: Path, tmp_path: Path, runtime: Path
) -> None:
    """/dev/gpu1 with GPU 1's numbers in a spec with no NVIDIA text or /dev/nvidia path: the
    container opens it (the cgroup allows it) and the journal records GPU 1 (source engine)."""
    gpu = node.gpus[1]
    bundle = gpu1_bundle(tmp_path, base_rootfs, node)
    assert "NVIDIA_" not in (bundle / "config.json").read_text()
    env = config_env(tmp_path, node)
    res = runc.run(bundle, unique_id("gpu1"), runtime=runtime, env=env)
    assert res.rc == 0, res.describe()
    assert re.search(rf"^c\S+ .* 195, +{gpu.minor} .*/dev/gpu1$", res.stdout, re.M), res.describe()
    assert "No such device or address" in res.stdout, res.describe()
    assert [(g["source"], g["gpus"]) for g in journal(env)] == [("engine", [gpu.uuid])]


def test_a_gpu_under_a_second_linux_key_is_refused(
    runc: Runc, node: Any, base_rootfs: Path, tmp_path: Path, runtime: Path
) -> None:
    """runc itself creates /dev/gpu1 from a second top-level "Linux" key (Go's key matching);
    through nvshim the create fails in one line naming both keys, config.json unchanged."""
    bundle = gpu1_bundle(tmp_path, base_rootfs, node)
    spec = json.loads((bundle / "config.json").read_text())
    linux = spec.pop("linux")
    spec["linux"] = {k: v for k, v in linux.items() if k != "devices"}
    text = json.dumps(spec)[:-1] + ', "Linux": {"devices": ' + json.dumps(linux["devices"]) + "}}"
    (bundle / "config.json").write_text(text)
    plain = runc.run(bundle, unique_id("plain"), env={"PATH": PATH_ENV})
    # the premise: runc made GPU 1's node from the "Linux" key, and its cgroup allows it
    assert plain.rc == 0, plain.describe()
    assert re.search(rf"^c\S+ .* 195, +{node.gpus[1].minor} .*/dev/gpu1$", plain.stdout, re.M)
    assert "No such device or address" in plain.stdout, plain.describe()

    env = config_env(tmp_path, node)
    res = runc.run(bundle, unique_id("hidden"), runtime=runtime, env=env)
    assert res.rc != 0, res.describe()
    assert (
        f'{bundle}/config.json: keys "linux" and "Linux" of the top level both name "linux"'
    ) in res.stderr, res.describe()
    assert (bundle / "config.json").read_text() == text
    assert journal(env) == []


def test_a_privileged_gpu_container_starts_and_is_journaled(
    runc: Runc, node: Any, base_rootfs: Path, tmp_path: Path, runtime: Path
) -> None:
    """A privileged container (SYS_ADMIN, every device allowed, the host's GPU nodes listed)
    whose image says NVIDIA_VISIBLE_DEVICES=all starts under the DaemonSet's settings with
    the kubelet unreachable, sees its GPUs, and is journaled as source privileged."""
    env = config_env(
        tmp_path,
        node,
        **{
            "require-allocation": True,
            "verify-with": "kubelet",
            "kubelet-unreachable": "fail",
            "kubelet-socket": str(tmp_path / "no-kubelet.sock"),
            "kubelet-checkpoint": None,
            "allocation-sources": [
                "volume-mounts",
                "cdi-annotations",
                "envvar-uuids",
                "privileged",
            ],
        },
    )
    bundle = make_bundle(
        tmp_path / "p",
        base_rootfs,
        ["sh", "-c", "ls /dev; echo END"],
        env={"NVIDIA_VISIBLE_DEVICES": "all"},
        capabilities_add=["CAP_SYS_ADMIN"],
        devices=[char_device(f"/dev/nvidia{g.minor}", 195, g.minor) for g in node.gpus],
        annotations={
            "io.kubernetes.cri.sandbox-name": "dcgm",
            "io.kubernetes.cri.sandbox-namespace": "gpu-operator",
            "io.kubernetes.cri.sandbox-uid": "uid-dcgm",
            "io.kubernetes.cri.container-name": "exporter",
        },
    )
    spec = json.loads((bundle / "config.json").read_text())
    spec["linux"]["resources"]["devices"] = [{"allow": True, "access": "rwm"}]
    write_config(bundle, spec)
    res = runc.run(bundle, unique_id("priv"), runtime=runtime, env=env)
    assert res.rc == 0, res.describe()
    seen = res.stdout.split()
    assert all(f"nvidia{g.minor}" in seen for g in node.gpus), res.describe()
    records = journal(env)
    assert [(r["source"], r["verified"], sorted(r["gpus"])) for r in records] == [
        ("privileged", "privileged", sorted(g.uuid for g in node.gpus))
    ]
