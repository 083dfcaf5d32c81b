"""``nvshim doctor``'s ``oci-hooks`` check: NVIDIA's hook in podman's and CRI-O's hooks.d.

NVIDIA's OCI-hook mode puts a hook file (``oci-nvidia-hook.json``) in
``/usr/share/containers/oci/hooks.d`` that runs ``nvidia-container-toolkit prestart`` (or
``nvidia-container-runtime-hook``) with ``"when": {"always": true}``: podman and CRI-O add it
to every container they start, whatever runtime runs it, and the hook grants GPUs from the
container's env -- a CUDA image's ``NVIDIA_VISIBLE_DEVICES=all`` gets every GPU, past nvshim
altogether. Hook files are read as the ``1.0.0`` schema says: every condition of ``when``
must match (``always``, ``annotations``, ``commands``, ``hasBindMounts``), and a file in a
later directory masks the one of the same name in an earlier directory.

One finding: ``fail`` for NVIDIA's hook in every container (``always`` true, no other
condition that could fail), ``warn`` for one limited by conditions (a container that
matches them, an annotation a pod may write itself, still gets GPUs from its env), and
``ok`` for both when the config NVIDIA's hook reads sets
``accept-nvidia-visible-devices-envvar-when-unprivileged = false``; ``skip`` when no hook
directory exists.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional

from nvshim.node.doctor.findings import DoctorOptions, Finding
from nvshim.node.doctor.follow import follow, nvidia_env_policy, parse_env

__all__ = ["check_oci_hooks"]

_CHECK = "oci-hooks"
_MATCH_ALL = {"", ".*", "^.*$", ".*$", "^.*"}
_SWITCH = "accept-nvidia-visible-devices-envvar-when-unprivileged"


def _hook_files(dirs: List[str]) -> Dict[str, str]:
    """file name → path, a later directory's file masking an earlier one's."""
    files: Dict[str, str] = {}
    for directory in dirs:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            if name.endswith(".json"):
                files[name] = os.path.join(directory, name)
    return files


def _load(path: str) -> Optional[Mapping[str, Any]]:
    from nvshim.errors import NvshimError
    from nvshim.node.engines.files import read_text

    try:
        text = read_text(path, "OCI hook file")
        doc = json.loads(text) if text is not None else None
    except (NvshimError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _conditions(when: Mapping[str, Any]) -> Optional[str]:
    """None when ``when`` matches every container; else what it is limited to."""
    if when.get("always") is not True:
        return 'its when conditions (no "always": true)'
    limits = []
    if when.get("annotations"):
        limits.append("annotations " + ", ".join(sorted(map(str, when["annotations"]))))
    if isinstance(when.get("hasBindMounts"), bool):
        limits.append("hasBindMounts")
    commands = when.get("commands")
    if isinstance(commands, list) and commands and not any(c in _MATCH_ALL for c in commands):
        limits.append("commands " + ", ".join(map(str, commands)))
    return "; ".join(limits) or None


def check_oci_hooks(options: DoctorOptions) -> Finding:
    """NVIDIA's hook in a hooks.d that podman or CRI-O reads (see the module docstring)."""
    dirs = list(options.hooks_dirs)
    if not any(os.path.isdir(d) for d in dirs):
        return Finding(_CHECK, "skip", f"no OCI hook directory ({', '.join(dirs)})")
    files = _hook_files(dirs)
    findings: List[Finding] = []
    for _, path in sorted(files.items()):
        doc = _load(path)
        hook = doc.get("hook") if doc is not None else None
        if doc is None or not isinstance(hook, dict) or not isinstance(hook.get("path"), str):
            continue  # not a 1.0.0 hook file: podman and CRI-O say so themselves
        env = parse_env(hook.get("env"))
        followed = follow(hook["path"], env, options.trampoline, hook=True)
        if followed.kind != "nvidia":
            continue
        when = doc.get("when")
        limited = _conditions(when if isinstance(when, dict) else {})
        policy = nvidia_env_policy(dict(followed.env), options.nvidia_config)
        runs = " → ".join([hook["path"], *followed.chain[1:]])
        scope = (
            'every container podman and CRI-O start ("always": true)'
            if limited is None
            else f"the containers that match {limited}"
        )
        if not policy.accepts_env:
            findings.append(
                Finding(
                    _CHECK,
                    "ok",
                    f"{path} adds NVIDIA's hook; {policy.path} turns its env grants off",
                    detail=f"{path} adds NVIDIA's hook {runs} to {scope}, and {policy.path} sets "
                    f"{_SWITCH} = false: an unprivileged container's env grants it no GPU",
                )
            )
            continue
        last = dirs[-1]
        mask = (
            f'mask it with a file of the same name in {last} whose "when" is {{"always": false}}'
            if os.path.dirname(path) != last
            else f"remove {path}"
        )
        fix = (
            f"{mask} and run GPU containers through nvshim-runtime (podman --runtime, CRI-O's "
            f"nvshim handler); or set {_SWITCH} = false in {policy.path}"
        )
        findings.append(
            Finding(
                _CHECK,
                "fail" if limited is None else "warn",
                f"NVIDIA's hook in {os.path.basename(path)}: "
                "containers asking no GPU get every GPU",
                "mask it (--verbose: how)" if mask != f"remove {path}" else "remove it",
                detail=f"{path} adds NVIDIA's hook {runs} to {scope}, whatever runtime runs them: "
                "it grants GPUs from the container's env, so one that requests no GPU gets "
                f"every GPU from a CUDA image's NVIDIA_VISIBLE_DEVICES=all, past nvshim "
                f"({policy.path}: {_SWITCH} "
                f"{'is true' if policy.exists else 'defaults to true'}). Fix: {fix}",
            )
        )
    if not findings:
        return Finding(
            _CHECK,
            "ok",
            f"no hook file in {', '.join(dirs)} runs NVIDIA's hook ({len(files)} file(s))",
        )
    worst = next(
        (f for f in findings if f.status == "fail"),
        next((f for f in findings if f.status == "warn"), findings[0]),
    )
    if len(findings) == 1:
        return worst
    others = "; ".join(f.detail or f.message for f in findings if f is not worst)
    return Finding(
        _CHECK,
        worst.status,
        f"{worst.message} (and {len(findings) - 1} more)",
        worst.fix,
        detail=f"{worst.detail}; also: {others}",
    )
