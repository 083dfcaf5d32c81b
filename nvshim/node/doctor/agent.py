"""The doctor's ``agent`` check: whether GPU creates take the fast path (the resident
``nvshim agent``, :mod:`nvshim.agent`) or start Python in nvshim-runtime."""

from __future__ import annotations

import json
import os

from nvshim.node.doctor.findings import Finding

__all__ = ["check_agent"]

_FIX = (
    "start the agent: systemctl enable --now nvshim-agent (install.sh writes the unit "
    "where systemd runs; deploy/daemonset.yaml runs it in a pod), or 'nvshim agent'"
)


def check_agent(socket_path: str, config_path: str, trampoline: str) -> Finding:
    """ok when an agent answers ready on ``socket_path`` serving ``config_path`` as it is
    now and the installed trampoline has the client; skip when no agent runs (a node may
    go without one); warn for one that is there but not serving (creates still work,
    through Python: the message says which path GPU creates take)."""
    from nvshim.agent.protocol import MAGIC, ProtocolError, parse_reply
    from nvshim.agent.server import ask
    from nvshim.agent.state import generation_of

    name = "agent"
    slow = "GPU creates start Python in nvshim-runtime (correct, slower each)"
    if not os.path.exists(socket_path):  # a node without an agent: valid, only slower
        return Finding(
            name,
            "skip",
            f"no node agent on {socket_path}: GPU creates start Python (correct, slower each)",
            _FIX,
            detail=f"{slow}; {_FIX}",
        )
    try:
        status, message = parse_reply(ask(socket_path, MAGIC + b"\0ready\0", timeout=3.0))
    except (OSError, ProtocolError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return Finding(
            name, "warn", f"node agent on {socket_path} does not answer ({why}): {slow}", _FIX
        )
    if status != "ready":
        return Finding(
            name,
            "warn",
            f"node agent on {socket_path} is not ready ({message}): {slow}",
            "see the agent's log (journalctl -u nvshim-agent, or the "
            "DaemonSet pod's agent container)",
        )
    try:
        info = json.loads(message)
        served, generation = str(info["config"]), str(info["generation"])
    except (ValueError, KeyError, TypeError):
        return Finding(
            name,
            "warn",
            f"node agent on {socket_path} gave an unreadable status",
            "install the same nvshim version as the agent's",
        )
    if served != config_path:
        return Finding(
            name,
            "warn",
            f"node agent on {socket_path} serves config {served}, not {config_path}: {slow}",
            f"run the agent with --config {config_path}",
        )
    if generation != generation_of(config_path) or not info.get("serving"):
        return Finding(
            name,
            "warn",
            f"node agent on {socket_path} has not loaded {config_path} "
            f"as it is now (it reloads on the next create; a config it cannot "
            f"load is not served): {slow} until then",
            f"nvshim config show --config {config_path} (it validates the config "
            "and says what does not load)",
        )
    try:
        with open(trampoline, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        text = ""
    if trampoline and text and "nvshim-agent-client" not in text:
        return Finding(
            name,
            "warn",
            f"node agent on {socket_path} is ready, but {trampoline} "
            f"predates the fast path: {slow}",
            "re-run install.sh",
        )
    version = info.get("version")
    which = (
        f" (nvshim {version})"
        if isinstance(version, str)
        else " (an older nvshim, which does not say its version)"
    )
    return Finding(
        name,
        "ok",
        f"node agent on {socket_path}{which} is ready for config "
        f"{config_path}: GPU creates go through it (nvshim inspect on a live bundle "
        "says which path served it)",
    )
