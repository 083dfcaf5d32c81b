"""``nvshim runtime configure``: register nvshim-runtime with containerd, Docker or CRI-O;
``nvshim runtime restart``: restart containerd and wait until it answers
(:mod:`nvshim.node.engines.restart`).

A thin shell over the engine interface :mod:`nvshim.node.engines.api` (containerd, Docker,
CRI-O alike, no per-engine branch here): it turns flags into one call,
prints the files (``--dry-run``, with where each goes on stderr) or a one-line summary to
stderr (both dropped by ``nvshim --quiet``; warnings never are), or with ``--format json``
one document saying what is (or would be) written where, and lets :class:`NvshimError`
propagate to the ``nvshim`` entry point, which prints ``nvshim: <message>`` and exits 1.

Why one module: it is the click shell of `nvshim runtime`; most of its lines are configure's
options and help, and the checks that must run in the order the flags are read (require-allocation,
the default-runtime guard, revert on refusal). The engine work is in
nvshim.node.engines.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import click

from nvshim._record import replace
from nvshim.cli.options import FORMAT
from nvshim.cli.output import info
from nvshim.errors import UsageError
from nvshim.node.engines import api as engines
from nvshim.node.engines import containerd, crio, docker
from nvshim.node.engines import restart as engine_restart
from nvshim.node.engines.files import (
    BACKUP_SUFFIX,
    ConfigureOutcome,
    FileChange,
    backup_path,
    default_runtime_guard,
)

__all__ = ["runtime", "configure_command", "restart_command"]

_SET_AS_DEFAULT_HELP = (
    "Also make it the engine's default runtime (containerd: "
    "<cri>.containerd.default_runtime_name; Docker: default-runtime; CRI-O: "
    "crio.runtime.default_runtime). Pitfall: every container without an explicit runtime, "
    "GPU request or not, then runs through nvshim, and CUDA images set "
    "NVIDIA_VISIBLE_DEVICES=all, which would give them every GPU on the node. "
    "Refused unless nvshim's config has require-allocation: true, or --force is given."
)


def _require_allocation(binary: str) -> Tuple[bool, str]:
    """The ``require-allocation`` setting of the config the runtime ``binary`` will read, and
    that config's path: the one an installed trampoline embeds, or a wrapper's
    ``NVSHIM_CONFIG`` (:func:`nvshim.node.doctor.follow.follow`); when the binary does not
    say, ``$NVSHIM_CONFIG`` or the default. A broken config is a ConfigError; a named one that
    is missing too (the runtime fails every create without it)."""
    from nvshim.config import config_path, load_config
    from nvshim.node.doctor.follow import follow

    followed = follow(binary, None, binary)
    path = followed.config if followed.kind == "nvshim" and followed.config else config_path()
    named = followed.named if followed.config else bool(os.environ.get("NVSHIM_CONFIG"))
    return load_config(path, required=named).require_allocation, path


def _warn(lines: Iterable[str]) -> None:
    for line in lines:
        click.echo(f"nvshim: warning: {line}", err=True)


def _print_files(files: Iterable[FileChange]) -> None:
    for change in files:
        if change.after is None:
            click.echo(f"# --- {change.path} (removed) ---")
            continue
        click.echo(f"# --- {change.path} ---")
        click.echo(change.after, nl=not change.after.endswith("\n"))


def _join(paths: Iterable[str]) -> str:
    return ", ".join(paths)


def _action(change: FileChange) -> str:
    if change.before == change.after:
        return "unchanged"
    if change.before is None:
        return "create"
    return "remove" if change.after is None else "modify"


def _file_rows(
    files: Sequence[FileChange],
    config_path: str,
    backup_file: str,
    backup_action: Optional[str],
    saved: bool,
) -> List[Dict[str, Any]]:
    """One row per file touched: ``path``, ``role`` (config, drop-in, backup), ``action``
    (create, modify, remove, unchanged), ``backup`` (the file that keeps its original bytes:
    ``saved`` for configure, where they go; else where a revert took them from) and
    ``content`` (the text written; null for a removal and for the backup itself)."""
    rows: List[Dict[str, Any]] = []
    for change in files:
        action = _action(change)
        rows.append(
            {
                "path": change.path,
                "role": (
                    "config"
                    if change.path == config_path
                    else "hook"
                    if os.path.basename(change.path) == docker.GPUS_HOOK
                    else "drop-in"
                ),
                "action": action,
                "backup": backup_file if saved and action != "unchanged" else None,
                "content": change.after,
            }
        )
    if backup_action is not None:
        rows.append(
            {
                "path": backup_file,
                "role": "backup",
                "action": backup_action,
                "backup": None,
                "content": None,
            }
        )
    return rows


_ROLE_TEXT = {
    "config": "main config",
    "drop-in": "drop-in",
    "hook": "nvshim's stand-in for docker run --gpus",
    "backup": "backup of the originals, for --revert",
}


def _print_plan(rows: Iterable[Dict[str, Any]]) -> None:
    """The ``--dry-run`` summary on stderr: what a real run would do to which path."""
    info("dry run: nothing written; a real run would:")
    for row in rows:
        role = _ROLE_TEXT[row["role"]]
        if row["role"] == "backup" and row["action"] == "remove":
            role = "backup, no longer needed"
        info(f"  {row['action']:<9} {row['path']} ({role})")


def _emit_json(document: Dict[str, Any]) -> None:
    click.echo(json.dumps(document, indent=2))


@click.group("runtime")
def runtime() -> None:
    """Register nvshim-runtime with a container engine."""


@runtime.command("configure")
@click.option(
    "--runtime",
    "engine",
    type=click.Choice(list(engines.ENGINES)),
    default="containerd",
    show_default=True,
    help="Container engine whose config to edit.",
)
@click.option(
    "--config",
    "config_path",
    default=None,
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help=(
        "The engine's main config file [default: containerd "
        f"{containerd.DEFAULT_CONFIG}, docker {docker.DEFAULT_CONFIG}, crio "
        f"{crio.DEFAULT_CONFIG}]. containerd's and Docker's are created if missing; "
        "CRI-O's is only read (runc's handler settings). The backup "
        f"FILE{BACKUP_SUFFIX} and, without --drop-in, the drop-in go beside it."
    ),
)
@click.option(
    "--drop-in",
    default=None,
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help=(
        "containerd and CRI-O: the drop-in file for the handler [default: beside --config: "
        f"containerd <dir>/conf.d/{containerd.DROP_IN_NAME}, so "
        f"{containerd.DEFAULT_DROP_IN}; crio <dir>/crio.conf.d/99-nvshim.toml, so "
        f"{crio.DEFAULT_DROP_IN}]. containerd's is "
        "imported from the main file and holds a copy of its whole CRI table, as containerd "
        '< 2.1 replaces plugin tables from imports; --drop-in "" edits the main file in '
        "place (version 1 configs always are). Docker has no drop-ins."
    ),
)
@click.option(
    "--name",
    default=containerd.DEFAULT_NAME,
    metavar="NAME",
    show_default=True,
    help=(
        "Runtime name (containerd/CRI-O: the handler a RuntimeClass names; docker: "
        "docker run --runtime NAME). Not the name of the engine's default runtime (runc, "
        "CRI-O's crun, or what the config makes default) unless with --set-as-default: "
        "every container would run nvshim. Docker reserves runc."
    ),
)
@click.option(
    "--binary",
    default=containerd.DEFAULT_BINARY,
    metavar="FILE",
    type=click.Path(dir_okay=False),
    show_default=True,
    help=(
        "Absolute path of nvshim-runtime (containerd: options.BinaryName; docker: "
        "runtimes.<name>.path; CRI-O: runtime_path)."
    ),
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
        "Turn on the engine's own CDI support. containerd: <cri>.enable_cdi = true, and "
        "cdi_spec_dirs = [" + ", ".join(f'"{d}"' for d in containerd.CDI_SPEC_DIRS) + "] "
        "unless set; docker: features.cdi = true "
        "(Docker 25 and later). CRI-O reads CDI specs without a switch. The engine then "
        "injects the devices cdi.k8s.io annotations name itself, and nvshim counts them as "
        "an engine grant: containerd's handler is then not passed cdi.k8s.io/* (nor where "
        "its CDI is already on, or a version 3 config leaves enable_cdi unset); elsewhere "
        "drop cdi-annotations from nvshim's allocation-sources (or cdi.k8s.io/ from "
        "annotation-prefixes) so nvshim does not inject them again (nvshim doctor's "
        "cdi-injection check)."
    ),
)
@click.option(
    "--pod-cdi-annotations",
    is_flag=True,
    help=(
        "containerd: also pass the pod's cdi.k8s.io/* annotations (pod_annotations). Off: "
        "anyone who can create a pod can write them, and nvshim cannot tell them from the "
        "device plugin's; with require-allocation use verify-with: kubelet if you turn this on."
    ),
)
@click.option(
    "--dry-run",
    is_flag=True,
    help=(
        "Print the resulting files to stdout, each after a '# --- <path> ---' line, and "
        "on stderr what a real run would do to each path (main config, drop-in, backup); "
        "write nothing."
    ),
)
@click.option(
    "--revert",
    is_flag=True,
    help=(
        "Undo an earlier configure: restore the original bytes saved in "
        f"<config>{BACKUP_SUFFIX} (and remove a drop-in that did not exist); without that "
        "backup, remove only nvshim's runtime, a default naming it, and its drop-in. While "
        "other runtimes configured into the same files remain (--name), only runtime NAME "
        "is taken out and the backup stays for them."
    ),
)
@FORMAT
@click.pass_context
@click.option(
    "--enable-nri",
    is_flag=True,
    help=(
        'containerd 1.7 (config version 2): turn on NRI ([plugins."io.containerd.nri.v1.nri"] '
        "disable = false), which nvshim agent's NRI plugin needs (docs/nri.md); containerd "
        "2.x runs NRI by default and nothing changes. Reverted with the handler."
    ),
)
def configure_command(
    ctx: click.Context,
    engine: str,
    config_path: Optional[str],
    drop_in: Optional[str],
    name: str,
    binary: str,
    set_as_default: bool,
    force: bool,
    enable_cdi: bool,
    pod_cdi_annotations: bool,
    enable_nri: bool,
    dry_run: bool,
    revert: bool,
    fmt: str,
) -> None:
    """Add an nvshim runtime to containerd's, Docker's or CRI-O's config, or take it out.

    containerd: a handler copying the runc handler's options (SystemdCgroup, Root, ...),
    options.BinaryName = nvshim-runtime, the container's cdi.k8s.io/* annotations (the
    device plugin's) passed through where containerd's own CDI is off (on, containerd
    injects those devices and nvshim counts them as an engine grant); the pod's only with
    --pod-cdi-annotations.
    Docker: runtimes.<name>.path in daemon.json, other keys and their order kept
    (docker run --runtime nvshim), and, unless dockerd's search path has one already
    (NVIDIA's is kept), nvshim's nvidia-container-runtime-hook beside --binary, which lets
    dockerd offer docker run --gpus (nvshim-runtime removes it from the containers it runs;
    it fails the others in one line). CRI-O: [crio.runtime.runtimes.<name>] in a drop-in,
    runtime_type "oci" with runc's runtime_root and monitor (conmon) settings.
    Comments and layout are kept where the format allows; every write is atomic and the
    original bytes are saved for --revert. Restart the engine afterwards.

    Runtimes of other names that nvshim configured into the same file stay: configure
    with a second --name adds it beside the first (the summary names the ones kept), and
    --revert --name takes out that one only. Every file goes beside --config: the drop-in
    unless --drop-in names another, and the backup always (which records the runtimes
    written, so nvshim doctor notices one the engine no longer loads).

    --format json prints one object instead of the text: {engine, operation, dry_run,
    config, name, files: [{path, role, action, backup, content}], written, warnings};
    role is config, drop-in, hook (Docker's --gpus) or backup; action is create, modify,
    remove or unchanged; backup is the file that keeps (or gave back) the original bytes.
    """
    chosen = engines.engine(engine)
    if config_path is None:
        config_path = chosen.default_config
    target = _Target(engine, os.path.abspath(config_path), name, dry_run, fmt == "json")
    options = engines.ConfigureOptions(
        name=name,
        binary=binary,
        drop_in=drop_in,
        set_as_default=set_as_default,
        force=force,
        enable_cdi=enable_cdi,
        pod_cdi_annotations=pod_cdi_annotations,
        enable_nri=enable_nri,
        dry_run=dry_run,
    )
    chosen.check(options)
    if revert:
        _refuse_with_revert(ctx)
        _revert(chosen, target, drop_in)
    else:
        _configure(chosen, target, options)


#: The configure flags --revert refuses: (flag, its parameter).
_CONFIGURE_ONLY = (
    ("--set-as-default", "set_as_default"),
    ("--force", "force"),
    ("--enable-cdi", "enable_cdi"),
    ("--pod-cdi-annotations", "pod_cdi_annotations"),
    ("--enable-nri", "enable_nri"),
    ("--binary", "binary"),
)


def _refuse_with_revert(ctx: click.Context) -> None:
    """A UsageError naming the configure-only flags given with ``--revert``."""
    conflicting = [
        flag
        for flag, param in _CONFIGURE_ONLY
        if ctx.get_parameter_source(param) is not click.core.ParameterSource.DEFAULT
    ]
    if conflicting:
        raise UsageError(
            f"--revert cannot be combined with {_join(conflicting)}: it takes only "
            "--runtime, --config, --drop-in, --name, --dry-run and --format"
        )


@dataclass(frozen=True)
class _Target:
    """What one configure or revert is about, and how its result is shown."""

    engine: str
    config_path: str
    name: str
    dry_run: bool
    as_json: bool

    @property
    def backup_file(self) -> str:
        return backup_path(self.config_path)

    @property
    def quiet(self) -> bool:
        """Nothing more to say after :meth:`report`: a dry run or a JSON document."""
        return self.dry_run or self.as_json

    def report(
        self,
        operation: str,
        files: Sequence[FileChange],
        warnings: Sequence[str],
        backup_action: Optional[str],
        saved: bool,
        written: Sequence[str],
    ) -> None:
        """The JSON document, or the warnings and (dry run) the files and the plan."""
        rows = _file_rows(files, self.config_path, self.backup_file, backup_action, saved)
        if self.as_json:
            _emit_json(
                {
                    "engine": self.engine,
                    "operation": operation,
                    "dry_run": self.dry_run,
                    "config": self.config_path,
                    "name": self.name,
                    "files": rows,
                    "written": list(written),
                    "warnings": list(warnings),
                }
            )
        else:
            _warn(warnings)
            if self.dry_run:
                _print_files(files)
                _print_plan(rows)


def _revert(chosen: engines.Engine, target: _Target, drop_in: Optional[str]) -> None:
    """Take runtime ``target.name`` out, report it, and say in one line what changed."""
    result = chosen.revert(
        target.config_path, name=target.name, drop_in=drop_in, dry_run=target.dry_run
    )
    written = () if target.dry_run else result.restored + result.edited + result.removed
    target.report(
        "revert",
        result.files,
        result.warnings,
        "remove" if result.used_backup and not result.kept_backup else None,
        result.used_backup,
        written,
    )
    if target.quiet:
        return
    done = []
    if result.restored:
        done.append("restored " + _join(result.restored))
    if result.edited:
        done.append("edited " + _join(result.edited))
    if result.removed:
        done.append("removed " + _join(result.removed))
    if done:
        info("; ".join(done) + f"; restart {chosen.process} to drop the runtime")
    else:
        info(f"nothing to revert in {target.config_path}")


def _configure(chosen: engines.Engine, target: _Target, options: engines.ConfigureOptions) -> None:
    """Add the runtime (a default only past the require-allocation guard), report it, and
    say in one line what was written."""
    if options.set_as_default:
        options = _guard_default(options)
    backup_existed = os.path.lexists(target.backup_file)
    outcome = chosen.configure(target.config_path, options)
    changed = any(change.changed for change in outcome.files)
    backup_action = None
    if changed:  # for a real run: as it was before the write
        backup_action = "modify" if backup_existed else "create"
    target.report(
        "configure", outcome.files, outcome.warnings, backup_action, True, outcome.written
    )
    if not target.quiet:
        info(_configured(chosen, outcome, target.name))


def _guard_default(options: engines.ConfigureOptions) -> engines.ConfigureOptions:
    """``options`` with the runtime's require-allocation; without ``--force`` a default
    runtime is refused here when it is off, naming the config the runtime reads."""
    require_allocation, read = _require_allocation(options.binary)
    if not options.force:
        default_runtime_guard(
            options.name,
            True,
            False,
            require_allocation,
            f"{read}, the config {options.binary} reads",
        )
    return replace(options, require_allocation=require_allocation)


def _configured(chosen: engines.Engine, outcome: ConfigureOutcome, name: str) -> str:
    """The summary line of a real configure: what was written (or that nothing was), and
    the runtimes configured before that the file still holds."""
    others = [other for other in outcome.handlers if other != name]
    holding = ""
    if others:  # say that the runtimes configured before are still there
        listed = ", ".join(f'"{n}"' for n in others)
        noun = "runtimes" if len(others) > 1 else "runtime"
        holding = f" ({outcome.handler_file} also keeps {noun} {listed})"
    if outcome.written:
        return (
            f"wrote {_join(outcome.written)}{holding}; "
            f'{chosen.restart_hint(outcome.written)} to use runtime "{name}"'
        )
    return f'{outcome.handler_file} already has runtime "{name}"{holding}; nothing written'


@runtime.command("restart")
@click.option(
    "--runtime",
    "engine",
    type=click.Choice(["containerd"]),
    default="containerd",
    show_default=True,
    help="Engine to restart (containerd only: Docker and CRI-O are restarted with systemctl).",
)
@click.option(
    "--mode",
    type=click.Choice(["systemd", "signal", "none"]),
    default="systemd",
    show_default=True,
    help=(
        "systemd: systemctl restart UNIT. signal: send --signal to the process that owns "
        "--socket; its supervisor must start containerd again. none: restart nothing "
        "(the operator does)."
    ),
)
@click.option(
    "--unit",
    default="containerd",
    show_default=True,
    metavar="UNIT",
    help="The systemd unit for --mode systemd (k3s: k3s or k3s-agent; RKE2: "
    "rke2-server or rke2-agent; microk8s: snap.microk8s.daemon-containerd).",
)
@click.option(
    "--socket",
    "socket_path",
    default=engine_restart.DEFAULT_SOCKET,
    show_default=True,
    metavar="PATH",
    help="containerd's gRPC socket.",
)
@click.option(
    "--signal",
    "signal_name",
    default="SIGHUP",
    show_default=True,
    metavar="SIG",
    help="The signal for --mode signal (containerd exits on SIGHUP and SIGTERM).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.5),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for the socket to answer again.",
)
@click.option(
    "--check",
    is_flag=True,
    help="Restart nothing: only check that containerd answers on --socket now "
    "(fails, naming the socket, when it does not).",
)
def restart_command(
    engine: str,
    mode: str,
    unit: str,
    socket_path: str,
    signal_name: str,
    timeout: float,
    check: bool,
) -> None:
    """Restart containerd so it loads its changed config; wait until its socket answers.

    After --mode systemd or signal, containerd's own Version call must answer on --socket
    within --timeout seconds, or the command fails with one line naming the socket
    (install.sh then puts the previous config back). Prints one line on stderr.
    """
    del engine  # one choice today; the option keeps the command line like configure's
    if check:
        engine_restart.parse_signal(signal_name)
        info(engine_restart.check_answers(socket_path))
        return
    info(
        engine_restart.restart_containerd(
            mode, socket_path, unit=unit, signal_name=signal_name, timeout=timeout
        )
    )
