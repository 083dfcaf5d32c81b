"""The node's denial journal: one JSON line per container denied the GPUs it asked for.

A container whose image or pod asks for GPUs and gets none (require-allocation strips the
request: ``stripped``), or whose create is refused for what it asks (the kubelet's record
lacks a device, a malformed or unknown device, ``on-missing-allocation: fail``:
``refused``), leaves a record here, with the reason as the runtime worded it, what it
asked, and who it is. ``nvshim grants --denied`` shows them.

The file is the grant journal's sibling: ``grants.jsonl`` → ``grants.denied.jsonl`` in the
same directory (:func:`denials_path`), written the grant journal's way (one ``write()`` of
one whole line under the directory's ``flock``, not fsynced; see
:mod:`nvshim.runtime.grants`). It is a history, not a state, bounded so that no tenant
can erase the others' records:

- what the container controls is :func:`~nvshim.runtime.grants.journaled` (escaped, and
  cut: names to 253 characters, the reason to 1024, each of at most :data:`ASKED_MAX`
  asked entries to :data:`ASKED_ENTRY_MAX`), so one record stays a few KiB whatever the
  pod's env, annotations or mounts hold;
- past ``grants-journal-max-bytes`` the appender rewrites it (:func:`compact_denials`)
  keeping records in turns: the newest record of every tenant (a Kubernetes namespace, or
  a container id outside Kubernetes), then every tenant's second newest, and so on,
  while they fit in half the limit; and the first :data:`KEEP_RECORDS` records of that
  order whatever their size. A tenant denied again and again pushes out only its own
  older records: the others keep at least ``KEEP_RECORDS // 2`` (32) of theirs, or all of
  them when they have fewer.
"""

from __future__ import annotations

import os

from nvshim import _jsonc
from nvshim._record import dataclass

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional, Tuple

    from nvshim.runtime.claim import Claim
    from nvshim.runtime.identity import Identity
    from nvshim.runtime.plan import Plan

__all__ = [
    "Denial",
    "denials_path",
    "append_denial",
    "read_denials",
    "asked_of",
    "strip_reason",
    "identity_fields",
    "compact_denials",
    "DENIAL_VERSION",
    "ASKED_MAX",
    "ASKED_ENTRY_MAX",
    "KEEP_RECORDS",
]

DENIAL_VERSION = 1
_SUFFIX = ".denied.jsonl"
#: The most ``asked`` entries a record keeps (one per way of asking: the env, each
#: device-plugin volume mount, each CDI annotation); the last says how many more there were.
ASKED_MAX = 16
#: The longest ``asked`` entry a record keeps (eight GPU UUIDs in one env value fit).
ASKED_ENTRY_MAX = 512
#: Compaction keeps the first this many records of its fair order whatever their size:
#: every other tenant keeps at least half of them (see the module docstring).
KEEP_RECORDS = 64


def denials_path(grants_journal: str) -> str:
    """The denial journal beside ``grants_journal``: its name without ``.jsonl`` (or its
    last extension), then ``.denied.jsonl``."""
    directory, name = os.path.split(grants_journal)
    stem = name[: -len(".jsonl")] if name.endswith(".jsonl") else os.path.splitext(name)[0]
    return os.path.join(directory, (stem or name) + _SUFFIX)


