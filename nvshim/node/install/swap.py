"""Putting a new prefix in place of the installed one in one step.

install.sh ``--from`` copies the payload beside the installed prefix, then exchanges the
two folders' names with renameat2(2)'s ``RENAME_EXCHANGE`` (Python's :mod:`os` has no
renameat2), run by the new prefix's own interpreter: a create running meanwhile (the
trampoline starting Python, Python importing lazily) finds one whole prefix or the other,
never none. Two renames left a gap in which such creates failed with no log line. Where the
file system cannot exchange (:func:`main` exits 1), install.sh falls back to two renames.
"""

from __future__ import annotations

import ctypes
import os
import sys

from nvshim.errors import HostError, host_error

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional, Sequence

__all__ = ["exchange", "main"]

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange(a: str, b: str) -> None:
    """Swap the names of ``a`` and ``b`` (both must exist) in one atomic step; HostError
    naming both when the kernel or the file system cannot (nothing moved then)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise host_error(f"cannot exchange {a} and {b}", OSError(err, os.strerror(err)))


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``A B``: exchange them; exit 1 with the reason on stderr when that cannot be done."""
    a, b = argv if argv is not None else sys.argv[1:]
    try:
        exchange(a, b)
    except HostError as exc:
        sys.stderr.write(f"install.sh: {exc}\n")
        sys.exit(1)
