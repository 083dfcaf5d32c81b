"""CDI end to end: podman consumes our generated spec, and the three ways of asking for GPU 1
(nvshim-runtime with an index, nvshim-runtime with a CDI name, podman with the CDI spec) give
the container the same device nodes and the same driver library mounts.

Every assertion is about what the process inside sees (stat of /dev/nvidia*, its mountinfo,
opening a node, writing a library), or about what the runtime leaves on disk.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

import pytest

from nvshim.cdi.schema import validate_spec
from nvshim.cdi.write import dump_spec
from nvshim.host.discovery import Host
from nvshim.node.cdigen import generate_spec
from nvshim.node.compile import compile_node
from tests.helpers.bundle import make_bundle
from tests.helpers.common import require_root, unique_id
from tests.helpers.node import write_nvshim_config
from tests.helpers.podman import Podman, installed_cdi_spec
from tests.helpers.runc import Runc

pytestmark = pytest.mark.e2e

VERSION = "550.54.15"
LIB = f"/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}"
PROBE = (
    # DEV <path> <major hex>:<minor hex> for every NVIDIA character device the container has
    'for n in /dev/nvidia* /dev/nvidia-caps/*; do [ -c "$n" ] && stat -c \'DEV %n %t:%T\' "$n"; done; '
    # LIB <mount point> for every driver library bind-mounted into the container
    "awk '$5 ~ /^\\/usr\\/lib\\/x86_64-linux-gnu\\/.*\\.so\\./ {print \"LIB \" $5}' /proc/self/mountinfo; "
    "for n in /dev/nvidia[0-9]*; do head -c0 $n 2>&1 | sed 's/^/OPEN: /'; done; "
    f"grep -c NVSHIM-SIM {LIB} >/dev/null && echo LIB-READABLE; "
    f"(echo x > {LIB}) 2>/dev/null && echo LIB-WRITABLE || echo LIB-READONLY"
)
CONTROL = {
    "/dev/nvidiactl": (195, 255),
    "/dev/nvidia-uvm": (510, 0),
    "/dev/nvidia-uvm-tools": (510, 1),
}
PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def seen_devices(output: str) -> Dict[str, Tuple[int, int]]:
    """{path: (major, minor)} from the probe's DEV lines."""
    out = {}
    for match in re.finditer(r"^DEV (\S+) ([0-9a-f]+):([0-9a-f]+)$", output, re.M):
        out[match.group(1)] = (int(match.group(2), 16), int(match.group(3), 16))
    return out


