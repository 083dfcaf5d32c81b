"""``nvshim doctor`` checks for Docker and CRI-O (containerd's live in :mod:`nvshim.node.doctor`).

Each engine gives one finding, ``docker`` / ``crio``: ``skip`` when the engine has no config
on this node; ``fail`` when the config does not parse, an nvshim runtime points at a
missing or non-executable binary, or nvshim is the engine's default runtime while
require-allocation is off (the pitfall: containers that asked for no GPU get every GPU
from a CUDA image's ``NVIDIA_VISIBLE_DEVICES=all``); ``warn`` when no nvshim runtime is
registered; ``ok`` otherwise.
"""

from __future__ import annotations

import os
from typing import Any, List, Mapping, Optional

from nvshim.errors import NvshimError

__all__ = ["check_crio", "check_dev_char_links", "check_docker"]


def _binary_problems(ours: Mapping[str, Optional[str]], key: str) -> List[str]:
    problems = []
    for name, binary in sorted(ours.items()):
        if binary is None:
            problems.append(f'runtime "{name}" has no {key}')
        elif not os.path.isabs(binary):
            problems.append(f'runtime "{name}" {key} {binary} is not an absolute path')
        elif not os.path.isfile(binary):
            problems.append(f'runtime "{name}" {key} {binary} does not exist')
        elif not os.access(binary, os.X_OK):
            problems.append(f'runtime "{name}" {key} {binary} is not executable')
    return problems


def _check(
    check: str,
    engine: str,
    path: str,
    handlers: Mapping[str, Optional[str]],
    default: Optional[str],
    key: str,
    config: Any,
    options: Any,
) -> Any:
    from nvshim.node.findings import Finding, is_nvshim

    ours = {n: b for n, b in handlers.items() if is_nvshim(n, b, options)}
    configure = f"nvshim runtime configure --runtime {check}"
    if not ours:
        return Finding(check, "warn", f"{path} has no nvshim runtime", configure)
    problems = _binary_problems(ours, key)
    if problems:
        return Finding(check, "fail", "; ".join(problems) + f": {engine} cannot start it",
                       f"install nvshim (./install.sh), or re-run {configure}")
    if default in ours:
        if config is None:
            return Finding(check, "skip", f"{engine}'s default runtime is nvshim; nvshim's "
                           "config is invalid")
        if not config.require_allocation:
            return Finding(
                check, "fail",
                f"{engine}'s default runtime is nvshim but require-allocation is off: "
                "containers that request no GPU get every GPU from CUDA images' "
                "NVIDIA_VISIBLE_DEVICES=all",
                f"set require-allocation: true in {options.config_path} (then nvshim config "
                f"compile), or {configure} without --set-as-default",
            )
    names = ", ".join(f"{n} ({b})" for n, b in sorted(ours.items()))
    return Finding(check, "ok", f"{path}: nvshim runtime {names}; default "
                   f"{default or 'the engine default'}")


def check_docker(path: str, config: Any, options: Any) -> Any:
    """Docker's daemon.json: nvshim runtime present, its path executable, the default pitfall."""
    from nvshim.node.docker import read_runtimes
    from nvshim.node.findings import Finding

    if not os.path.exists(path):
        return Finding("docker", "skip", f"no Docker config at {path}")
    try:
        seen = read_runtimes(path)
    except NvshimError as exc:
        return Finding("docker", "fail", str(exc), f"fix {path}: dockerd will not start with it")
    return _check("docker", "Docker", path, seen.runtimes, seen.default_runtime, "path",
                  config, options)


def check_crio(path: str, config: Any, options: Any) -> Any:
    """CRI-O's config and drop-ins: the same three questions."""
    from nvshim.node.crio import read_handlers
    from nvshim.node.findings import Finding

    drop_ins = os.path.join(os.path.dirname(path), "crio.conf.d")
    if not os.path.exists(path) and not os.path.isdir(drop_ins):
        return Finding("crio", "skip", f"no CRI-O config at {path} or {drop_ins}")
    try:
        seen = read_handlers(path, drop_ins)
    except NvshimError as exc:
        return Finding("crio", "fail", str(exc), "fix the file: crio will not start with it")
    return _check("crio", "CRI-O", f"{path} (+{len(seen.files)} file(s))", seen.handlers,
                  seen.default_runtime, "runtime_path", config, options)


def check_dev_char_links(dev_root: str, systemd: Optional[bool] = None) -> Any:
    """Every NVIDIA device node has its /dev/char/<major>:<minor> link (systemd needs it).

    ``systemd`` (default: whether /run/systemd/system exists) says if systemd runs here;
    without it nothing re-applies device rules and the check is ``skip``.
    """
    from nvshim.host.system import create_dev_char_symlinks
    from nvshim.node.findings import Finding

    if systemd is None:
        systemd = os.path.isdir("/run/systemd/system")
    if not systemd:
        return Finding("dev-char-links", "skip", "systemd does not run here: no daemon-reload "
                       "can take devices away, /dev/char links are not needed")
    try:
        outcomes = create_dev_char_symlinks(dev_root, dry_run=True)
    except NvshimError as exc:
        return Finding("dev-char-links", "skip", str(exc))
    missing = [f"{os.path.basename(o.path)} ({o.detail.split(',')[0]})" for o in outcomes
               if o.action != "exists"]
    if not missing:
        return Finding("dev-char-links", "ok",
                       f"{len(outcomes)} NVIDIA device node(s), each with its /dev/char link")
    shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
    where = "" if dev_root in ("", "/") else f" --dev-root {dev_root}"
    return Finding(
        "dev-char-links", "warn",
        f"/dev/char links missing or foreign: {shown}; a `systemctl daemon-reload` takes those "
        "devices away from running containers that use the systemd cgroup driver",
        f"nvshim system create-dev-char-symlinks{where}",
    )
