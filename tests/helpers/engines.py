"""Runners for real container engines, each returning a :class:`RunResult`.

* :class:`Runc` — drives any runc-compatible binary (runc, crun through :func:`make_crun_wrapper`,
  ``nvshim-runtime``) with a private ``--root``; ``run`` or ``create``/``start``/``state``/
  ``kill``/``delete``, every call may name its own ``runtime`` binary, ``log`` file (``--log F
  --log-format json``) and ``env``.
* :class:`Containerd` — a private containerd 1.6 daemon (own root/state/sockets/opt dir, unique
  namespace, ``restrict_oom_score_adj = true``) and :meth:`Containerd.ctr_run`, which runs
  ``ctr run --rm --rootfs --runc-binary X --runc-root <private> --fifo-dir <private>``.
* :class:`Podman` — podman 4.3.1 with private ``--root/--runroot/--tmpdir``, cgroupfs (with a
  private ``--cgroup-parent``), file events, overlay storage, and :meth:`Podman.podman_run`
  (``--rootfs``, ``--network none``, the ulimits this VM needs). :func:`installed_cdi_spec`
  puts a CDI spec where podman reads it.
* :func:`write_nvshim_config` / :func:`nvshim_config_env` — an nvshim YAML config and the env
  (``NVSHIM_CONFIG``) to run ``nvshim-runtime`` with; :func:`make_env_wrapper` bakes env into
  a script for engines that do not pass the caller's env to the runtime (containerd passes its
  daemon's env, not ctr's).

Nothing here sleeps for timing: waits poll a condition with a deadline.

What a session leaves behind: containerd 1.6 always creates ``/run/containerd/s`` for shim
sockets (not configurable); the sockets go with their shims and :meth:`Containerd.stop`
removes ``/run/containerd/s`` and ``/run/containerd`` again when it created them and they are
empty; podman passes no ``--root`` to its runtime, so runc/crun use ``/run/runc``/``/run/crun``,
which :meth:`Podman.cleanup` removes the same way. The cgroups ctr (``/<namespace>``) and
podman (``--cgroup-parent``) leave are removed at stop/cleanup. Everything else (runc/crun
roots, fifos, podman storage) lives under pytest's tmp dirs.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import pytest
import yaml

from tests.helpers.bundle import DEFAULT_PATH

__all__ = [
    "CDI_DIR",
    "Containerd",
    "Podman",
    "Runc",
    "RunResult",
    "installed_cdi_spec",
    "make_crun_wrapper",
    "make_env_wrapper",
    "make_failing_runtime",
    "make_mount_targets",
    "nvshim_config_env",
    "pids_with_arg",
    "read_only_bind",
    "require_binary",
    "require_root",
    "rootwork_by",
    "unique_id",
    "wait_until",
    "write_nvshim_config",
]

PathLike = Union[str, Path]
EnvArg = Union[Mapping[str, str], Sequence[str], None]

CDI_DIR = Path("/var/run/cdi")
"""A directory podman 4.3.1 reads CDI specs from (the other is /etc/cdi)."""

_counter = itertools.count()


# --------------------------------------------------------------------------- basics


def require_root() -> None:
    """Skip the calling test unless running as root."""
    if os.geteuid() != 0:
        pytest.skip("e2e engine tests need root (containers, cgroups, mounts)")


def require_binary(name: str) -> str:
    """Absolute path of ``name`` on PATH, or skip the calling test saying it is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (not found on PATH)")
    return path


def unique_id(prefix: str = "t") -> str:
    """A container id unique in this process and valid for runc, crun, ctr and podman."""
    return f"{prefix}-{os.getpid()}-{next(_counter)}-{uuid.uuid4().hex[:6]}"


def wait_until(
    predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05
) -> None:
    """Poll ``predicate`` until true; raise AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def _pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a zombie child of ours is reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state == "Z":
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


def pids_with_arg(needle: str) -> List[int]:
    """PIDs whose command line contains ``needle`` as one argument or inside one."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if any(needle.encode() in a for a in args):
            pids.append(int(entry))
    return pids