def seen_libraries(output: str) -> Set[str]:
    """Library mount points from the probe's LIB lines."""
    return set(re.findall(r"^LIB (\S+)$", output, re.M))


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A simulated 2-GPU node whose minors are swapped (GPU 1 is /dev/nvidia0)."""
    require_root()
    from nvshim.sim.build import create_node

    sim = create_node(
        str(tmp_path_factory.mktemp("sim") / "node"),
        gpus=2,
        shuffle_minors=True,
        driver_version=VERSION,
    )
    assert sim.gpus[1].minor != 1, "shuffled minors must make index and minor differ"
    return sim


@pytest.fixture(scope="module")
def spec_text(node: Any) -> str:
    """The generated spec for the node (YAML), hook run by the venv that runs these tests."""
    from nvshim.runtime.hookargs import hook_command

    spec = generate_spec(Host(node.root), hook_command=hook_command())
    assert validate_spec(spec) == []
    return dump_spec(spec, "yaml")


@pytest.fixture
def cdi_env(tmp_path: Path, node: Any, spec_text: str) -> Dict[str, str]:
    """nvshim-runtime env: config with the node as driver root and a private cdi-spec-dir
    holding the generated spec."""
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / "nvidia.yaml").write_text(spec_text)
    cfg = write_nvshim_config(
        tmp_path / "cfg",
        {
            "driver-root": node.root,
            "runtimes": ["runc"],
            "cdi-spec-dirs": [str(spec_dir)],
        },
    )
    compile_node(str(cfg))
    return {"NVSHIM_CONFIG": str(cfg), "PATH": PATH_ENV}


def expected_gpu1(node: Any) -> Dict[str, Tuple[int, int]]:
    minor = node.gpus[1].minor
    return {f"/dev/nvidia{minor}": (195, minor), **CONTROL}


def test_podman_consumes_generated_spec(
    podman: Podman, node: Any, spec_text: str, rootfs: Path
) -> None:
    """podman 4.3.1 with --device nvidia.com/gpu=1 from our spec shows GPU 1's node (by its
    minor) and the control nodes only, opens the GPU with ENXIO (cgroup rule present), and
    mounts the driver libraries read-only."""
    with installed_cdi_spec(spec_text, f"nvshim-e2e-{unique_id()}.yaml"):
        res = podman.podman_run(rootfs, ["sh", "-c", PROBE], devices=["nvidia.com/gpu=1"])
    assert res.rc == 0, res.describe()
    minor = node.gpus[1].minor
    assert seen_devices(res.stdout) == expected_gpu1(node), res.describe()
    assert f"OPEN: head: /dev/nvidia{minor}: No such device or address" in res.stdout, (
        res.describe()
    )
    assert "Operation not permitted" not in res.stdout
    assert "LIB-READABLE" in res.stdout and "LIB-READONLY" in res.stdout, res.describe()
    assert LIB in seen_libraries(res.stdout)


def test_runtime_index_runtime_cdi_and_podman_agree(
    podman: Podman,
    runc: Runc,
    node: Any,
    spec_text: str,
    rootfs: Path,
    tmp_path: Path,
    cdi_env: Dict[str, str],
    nvshim_runtime_bin: str,
) -> None:
    """NVIDIA_VISIBLE_DEVICES=1 and =nvidia.com/gpu=1 through nvshim-runtime, and podman with
    the generated spec, give the same device nodes (major:minor) and library mounts."""
    results = {}
    for label, value in (("index", "1"), ("cdi-name", "nvidia.com/gpu=1")):
        bundle = make_bundle(
            tmp_path / label, rootfs, ["sh", "-c", PROBE], env=[f"NVIDIA_VISIBLE_DEVICES={value}"]
        )
        res = runc.run_detached(
            bundle, unique_id(), runtime=nvshim_runtime_bin, env=cdi_env
        ).check()
        results[label] = res
    with installed_cdi_spec(spec_text, f"nvshim-e2e-{unique_id()}.yaml"):
        res = podman.podman_run(rootfs, ["sh", "-c", PROBE], devices=["nvidia.com/gpu=1"])
    assert res.rc == 0, res.describe()
    results["podman"] = res

    devices = {label: seen_devices(r.stdout) for label, r in results.items()}
    libraries = {label: seen_libraries(r.stdout) for label, r in results.items()}
    assert devices["index"] == expected_gpu1(node), results["index"].describe()
    assert devices["cdi-name"] == devices["index"], results["cdi-name"].describe()
    assert devices["podman"] == devices["index"], results["podman"].describe()
    assert LIB in libraries["index"]
    assert all(p.endswith(f".so.{VERSION}") for p in libraries["index"])
    assert libraries["cdi-name"] == libraries["index"]
    assert libraries["podman"] == libraries["index"]
    for label, r in results.items():
        assert "LIB-READONLY" in r.stdout, (label, r.describe())


def test_unknown_cdi_name_fails_and_keeps_bytes(
    runc: Runc,
    rootfs: Path,
    tmp_path: Path,
    cdi_env: Dict[str, str],
    nvshim_runtime_bin: str,
) -> None:
    """NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=9 fails create with exit 1, one error naming the
    device, the spec directories searched and the config that named them, and config.json
    byte-identical."""
    bundle = make_bundle(
        tmp_path / "b", rootfs, ["true"], env=["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=9"]
    )
    spec = bundle / "config.json"
    before = spec.read_bytes()
    spec_dir = str(tmp_path / "cdi")
    res = runc.create(
        bundle, unique_id(), runtime=nvshim_runtime_bin, env=cdi_env, log=tmp_path / "log.json"
    )
    assert res.rc == 1, res.describe()
    assert spec.read_bytes() == before
    assert len(res.log_errors) == 1, res.describe()
    for text in (res.log_errors[0], res.stderr):
        assert "nvidia.com/gpu=9" in text and spec_dir in text, res.describe()
        assert f"(config {cdi_env['NVSHIM_CONFIG']})" in text, res.describe()
    assert "Traceback" not in res.stderr


def test_cdi_annotation_selects_device(
    runc: Runc,
    node: Any,
    rootfs: Path,
    tmp_path: Path,
    cdi_env: Dict[str, str],
    nvshim_runtime_bin: str,
) -> None:
    """A cdi.k8s.io/ annotation naming nvidia.com/gpu=0 gives exactly GPU 0's node."""
    bundle = make_bundle(
        tmp_path / "b",
        rootfs,
        ["sh", "-c", PROBE],
        annotations={"cdi.k8s.io/test": "nvidia.com/gpu=0"},
    )
    res = runc.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=cdi_env).check()
    minor = node.gpus[0].minor
    assert seen_devices(res.stdout) == {f"/dev/nvidia{minor}": (195, minor), **CONTROL}, (
        res.describe()
    )
    assert LIB in seen_libraries(res.stdout)


