"""A simulated GPU node: the driver root a real NVIDIA host has, as a directory tree.

:func:`create_node` writes, under ``root`` (device nodes under ``dev_root`` when given):

* ``dev/nvidia<minor>`` (char 195:minor) per GPU, ``dev/nvidiactl`` (195:255),
  ``dev/nvidia-modeset`` (195:254), ``dev/nvidia-uvm`` and ``dev/nvidia-uvm-tools``
  (510:0, 510:1), all mode 0666; with MIG, ``dev/nvidia-caps/nvidia-cap<m>`` (237:m).
* ``proc/devices`` (the character-device majors: ``nvidia-frontend`` 195, ``nvidia-uvm``
  510, ``nvidia-caps`` 237), ``proc/driver/nvidia/version``, ``params`` and
  ``gpus/<pci bus id>/information`` in the kernel module's formats; with MIG, ``proc/driver/nvidia-caps/mig-minors`` and
  ``proc/driver/nvidia/capabilities/...`` access files.
* the driver libraries in ``usr/lib/x86_64-linux-gnu/`` (``lib<X>.so.<version>``, each a
  tiny loadable ELF with the real SONAME and a ``NVSHIM-SIM <file> <version>`` marker
  string, plus SONAME links and ``.so`` links for libcuda/libnvidia-ml), ``vdpau/``,
  ``etc/ld.so.cache`` listing the links (new layout), ``etc/ld.so.conf``.
* ``usr/bin/nvidia-smi`` (a POSIX sh script labelled ``SIMULATED nvidia-smi (nvshim sim)``
  that lists the GPUs whose ``/dev/nvidia<minor>`` it can see; ``NVSHIM_SIM_DEV``
  overrides ``/dev``), labelled stubs of the other driver binaries, GSP firmware files,
  the ``run/nvidia-persistenced/socket`` UNIX socket, ``tmp/nvidia-mps``.
* ``nvml-facts.json``: what NVML would say and procfs does not (MIG UUIDs, CUDA version,
  compute capability, brand), in the format :class:`nvshim.host.nvml.NvmlFacts` defines.
  Production code reads it only when a config names it (``nvml-facts:
  <root>/nvml-facts.json``, :attr:`SimNode.nvml_facts`), as it would any such file.
* ``nvshim-sim.json``: the simulator's own record of what it made, for :func:`load_node`
  (never read by production code). Format 1::

    {
      "format": 1,
      "simulated": true,
      "generator": "nvshim sim",
      "seed": 0,
      "driver_version": "550.54.15",
      "cuda_version": "12.4",           # the newest CUDA this driver supports
      "dev_root": "/abs/path",          # where dev/ was made (informational)
      "gpus": [                         # index order = PCI bus id order (NVML's)
        {"index": 0, "minor": 0, "uuid": "GPU-…", "pci_bus_id": "0000:18:00.0",
         "model": "NVIDIA H100 80GB HBM3", "arch": "hopper", "brand": "nvidia",
         "compute_capability": "9.0", "mig_enabled": true,
         "mig": [{"gi": 1, "ci": 0, "uuid": "MIG-…", "profile": "3g.40gb",
                  "gi_cap_minor": 12, "ci_cap_minor": 13}]}
      ]
    }

PCI bus ids use the procfs form ``0000:18:00.0`` (4-digit domain, lower case); NVML's own
form is ``00000000:18:00.0``. The tree is deterministic for a given set of arguments; GPU
``i``'s UUID depends only on ``seed`` and ``i``. Creating it needs root (``mknod``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import socket
import stat
from collections.abc import Sequence
from typing import Any

from nvshim._record import dataclass
from nvshim.errors import HostError, UsageError
from nvshim.host.elf import build_shared_object
from nvshim.host.ldcache import build_ldcache
from nvshim.host.nvml import FACTS_FORMAT

__all__ = [
    "CAPS_MAJOR",
    "NVIDIA_MAJOR",
    "SIM_FILE",
    "NVML_FACTS_FILE",
    "SIM_LIBRARIES",
    "UVM_MAJOR",
    "SimGpu",
    "SimMig",
    "SimNode",
    "create_node",
    "load_node",
    "nvml_facts_document",
    "mig_cap_minor",
]

NVIDIA_MAJOR = 195
UVM_MAJOR = 510
CAPS_MAJOR = 237
# Majors of the extra device classes (dynamic on real hosts; fixed here, as /proc/devices says).
IMEX_MAJOR = 234
NVSWITCH_MAJOR = 236
NVIDIA_FS_MAJOR = 241
GDRDRV_MAJOR = 509
INFINIBAND_MAJOR = 231  # infiniband_verbs / infiniband_mad (fixed by the kernel)
MISC_MAJOR = 10
SIM_FILE = "nvshim-sim.json"
NVML_FACTS_FILE = "nvml-facts.json"
#: The NVIDIA driver handles at most 32 GPUs per node (NV_MAX_DEVICES); a simulated node
#: may have more, for scale tests (CDI specs and discovery at 64 or 256 GPUs).
DRIVER_MAX_GPUS = 32
MAX_GPUS = 1024
#: Minors of /dev/nvidia-modeset and /dev/nvidiactl: GPU minors skip them.
_RESERVED_MINORS = (254, 255)
LIB_DIR = "usr/lib/x86_64-linux-gnu"

#: (library base name, SONAME suffix or None when the SONAME is the versioned file name,
#: whether a ``.so`` development link exists)
SIM_LIBRARIES: tuple[tuple[str, str | None, bool], ...] = (
    ("libcuda", ".so.1", True),
    ("libcudadebugger", ".so.1", False),
    ("libnvidia-ml", ".so.1", True),
    ("libnvidia-cfg", ".so.1", False),
    ("libnvidia-ptxjitcompiler", ".so.1", False),
    ("libnvidia-nvvm", ".so.4", False),
    ("libnvidia-gpucomp", None, False),
    ("libnvidia-allocator", ".so.1", False),
    ("libnvidia-opencl", ".so.1", False),
    ("libnvidia-encode", ".so.1", False),
    ("libnvcuvid", ".so.1", False),
    ("libnvidia-opticalflow", ".so.1", False),
    ("libnvidia-eglcore", None, False),
    ("libnvidia-glcore", None, False),
    ("libnvidia-tls", None, False),
    ("libGLX_nvidia", ".so.0", False),
    ("libEGL_nvidia", ".so.0", False),
    ("libnvidia-ngx", ".so.1", False),
    ("libnvidia-fbc", ".so.1", False),
)
_BINARIES = (
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
# Plausible bus numbers of an 8-GPU server (ascending); more GPUs get a regular spread.
_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
# (model substring, arch, compute capability, brand); first match wins.
_MODELS = (
    ("B200", "blackwell", "10.0", "nvidia"),
    ("H100", "hopper", "9.0", "nvidia"),
    ("H200", "hopper", "9.0", "nvidia"),
    ("H800", "hopper", "9.0", "nvidia"),
    ("L40", "ada-lovelace", "8.9", "nvidia"),
    ("L4", "ada-lovelace", "8.9", "nvidia"),
    ("A100", "ampere", "8.0", "nvidia"),
    ("A30", "ampere", "8.0", "nvidia"),
    ("A10", "ampere", "8.6", "nvidia"),
    ("A40", "ampere", "8.6", "nvidia"),
    ("T4", "turing", "7.5", "tesla"),
    ("V100", "volta", "7.0", "tesla"),
)
_MIG_GIS = (1, 2)  # GPU instances made on GPU 0 with mig=True, one CI (0) each
_GI_SLOTS = 15  # the driver lists gi0..gi14 ...
_CI_SLOTS = 8  # ... and ci0..ci7 per GPU in mig-minors
_VERSION_RE = re.compile(r"^[0-9]+\.[0-9]+(\.[0-9]+)?$")
_CUDA_RE = re.compile(r"^[0-9]+\.[0-9]+$")


@dataclass(frozen=True)
class SimMig:
    """A MIG device (one compute instance) of a simulated GPU."""

    gpu_index: int
    gi: int
    ci: int
    uuid: str
    profile: str
    gi_cap_minor: int
    ci_cap_minor: int


@dataclass(frozen=True)
class SimGpu:
    """One simulated GPU; ``index`` is the NVML index (PCI order), ``minor`` the node's."""

    index: int
    minor: int
    uuid: str
    pci_bus_id: str
    model: str
    arch: str
    brand: str
    mig: tuple[SimMig, ...] = ()
    compute_capability: str = "9.0"


