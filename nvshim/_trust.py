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
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional, Tuple

__all__ = ["replaceable_by_others", "lookup_problem"]

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
