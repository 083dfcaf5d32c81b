"""The links hook's command line: how nvshim's createContainer hook is started, and the
arguments the runtime writes and the hook parses.

The createContainer hooks' command lines, shared by the runtime (which writes them) and
the hooks (which parse them): how a hook starts nvshim (:func:`hook_command`), the
arguments after it (:func:`build_hook_args`, :func:`parse_hook_args`,
:func:`parse_host_driver_version`, :func:`parse_graphics_args`), how to tell nvshim's
hook from any other (:func:`is_nvshim_hook`) and how to rewrite it (:func:`with_links`,
:func:`dev_links_only`). The one owner of this format: edit builders, the in-root work and
the hook itself read it only through these functions.

The second hook, ``ModifyDeviceFiles: 0``, has a module of its own
(:mod:`nvshim.runtime.devparams`): its sh script, the bundle copy it binds, and the
generated specs' Python hook with its command line, whose module name never contains
:data:`HOOK_MODULE`, so the link pruning, the engine's hook replacement and the in-root
decision never take it for the links hook.

Kept apart from :mod:`nvshim.hook` so that building a hook entry on the create path does
not import the hook's own machinery (argparse, the ld.so.cache codec, in-root file ops).
"""

from __future__ import annotations

import os
import sys

from nvshim.errors import UsageError

# typing and re are not on the GPU create path (tests/unit/test_import_guard.py); nor is
# nvshim.edits in the hook's process, which imports this module for the links hook's argv
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, List, NoReturn, Optional, Sequence, Tuple


__all__ = [
    "SEP",
    "HOOK_MODULE",
    "HOOK_DESCRIPTION",
    "HOOK_OPTIONS",
    "hook_command",
    "runs_nvshim_hook",
    "is_nvshim_hook",
    "split_hook_argv",
    "with_links",
    "build_hook_args",
    "parse_hook_args",
    "parse_hook_cli",
    "parse_host_driver_version",
    "parse_graphics_args",
    "dev_links_only",
    "check_link",
    "check_dev_link",
    "check_folder",
]

SEP = "::"

#: The module a hook command names (``-m nvshim.hook`` or ``-c`` boot code importing it):
#: written into CDI specs, so it never changes.
HOOK_MODULE = "nvshim.hook"

#: What the hook does, and its options as (flag, metavar, help, repeatable): the hook's
#: parser (:func:`parse_hook_cli`) and ``nvshim hook --help`` both read them.
HOOK_DESCRIPTION = (
    "OCI createContainer hook: make driver library symlinks and update the ld.so.cache "
    "inside the container rootfs; for graphics, the /dev/dri/by-path links and the EGL "
    "application profile. Reads the OCI state on stdin."
)
#: A flag's metavar None: it takes no value.
HOOK_OPTIONS = (
    ("--link", f"TARGET{SEP}LINK", "create symlink LINK (container path) pointing to TARGET", True),
    (
        "--folder",
        "DIR",
        "container directory holding injected libraries (added to the ld.so.cache)",
        True,
    ),
    (
        "--host-driver-version",
        "VERSION",
        "the host driver's version: a newer CUDA compat libcuda in the image "
        "(/usr/local/cuda/compat) then goes first in the ld.so.cache",
        False,
    ),
    (
        "--dev-link",
        f"TARGET{SEP}LINK",
        "create symlink LINK under /dev pointing to TARGET when TARGET is a character device "
        "in the container's /dev (a GPU's /dev/dri/by-path links)",
        True,
    ),
    (
        "--egl-profile",
        None,
        "write the EGL application profile (EGLVisibleDGPUDevices) naming the container's "
        "/dev/nvidia<N> GPUs",
        False,
    ),
)


