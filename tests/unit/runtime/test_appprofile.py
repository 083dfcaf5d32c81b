"""The EGL application profile (nvshim.runtime.appprofile): the reference's bytes, the GPUs it
names (by minor, /dev/nvidia<N> character devices only), written inside the rootfs by the
runtime (from config.json's devices) or the hook (from the container's /dev), never through
an image's symlink to the host, and only for graphics and display."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Dict

import pytest

from nvshim.config import Config
from nvshim.edits import HOOK_ENV, DeviceNode, Edits, Hook, Mount
from nvshim.host import inroot
from nvshim.runtime.appprofile import (
    PROFILE,
    gpu_minors,
    minors_in_dev,
    profile_content,
    write_profile,
)
from nvshim.runtime.hookargs import build_hook_args, hook_command
from nvshim.runtime.rootwork import decide, prepare, work_from_hooks
from tests.helpers.hookworld import make_bundle, run_hook, runc_state

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod)")
#: What the toolkit's update-application-profile hook writes for /dev/nvidia1 (its Go format
#: string ``...0x%x...`` with mask 1<<1), byte for byte.
TOOLKIT_GPU1 = (
    b'{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",0x2]}],'
    b'"rules":[{"pattern":[],"profile":"_container_"}]}'
)


def test_content_is_the_references_bytes_with_one_bit_per_minor() -> None:
    """Bit N per /dev/nvidia<N>, hex as the reference writes it; no GPU: no content; a
    minor past 63 does not fit the mask and is left out (as the toolkit does)."""
    assert profile_content([1]) == TOOLKIT_GPU1
    assert b'"EGLVisibleDGPUDevices",0x8a]' in profile_content([7, 3, 1, 3])
    assert b'"EGLVisibleDGPUDevices",0x8000000000000001]' in profile_content([0, 63, 64])
    assert profile_content([]) == b"" and profile_content([64, 200]) == b""


def test_gpu_minors_are_the_nvidia_n_character_devices() -> None:
    """From config.json's linux.devices and from edits' device nodes: the minors of
    /dev/nvidia<N> char devices; control, UVM, caps, DRM and block nodes are not GPUs."""
    spec_devices = [
        {"path": "/dev/nvidia3", "type": "c", "major": 195, "minor": 3},
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
        {"path": "/dev/nvidia-uvm", "type": "c", "major": 510, "minor": 0},
        {"path": "/dev/nvidia-caps/nvidia-cap1", "type": "c", "major": 237, "minor": 1},
        {"path": "/dev/nvidia7", "type": "b", "major": 8, "minor": 7},
        {"path": "/dev/dri/card1", "type": "c", "major": 226, "minor": 1},
        {"path": "/dev/nvidia٣", "type": "c", "major": 195, "minor": 3},  # not ASCII digits
    ]
    nodes = [
        DeviceNode("/dev/nvidia0", type="c", major=195, minor=0),
        DeviceNode("/dev/nvidia5"),
    ]  # no minor filled in: its name's
    assert gpu_minors([*spec_devices, *nodes]) == (0, 3, 5)


def test_write_profile_stays_in_the_root_and_replaces_the_images_file(tmp_path: Path) -> None:
    """An image whose /etc/nvidia is an absolute symlink to a host folder gets the profile
    in its own tree (the host folder stays empty); an image's own 10-container.conf is
    replaced (as the toolkit's hook does); the file is 0444 and rewritten only on change."""
    rootfs = tmp_path / "rootfs"
    host = tmp_path / "host-etc-nvidia"
    host.mkdir()
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc/nvidia").symlink_to(str(host))
    with inroot.open_root(str(rootfs)) as root:
        assert write_profile(root, [1])
    assert list(host.iterdir()) == []
    written = rootfs / str(host).lstrip("/") / "nvidia-application-profiles-rc.d/10-container.conf"
    assert written.read_bytes() == TOOLKIT_GPU1
    assert stat.S_IMODE(written.stat().st_mode) == 0o444
    inode = written.stat().st_ino
    with inroot.open_root(str(rootfs)) as root:
        assert write_profile(root, [1])
        assert written.stat().st_ino == inode
        assert not write_profile(root, [])  # no GPU: nothing written, the file left
    written.chmod(0o644)
    written.write_text('{"rules":[]}')
    with inroot.open_root(str(rootfs)) as root:
        write_profile(root, [2])
    assert b"0x4]" in written.read_bytes()


@needs_root
def test_minors_in_dev_are_character_devices_only(tmp_path: Path) -> None:
    """The hook's view: nvidia<N> char devices in the container's /dev; a link named like
    one (even to a real GPU node) and a regular file are not GPUs."""
    rootfs = tmp_path / "rootfs"
    dev = rootfs / "dev"
    dev.mkdir(parents=True)
    os.mknod(dev / "nvidia2", 0o666 | stat.S_IFCHR, os.makedev(195, 2))
    os.mknod(dev / "nvidiactl", 0o666 | stat.S_IFCHR, os.makedev(195, 255))
    (dev / "nvidia5").symlink_to("nvidia2")
    (dev / "nvidia6").write_text("")
    with inroot.open_root(str(rootfs)) as root:
        assert minors_in_dev(root) == (2,)
    with inroot.open_root(str(tmp_path)) as root:  # no /dev at all
        assert minors_in_dev(root) == ()


@needs_root
def test_hook_writes_the_profile_of_the_containers_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """nvshim hook --egl-profile (the fallback, and a CDI spec's hook): the profile names the
    /dev/nvidia<N> the container has; without GPU nodes it writes nothing and succeeds."""
    bundle, rootfs = make_bundle(tmp_path)
    args = build_hook_args([], [], egl_profile=True)
    assert run_hook(monkeypatch, capsys, args, runc_state(bundle), rootfs) == (0, "")
    assert not (rootfs / PROFILE.lstrip("/")).exists()
    (rootfs / "dev").mkdir()
    os.mknod(rootfs / "dev/nvidia1", 0o666 | stat.S_IFCHR, os.makedev(195, 1))
    assert run_hook(monkeypatch, capsys, args, runc_state(bundle), rootfs) == (0, "")
    assert (rootfs / PROFILE.lstrip("/")).read_bytes() == TOOLKIT_GPU1


def _hook(**kwargs: Any) -> Hook:
    args = (*hook_command(), *build_hook_args(**kwargs))
    return Hook("createContainer", args[0], args, HOOK_ENV)


def test_the_runtime_plans_the_profile_from_config_jsons_gpus(tmp_path: Path) -> None:
    """work_from_hooks: the profile's GPUs are the edits' /dev/nvidia<N> nodes plus those
    config.json already lists (an engine's); no --egl-profile: no profile planned."""
    hook = _hook(links=[], folders=[], egl_profile=True)
    spec: Dict[str, Any] = {
        "linux": {"devices": [{"path": "/dev/nvidia4", "type": "c", "major": 195, "minor": 4}]}
    }
    work = work_from_hooks(
        [hook], [], devices=[DeviceNode("/dev/nvidia1", type="c", minor=1)], spec=spec
    )
    assert work is not None and work.gpu_minors == (1, 4)
    plain = work_from_hooks(
        [_hook(links=[], folders=[])], [], devices=[DeviceNode("/dev/nvidia1", type="c", minor=1)]
    )
    assert plain is not None and plain.gpu_minors is None
    rootfs = tmp_path / "bundle" / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    assert prepare(str(rootfs), work) == []
    assert b'"EGLVisibleDGPUDevices",0x12]' in (rootfs / PROFILE.lstrip("/")).read_bytes()


def test_a_mount_over_the_profile_folder_sends_the_work_to_the_hook(tmp_path: Path) -> None:
    """config.json mounting /etc/nvidia would hide a profile written before runc: decide()
    gives the work to the hook (which writes after the mounts)."""
    bundle, rootfs = make_bundle(tmp_path)
    work = work_from_hooks(
        [_hook(links=[], folders=[], egl_profile=True)],
        [],
        devices=[DeviceNode("/dev/nvidia0", type="c", minor=0)],
    )
    assert work is not None
    spec = {
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/etc/nvidia", "type": "tmpfs", "source": "tmpfs"}],
    }
    by, why = decide(spec, str(bundle), work)
    assert by == "hook" and "/etc/nvidia" in why, why
    by, _ = decide({"root": {"path": "rootfs"}, "mounts": []}, str(bundle), work)
    assert by == "runtime"


@needs_root
@pytest.mark.parametrize(
    "caps, profile",
    [("graphics", True), ("display", True), ("compute,utility", False), ("video", False)],
)
def test_only_graphics_and_display_ask_for_the_profile(
    tmp_path: Path, caps: str, profile: bool
) -> None:
    """As the reference (graphics, and display which implies it): the runtime's plan has a
    profile for GPU 1's minor with those capabilities, and none otherwise."""
    from nvshim.runtime.create import plan_create
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=2, shuffle_minors=True)
    bundle = tmp_path / "b"
    (bundle / "rootfs/etc").mkdir(parents=True)
    env = ["NVIDIA_VISIBLE_DEVICES=1", f"NVIDIA_DRIVER_CAPABILITIES={caps}"]
    (bundle / "config.json").write_text(
        json.dumps({"root": {"path": "rootfs"}, "process": {"env": env}, "mounts": []})
    )
    plan = plan_create(str(bundle), Config(driver_root=node.root))
    minors = plan.rootfs.work.gpu_minors if plan.rootfs.work is not None else None
    assert minors == ((node.gpus[1].minor,) if profile else None)


def test_restricting_a_cdi_hook_to_compute_drops_the_profile_and_dev_links() -> None:
    """A generated spec's hook carries --egl-profile and --dev-link; injected for
    compute,utility it keeps its libraries' work but neither of those."""
    from nvshim.runtime.cdiedits import restrict_to_capabilities
    from nvshim.runtime.hookargs import parse_graphics_args, parse_hook_args

    lib = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
    hook = _hook(
        links=[("libcuda.so.550.54.15", "/usr/lib/x86_64-linux-gnu/libcuda.so.1")],
        folders=["/usr/lib/x86_64-linux-gnu"],
        dev_links=[("../card0", "/dev/dri/by-path/pci-0000:01:00.0-card")],
        egl_profile=True,
    )
    edits = Edits(mounts=(Mount(lib, lib),), hooks=(hook,))
    (kept,) = restrict_to_capabilities(edits, ["compute", "utility"]).hooks
    assert parse_graphics_args(kept.args) == ([], False)
    assert parse_hook_args(kept.args) == parse_hook_args(hook.args)
    (kept,) = restrict_to_capabilities(edits, ["compute", "graphics"]).hooks
    assert parse_graphics_args(kept.args) == parse_graphics_args(hook.args)
