"""What ``nvshim grants --denied`` shows: the denial journal as a table or JSON.

Reads :class:`~nvshim.runtime.denials.Denial` records (written by the runtime when a
container is stripped of the GPUs it asked for, or refused); writes nothing.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, List, Sequence

from nvshim.errors import one_line

if TYPE_CHECKING:
    from nvshim.runtime.denials import Denial

__all__ = ["render_denied_table", "render_denied_json"]


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def render_denied_table(denials: Sequence[Denial]) -> str:
    """One row per record, oldest first: when, the container id, the pod's container,
    stripped or refused, what it asked; the reason on the line below each row (it is long).
    Every value is :func:`~nvshim.errors.one_line` (escaped, cut): a record cannot add a
    line or a column, whoever wrote the journal."""
    rows = [("TIME", "CONTAINER", "POD", "ACTION", "ASKED")]
    for d in denials:
        pod = f"{d.namespace}/{d.pod}/{d.container}" if d.pod else "-"
        rows.append(
            (
                _when(d.time),
                one_line(d.container_id or "-"),
                one_line(pod),
                one_line(d.action),
                one_line(", ".join(d.asked) or "-"),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines: List[str] = []
    for n, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n:
            lines.append(f"  reason: {one_line(denials[n - 1].reason)}")
    return "\n".join(lines)


def render_denied_json(denials: Sequence[Denial]) -> str:
    """``{"denied": [...]}``, oldest first, every field of each record."""
    return json.dumps(
        {
            "denied": [
                {
                    "time": d.time,
                    "container_id": d.container_id,
                    "action": d.action,
                    "reason": d.reason,
                    "asked": list(d.asked),
                    "namespace": d.namespace,
                    "pod": d.pod,
                    "pod_uid": d.pod_uid,
                    "container": d.container,
                    "bundle": d.bundle,
                    "root": d.root,
                    "runtime": d.runtime,
                }
                for d in denials
            ]
        },
        indent=2,
    )
