"""``nvshim cdi …``: list resolvable CDI devices and validate spec files.

The group is exported as :data:`cdi`; other commands (``generate``) attach to it with
``@cdi.command()``. Output rules: results on stdout, warnings and summaries on stderr.
"""

from __future__ import annotations

from typing import Tuple

import click

from nvshim import cdi as cdi_specs

__all__ = ["cdi"]


@click.group(name="cdi")
def cdi() -> None:
    """Work with CDI (Container Device Interface) spec files."""


@cdi.command(name="list")
@click.option(
    "--spec-dir",
    "spec_dirs",
    multiple=True,
    metavar="DIR",
    help="Directory to scan, lowest priority first (repeatable). "
    "Default: the config's cdi-spec-dirs "
    f"({', '.join(cdi_specs.DEFAULT_SPEC_DIRS)} unless configured).",
)
def list_devices(spec_dirs: Tuple[str, ...]) -> None:
    """Print every resolvable qualified device name, one per line.

    Files that fail to load and conflicting devices are reported on stderr as
    warnings; they do not change the exit status.
    """
    if not spec_dirs:
        from nvshim.config import load_config

        # the directories the runtime resolves CDI names from, so the list matches it
        spec_dirs = load_config().cdi_spec_dirs
    registry = cdi_specs.load_registry(spec_dirs)
    for problem in registry.problems:
        click.echo(f"warning: {problem}", err=True)
    for name in registry.names():
        click.echo(name)


@cdi.command()
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
def validate(files: Tuple[str, ...]) -> None:
    """Check CDI spec files against the schema and CDI's rules.

    Prints one line per problem (`<file>: <json path>: <message>`) and a summary on
    stderr; exits 1 if any file has a problem.
    """
    total = 0
    for path in files:
        for problem in cdi_specs.validate_file(path):
            click.echo(str(problem))
            total += 1
    click.echo(
        f"{len(files)} file{'s' if len(files) != 1 else ''}, "
        f"{total} problem{'s' if total != 1 else ''}",
        err=True,
    )
    if total:
        click.get_current_context().exit(1)
