"""ModifyDeviceFiles: 0 from a generated CDI spec used directly, with no nvshim-runtime.

``nvshim cdi generate`` gives the spec nvshim's params hook (nvshim/params_hook.py); podman
4.3.1 consumes the spec itself, and runc and crun run a config.json with the spec's edits
injected as containerd's CRI plugin does (tests/helpers/engineinject.py). This VM has no
NVIDIA driver, so the container's procfs has no ``/proc/driver/nvidia``: a createContainer
hook of the test, listed before nvshim's in the spec, mounts a tmpfs over the container's
``/proc/driver`` and writes a driver file saying ``ModifyDeviceFiles: 1`` (as in
test_devparams_e2e.py). The container's own ``cat`` is the assertion; the host's params are
the simulated node's.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import pytest

from nvshim.cdi.write import dump_spec
from nvshim.node.compile import compile_node
from tests.helpers.bundle import make_bundle, read_config
from tests.helpers.common import require_root, unique_id
from tests.helpers.engineinject import inject_like_engine
from tests.helpers.node import write_nvshim_config
from tests.helpers.podman import Podman, installed_cdi_spec

pytestmark = pytest.mark.e2e

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DRIVER_FILE = "FakeDriverFile: 1\nModifyDeviceFiles: 1\n"
#: The container's rootfs from the state on stdin and the bundle's config.json (podman's
#: --rootfs is absolute, a bundle's ``rootfs`` relative), then the fake driver file.
FAKE_DRIVER = (
    'b=$(sed -n \'s/.*"bundle" *: *"\\([^"]*\\)".*/\\1/p\'); '
    "r=$(tr -d '\\n' < \"$b/config.json\" "
    '| sed -n \'s/.*"root"[[:space:]]*:[[:space:]]*{[[:space:]]*"path"[[:space:]]*:'
    '[[:space:]]*"\\([^"]*\\)".*/\\1/p\'); '
    'case "$r" in /*) ;; *) r="$b/$r" ;; esac; '
    'mount -t tmpfs -o mode=755 tmpfs "$r/proc/driver" && mkdir "$r/proc/driver/nvidia" && '
    "printf '" + DRIVER_FILE.replace("\n", "\\n") + '\' > "$r/proc/driver/nvidia/params"'
)
FAKE_HOOK = {
    "hookName": "createContainer",
    "path": "/bin/sh",
    "args": ["sh", "-c", FAKE_DRIVER],
    "env": [f"PATH={PATH}"],
}
PROBE = (
    "cat /proc/driver/nvidia/params; "
    "if (echo x > /proc/driver/nvidia/params) 2>/dev/null; then echo WRITABLE; fi; "
    "grep -c nvshim-params /proc/self/mountinfo || true"
)


@pytest.fixture
def node(tmp_path: Path) -> Any:
    """A simulated 1-GPU node (its own: tests rewrite its params)."""
    require_root()
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path / "node"), gpus=1)


def cli_generate(nvshim_bin: str, cfg: Path, node: Any, *extra: str) -> str:
    """What ``nvshim cdi generate --format json`` prints for ``node`` under config ``cfg``."""
    res = subprocess.run(
        [nvshim_bin, "cdi", "generate", "--driver-root", node.root, "--format", "json", *extra],
        capture_output=True,
        text=True,
        env={**os.environ, "NVSHIM_CONFIG": str(cfg)},
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def generated(nvshim_bin: str, node: Any, tmp_path: Path, *extra: str) -> Dict[str, Any]:
    """``nvshim cdi generate`` for the node (as JSON), with the test's fake driver hook put
    before every other hook of the spec."""
    cfg = write_nvshim_config(
        tmp_path / f"cfg-{unique_id('c')}", {"driver-root": node.root, "runtimes": ["runc"]}
    )
    out = cli_generate(nvshim_bin, cfg, node, *extra)
    spec = json.loads(out)
    edits = spec["containerEdits"]
    edits["hooks"] = [FAKE_HOOK] + list(edits.get("hooks") or [])
    return spec


def host_params(node: Any) -> Path:
    return Path(node.root, "proc/driver/nvidia/params")


def zeroed(node: Any) -> str:
    return host_params(node).read_text().replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0")


def params_hooks(config: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The createContainer hooks of a config.json (or a spec's edits) that run nvshim's
    params hook."""
    hooks = config.get("hooks") or {}
    listed = hooks.get("createContainer", []) if isinstance(hooks, dict) else hooks
    return [h for h in listed if "nvshim.params_hook" in " ".join(h["args"])]


