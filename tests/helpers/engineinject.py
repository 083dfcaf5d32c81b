"""config.json as an engine leaves it after its own CDI injection (containerd 1.7+, CRI-O).

:func:`inject_like_engine` applies CDI devices of a spec dict to an OCI spec the way CDI's
reference library does (spec-level edits once, then each device's; env replaced by name,
``linux.devices`` plus one cgroup allow rule per node, mounts appended and sorted by depth,
hooks appended), written here in plain Python so that tests of nvshim never build their
input with nvshim's own :func:`~nvshim.edits.apply_edits`.
:func:`nvidia_style_hooks` turns nvshim's hook in a spec into the ``nvidia-cdi-hook`` hooks
NVIDIA's ``nvidia-ctk cdi generate`` writes (create-symlinks, update-ldcache).
"""

from __future__ import annotations

import copy
import posixpath
from typing import Any, Dict, List, Mapping, Sequence

__all__ = ["inject_like_engine", "nvidia_style_hooks"]


def nvidia_style_hooks(cdi_spec: Mapping[str, Any], binary: str) -> Dict[str, Any]:
    """A copy of ``cdi_spec`` whose nvshim createContainer hook is replaced by NVIDIA's
    ``<binary> create-symlinks --link T::L …`` and ``<binary> update-ldcache --folder D …``."""
    from nvshim.runtime.hookargs import parse_hook_args, runs_nvshim_hook

    out = copy.deepcopy(dict(cdi_spec))
    edits = out.get("containerEdits") or {}
    hooks: List[Dict[str, Any]] = []
    for hook in edits.get("hooks") or []:
        if not runs_nvshim_hook(hook.get("args") or []):
            hooks.append(hook)
            continue
        links, folders = parse_hook_args(hook["args"])
        name = posixpath.basename(binary)
        symlinks = [name, "create-symlinks"]
        for target, link in links:
            symlinks += ["--link", f"{target}::{link}"]
        ldcache = [name, "update-ldcache"]
        for folder in folders:
            ldcache += ["--folder", folder]
        for args in (symlinks, ldcache):
            hooks.append(
                {
                    "hookName": "createContainer",
                    "path": binary,
                    "args": args,
                    "env": ["NVIDIA_CTK_DEBUG=false"],
                }
            )
    edits["hooks"] = hooks
    return out


def _set_env(env: List[str], entry: str) -> None:
    name = entry.split("=", 1)[0]
    for i, item in enumerate(env):
        if item.split("=", 1)[0] == name:
            env[i] = entry
            return
    env.append(entry)


def inject_like_engine(
    spec: Mapping[str, Any], cdi_spec: Mapping[str, Any], names: Sequence[str], void: bool = True
) -> Dict[str, Any]:
    """``spec`` with the CDI devices ``names`` (unqualified, of ``cdi_spec``) injected as
    containerd 1.7's CRI plugin does; ``void=False`` leaves out the spec's
    ``NVIDIA_VISIBLE_DEVICES=void`` env line (other vendors' and hand-written specs)."""
    out = copy.deepcopy(dict(spec))
    by_name = {d["name"]: d for d in cdi_spec["devices"]}
    edit_sets = [cdi_spec.get("containerEdits") or {}]
    edit_sets += [by_name[n]["containerEdits"] for n in names]
    process = out.setdefault("process", {})
    env = process.setdefault("env", [])
    linux = out.setdefault("linux", {})
    devices = linux.setdefault("devices", [])
    rules = linux.setdefault("resources", {}).setdefault("devices", [])
    mounts = out.setdefault("mounts", [])
    hooks = out.setdefault("hooks", {})
    for edits in edit_sets:
        for entry in edits.get("env") or []:
            if void or entry != "NVIDIA_VISIBLE_DEVICES=void":
                _set_env(env, entry)
        for node in edits.get("deviceNodes") or []:
            devices[:] = [d for d in devices if d["path"] != node["path"]]
            dev = {
                "path": node["path"],
                "type": node["type"],
                "major": node["major"],
                "minor": node["minor"],
            }
            if "fileMode" in node:
                dev["fileMode"] = node["fileMode"]
            devices.append(dev)
            rules.append(
                {
                    "allow": True,
                    "type": node["type"],
                    "major": node["major"],
                    "minor": node["minor"],
                    "access": node.get("permissions") or "rwm",
                }
            )
        for m in edits.get("mounts") or []:
            mounts[:] = [x for x in mounts if x["destination"] != m["containerPath"]]
            mount = {"destination": m["containerPath"], "source": m["hostPath"]}
            if m.get("type"):
                mount["type"] = m["type"]
            mount["options"] = list(m.get("options") or [])
            mounts.append(mount)
        for hook in edits.get("hooks") or []:
            entry = {"path": hook["path"], "args": list(hook.get("args") or [])}
            if hook.get("env"):
                entry["env"] = list(hook["env"])
            hooks.setdefault(hook["hookName"], []).append(entry)
    mounts.sort(key=lambda m: posixpath.normpath(m["destination"]).count("/"))
    return out
