"""How nvshim reads its own files (only when trusted) and writes them (atomically).

Reads (:func:`read_bytes`, :func:`read_trusted_cache`) hold a file to the trust rule: when
running as root, only a file that nobody but root could have written or replaced is used.
Writes (:func:`write_atomic`) are the one way nvshim replaces a file: same-directory temp
file, fsync, rename.

Who but root could change what a path leads to: the directories its lookup goes through.

A file's own owner and mode say who can write it; who can *replace* it is decided by every
directory the kernel looks a name up in on the way there: each ancestor, and, past a
symlink, the directories of the symlink's target (a symlink is replaced like a file, so
its own directory counts too). :func:`replaceable_by_others` walks that chain as the
kernel resolves the path — ``..`` after a symlink is the real parent — and returns the
first place that someone but root could change: a directory not owned by root, or writable
by group or others without the sticky bit; in a sticky, world-writable directory (``/tmp``)
an entry (directory or symlink) that root does not own.

Costs one ``lstat`` per component (a few microseconds each): cheap enough for every create.

The rule nvshim holds its files to is here too (:func:`check_trusted`, like sshd's
StrictModes): when running as root, every file a create reads (the config, its compiled
copy, the trampoline's lists, the node plan cache, the CDI index, CDI spec files) must be
root's, writable by root only, and reached through directories only root can change.
So must every program it runs as root or lets runc run because of its config or a CDI
spec it loaded (:func:`executable_problem`: the low-level runtime, the hooks it adds).
:func:`read_bytes` and :func:`read_trusted_cache` open such files without blocking on a
FIFO and check them on the open descriptor; :func:`read_upto` reads an open file without
allocating its size bound first.

Why one module: the trust rule, the trusted reads that apply it and the atomic write are
the one contract for every file nvshim reads or replaces as root; split, a read could
leave the rule behind without a reviewer seeing it beside the others.
"""

from __future__ import annotations

import os
import stat

from nvshim.errors import ConfigError, HostError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO, List, Optional, Tuple

    #: What a resident process holds of a cache it read (:func:`read_trusted_held`):
    #: (path, its :func:`stat_signature` when read, the parsed document).
    Held = Tuple[str, List[int], Any]

__all__ = [
    "replaceable_by_others",
    "lookup_problem",
    "check_trusted",
    "executable_problem",
    "check_executable",
    "read_bytes",
    "read_upto",
    "read_trusted_cache",
    "write_atomic",
    "remove_stale_temps",
    "stat_signature",
]

_MAX_LINKS = 40  # the kernel's limit on symlinks followed in one lookup


def _open_to_others(st: os.stat_result) -> bool:
    """Group or others may write the directory."""
    return bool(st.st_mode & 0o022)


def _weak_directory(st: os.stat_result) -> bool:
    """Someone but root can add, remove or rename any entry of the directory."""
    return st.st_uid != 0 or (_open_to_others(st) and not st.st_mode & stat.S_ISVTX)


def replaceable_by_others(path: str) -> Optional[Tuple[str, os.stat_result, str]]:
    """(the place, its stat, what it is) of the first step in the lookup of ``path`` that a
    user other than root could change; None when every step is root's alone.

    ``what`` is ``directory`` (a directory of the chain others can write, or that root does
    not own), ``entry`` (a directory or symlink in a sticky directory that another user
    owns), ``a symlink loop`` (more than 40 symlinks) or ``not a directory`` (a component the lookup
    must pass through). The last component is not judged (the caller checks the file it
    opened); an ``OSError`` of ``lstat``/``readlink`` (a component gone meanwhile) is raised.
    """
    pending: List[str] = [p for p in reversed(os.path.abspath(path).split("/")) if p]
    current = "/"
    current_st = os.lstat(current)
    if _weak_directory(current_st):
        return current, current_st, "directory"
    links = 0
    while pending:
        name = pending.pop()
        if name == ".":
            continue
        if name == "..":
            current = os.path.dirname(current)
            current_st = os.lstat(current)
            continue
        step = os.path.join(current, name)
        st = os.lstat(step)
        if st.st_uid != 0 and _open_to_others(current_st) and pending:
            # in a sticky world-writable directory: its owner can replace it (a symlink
            # that is the last component is one too)
            return step, st, "entry"
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid != 0 and _open_to_others(current_st):
                return step, st, "entry"
            links += 1
            if links > _MAX_LINKS:
                return step, st, "a symlink loop"
            target = os.readlink(step)
            if target.startswith("/"):
                current = "/"
                current_st = os.lstat(current)
            pending.extend(p for p in reversed(target.split("/")) if p)
            continue
        if not pending:
            return None
        if not stat.S_ISDIR(st.st_mode):
            return step, st, "not a directory"
        if _weak_directory(st):
            return step, st, "directory"
        current, current_st = step, st
    return None


