"""Where in a runc or crun argv the command, the bundle and the log file are.

Pure and import-light (nothing beyond builtins): the runtime calls this before it knows
whether it has anything to do, and the shell trampoline (``nvshim/node/install/trampoline.py``)
makes the same decision, checked by a differential test.

Two grammars reach nvshim-runtime, and it reads argv so that it finds what either
low-level runtime would find:

* runc (urfave/cli, Go's flag package): global flags, the command, then the command's
  flags and positional arguments in any order; ``-flag``, ``--flag``, ``--flag=value``,
  ``--flag value``; ``--`` ends flags.
* crun (argp, getopt_long): global options, the command, its options (only before the
  container id); long options ``--name=value``/``--name value`` or any unambiguous
  prefix (``--bund``); short options that cluster and take attached values (``-db/x``);
  global ``--cgroup-manager MANAGER``; ``create -f/--config FILE``.

Where one runtime accepts a form the other refuses, the accepting one's reading is used
(the refusing one fails anyway). Where both accept a form but read it differently
(``-bundle /b`` is ``--bundle /b`` to runc and ``-b undle`` to crun; ``-b=/b``), or crun
would refuse it as ambiguous (``--co``), create/run fails closed with one line rather
than edit a config.json the runtime may not read. ``--config FILE`` (crun reads FILE
instead of config.json) is refused for the same reason.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Dict, FrozenSet, List, Optional, Tuple, Union

__all__ = ["Invocation", "parse_argv", "MODIFYING_COMMANDS"]

#: Commands whose config.json nvshim edits. The reference leaves ``run`` alone; we don't.
MODIFYING_COMMANDS: FrozenSet[str] = frozenset({"create", "run"})

#: Global options of runc and crun by what they do: take a value, or not, or print the
#: version or help instead of running a command.
_GLOBAL: Dict[str, str] = {
    "log": "value",
    "log-format": "value",
    "root": "value",
    "rootless": "value",
    "criu": "value",  # runc only
    "cgroup-manager": "value",  # crun only
    "debug": "bool",
    "systemd-cgroup": "bool",
    "v": "version",
    "version": "version",
    "V": "version",
    "h": "help",
    "help": "help",
    "usage": "help",
    "?": "help",
}
#: crun's global long options (argp adds --program-name and --HANG): prefixes resolve here.
_CRUN_GLOBAL_LONG: Tuple[Tuple[str, str], ...] = (
    ("cgroup-manager", "value"),
    ("debug", "bool"),
    ("log", "value"),
    ("log-format", "value"),
    ("root", "value"),
    ("rootless", "value"),
    ("systemd-cgroup", "bool"),
    ("help", "help"),
    ("usage", "help"),
    ("version", "version"),
    ("program-name", "value"),
    ("HANG", "bool"),
)

#: create/run options of runc (``-name`` or ``--name``) by effect.
_RUNC_CMD: Dict[str, str] = {
    "bundle": "bundle",
    "b": "bundle",
    "console-socket": "value",
    "pid-file": "value",
    "preserve-fds": "value",
    "no-pivot": "bool",
    "no-new-keyring": "bool",
    "detach": "bool",
    "d": "bool",
    "keep": "bool",
    "help": "help",
    "h": "help",
}
#: Go's strconv.ParseBool false values: runc's ``--help=false`` is no help.
_GO_FALSE: FrozenSet[str] = frozenset({"0", "f", "F", "FALSE", "false", "False"})
#: crun's create/run long options (and argp's own): exact names and prefixes resolve here.
_CRUN_CMD_LONG: Tuple[Tuple[str, str], ...] = (
    ("bundle", "bundle"),
    ("config", "config"),
    ("console-socket", "value"),
    ("detach", "bool"),
    ("no-new-keyring", "bool"),
    ("no-pivot", "bool"),
    ("no-subreaper", "bool"),
    ("pid-file", "value"),
    ("preserve-fds", "value"),
    ("help", "help"),
    ("usage", "help"),
    ("program-name", "value"),
    ("HANG", "bool"),
)
_CMD_LONG: Dict[str, str] = {**_RUNC_CMD, **dict(_CRUN_CMD_LONG)}


class Invocation:
    """What one runtime call asks for (a plain class: ``NamedTuple`` needs typing)."""

    __slots__ = (
        "command",
        "bundle",
        "log",
        "log_format",
        "error",
        "root",
        "container_id",
        "version",
        "help",
    )

    def __init__(
        self,
        command: Optional[str],
        bundle: Optional[str],
        log: Optional[str],
        log_format: Optional[str],
        error: Optional[str],
        root: Optional[str] = None,
        container_id: Optional[str] = None,
        version: bool = False,
        help: bool = False,
    ) -> None:
        self.command = command
        self.bundle = bundle
        self.log = log
        self.log_format = log_format
        self.error = error
        self.root = root
        self.container_id = container_id
        self.version = version
        self.help = help

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"Invocation({inner})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Invocation) and all(
            getattr(self, k) == getattr(other, k) for k in self.__slots__
        )

    __hash__ = None  # type: ignore[assignment]

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
    root: Optional[str]
    """runc's ``--root`` (where it keeps container state), when given."""
    container_id: Optional[str]
    """The container id of create/run (its first positional argument), when given."""
    version: bool
    """``-v``/``--version`` before any command: nvshim shows its version, then the runtime's."""
    help: bool
    """create/run with its ``--help`` (``-h``, ``-?``, ``--usage`` …): the runtime prints
    help and creates nothing, so nothing is edited."""

    @property
    def modifies(self) -> bool:
        """True when nvshim must edit config.json before handing over."""
        return self.command in MODIFYING_COMMANDS and not self.help


