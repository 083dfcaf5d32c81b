"""The simulated GPU node: device nodes, procfs files, driver libraries, nvidia-smi, MIG."""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from nvshim.errors import HostError, UsageError
from nvshim.host.compat32 import is_i386_elf
from nvshim.host.elf import build_shared_object, read_soname
from nvshim.host.ldcache import FLAG_ELF_LIBC6, FLAG_X8664_LIBC6, read_ldcache
from nvshim.sim.build import (
    CAPS_MAJOR,
    NVIDIA_MAJOR,
    SIM_LIBRARIES,
    UVM_MAJOR,
    SimNode,
    create_node,
    cuda_for_driver,
    libraries_for_driver,
    load_node,
    mig_cap_minor,
)
from nvshim.sim.model import LIB32_DIR, SIM_LIBRARIES32
from tests.helpers.commands import nvshim_cli

LIB_DIR = "usr/lib/x86_64-linux-gnu"
VERSION = "550.54.15"
LDCONFIG = shutil.which("ldconfig") or "/sbin/ldconfig"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="creating a node needs root (mknod)")


def char_node(path: Path) -> tuple:
    """(major, minor, permission bits) of a character device, failing if it is not one."""
    st = os.lstat(path)
    assert stat.S_ISCHR(st.st_mode), f"{path} is not a character device"
    return os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode)


