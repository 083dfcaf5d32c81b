"""The EGL application profile and the DRM by-path links, end to end on a simulated node.

A graphics or display container granted GPUs gets
``/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf`` whose
``EGLVisibleDGPUDevices`` mask names exactly its ``/dev/nvidia<N>`` nodes (by minor: the
node's minors are shuffled so that index and minor differ), and
``/dev/dri/by-path/pci-<bus id>-{card,render}`` links to its DRM nodes. Both through
nvshim-runtime → runc (and crun): the runtime writes the profile before runc, or the hook
does it for a rootfs the runtime cannot write; the ``/dev`` links are always the hook's
(``/dev`` is runc's tmpfs). And from ``nvshim cdi generate``'s spec, through nvshim-runtime
with a CDI name and through podman using the spec directly. Assertions are what the
process inside sees.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, Tuple

import pytest

from nvshim.host.discovery import Host
from nvshim.node.cdigen import generate_spec
from nvshim.node.compile import compile_node
from nvshim.runtime.hookargs import hook_command
from tests.helpers.bundle import make_bundle, read_config
from tests.helpers.common import require_root, unique_id
from tests.helpers.node import make_mount_targets, read_only_bind, rootwork_by, write_nvshim_config

pytestmark = pytest.mark.e2e

PROFILE = "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: PROFILE <content>, or NO-PROFILE; LINK <link> <target> <major:minor hex of what it reaches>
PROBE = (
    f"if [ -e {PROFILE} ]; then printf 'PROFILE '; cat {PROFILE}; echo; "
    "else echo NO-PROFILE; fi; "
    'for l in /dev/dri/by-path/*; do [ -L "$l" ] && '
    'echo "LINK $l $(readlink $l) $(stat -L -c %t:%T $l)"; done; '
    "[ -e /dev/dri/by-path ] || echo NO-BY-PATH"
)


def expected_profile(*minors: int) -> str:
    """The reference's bytes for the GPUs of ``minors`` (the toolkit's hook writes these)."""
    mask = sum(1 << m for m in minors)
    return (
        '{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",'
        f'{mask:#x}]}}],"rules":[{{"pattern":[],"profile":"_container_"}}]}}'
    )


def seen_profile(output: str) -> str:
    m = re.search(r"^PROFILE (.*)$", output, re.M)
    return m.group(1) if m else ""


def seen_links(output: str) -> Dict[str, Tuple[str, Tuple[int, int]]]:
    """link → (target, (major, minor) of the node it reaches)."""
    return {
        m.group(1): (m.group(2), (int(m.group(3), 16), int(m.group(4), 16)))
        for m in re.finditer(r"^LINK (\S+) (\S+) ([0-9a-f]+):([0-9a-f]+)$", output, re.M)
    }


def expected_links(node: Any, *indexes: int) -> Dict[str, Tuple[str, Tuple[int, int]]]:
    """The by-path links of the GPUs at ``indexes`` (the simulator's card<i>, renderD<128+i>)."""
    out = {}
    for i in indexes:
        bus = node.gpus[i].pci_bus_id
        out[f"/dev/dri/by-path/pci-{bus}-card"] = (f"../card{i}", (226, i))
        out[f"/dev/dri/by-path/pci-{bus}-render"] = (f"../renderD{128 + i}", (226, 128 + i))
    return out


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A simulated 2-GPU node with nvidia-drm's nodes, minors shuffled (index ≠ minor)."""
    require_root()
    from nvshim.sim.build import create_node

    sim = create_node(str(tmp_path_factory.mktemp("sim") / "node"), gpus=2, shuffle_minors=True)
    assert sim.gpus[1].minor != 1
    return sim


def config_env(node: Any, tmp_path: Path, runtime: str = "runc", **more: Any) -> Dict[str, str]:
    cfg = write_nvshim_config(
        tmp_path / unique_id("cfg"),
        {
            "driver-root": node.root,
            "runtimes": [runtime],
            "debug-log": str(tmp_path / "debug.log"),
            **more,
        },
    )
    compile_node(str(cfg))
    return {"NVSHIM_CONFIG": str(cfg), "PATH": PATH}


def gpu_env(visible: str, caps: str) -> Dict[str, str]:
    return {"NVIDIA_VISIBLE_DEVICES": visible, "NVIDIA_DRIVER_CAPABILITIES": caps}


@pytest.fixture(params=["runc", "crun"])
def engine(request: pytest.FixtureRequest, crunw: Path) -> Tuple[Any, str]:
    """(driver, low-level runtime for nvshim's config) for runc and for crun."""
    if request.param == "runc":
        return request.getfixturevalue("runc"), "runc"
    return request.getfixturevalue("crun"), str(crunw)


@pytest.mark.parametrize("caps", ["graphics", "display", "compute,utility,graphics"])
def test_graphics_container_gets_a_profile_and_links_of_its_gpu_only(
    engine, node, rootfs, tmp_path, nvshim_runtime_bin, caps
):
    """GPU 1 (minor ≠ index) with graphics or display: the profile's mask has only GPU 1's
    minor bit, written by the runtime before runc, and /dev/dri/by-path has GPU 1's card and
    render links (resolving to 226:1 and 226:129) and not GPU 0's; the hook left in
    config.json makes only those /dev links."""
    driver, low = engine
    env = config_env(node, tmp_path, low)
    bundle = make_bundle(tmp_path / "b", rootfs, ["sh", "-c", PROBE], env=gpu_env("1", caps))
    res = driver.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
    assert seen_profile(res.stdout) == expected_profile(node.gpus[1].minor), res.describe()
    assert seen_links(res.stdout) == expected_links(node, 1), res.describe()
    assert rootwork_by(tmp_path / "debug.log") == ["runtime"]
    hooks = [
        h
        for h in read_config(bundle)["hooks"]["createContainer"]
        if any("nvshim.hook" in a for a in h["args"])
    ]
    assert len(hooks) == 1, hooks
    args = hooks[0]["args"]
    assert "--folder" not in args and "--link" not in args and "--egl-profile" not in args
    assert args.count("--dev-link") == 2, args


def test_two_gpus_give_both_bits_and_both_gpus_links(
    runc, node, rootfs, tmp_path, nvshim_runtime_bin
):
    """NVIDIA_VISIBLE_DEVICES=all with graphics: both minors' bits, all four links."""
    env = config_env(node, tmp_path)
    bundle = make_bundle(
        tmp_path / "b", rootfs, ["sh", "-c", PROBE], env=gpu_env("all", "graphics")
    )
    res = runc.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
    assert seen_profile(res.stdout) == expected_profile(*(g.minor for g in node.gpus)), (
        res.describe()
    )
    assert seen_links(res.stdout) == expected_links(node, 0, 1), res.describe()


def test_compute_container_gets_neither_profile_nor_links(
    runc, node, rootfs, tmp_path, nvshim_runtime_bin
):
    """compute,utility (the reference writes the profile for graphics and display only):
    no profile, no /dev/dri at all."""
    env = config_env(node, tmp_path)
    bundle = make_bundle(
        tmp_path / "b", rootfs, ["sh", "-c", PROBE], env=gpu_env("1", "compute,utility")
    )
    res = runc.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
    assert "NO-PROFILE" in res.stdout and "NO-BY-PATH" in res.stdout, res.describe()
    assert not (bundle / "rootfs" / PROFILE.lstrip("/")).exists()


def test_read_only_rootfs_gets_the_profile_from_the_hook(
    engine, node, rootfs, tmp_path, nvshim_runtime_bin
):
    """A rootfs the runtime cannot write: the hook writes the same profile, from the
    /dev/nvidia<N> nodes it finds in the container's /dev, and makes the links."""
    driver, low = engine
    env = config_env(node, tmp_path, low)
    bundle = make_bundle(tmp_path / "b", rootfs, ["sh", "-c", PROBE], env=gpu_env("1", "graphics"))
    make_mount_targets(bundle, env)
    (bundle / "rootfs" / PROFILE.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    with read_only_bind(bundle / "rootfs"):
        res = driver.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
    assert rootwork_by(tmp_path / "debug.log") == ["hook"]
    assert seen_profile(res.stdout) == expected_profile(node.gpus[1].minor), res.describe()
    assert seen_links(res.stdout) == expected_links(node, 1), res.describe()


@pytest.fixture
def cdi_env(tmp_path: Path, node: Any) -> Dict[str, str]:
    """nvshim-runtime's env with a private cdi-spec-dir holding ``nvshim cdi generate``'s
    spec for the node, generated with graphics."""
    spec = generate_spec(
        Host(node.root),
        capabilities=("compute", "utility", "graphics"),
        hook_command=hook_command(),
    )
    from nvshim.cdi.write import write_spec

    write_spec(str(tmp_path / "cdi" / "nvidia.yaml"), spec)
    return config_env(node, tmp_path, **{"cdi-spec-dirs": [str(tmp_path / "cdi")]})


def test_cdi_name_with_graphics_gets_its_gpus_profile_and_links(
    runc, node, rootfs, tmp_path, nvshim_runtime_bin, cdi_env
):
    """nvidia.com/gpu=1 from the generated spec, graphics: GPU 1's profile and links only
    (the spec's one hook carries every GPU's links; only those whose node the container got
    are made); compute,utility from the same spec: neither."""
    bundle = make_bundle(
        tmp_path / "b", rootfs, ["sh", "-c", PROBE], env=gpu_env("nvidia.com/gpu=1", "graphics")
    )
    res = runc.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=cdi_env).check()
    assert seen_profile(res.stdout) == expected_profile(node.gpus[1].minor), res.describe()
    assert seen_links(res.stdout) == expected_links(node, 1), res.describe()
    bundle = make_bundle(
        tmp_path / "c",
        rootfs,
        ["sh", "-c", PROBE],
        env=gpu_env("nvidia.com/gpu=1", "compute,utility"),
    )
    res = runc.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=cdi_env).check()
    assert "NO-PROFILE" in res.stdout and "NO-BY-PATH" in res.stdout, res.describe()


def test_podman_with_the_generated_spec_gets_profile_and_links(podman, node, rootfs):
    """podman using the generated spec directly (no nvshim-runtime): --device
    nvidia.com/gpu=1 gives GPU 1's profile and by-path links, made by the spec's hook."""
    from nvshim.cdi.write import dump_spec
    from tests.helpers.podman import installed_cdi_spec

    spec = generate_spec(
        Host(node.root),
        capabilities=("compute", "utility", "graphics"),
        hook_command=hook_command(),
    )
    with installed_cdi_spec(dump_spec(spec, "yaml"), f"nvshim-e2e-{unique_id()}.yaml"):
        res = podman.podman_run(rootfs, ["sh", "-c", PROBE], devices=["nvidia.com/gpu=1"])
    assert res.rc == 0, res.describe()
    assert seen_profile(res.stdout) == expected_profile(node.gpus[1].minor), res.describe()
    assert seen_links(res.stdout) == expected_links(node, 1), res.describe()
