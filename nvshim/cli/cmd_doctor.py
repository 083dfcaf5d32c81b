"""``nvshim doctor``: the click shell over :func:`nvshim.cli.readonly.doctor` (which
:mod:`nvshim.cli.fast` calls without click)."""

from __future__ import annotations

import sys
from typing import Optional, Tuple

import click

from nvshim.agent import AGENT_SOCKET
from nvshim.cli import readonly
from nvshim.config import DEFAULT_CONFIG_PATH
from nvshim.node.doctor.findings import DEFAULT_HOOKS_DIRS, DEFAULT_TRAMPOLINE
from nvshim.node.doctor.follow import NVIDIA_CONFIG

__all__ = ["doctor"]


@click.command()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="One line per finding, or a JSON list of findings.",
)
@click.option(
    "--config",
    "config_file",
    default=None,
    type=click.Path(dir_okay=False),
    help=f"nvshim config file (default: $NVSHIM_CONFIG or {DEFAULT_CONFIG_PATH}).",
)
@click.option(
    "--containerd-config",
    default="/etc/containerd/config.toml",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="containerd's main config file.",
)
@click.option(
    "--docker-config",
    default="/etc/docker/daemon.json",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Docker's daemon.json.",
)
@click.option(
    "--crio-config",
    default="/etc/crio/crio.conf",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="CRI-O's main config file (its crio.conf.d/ drop-ins are read too).",
)
@click.option(
    "--driver-root",
    default=None,
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Driver root to discover GPUs under (default: from the config).",
)
@click.option(
    "--dev-root",
    default=None,
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Where /dev/nvidia* live (default: the driver root).",
)
@click.option(
    "--trampoline",
    default=None,
    type=click.Path(dir_okay=False),
    help="The installed nvshim-runtime to check [default: $NVSHIM_BINDIR/"
    f"nvshim-runtime, else {DEFAULT_TRAMPOLINE}].",
)
@click.option(
    "--nvidia-config",
    default=NVIDIA_CONFIG,
    show_default=True,
    type=click.Path(dir_okay=False),
    help="NVIDIA's runtime config, read for accept-nvidia-visible-devices-envvar-"
    "when-unprivileged (unless the runtime's env names another: "
    "NVIDIA_CTK_CONFIG_FILE_PATH, XDG_CONFIG_HOME).",
)
@click.option(
    "--hooks-dir",
    "hooks_dirs",
    multiple=True,
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="OCI hook directory of podman and CRI-O, lowest precedence first; "
    f"repeatable [default: {', '.join(DEFAULT_HOOKS_DIRS)}].",
)
@click.option(
    "--runtime-binary",
    "runtime_binaries",
    multiple=True,
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="A runtime an engine runs that no config doctor reads names (podman "
    "--runtime FILE, ctr --runc-binary FILE): followed, like the engines' "
    "runtimes, to the nvshim config it reads. Repeatable.",
)
@click.option(
    "--agent-socket",
    default=AGENT_SOCKET,
    show_default=True,
    metavar="PATH",
    help="The node agent's socket (nvshim agent): whether GPU creates "
    "go through it or start Python.",
)
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="Also print each finding's details (the programs followed, why it "
    "matters) on an indented line below it; JSON always has them (detail).",
)
def doctor(
    fmt: str,
    config_file: Optional[str],
    containerd_config: str,
    docker_config: str,
    crio_config: str,
    driver_root: Optional[str],
    dev_root: Optional[str],
    trampoline: Optional[str],
    nvidia_config: str,
    hooks_dirs: Tuple[str, ...],
    runtime_binaries: Tuple[str, ...],
    agent_socket: str,
    verbose: bool,
) -> None:
    """Check this node: config, containerd, Docker, CRI-O, runtimes, GPUs, driver files, CDI
    specs, runtime.

    Prints one line per finding (ok, warn, FAIL, skip), each problem with its fix.
    Exits 1 when any check fails. The classic pitfall it catches: a default runtime
    that grants GPUs from the image's env -- NVIDIA's runtime, or nvshim while
    require-allocation is off -- which gives containers that request no GPU every GPU
    of the node (for containerd, Docker and CRI-O). It also says whether the engine
    (containerd's enable_cdi, asking `containerd --version` when the config leaves it
    open; CRI-O always) or nvshim injects CDI devices, and warns when both would.

    Each engine's runtime is followed to what it runs -- wrapper scripts (their
    NVSHIM_CONFIG and exec lines), nvshim's trampoline (the config it embeds), CRI-O's
    monitor_env -- and judged by the config IT reads (handler-config): NVIDIA's runtime
    behind a wrapper is NVIDIA's runtime, and it is no pitfall where its own config sets
    accept-nvidia-visible-devices-envvar-when-unprivileged = false. NVIDIA's OCI hook in
    podman's/CRI-O's hooks.d (oci-hooks) and nvshim runtimes: that lead to NVIDIA's runtime
    are caught too. Every fix that re-runs nvshim runtime configure keeps the flags the
    runtime was registered with (--name, --binary, --set-as-default, ...).
    """
    # sys.exit, not ctx.exit: `nvshim` runs click with standalone_mode=False, where
    # click turns ctx.exit(1) into a return value and the entry point would exit 0.
    sys.exit(
        readonly.doctor(
            fmt,
            config_file,
            containerd_config,
            docker_config,
            crio_config,
            driver_root,
            dev_root,
            trampoline,
            nvidia_config,
            hooks_dirs,
            runtime_binaries,
            agent_socket,
            verbose,
        )
    )
