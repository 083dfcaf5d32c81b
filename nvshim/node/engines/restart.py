"""Restart containerd so it loads a changed config, and wait until its socket answers again.

``nvshim runtime restart`` lands here; install.sh calls it after ``runtime configure`` (and
after ``--revert``), and puts the previous config back when containerd does not come back.
The modes are those of the GPU Operator's toolkit container:

* ``systemd`` — ``systemctl restart <unit>``: ``containerd``, or the unit that starts it
  (k3s: ``k3s`` / ``k3s-agent``; RKE2: ``rke2-server`` / ``rke2-agent``; microk8s:
  ``snap.microk8s.daemon-containerd``);
* ``signal`` — a signal (default SIGHUP, as the toolkit sends) to the process that owns the
  socket (its pid from the connection's ``SO_PEERCRED``). containerd does not handle SIGHUP,
  so it exits; on SIGTERM it shuts down cleanly. Its supervisor (systemd, k3s, a loop) must
  start it again. When nothing owns the socket (containerd is down already) nothing is
  signalled, and the wait below tells whether the supervisor brings it back;
* ``none`` — nothing: the operator restarts it; nothing is waited for.

After ``systemd`` or ``signal`` the socket must answer a gRPC call (containerd's own
``Version`` service, sent as raw bytes: no protobuf code needed) within the timeout, else
:class:`~nvshim.errors.HostError` with one line naming the socket. With ``signal`` the old
process must be gone first, so an answer comes from the restarted one.
"""

from __future__ import annotations

import os
import signal as signals
import socket
import stat
import struct
import subprocess
import time
from typing import Any, Callable, Optional

from nvshim.errors import HostError, UsageError

__all__ = [
    "DEFAULT_SOCKET",
    "MODES",
    "answers",
    "check_answers",
    "parse_signal",
    "restart_containerd",
    "socket_owner",
]

#: containerd's socket on a node installed from packages (k3s/RKE2:
#: /run/k3s/containerd/containerd.sock; microk8s: /var/snap/microk8s/common/run/containerd.sock).
DEFAULT_SOCKET = "/run/containerd/containerd.sock"
MODES = ("systemd", "signal", "none")
_VERSION_METHOD = "/containerd.services.version.v1.Version/Version"
_POLL = 0.25


def parse_signal(name: str) -> signals.Signals:
    """``HUP``, ``SIGHUP`` or ``1`` → the signal; anything else is a :class:`UsageError`."""
    text = name.strip().upper()
    try:
        return (
            signals.Signals(int(text))
            if text.isdigit()
            else signals.Signals[text if text.startswith("SIG") else f"SIG{text}"]
        )
    except (KeyError, ValueError) as exc:
        raise UsageError(f'unknown signal "{name}": give a name like SIGHUP or SIGTERM') from exc


def socket_owner(path: str) -> Optional[int]:
    """The pid of the process that listens on the unix socket ``path`` (as this process's
    pid namespace numbers it), or ``None`` when nothing accepts a connection there."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(2.0)
        conn.connect(path)
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    finally:
        conn.close()
    pid = int(struct.unpack("3i", creds)[0])
    return pid or None


def answers(path: str, timeout: float) -> bool:
    """Whether containerd answers its ``Version`` call on the socket ``path`` in time."""
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return False
    except OSError:
        return False
    import grpc  # costly (BENCHMARKS.md, figures): only the installer's restart pays it

    with grpc.insecure_channel(f"unix://{path}") as channel:
        call: Any = channel.unary_unary(_VERSION_METHOD)  # raw bytes both ways
        try:
            call(b"", timeout=timeout)
        except grpc.RpcError:
            return False
    return True


def check_answers(path: str, timeout: float = 5.0) -> str:
    """One line saying containerd answers on ``path``; :class:`HostError` when it does not
    (before a config change: a wrong socket path fails before anything is written)."""
    if not answers(path, timeout):
        raise HostError(
            f"containerd does not answer on {path}: is it running, and is that its socket "
            "(NVSHIM_CONTAINERD_SOCKET, --socket)?"
        )
    owner = socket_owner(path)
    return f"containerd answers on {path}" + (f" (pid {owner})" if owner else "")


def _start_time(pid: int) -> Optional[str]:
    """Field 22 of ``/proc/<pid>/stat`` (when it started), ``None`` once it is gone or a
    zombie: with the pid, it names one process even if the number is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode(errors="replace")
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    if not fields or fields[0] == "Z":
        return None
    return fields[19] if len(fields) > 19 else None


def _ignores(pid: int, sig: signals.Signals) -> bool:
    """Whether process ``pid`` ignores ``sig`` (its ``SigIgn`` mask in /proc)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("SigIgn:"):
                    return bool(int(line.split()[1], 16) >> (int(sig) - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _wait(done: Callable[[], bool], deadline: float) -> bool:
    while True:
        if done():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL)


def restart_containerd(
    mode: str,
    socket_path: str = DEFAULT_SOCKET,
    *,
    unit: str = "containerd",
    signal_name: str = "SIGHUP",
    timeout: float = 60.0,
) -> str:
    """Restart containerd the ``mode`` way and wait until ``socket_path`` answers again.

    Returns the line to report; raises :class:`HostError` (one line, naming the socket) when
    the restart fails or containerd does not answer within ``timeout`` seconds.
    """
    if mode not in MODES:
        raise UsageError(f'unknown restart mode "{mode}": use one of {", ".join(MODES)}')
    if mode == "none":
        return "did not restart containerd (restart mode none): restart it to load the change"
    deadline = time.monotonic() + timeout
    if mode == "systemd":
        how = f"systemctl restart {unit}"
        try:
            done = subprocess.run(
                ["systemctl", "restart", unit],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise HostError(f"{how} failed: {exc}") from exc
        if done.returncode != 0:
            said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise HostError(f"{how} failed: {said}")
    else:
        sig = parse_signal(signal_name)
        pid = socket_owner(socket_path)
        if pid is None:
            how = f"nothing owned {socket_path} to signal; waited for its supervisor"
        else:
            how = f"{sig.name} to pid {pid}"
            if sig != signals.SIGTERM and _ignores(pid, sig):
                # started under nohup (or by something that ignores it): the signal would do
                # nothing, and the wait below would time out; SIGTERM stops containerd cleanly
                how = f"SIGTERM to pid {pid} (it ignores {sig.name})"
                sig = signals.SIGTERM
            started = _start_time(pid)
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
            if not _wait(lambda: _start_time(pid) != started, deadline):
                raise HostError(
                    f"containerd (pid {pid}) did not exit within {timeout:g}s "
                    f"of {sig.name}: {socket_path} still answers from it"
                )

    def answered() -> bool:
        return answers(socket_path, max(0.5, min(2.0, deadline - time.monotonic())))

    if not _wait(answered, deadline):
        raise HostError(
            f"containerd did not answer on {socket_path} within {timeout:g}s "
            f"after the restart ({how})"
        )
    return f"restarted containerd ({how}); it answers on {socket_path}"
