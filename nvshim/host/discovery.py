"""What the host has: GPUs, device nodes, driver version, driver files — the one seam.

The :class:`Host` is the one seam that reads the machine. Tests point it at a simulated
node (``nvshim sim create``) through ``driver_root``/``dev_root``; nothing is
monkeypatched. Results are plain records (:class:`Gpu`, :class:`Library` …) that the
pure edit builders in :mod:`nvshim.edits` turn into container edits.

The rules live in the module named after what they find, and :class:`Host` joins them:

- :mod:`nvshim.host.roots` — the driver and dev roots, links followed inside them;
- :mod:`nvshim.host.gpus` — GPUs (procfs or NVML) and the device nodes under the dev root;
- :mod:`nvshim.host.driverfiles` — the per-capability tables of libraries, programs, data
  files, firmware and sockets, and where they are found in the driver root;
- :mod:`nvshim.host.versions` — the files' and the kernel module's driver version, and the
  CUDA version libcuda supports (loaded when a version is read: the node plan cache
  answers a create without it).

Importers keep using this module's names; :mod:`nvshim.runtime.plancache` subclasses
:class:`Host` to answer from the node plan cache.
"""

from __future__ import annotations

from nvshim.errors import HostError
from nvshim.host.devices import MigDevice
from nvshim.host.driverfiles import (
    BIN_DIRS,
    BINARIES,
    DATA_FILES,
    ESSENTIAL,
    LIB_DIRS,
    LIBRARIES,
    LIBRARY_SETS,
    OWN_VERSION_LIBRARIES,
    DriverFile,
    DriverFileFinder,
    Library,
    missing_files,
    system_libdir,
)
from nvshim.host.gpus import CONTROL_NODES, Gpu, GpuFinder, drm_capabilities
from nvshim.host.roots import resolve_in

TYPE_CHECKING = False  # typing costs ~4 ms to import on the create path
if TYPE_CHECKING:
    from typing import Dict, Iterable, Optional, Tuple

__all__ = [
    "Host",
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


class Host(GpuFinder, DriverFileFinder):
    """Reads one node: a driver root (libraries, /proc files) and a dev root (nodes)."""

    def __init__(self, driver_root: str = "/", dev_root: Optional[str] = None,
                 nvml_facts: Optional[str] = None) -> None:
        super().__init__(driver_root, dev_root)
        self.nvml_facts = nvml_facts
        """The config's ``nvml-facts`` file (:class:`nvshim.host.nvml.NvmlFacts`), or None."""
        self._gpus: Optional[Tuple[Gpu, ...]] = None
        self._ldcache: Optional[Dict[str, str]] = None
        self._version: Optional[str] = None
        self.gpu_source: str = ""

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
        out = DriverFileFinder.missing(self, caps)
        asking = drm_capabilities(caps)
        if asking:
            from nvshim.host.drm import missing_drm

            out += missing_drm(asking, ((gpu.index, self.drm(gpu)) for gpu in self.gpus()))
        return out
