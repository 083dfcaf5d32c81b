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
    "DATA_FILES",
    "ESSENTIAL",
    "OWN_VERSION_LIBRARIES",
    "missing_files",
    "resolve_in",
    "system_libdir",
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
        "libnvidia-vulkan-producer",
        "libnvidia-allocator",  # also compute's: GBM's nvidia-drm_gbm.so is a link to it
        "libnvidia-egl-gbm",
        "libnvidia-egl-wayland",
    ),
    "ngx": ("libnvidia-ngx",),
    "display": (),
    "compat32": (),
}

#: Libraries the driver ships with a version of their own (EGL platform libraries): the
#: file is whatever ``<SONAME>`` resolves to, not ``<base>.so.<driver version>``.
OWN_VERSION_LIBRARIES: Dict[str, str] = {
    "libnvidia-egl-gbm": "libnvidia-egl-gbm.so.1",
    "libnvidia-egl-wayland": "libnvidia-egl-wayland.so.1",
}

#: Driver data files per capability: (capability, container path — "" for where it was
#: found —, paths to look for in the driver root, in order; ``{version}`` is the driver's).
DATA_FILES: Tuple[Tuple[str, str, Tuple[str, ...]], ...] = (
    ("graphics", "", ("/etc/glvnd/egl_vendor.d/10_nvidia.json",
                      "/usr/share/glvnd/egl_vendor.d/10_nvidia.json")),
    ("graphics", "", ("/etc/vulkan/icd.d/nvidia_icd.json",
                      "/usr/share/vulkan/icd.d/nvidia_icd.json")),
    ("graphics", "", ("/etc/vulkan/implicit_layer.d/nvidia_layers.json",
                      "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json")),
    ("graphics", "", ("/etc/egl/egl_external_platform.d/10_nvidia_wayland.json",
                      "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json")),
    ("graphics", "", ("/etc/egl/egl_external_platform.d/15_nvidia_gbm.json",
                      "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json")),
    ("graphics", "", ("/usr/share/nvidia/nvoptix.bin",
                      "/usr/lib/x86_64-linux-gnu/nvidia/current/nvoptix.bin")),
    ("compute", "", ("/etc/OpenCL/vendors/nvidia.icd",)),
    ("display", "/usr/lib/xorg/modules/drivers/nvidia_drv.so",
     ("/usr/lib/xorg/modules/drivers/nvidia_drv.so",
      "/usr/lib64/xorg/modules/drivers/nvidia_drv.so",
      "/usr/lib/x86_64-linux-gnu/nvidia/xorg/nvidia_drv.so",
      "/usr/lib/nvidia/nvidia_drv.so",  # Debian's alternatives link
      "/usr/lib/nvidia/current/nvidia_drv.so")),
    ("display", "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{version}",
     ("/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{version}",
      "/usr/lib64/xorg/modules/extensions/libglxserver_nvidia.so.{version}",
      "/usr/lib/x86_64-linux-gnu/nvidia/xorg/libglxserver_nvidia.so.{version}",
      "/usr/lib/nvidia/current/libglxserver_nvidia.so.{version}")),
    ("display", "", ("/etc/X11/xorg.conf.d/10-nvidia.conf",
                     "/usr/share/X11/xorg.conf.d/10-nvidia.conf")),
)

