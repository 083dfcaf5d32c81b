"""``ModifyDeviceFiles: 0`` inside the container: the hook that shows it, and its command line.

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
fork+execs on every GPU create (BENCHMARKS.md, bench/devparams.py), and the path test
already keeps the target inside the rootfs).

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

from nvshim.errors import UsageError

# typing is not on the GPU create path (tests/unit/test_import_guard.py); nor is
# nvshim.edits in the params hook's process, which imports this module for its argv
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional, Sequence, Tuple

    from nvshim.edits import Edits, Hook

__all__ = [
    "PARAMS_HOOK_MODULE",
    "PARAMS_HOOK_COMMAND",
    "params_hook_args",
    "parse_params_cli",
    "runs_params_hook",
    "PARAMS",
    "BUNDLE_FILE",
    "HOOK_SCRIPT",
    "modified_params",
    "without_modification",
    "params_hook",
    "spec_hook",
    "without_spec_hooks",
]

#: The params hook's module (:mod:`nvshim.params_hook`) and its ``nvshim`` command (the
#: ``--hook-path`` form): written into CDI specs, so they never change.
PARAMS_HOOK_MODULE = "nvshim.params_hook"
PARAMS_HOOK_COMMAND = "params-hook"


def runs_params_hook(argv: Sequence[str]) -> bool:
    """Whether a hook's argv starts nvshim's params hook: an argument names
    :data:`PARAMS_HOOK_MODULE`, or the second is :data:`PARAMS_HOOK_COMMAND` (``nvshim
    params-hook``, a ``--hook-path`` spec's form)."""
    args = list(argv)
    return any(PARAMS_HOOK_MODULE in a for a in args) or (
        len(args) > 1 and args[1] == PARAMS_HOOK_COMMAND
    )


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


PARAMS = "proc/driver/nvidia/params"
BUNDLE_FILE = ".nvshim-nvidia-params"
_KEY = b"ModifyDeviceFiles:"

#: $1 = the rootfs (absolute host path), $2 = the modified copy in the bundle directory.
HOOK_SCRIPT = (
    "r=$1 src=$2\n"
    'cd -P -- "$r" 2>/dev/null || exit 0\n'
    "R=$PWD\n"
    "cd -P -- proc/driver/nvidia 2>/dev/null || exit 0\n"
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
        if line.startswith(_KEY) and line[len(_KEY) :].strip() == b"1":
            lines[i], hit = b"ModifyDeviceFiles: 0", True
    return b"\n".join(lines) if hit else None


def params_hook(rootfs: str, copy: str) -> Hook:
    """The createContainer hook that binds ``copy`` over the container's params."""
    from nvshim.edits import HOOK_ENV, Hook

    return Hook(
        "createContainer",
        "/bin/sh",
        ("sh", "-c", HOOK_SCRIPT, "nvshim-params", rootfs, copy),
        HOOK_ENV,
    )


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
