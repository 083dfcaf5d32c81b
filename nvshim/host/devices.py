"""How a GPU or a MIG device is named: the records discovery fills in, and the device-token
grammar of NVIDIA_VISIBLE_DEVICES (and of device-plugin ids) that picks them.

The records (:class:`Gpu`, :class:`MigDevice`, and the :class:`GpuRef`/:class:`MigRef`
identities request matching needs) are shared by discovery and the runtime's request, so
neither imports the other, and a create answered by the node plan cache builds its
:class:`Gpu` records without loading the finders (:mod:`nvshim.host.gpus`).

:func:`parse_visible_devices` turns one value into normalised tokens (indices, GPU/MIG
UUIDs, PCI bus ids, ``<gpu>:<mig>``, CDI names, ``all``/``none``); :func:`select_gpus` maps
them onto the node's GPUs. Pure: no filesystem. Loaded only when a container names a
device: :mod:`nvshim.runtime.claim` and :mod:`nvshim.runtime.request` import it lazily, so
a create that asks for nothing never does.
"""

from __future__ import annotations

from nvshim._record import dataclass, field
from nvshim.errors import RequestError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence, Tuple

    from nvshim.edits import DeviceNode

__all__ = [
    "Gpu",
    "GpuRef",
    "MigDevice",
    "MigRef",
    "all_uuids",
    "describe_indices",
    "hex_digits",
    "is_qualified",
    "names_replicas",
    "normalize_pci",
    "parse_visible_devices",
    "select_gpus",
]

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


# The token grammars below are plain string checks, not regular expressions: ``re``
# (with enum, functools, collections) is a costly import on every GPU create (BENCHMARKS.md).
def _digits(text: str) -> bool:
    """``[0-9]+``: ASCII digits only (str.isdigit alone accepts other scripts' digits)."""
    return text.isascii() and text.isdigit()


def _uuid(token: str, prefix: str) -> bool:
    """``<prefix>-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` (hex, any case, prefix too)."""
    if len(token) != 40 or token[:4].upper() != prefix + "-":
        return False
    parts = token[4:].split("-")
    return [len(p) for p in parts] == [8, 4, 4, 4, 12] and all(hex_digits(p, 1, 12) for p in parts)


def _gpu_uuid(token: str) -> bool:
    return _uuid(token, "GPU")


def _mig_uuid(token: str) -> bool:
    return _uuid(token, "MIG")


def _replica_of(token: str) -> Optional[str]:
    """``<device>::<N>`` (a device plugin's shared-GPU replica) → ``<device>``, else None."""
    cut = token.rfind("::")
    if cut < 1 or not _digits(token[cut + 2 :]) or "\n" in token[:cut]:
        return None
    return token[:cut]


def _mig_pair(token: str) -> Optional[Tuple[str, str]]:
    """``<gpu>:<mig>`` (both decimal) → the two numbers as written, else None."""
    gpu, sep, mig = token.partition(":")
    return (gpu, mig) if sep and _digits(gpu) and _digits(mig) else None


def is_qualified(token: str) -> bool:
    """A CDI-qualified name has ``vendor/class=name``; a PCI id or UUID never has ``/``."""
    head, sep, tail = token.partition("=")
    return bool(sep) and "/" in head and bool(tail) and not head.startswith("/")


def parse_visible_devices(value: str) -> Tuple[str, ...]:
    """The NVIDIA_VISIBLE_DEVICES grammar.

    Returns ``()`` for "not a GPU container" (empty, ``void``), ``("none",)`` for driver
    files only, ``("all",)`` for all GPUs, else the tokens in order: trimmed, empties
    dropped, ``::N`` replica suffixes removed, duplicates collapsed.
    """
    tokens: List[str] = []
    for raw in value.split(","):
        token = raw.strip()
        if not token:
            continue
        head = _replica_of(token)
        if head is not None and not is_qualified(token):
            token = head
        tokens.append(token)
    if not tokens or any(t.lower() == "void" for t in tokens):
        return ()
    for token in tokens:
        if token.lower() in ("all", "none"):
            return (token.lower(),)
    seen: Dict[str, None] = {}
    for token in tokens:
        key = token.lower() if (_gpu_uuid(token) or _mig_uuid(token)) else token
        seen.setdefault(key, None)
    return tuple(_canonical(t) for t in seen)


