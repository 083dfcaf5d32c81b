"""What every engine runner shares: skips, ids, polling, process and cgroup cleanup,
running a command and capturing it as a :class:`RunResult`, and runtime stand-ins.

* :func:`require_root` / :func:`require_binary` skip a test the machine cannot run;
  :func:`unique_id` names containers so concurrent sessions never collide; :func:`wait_until`
  polls a condition with a deadline (nothing here sleeps for timing).
* :func:`execute` runs an argv (stdio captured, optionally through files for a container that
  keeps them open) and returns a :class:`RunResult` with the JSON lines a runtime appended to
  its ``--log`` meanwhile.
* :func:`pids_with_arg`, :func:`terminate_pids`, :func:`mounts_under` and
  :func:`remove_cgroup_tree` are the teardown tools of the engine modules
  (:mod:`tests.helpers.runc`, :mod:`tests.helpers.containerd`, :mod:`tests.helpers.podman`,
  :mod:`tests.helpers.docker`).
* :func:`cache_dir` / :func:`locked`: where slow things a test needs (downloaded packages,
  built node roots) are kept between runs, and the flock two pytest processes build them
  under.
* :func:`make_env_wrapper` bakes env into a script for engines that do not pass the caller's
  env to the runtime (containerd and dockerd pass their daemon's); :func:`make_failing_runtime`
  writes a runtime that fails every command as runc would.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
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

__all__ = [
    "EnvArg",
    "PathLike",
    "RunResult",
    "env_dict",
    "execute",
    "locked",
    "make_env_wrapper",
    "make_failing_runtime",
    "mounts_under",
    "pids_with_arg",
    "remove_cgroup_tree",
    "require_binary",
    "require_root",
    "stdio_paths",
    "terminate_pids",
    "cache_dir",
    "unique_id",
    "wait_until",
]

PathLike = Union[str, Path]
EnvArg = Union[Mapping[str, str], Sequence[str], None]

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


def cache_dir(name: str, env_var: str) -> Path:
    """Where the tests keep ``name`` between runs: ``$<env_var>`` when set, else
    ``${XDG_CACHE_HOME:-~/.cache}/nvshim-tests/<name>`` (created by whoever fills it)."""
    explicit = os.environ.get(env_var)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "nvshim-tests" / name


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (created if missing) for the ``with`` body."""
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


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


def terminate_pids(pids: Iterable[int], timeout: float = 10) -> None:
    """SIGTERM ``pids``, then SIGKILL those still alive after ``timeout`` s; wait for them."""
    pids = list(pids)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not any(_pid_alive(p) for p in pids), timeout, "processes to exit")
            return


def mounts_under(path: Path) -> List[str]:
    """Mount points at or below ``path`` (from /proc/self/mountinfo)."""
    prefix = str(path.resolve())
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return found


def remove_cgroup_tree(name: str) -> None:
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
    """JSON records the runtime appended to its ``--log`` file during this call, one a line or
    pretty-printed over several (crun 1.28); a line that is not JSON appears as
    ``{"raw": line}``."""

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

    def refusal(self) -> str:
        """The one line of a refused create: exit 1, one stderr line, the same as the one
        error line in runc's ``--log`` (what podman and containerd each show)."""
        assert self.rc == 1, self.describe()
        lines = self.stderr.splitlines()
        assert len(lines) == 1 and self.log_errors == lines, self.describe()
        return lines[0]

    def check(self) -> "RunResult":
        """Return self when rc is 0, else raise AssertionError with :meth:`describe`."""
        if self.rc != 0:
            raise AssertionError("command failed\n" + self.describe())
        return self


def env_dict(env: EnvArg) -> Optional[Dict[str, str]]:
    """``env`` (mapping or ``K=V`` list) as a dict; None stays None (inherit)."""
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
    # a stream of JSON values: runc and nvshim write one a line, crun 1.28 its own errors
    # pretty-printed over several lines; what is no JSON counts line by line as raw
    decoder = json.JSONDecoder()
    lines: List[Dict[str, Any]] = []
    pos, end = 0, len(text)
    while True:
        while pos < end and text[pos].isspace():
            pos += 1
        if pos >= end:
            return tuple(lines)
        try:
            obj, after = decoder.raw_decode(text, pos)
        except ValueError:
            after = text.find("\n", pos)
            after = end if after < 0 else after
            obj = None
        lines.append(obj if isinstance(obj, dict) else {"raw": text[pos:after]})
        pos = after


def execute(
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
            env=env_dict(env),
            cwd=cwd,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        out, err, rc = proc.stdout, proc.stderr, proc.returncode
    else:
        out_path, err_path = stdio_paths(stdio_to)
        with open(out_path, "ab") as o, open(err_path, "ab") as e:
            o_off, e_off = o.tell(), e.tell()
            rc = subprocess.run(
                argv,
                env=env_dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=o,
                stderr=e,
                timeout=timeout,
            ).returncode
        out = _read_from(out_path, o_off)
        err = _read_from(err_path, e_off)
    return RunResult(tuple(argv), rc, out, err, _read_log(log_path, offset))


def stdio_paths(stem: Path) -> Tuple[Path, Path]:
    """``<stem>.out`` and ``<stem>.err``: where a detached container's stdio goes."""
    return stem.with_name(stem.name + ".out"), stem.with_name(stem.name + ".err")


def _read_from(path: Path, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


# --------------------------------------------------------------------------- stand-ins


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


def make_failing_runtime(
    path: PathLike, message: str, *, rc: int = 1, to_log: bool = True, to_stderr: bool = True
) -> Path:
    """Write a runtime stand-in that fails every command with ``message``.

    With ``to_log`` it appends ``{"level":"error","msg":message,...}`` to its ``--log`` file (as
    runc does); with ``to_stderr`` it also prints the message on stderr; exits ``rc``.
    """
    msg_json = json.dumps({"level": "error", "msg": message, "time": "1970-01-01T00:00:00Z"})
    script = [
        "#!/bin/sh",
        "log=",
        "while [ $# -gt 0 ]; do",
        '  case "$1" in --log) log="$2"; shift;; --log=*) log="${1#--log=}";; esac',
        "  shift",
        "done",
    ]
    if to_log:
        script.append(f'[ -n "$log" ] && printf \'%s\\n\' {_shq(msg_json)} >> "$log"')
    if to_stderr:
        script.append(f"printf '%s\\n' {_shq(message)} >&2")
    script.append(f"exit {rc}")
    p = Path(path)
    p.write_text("\n".join(script) + "\n")
    p.chmod(0o755)
    return p


def _shq(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"