def smi(node: SimNode, *args: str, shell: str = "sh", dev: str | None = None):
    """Run the node's nvidia-smi with the given shell, looking for nodes under ``dev``."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "NVSHIM_SIM_DEV": dev or f"{node.dev_root}/dev",
    }
    cmd = [shell] if shell == "sh" else [shell, "sh"]
    return subprocess.run(
        cmd + [f"{node.root}/usr/bin/nvidia-smi", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def parse_information(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        match = re.match(r"^([A-Za-z ]+):[ \t]+(.*)$", line)
        assert match, f"line not in the driver's 'Key: <tabs> value' format: {line!r}"
        out[match.group(1).strip()] = match.group(2)
    return out


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    if os.geteuid() != 0:
        pytest.skip("creating a node needs root (mknod)")
    return create_node(str(tmp_path / "node"), gpus=4, shuffle_minors=True, mig=True, seed=3)


# -- device nodes ------------------------------------------------------------------------


@needs_root
def test_device_nodes_have_the_driver_numbers(node: SimNode) -> None:
    """Each GPU gets char 195:minor, plus nvidiactl 195:255, modeset 195:254, uvm 510:0/1, all 0666."""
    dev = Path(node.dev_root) / "dev"
    for gpu in node.gpus:
        assert char_node(dev / f"nvidia{gpu.minor}") == (NVIDIA_MAJOR, gpu.minor, 0o666)
    assert char_node(dev / "nvidiactl") == (NVIDIA_MAJOR, 255, 0o666)
    assert char_node(dev / "nvidia-modeset") == (NVIDIA_MAJOR, 254, 0o666)
    assert char_node(dev / "nvidia-uvm") == (UVM_MAJOR, 0, 0o666)
    assert char_node(dev / "nvidia-uvm-tools") == (UVM_MAJOR, 1, 0o666)


@needs_root
def test_dev_root_takes_the_device_nodes(tmp_path: Path) -> None:
    """With dev_root the nodes go to <dev_root>/dev and none to <root>/dev."""
    made = create_node(str(tmp_path / "root"), gpus=1, dev_root=str(tmp_path / "devroot"))
    assert made.dev_root == str(tmp_path / "devroot")
    assert char_node(tmp_path / "devroot/dev/nvidia0")[:2] == (NVIDIA_MAJOR, 0)
    assert not (tmp_path / "root/dev").exists()


@needs_root
def test_existing_node_in_dev_root_is_not_replaced(tmp_path: Path) -> None:
    """A dev_root that already holds /dev/nvidia0 is refused with the path named."""
    (tmp_path / "devroot/dev").mkdir(parents=True)
    (tmp_path / "devroot/dev/nvidia0").write_text("")
    with pytest.raises(HostError, match="nvidia0 already exists"):
        create_node(str(tmp_path / "root"), gpus=1, dev_root=str(tmp_path / "devroot"))


# -- GPU identity ------------------------------------------------------------------------


@needs_root
@pytest.mark.parametrize("gpus", [2, 3, 4, 8])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_shuffled_minors_are_a_non_identity_permutation(
    tmp_path: Path, gpus: int, seed: int
) -> None:
    """shuffle_minors gives a permutation of 0..n-1 that is never the identity; PCI ids ascend."""
    made = create_node(str(tmp_path / "n"), gpus=gpus, shuffle_minors=True, seed=seed)
    minors = [g.minor for g in made.gpus]
    assert sorted(minors) == list(range(gpus)) and minors != list(range(gpus))
    buses = [g.pci_bus_id for g in made.gpus]
    assert buses == sorted(buses) and len(set(buses)) == gpus
    assert [g.index for g in made.gpus] == list(range(gpus))


@needs_root
def test_unshuffled_minors_equal_indices(tmp_path: Path) -> None:
    """Without shuffle_minors, GPU i has device minor i."""
    made = create_node(str(tmp_path / "n"), gpus=3)
    assert [g.minor for g in made.gpus] == [0, 1, 2]


@needs_root
def test_same_seed_same_node(tmp_path: Path) -> None:
    """Two nodes built with the same arguments are identical apart from their paths."""
    a = create_node(str(tmp_path / "a"), gpus=3, shuffle_minors=True, mig=True, seed=5)
    b = create_node(str(tmp_path / "b"), gpus=3, shuffle_minors=True, mig=True, seed=5)
    c = create_node(str(tmp_path / "c"), gpus=3, shuffle_minors=True, mig=True, seed=6)
    assert a.gpus == b.gpus
    assert {g.uuid for g in a.gpus}.isdisjoint(g.uuid for g in c.gpus)
    assert (tmp_path / "a/nvshim-sim.json").read_text().replace("/a", "/X") == (
        tmp_path / "b/nvshim-sim.json"
    ).read_text().replace("/b", "/X")


@needs_root
def test_ids_have_the_real_formats(node: SimNode) -> None:
    """UUIDs are lower-case GPU-/MIG-prefixed 8-4-4-4-12 hex, PCI ids are 0000:bb:00.0."""
    uuid = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    for gpu in node.gpus:
        assert re.fullmatch("GPU-" + uuid, gpu.uuid)
        assert re.fullmatch(r"0000:[0-9a-f]{2}:00\.0", gpu.pci_bus_id)
        for m in gpu.mig:
            assert re.fullmatch("MIG-" + uuid, m.uuid)


# -- procfs ------------------------------------------------------------------------------


@needs_root
def test_information_files_parse(node: SimNode) -> None:
    """Each gpus/<bus>/information has the driver's keys with this GPU's model, UUID, bus and minor."""
    for gpu in node.gpus:
        path = Path(node.root) / "proc/driver/nvidia/gpus" / gpu.pci_bus_id / "information"
        info = parse_information(path.read_text())
        assert list(info) == [
            "Model", "IRQ", "GPU UUID", "Video BIOS", "Bus Type", "DMA Size", "DMA Mask",
            "Bus Location", "Device Minor", "GPU Firmware", "GPU Excluded",
        ]  # fmt: skip
        assert info["Model"] == gpu.model
        assert info["GPU UUID"] == gpu.uuid
        assert info["Bus Location"] == gpu.pci_bus_id
        assert info["Device Minor"] == str(gpu.minor)
        assert info["GPU Excluded"] == "No"
    listed = sorted(os.listdir(Path(node.root) / "proc/driver/nvidia/gpus"))
    assert listed == [g.pci_bus_id for g in node.gpus]


@needs_root
def test_version_file_has_the_driver_format(node: SimNode) -> None:
    """proc/driver/nvidia/version starts with the NVRM line carrying the driver version."""
    text = (Path(node.root) / "proc/driver/nvidia/version").read_text()
    first, second = text.splitlines()[:2]
    assert re.match(r"^NVRM version: NVIDIA UNIX x86_64 Kernel Module  550\.54\.15  \S", first)
    assert second.startswith("GCC version:")


# -- libraries ---------------------------------------------------------------------------


@needs_root
def test_libraries_have_their_sonames(node: SimNode) -> None:
    """Every driver library is an ELF with the right DT_SONAME and a SONAME link to it."""
    libdir = Path(node.root) / LIB_DIR
    for base, suffix, _dev in SIM_LIBRARIES:
        path = libdir / f"{base}.so.{VERSION}"
        soname = f"{base}{suffix}" if suffix else path.name
        assert read_soname(str(path)) == soname
        assert (libdir / soname).resolve() == path.resolve()
        assert f"NVSHIM-SIM {path.name} {VERSION}".encode() in path.read_bytes()
    assert os.readlink(libdir / "libcuda.so") == "libcuda.so.1"
    assert os.readlink(libdir / "libnvidia-ml.so") == "libnvidia-ml.so.1"
    assert (
        read_soname(str(libdir / f"vdpau/libvdpau_nvidia.so.{VERSION}")) == "libvdpau_nvidia.so.1"
    )


@needs_root
def test_dlopen_loads_a_simulated_library(node: SimNode) -> None:
    """glibc's dlopen (ctypes.CDLL) loads the simulated libcuda and libnvidia-ml."""
    for name in ("libcuda.so.1", "libnvidia-ml.so.1"):
        assert ctypes.CDLL(str(Path(node.root) / LIB_DIR / name))._handle


