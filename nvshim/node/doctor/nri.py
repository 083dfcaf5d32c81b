"""The doctor's ``nri`` check: is NRI on in the node's containerd (or CRI-O), and is an
``nvshim agent`` registered there as its NRI plugin (docs/nri.md)?

NRI exists from containerd 1.7 (off by default: ``[plugins."io.containerd.nri.v1.nri"]
disable = false`` turns it on) and is on by default from 2.0; CRI-O has it from 1.26
(``[crio.nri] enable_nri``, on by default from 1.30). Only the main config file is read
for the NRI table (an import that sets it is not followed). Whether the agent is
registered comes from its own socket: it answers ``ready`` only while registered with the
engine's NRI socket (when it was started with one).
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Tuple

from nvshim.node.doctor.findings import Finding

__all__ = ["check_nri", "nri_enabled", "NRI_PLUGIN", "DEFAULT_NRI_SOCKET"]

NRI_PLUGIN = "io.containerd.nri.v1.nri"
DEFAULT_NRI_SOCKET = "/var/run/nri/nri.sock"
_ON = f'[plugins."{NRI_PLUGIN}"] disable = false'


def _toml(path: str) -> Optional[Any]:
    """The file as plain values (None: unreadable, not TOML); read with the stdlib's tomllib,
    tomlkit only for a text tomllib refuses (what tomlkit alone accepts reads as before)."""
    import tomllib

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, ValueError):
        return None
    try:
        return tomllib.loads(text)
    except ValueError:
        pass
    import tomlkit

    try:
        return tomlkit.parse(text).unwrap()
    except ValueError:
        return None


def nri_enabled(config_path: str, major_minor: Optional[Tuple[int, int]]
                ) -> Tuple[Optional[bool], str, str]:
    """(whether containerd's NRI is on — None when this containerd has no NRI —, its socket
    path, why) for the config at ``config_path`` and containerd ``major_minor``."""
    doc = _toml(config_path) if os.path.exists(config_path) else {}
    table = ((doc or {}).get("plugins") or {}).get(NRI_PLUGIN)
    socket = DEFAULT_NRI_SOCKET
    disable: Optional[bool] = None
    if isinstance(table, dict):
        socket = str(table.get("socket_path") or DEFAULT_NRI_SOCKET)
        if isinstance(table.get("disable"), bool):
            disable = table["disable"]
    if major_minor is not None and major_minor < (1, 7):
        return None, socket, f"containerd {major_minor[0]}.{major_minor[1]} has no NRI"
    if disable is not None:
        return (not disable, socket,
                f"{config_path} sets disable = {str(disable).lower()} in {NRI_PLUGIN}")
    if major_minor is not None and major_minor >= (2, 0):
        return True, socket, f"on by default in containerd {major_minor[0]}.{major_minor[1]}"
    return False, socket, "off by default in containerd 1.7 (no NRI table in " \
                          f"{config_path})"


def _agent_nri(agent_socket: str) -> Tuple[str, str]:
    """("registered" | "not-registered" | "no-nri" | "absent", detail) from the agent."""
    if not os.path.exists(agent_socket):
        return "absent", f"no node agent on {agent_socket}"
    from nvshim.agent.protocol import MAGIC, ProtocolError, parse_reply
    from nvshim.agent.server import ask

    try:
        status, message = parse_reply(ask(agent_socket, MAGIC + b"\0ready\0", timeout=3.0))
    except (OSError, ProtocolError) as exc:
        return "absent", f"the node agent on {agent_socket} does not answer ({exc})"
    if status == "ready":
        try:
            nri = str(json.loads(message).get("nri", "none"))
        except (ValueError, AttributeError):
            nri = "none"
        if nri == "none":
            return "no-nri", f"the node agent on {agent_socket} runs with --nri-socket none"
        return "registered", f"the node agent on {agent_socket} is registered on {nri}"
    if "NRI" in message:
        return "not-registered", message
    return "absent", f"the node agent on {agent_socket} is not ready ({message})"


def check_nri(containerd_config: str, containerd_binary: str, agent_socket: str,
              crio_config: str = "/etc/crio/crio.conf") -> Finding:
    """ok: NRI on and the agent registered; warn: NRI on without the agent registered, or
    an agent started for NRI on an engine whose NRI is off; skip: no engine with NRI, or
    NRI off and no agent asking for it (the runtime handler is the enforcing path)."""
    from nvshim.node.engines.containerd_read import containerd_version

    name = "nri"
    version = containerd_version(containerd_binary)
    agent, detail = _agent_nri(agent_socket)
    start = ("nvshim agent --nri-socket {socket} (the DaemonSet's agent, or the "
             "nvshim-agent unit) with nri-* set in the config (docs/nri.md)")
    if version is None and os.path.exists(crio_config):
        crio = ((_toml(crio_config) or {}).get("crio") or {}).get("nri") or {}
        on = crio.get("enable_nri")
        if on is False:
            return Finding(name, "skip" if agent != "not-registered" else "warn",
                           f"CRI-O's NRI is off ({crio_config}: enable_nri = false); {detail}",
                           f"set [crio.nri] enable_nri = true in {crio_config} and restart "
                           "CRI-O, if the NRI plugin should run")
        socket = str(crio.get("nri_listen") or DEFAULT_NRI_SOCKET)
        fix = start.format(socket=socket)
        return Finding(name, "ok" if agent == "registered" else "skip",
                       f"CRI-O's NRI ({socket}): {detail}", "" if agent == "registered" else fix)
    if version is None:
        return Finding(name, "skip", f"no containerd or CRI-O found; {detail}")
    enabled, socket, why = nri_enabled(containerd_config, version[:2])
    if enabled is None:
        return Finding(name, "skip", f"{why}: the runtime handler is the only path")
    if not enabled:
        status = "warn" if agent == "not-registered" else "skip"
        return Finding(name, status, f"containerd's NRI is off; {detail}",
                       f"set {_ON} in {containerd_config} (a drop-in under its imports "
                       "works) and restart containerd, if the NRI plugin should run",
                       detail=f"containerd's NRI is off ({why})")
    if agent == "registered":
        return Finding(name, "ok", f"containerd's NRI is on; {detail}",
                       detail=f"containerd's NRI is on ({why})")
    status = "warn" if agent == "not-registered" else "skip"
    return Finding(name, status, f"containerd's NRI is on, but no nvshim agent is registered "
                   f"there: {detail}", start.format(socket=socket),
                   detail=f"containerd's NRI is on ({why}) on {socket}")