def test_fifo_and_device_in_spec_dir_do_not_hang_create(
    runc: Runc,
    node: Any,
    rootfs: Path,
    tmp_path: Path,
    cdi_env: Dict[str, str],
    nvshim_runtime_bin: str,
) -> None:
    """A FIFO named *.yaml and a *.json symlink to /dev/zero in a spec dir are skipped as
    problems, not read: reading them blocked create forever (the FIFO) or never ended
    (/dev/zero). The index is stale once they appear, so create rescans the directory."""
    spec_dir = tmp_path / "cdi"
    os.mkfifo(spec_dir / "00-fifo.yaml")
    os.symlink("/dev/zero", spec_dir / "01-zero.json")
    bundle = make_bundle(
        tmp_path / "b",
        rootfs,
        ["sh", "-c", PROBE],
        annotations={"cdi.k8s.io/test": "nvidia.com/gpu=0"},
    )
    res = runc.run_detached(
        bundle, unique_id(), runtime=nvshim_runtime_bin, env=cdi_env, timeout=30
    ).check()
    minor = node.gpus[0].minor
    assert seen_devices(res.stdout) == {f"/dev/nvidia{minor}": (195, minor), **CONTROL}, (
        res.describe()
    )


OLD_VERSION = "535.104.05"


def _stale_spec(kind: str, node: Any, spec_text: str, tmp_path: Path) -> Tuple[str, str]:
    """(spec text, device to ask for) of a spec that no longer describes ``node``:
    ``driver``: made when the node ran driver 535 (its libraries are still on disk, under
    another root); ``gpus``: the node's own spec plus a GPU 7 whose /dev/nvidia7 it lacks."""
    import yaml

    from nvshim.runtime.hookargs import hook_command
    from nvshim.sim.build import create_node

    if kind == "driver":
        old = create_node(str(tmp_path / "old-node"), gpus=2, driver_version=OLD_VERSION)
        return dump_spec(generate_spec(Host(old.root), hook_command=hook_command()), "yaml"), "0"
    doc = yaml.safe_load(spec_text)
    doc["devices"].append(
        {
            "name": "7",
            "containerEdits": {
                "deviceNodes": [
                    {
                        "path": "/dev/nvidia7",
                        "hostPath": f"{node.root}/dev/nvidia7",
                        "type": "c",
                        "major": 195,
                        "minor": 7,
                    }
                ]
            },
        }
    )
    return dump_spec(doc, "yaml"), "7"


def _stale_env(tmp_path: Path, node: Any, text: str, policy: str) -> Dict[str, str]:
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / "nvidia.yaml").write_text(text)
    cfg = write_nvshim_config(
        tmp_path / "cfg",
        {
            "driver-root": node.root,
            "runtimes": ["runc"],
            "cdi-spec-dirs": [str(spec_dir)],
            "stale-cdi-spec": policy,
        },
    )
    compile_node(str(cfg))
    return {"NVSHIM_CONFIG": str(cfg), "PATH": PATH_ENV}


def _warnings(res: Any) -> List[str]:
    return [str(x.get("msg")) for x in res.log_lines if x.get("level") == "warning"]


