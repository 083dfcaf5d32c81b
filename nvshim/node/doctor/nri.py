"""The doctor's ``nri`` check: is NRI on in the node's containerd (or CRI-O), and is an
``nvshim agent`` registered there as its NRI plugin (docs/nri.md)?

NRI exists from containerd 1.7 (off by default: ``[plugins."io.containerd.nri.v1.nri"]
disable = false`` turns it on) and is on by default from 2.0; CRI-O has it from 1.26
(``[crio.nri] enable_nri``, on by default from 1.30). Only the main config file is read
for the NRI table (an import that sets it is not followed). Whether the agent is
registered comes from its own socket: it answers ``ready`` only while registered with the
engine's NRI socket (when it was started with one).

NVIDIA's own NRI plugin (the toolkit installer's, the GPU Operator's NRI mode) is named when
it is connected to that socket (:mod:`nvshim.node.doctor.nripeers`): it injects the CDI
devices a pod's own ``nvidia.cdi.k8s.io`` annotation names, which only a registered nvshim
agent (guard or verify) holds to the kubelet's allocation.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

from nvshim._record import replace
from nvshim.agent import NRI_SOCKET
from nvshim.node.doctor.findings import Finding

__all__ = ["check_nri", "nri_enabled", "nri_guard", "NRI_PLUGIN", "DEFAULT_NRI_SOCKET"]

NRI_PLUGIN = "io.containerd.nri.v1.nri"
DEFAULT_NRI_SOCKET = NRI_SOCKET
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


def _chain_docs(config_path: str) -> List[Tuple[str, Any]]:
    """(path, parsed document) of the main config and every file it imports, in
    containerd's load order (nvshim's own drop-in among them: ``runtime configure
    --enable-nri`` turns NRI on there); a file that does not parse counts as empty."""
    if not os.path.exists(config_path):
        return []
    main = _toml(config_path)
    out: List[Tuple[str, Any]] = [(config_path, main)]
    from nvshim.node.engines.containerd_chain import load_chain

    try:
        chain = load_chain(config_path, main or {})
    except (OSError, ValueError):
        return out
    for loaded in chain.files:
        if loaded.depth > 0 and loaded.text is not None:
            out.append((loaded.path, _toml(loaded.path)))
    return out


def nri_enabled(
    config_path: str, major_minor: Optional[Tuple[int, int]]
) -> Tuple[Optional[bool], str, str]:
    """(whether containerd's NRI is on — None when this containerd has no NRI —, its socket
    path, why) for the config at ``config_path`` and containerd ``major_minor``."""
    socket = DEFAULT_NRI_SOCKET
    disable: Optional[bool] = None
    setter = config_path
    for path, doc in _chain_docs(config_path):
        table = ((doc or {}).get("plugins") or {}).get(NRI_PLUGIN)
        if isinstance(table, dict):  # a later file's plugin table replaces an earlier one
            socket = str(table.get("socket_path") or DEFAULT_NRI_SOCKET)
            disable = table["disable"] if isinstance(table.get("disable"), bool) else None
            setter = path
    if major_minor is not None and major_minor < (1, 7):
        return None, socket, f"containerd {major_minor[0]}.{major_minor[1]} has no NRI"
    if disable is not None:
        return (
            not disable,
            socket,
            f"{setter} sets disable = {str(disable).lower()} in {NRI_PLUGIN}",
        )
    if major_minor is not None and major_minor >= (2, 0):
        return True, socket, f"on by default in containerd {major_minor[0]}.{major_minor[1]}"
    return False, socket, f"off by default in containerd 1.7 (no NRI table in {config_path})"


def _ask_ready(agent_socket: str) -> Tuple[Optional[str], str]:
    """(the agent's ``ready`` status, its message) on ``agent_socket``; (None, why) when no
    agent is there or it does not answer."""
    if not os.path.exists(agent_socket):
        return None, f"no node agent on {agent_socket}"
    from nvshim.agent.protocol import MAGIC, ProtocolError, parse_reply
    from nvshim.agent.server import ask

    try:
        return parse_reply(ask(agent_socket, MAGIC + b"\0ready\0", timeout=3.0))
    except (OSError, ProtocolError) as exc:
        return None, f"the node agent on {agent_socket} does not answer ({exc})"


def _ready_info(message: str) -> Dict[str, Any]:
    """The JSON object of a ``ready`` reply; {} when it is none."""
    try:
        info = json.loads(message)
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def _agent_nri(agent_socket: str) -> Tuple[str, str]:
    """("registered" | "not-registered" | "no-nri" | "absent", detail) from the agent."""
    status, message = _ask_ready(agent_socket)
    if status is None:
        return "absent", message
    if status == "ready":
        nri = str(_ready_info(message).get("nri", "none"))
        if nri == "none":
            return "no-nri", f"the node agent on {agent_socket} runs with --nri-socket none"
        return "registered", f"the node agent on {agent_socket} is registered on {nri}"
    if "NRI" in message:
        return "not-registered", message
    return "absent", f"the node agent on {agent_socket} is not ready ({message})"


def nri_guard(agent_socket: str) -> Optional[Tuple[str, Tuple[str, ...]]]:
    """(who guards, the handlers it leaves to nvshim's runtime) when the nvshim agent on
    ``agent_socket`` is registered with an engine's NRI socket and its config has
    ``nri-guard`` on; None otherwise (no agent, not registered, the guard off, a config
    that does not load)."""
    status, message = _ask_ready(agent_socket)
    if status != "ready":
        return None
    from nvshim.config import load_config
    from nvshim.errors import NvshimError

    info = _ready_info(message)
    nri, path = info.get("nri"), info.get("config")
    if not isinstance(nri, str) or nri in ("", "none") or not isinstance(path, str):
        return None
    try:
        config = load_config(path)
    except NvshimError:
        return None
    if not config.nri_guard:
        return None
    return (
        f"the nvshim agent's NRI guard (registered on {nri}; nri-guard: true in {path})",
        tuple(config.nri_nvshim_handlers),
    )


_START = (
    "nvshim agent --nri-socket {socket} (the DaemonSet's agent, or the "
    "nvshim-agent unit) with nri-* set in the config (docs/nri.md)"
)


def check_nri(
    containerd_config: str,
    containerd_binary: str,
    agent_socket: str,
    crio_config: str = "/etc/crio/crio.conf",
    inject: str = "",
) -> Finding:
    """ok: NRI on and the agent registered; warn: NRI on without the agent registered, or
    an agent started for NRI on an engine whose NRI is off; skip: no engine with NRI, or
    NRI off and no agent asking for it (the runtime handler is the enforcing path).
    ``inject``: the config that turns ``nri-inject`` on (""; off): NRI on and no agent
    registered is then a failure, with its consequence."""
    from nvshim.node.engines.containerd_read import containerd_version

    version = containerd_version(containerd_binary)
    agent, detail = _agent_nri(agent_socket)
    finding, socket = _check(containerd_config, version, agent, detail, crio_config)
    if inject and socket and agent != "registered":
        finding = replace(
            finding,
            status="fail",
            message=(
                f"nri-inject is on in {inject}, but no nvshim agent is registered on {socket}: "
                f"GPU pods under plain runc or crun start without their GPUs ({detail})"
            ),
            fix=finding.fix or _START.format(socket=socket),
        )
    return _with_nvidia(finding, agent, socket)


def _with_nvidia(finding: Finding, agent: str, socket: str) -> Finding:
    """``finding`` with NVIDIA's NRI plugin named when it is connected to the NRI socket
    (``""``: NRI is off or absent): a failure while no nvshim agent is registered beside it
    (any pod can name every GPU in its annotation)."""
    if not socket:
        return finding
    from nvshim.node.doctor.nripeers import is_nvidia_plugin, nri_plugins

    nvidia = [p for p in nri_plugins(socket) or () if is_nvidia_plugin(p)]
    if not nvidia:
        return finding
    named = ", ".join(f"{p.name} (pid {p.pid})" for p in nvidia)
    what = (
        f"NVIDIA's NRI plugin is connected to {socket}: {named}; it injects the CDI "
        "devices a pod's own nvidia.cdi.k8s.io annotation names"
    )
    if agent == "registered":
        return replace(
            finding,
            message=f"{finding.message}; {what}, which the agent holds "
            "to the kubelet's allocation (nri-guard or nri-verify)",
        )
    return replace(
        finding,
        status="fail",
        message=f"{what}, and no nvshim agent is "
        f"registered to hold them to the allocation: any pod can take every GPU "
        f"({finding.message})",
        fix=finding.fix or "start " + _START.format(socket=socket),
    )


def _check(
    containerd_config: str,
    version: Optional[Tuple[int, int, str]],
    agent: str,
    detail: str,
    crio_config: str,
) -> Tuple[Finding, str]:
    """(the finding before NVIDIA's plugin is looked for, the NRI socket when NRI is on)."""
    name = "nri"
    start = _START
    if version is None and os.path.exists(crio_config):
        crio = ((_toml(crio_config) or {}).get("crio") or {}).get("nri") or {}
        on = crio.get("enable_nri")
        if on is False:
            return Finding(
                name,
                "skip" if agent != "not-registered" else "warn",
                f"CRI-O's NRI is off ({crio_config}: enable_nri = false); {detail}",
                f"set [crio.nri] enable_nri = true in {crio_config} and restart "
                "CRI-O, if the NRI plugin should run",
            ), ""
        socket = str(crio.get("nri_listen") or DEFAULT_NRI_SOCKET)
        fix = start.format(socket=socket)
        return Finding(
            name,
            "ok" if agent == "registered" else "skip",
            f"CRI-O's NRI ({socket}): {detail}",
            "" if agent == "registered" else fix,
        ), socket
    if version is None:
        return Finding(name, "skip", f"no containerd or CRI-O found; {detail}"), ""
    enabled, socket, why = nri_enabled(containerd_config, version[:2])
    if enabled is None:
        return Finding(name, "skip", f"{why}: the runtime handler is the only path"), ""
    if not enabled:
        status = "warn" if agent == "not-registered" else "skip"
        return Finding(
            name,
            status,
            f"containerd's NRI is off; {detail}",
            f"set {_ON} in {containerd_config} (a drop-in under its imports "
            "works) and restart containerd, if the NRI plugin should run",
            detail=f"containerd's NRI is off ({why})",
        ), ""
    if agent == "registered":
        return Finding(
            name,
            "ok",
            f"containerd's NRI is on; {detail}",
            detail=f"containerd's NRI is on ({why})",
        ), socket
    status = "warn" if agent == "not-registered" else "skip"
    return Finding(
        name,
        status,
        f"containerd's NRI is on, but no nvshim agent is registered there: {detail}",
        start.format(socket=socket),
        detail=f"containerd's NRI is on ({why}) on {socket}",
    ), socket