def _terminate_pids(pids: Iterable[int], timeout: float = 10) -> None:
    pids = list(pids)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not any(_pid_alive(p) for p in pids), timeout, "processes to exit")
            return


def _mounts_under(path: Path) -> List[str]:
    """Mount points at or below ``path`` (from /proc/self/mountinfo)."""
    prefix = str(path.resolve())
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return found


def _remove_cgroup_tree(name: str) -> None:
    """rmdir ``/sys/fs/cgroup/<hierarchy>/<name>`` and its children, deepest first, when empty."""
    root = Path("/sys/fs/cgroup")
    if not root.is_dir() or not name.strip("/"):
        return
    for hierarchy in root.iterdir():
        top = hierarchy / name.strip("/")
        if not top.is_dir() or top.is_symlink():
            continue
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)


@dataclass(frozen=True)
class RunResult:
    """What one engine command did."""

    argv: Tuple[str, ...]
    rc: int
    stdout: str
    stderr: str
    log_lines: Tuple[Dict[str, Any], ...] = ()
    """JSON lines the runtime appended to its ``--log`` file during this call (a line that is
    not JSON appears as ``{"raw": line}``)."""

    @property
    def output(self) -> str:
        """stdout followed by stderr."""
        return self.stdout + self.stderr

    @property
    def log_errors(self) -> List[str]:
        """``msg`` of every ``"level": "error"`` line in :attr:`log_lines`."""
        return [str(x.get("msg")) for x in self.log_lines if x.get("level") == "error"]

    def json(self) -> Any:
        """stdout parsed as JSON (e.g. ``runc state``)."""
        return json.loads(self.stdout)

    def describe(self) -> str:
        """A multi-line account for assertion messages."""
        return (
            f"argv: {' '.join(self.argv)}\nrc: {self.rc}\n--- stdout\n{self.stdout}"
            f"--- stderr\n{self.stderr}--- log\n"
            + "".join(json.dumps(x) + "\n" for x in self.log_lines)
        )

    def check(self) -> "RunResult":
        """Return self when rc is 0, else raise AssertionError with :meth:`describe`."""
        if self.rc != 0:
            raise AssertionError("command failed\n" + self.describe())
        return self


def _env(env: EnvArg) -> Optional[Dict[str, str]]:
    if env is None:
        return None
    if isinstance(env, Mapping):
        return dict(env)
    return dict(e.split("=", 1) for e in env)