def hook_command(module: str = HOOK_MODULE) -> Tuple[str, ...]:
    """How a hook starts nvshim: this interpreter by absolute path, isolated, without site.

    ``-I`` ignores PYTHON* variables, the user site and the current directory (the hook's
    cwd is the container rootfs); ``-S`` skips site (a cost on every start), so the directory
    holding nvshim is put on ``sys.path`` explicitly — the hook needs nothing else. The
    hook entry also carries an explicit env: nothing of the image's environment reaches it.
    ``module`` is the hook's (:data:`HOOK_MODULE`, or
    :data:`nvshim.runtime.devparams.PARAMS_HOOK_MODULE`); both paths the command names lie
    in nvshim's own install (its prefix's interpreter and package).
    """
    from nvshim import _jsonc  # the create path has it already; the hook process does not

    parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    boot = (
        f"import sys; sys.path[0:0] = {_jsonc.dumps([parent])}; "
        f"from {module} import main; sys.exit(main())"
    )
    return (os.path.abspath(sys.executable), "-I", "-S", "-c", boot)


def runs_nvshim_hook(argv: Sequence[str]) -> bool:
    """Whether a hook's argv starts nvshim's hook (one argument names :data:`HOOK_MODULE`)."""
    return any(HOOK_MODULE in a for a in argv)


def is_nvshim_hook(hook: Any) -> bool:
    """Whether an edits :class:`~nvshim.edits.Hook` is nvshim's own createContainer hook."""
    return hook.hook_name == "createContainer" and runs_nvshim_hook(hook.args)


def split_hook_argv(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(the command up to the argument naming :data:`HOOK_MODULE`, the arguments after it).

    No such argument: everything is command but the last argument, which is returned as
    the arguments (``parse_hook_args`` then finds no pair in it).
    """
    args = list(argv)
    start = next((i for i, a in enumerate(args) if HOOK_MODULE in a), len(args) - 1) + 1
    return args[:start], args[start:]


def with_links(
    argv: Sequence[str], links: Sequence[Tuple[str, str]], graphics: bool = True
) -> List[str]:
    """nvshim's hook argv with its ``--link`` pairs replaced by ``links`` (folders and the
    host driver version kept; the ``/dev`` links and the EGL profile too unless not
    ``graphics``)."""
    head, _ = split_hook_argv(argv)
    _, folders = parse_hook_args(argv)
    dev_links, egl = parse_graphics_args(argv) if graphics else ([], False)
    return head + build_hook_args(links, folders, parse_host_driver_version(argv), dev_links, egl)


def dev_links_only(argv: Sequence[str]) -> Optional[List[str]]:
    """nvshim's hook argv doing only its ``/dev`` links (None when it has none): what the
    hook still does when the runtime did the rest in the rootfs, since ``/dev`` is runc's
    tmpfs, made after the runtime ran."""
    dev_links, _ = parse_graphics_args(argv)
    if not dev_links:
        return None
    return split_hook_argv(argv)[0] + build_hook_args((), (), None, dev_links)


def check_link(target: str, link: str) -> None:
    if not target or not link:
        raise UsageError(f"--link {target}{SEP}{link}: target and link must not be empty")
    if target.startswith("-"):
        raise UsageError(f"--link {target}{SEP}{link}: the target must not start with '-'")
    if SEP in target or SEP in link:
        raise UsageError(f"--link {target}{SEP}{link}: {SEP!r} may appear only once")
    if not link.startswith("/"):
        raise UsageError(f"--link {target}{SEP}{link}: the link must be an absolute path")


def check_dev_link(target: str, link: str) -> None:
    check_link(target, link)
    if not link.startswith("/dev/"):
        raise UsageError(f"--dev-link {target}{SEP}{link}: the link must be under /dev")


def check_folder(folder: str) -> None:
    if not folder.startswith("/"):
        raise UsageError(f"--folder {folder}: must be an absolute container path")


def build_hook_args(
    links: Sequence[Tuple[str, str]],
    folders: Sequence[str],
    host_driver_version: Optional[str] = None,
    dev_links: Sequence[Tuple[str, str]] = (),
    egl_profile: bool = False,
) -> List[str]:
    """The hook arguments after ``-m nvshim.hook`` for *links* (target, link) and *folders*;
    *host_driver_version* turns on the CUDA forward-compatibility check
    (:func:`nvshim.runtime.rootcache.compat_folder`); *dev_links* are made under ``/dev`` for
    the device nodes the container has, and *egl_profile* writes the EGL application profile
    (:mod:`nvshim.runtime.appprofile`).

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
    for target, link in dev_links:
        check_dev_link(target, link)
        args += ["--dev-link", f"{target}{SEP}{link}"]
    if egl_profile:
        args.append("--egl-profile")
    return args


