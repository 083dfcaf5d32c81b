"""What the host has: GPUs, device nodes, driver version, driver files.

The :class:`Host` is the one seam that reads the machine. Tests point it at a simulated
node (``nvshim sim create``) through ``driver_root``/``dev_root``; nothing is
monkeypatched. Results are plain records (:class:`Gpu`, :class:`Library` …) that the
pure edit builders in :mod:`nvshim.edits` turn into container edits.

GPUs come from procfs (``/proc/driver/nvidia/gpus/*/information``) or NVML. The runtime
prefers procfs — it answers without loading the driver library and holds everything
injection needs (minor, UUID, PCI bus id); NVML is used when procfs has no GPUs and the
driver root is ``/``, and by the CLI when asked. Index order = PCI bus id order, which
is how NVML numbers GPUs.

One module (~470 lines) on purpose: it is the one seam that reads the machine — the
:class:`Host` and the driver-file tables it searches by — and every create that finds the
plan cache stale, and the cache itself (:mod:`nvshim.runtime.plancache` subclasses
:class:`Host`), imports all of it; split, each such create would load two modules for one
job.
"""

from __future__ import annotations

import os
import stat

from nvshim._record import dataclass, field
from nvshim.edits import DeviceNode
from nvshim.errors import HostError
from nvshim.host.devices import GpuRef, MigDevice, MigRef, normalize_pci

TYPE_CHECKING = False  # typing costs ~4 ms to import on the create path
if TYPE_CHECKING:
    from typing import Dict, Iterable, List, Optional, Tuple

__all__ = [
    "Host",
    "Gpu",
    "MigDevice",
    "Library",
    "DriverFile",
    "LIBRARIES",
    "BINARIES",
    "CONTROL_NODES",
    "LIB_DIRS",
    "BIN_DIRS",
]

#: Driver libraries per capability (library base names; the file is ``<base>.so.<version>``).
LIBRARIES: Dict[str, Tuple[str, ...]] = {
    "utility": ("libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq"),
    "compute": (
        "libcuda",
        "libcudadebugger",
        "libnvidia-opencl",
        "libnvidia-gpucomp",
        "libnvidia-ptxjitcompiler",
        "libnvidia-fatbinaryloader",
        "libnvidia-allocator",
        "libnvidia-compiler",
        "libnvidia-pkcs11",
        "libnvidia-pkcs11-openssl3",
        "libnvidia-nvvm",
        "libnvidia-tileiras",
    ),
    "video": ("libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid"),
    "graphics": (
        "libnvidia-eglcore",
        "libnvidia-glcore",
        "libnvidia-tls",
        "libnvidia-glsi",
        "libnvidia-fbc",
        "libnvidia-ifr",
        "libnvidia-rtcore",
        "libnvoptix",
        "libGLX_nvidia",
        "libEGL_nvidia",
        "libGLESv2_nvidia",
        "libGLESv1_CM_nvidia",
        "libnvidia-glvkspirv",
        "libnvidia-cbl",
    ),
    "ngx": ("libnvidia-ngx",),
    "display": (),
    "compat32": (),
}

#: Which library sets a capability pulls in (video also needs the compute libraries;
#: display needs graphics).
LIBRARY_SETS: Dict[str, Tuple[str, ...]] = {
    "utility": ("utility",),
    "compute": ("compute",),
    "video": ("video", "compute"),
    "graphics": ("graphics",),
    "display": ("display", "graphics"),
    "ngx": ("ngx",),
    "compat32": (),
}

#: Driver binaries per capability.
BINARIES: Dict[str, Tuple[str, ...]] = {
    "utility": ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"),
    "compute": ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
}

#: Control device nodes and the capability that needs each (None = always).
CONTROL_NODES: Tuple[Tuple[str, Optional[str]], ...] = (
    ("/dev/nvidiactl", None),
    ("/dev/nvidia-uvm", "compute"),
    ("/dev/nvidia-uvm-tools", "compute"),
    ("/dev/nvidia-modeset", "display"),
)

#: Standard library directories searched when the ld.so.cache has no entry.
LIB_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib",
    "/lib",
)

