"""``nvshim runtime configure``: register nvshim-runtime as a containerd runtime handler.

A thin shell over :mod:`nvshim.containerd`: it turns flags into one call, prints the
files (``--dry-run``) or a one-line summary to stderr, and lets :class:`NvshimError`
propagate to the ``nvshim`` entry point, which prints ``nvshim: <message>`` and exits 1.
"""

from __future__ import annotations

from typing import Iterable, Optional

import click

from nvshim import containerd
from nvshim.errors import UsageError

__all__ = ["runtime", "configure_command"]

_SET_AS_DEFAULT_HELP = (
    "Also make the handler containerd's default runtime "
    "(<cri>.containerd.default_runtime_name). Pitfall: every pod without a RuntimeClass, "
    "GPU request or not, then runs through nvshim, and CUDA images set "
    "NVIDIA_VISIBLE_DEVICES=all, which would give such pods every GPU on the node. "
    "Refused unless nvshim's config has require-allocation: true, or --force is given."
)


def _require_allocation() -> bool:
    """nvshim's ``require-allocation`` setting; ``False`` where the config module lacks it."""
    try:
        from nvshim.config import load_config
    except ImportError:
        return False
    return bool(getattr(load_config(), "require_allocation", False))


def _warn(lines: Iterable[str]) -> None:
    for line in lines:
        click.echo(f"nvshim: warning: {line}", err=True)


def _print_files(files: Iterable[containerd.FileChange]) -> None:
    for change in files:
        if change.after is None:
            click.echo(f"# --- {change.path} (removed) ---")
            continue
        click.echo(f"# --- {change.path} ---")
        click.echo(change.after, nl=not change.after.endswith("\n"))


def _join(paths: Iterable[str]) -> str:
    return ", ".join(paths)


@click.group("runtime")
def runtime() -> None:
    """Register nvshim-runtime with a container engine."""


@runtime.command("configure")
@click.option(
    "--runtime",
    "engine",
    type=click.Choice(["containerd"]),
    default="containerd",
    show_default=True,
    help="Container engine whose config to edit.",
)
@click.option(
    "--config",
    "config_path",
    default=containerd.DEFAULT_CONFIG,
    show_default=True,
    type=click.Path(dir_okay=False),
    help="containerd's main config file (created if missing).",
)
@click.option(
    "--drop-in",
    default=None,
    type=click.Path(dir_okay=False),
    help=(
        f"Drop-in file for the handler, imported from the main file "
        f"[default: {containerd.DEFAULT_DROP_IN}]. It holds a copy of the main file's whole "
        'CRI table, as containerd < 2.1 replaces plugin tables from imports. --drop-in "" '
        "edits the main file in place; version 1 configs are always edited in place."
    ),
)
@click.option(
    "--name",
    default=containerd.DEFAULT_NAME,
    show_default=True,
    help="Runtime handler name; a RuntimeClass's handler must equal it.",
)
@click.option(
    "--binary",
    default=containerd.DEFAULT_BINARY,
    show_default=True,
    help="Absolute path of nvshim-runtime, written to the handler's options.BinaryName.",
)
@click.option("--set-as-default", is_flag=True, help=_SET_AS_DEFAULT_HELP)
@click.option(
    "--force",
    is_flag=True,
    help="With --set-as-default: proceed although require-allocation is off (warns).",
)
@click.option(
    "--enable-cdi",
    is_flag=True,
    help=(
        "Turn on containerd's own CDI support: <cri>.enable_cdi = true, and cdi_spec_dirs = "
        '["/etc/cdi", "/var/run/cdi"] unless set.'
    ),
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the resulting files to stdout, each after a '# --- <path> ---' line; write nothing.",
)
@click.option(
    "--revert",
    is_flag=True,
    help=(
        "Undo an earlier configure: restore the original bytes saved in "
        f"<config>{containerd.BACKUP_SUFFIX} and remove the drop-in; without that backup, "
        "remove only the handler, its default_runtime_name, its import and drop-in."
    ),
)
@click.pass_context
def configure_command(
    ctx: click.Context,
    engine: str,
    config_path: str,
    drop_in: Optional[str],
    name: str,
    binary: str,
    set_as_default: bool,
    force: bool,
    enable_cdi: bool,
    dry_run: bool,
    revert: bool,
) -> None:
    """Add an nvshim runtime handler to containerd's config, or take it out (--revert).

    The handler copies the runc handler's options (SystemdCgroup, Root, ...), sets
    options.BinaryName to nvshim-runtime and passes cdi.k8s.io/* annotations through.
    Comments and layout of the files are kept; every write is atomic. Restart containerd
    afterwards.
    """
    if revert:
        conflicting = [
            flag
            for flag, param in (
                ("--set-as-default", "set_as_default"),
                ("--force", "force"),
                ("--enable-cdi", "enable_cdi"),
                ("--binary", "binary"),
            )
            if ctx.get_parameter_source(param) is not click.core.ParameterSource.DEFAULT
        ]
        if conflicting:
            raise UsageError(
                f"--revert cannot be combined with {_join(conflicting)}: it takes only "
                "--config, --drop-in, --name and --dry-run"
            )
        result = containerd.revert(config_path, name=name, drop_in=drop_in, dry_run=dry_run)
        _warn(result.warnings)
        if dry_run:
            _print_files(result.files)
            click.echo("dry run: nothing written", err=True)
            return
        done = []
        if result.restored:
            done.append("restored " + _join(result.restored))
        if result.edited:
            done.append("edited " + _join(result.edited))
        if result.removed:
            done.append("removed " + _join(result.removed))
        if done:
            click.echo("; ".join(done) + "; restart containerd to drop the runtime", err=True)
        else:
            click.echo(f'nothing to revert in {config_path}', err=True)
        return

    require_allocation = _require_allocation() if set_as_default else False
    result_c = containerd.configure(
        config_path,
        name=name,
        binary=binary,
        drop_in=drop_in,
        set_as_default=set_as_default,
        force=force,
        enable_cdi=enable_cdi,
        require_allocation=require_allocation,
        dry_run=dry_run,
    )
    _warn(result_c.warnings)
    if dry_run:
        _print_files(result_c.files)
        click.echo("dry run: nothing written", err=True)
    elif result_c.written:
        click.echo(
            f'wrote {_join(result_c.written)}; restart containerd to use runtime "{name}"',
            err=True,
        )
    else:
        click.echo(
            f'{result_c.handler_file} already has runtime "{name}"; nothing written', err=True
        )
