"""Options several commands share, so each spells them the same way."""

from __future__ import annotations

import click

from nvshim.config import DEFAULT_CONFIG_PATH

__all__ = ["CONFIG_FILE", "FORMAT"]

CONFIG_FILE = click.option(
    "--config",
    "config_file",
    default=None,
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help=f"Config file (default: $NVSHIM_CONFIG or {DEFAULT_CONFIG_PATH}).",
)
FORMAT = click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True
)
