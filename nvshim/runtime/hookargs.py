"""The hooks nvshim puts into a spec: the createContainer hooks' command lines, and the
``ModifyDeviceFiles: 0`` hook with the params copy it binds.

The createContainer hooks' command lines, shared by the runtime (which writes them) and
the hooks (which parse them): how a hook starts nvshim (:func:`hook_command`), the
arguments after it (:func:`build_hook_args`, :func:`parse_hook_args`,
:func:`parse_host_driver_version`, :func:`parse_graphics_args`), how to tell nvshim's
hook from any other (:func:`is_nvshim_hook`) and how to rewrite it (:func:`with_links`,
:func:`dev_links_only`). The one owner of this format: edit builders, the in-root work and
the hook itself read it only through these functions.

The second hook, ``ModifyDeviceFiles: 0`` for generated CDI specs
(:data:`PARAMS_HOOK_MODULE`, :func:`params_hook_args`, :func:`runs_params_hook`), is its
own entry point with its own module name, which never contains :data:`HOOK_MODULE`: the
link pruning, the engine's hook replacement and the in-root decision never take it for
the links hook.

Kept apart from :mod:`nvshim.hook` so that building a hook entry on the create path does
not import the hook's own machinery (argparse, the ld.so.cache codec, in-root file ops).

Device-node modification off inside the container: ``ModifyDeviceFiles: 0``.

The NVIDIA kernel module's ``/proc/driver/nvidia/params`` says whether user-space (the CUDA
driver, nvidia-smi) may create and chmod ``/dev/nvidia*`` nodes (``ModifyDeviceFiles: 1``,
the default). Inside a container it must not: the device nodes are the runtime's
decision. As the reference does (``disable-device-node-modification``), a container
granted GPUs sees the host's params with that line set to ``0``.

How. runc refuses an OCI bind mount into ``/proc`` from anything but procfs, so the copy
is bound by a ``createContainer`` hook, which runc runs in the container's mount namespace
after its mounts (procfs is at ``<rootfs>/proc``) and before ``pivot_root``. The hook is a
few lines of POSIX sh and util-linux ``mount``, not Python: it runs on every GPU create
on a node whose driver allows modification, and ``sh`` + ``mount`` cost a few ms where a
Python hook costs tens. nvshim-runtime writes the modified copy into the bundle directory
(``.nvshim-nvidia-params``, mode 0444) at create; the hook binds it read-only over
``<rootfs>/proc/driver/nvidia/params``. The copy stays in the bundle (the engine removes
the bundle with the container; the next create of the bundle rewrites it).

The hook binds only where ``proc/driver/nvidia`` in the rootfs is reached without
following a symlink (``cd -P`` ends exactly at ``<physical rootfs>/proc/driver/nvidia``)
and ``params`` there is a regular file, not a symlink: an image symlink on the way, which
would resolve on the host before ``pivot_root``, makes it bind nothing. The mount happens
in the container's mount namespace only. Only sh builtins decide: the one command the hook
runs is ``mount`` (a ``stat -f`` procfs test and an ``rm`` of the copy cost two more
fork+execs, ≈ 1.8 ms of every GPU create, and the path test already keeps the target
inside the rootfs).

Added only when ``disable-device-node-modification`` is on (default), the container gets
GPUs or driver files through nvshim's own discovery or a CDI spec, and the host's params
exist and say ``ModifyDeviceFiles: 1``; otherwise nothing is added and nothing is read but
that file.

Generated CDI specs. A spec used by podman, containerd or CRI-O directly has no runtime
to write the bundle copy, so ``nvshim cdi generate`` gives it :func:`spec_hook`: nvshim's
own params hook (:mod:`nvshim.params_hook`), which reads the host's params at container
start and does the same with a copy on a tmpfs of its own. When nvshim-runtime meets that
hook (a CDI name it injects, or a spec an engine injected) it takes it out and adds the
sh hook above instead: the same result for a few ms instead of a Python start.
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

    from nvshim.edits import Edits, Hook

__all__ = [
    "SEP",
    "HOOK_MODULE",
    "HOOK_DESCRIPTION",
    "HOOK_OPTIONS",
    "PARAMS_HOOK_MODULE",
    "PARAMS_HOOK_COMMAND",
    "hook_command",
    "params_hook_args",
    "parse_params_cli",
    "runs_params_hook",
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
    "PARAMS",
    "BUNDLE_FILE",
    "HOOK_SCRIPT",
    "modified_params",
    "without_modification",
    "params_hook",
    "spec_hook",
    "without_spec_hooks",
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
    ("--link", f"TARGET{SEP}LINK", "create symlink LINK (container path) pointing to TARGET",
     True),
    ("--folder", "DIR",
     "container directory holding injected libraries (added to the ld.so.cache)", True),
    ("--host-driver-version", "VERSION",
     "the host driver's version: a newer CUDA compat libcuda in the image "
     "(/usr/local/cuda/compat) then goes first in the ld.so.cache", False),
    ("--dev-link", f"TARGET{SEP}LINK",
     "create symlink LINK under /dev pointing to TARGET when TARGET is a character device "
     "in the container's /dev (a GPU's /dev/dri/by-path links)", True),
    ("--egl-profile", None,
     "write the EGL application profile (EGLVisibleDGPUDevices) naming the container's "
     "/dev/nvidia<N> GPUs", False),
)


#: The params hook's module (:mod:`nvshim.params_hook`) and its ``nvshim`` command (the
#: ``--hook-path`` form): written into CDI specs, so they never change.
PARAMS_HOOK_MODULE = "nvshim.params_hook"
PARAMS_HOOK_COMMAND = "params-hook"


def hook_command(module: str = HOOK_MODULE) -> Tuple[str, ...]:
    """How a hook starts nvshim: this interpreter by absolute path, isolated, without site.

    ``-I`` ignores PYTHON* variables, the user site and the current directory (the hook's
    cwd is the container rootfs); ``-S`` skips site (5-30 ms per start), so the directory
    holding nvshim is put on ``sys.path`` explicitly — the hook needs nothing else. The
    hook entry also carries an explicit env: nothing of the image's environment reaches it.
    ``module`` is the hook's (:data:`HOOK_MODULE` or :data:`PARAMS_HOOK_MODULE`); both paths
    the command names lie in nvshim's own install (its prefix's interpreter and package).
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


