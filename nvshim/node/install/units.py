"""The systemd units and the udev rule install.sh writes, as text: values in, text out.

``nvshim-cdi-refresh.path`` (PathChanged on the running kernel's ``modules.dep`` and
``.bin``, the files ``nvshim cdi refresh --print-watch-paths`` names, the ``nvshim``
command), ``nvshim-cdi-refresh.service`` (oneshot ``nvshim cdi refresh``),
``99-nvshim-cdi-refresh.rules`` (starts that service when the nvidia module is loaded) and
``nvshim-agent.service`` (``nvshim agent`` on :data:`nvshim.agent.AGENT_SOCKET`).
install.sh decides where they go and whether to write them at all, writes each only when
its bytes changed, records it in the manifest and enables it; it runs :func:`main` through
nvshim's own interpreter (the installed prefix's, or ``--dev``'s venv): ``KIND OPTION...``
prints one file.

A value a unit file cannot carry as written is escaped by systemd's rules: ``%`` is a
specifier everywhere (``%%``); an ``ExecStart=`` word is split on whitespace, unquoted and
C-unescaped, and in an argument ``$`` starts a variable (:func:`exec_word` double-quotes a
word that needs it and writes ``$$``; :func:`exec_path` the command, where systemd expands
nothing and takes no quote or backslash). A value no escaping can carry (a line break, a
trailing backslash that would continue the line, a udev ``RUN`` program that is not a
plain absolute path) is refused with one line naming it.
"""

from __future__ import annotations

import argparse
import re
import sys

from nvshim.agent import AGENT_SOCKET
from nvshim.errors import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional, Sequence

__all__ = [
    "REFRESH",
    "REFRESH_RULE",
    "AGENT_UNIT",
    "path_value",
    "exec_word",
    "exec_path",
    "render_refresh_path",
    "render_refresh_service",
    "render_refresh_rule",
    "render_agent_service",
    "main",
]

REFRESH = "nvshim-cdi-refresh"
"""The CDI refresh units' name (``.path`` and ``.service``)."""
REFRESH_RULE = "99-nvshim-cdi-refresh.rules"
"""The udev rule's file name."""
AGENT_UNIT = "nvshim-agent"
"""The node agent's unit name (``.service``)."""

#: An ExecStart= word written as it is: no quote, backslash, whitespace, ``$`` or ``;``.
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
#: A program a udev RUN key names as it is (udev splits RUN on spaces, expands ``$`` and ``%``).
_PLAIN_PROGRAM = re.compile(r"/[A-Za-z0-9_+.,/-]*")
#: C escapes systemd's unquoting reads inside double quotes.
_EXEC_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _control(c: str) -> bool:
    return ord(c) < 0x20 or c == "\x7f"


def _specifiers(text: str) -> str:
    """``text`` with every ``%`` doubled: systemd reads ``%x`` as a specifier."""
    return text.replace("%", "%%")


def _one_line(value: str, what: str) -> str:
    if "\n" in value or "\r" in value or value.endswith("\\"):
        raise ConfigError(
            f"{what} {value!r} cannot be written in a systemd unit "
            "(a line break, or a trailing backslash that continues the line)"
        )
    return value


def path_value(path: str) -> str:
    """``path`` as the value of a path setting (``PathChanged=``): the rest of the line,
    spaces included, with ``%`` doubled."""
    return _specifiers(_one_line(path, "path"))


def exec_word(word: str) -> str:
    """``word`` as one argument of an ``ExecStart=`` line: as it is when plain, else in
    double quotes with ``\\`` and ``"`` escaped and control characters C-escaped; ``$`` as
    ``$$`` and ``%`` as ``%%`` either way."""
    if _PLAIN_WORD.fullmatch(word):
        return _specifiers(word)
    quoted = "".join(
        _EXEC_ESCAPES.get(c) or (f"\\x{ord(c):02x}" if _control(c) else c) for c in word
    )
    return '"' + _specifiers(quoted).replace("$", "$$") + '"'


def exec_path(path: str) -> str:
    """``path`` as the command of an ``ExecStart=`` line: systemd expands no variable
    there and refuses a quote, a backslash or a control character in it (refused here with
    one line naming it); in double quotes when it holds a space, ``%`` doubled."""
    if any(c in "\"'\\" or _control(c) for c in path):
        raise ConfigError(
            f"command {path!r} cannot be written in a systemd unit "
            "(systemd refuses a quote, a backslash or a control character there)"
        )
    return _specifiers(path if _PLAIN_WORD.fullmatch(path.replace("$", "_")) else f'"{path}"')


def _exec_start(command: str, args: Sequence[str]) -> str:
    return "ExecStart=" + " ".join([exec_path(command), *(exec_word(a) for a in args)])


def _lines(lines: Sequence[str]) -> str:
    return "".join(line + "\n" for line in lines)


def _watched(paths: Sequence[str]) -> List[str]:
    """The paths a path unit can watch: procfs is not watchable, and the running kernel's
    ``modules.dep`` is named by ``%v`` already."""
    return [p for p in paths if p and "/proc/" not in p and not p.startswith("/lib/modules/")]