@dataclass(frozen=True)
class SimNode:
    """What :func:`create_node` made: absolute ``root`` and ``dev_root``, the GPUs."""

    root: str
    dev_root: str
    driver_version: str
    cuda_version: str
    gpus: tuple[SimGpu, ...]
    imex_channels: int = 0
    nvswitches: int = 0
    gds: bool = False
    mofed: bool = False
    gdrcopy: bool = False

    @property
    def nvml_facts(self) -> str:
        """The facts file this node's config names as ``nvml-facts`` (what NVML would say)."""
        return os.path.join(self.root, NVML_FACTS_FILE)


def mig_cap_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """The nvidia-cap minor of ``gpu<minor>/gi<gi>/access`` (or ``.../ci<ci>/access``).

    The driver numbers them in order after ``config`` (1) and ``monitor`` (2): per GPU
    minor, for each GI its access then its 8 CI accesses.
    """
    per_gi = 1 + _CI_SLOTS
    base = 3 + gpu_minor * _GI_SLOTS * per_gi + gi * per_gi
    return base if ci is None else base + 1 + ci


def _uuid(seed: int, *parts: object) -> str:
    digest = hashlib.sha256("/".join(["nvshim-sim", str(seed), *map(str, parts)]).encode())
    h = digest.hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _model_facts(model: str) -> tuple[str, str, str]:
    for needle, arch, cc, brand in _MODELS:
        if needle in model:
            return arch, cc, brand
    return "unknown", "0.0", "nvidia"


