"""A private containerd daemon (the machine's 1.6, or Debian 13's 1.7) driven through ``ctr``.

* :func:`containerd_private_config` — the config (version 2) that keeps a test daemon off the
  host's: own root, state, sockets and opt dir; :mod:`tests.helpers.cri` builds its CRI
  daemon's config on it.
* :class:`Containerd` — the daemon (own root/state/sockets/opt dir, unique namespace,
  ``restrict_oom_score_adj = true``; ``bin_dir`` picks another containerd, its shim and
  ctr: :func:`tests.helpers.debian13.containerd_17_dir`) and :meth:`Containerd.ctr_run`, which runs
  ``ctr run --rm --rootfs --runc-binary X --runc-root <private> --fifo-dir <private>``.
  The runtime runs with the daemon's env, not ctr's: see
  :func:`~tests.helpers.common.make_env_wrapper`.

What a session leaves behind: containerd 1.6 and 1.7 always create ``/run/containerd/s`` for shim
sockets (not configurable); the sockets go with their shims and :meth:`Containerd.stop`
removes ``/run/containerd/s`` and ``/run/containerd`` again when it created them and they are
empty. The cgroup ctr puts containers under (``/<namespace>``) is removed at stop.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from tests.helpers.bundle import DEFAULT_PATH
from tests.helpers.common import (
    EnvArg,
    PathLike,
    RunResult,
    env_dict,
    execute,
    pids_with_arg,
    remove_cgroup_tree,
    require_binary,
    terminate_pids,
    unique_id,
    wait_until,
)

__all__ = ["Containerd", "containerd_private_config", "private_nri"]


def containerd_private_config(base: PathLike) -> str:
    """The part of a test containerd's config (version 2) that keeps it off the host's:
    its own root, state, sockets and opt dir under ``base``. Ends inside ``[plugins]``,
    so a caller appends its own plugin tables."""
    return f"""\
version = 2
root = "{base}/root"
state = "{base}/state"
[grpc]
  address = "{base}/containerd.sock"
[ttrpc]
  address = "{base}/containerd-ttrpc.sock"
[debug]
  address = "{base}/debug.sock"
  level = "info"
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{base}/opt"
"""


def private_nri(base: PathLike) -> str:
    """A plugin table (to append inside ``[plugins]``) that moves NRI's socket under ``base``:
    containerd 2 runs NRI by default and would otherwise leave ``/var/run/nri/nri.sock``."""
    return f"""\
  [plugins."io.containerd.nri.v1.nri"]
    socket_path = "{base}/nri.sock"
