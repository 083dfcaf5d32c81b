"""``ModifyDeviceFiles: 0`` for containers made from a generated CDI spec: the params hook.

``nvshim cdi generate`` gives every spec this createContainer hook (see
:mod:`nvshim.runtime.devparams` for why the container must not see ``1``). podman,
containerd and CRI-O run it themselves, through runc or crun, with no nvshim-runtime to
write a copy into the bundle; so, as the reference's ``disable-device-node-modification``
does, the hook makes its own copy at container start:

1. it reads the host's params (``--params``, the spec's driver root's
   ``/proc/driver/nvidia/params``); no file, or ``ModifyDeviceFiles`` not ``1``: it does
   nothing (exit 0);
2. it finds the container's ``proc/driver/nvidia/params`` from a directory fd of the
   rootfs, one component at a time, refusing any symlink on the way and a final one
   (:func:`nvshim.host.inroot.open_dir_plain`): an image symlink is never followed, and a
   rootfs without that file (no driver in the container's procfs) is left alone;
3. it mounts a tmpfs of its own over that ``nvidia`` directory for a moment, writes the
   copy there (0444), bind-mounts the copy over the ``params`` file it opened before,
   unmounts the tmpfs (the bind keeps it alive, unreachable by any path), and remounts the
   bind read-only, ``nosuid,nodev,noexec``. Every mount names its source and target by
   ``/proc/self/fd/N`` of fds opened through that walk, so nothing is resolved twice.

So it writes nothing on the host and nothing in the image: the only trace is the
read-only bind over ``/proc/driver/nvidia/params`` in the container's mount namespace
(the reference leaves its tmpfs at ``/run/nvidia-ctk-hook/<uuid>``, made in the image's
``/run``; this one needs no directory, so a read-only rootfs is no obstacle). The hook
entry carries an explicit env (:data:`nvshim.edits.HOOK_ENV`), and only ``os``, ``sys``,
``json`` and ``ctypes`` are imported, never the links hook's machinery
(:mod:`nvshim.hook`): the runtime's hook handling tells the two apart by module name
(:func:`nvshim.runtime.devparams.runs_params_hook`). Errors are one ``nvshim params-hook:
…`` line and exit 1, which fails the create: a container must not run believing it may
make device nodes when the hook could not say otherwise.
"""

from __future__ import annotations

import errno
import os
import stat
import sys

from nvshim._ocistate import container_root, read_state
from nvshim.errors import HostError, NvshimError
from nvshim.host import inroot
from nvshim.runtime.devparams import PARAMS_HOOK_COMMAND, parse_params_cli, without_modification

TYPE_CHECKING = False  # typing: annotations only (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Optional, Sequence

__all__ = ["main", "show_params"]

_PREFIX = f"nvshim {PARAMS_HOOK_COMMAND}: "
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND = 32, 4096
_MNT_DETACH = 2
_MAX_PARAMS = 65536
_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = _PATH | os.O_DIRECTORY


