"""The node's denial journal: one JSON line per container denied the GPUs it asked for.

A container whose image or pod asks for GPUs and gets none (require-allocation strips the
request: ``stripped``), or whose create is refused for what it asks (the kubelet's record
lacks a device, a malformed or unknown device, ``on-missing-allocation: fail``:
``refused``), leaves a record here, with the reason as the runtime worded it, what it
asked, and who it is. ``nvshim grants --denied`` shows them.

The file is the grant journal's sibling: ``grants.jsonl`` → ``grants.denied.jsonl`` in the
same directory (:func:`denials_path`), written the grant journal's way (one ``write()`` of
one whole line under the directory's ``flock``, not fsynced; see
:mod:`nvshim.runtime.grants`). It is a history, not a state: past
``grants-journal-max-bytes`` the appender keeps the newest half of it.
"""

from __future__ import annotations

import os

from nvshim import _jsonc
from nvshim._record import dataclass

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Any, List, Mapping, Optional, Tuple

    from nvshim.runtime.claim import Claim
    from nvshim.runtime.identity import Identity
    from nvshim.runtime.plan import Plan

__all__ = ["Denial", "denials_path", "append_denial", "read_denials", "asked_of",
           "strip_reason", "identity_fields", "DENIAL_VERSION"]

DENIAL_VERSION = 1
_SUFFIX = ".denied.jsonl"


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
        doc = {
            "v": DENIAL_VERSION, "t": round(self.time, 3), "id": self.container_id,
            "root": self.root, "runtime": self.runtime, "bundle": self.bundle,
            "action": self.action, "reason": self.reason, "asked": list(self.asked),
            "namespace": self.namespace, "pod": self.pod, "pod_uid": self.pod_uid,
            "container": self.container,
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
            return cls(time=float(doc["t"]), container_id=str(doc["id"]),
                       root=str(doc.get("root", "")), runtime=str(doc.get("runtime", "")),
                       bundle=str(doc.get("bundle", "")), action=str(doc["action"]),
                       reason=str(doc["reason"]), asked=tuple(asked), **strings)
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def who(self) -> str:
        """``namespace/pod/container`` of a Kubernetes container, else the container id."""
        return (f"{self.namespace}/{self.pod}/{self.container}" if self.pod
                else self.container_id)


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


def _keep_newest_half(max_bytes: int) -> Any:
    def compact(path: str) -> bool:
        from nvshim.files import write_atomic
        from nvshim.runtime.grants import read_journal_bytes

        data = read_journal_bytes(path) or b""
        lines = data.split(b"\n")[:-1]  # a torn last line goes
        kept: List[bytes] = []
        size = 0
        for line in reversed(lines):
            if size + len(line) + 1 > max_bytes // 2:
                break
            kept.append(line + b"\n")
            size += len(line) + 1
        write_atomic(path, b"".join(reversed(kept)))
        return True

    return compact


def append_denial(path: str, denial: Denial, max_bytes: int) -> Optional[str]:
    """Append one record; past ``max_bytes`` keep the newest half first. Returns a
    warning when that failed (the record is appended all the same)."""
    from nvshim.runtime.grants import append_line

    return append_line(path, denial.to_line(), max_bytes, _keep_newest_half(max_bytes),
                       "denial")


def read_denials(path: str) -> Optional[List[Denial]]:
    """Every whole, well-formed record in order (others skipped); None without a file."""
    from nvshim.runtime.grants import read_journal_bytes

    data = read_journal_bytes(path)
    if data is None:
        return None
    out: List[Denial] = []
    for raw in data.split(b"\n")[:-1]:
        if not raw.strip():
            continue
        try:
            doc = _jsonc.loads(raw)
        except (ValueError, RecursionError):
            continue
        denial = Denial.from_doc(doc) if isinstance(doc, dict) else None
        if denial is not None:
            out.append(denial)
    return out


def identity_fields(identity: Optional[Identity]) -> Mapping[str, str]:
    """The record's pod fields from an identity (empty strings without one)."""
    if identity is None:
        return {"namespace": "", "pod": "", "pod_uid": "", "container": ""}
    return {"namespace": identity.namespace, "pod": identity.pod, "pod_uid": identity.pod_uid,
            "container": identity.container}
