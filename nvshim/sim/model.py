"""The simulated node's model: its records, constants and plan, and the tree's file writers.

:func:`plan_gpus` decides what a node of given arguments has (minors, UUIDs, PCI bus ids,
MIG devices and their capability minors); :mod:`nvshim.sim.kernel` and
:mod:`nvshim.sim.driver` write it, :mod:`nvshim.sim.build` puts it together.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import stat

from nvshim._record import dataclass
from nvshim.errors import HostError, UsageError

__all__ = [
    "CAPS_MAJOR",
    "CI_SLOTS",
    "CUDA_BY_BRANCH",
    "DRIVER_BINARIES",
    "GI_SLOTS",
    "LIBRARY_SINCE_BRANCH",
    "LIB32_DIR",
    "LIB_DIR",
    "NVIDIA_MAJOR",
    "NVML_FACTS_FILE",
    "SIM_FILE",
    "SIM_LIBRARIES",
    "SIM_LIBRARIES32",
    "UVM_MAJOR",
    "SimGpu",
    "SimMig",
    "SimNode",
    "check_arguments",
    "cuda_for_driver",
    "driver_branch",
    "libraries_for_driver",
    "mig_cap_minor",
    "mknod",
    "plan_gpus",
    "write_bytes",
    "write_text",
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
DRM_MAJOR = 226  # /dev/dri/card<n> (minor n) and renderD<128+n>
SIM_FILE = "nvshim-sim.json"
NVML_FACTS_FILE = "nvml-facts.json"
#: The NVIDIA driver handles at most 32 GPUs per node (NV_MAX_DEVICES); a simulated node
#: may have more, for scale tests (CDI specs and discovery at 64 or 256 GPUs).
DRIVER_MAX_GPUS = 32
MAX_GPUS = 1024
#: Minors of /dev/nvidia-modeset and /dev/nvidiactl: GPU minors skip them.
_RESERVED_MINORS = (254, 255)
LIB_DIR = "usr/lib/x86_64-linux-gnu"
#: Where the 32-bit (i386) copies go: a multiarch node's folder, as NVIDIA's installer
#: lays them out there.
LIB32_DIR = "usr/lib/i386-linux-gnu"

#: (library base name, SONAME suffix or None when the SONAME is the versioned file name,
#: whether a ``.so`` development link exists); a node has those of its driver branch
#: (:func:`libraries_for_driver`)
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
#: The libraries of :data:`SIM_LIBRARIES` the driver also ships as 32-bit (i386) copies
#: (no NVML-only, debugger, config or NGX one, as NVIDIA's installer): ELF32 stubs in
#: :data:`LIB32_DIR` with i386 ld.so.cache entries, for ``compat32``.
SIM_LIBRARIES32: tuple[str, ...] = (
    "libcuda",
    "libnvidia-ml",
    "libnvidia-ptxjitcompiler",
    "libnvidia-nvvm",
    "libnvidia-allocator",
    "libnvidia-opencl",
    "libnvidia-encode",
    "libnvcuvid",
    "libnvidia-eglcore",
    "libnvidia-glcore",
    "libnvidia-tls",
    "libGLX_nvidia",
    "libEGL_nvidia",
    "libnvidia-fbc",
)
#: The first driver branch that ships a library of :data:`SIM_LIBRARIES` (the others are in
#: every branch the simulator knows): 535 and older have no libnvidia-gpucomp.
LIBRARY_SINCE_BRANCH: dict[str, int] = {"libnvidia-gpucomp": 545}
#: The newest CUDA version each driver branch supports, oldest branch first.
CUDA_BY_BRANCH: tuple[tuple[int, str], ...] = (
    (470, "11.4"),
    (525, "12.0"),
    (530, "12.1"),
    (535, "12.2"),
    (545, "12.3"),
    (550, "12.4"),
    (555, "12.5"),
    (560, "12.6"),
    (565, "12.7"),
    (570, "12.8"),
    (575, "12.9"),
    (580, "13.0"),
)
#: The driver's other programs; the simulator writes a labelled stub of each.
DRIVER_BINARIES = (
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
GI_SLOTS = 15  # the driver lists gi0..gi14 ...
CI_SLOTS = 8  # ... and ci0..ci7 per GPU in mig-minors
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
    #: False for headless GPUs (no nvidia-drm module): no /dev/dri, no sysfs drm folder.
    drm: bool = True
    #: False when only the kernel side was built (``--no-driver-files``).
    driver_files: bool = True

    @property
    def libraries(self) -> tuple[tuple[str, str | None, bool], ...]:
        """The :data:`SIM_LIBRARIES` this node's driver branch ships."""
        return libraries_for_driver(self.driver_version)

    @property
    def nvml_facts(self) -> str:
        """The facts file this node's config names as ``nvml-facts`` (what NVML would say)."""
        return os.path.join(self.root, NVML_FACTS_FILE)


