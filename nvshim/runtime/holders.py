"""Who holds which GPU now: the grant journal's live records, GPUs held twice, and their
renderings for ``nvshim grants`` (table, JSON, Prometheus textfile).

Kept out of :mod:`nvshim.runtime.grants`, which every GPU create imports to append its
record: none of this runs at create, and its record type alone cost the create path
an import-time dataclass. A grant is live while its container exists
(``<runtime> --root R state ID``).
"""

from __future__ import annotations

from nvshim import _jsonc
from nvshim._record import dataclass
from nvshim.runtime.grants import Grant, container_exists, read_grants

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Sequence, Tuple

__all__ = ["Holder", "live_grants", "conflicts", "render_table", "render_json",
           "render_prometheus"]


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
            capture_output=True, timeout=timeout, check=False,
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


def live_grants(path: str, timeout: float = 5.0) -> List[Holder]:
    """The newest record per container that still exists and is not stopped."""
    latest: Dict[Tuple[str, str], Grant] = {}
    for grant in read_grants(path):
        key = (grant.root, grant.container_id)
        latest.pop(key, None)
        latest[key] = grant
    out: List[Holder] = []
    for grant in latest.values():
        status, pid = _state(grant, timeout)
        if status in ("created", "running", "paused", "creating", "unknown"):
            out.append(Holder(grant, status, pid))
    return out


def conflicts(holders: Sequence[Holder]) -> Dict[str, List[Holder]]:
    """GPUs held by more than one live container where not every grant is a replica grant."""
    by_gpu: Dict[str, List[Holder]] = {}
    for h in holders:
        for gpu in h.grant.gpus:
            by_gpu.setdefault(gpu, []).append(h)
    return {
        gpu: hs for gpu, hs in by_gpu.items()
        if len(hs) > 1 and not all(h.grant.shared for h in hs)
    }


# --- rendering ----------------------------------------------------------------------------


def _who(g: Grant) -> str:
    if g.pod:
        return f"{g.namespace}/{g.pod}/{g.container}"
    return "-"


def render_table(holders: Sequence[Holder]) -> str:
    """One row per (GPU, container); a GPU held twice without sharing is marked CONFLICT."""
    clash = conflicts(holders)
    rows = [("GPU", "CONTAINER", "POD", "SOURCE", "VERIFIED", "STATUS", "NOTE")]
    for h in holders:
        g = h.grant
        for gpu in g.gpus:
            note = "CONFLICT: held by another live container" if gpu in clash else (
                "shared (replica)" if g.shared else "")
            rows.append((gpu, g.container_id, _who(g), g.source, g.verified, h.status, note))
    rows[1:] = sorted(rows[1:])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if clash:
        lines.append("")
        for gpu, hs in sorted(clash.items()):
            lines.append(f"conflict: {gpu} is held by {len(hs)} live containers without "
                         "time-slicing: " + ", ".join(h.grant.container_id for h in hs))
    return "\n".join(lines)


def render_json(holders: Sequence[Holder]) -> str:
    clash = conflicts(holders)
    doc = {
        "grants": [
            {"container_id": h.grant.container_id, "status": h.status, "pid": h.pid,
             "gpus": list(h.grant.gpus), "source": h.grant.source, "verified": h.grant.verified,
             "shared": h.grant.shared, "namespace": h.grant.namespace, "pod": h.grant.pod,
             "pod_uid": h.grant.pod_uid, "container": h.grant.container,
             "bundle": h.grant.bundle, "root": h.grant.root, "time": h.grant.time}
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
            labels = (f'gpu="{_label(gpu)}",namespace="{_label(g.namespace)}",'
                      f'pod="{_label(g.pod)}",container="{_label(g.container or g.container_id)}",'
                      f'container_id="{_label(g.container_id)}",source="{_label(g.source)}"')
            samples.add(f"nvshim_gpu_grants{{{labels}}} 1")
    out.extend(sorted(samples))
    clash = conflicts(holders)
    out.append("# HELP nvshim_gpu_grant_conflicts Live containers holding one unshared GPU.")
    out.append("# TYPE nvshim_gpu_grant_conflicts gauge")
    for gpu, hs in sorted(clash.items()):
        out.append(f'nvshim_gpu_grant_conflicts{{gpu="{_label(gpu)}"}} {len(hs)}')
    return "\n".join(out) + "\n"
