"""``nvshim grants``: which live container holds which GPU, from the grant journal."""

from __future__ import annotations

import sys
from typing import Optional

import click

from nvshim.cli.options import CONFIG_FILE, FORMAT

__all__ = ["grants"]


# --- grants -------------------------------------------------------------------------------


@click.command()
@CONFIG_FILE
@click.option("--journal", default=None, type=click.Path(dir_okay=False),
              help="Grant journal to read (default: config grants-journal).")
@FORMAT
@click.option("--prometheus", "prom_file", default=None, type=click.Path(dir_okay=False),
              help="Also write a node-exporter textfile-collector file here (atomically).")
def grants(config_file: Optional[str], journal: Optional[str], fmt: str,
           prom_file: Optional[str]) -> None:
    """Which live container holds which GPU, from the runtime's grant journal.

    A grant is live while its container exists (`runc/crun --root R state ID`). A GPU held
    by two live containers is flagged as a CONFLICT unless every one of those grants named
    time-slicing replicas (<uuid>::N); then the command exits 1.
    """
    from nvshim.config import load_config
    from nvshim.errors import ConfigError
    from nvshim.runtime.holders import (
        conflicts,
        live_grants,
        render_json,
        render_prometheus,
        render_table,
    )

    path = journal or load_config(config_file).grants_journal
    if not path:
        raise ConfigError("grants-journal is off (null) in the config; pass --journal FILE")
    holders = live_grants(path)
    if prom_file:
        from nvshim.files import write_atomic

        write_atomic(prom_file, render_prometheus(holders).encode(), default_mode=0o644)
    click.echo(render_json(holders) if fmt == "json" else render_table(holders))
    if conflicts(holders):
        sys.exit(1)
