"""The self-contained prefix (``/opt/nvshim``): where its pieces sit, how its Python starts,
and the ``nvshim`` command install.sh writes for it.

The layout, relative to the prefix (install.sh ``--payload`` builds it with
:mod:`nvshim.node.install.payload`; nothing else names these paths)::

    bin/python3          the launcher: a stable name (sys.executable, CDI hooks name it)
    libexec/python3      the interpreter itself (an ELF copied from the build machine)
    lib/                 its dynamic loader, its glibc and every library its ELFs need
    lib/pythonX.Y/       the trimmed standard library, lib-dynload included
    site/                nvshim and its dependencies (a Python-version-independent name)
    payload-files        every file of the payload, one path per line (install.sh checks it)

The interpreter runs through the bundled loader, never the node's:
``lib/ld-linux-x86-64.so.2 --library-path lib --argv0 bin/python3 libexec/python3 …``.
No environment variable is involved, so nothing reaches runc or the hooks, and the
node's C library (or its absence) does not matter. ``--argv0`` makes ``sys.executable``
the launcher, so CPython finds ``lib/pythonX.Y`` from ``bin/`` and every subprocess of
nvshim's (a hook, ``nvshim cdi generate``'s hook command) names the stable launcher.
"""

from __future__ import annotations

import os

from nvshim.errors import HostError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional

__all__ = [
    "DEFAULT_BINDIR",
    "DEFAULT_RUNTIME_PATH",
    "LAUNCHER",
    "INTERPRETER",
    "LIBDIR",
    "PACKAGES",
    "FILE_LIST",
    "loader_name",
    "launch_argv",
    "installed_prefix",
    "render_runtime",
    "render_cli",
]

LAUNCHER = "bin/python3"
INTERPRETER = "libexec/python3"
LIBDIR = "lib"
PACKAGES = "site"
FILE_LIST = "payload-files"
DEFAULT_BINDIR = "/usr/local/bin"
"""Where install.sh puts the two commands unless NVSHIM_BINDIR says otherwise."""
DEFAULT_RUNTIME_PATH = f"{DEFAULT_BINDIR}/nvshim-runtime"
"""The installed ``nvshim-runtime`` there: what the engines are configured with by default."""

# the dynamic loader's file name (PT_INTERP's basename) per machine
_LOADERS = {
    "x86_64": "ld-linux-x86-64.so.2",
    "aarch64": "ld-linux-aarch64.so.1",
}


def loader_name(machine: Optional[str] = None) -> str:
    """The dynamic loader's file name for ``machine`` (default: this one's)."""
    machine = machine or os.uname().machine  # platform.machine(), without its import
    try:
        return _LOADERS[machine]
    except KeyError:
        raise HostError(
            f"no self-contained runtime for machine {machine!r}: only {', '.join(sorted(_LOADERS))}"
        ) from None


def launch_argv(prefix: str, machine: Optional[str] = None) -> List[str]:
    """The words that start the prefix's Python (its options and arguments follow)."""
    lib = f"{prefix}/{LIBDIR}"
    return [
        f"{lib}/{loader_name(machine)}",
        "--library-path",
        lib,
        "--argv0",
        f"{prefix}/{LAUNCHER}",
        f"{prefix}/{INTERPRETER}",
    ]


def installed_prefix(python: str) -> Optional[str]:
    """The prefix whose launcher ``python`` is, when that prefix is installed (its loader
    and interpreter are there); None for any other interpreter (a venv's, the system's)."""
    suffix = "/" + LAUNCHER
    if not python.endswith(suffix):
        return None
    prefix = python[: -len(suffix)]
    try:
        words = launch_argv(prefix)
    except HostError:
        return None
    if not (os.path.isfile(words[0]) and os.path.isfile(words[-1])):
        return None
    return prefix


def _check_plain(value: str, what: str) -> None:
    from nvshim.node.install.trampoline import UnsafeValue

    if not value.startswith("/") or any(c in value for c in " \t\n'\"$`\\"):
        raise UnsafeValue(f"{what} must be absolute and plain: {value!r}")


def render_runtime(prefix: str, config: Optional[str] = None, machine: Optional[str] = None) -> str:
    """The ``nvshim-runtime`` trampoline for a prefix: its Python started through the
    bundled loader, nvshim's runtime modules served from the preload file."""
    from nvshim._preload import FILE_NAME
    from nvshim.node.install.trampoline import render

    site = f"{prefix}/{PACKAGES}"
    return render(
        f"{prefix}/{LAUNCHER}",
        [site],
        config,
        launch=launch_argv(prefix, machine),
        preload=f"{site}/{FILE_NAME}",
    )


def render_cli(
    prefix: str, config: str, machine: Optional[str] = None, bindir: Optional[str] = None
) -> str:
    """The ``nvshim`` command for a prefix: sh that execs the bundled loader (no launcher
    process in between), ``NVSHIM_CONFIG`` defaulting to ``config`` and, for a bin dir
    other than /usr/local/bin, ``NVSHIM_BINDIR`` to ``bindir`` (where doctor finds
    ``nvshim-runtime``)."""
    import json

    _check_plain(prefix, "prefix")
    _check_plain(config, "config path")
    where = ""
    if bindir and bindir.rstrip("/") != DEFAULT_BINDIR:
        _check_plain(bindir, "bin dir")
        where = (
            f"os.environ.setdefault({json.dumps('NVSHIM_BINDIR')}, "
            f"{json.dumps(bindir.rstrip('/'))}); "
        )
    boot = (
        f"import os, sys; sys.argv[0] = {json.dumps('nvshim')}; "
        f"sys.path[0:0] = {json.dumps([f'{prefix}/{PACKAGES}'])}; "
        f"os.environ.setdefault({json.dumps('NVSHIM_CONFIG')}, {json.dumps(config)}); "
        f"{where}from nvshim.cli.main import main; main()"
    )
    return (
        "#!/bin/sh\n"
        "# nvshim — generated by nvshim's install.sh; do not edit (re-run install.sh).\n"
        f"exec {' '.join(launch_argv(prefix, machine))} -I -S -c '{boot}' \"$@\"\n"
    )
