"""CDI spec versions: which ``cdiVersion`` a spec's content needs (the reference
implementation's gating rules), and whether a declared version is known and high enough.

Used by the checker (every loaded spec) and by the writer (the minimum version of a
generated spec). Standard library only.
"""

from __future__ import annotations

from _collections_abc import Mapping  # loaded by os at start-up; collections.abc is not

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any, List, Optional, Tuple

__all__ = [
    "KNOWN_VERSIONS",
    "CURRENT_VERSION",
    "EARLIEST_VERSION",
    "required_version",
    "version_error",
]

#: Spec versions the reference implementation knows, newest first. 0.1.0 and 0.2.0 are
#: known but older than :data:`EARLIEST_VERSION`, so a spec declaring them never validates.
KNOWN_VERSIONS: Tuple[str, ...] = (
    "1.1.0",
    "1.0.0",
    "0.8.0",
    "0.7.0",
    "0.6.0",
    "0.5.0",
    "0.4.0",
    "0.3.0",
    "0.2.0",
    "0.1.0",
)
CURRENT_VERSION = "1.1.0"
EARLIEST_VERSION = "0.3.0"


def _version_key(version: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _edit_sets(spec: Mapping[str, Any]) -> List[Tuple[str, Mapping[str, Any]]]:
    """Every containerEdits mapping of a spec (spec level first), with its JSON path."""
    found: List[Tuple[str, Mapping[str, Any]]] = []
    edits = spec.get("containerEdits")
    if isinstance(edits, Mapping):
        found.append(("$.containerEdits", edits))
    for index, device in _devices(spec):
        edits = device.get("containerEdits")
        if isinstance(edits, Mapping):
            found.append((f"$.devices[{index}].containerEdits", edits))
    return found


def _devices(spec: Mapping[str, Any]) -> List[Tuple[int, Mapping[str, Any]]]:
    devices = spec.get("devices")
    if not isinstance(devices, list):
        return []
    return [(i, d) for i, d in enumerate(devices) if isinstance(d, Mapping)]


def _list_of_mappings(value: Any) -> List[Mapping[str, Any]]:
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, Mapping)]


def _version_needs(spec: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """Each feature of ``spec`` that needs a version above the baseline, as
    ``(version, reason)`` in document order. Tolerates any shape of input."""
    needs: List[Tuple[str, str]] = []
    if not isinstance(spec, Mapping):
        return needs
    edit_sets = _edit_sets(spec)
    for where, edits in edit_sets:
        net = edits.get("netDevices")
        if isinstance(net, list) and net:
            needs.append(("1.1.0", f"{where}.netDevices is set"))
        rdt = edits.get("intelRdt")
        if isinstance(rdt, Mapping):
            if rdt.get("schemata") is not None:
                needs.append(("1.1.0", f"{where}.intelRdt.schemata is set"))
            if rdt.get("enableMonitoring") is True:
                needs.append(("1.1.0", f"{where}.intelRdt.enableMonitoring is true"))
            needs.append(("0.7.0", f"{where}.intelRdt is set"))
        gids = edits.get("additionalGids")
        if isinstance(gids, list) and gids:
            needs.append(("0.7.0", f"{where}.additionalGids is set"))
    if isinstance(spec.get("annotations"), Mapping) and spec["annotations"]:
        needs.append(("0.6.0", "$.annotations is set"))
    for index, device in _devices(spec):
        annotations = device.get("annotations")
        if isinstance(annotations, Mapping) and annotations:
            needs.append(("0.6.0", f"$.devices[{index}].annotations is set"))
    kind = spec.get("kind")
    if isinstance(kind, str) and "/" in kind and "." in kind.split("/", 1)[1]:
        needs.append(("0.6.0", f'class of kind "{kind}" contains "."'))
    for _, device in _devices(spec):
        name = device.get("name")
        if isinstance(name, str) and name[:1].isdigit() and name[:1].isascii():
            needs.append(("0.5.0", f'device name "{name}" starts with a digit'))
    for where, edits in edit_sets:
        for node in _list_of_mappings(edits.get("deviceNodes")):
            host_path = node.get("hostPath")
            if isinstance(host_path, str) and host_path:
                needs.append(("0.5.0", f"{where}.deviceNodes has a hostPath"))
                break
    for where, edits in edit_sets:
        for mount in _list_of_mappings(edits.get("mounts")):
            mtype = mount.get("type")
            if isinstance(mtype, str) and mtype:
                needs.append(("0.4.0", f"{where}.mounts has a type"))
                break
    return needs


def _required(spec: Mapping[str, Any]) -> Tuple[str, str]:
    """The minimum version and the first feature that needs it."""
    best = (EARLIEST_VERSION, "the earliest supported version")
    for version, reason in _version_needs(spec):
        if _version_key(version) > _version_key(best[0]):
            best = (version, reason)
    return best


def required_version(spec: Mapping[str, Any]) -> str:
    """The minimum ``cdiVersion`` that ``spec``'s content needs (CDI's own rules)."""
    return _required(spec)[0]


def version_error(declared: str, spec: Mapping[str, Any]) -> Optional[str]:
    version = declared[1:] if declared.startswith("v") else declared
    if version not in KNOWN_VERSIONS:
        known = ", ".join(KNOWN_VERSIONS[:-2])
        return f'unknown cdiVersion "{declared}": known versions are {known}'
    needed, reason = _required(spec)
    if _version_key(version) < _version_key(needed):
        return f'cdiVersion "{declared}" is too low: content requires {needed} ({reason})'
    return None
