"""What a command prints besides its result, under the global ``--quiet`` and ``--debug``.

``nvshim --quiet CMD`` drops informational stderr lines (``wrote …``, notes); errors and
warnings always print. ``nvshim --debug CMD`` prints debug lines and, for a failure, the
Python traceback before the one error line. The settings live on the click context
(``ctx.obj``, an :class:`Output`), so a command invoked on its own (tests' ``CliRunner``)
prints as without either flag.
"""

from __future__ import annotations

from dataclasses import dataclass

import click

__all__ = ["Output", "settings", "info", "debug"]


@dataclass
class Output:
    """The global output flags of one ``nvshim`` run."""

    quiet: bool = False
    debug: bool = False


def settings() -> Output:
    """The running command's :class:`Output` (defaults outside an ``nvshim`` run)."""
    ctx = click.get_current_context(silent=True)
    found = ctx.find_object(Output) if ctx is not None else None
    return found if found is not None else Output()


def info(message: str) -> None:
    """An informational line on stderr (``wrote …``, a note); nothing under ``--quiet``."""
    if not settings().quiet:
        click.echo(message, err=True)


def debug(message: str) -> None:
    """A ``nvshim: debug: …`` line on stderr, only under ``--debug``."""
    if settings().debug:
        click.echo(f"nvshim: debug: {message}", err=True)