@needs_root
def test_ld_so_cache_lists_the_links(node: SimNode) -> None:
    """etc/ld.so.cache maps every SONAME link and .so link to its /usr/lib/x86_64-linux-gnu
    path (x86-64 entries), and each 32-bit SONAME to /usr/lib/i386-linux-gnu (i386 entries)."""
    entries = read_ldcache(str(Path(node.root) / "etc/ld.so.cache"))
    got = {e.key: e.value for e in entries if e.flags == FLAG_X8664_LIBC6}
    got32 = {e.key: e.value for e in entries if e.flags == FLAG_ELF_LIBC6}
    assert len(got) + len(got32) == len(entries)
    want, want32 = {}, {}
    for base, suffix, dev in SIM_LIBRARIES:
        soname = f"{base}{suffix}" if suffix else f"{base}.so.{VERSION}"
        want[soname] = f"/{LIB_DIR}/{soname}"
        if dev:
            want[f"{base}.so"] = f"/{LIB_DIR}/{base}.so"
        if base in SIM_LIBRARIES32:
            want32[soname] = f"/{LIB32_DIR}/{soname}"
    assert got == want
    assert got32 == want32 and "libcuda.so.1" in got32
    for key, value in [*got.items(), *got32.items()]:
        assert read_soname(str(Path(node.root) / value.lstrip("/"))) in (key, key + ".1")
    for value in got32.values():
        assert is_i386_elf(str(Path(node.root) / value.lstrip("/"))), value


@needs_root
@pytest.mark.skipif(not os.path.exists(LDCONFIG), reason="no ldconfig binary")
def test_real_ldconfig_agrees_with_the_sim_cache(node: SimNode, tmp_path: Path) -> None:
    """glibc's ldconfig over the 64-bit and 32-bit library dirs finds the same names, with
    the same flags, in the same order, as our cache."""
    libdirs = (f"{node.root}/{LIB_DIR}", f"{node.root}/{LIB32_DIR}")
    conf = tmp_path / "ld.so.conf"
    conf.write_text("".join(d + "\n" for d in libdirs))
    cache = tmp_path / "ld.so.cache"
    subprocess.run([LDCONFIG, "-X", "-f", str(conf), "-C", str(cache)], check=True)
    theirs = [
        (e.key, e.value[len(node.root) :], e.flags)
        for e in read_ldcache(str(cache))
        if e.value.startswith(tuple(d + "/" for d in libdirs))
    ]
    ours = [(e.key, e.value, e.flags) for e in read_ldcache(f"{node.root}/etc/ld.so.cache")]
    assert theirs == ours
    assert any(flags == FLAG_ELF_LIBC6 for _, _, flags in theirs)


