"""Who is connected to an engine's NRI socket: the NRI plugins running on this node.

The engine lists its plugins nowhere a client can read, so the doctor asks the kernel:
the unix sockets bound to the NRI socket's path (the engine's side of each connection)
and their peers come from sock_diag (``NETLINK_SOCK_DIAG``, what ``ss -xp`` reads), the
processes holding those peers from ``/proc/<pid>/fd``. Read-only; root sees every
process. :func:`nri_plugins` is None where the kernel does not answer (no ``unix_diag``).
"""

from __future__ import annotations

import os
import socket
import struct
from typing import Dict, List, Optional, Set, Tuple

from nvshim._record import dataclass

__all__ = ["NriPeer", "nri_plugins", "is_nvidia_plugin"]

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_UDIAG_SHOW_NAME, _UDIAG_SHOW_PEER = 0x1, 0x4
_UNIX_DIAG_NAME, _UNIX_DIAG_PEER = 0, 2


@dataclass(frozen=True)
class NriPeer:
    """One process connected to the NRI socket."""

    pid: int
    argv: Tuple[str, ...]

    @property
    def name(self) -> str:
        return os.path.basename(self.argv[0]) if self.argv else f"pid {self.pid}"


def _unix_sockets() -> Optional[Dict[int, Tuple[str, int]]]:
    """inode → (bound path, peer inode) of every unix socket; None without sock_diag."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
    except OSError:
        return None
    request = struct.pack(
        "=BBHIIIII",
        socket.AF_UNIX,
        0,
        0,
        0xFFFFFFFF,
        0,
        _UDIAG_SHOW_NAME | _UDIAG_SHOW_PEER,
        0xFFFFFFFF,
        0xFFFFFFFF,
    )
    header = struct.pack(
        "=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0
    )
    out: Dict[int, Tuple[str, int]] = {}
    try:
        with sock:
            sock.settimeout(3.0)
            sock.send(header + request)
            while True:
                data = sock.recv(1 << 16)
                offset = 0
                while offset + 16 <= len(data):
                    length, kind = struct.unpack_from("=IH", data, offset)
                    if length < 16 or kind in (_NLMSG_DONE, _NLMSG_ERROR):
                        return out if kind == _NLMSG_DONE else None
                    _parse(data[offset + 16 : offset + length], out)
                    offset += (length + 3) & ~3
                if not data:
                    return out
    except OSError:
        return None


def _parse(msg: bytes, out: Dict[int, Tuple[str, int]]) -> None:
    """One ``unix_diag_msg`` and its attributes into ``out``."""
    if len(msg) < 16:
        return
    (inode,) = struct.unpack_from("=I", msg, 4)
    name, peer, offset = "", 0, 16
    while offset + 4 <= len(msg):
        length, kind = struct.unpack_from("=HH", msg, offset)
        if length < 4:
            break
        body = msg[offset + 4 : offset + length]
        if kind == _UNIX_DIAG_NAME:
            name = body.split(b"\0", 1)[0].decode("utf-8", "replace") if body[:1] != b"\0" else ""
        elif kind == _UNIX_DIAG_PEER and len(body) >= 4:
            (peer,) = struct.unpack_from("=I", body)
        offset += (length + 3) & ~3
    out[inode] = (name, peer)


def _holders(inodes: Set[int], proc: str) -> List[int]:
    """The pids holding a socket of ``inodes``."""
    found: List[int] = []
    wanted = {f"socket:[{i}]" for i in inodes}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        fds = os.path.join(proc, entry, "fd")
        try:
            links = os.listdir(fds)
        except OSError:
            continue
        for fd in links:
            try:
                if os.readlink(os.path.join(fds, fd)) in wanted:
                    found.append(int(entry))
                    break
            except OSError:
                continue
    return found


def _argv(pid: int, proc: str) -> Tuple[str, ...]:
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as f:
            raw = f.read(4096)
    except OSError:
        return ()
    return tuple(a.decode("utf-8", "replace") for a in raw.split(b"\0") if a)


def nri_plugins(nri_socket: str, proc: str = "/proc") -> Optional[List[NriPeer]]:
    """The processes connected to ``nri_socket`` (the engine's own excluded), by pid; None
    when the kernel cannot say (no sock_diag)."""
    sockets = _unix_sockets()
    if sockets is None:
        return None
    target = os.path.realpath(nri_socket)
    peers = {
        peer
        for name, peer in sockets.values()
        if peer and name and os.path.realpath(name) == target
    }
    if not peers:
        return []
    return [NriPeer(pid, _argv(pid, proc)) for pid in sorted(_holders(peers, proc))]


def is_nvidia_plugin(peer: NriPeer) -> bool:
    """Whether ``peer`` is NVIDIA's NRI plugin: the toolkit's installer
    (``nvidia-ctk-installer``, the GPU Operator's NRI mode) or another NVIDIA program, by
    its executable's name; nvshim's own agent is never one."""
    words = " ".join(peer.argv[:3])
    return peer.name.startswith("nvidia") and "nvshim" not in words
