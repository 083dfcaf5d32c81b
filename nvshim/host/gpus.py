"""The node's GPUs and device nodes: procfs or NVML enumeration.

GPUs come from procfs (``/proc/driver/nvidia/gpus/*/information``) or NVML. The runtime
prefers procfs — it answers without loading the driver library and holds everything
injection needs (minor, UUID, PCI bus id); NVML is used when procfs has no GPUs and the
driver root is ``/``, and by the CLI when asked. Index order = PCI bus id order, which
is how NVML numbers GPUs. MIG devices are :mod:`nvshim.host.mig`'s, DRM nodes
:mod:`nvshim.host.drm`'s; the records (:class:`~nvshim.host.devices.Gpu`) and which
capability gets which control node (:data:`~nvshim.host.capabilities.CONTROL_NODES`) are in
light modules of their own.

Functions of the :class:`~nvshim.host.discovery.Host`, which calls them through its methods
of the same names and imports this module only then: a create answered by the node plan
cache never loads it.
"""

from __future__ import annotations

import os
import stat

from nvshim.edits import DeviceNode
from nvshim.errors import HostError
from nvshim.host import driver_loaded, resolve_in
from nvshim.host.devices import Gpu, MigDevice, normalize_pci

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

    from nvshim.host import Roots

__all__ = ["device_node", "find_gpus"]


def _parse_information(text: str) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def device_node(host: Roots, container_path: str) -> Optional[DeviceNode]:
    """Stat a device node under the dev root; None when it does not exist."""
    resolved = resolve_in(host.dev_root, container_path)  # a link stays in the dev root
    if resolved is None:
        return None
    path = host.dev_path(resolved)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise HostError(f"cannot stat device node {path}: {exc.strerror}") from exc
    if stat.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat.S_ISBLK(st.st_mode):
        kind = "b"
    else:
        raise HostError(f"{path} is not a device node")
    return DeviceNode(
        path=container_path,
        host_path=path,
        type=kind,
        major=os.major(st.st_rdev),
        minor=os.minor(st.st_rdev),
        file_mode=stat.S_IMODE(st.st_mode),
    )


def find_gpus(host: Roots, method: str) -> Tuple[Tuple[Gpu, ...], str]:
    """(all full GPUs of the node, index = PCI bus id order; where they came from:
    ``procfs`` or ``nvml``).

    ``method``: ``procfs``, ``nvml`` or ``auto`` (procfs, then NVML when procfs has
    none and the driver root is ``/``).
    """
    if method == "nvml":
        return _gpus_from_nvml(host), "nvml"
    found = _gpus_from_procfs(host)
    if not found and method == "auto" and host.driver_root == "/" and driver_loaded():
        try:
            return _gpus_from_nvml(host), "nvml"
        except HostError:
            pass
    return found, "procfs"


def _gpus_from_procfs(host: Roots) -> Tuple[Gpu, ...]:
    base = host.host_path("/proc/driver/nvidia/gpus")
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
            raise HostError(f"{path}: cannot read GPU UUID, Device Minor and Bus Location from it")
        raw.append((bus, int(minor_text), uuid, info.get("Model", "")))
    raw.sort()
    return tuple(_make_gpu(host, i, *r) for i, r in enumerate(raw))


def _gpus_from_nvml(host: Roots) -> Tuple[Gpu, ...]:
    from nvshim.host.nvml import as_text, nvml

    with nvml("NVML query failed", host.driver_root) as pynvml:
        raw = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = as_text(pynvml.nvmlDeviceGetUUID(handle))
            minor = int(pynvml.nvmlDeviceGetMinorNumber(handle))
            bus = normalize_pci(as_text(pynvml.nvmlDeviceGetPciInfo(handle).busId)) or ""
            model = as_text(pynvml.nvmlDeviceGetName(handle))
            raw.append((bus, minor, uuid, model))
    raw.sort()
    return tuple(_make_gpu(host, i, *r) for i, r in enumerate(raw))


def _make_gpu(host: Roots, index: int, bus: str, minor: int, uuid: str, model: str) -> Gpu:
    node = host.device_node(f"/dev/nvidia{minor}")
    if node is None:
        raise HostError(
            f"GPU {index} ({uuid}) has device minor {minor} but "
            f"{host.dev_path(f'/dev/nvidia{minor}')} does not exist"
        )
    mig = _mig_devices(host, index, minor)
    return Gpu(index, minor, uuid, bus, model, node, mig)


def _mig_devices(host: Roots, index: int, minor: int) -> Tuple[MigDevice, ...]:
    """MIG devices of a GPU, from the capability files procfs exposes.

    procfs has no MIG UUIDs: :mod:`nvshim.host.mig` asks
    :class:`nvshim.host.nvml.NvmlFacts` (NVML, else the ``nvml-facts`` file).
    """
    from nvshim.host import mig

    return mig.discover_mig(host, index, minor)
