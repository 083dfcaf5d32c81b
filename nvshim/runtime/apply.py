"""Apply :class:`~nvshim.edits.Edits` to an OCI spec — the one function that edits config.json.

Pure: returns a new dict and never mutates its input; unknown fields survive. Follows
CDI's rules (env overwritten by name, device nodes de-duplicated by container path, a
cgroup allow rule per node, mounts replacing the same destination then stable-sorted by
depth, hooks appended) with one deliberate difference: identical cgroup rules, hooks and
gids are not added twice, so applying the same edits twice gives the same spec as once.
"""

from __future__ import annotations

import posixpath

from nvshim.edits import HOOK_NAMES, DeviceNode, Edits
from nvshim.errors import SPEC_FILE, SpecError

TYPE_CHECKING = False  # typing costs ~4 ms to import on the create path
if TYPE_CHECKING:
    from typing import Any, Dict, List  # Any: config.json's JSON values, kept as they are

__all__ = ["apply_edits", "set_env"]


def _copy(value: Any) -> Any:
    """A deep copy of decoded JSON (dicts, lists, scalars); ``copy.deepcopy`` costs ~4 ms
    to import (weakref) on the create path and is slower on such trees."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _obj(parent: Dict[str, Any], key: str, where: str) -> Dict[str, Any]:
    value = parent.get(key)
    if value is None:
        value = {}
        parent[key] = value
    if not isinstance(value, dict):
        raise SpecError(f"{where} must be an object", SPEC_FILE)
    return value


def _list(parent: Dict[str, Any], key: str, where: str) -> List[Any]:
    value = parent.get(key)
    if value is None:
        value = []
        parent[key] = value
    if not isinstance(value, list):
        raise SpecError(f"{where} must be a list", SPEC_FILE)
    return value


def set_env(env: List[Any], entry: str) -> None:
    """Set ``NAME=VALUE`` in an OCI env list: every entry of NAME becomes this one.

    CDI overwrites the first entry in place; we also drop later duplicates so the value
    the container sees is unambiguous (runc keeps the last entry of a name).
    """
    name = entry.split("=", 1)[0]
    replaced = False
    out = []
    for item in env:
        if isinstance(item, str) and item.split("=", 1)[0] == name:
            if not replaced:
                out.append(entry)
                replaced = True
            continue
        out.append(item)
    if not replaced:
        out.append(entry)
    env[:] = out


def _oci_device(node: DeviceNode, process: Dict[str, Any]) -> Dict[str, Any]:
    if node.type is None or (node.type != "p" and node.major is None):
        raise SpecError(
            f"device node {node.path} has no type/major: discovery must fill them before apply"
        )
    dev: Dict[str, Any] = {"path": node.path, "type": node.type}
    if node.type != "p":
        dev["major"] = node.major
        dev["minor"] = node.minor or 0
    if node.file_mode is not None:
        dev["fileMode"] = node.file_mode
    found = process.get("user")
    user: Dict[str, Any] = found if isinstance(found, dict) else {}
    uid = node.uid if node.uid is not None else (user.get("uid") or None)
    gid = node.gid if node.gid is not None else (user.get("gid") or None)
    if uid is not None:
        dev["uid"] = uid
    if gid is not None:
        dev["gid"] = gid
    return dev


def _depth(mount: Any) -> int:
    dest = mount.get("destination", "") if isinstance(mount, dict) else ""
    if not isinstance(dest, str):
        return 0
    return posixpath.normpath(dest).count("/")


def apply_edits(spec: Dict[str, Any], edits: Edits) -> Dict[str, Any]:
    """Return a copy of ``spec`` with ``edits`` applied (``spec`` is left untouched)."""
    if not isinstance(spec, dict):
        raise SpecError("top level must be a JSON object", SPEC_FILE)
    out: Dict[str, Any] = _copy(spec)
    if not edits:
        return out

    touches_process = edits.env or edits.device_nodes or edits.additional_gids
    process = _obj(out, "process", "process") if touches_process else {}
    if edits.env:
        env = _list(process, "env", "process.env")
        for entry in edits.env:
            set_env(env, entry)

    if edits.device_nodes:
        linux = _obj(out, "linux", "linux")
        devices = _list(linux, "devices", "linux.devices")
        resources = _obj(linux, "resources", "linux.resources")
        rules = _list(resources, "devices", "linux.resources.devices")
        for node in edits.device_nodes:
            dev = _oci_device(node, process)
            devices[:] = [d for d in devices
                          if not (isinstance(d, dict) and d.get("path") == node.path)]
            devices.append(dev)
            if node.type in ("b", "c"):
                rule = {
                    "allow": True,
                    "type": node.type,
                    "major": node.major,
                    "minor": node.minor or 0,
                    "access": node.permissions or "rwm",
                }
                if rule not in rules:
                    rules.append(rule)

    if edits.mounts:
        mounts = _list(out, "mounts", "mounts")
        for m in edits.mounts:
            for i, existing in enumerate(mounts):
                if isinstance(existing, dict) and existing.get("destination") == m.container_path:
                    del mounts[i]
                    break
            mount: Dict[str, Any] = {"destination": m.container_path, "source": m.host_path}
            if m.type:
                mount["type"] = m.type
            if m.options:
                mount["options"] = list(m.options)
            mounts.append(mount)
        mounts.sort(key=_depth)  # stable: parents first, ties keep their order

    if edits.hooks:
        hooks = _obj(out, "hooks", "hooks")
        for hook in edits.hooks:
            if hook.hook_name not in HOOK_NAMES:
                raise SpecError(f'unknown hook name "{hook.hook_name}"')
            lst = _list(hooks, hook.hook_name, f"hooks.{hook.hook_name}")
            oci = hook.to_oci()
            if oci not in lst:
                lst.append(oci)

    if edits.additional_gids:
        user = _obj(process, "user", "process.user")
        gids = _list(user, "additionalGids", "process.user.additionalGids")
        for gid in edits.additional_gids:
            if gid and gid not in gids:
                gids.append(gid)
    return out
