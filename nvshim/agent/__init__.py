"""``nvshim agent``: the resident node process.

One process per node holds what every create would otherwise load afresh (the config,
the node plan) and serves the runtime's creates over a Unix socket
(:mod:`nvshim.agent.server`, protocol in ``docs/agent.md``); the NRI plugin (the ``nri``
module of this package, issue 33) lives in the same process. Nothing here runs on the
runtime's own path: the agent pays its imports (structlog among them) once.
"""

__all__ = ["AGENT_SOCKET", "NRI_SOCKET"]

AGENT_SOCKET = "/run/nvshim/agent.sock"
"""The node agent's socket: the one default every part uses (the agent, nvshim-runtime's
trampoline, doctor, the CLI, install.sh's unit through :mod:`nvshim.node.install.units`).
deploy/daemonset.yaml, which cannot import it, is held to it by tests/unit/test_deploy.py."""

NRI_SOCKET = "/var/run/nri/nri.sock"
"""containerd's and CRI-O's usual NRI socket: what ``nvshim agent --nri-socket`` names in its
help and what doctor assumes when the engine's config names none (the agent's own default is
``none``: NRI is opt-in)."""
