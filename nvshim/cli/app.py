"""The click application behind ``nvshim``: the group, ``sim``, ``demo``, ``completion``,
``hook`` and ``params-hook``, and the other commands loaded on demand (one module each).

:func:`nvshim.cli.main.main` imports this module only for the forms
:mod:`nvshim.cli.fast` does not serve: click and the command modules cost several times the
interpreter's own start (docs/benchmarks-history.md, "The CLI"), so a command loads only
its own module.
"""

from __future__ import annotations

import importlib
import sys
from typing import Dict, List, Optional, Tuple

import click

from nvshim import __version__
from nvshim.cli.fast import COMPLETE_VAR
from nvshim.cli.output import Output, settings
from nvshim.cli.report import fail, internal_error
from nvshim.errors import NvshimError

#: The commands in a module of their own: name -> (module, attribute). A run loads only the
#: one it names; the group's help (which lists them all) loads every one.
LAZY_COMMANDS: Dict[str, Tuple[str, str]] = {
    "agent": ("nvshim.cli.cmd_agent", "agent"),
    "cdi": ("nvshim.cli.cmd_cdi", "cdi"),
    "config": ("nvshim.cli.cmd_config", "config_group"),
    "doctor": ("nvshim.cli.cmd_doctor", "doctor"),
    "grants": ("nvshim.cli.cmd_grants", "grants"),
    "inspect": ("nvshim.cli.cmd_inspect", "inspect"),
    "runtime": ("nvshim.cli.cmd_runtime", "runtime"),
    "system": ("nvshim.cli.cmd_system", "system"),
}


class _LazyGroup(click.Group):
    """A group whose :data:`LAZY_COMMANDS` are imported when first looked up."""

    def list_commands(self, ctx: click.Context) -> List[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        if cmd_name in LAZY_COMMANDS and cmd_name not in self.commands:
            module, attr = LAZY_COMMANDS[cmd_name]
            self.add_command(getattr(importlib.import_module(module), attr), cmd_name)
        return super().get_command(ctx, cmd_name)


__all__ = ["cli", "run"]


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-q",
    "--quiet",
    is_flag=True,
    help="No informational lines on stderr (wrote …, notes); errors and warnings still print.",
)
@click.option(
    "--debug",
    is_flag=True,
    help="On a failure, print the Python traceback before the one error line.",
)
@click.version_option(__version__, prog_name="nvshim")
@click.pass_context
def cli(ctx: click.Context, quiet: bool, debug: bool) -> None:
    """nvshim: give containers NVIDIA GPUs, readably.

    nvshim-runtime is the OCI runtime (set it as containerd's BinaryName); this
    command inspects what it would do, manages CDI specs, configures containerd and
    diagnoses a node.
    """
    out = ctx.ensure_object(Output)
    out.quiet, out.debug = quiet, debug


# --- sim ----------------------------------------------------------------------------------


@cli.group()
def sim() -> None:
    """Simulated GPU nodes for tests and demos (no GPU needed; needs root for mknod)."""


