"""``nvshim`` without click, for the forms operators run in loops, scripts and health checks:
``--version``, the top-level help, ``grants``, ``cdi list``, ``cdi generate`` (``--check``
too) and ``doctor``.

Importing click and the command modules costs several times the interpreter's own start
(docs/benchmarks-history.md, "The CLI"); these forms need neither. :func:`serve`
answers a form it knows
and returns its exit status, or returns ``None`` for anything else: global options, an
option this table does not hold, ``--help`` of a command, a value click would refuse (a
choice not offered, a directory that does not exist). click then runs the same arguments
and gives its own answer, so what is served here is exactly what click would do, by the
same command bodies (:mod:`nvshim.cli.readonly`).

The option tables below repeat, for these commands only, what their click declarations
say; ``tests/unit/cli/test_fast.py`` holds the two to each other (flags, destinations,
multiple, choices, defaults), and the top-level help to click's rendering of it.
"""

from __future__ import annotations

import os

from nvshim import __version__
from nvshim.agent import AGENT_SOCKET

TYPE_CHECKING = False  # typing alone costs about the interpreter's start (BENCHMARKS.md)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["serve", "FORMS", "TOP_HELP", "HELP_WIDTH", "COMPLETE_VAR"]

#: The variable that asks for shell completion: such a run is click's.
COMPLETE_VAR = "_NVSHIM_COMPLETE"


class Opt:
    """One option of a served form: ``dest`` in the parsed values; a flag takes no value.
    (A plain class: NamedTuple would import typing, which costs what this module saves.)"""

    __slots__ = ("dest", "flag", "multiple", "choices", "is_dir", "not_dir", "not_file")

    def __init__(
        self,
        dest: str,
        flag: bool = False,
        multiple: bool = False,
        choices: Tuple[str, ...] = (),
        is_dir: bool = False,
        not_dir: bool = False,
        not_file: bool = False,
    ) -> None:
        self.dest = dest
        self.flag = flag
        self.multiple = multiple
        self.choices = choices
        #: click.Path(exists=True, file_okay=False): an existing directory
        self.is_dir = is_dir
        #: click.Path(dir_okay=False): anything but a directory
        self.not_dir = not_dir
        #: click.Path(file_okay=False) without exists: anything but a regular file
        self.not_file = not_file

    def refuses(self, value: str) -> bool:
        """Whether click would refuse VALUE for this option (then click answers)."""
        if self.choices and value not in self.choices:
            return True
        if not (self.is_dir or self.not_dir or self.not_file):
            return False
        try:
            st = os.stat(value)
        except OSError:
            return self.is_dir  # click.Path(exists=True) only
        import stat

        # click.Path's checks, readable=True included
        return (
            (self.is_dir and not stat.S_ISDIR(st.st_mode))
            or (self.not_file and stat.S_ISREG(st.st_mode))
            or (self.not_dir and stat.S_ISDIR(st.st_mode))
            or not os.access(value, os.R_OK)
        )


_FORMAT = Opt("fmt", choices=("text", "json"))

#: command path -> its options (flag spelling -> Opt) and their defaults
FORMS: Dict[Tuple[str, ...], Tuple[Dict[str, Opt], Dict[str, Any]]] = {
    ("grants",): (
        {
            "--config": Opt("config_file", not_dir=True),
            "--journal": Opt("journal", not_dir=True),
            "--format": _FORMAT,
            "--prometheus": Opt("prom_file", not_dir=True),
            "--denied": Opt("denied", flag=True),
        },
        {"config_file": None, "journal": None, "fmt": "text", "prom_file": None, "denied": False},
    ),
    ("cdi", "list"): (
        {
            "--spec-dir": Opt("spec_dirs", multiple=True, is_dir=True),
            "--format": _FORMAT,
        },
        {"spec_dirs": (), "fmt": "text"},
    ),
    ("cdi", "generate"): (
        {
            "--driver-root": Opt("driver_root", is_dir=True),
            "--dev-root": Opt("dev_root", is_dir=True),
            "--vendor": Opt("vendor"),
            "--class": Opt("class_"),
            "--device-name-strategy": Opt("strategies", multiple=True, choices=("index", "uuid")),
            "--driver-capabilities": Opt("driver_capabilities"),
            "--gpu-source": Opt("gpu_source", choices=("auto", "procfs", "nvml")),
            "--hook-path": Opt("hook_path"),
            "--check": Opt("check_file", not_dir=True),
            "--output": Opt("output", not_dir=True),
            "-o": Opt("output", not_dir=True),
            "--format": Opt("fmt", choices=("yaml", "json")),
        },
        {
            "driver_root": None,
            "dev_root": None,
            "vendor": "nvidia.com",
            "class_": "gpu",
            "strategies": ("index", "uuid"),
            "driver_capabilities": "compute,utility",
            "gpu_source": "auto",
            "hook_path": None,
            "check_file": None,
            "output": None,
            "fmt": None,
        },
    ),
    ("doctor",): (
        {
            "--format": _FORMAT,
            "--config": Opt("config_file", not_dir=True),
            "--containerd-config": Opt("containerd_config", not_dir=True),
            "--docker-config": Opt("docker_config", not_dir=True),
            "--crio-config": Opt("crio_config", not_dir=True),
            "--driver-root": Opt("driver_root", not_file=True),
            "--dev-root": Opt("dev_root", not_file=True),
            "--trampoline": Opt("trampoline", not_dir=True),
            "--nvidia-config": Opt("nvidia_config", not_dir=True),
            "--hooks-dir": Opt("hooks_dirs", multiple=True, not_file=True),
            "--runtime-binary": Opt("runtime_binaries", multiple=True, not_dir=True),
            "--agent-socket": Opt("agent_socket"),
            "--verbose": Opt("verbose", flag=True),
            "-v": Opt("verbose", flag=True),
        },
        {
            "fmt": "text",
            "config_file": None,
            "containerd_config": "/etc/containerd/config.toml",
            "docker_config": "/etc/docker/daemon.json",
            "crio_config": "/etc/crio/crio.conf",
            "driver_root": None,
            "dev_root": None,
            "trampoline": None,
            "nvidia_config": "/etc/nvidia-container-runtime/config.toml",
            "hooks_dirs": (),
            "runtime_binaries": (),
            "agent_socket": AGENT_SOCKET,
            "verbose": False,
        },
    ),
}

