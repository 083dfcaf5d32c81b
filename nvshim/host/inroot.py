"""File operations confined to a container rootfs, as if chrooted into it.

The createContainer hook runs as host root in the container's mount namespace before
``pivot_root``: host paths still resolve, and the rootfs is just a directory whose
contents the image controls. A plain ``open(os.path.join(rootfs, path))`` follows an
image symlink such as ``/usr/lib/x86_64-linux-gnu -> /etc`` out to the host (the
CVE-2024-0132 / CVE-2025-23267 family). Everything here instead walks the path one
component at a time from a directory fd of the root:

- each component is opened with ``O_PATH|O_NOFOLLOW|O_DIRECTORY`` relative to the
  previous one, so the kernel never follows a symlink for us;
- a symlink met on the way is read with ``readlinkat`` and its text is walked again,
  in the root: an absolute target restarts at the root, ``..`` pops our own stack of
  directory fds and stops at the root (it is never opened as ``..``), and more than
  :data:`MAX_SYMLINKS` links fail with ``ELOOP``;
- the final component of a write is never followed: files and symlinks are created
  under a temporary name in the resolved directory and renamed over it with
  ``renameat``, both through the same directory fd, so there is no window between
  resolving and writing.

Why not ``openat2(RESOLVE_IN_ROOT)`` via ctypes: it needs Linux 5.6 and is often hidden
by seccomp (ENOSYS/EPERM), so this walk must exist and be right anyway; a second path
would double what has to be tested. ``import ctypes`` is also costly (BENCHMARKS.md), in a
hook that runs on every container create. The remaining gap versus openat2 — a process
renaming directories of this rootfs while we walk — does not apply: during
createContainer the container's own process is still parked in runc's init.

Errors are :class:`OSError` with ``filename`` set to the container path; the caller
turns them into a one-line message. Directory fds returned to callers are ``O_PATH``
fds owned by the caller (close them).

Why one module: every operation here is the same confined walk put to one use, and the
walk's guarantees are only as good as its users' (never following the final component,
renaming through the same directory fd); reviewing them side by side is the point. The
hook imports it on every create, where a second module would cost more.
"""

from __future__ import annotations

import errno
import os
import stat

# typing is costly (BENCHMARKS.md) and the hook runs on every create: annotations only
# (mypy treats a name TYPE_CHECKING as true).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Iterable, List, Optional, Tuple, Union

__all__ = [
    "MAX_SYMLINKS",
    "RootFd",
    "open_root",
    "resolve_dir",
    "real_path",
    "list_dir",
    "open_dir",
    "open_dir_plain",
    "child_dir",
    "read_file_in",
    "is_file_in",
    "write_file_in",
    "dir_kinds",
    "open_in_dir",
    "lstat",
    "open_file",
    "read_file",
    "write_file_atomic",
    "symlink_atomic",
    "symlinks_atomic",
]

#: The kernel's own limit on symlinks followed in one lookup.
MAX_SYMLINKS = 40

#: Refuse to read files larger than this (a hostile image could ship a huge cache).
MAX_READ = 64 << 20

_DIR_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC


class RootFd:
    """An open ``O_PATH`` directory fd of a container rootfs; use as a context manager."""

    __slots__ = ("fd", "path")

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> RootFd:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if TYPE_CHECKING:
    Root = Union[RootFd, int]  # a RootFd or its bare fd


def _root_fd(root: Root) -> int:
    return root.fd if isinstance(root, RootFd) else root


def open_root(path: str) -> RootFd:
    """Open the rootfs directory *path* (a trusted host path: symlinks in it are followed)."""
    fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return RootFd(fd, path)


def _components(path: str) -> List[str]:
    if "\0" in path:  # no file has one; os calls would raise ValueError, not OSError
        raise OSError(errno.EINVAL, "path contains a NUL byte", path.replace("\0", "\\0"))
    return [c for c in path.split("/") if c and c != "."]


