"""The structured log of nvshim's long-running processes, the agent and ``nvshim cdi
refresh --watch``: JSON lines in a pod or when stderr is not a terminal, readable console
lines on a terminal (run by hand). The create does not use it (docs/architecture.md,
"Logging")."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Optional, TextIO

import structlog

__all__ = ["configure", "json_wanted"]


def json_wanted(stream: TextIO, environ: Optional[dict[str, str]] = None) -> bool:
    """JSON unless a person is reading: stderr a terminal and not in a Kubernetes pod."""
    env = os.environ if environ is None else environ
    if env.get("KUBERNETES_SERVICE_HOST"):
        return True
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):
        return True


def configure(stream: Optional[TextIO] = None, level: int = logging.INFO,
              name: str = "nvshim.agent") -> Any:
    """Configure structlog for this process and return a bound logger called ``name``."""
    out = sys.stderr if stream is None else stream
    renderer: Any = (structlog.processors.JSONRenderer() if json_wanted(out)
                     else structlog.dev.ConsoleRenderer(colors=False))
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
    return structlog.get_logger(name)
