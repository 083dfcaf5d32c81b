"""Who holds which GPU now: the grant journal's live records, GPUs held twice, and their
renderings for ``nvshim grants`` (table, JSON, Prometheus textfile).

:func:`read_journal` reads the journal as ``nvshim grants`` needs it: the records, and the
numbers of the lines that are not records (the runtime's own reader skips them silently).

Kept out of :mod:`nvshim.runtime.grants`, which every GPU create imports to append its
record: none of this runs at create, and its record type alone cost the create path
an import-time dataclass. A grant is live while its container exists
(``<runtime> --root R state ID``).
"""

from __future__ import annotations

from nvshim import _jsonc
from nvshim._record import dataclass
from nvshim.errors import one_line
from nvshim.runtime.grants import Grant, container_exists

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

__all__ = [
    "Journal",
    "Holder",
    "read_journal",
    "gpu_indices",
    "live_grants",
    "conflicts",
    "shared_claims",
    "render_table",
    "render_json",
    "render_prometheus",
]


@dataclass(frozen=True)
class Journal:
    """What a grant journal holds: its records in order, and the (1-based) numbers of the
    lines that are not records: garbage, foreign JSON, another record version, or a last
    line cut short by a crash."""

    path: str
    grants: Tuple[Grant, ...]
    unreadable: Tuple[int, ...]


def read_journal(path: str) -> Optional[Journal]:
    """The journal at ``path``, or None when there is no file there.

    Raises HostError when it cannot be read or is not a regular file (a FIFO would block
    the reader until a writer came); blank lines are neither records nor unreadable.
    """
    from nvshim.runtime.grants import parse_record, read_journal_bytes

    data = read_journal_bytes(path)
    if data is None:
        return None
    grants: List[Grant] = []
    unreadable: List[int] = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        grant = parse_record(raw)
        if grant is None:
            unreadable.append(number)
        else:
            grants.append(grant)
    return Journal(path, tuple(grants), tuple(unreadable))


def gpu_indices(host: Any) -> Dict[str, str]:
    """UUID → index as nvidia-smi numbers the node's devices (PCI bus order, as discovery):
    ``"0"`` for a GPU, ``"0:1"`` for MIG device 1 of GPU 0."""
    out: Dict[str, str] = {}
    for gpu in host.gpus():
        out[gpu.uuid] = str(gpu.index)
        for mig in gpu.mig:
            out[mig.uuid] = f"{gpu.index}:{mig.index}"
    return out


@dataclass(frozen=True)
class Holder:
    """A grant whose container still exists, with its state."""

    grant: Grant
    status: str
    pid: int


