"""``nvshim agent``: the resident node agent (over nvshim.agent)."""

from __future__ import annotations

import sys
from typing import Optional

import click

from nvshim.agent import AGENT_SOCKET, NRI_SOCKET
from nvshim.cli.options import CONFIG_FILE

__all__ = ["agent"]


@click.command("agent")
@CONFIG_FILE
@click.option(
    "--socket",
    "socket_path",
    default=AGENT_SOCKET,
    show_default=True,
    metavar="PATH",
    help="The agent's own socket, which nvshim-runtime's creates use.",
)
@click.option(
    "--nri-socket",
    default="none",
    show_default=True,
    metavar="PATH",
    help="The engine's NRI socket to register with as a plugin (containerd's and "
    f"CRI-O's usual one: {NRI_SOCKET}); 'none', the default everywhere (the "
    "unit, the DaemonSet), for no NRI.",
)
@click.option(
    "--wait",
    is_flag=True,
    help="When another agent serves --socket, wait for it to stop, then serve "
    "(a rollout's new agent beside the old one: the DaemonSet's agent "
    "container); without it that is an error.",
)
@click.option(
    "--ready",
    "check_ready",
    is_flag=True,
    help="Do not serve: ask the agent on --socket whether it is ready (exit 0) or "
    "not (one line, exit 1). For readiness probes.",
)
def agent(
    config_file: Optional[str], socket_path: str, nri_socket: str, wait: bool, check_ready: bool
) -> None:
    """Run the node agent in the foreground until SIGTERM or SIGINT.

    It serves nvshim-runtime's creates on --socket (root peers only; a create the agent
    cannot serve runs in nvshim-runtime itself, as without an agent) and, given
    --nri-socket PATH, registers with the engine's NRI socket (NRI is opt-in). It is ready once its
    socket serves and, with NRI, once registered. Logs are structured: JSON lines when
    stderr is not a terminal or in a pod, console lines on a terminal.
    """
    if check_ready:
        from nvshim.agent.protocol import MAGIC, ProtocolError, parse_reply
        from nvshim.agent.server import ask
        from nvshim.errors import HostError

        try:
            status, message = parse_reply(ask(socket_path, MAGIC + b"\0ready\0"))
        except (OSError, ProtocolError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise HostError(f"agent socket {socket_path}: {why}") from exc
        if status != "ready":
            raise HostError(f"agent on {socket_path} is not ready: {message}")
        click.echo(f"agent on {socket_path} is ready")
        return
    from nvshim.agent.daemon import run_agent

    sys.exit(
        run_agent(config_file, socket_path, None if nri_socket == "none" else nri_socket, wait=wait)
    )