def render_refresh_path(bindir: str, watched: Sequence[str]) -> str:
    """``nvshim-cdi-refresh.path``: PathChanged on the running kernel's module list, each of
    ``watched`` (``nvshim cdi refresh --print-watch-paths``) and ``bindir``'s nvshim."""
    changed = [path_value(p) for p in _watched([*watched, f"{bindir}/nvshim"])]
    return _lines(
        [
            f"# Written by nvshim's install.sh: start {REFRESH}.service"
            " when the NVIDIA driver changes.",
            "[Unit]",
            "Description=Watch the NVIDIA driver for nvshim's CDI refresh",
            "",
            "[Path]",
            "PathChanged=/lib/modules/%v/modules.dep",
            "PathChanged=/lib/modules/%v/modules.dep.bin",
            *(f"PathChanged={p}" for p in changed),
            f"Unit={REFRESH}.service",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
        ]
    )


def render_refresh_service(bindir: str, etcdir: str) -> str:
    """``nvshim-cdi-refresh.service``: oneshot ``nvshim cdi refresh`` for the config in
    ``etcdir``, only where the nvidia module is loaded, at most 10 starts in 10 minutes."""
    return _lines(
        [
            "# Written by nvshim's install.sh: "
            "regenerate nvshim's CDI specs, node plan and CDI index.",
            "[Unit]",
            "Description=Refresh nvshim's CDI specs, node plan and CDI index for the NVIDIA driver",
            "ConditionPathExists=|/sys/module/nvidia",
            "ConditionPathExists=|/sys/module/nvidia_current",
            "StartLimitIntervalSec=600",
            "StartLimitBurst=10",
            "",
            "[Service]",
            "Type=oneshot",
            _exec_start(
                f"{bindir}/nvshim", ["cdi", "refresh", "--config", f"{etcdir}/config.yaml"]
            ),
            "Restart=on-failure",
            "RestartSec=15",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
        ]
    )


def render_refresh_rule(systemctl: str) -> str:
    """``99-nvshim-cdi-refresh.rules``: ``systemctl`` starts the refresh service when the
    nvidia module is added."""
    if not _PLAIN_PROGRAM.fullmatch(systemctl):
        raise ConfigError(
            f"systemctl {systemctl!r} cannot be named in a udev rule: "
            "it takes an absolute path of letters, digits and _+.,/-"
        )
    return _lines(
        [
            "# Written by nvshim's install.sh:"
            " refresh nvshim's CDI specs when the NVIDIA module is loaded.",
            'ACTION=="add", SUBSYSTEM=="module", KERNEL=="nvidia|nvidia_current", '
            f'RUN+="{systemctl} --no-block start {REFRESH}.service"',
        ]
    )


def render_agent_service(bindir: str, etcdir: str, nri_socket: str = "none") -> str:
    """``nvshim-agent.service``: ``nvshim agent`` for the config in ``etcdir`` on the
    agent's socket, registering with the NRI socket ``nri_socket`` (``none``: no NRI)."""
    return _lines(
        [
            "# Written by nvshim's install.sh:"
            " nvshim's node agent (GPU creates without a Python start).",
            "[Unit]",
            "Description=nvshim node agent",
            "After=local-fs.target",
            "",
            "[Service]",
            "Type=simple",
            _exec_start(
                f"{bindir}/nvshim",
                [
                    "agent",
                    "--config",
                    f"{etcdir}/config.yaml",
                    "--socket",
                    AGENT_SOCKET,
                    "--nri-socket",
                    nri_socket or "none",
                ],
            ),
            "Restart=always",
            "RestartSec=2",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
        ]
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="install.sh: units", description="print one of the files install.sh writes"
    )
    kinds = parser.add_subparsers(dest="kind", required=True)
    path = kinds.add_parser(f"{REFRESH}.path")
    path.add_argument("--bindir", required=True)
    path.add_argument("--watched", default="", help="the paths to watch, one a line")
    service = kinds.add_parser(f"{REFRESH}.service")
    service.add_argument("--bindir", required=True)
    service.add_argument("--etcdir", required=True)
    rule = kinds.add_parser(REFRESH_RULE)
    rule.add_argument("--systemctl", required=True)
    agent = kinds.add_parser(f"{AGENT_UNIT}.service")
    agent.add_argument("--bindir", required=True)
    agent.add_argument("--etcdir", required=True)
    agent.add_argument("--nri-socket", default="none")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``KIND OPTION...``: print the file KIND (its file name) to stdout; a value it cannot
    carry is one line on stderr and exit status 1, nothing on stdout."""
    ns = _parser().parse_args(argv)
    try:
        if ns.kind == f"{REFRESH}.path":
            text = render_refresh_path(ns.bindir, ns.watched.splitlines())
        elif ns.kind == f"{REFRESH}.service":
            text = render_refresh_service(ns.bindir, ns.etcdir)
        elif ns.kind == REFRESH_RULE:
            text = render_refresh_rule(ns.systemctl)
        else:
            text = render_agent_service(ns.bindir, ns.etcdir, ns.nri_socket)
    except ConfigError as exc:
        sys.stderr.write(f"install.sh: {ns.kind}: {exc}\n")
        sys.exit(1)
    sys.stdout.write(text)
