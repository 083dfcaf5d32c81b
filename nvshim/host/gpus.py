"""The node's GPUs and device nodes: procfs or NVML enumeration, control nodes.

GPUs come from procfs (``/proc/driver/nvidia/gpus/*/information``) or NVML. The runtime
prefers procfs — it answers without loading the driver library and holds everything
injection needs (minor, UUID, PCI bus id); NVML is used when procfs has no GPUs and the
driver root is ``/``, and by the CLI when asked. Index order = PCI bus id order, which
is how NVML numbers GPUs. MIG devices are :mod:`nvshim.host.mig`'s.
"""

from __future__ import annotations

import os
import stat

from nvshim._record import dataclass, field
from nvshim.edits import DeviceNode
from nvshim.errors import HostError
from nvshim.host.devices import GpuRef, MigDevice, MigRef, normalize_pci
from nvshim.host.roots import Roots, resolve_in

TYPE_CHECKING = False  # typing costs ~4 ms to import on the create path
if TYPE_CHECKING:
    from typing import Dict, Iterable, List, Optional, Tuple

    from nvshim.host.drm import DrmNodes

__all__ = ["CONTROL_NODES", "DRM_CAPABILITIES", "Gpu", "GpuFinder", "drm_capabilities",
           "wants_drm"]

#: Control device nodes and the capability that needs each (None = always).
CONTROL_NODES: Tuple[Tuple[str, Optional[str]], ...] = (
    ("/dev/nvidiactl", None),
    ("/dev/nvidia-uvm", "compute"),
    ("/dev/nvidia-uvm-tools", "compute"),
    ("/dev/nvidia-modeset", "display"),
)

#: The capabilities that get each granted GPU's DRM nodes (:mod:`nvshim.host.drm`), as the
#: reference's graphics modifier gives them.
DRM_CAPABILITIES = ("graphics", "display")


def drm_capabilities(capabilities: Iterable[str]) -> Tuple[str, ...]:
    """Those of ``capabilities`` that get the GPUs' DRM nodes, sorted."""
    return tuple(sorted({cap for cap in capabilities if cap in DRM_CAPABILITIES}))


def wants_drm(capabilities: Iterable[str]) -> bool:
    """Whether ``capabilities`` get the GPUs' DRM nodes (no DRM lookup otherwise)."""
    return any(cap in DRM_CAPABILITIES for cap in capabilities)


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



def _parse_information(text: str) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


class GpuFinder(Roots):
    """Finds the GPUs of a node and the device nodes under its dev root."""

    nvml_facts: Optional[str]
    _gpus: Optional[Tuple[Gpu, ...]]
    gpu_source: str

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

    def drm(self, gpu: Gpu) -> DrmNodes:
        """The GPU's DRM nodes and by-path links (:func:`nvshim.host.drm.find_drm`); asked
        only for the capabilities that get them."""
        from nvshim.host.drm import find_drm

        return find_drm(self, gpu.pci_bus_id)