def _state(grant: Grant, timeout: float) -> Tuple[str, int]:
    """``<runtime> --root R state ID`` → (status, pid); ("gone", 0) for no such container."""
    import subprocess

    if not container_exists(grant):
        return "gone", 0
    try:
        res = subprocess.run(
            [grant.runtime, "--root", grant.root, "state", grant.container_id],
            capture_output=True,
            timeout=timeout,
            check=False,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown", 0
    if res.returncode != 0:
        return ("gone", 0) if not container_exists(grant) else ("unknown", 0)
    try:
        doc = _jsonc.loads(res.stdout)
        return str(doc.get("status", "unknown")), int(doc.get("pid") or 0)
    except (ValueError, TypeError, AttributeError):
        return "unknown", 0


def live_grants(grants: Sequence[Grant], timeout: float = 5.0) -> List[Holder]:
    """The newest record per container that still exists and is not stopped."""
    latest: Dict[Tuple[str, str], Grant] = {}
    for grant in grants:
        key = (grant.root, grant.container_id)
        latest.pop(key, None)
        latest[key] = grant
    out: List[Holder] = []
    for grant in latest.values():
        status, pid = _state(grant, timeout)
        if status in ("created", "running", "paused", "creating", "unknown"):
            out.append(Holder(grant, status, pid))
    return out


def shared_claims(gpu: str, holders: Sequence[Holder]) -> List[str]:
    """The DRA claims (``namespace/claim``) through which every one of ``holders`` got
    ``gpu``, as the kubelet listed them for each."""
    common: Optional[Set[str]] = None
    for h in holders:
        mine = {claim for claim, uuids in h.grant.claims if gpu in uuids}
        common = mine if common is None else common & mine
    return sorted(common or ())


def conflicts(holders: Sequence[Holder]) -> Dict[str, List[Holder]]:
    """GPUs held by more than one live container where not every grant is a replica grant
    and not every holder got it through one DRA claim the kubelet listed for each.

    A privileged container (source ``privileged``) holds every device by privilege: it is
    listed, never counted as a conflict (a node's privileged GPU system pods would flag
    every GPU and teach operators to ignore CONFLICT)."""
    by_gpu: Dict[str, List[Holder]] = {}
    for h in holders:
        if h.grant.source.split("+")[-1] == "privileged":
            continue
        for gpu in h.grant.gpus:
            by_gpu.setdefault(gpu, []).append(h)
    return {
        gpu: hs
        for gpu, hs in by_gpu.items()
        if len(hs) > 1 and not all(h.grant.shared for h in hs) and not shared_claims(gpu, hs)
    }


def _note(
    gpu: str, holder: Holder, holders: Sequence[Holder], clash: Mapping[str, List[Holder]]
) -> str:
    """The table's NOTE for one (GPU, holder) row."""
    g = holder.grant
    if gpu in clash:
        return "CONFLICT: held by another live container"
    if g.source.split("+")[-1] == "privileged":
        return "privileged (holds every device)"
    if g.shared:
        return "shared (replica)"
    others = [
        h
        for h in holders
        if gpu in h.grant.gpus and h.grant.claims and h.grant.source.split("+")[-1] != "privileged"
    ]
    claims = shared_claims(gpu, others) if len(others) > 1 else []
    return f"shared (DRA claim {', '.join(claims)})" if claims else ""


# --- rendering ----------------------------------------------------------------------------


def _who(g: Grant) -> str:
    if g.pod:
        return f"{g.namespace}/{g.pod}/{g.container}"
    return "-"


def _index_order(index: str) -> Tuple[int, ...]:
    """``"10"`` after ``"2"``, ``"0:1"`` after ``"0"``; an unknown index (``?``) last."""
    parts = index.split(":")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else (1 << 30,)


def render_table(holders: Sequence[Holder], indices: Optional[Mapping[str, str]] = None) -> str:
    """One row per (GPU, container): the GPU's index on this node (``?`` when it has no such
    GPU now) and UUID; a GPU held twice without sharing is marked CONFLICT."""
    indices = indices or {}
    clash = conflicts(holders)
    rows: List[Tuple[str, ...]] = [
        ("GPU", "UUID", "CONTAINER", "POD", "SOURCE", "VERIFIED", "STATUS", "NOTE")
    ]
    for h in holders:
        g = h.grant
        for gpu in g.gpus:
            note = _note(gpu, h, holders, clash)
            row = (
                indices.get(gpu, "?"),
                gpu,
                g.container_id,
                _who(g),
                g.source,
                g.verified,
                h.status,
                note,
            )
            rows.append(tuple(one_line(c) for c in row))  # no record adds a line or column
    rows[1:] = sorted(rows[1:], key=lambda r: (_index_order(r[0]), r))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if clash:
        lines.append("")
        for gpu, hs in sorted(clash.items()):
            lines.append(
                one_line(
                    f"conflict: {gpu} is held by {len(hs)} live containers "
                    "without time-slicing: " + ", ".join(h.grant.container_id for h in hs),
                    None,
                )
            )
    return "\n".join(lines)


def render_json(holders: Sequence[Holder], indices: Optional[Mapping[str, str]] = None) -> str:
    """``{"grants": [...], "conflicts": {uuid: [container ids]}}``; each grant's
    ``gpu_indices`` lines up with its ``gpus`` (null for a UUID this node does not have)."""
    indices = indices or {}
    clash = conflicts(holders)
    doc = {
        "grants": [
            {
                "container_id": h.grant.container_id,
                "status": h.status,
                "pid": h.pid,
                "gpus": list(h.grant.gpus),
                "gpu_indices": [indices.get(gpu) for gpu in h.grant.gpus],
                "source": h.grant.source,
                "verified": h.grant.verified,
                "shared": h.grant.shared,
                "namespace": h.grant.namespace,
                "pod": h.grant.pod,
                "pod_uid": h.grant.pod_uid,
                "container": h.grant.container,
                "bundle": h.grant.bundle,
                "root": h.grant.root,
                "time": h.grant.time,
                "claims": {claim: list(uuids) for claim, uuids in h.grant.claims},
            }
            for h in holders
        ],
        "conflicts": {gpu: [h.grant.container_id for h in hs] for gpu, hs in sorted(clash.items())},
    }
    return _jsonc.dumps(doc, indent=2)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_prometheus(holders: Sequence[Holder]) -> str:
    """node-exporter textfile-collector text: one sample per live (GPU, container)."""
    out = [
        "# HELP nvshim_gpu_grants GPUs granted by nvshim to containers that are still live.",
        "# TYPE nvshim_gpu_grants gauge",
    ]
    samples = set()
    for h in holders:
        g = h.grant
        for gpu in g.gpus:
            labels = (
                f'gpu="{_label(gpu)}",namespace="{_label(g.namespace)}",'
                f'pod="{_label(g.pod)}",container="{_label(g.container or g.container_id)}",'
                f'container_id="{_label(g.container_id)}",source="{_label(g.source)}"'
            )
            samples.add(f"nvshim_gpu_grants{{{labels}}} 1")
    out.extend(sorted(samples))
    clash = conflicts(holders)
    out.append("# HELP nvshim_gpu_grant_conflicts Live containers holding one unshared GPU.")
    out.append("# TYPE nvshim_gpu_grant_conflicts gauge")
    for gpu, hs in sorted(clash.items()):
        out.append(f'nvshim_gpu_grant_conflicts{{gpu="{_label(gpu)}"}} {len(hs)}')
    return "\n".join(out) + "\n"
