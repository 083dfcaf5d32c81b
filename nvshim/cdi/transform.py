"""``nvshim cdi transform root``: move a CDI spec's paths from one root to another.

A driver container (the GPU operator's) installs the driver under ``/run/nvidia/driver`` on
the host; a spec generated inside that container says ``/usr/lib/...``, one generated on the
host says ``/run/nvidia/driver/usr/lib/...``. ``transform root --from A --to B`` rewrites
every path that is ``A`` or below it so that it is under ``B`` instead:

* ``--relative-to host`` (default): ``hostPath`` of mounts and device nodes, hook
  ``path``, and the host file after a hook's ``--params`` (nvshim's params hook reads the
  driver's ``proc/driver/nvidia/params`` there); a device node without ``hostPath`` whose
  ``path`` moves gets a ``hostPath``, so its container path stays;
* ``--relative-to container``: ``containerPath`` of mounts and ``path`` of device nodes.

Paths are compared by components (``/run/nvidia/driver2`` is not under ``/run/nvidia/driver``).
The result is checked like any spec before it is written.
"""

from __future__ import annotations

import copy
import posixpath
from typing import Any, Dict, List, Mapping, Tuple

from nvshim.errors import UsageError

__all__ = ["transform_root"]

#: The hook flag whose value is a host file (nvshim.runtime.devparams.params_hook_args).
_HOST_FILE_FLAG = "--params"


def _move(path: str, old: str, new: str) -> str:
    """``path`` re-rooted from ``old`` to ``new``; unchanged when not under ``old``."""
    if not isinstance(path, str) or not path.startswith("/"):
        return path
    clean = posixpath.normpath(path)
    if old == "/":
        rest = clean.lstrip("/")
    elif clean == old:
        rest = ""
    elif clean.startswith(old + "/"):
        rest = clean[len(old) + 1 :]
    else:
        return path
    return posixpath.join(new, rest) if rest else new


def _edit_sets(spec: Dict[str, Any]) -> List[Dict[str, Any]]:
    sets = []
    if isinstance(spec.get("containerEdits"), dict):
        sets.append(spec["containerEdits"])
    for device in spec.get("devices") or []:
        if isinstance(device, dict) and isinstance(device.get("containerEdits"), dict):
            sets.append(device["containerEdits"])
    return sets


def transform_root(
    spec: Mapping[str, Any], old: str, new: str, relative_to: str = "host"
) -> Tuple[Dict[str, Any], int]:
    """A copy of ``spec`` with paths moved from ``old`` to ``new``, and how many changed."""
    for label, value in (("--from", old), ("--to", new)):
        if not value.startswith("/"):
            raise UsageError(f'{label} "{value}" is not an absolute path')
    if relative_to not in ("host", "container"):
        raise UsageError(f'--relative-to "{relative_to}": expected host or container')
    old, new = posixpath.normpath(old), posixpath.normpath(new)
    out = copy.deepcopy(dict(spec))
    changed = 0

    def move(obj: Dict[str, Any], key: str, source: str = "") -> None:
        nonlocal changed
        value = obj.get(key, obj.get(source) if source else None)
        if not isinstance(value, str):
            return
        moved = _move(value, old, new)
        if moved != value:
            obj[key] = moved
            changed += 1

    for edits in _edit_sets(out):
        for mount in edits.get("mounts") or []:
            if isinstance(mount, dict):
                move(mount, "hostPath" if relative_to == "host" else "containerPath")
        for node in edits.get("deviceNodes") or []:
            if isinstance(node, dict):
                if relative_to == "host":
                    move(node, "hostPath", source="path")
                else:
                    move(node, "path")
                if node.get("hostPath") == node.get("path"):
                    del node["hostPath"]  # CDI's default: the host path is the path
        if relative_to == "host":
            for hook in edits.get("hooks") or []:
                if isinstance(hook, dict):
                    move(hook, "path")
                    args = hook.get("args")
                    if not isinstance(args, list):
                        continue
                    for i in range(1, len(args)):
                        if args[i - 1] == _HOST_FILE_FLAG:  # nvshim's params hook reads it
                            moved = _move(args[i], old, new)
                            if moved != args[i]:
                                args[i] = moved
                                changed += 1
    return out, changed