def engine_bundle(tmp_path: Path, rootfs: Path, spec: Dict[str, Any]) -> Path:
    """A bundle whose config.json has the spec's device 0 injected as containerd does."""
    bundle = make_bundle(tmp_path / unique_id("b"), rootfs, ["sh", "-c", PROBE])
    config = inject_like_engine(read_config(bundle), spec, ["0"])
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


def test_podman_with_the_generated_spec_sees_modify_device_files_0(
    podman: Podman, nvshim_bin: str, node: Any, rootfs: Path, tmp_path: Path
) -> None:
    """podman 4.3.1 with --device nvidia.com/gpu=0 from a generated spec: the container's
    /proc/driver/nvidia/params is the host's with ModifyDeviceFiles: 0, read-only."""
    spec = generated(nvshim_bin, node, tmp_path)
    assert spec["cdiVersion"] <= "0.5.0"
    with installed_cdi_spec(dump_spec(spec, "yaml"), f"nvshim-e2e-{unique_id()}.yaml"):
        res = podman.podman_run(rootfs, ["sh", "-c", PROBE], devices=["nvidia.com/gpu=0"])
    assert res.rc == 0, res.describe()
    assert res.stdout.startswith(zeroed(node)), res.describe()
    assert "WRITABLE" not in res.stdout, res.describe()


@pytest.fixture(params=["runc", "crun"])
def engine(request: pytest.FixtureRequest) -> Any:
    """runc and crun (crun makes a read-only rootfs read-only before the hooks run)."""
    return request.getfixturevalue(request.param)


def test_runc_and_crun_with_the_specs_edits_see_modify_device_files_0(
    engine: Any, nvshim_bin: str, node: Any, rootfs: Path, tmp_path: Path
) -> None:
    """The spec's edits injected as containerd's CRI does, run by plain runc and crun over a
    read-only rootfs: ModifyDeviceFiles: 0, read-only, one bind and no tmpfs left mounted,
    and nothing new in the image's /run (the reference's hook leaves a tmpfs there)."""
    bundle = engine_bundle(tmp_path, rootfs, generated(nvshim_bin, node, tmp_path))
    run = bundle / "rootfs" / "run"
    run.mkdir(exist_ok=True)
    res = engine.run_detached(bundle, unique_id()).check()
    got, _, mounts = res.stdout.rpartition(zeroed(node))
    assert got == "" and mounts.strip() == "1", res.describe()
    assert [p.name for p in run.iterdir()] == ["nvidia-persistenced"]  # the spec's mount


def test_host_saying_0_leaves_the_containers_file(
    runc: Any, nvshim_bin: str, node: Any, rootfs: Path, tmp_path: Path
) -> None:
    """When the host's params already say ModifyDeviceFiles: 0 the hook does nothing: the
    container reads its own (fake) driver's file."""
    spec = generated(nvshim_bin, node, tmp_path)
    host_params(node).write_text(zeroed(node))
    bundle = engine_bundle(tmp_path, rootfs, spec)
    assert len(params_hooks(read_config(bundle))) == 1
    res = runc.run_detached(bundle, unique_id()).check()
    assert res.stdout.startswith(DRIVER_FILE), res.describe()
    assert "WRITABLE" in res.stdout, res.describe()


def test_an_image_symlink_on_the_way_is_never_followed(
    runc: Any, nvshim_bin: str, node: Any, rootfs: Path, tmp_path: Path
) -> None:
    """A container whose proc/driver/nvidia is a symlink (relative, to the image's own
    /etc) gets nothing bound: the hook follows no link, and the image's file is left as the
    test's driver wrote it."""
    spec = generated(nvshim_bin, node, tmp_path)
    edits = spec["containerEdits"]
    edits["hooks"][0] = {
        **FAKE_HOOK,
        "args": [
            "sh",
            "-c",
            FAKE_DRIVER.replace(
                'mkdir "$r/proc/driver/nvidia"', 'ln -s ../../etc "$r/proc/driver/nvidia"'
            ),
        ],
    }
    bundle = engine_bundle(tmp_path, rootfs, spec)
    assert len(params_hooks(read_config(bundle))) == 1
    res = runc.run_detached(bundle, unique_id()).check()
    assert res.stdout.startswith(DRIVER_FILE), res.describe()
    assert (bundle / "rootfs/etc/params").read_text() == DRIVER_FILE