def lookup_problem(path: str, noun: str) -> str:
    """The one-line refusal of :func:`replaceable_by_others`' finding for ``path`` (a
    ``noun``: ``config``), with the command that fixes it; "" when the lookup is root's."""
    try:
        weak = replaceable_by_others(path)
    except OSError as exc:
        return f"cannot look up {noun} {path}: {exc.strerror}"
    if weak is None:
        return ""
    where, st, what = weak
    if what in ("a symlink loop", "not a directory"):
        return f"cannot look up {noun} {path}: {where} is {what}"
    via = "" if os.path.dirname(os.path.abspath(path)) == where else f" (on the way to {path})"
    if what == "entry":  # another user's directory or symlink in a sticky one (/tmp)
        return (
            f"{noun} path {where}{via} is owned by uid {st.st_uid} in a directory others "
            f"can write: run chown root {where}"
        )
    return (
        f"{noun} directory {where}{via} can be written by others (uid {st.st_uid}, mode "
        f"{st.st_mode & 0o7777:04o}), so {os.path.basename(path)} could be replaced: "
        f"run {'chmod go-w' if st.st_uid == 0 else 'chown root'} {where}"
    )


def check_trusted(path: str, st: os.stat_result, what: str = "config") -> None:
    """Refuse a config file others could have written (like sshd's StrictModes, sudo).

    nvshim-runtime runs as root and executes the runtimes these files name, so when
    running as root each file nvshim reads or the trampoline trusts must be owned by root
    and writable by its owner only, and no directory its lookup goes through (ancestors,
    and past a symlink its target's) may let others replace it (:func:`lookup_problem`).
    ``what`` names the kind of file in the message: the same rule holds CDI spec files,
    whose hooks run as root on the host (:mod:`nvshim.cdi.load`).
    """
    euid = os.geteuid()
    if euid != 0:
        return  # the rule protects root; a user's own nvshim reads what that user may read
    if st.st_uid != 0:
        raise ConfigError(
            f"{what} {path} is owned by uid {st.st_uid}, not root: nvshim-runtime runs as "
            f"root and executes what it names; run chown root {path}"
        )
    if st.st_mode & 0o022:
        raise ConfigError(
            f"{what} {path} is writable by group or others (mode {st.st_mode & 0o7777:04o}): "
            f"nvshim-runtime runs as root and executes what it names; run chmod go-w {path}"
        )
    problem = lookup_problem(path, what)  # the ancestors, and past a symlink its target's
    if problem:
        raise ConfigError(problem)


def executable_problem(path: str, what: str) -> str:
    """The one-line refusal of a program nvshim runs as root, or puts in config.json for
    runc to run as root (a ``what``: ``runtime``, ``hook``), that someone but root could
    have written or replaced; "" when it is root's alone, when not running as root (the
    rule protects root, as :func:`check_trusted`), or when it does not exist (exec and
    runc say that). The rule is the config files': owned by root, writable by root only,
    reached through directories only root can change (:func:`lookup_problem`)."""
    if os.geteuid() != 0:
        return ""
    try:
        st = os.stat(path)
    except OSError:
        return ""
    if st.st_uid != 0:
        return (
            f"{what} {path} is owned by uid {st.st_uid}, not root: it would run as root; "
            f"run chown root {path}"
        )
    if st.st_mode & 0o022:
        return (
            f"{what} {path} is writable by group or others (mode {st.st_mode & 0o7777:04o}): "
            f"it would run as root; run chmod go-w {path}"
        )
    problem = lookup_problem(path, what)
    return f"{what} {path} would run as root, but {problem}" if problem else ""


def check_executable(path: str, what: str) -> None:
    """:func:`executable_problem` as a :class:`ConfigError`."""
    problem = executable_problem(path, what)
    if problem:
        raise ConfigError(problem)


def read_trusted_cache(path: str, what: str) -> Tuple[Optional[Any], str]:
    """(the parsed JSON, "") of a cache nvshim keeps beside the config (node plan, CDI
    index), else (None, why not): missing, unreadable, not trusted like the config (a cache
    names host files and hooks that go into containers), or not JSON. Never raises: a
    cache that cannot be used is rebuilt, it never fails a create."""
    from nvshim._jsonc import loads

    try:
        with _open_file(path) as fh:
            try:
                check_trusted(path, os.fstat(fh.fileno()))
            except ConfigError as exc:
                return None, f"{what} not trusted: {exc}"
            raw = fh.read()
    except _NotAFile:
        return None, f"{what} is not a regular file"
    except FileNotFoundError:
        return None, f"no {what}"
    except OSError as exc:
        return None, f"{what} unreadable: {exc.strerror}"
    try:
        return loads(raw), ""
    except (ValueError, RecursionError):
        return None, f"{what} is not valid JSON"


class _NotAFile(Exception):
    """Internal: the path is a FIFO, a device, a socket or a directory."""