def _mig_profile(model: str) -> str:
    match = re.search(r"([0-9]+)\s*GB", model)
    memory = int(match.group(1)) if match else 80
    return f"3g.{memory // 2}gb"


def _minors(gpus: int, shuffle: bool, seed: int) -> list[int]:
    minors = [i if i < _RESERVED_MINORS[0] else i + len(_RESERVED_MINORS) for i in range(gpus)]
    if shuffle and gpus >= 2:
        random.Random(seed).shuffle(minors)
        if minors == sorted(minors):
            minors = minors[1:] + minors[:1]  # a shuffle may land on the identity
    return minors


def _plan(gpus: int, shuffle_minors: bool, mig: bool, model: str, seed: int) -> tuple[SimGpu, ...]:
    arch, cc, brand = _model_facts(model)
    minors = _minors(gpus, shuffle_minors, seed)
    if gpus <= len(_BUSES):
        pci = [f"0000:{bus:02x}:00.0" for bus in _BUSES]
    elif gpus <= 36:  # one GPU per bus, a regular spread below 0xff
        pci = [f"0000:{4 + 7 * i:02x}:00.0" for i in range(gpus)]
    else:  # large nodes: 32 device slots per bus, still ascending with the index
        pci = [f"0000:{4 + i // 32:02x}:{i % 32:02x}.0" for i in range(gpus)]
    out = []
    for index in range(gpus):
        migs: tuple[SimMig, ...] = ()
        if mig and index == 0:
            migs = tuple(
                SimMig(
                    gpu_index=index,
                    gi=gi,
                    ci=0,
                    uuid="MIG-" + _uuid(seed, "mig", index, gi, 0),
                    profile=_mig_profile(model),
                    gi_cap_minor=mig_cap_minor(minors[index], gi),
                    ci_cap_minor=mig_cap_minor(minors[index], gi, 0),
                )
                for gi in _MIG_GIS
            )
        out.append(
            SimGpu(
                index=index,
                minor=minors[index],
                uuid="GPU-" + _uuid(seed, "gpu", index),
                pci_bus_id=pci[index],
                model=model,
                arch=arch,
                brand=brand,
                mig=migs,
                compute_capability=cc,
            )
        )
    return tuple(out)


def _check_arguments(
    gpus: int, driver_version: str, cuda_version: str, mig: bool, model: str
) -> None:
    if not 0 <= gpus <= MAX_GPUS:
        raise UsageError(
            f"--gpus {gpus}: a simulated node has 0-{MAX_GPUS} GPUs "
            f"(the real driver handles up to {DRIVER_MAX_GPUS})"
        )
    if not _VERSION_RE.match(driver_version):
        raise UsageError(
            f'--driver-version "{driver_version}": expected a driver version like 550.54.15'
        )
    if not _CUDA_RE.match(cuda_version):
        raise UsageError(f'cuda version "{cuda_version}": expected a version like 12.4')
    if mig and gpus == 0:
        raise UsageError("--mig needs at least one GPU: --gpus is 0")
    if not model or not model.isprintable() or any(c in model for c in "|'\\"):
        raise UsageError(f"model {model!r}: must be printable text without | ' or \\")