@sim.command("create")
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False))
@click.option(
    "--gpus",
    default=2,
    show_default=True,
    type=click.IntRange(0, 1024),
    help="Number of GPUs, 0-1024 (a real driver handles up to 32; more are for scale tests).",
)
@click.option(
    "--driver-version", default="550.54.15", show_default=True, help="Driver version to simulate."
)
@click.option(
    "--shuffle-minors", is_flag=True, help="Device minors not in PCI order (as on real nodes)."
)
@click.option("--mig", is_flag=True, help="Make GPU 0 MIG-enabled with two MIG devices.")
@click.option(
    "--dev-root",
    default=None,
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Create the /dev nodes under this DIR, not in the node's DIR.",
)
@click.option(
    "--imex-channels",
    default=0,
    show_default=True,
    type=click.IntRange(0, 2048),
    help="IMEX channel nodes /dev/nvidia-caps-imex-channels/channel0..N-1.",
)
@click.option(
    "--nvswitches",
    default=0,
    show_default=True,
    type=click.IntRange(0, 64),
    help="NVSwitch nodes (nvidia-nvswitchctl, nvidia-nvswitch0..N-1) and the "
    "fabric manager socket.",
)
@click.option(
    "--gds", is_flag=True, help="GPUDirect Storage: /dev/nvidia-fs0..3, /etc/cufile.json."
)
@click.option("--mofed", is_flag=True, help="MOFED: /dev/infiniband/{uverbs0,umad0,issm0,rdma_cm}.")
@click.option("--gdrcopy", is_flag=True, help="gdrcopy: /dev/gdrdrv.")
@click.option(
    "--no-driver-files",
    "no_driver_files",
    is_flag=True,
    help="Build only the kernel side (/dev nodes, /proc/devices, /proc/driver/nvidia "
    "with --driver-version as the kernel module's version): no driver libraries, "
    "ld.so.cache or ld.so.conf, programs or firmware, so that real driver "
    "user-space files (e.g. from Debian's packages) can be put under DIR.",
)
def sim_create(
    directory: str,
    gpus: int,
    driver_version: str,
    shuffle_minors: bool,
    mig: bool,
    dev_root: Optional[str],
    imex_channels: int,
    nvswitches: int,
    gds: bool,
    mofed: bool,
    gdrcopy: bool,
    no_driver_files: bool,
) -> None:
    """Build a driver root a real GPU host would have, in DIR.

    Device nodes (mknod), /proc/devices and /proc/driver/nvidia files, versioned driver
    libraries with SONAME links and an ld.so.cache, and a clearly labelled simulated
    nvidia-smi; optionally IMEX channels, NVSwitch, GDS, MOFED and gdrcopy devices.
    With --no-driver-files, only the kernel side: put real driver user space beside it.
    """
    from nvshim.sim.build import create_node

    node = create_node(
        directory,
        gpus=gpus,
        driver_version=driver_version,
        shuffle_minors=shuffle_minors,
        mig=mig,
        dev_root=dev_root,
        imex_channels=imex_channels,
        nvswitches=nvswitches,
        gds=gds,
        mofed=mofed,
        gdrcopy=gdrcopy,
        driver_files=not no_driver_files,
    )
    if settings().quiet:  # the node is the result; the listing is what it holds
        return
    side = "" if node.driver_files else ", kernel side only"
    click.echo(f"simulated node in {node.root} (driver {node.driver_version}{side}):")
    for g in node.gpus:
        click.echo(f"  GPU {g.index}: /dev/nvidia{g.minor}  {g.uuid}  {g.pci_bus_id}  {g.model}")
        for j, m in enumerate(g.mig):
            click.echo(f"    MIG {g.index}:{j}  gi {m.gi} ci {m.ci}  {m.uuid}  {m.profile}")
    if node.driver_files:
        from nvshim.sim.libnvml import compiled_library

        built = compiled_library()  # compiled once per process: create_node's build
        if isinstance(built, str):
            click.echo(f"its libnvidia-ml is a stub without NVML: {built}")
    click.echo(f"use it with config driver-root: {node.root} and nvml-facts: {node.nvml_facts}")


# --- demo ---------------------------------------------------------------------------------


@cli.command()
@click.option(
    "--keep", is_flag=True, help="Keep the temp dir (node, bundles) for a look afterwards."
)
def demo(keep: bool) -> None:
    """Run real containers through nvshim-runtime → runc on a simulated 4-GPU node.

    Builds the node and a busybox bundle in a temp dir, runs NVIDIA_VISIBLE_DEVICES=1,
    =0,2, =all and =void, shows what each container saw, and cleans up. Needs root,
    runc and busybox-static (install.sh installs them). With nvshim --quiet, only the
    last line, unless a container misbehaved or --keep is given.
    """
    from nvshim.node.demo import run_demo

    if not settings().quiet:
        failures = run_demo(click.echo, keep=keep)
    else:
        lines: List[str] = []
        failures = run_demo(lines.append, keep=keep)
        for line in lines if failures or keep else lines[-1:]:
            click.echo(line)
    if failures:
        sys.exit(1)


# --- completion ---------------------------------------------------------------------------


