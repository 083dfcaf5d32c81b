"""What the host has: GPUs, device nodes, driver version, driver files — the one seam.

The :class:`Host` is the one seam that reads the machine. Tests point it at a simulated
node (``nvshim sim create``) through ``driver_root``/``dev_root``; nothing is
monkeypatched. Results are plain records (:class:`~nvshim.host.devices.Gpu`,
:class:`~nvshim.host.capabilities.Library` …) that the pure edit builders in
:mod:`nvshim.edits` turn into container edits.

A node is read through a driver root and a dev root (:class:`nvshim.host.Roots`).

The rules live in the module named after what they find or decide, and :class:`Host`
calls them, importing each only when a question needs it:

- :mod:`nvshim.host.capabilities` — what each capability gets (the tables) and the
  records of what was found (always loaded: light);
- :mod:`nvshim.host.gpus` — GPUs (procfs or NVML) and the device nodes under the dev root;
  :mod:`nvshim.host.mig` their MIG devices, :mod:`nvshim.host.drm` their DRM nodes;
- :mod:`nvshim.host.driverfiles` — where libraries, programs, data files and firmware are
  found in the driver root; :mod:`nvshim.host.compat32` the 32-bit rules;
- :mod:`nvshim.host.versions` — the files' and the kernel module's driver version, and the
  CUDA version libcuda supports.

:mod:`nvshim.runtime.plancache` subclasses :class:`Host` to answer from the node plan
cache: a create it answers loads this module, the tables and the records, none of the
finders.
"""

from __future__ import annotations

import os
import stat

from nvshim.errors import HostError
from nvshim.host import Roots, resolve_in
from nvshim.host.capabilities import (
    BIN_DIRS,
    BINARIES,
    CONTROL_NODES,
    DATA_FILES,
    ESSENTIAL,
    LIB_DIRS,
    LIBRARIES,
    LIBRARY_SETS,
    OWN_VERSION_LIBRARIES,
    DriverFile,
    Library,
    drm_capabilities,
    missing_files,
    system_libdir,
    with_implied,
)
from nvshim.host.devices import Gpu, MigDevice

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Dict, Iterable, List, Optional, Tuple

    from nvshim.edits import DeviceNode
    from nvshim.host.drm import DrmNodes