def _split_flag(arg: str) -> Tuple[str, Optional[str]]:
    """``--name=value`` → (name, value); ``-name`` → (name, None)."""
    name = arg.lstrip("-")
    if "=" in name:
        name, value = name.split("=", 1)
        return name, value
    return name, None


def _long(
    name: str, exact: Dict[str, str], crun: Tuple[Tuple[str, str], ...], strict: bool = False
) -> Tuple[Optional[str], str]:
    """(effect, resolved name) of a ``--name``: exact, else an unambiguous crun prefix.

    Effect None: unknown (both runtimes refuse it). ``"ambiguous"``: a prefix of several
    options (crun refuses it, naming them) — unless not ``strict`` and they all have the
    same effect, where only the effect matters (which word is the command)."""
    if name in exact:
        return exact[name], name
    if not name:
        return None, name
    found = [(option, effect) for option, effect in crun if option.startswith(name)]
    if len(found) == 1:
        return found[0][1], found[0][0]
    effects = {effect for _, effect in found}
    if len(effects) == 1 and not strict:
        return effects.pop(), name  # several options, one effect (--lo: log or log-format)
    if found:
        return "ambiguous", " or ".join(f"--{option}" for option, _ in found)
    return None, name


def _crun_cluster(body: str) -> Optional[Tuple[str, Optional[str]]]:
    """crun's reading of ``-<body>`` in create/run: short options d, b, f, ? clustered,
    b/f taking the rest of the word (or the next word, value None). None: invalid."""
    effect: Tuple[str, Optional[str]] = ("bool", None)
    for j, ch in enumerate(body):
        if ch == "d":
            continue
        if ch in "bf":
            rest = body[j + 1 :]
            return ("bundle" if ch == "b" else "config", rest or None)
        if ch == "?":
            return ("help", None)
        return None
    return effect


# Two loops, global options then create/run's options: the same state machine as the
# trampoline's sh loop, which the differential test compares with it decision by decision.
def parse_argv(argv: List[str]) -> Invocation:
    """Find the command, bundle and log settings in ``argv`` (without argv[0])."""
    globals_: Dict[str, str] = {}
    found = _read_globals(argv, globals_)
    if isinstance(found, Invocation):
        return found
    command, i = found
    if command not in MODIFYING_COMMANDS:
        return Invocation(command, None, globals_.get("log"), globals_.get("log-format"), None)
    return _read_create(argv, i, command, globals_)