"""


_CONTAINERD_CRI = """\
  [plugins."io.containerd.grpc.v1.cri"]
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "{base}/cni/net.d"
"""

_RUN_CONTAINERD = Path("/run/containerd")


@dataclass
class Containerd:
    """A private containerd daemon under ``base`` (call :meth:`start`, then :meth:`stop`)."""

    base: Path
    namespace: str = field(default_factory=lambda: unique_id("nvshim-e2e"))
    config_text: Optional[str] = None
    """The daemon's whole config (default: the private one above, for ``ctr run``)."""
    bin_dir: Optional[Path] = None
    """Where ``containerd``, ``containerd-shim-runc-v2`` and ``ctr`` come from (default: PATH,
    the machine's 1.6). It goes first on the daemon's PATH: containerd finds its shim there."""
    pid: Optional[int] = None
    _proc: Optional["subprocess.Popen[bytes]"] = None
    _created_run_dirs: List[Path] = field(default_factory=list)

    @property
    def address(self) -> str:
        return str(self.base / "containerd.sock")

    @property
    def runc_root(self) -> Path:
        """Where runc keeps state for ctr-run containers (``ctr run --runc-root``)."""
        return self.base / "runc-root"

    @property
    def fifo_dir(self) -> Path:
        return self.base / "fifo"

    @property
    def log_path(self) -> Path:
        """The daemon's stdout/stderr."""
        return self.base / "containerd.log"

    def start(self, timeout: float = 30) -> None:
        """Write the config, start the daemon, wait until ``ctr version`` answers."""
        if self.bin_dir is None:
            binary = require_binary("containerd")
            require_binary("ctr")
            env = None
        else:
            binary = str(self.bin_dir / "containerd")
            env = {**os.environ, "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}"}
        if len(self.address) > 100:
            raise AssertionError(f"containerd socket path too long: {self.address}")
        for d in (self.base, self.runc_root, self.fifo_dir, self.base / "cni" / "net.d"):
            d.mkdir(parents=True, exist_ok=True)
        for d in (_RUN_CONTAINERD, _RUN_CONTAINERD / "s"):
            if not d.exists():
                self._created_run_dirs.insert(0, d)
        config = self.base / "config.toml"
        config.write_text(
            self.config_text
            or containerd_private_config(self.base) + _CONTAINERD_CRI.format(base=self.base)
        )
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [binary, "--config", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                env=env,
            )
        self.pid = self._proc.pid

        def up() -> bool:
            if self._proc is not None and self._proc.poll() is not None:
                raise AssertionError(
                    f"containerd exited with {self._proc.returncode}:\n"
                    + self.log_path.read_text(errors="replace")[-3000:]
                )
            return self.ctr("version", timeout=5).rc == 0

        wait_until(up, timeout, "containerd to answer `ctr version`", interval=0.1)

    def ctr(self, *args: PathLike, timeout: float = 60, env: EnvArg = None) -> RunResult:
        """``ctr --address A --namespace NS *args``."""
        ctr = str(self.bin_dir / "ctr") if self.bin_dir is not None else "ctr"
        return execute(
            [ctr, "--address", self.address, "--namespace", self.namespace, *args],
            env=env,
            timeout=timeout,
        )

    def ctr_run(
        self,
        rootfs: PathLike,
        id: str,
        args: Sequence[str],
        *,
        env: EnvArg = None,
        mounts: Iterable[Union[Tuple[PathLike, str], Tuple[PathLike, str, str]]] = (),
        runc_binary: Optional[PathLike] = None,
        devices: Iterable[PathLike] = (),
        annotations: Optional[Mapping[str, str]] = None,
        extra_flags: Sequence[str] = (),
        timeout: float = 60,
    ) -> RunResult:
        """``ctr run --rm --rootfs ... <rootfs> <id> <args>``; rc is the container's exit status.

        ``env``: container env (mapping or ``K=V`` list; PATH is added when missing — with
        ``--rootfs`` there is no image config). ``mounts``: ``(src, dst)`` → ``rbind:ro`` bind
        mount, or ``(src, dst, "rbind:rw")``. ``runc_binary``: the runtime the shim calls
        (default: runc on PATH); it runs with containerd's env, cwd = bundle, and
        ``--root <runc_root>/<namespace> --log <bundle>/log.json --log-format json``.
        ``devices``: host device paths (same path inside). ctr's output is the container's
        output plus ctr's own error line (``ctr: failed to create shim task: ...``).
        """
        runtime = str(runc_binary) if runc_binary is not None else require_binary("runc")
        flags: List[str] = [
            "--rm",
            "--rootfs",
            "--runc-binary",
            runtime,
            "--runc-root",
            str(self.runc_root),
            "--fifo-dir",
            str(self.fifo_dir),
        ]
        env_items = env_dict(env) or {}
        if "PATH" not in env_items:
            env_items = {"PATH": DEFAULT_PATH.split("=", 1)[1], **env_items}
        for k, v in env_items.items():
            flags += ["--env", f"{k}={v}"]
        for m in mounts:
            src, dst = m[0], m[1]
            options = m[2] if len(m) > 2 else "rbind:ro"  # type: ignore[misc]
            flags += ["--mount", f"type=bind,src={src},dst={dst},options={options}"]
        for d in devices:
            flags += ["--device", str(d)]
        for k, v in (annotations or {}).items():
            flags += ["--annotation", f"{k}={v}"]
        flags += list(extra_flags)
        return self.ctr("run", *flags, str(rootfs), id, *args, timeout=timeout)

    def cleanup_containers(self) -> None:
        """Kill and delete every task and container left in this namespace."""
        listed = self.ctr("containers", "ls", "-q", timeout=30)
        for cid in listed.stdout.split() if listed.rc == 0 else []:
            self.ctr("tasks", "kill", "--signal", "SIGKILL", cid, timeout=30)
            self.ctr("tasks", "delete", "--force", cid, timeout=30)
            self.ctr("containers", "delete", cid, timeout=30)

    def stop(self, timeout: float = 30) -> None:
        """Clean up containers, TERM the daemon and wait for it and its shims to be gone."""
        if self._proc is None:
            return
        with contextlib.suppress(Exception):
            self.cleanup_containers()
            self.ctr("namespaces", "remove", self.namespace, timeout=30)
        proc, self._proc = self._proc, None
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
        # Shims started by this daemon carry its address in their argv.
        terminate_pids(pids_with_arg(self.address))
        # ctr puts containers in the cgroup /<namespace>/<id>; runc removes only <id>.
        remove_cgroup_tree(self.namespace)
        for d in self._created_run_dirs:
            with contextlib.suppress(OSError):
                d.rmdir()
