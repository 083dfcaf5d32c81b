"""The structured log of nvshim's long-running processes, the agent and ``nvshim cdi
refresh --watch``: JSON lines in a pod or when stderr is not a terminal, readable console
lines on a terminal (run by hand). The create does not use it (docs/architecture.md,
"Logging").

A base module, so that every layer can name the logger it is handed (:class:`Log`, the
structlog-shaped logger the agent, its NRI plugin and ``cdi refresh --watch`` pass
around) without importing the agent; structlog itself is imported only by
:func:`configure`. A module on the create path names :class:`Log` under ``TYPE_CHECKING``
only (this module imports ``typing``).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional, Protocol, TextIO

__all__ = ["Log", "configure", "json_wanted"]


class Log(Protocol):
    """A structlog-shaped logger: one event name and its fields per line, by level.

    What :func:`configure` returns satisfies it; so does any object with these four
    methods (the tests' recording logger)."""

    def debug(self, event: str, **fields: Any) -> Any: ...

    def info(self, event: str, **fields: Any) -> Any: ...

    def warning(self, event: str, **fields: Any) -> Any: ...

    def error(self, event: str, **fields: Any) -> Any: ...


def json_wanted(stream: TextIO, environ: Optional[dict[str, str]] = None) -> bool:
    """JSON unless a person is reading: stderr a terminal and not in a Kubernetes pod."""
    env = os.environ if environ is None else environ
    if env.get("KUBERNETES_SERVICE_HOST"):
        return True
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):
        return True


def configure(stream: Optional[TextIO] = None, level: int = 20, name: str = "nvshim.agent") -> Log:
    """Configure structlog for this process and return a bound logger called ``name``
    that logs ``level`` (``logging``'s numbers: 20, INFO, by default) and above."""
    import structlog

    out = sys.stderr if stream is None else stream
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json_wanted(out)
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    log: Log = structlog.get_logger(name)
    return log
