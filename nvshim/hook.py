"""The one OCI ``createContainer`` hook: SONAME links and ld.so.cache in the rootfs.

nvshim-runtime bind-mounts the host's driver libraries into the container at their host
paths and adds one hook entry that runs ``<venv python> -I -m nvshim.hook`` with the
arguments from :func:`build_hook_args`. runc runs it in the container's mount namespace
after the mounts and before ``pivot_root`` (cwd = the rootfs; crun: cwd = the bundle),
with the OCI state on stdin and only the hook entry's own environment. It:

1. makes each ``--link TARGET::LINK`` symlink in the rootfs (no-op when it already points
   to TARGET, otherwise replaced atomically);
2. makes each ``--dev-link TARGET::LINK`` under ``/dev`` whose TARGET is a character
   device the container has (a GPU's ``/dev/dri/by-path`` links: ``/dev`` is runc's tmpfs,
   so only a hook can; kept even when the runtime did the rest);
3. with ``--egl-profile``, writes the EGL application profile naming the container's
   ``/dev/nvidia<N>`` GPUs (:mod:`nvshim.runtime.appprofile`);
4. writes ``/etc/ld.so.conf.d/00-nvshim.conf`` listing the ``--folder`` directories (so a
   later ``ldconfig`` in the container keeps them), creates ``/etc/ld.so.conf`` with an
   ``include`` line if the image has none, and rewrites ``/etc/ld.so.cache`` with the
   image's entries plus every library found in those folders.

The cache is written by our own codec (:mod:`nvshim.host.ldcache`), not by running the host's
``/sbin/ldconfig -r <rootfs>``: that would run a host binary as root over directories the
image controls (ldconfig follows their symlinks and writes where they point, the
CVE-2025-23267 class), and making it safe takes namespaces, a fresh /proc, a sealed copy
of the binary and ``pivot_root`` — all to produce a file we can write in a few lines.
Here nothing the image controls is executed, and every file operation goes through
:mod:`nvshim.host.inroot`, which resolves paths inside the rootfs as if chrooted.

A rootfs without ``/etc`` (a scratch image) gets one, created in the root: the container
still starts, and a dynamically linked program in it then finds the driver. Failing the
create would be worse, and skipping the cache would leave such a program without libcuda.

Start-up matters (this runs on every GPU container create), so only ``os``, ``sys``,
``json``, ``argparse`` and ``struct`` from the standard library are imported; never click,
structlog, yaml, jsonschema or pynvml. Errors are one ``nvshim hook: ...`` line on stderr
and exit status 1, which runc reports as the create failure.
"""

from __future__ import annotations

import os
import sys

from nvshim._ocistate import container_root, read_state
from nvshim.errors import HostError, NvshimError, host_error, one_line
from nvshim.host import inroot as _inroot
from nvshim.runtime.hookargs import build_hook_args, parse_hook_cli
from nvshim.runtime.rootcache import LDCACHE, LDCONF, LDCONF_DROPIN, update_ldcache
from nvshim.runtime.rootwork import (
    apply_dev_links,
    apply_links,
    is_host_root,
    write_egl_profile,
)

# typing: annotations only (cost: BENCHMARKS.md, figures) (mypy treats TYPE_CHECKING as true).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional, Sequence

__all__ = [
    "LDCACHE",
    "LDCONF",
    "LDCONF_DROPIN",
    "build_hook_args",
    "container_root",
    "main",
    "update_ldcache",
]

_PREFIX = "nvshim hook: "


# mount(2) flags and the statvfs(3) flags they correspond to.
_MS_RDONLY, _MS_REMOUNT, _MS_BIND = 1, 32, 4096
_KEEP_FLAGS = ((2, 2), (4, 4), (8, 8), (1024, 1024), (2048, 2048), (4096, 1 << 21))


def _remount(path: str, readonly: bool) -> bool:
    """Bind-remount ``path`` read-only or read-write, keeping its other flags.

    Only for crun, which makes a read-only rootfs read-only *before* createContainer
    hooks (runc does it after): the hook runs in the container's mount namespace, so this
    changes the container's view of its own rootfs and nothing on the host.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    try:
        current = os.statvfs(path).f_flag
    except OSError as exc:
        raise host_error(f"cannot stat the read-only rootfs {path}", exc) from exc
    flags = _MS_REMOUNT | _MS_BIND | (_MS_RDONLY if readonly else 0)
    for st_flag, ms_flag in _KEEP_FLAGS:
        if current & st_flag:
            flags |= ms_flag
    if libc.mount(None, os.fsencode(path), None, flags, None) != 0:
        err = ctypes.get_errno()
        if err == 22 and not readonly:  # EINVAL: not a mount point; the write will say EROFS
            return False
        mode = "read-only" if readonly else "writable"
        raise HostError(f"cannot remount the read-only rootfs {path} {mode}: {os.strerror(err)}")
    return True


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the hook; return the exit status (0, or 1 after one line on stderr)."""
    os.umask(0o022)
    try:
        args = parse_hook_cli(sys.argv[1:] if argv is None else argv)
        rootfs = container_root(read_state(sys.stdin))
        if is_host_root(rootfs):  # runc runs hooks before its pivot_root fails on it
            sys.stderr.write(
                f"{_PREFIX}warning: the container rootfs {rootfs} is the host's /: "
                "nothing is written in it\n"
            )
            return 0
        try:
            root = _inroot.open_root(rootfs)
        except OSError as exc:
            raise host_error("cannot open the container rootfs", exc) from exc
        try:
            readonly = bool(os.statvfs(rootfs).f_flag & os.ST_RDONLY)
        except OSError as exc:
            raise host_error("cannot stat the container rootfs", exc) from exc
        if readonly:
            readonly = _remount(rootfs, readonly=False)
        try:
            _apply(root, rootfs, args)
        finally:
            if readonly:
                _remount(rootfs, readonly=True)
    except NvshimError as exc:
        sys.stderr.write(f"{_PREFIX}{exc}\n")
        return exc.exit_code
    return 0


def _apply(root: _inroot.RootFd, rootfs: str, args: Any) -> None:
    """Make the links, the ``/dev`` links and the EGL profile, and update the cache (the
    part that writes into the rootfs)."""
    with root:
        apply_links(root, rootfs, args.link)
        if args.dev_link:
            apply_dev_links(root, rootfs, args.dev_link)
        if args.egl_profile:
            from nvshim.runtime.appprofile import minors_in_dev

            minors = minors_in_dev(root)
            if minors:
                write_egl_profile(root, rootfs, minors)
        if args.folder:
            for line in update_ldcache(root, args.folder, None, args.host_driver_version):
                sys.stderr.write(f"{_PREFIX}warning: {one_line(line)}\n")


if __name__ == "__main__":
    sys.exit(main())
