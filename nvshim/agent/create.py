"""A create served by the agent (filled in by issue 34's fast path)."""

from __future__ import annotations

from typing import Tuple

from nvshim.agent.protocol import Request
from nvshim.agent.server import Peer
from nvshim.agent.state import AgentState

__all__ = ["serve_create"]


def serve_create(state: AgentState, request: Request, bundle_fd: int,
                 peer: Peer) -> Tuple[str, str]:
    return "fallback", "this agent serves no create yet"
