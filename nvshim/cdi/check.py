"""The CDI spec checker: structure and the reference implementation's semantic rules.

The one owner of every rule a spec's fields obey (types, required fields, value ranges,
names, versions, duplicates): :func:`check_semantics` lists every problem of a decoded
document and never raises, whatever its shape. What it accepts, :mod:`nvshim.cdi.load`
converts without checking again. The JSON-schema layer on top is :mod:`nvshim.cdi.schema`.

One rule is stricter than the reference implementation: container paths (``deviceNodes``
``path``, mounts' ``containerPath``) and hook ``path`` must be absolute, as CDI's SPEC.md
and the OCI runtime spec require. A spec breaking it is refused by ``cdi validate`` and
skipped at create alike (a runtime could not use it as written).

Standard library only: every spec a CDI create loads is checked.
"""

from __future__ import annotations

from _collections_abc import Mapping  # loaded by os at start-up; collections.abc is not

from nvshim import _jsonc
from nvshim.cdi.model import NO_FILE
from nvshim.cdi.names import device_name_error, kind_error
from nvshim.cdi.version import version_error
from nvshim.edits import HOOK_NAMES
from nvshim.errors import CdiProblem

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["check_semantics", "type_name", "key_path"]

_DEVICE_TYPES = ("", "b", "c", "u", "p")
_UINT32 = (0, 2**32 - 1)
_INT64 = (-(2**63), 2**63 - 1)
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


def type_name(value: Any) -> str:
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


def key_path(base: str, key: Any) -> str:
    if isinstance(key, str) and key and key.replace("_", "a").isalnum() and key.isascii():
        return f"{base}.{key}"
    return f"{base}[{_jsonc.dumps(str(key))}]"