def driver_branch(driver_version: str) -> int:
    """The branch of a driver version: its first number (``535.104.05`` → 535)."""
    return int(driver_version.split(".", 1)[0])


def cuda_for_driver(driver_version: str) -> str:
    """The newest CUDA version the driver's branch supports (``535.104.05`` → ``12.2``).

    A branch between two known ones (:data:`CUDA_BY_BRANCH`) takes the nearest lower known
    branch's version (``555``-``559`` → ``12.5``); a branch above the newest known one takes
    the newest (``590`` → ``13.0``); a branch below the oldest takes the oldest (``11.4``).
    """
    branch = driver_branch(driver_version)
    cuda = CUDA_BY_BRANCH[0][1]
    for known, version in CUDA_BY_BRANCH:
        if known <= branch:
            cuda = version
    return cuda


def libraries_for_driver(driver_version: str) -> tuple[tuple[str, str | None, bool], ...]:
    """The :data:`SIM_LIBRARIES` the driver's branch ships (:data:`LIBRARY_SINCE_BRANCH`)."""
    branch = driver_branch(driver_version)
    return tuple(lib for lib in SIM_LIBRARIES if LIBRARY_SINCE_BRANCH.get(lib[0], 0) <= branch)


def mig_cap_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """The nvidia-cap minor of ``gpu<minor>/gi<gi>/access`` (or ``.../ci<ci>/access``).

    The driver numbers them in order after ``config`` (1) and ``monitor`` (2): per GPU
    minor, for each GI its access then its 8 CI accesses.
    """
    per_gi = 1 + CI_SLOTS
    base = 3 + gpu_minor * GI_SLOTS * per_gi + gi * per_gi
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


def plan_gpus(
    gpus: int, shuffle_minors: bool, mig: bool, model: str, seed: int
) -> tuple[SimGpu, ...]:
    """The GPUs (and MIG devices) a node of these arguments has: minors, UUIDs, PCI ids."""
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


def check_arguments(
    gpus: int, driver_version: str, cuda_version: str | None, mig: bool, model: str
) -> None:
    """UsageError naming the first argument a simulated node cannot have."""
    if not 0 <= gpus <= MAX_GPUS:
        raise UsageError(
            f"--gpus {gpus}: a simulated node has 0-{MAX_GPUS} GPUs "
            f"(the real driver handles up to {DRIVER_MAX_GPUS})"
        )
    if not _VERSION_RE.match(driver_version):
        raise UsageError(
            f'--driver-version "{driver_version}": expected a driver version like 550.54.15'
        )
    if cuda_version is not None and not _CUDA_RE.match(cuda_version):
        raise UsageError(f'cuda version "{cuda_version}": expected a version like 12.4')
    if mig and gpus == 0:
        raise UsageError("--mig needs at least one GPU: --gpus is 0")
    if not model or not model.isprintable() or any(c in model for c in "|'\\"):
        raise UsageError(f"model {model!r}: must be printable text without | ' or \\")


# -- writers of the tree ---------------------------------------------------------------


def write_text(path: str, text: str, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, mode)


def write_bytes(path: str, data: bytes, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)


def mknod(path: str, major: int, minor: int, mode: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        raise HostError(f"device node {path} already exists: refusing to replace it")
    os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    os.chmod(path, mode)  # mknod's mode is masked by the umask