def test_read_soname_of_host_libc_and_non_elf(tmp_path: Path) -> None:
    """read_soname reads a real library's SONAME and gives None for non-ELF or SONAME-less files."""
    libc = "/lib/x86_64-linux-gnu/libc.so.6"
    if os.path.exists(libc):
        assert read_soname(libc) == "libc.so.6"
    (tmp_path / "text").write_text("hello")
    assert read_soname(str(tmp_path / "text")) is None
    assert read_soname(sys.executable) is None  # an executable has no SONAME
    with pytest.raises(HostError, match="cannot read ELF file"):
        read_soname(str(tmp_path / "missing"))


def test_built_object_loads_without_root(tmp_path: Path) -> None:
    """build_shared_object writes an ELF that dlopen loads and whose DT_NEEDED ld.so follows."""
    dep = tmp_path / "libdep.so.1"
    dep.write_bytes(build_shared_object("libdep.so.1"))
    top = tmp_path / "libtop.so.2"
    top.write_bytes(build_shared_object("libtop.so.2", "marker text", needed=[str(dep)]))
    assert read_soname(str(top)) == "libtop.so.2"
    assert ctypes.CDLL(str(top))._handle
    assert b"marker text\0" in top.read_bytes()


# -- binaries ----------------------------------------------------------------------------


@needs_root
def test_nvidia_smi_lists_all_gpus_in_pci_order(node: SimNode) -> None:
    """nvidia-smi -L prints each visible GPU as 'GPU i: model (UUID: …)' in PCI order, MIG lines under GPU 0."""
    result = smi(node, "-L")
    assert result.returncode == 0, result.stderr
    want: list[str] = []
    for gpu in node.gpus:
        want.append(f"GPU {gpu.index}: {gpu.model} (UUID: {gpu.uuid})")
        for j, m in enumerate(gpu.mig):
            want.append(f"  MIG {m.profile:<11} Device {j:2d}: (UUID: {m.uuid})")
    assert result.stdout.splitlines() == want


@needs_root
def test_nvidia_smi_numbers_only_visible_gpus(node: SimNode, tmp_path: Path) -> None:
    """With some /dev/nvidia<minor> nodes missing, nvidia-smi renumbers the rest 0.. by PCI order."""
    dev = tmp_path / "dev"
    dev.mkdir()
    keep = [node.gpus[1], node.gpus[3]]
    for name in ["nvidiactl"] + [f"nvidia{g.minor}" for g in keep]:
        os.symlink(f"{node.dev_root}/dev/{name}", dev / name)
    result = smi(node, "-L", dev=str(dev))
    assert result.stdout.splitlines() == [
        f"GPU {i}: {g.model} (UUID: {g.uuid})" for i, g in enumerate(keep)
    ]


@needs_root
def test_nvidia_smi_without_driver_or_devices(node: SimNode, tmp_path: Path) -> None:
    """No nvidiactl: exit 9 with the driver message; nvidiactl but no GPU nodes: exit 6."""
    empty = tmp_path / "empty"
    empty.mkdir()
    result = smi(node, "-L", dev=str(empty))
    assert result.returncode == 9 and "couldn't communicate with the NVIDIA driver" in result.stdout
    os.symlink(f"{node.dev_root}/dev/nvidiactl", empty / "nvidiactl")
    result = smi(node, "-L", dev=str(empty))
    assert result.returncode == 6 and result.stdout.strip() == "No devices were found"


