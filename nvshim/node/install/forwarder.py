"""The forwarder ``install.sh --uninstall`` leaves in place of ``nvshim-runtime`` while
containers created through it still run.

containerd's shim runs the runtime a task was created with for every later ``kill``,
``delete`` and ``state``, by the path its ``options.json`` names. Were that path gone, such
a container could never be stopped (``fork/exec .../nvshim-runtime: no such file or
directory``: a pod stuck Terminating). So while any task names it, the uninstall writes
in its place a short sh script that execs the runtime nvshim handed to, marked
(:data:`MARK`, its second line) so that a later ``install.sh --uninstall`` knows it and
removes it once no task names it; the containerd state folders it was written for are in
its comments (:data:`STATE`), for that later uninstall to look in when the engines'
configs are gone.

The runtime is config.runtimes' first that resolves (``$ETCDIR/config.runtimes``, the
compiled list the trampoline reads: :func:`nvshim.runtime.main.find_runtime`, the same
lookup as the runtime's), else ``runc`` on ``PATH``, else the word ``runc``. Nothing the
script names can end a comment line or leave its quotes: a path with a control character
is skipped.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from nvshim.errors import NvshimError, os_reason
from nvshim.files import write_atomic
from nvshim.runtime.main import find_runtime

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional, Sequence

__all__ = ["MARK", "STATE", "pick_target", "render_forwarder", "main"]

MARK = "# nvshim-runtime-forwarder"
"""The forwarder's second line: install.sh's ``is_forwarder`` reads it."""
STATE = "# containerd-state: "
"""The start of a comment line naming a containerd state folder the forwarder serves."""


def _plain(text: str) -> bool:
    """No control character (a line break would end a comment line of the script)."""
    return text.isprintable()


def pick_target(runtimes: Sequence[str], path_env: Optional[str]) -> str:
    """The runtime the forwarder execs: the first of ``runtimes`` that resolves on
    ``path_env``, else ``runc`` there, else ``runc``."""
    candidates = [r for r in runtimes if _plain(r)]
    return find_runtime(candidates, path_env) or find_runtime(["runc"], path_env) or "runc"


def render_forwarder(target: str, users: int, states: Sequence[str], when: str) -> str:
    """The script: ``#!/bin/sh``, :data:`MARK`, why it is there (``users`` containers at
    ``when``), one :data:`STATE` line per state folder, and the ``exec``."""
    quoted = shlex.quote(target)
    lines = [
        "#!/bin/sh",
        MARK,
        f"# Left by nvshim's install.sh --uninstall ({when}): {users} container(s) created",
        "# through nvshim-runtime still ran, and containerd stops and deletes them through this",
        f"# path. nvshim is not installed: every command goes to {quoted}. 'install.sh",
        "# --uninstall' removes this file once no container names it.",
    ]
    lines += [STATE + state for state in sorted(set(states)) if state and _plain(state)]
    lines.append(f'exec {quoted} "$@"')
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="install.sh forwarder",
        description="write the forwarder; the containerd state folders are read from stdin",
    )
    parser.add_argument("--path", required=True, help="the nvshim-runtime to replace")
    parser.add_argument("--runtimes", required=True, help="the compiled config.runtimes")
    parser.add_argument("--users", required=True, type=int, help="tasks that name it")
    return parser


def _runtimes(path: str) -> List[str]:
    """The compiled list, one runtime a line; none when the file is not there."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return [line.rstrip("\n") for line in f]
    except FileNotFoundError:
        return []


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Write the forwarder at ``--path`` (atomically, mode 0755) and say so on stderr; a
    failure is one line on stderr and exit status 1, the old file left as it was."""
    ns = _parser().parse_args(argv)
    target = pick_target(_runtimes(ns.runtimes), os.environ.get("PATH"))
    states = [line.rstrip("\n") for line in sys.stdin]
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        text = render_forwarder(target, ns.users, states, when)
        write_atomic(ns.path, text.encode(), default_mode=0o755)
        os.chmod(ns.path, 0o755)
    except (OSError, NvshimError) as exc:
        reason = os_reason(exc) if isinstance(exc, OSError) else str(exc)
        sys.stderr.write(f"install.sh: cannot write the forwarder {ns.path}: {reason}\n")
        sys.exit(1)
    sys.stderr.write(
        f"install.sh: left {ns.path} as a forwarder to {target}: {ns.users} container(s) "
        "created through it still run, and containerd stops them through it; "
        "'install.sh --uninstall' removes it once they are gone\n"
    )