def _prepare_root(root: str) -> None:
    try:
        entries = os.listdir(root)
    except FileNotFoundError:
        entries = []
    except NotADirectoryError as exc:
        raise HostError(f"simulated node root {root} is not a directory") from exc
    except OSError as exc:
        raise HostError(f"cannot read simulated node root {root}: {exc.strerror}") from exc
    if entries:
        raise HostError(
            f"simulated node root {root} is not empty ({len(entries)} entries): "
            "give a new or empty directory"
        )


def create_node(
    root: str,
    gpus: int = 2,
    driver_version: str = "550.54.15",
    shuffle_minors: bool = False,
    mig: bool = False,
    dev_root: str | None = None,
    cuda_version: str = "12.4",
    model: str = "NVIDIA H100 80GB HBM3",
    seed: int = 0,
    imex_channels: int = 0,
    nvswitches: int = 0,
    gds: bool = False,
    mofed: bool = False,
    gdrcopy: bool = False,
) -> SimNode:
    """Build a simulated GPU node under ``root`` and describe it (see the module doc).

    ``root`` must be new or an empty directory; with ``dev_root`` the device nodes go to
    ``<dev_root>/dev`` (existing nodes there are refused, not replaced). Minors equal
    indices unless ``shuffle_minors`` (a seeded permutation, never the identity for two or
    more GPUs). ``mig`` makes GPU 0 MIG-enabled with GPU instances 1 and 2, one compute
    instance each. ``imex_channels`` makes ``dev/nvidia-caps-imex-channels/channel0..N-1``;
    ``nvswitches`` ``dev/nvidia-nvswitchctl``, ``nvidia-nvswitch0..N-1`` and the fabric
    manager socket; ``gds`` ``dev/nvidia-fs0..3`` and ``etc/cufile.json``; ``mofed``
    ``dev/infiniband/{uverbs0,umad0,issm0,rdma_cm}``; ``gdrcopy`` ``dev/gdrdrv``; each with
    its ``proc/devices`` line. Raises :class:`UsageError` for bad arguments and :class:`HostError`
    when not root, when ``root`` is not empty, or when the tree cannot be written.
    """
    _check_arguments(gpus, driver_version, cuda_version, mig, model)
    if not 0 <= imex_channels <= 2048 or not 0 <= nvswitches <= 64:
        raise UsageError(f"--imex-channels {imex_channels} / --nvswitches {nvswitches}: a "
                         "simulated node has 0-2048 channels and 0-64 NVSwitches")
    if os.geteuid() != 0:
        raise HostError(
            f"creating a simulated node needs root for mknod: running as uid {os.geteuid()}"
        )
    root = os.path.abspath(root)
    dev_base = os.path.abspath(dev_root) if dev_root else root
    _prepare_root(root)
    node = SimNode(
        root=root,
        dev_root=dev_base,
        driver_version=driver_version,
        cuda_version=cuda_version,
        gpus=_plan(gpus, shuffle_minors, mig, model, seed),
        imex_channels=imex_channels,
        nvswitches=nvswitches,
        gds=gds,
        mofed=mofed,
        gdrcopy=gdrcopy,
    )
    try:
        os.makedirs(root, exist_ok=True)
        _write_devices(node)
        _write_procfs(node)
        _write_libraries(node)
        _write_binaries(node)
        _write_driver_files(node)
        _write_text(os.path.join(root, SIM_FILE), json.dumps(_to_json(node, seed), indent=2))
        _write_text(node.nvml_facts, json.dumps(nvml_facts_document(node), indent=2))
    except OSError as exc:
        where = exc.filename or root
        raise HostError(
            f"cannot create simulated node under {root}: {where}: {exc.strerror}"
        ) from exc
    return node


# -- writers ----------------------------------------------------------------------------


def _write_text(path: str, text: str, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, mode)


def _write_bytes(path: str, data: bytes, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)