@needs_root
def test_nvidia_smi_table_is_labelled(node: SimNode) -> None:
    """nvidia-smi with no arguments says it is simulated and shows the driver and CUDA versions."""
    result = smi(node)
    assert result.returncode == 0
    assert "SIMULATED nvidia-smi (nvshim sim)" in result.stdout
    assert "Driver Version: 550.54.15" in result.stdout and "CUDA Version: 12.4" in result.stdout
    for gpu in node.gpus:
        assert gpu.uuid in result.stdout


@needs_root
@pytest.mark.skipif(not shutil.which("busybox"), reason="busybox is not installed")
def test_nvidia_smi_runs_under_busybox_sh(node: SimNode) -> None:
    """The script needs only busybox ash: -L gives the same output as with the host sh."""
    assert smi(node, "-L", shell="busybox").stdout == smi(node, "-L").stdout
    assert smi(node, "-L", shell="busybox").returncode == 0


@needs_root
def test_driver_files_and_stubs(node: SimNode) -> None:
    """Stub binaries are labelled executables; firmware, the persistenced socket and MPS dir exist."""
    root = Path(node.root)
    for name in ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced",
                 "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"):  # fmt: skip
        path = root / "usr/bin" / name
        assert os.access(path, os.X_OK) and "SIMULATED" in path.read_text()
        assert path.read_text().startswith("#!/bin/sh\n")
    for name in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        assert (root / f"lib/firmware/nvidia/{VERSION}/{name}").is_file()
    assert stat.S_ISSOCK(os.lstat(root / "run/nvidia-persistenced/socket").st_mode)
    assert (root / "var/run/nvidia-persistenced/socket").exists()
    assert (root / "tmp/nvidia-mps").is_dir()


@needs_root
def test_socket_under_a_deep_root(tmp_path: Path) -> None:
    """A root path longer than a UNIX socket address still gets its persistenced socket."""
    deep = tmp_path / ("d" * 120) / "node"
    made = create_node(str(deep), gpus=1)
    assert stat.S_ISSOCK(os.lstat(Path(made.root) / "run/nvidia-persistenced/socket").st_mode)


@needs_root
def test_no_driver_files_builds_only_the_kernel_side(tmp_path: Path) -> None:
    """driver_files=False writes /dev, /proc and the JSON records but no library, ld.so file,
    program or firmware: real user space goes under the same root."""
    made = create_node(
        str(tmp_path / "n"), gpus=2, mig=True, driver_version="535.161.08", driver_files=False
    )
    root = Path(made.root)
    assert char_node(root / f"dev/nvidia{made.gpus[0].minor}")[:2] == (NVIDIA_MAJOR, 0)
    assert "nvidia-frontend" in (root / "proc/devices").read_text()
    assert "Kernel Module  535.161.08" in (root / "proc/driver/nvidia/version").read_text()
    assert len(list((root / "proc/driver/nvidia/gpus").iterdir())) == 2
    assert (root / "proc/driver/nvidia-caps/mig-minors").is_file()
    assert (root / "nvml-facts.json").is_file() and load_node(made.root) == made
    assert not made.driver_files
    files = {str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir()}
    user_space = {f for f in files if f.startswith(("usr/", "lib/", "etc/ld.so", "sbin/", "bin/"))}
    assert user_space == set() and not (root / "usr").exists() and not (root / "lib").exists()
    assert not any(".so" in f or "gsp_" in f or "nvidia-smi" in f for f in files)


@needs_root
def test_sim_create_no_driver_files_from_the_cli(tmp_path: Path) -> None:
    """`nvshim sim create --no-driver-files` says "kernel side only" and writes no library."""
    from click.testing import CliRunner

    from nvshim.cli.main import sim

    result = CliRunner().invoke(sim, ["create", str(tmp_path / "n"), "--no-driver-files"])
    assert result.exit_code == 0, result.output
    assert "kernel side only" in result.output
    assert (tmp_path / "n/proc/driver/nvidia/version").is_file()
    assert not (tmp_path / "n" / LIB_DIR).exists() and not (tmp_path / "n/usr/bin").exists()


