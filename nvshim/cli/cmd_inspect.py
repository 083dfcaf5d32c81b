"""``nvshim inspect``: what nvshim-runtime would do to a bundle, without writing anything."""

from __future__ import annotations

import json
import os
from typing import Optional

import click

from nvshim.cli.options import FORMAT
from nvshim.config import DEFAULT_CONFIG_PATH

__all__ = ["inspect"]


# --- inspect ------------------------------------------------------------------------------


@click.command()
@click.option(
    "--bundle",
    "-b",
    "bundle",
    default=".",
    show_default=True,
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="OCI bundle directory (holds config.json).",
)
@click.option(
    "--driver-root",
    default=None,
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Driver root to discover GPUs under (default: from config).",
)
@click.option(
    "--dev-root",
    default=None,
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Where /dev/nvidia* live (default: driver root).",
)
@click.option(
    "--config",
    "config_file",
    default=None,
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help=f"nvshim config file (default: $NVSHIM_CONFIG or {DEFAULT_CONFIG_PATH}).",
)
@click.option(
    "--no-diff",
    "no_diff",
    is_flag=True,
    help="Leave out the unified diff of config.json (text and JSON).",
)
@FORMAT
def inspect(
    bundle: str,
    driver_root: Optional[str],
    dev_root: Optional[str],
    config_file: Optional[str],
    no_diff: bool,
    fmt: str,
) -> None:
    """Show what nvshim-runtime would do to a bundle, without writing anything.

    First a summary: where the request came from, the GPUs granted (index and UUID), the
    capabilities, how many device nodes, mounts and hooks are added, who makes the SONAME
    links and ld.so.cache (nvshim-runtime before runc, or the createContainer hook, and
    why), where the node plan came from, warnings and notes. Then the details (one line
    per hook, no script bodies), then a unified diff of config.json (--no-diff leaves it
    out). Exits 1 with the runtime's error line when the runtime would fail.

    A live bundle, whose config.json nvshim-runtime already rewrote (it carries the
    nvshim.io/rewritten annotation), is not planned again: inspect says so and shows the
    grant journal's and the denial journal's latest records for the bundle (what was
    granted, or stripped or refused and why), the device nodes config.json holds, and
    which path served the create: the node agent's fast path or nvshim-runtime's own Python.
    """
    from nvshim._record import replace
    from nvshim.config import load_config
    from nvshim.node.inspection import plan_diff, plan_summary, render_text
    from nvshim.runtime.create import plan_create

    config = load_config(config_file, required=config_file is not None)
    if driver_root is not None:
        config = replace(config, driver_root=driver_root, dev_root=dev_root)
    elif dev_root is not None:
        config = replace(config, dev_root=dev_root)
    from nvshim.node.inspection import live_summary, render_live, rewritten_mark
    from nvshim.runtime.specjson import read_spec

    spec_path, _, spec = read_spec(os.path.abspath(bundle))
    mark = rewritten_mark(spec)
    if mark is not None:  # a live bundle: its spec is nvshim's output, not the engine's
        live = live_summary(spec_path, spec, mark, config)
        click.echo(json.dumps(live, indent=2) if fmt == "json" else render_live(live))
        return
    plan = plan_create(os.path.abspath(bundle), config)
    diff = "" if no_diff else plan_diff(plan)
    if fmt == "json":
        summary = plan_summary(plan, config)
        if not no_diff:
            summary["diff"] = diff
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(render_text(plan, config))
    if diff:
        click.echo()
        click.echo(diff, nl=False)