def _read_globals(
    argv: List[str], globals_: Dict[str, str]
) -> Union[Invocation, Tuple[Optional[str], int]]:
    """The global options before the command, into ``globals_`` (name → value); then
    (the command, the index after it), or the whole answer where the options end the call
    (a version or help option; a value missing at the end)."""
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
            if arg.startswith("--"):
                effect, name = _long(name, _GLOBAL, _CRUN_GLOBAL_LONG)
            else:
                effect = _GLOBAL.get(name)
                if effect is None and arg[1:2] in ("v", "V", "?"):
                    effect = "help" if arg[1] == "?" else "version"  # crun's -vx, -?x
            if effect in ("version", "help"):
                # the runtime prints its version/help and ignores any command: never modify.
                return Invocation(
                    None,
                    None,
                    globals_.get("log"),
                    globals_.get("log-format"),
                    None,
                    version=effect == "version",
                )
            if effect == "value" and value is None:
                if i + 1 >= n:
                    return Invocation(
                        None, None, globals_.get("log"), globals_.get("log-format"), None
                    )
                value = argv[i + 1]
                i += 1
            if value is not None:
                globals_[name] = value
            i += 1
            continue
        command = arg
        i += 1
        break
    return command, i


def _short(
    arg: str, name: str, value: Optional[str]
) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """(effect, value, error) of a single-dash create/run option: runc's ``-name`` and
    crun's clustered short options, an error where the two read it differently."""
    runc = _RUNC_CMD.get(name)
    crun = _crun_cluster(arg[1:])
    if runc is not None and crun is not None and (runc, value) != crun:
        return (
            None,
            value,
            (
                f"option {arg} means one thing to runc and another to crun: "
                "write --bundle/--pid-file/… in full, with two dashes"
            ),
        )
    if runc is not None:
        return runc, value, None
    if crun is not None:
        return crun[0], crun[1], None
    return None, value, None


def _read_create(argv: List[str], i: int, command: str, globals_: Dict[str, str]) -> Invocation:
    """The create/run call whose options start at ``argv[i]``: its bundle, container id,
    whether it only prints help, or why nvshim cannot read it."""
    n = len(argv)
    log = globals_.get("log")
    log_format = globals_.get("log-format")
    bundle: Optional[str] = None
    error: Optional[str] = None
    container_id: Optional[str] = None
    while i < n:
        arg = argv[i]
        if arg == "--":
            if container_id is None and i + 1 < n:
                container_id = argv[i + 1]
            break
        if not arg.startswith("-") or arg == "-":
            if container_id is None:
                container_id = arg
            i += 1
            continue
        name, value = _split_flag(arg)
        given = name
        if arg.startswith("--"):
            effect, name = _long(name, _CMD_LONG, _CRUN_CMD_LONG, strict=True)
            if effect == "ambiguous":
                error = f"ambiguous option {arg} ({name}): write the full option name"
                break
        else:
            effect, value, error = _short(arg, name, value)
            if error is not None:
                break
        if effect == "help":
            if value is None or given not in ("help", "h") or value not in _GO_FALSE:
                # runc/crun print the command's help and create nothing (runc's
                # --help=true too; other values fail in both): leave config.json alone
                return Invocation(
                    command,
                    None,
                    log,
                    log_format,
                    None,
                    globals_.get("root"),
                    container_id,
                    help=True,
                )
            effect = "bool"  # runc's --help=false: no help, the create goes on
        if effect in ("bundle", "config", "value") and value is None:
            if i + 1 >= n:
                error = f"flag needs an argument: {arg}"
                break
            value = argv[i + 1]
            i += 1
        if effect == "bundle":
            bundle = value
        elif effect == "config":
            error = (
                f"{arg} {value}: nvshim edits the bundle's config.json and cannot "
                "follow crun's --config to another file"
            )
            break
        i += 1
    if container_id is None and i + 1 < n and argv[i] == "--":
        container_id = argv[i + 1]
    return Invocation(command, bundle, log, log_format, error, globals_.get("root"), container_id)