def test_sim_create_help_names_no_driver_files() -> None:
    """`nvshim sim create --help` documents --no-driver-files and what it leaves out."""
    from click.testing import CliRunner

    from nvshim.cli.main import sim

    result = CliRunner().invoke(sim, ["create", "--help"], terminal_width=200)
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "--no-driver-files" in text
    assert "no driver libraries, ld.so.cache or ld.so.conf, programs or firmware" in text


# -- driver branches ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "driver, cuda",
    [
        ("470.256.02", "11.4"),
        ("525.147.05", "12.0"),
        ("535.104.05", "12.2"),
        ("535.247.01", "12.2"),
        ("545.23.08", "12.3"),
        ("550.54.15", "12.4"),
        ("552.12", "12.4"),  # between known branches: the nearest lower one
        ("570.133.20", "12.8"),
        ("580.65.06", "13.0"),
        ("595.1", "13.0"),  # above the newest known branch: the newest
        ("418.226.00", "11.4"),  # below the oldest known branch: the oldest
    ],
)
def test_cuda_version_follows_the_driver_branch(driver: str, cuda: str) -> None:
    """The newest CUDA a simulated driver supports is its branch's, not 12.4 for every one."""
    assert cuda_for_driver(driver) == cuda


@pytest.mark.parametrize(
    "driver, has_gpucomp",
    [
        ("470.256.02", False),
        ("535.104.05", False),
        ("545.23.08", True),
        ("550.54.15", True),
        ("580.65.06", True),
    ],
)
def test_gpucomp_ships_from_branch_545(driver: str, has_gpucomp: bool) -> None:
    """libnvidia-gpucomp is in the library set from branch 545 on; the rest is in every branch."""
    names = [base for base, _suffix, _dev in libraries_for_driver(driver)]
    assert ("libnvidia-gpucomp" in names) is has_gpucomp
    assert set(names) | {"libnvidia-gpucomp"} == {base for base, _s, _d in SIM_LIBRARIES}


@needs_root
def test_a_535_node_says_cuda_12_2_and_has_no_gpucomp(tmp_path: Path) -> None:
    """A 535 node's nvml-facts, nvidia-smi and metadata say CUDA 12.2; no gpucomp file or cache
    entry exists, while a 550 node has both."""
    old = create_node(str(tmp_path / "old"), gpus=1, driver_version="535.104.05")
    assert old.cuda_version == "12.2" and load_node(old.root).cuda_version == "12.2"
    facts = json.loads(Path(old.nvml_facts).read_text())
    assert facts["cuda_version"] == "12.2"
    table = smi(old).stdout
    assert "Driver Version: 535.104.05" in table and "CUDA Version: 12.2" in table
    assert "CUDA Version        : 12.2" in smi(old, "--version").stdout
    libdir = Path(old.root) / LIB_DIR
    assert not list(libdir.glob("libnvidia-gpucomp*"))
    assert (libdir / "libcuda.so.535.104.05").is_file()
    cached = {e.key for e in read_ldcache(str(Path(old.root) / "etc/ld.so.cache"))}
    assert not any("gpucomp" in key for key in cached)
    new = create_node(str(tmp_path / "new"), gpus=1, driver_version="550.54.15")
    assert (Path(new.root) / LIB_DIR / "libnvidia-gpucomp.so.550.54.15").is_file()
    assert json.loads(Path(new.nvml_facts).read_text())["cuda_version"] == "12.4"


@needs_root
def test_explicit_cuda_version_overrides_the_branch(tmp_path: Path) -> None:
    """create_node(cuda_version=...) wins over the branch's version."""
    made = create_node(
        str(tmp_path / "n"), gpus=1, driver_version="535.104.05", cuda_version="12.3"
    )
    assert json.loads(Path(made.nvml_facts).read_text())["cuda_version"] == "12.3"
    assert "CUDA Version: 12.3" in smi(made).stdout


