"""The CDI spec model: what a loaded spec and a registry of spec directories hold.

Plain values, built by :mod:`nvshim.cdi.load` (a spec) and :mod:`nvshim.cdi.registry`
(a registry); the problems they carry are :class:`nvshim.errors.CdiProblem`.
"""

from __future__ import annotations

from nvshim._record import dataclass, field
from nvshim.edits import Edits

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any, Dict, List, Mapping, Tuple

    from nvshim.errors import CdiProblem

__all__ = [
    "NO_FILE",
    "SPEC_EXTENSIONS",
    "UNAPPLIED_EDITS",
    "CdiDevice",
    "Spec",
    "ResolvedDevice",
    "Registry",
]

#: Where a problem that concerns no particular file is reported.
NO_FILE = "<spec>"

#: The file name endings of CDI spec files; other files of a spec directory are ignored.
SPEC_EXTENSIONS = (".json", ".yaml")

#: ``containerEdits`` fields :class:`~nvshim.edits.Edits` does not model, so nvshim-runtime
#: cannot apply them: a create injecting edits that set one is refused
#: (:func:`nvshim.cdi.registry.refuse_unapplied`), never run without them.
UNAPPLIED_EDITS = ("intelRdt", "netDevices")


@dataclass(frozen=True)
class CdiDevice:
    """A device of a spec: its unqualified name and its own edits. ``unapplied``: the
    :data:`UNAPPLIED_EDITS` fields its ``containerEdits`` set."""

    name: str
    edits: Edits
    unapplied: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Spec:
    """A loaded, valid spec file. ``raw`` is the decoded document, kept for fields
    :class:`Edits` does not model (annotations, intelRdt, netDevices)."""

    path: str
    version: str
    kind: str
    vendor: str
    class_: str
    devices: Tuple[CdiDevice, ...]
    edits: Edits
    raw: Mapping[str, Any] = field(compare=False, repr=False)
    unapplied: Tuple[str, ...] = ()
    """The :data:`UNAPPLIED_EDITS` fields the spec-level ``containerEdits`` set."""


@dataclass(frozen=True)
class ResolvedDevice:
    """A registry entry: the device and the spec (file) that defines it."""

    spec: Spec
    device: CdiDevice


@dataclass
class Registry:
    """Every resolvable device of a set of spec directories.

    ``devices`` maps qualified names to their definition after priority and conflict
    rules; ``problems`` lists files that were skipped and conflicts, in scan order;
    ``untrusted`` maps each name a skipped, untrusted spec file declares to that file's
    problem (why a create cannot have it, when no trusted spec defines it).
    """

    spec_dirs: Tuple[str, ...]
    devices: Dict[str, ResolvedDevice] = field(default_factory=dict)
    specs: List[Spec] = field(default_factory=list)
    problems: List[CdiProblem] = field(default_factory=list)
    untrusted: Dict[str, CdiProblem] = field(default_factory=dict)

    def names(self) -> List[str]:
        """All resolvable qualified device names, sorted."""
        return sorted(self.devices)