BIN_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin")

# Compiled on first use: ``re`` costs ~6 ms to import, and a create with a fresh node plan
# cache never reads the version.
_VERSION_PATTERN = r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9]+(?:\.[0-9]+)+)"
_LIBCUDA_PATTERN = r"^libcuda\.so\.([0-9]+(?:\.[0-9]+){1,2})$"


@dataclass(frozen=True)
class Gpu:
    """One full GPU as discovery sees it."""

    index: int
    minor: int
    uuid: str
    pci_bus_id: str
    model: str
    node: Optional[DeviceNode] = None
    mig: Tuple[MigDevice, ...] = field(default=())

    def ref(self) -> GpuRef:
        return GpuRef(
            self.index,
            self.uuid,
            self.pci_bus_id,
            tuple(MigRef(m.gpu_index, m.index, m.uuid) for m in self.mig),
        )


@dataclass(frozen=True)
class Library:
    """A driver library: the versioned file and the SONAME link the container needs."""

    base: str
    host_path: str
    container_path: str
    soname: Optional[str]
    capability: str


@dataclass(frozen=True)
class DriverFile:
    """Another driver file to bind-mount (binary, firmware, IPC socket)."""

    host_path: str
    container_path: str
    capability: Optional[str]
    kind: str  # "binary" | "firmware" | "ipc"


def _parse_information(text: str) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