__all__ = [
    "Host",
    "Roots",
    "Gpu",
    "MigDevice",
    "Library",
    "DriverFile",
    "LIBRARIES",
    "LIBRARY_SETS",
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


class Host(Roots):
    """Reads one node: a driver root (libraries, /proc files) and a dev root (nodes)."""

    def __init__(
        self,
        driver_root: str = "/",
        dev_root: Optional[str] = None,
        nvml_facts: Optional[str] = None,
    ) -> None:
        super().__init__(driver_root, dev_root)
        self.nvml_facts = nvml_facts
        """The config's ``nvml-facts`` file (:class:`nvshim.host.nvml.NvmlFacts`), or None."""
        self._gpus: Optional[Tuple[Gpu, ...]] = None
        self._ldcache: Optional[Dict[str, str]] = None
        self._ldcache32: Optional[Dict[str, str]] = None
        self._version: Optional[str] = None
        self.gpu_source: str = ""

    # -- GPUs and device nodes (nvshim.host.gpus, .drm) ----------------------------------

    def gpus(self, method: str = "auto") -> Tuple[Gpu, ...]:
        """All full GPUs of the node, index = PCI bus id order
        (:func:`nvshim.host.gpus.find_gpus`; ``method``: ``procfs``, ``nvml`` or ``auto``,
        whose answer is kept)."""
        if self._gpus is not None and method == "auto":
            return self._gpus
        from nvshim.host.gpus import find_gpus

        found, self.gpu_source = find_gpus(self, method)
        if method == "auto":
            self._gpus = found
        return found

    def device_node(self, container_path: str) -> Optional[DeviceNode]:
        """Stat a device node under the dev root; None when it does not exist."""
        from nvshim.host.gpus import device_node

        return device_node(self, container_path)

    def control_nodes(self, capabilities: Iterable[str]) -> Tuple[DeviceNode, ...]:
        """The control nodes of ``capabilities`` (:data:`CONTROL_NODES`) the node has."""
        caps = set(capabilities)
        found = (
            self.device_node(path)
            for path, needs in CONTROL_NODES
            if needs is None or needs in caps
        )
        return tuple(node for node in found if node is not None)

    def drm(self, gpu: Gpu) -> DrmNodes:
        """The GPU's DRM nodes and by-path links (:func:`nvshim.host.drm.find_drm`); asked
        only for the capabilities that get them."""
        from nvshim.host.drm import find_drm

        return find_drm(self, gpu.pci_bus_id)

    # -- driver files (nvshim.host.driverfiles, .compat32) ---------------------------------

    def ldcache(self) -> Dict[str, str]:
        """SONAME/file name → path (as the driver root sees it), x86-64 entries only."""
        if self._ldcache is None:
            from nvshim.host.driverfiles import ldcache

            self._ldcache = ldcache(self)
        return self._ldcache

    def find_library(self, base: str, capability: str) -> Optional[Library]:
        """:func:`nvshim.host.driverfiles.find_library`."""
        from nvshim.host.driverfiles import find_library

        return find_library(self, base, capability)

    def find_library32(self, base: str) -> Optional[Library]:
        """The 32-bit (i386) copy of ``base`` in the root, a ``compat32`` :class:`Library`,
        or None (:func:`nvshim.host.driverfiles.find_library32`)."""
        from nvshim.host.driverfiles import find_library32

        if self._ldcache32 is None:
            from nvshim.host.compat32 import ldcache32

            self._ldcache32 = ldcache32(self.host_path("/etc/ld.so.cache"))
        return find_library32(self, base, self._ldcache32)

    def libraries32(self, capabilities: Iterable[str]) -> Tuple[Library, ...]:
        """The 32-bit libraries ``capabilities`` ask for that the root has (none without
        ``compat32``; the node plan cache answers :meth:`find_library32`)."""
        from nvshim.host.compat32 import bases32

        found = (self.find_library32(b) for b in bases32(capabilities, LIBRARIES, LIBRARY_SETS))
        return tuple(lib for lib in found if lib is not None)

    def libraries(self, capabilities: Iterable[str]) -> Tuple[Library, ...]:
        """The 64-bit libraries of ``capabilities``, then (with ``compat32``) the 32-bit
        copies (:mod:`nvshim.host.compat32`)."""
        capabilities = tuple(capabilities)
        wanted: Dict[str, str] = {}
        for cap in sorted(capabilities):
            for libset in LIBRARY_SETS.get(cap, ()):
                for base in LIBRARIES[libset]:
                    wanted.setdefault(base, libset)
        found = [
            lib for base, cap in wanted.items() if (lib := self.find_library(base, cap)) is not None
        ]
        if "compat32" in capabilities:
            found += self.libraries32(capabilities)
        return tuple(found)

    def binaries(self, capabilities: Iterable[str]) -> Tuple[DriverFile, ...]:
        """:func:`nvshim.host.driverfiles.binaries`."""
        from nvshim.host.driverfiles import binaries

        return binaries(self, capabilities)

    def data_files(self, capabilities: Iterable[str]) -> Tuple[DriverFile, ...]:
        """:func:`nvshim.host.driverfiles.data_files`."""
        from nvshim.host.driverfiles import data_files

        return data_files(self, capabilities)

    def firmware(self) -> Tuple[DriverFile, ...]:
        """:func:`nvshim.host.driverfiles.firmware`."""
        from nvshim.host.driverfiles import firmware

        return firmware(self)

    def files(self, capabilities: Iterable[str]) -> Tuple[DriverFile, ...]:
        """Every driver file but the libraries and IPC sockets: programs, data, firmware."""
        caps = tuple(capabilities)
        return self.binaries(caps) + self.data_files(caps) + self.firmware()

    def driver_files(self, capabilities: Iterable[str]) -> Tuple[DriverFile, ...]:
        """What a container of ``capabilities`` gets besides libraries and device nodes
        (``display``'s includes ``graphics``'s: :data:`~nvshim.host.capabilities.FILE_SETS`)."""
        caps = tuple(capabilities)
        return self.files(with_implied(caps)) + self.ipc(caps)

    def ipc(self, capabilities: Iterable[str]) -> Tuple[DriverFile, ...]:
        """The daemons' IPC sockets and the MPS folder ``capabilities`` get: looked up live
        on every create (they come and go with their daemons)."""
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

    # -- driver version (nvshim.host.versions) ------------------------------------------

    def module_version(self) -> Optional[str]:
        """The loaded kernel module's version (``/proc/driver/nvidia/version``), or None."""
        from nvshim.host import versions

        return versions.module_version(self)

    def files_version(self) -> Optional[str]:
        """The version of the driver's userspace files, or None when there are none
        (:func:`nvshim.host.versions.files_version`)."""
        from nvshim.host import versions

        return versions.files_version(self)

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
        """The newest CUDA version libcuda supports (:func:`nvshim.host.versions.cuda_version`:
        asked in a child process, once per driver: the node plan cache keeps it)."""
        from nvshim.host import versions

        return versions.cuda_version(self)

    # -- what a capability asked for and did not find ---------------------------------

    def missing(self, capabilities: Iterable[str]) -> Tuple[str, ...]:
        """The essential driver files (:func:`missing_files`) and, for the capabilities that
        get them, the DRM card and render nodes (:func:`nvshim.host.drm.missing_drm`) this
        node lacks for ``capabilities``: ``doctor`` names them."""
        caps = tuple(capabilities)
        out = missing_files(caps, self.libraries(caps), self.files(with_implied(caps)))
        asking = drm_capabilities(caps)
        if asking:
            from nvshim.host.drm import missing_drm

            out += missing_drm(asking, ((gpu.index, self.drm(gpu)) for gpu in self.gpus()))
        return out