class _Checker:
    """Collects problems while walking a decoded spec; never raises on odd input."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.problems: List[CdiProblem] = []

    def add(self, json_path: str, message: str) -> None:
        self.problems.append(CdiProblem(self.file, json_path, message))

    # generic shapes ---------------------------------------------------------------

    def mapping(self, value: Any, where: str, keys: Sequence[str]) -> bool:
        """Check ``value`` is a mapping with only ``keys``; False if not a mapping."""
        if value.__class__ is not dict and not isinstance(value, Mapping):
            self.add(where, f"must be a mapping, got {type_name(value)}")
            return False
        for key in value:
            if key in keys:
                continue
            hint = ""
            lower = {k.lower(): k for k in keys}
            if isinstance(key, str) and key.lower() in lower:
                hint = f' (did you mean "{lower[key.lower()]}"?)'
            self.add(key_path(where, key), f'unknown field "{key}"{hint}')
        return True

    def list_(self, value: Any, where: str) -> List[Tuple[str, Any]]:
        """Items of an optional list with their paths; null is an empty list."""
        if value is None:
            return []
        if not isinstance(value, list):
            self.add(where, f"must be a list, got {type_name(value)}")
            return []
        return [(f"{where}[{i}]", item) for i, item in enumerate(value)]

    def string(self, value: Any, where: str, required: bool = False) -> Optional[str]:
        """A string field; reports a wrong type, or an empty/missing required one."""
        if value is None and not required:
            return None
        if not isinstance(value, str):
            self.add(where, f"must be a string, got {type_name(value)}")
            return None
        if required and not value:
            self.add(where, "must not be empty")
            return None
        return value

    def integer(self, value: Any, where: str, bounds: Tuple[int, int]) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(where, f"must be an integer, got {type_name(value)}")
        elif not bounds[0] <= value <= bounds[1]:
            self.add(where, f"{value} is out of range {bounds[0]}..{bounds[1]}")

    def absolute(self, path: Optional[str], where: str, label: str) -> None:
        """A container path or hook path must be absolute (CDI's SPEC.md and the OCI runtime
        spec say so; the reference implementation does not check, runc warns or fails)."""
        if not path or path.startswith("/"):
            return
        hint = f" (did you mean {_jsonc.dumps('/' + path)}?)" if label == "container path" else ""
        self.add(where, f"{label} {_jsonc.dumps(path)} is not absolute{hint}")

    def strings(self, value: Any, where: str) -> None:
        for item_path, item in self.list_(value, where):
            self.string(item, item_path)

    def required(self, obj: Mapping[str, Any], key: str, where: str) -> bool:
        if key not in obj:
            self.add(key_path(where, key), "required field is missing")
            return False
        return True

    def annotations(self, value: Any, where: str) -> None:
        if value is not None:
            self.mapping_of_strings(value, where)

    def mapping_of_strings(self, value: Any, where: str) -> bool:
        if not isinstance(value, Mapping):
            self.add(where, f"must be a mapping, got {type_name(value)}")
            return False
        for key, item in value.items():
            if not isinstance(key, str):
                self.add(key_path(where, key), f"key must be a string, got {type_name(key)}")
            elif not isinstance(item, str):
                self.add(key_path(where, key), f"must be a string, got {type_name(item)}")
        return True

    def env(self, value: Any, where: str) -> None:
        for item_path, item in self.list_(value, where):
            text = self.string(item, item_path)
            if text is not None and text.find("=") <= 0:
                self.add(item_path, f'env entry "{text}" must be NAME=VALUE')

    # CDI shapes ---------------------------------------------------------------------

    def spec(self, raw: Any) -> None:
        if not isinstance(raw, Mapping):
            self.add("$", f"top level must be a mapping, got {type_name(raw)}")
            return
        self.mapping(raw, "$", _TOP_KEYS)
        if self.required(raw, "cdiVersion", "$"):
            version = self.string(raw["cdiVersion"], "$.cdiVersion", required=True)
            if version is not None:
                reason = version_error(version, raw)
                if reason:
                    self.add("$.cdiVersion", reason)
        if self.required(raw, "kind", "$"):
            kind = self.string(raw["kind"], "$.kind", required=True)
            if kind is not None:
                reason = kind_error(kind)
                if reason:
                    self.add("$.kind", reason)
        self.annotations(raw.get("annotations"), "$.annotations")
        if raw.get("containerEdits") is not None:
            self.edits(raw["containerEdits"], "$.containerEdits")
        if self.required(raw, "devices", "$"):
            devices = raw["devices"]
            if not isinstance(devices, list):
                self.add("$.devices", f"must be a list, got {type_name(devices)}")
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
                reason = device_name_error(name)
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
            path = self.string(node["path"], f"{where}.path", required=True)
            self.absolute(path, f"{where}.path", "container path")
        self.string(node.get("hostPath"), f"{where}.hostPath")
        dtype = self.string(node.get("type"), f"{where}.type")
        if dtype is not None and dtype not in _DEVICE_TYPES:
            self.add(f"{where}.type", f'device type "{dtype}" is not one of b, c, u, p')
        for key in ("major", "minor"):  # runc keeps the low 32 bits: only these mean it
            value = node.get(key)
            if type(value) is int and not _UINT32[0] <= value <= _UINT32[1]:
                self.add(
                    f"{where}.{key}",
                    f"{value} is out of range 0..{_UINT32[1]} (runc keeps "
                    f"the low 32 bits: it would use {value % (_UINT32[1] + 1)})",
                )
            else:
                self.integer(value, f"{where}.{key}", _UINT32)
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
                path = self.string(mount[key], f"{where}.{key}", required=True)
                if key == "containerPath":
                    self.absolute(path, f"{where}.{key}", "container path")
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
            path = self.string(hook["path"], f"{where}.path", required=True)
            self.absolute(path, f"{where}.path", "hook path")
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
            self.add(f"{where}.enableMonitoring", f"must be a boolean, got {type_name(monitoring)}")

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


def check_semantics(raw: Any, path: str = NO_FILE) -> List[CdiProblem]:
    """Structure and the reference implementation's rules, without jsonschema.

    This is what the registry applies when it loads a spec (cheap enough for the
    runtime's ``create`` path); :func:`validate_spec` adds the JSON-schema layer.
    """
    checker = _Checker(path)
    checker.spec(raw)
    return checker.problems
