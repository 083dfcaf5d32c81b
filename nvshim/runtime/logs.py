"""Where messages go: runc's ``--log`` file, stderr, and the optional debug log.

containerd reads the last ``{"level":"error","msg":…}`` line of the ``--log`` file and
ignores stderr; podman passes no ``--log`` and shows stderr. So an error goes to both.
On success nothing is printed: during ``create`` stdout/stderr are the container's.
The debug log (config ``debug-log``) uses structlog, imported only when it is on.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing costs ~4 ms to import on the create path
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

__all__ = ["report_error", "report_warning", "DebugLog", "open_debug_log"]


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


def report_error(message: str, log: Optional[str], log_format: Optional[str]) -> None:
    """Write one error line to runc's ``--log`` (JSON or text) and one to stderr."""
    text = f"nvshim: {message}"
    if log:
        _log_line("error", text, log, log_format)
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def report_warning(message: str, log: Optional[str], log_format: Optional[str]) -> None:
    """One warning line in runc's ``--log`` only: during create stderr is the container's."""
    if log:
        _log_line("warning", f"nvshim: {message}", log, log_format)


class DebugLog:
    """The debug log: a no-op unless ``debug-log`` is configured."""

    def __init__(self, logger: Any = None) -> None:
        self._logger = logger

    @property
    def enabled(self) -> bool:
        return self._logger is not None

    def event(self, event: str, **fields: Any) -> None:
        if self._logger is not None:
            self._logger.info(event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        if self._logger is not None:
            self._logger.error(event, **fields)


def open_debug_log(path: Optional[str], warn: Optional[Callable[[str], None]] = None,
                   **context: Any) -> DebugLog:
    """A structlog logger appending JSON lines to ``path``; no-op when ``path`` is empty.

    ``context`` (e.g. the container ``id``) is bound into every record, with the pid. A file
    that cannot be opened gives a no-op log and one message to ``warn`` (the runtime's:
    runc's ``--log``; during create stderr is the container's), else to stderr."""
    if not path:
        return DebugLog()
    try:
        fh = open(path, "a", encoding="utf-8")
    except OSError as exc:
        message = f"cannot open debug-log {path}: {exc.strerror}"
        if warn is not None:
            warn(message)
        else:
            sys.stderr.write(f"nvshim: {message}\n")
        return DebugLog()
    import structlog

    logger = structlog.wrap_logger(
        structlog.WriteLogger(fh),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(sort_keys=True),
        ],
    ).bind(pid=os.getpid(), **context)
    return DebugLog(logger)
