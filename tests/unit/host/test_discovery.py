"""Discovery on simulated nodes: GPU order, minors, split roots, driver version, libraries."""

from __future__ import annotations

import os
import shutil

import pytest

from nvshim.errors import HostError
from nvshim.host.discovery import Host


@pytest.fixture(autouse=True)
def _root():
    if os.geteuid() != 0:
        pytest.skip("simulated nodes need root (mknod)")


def make(tmp_path, **kw):
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path / "node"), **kw)


def test_gpus_in_pci_order_with_shuffled_minors(tmp_path):
    """Index = PCI bus order (as NVML numbers GPUs); minors come from procfs, not from the index."""
    node = make(tmp_path, gpus=4, shuffle_minors=True)
    gpus = Host(node.root).gpus()
    assert [g.pci_bus_id for g in gpus] == sorted(g.pci_bus_id for g in gpus)
    assert [(g.index, g.minor, g.uuid) for g in gpus] == [
        (s.index, s.minor, s.uuid) for s in node.gpus
    ]
    assert [g.minor for g in gpus] != [0, 1, 2, 3]
    for g in gpus:
        assert g.node.path == f"/dev/nvidia{g.minor}" and (
            g.node.type,
            g.node.major,
            g.node.minor,
        ) == ("c", 195, g.minor)
        assert g.node.host_path == f"{node.root}/dev/nvidia{g.minor}"


def test_split_driver_and_dev_root(tmp_path):
    """Nodes are stat'ed under the dev root, files read under the driver root."""
    node = make(tmp_path, gpus=2, dev_root=str(tmp_path / "devroot"))
    host = Host(node.root, str(tmp_path / "devroot"))
    gpus = host.gpus()
    assert [g.node.host_path for g in gpus] == [
        f"{tmp_path}/devroot/dev/nvidia{g.minor}" for g in gpus
    ]
    ctl = {n.path: n for n in host.control_nodes(["compute"])}
    assert ctl["/dev/nvidiactl"].host_path == f"{tmp_path}/devroot/dev/nvidiactl"
    assert ctl["/dev/nvidia-uvm"].major == 510
    # with the dev root wrongly left at the driver root, the missing node is named
    with pytest.raises(
        HostError, match=r"has device minor 0 but .*/node/dev/nvidia0 does not exist"
    ):
        Host(node.root).gpus()


def test_driver_version_from_library_files_then_procfs(tmp_path):
    """The version is the files': libcuda.so.<version>, else libnvidia-ml.so.<version>, else
    the kernel module's from /proc/driver/nvidia/version."""
    node = make(tmp_path, gpus=1, driver_version="560.35.03")
    libdir = f"{node.root}/usr/lib/x86_64-linux-gnu"
    assert Host(node.root).driver_version() == "560.35.03"
    os.rename(f"{libdir}/libcuda.so.560.35.03", f"{libdir}/libcuda.so.560.35.99")
    assert Host(node.root).driver_version() == "560.35.99"
    for name in os.listdir(libdir):
        if name.startswith("libcuda."):
            os.unlink(f"{libdir}/{name}")
    assert Host(node.root).driver_version() == "560.35.03"  # libnvidia-ml's
    for name in os.listdir(libdir):
        if name.startswith("libnvidia-ml."):
            os.unlink(f"{libdir}/{name}")
    assert Host(node.root).driver_version() == "560.35.03"  # the module's
    os.unlink(f"{node.root}/proc/driver/nvidia/version")
    with pytest.raises(HostError, match="cannot find the NVIDIA driver version"):
        Host(node.root).driver_version()


def test_libraries_through_ldcache_and_fallback_dirs(tmp_path):
    """Libraries are found through the driver root's ld.so.cache, and without one in the standard dirs."""
    node = make(tmp_path, gpus=1)
    libs = {lib.base: lib for lib in Host(node.root).libraries(["compute", "utility"])}
    cuda = libs["libcuda"]
    assert cuda.container_path == "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
    assert cuda.host_path == node.root + cuda.container_path and cuda.soname == "libcuda.so.1"
    assert "libnvidia-ml" in libs and "libnvcuvid" not in libs  # video not asked for
    # move the libraries to a non-standard dir that only the cache knows
    src = f"{node.root}/usr/lib/x86_64-linux-gnu"
    dst = f"{node.root}/opt/nvidia/lib"
    shutil.move(src, dst)
    from nvshim.host.ldcache import build_ldcache

    entries = [(n, f"/opt/nvidia/lib/{n}") for n in os.listdir(dst) if ".so" in n]
    with open(f"{node.root}/etc/ld.so.cache", "wb") as fh:
        fh.write(build_ldcache(entries))
    moved = {lib.base: lib for lib in Host(node.root).libraries(["compute"])}
    assert moved["libcuda"].container_path == "/opt/nvidia/lib/libcuda.so.550.54.15"
    # no cache and a non-standard dir: not found (nothing guessed)
    os.unlink(f"{node.root}/etc/ld.so.cache")
    assert Host(node.root).libraries(["compute"]) == ()


def test_capabilities_pick_control_nodes(tmp_path):
    """nvidia-uvm only with compute, nvidia-modeset only with display, nvidiactl always."""
    node = make(tmp_path, gpus=1)
    host = Host(node.root)
    assert [n.path for n in host.control_nodes(["utility"])] == ["/dev/nvidiactl"]
    assert [n.path for n in host.control_nodes(["compute"])] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    assert "/dev/nvidia-modeset" in [n.path for n in host.control_nodes(["display"])]


def test_broken_information_file_is_named(tmp_path):
    """A procfs information file without UUID/minor/bus is one error naming the file."""
    node = make(tmp_path, gpus=1)
    bus = node.gpus[0].pci_bus_id
    info = f"{node.root}/proc/driver/nvidia/gpus/{bus}/information"
    with open(info, "w") as fh:
        fh.write("Model: \t\t something\n")
    with pytest.raises(HostError, match=f"{info}: cannot read GPU UUID"):
        Host(node.root).gpus()


def test_no_driver_means_no_gpus(tmp_path):
    """An empty driver root has no GPUs (procfs missing), and that is not an error by itself."""
    (tmp_path / "empty").mkdir()
    assert Host(str(tmp_path / "empty")).gpus() == ()
