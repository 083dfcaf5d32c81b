"""A CDI spec made for another driver is found by any of its driver files, not only by
libcuda/libnvidia-ml: every NVIDIA library named for a driver version, a library folder
mounted whole whose libcuda/libnvidia-ml links name another version, the CUDA compat hook's
``--host-driver-version``. The same rule judges what the engine injected itself."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List

import pytest

from nvshim.cdi import index as cdiindex
from nvshim.cdi.registry import load_registry
from nvshim.cdi.stale import driver_version_of, stale_reasons
from nvshim.config import Config
from nvshim.edits import Hook, Mount
from nvshim.errors import CdiError
from nvshim.host.discovery import Host
from nvshim.runtime.cdiedits import inject_cdi

OLD, NEW = "535.104.05", "550.54.15"
LIB = "/usr/lib/x86_64-linux-gnu"


@pytest.mark.parametrize(
    ("name", "version"),
    [
        (f"libcuda.so.{OLD}", OLD),
        (f"libnvidia-ptxjitcompiler.so.{OLD}", OLD),
        (f"libnvidia-gpucomp.so.{NEW}", NEW),
        (f"libGLX_nvidia.so.{OLD}", OLD),
        (f"libvdpau_nvidia.so.{OLD}", OLD),
        (f"libnvcuvid.so.{OLD}", OLD),
        (f"libcudadebugger.so.{OLD}", OLD),
        ("libcuda.so.550.54", "550.54"),
        ("libcuda.so.1", ""),
        ("libcuda.so", ""),
        ("libnvidia-egl-wayland.so.1.1.13", ""),  # versioned on its own
        ("libnvidia-nvvm70.so.4", ""),
        ("libnvidia-allocator.so.1", ""),
        ("libfoo.so.535.104.05", ""),  # not NVIDIA's
        ("nvidia-smi", ""),
    ],
)
def test_driver_version_of_a_file_name(name: str, version: str) -> None:
    """Which file names carry the driver's version: NVIDIA's driver libraries named
    <lib>.so.<driver version>; links, own-versioned libraries and others' carry none."""
    assert driver_version_of(name) == version


def mounts(*paths: str) -> List[Mount]:
    return [Mount(p, p) for p in paths]


def test_a_spec_without_libcuda_or_nvml_is_stale_by_its_other_libraries() -> None:
    """A spec mounting only libnvidia-ptxjitcompiler.so.<old> (no libcuda, no
    libnvidia-ml) was made for the old driver."""
    found = stale_reasons(
        mounts(f"{LIB}/libcuda.so.1", f"{LIB}/libnvidia-ptxjitcompiler.so.{OLD}"), (), NEW
    )
    assert [r for r, _ in found] == [
        f"it mounts libnvidia-ptxjitcompiler.so.{OLD}, the node's driver is {NEW}"
    ]
    assert stale_reasons(mounts(f"{LIB}/libnvidia-ptxjitcompiler.so.{NEW}"), (), NEW) == []


def old_folder(tmp_path: Path, version: str) -> Path:
    folder = tmp_path / f"nvidia-{version.split('.')[0]}"
    folder.mkdir()
    for lib in ("libcuda", "libnvidia-ml"):
        (folder / f"{lib}.so.{version}").write_bytes(b"")
        os.symlink(f"{lib}.so.{version}", folder / f"{lib}.so.1")
    return folder


def test_a_library_folder_mounted_whole_is_judged_by_its_driver_links(tmp_path: Path) -> None:
    """A folder mount whose libcuda.so.1 (or libnvidia-ml.so.1) names another driver's file
    is stale; the node's own folder is not."""
    folder = old_folder(tmp_path, OLD)
    found = stale_reasons(mounts(str(folder)), (), NEW)
    assert found == [
        (
            f"it mounts {folder} whole, whose libcuda.so.1 is libcuda.so.{OLD}, "
            f"the node's driver is {NEW}",
            str(folder),
        )
    ]
    (tmp_path / "current").mkdir()
    current = old_folder(tmp_path / "current", NEW)
    assert stale_reasons(mounts(str(current)), (), NEW) == []