def runs_params_hook(argv: Sequence[str]) -> bool:
    """Whether a hook's argv starts nvshim's params hook: an argument names
    :data:`PARAMS_HOOK_MODULE`, or the second is :data:`PARAMS_HOOK_COMMAND` (``nvshim
    params-hook``, a ``--hook-path`` spec's form)."""
    args = list(argv)
    return (any(PARAMS_HOOK_MODULE in a for a in args)
            or (len(args) > 1 and args[1] == PARAMS_HOOK_COMMAND))


def params_hook_args(host_params: str) -> List[str]:
    """The params hook's arguments: the host's params file it reads at container start."""
    if not host_params.startswith("/"):
        raise UsageError(f"--params {host_params}: must be an absolute host path")
    return ["--params", host_params]


def parse_params_cli(argv: Sequence[str]) -> str:
    """The host params path of the params hook's own arguments (what
    :func:`params_hook_args` writes, nothing else); a UsageError otherwise."""
    args = list(argv)
    if len(args) != 2 or args[0] != "--params":
        raise UsageError(f"expected --params PATH, got {' '.join(args) or 'no arguments'}")
    params_hook_args(args[1])
    return args[1]


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


def with_links(argv: Sequence[str], links: Sequence[Tuple[str, str]],
               graphics: bool = True) -> List[str]:
    """nvshim's hook argv with its ``--link`` pairs replaced by ``links`` (folders and the
    host driver version kept; the ``/dev`` links and the EGL profile too unless not
    ``graphics``)."""
    head, _ = split_hook_argv(argv)
    _, folders = parse_hook_args(argv)
    dev_links, egl = parse_graphics_args(argv) if graphics else ([], False)
    return head + build_hook_args(links, folders, parse_host_driver_version(argv), dev_links,
                                  egl)


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


def build_hook_args(links: Sequence[Tuple[str, str]], folders: Sequence[str],
                    host_driver_version: Optional[str] = None,
                    dev_links: Sequence[Tuple[str, str]] = (),
                    egl_profile: bool = False) -> List[str]:
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


# ModifyDeviceFiles: 0, the runtime's sh hook and the spec hook

PARAMS = "proc/driver/nvidia/params"
BUNDLE_FILE = ".nvshim-nvidia-params"
_KEY = b"ModifyDeviceFiles:"

#: $1 = the rootfs (absolute host path), $2 = the modified copy in the bundle directory.
HOOK_SCRIPT = (
    'r=$1 src=$2\n'
    'cd -P -- "$r" 2>/dev/null || exit 0\n'
    'R=$PWD\n'
    'cd -P -- proc/driver/nvidia 2>/dev/null || exit 0\n'
    '[ "$PWD" = "$R/proc/driver/nvidia" ] && [ -f params ] && [ ! -L params ] || exit 0\n'
    'mount --bind -o ro -- "$src" "$PWD/params" || {\n'
    '  echo "nvshim: cannot bind ModifyDeviceFiles: 0 over $PWD/params" >&2; exit 1; }\n'
)


def modified_params(driver_root: str) -> Optional[bytes]:
    """The host's params with ``ModifyDeviceFiles: 0``; None when there is nothing to hide
    (no params file, unreadable, or modification already off)."""
    try:
        with open(os.path.join(driver_root, PARAMS), "rb") as fh:
            text = fh.read(65536)
    except OSError:
        return None
    return without_modification(text)


def without_modification(text: bytes) -> Optional[bytes]:
    """``text`` (a params file's) with ``ModifyDeviceFiles: 1`` set to 0; None when it has
    no such line (modification off already: nothing to hide)."""
    lines = text.split(b"\n")
    hit = False
    for i, line in enumerate(lines):
        if line.startswith(_KEY) and line[len(_KEY):].strip() == b"1":
            lines[i], hit = b"ModifyDeviceFiles: 0", True
    return b"\n".join(lines) if hit else None


def params_hook(rootfs: str, copy: str) -> Hook:
    """The createContainer hook that binds ``copy`` over the container's params."""
    from nvshim.edits import HOOK_ENV, Hook

    return Hook("createContainer", "/bin/sh",
                ("sh", "-c", HOOK_SCRIPT, "nvshim-params", rootfs, copy), HOOK_ENV)


def spec_hook(command: Sequence[str], host_params: str) -> Hook:
    """The params hook a generated CDI spec carries: ``command`` (:func:`hook_command` of
    :data:`PARAMS_HOOK_MODULE`, or ``nvshim params-hook`` with ``--hook-path``) reading
    ``host_params`` at container start."""
    from nvshim.edits import HOOK_ENV, Hook

    args = tuple(command) + tuple(params_hook_args(host_params))
    return Hook("createContainer", command[0], args, HOOK_ENV)


def without_spec_hooks(edits: Edits) -> Tuple[Edits, bool]:
    """(``edits`` without the params hooks a CDI spec brought, whether it had any): the
    runtime then adds its own (:func:`params_hook`) when the host's params say 1."""
    from nvshim._record import replace

    kept = tuple(h for h in edits.hooks if not runs_params_hook(h.args))
    if len(kept) == len(edits.hooks):
        return edits, False
    return replace(edits, hooks=kept), True
