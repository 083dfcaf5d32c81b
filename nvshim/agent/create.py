"""A create served by the agent: the runtime's own create, run on what the caller sees.

The client passes the bundle directory as a descriptor it opened itself. The agent serves
the create only when resolving the caller's paths here gives what the caller sees:

- the peer (``SO_PEERCRED``) is visible here (pid not 0), in this agent's mount
  namespace and with this agent's root directory (``/proc/<pid>/ns/mnt`` and
  ``/proc/<pid>/root``: an agent in a pod runs in the host's mount namespace, see
  ``deploy/daemonset.yaml``);
- the bundle path (made absolute against the caller's working directory) is the very
  directory the descriptor holds (same device and inode): a bundle swapped or mounted
  over between the client's open and now is not served.

Then :func:`nvshim.runtime.main.create` runs exactly as in ``nvshim-runtime`` (the same
plan, journal, in-root work through fd-relative, no-symlink opens, atomic config.json),
with the config the agent holds, which must be the generation the client named. Any
check that fails is ``fallback``: the caller's in-process create runs, as without an
agent. A create still unplanned :data:`DEADLINE` seconds after it arrived is abandoned
before anything is written (the client gives up at 10 s and runs its own create).
"""

from __future__ import annotations

import os
import stat
import time
from typing import Tuple

from nvshim import __version__
from nvshim.agent.protocol import Request
from nvshim.agent.server import Peer
from nvshim.agent.state import AgentState

__all__ = ["serve_create", "DEADLINE", "same_view"]

#: Seconds after which a create is abandoned before its first write (client: 10 s).
DEADLINE = 8.0


def same_view(pid: int) -> str:
    """ "" when process ``pid`` resolves paths as this process does (same mount namespace,
    same root); else why not."""
    if pid <= 0:
        return "the caller's pid is not visible from the agent's pid namespace"
    try:
        theirs, ours = os.stat(f"/proc/{pid}/ns/mnt"), os.stat("/proc/self/ns/mnt")
        if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
            return "the caller is in another mount namespace"
        theirs, ours = os.stat(f"/proc/{pid}/root"), os.stat("/")
        if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
            return "the caller has another root directory"
    except OSError as exc:
        return f"cannot read the caller's namespaces: {exc.strerror}"
    return ""


def _absolute(path: str, cwd: str) -> str:
    return path if path.startswith("/") else f"{cwd}/{path}"


def serve_create(
    state: AgentState, request: Request, bundle_fd: int, peer: Peer
) -> Tuple[str, str]:
    """(status, message) for one create (see the module docstring); a create not served
    is logged with the reason (the caller's create runs in-process)."""
    status, message = _serve(state, request, bundle_fd, peer)
    if status == "fallback":
        state.log.info("create not served", pid=peer.pid, bundle=request.bundle, reason=message)
    return status, message


def _serve(state: AgentState, request: Request, bundle_fd: int, peer: Peer) -> Tuple[str, str]:
    arrived = time.monotonic()
    state.reload_if_changed()
    config, generation = state.current()
    if request.version != __version__:
        return "fallback", f"client of nvshim {request.version}, agent {__version__}"
    if request.config != state.config_path:
        return "fallback", f"config {request.config} is not the agent's {state.config_path}"
    if config is None:
        return "fallback", state.config_error
    if request.generation != generation:
        return "fallback", f"config {request.config} is not the generation the agent serves"
    why = same_view(peer.pid)
    if why:
        return "fallback", why
    from nvshim.runtime.argv import parse_argv

    inv = parse_argv(list(request.argv))
    if not inv.modifies:
        return "fallback", "not a create or run"
    if (inv.bundle or "") != request.bundle:
        return "fallback", "the client's bundle is not the argv's"
    bundle = _absolute(inv.bundle, request.cwd) if inv.bundle else request.cwd
    try:
        held, named = os.fstat(bundle_fd), os.stat(bundle)
    except OSError as exc:
        return "fallback", f"bundle {bundle}: {exc.strerror}"
    if not stat.S_ISDIR(held.st_mode) or (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
        return "fallback", f"bundle {bundle} is not the directory the caller opened"
    if inv.log:
        inv.log = _absolute(inv.log, request.cwd)
    if inv.root:
        inv.root = _absolute(inv.root, request.cwd)
    from nvshim.errors import Abandoned
    from nvshim.runtime.logs import report_error
    from nvshim.runtime.main import create

    def in_time() -> None:
        if time.monotonic() - arrived > DEADLINE:
            raise Abandoned()

    try:
        failure = create(inv, config, request.runtime, request.cwd, in_time, "agent")
    except Abandoned:
        return "fallback", f"not planned within {DEADLINE:g} s"
    if failure is not None:
        report_error(failure, inv.log, inv.log_format, stderr=False)
        state.log.info("create refused", bundle=bundle, id=inv.container_id, error=failure)
        return "refused", failure
    state.log.debug(
        "create served",
        bundle=bundle,
        id=inv.container_id,
        ms=round((time.monotonic() - arrived) * 1000, 2),
    )
    return "ok", ""
