"""``nvshim grants``: which live container holds which GPU, from the grant journal."""

from __future__ import annotations

import sys
from typing import Optional

import click

from nvshim.cli.options import CONFIG_FILE, FORMAT

__all__ = ["grants"]


@click.command()
@CONFIG_FILE
@click.option(
    "--journal",
    default=None,
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="Grant journal to read (default: config grants-journal).",
)
@FORMAT
@click.option(
    "--prometheus",
    "prom_file",
    default=None,
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="Also write a node-exporter textfile-collector file here (atomically).",
)
@click.option(
    "--denied",
    is_flag=True,
    help="Show the containers denied GPUs instead (stripped or refused, and why), "
    "from the denial journal beside the grant journal.",
)
def grants(
    config_file: Optional[str],
    journal: Optional[str],
    fmt: str,
    prom_file: Optional[str],
    denied: bool,
) -> None:
    """Which live container holds which GPU, from the runtime's grant journal.

    Each GPU is shown by its index on this node (as nvidia-smi numbers it; ? when the
    node has no such GPU now) and its UUID. A grant is live while its container exists
    (`runc/crun --root R state ID`). A GPU held by two live containers is flagged as a
    CONFLICT unless every one of those grants named time-slicing replicas (<uuid>::N);
    then the command exits 1.

    A --journal that does not exist is an error; the config's grants-journal not existing
    yet means no GPU was granted on this node (said on stderr, exit 0). Lines that are
    not grant records are skipped with a warning naming them; a journal with such lines
    and no record at all is an error.

    --denied lists, oldest first, every container that asked for GPUs and got none: its
    request stripped (created without them) or its create refused, with the reason the
    runtime gave and what it asked. They are kept in the grant journal's sibling
    (grants.jsonl -> grants.denied.jsonl); past grants-journal-max-bytes every tenant
    (namespace) keeps its newest records first, so one tenant cannot push out the others.

    Every value a container controls is shown with its control characters escaped
    (\\n, \\r, \\x1b, \\u202e ...): no record can add a line or a column.
    """
    from nvshim.cli.readonly import grants as run_grants

    rc = run_grants(config_file, journal, fmt, prom_file, denied)
    if rc:
        sys.exit(rc)