def _split_final(container_path: str) -> Tuple[str, str]:
    """Split *container_path* into (parent, final name); the name must be a real name."""
    parts = _components(container_path)
    if not parts or parts[-1] == "..":
        raise OSError(errno.EINVAL, "path does not name a file", container_path)
    return "/".join(parts[:-1]), parts[-1]


def _loop_error(container_path: str) -> OSError:
    return OSError(
        errno.ELOOP,
        f"more than {MAX_SYMLINKS} symbolic links (a symlink loop?)",
        container_path,
    )


def _make_dir(parent: int, name: str, mode: int) -> None:
    """mkdirat *name* with exactly *mode* (not masked by the umask); EEXIST is fine."""
    try:
        os.mkdir(name, mode, dir_fd=parent)
    except FileExistsError:
        return
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


# Long on purpose: the confined walk (one openat per component, every symlink resolved
# inside the root) kept whole, so its safety is read in one place.
def _walk(
    root: int,
    container_path: str,
    *,
    create: bool,
    mode: int,
    shown: Optional[str] = None,
) -> int:
    """Resolve *container_path* as a directory in *root*; return a new ``O_PATH`` fd.

    Missing components are created (``mode``) when *create*; otherwise
    ``FileNotFoundError``. Every symlink, the last component's included, is resolved.
    Errors name *shown* (default: *container_path*).
    """
    if shown is None:
        shown = container_path
    todo = _components(container_path)
    todo.reverse()  # a stack: pop() yields the next component
    stack: List[int] = []  # fds we opened below root; root itself is implicit
    links = 0
    try:
        while todo:
            name = todo.pop()
            if name == "..":
                if stack:
                    os.close(stack.pop())
                continue
            cur = stack[-1] if stack else root
            try:
                stack.append(os.open(name, _DIR_FLAGS, dir_fd=cur))
                continue
            except FileNotFoundError:
                if not create:
                    raise FileNotFoundError(
                        errno.ENOENT, os.strerror(errno.ENOENT), shown
                    ) from None
                # Could be a dangling symlink: readlink tells; else make the directory.
                target = _readlink(name, cur)
                if target is None:
                    try:
                        _make_dir(cur, name, mode)
                    except OSError as exc:
                        raise OSError(exc.errno, exc.strerror, shown) from None
                    todo.append(name)
                    continue
            except OSError as exc:
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise OSError(exc.errno, exc.strerror, shown) from None
                target = _readlink(name, cur)
                if target is None:
                    raise NotADirectoryError(
                        errno.ENOTDIR, f"{name!r} is not a directory", shown
                    ) from None
            links += 1
            if links > MAX_SYMLINKS:
                raise _loop_error(shown)
            if target.startswith("/"):
                while stack:
                    os.close(stack.pop())
            todo.extend(reversed(_components(target)))
        return stack.pop() if stack else os.dup(root)  # the last one is the caller's
    finally:
        for fd in stack:
            os.close(fd)


def _readlink(name: str, dir_fd: int) -> Optional[str]:
    """The text of symlink *name* in *dir_fd*, or None if it is not a symlink (or gone)."""
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except (OSError, ValueError):
        return None


def resolve_dir(root: Root, container_path: str, create: bool = False, mode: int = 0o755) -> int:
    """Return an ``O_PATH`` fd of directory *container_path* resolved inside *root*.

    Symlinks on the way are resolved relative to the root (as if chrooted); ``..`` stops
    at the root. With *create*, missing directories are made with *mode*. Raises
    ``FileNotFoundError``, ``NotADirectoryError`` or ``OSError(ELOOP)``.
    """
    return _walk(_root_fd(root), container_path, create=create, mode=mode)