@cli.command()
@click.argument("shell", metavar="SHELL", type=click.Choice(["bash", "zsh", "fish"]))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the shell completion script for bash, zsh or fish.

    It completes commands, options and their choices; it runs `nvshim` (found on PATH)
    with _NVSHIM_COMPLETE set to ask what fits.

    \b
    Install it for your user, then open a new shell:
      bash  nvshim completion bash > ~/.local/share/bash-completion/completions/nvshim
            (needs bash-completion; for all users: /etc/bash_completion.d/nvshim)
      zsh   nvshim completion zsh > ~/.zfunc/_nvshim
            (in ~/.zshrc: fpath+=~/.zfunc before autoload -Uz compinit && compinit)
      fish  nvshim completion fish > ~/.config/fish/completions/nvshim.fish
    Or for the running shell only: eval "$(nvshim completion bash)" (zsh: after compinit).
    """
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    if cls is None:  # click.Choice lets only the shells click knows through
        raise click.BadParameter(f"no completion for {shell}", param_hint="SHELL")
    # the script `_NVSHIM_COMPLETE=bash_source nvshim` prints, ending in a line break
    source = cls(ctx.find_root().command, {}, "nvshim", COMPLETE_VAR).source()
    click.echo(source, nl=not source.endswith("\n"))


# --- hook ---------------------------------------------------------------------------------


class _HookCommand(click.Command):
    """A command whose ``--help`` is click's but whose arguments reach the callback as
    ``argv``, unparsed: ``nvshim hook``'s arguments are read by the hook's own parser, the
    one a runc-run hook meets, so both accept and refuse exactly the same."""

    def parse_args(self, ctx: click.Context, args: List[str]) -> List[str]:
        if any(a in ctx.help_option_names for a in args):  # as the hook's parser does
            click.echo(ctx.get_help(), color=ctx.color)
            ctx.exit()
        ctx.params["argv"] = list(args)
        return []


def _hook_options() -> List[click.Parameter]:
    """The hook's options, from its own table, for ``nvshim hook --help``."""
    from nvshim.runtime.hookargs import HOOK_OPTIONS

    return [
        click.Option(
            [flag],
            metavar=metavar,
            multiple=repeatable,
            is_flag=metavar is None,
            help=f"{text[0].upper()}{text[1:]}." + (" Repeatable." if repeatable else ""),
        )
        for flag, metavar, text, repeatable in HOOK_OPTIONS
    ]


@cli.command(cls=_HookCommand, params=_hook_options())
def hook(argv: List[str]) -> None:
    """Run the createContainer hook (SONAME links, ld.so.cache) — what runc calls.

    Makes the driver library symlinks and updates the ld.so.cache inside the container
    rootfs; for graphics, the /dev/dri/by-path links of the GPUs the container has and the
    EGL application profile naming them; reads the OCI state on stdin. The runtime adds it
    as `<python> -I -S -c …` (the nvshim.hook module); a CDI spec made with
    `nvshim cdi generate --hook-path PATH` runs it as `PATH hook …`. Same code, same
    arguments; errors are one `nvshim hook: …` line and exit 1.
    """
    from nvshim.hook import main as hook_main

    sys.exit(hook_main(argv))


@cli.command(
    "params-hook",
    cls=_HookCommand,
    params=[
        click.Option(
            ["--params"],
            metavar="PATH",
            help="The host's /proc/driver/nvidia/params (under the driver root).",
        )
    ],
)
def params_hook(argv: List[str]) -> None:
    """Run the createContainer hook that shows ModifyDeviceFiles: 0 — what runc calls.

    When the host's params say ModifyDeviceFiles: 1, binds a read-only copy saying 0 over
    the container's /proc/driver/nvidia/params (on a tmpfs of its own; nothing is written
    on the host or in the image); otherwise does nothing. Reads the OCI state on stdin.
    `nvshim cdi generate` puts it in every spec as `<python> -I -S -c …` (the
    nvshim.params_hook module), or as `PATH params-hook …` with --hook-path; nvshim-runtime
    does the same with its own copy instead. Errors are one line and exit 1.
    """
    from nvshim.params_hook import main as params_main

    sys.exit(params_main(argv))


_NO_COMMAND = getattr(click.exceptions, "NoArgsIsHelpError", None)


def run(argv: Optional[List[str]]) -> None:
    """``nvshim ARGV`` through click: one line on stderr and exit 1 for any nvshim failure."""
    out = Output()
    try:
        rc = cli.main(
            args=argv, prog_name="nvshim", complete_var=COMPLETE_VAR, standalone_mode=False, obj=out
        )
    except NvshimError as exc:
        fail(str(exc), exc, out.debug, exc.exit_code)
    except click.exceptions.Abort:
        click.echo("nvshim: aborted", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        if _NO_COMMAND is not None and isinstance(exc, _NO_COMMAND) and exc.ctx is not None:
            # a group run without a command: its help, as git and kubectl do (click >= 8.2
            # raises this where 8.1 printed the help itself)
            click.echo(exc.ctx.get_help(), color=exc.ctx.color)
            sys.exit(0)
        # one line, also where click lists choices on lines of their own
        message = " ".join(line.strip() for line in exc.format_message().splitlines())
        click.echo(f"nvshim: {message}", err=True)
        sys.exit(1 if exc.exit_code == 2 else exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # a bug in nvshim: still one line, the traceback on request
        internal_error(exc, out.debug)
    # with standalone_mode=False, click returns ctx.exit(N)'s code instead of exiting
    sys.exit(rc if isinstance(rc, int) else 0)
