"""Where in runc's argv the command, the bundle and the log file are.

Pure and import-light (nothing beyond builtins): the runtime calls this before it knows
whether it has anything to do, and the shell trampoline (``nvshim/data/trampoline.sh``)
makes the same decision, checked by a differential test.

runc's grammar (urfave/cli): global flags, then the command, then the command's flags and
positional arguments in any order (flags are re-ordered before positionals), ``--``
ends flags. Flags may be written ``-flag``, ``--flag``, ``--flag=value`` or
``--flag value``.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, List, NamedTuple, Optional, Tuple

__all__ = ["Invocation", "parse_argv", "MODIFYING_COMMANDS"]

#: Commands whose config.json nvshim edits. The reference leaves ``run`` alone; we don't.
MODIFYING_COMMANDS: FrozenSet[str] = frozenset({"create", "run"})

#: runc global flags that take a value (``--log FILE``); all others are booleans.
_GLOBAL_VALUE_FLAGS: FrozenSet[str] = frozenset({"log", "log-format", "root", "criu", "rootless"})

#: create/run flags that take a value. ``bundle``/``b`` is the one we care about; the others
#: must be known so that their value is not mistaken for a positional argument.
_CREATE_VALUE_FLAGS: FrozenSet[str] = frozenset(
    {"bundle", "b", "console-socket", "pid-file", "preserve-fds"}
)


class Invocation(NamedTuple):
    """What one runtime call asks for."""

    command: Optional[str]
    """The subcommand (``create``, ``state`` …), or None when there is none."""
    bundle: Optional[str]
    """The ``--bundle`` value of create/run (last one wins), None when absent."""
    log: Optional[str]
    """runc's ``--log`` file, when given."""
    log_format: Optional[str]
    """runc's ``--log-format`` (``json`` or ``text``), when given."""
    error: Optional[str]
    """Why the argv cannot be parsed for create/run (e.g. a flag without its value)."""
    root: Optional[str] = None
    """runc's ``--root`` (where it keeps container state), when given."""
    container_id: Optional[str] = None
    """The container id of create/run (its first positional argument), when given."""
    version: bool = False
    """``-v``/``--version`` before any command: nvshim shows its version, then the runtime's."""

    @property
    def modifies(self) -> bool:
        """True when nvshim must edit config.json before handing over."""
        return self.command in MODIFYING_COMMANDS


def _split_flag(arg: str) -> Tuple[str, Optional[str]]:
    """``--name=value`` → (name, value); ``-name`` → (name, None)."""
    name = arg.lstrip("-")
    if "=" in name:
        name, value = name.split("=", 1)
        return name, value
    return name, None


def parse_argv(argv: List[str]) -> Invocation:
    """Find the command, bundle and log settings in ``argv`` (without argv[0])."""
    globals_: Dict[str, str] = {}
    i = 0
    n = len(argv)
    command: Optional[str] = None
    while i < n:
        arg = argv[i]
        if arg == "--":
            i += 1
            if i < n:
                command = argv[i]
                i += 1
            break
        if arg.startswith("-") and arg != "-":
            name, value = _split_flag(arg)
            if name in ("v", "version", "h", "help"):
                # runc prints its version/help and ignores any command: never modify.
                return Invocation(None, None, globals_.get("log"), globals_.get("log-format"), None,
                                  version=name in ("v", "version"))
            if name in _GLOBAL_VALUE_FLAGS and value is None:
                if i + 1 >= n:
                    return Invocation(None, None, globals_.get("log"), globals_.get("log-format"), None)
                value = argv[i + 1]
                i += 1
            if value is not None:
                globals_[name] = value
            i += 1
            continue
        command = arg
        i += 1
        break

    log = globals_.get("log")
    log_format = globals_.get("log-format")
    if command not in MODIFYING_COMMANDS:
        return Invocation(command, None, log, log_format, None)

    bundle: Optional[str] = None
    error: Optional[str] = None
    container_id: Optional[str] = None
    while i < n:
        arg = argv[i]
        if arg == "--":
            if container_id is None and i + 1 < n:
                container_id = argv[i + 1]
            break
        if arg.startswith("-") and arg != "-":
            name, value = _split_flag(arg)
            if name in _CREATE_VALUE_FLAGS and value is None:
                if i + 1 >= n:
                    error = f"flag needs an argument: {arg}"
                    break
                value = argv[i + 1]
                i += 1
            if name in ("bundle", "b"):
                bundle = value
            i += 1
            continue
        if container_id is None:
            container_id = arg
        i += 1
    if container_id is None and i + 1 < n and argv[i] == "--":
        container_id = argv[i + 1]
    return Invocation(command, bundle, log, log_format, error, globals_.get("root"), container_id)
