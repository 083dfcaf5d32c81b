"""``nvshim config``: validate, compile and show nvshim's own configuration file."""

from __future__ import annotations

from typing import Optional

import click

from nvshim.cli.options import CONFIG_FILE, FORMAT
from nvshim.cli.output import info

__all__ = ["config_group"]


# --- config -------------------------------------------------------------------------------


@click.group("config")
def config_group() -> None:
    """nvshim's own configuration file."""


@config_group.command("compile")
@CONFIG_FILE
def config_compile(config_file: Optional[str]) -> None:
    """Validate the YAML config and write the JSON copy the runtime's hot path reads.

    Also rebuilds, next to it, the node plan cache (what discovery finds on this node)
    and the index of the CDI spec dirs; creates check both with stat and rebuild them
    when stale. Refuses (and writes nothing) when driver-root or dev-root is not a
    directory on this node.
    """
    from nvshim.node.compile import compile_node

    out, plan, index = compile_node(config_file)
    info(f"wrote {out}")
    info(f"node plan: {plan}")
    info(f"CDI index: {index}")


@config_group.command("show")
@CONFIG_FILE
@FORMAT
def config_show(config_file: Optional[str], fmt: str) -> None:
    """Validate the config and print the effective values (defaults filled in).

    text: YAML, after a comment naming the file the values came from. json: one object,
    {"source": FILE or null for the built-in defaults, "config": {KEY: VALUE, ...}}.
    """
    from nvshim.config import config_path, load_config

    config = load_config(config_file, required=config_file is not None)
    if fmt == "json":
        import json

        click.echo(json.dumps({"source": config.source, "config": config.to_mapping()},
                              indent=2))
        return
    import yaml

    # without a file, name the one looked for: $NVSHIM_CONFIG may name one that is not there
    where = config.source or f"built-in defaults (no config {config_path()})"
    click.echo(f"# effective config from {where}")
    click.echo(yaml.safe_dump(config.to_mapping(), sort_keys=False).rstrip())
