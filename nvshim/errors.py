"""The one exception tree of nvshim.

Every failure a user can cause or meet is an :class:`NvshimError`. Its message is one
lower-case line with no trailing period that names the value and where it came from;
the runtime prints it once (stderr and runc's ``--log``) and exits 1.
"""

from __future__ import annotations

__all__ = [
    "NvshimError",
    "UsageError",
    "SpecError",
    "RequestError",
    "HostError",
    "ConfigError",
    "CdiError",
]


class NvshimError(Exception):
    """Base class: a failure with a one-line, user-facing message."""

    exit_code = 1

    def __str__(self) -> str:
        text = super().__str__()
        # One line, always: a newline in a message would split containerd's log entry.
        return " ".join(text.split("\n"))


class UsageError(NvshimError):
    """The command line is wrong (missing flag value, unknown option)."""


class SpecError(NvshimError):
    """The OCI bundle's config.json cannot be read or has the wrong shape."""


class RequestError(NvshimError):
    """The container asks for something this node cannot or will not give."""


class HostError(NvshimError):
    """The host (driver root, device nodes, low-level runtime) is not as needed."""


class ConfigError(NvshimError):
    """nvshim's own configuration file is invalid."""


class CdiError(NvshimError):
    """A CDI spec is invalid or a CDI device name cannot be resolved."""
