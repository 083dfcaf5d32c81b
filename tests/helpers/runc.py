"""runc and crun: :class:`Runc` drives any runc-compatible CLI with a private ``--root``.

* :class:`Runc` — runc, crun through :func:`make_crun_wrapper`, or ``nvshim-runtime``; ``run``
  or ``create``/``start``/``state``/``kill``/``delete``, every call may name its own
  ``runtime`` binary, ``log`` file (``--log F --log-format json``) and ``env``, and returns a
  :class:`~tests.helpers.common.RunResult`.
* :func:`make_crun_wrapper` — crun 1.8.1 in a private mount namespace that hides this VM's
  cgroup v2 ``unified`` mount, so crun sees a pure v1 layout.

State roots and the containers' stdio files live under the caller's (pytest's) tmp dirs;
:meth:`Runc.cleanup` force-deletes whatever a test left.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tests.helpers.common import (
    EnvArg,
    PathLike,
    RunResult,
    execute,
    require_binary,
    stdio_paths,
    wait_until,
)

__all__ = ["Runc", "make_crun_wrapper"]


#: runc 1.1.x's message when its re-exec through a cloned copy of its binary hits EBUSY
#: (seen under load on Debian 13's runc 1.1.15): the create did not happen, a retry is safe.
_RUNC_CLONE_RACE = "could not ensure we are a cloned binary"


class Runc:
    """A runc-compatible CLI with a private state root.

    Every method accepts ``runtime`` (binary to call; default: the one given to the
    constructor), ``log`` (adds ``--log <log> --log-format json``; the lines written during the
    call land in ``RunResult.log_lines``) and ``env`` (mapping or ``K=V`` list replacing the
    environment; default: inherited). ``create`` writes the container's stdio to files
    (``<io_dir>/<id>.out``/``.err``) because the container keeps them open;
    :meth:`container_output` reads them.
    """

    def __init__(
        self,
        root_dir: PathLike,
        runtime: PathLike = "runc",
        *,
        io_dir: Optional[PathLike] = None,
        env: EnvArg = None,
    ) -> None:
        self.root_dir = Path(root_dir)
        self.runtime = str(runtime)
        self.io_dir = (
            Path(io_dir)
            if io_dir is not None
            else self.root_dir.with_name(self.root_dir.name + "-io")
        )
        self.env = env
        self._used: Dict[str, Tuple[Optional[PathLike], EnvArg]] = {}
        self.root_dir.mkdir(parents=True, exist_ok=True)
        self.io_dir.mkdir(parents=True, exist_ok=True)

    def argv(
        self, *sub: PathLike, runtime: Optional[PathLike] = None, log: Optional[PathLike] = None
    ) -> List[str]:
        """``[runtime, --root R, (--log L --log-format json), *sub]``."""
        argv = [str(runtime or self.runtime), "--root", str(self.root_dir)]
        if log is not None:
            argv += ["--log", str(log), "--log-format", "json"]
        return argv + [str(s) for s in sub]

    def _call(
        self,
        sub: Sequence[PathLike],
        runtime: Optional[PathLike],
        log: Optional[PathLike],
        env: EnvArg,
        timeout: float,
        **kw: Any,
    ) -> RunResult:
        res = execute(
            self.argv(*sub, runtime=runtime, log=log),
            env=env if env is not None else self.env,
            log=log,
            timeout=timeout,
            **kw,
        )
        if (
            res.rc != 0
            and sub
            and str(sub[0]) in ("create", "run")
            and _RUNC_CLONE_RACE in res.stderr
        ):
            # runc 1.1's own transient failure (its re-exec of a cloned copy of itself found
            # the copy busy): nothing of nvshim's; the container was not made, so once more
            execute(
                self.argv("delete", "--force", str(sub[-1]), runtime=runtime),
                env=env if env is not None else self.env,
                timeout=timeout,
            )
            res = execute(
                self.argv(*sub, runtime=runtime, log=log),
                env=env if env is not None else self.env,
                log=log,
                timeout=timeout,
                **kw,
            )
        return res

    def run(
        self,
        bundle: PathLike,
        id: str,
        *,
        runtime: Optional[PathLike] = None,
        log: Optional[PathLike] = None,
        env: EnvArg = None,
        timeout: float = 60,
    ) -> RunResult:
        """``run --bundle B id`` in the foreground; rc is the container's exit status."""
        self._used[id] = (runtime, env)
        return self._call(["run", "--bundle", bundle, id], runtime, log, env, timeout)

    def create(
        self,
        bundle: PathLike,
        id: str,
        *,
        runtime: Optional[PathLike] = None,
        log: Optional[PathLike] = None,
        env: EnvArg = None,
        pid_file: Optional[PathLike] = None,
        timeout: float = 60,
    ) -> RunResult:
        """``create --bundle B [--pid-file P] id``; stdout/stderr: what appeared during create."""
        self._used[id] = (runtime, env)
        sub: List[PathLike] = ["create", "--bundle", bundle]
        if pid_file is not None:
            sub += ["--pid-file", pid_file]
        return self._call(sub + [id], runtime, log, env, timeout, stdio_to=self.io_dir / id)

    def start(
        self,
        id: str,
        *,
        runtime: Optional[PathLike] = None,
        log: Optional[PathLike] = None,
        env: EnvArg = None,
        timeout: float = 60,
    ) -> RunResult:
        """``start id``."""
        return self._call(["start", id], runtime, log, env, timeout)

    def state(
        self,
        id: str,
        *,
        runtime: Optional[PathLike] = None,
        log: Optional[PathLike] = None,
        env: EnvArg = None,
        timeout: float = 60,
    ) -> RunResult:
        """``state id``; ``.json()`` gives the state object when rc is 0."""
        return self._call(["state", id], runtime, log, env, timeout)

    def kill(
        self,
        id: str,
        signal: str = "KILL",
        *,
        all: bool = False,
        runtime: Optional[PathLike] = None,
        log: Optional[PathLike] = None,
        env: EnvArg = None,
        timeout: float = 60,
    ) -> RunResult:
        """``kill [--all] id SIGNAL``."""
        sub: List[PathLike] = ["kill"] + (["--all"] if all else []) + [id, signal]
        return self._call(sub, runtime, log, env, timeout)

    def delete(
        self,
        id: str,
        *,
        force: bool = False,
        runtime: Optional[PathLike] = None,
        log: Optional[PathLike] = None,
        env: EnvArg = None,
        timeout: float = 60,
    ) -> RunResult:
        """``delete [--force] id``."""
        sub: List[PathLike] = ["delete"] + (["--force"] if force else []) + [id]
        return self._call(sub, runtime, log, env, timeout)

    def wait_stopped(
        self,
        id: str,
        *,
        timeout: float = 30,
        runtime: Optional[PathLike] = None,
        env: EnvArg = None,
    ) -> Dict[str, Any]:
        """Poll ``state`` until the container is ``stopped``; return that state object."""
        last: Dict[str, Any] = {}

        def stopped() -> bool:
            nonlocal last
            res = self.state(id, runtime=runtime, env=env)
            if res.rc != 0:
                raise AssertionError("state failed while waiting\n" + res.describe())
            last = res.json()
            return last.get("status") == "stopped"

        wait_until(stopped, timeout, f"container {id} to stop")
        return last

    def container_output(self, id: str) -> Tuple[str, str]:
        """(stdout, stderr) the container (and its create call) wrote so far."""
        out, err = stdio_paths(self.io_dir / id)
        return (
            out.read_text(errors="replace") if out.exists() else "",
            err.read_text(errors="replace") if err.exists() else "",
        )

    def run_detached(
        self,
        bundle: PathLike,
        id: str,
        *,
        runtime: Optional[PathLike] = None,
        log: Optional[PathLike] = None,
        env: EnvArg = None,
        timeout: float = 60,
    ) -> RunResult:
        """create → start → wait for ``stopped`` → delete, like a shim does.

        Returns the first failing step's result, else a result whose stdout/stderr are the
        container's output, rc 0 (runc cannot report a detached container's exit status) and
        log_lines from all steps.
        """
        kw: Dict[str, Any] = {"runtime": runtime, "log": log, "env": env}
        logs: List[Dict[str, Any]] = []
        created = self.create(bundle, id, timeout=timeout, **kw)
        logs += created.log_lines
        if created.rc != 0:
            return created
        started = self.start(id, timeout=timeout, **kw)
        logs += started.log_lines
        if started.rc != 0:
            self.delete(id, force=True, runtime=runtime, env=env)
            return started
        self.wait_stopped(id, timeout=timeout, runtime=runtime, env=env)
        deleted = self.delete(id, timeout=timeout, **kw)
        logs += deleted.log_lines
        if deleted.rc != 0:
            return deleted
        out, err = self.container_output(id)
        return RunResult(created.argv, 0, out, err, tuple(logs))

    def list_ids(self) -> List[str]:
        """Ids of the containers under this root (``list -q``)."""
        res = execute(self.argv("list", "-q", runtime=self.runtime), env=self.env)
        return res.stdout.split() if res.rc == 0 else []

    def cleanup(self) -> None:
        """Force-delete every container left under this root (fixture teardown): each id this
        object created with the runtime/env it was created with, then whatever ``list`` shows."""
        for cid, (runtime, env) in self._used.items():
            if (self.root_dir / cid).exists():
                self.delete(cid, force=True, runtime=runtime, env=env)
        for cid in self.list_ids():
            self.delete(cid, force=True)


def make_crun_wrapper(dir: PathLike, crun: Optional[str] = None) -> Path:
    """Write ``<dir>/crunw``: crun in a private mount ns without /sys/fs/cgroup/unified.

    crun (1.8.1, 1.21 and 1.28) refuses this VM's cgroup "hybrid" layout (the unified hierarchy
    holds ``hugetlb``); hiding it in a private mount namespace gives crun a pure v1 view and
    changes nothing for the rest of the machine. Accepts the same CLI as crun. ``crun``: the
    binary (default: crun on PATH).
    """
    crun = crun or require_binary("crun")
    unshare = require_binary("unshare")
    path = Path(dir) / "crunw"
    path.write_text(
        "#!/bin/sh\n"
        "# crun 1.8.1 refuses cgroup hybrid mode; see tests/helpers/runc.py\n"
        f"exec {unshare} -m --propagation private sh -c "
        f'\'umount /sys/fs/cgroup/unified 2>/dev/null; exec {crun} "$@"\' crun "$@"\n'
    )
    path.chmod(0o755)
    return path
