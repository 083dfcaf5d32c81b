"""Small records naming a GPU or a MIG device, shared by discovery and request matching.

Kept apart so that :mod:`nvshim.runtime.request` (which matches tokens onto GPUs) and
:mod:`nvshim.host.discovery` (which finds them) need not import each other, and so that a
create answered by the node plan cache builds its :class:`Gpu` records without loading
the finders (:mod:`nvshim.host.gpus`).
"""

from __future__ import annotations

from nvshim._record import dataclass, field

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional, Tuple

    from nvshim.edits import DeviceNode

_HEX = frozenset("0123456789abcdefABCDEF")


def hex_digits(text: str, low: int, high: int) -> bool:
    """``[0-9a-f]{low,high}`` (either case)."""
    return low <= len(text) <= high and all(c in _HEX for c in text)


@dataclass(frozen=True)
class MigDevice:
    """A MIG device: its parent GPU, GPU/compute instance ids and capability nodes."""

    gpu_index: int
    index: int
    gi: int
    ci: int
    uuid: str
    profile: str = ""
    cap_nodes: Tuple[DeviceNode, ...] = ()


@dataclass(frozen=True)
class GpuRef:
    """The identity of a GPU as request matching needs it (discovery builds these)."""

    index: int
    uuid: str
    pci_bus_id: str
    mig: Tuple["MigRef", ...] = field(default=())


@dataclass(frozen=True)
class MigRef:
    """A MIG device of a GPU: ``<gpu index>:<mig index>`` and its UUID."""

    gpu_index: int
    index: int
    uuid: str


def normalize_pci(bus_id: str) -> Optional[str]:
    """``18:00.0``, ``0000:18:00.0``, ``00000000:18:00.0`` → ``0000:18:00.0`` (lower case)."""
    head, dot, fn = bus_id.strip().rpartition(".")
    parts = head.split(":")
    if not dot or len(fn) != 1 or fn not in "01234567" or len(parts) not in (2, 3):
        return None
    domain = parts[0] if len(parts) == 3 else "0"
    bus, dev = parts[-2], parts[-1]
    if not (hex_digits(domain, 1, 8) and hex_digits(bus, 1, 2) and hex_digits(dev, 1, 2)):
        return None
    return "%04x:%02x:%02x.%s" % (int(domain, 16), int(bus, 16), int(dev, 16), fn)


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