def real_path(root: Root, container_path: str) -> str:
    """The container path *container_path* names once its symlinks are resolved in *root*.

    Every component, the last included, is resolved as :func:`resolve_dir` would (as if
    chrooted, ``..`` stopping at the root); components that do not exist are kept as
    written. Only reads: nothing is created. Raises ``OSError(ELOOP)`` for a loop.
    """
    root_fd = _root_fd(root)
    todo = _components(container_path)
    todo.reverse()
    names: List[str] = []
    fds: List[Optional[int]] = []  # per name: its O_PATH fd, None below a missing component
    links = 0
    try:
        while todo:
            name = todo.pop()
            if name == "..":
                if names:
                    names.pop()
                    fd = fds.pop()
                    if fd is not None:
                        os.close(fd)
                continue
            cur = fds[-1] if fds else root_fd
            if cur is None:
                names.append(name)
                fds.append(None)
                continue
            target = _readlink(name, cur)
            if target is not None:
                links += 1
                if links > MAX_SYMLINKS:
                    raise _loop_error(container_path)
                if target.startswith("/"):
                    names.clear()
                    while fds:
                        fd = fds.pop()
                        if fd is not None:
                            os.close(fd)
                todo.extend(reversed(_components(target)))
                continue
            try:
                opened: Optional[int] = os.open(name, _DIR_FLAGS, dir_fd=cur)
            except OSError:
                opened = None  # missing, or not a directory: nothing below it resolves
            names.append(name)
            fds.append(opened)
        return "/" + "/".join(names)
    finally:
        for fd in fds:
            if fd is not None:
                os.close(fd)


def _open_final(root: int, container_path: str, flags: int) -> int:
    """Open the regular file *container_path* in *root*, following a final symlink in the
    root.

    Anything else is refused with ``OSError(EINVAL)`` *before* it is opened: opening a
    device node runs its driver's open (an image's ``c 10:130`` node would arm the host's
    watchdog) and the runtime opens image files as host root, outside any device cgroup.
    """
    parent_path, name = _split_final(container_path)
    links = 0
    while True:
        parent = _walk(root, parent_path, create=False, mode=0, shown=container_path)
        try:
            try:
                mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
                if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                    raise OSError(errno.EINVAL, "not a regular file", container_path)
                return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise OSError(exc.errno, exc.strerror, container_path) from None
                target = _readlink(name, parent)
                if target is None:
                    raise OSError(exc.errno, exc.strerror, container_path) from None
        finally:
            os.close(parent)
        links += 1
        if links > MAX_SYMLINKS:
            raise _loop_error(container_path)
        # Re-resolve "<parent>/<target>" from the root: absolute targets restart there.
        joined = target if target.startswith("/") else f"{parent_path}/{target}"
        parent_path, name = _split_final(joined)


def open_file(root: Root, container_path: str) -> int:
    """Open regular file *container_path* in *root* read-only; return the fd (caller closes).

    Symlinks, the final one included, are resolved inside the root. Anything but a
    regular file (a FIFO, a device, a directory) is refused without being opened, with
    ``OSError(EINVAL)``; a missing file raises ``FileNotFoundError``.
    """
    return _open_regular(
        _open_final(_root_fd(root), container_path, os.O_RDONLY | os.O_NONBLOCK), container_path
    )[0]