def test_config_off_generates_no_params_hook(nvshim_bin: str, node: Any, tmp_path: Path) -> None:
    """disable-device-node-modification: false in the config: the generated spec has no
    params hook; the default config's has one."""
    cfg = write_nvshim_config(
        tmp_path / "cfg-off",
        {"driver-root": node.root, "runtimes": ["runc"], "disable-device-node-modification": False},
    )
    out = cli_generate(nvshim_bin, cfg, node)
    assert params_hooks(json.loads(out)["containerEdits"]) == []
    assert len(params_hooks(generated(nvshim_bin, node, tmp_path)["containerEdits"])) == 1


def test_nvshim_runtime_replaces_the_specs_hook_with_its_own(
    runc: Any, nvshim_runtime_bin: str, nvshim_bin: str, node: Any, rootfs: Path, tmp_path: Path
) -> None:
    """A config.json an engine injected the spec into, run through nvshim-runtime: the
    spec's params hook is replaced by the runtime's bundle copy (one hook, not two), and the
    container still reads ModifyDeviceFiles: 0."""
    cfg = write_nvshim_config(tmp_path / "cfg-rt", {"driver-root": node.root, "runtimes": ["runc"]})
    compile_node(str(cfg))
    bundle = engine_bundle(tmp_path, rootfs, generated(nvshim_bin, node, tmp_path))
    res = runc.run_detached(
        bundle,
        unique_id(),
        runtime=nvshim_runtime_bin,
        env={"NVSHIM_CONFIG": str(cfg), "PATH": PATH},
    ).check()
    assert res.stdout.startswith(zeroed(node)), res.describe()
    hooks = read_config(bundle)["hooks"]["createContainer"]
    args = [" ".join(h["args"]) for h in hooks]
    assert not any("nvshim.params_hook" in a for a in args), args
    assert sum("nvshim-params" in a for a in args) == 1, args
    assert (bundle / ".nvshim-nvidia-params").read_text() == zeroed(node)


def test_spec_hook_command_names_only_nvshims_install(
    nvshim_bin: str, node: Any, tmp_path: Path
) -> None:
    """The params hook runs nvshim's own interpreter (the one `nvshim` runs on) by absolute
    path with an explicit env; --hook-path makes it `PATH params-hook --params …`."""
    spec = generated(nvshim_bin, node, tmp_path)
    hook = next(
        h for h in spec["containerEdits"]["hooks"] if "nvshim.params_hook" in " ".join(h["args"])
    )
    shebang = Path(nvshim_bin).read_text().splitlines()[0]
    assert hook["path"] == shebang[2:].split()[0], (hook, shebang)
    assert hook["args"][-2:] == ["--params", str(host_params(node))]
    assert hook["env"] == ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"]
    other = generated(nvshim_bin, node, tmp_path, "--hook-path", "/opt/x/bin/nvshim")
    hooks = copy.deepcopy(other["containerEdits"]["hooks"])
    assert {
        "hookName": "createContainer",
        "path": "/opt/x/bin/nvshim",
        "args": ["/opt/x/bin/nvshim", "params-hook", "--params", str(host_params(node))],
        "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"],
    } in hooks


def test_runtime_cdi_name_uses_the_runtimes_hook_not_the_specs(
    runc: Any, nvshim_runtime_bin: str, nvshim_bin: str, node: Any, rootfs: Path, tmp_path: Path
) -> None:
    """NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0 through nvshim-runtime from a generated spec:
    the runtime leaves the spec's params hook out and adds its own, and the container reads
    ModifyDeviceFiles: 0."""
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / "nvidia.yaml").write_text(dump_spec(generated(nvshim_bin, node, tmp_path), "yaml"))
    cfg = write_nvshim_config(
        tmp_path / "cfg-cdi",
        {"driver-root": node.root, "runtimes": ["runc"], "cdi-spec-dirs": [str(spec_dir)]},
    )
    compile_node(str(cfg))
    bundle = make_bundle(
        tmp_path / "b", rootfs, ["sh", "-c", PROBE], env=["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0"]
    )
    res = runc.run_detached(
        bundle,
        unique_id(),
        runtime=nvshim_runtime_bin,
        env={"NVSHIM_CONFIG": str(cfg), "PATH": PATH},
    ).check()
    assert res.stdout.startswith(zeroed(node)), res.describe()
    config = read_config(bundle)
    assert params_hooks(config) == []
    args = [" ".join(h["args"]) for h in config["hooks"]["createContainer"]]
    assert sum("nvshim-params" in a for a in args) == 1, args