# -- MIG ---------------------------------------------------------------------------------


@needs_root
def test_mig_minors_file_has_the_driver_layout(node: SimNode) -> None:
    """mig-minors lists config 1, monitor 2, then gi0..14 and ci0..7 per GPU with rising minors."""
    lines = (Path(node.root) / "proc/driver/nvidia-caps/mig-minors").read_text().splitlines()
    assert lines[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    assert "gpu1/gi0/access 138" in lines  # 135 capabilities per GPU, as the driver numbers them
    assert len(lines) == 2 + len(node.gpus) * 15 * 9
    minors = [int(line.split()[1]) for line in lines]
    assert minors == list(range(1, len(lines) + 1))
    for line in lines[2:]:
        assert re.fullmatch(r"gpu\d+/gi\d+(/ci\d)?/access \d+", line)


@needs_root
def test_mig_devices_have_capability_files_and_nodes(node: SimNode) -> None:
    """GPU 0 has GIs 1 and 2 with CI 0; their access files and nvidia-cap nodes agree on minors."""
    gpu0 = node.gpus[0]
    assert [(m.gi, m.ci) for m in gpu0.mig] == [(1, 0), (2, 0)]
    assert all(not g.mig for g in node.gpus[1:])
    caps = Path(node.root) / f"proc/driver/nvidia/capabilities/gpu{gpu0.minor}/mig"
    dev = Path(node.dev_root) / "dev/nvidia-caps"
    for m in gpu0.mig:
        assert m.gi_cap_minor == mig_cap_minor(gpu0.minor, m.gi)
        assert m.ci_cap_minor == mig_cap_minor(gpu0.minor, m.gi, m.ci)
        for path, minor in ((caps / f"gi{m.gi}/access", m.gi_cap_minor),
                            (caps / f"gi{m.gi}/ci{m.ci}/access", m.ci_cap_minor)):  # fmt: skip
            assert path.read_text() == (
                f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
            )
            assert char_node(dev / f"nvidia-cap{minor}") == (CAPS_MAJOR, minor, 0o444)
    assert char_node(dev / "nvidia-cap1")[:2] == (CAPS_MAJOR, 1)
    assert char_node(dev / "nvidia-cap2")[:2] == (CAPS_MAJOR, 2)


@needs_root
def test_no_mig_files_without_mig(tmp_path: Path) -> None:
    """A node made without mig has no mig-minors, capabilities or nvidia-caps nodes."""
    made = create_node(str(tmp_path / "n"), gpus=2)
    assert not (Path(made.root) / "proc/driver/nvidia-caps").exists()
    assert not (Path(made.root) / "dev/nvidia-caps").exists()
    assert all(not g.mig for g in made.gpus)


@needs_root
def test_sim_create_says_which_config_makes_its_mig_devices_visible(tmp_path: Path) -> None:
    """Issue 14: `nvshim sim create --mig` ends with the driver-root and nvml-facts lines to
    configure; with those, discovery names the MIG devices it printed. Without nvml-facts
    it cannot on a host with no driver loaded: nvshim asks the node's NVML only where one
    is (tests/unit/sim/test_libnvml.py runs it as on such a host)."""
    res = nvshim_cli("sim", "create", str(tmp_path / "n"), "--gpus", "2", "--mig")
    assert res.returncode == 0, res.stderr
    last = res.stdout.splitlines()[-1]
    root, facts = str(tmp_path / "n"), str(tmp_path / "n" / "nvml-facts.json")
    assert last == f"use it with config driver-root: {root} and nvml-facts: {facts}"
    from nvshim.host.discovery import Host

    printed = {line.split()[-2] for line in res.stdout.splitlines() if line.startswith("    MIG ")}
    assert (
        printed and {m.uuid for g in Host(root, nvml_facts=facts).gpus() for m in g.mig} == printed
    )
    assert [m for g in Host(root).gpus() for m in g.mig] == []


# -- metadata and arguments --------------------------------------------------------------


@needs_root
def test_metadata_reads_back_as_the_same_node(node: SimNode) -> None:
    """nvshim-sim.json holds what create_node returned; load_node rebuilds it exactly."""
    assert load_node(node.root) == node
    assert node.cuda_version == "12.4"
    assert {(g.arch, g.brand, g.compute_capability) for g in node.gpus} == {
        ("hopper", "nvidia", "9.0")
    }


@needs_root
def test_non_empty_root_is_refused(tmp_path: Path) -> None:
    """create_node refuses a root that has files and accepts an existing empty directory."""
    (tmp_path / "full").mkdir()
    (tmp_path / "full/x").write_text("")
    with pytest.raises(HostError, match="is not empty"):
        create_node(str(tmp_path / "full"))
    (tmp_path / "empty").mkdir()
    assert create_node(str(tmp_path / "empty"), gpus=1).gpus[0].minor == 0


@needs_root
def test_non_root_is_refused(tmp_path: Path) -> None:
    """Run as an unprivileged user, create_node fails with a HostError naming the need for root."""
    code = (
        "import sys; from nvshim.sim.build import create_node; from nvshim.errors import HostError\n"
        "try:\n    create_node(sys.argv[1])\nexcept HostError as e:\n    print(e)\n"
    )
    repo = str(Path(__file__).resolve().parents[3])
    target = tmp_path / "n"
    os.chmod(tmp_path, 0o777)
    try:
        result = subprocess.run(
            [sys.executable, "-c", code, str(target)],
            capture_output=True,
            text=True,
            user=65534,
            group=65534,
            cwd="/",
            env={"PYTHONPATH": repo, "PATH": "/usr/bin:/bin"},
            check=False,
        )
    except PermissionError as exc:  # an interpreter under /root (pyenv's): nobody cannot run it
        pytest.skip(f"nobody cannot run {sys.executable}: {exc}")
    if "Permission denied" in result.stderr:
        pytest.skip(f"nobody cannot read the interpreter or repo: {result.stderr.splitlines()[-1]}")
    assert "needs root" in result.stdout, result.stderr
    assert not target.exists()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"gpus": 1025}, "0-1024 GPUs"),
        ({"gpus": -1}, "0-1024 GPUs"),
        ({"driver_version": "../550"}, "driver version"),
        ({"cuda_version": "twelve"}, "cuda version"),
        ({"gpus": 0, "mig": True}, "--mig needs at least one GPU"),
        ({"model": "bad|name"}, "model"),
    ],
)
def test_bad_arguments_are_usage_errors(tmp_path: Path, kwargs: dict, message: str) -> None:
    """Out-of-range GPU counts, odd versions and unsafe model names are refused before writing."""
    with pytest.raises(UsageError, match=message):
        create_node(str(tmp_path / "n"), **kwargs)
    assert not (tmp_path / "n").exists()


@needs_root
def test_sim_creates_large_nodes_with_valid_minors_and_bus_ids(tmp_path: Path) -> None:
    """Issue 12 item 15: `nvshim sim create --gpus 256` builds a node discovery reads back: 256
    GPUs, distinct minors that skip nvidia-modeset (254) and nvidiactl (255), valid ascending PCI
    bus ids."""
    res = nvshim_cli("sim", "create", str(tmp_path / "n"), "--gpus", "256")
    assert res.returncode == 0, res.stderr
    from nvshim.host.discovery import Host

    gpus = Host(str(tmp_path / "n")).gpus()
    assert len(gpus) == 256
    minors = [g.minor for g in gpus]
    assert len(set(minors)) == 256 and not {254, 255} & set(minors)
    assert [g.index for g in gpus] == list(range(256))
    buses = [g.pci_bus_id for g in gpus]
    assert buses == sorted(buses) and all(len(b) == 12 for b in buses)
    assert nvshim_cli("sim", "create", str(tmp_path / "m"), "--gpus", "64", "--mig").returncode == 0