def _host_params(path: str) -> Optional[bytes]:
    """The host's params file's bytes; None when it is missing or not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise HostError(f"cannot read the host's {path}: {exc.strerror}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, _MAX_PARAMS)
    finally:
        os.close(fd)


def _fd_path(fd: int) -> bytes:
    return f"/proc/self/fd/{fd}".encode()


class _Mounts:
    """mount(2) and umount2(2) through libc, failing as :class:`HostError` naming ``what``."""

    def __init__(self) -> None:
        import ctypes

        self._libc = ctypes.CDLL(None, use_errno=True)
        self._errno = ctypes.get_errno

    def mount(
        self,
        source: Optional[bytes],
        target: bytes,
        fstype: Optional[bytes],
        flags: int,
        data: Optional[bytes],
        what: str,
    ) -> None:
        if self._libc.mount(source, target, fstype, flags, data) != 0:
            raise HostError(f"cannot {what}: {os.strerror(self._errno())}")

    def detach(self, target: bytes, what: str) -> None:
        if self._libc.umount2(target, _MNT_DETACH) != 0:
            raise HostError(f"cannot {what}: {os.strerror(self._errno())}")


def _open_quietly(name: str, flags: int, dir_fd: int) -> Optional[int]:
    """``name`` opened in ``dir_fd``; None when missing, a symlink or the wrong type."""
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
            return None
        raise


def show_params(rootfs: str, content: bytes) -> bool:
    """Bind ``content`` read-only over ``<rootfs>/proc/driver/nvidia/params`` (see the
    module's steps); False, with nothing done, when the rootfs has no such plain file."""
    try:
        root = inroot.open_root(rootfs)
    except OSError as exc:
        raise HostError(f"cannot open the container rootfs {rootfs}: {exc.strerror}") from exc
    fds = []
    try:
        with root:
            driver = inroot.open_dir_plain(root, "proc/driver")
            if driver is None:
                return False
            fds.append(driver)
            nvidia = _open_quietly("nvidia", _DIR, driver)
            if nvidia is None:
                return False
            fds.append(nvidia)
            target = _open_quietly("params", _PATH, nvidia)
            if target is None:
                return False
            fds.append(target)
            if not stat.S_ISREG(os.fstat(target).st_mode):
                return False
            shown = f"{rootfs}/proc/driver/nvidia"
            copy = _bind_copy(driver, nvidia, target, content, shown)
            _remount_read_only(driver, copy, shown)
            return True
    except OSError as exc:
        raise HostError(f"cannot reach {rootfs}/proc/driver/nvidia/params: {exc.strerror}") from exc
    finally:
        for fd in fds:
            os.close(fd)


def _bind_copy(driver: int, nvidia: int, target: int, content: bytes, shown: str) -> os.stat_result:
    """Write ``content`` on a tmpfs mounted over ``nvidia`` for the moment, bind it over
    ``target`` (the procfs file, opened before), unmount the tmpfs; the copy's stat."""
    mounts = _Mounts()
    mounts.mount(
        b"nvshim-params",
        _fd_path(nvidia),
        b"tmpfs",
        _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
        b"mode=0700,size=64k",
        f"mount a tmpfs over {shown}",
    )
    tmp = os.open("nvidia", _DIR, dir_fd=driver)  # the tmpfs's root: the walk crosses it
    try:
        if os.fstat(tmp).st_dev == os.fstat(nvidia).st_dev:
            raise HostError(f"the tmpfs mounted over {shown} is not where it was mounted")
        fd = os.open(
            "params",
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o444,
            dir_fd=tmp,
        )
        try:
            os.fchmod(fd, 0o444)  # as the driver's own file, whatever the umask
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        copy = os.open("params", _PATH, dir_fd=tmp)
        try:
            mounts.mount(
                _fd_path(copy),
                _fd_path(target),
                None,
                _MS_BIND,
                None,
                f"bind ModifyDeviceFiles: 0 over {shown}/params",
            )
            return os.fstat(copy)
        finally:
            os.close(copy)
    finally:
        try:
            mounts.detach(_fd_path(tmp), f"unmount the tmpfs over {shown}")
        finally:
            os.close(tmp)


def _remount_read_only(driver: int, copy: os.stat_result, shown: str) -> None:
    """Remount the bind over ``params`` read-only, once it is checked to be the copy."""
    nvidia = os.open("nvidia", _DIR, dir_fd=driver)
    try:
        bound = os.open("params", _PATH, dir_fd=nvidia)
    finally:
        os.close(nvidia)
    try:
        st = os.fstat(bound)
        if (st.st_dev, st.st_ino) != (copy.st_dev, copy.st_ino):
            raise HostError(f"{shown}/params is not the copy just bound there")
        _Mounts().mount(
            None,
            _fd_path(bound),
            None,
            _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
            None,
            f"make {shown}/params read-only",
        )
    finally:
        os.close(bound)


def _is_host_root(rootfs: str) -> bool:
    try:
        return os.path.samestat(os.stat(rootfs), os.stat("/"))
    except OSError:
        return False


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the hook; return the exit status (0, or 1 after one line on stderr)."""
    os.umask(0o077)
    try:
        host_params = parse_params_cli(sys.argv[1:] if argv is None else argv)
        state = sys.stdin.read()  # read whatever happens: runc writes it all
        text = _host_params(host_params)
        content = None if text is None else without_modification(text)
        if content is None:
            return 0  # no driver, or device-node modification is off already
        import io

        rootfs = container_root(read_state(io.StringIO(state)))
        if _is_host_root(rootfs):
            sys.stderr.write(
                f"{_PREFIX}warning: the container rootfs {rootfs} is the "
                "host's /: nothing is mounted\n"
            )
            return 0
        show_params(rootfs, content)
    except NvshimError as exc:
        sys.stderr.write(f"{_PREFIX}{exc}\n")
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