#: The width click renders help at on a terminal of 80 columns or more (and off a terminal).
HELP_WIDTH = 80

TOP_HELP = """\
Usage: nvshim [OPTIONS] COMMAND [ARGS]...

  nvshim: give containers NVIDIA GPUs, readably.

  nvshim-runtime is the OCI runtime (set it as containerd's BinaryName); this
  command inspects what it would do, manages CDI specs, configures containerd
  and diagnoses a node.

Options:
  -q, --quiet  No informational lines on stderr (wrote …, notes); errors and
               warnings still print.
  --debug      On a failure, print the Python traceback before the one error
               line.
  --version    Show the version and exit.
  -h, --help   Show this message and exit.

Commands:
  agent        Run the node agent in the foreground until SIGTERM or SIGINT.
  cdi          Work with CDI (Container Device Interface) spec files.
  completion   Print the shell completion script for bash, zsh or fish.
  config       nvshim's own configuration file.
  demo         Run real containers through nvshim-runtime → runc on a...
  doctor       Check this node: config, containerd, Docker, CRI-O,...
  grants       Which live container holds which GPU, from the runtime's...
  hook         Run the createContainer hook (SONAME links, ld.so.cache) —...
  inspect      Show what nvshim-runtime would do to a bundle, without...
  params-hook  Run the createContainer hook that shows ModifyDeviceFiles:...
  runtime      Register nvshim-runtime with a container engine.
  sim          Simulated GPU nodes for tests and demos (no GPU needed;...
  system       Prepare the host: NVIDIA device nodes and their /dev/char...
"""


def _columns() -> int:
    """The terminal width click would see (``$COLUMNS``, else stdout's terminal, else 80)."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(1).columns
    except OSError:
        return HELP_WIDTH


def parse(
    args: Sequence[str], options: Dict[str, Opt], defaults: Dict[str, Any]
) -> Optional[Dict[str, Any]]:
    """The values of ``--name value``, ``--name=value`` and flags, or None for anything
    click should judge (an unknown option, an argument, a refused value)."""
    values = dict(defaults)
    given: Dict[str, List[str]] = {}
    i = 0
    while i < len(args):
        word = args[i]
        name, eq, inline = word.partition("=")
        opt = options.get(name)
        if opt is None:
            return None
        if opt.flag:
            if eq:
                return None
            values[opt.dest] = True
            i += 1
            continue
        if eq:
            value = inline
            i += 1
        elif i + 1 < len(args):
            value = args[i + 1]
            i += 2
        else:
            return None
        if opt.refuses(value):
            return None
        given.setdefault(opt.dest, []).append(value)
    for dest, seen in given.items():
        multiple = next(o.multiple for o in options.values() if o.dest == dest)
        values[dest] = tuple(seen) if multiple else seen[-1]
    return values


def serve(args: Sequence[str]) -> Optional[int]:
    """Answer ARGS without click (the exit status), or None: click answers them."""
    if COMPLETE_VAR in os.environ:
        return None
    if list(args) == ["--version"]:
        from nvshim.cli.report import out

        out(f"nvshim, version {__version__}")
        return 0
    if list(args) in ([], ["--help"], ["-h"]):
        if _columns() < HELP_WIDTH:
            return None
        from nvshim.cli.report import out

        out(TOP_HELP.rstrip("\n"))
        return 0
    for path, (options, defaults) in FORMS.items():
        if tuple(args[: len(path)]) == path:
            values = parse(args[len(path) :], options, defaults)
            if values is not None:
                return _run(path, values)
    return None


def _run(path: Tuple[str, ...], values: Dict[str, Any]) -> Optional[int]:
    from nvshim.cli import readonly

    if path == ("grants",):
        return readonly.grants(
            values["config_file"],
            values["journal"],
            values["fmt"],
            values["prom_file"],
            values["denied"],
        )
    if path == ("cdi", "list"):
        return readonly.cdi_list(values["spec_dirs"], values["fmt"])
    if path == ("doctor",):
        return readonly.doctor(
            values["fmt"],
            values["config_file"],
            values["containerd_config"],
            values["docker_config"],
            values["crio_config"],
            values["driver_root"],
            values["dev_root"],
            values["trampoline"],
            values["nvidia_config"],
            values["hooks_dirs"],
            values["runtime_binaries"],
            values["agent_socket"],
            values["verbose"],
        )
    if values["check_file"] is None:
        from nvshim.node.cdigen import generate_text

        text = generate_text(
            values["driver_root"],
            values["dev_root"],
            values["output"],
            values["fmt"],
            values["class_"],
            values["vendor"],
            values["strategies"],
            values["driver_capabilities"],
            values["gpu_source"],
            values["hook_path"],
        )
        if text:
            import sys

            sys.stdout.write(text)
        return 0
    return readonly.cdi_check(
        values["check_file"],
        False,
        values["driver_root"],
        values["dev_root"],
        values["class_"],
        values["vendor"],
        values["strategies"],
        values["driver_capabilities"],
        values["gpu_source"],
        values["hook_path"],
    )
