"""Where messages go: runc's ``--log`` file, stderr, and the optional debug log.

containerd reads the last ``{"level":"error","msg":…}`` line of the ``--log`` file and
ignores stderr; podman passes no ``--log`` and shows stderr. So an error goes to both.
On success nothing is printed: during ``create`` stdout/stderr are the container's.
The debug log (config ``debug-log``): JSON lines, imported only when it is on.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Optional

__all__ = ["report_error", "report_warning", "DebugLog", "open_debug_log", "render_record"]


def _utc_now() -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _log_line(level: str, text: str, log: str, log_format: Optional[str]) -> None:
    """Append one runc-style line to runc's ``--log`` file: JSON with ``--log-format json``,
    else logfmt text, runc's and crun's default whatever the file is called."""
    from nvshim._jsonc import dumps as json_dumps  # not the json package: warnings are hot

    if log_format == "json":
        line = json_dumps({"level": level, "msg": text, "time": _utc_now()})
    else:
        line = f'time="{_utc_now()}" level={level} msg={json_dumps(text)}'
    try:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError as exc:
        sys.stderr.write(f"nvshim: cannot write to --log {log}: {exc.strerror}\n")


def report_error(
    message: str, log: Optional[str], log_format: Optional[str], stderr: bool = True
) -> None:
    """Write one error line to runc's ``--log`` (JSON or text) and one to stderr (unless
    not ``stderr``: the agent's client prints that one), the container's values in it
    escaped and cut (:func:`nvshim.errors.one_line`)."""
    from nvshim.errors import one_line

    text = f"nvshim: {one_line(message)}"
    if log:
        _log_line("error", text, log, log_format)
    if stderr:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def report_warning(message: str, log: Optional[str], log_format: Optional[str]) -> None:
    """One warning line in runc's ``--log`` only: during create stderr is the container's.
    Escaped and cut like an error line."""
    if log:
        from nvshim.errors import one_line

        _log_line("warning", f"nvshim: {one_line(message)}", log, log_format)


class DebugLog:
    """The debug log: a no-op unless ``debug-log`` is configured.

    Each record is one JSON line appended with one ``write()`` (concurrent creates sharing
    the file never interleave): the keys sorted, with ``event``, ``level``, an ISO 8601
    UTC ``timestamp`` with microseconds, the ``pid`` and the bound context, exactly what
    structlog's ``JSONRenderer(sort_keys=True)`` behind ``add_log_level`` and
    ``TimeStamper(fmt="iso", utc=True)`` wrote. Written here without structlog, whose
    import cost every GPU create tens of ms while the log was on (BENCHMARKS.md;
    ``_jsonc`` and ``time`` are already loaded by a create)."""

    def __init__(self, fd: Optional[int] = None, context: Optional[Dict[str, Any]] = None) -> None:
        self._fd = fd
        self._context = dict(context or {})

    @property
    def enabled(self) -> bool:
        return self._fd is not None

    def event(self, event: str, **fields: Any) -> None:
        self._write("info", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._write("error", event, fields)

    def _write(self, level: str, event: str, fields: Dict[str, Any]) -> None:
        if self._fd is None:
            return
        record = dict(self._context)
        record.update(fields)
        record.update(event=event, level=level, timestamp=_iso_now())
        try:
            os.write(self._fd, (render_record(record) + "\n").encode())
        except OSError:
            pass  # a full disk loses debug lines, never a create


def _sorted(value: Any) -> Any:
    """``value`` with every mapping's keys in order, as ``json.dumps(sort_keys=True)``."""
    if isinstance(value, dict):
        return {str(k): _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_sorted(v) for v in value]
    return value


def render_record(record: Dict[str, Any]) -> str:
    """One debug-log line (no newline): JSON, keys sorted at every level, ``repr`` of
    what JSON cannot hold."""
    from nvshim._jsonc import dumps as json_dumps

    return json_dumps(_sorted(record), default=repr)


def _iso_now() -> str:
    """Now in UTC as ``datetime.isoformat`` writes it, ``+00:00`` spelled ``Z``."""
    import time

    seconds, nanos = divmod(time.time_ns(), 1_000_000_000)
    micros = nanos // 1000
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{stamp}.{micros:06d}Z" if micros else f"{stamp}Z"


def open_debug_log(
    path: Optional[str], warn: Optional[Callable[[str], None]] = None, **context: Any
) -> DebugLog:
    """A log appending JSON lines to ``path``; no-op when ``path`` is empty.

    ``context`` (e.g. the container ``id``) is bound into every record, with the pid. A file
    that cannot be opened gives a no-op log and one message to ``warn`` (the runtime's:
    runc's ``--log``; during create stderr is the container's), else to stderr."""
    if not path:
        return DebugLog()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        message = f"cannot open debug-log {path}: {exc.strerror}"
        if warn is not None:
            warn(message)
        else:
            sys.stderr.write(f"nvshim: {message}\n")
        return DebugLog()
    return DebugLog(fd, dict(context, pid=os.getpid()))
