"""nvshim's NRI plugin: the agent's connection to containerd's or CRI-O's NRI socket.

:func:`run_nri` connects to the engine's socket, refuses a peer that is not root (or this
process's own user), registers as plugin ``nvshim`` at index :data:`PLUGIN_INDEX`, serves
the Plugin service (:class:`nvshim.agent.nri.plugin.Plugin`) until the engine goes away,
and reconnects with a backoff (:data:`BACKOFF_MIN` doubling to :data:`BACKOFF_MAX`) until
``stop`` is set. ``on_registered(True)`` once the engine has registered and configured it,
``on_registered(False)`` whenever the connection is lost. Modules: :mod:`.api` (NRI's
messages as plain values, from :mod:`.api_pb2`, protoc's code for NRI's api.proto),
:mod:`.transport` (the multiplexer and ttrpc), :mod:`.plugin` (the handler table and the
decisions).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Callable, Optional

if TYPE_CHECKING:
    from nvshim.agent.hookwork import PendingWork
    from nvshim.agent.state import AgentState

__all__ = ["run_nri", "PLUGIN_NAME", "PLUGIN_INDEX"]

PLUGIN_NAME = "nvshim"
#: Plugins run in index order: early, so a later plugin sees the devices nvshim gave.
PLUGIN_INDEX = "10"
BACKOFF_MIN = 0.5
BACKOFF_MAX = 10.0


def run_nri(
    state: AgentState,
    nri_socket_path: str,
    stop: threading.Event,
    on_registered: Callable[[bool], None],
    pending: Optional[PendingWork] = None,
) -> None:
    """Serve NRI on ``nri_socket_path`` until ``stop`` (see the module docstring);
    ``pending``: the agent's :class:`nvshim.agent.hookwork.PendingWork`, where
    ``nri-inroot: agent`` leaves the in-root work for the agent's createContainer hook."""
    from nvshim.agent.nri.api import SERVICE_RUNTIME, encode_register
    from nvshim.agent.nri.plugin import Plugin
    from nvshim.agent.nri.transport import RpcError, Session, connect, peer_uid

    log = state.log
    plugin = Plugin(state, pending)
    backoff = BACKOFF_MIN
    while not stop.is_set():
        try:
            sock = connect(nri_socket_path)
        except OSError as exc:
            log.warning(
                "nri socket not reachable",
                socket=nri_socket_path,
                error=exc.strerror or str(exc),
                retry_s=backoff,
            )
            stop.wait(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)
            continue
        uid = peer_uid(sock)
        if uid not in (0, os.getuid()):
            log.error(
                "nri peer refused",
                socket=nri_socket_path,
                uid=uid,
                reason="the engine's socket is not served by root",
            )
            sock.close()
            stop.wait(BACKOFF_MAX)
            continue
        session = Session(sock, plugin.handle, log)
        reader = threading.Thread(target=session.run, args=(stop,), name="nri-read", daemon=True)
        reader.start()
        try:
            session.call(
                SERVICE_RUNTIME, "RegisterPlugin", encode_register(PLUGIN_NAME, PLUGIN_INDEX)
            )
        except (RpcError, TimeoutError, OSError) as exc:
            log.warning("nri registration failed", socket=nri_socket_path, error=str(exc))
            session.close()
            reader.join()
            stop.wait(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)
            continue
        log.info("nri registered", socket=nri_socket_path, name=PLUGIN_NAME, index=PLUGIN_INDEX)
        on_registered(True)
        backoff = BACKOFF_MIN
        while reader.is_alive() and not stop.is_set():
            reader.join(0.5)
        session.close()
        reader.join()
        on_registered(False)
        if not stop.is_set():
            stop.wait(backoff)