def _scan(argv: Sequence[str]) -> List[Tuple[str, Optional[str]]]:
    """(option, value) of a full hook argv's arguments after the one naming the module, as
    :func:`build_hook_args` wrote them (a flag's value is None; anything else is skipped)."""
    rest = split_hook_argv(argv)[1]
    takes = {flag: metavar is not None for flag, metavar, _, _ in HOOK_OPTIONS}
    out: List[Tuple[str, Optional[str]]] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        if takes.get(arg) is False:
            out.append((arg, None))
        elif takes.get(arg) and i + 1 < len(rest):
            out.append((arg, rest[i + 1]))
            i += 1
        i += 1
    return out


def parse_hook_args(argv: Sequence[str]) -> Tuple[List[Tuple[str, str]], List[str]]:
    """(links, folders) of a full hook argv as :func:`build_hook_args` wrote it.

    The arguments start after the one naming ``nvshim.hook`` (``-m nvshim.hook`` or the
    ``-c`` boot code importing it); anything else is ignored here (the hook rejects it).
    """
    links: List[Tuple[str, str]] = []
    folders: List[str] = []
    for option, value in _scan(argv):
        if option == "--link" and value is not None:
            target, sep, link = value.partition(SEP)
            if sep:
                links.append((target, link))
        elif option == "--folder" and value is not None:
            folders.append(value)
    return links, folders


def parse_host_driver_version(argv: Sequence[str]) -> Optional[str]:
    """The ``--host-driver-version`` of a full hook argv, or None."""
    return next((v for o, v in _scan(argv) if o == "--host-driver-version"), None)


def parse_graphics_args(argv: Sequence[str]) -> Tuple[List[Tuple[str, str]], bool]:
    """(``--dev-link`` pairs, whether ``--egl-profile``) of a full hook argv."""
    dev_links: List[Tuple[str, str]] = []
    egl = False
    for option, value in _scan(argv):
        if option == "--dev-link" and value is not None:
            target, sep, link = value.partition(SEP)
            if sep:
                dev_links.append((target, link))
        elif option == "--egl-profile":
            egl = True
    return dev_links, egl


def parse_hook_cli(argv: Sequence[str]) -> Any:
    """The hook's own strict parser (``python -m nvshim.hook ARGS``): an argparse namespace
    with ``link`` [(target, link)], ``folder`` [dir], ``host_driver_version``,
    ``dev_link`` [(target, link)] and ``egl_profile``.

    Accepts exactly what :func:`build_hook_args` writes; anything else is a UsageError.
    argparse is imported here, never on the create path.
    """
    import argparse

    class Parser(argparse.ArgumentParser):
        """argparse that raises UsageError instead of printing usage and exiting 2."""

        def error(self, message: str) -> NoReturn:
            raise UsageError(message)

    parser = Parser(prog=f"python -I -m {HOOK_MODULE}", description=HOOK_DESCRIPTION)
    for flag, metavar, text, repeatable in HOOK_OPTIONS:
        if metavar is None:
            parser.add_argument(flag, action="store_true", help=text)
        elif repeatable:
            parser.add_argument(flag, action="append", default=[], metavar=metavar, help=text)
        else:
            parser.add_argument(flag, default=None, metavar=metavar, help=text)
    ns = parser.parse_args(list(argv))
    ns.link = [_parse_link(v) for v in ns.link]
    ns.dev_link = [_parse_link(v, "--dev-link") for v in ns.dev_link]
    for folder in ns.folder:
        check_folder(folder)
    return ns


def _parse_link(value: str, flag: str = "--link") -> Tuple[str, str]:
    target, sep, link = value.partition(SEP)
    if not sep:
        raise UsageError(f"{flag} {value}: expected TARGET{SEP}LINK")
    (check_dev_link if flag == "--dev-link" else check_link)(target, link)
    return target, link
