"""``nvshim doctor``'s ``executable-trust`` check: the programs nvshim runs as root, or puts
into config.json for runc to run as root, pass the config files' trust rule
(:func:`nvshim.files.executable_problem`: owned by root, writable by root only, reached
through directories only root can change) -- as nvshim-runtime holds them on every create.

Looked at: each ``runtimes:`` entry found on doctor's PATH (an absolute one as it is), the
hooks of every CDI spec file in ``cdi-spec-dirs``, the interpreter nvshim's own hook runs
(this nvshim's), and nvshim's ``nvidia-container-runtime-hook`` stand-in for Docker on
dockerd's PATH. One failure per program, naming it and the fix; ``skip`` when not root.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from nvshim.config import Config
from nvshim.node.doctor.findings import Finding

if TYPE_CHECKING:
    from nvshim.cdi.model import Spec

__all__ = ["check_executables", "executables"]

NAME = "executable-trust"


def executables(
    config: Config, load_spec: Optional[Callable[[str], Spec]] = None
) -> List[Tuple[str, str]]:
    """(program, what names it) for every program nvshim would run as root on this node
    because of ``config`` or a CDI spec it loads; each program once, first naming kept."""
    from nvshim.node.engines.docker import DOCKERD_PATH, GPUS_HOOK, is_gpus_hook
    from nvshim.runtime.hookargs import hook_command
    from nvshim.runtime.main import find_runtime

    out: Dict[str, str] = {}
    source = config.source or "the built-in defaults"
    for name in config.runtimes:
        found = find_runtime((name,), os.environ.get("PATH"))
        if found is not None:
            out.setdefault(found, f"runtimes: in {source}")
    for path, spec in _spec_hooks(config.cdi_spec_dirs, load_spec):
        out.setdefault(path, f"a hook of CDI spec {spec}")
    out.setdefault(hook_command()[0], "nvshim's own hook")
    for directory in DOCKERD_PATH:
        path = os.path.join(directory, GPUS_HOOK)
        try:
            with open(path, "rb") as fh:
                head = fh.read(4096)
        except OSError:
            continue
        if is_gpus_hook(head.decode("utf-8", "replace")):
            out.setdefault(path, "nvshim's stand-in for docker run --gpus")
    return list(out.items())


def _spec_hooks(
    spec_dirs: Tuple[str, ...], load_spec: Optional[Callable[[str], Spec]] = None
) -> List[Tuple[str, str]]:
    """(hook path, spec file) of every hook (spec-level and per device) of the CDI spec
    files in ``spec_dirs`` that load; broken ones are the ``cdi-specs`` check's.
    ``load_spec``: how a file is loaded (default: ``load_spec_file``)."""
    from nvshim.cdi.load import load_spec_file
    from nvshim.cdi.registry import spec_files
    from nvshim.errors import NvshimError

    read = load_spec_file if load_spec is None else load_spec
    out = []
    for directory in spec_dirs:
        for path in spec_files(directory, []):
            try:
                spec = read(path)
            except NvshimError:
                continue
            for edits in (spec.edits, *(d.edits for d in spec.devices)):
                out += [(h.path, path) for h in edits.hooks]
    return out


def check_executables(
    config: Config, load_spec: Optional[Callable[[str], Spec]] = None
) -> List[Finding]:
    """One failure per program of :func:`executables` that the trust rule refuses, else
    one ok; ``skip`` when not root (the rule protects root only)."""
    from nvshim.files import executable_problem

    if os.geteuid() != 0:
        return [
            Finding(
                NAME,
                "skip",
                "not running as root: nvshim-runtime (root) refuses "
                "runtimes and hooks others could write; run doctor as root to check "
                "them",
            )
        ]
    found = executables(config, load_spec)
    findings = []
    for path, named in found:
        problem = executable_problem(path, "program")
        if problem:
            fix = (
                problem.rsplit("; run ", 1)[-1]
                if "; run " in problem
                else problem.rsplit(": run ", 1)[-1]
            )
            findings.append(
                Finding(
                    NAME,
                    "fail",
                    f"{problem} ({named}); nvshim-runtime refuses to run it",
                    f"{fix}, after checking who wrote it",
                )
            )
    if not findings:
        findings.append(
            Finding(
                NAME,
                "ok",
                f"{len(found)} program(s) nvshim runs as root "
                "(runtimes, CDI hooks, its own hook): each root's alone",
            )
        )
    return findings
