"""``nvshim doctor``'s checks of what install.sh set up: where the commands are, and the
default-runtime mark.

``default-runtime-config``: install.sh --set-as-default marked the config as read by a
default runtime (:mod:`nvshim.node.configguard`); ``fail`` when the config there has
require-allocation off or holds no settings (edited by hand since: compile refuses it, but
the runtime reads the YAML itself), ``skip`` when there is no mark.

:func:`default_trampoline` is where doctor looks for the installed ``nvshim-runtime``:
``$NVSHIM_BINDIR`` (install.sh's bin-dir setting, which the installed ``nvshim`` command
carries) or ``/usr/local/bin``.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from nvshim.config import default_mark_path
from nvshim.errors import NvshimError
from nvshim.node.doctor.findings import DEFAULT_TRAMPOLINE, Finding, compile_command

__all__ = ["check_default_mark", "default_trampoline"]


def default_trampoline(environ: Optional[Mapping[str, str]] = None) -> str:
    """The installed ``nvshim-runtime``: in ``$NVSHIM_BINDIR`` when set, else the default."""
    env = os.environ if environ is None else environ
    bindir = env.get("NVSHIM_BINDIR", "")
    return os.path.join(bindir, "nvshim-runtime") if bindir else DEFAULT_TRAMPOLINE


def check_default_mark(path: str) -> Finding:
    """The config install.sh --set-as-default marked still passes the default-runtime guard."""
    name = "default-runtime-config"
    mark = default_mark_path(path)
    if not os.path.lexists(mark):
        return Finding(name, "skip", f"no {mark}: install.sh did not make nvshim a default runtime")
    from nvshim.config import load_config
    from nvshim.files import read_bytes
    from nvshim.node.configguard import guard_default

    try:
        data = read_bytes(path)
        config = load_config(path)
    except NvshimError:
        return Finding(name, "skip", f"{path} did not load (see the config check)")
    if data is None:
        return Finding(
            name,
            "fail",
            f"{path} does not exist, and nvshim is a default runtime "
            f"({mark}): the built-in defaults have require-allocation off",
            f"write {path} with require-allocation: true, then {compile_command(path)}",
        )
    try:
        guard_default(path, data, config)
    except NvshimError as exc:
        return Finding(
            name,
            "fail",
            f"{path}: require-allocation off under a default runtime",
            f"require-allocation: true in {path}",
            detail=str(exc).split(": refused,")[0] + f", under a default runtime "
            f"({mark}). Fix: set require-allocation: true in {path}, then "
            f"{compile_command(path)}",
        )
    return Finding(name, "ok", f"{path} has require-allocation on ({mark})")
