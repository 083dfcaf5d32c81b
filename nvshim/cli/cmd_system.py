"""``nvshim system``: host device nodes and ``/dev/char`` links (over nvshim.host.system)."""

from __future__ import annotations

import json
from typing import List

import click

from nvshim.cli.output import info
from nvshim.host.system import (
    Outcome,
    create_dev_char_symlinks,
    create_device_nodes,
    plan_device_nodes,
)

__all__ = ["system"]

_FORMAT = click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="One line per path, or a JSON object {outcomes, notes}.",
)
_DRY_RUN = click.option(
    "--dry-run", is_flag=True, help="Say what would be created; create nothing."
)
_DEV_ROOT = click.option(
    "--dev-root",
    default=None,
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Root under which dev/ is written [default: the driver root].",
)


def _report(outcomes: List[Outcome], notes: List[str], fmt: str) -> None:
    if fmt == "json":
        click.echo(
            json.dumps({"outcomes": [o.to_dict() for o in outcomes], "notes": notes}, indent=2)
        )
        return
    for outcome in outcomes:
        click.echo(f"{outcome.action:<12} {outcome.path} {outcome.detail}")
    for note in notes:
        info(f"nvshim: note: {note}")


@click.group("system")
def system() -> None:
    """Prepare the host: NVIDIA device nodes and their /dev/char links."""


@system.command("create-device-nodes")
@click.option(
    "--driver-root",
    default="/",
    show_default=True,
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Root of the host whose /proc/devices and /proc/driver/nvidia are read.",
)
@_DEV_ROOT
@_DRY_RUN
@_FORMAT
def create_device_nodes_command(driver_root: str, dev_root: str, dry_run: bool, fmt: str) -> None:
    """Create the NVIDIA device nodes the loaded driver serves, where missing.

    /dev/nvidiactl and /dev/nvidia-modeset, /dev/nvidia<minor> per GPU (from
    /proc/driver/nvidia/gpus/*/information), /dev/nvidia-uvm and /dev/nvidia-uvm-tools when
    nvidia-uvm is loaded, and /dev/nvidia-caps/nvidia-cap<minor> for every capability in
    /proc/driver/nvidia/capabilities (MIG config, monitor, GI/CI access). Majors come from
    /proc/devices; mode, owner and group of GPU and control nodes from the driver's params.
    Idempotent: existing nodes are left alone; one with the wrong major:minor is reported
    as a conflict, never replaced. Exits 1 when any path conflicts.
    """
    nodes, notes = plan_device_nodes(driver_root)
    outcomes = create_device_nodes(nodes, dev_root or driver_root, dry_run=dry_run)
    _report(outcomes, notes, fmt)
    if any(o.action == "conflict" for o in outcomes):
        raise SystemExit(1)


@system.command("create-dev-char-symlinks")
@click.option(
    "--dev-root",
    default="/",
    show_default=True,
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Root under which dev/ is read and dev/char/ written.",
)
@_DRY_RUN
@_FORMAT
def create_dev_char_symlinks_command(dev_root: str, dry_run: bool, fmt: str) -> None:
    """Create /dev/char/<major>:<minor> -> ../<node> for every NVIDIA device node.

    Why: with the systemd cgroup driver, runc hands a container's device rules to systemd
    as DeviceAllow= entries naming /dev/char/<major>:<minor>. On `systemctl daemon-reload`
    systemd re-applies them and drops every device that has no such link, so running GPU
    containers lose their GPUs (NVML "Unknown Error"). udev links the devices it creates;
    the NVIDIA nodes come from the driver's helper and get none. Run this after the nodes
    exist (nvshim system create-device-nodes) and again when GPUs or MIG devices change.
    Idempotent: existing correct links stay; a different link is reported as a conflict,
    never replaced. Exits 1 when any link conflicts.
    """
    outcomes = create_dev_char_symlinks(dev_root, dry_run=dry_run)
    notes = (
        []
        if outcomes
        else [
            f"no NVIDIA device nodes under {dev_root.rstrip('/')}/dev: "
            "nothing to link (nvshim system create-device-nodes makes them)"
        ]
    )
    _report(outcomes, notes, fmt)
    if any(o.action == "conflict" for o in outcomes):
        raise SystemExit(1)