def _open_regular(fd: int, shown: str) -> Tuple[int, int]:
    """(*fd*, its size) once ``fstat`` says *fd* is a regular file; otherwise *fd* is
    closed and ``OSError(EINVAL)`` names *shown*."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", shown)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def lstat(root: Root, container_path: str) -> os.stat_result:
    """``lstat`` of *container_path* in *root*: the parent is resolved in the root, the
    final component is not followed."""
    parent_path, name = _split_final(container_path)
    parent = _walk(_root_fd(root), parent_path, create=False, mode=0, shown=container_path)
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, container_path) from None
    finally:
        os.close(parent)


def read_file(root: Root, container_path: str, max_size: int = MAX_READ) -> Optional[bytes]:
    """The bytes of regular file *container_path* in *root*, or None if it does not exist.

    Resolution as in :func:`open_file`; files over *max_size* bytes raise ``OSError``.
    """
    try:
        fd = _open_final(_root_fd(root), container_path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    return _read_all(*_open_regular(fd, container_path), max_size, container_path)


def _read_all(fd: int, size: int, max_size: int, shown: str) -> bytes:
    """The bytes of the open regular file *fd* (``fstat`` said *size*), closing it: one
    ``read`` of size + 1 bytes (short once the size is read: the end), more only when it
    grew meanwhile or a read came back short; ``OSError(EFBIG)`` past *max_size* bytes."""
    try:
        chunks: List[bytes] = []
        total = 0
        want = min(size, max_size) + 1
        while True:
            chunk = os.read(fd, want)
            total += len(chunk)
            if total > max_size:
                raise OSError(errno.EFBIG, f"larger than {max_size} bytes", shown)
            chunks.append(chunk)
            if not chunk or (len(chunk) < want and total >= size):
                break
            want = min(1 << 20, max_size + 1 - total)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)


def list_dir(root: Root, container_path: str) -> Optional[List[str]]:
    """Names in directory *container_path* (resolved in *root*), or None if it is missing."""
    try:
        dfd = resolve_dir(root, container_path)
    except FileNotFoundError:
        return None
    try:
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dfd)
    finally:
        os.close(dfd)
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


def open_dir(root: Root, container_path: str) -> Optional[int]:
    """An ``O_PATH`` fd of directory *container_path* resolved in *root* (every symlink,
    the last one's included, resolved inside the root), or None when it is missing. The
    caller closes it; :func:`dir_kinds` and :func:`open_in_dir` work below it without
    walking from the root again."""
    try:
        return resolve_dir(root, container_path)
    except FileNotFoundError:
        return None


def child_dir(
    root: Root, dir_fd: int, dir_path: str, name: str, create: bool = False, mode: int = 0o755
) -> int:
    """An ``O_PATH`` fd of the directory *name* in the directory *dir_fd* (resolved in
    *root* as *dir_path*), as :func:`resolve_dir` would give for ``dir_path/name``: a
    plain directory is opened right there (never following it); a symlink, or a missing
    one with *create*, goes through the walk from the root (its target resolved there)."""
    shown = f"{dir_path.rstrip('/')}/{name}"
    if name and "/" not in name and name not in (".", ".."):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            if create and _readlink(name, dir_fd) is None:  # nothing there, not a link
                try:
                    _make_dir(dir_fd, name, mode)
                    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
                except OSError as exc:
                    raise OSError(exc.errno, exc.strerror, shown) from None
        except OSError as exc:
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise OSError(exc.errno, exc.strerror, shown) from None
    return resolve_dir(root, shown, create, mode)


def read_file_in(
    root: Root, dir_fd: int, dir_path: str, name: str, max_size: int = MAX_READ
) -> Optional[bytes]:
    """:func:`read_file` of ``dir_path/name`` where *dir_fd* is *dir_path* resolved in
    *root*: a regular file is opened right in *dir_fd* (``lstat``, ``O_NOFOLLOW`` open,
    ``fstat``); a symlink or anything else goes through :func:`read_file` (the link
    resolved in the root, a device refused before it is opened)."""
    shown = f"{dir_path.rstrip('/')}/{name}"
    if not name or "/" in name or name in (".", ".."):
        raise OSError(errno.EINVAL, "not a file name", shown)
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, shown) from None
    if not stat.S_ISREG(mode):
        return read_file(root, shown, max_size)
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link now: resolved in the root
            return read_file(root, shown, max_size)
        raise OSError(exc.errno, exc.strerror, shown) from None
    return _read_all(*_open_regular(fd, shown), max_size, shown)


def is_file_in(dir_fd: int, name: str, shown: str) -> Optional[bool]:
    """Whether *name* in the directory *dir_fd* is a regular file (one ``lstat``, nothing
    followed): None when nothing is there, False for a symlink or anything else; errors
    name *shown*."""
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, shown) from None


def open_dir_plain(root: Root, container_path: str) -> Optional[int]:
    """An ``O_PATH`` fd of directory *container_path* in *root* reached without a single
    symlink (``..`` refused too), or None when a component is missing, a symlink or not a
    directory: for a target that must be exactly the path it names (a mount point under the
    container's ``/proc``), where even a link resolved inside the root would be wrong."""
    parts = _components(container_path)
    fd = os.dup(_root_fd(root))
    try:
        for name in parts:
            if name == "..":
                return None
            try:
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    return None
                raise OSError(exc.errno, exc.strerror, container_path) from None
            os.close(fd)
            fd = nxt
        out, fd = fd, -1
        return out
    finally:
        if fd >= 0:
            os.close(fd)


def dir_kinds(dir_fd: int) -> Dict[str, str]:
    """``name → "file" | "link" | "other"`` for every entry of the directory *dir_fd*.

    One ``getdents`` pass: the types come from the directory (``lstat`` only where the
    filesystem does not say), nothing is opened or followed."""
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        kinds: Dict[str, str] = {}
        with os.scandir(fd) as entries:
            for entry in entries:
                if entry.is_symlink():
                    kinds[entry.name] = "link"
                elif entry.is_file(follow_symlinks=False):
                    kinds[entry.name] = "file"
                else:
                    kinds[entry.name] = "other"
        return kinds
    finally:
        os.close(fd)


def open_in_dir(dir_fd: int, name: str, shown: str, listed: bool = False) -> int:
    """Open the regular file *name* directly in the directory *dir_fd*, read-only.

    *name* is one component: nothing is walked, a symlink is never followed (``ELOOP``),
    and anything but a regular file is refused with ``OSError(EINVAL)`` *before* it is
    opened, as :func:`open_file` does (a device node's open runs its driver). That check
    is an ``lstat``, or with *listed* the directory's own word: the caller has just read
    *name*'s type from ``getdents`` (:func:`dir_kinds` says ``"file"``), as sure a check
    as the ``lstat`` and one syscall fewer per file of a folder scan. Either way the open
    file is ``fstat``-checked again (swapped in between: refused). Errors name *shown*
    (the container path)."""
    if not name or "/" in name or name in (".", ".."):
        raise OSError(errno.EINVAL, "not a file name", shown)
    try:
        if not listed and not stat.S_ISREG(
            os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        ):
            raise OSError(errno.EINVAL, "not a regular file", shown)
        fd = os.open(
            name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, shown) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped between the stat and the open
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", shown)
    return fd


#: [this process's pid]: kept, not asked for at each write (a forked child sets its own)
_PID = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))
#: numbers the temporary names of this process (``next`` is atomic for threads)
_SEQ = iter(range(1 << 62))