def _read_log(path: Optional[Path], offset: int) -> Tuple[Dict[str, Any], ...]:
    if path is None or not path.exists():
        return ()
    with open(path, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    lines: List[Dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            obj = {"raw": line}
        lines.append(obj if isinstance(obj, dict) else {"raw": line})
    return tuple(lines)


def _execute(
    argv: Sequence[str],
    *,
    env: EnvArg = None,
    log: Optional[PathLike] = None,
    timeout: float = 60,
    cwd: Optional[PathLike] = None,
    stdio_to: Optional[Path] = None,
    stdin: Optional[str] = None,
) -> RunResult:
    """Run argv; capture stdout/stderr (through files named ``stdio_to``.out/.err if given)."""
    log_path = Path(log) if log is not None else None
    offset = log_path.stat().st_size if log_path is not None and log_path.exists() else 0
    argv = [str(a) for a in argv]
    if stdio_to is None:
        proc = subprocess.run(
            argv,
            env=_env(env),
            cwd=cwd,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        out, err, rc = proc.stdout, proc.stderr, proc.returncode
    else:
        out_path, err_path = _stdio_paths(stdio_to)
        with open(out_path, "ab") as o, open(err_path, "ab") as e:
            o_off, e_off = o.tell(), e.tell()
            rc = subprocess.run(
                argv,
                env=_env(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=o,
                stderr=e,
                timeout=timeout,
            ).returncode
        out = _read_from(out_path, o_off)
        err = _read_from(err_path, e_off)
    return RunResult(tuple(argv), rc, out, err, _read_log(log_path, offset))


def _stdio_paths(stem: Path) -> Tuple[Path, Path]:
    return stem.with_name(stem.name + ".out"), stem.with_name(stem.name + ".err")


def _read_from(path: Path, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


# --------------------------------------------------------------------------- runc / crun


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
        self.io_dir = Path(io_dir) if io_dir is not None else self.root_dir.with_name(
            self.root_dir.name + "-io"
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
        return _execute(
            self.argv(*sub, runtime=runtime, log=log),
            env=env if env is not None else self.env,
            log=log,
            timeout=timeout,
            **kw,
        )

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
        """``create --bundle B [--pid-file P] id``; stdout/stderr are what appeared during create."""
        self._used[id] = (runtime, env)
        sub: List[PathLike] = ["create", "--bundle", bundle]
        if pid_file is not None:
            sub += ["--pid-file", pid_file]
        return self._call(sub + [id], runtime, log, env, timeout, stdio_to=self.io_dir / id)

    def start(self, id: str, *, runtime: Optional[PathLike] = None,
              log: Optional[PathLike] = None, env: EnvArg = None,
              timeout: float = 60) -> RunResult:
        """``start id``."""
        return self._call(["start", id], runtime, log, env, timeout)

    def state(self, id: str, *, runtime: Optional[PathLike] = None,
              log: Optional[PathLike] = None, env: EnvArg = None,
              timeout: float = 60) -> RunResult:
        """``state id``; ``.json()`` gives the state object when rc is 0."""
        return self._call(["state", id], runtime, log, env, timeout)

    def kill(self, id: str, signal: str = "KILL", *, all: bool = False,
             runtime: Optional[PathLike] = None, log: Optional[PathLike] = None,
             env: EnvArg = None, timeout: float = 60) -> RunResult:
        """``kill [--all] id SIGNAL``."""
        sub: List[PathLike] = ["kill"] + (["--all"] if all else []) + [id, signal]
        return self._call(sub, runtime, log, env, timeout)

    def delete(self, id: str, *, force: bool = False, runtime: Optional[PathLike] = None,
               log: Optional[PathLike] = None, env: EnvArg = None,
               timeout: float = 60) -> RunResult:
        """``delete [--force] id``."""
        sub: List[PathLike] = ["delete"] + (["--force"] if force else []) + [id]
        return self._call(sub, runtime, log, env, timeout)

    def wait_stopped(self, id: str, *, timeout: float = 30, runtime: Optional[PathLike] = None,
                     env: EnvArg = None) -> Dict[str, Any]:
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
        out, err = _stdio_paths(self.io_dir / id)
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
        res = _execute(self.argv("list", "-q", runtime=self.runtime), env=self.env)
        return res.stdout.split() if res.rc == 0 else []

    def cleanup(self) -> None:
        """Force-delete every container left under this root (fixture teardown): each id this
        object created with the runtime/env it was created with, then whatever ``list`` shows."""
        for cid, (runtime, env) in self._used.items():
            if (self.root_dir / cid).exists():
                self.delete(cid, force=True, runtime=runtime, env=env)
        for cid in self.list_ids():
            self.delete(cid, force=True)


def make_crun_wrapper(dir: PathLike) -> Path:
    """Write ``<dir>/crunw``: crun in a private mount ns without /sys/fs/cgroup/unified.

    crun 1.8.1 refuses this VM's cgroup "hybrid" layout (the unified hierarchy holds
    ``hugetlb``); hiding it in a private mount namespace gives crun a pure v1 view and changes
    nothing for the rest of the machine. Accepts the same CLI as crun.
    """
    crun = require_binary("crun")
    unshare = require_binary("unshare")
    path = Path(dir) / "crunw"
    path.write_text(
        "#!/bin/sh\n"
        "# crun 1.8.1 refuses cgroup hybrid mode; see tests/helpers/engines.py\n"
        f"exec {unshare} -m --propagation private sh -c "
        f"'umount /sys/fs/cgroup/unified 2>/dev/null; exec {crun} \"$@\"' crun \"$@\"\n"
    )
    path.chmod(0o755)
    return path


def make_env_wrapper(path: PathLike, binary: PathLike, env: Mapping[str, str]) -> Path:
    """Write an executable script at ``path`` that exports ``env`` and execs ``binary "$@"``.

    For engines whose runtime env is not the caller's (containerd: the daemon's env).
    """
    lines = ["#!/bin/sh"] + [f"export {k}={_shq(str(v))}" for k, v in env.items()]
    lines.append(f'exec {_shq(str(binary))} "$@"')
    p = Path(path)
    p.write_text("\n".join(lines) + "\n")
    p.chmod(0o755)
    return p


def make_failing_runtime(path: PathLike, message: str, *, rc: int = 1,
                         to_log: bool = True, to_stderr: bool = True) -> Path:
    """Write a runtime stand-in that fails every command with ``message``.

    With ``to_log`` it appends ``{"level":"error","msg":message,...}`` to its ``--log`` file (as
    runc does); with ``to_stderr`` it also prints the message on stderr; exits ``rc``.
    """
    msg_json = json.dumps({"level": "error", "msg": message, "time": "1970-01-01T00:00:00Z"})
    script = ["#!/bin/sh", "log=", 'while [ $# -gt 0 ]; do',
              '  case "$1" in --log) log="$2"; shift;; --log=*) log="${1#--log=}";; esac',
              "  shift", "done"]
    if to_log:
        script.append(f"[ -n \"$log\" ] && printf '%s\\n' {_shq(msg_json)} >> \"$log\"")
    if to_stderr:
        script.append(f"printf '%s\\n' {_shq(message)} >&2")
    script.append(f"exit {rc}")
    p = Path(path)
    p.write_text("\n".join(script) + "\n")
    p.chmod(0o755)
    return p


def _shq(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


# --------------------------------------------------------------------------- nvshim config


def write_nvshim_config(dir: PathLike, settings: Mapping[str, Any],
                        name: str = "config.yaml") -> Path:
    """Dump ``settings`` (YAML keys, e.g. ``{"runtimes": [crunw], "debug-log": ...}``) to
    ``<dir>/<name>``; return its path. ``grants-journal`` defaults to ``<dir>/grants.jsonl``."""
    path = Path(dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    # Tests never write the node's real journal (/var/lib/nvshim): keep it next to the config.
    settings = {"grants-journal": str(path.parent / "grants.jsonl"), **settings}
    data = {k: ([str(x) for x in v] if isinstance(v, (list, tuple)) else
                str(v) if isinstance(v, Path) else v) for k, v in settings.items()}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def nvshim_config_env(dir: PathLike, settings: Mapping[str, Any],
                      base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Write the config (see :func:`write_nvshim_config`) and return ``base`` (default
    ``os.environ``) plus ``NVSHIM_CONFIG=<path>``."""
    path = write_nvshim_config(dir, settings)
    env = dict(os.environ if base is None else base)
    env["NVSHIM_CONFIG"] = str(path)
    return env


# --------------------------------------------------------------------------- containerd


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
    """A private containerd 1.6 daemon under ``base`` (call :meth:`start`, then :meth:`stop`)."""

    base: Path
    namespace: str = field(default_factory=lambda: unique_id("nvshim-e2e"))
    config_text: Optional[str] = None
    """The daemon's whole config (default: the private one above, for ``ctr run``)."""
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
        binary = require_binary("containerd")
        require_binary("ctr")
        if len(self.address) > 100:
            raise AssertionError(f"containerd socket path too long: {self.address}")
        for d in (self.base, self.runc_root, self.fifo_dir, self.base / "cni" / "net.d"):
            d.mkdir(parents=True, exist_ok=True)
        for d in (_RUN_CONTAINERD, _RUN_CONTAINERD / "s"):
            if not d.exists():
                self._created_run_dirs.insert(0, d)
        config = self.base / "config.toml"
        config.write_text(self.config_text or containerd_private_config(self.base)
                          + _CONTAINERD_CRI.format(base=self.base))
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [binary, "--config", str(config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True,
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
        return _execute(
            ["ctr", "--address", self.address, "--namespace", self.namespace, *args],
            env=env, timeout=timeout,
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
            "--rm", "--rootfs", "--runc-binary", runtime,
            "--runc-root", str(self.runc_root), "--fifo-dir", str(self.fifo_dir),
        ]
        env_items = _env(env) or {}
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
        _terminate_pids(pids_with_arg(self.address))
        # ctr puts containers in the cgroup /<namespace>/<id>; runc removes only <id>.
        _remove_cgroup_tree(self.namespace)
        for d in self._created_run_dirs:
            with contextlib.suppress(OSError):
                d.rmdir()


# --------------------------------------------------------------------------- podman


_DEFAULT_STATE_DIRS = (Path("/run/runc"), Path("/run/crun"))


@dataclass
class Podman:
    """podman 4.3.1 with private storage under ``base`` (nothing under /var/lib/containers)."""

    base: Path
    runtime: Optional[PathLike] = None
    """Default ``--runtime`` (None: runc on PATH)."""
    cgroup_parent: str = field(default_factory=lambda: "/" + unique_id("nvshim-e2e-podman"))
    """``--cgroup-parent`` of every container (conmon's cgroup goes under it too), removed by
    :meth:`cleanup`; podman's default ``/libpod_parent`` would stay behind."""
    runroot: Path = field(init=False)
    """``--runroot``: podman refuses one longer than 50 characters, so it is a short
    ``/tmp/nvshim-podrun-*`` directory (removed by :meth:`cleanup`), not under ``base``."""
    _absent_state_dirs: List[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        # podman passes no --root, so runc/crun keep state in their default dirs; remember
        # which of those did not exist yet so cleanup() can remove them again (when empty).
        self._absent_state_dirs = [d for d in _DEFAULT_STATE_DIRS if not d.exists()]
        self.base = Path(self.base)
        self.base.mkdir(parents=True, exist_ok=True)
        self.runroot = Path(tempfile.mkdtemp(prefix="nvshim-podrun-", dir="/tmp"))

    def global_args(self, runtime: Optional[PathLike] = None) -> List[str]:
        """The global flags every call gets."""
        rt = runtime or self.runtime or require_binary("runc")
        return [
            "--root", str(self.base / "root"),
            "--runroot", str(self.runroot),
            "--tmpdir", str(self.base / "tmp"),
            "--cgroup-manager", "cgroupfs",
            "--events-backend", "file",
            "--storage-driver", "overlay",
            "--runtime", str(rt),
        ]

    def podman(self, *args: PathLike, runtime: Optional[PathLike] = None,
               env: EnvArg = None, log_level: Optional[str] = None,
               timeout: float = 120) -> RunResult:
        """``podman <global flags> [--log-level L] *args``; ``env`` is podman's (and so the
        runtime's) environment."""
        argv = [require_binary("podman"), *self.global_args(runtime)]
        if log_level:
            argv += ["--log-level", log_level]
        return _execute([*argv, *args], env=env, timeout=timeout, cwd=self.base)

    def podman_run(
        self,
        rootfs: PathLike,
        args: Sequence[str],
        *,
        env: EnvArg = None,
        devices: Iterable[str] = (),
        runtime: Optional[PathLike] = None,
        mounts: Iterable[Union[Tuple[PathLike, str], Tuple[PathLike, str, str]]] = (),
        annotations: Optional[Mapping[str, str]] = None,
        extra_flags: Sequence[str] = (),
        podman_env: EnvArg = None,
        log_level: Optional[str] = None,
        timeout: float = 120,
    ) -> RunResult:
        """``podman run --rm --network none --ulimit ... [--device D] --rootfs R args``.

        ``env``: container env (``--env``). ``devices``: ``--device`` values, CDI names
        (``nvidia.com/gpu=0``, see :func:`installed_cdi_spec`) or host paths. ``mounts``:
        ``(src, dst)`` → ``--volume src:dst:ro``, or ``(src, dst, "rw")``. ``podman_env`` is the
        env of podman and so of the runtime it calls (e.g. :func:`nvshim_config_env`).
        Podman shows the runtime's stderr, not its ``--log`` (it passes none).
        """
        flags: List[str] = [
            "--rm", "--network", "none", "--cgroup-parent", self.cgroup_parent,
            "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096",
        ]
        for k, v in (_env(env) or {}).items():
            flags += ["--env", f"{k}={v}"]
        for d in devices:
            flags += ["--device", d]
        for m in mounts:
            opts = m[2] if len(m) > 2 else "ro"  # type: ignore[misc]
            flags += ["--volume", f"{m[0]}:{m[1]}:{opts}"]
        for k, v in (annotations or {}).items():
            flags += ["--annotation", f"{k}={v}"]
        flags += list(extra_flags)
        return self.podman(
            "run", *flags, "--rootfs", str(rootfs), *args,
            runtime=runtime, env=podman_env, log_level=log_level, timeout=timeout,
        )

    def cleanup(self) -> None:
        """Remove all containers of this storage and wait for podman helpers to exit."""
        if (self.base / "root").exists():
            self.podman("rm", "--all", "--force", timeout=60)
        # conmon and `podman container cleanup` carry our --root in their argv.
        needle = str(self.base / "root")
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not pids_with_arg(needle), 15, "podman helper processes to exit")
        _terminate_pids(pids_with_arg(needle))
        _remove_cgroup_tree(self.cgroup_parent)
        for d in self._absent_state_dirs:
            with contextlib.suppress(OSError):
                d.rmdir()
        if self.runroot.exists() and not _mounts_under(self.runroot):
            shutil.rmtree(self.runroot, ignore_errors=True)


@contextlib.contextmanager
def installed_cdi_spec(spec: Union[PathLike, str], name: str) -> Iterator[Path]:
    """Install a CDI spec as ``/var/run/cdi/<name>`` for the duration of the block.

    ``spec`` is a path to a spec file or the spec's text (YAML or JSON; ``name`` should end in
    ``.yaml`` or ``.json`` to match). Refuses (AssertionError) to overwrite an existing file;
    removes the file afterwards, and the directory too when this created it and it is empty.
    """
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"bad CDI spec file name {name!r}")
    text = Path(spec).read_text() if isinstance(spec, Path) or (
        "\n" not in str(spec) and Path(str(spec)).is_file()
    ) else str(spec)
    created_dir = not CDI_DIR.exists()
    CDI_DIR.mkdir(parents=True, exist_ok=True)
    target = CDI_DIR / name
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise AssertionError(f"refusing to overwrite existing CDI spec {target}") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        yield target
    finally:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        if created_dir:
            with contextlib.suppress(OSError):
                CDI_DIR.rmdir()


# --------------------------------------------------------------------------- rootfs work


@contextlib.contextmanager
def read_only_bind(path: PathLike) -> Iterator[Path]:
    """Make ``path`` a read-only bind mount of itself for the ``with`` body (then unmount).

    What a read-only rootfs looks like to nvshim-runtime (a squashfs, a read-only bind): the
    host cannot write it, so the in-root work goes to the createContainer hook.
    """
    target = Path(path)
    subprocess.run(["mount", "--bind", str(target), str(target)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(target), str(target)], check=True)
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def make_mount_targets(bundle: PathLike, env: Mapping[str, str]) -> None:
    """Create, in ``bundle``'s rootfs, an empty file for each driver file nvshim would mount
    (as an image that already has them): runc cannot create mount targets in a read-only
    rootfs. ``env`` holds the ``NVSHIM_CONFIG`` to plan with."""
    from nvshim.config import load_config
    from nvshim.create import plan_create

    from nvshim import _inroot

    plan = plan_create(str(bundle), load_config(env["NVSHIM_CONFIG"]))
    # resolved as if chrooted, like runc does: an image symlink must not send us to the host
    with _inroot.open_root(str(Path(bundle) / "rootfs")) as root:
        for mount in plan.edits.mounts:
            if os.path.isdir(mount.host_path):
                os.close(_inroot.resolve_dir(root, mount.container_path, create=True))
            elif _inroot.read_file(root, mount.container_path) is None:
                _inroot.write_file_atomic(root, mount.container_path, b"")


def rootwork_by(debug_log: PathLike) -> List[str]:
    """Who did the in-root work of each create logged in nvshim's debug log, in order
    (``runtime`` or ``hook``), from its ``rootfs`` events."""
    out = []
    for line in Path(debug_log).read_text().splitlines():
        record = json.loads(line)
        if record.get("event") == "rootfs":
            out.append(record["by"])
    return out
