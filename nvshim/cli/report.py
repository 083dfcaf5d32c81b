"""How the ``nvshim`` command prints, without click: results on stdout, warnings and notes on
stderr, and a failure as one ``nvshim: …`` line (the traceback before it under ``--debug``).
"""

from __future__ import annotations

import sys

from nvshim.errors import one_line

TYPE_CHECKING = False  # typing alone costs about the interpreter's start (BENCHMARKS.md)
if TYPE_CHECKING:
    from typing import NoReturn

__all__ = ["out", "err", "fail", "internal_error"]


def out(text: str) -> None:
    """A result line (or lines) on stdout."""
    sys.stdout.write(f"{text}\n")


def err(text: str) -> None:
    """A warning or note on stderr, after what stdout already holds."""
    sys.stdout.flush()
    sys.stderr.write(f"{text}\n")
    sys.stderr.flush()


def fail(message: str, exc: BaseException, debug: bool, code: int = 1) -> NoReturn:
    """One ``nvshim: …`` line on stderr (after the traceback under ``--debug``); exit."""
    if debug:
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    err(f"nvshim: {message}")
    sys.exit(code)


def internal_error(exc: BaseException, debug: bool) -> NoReturn:
    """A bug in nvshim: still one line, the traceback on request."""
    hint = "" if debug else " (nvshim --debug shows the traceback)"
    fail(f"internal error: {type(exc).__name__}: {one_line(str(exc))}{hint}", exc, debug)