@pytest.mark.parametrize("kind", ["driver", "gpus"])
def test_create_from_a_stale_spec_warns_in_the_log(
    runc: Runc,
    node: Any,
    spec_text: str,
    rootfs: Path,
    tmp_path: Path,
    nvshim_runtime_bin: str,
    kind: str,
) -> None:
    """A create that injects from a spec made for another driver (libcuda.so.535…) or naming a
    GPU node the node lacks (/dev/nvidia7) writes one warning line to runc's --log naming
    the spec and why, and the container is still created (stale-cdi-spec: warn, the default);
    ``nvshim inspect`` shows the same line among its warnings and notes."""
    from nvshim.config import load_config
    from nvshim.node.inspection import plan_summary
    from nvshim.runtime.create import plan_create

    text, device = _stale_spec(kind, node, spec_text, tmp_path)
    env = _stale_env(tmp_path, node, text, "warn")
    bundle = make_bundle(
        tmp_path / "b", rootfs, ["true"], env=[f"NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu={device}"]
    )
    config = load_config(env["NVSHIM_CONFIG"])
    inspected = plan_summary(plan_create(str(bundle), config), config)
    cid = unique_id()
    res = runc.create(bundle, cid, runtime=nvshim_runtime_bin, env=env, log=tmp_path / "log.json")
    assert res.rc == 0, res.describe()
    assert runc.state(cid, env=env).json()["status"] == "created"
    why = (
        f"it mounts libcuda.so.{OLD_VERSION}, the node's driver is {VERSION}"
        if kind == "driver"
        else f"{node.root}/dev/nvidia7 does not exist"
    )
    assert _warnings(res) == [
        f"nvshim: CDI spec {tmp_path}/cdi/nvidia.yaml does not match this node ({why}): "
        f"regenerate it with nvshim cdi generate --output {tmp_path}/cdi/nvidia.yaml; "
        "injected anyway (stale-cdi-spec: warn)"
    ], res.describe()
    assert res.log_errors == [] and res.stdout == ""
    line = _warnings(res)[0][len("nvshim: ") :]
    assert inspected["warnings"] == [line] and line in inspected["notes"]


@pytest.mark.parametrize("kind", ["driver", "gpus"])
def test_create_from_a_stale_spec_is_refused_when_configured(
    runc: Runc,
    node: Any,
    spec_text: str,
    rootfs: Path,
    tmp_path: Path,
    nvshim_runtime_bin: str,
    kind: str,
) -> None:
    """Under stale-cdi-spec: refuse the same create exits 1 with one line (stderr and --log)
    naming the spec and the setting, and config.json stays byte-identical."""
    text, device = _stale_spec(kind, node, spec_text, tmp_path)
    env = _stale_env(tmp_path, node, text, "refuse")
    bundle = make_bundle(
        tmp_path / "b", rootfs, ["true"], env=[f"NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu={device}"]
    )
    before = (bundle / "config.json").read_bytes()
    res = runc.create(
        bundle, unique_id(), runtime=nvshim_runtime_bin, env=env, log=tmp_path / "log.json"
    )
    lines = [res.refusal()]
    assert (bundle / "config.json").read_bytes() == before
    assert lines[0].startswith(
        f"nvshim: CDI spec {tmp_path}/cdi/nvidia.yaml does not match this node ("
    )
    assert lines[0].endswith("(stale-cdi-spec: refuse)"), lines
    assert _warnings(res) == []


def test_create_from_a_current_spec_warns_nothing(
    runc: Runc,
    rootfs: Path,
    tmp_path: Path,
    cdi_env: Dict[str, str],
    nvshim_runtime_bin: str,
) -> None:
    """The node's own spec (every GPU, the driver's libraries, own-versioned ones too) gives no
    stale-spec warning."""
    bundle = make_bundle(
        tmp_path / "b", rootfs, ["true"], env=["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all"]
    )
    res = runc.create(
        bundle, unique_id(), runtime=nvshim_runtime_bin, env=cdi_env, log=tmp_path / "log.json"
    )
    assert res.rc == 0, res.describe()
    assert _warnings(res) == [] and res.log_errors == [], res.describe()
