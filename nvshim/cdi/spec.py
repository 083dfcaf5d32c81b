"""CDI (Container Device Interface) specs: names, versions, validation, registry, writing.

One module for everything nvshim does with CDI spec files:

- qualified device names (``nvidia.com/gpu=0``): :func:`parse_qualified_name`;
- the minimum ``cdiVersion`` a spec's content needs: :func:`required_version`;
- strict loading (:func:`load_spec_file`) and validation in two layers — the JSON schema
  ``cdi-specs/schema.json`` and the reference implementation's semantic rules
  (:func:`validate_spec`, :func:`validate_file`);
- the registry of spec directories with CDI's priority and conflict rules
  (:func:`load_registry`) and resolution of requested names into one :class:`Edits`
  (:func:`resolve_devices`);
- building and writing specs (:func:`spec_to_dict`, :func:`dump_spec`, :func:`write_spec`).

The runtime resolves CDI names on the ``create`` path, so importing this module and
loading JSON specs needs only the standard library: ``yaml`` is imported only when a
``.yaml`` file is read or written, ``jsonschema`` only by :func:`validate_spec`.
"""

from __future__ import annotations

import os
from _collections_abc import Mapping  # loaded by os at start-up; collections.abc is not

from nvshim import _jsonc
from nvshim._record import dataclass, field
from nvshim.edits import HOOK_NAMES, Edits
from nvshim.errors import CdiError

TYPE_CHECKING = False  # typing costs ~4 ms to import on the create path
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

    import jsonschema

