"""Who but root could change what a path leads to: the directories its lookup goes through.

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
:func:`read_bytes` and :func:`read_trusted_cache` open such files without blocking on a
FIFO and check them on the open descriptor.
"""

from __future__ import annotations

import os
import stat

from nvshim.errors import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO, List, Optional, Tuple

__all__ = ["replaceable_by_others", "lookup_problem", "check_trusted", "read_bytes",
           "read_trusted_cache"]

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
        return (f"{noun} path {where}{via} is owned by uid {st.st_uid} in a directory others "
                f"can write: run chown root {where}")
    return (f"{noun} directory {where}{via} can be written by others (uid {st.st_uid}, mode "
            f"{st.st_mode & 0o7777:04o}), so {os.path.basename(path)} could be replaced: "
            f"run {'chmod go-w' if st.st_uid == 0 else 'chown root'} {where}")


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
