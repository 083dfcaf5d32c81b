"""``nvshim``: inspect bundles, manage CDI specs, configure containerd, diagnose a node.

Every command reports failure the same way: one line ``nvshim: <what went wrong>`` on
stderr and exit code 1 (``nvshim --debug`` puts the Python traceback before it). A group
run without a command prints its help on stdout and exits 0.

This module imports no click: :func:`main` first offers the arguments to
:mod:`nvshim.cli.fast` (``--version``, the top-level help and the read-only commands
operators run in loops), and only for every other form loads the click application
(:mod:`nvshim.cli.app`). Both report errors through :mod:`nvshim.cli.report`.
"""

from __future__ import annotations

import sys

from nvshim.cli.report import fail, internal_error
from nvshim.errors import NvshimError

TYPE_CHECKING = False  # typing alone costs about the interpreter's start (BENCHMARKS.md)
if TYPE_CHECKING:
    from typing import Any, List, Optional


__all__ = ["main"]  # and cli, through __getattr__


def main(argv: Optional[List[str]] = None) -> None:
    """Console entry point: one line on stderr and exit 1 for any nvshim failure."""
    from nvshim.cli import fast

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        rc = fast.serve(args)
    except NvshimError as exc:
        fail(str(exc), exc, False, exc.exit_code)
    except Exception as exc:
        internal_error(exc, False)
    if rc is not None:
        sys.stdout.flush()
        sys.exit(rc)
    from nvshim.cli.app import run

    run(args)


def __getattr__(name: str) -> Any:
    """The click application's names (``cli``, the group; ``sim``, ``hook`` …) for callers
    that drive it (tests' CliRunner, completion): loaded from :mod:`nvshim.cli.app`."""
    if name.startswith("__"):  # the import system asks (__path__ …): nothing to load
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from nvshim.cli import app

    try:
        return getattr(app, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


if __name__ == "__main__":
    main()
