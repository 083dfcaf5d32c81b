"""The agent-served createContainer hook (``nri-inroot: agent``, docs/nri.md).

At CreateContainer the NRI plugin plans a GPU container's in-root work (SONAME links,
ld.so.cache, EGL profile, ``/dev`` links) but no rootfs exists yet. Instead of nvshim's
Python hook (an interpreter started inside ``runc create``), the adjustment's
createContainer hook is the static client (``nvshim-agent-client --hook SOCKET VERSION
PYTHON-HOOK-ARGV...``), and the plan waits here, keyed by the container's id
(:class:`PendingWork`). runc runs the hook in the container's mount namespace after its
mounts and before ``pivot_root`` (a read-only rootfs still writable); the client sends the
OCI state from its stdin and an ``O_PATH`` descriptor of its ``/`` (protocol ``hook``).

:func:`serve_hook` finds the bundle and the rootfs through that descriptor with
:func:`nvshim.host.inroot.resolve_dir` (every symlink resolved inside the caller's root:
what the hook sees, never a path of the agent's own mount namespace), and does the work
with the runtime's fd-relative, no-symlink writer (:func:`nvshim.runtime.rootwork.prepare_in`).
The work is bound to its container: only a peer (``SO_PEERCRED``'s pid) that runs in the
cgroup the engine gave the container at CreateContainer (``linux.cgroups_path``, read by
the kernel from ``/proc/<pid>/cgroup``, never from what the peer sends) may take it, so a
root process elsewhere on the node cannot name a created-but-not-started container's id
and have its work written into a tree of its choosing; a peer that fails the check gets
``fallback`` and the work stays for the container's own hook (:meth:`PendingWork.claim`).
Anything else is ``fallback``: the client then execs the Python hook with the same argv
and the same state on stdin, so the work is done all the same (fails closed): another
nvshim version, a peer outside the container's cgroup (an agent in a cgroup or pid
namespace of its own sees none), no work waiting for the container (the agent restarted since
CreateContainer), a state or rootfs it cannot read, a rootfs it cannot write (crun makes
a read-only rootfs read-only before the hooks; the Python hook remounts it).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from nvshim import __version__
from nvshim.agent.protocol import Request
from nvshim.agent.server import Peer
from nvshim.errors import SpecError

__all__ = [
    "PendingWork",
    "serve_hook",
    "outside_cgroup",
    "cgroup_candidates",
    "cgroup_matches",
    "HOOK_FLAG",
    "PENDING_MAX",
]

#: The client's first argument in hook mode.
HOOK_FLAG = "--hook"
#: Containers whose work waits at once, at most (a hook never run: the oldest goes).
PENDING_MAX = 4096

DevLinks = Tuple[Tuple[str, str], ...]
#: (work, /dev links, the cgroups path the engine gave the container)
_Item = Tuple[Any, DevLinks, str]


class PendingWork:
    """In-root work planned at CreateContainer, waiting for its container's hook."""

    def __init__(self, socket_path: str, client: Optional[str] = None) -> None:
        from nvshim.agent.client import client_path

        self.socket_path = os.path.abspath(socket_path)
        self.client = client if client is not None else client_path(sys.executable)
        self._work: Dict[str, _Item] = {}
        self._lock = threading.Lock()
        self._probed: Tuple[Any, bool] = (None, False)

    def __len__(self) -> int:
        return len(self._work)

    def put(
        self, container_id: str, work: Any, dev_links: DevLinks = (), cgroups_path: str = ""
    ) -> None:
        """Leave ``work`` for the container's hook; ``cgroups_path`` is the engine's
        ``linux.cgroups_path`` for it (without one no peer can claim the work)."""
        with self._lock:
            self._work.pop(container_id, None)
            if len(self._work) >= PENDING_MAX:  # hooks never run (failed creates): oldest out
                del self._work[next(iter(self._work))]
            self._work[container_id] = (work, dev_links, cgroups_path)

    def claim(self, container_id: str, pid: int) -> Tuple[Any, DevLinks]:
        """The container's work, taken, for the peer ``pid`` when it runs in the
        container's cgroup; _NotServed (the work left waiting) otherwise."""
        with self._lock:
            item = self._work.get(container_id)
        if item is None:
            raise _NotServed(
                f"no in-root work waits for container {container_id} "
                "(the agent restarted since its CreateContainer?)"
            )
        work, dev_links, cgroups_path = item
        why = outside_cgroup(pid, cgroups_path)
        if why:
            raise _NotServed(f"the hook for container {container_id} is not its own: {why}")
        with self._lock:
            if self._work.get(container_id) is not item:  # taken or replaced meanwhile
                raise _NotServed(f"no in-root work waits for container {container_id}")
            del self._work[container_id]
        return work, dev_links

    def drop(self, container_id: str) -> None:
        with self._lock:
            self._work.pop(container_id, None)

    def hook_entry(self, hook: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """nvshim's Python hook entry (OCI JSON) as the client's: the same argv after the
        client's own words, so that the client can exec it; None when the client is not
        here (a machine it is not built for): the Python hook stays."""
        if not self.client_has_hook():
            return None
        args = [self.client, HOOK_FLAG, self.socket_path, __version__, *hook["args"]]
        return {**hook, "path": self.client, "args": args}

    def client_has_hook(self) -> bool:
        """Whether the client is here and has the ``--hook`` mode: asked once per client
        file (``--hook`` alone is its usage line, exit 1; a client older than the mode
        would fail every GPU create's hook instead of falling back)."""
        try:
            st = os.stat(self.client)
        except OSError:
            return False
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if self._probed[0] == key:
            return self._probed[1]
        import subprocess

        try:
            res = subprocess.run(
                [self.client, HOOK_FLAG], stdin=subprocess.DEVNULL, capture_output=True, timeout=10
            )
            ok = res.returncode == 1 and res.stderr.startswith(b"nvshim: usage: ")
        except (OSError, subprocess.SubprocessError):
            ok = False
        self._probed = (key, ok)
        return ok


def serve_hook(
    pending: PendingWork, request: Request, root_fd: int, peer: Peer, log: Any
) -> Tuple[str, str]:
    """(status, message) for one hook request (see the module docstring)."""
    started = time.perf_counter()
    cid = ""
    try:
        if request.version != __version__:
            raise _NotServed(f"hook of nvshim {request.version}, agent {__version__}")
        cid, state = _read_state(request.state)
        work, dev_links = pending.claim(cid, peer.pid)
        warnings, inroot_s = _do(root_fd, state, work, dev_links)
    except _NotServed as exc:
        log.info(
            "nri in-root work not served (the Python hook does it)",
            id=cid,
            pid=peer.pid,
            reason=str(exc),
        )
        return "fallback", str(exc)
    # ms: the whole request (state, claim, config.json, rootfs); inroot_ms: the work's own
    log.info(
        "nri in-root work",
        id=cid,
        by="agent hook",
        pid=peer.pid,
        warnings=warnings,
        ms=round((time.perf_counter() - started) * 1e3, 2),
        inroot_ms=round(inroot_s * 1e3, 2),
    )
    return "ok", ""


class _NotServed(Exception):
    """Why the hook falls back to Python (one line)."""


def cgroup_candidates(cgroups_path: str) -> Tuple[str, ...]:
    """The cgroup paths (as ``/proc/<pid>/cgroup`` shows them from the root cgroup
    namespace) a runtime makes of an OCI ``linux.cgroupsPath``: the path itself
    (cgroupfs), and for systemd's ``slice:prefix:name`` the scope under its expanded slice
    (``a-b.slice`` is ``/a.slice/a-b.slice``, as runc and crun expand it)."""
    out = [cgroups_path]
    parts = cgroups_path.split(":")
    if len(parts) == 3 and "/" not in cgroups_path:
        slice_, prefix, name = parts
        unit = (
            name
            if name.endswith(".slice")
            else (f"{prefix}-{name}.scope" if prefix else f"{name}.scope")
        )
        slice_ = slice_ or "system.slice"
        tree = ""
        if slice_ != "-.slice":
            stem, words = slice_[: -len(".slice")], []
            for word in stem.split("-"):
                words.append(word)
                tree += "/" + "-".join(words) + ".slice"
        out.append(f"{tree}/{unit}")
    return tuple(p for p in out if p)


def outside_cgroup(pid: int, cgroups_path: str) -> str:
    """Why process ``pid`` is not in the cgroup ``cgroups_path`` names ("" when it is,
    in any hierarchy: cgroup v1 lists one line per hierarchy, v2 one). A path the reader
    sees from a cgroup namespace of its own (``/../..``-prefixed) matches by its tail."""
    if not cgroups_path:
        return "the engine gave the container no cgroups path"
    if pid <= 0:
        return "the peer is outside the agent's pid namespace"
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        return f"cannot read /proc/{pid}/cgroup: {exc.strerror}"
    paths = [line.split(":", 2)[-1] for line in lines]
    if any(cgroup_matches(path, cgroups_path) for path in paths):
        return ""
    return f"peer pid {pid} runs in cgroup {paths[0] if paths else '(none)'}, not {cgroups_path}"


def cgroup_matches(path: str, cgroups_path: str) -> bool:
    """Whether ``path`` (one line of ``/proc/<pid>/cgroup``, past its second colon) is
    the cgroup a runtime makes of ``cgroups_path`` (:func:`cgroup_candidates`): equal;
    for a relative ``cgroups_path`` (under the runtime's own cgroup) its tail; for a path
    seen from another cgroup namespace (``/../../x``) the tail after the ``..``."""
    tail = path
    while tail.startswith("/.."):
        tail = tail[3:]
    for want in cgroup_candidates(cgroups_path):
        absolute = want if want.startswith("/") else "/" + want
        if path == absolute or (want[:1] != "/" and path.endswith(absolute)):
            return True
        if tail != path and tail.startswith("/") and absolute.endswith(tail):
            return True
    return False


def _read_state(text: str) -> Tuple[str, Mapping[str, Any]]:
    """(id, state) of the OCI state, its bundle checked (:mod:`nvshim._ocistate`)."""
    from nvshim._ocistate import parse_state, state_bundle

    try:
        state = parse_state(text)
        cid = state.get("id")
        if not isinstance(cid, str) or not cid:
            raise _NotServed("the oci state has no container id")
        state_bundle(state)
    except SpecError as exc:
        raise _NotServed(str(exc)) from exc
    return cid, state


def _rootfs_of(root_fd: int, state: Mapping[str, Any]) -> str:
    """The rootfs path (the caller's) of the state (:func:`nvshim._ocistate.container_root`),
    config.json read through ``root_fd``, never by a path of the agent's own namespace."""
    from nvshim._ocistate import container_root
    from nvshim.host import inroot

    def read_config(bundle: str) -> bytes:
        try:
            bundle_fd = inroot.resolve_dir(root_fd, bundle)
        except OSError as exc:
            raise SpecError(f"bundle {bundle}: {exc.strerror}") from exc
        try:
            return inroot.read_file(bundle_fd, "config.json") or b""
        finally:
            os.close(bundle_fd)

    try:
        return os.path.normpath(container_root(state, read_config))
    except SpecError as exc:
        raise _NotServed(str(exc)) from exc


def _do(
    root_fd: int, state: Mapping[str, Any], work: Any, dev_links: DevLinks
) -> Tuple[List[str], float]:
    """The work in the rootfs the caller sees: its warnings and the seconds the work itself
    took (the links, cache and profile made, once the rootfs is found); or _NotServed."""
    from nvshim.errors import NvshimError
    from nvshim.host import inroot
    from nvshim.runtime import rootwork

    rootfs = _rootfs_of(root_fd, state)
    try:
        fd = inroot.resolve_dir(root_fd, rootfs)
    except OSError as exc:
        raise _NotServed(f"rootfs {rootfs}: {exc.strerror}") from exc
    with inroot.RootFd(fd, rootfs) as rootfs_fd:
        try:
            held, top = os.fstat(fd), os.fstat(root_fd)
            if (held.st_dev, held.st_ino) == (top.st_dev, top.st_ino):
                raise _NotServed(f"the rootfs {rootfs} is the caller's /")  # the hook warns
            started = time.perf_counter()
            warnings = rootwork.prepare_in(rootfs_fd, work)
            if dev_links:
                rootwork.apply_dev_links(rootfs_fd, rootfs, dev_links)
            took = time.perf_counter() - started
        except (NvshimError, OSError) as exc:
            raise _NotServed(str(exc)) from exc
    return list(warnings), took
