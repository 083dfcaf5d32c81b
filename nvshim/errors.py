"""The one exception tree of nvshim.

Every failure a user can cause or meet is an :class:`NvshimError`. Its message is one
lower-case line with no trailing period that names the value and where it came from;
the runtime prints it once (stderr and runc's ``--log``) and exits 1.
"""

from __future__ import annotations

__all__ = [
    "one_line",
    "NvshimError",
    "UsageError",
    "SpecError",
    "SPEC_FILE",
    "RequestError",
    "HostError",
    "Abandoned",
    "host_error",
    "os_reason",
    "ConfigError",
    "CdiError",
    "CdiProblem",
    "CdiSpecError",
]


def one_line(text: str, limit: "int | None" = 2000) -> str:
    """``text`` as nvshim shows or journals a value it does not control: on one line, with
    every character :meth:`str.isprintable` rejects escaped the way ``repr`` writes it
    (``\\n``, ``\\r``, ``\\t``, ``\\x1b``, ``\\x85``, ``\\u2028``, ``\\u202e``, ``\\ud800``: C0
    and C1 controls, DEL, line and paragraph separators, bidi and other format characters,
    lone surrogates), and past ``limit`` characters cut to ``limit`` with
    ``… (N more characters)`` at the end.

    The one helper for container-controlled text in the journals, the tables and error
    lines, so that no value can forge a line (or a column) of what an operator reads. A
    backslash is kept as it is, so the helper is idempotent: what it returns, it returns
    unchanged (a record journaled escaped and shown again is not escaped twice).
    """
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if limit is not None and len(text) > limit:
        keep = max(limit - 40, 0)  # the marker below is at most 40 characters
        text = f"{text[:keep]}… ({len(text) - keep} more characters)"[:limit]
    return text


class NvshimError(Exception):
    """Base class: a failure with a one-line, user-facing message."""

    exit_code = 1

    #: Longest message printed; a hostile value (a 1 MB env token) must not become a 1 MB line.
    MAX_LENGTH = 2000

    def __str__(self) -> str:
        return one_line(super().__str__(), self.MAX_LENGTH)


class UsageError(NvshimError):
    """The command line is wrong (missing flag value, unknown option)."""


class SpecError(NvshimError):
    """The OCI bundle's config.json cannot be read or has the wrong shape.

    ``file`` is the file the problem is in, when the error is about one: the message is
    ``<file>: <detail>``. The pure readers of a spec, which see a dict and no path, say
    :data:`SPEC_FILE`; create names the bundle's own file with :meth:`in_file`.
    """

    def __init__(self, detail: str, file: "str | None" = None) -> None:
        super().__init__(f"{file}: {detail}" if file else detail)
        self.detail = detail
        self.file = file

    def in_file(self, path: str) -> "SpecError":
        """The same error about ``path`` (a new one: raise it ``from`` this one)."""
        return SpecError(self.detail, path)


#: The file a spec error is in when the reader saw only the decoded spec.
SPEC_FILE = "config.json"


class RequestError(NvshimError):
    """The container asks for something this node cannot or will not give."""


class HostError(NvshimError):
    """The host (driver root, device nodes, low-level runtime) is not as needed."""


class Abandoned(NvshimError):
    """A create stopped before anything was written because it is done elsewhere (the
    node agent past its deadline: the caller's own create runs instead); no failure."""


def os_reason(exc: OSError) -> str:
    """The reason an OSError gives (its strerror), starting lower-case."""
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]


def host_error(action: str, exc: OSError) -> HostError:
    """The one-line HostError for ``exc``: what was being done, the file, the reason."""
    reason = os_reason(exc)
    if exc.filename and str(exc.filename) not in action:
        return HostError(f"{action}: {exc.filename}: {reason}")
    return HostError(f"{action}: {reason}")


class ConfigError(NvshimError):
    """nvshim's own configuration file is invalid."""


class CdiError(NvshimError):
    """A CDI spec is invalid or a CDI device name cannot be resolved."""


class CdiProblem:
    """One thing wrong with a CDI spec: the file, where in it (a JSON path) and what.

    An immutable value (equal and hashable by its three fields); it prints as
    ``<file>: <json path>: <message>`` on one line.
    """

    __slots__ = ("path", "json_path", "message")

    path: str
    json_path: str
    message: str

    def __init__(self, path: str, json_path: str, message: str) -> None:
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "json_path", json_path)
        object.__setattr__(self, "message", message)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"CdiProblem is immutable: cannot set {name}")

    def _key(self) -> "tuple[str, str, str]":
        return (self.path, self.json_path, self.message)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CdiProblem):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"CdiProblem(path={self.path!r}, json_path={self.json_path!r}, "
            f"message={self.message!r})"
        )

    def __str__(self) -> str:
        return one_line(f"{self.path}: {self.json_path}: {self.message}")


class CdiSpecError(CdiError):
    """A CDI spec cannot be loaded or written; ``problems`` lists every reason (at least one)."""

    def __init__(self, problems: "list[CdiProblem] | tuple[CdiProblem, ...]") -> None:
        self.problems = list(problems)
        text = str(self.problems[0])
        if len(self.problems) > 1:
            text += f" (and {len(self.problems) - 1} more)"
        super().__init__(text)
