"""The createContainer hook's command line, shared by the runtime (which writes it) and
the hook (which parses it): how the hook starts nvshim (:func:`hook_command`) and the
arguments after it.

Kept apart from :mod:`nvshim.hook` so that building a hook entry on the create path does
not import the hook's own machinery (argparse, the ld.so.cache codec, in-root file ops).
"""

from __future__ import annotations

import os
import sys

from nvshim import _jsonc
from nvshim.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional, Sequence, Tuple

__all__ = [
    "SEP",
    "hook_command",
    "build_hook_args",
    "parse_hook_args",
    "parse_host_driver_version",
    "check_link",
    "check_folder",
]

SEP = "::"


def hook_command() -> Tuple[str, ...]:
    """How a hook starts nvshim: this interpreter by absolute path, isolated, without site.

    ``-I`` ignores PYTHON* variables, the user site and the current directory (the hook's
    cwd is the container rootfs); ``-S`` skips site (5-30 ms per start), so the directory
    holding nvshim is put on ``sys.path`` explicitly — the hook needs nothing else. The
    hook entry also carries an explicit env: nothing of the image's environment reaches it.
    """
    parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    boot = (
        f"import sys; sys.path[0:0] = {_jsonc.dumps([parent])}; "
        "from nvshim.hook import main; sys.exit(main())"
    )
    return (os.path.abspath(sys.executable), "-I", "-S", "-c", boot)


def check_link(target: str, link: str) -> None:
    if not target or not link:
        raise UsageError(f"--link {target}{SEP}{link}: target and link must not be empty")
    if target.startswith("-"):
        raise UsageError(f"--link {target}{SEP}{link}: the target must not start with '-'")
    if SEP in target or SEP in link:
        raise UsageError(f"--link {target}{SEP}{link}: {SEP!r} may appear only once")
    if not link.startswith("/"):
        raise UsageError(f"--link {target}{SEP}{link}: the link must be an absolute path")


def check_folder(folder: str) -> None:
    if not folder.startswith("/"):
        raise UsageError(f"--folder {folder}: must be an absolute container path")


def build_hook_args(links: Sequence[Tuple[str, str]], folders: Sequence[str],
                    host_driver_version: Optional[str] = None) -> List[str]:
    """The hook arguments after ``-m nvshim.hook`` for *links* (target, link) and *folders*;
    *host_driver_version* turns on the CUDA forward-compatibility check (nvshim.host.cudacompat).

    The inverse of this module's parser: ``main`` accepts exactly what this returns.
    """
    args: List[str] = []
    if host_driver_version:
        args += ["--host-driver-version", host_driver_version]
    for folder in folders:
        check_folder(folder)
        args += ["--folder", folder]
    for target, link in links:
        check_link(target, link)
        args += ["--link", f"{target}{SEP}{link}"]
    return args


def parse_hook_args(argv: Sequence[str]) -> Tuple[List[Tuple[str, str]], List[str]]:
    """(links, folders) of a full hook argv as :func:`build_hook_args` wrote it.

    The arguments start after the one naming ``nvshim.hook`` (``-m nvshim.hook`` or the
    ``-c`` boot code importing it); anything else is ignored here (the hook rejects it).
    """
    args = list(argv)
    start = next((i for i, a in enumerate(args) if "nvshim.hook" in a), len(args) - 1) + 1
    links: List[Tuple[str, str]] = []
    folders: List[str] = []
    rest = args[start:]
    for i in range(0, len(rest) - 1, 2):
        if rest[i] == "--link":
            target, sep, link = rest[i + 1].partition(SEP)
            if sep:
                links.append((target, link))
        elif rest[i] == "--folder":
            folders.append(rest[i + 1])
    return links, folders


def parse_host_driver_version(argv: Sequence[str]) -> Optional[str]:
    """The ``--host-driver-version`` of a full hook argv, or None."""
    args = list(argv)
    for i in range(len(args) - 1):
        if args[i] == "--host-driver-version":
            return args[i + 1]
    return None
