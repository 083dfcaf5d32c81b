"""``nvshim``: inspect bundles, manage CDI specs, configure containerd, diagnose a node.

Every command reports failure the same way: one line ``nvshim: <what went wrong>`` on
stderr and exit code 1.
"""

from __future__ import annotations

import sys
from typing import List, Optional

import click

from nvshim import __version__
from nvshim.errors import NvshimError

__all__ = ["main", "cli"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nvshim")
def cli() -> None:
    """nvshim: give containers NVIDIA GPUs, readably.

    nvshim-runtime is the OCI runtime (set it as containerd's BinaryName); this
    command inspects what it would do, manages CDI specs, configures containerd and
    diagnoses a node.
    """


# --- sim ----------------------------------------------------------------------------------


@cli.group()
def sim() -> None:
    """Simulated GPU nodes for tests and demos (no GPU needed; needs root for mknod)."""


@sim.command("create")
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--gpus", default=2, show_default=True, type=click.IntRange(0, 1024),
              help="Number of GPUs, 0-1024 (a real driver handles up to 32; more are for scale "
                   "tests).")
@click.option("--driver-version", default="550.54.15", show_default=True,
              help="Driver version to simulate.")
@click.option("--shuffle-minors", is_flag=True,
              help="Device minors not in PCI order (as on real nodes).")
@click.option("--mig", is_flag=True, help="Make GPU 0 MIG-enabled with two MIG devices.")
@click.option("--dev-root", default=None, metavar="DIR", type=click.Path(file_okay=False),
              help="Create the /dev nodes under this DIR, not in the node's DIR.")
@click.option("--imex-channels", default=0, show_default=True, type=click.IntRange(0, 2048),
              help="IMEX channel nodes /dev/nvidia-caps-imex-channels/channel0..N-1.")
@click.option("--nvswitches", default=0, show_default=True, type=click.IntRange(0, 64),
              help="NVSwitch nodes (nvidia-nvswitchctl, nvidia-nvswitch0..N-1) and the "
                   "fabric manager socket.")
@click.option("--gds", is_flag=True,
              help="GPUDirect Storage: /dev/nvidia-fs0..3, /etc/cufile.json.")
@click.option("--mofed", is_flag=True, help="MOFED: /dev/infiniband/{uverbs0,umad0,issm0,rdma_cm}.")
@click.option("--gdrcopy", is_flag=True, help="gdrcopy: /dev/gdrdrv.")
@click.option("--no-driver-files", "no_driver_files", is_flag=True,
              help="Build only the kernel side (/dev nodes, /proc/devices, /proc/driver/nvidia "
                   "with --driver-version as the kernel module's version): no driver libraries, "
                   "ld.so.cache or ld.so.conf, programs or firmware, so that real driver "
                   "user-space files (e.g. from Debian's packages) can be put under DIR.")
def sim_create(directory: str, gpus: int, driver_version: str, shuffle_minors: bool,
               mig: bool, dev_root: Optional[str], imex_channels: int, nvswitches: int,
               gds: bool, mofed: bool, gdrcopy: bool, no_driver_files: bool) -> None:
    """Build a driver root a real GPU host would have, in DIR.

    Device nodes (mknod), /proc/devices and /proc/driver/nvidia files, versioned driver
    libraries with SONAME links and an ld.so.cache, and a clearly labelled simulated
    nvidia-smi; optionally IMEX channels, NVSwitch, GDS, MOFED and gdrcopy devices.
    With --no-driver-files, only the kernel side: put real driver user space beside it.
    """
    from nvshim.host.sim import create_node

    node = create_node(directory, gpus=gpus, driver_version=driver_version,
                       shuffle_minors=shuffle_minors, mig=mig, dev_root=dev_root,
                       imex_channels=imex_channels, nvswitches=nvswitches, gds=gds,
                       mofed=mofed, gdrcopy=gdrcopy, driver_files=not no_driver_files)
    side = "" if node.driver_files else ", kernel side only"
    click.echo(f"simulated node in {node.root} (driver {node.driver_version}{side}):")
    for g in node.gpus:
        click.echo(f"  GPU {g.index}: /dev/nvidia{g.minor}  {g.uuid}  {g.pci_bus_id}  {g.model}")
        for j, m in enumerate(g.mig):
            click.echo(f"    MIG {g.index}:{j}  gi {m.gi} ci {m.ci}  {m.uuid}  {m.profile}")
    click.echo(f"use it with config driver-root: {node.root} and nvml-facts: {node.nvml_facts}")


# --- demo ---------------------------------------------------------------------------------


@cli.command()
@click.option("--keep", is_flag=True,
              help="Keep the temp dir (node, bundles) for a look afterwards.")
def demo(keep: bool) -> None:
    """Run real containers through nvshim-runtime → runc on a simulated 4-GPU node.

    Builds the node and a busybox bundle in a temp dir, runs NVIDIA_VISIBLE_DEVICES=1,
    =0,2, =all and =void, shows what each container saw, and cleans up. Needs root,
    runc and busybox-static (install.sh installs them).
    """
    from nvshim.node.demo import run_demo

    if run_demo(click.echo, keep=keep):
        sys.exit(1)


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

    return [click.Option([flag], metavar=metavar, multiple=repeatable,
                         help=f"{text[0].upper()}{text[1:]}." + (" Repeatable." if repeatable
                                                                 else ""))
            for flag, metavar, text, repeatable in HOOK_OPTIONS]


@cli.command(cls=_HookCommand, params=_hook_options())
def hook(argv: List[str]) -> None:
    """Run the createContainer hook (SONAME links, ld.so.cache) — what runc calls.

    Makes the driver library symlinks and updates the ld.so.cache inside the container
    rootfs; reads the OCI state on stdin. The runtime adds it as `<python> -I -S -c …`
    (the nvshim.hook module); a CDI spec made with `nvshim cdi generate --hook-path PATH`
    runs it as `PATH hook …`. Same code, same arguments; errors are one `nvshim hook: …`
    line and exit 1.
    """
    from nvshim.hook import main as hook_main

    sys.exit(hook_main(argv))


def _add_commands() -> None:
    from nvshim.cli.cmd_cdi import cdi
    from nvshim.cli.cmd_config import config_group
    from nvshim.cli.cmd_doctor import doctor
    from nvshim.cli.cmd_grants import grants
    from nvshim.cli.cmd_inspect import inspect
    from nvshim.cli.cmd_runtime import runtime
    from nvshim.cli.cmd_system import system
    cli.add_command(inspect)
    cli.add_command(cdi)
    cli.add_command(config_group)
    cli.add_command(grants)
    cli.add_command(runtime)
    cli.add_command(system)
    cli.add_command(doctor)


_NO_COMMAND = getattr(click.exceptions, "NoArgsIsHelpError", None)


def main(argv: Optional[List[str]] = None) -> None:
    """Console entry point: one line on stderr and exit 1 for any nvshim failure."""
    _add_commands()
    try:
        rc = cli.main(args=argv, prog_name="nvshim", standalone_mode=False)
    except NvshimError as exc:
        click.echo(f"nvshim: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("nvshim: aborted", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        if _NO_COMMAND is not None and isinstance(exc, _NO_COMMAND) and exc.ctx is not None:
            # a group run without a command: its help, not "nvshim: Usage: …" (click >= 8.2
            # raises this where 8.1 printed the help itself)
            click.echo(exc.ctx.get_help(), err=True)
            sys.exit(1)
        click.echo(f"nvshim: {exc.format_message()}", err=True)
        sys.exit(1 if exc.exit_code == 2 else exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    # with standalone_mode=False, click returns ctx.exit(N)'s code instead of exiting
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