@dataclass(frozen=True)
class Denial:
    """One container denied GPUs: ``stripped`` (created without them) or ``refused``."""

    time: float
    container_id: str
    root: str
    runtime: str
    bundle: str
    action: str
    """``stripped`` (the create went on without the GPUs) or ``refused`` (it failed)."""
    reason: str
    asked: Tuple[str, ...] = ()
    """What the container asked, e.g. ``NVIDIA_VISIBLE_DEVICES=0``, ``volume-mount 0``."""
    namespace: str = ""
    pod: str = ""
    pod_uid: str = ""
    container: str = ""

    def to_line(self) -> bytes:
        """The record's JSON line, what the container controls (its reason, what it asked,
        its pod's names) :func:`~nvshim.runtime.grants.journaled`: escaped and cut."""
        from nvshim.runtime.grants import VALUE_MAX, journaled

        asked = [journaled(a, ASKED_ENTRY_MAX) for a in self.asked[:ASKED_MAX]]
        if len(self.asked) > ASKED_MAX:
            asked[-1] = f"… and {len(self.asked) - ASKED_MAX + 1} more"
        doc = {
            "v": DENIAL_VERSION,
            "t": round(self.time, 3),
            "id": self.container_id,
            "root": self.root,
            "runtime": self.runtime,
            "bundle": self.bundle,
            "action": self.action,
            "reason": journaled(self.reason, VALUE_MAX),
            "asked": asked,
            "namespace": journaled(self.namespace),
            "pod": journaled(self.pod),
            "pod_uid": journaled(self.pod_uid),
            "container": journaled(self.container),
        }
        return (_jsonc.dumps(dict(sorted(doc.items())), separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Optional["Denial"]:
        """A record from a parsed line; None when it is not one of ours."""
        try:
            if doc.get("v") != DENIAL_VERSION or doc.get("action") not in ("stripped", "refused"):
                return None
            asked = doc.get("asked", [])
            if not isinstance(asked, list) or not all(isinstance(a, str) for a in asked):
                return None
            strings = {k: doc.get(k, "") for k in ("namespace", "pod", "pod_uid", "container")}
            if not all(isinstance(v, str) for v in strings.values()):
                return None
            return cls(
                time=float(doc["t"]),
                container_id=str(doc["id"]),
                root=str(doc.get("root", "")),
                runtime=str(doc.get("runtime", "")),
                bundle=str(doc.get("bundle", "")),
                action=str(doc["action"]),
                reason=str(doc["reason"]),
                asked=tuple(asked),
                **strings,
            )
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def tenant(self) -> str:
        """Whose share of the journal the record is in: the Kubernetes namespace, else the
        container id (a tenant can make any number of pods: per-pod shares would be none)."""
        return f"namespace {self.namespace}" if self.pod else f"container {self.container_id}"

    @property
    def who(self) -> str:
        """``namespace/pod/container`` of a Kubernetes container, else the container id."""
        return f"{self.namespace}/{self.pod}/{self.container}" if self.pod else self.container_id


def asked_of(claim: Claim) -> Tuple[str, ...]:
    """What a claim asks for, one entry per way of asking (the journal's ``asked``)."""
    from nvshim.runtime.claim import VISIBLE_DEVICES

    view = claim.view
    out: List[str] = []
    visible = view.get(VISIBLE_DEVICES)
    if visible is not None:
        out.append(f"{VISIBLE_DEVICES}={visible}")
    elif claim.image_asks:
        out.append("legacy CUDA image (all GPUs)")
    out += [f"volume-mount {raw}" for raw in claim.mount_raw]
    out += [f"annotation {key}={view.annotations[key]}" for key in claim.annotation_keys]
    return tuple(out)


def strip_reason(plan: Plan) -> Optional[str]:
    """Why a planned create gives a container that asks for GPUs none of them (its request
    stripped: the notes that say what was ignored); None when it asks for none, or gets
    what it asks for (in part or whole), or is a pod's sandbox."""
    claim, request = plan.claim, plan.request
    if request.source != "none" or request.injects or claim.view.sandbox:
        return None
    if not (claim.image_asks or claim.mount_raw or claim.annotation_ids):
        return None
    ignored = [n for n in request.notes if " ignored" in n or "not taken" in n]
    return "; ".join(ignored) or "no GPU granted"


def compact_denials(data: bytes, budget: int) -> bytes:
    """The denial journal ``data`` after a compaction: its records in turns, the newest of
    every tenant first (newest tenants first), then each one's second newest, and so on,
    kept while they fit in ``budget`` bytes, and at least the first :data:`KEEP_RECORDS`
    of that order whatever their size; written back oldest first, each as this version
    writes it (a record journaled uncut by an older nvshim is cut now). Lines that are no
    record (a torn last line, a foreign one) go."""
    records = [
        (d.to_line(), d) for d in (_parse(raw) for raw in data.split(b"\n")[:-1]) if d is not None
    ]
    depth: Dict[str, int] = {}
    order: List[Tuple[int, int]] = []  # (turn, -position): a tenant's n-th newest: turn n
    for position in range(len(records) - 1, -1, -1):
        tenant = records[position][1].tenant
        turn = depth[tenant] = depth.get(tenant, -1) + 1
        order.append((turn, -position))
    order.sort()
    kept: List[int] = []
    size = 0
    for n, (_, negative) in enumerate(order):
        size += len(records[-negative][0])
        if n >= KEEP_RECORDS and size > budget:
            break
        kept.append(-negative)
    return b"".join(records[i][0] for i in sorted(kept))


def _keep_in_turns(max_bytes: int) -> Any:
    def compact(path: str) -> bool:
        from nvshim.files import write_atomic
        from nvshim.runtime.grants import read_journal_bytes

        data = read_journal_bytes(path) or b""
        kept = compact_denials(data, max_bytes // 2)
        if len(data) - len(kept) < len(data) // 4:
            return False  # cannot shrink by a quarter (every record is protected): append
        write_atomic(path, kept)
        return True

    return compact


def append_denial(path: str, denial: Denial, max_bytes: int) -> Optional[str]:
    """Append one record; past ``max_bytes`` compact the journal first
    (:func:`compact_denials`, to half of it). Returns a warning when that failed (the record
    is appended all the same); HostError when the record cannot be appended."""
    from nvshim.runtime.grants import append_line

    return append_line(path, denial.to_line(), max_bytes, _keep_in_turns(max_bytes), "denial")


def _parse(raw: bytes) -> Optional[Denial]:
    if not raw.strip():
        return None
    try:
        doc = _jsonc.loads(raw)
    except (ValueError, RecursionError):
        return None
    return Denial.from_doc(doc) if isinstance(doc, dict) else None


def read_denials(path: str) -> Optional[List[Denial]]:
    """Every whole, well-formed record in order (others skipped); None without a file."""
    from nvshim.runtime.grants import read_journal_bytes

    data = read_journal_bytes(path)
    if data is None:
        return None
    records = (_parse(raw) for raw in data.split(b"\n")[:-1])
    return [d for d in records if d is not None]


def identity_fields(identity: Optional[Identity]) -> Mapping[str, str]:
    """The record's pod fields from an identity (empty strings without one)."""
    if identity is None:
        return {"namespace": "", "pod": "", "pod_uid": "", "container": ""}
    return {
        "namespace": identity.namespace,
        "pod": identity.pod,
        "pod_uid": identity.pod_uid,
        "container": identity.container,
    }