def _mknod(path: str, major: int, minor: int, mode: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        raise HostError(f"device node {path} already exists: refusing to replace it")
    os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    os.chmod(path, mode)  # mknod's mode is masked by the umask


def _write_devices(node: SimNode) -> None:
    dev = os.path.join(node.dev_root, "dev")
    for gpu in node.gpus:
        _mknod(os.path.join(dev, f"nvidia{gpu.minor}"), NVIDIA_MAJOR, gpu.minor, 0o666)
    _mknod(os.path.join(dev, "nvidiactl"), NVIDIA_MAJOR, 255, 0o666)
    _mknod(os.path.join(dev, "nvidia-modeset"), NVIDIA_MAJOR, 254, 0o666)
    _mknod(os.path.join(dev, "nvidia-uvm"), UVM_MAJOR, 0, 0o666)
    _mknod(os.path.join(dev, "nvidia-uvm-tools"), UVM_MAJOR, 1, 0o666)
    migs = [m for gpu in node.gpus for m in gpu.mig]
    if migs:
        caps = os.path.join(dev, "nvidia-caps")
        _mknod(os.path.join(caps, "nvidia-cap1"), CAPS_MAJOR, 1, 0o400)
        _mknod(os.path.join(caps, "nvidia-cap2"), CAPS_MAJOR, 2, 0o400)
        for m in migs:
            for minor in (m.gi_cap_minor, m.ci_cap_minor):
                _mknod(os.path.join(caps, f"nvidia-cap{minor}"), CAPS_MAJOR, minor, 0o444)
    for channel in range(node.imex_channels):
        _mknod(os.path.join(dev, "nvidia-caps-imex-channels", f"channel{channel}"), IMEX_MAJOR,
               channel, 0o666)
    if node.nvswitches:
        _mknod(os.path.join(dev, "nvidia-nvswitchctl"), NVSWITCH_MAJOR, 255, 0o666)
    for switch in range(node.nvswitches):
        _mknod(os.path.join(dev, f"nvidia-nvswitch{switch}"), NVSWITCH_MAJOR, switch, 0o666)
    for fs in range(4 if node.gds else 0):
        _mknod(os.path.join(dev, f"nvidia-fs{fs}"), NVIDIA_FS_MAJOR, fs, 0o666)
    if node.mofed:
        ib = os.path.join(dev, "infiniband")
        _mknod(os.path.join(ib, "uverbs0"), INFINIBAND_MAJOR, 192, 0o666)
        _mknod(os.path.join(ib, "umad0"), INFINIBAND_MAJOR, 0, 0o600)
        _mknod(os.path.join(ib, "issm0"), INFINIBAND_MAJOR, 64, 0o600)
        _mknod(os.path.join(ib, "rdma_cm"), MISC_MAJOR, 58, 0o666)
    if node.gdrcopy:
        _mknod(os.path.join(dev, "gdrdrv"), GDRDRV_MAJOR, 0, 0o666)


def _information(gpu: SimGpu, driver_version: str) -> str:
    return (
        f"Model: \t\t {gpu.model}\n"
        f"IRQ:   \t\t {160 + gpu.index}\n"
        f"GPU UUID: \t {gpu.uuid}\n"
        "Video BIOS: \t 96.00.99.00.01\n"
        "Bus Type: \t PCIe\n"
        "DMA Size: \t 52 bits\n"
        "DMA Mask: \t 0xfffffffffffff\n"
        f"Bus Location: \t {gpu.pci_bus_id}\n"
        f"Device Minor: \t {gpu.minor}\n"
        f"GPU Firmware: \t {driver_version}\n"
        "GPU Excluded:\t No\n"
    )


def _mig_minors(minors: list[int]) -> str:
    lines = ["config 1", "monitor 2"]
    for minor in minors:
        for gi in range(_GI_SLOTS):
            lines.append(f"gpu{minor}/gi{gi}/access {mig_cap_minor(minor, gi)}")
            for ci in range(_CI_SLOTS):
                lines.append(f"gpu{minor}/gi{gi}/ci{ci}/access {mig_cap_minor(minor, gi, ci)}")
    return "\n".join(lines) + "\n"


def _cap_file(minor: int, mode: int) -> str:
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"


def _proc_devices(node: SimNode) -> str:
    """/proc/devices as the kernel prints it (``%3d %s``), with the drivers this node has."""
    char = [(1, "mem"), (4, "tty"), (5, "/dev/tty"), (MISC_MAJOR, "misc"),
            (NVIDIA_MAJOR, "nvidia-frontend"), (CAPS_MAJOR, "nvidia-caps"),
            (UVM_MAJOR, "nvidia-uvm")]
    if node.imex_channels:
        char.append((IMEX_MAJOR, "nvidia-caps-imex-channels"))
    if node.nvswitches:
        char.append((NVSWITCH_MAJOR, "nvidia-nvswitch"))
    if node.gds:
        char.append((NVIDIA_FS_MAJOR, "nvidia-fs"))
    if node.mofed:
        char.append((INFINIBAND_MAJOR, "infiniband_verbs"))
    if node.gdrcopy:
        char.append((GDRDRV_MAJOR, "gdrdrv"))
    lines = ["Character devices:"] + [f"{major:3d} {name}" for major, name in sorted(char)]
    lines += ["", "Block devices:", "  7 loop", "254 virtblk"]
    return "\n".join(lines) + "\n"


def _write_procfs(node: SimNode) -> None:
    _write_text(os.path.join(node.root, "proc", "devices"), _proc_devices(node), 0o444)
    proc = os.path.join(node.root, "proc", "driver", "nvidia")
    _write_text(
        os.path.join(proc, "version"),
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {node.driver_version}  "
        "Tue Mar  5 22:23:56 UTC 2024\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n",
        0o444,
    )
    _write_text(
        os.path.join(proc, "params"),
        "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\n"
        "DeviceFileUID: 0\nDeviceFileGID: 0\nDeviceFileMode: 438\n",
        0o444,
    )
    for gpu in node.gpus:
        _write_text(
            os.path.join(proc, "gpus", gpu.pci_bus_id, "information"),
            _information(gpu, node.driver_version),
            0o444,
        )
    if not any(gpu.mig for gpu in node.gpus):
        return
    _write_text(
        os.path.join(node.root, "proc", "driver", "nvidia-caps", "mig-minors"),
        _mig_minors(sorted(g.minor for g in node.gpus)),
        0o444,
    )
    caps = os.path.join(proc, "capabilities")
    _write_text(os.path.join(caps, "mig", "config"), _cap_file(1, 256), 0o444)
    _write_text(os.path.join(caps, "mig", "monitor"), _cap_file(2, 256), 0o444)
    for gpu in node.gpus:
        for m in gpu.mig:
            gi_dir = os.path.join(caps, f"gpu{gpu.minor}", "mig", f"gi{m.gi}")
            _write_text(os.path.join(gi_dir, "access"), _cap_file(m.gi_cap_minor, 292), 0o444)
            _write_text(
                os.path.join(gi_dir, f"ci{m.ci}", "access"), _cap_file(m.ci_cap_minor, 292), 0o444
            )


def _library(directory: str, base: str, suffix: str | None, version: str) -> str:
    """Write ``<base>.so.<version>`` and its SONAME link; return the SONAME."""
    file_name = f"{base}.so.{version}"
    soname = f"{base}{suffix}" if suffix else file_name
    marker = f"NVSHIM-SIM {file_name} {version}"
    _write_bytes(os.path.join(directory, file_name), build_shared_object(soname, marker), 0o644)
    if soname != file_name:
        os.symlink(file_name, os.path.join(directory, soname))
    return soname


def _write_libraries(node: SimNode) -> None:
    libdir = os.path.join(node.root, LIB_DIR)
    os.makedirs(libdir, exist_ok=True)
    cache: list[tuple[str, str]] = []
    for base, suffix, dev_link in SIM_LIBRARIES:
        soname = _library(libdir, base, suffix, node.driver_version)
        cache.append((soname, f"/{LIB_DIR}/{soname}"))
        if dev_link:
            os.symlink(soname, os.path.join(libdir, f"{base}.so"))
            cache.append((f"{base}.so", f"/{LIB_DIR}/{base}.so"))
    _library(os.path.join(libdir, "vdpau"), "libvdpau_nvidia", ".so.1", node.driver_version)
    etc = os.path.join(node.root, "etc")
    _write_bytes(os.path.join(etc, "ld.so.cache"), build_ldcache(cache, "new"))
    _write_text(os.path.join(etc, "ld.so.conf"), "include /etc/ld.so.conf.d/*.conf\n")
    _write_text(os.path.join(etc, "ld.so.conf.d", "x86_64-linux-gnu.conf"), f"/{LIB_DIR}\n")


_SMI = r"""#!/bin/sh
# SIMULATED nvidia-smi (nvshim sim): not NVIDIA's program, and no GPU is behind it.
# It lists the GPUs of a simulated node whose device nodes it can see under
# $NVSHIM_SIM_DEV (default /dev), numbered 0.. in PCI order as NVML numbers them.
DEV="${NVSHIM_SIM_DEV:-/dev}"
DRIVER_VERSION='@DRIVER@'
CUDA_VERSION='@CUDA@'
# gpu|minor|uuid|pci bus id|model   then   mig|gi cap minor|ci cap minor|uuid|profile
TABLE='@TABLE@'

no_driver() {
    echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. (SIMULATED nvidia-smi (nvshim sim): no $DEV/nvidiactl)"
    exit 9
}

list_gpus() {
    printf '%s\n' "$TABLE" | {
        n=0; seen=0; m=0
        while IFS='|' read -r kind a b c d; do
            if [ "$kind" = gpu ]; then
                seen=0
                if [ -c "$DEV/nvidia$a" ]; then
                    seen=1; m=0
                    if [ "$1" = table ]; then
                        printf '| %3d  %-30s  %-12s  %-40s |\n' "$n" "$d" "$c" "$b"
                    else
                        printf 'GPU %d: %s (UUID: %s)\n' "$n" "$d" "$b"
                    fi
                    n=$((n + 1))
                fi
            elif [ "$kind" = mig ] && [ "$seen" = 1 ] && [ "$1" != table ] \
                && [ -c "$DEV/nvidia-caps/nvidia-cap$a" ] && [ -c "$DEV/nvidia-caps/nvidia-cap$b" ]; then
                printf '  MIG %-11s Device %2d: (UUID: %s)\n' "$d" "$m" "$c"
                m=$((m + 1))
            fi
        done
        if [ "$n" = 0 ]; then
            echo "No devices were found"
            exit 6
        fi
    }
}

[ -c "$DEV/nvidiactl" ] || no_driver
case "$*" in
    -L|--list-gpus)
        list_gpus list ;;
    "")
        echo "SIMULATED nvidia-smi (nvshim sim): no real GPU behind this output"
        echo "@RULE@"
        printf '| NVIDIA-SMI %-14s Driver Version: %-14s CUDA Version: %-20s |\n' "$DRIVER_VERSION" "$DRIVER_VERSION" "$CUDA_VERSION"
        echo "@RULE@"
        printf '| %3s  %-30s  %-12s  %-40s |\n' GPU Name Bus-Id UUID
        list_gpus table || exit $?
        echo "@RULE@" ;;
    --version)
        printf 'NVIDIA-SMI version  : %s (SIMULATED, nvshim sim)\nDRIVER version      : %s\nCUDA Version        : %s\n' \
            "$DRIVER_VERSION" "$DRIVER_VERSION" "$CUDA_VERSION" ;;
    *)
        echo "SIMULATED nvidia-smi (nvshim sim): supports only -L, --list-gpus, --version or no arguments" >&2
        exit 2 ;;
esac
"""

_STUB = """#!/bin/sh
# SIMULATED {name} (nvshim sim): a labelled stub, not NVIDIA's program.
echo "SIMULATED {name} (nvshim sim): stub of driver {version}, does nothing" >&2
exit 0
"""


def _smi_table(node: SimNode) -> str:
    rows = []
    for gpu in node.gpus:
        rows.append(f"gpu|{gpu.minor}|{gpu.uuid}|{gpu.pci_bus_id}|{gpu.model}")
        for m in gpu.mig:
            rows.append(f"mig|{m.gi_cap_minor}|{m.ci_cap_minor}|{m.uuid}|{m.profile}")
    return "\n".join(rows)


def _write_binaries(node: SimNode) -> None:
    bindir = os.path.join(node.root, "usr", "bin")
    script = (
        _SMI.replace("@DRIVER@", node.driver_version)
        .replace("@CUDA@", node.cuda_version)
        .replace("@TABLE@", _smi_table(node))
        .replace("@RULE@", "+" + "-" * 93 + "+")
    )
    _write_text(os.path.join(bindir, "nvidia-smi"), script, 0o755)
    for name in _BINARIES:
        stub = _STUB.format(name=name, version=node.driver_version)
        _write_text(os.path.join(bindir, name), stub, 0o755)


def _write_driver_files(node: SimNode) -> None:
    firmware = os.path.join(node.root, "lib", "firmware", "nvidia", node.driver_version)
    for name in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        _write_text(os.path.join(firmware, name), f"NVSHIM-SIM {name} {node.driver_version}\n")
    run = os.path.join(node.root, "run", "nvidia-persistenced")
    os.makedirs(run, exist_ok=True)
    os.makedirs(os.path.join(node.root, "var"), exist_ok=True)
    os.symlink("../run", os.path.join(node.root, "var", "run"))
    # Bind through /proc/self/fd so a deep root does not hit the 108-byte sun_path limit.
    dir_fd = os.open(run, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.bind(f"/proc/self/fd/{dir_fd}/socket")
    finally:
        os.close(dir_fd)
    os.makedirs(os.path.join(node.root, "tmp", "nvidia-mps"), exist_ok=True)
    if node.nvswitches:
        _bind_socket(os.path.join(node.root, "run", "nvidia-fabricmanager"))
    if node.gds:
        _write_text(os.path.join(node.root, "etc", "cufile.json"),
                    '{"NVSHIM-SIM": "cufile.json", "logging": {"level": "ERROR"}}\n')


def _bind_socket(directory: str) -> None:
    """A listening-less UNIX socket ``<directory>/socket`` (bound via /proc/self/fd)."""
    os.makedirs(directory, exist_ok=True)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.bind(f"/proc/self/fd/{dir_fd}/socket")
    finally:
        os.close(dir_fd)


# -- metadata ---------------------------------------------------------------------------


def _to_json(node: SimNode, seed: int) -> dict[str, Any]:
    return {
        "format": 1,
        "simulated": True,
        "generator": "nvshim sim",
        "seed": seed,
        "driver_version": node.driver_version,
        "cuda_version": node.cuda_version,
        "dev_root": node.dev_root,
        "gpus": [
            {
                "index": gpu.index,
                "minor": gpu.minor,
                "uuid": gpu.uuid,
                "pci_bus_id": gpu.pci_bus_id,
                "model": gpu.model,
                "arch": gpu.arch,
                "brand": gpu.brand,
                "compute_capability": gpu.compute_capability,
                "mig_enabled": bool(gpu.mig),
                "mig": [
                    {
                        "gi": m.gi,
                        "ci": m.ci,
                        "uuid": m.uuid,
                        "profile": m.profile,
                        "gi_cap_minor": m.gi_cap_minor,
                        "ci_cap_minor": m.ci_cap_minor,
                    }
                    for m in gpu.mig
                ],
            }
            for gpu in node.gpus
        ],
    }


def nvml_facts_document(node: SimNode) -> dict[str, Any]:
    """What NVML would say about ``node`` and procfs does not, in the ``nvml-facts`` format
    (:class:`nvshim.host.nvml.NvmlFacts`): a config names the file to use it."""
    return {
        "format": FACTS_FORMAT,
        "cuda_version": node.cuda_version,
        "gpus": [
            {
                "uuid": gpu.uuid,
                "minor": gpu.minor,
                "compute_capability": gpu.compute_capability,
                "brand": gpu.brand,
                "mig": [
                    {"gi": m.gi, "ci": m.ci, "uuid": m.uuid, "profile": m.profile}
                    for m in gpu.mig
                ],
            }
            for gpu in node.gpus
        ],
    }


def load_node(root: str) -> SimNode:
    """Read ``<root>/nvshim-sim.json`` back into a :class:`SimNode`.

    Raises :class:`HostError` when the file is missing, not JSON, or not format 1.
    """
    root = os.path.abspath(root)
    path = os.path.join(root, SIM_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            meta = json.load(handle)
    except FileNotFoundError as exc:
        raise HostError(f"{path} does not exist: {root} is not a simulated node") from exc
    except (OSError, ValueError) as exc:
        raise HostError(f"cannot read {path}: {exc}") from exc
    try:
        if meta["format"] != 1 or meta["simulated"] is not True:
            raise HostError(f"{path}: unsupported format {meta['format']!r}")
        gpus: Sequence[dict[str, Any]] = meta["gpus"]
        return SimNode(
            root=root,
            dev_root=str(meta.get("dev_root") or root),
            driver_version=str(meta["driver_version"]),
            cuda_version=str(meta["cuda_version"]),
            gpus=tuple(
                SimGpu(
                    index=int(g["index"]),
                    minor=int(g["minor"]),
                    uuid=str(g["uuid"]),
                    pci_bus_id=str(g["pci_bus_id"]),
                    model=str(g["model"]),
                    arch=str(g["arch"]),
                    brand=str(g["brand"]),
                    compute_capability=str(g["compute_capability"]),
                    mig=tuple(
                        SimMig(
                            gpu_index=int(g["index"]),
                            gi=int(m["gi"]),
                            ci=int(m["ci"]),
                            uuid=str(m["uuid"]),
                            profile=str(m["profile"]),
                            gi_cap_minor=int(m["gi_cap_minor"]),
                            ci_cap_minor=int(m["ci_cap_minor"]),
                        )
                        for m in g["mig"]
                    ),
                )
                for g in gpus
            ),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise HostError(f"{path}: missing or malformed field {exc}") from exc