#: What a capability cannot work without (library base names and file names): reported
#: by ``doctor`` and ``inspect`` when a container asking for it would not get it.
ESSENTIAL: Dict[str, Tuple[str, ...]] = {
    "compute": ("libcuda",),
    "utility": ("libnvidia-ml", "nvidia-smi"),
    "video": ("libnvcuvid", "libnvidia-encode"),
    "graphics": ("libGLX_nvidia", "libEGL_nvidia", "libnvidia-glcore", "libnvidia-eglcore"),
    "display": ("nvidia_drv.so",),
    "ngx": ("libnvidia-ngx",),
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
    kind: str  # "binary" | "data" | "firmware" | "ipc"


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
        resolved = resolve_in(self.dev_root, container_path)  # a link stays in the dev root
        if resolved is None:
            return None
        host = self.dev_path(resolved)
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

    # -- paths inside the driver root ----------------------------------------------------

    def resolve(self, path: str) -> Optional[str]:
        """:func:`resolve_in` the driver root."""
        return resolve_in(self.driver_root, path)

    def _regular_file(self, path: str) -> Optional[str]:
        """The in-root path of the regular file ``path`` names (links followed in the root)."""
        resolved = self.resolve(path)
        if resolved is None or not os.path.isfile(self.host_path(resolved)):
            return None
        return resolved

    # -- driver version -----------------------------------------------------------------

    def module_version(self) -> Optional[str]:
        """The loaded kernel module's version (``/proc/driver/nvidia/version``), or None."""
        import re

        text = self.read_text("/proc/driver/nvidia/version")
        match = re.search(_VERSION_PATTERN, text) if text else None
        return match.group(1) if match else None

    def files_version(self) -> Optional[str]:
        """The version of the driver's userspace files, or None when there are none.

        As the reference does: the suffix of ``libcuda.so.<version>``, else of
        ``libnvidia-ml.so.<version>`` — first the one the driver root's ld.so.cache names,
        then the first found in :data:`LIB_DIRS`.
        """
        import re

        for base in ("libcuda", "libnvidia-ml"):
            pattern = re.compile(rf"^{re.escape(base)}\.so\.([0-9]+(?:\.[0-9]+){{1,2}})$")
            for key, value in self.ldcache().items():
                if key.startswith(base + ".so"):
                    resolved = self._regular_file(value)
                    match = pattern.match(resolved.rsplit("/", 1)[1]) if resolved else None
                    if match:
                        return match.group(1)
            for directory in LIB_DIRS:
                try:
                    names = sorted(os.listdir(self.host_path(directory)))
                except OSError:
                    continue
                for name in names:
                    match = pattern.match(name)
                    if match and self._regular_file(f"{directory}/{name}"):
                        return match.group(1)
        return None

    def driver_version(self) -> str:
        """The version whose files are injected: the userspace files' own version, else the
        kernel module's (a node whose packages were upgraded but whose module was not
        reloaded still gets every library, of the version the files are)."""
        if self._version is not None:
            return self._version
        version = self.files_version() or self.module_version()
        if version is None:
            raise HostError(
                f"cannot find the NVIDIA driver version under {self.driver_root}: "
                "no /proc/driver/nvidia/version and no libcuda.so.<version>"
            )
        self._version = version
        return version

    def version_skew(self) -> Optional[Tuple[str, str]]:
        """(kernel module version, files version) when both are known and differ."""
        module = self.module_version()
        if module is None:
            return None
        try:
            files = self.driver_version()
        except HostError:
            return None
        return (module, files) if module != files else None

    def cuda_version(self) -> Optional[str]:
        """The newest CUDA version libcuda says it supports (``12.2``), or None.

        ``cuDriverGetVersion`` answers without a GPU or a loaded module. The library is
        loaded in a child process (``python -I``, empty environment, 10 s): a driver
        library never runs inside nvshim itself. Callers keep the answer (the node plan
        cache stores it), so it runs once per driver, never on an ordinary create.
        """
        try:
            lib = self.find_library("libcuda", "compute")
        except HostError:  # no driver version: no libcuda either
            return None
        if lib is None or not _mentions(lib.host_path, b"cuDriverGetVersion"):
            return None  # no such function to call (a stub): no child process either
        import subprocess
        import sys

        code = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); v = ctypes.c_int(0); "
                "sys.exit(3) if lib.cuDriverGetVersion(ctypes.byref(v)) else print(v.value)")
        try:
            done = subprocess.run([sys.executable, "-I", "-S", "-c", code, lib.host_path],
                                  capture_output=True, timeout=10, env={}, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        text = done.stdout.decode("ascii", "replace").strip()
        if done.returncode != 0 or not text.isdigit() or int(text) <= 0:
            return None
        raw = int(text)
        return f"{raw // 1000}.{raw % 1000 // 10}"

    # -- driver files -------------------------------------------------------------------

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

    def _library_paths(self, base: str, filename: str) -> List[str]:
        """Where ``filename`` may be, in order: beside (and behind) the ld.so.cache's
        entries for ``base``, then :data:`LIB_DIRS`."""
        candidates: List[str] = []
        for key, value in self.ldcache().items():
            if key == filename or key.startswith(base + ".so"):
                candidates.append(os.path.join(os.path.dirname(value), filename))
                resolved = self.resolve(value)  # Debian: libcuda.so.1 -> …/nvidia/current/
                if resolved is not None:
                    candidates.append(os.path.join(os.path.dirname(resolved), filename))
        candidates.extend(os.path.join(d, filename) for d in LIB_DIRS)
        candidates.extend(os.path.join(d, "vdpau", filename) for d in LIB_DIRS[:2])
        return list(dict.fromkeys(candidates))

    def _library_at(self, base: str, resolved: str, capability: str) -> Library:
        """The :class:`Library` whose file is ``resolved`` (an in-root path, links followed)."""
        from nvshim.host.elf import read_soname

        host = self.host_path(resolved)
        directory, filename = resolved.rsplit("/", 1)
        container = resolved
        if base == "libvdpau_nvidia":  # libvdpau looks in <libdir>/vdpau/ only
            container = f"{system_libdir(directory)}/vdpau/{filename}"
        return Library(base, host, container, read_soname(host), capability)

    def find_library(self, base: str, capability: str) -> Optional[Library]:
        """Locate ``<base>.so.<driver version>`` (or, for the libraries the driver ships
        with their own version, the file behind their SONAME) inside the driver root.

        The file mounted is the one every link resolves to in the root; its container
        path is where it lies there (VDPAU's is moved into ``<libdir>/vdpau/``).
        """
        name = OWN_VERSION_LIBRARIES.get(base) or f"{base}.so.{self.driver_version()}"
        for candidate in self._library_paths(base, name):
            resolved = self._regular_file(candidate)
            if resolved is not None:
                return self._library_at(base, resolved, capability)
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
        """The driver's programs of ``capabilities``, mounted where they were found in
        :data:`BIN_DIRS` (the file behind Debian's alternatives links, in the root)."""
        out = []
        for cap in sorted(capabilities):
            for name in BINARIES.get(cap, ()):
                for directory in BIN_DIRS:
                    path = f"{directory}/{name}"
                    resolved = self._regular_file(path)
                    if resolved is not None:
                        out.append(DriverFile(self.host_path(resolved), path, cap, "binary"))
                        break
        return tuple(out)

    def data_files(self, capabilities: Iterable[str]) -> Tuple[DriverFile, ...]:
        """The driver's configuration and data files of ``capabilities`` (:data:`DATA_FILES`):
        ICD and vendor JSONs, the OpenCL ICD, ``nvoptix.bin``, the Xorg modules."""
        caps = set(capabilities)
        version: Optional[str] = None
        out = []
        for cap, container_path, candidates in DATA_FILES:
            if cap not in caps:
                continue
            if "{version}" in container_path:
                version = version or self.driver_version()
                container_path = container_path.format(version=version)
                candidates = tuple(c.format(version=version) for c in candidates)
            for candidate in candidates:
                resolved = self._regular_file(candidate)
                if resolved is not None:
                    target = container_path or candidate
                    out.append(DriverFile(self.host_path(resolved), target, cap, "data"))
                    break
        return tuple(out)

    def firmware(self) -> Tuple[DriverFile, ...]:
        """The GSP firmware of the driver version (:meth:`driver_version`)."""
        version = self.driver_version()
        directory = f"/lib/firmware/nvidia/{version}"
        resolved_dir = self.resolve(directory)
        if resolved_dir is None:
            return ()
        try:
            names = sorted(os.listdir(self.host_path(resolved_dir)))
        except OSError:
            return ()
        out = []
        for name in names:
            if name.startswith("gsp") and name.endswith(".bin"):
                resolved = self._regular_file(f"{resolved_dir}/{name}")
                if resolved is not None:
                    out.append(DriverFile(self.host_path(resolved), f"{directory}/{name}",
                                          None, "firmware"))
        return tuple(out)

    def files(self, capabilities: Iterable[str]) -> Tuple[DriverFile, ...]:
        """Every driver file but the libraries and IPC sockets: programs, data, firmware."""
        caps = tuple(capabilities)
        return self.binaries(caps) + self.data_files(caps) + self.firmware()

    def driver_files(self, capabilities: Iterable[str]) -> Tuple[DriverFile, ...]:
        """What a container of ``capabilities`` gets besides libraries and device nodes."""
        caps = tuple(capabilities)
        return self.files(caps) + self.ipc(caps)

    def missing(self, capabilities: Iterable[str]) -> Tuple[str, ...]:
        """:func:`missing_files` of what this node has for ``capabilities``."""
        caps = tuple(capabilities)
        return missing_files(caps, self.libraries(caps), self.files(caps))

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
                resolved = self.resolve(path)
                try:
                    st = os.stat(self.host_path(resolved or path))
                except OSError:
                    continue
                if resolved is not None and stat.S_ISSOCK(st.st_mode):
                    out.append(DriverFile(self.host_path(resolved), path, cap, "ipc"))
                    break
        if "compute" in caps:
            path = "/tmp/nvidia-mps"
            resolved = self.resolve(path)
            if resolved is not None and os.path.isdir(self.host_path(resolved)):
                out.append(DriverFile(self.host_path(resolved), path, "compute", "ipc"))
        return tuple(out)


def resolve_in(root: str, path: str) -> Optional[str]:
    """``path`` with every link followed inside ``root``, as if chrooted there.

    Absolute link targets and ``..`` stay inside the root (``/etc/alternatives/x`` is the
    root's, never the host's), so what it returns, under ``root``, is a file of the root.
    None when a component does not exist, is not a folder where one is needed, or links
    loop (more than 40 links, as the kernel allows).
    """
    prefix = "" if root == "/" else root
    parts = [p for p in path.split("/") if p]
    done: List[str] = []
    links = 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        current = prefix + "/" + "/".join(done + [part])
        try:
            target = os.readlink(current)
        except FileNotFoundError:
            return None
        except OSError:  # EINVAL: not a link; ENOTDIR: a file where a folder is needed
            if parts and not os.path.isdir(current):
                return None
            done.append(part)
            continue
        links += 1
        if links > 40:
            return None
        if target.startswith("/"):
            done = []
        parts[0:0] = [p for p in target.split("/") if p]
    return "/" + "/".join(done)


def _mentions(path: str, name: bytes) -> bool:
    """Whether the file holds ``name`` (a symbol name in a library's string table)."""
    import mmap

    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(name) >= 0
    except (OSError, ValueError):  # ValueError: an empty file cannot be mapped
        return False


def missing_files(capabilities: Iterable[str], libraries: Iterable[Library],
                  files: Iterable[DriverFile]) -> Tuple[str, ...]:
    """The essential files (:data:`ESSENTIAL`) of ``capabilities`` that ``libraries`` and
    ``files`` lack, as ``"libcuda (compute)"``: a container asking for those capabilities
    would get a driver it cannot use."""
    have = {lib.base for lib in libraries}
    have |= {f.container_path.rsplit("/", 1)[1] for f in files}
    out: List[str] = []
    for cap in sorted(set(capabilities)):
        out += [f"{name} ({cap})" for name in ESSENTIAL.get(cap, ()) if name not in have]
    return tuple(out)


def system_libdir(directory: str) -> str:
    """The library folder a driver folder belongs to: Debian's ``…/nvidia/current`` (and a
    ``vdpau``/``gbm`` subfolder) map to the folder above them, where the loader's plugins
    (``vdpau/``, ``gbm/``) are looked for."""
    for suffix in ("/vdpau", "/gbm", "/nvidia/current"):
        if directory.endswith(suffix):
            directory = directory[: -len(suffix)]
    return directory or "/"
