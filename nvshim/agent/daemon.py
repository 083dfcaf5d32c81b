"""``nvshim agent``'s life: load, bind, serve, (register with NRI), stop on SIGTERM/SIGINT.

Ready (the ``ready`` request, the DaemonSet's readiness probe) means: the agent socket
serves and, when NRI is asked for, the plugin is registered with the engine.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Callable, List, Optional, Tuple

from nvshim.agent.protocol import Request
from nvshim.agent.server import AgentServer, Peer, SocketBusy
from nvshim.agent.state import AgentState, install_changed

__all__ = ["Agent", "run_agent"]


class Agent:
    """The daemon: its state, its socket, its NRI thread and whether it is ready."""

    def __init__(self, state: AgentState, socket_path: str, nri_socket: Optional[str]) -> None:
        self.state = state
        self.log = state.log
        self.socket_path = socket_path
        self.nri_socket = nri_socket
        self.stop = threading.Event()
        self.registered = threading.Event()
        self.nri_error = ""
        self.server: Optional[AgentServer] = None
        from nvshim.agent.hookwork import PendingWork

        self.pending = PendingWork(socket_path)
        """In-root work the NRI plugin planned, waiting for its createContainer hook."""

    # --- readiness --------------------------------------------------------------------

    def on_registered(self, registered: bool) -> None:
        """The NRI plugin's news: registered with the engine (True) or not any more."""
        if registered:
            self.registered.set()
        else:
            self.registered.clear()
        self.log.info("nri registration", registered=registered)

    def readiness(self) -> Tuple[bool, str]:
        if self.server is None or not self.server.serving:
            return False, "agent socket not serving"
        if self.nri_socket is not None and not self.registered.is_set():
            why = f": {self.nri_error}" if self.nri_error else ""
            return False, f"not registered with the engine's NRI socket {self.nri_socket}{why}"
        return True, ""

    # --- requests ---------------------------------------------------------------------

    def handle(self, request: Request, fds: List[int], peer: Peer) -> Tuple[str, str]:
        changed = install_changed()
        if request.op == "ready":
            ok, why = self.readiness()
            if changed:
                ok, why = False, changed
            if not ok:
                return "not-ready", why
            import json

            from nvshim import __version__

            config, generation = self.state.current()
            return "ready", json.dumps(
                {
                    "config": self.state.config_path,
                    "generation": generation,
                    "serving": config is not None,
                    "nri": self.nri_socket or "none",
                    "version": __version__,
                }
            )
        if changed:  # the client does the work itself, on the installed code
            self.log.error("request not served", op=request.op, reason=changed)
            return "fallback", changed
        if request.op == "hook":
            from nvshim.agent.hookwork import serve_hook

            return serve_hook(self.pending, request, fds[0], peer, self.log)
        from nvshim.agent.create import serve_create

        return serve_create(self.state, request, fds[0], peer)

    # --- life -------------------------------------------------------------------------

    def _start_nri(self) -> None:
        assert self.nri_socket is not None
        path = self.nri_socket

        def run() -> None:
            from nvshim.agent.nri import run_nri  # only when NRI is asked for

            try:
                run_nri(self.state, path, self.stop, self.on_registered, self.pending)
            except Exception as exc:  # noqa: BLE001 - the socket keeps serving; not ready
                self.nri_error = f"{type(exc).__name__}: {exc}"
                self.log.error("nri plugin stopped", error=self.nri_error)
            finally:
                self.registered.clear()

        threading.Thread(target=run, name="nri", daemon=True).start()

    def _bind(self, wait: bool) -> Optional[AgentServer]:
        """The server on the socket; with ``wait``, once the agent serving it now has
        stopped (polled every 0.1 s: a rollout's new agent takes over from the old one
        within that). None: stopped while waiting."""
        said = False
        while True:
            try:
                return AgentServer(self.socket_path, self.handle, self.log)
            except SocketBusy:
                if not wait:
                    raise
            if not said:
                said = True
                self.log.info(
                    "another agent serves the socket: waiting for it to stop",
                    socket=self.socket_path,
                )
            if self.stop.wait(0.1):
                return None

    def run(self, wait: bool = False) -> int:
        """Serve until SIGTERM/SIGINT; 0 after a clean stop. ``wait``: when another agent
        serves the socket, wait for it to stop instead of failing."""
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        previous: List[Tuple[int, Any]] = []

        def stopping(signum: int, _frame: Any) -> None:
            self.stop.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            previous.append((signum, signal.signal(signum, stopping)))
        old_wake = signal.set_wakeup_fd(wake_w)
        try:
            self.server = self._bind(wait)
            if self.server is None:
                return 0
            if self.nri_socket is not None:
                self._start_nri()
            self.log.info(
                "agent serving",
                socket=self.socket_path,
                nri_socket=self.nri_socket or "none",
                config=self.state.config_path,
                generation=self.state.generation,
            )
            self.server.serve(self.stop, wake_r, self.state.reload_if_changed)
        finally:
            signal.set_wakeup_fd(old_wake)
            for number, handler in previous:
                signal.signal(number, handler)
            os.close(wake_r)
            os.close(wake_w)
        self.log.info("agent stopped", socket=self.socket_path)
        return 0


def _warm_up() -> None:
    """Import what a GPU create uses now, not on the first create; then freeze what is
    loaded (``gc.freeze``: the modules' objects live as long as the agent, and a full
    collection then walks only what the creates made since, not every module again) and
    undo the runtime entry's ``gc.disable()``, which suits a process that lives for one
    create, not a resident one."""
    import gc

    import nvshim.agent.create  # noqa: F401
    import nvshim.runtime.create  # noqa: F401
    import nvshim.runtime.devparams  # noqa: F401
    import nvshim.runtime.grants  # noqa: F401
    import nvshim.runtime.hookargs  # noqa: F401
    import nvshim.runtime.hostedits  # noqa: F401
    import nvshim.runtime.main  # noqa: F401
    import nvshim.runtime.plancache  # noqa: F401
    import nvshim.runtime.rootwork  # noqa: F401
    import nvshim.runtime.specjson  # noqa: F401

    gc.collect()
    gc.freeze()
    gc.enable()


def run_agent(
    config_file: Optional[str],
    socket_path: str,
    nri_socket: Optional[str],
    log: Any = None,
    started: Optional[Callable[[Agent], None]] = None,
    wait: bool = False,
) -> int:
    """``nvshim agent``: build the state, serve; ``nri_socket`` None is ``--nri-socket none``;
    ``wait``: ``--wait`` (another agent on the socket is waited for, not an error)."""
    from nvshim.logs import configure
    from nvshim.runtime.allocation.kubelet import set_resident
    from nvshim.runtime.plancache import use_memo

    log = log if log is not None else configure()
    _warm_up()
    state = AgentState(config_file, log)
    use_memo(state.plan_memo)
    set_resident(True)  # before any thread: the creates' code then changes no process state
    agent = Agent(state, socket_path, nri_socket)
    if started is not None:
        started(agent)
    try:
        return agent.run(wait)
    finally:
        set_resident(False)
        use_memo(None)