def test_the_compat_hooks_host_driver_version_is_checked() -> None:
    """A hook that says --host-driver-version <old> (nvshim's) or =<old> (NVIDIA's) was
    written for the old driver."""
    nvshim = Hook(
        "createContainer", "/usr/bin/nvshim", ("nvshim", "hook", "--host-driver-version", OLD)
    )
    nvidia = Hook(
        "createContainer",
        "/usr/bin/nvidia-cdi-hook",
        ("nvidia-cdi-hook", "enable-cuda-compat", f"--host-driver-version={OLD}"),
    )
    for hook in (nvshim, nvidia):
        assert [r for r, _ in stale_reasons((), (hook,), NEW)] == [
            f"its hook says --host-driver-version {OLD}, the node's driver is {NEW}"
        ]
        assert stale_reasons((), (hook,), OLD) == []


def write_spec(tmp_path: Path, doc: Dict[str, Any]) -> str:
    (tmp_path / "cdi").mkdir(exist_ok=True)
    path = tmp_path / "cdi" / "nvidia.json"
    path.write_text(json.dumps(doc))
    return str(path)


def driver_root(tmp_path: Path, version: str) -> str:
    root = tmp_path / "root"
    proc = root / "proc" / "driver" / "nvidia"
    proc.mkdir(parents=True)
    (proc / "version").write_text(
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Tue Mar 5\n"
    )
    return str(root)


@pytest.mark.parametrize("shape", ["other-libraries", "folder", "hook"])
def test_refuse_fails_the_create_for_each_shape_of_stale_spec(tmp_path: Path, shape: str) -> None:
    """stale-cdi-spec: refuse fails the create, naming the spec and the reason, for a spec
    without libcuda/libnvidia-ml mounts, one mounting the old library folder whole, and one
    whose hook names the old driver; warn injects it with the same line."""
    lib = tmp_path / f"libnvidia-ptxjitcompiler.so.{OLD}"
    lib.write_bytes(b"")
    edits: Dict[str, Any] = {
        "other-libraries": {"mounts": [{"hostPath": str(lib), "containerPath": f"{LIB}/x"}]},
        "folder": {
            "mounts": [
                {"hostPath": str(old_folder(tmp_path, OLD)), "containerPath": "/usr/lib/nvidia"}
            ]
        },
        "hook": {
            "hooks": [
                {
                    "hookName": "createContainer",
                    "path": "/bin/true",
                    "args": ["true", f"--host-driver-version={OLD}"],
                }
            ]
        },
    }[shape]
    path = write_spec(
        tmp_path,
        {
            "cdiVersion": "0.5.0",
            "kind": "nvidia.com/gpu",
            "containerEdits": edits,
            "devices": [{"name": "0", "containerEdits": {"env": ["A=1"]}}],
        },
    )
    root = driver_root(tmp_path, NEW)
    config = Config(
        driver_root=root,
        cdi_spec_dirs=(str(tmp_path / "cdi"),),
        source=str(tmp_path / "config.yaml"),
        stale_cdi_spec="refuse",
    )
    with pytest.raises(CdiError) as err:
        inject_cdi(["nvidia.com/gpu=0"], config, ("compute",), Host(root))
    assert str(err.value).startswith(f"CDI spec {path} does not match this node (")
    assert str(err.value).endswith(
        f"the node's driver is {NEW}): regenerate it with nvshim "
        f"cdi generate --output {path} (stale-cdi-spec: refuse)"
    )
    warned = Config(
        driver_root=root,
        cdi_spec_dirs=(str(tmp_path / "cdi"),),
        source=str(tmp_path / "config.yaml"),
    )
    got = inject_cdi(["nvidia.com/gpu=0"], warned, ("compute",), Host(root))
    assert len(got.warnings) == 1 and got.warnings[0].endswith("(stale-cdi-spec: warn)")


def test_stale_specs_keeps_its_libcuda_line(tmp_path: Path) -> None:
    """The libcuda/libnvidia-ml line reads as before the rule grew."""
    write_spec(
        tmp_path,
        {
            "cdiVersion": "0.5.0",
            "kind": "nvidia.com/gpu",
            "containerEdits": {
                "mounts": [{"hostPath": f"{LIB}/libcuda.so.{OLD}", "containerPath": "/l"}]
            },
            "devices": [{"name": "0", "containerEdits": {"env": ["A=1"]}}],
        },
    )
    reg = load_registry([str(tmp_path / "cdi")])
    assert (
        cdiindex.stale_specs(reg, ["nvidia.com/gpu=0"], NEW)[0]
        .split(" (", 1)[1]
        .startswith(f"it mounts libcuda.so.{OLD}, the node's driver is {NEW})")
    )