class Host:
    """Reads one node: a driver root (libraries, /proc files) and a dev root (nodes)."""

    def __init__(self, driver_root: str = "/", dev_root: Optional[str] = None,
                 nvml_facts: Optional[str] = None) -> None:
        self.driver_root = os.path.abspath(driver_root or "/")
        self.dev_root = os.path.abspath(dev_root or self.driver_root)
        self.nvml_facts = nvml_facts
        """The config's ``nvml-facts`` file (:class:`nvshim.host.nvml.NvmlFacts`), or None."""
        self._gpus: Optional[Tuple[Gpu, ...]] = None
        self._ldcache: Optional[Dict[str, str]] = None
        self._version: Optional[str] = None
        self.gpu_source: str = ""

    # -- paths ------------------------------------------------------------------------

    def host_path(self, container_path: str) -> str:
        """``/usr/lib/x`` → the same file under the driver root."""
        if self.driver_root == "/":
            return container_path
        return self.driver_root + container_path

    def dev_path(self, container_path: str) -> str:
        if self.dev_root == "/":
            return container_path
        return self.dev_root + container_path

    def read_text(self, container_path: str) -> Optional[str]:
        try:
            with open(self.host_path(container_path), encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            where = self.host_path(container_path)
            raise HostError(f"cannot read {where}: {exc.strerror}") from exc

    # -- device nodes -------------------------------------------------------------------

    def device_node(self, container_path: str) -> Optional[DeviceNode]:
        """Stat a device node under the dev root; None when it does not exist."""
        host = self.dev_path(container_path)
        try:
            st = os.stat(host)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise HostError(f"cannot stat device node {host}: {exc.strerror}") from exc
        if stat.S_ISCHR(st.st_mode):
            kind = "c"
        elif stat.S_ISBLK(st.st_mode):
            kind = "b"
        else:
            raise HostError(f"{host} is not a device node")
        return DeviceNode(
            path=container_path,
            host_path=host,
            type=kind,
            major=os.major(st.st_rdev),
            minor=os.minor(st.st_rdev),
            file_mode=stat.S_IMODE(st.st_mode),
        )

    def control_nodes(self, capabilities: Iterable[str]) -> Tuple[DeviceNode, ...]:
        caps = set(capabilities)
        nodes = []
        for path, needs in CONTROL_NODES:
            if needs is not None and needs not in caps:
                continue
            node = self.device_node(path)
            if node is not None:
                nodes.append(node)
        return tuple(nodes)

    # -- GPUs -------------------------------------------------------------------------

    def gpus(self, method: str = "auto") -> Tuple[Gpu, ...]:
        """All full GPUs of the node, index = PCI bus id order.

        ``method``: ``procfs``, ``nvml`` or ``auto`` (procfs, then NVML when procfs has
        none and the driver root is ``/``).
        """
        if self._gpus is not None and method == "auto":
            return self._gpus
        if method == "nvml":
            found = self._gpus_from_nvml()
            self.gpu_source = "nvml"
        else:
            found = self._gpus_from_procfs()
            self.gpu_source = "procfs"
            if not found and method == "auto" and self.driver_root == "/":
                try:
                    found = self._gpus_from_nvml()
                    self.gpu_source = "nvml"
                except HostError:
                    found = ()
        if method == "auto":
            self._gpus = found
        return found

    def _gpus_from_procfs(self) -> Tuple[Gpu, ...]:
        base = self.host_path("/proc/driver/nvidia/gpus")
        try:
            entries = sorted(os.listdir(base))
        except FileNotFoundError:
            return ()
        except OSError as exc:
            raise HostError(f"cannot list {base}: {exc.strerror}") from exc
        raw: List[Tuple[str, int, str, str]] = []
        for entry in entries:
            path = os.path.join(base, entry, "information")
            try:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    info = _parse_information(fh.read())
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise HostError(f"cannot read {path}: {exc.strerror}") from exc
            uuid = info.get("GPU UUID", "")
            minor_text = info.get("Device Minor", "")
            bus = normalize_pci(info.get("Bus Location", entry)) or normalize_pci(entry)
            if not uuid.startswith("GPU-") or not minor_text.isdigit() or bus is None:
                raise HostError(
                    f"{path}: cannot read GPU UUID, Device Minor and Bus Location from it"
                )
            raw.append((bus, int(minor_text), uuid, info.get("Model", "")))
        raw.sort()
        return tuple(self._make_gpu(i, *r) for i, r in enumerate(raw))

    def _gpus_from_nvml(self) -> Tuple[Gpu, ...]:
        from nvshim.host.nvml import as_text, nvml

        with nvml("NVML query failed") as pynvml:
            raw = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid = as_text(pynvml.nvmlDeviceGetUUID(handle))
                minor = int(pynvml.nvmlDeviceGetMinorNumber(handle))
                bus = normalize_pci(as_text(pynvml.nvmlDeviceGetPciInfo(handle).busId)) or ""
                model = as_text(pynvml.nvmlDeviceGetName(handle))
                raw.append((bus, minor, uuid, model))
        raw.sort()
        return tuple(self._make_gpu(i, *r) for i, r in enumerate(raw))

    def _make_gpu(self, index: int, bus: str, minor: int, uuid: str, model: str) -> Gpu:
        node = self.device_node(f"/dev/nvidia{minor}")
        if node is None:
            raise HostError(
                f"GPU {index} ({uuid}) has device minor {minor} but "
                f"{self.dev_path(f'/dev/nvidia{minor}')} does not exist"
            )
        mig = self._mig_devices(index, minor)
        return Gpu(index, minor, uuid, bus, model, node, mig)

    def _mig_devices(self, index: int, minor: int) -> Tuple[MigDevice, ...]:
        """MIG devices of a GPU, from the capability files procfs exposes.

        procfs has no MIG UUIDs: :mod:`nvshim.host.mig` asks
        :class:`nvshim.host.nvml.NvmlFacts` (NVML, else the ``nvml-facts`` file).
        """
        from nvshim.host import mig

        return mig.discover_mig(self, index, minor)

    # -- driver -----------------------------------------------------------------------

    def driver_version(self) -> str:
        if self._version is not None:
            return self._version
        import re

        text = self.read_text("/proc/driver/nvidia/version")
        version = None
        if text:
            match = re.search(_VERSION_PATTERN, text)
            if match:
                version = match.group(1)
        if version is None:
            for directory in LIB_DIRS:
                try:
                    names = os.listdir(self.host_path(directory))
                except OSError:
                    continue
                for name in sorted(names):
                    match = re.match(_LIBCUDA_PATTERN, name)
                    if match:
                        version = match.group(1)
                        break
                if version:
                    break
        if version is None:
            raise HostError(
                f"cannot find the NVIDIA driver version under {self.driver_root}: "
                "no /proc/driver/nvidia/version and no libcuda.so.<version>"
            )
        self._version = version
        return version

    def ldcache(self) -> Dict[str, str]:
        """SONAME/file name → path (as the driver root sees it), x86-64 entries only."""
        if self._ldcache is None:
            from nvshim.host.ldcache import read_ldcache

            entries: Dict[str, str] = {}
            for entry in read_ldcache(self.host_path("/etc/ld.so.cache")):
                # 0x0300 = x86-64 libc6 library; keep the first (preferred) entry of a key.
                if entry.flags & 0xFF00 == 0x0300 or entry.flags == 0x0303:
                    entries.setdefault(entry.key, entry.value)
            self._ldcache = entries
        return self._ldcache

    def find_library(self, base: str, capability: str) -> Optional[Library]:
        """Locate ``<base>.so.<driver version>`` through the ld.so.cache, then LIB_DIRS."""
        version = self.driver_version()
        filename = f"{base}.so.{version}"
        candidates: List[str] = []
        cache = self.ldcache()
        for key, value in cache.items():
            if key == filename or key.startswith(base + ".so"):
                candidates.append(os.path.join(os.path.dirname(value), filename))
        candidates.extend(os.path.join(d, filename) for d in LIB_DIRS)
        candidates.extend(os.path.join(d, "vdpau", filename) for d in LIB_DIRS[:1])
        seen = set()
        for container_path in candidates:
            if container_path in seen:
                continue
            seen.add(container_path)
            host = self.host_path(container_path)
            if os.path.isfile(host):
                from nvshim.host.elf import read_soname

                soname = read_soname(host)
                return Library(base, host, container_path, soname, capability)
        return None

    def libraries(self, capabilities: Iterable[str]) -> Tuple[Library, ...]:
        wanted: Dict[str, str] = {}
        for cap in sorted(capabilities):
            for libset in LIBRARY_SETS.get(cap, ()):
                for base in LIBRARIES[libset]:
                    wanted.setdefault(base, libset)
        found = []
        for base, cap in wanted.items():
            lib = self.find_library(base, cap)
            if lib is not None:
                found.append(lib)
        return tuple(found)

    def binaries(self, capabilities: Iterable[str]) -> Tuple[DriverFile, ...]:
        out = []
        for cap in sorted(capabilities):
            for name in BINARIES.get(cap, ()):
                for directory in BIN_DIRS:
                    path = f"{directory}/{name}"
                    if os.path.isfile(self.host_path(path)):
                        out.append(DriverFile(self.host_path(path), path, cap, "binary"))
                        break
        return tuple(out)

    def firmware(self) -> Tuple[DriverFile, ...]:
        version = self.driver_version()
        directory = f"/lib/firmware/nvidia/{version}"
        try:
            names = sorted(os.listdir(self.host_path(directory)))
        except OSError:
            return ()
        return tuple(
            DriverFile(self.host_path(f"{directory}/{n}"), f"{directory}/{n}", None, "firmware")
            for n in names
            if n.startswith("gsp") and n.endswith(".bin")
        )

    def ipc(self, capabilities: Iterable[str]) -> Tuple[DriverFile, ...]:
        caps = set(capabilities)
        out = []
        wanted: List[Tuple[str, str]] = []
        if "utility" in caps or "compute" in caps:
            wanted.append(("nvidia-persistenced/socket", "utility"))
        if "utility" in caps:
            wanted.append(("nvidia-fabricmanager/socket", "utility"))
        for rel, cap in wanted:
            for run in ("/run", "/var/run"):
                path = f"{run}/{rel}"
                try:
                    st = os.stat(self.host_path(path))
                except OSError:
                    continue
                if stat.S_ISSOCK(st.st_mode):
                    out.append(DriverFile(self.host_path(path), path, cap, "ipc"))
                    break
        if "compute" in caps:
            path = "/tmp/nvidia-mps"
            if os.path.isdir(self.host_path(path)):
                out.append(DriverFile(self.host_path(path), path, "compute", "ipc"))
        return tuple(out)


