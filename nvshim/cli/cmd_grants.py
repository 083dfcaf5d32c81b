"""``nvshim grants``: which live container holds which GPU, from the grant journal."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Dict, Optional, Sequence

import click

from nvshim.cli.options import CONFIG_FILE, FORMAT

if TYPE_CHECKING:
    from nvshim.config import Config

__all__ = ["grants"]


# --- grants -------------------------------------------------------------------------------

#: Unreadable line numbers a warning lists before it says "…".
_SHOWN_LINES = 10


def _unreadable(numbers: Sequence[int]) -> str:
    """``3 unreadable lines (1-2,7)``: the count, and the first line numbers as ranges."""
    from nvshim.host.devices import describe_indices

    shown = describe_indices(list(numbers[:_SHOWN_LINES]))
    more = ",…" if len(numbers) > _SHOWN_LINES else ""
    return f"{len(numbers)} unreadable line{'s' if len(numbers) > 1 else ''} ({shown}{more})"


def _indices(config: Config) -> Dict[str, str]:
    """UUID → index on this node (the plan cache, else discovery, as create sees it); empty,
    with a warning, when the node cannot be read: the holders are still worth showing."""
    from nvshim.errors import NvshimError
    from nvshim.node.holders import gpu_indices
    from nvshim.runtime.plancache import host_for

    try:
        host, _ = host_for(config, save=False)
        return gpu_indices(host)
    except NvshimError as exc:
        click.echo(f"nvshim: warning: GPU indices unknown: {exc}", err=True)
        return {}


def _show_denied(journal: str, fmt: str) -> None:
    from nvshim.node.denied import render_denied_json, render_denied_table
    from nvshim.runtime.denials import denials_path, read_denials

    path = denials_path(journal)
    records = read_denials(path)
    if records is None:
        click.echo(f"nvshim: no denials yet: {path} does not exist (nvshim-runtime creates it "
                   "at the first container it strips or refuses)", err=True)
        records = []
    click.echo(render_denied_json(records) if fmt == "json" else render_denied_table(records))


@click.command()
@CONFIG_FILE
@click.option("--journal", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="Grant journal to read (default: config grants-journal).")
@FORMAT
@click.option("--prometheus", "prom_file", default=None, metavar="FILE",
              type=click.Path(dir_okay=False),
              help="Also write a node-exporter textfile-collector file here (atomically).")
@click.option("--denied", is_flag=True,
              help="Show the containers denied GPUs instead (stripped or refused, and why), "
                   "from the denial journal beside the grant journal.")
def grants(config_file: Optional[str], journal: Optional[str], fmt: str,
           prom_file: Optional[str], denied: bool) -> None:
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
    from nvshim.config import load_config
    from nvshim.errors import ConfigError, HostError
    from nvshim.node.holders import (
        conflicts,
        live_grants,
        read_journal,
        render_json,
        render_prometheus,
        render_table,
    )

    config = load_config(config_file, required=config_file is not None)
    path = journal or config.grants_journal
    if not path:
        raise ConfigError(f"grants-journal is off (null) in {config.source or 'the config'}; "
                          "pass --journal FILE")
    if denied:
        _show_denied(path, fmt)
        return
    doc = read_journal(path)
    if doc is None and journal is not None:
        raise HostError(f"grant journal {path} does not exist")
    if doc is None:
        click.echo(f"nvshim: no grants yet: {path} does not exist (nvshim-runtime creates it "
                   "at the first GPU grant)", err=True)
    elif doc.unreadable and not doc.grants:
        raise HostError(f"{path} holds no grant record, only {_unreadable(doc.unreadable)}: "
                        "is it the grant journal?")
    elif doc.unreadable:
        click.echo(f"nvshim: warning: {path}: skipped {_unreadable(doc.unreadable)}", err=True)
    holders = live_grants(doc.grants if doc is not None else ())
    indices = _indices(config) if holders else {}
    if prom_file:
        from nvshim.files import write_atomic

        write_atomic(prom_file, render_prometheus(holders).encode(), default_mode=0o644)
    click.echo(render_json(holders, indices) if fmt == "json" else render_table(holders, indices))
    if conflicts(holders):
        sys.exit(1)