def _temp_name(name: str, unique: bool = False) -> str:
    """A temporary name beside *name*: the pid and a sequence number (no syscall), or
    with *unique* random bytes too (a leftover of a dead process with the same pid)."""
    tail = f"-{os.urandom(4).hex()}" if unique else ""
    return f".{name}.nvshim-{_PID[0]}-{next(_SEQ)}{tail}"


def _create_temp(parent: int, name: str, mode: int) -> Tuple[str, int]:
    """(temporary name, fd) of a new file beside *name* in *parent* (``O_EXCL``, never
    following anything); a name already taken is retried once with random bytes."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    tmp = _temp_name(name)
    try:
        return tmp, os.open(tmp, flags, mode, dir_fd=parent)
    except FileExistsError:
        tmp = _temp_name(name, unique=True)
        return tmp, os.open(tmp, flags, mode, dir_fd=parent)


def write_file_atomic(
    root: Root,
    container_path: str,
    data: bytes,
    mode: int = 0o644,
    dir_mode: int = 0o755,
    durable: bool = True,
) -> None:
    """Write *data* to *container_path* in *root*: temp file, fsync, rename over.

    Missing parent directories are created with *dir_mode*. Whatever the final component
    was (a symlink to the host, a file) is replaced, never followed or truncated.
    ``durable=False`` skips the fsync (the rename still makes the write atomic).
    """
    parent_path, name = _split_final(container_path)
    parent = _walk(_root_fd(root), parent_path, create=True, mode=dir_mode, shown=container_path)
    try:
        write_file_in(parent, name, data, mode, container_path, durable)
    finally:
        os.close(parent)


def write_file_in(
    dir_fd: int, name: str, data: bytes, mode: int, shown: str, durable: bool = True
) -> None:
    """:func:`write_file_atomic`'s write in a directory already resolved in the root
    (*dir_fd*, from :func:`resolve_dir` or :func:`child_dir`): a temporary file made and
    renamed over *name* through that same fd; errors name *shown*."""
    if not name or "/" in name or name in (".", ".."):
        raise OSError(errno.EINVAL, "not a file name", shown)
    try:
        tmp, fd = _create_temp(dir_fd, name, 0o600)
    except OSError as exc:  # named as the file we write, not our temporary name
        raise OSError(exc.errno, exc.strerror, shown) from None
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        _unlink_quietly(tmp, dir_fd)
        raise OSError(exc.errno, exc.strerror, shown) from None


def symlink_atomic(root: Root, target: str, container_path: str, dir_mode: int = 0o755) -> bool:
    """Make *container_path* in *root* a symlink to *target*; True if anything changed.

    No-op when it already is that symlink. Where nothing is there, the link is made in
    place (``symlinkat`` is atomic and never follows or replaces an existing entry);
    otherwise a temporary symlink is renamed over whatever is there (a file, a symlink to
    elsewhere); the old entry is never followed. *target* is stored as given and is not
    checked: the container resolves it later. Missing parents are made with *dir_mode*.
    """
    return symlinks_atomic(root, ((target, container_path),), dir_mode) == 1


def symlinks_atomic(root: Root, links: Iterable[Tuple[str, str]], dir_mode: int = 0o755) -> int:
    """:func:`symlink_atomic` for each (target, container path) of *links*, in order, with
    each parent directory resolved once (a driver's SONAME links share one folder: one walk
    instead of one per link). Returns how many changed; an ``OSError`` names the container
    path of the link that failed."""
    root_fd = _root_fd(root)
    parents: Dict[str, int] = {}
    changed = 0
    try:
        for target, container_path in links:
            parent_path, name = _split_final(container_path)
            parent = parents.get(parent_path)
            if parent is None:
                parent = _walk(
                    root_fd, parent_path, create=True, mode=dir_mode, shown=container_path
                )
                parents[parent_path] = parent
            changed += _symlink_in(parent, target, name, container_path)
    finally:
        for fd in parents.values():
            os.close(fd)
    return changed


def _symlink_in(parent: int, target: str, name: str, container_path: str) -> bool:
    """*name* in *parent* made a link to *target*: ``symlinkat`` first (a fresh rootfs has
    none of nvshim's links: one call each), and only when something is there a
    ``readlinkat`` (already right: nothing to do) and a link renamed over it."""
    try:
        os.symlink(target, name, dir_fd=parent)
        return True
    except FileExistsError:
        pass  # a link, a file or a directory is there
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, container_path) from None
    if _readlink(name, parent) == target:
        return False
    tmp = _temp_name(name, unique=True)  # rare (something else was there): never taken
    try:
        os.symlink(target, tmp, dir_fd=parent)
        os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except OSError as exc:
        _unlink_quietly(tmp, parent)
        raise OSError(exc.errno, exc.strerror, container_path) from None
    return True


def _unlink_quietly(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