__all__ = [
    "KNOWN_VERSIONS",
    "CURRENT_VERSION",
    "EARLIEST_VERSION",
    "DEFAULT_SPEC_DIRS",
    "CdiSpecError",
    "Problem",
    "CdiDevice",
    "Spec",
    "ResolvedDevice",
    "Registry",
    "parse_qualified_name",
    "is_qualified_name",
    "qualified_name",
    "required_version",
    "load_spec_file",
    "parse_spec",
    "check_schema",
    "check_semantics",
    "validate_spec",
    "validate_file",
    "load_registry",
    "build_registry",
    "resolve_devices",
    "spec_to_dict",
    "dump_spec",
    "write_spec",
    "schema_path",
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

#: Where runtimes look for specs, lowest priority first (later directories override).
DEFAULT_SPEC_DIRS: Tuple[str, ...] = ("/etc/cdi", "/var/run/cdi")

#: Where a problem that concerns no particular file is reported.
NO_FILE = "<spec>"

_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_ALNUM = _LETTERS | frozenset("0123456789")
_KIND_CHARS = _ALNUM | frozenset("_.-")
_DEVICE_CHARS = _KIND_CHARS | frozenset(":")
_EXTENSIONS = (".json", ".yaml")
_DEVICE_TYPES = ("", "b", "c", "u", "p")
_UINT32 = (0, 2**32 - 1)
_INT64 = (-(2**63), 2**63 - 1)


class CdiSpecError(CdiError):
    """A spec file cannot be loaded; ``problems`` lists every reason (at least one)."""

    def __init__(self, problems: Sequence["Problem"]) -> None:
        self.problems = list(problems)
        text = str(self.problems[0])
        if len(self.problems) > 1:
            text += f" (and {len(self.problems) - 1} more)"
        super().__init__(text)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec: the file, where in it (a JSON path) and what."""

    path: str
    json_path: str
    message: str

    def __str__(self) -> str:
        from nvshim.errors import one_line

        return one_line(f"{self.path}: {self.json_path}: {self.message}")


@dataclass(frozen=True)
class CdiDevice:
    """A device of a spec: its unqualified name and its own edits."""

    name: str
    edits: Edits


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


@dataclass(frozen=True)
class ResolvedDevice:
    """A registry entry: the device and the spec (file) that defines it."""

    spec: Spec
    device: CdiDevice


@dataclass
class Registry:
    """Every resolvable device of a set of spec directories.

    ``devices`` maps qualified names to their definition after priority and conflict
    rules; ``problems`` lists files that were skipped and conflicts, in scan order.
    """

    spec_dirs: Tuple[str, ...]
    devices: Dict[str, ResolvedDevice] = field(default_factory=dict)
    specs: List[Spec] = field(default_factory=list)
    problems: List[Problem] = field(default_factory=list)

    def names(self) -> List[str]:
        """All resolvable qualified device names, sorted."""
        return sorted(self.devices)


# --------------------------------------------------------------------------------------
# Names


def _name_error(value: str, what: str, chars: frozenset[str], first: frozenset[str],
                first_rule: str) -> Optional[str]:
    """Why ``value`` is not a valid ``what`` name (the CDI name grammar), or None if it is."""
    if not value:
        return f"empty {what} name"
    for char in value:
        if char not in chars:
            return f'{what} name "{value}" has invalid character {_show_char(char)}'
    if value[0] not in first:
        return f'{what} name "{value}" must start with {first_rule}'
    if value[-1] not in _ALNUM:
        return f'{what} name "{value}" must end with a letter or digit'
    return None


def _kind_part_error(value: str, what: str) -> Optional[str]:
    """Vendor and class: letters, digits, ``_.-``; a letter first."""
    return _name_error(value, what, _KIND_CHARS, _LETTERS, "a letter")


def _device_name_error(value: str) -> Optional[str]:
    """Unqualified device names: also ``:`` (MIG ``0:1``); a letter or digit first."""
    return _name_error(value, "device", _DEVICE_CHARS, _ALNUM, "a letter or digit")


def _show_char(char: str) -> str:
    return _jsonc.dumps(char)


def _kind_error(kind: str) -> Optional[str]:
    """Why ``kind`` is not ``<vendor>/<class>``, or None if it is."""
    if "/" not in kind:
        return f'kind "{kind}" must be <vendor>/<class>, like nvidia.com/gpu'
    vendor, class_ = kind.split("/", 1)
    reason = _kind_part_error(vendor, "vendor") or _kind_part_error(class_, "class")
    return f'invalid kind "{kind}": {reason}' if reason else None


def parse_qualified_name(name: str) -> Tuple[str, str, str]:
    """Split ``<vendor>/<class>=<device>`` into its three parts, validating each.

    Raises :class:`CdiError` naming the value and the reason.
    """
    if not isinstance(name, str):
        raise CdiError(f"invalid CDI device name {name!r}: not a string")
    reason = _qualified_name_error(name)
    if reason:
        raise CdiError(f'invalid CDI device name "{name}": {reason}')
    qualifier, device = name.split("=", 1)
    vendor, class_ = qualifier.split("/", 1)
    return vendor, class_, device


def _qualified_name_error(name: str) -> Optional[str]:
    if not name:
        return "empty name"
    if name.startswith("/"):
        return "a device path, not <vendor>/<class>=<device>"
    if "=" not in name:
        return 'missing "=": expected <vendor>/<class>=<device>'
    qualifier, device = name.split("=", 1)
    if "/" not in qualifier:
        return 'missing "/": expected <vendor>/<class>=<device>'
    vendor, class_ = qualifier.split("/", 1)
    return (
        _kind_part_error(vendor, "vendor")
        or _kind_part_error(class_, "class")
        or _device_name_error(device)
    )


def is_qualified_name(s: str) -> bool:
    """True if ``s`` is a valid fully-qualified CDI device name."""
    return isinstance(s, str) and _qualified_name_error(s) is None


def qualified_name(kind: str, device: str) -> str:
    """``<kind>=<device>``, e.g. ``nvidia.com/gpu=0``."""
    return f"{kind}={device}"


# --------------------------------------------------------------------------------------
# Versions


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
    for index, device in _devices(spec):
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


def _version_error(declared: str, spec: Mapping[str, Any]) -> Optional[str]:
    version = declared[1:] if declared.startswith("v") else declared
    if version not in KNOWN_VERSIONS:
        return f'unknown cdiVersion "{declared}": known versions are {", ".join(KNOWN_VERSIONS[:-2])}'
    needed, reason = _required(spec)
    if _version_key(version) < _version_key(needed):
        return f'cdiVersion "{declared}" is too low: content requires {needed} ({reason})'
    return None


# --------------------------------------------------------------------------------------
# Semantic checks (the reference implementation's rules, plus strict structure)

_TOP_KEYS = ("cdiVersion", "kind", "annotations", "devices", "containerEdits")
_DEVICE_KEYS = ("name", "annotations", "containerEdits")
_EDITS_KEYS = (
    "env",
    "deviceNodes",
    "mounts",
    "hooks",
    "intelRdt",
    "additionalGids",
    "netDevices",
)
_NODE_KEYS = ("path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid")
_MOUNT_KEYS = ("hostPath", "containerPath", "type", "options")
_HOOK_KEYS = ("hookName", "path", "args", "env", "timeout")
_RDT_KEYS = ("closID", "l3CacheSchema", "memBwSchema", "schemata", "enableMonitoring")
_NET_KEYS = ("hostInterfaceName", "name")


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


def _key_path(base: str, key: Any) -> str:
    if isinstance(key, str) and key and key.replace("_", "a").isalnum() and key.isascii():
        return f"{base}.{key}"
    return f"{base}[{_jsonc.dumps(str(key))}]"


class _Checker:
    """Collects problems while walking a decoded spec; never raises on odd input."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.problems: List[Problem] = []

    def add(self, json_path: str, message: str) -> None:
        self.problems.append(Problem(self.file, json_path, message))

    # generic shapes ---------------------------------------------------------------

    def mapping(self, value: Any, where: str, keys: Sequence[str]) -> bool:
        """Check ``value`` is a mapping with only ``keys``; False if not a mapping."""
        if not isinstance(value, Mapping):
            self.add(where, f"must be a mapping, got {_type_name(value)}")
            return False
        lower = {k.lower(): k for k in keys}
        for key in value:
            if key in keys:
                continue
            hint = ""
            if isinstance(key, str) and key.lower() in lower:
                hint = f' (did you mean "{lower[key.lower()]}"?)'
            self.add(_key_path(where, key), f'unknown field "{key}"{hint}')
        return True

    def list_(self, value: Any, where: str) -> List[Tuple[str, Any]]:
        """Items of an optional list with their paths; null is an empty list."""
        if value is None:
            return []
        if not isinstance(value, list):
            self.add(where, f"must be a list, got {_type_name(value)}")
            return []
        return [(f"{where}[{i}]", item) for i, item in enumerate(value)]

    def string(self, value: Any, where: str, required: bool = False) -> Optional[str]:
        """A string field; reports a wrong type, or an empty/missing required one."""
        if value is None and not required:
            return None
        if not isinstance(value, str):
            self.add(where, f"must be a string, got {_type_name(value)}")
            return None
        if required and not value:
            self.add(where, "must not be empty")
            return None
        return value

    def integer(self, value: Any, where: str, bounds: Tuple[int, int]) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(where, f"must be an integer, got {_type_name(value)}")
        elif not bounds[0] <= value <= bounds[1]:
            self.add(where, f"{value} is out of range {bounds[0]}..{bounds[1]}")

    def strings(self, value: Any, where: str) -> None:
        for item_path, item in self.list_(value, where):
            self.string(item, item_path)

    def required(self, obj: Mapping[str, Any], key: str, where: str) -> bool:
        if key not in obj:
            self.add(_key_path(where, key), "required field is missing")
            return False
        return True

    def annotations(self, value: Any, where: str) -> None:
        if value is not None:
            self.mapping_of_strings(value, where)

    def mapping_of_strings(self, value: Any, where: str) -> bool:
        if not isinstance(value, Mapping):
            self.add(where, f"must be a mapping, got {_type_name(value)}")
            return False
        for key, item in value.items():
            if not isinstance(key, str):
                self.add(_key_path(where, key), f"key must be a string, got {_type_name(key)}")
            elif not isinstance(item, str):
                self.add(_key_path(where, key), f"must be a string, got {_type_name(item)}")
        return True

    def env(self, value: Any, where: str) -> None:
        for item_path, item in self.list_(value, where):
            text = self.string(item, item_path)
            if text is not None and text.find("=") <= 0:
                self.add(item_path, f'env entry "{text}" must be NAME=VALUE')

    # CDI shapes ---------------------------------------------------------------------

    def spec(self, raw: Any) -> None:
        if not isinstance(raw, Mapping):
            self.add("$", f"top level must be a mapping, got {_type_name(raw)}")
            return
        self.mapping(raw, "$", _TOP_KEYS)
        if self.required(raw, "cdiVersion", "$"):
            version = self.string(raw["cdiVersion"], "$.cdiVersion", required=True)
            if version is not None:
                reason = _version_error(version, raw)
                if reason:
                    self.add("$.cdiVersion", reason)
        if self.required(raw, "kind", "$"):
            kind = self.string(raw["kind"], "$.kind", required=True)
            if kind is not None:
                reason = _kind_error(kind)
                if reason:
                    self.add("$.kind", reason)
        self.annotations(raw.get("annotations"), "$.annotations")
        if raw.get("containerEdits") is not None:
            self.edits(raw["containerEdits"], "$.containerEdits")
        if self.required(raw, "devices", "$"):
            devices = raw["devices"]
            if not isinstance(devices, list):
                self.add("$.devices", f"must be a list, got {_type_name(devices)}")
            elif not devices:
                self.add("$.devices", "no devices: a spec must define at least one")
            else:
                seen: Dict[str, int] = {}
                for index, device in enumerate(devices):
                    self.device(device, f"$.devices[{index}]", index, seen)

    def device(self, value: Any, where: str, index: int, seen: Dict[str, int]) -> None:
        if not self.mapping(value, where, _DEVICE_KEYS):
            return
        name = None
        if self.required(value, "name", where):
            name = self.string(value["name"], f"{where}.name", required=True)
            if name is not None:
                reason = _device_name_error(name)
                if reason:
                    self.add(f"{where}.name", reason)
                elif name in seen:
                    self.add(
                        f"{where}.name",
                        f'duplicate device name "{name}" (also $.devices[{seen[name]}])',
                    )
                else:
                    seen[name] = index
        self.annotations(value.get("annotations"), f"{where}.annotations")
        if self.required(value, "containerEdits", where):
            edits = value["containerEdits"]
            label = f'device "{name}"' if name else "device"
            if edits is None:
                self.add(f"{where}.containerEdits", f"{label} has empty containerEdits")
            elif self.edits(edits, f"{where}.containerEdits") and _edits_empty(edits):
                self.add(f"{where}.containerEdits", f"{label} has empty containerEdits")

    def edits(self, value: Any, where: str) -> bool:
        if not self.mapping(value, where, _EDITS_KEYS):
            return False
        self.env(value.get("env"), f"{where}.env")
        for item_path, node in self.list_(value.get("deviceNodes"), f"{where}.deviceNodes"):
            self.device_node(node, item_path)
        for item_path, mount in self.list_(value.get("mounts"), f"{where}.mounts"):
            self.mount(mount, item_path)
        for item_path, hook in self.list_(value.get("hooks"), f"{where}.hooks"):
            self.hook(hook, item_path)
        if value.get("intelRdt") is not None:
            self.intel_rdt(value["intelRdt"], f"{where}.intelRdt")
        for item_path, gid in self.list_(value.get("additionalGids"), f"{where}.additionalGids"):
            self.integer(gid, item_path, _UINT32)
        hosts: Dict[str, str] = {}
        names: Dict[str, str] = {}
        for item_path, net in self.list_(value.get("netDevices"), f"{where}.netDevices"):
            self.net_device(net, item_path, hosts, names)
        return True

    def device_node(self, node: Any, where: str) -> None:
        if not self.mapping(node, where, _NODE_KEYS):
            return
        if self.required(node, "path", where):
            self.string(node["path"], f"{where}.path", required=True)
        self.string(node.get("hostPath"), f"{where}.hostPath")
        dtype = self.string(node.get("type"), f"{where}.type")
        if dtype is not None and dtype not in _DEVICE_TYPES:
            self.add(f"{where}.type", f'device type "{dtype}" is not one of b, c, u, p')
        for key in ("major", "minor"):
            self.integer(node.get(key), f"{where}.{key}", _INT64)
        for key in ("fileMode", "uid", "gid"):
            self.integer(node.get(key), f"{where}.{key}", _UINT32)
        perms = self.string(node.get("permissions"), f"{where}.permissions")
        if perms is not None and not set(perms) <= set("rwm"):
            self.add(
                f"{where}.permissions",
                f'permissions "{perms}" may only contain the letters r, w and m',
            )

    def mount(self, mount: Any, where: str) -> None:
        if not self.mapping(mount, where, _MOUNT_KEYS):
            return
        for key in ("hostPath", "containerPath"):
            if self.required(mount, key, where):
                self.string(mount[key], f"{where}.{key}", required=True)
        self.string(mount.get("type"), f"{where}.type")
        self.strings(mount.get("options"), f"{where}.options")

    def hook(self, hook: Any, where: str) -> None:
        if not self.mapping(hook, where, _HOOK_KEYS):
            return
        if self.required(hook, "hookName", where):
            name = self.string(hook["hookName"], f"{where}.hookName", required=True)
            if name is not None and name not in HOOK_NAMES:
                self.add(
                    f"{where}.hookName",
                    f'unknown hook name "{name}": expected one of {", ".join(HOOK_NAMES)}',
                )
        if self.required(hook, "path", where):
            self.string(hook["path"], f"{where}.path", required=True)
        self.strings(hook.get("args"), f"{where}.args")
        self.env(hook.get("env"), f"{where}.env")
        self.integer(hook.get("timeout"), f"{where}.timeout", _INT64)

    def intel_rdt(self, rdt: Any, where: str) -> None:
        if not self.mapping(rdt, where, _RDT_KEYS):
            return
        clos = self.string(rdt.get("closID"), f"{where}.closID")
        if clos and clos != "/":
            if clos in (".", "..") or "/" in clos or "\n" in clos or len(clos) >= 4096:
                self.add(f"{where}.closID", f"invalid closID {_jsonc.dumps(clos)}")
        for key in ("l3CacheSchema", "memBwSchema"):
            self.string(rdt.get(key), f"{where}.{key}")
        self.strings(rdt.get("schemata"), f"{where}.schemata")
        monitoring = rdt.get("enableMonitoring")
        if monitoring is not None and not isinstance(monitoring, bool):
            self.add(
                f"{where}.enableMonitoring", f"must be a boolean, got {_type_name(monitoring)}"
            )

    def net_device(
        self, net: Any, where: str, hosts: Dict[str, str], names: Dict[str, str]
    ) -> None:
        if not self.mapping(net, where, _NET_KEYS):
            return
        for key, seen in (("hostInterfaceName", hosts), ("name", names)):
            if not self.required(net, key, where):
                continue
            value = self.string(net[key], f"{where}.{key}", required=True)
            if value is None:
                continue
            if value in seen:
                self.add(f"{where}.{key}", f'duplicate {key} "{value}" (also {seen[value]})')
            else:
                seen[value] = where


def _edits_empty(edits: Mapping[str, Any]) -> bool:
    """CDI's notion of "no edits": no non-empty list and no intelRdt."""
    if edits.get("intelRdt") is not None:
        return False
    return not any(
        isinstance(edits.get(key), list) and edits[key]
        for key in ("env", "deviceNodes", "mounts", "hooks", "additionalGids", "netDevices")
    )


def check_semantics(raw: Any, path: str = NO_FILE) -> List[Problem]:
    """Structure and the reference implementation's rules, without jsonschema.

    This is what the registry applies when it loads a spec (cheap enough for the
    runtime's ``create`` path); :func:`validate_spec` adds the JSON-schema layer.
    """
    checker = _Checker(path)
    checker.spec(raw)
    return checker.problems


# --------------------------------------------------------------------------------------
# JSON schema layer


def schema_path() -> str:
    """The CDI JSON schema: the packaged copy if installed, else the repository's."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # nvshim/
    packaged = os.path.join(here, "data", "cdi-schema.json")
    if os.path.exists(packaged):
        return packaged
    return os.path.join(os.path.dirname(here), "cdi-specs", "schema.json")


_VALIDATOR: List["jsonschema.protocols.Validator"] = []


def _validator() -> "jsonschema.protocols.Validator":
    if not _VALIDATOR:
        import jsonschema  # heavy: only validation needs it

        location = schema_path()
        try:
            with open(location, encoding="utf-8") as stream:
                schema = _jsonc.loads(stream.read())
        except (OSError, ValueError) as exc:
            raise CdiError(f"cannot read the CDI schema {location}: {exc}") from exc
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        _VALIDATOR.append(cls(schema))
    return _VALIDATOR[0]


def _json_path(parts: Sequence[Any]) -> str:
    out = "$"
    for part in parts:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            out = _key_path(out, part)
    return out


def _schema_error_problems(error: Any, file: str) -> List[Problem]:
    """One problem per schema error; required/additionalProperties point at the key."""
    where = _json_path(list(error.absolute_path))
    if error.validator in ("anyOf", "oneOf") and error.context:
        # "null or X": report why the X branch failed, not "not valid under any of".
        real = [
            sub
            for sub in error.context
            if not (sub.validator == "type" and sub.validator_value == "null")
        ]
        if real:
            return [p for sub in real for p in _schema_error_problems(sub, file)]
    if error.validator == "required" and isinstance(error.instance, Mapping):
        return [
            Problem(file, _key_path(where, key), "required field is missing")
            for key in error.validator_value
            if key not in error.instance
        ]
    if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
        known = error.schema.get("properties", {})
        return [
            Problem(file, _key_path(where, key), f'unknown field "{key}"')
            for key in error.instance
            if key not in known
        ]
    return [Problem(file, where, error.message)]


def check_schema(raw: Any, path: str = NO_FILE) -> List[Problem]:
    """Problems found by the JSON schema alone (imports jsonschema)."""
    problems: List[Problem] = []
    for error in _validator().iter_errors(raw):
        for problem in _schema_error_problems(error, path):
            if problem not in problems:
                problems.append(problem)
    return problems


def validate_spec(raw: Any, path: str = NO_FILE) -> List[Problem]:
    """Every problem of a decoded spec: semantic rules plus the JSON schema.

    Where both layers report at the same JSON path, the semantic message (which names
    the value and the rule) is kept. Semantic problems come first, in the order the
    reference implementation checks; then any the schema alone found. Never raises for
    any input shape.
    """
    semantic = check_semantics(raw, path)
    covered = {p.json_path for p in semantic}
    extra = [p for p in check_schema(raw, path) if p.json_path not in covered]
    return semantic + extra


# --------------------------------------------------------------------------------------
# Decoding


class _DuplicateKey(ValueError):
    pass


def _json_pairs(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _decode_json(text: str, path: str) -> Any:
    try:
        return _jsonc.loads(text, object_pairs_hook=_json_pairs, parse_constant=_json_constant)
    except _DuplicateKey as exc:
        raise CdiSpecError([Problem(path, "$", f'invalid JSON: duplicate key "{exc}"')]) from exc
    except ValueError as exc:
        if getattr(exc, "colno", None) is None:  # not a json.JSONDecodeError
            raise CdiSpecError([Problem(path, "$", f"invalid JSON: {exc}")]) from exc
        raise CdiSpecError(
            [Problem(path, "$", f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}")]  # type: ignore[attr-defined]
        ) from exc
    except RecursionError as exc:
        raise CdiSpecError([Problem(path, "$", f"invalid JSON: {exc}")]) from exc


_YAML_LOADER: List[Any] = []


def _yaml_loader() -> Any:
    """A SafeLoader that rejects duplicate mapping keys (built on first use)."""
    if _YAML_LOADER:
        return _YAML_LOADER[0]
    import yaml  # heavy: only YAML files need it

    class StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                # Only keys written in this mapping: a "<<" merge may be overridden.
                seen: List[Any] = []
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=deep)
                    try:
                        duplicate = key in seen
                    except TypeError:
                        duplicate = False  # unhashable key: the base class reports it
                    if duplicate:
                        raise yaml.constructor.ConstructorError(
                            None,
                            None,
                            f"duplicate key {_jsonc.dumps(str(key))}",
                            key_node.start_mark,
                        )
                    seen.append(key)
            return super().construct_mapping(node, deep=deep)

    _YAML_LOADER.append(StrictLoader)
    return StrictLoader


def _decode_yaml(text: str, path: str) -> Any:
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        reason = exc.problem or "syntax error"
        if exc.context:
            reason = f"{exc.context}: {reason}"
        raise CdiSpecError([Problem(path, "$", f"invalid YAML{where}: {reason}")]) from exc
    except (yaml.YAMLError, RecursionError) as exc:
        raise CdiSpecError([Problem(path, "$", f"invalid YAML: {exc}")]) from exc


def _read_document(path: str) -> Any:
    """Read and strictly decode one spec file into a mapping (CdiSpecError if not)."""
    ext = os.path.splitext(path)[1]
    if ext not in _EXTENSIONS:
        raise CdiSpecError(
            [Problem(path, "$", f'unknown extension "{ext}": CDI spec files end in .json or .yaml')]
        )
    try:
        with open(path, "rb") as stream:
            data = stream.read()
    except OSError as exc:
        raise CdiSpecError([Problem(path, "$", f"cannot read: {exc.strerror}")]) from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CdiSpecError(
            [Problem(path, "$", f"not UTF-8 text: invalid byte at offset {exc.start}")]
        ) from exc
    if not text.strip():
        raise CdiSpecError([Problem(path, "$", "empty document")])
    raw = _decode_json(text, path) if ext == ".json" else _decode_yaml(text, path)
    if raw is None:
        raise CdiSpecError([Problem(path, "$", "empty document")])
    if not isinstance(raw, dict):
        raise CdiSpecError(
            [Problem(path, "$", f"top level must be a mapping, got {_type_name(raw)}")]
        )
    return raw


def parse_spec(raw: Mapping[str, Any], path: str = NO_FILE) -> Spec:
    """Build a :class:`Spec` from a decoded document after the semantic checks.

    Raises :class:`CdiSpecError` listing every problem.
    """
    problems = check_semantics(raw, path)
    if problems:
        raise CdiSpecError(problems)
    try:
        devices = tuple(
            CdiDevice(
                name=device["name"],
                edits=Edits.from_cdi(device["containerEdits"], f"$.devices[{i}].containerEdits"),
            )
            for i, device in enumerate(raw["devices"])
        )
        edits = Edits.from_cdi(raw.get("containerEdits"), "$.containerEdits")
    except CdiError as exc:  # the checks above should make this unreachable
        raise CdiSpecError([Problem(path, "$", str(exc))]) from exc
    kind = raw["kind"]
    vendor, class_ = kind.split("/", 1)
    return Spec(
        path=path,
        version=raw["cdiVersion"],
        kind=kind,
        vendor=vendor,
        class_=class_,
        devices=devices,
        edits=edits,
        raw=raw,
    )


def load_spec_file(path: str) -> Spec:
    """Read, strictly decode and check one spec file (``.json`` or ``.yaml``).

    Duplicate keys, an empty document, a non-mapping document, and any semantic problem
    are errors: raises :class:`CdiSpecError` (a :class:`CdiError`).
    """
    return parse_spec(_read_document(path), path)


def validate_file(path: str) -> List[Problem]:
    """Every problem of one spec file; decoding errors are one problem each."""
    try:
        raw = _read_document(path)
    except CdiSpecError as exc:
        return exc.problems
    return validate_spec(raw, path)


# --------------------------------------------------------------------------------------
# Registry and resolution


def _spec_files(directory: str, problems: List[Problem]) -> List[str]:
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        problems.append(Problem(directory, "$", "spec directory is not a directory"))
        return []
    except OSError as exc:
        problems.append(Problem(directory, "$", f"cannot list spec directory: {exc.strerror}"))
        return []
    files = []
    for entry in entries:
        if not entry.name.endswith(_EXTENSIONS):
            continue
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        if not is_dir:
            files.append(entry.path)
    return files


def load_registry(spec_dirs: Sequence[str] = DEFAULT_SPEC_DIRS) -> Registry:
    """Load every spec of ``spec_dirs`` with CDI's rules.

    Directories are scanned in order, non-recursively, files in name order; a later
    directory has higher priority and silently overrides. A file that fails to load is
    skipped and recorded in ``problems``. A device defined in two files of the same
    directory is a conflict: recorded, and the device is dropped entirely.
    """
    return build_registry(spec_dirs, _scan_specs(spec_dirs))


def _scan_specs(spec_dirs: Sequence[str]) -> Iterable[Tuple[int, Optional[Spec], List[Problem]]]:
    """(rank, spec or None, problems) for every spec file of ``spec_dirs``, in CDI order."""
    for rank, directory in enumerate(spec_dirs):
        problems: List[Problem] = []
        files = _spec_files(directory, problems)
        if problems:
            yield rank, None, problems
        for path in files:
            try:
                yield rank, load_spec_file(path), []
            except CdiSpecError as exc:
                yield rank, None, exc.problems


def build_registry(spec_dirs: Sequence[str],
                   loaded: Iterable[Tuple[int, Optional[Spec], List[Problem]]]) -> Registry:
    """A :class:`Registry` from specs already loaded, in scan order (CDI's priority and
    conflict rules; shared by :func:`load_registry` and the spec index)."""
    registry = Registry(spec_dirs=tuple(spec_dirs))
    priority: Dict[str, int] = {}
    conflicted: set[str] = set()
    for rank, spec, problems in loaded:
        registry.problems.extend(problems)
        if spec is None:
            continue
        path = spec.path
        registry.specs.append(spec)
        for index, device in enumerate(spec.devices):
            name = qualified_name(spec.kind, device.name)
            old = registry.devices.get(name)
            if old is not None and priority[name] == rank:
                registry.problems.append(
                    Problem(
                        path,
                        f"$.devices[{index}].name",
                        f'conflicting device "{name}" (specs "{old.spec.path}", "{path}"):'
                        " device dropped",
                    )
                )
                conflicted.add(name)
                continue
            registry.devices[name] = ResolvedDevice(spec, device)
            priority[name] = rank
    for name in conflicted:
        registry.devices.pop(name, None)
    return registry


def resolve_devices(registry: Registry, names: Sequence[str]) -> Edits:
    """The merged edits for ``names``, in CDI order.

    Names are taken in order (repeats collapsed); the first time a spec is met its
    spec-level edits are added, then each device's own. If any name is unknown nothing
    is resolved: raises :class:`CdiError` listing all of them and the directories searched.
    """
    unique = list(dict.fromkeys(names))
    missing = [name for name in unique if name not in registry.devices]
    if missing:
        searched = ", ".join(registry.spec_dirs) or "no spec directories"
        hint = ""
        if registry.problems:
            count = len(registry.problems)
            hint = f"; {count} spec problem{'s' if count != 1 else ''}, first: {registry.problems[0]}"
        raise CdiError(f"unresolvable CDI devices {', '.join(missing)} (searched {searched}{hint})")
    edits = Edits()
    seen_specs: set[str] = set()
    for name in unique:
        resolved = registry.devices[name]
        if resolved.spec.path not in seen_specs:
            seen_specs.add(resolved.spec.path)
            edits = edits + resolved.spec.edits
        edits = edits + resolved.device.edits
    return edits


# --------------------------------------------------------------------------------------
# Building and writing specs

_KEY_ORDER = ("cdiVersion", "kind", "annotations", "devices", "containerEdits")


def spec_to_dict(
    kind: str,
    devices: Sequence[Tuple[str, Edits]],
    edits: Edits,
    version: Optional[str] = None,
) -> Dict[str, Any]:
    """A spec document for ``kind`` with ``devices`` (name, edits) and spec-level ``edits``.

    ``cdiVersion`` is the minimum the content needs unless ``version`` is given. The
    result is checked; raises :class:`CdiSpecError` if it would not load.
    """
    spec: Dict[str, Any] = {
        "cdiVersion": "",
        "kind": kind,
        "devices": [{"name": name, "containerEdits": dev.to_cdi()} for name, dev in devices],
    }
    if edits:
        spec["containerEdits"] = edits.to_cdi()
    spec["cdiVersion"] = version if version is not None else required_version(spec)
    problems = check_semantics(spec)
    if problems:
        raise CdiSpecError(problems)
    return spec


def _ordered(spec: Mapping[str, Any]) -> Dict[str, Any]:
    out = {key: spec[key] for key in _KEY_ORDER if key in spec}
    out.update((key, value) for key, value in spec.items() if key not in out)
    return out


def dump_spec(spec: Mapping[str, Any], fmt: str = "yaml") -> str:
    """Serialise a spec document: ``yaml`` (starts with ``---``) or ``json``.

    Top-level keys come in the order cdiVersion, kind, annotations, devices,
    containerEdits; inner keys keep their order. Output is stable for equal input.
    """
    ordered = _ordered(spec)
    if fmt == "json":
        return _jsonc.dumps(ordered, indent=2, ensure_ascii=False) + "\n"
    if fmt == "yaml":
        import yaml

        text: str = yaml.safe_dump(
            ordered,
            explicit_start=True,
            sort_keys=False,
            default_flow_style=False,
            width=2**30,
        )
        return text
    raise CdiError(f'unknown spec format "{fmt}": expected yaml or json')


def _format_for(path: str) -> str:
    ext = os.path.splitext(path)[1]
    if ext not in _EXTENSIONS:
        raise CdiError(f'cannot write CDI spec {path}: the name must end in .json or .yaml')
    return ext[1:]


def write_spec(path: str, spec: Mapping[str, Any]) -> None:
    """Write ``spec`` to ``path`` atomically, format from the extension.

    The directory is created (0755) if needed; a new file gets mode 0644 (an existing
    file keeps its mode). Readers never see a partial file: the temporary file's name
    does not end in .json/.yaml, so registries ignore it.
    """
    from nvshim.files import write_atomic

    text = dump_spec(spec, _format_for(path))
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
    except OSError as exc:
        raise CdiError(f"cannot create CDI spec directory {directory}: {exc.strerror}") from exc
    write_atomic(path, text.encode("utf-8"), default_mode=0o644)