def _open_file(path: str) -> BinaryIO:
    """``open(path, "rb")`` that refuses anything but a regular file, without blocking: a
    FIFO at a config path would otherwise hang every create waiting for a writer."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _NotAFile(path)
    return open(fd, "rb")


def read_bytes(path: str) -> Optional[bytes]:
    try:
        with _open_file(path) as fh:
            check_trusted(path, os.fstat(fh.fileno()))
            return fh.read()
    except _NotAFile:
        raise ConfigError(f"cannot read config {path}: not a regular file") from None
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc


def read_upto(fd: int, size: int, limit: int) -> bytes:
    """The bytes of the open file ``fd`` up to its end, ``limit`` at most, even if it grows
    meanwhile; ``size`` is what ``fstat`` said it holds. The first read asks for that and
    one byte more: a read of a regular file that comes back short has met the end, so a
    file that did not grow is read in one ``read``. Later reads ask for 64 KiB: a read
    that asks for ``limit`` or a megabyte allocates that much before reading a few KiB.
    Callers that refuse a file over a bound pass the bound + 1 and compare the length."""
    chunks: List[bytes] = []
    got = 0
    want = size + 1
    while got < limit:
        asked = min(want, limit - got)
        chunk = os.read(fd, asked)
        if chunk:
            chunks.append(chunk)
            got += len(chunk)
        if len(chunk) < asked:
            break  # the end (a regular file reads short only there)
        want = 1 << 16  # it grew: on in 64 KiB reads
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_TEMP_MARK = ".nvshim-"


def remove_stale_temps(directory: str, base: str) -> None:
    """Delete ``.<base>.nvshim-<pid>`` files left by writers that died (SIGKILL, OOM).

    One listdir; a temp file is removed only when its pid no longer exists, so a
    concurrent writer's file is never touched (a reused pid keeps a leftover, harmlessly).
    """
    prefix = f".{base}{_TEMP_MARK}"
    try:
        names = os.listdir(directory)
    except OSError:
        return  # the write itself will report an unusable directory
    for name in names:
        if not name.startswith(prefix):
            continue
        pid_text = name[len(prefix) :]
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            try:
                os.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                pass  # another create removed it first
            except OSError:
                pass  # not ours to remove after all; leaving it is harmless
        except OSError:
            continue  # the pid exists (EPERM: another user's process)


def write_atomic(path: str, data: bytes, default_mode: int = 0o644, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically, keeping its mode (``default_mode`` if new).

    Readers see the old bytes or the new bytes, never a mix; a crash leaves at most a
    ``.<name>.nvshim-*`` temp file behind, never a truncated target. ``durable=False``
    skips the two fsyncs (file and directory: BENCHMARKS.md, figures) for files that are
    rewritten by every create anyway (a bundle's config.json): atomicity is the rename's,
    only surviving a power loss is given up.
    """
    directory = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = default_mode
    except OSError as exc:
        raise HostError(f"cannot stat {path}: {exc.strerror}") from exc
    remove_stale_temps(directory, base)
    tmp = os.path.join(directory, f".{base}.nvshim-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        os.unlink(tmp)  # a leftover of a crashed run with our pid; never someone else's
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise HostError(f"cannot write {path}: {exc.strerror}") from exc
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass  # already gone; the original error is the one to report
        raise HostError(f"cannot write {path}: {exc.strerror}") from exc
    if not durable:
        return
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return  # the rename is done; a directory we cannot open cannot be fsynced either
    try:
        os.fsync(dfd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the data is already durable
    finally:
        os.close(dfd)


def read_trusted_held(
    path: str, what: str, held: Optional[Held]
) -> Tuple[Optional[Any], str, Optional[Held]]:
    """:func:`read_trusted_cache` for a resident process (the agent's plan and CDI index
    memos): ``held``'s document again while ``path``'s :func:`stat_signature` is the one
    read (its trust checked anew each time, as a read would), else the file read afresh.
    Returns (the document or None, why not, what to hold from now on)."""
    sig = stat_signature(path)
    if sig is not None and held is not None and held[0] == path and held[1] == sig:
        try:
            check_trusted(path, os.stat(path))
        except ConfigError as exc:
            return None, f"{what} not trusted: {exc}", held
        except OSError as exc:
            return None, f"{what} unreadable: {exc.strerror}", held
        return held[2], "", held
    doc, why = read_trusted_cache(path, what)
    return doc, why, (None if why or sig is None else (path, sig, doc))


def stat_signature(path: str) -> Optional[List[int]]:
    """What ``stat`` says of ``path`` that changes when it is replaced or written (inode,
    device, mode, device number, links, size, modification and change times); None when
    it does not exist. The node plan cache compares these to see that nothing changed."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return [
        st.st_ino,
        st.st_dev,
        st.st_mode,
        st.st_rdev,
        st.st_nlink,
        st.st_size,
        st.st_mtime_ns,
        st.st_ctime_ns,
    ]
