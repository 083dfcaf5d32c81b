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
@click.option(
    "--default-runtime",
    is_flag=True,
    help="A default runtime reads this config: refuse it unless require-allocation "
    "is on (a file of only comments too), and mark it so every later compile "
    "does the same (install.sh --set-as-default).",
)
@click.option(
    "--check", is_flag=True, help="Only validate (with the same refusals), write nothing."
)
def config_compile(config_file: Optional[str], default_runtime: bool, check: bool) -> None:
    """Validate the YAML config and write the JSON copy the runtime's hot path reads.

    Also rebuilds, next to it, the node plan cache (what discovery finds on this node)
    and the index of the CDI spec dirs; creates check both with stat and rebuild them
    when stale. Refuses (and writes nothing) when driver-root or dev-root is not a
    directory on this node, and, when a default runtime reads the config (--default-runtime,
    or the config.default-runtime mark beside it), when require-allocation is off or the
    file holds no settings.
    """
    from nvshim.node.compile import check_config, compile_node

    if check:
        path = check_config(config_file, default_runtime)[0]
        info(f"config {path} is valid")
        return
    out, plan, index = compile_node(config_file, default_runtime)
    info(f"wrote {out}")
    info(f"node plan: {plan}")
    info(f"CDI index: {index}")


@config_group.command("paths")
@CONFIG_FILE
def config_paths(config_file: Optional[str]) -> None:
    """Print the files this config makes nvshim write, one "KEY PATH" line each.

    grants-journal and denied-journal (absent when grants-journal is null), then the
    files compile writes beside the config. install.sh records them from here.
    """
    from nvshim import config as cfg
    from nvshim.runtime.denials import denials_path

    config = cfg.load_config(config_file, required=config_file is not None)
    path = config.source or cfg.config_path()
    lines = []
    if config.grants_journal:
        lines += [
            f"grants-journal {config.grants_journal}",
            f"denied-journal {denials_path(config.grants_journal)}",
        ]
    lines += [
        f"compiled {cfg.compiled_path(path)}",
        f"runtimes {cfg.runtimes_path(path)}",
        f"annotation-prefixes {cfg.prefixes_path(path)}",
        f"plan {cfg.plan_path(path)}",
        f"source-link {cfg.source_link_path(path)}",
        f"cdi-index {cfg.cdi_index_path(path)}",
        f"default-runtime-mark {cfg.default_mark_path(path)}",
    ]
    click.echo("\n".join(lines))


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

        click.echo(json.dumps({"source": config.source, "config": config.to_mapping()}, indent=2))
        return
    import yaml

    # without a file, name the one looked for: $NVSHIM_CONFIG may name one that is not there
    where = config.source or f"built-in defaults (no config {config_path()})"
    click.echo(f"# effective config from {where}")
    click.echo(yaml.safe_dump(config.to_mapping(), sort_keys=False).rstrip())