def _canonical(token: str) -> str:
    if _gpu_uuid(token) or _mig_uuid(token):
        return token[:4].upper() + token[4:].lower()
    return token


def names_replicas(values: Sequence[str]) -> bool:
    """Whether any raw id is a time-slicing replica (``<id>::N``)."""
    return any(
        _replica_of(v.strip()) is not None and not is_qualified(v.strip())
        for value in values
        for v in value.split(",")
    )


def all_uuids(tokens: Sequence[str]) -> bool:
    return bool(tokens) and all(_gpu_uuid(t) or _mig_uuid(t) for t in tokens)


def describe_indices(indices: Sequence[int]) -> str:
    """``[0,1,2,3]`` → ``0-3``; ``[0,2,3]`` → ``0,2-3``; ``[]`` → ``none``."""
    if not indices:
        return "none"
    ordered = sorted(indices)
    parts: List[str] = []
    start = prev = ordered[0]
    tail: List[Optional[int]] = [None]
    for i in [*ordered[1:], *tail]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


def _node_summary(gpus: Sequence[GpuRef]) -> str:
    if not gpus:
        return "this node has no GPUs"
    return f"this node has GPUs {describe_indices([g.index for g in gpus])}"


def select_gpus(
    tokens: Sequence[str], gpus: Sequence[GpuRef], where: str = ""
) -> Tuple[Tuple[GpuRef, ...], Tuple[MigRef, ...]]:
    """Map request tokens (not CDI names) onto GPUs and MIG devices, in request order.

    ``all`` selects every GPU (a MIG-enabled GPU brings its MIG devices). Unknown tokens
    raise one error naming the token, what the node has and ``where`` that was looked up
    (e.g. ``under driver root / (config /etc/nvshim/config.yaml)``), placed right after
    the node's devices.
    """
    if tuple(tokens) == ("all",):
        return tuple(gpus), tuple(m for g in gpus for m in g.mig)
    by_index = {str(g.index): g for g in gpus}
    by_uuid = {g.uuid.lower(): g for g in gpus}
    by_pci = {normalize_pci(g.pci_bus_id): g for g in gpus}
    migs = [m for g in gpus for m in g.mig]
    mig_by_uuid = {m.uuid.lower(): m for m in migs}
    mig_by_pair = {f"{m.gpu_index}:{m.index}": m for m in migs}
    chosen: Dict[int, GpuRef] = {}
    chosen_mig: Dict[str, MigRef] = {}
    for token in tokens:
        if token in ("all", "none"):
            raise RequestError(f'"{token}" cannot be combined with other devices')
        gpu = None
        mig = None
        pair = _mig_pair(token)
        if _digits(token):
            gpu = by_index.get(token.lstrip("0") or "0")  # no int(): 10 000 digits is fine
        elif _gpu_uuid(token):
            gpu = by_uuid.get(token.lower())
        elif _mig_uuid(token):
            mig = mig_by_uuid.get(token.lower())
        elif pair is not None:
            mig = mig_by_pair.get(f"{pair[0].lstrip('0') or '0'}:{pair[1].lstrip('0') or '0'}")
        else:
            pci = normalize_pci(token)
            if pci is not None:
                gpu = by_pci.get(pci)
        if gpu is not None:
            chosen.setdefault(gpu.index, gpu)
        elif mig is not None:
            chosen_mig.setdefault(mig.uuid, mig)
        else:
            summary = _node_summary(gpus)
            hint = ""
            if _mig_uuid(token) or pair is not None:
                summary += f" and MIG devices {', '.join(sorted(mig_by_pair)) or 'none'}"
                if not mig_by_pair:  # their UUIDs come from NVML (or config nvml-facts)
                    hint = "; MIG devices are named by NVML or, without it, by config nvml-facts"
            if where:
                summary += f" {where}"
            raise RequestError(f'unknown device "{token}": {summary}{hint}')
    return tuple(chosen.values()), tuple(chosen_mig.values())
