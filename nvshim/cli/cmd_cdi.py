"""``nvshim cdi …``: list resolvable CDI devices, validate, generate and refresh spec files.

The group is exported as :data:`cdi`; other commands (``generate``) attach to it with
``@cdi.command()``. Output rules: results on stdout, warnings and summaries on stderr.

Why one module: it is the click shell of `nvshim cdi`, one subcommand per function, and most
of its lines are options and help texts; the work of each (loading, checking, generating,
refreshing specs) lives in nvshim.cdi and nvshim.node, and the output rules above are shared
by every subcommand.
"""

from __future__ import annotations

import sys
from typing import Any, BinaryIO, Dict, List, Optional, Tuple

import click

from nvshim.cli.options import CONFIG_FILE, FORMAT
from nvshim.cli.output import info, settings
from nvshim.cli.readonly import echo_json, problem_json
from nvshim.config import DEFAULT_CAPABILITIES, DEFAULT_CDI_SPEC_DIRS
from nvshim.node.cdigen import STRATEGIES

__all__ = ["cdi"]


@click.group(name="cdi")
def cdi() -> None:
    """Work with CDI (Container Device Interface) spec files."""


@cdi.command(name="list")
@click.option(
    "--spec-dir",
    "spec_dirs",
    multiple=True,
    type=click.Path(exists=True, file_okay=False),
    metavar="DIR",
    help="Directory to scan, lowest priority first (repeatable; must exist). "
    "Default: the config's cdi-spec-dirs "
    f"({', '.join(DEFAULT_CDI_SPEC_DIRS)} unless configured).",
)
@FORMAT
def list_devices(spec_dirs: Tuple[str, ...], fmt: str) -> None:
    """Print every resolvable qualified device name, one per line.

    Files that fail to load, files others could have written (run as root: a spec or
    its directory not owned by root, or writable by group or others; nvshim-runtime skips
    them too) and conflicting devices are reported on stderr as warnings; they do not
    change the exit status. When no device is found, stderr says
    which directories were searched. --format json prints one document: the
    directories, each device (name, kind, device name, spec file) and the problems.
    """
    from nvshim.cli.readonly import cdi_list

    cdi_list(spec_dirs, fmt)


@cdi.command()
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@FORMAT
def validate(files: Tuple[str, ...], fmt: str) -> None:
    """Check CDI spec files against the schema and CDI's rules (`-` reads stdin).

    Prints one line per problem (`<file>: <json path>: <message>`) and a summary on
    stderr; exits 1 if any file has a problem. --format json prints one document
    instead: per file, whether it is ok and its problems.
    """
    from nvshim.cdi.load import STDIN
    from nvshim.cdi.schema import validate_file

    results = [(STDIN if path == "-" else path, validate_file(path, _stdin())) for path in files]
    total = sum(len(problems) for _, problems in results)
    if fmt == "json":
        echo_json(
            {
                "files": [
                    {
                        "file": path,
                        "ok": not problems,
                        "problems": [problem_json(p) for p in problems],
                    }
                    for path, problems in results
                ],
                "ok": not total,
            }
        )
    else:
        for _, problems in results:
            for problem in problems:
                click.echo(str(problem))
        info(
            f"{len(files)} file{'s' if len(files) != 1 else ''}, "
            f"{total} problem{'s' if total != 1 else ''}"
        )
    if total:
        click.get_current_context().exit(1)


def _stdin() -> Optional[BinaryIO]:
    """Standard input's bytes; None when it is closed (``cmd <&-``: Python has no stdin)."""
    return sys.stdin.buffer if sys.stdin is not None else None


# --- generate ---------------------------------------------------------------------------


@cdi.command()
@click.option(
    "--driver-root",
    default=None,
    metavar="DIR",
    type=click.Path(exists=True, file_okay=False),
    help="Driver root (default: from config, usually /).",
)
@click.option(
    "--dev-root",
    default=None,
    metavar="DIR",
    type=click.Path(exists=True, file_okay=False),
    help="Where /dev/nvidia* are (default: driver root).",
)
@click.option(
    "--output",
    "-o",
    default=None,
    metavar="FILE",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Write here atomically (mode 0644; .json or .yaml picks the format). "
    "Default (or -): stdout.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["yaml", "json"]),
    default=None,
    help="Output format for stdout (default yaml; --output uses its extension).",
)
@click.option("--vendor", default="nvidia.com", show_default=True, help="CDI vendor.")
@click.option(
    "--class",
    "class_",
    default="gpu",
    show_default=True,
    help="CDI device class. imex-channel: a spec of the node's IMEX channels "
    "(<vendor>/imex-channel=N, one /dev/nvidia-caps-imex-channels/channelN each).",
)
@click.option(
    "--device-name-strategy",
    "strategies",
    multiple=True,
    default=STRATEGIES,
    show_default=True,
    type=click.Choice(STRATEGIES),
    help="How devices are named: index (0, 0:1) and/or uuid (GPU-…, MIG-…).",
)
@click.option(
    "--driver-capabilities",
    default=",".join(DEFAULT_CAPABILITIES),
    show_default=True,
    help="Which driver files the spec injects (NVIDIA_DRIVER_CAPABILITIES syntax).",
)
@click.option(
    "--gpu-source",
    type=click.Choice(["auto", "procfs", "nvml"]),
    default="auto",
    show_default=True,
    help="Where GPUs are read from.",
)
@click.option(
    "--hook-path",
    default=None,
    metavar="PATH",
    help="Absolute path of an `nvshim` command on the hosts that will use the spec; "
    "its hooks then run as `PATH hook …` and `PATH params-hook …` instead of "
    "naming this nvshim's venv interpreter, so the spec works where nvshim is "
    "installed elsewhere.",
)
@click.option(
    "--check",
    "check_file",
    default=None,
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="Do not write: exit 1 with the reasons if FILE is stale for this node.",
)
def generate(
    driver_root: Optional[str],
    dev_root: Optional[str],
    output: Optional[str],
    fmt: Optional[str],
    vendor: str,
    class_: str,
    strategies: Tuple[str, ...],
    driver_capabilities: str,
    gpu_source: str,
    hook_path: Optional[str],
    check_file: Optional[str],
) -> None:
    """Generate a CDI spec for this node's GPUs (devices by index, UUID, MIG, and all).

    With --class imex-channel: a spec of the node's IMEX channels instead (write it to a
    second file, e.g. /var/run/cdi/nvidia-imex.yaml).

    cdiVersion is the minimum the content needs (0.5.0 for a typical spec, which
    podman 4.x accepts). Works from procfs under any driver root, and with NVML on a
    real host.
    """
    if check_file:
        from nvshim.cli.readonly import cdi_check

        cdi_check(
            check_file,
            settings().quiet,
            driver_root,
            dev_root,
            class_,
            vendor,
            strategies,
            driver_capabilities,
            gpu_source,
            hook_path,
        )
        return
    from nvshim.node.cdigen import generate_text

    text = generate_text(
        driver_root,
        dev_root,
        output,
        fmt,
        class_,
        vendor,
        strategies,
        driver_capabilities,
        gpu_source,
        hook_path,
    )
    if text:
        click.echo(text, nl=False)


# --- refresh ----------------------------------------------------------------------------

#: generate's options a cdi-refresh entry may not give: the config names the roots, and an
#: entry writes its spec (it neither checks one nor prints one).
_NOT_IN_REFRESH = ("--driver-root", "--dev-root", "--check", "--format", "--help")


@cdi.command()
@CONFIG_FILE
@click.option(
    "--watch",
    is_flag=True,
    help="Keep running: refresh now, then whenever the driver changes (polls the "
    "--print-watch-paths files), until SIGTERM or SIGINT (exit 0). For nodes "
    "without systemd, e.g. a DaemonSet's container. Logs on stderr: JSON lines "
    "unless a terminal reads them (or in a pod, always JSON).",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.01),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="How often --watch polls.",
)
@click.option(
    "--print-watch-paths",
    is_flag=True,
    help="Print the files whose change means the driver changed, one per line "
    "(what --watch polls and install.sh's nvshim-cdi-refresh.path watches), "
    "and exit.",
)
def refresh(
    config_file: Optional[str], watch: bool, interval: float, print_watch_paths: bool
) -> None:
    """Bring everything nvshim derives from the driver up to date, in one go.

    Regenerates each CDI spec the config's cdi-refresh lists (an entry is the options of
    `nvshim cdi generate`, --output required), then the compiled config, the node plan
    cache and the CDI index when stale. Atomic writes, only of what changed: a second run
    writes nothing. Exits 1 with one line, writing nothing, when the driver is not there
    yet or an entry cannot be made. Prints on stderr what it rewrote.
    """
    from nvshim.config import load_config
    from nvshim.node import cdirefresh

    def load() -> Tuple[Any, List[Any]]:
        config = load_config(config_file, required=True)
        return config, _refresh_targets(config)

    if print_watch_paths:
        config, _ = load()
        for path in cdirefresh.watch_paths(config):
            click.echo(path)
        return
    if watch:
        from nvshim.logs import configure

        cdirefresh.watch(load, interval, configure(name="nvshim.cdi-refresh"))
        return
    config, targets = load()
    done = cdirefresh.refresh_node(config, targets)
    for line in done.written:
        info(line)
    if not done.written:
        specs = f"{done.specs} CDI spec{'s' if done.specs != 1 else ''}"
        info(
            f"nothing to refresh: {specs}, the node plan and the CDI index are current "
            f"for driver {done.version}"
        )


def _refresh_targets(config: Any) -> List[Any]:
    """The config's cdi-refresh entries, parsed by `generate`'s own options."""
    import os
    import shlex

    from nvshim import _jsonc
    from nvshim.config import describe_config
    from nvshim.errors import ConfigError
    from nvshim.node.cdirefresh import Target

    targets: List[Any] = []
    seen: Dict[str, int] = {}
    for i, entry in enumerate(config.cdi_refresh):
        where = f'{describe_config(config)}: "cdi-refresh[{i}]" is {_jsonc.dumps(entry)}'
        try:
            args = shlex.split(entry)
        except ValueError as exc:
            raise ConfigError(f"{where}: {_sentence(str(exc))}") from None
        banned = [a for a in args if a.split("=", 1)[0] in _NOT_IN_REFRESH]
        if banned:
            raise ConfigError(
                f"{where}: {banned[0].split('=', 1)[0]} cannot be used here "
                "(driver-root and dev-root come from the config)"
            )
        try:
            params = generate.make_context("generate", args).params
        except click.ClickException as exc:
            raise ConfigError(f"{where}: {_sentence(exc.format_message())}") from None
        output = params["output"]
        if not output or output == "-" or not os.path.isabs(output):
            raise ConfigError(f"{where}: needs --output with an absolute path")
        if output in seen:
            raise ConfigError(f"{where}: {output} is also cdi-refresh[{seen[output]}]'s output")
        seen[output] = i
        targets.append(
            Target(
                entry,
                output,
                params["class_"],
                params["vendor"],
                tuple(params["strategies"]),
                params["driver_capabilities"],
                params["gpu_source"],
                params["hook_path"],
            )
        )
    return targets


def _sentence(message: str) -> str:
    """A library's message in nvshim's style: lower-case start, no trailing period."""
    message = message.replace(". Did you mean", "; did you mean").rstrip(".")
    return message[:1].lower() + message[1:]


# --- transform --------------------------------------------------------------------------


@click.command("root")
@click.option(
    "--from", "old", required=True, metavar="DIR", help="The root the spec's paths are under now."
)
@click.option("--to", "new", required=True, metavar="DIR", help="The root they should be under.")
@click.option(
    "--relative-to",
    type=click.Choice(["host", "container"]),
    default="host",
    show_default=True,
    help="Which paths move: host paths (hostPath, hook path) or container paths.",
)
@click.option(
    "--input",
    "input_file",
    required=True,
    metavar="FILE",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="The spec file to read (.yaml or .json); - reads stdin (JSON if it "
    "starts with {, else YAML).",
)
@click.option(
    "--output",
    "-o",
    default=None,
    metavar="FILE",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Write here atomically (.json or .yaml picks the format); default (or -): stdout.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["yaml", "json"]),
    default=None,
    help="Format for stdout (default: the input's).",
)
def root_command(
    old: str, new: str, relative_to: str, input_file: str, output: Optional[str], fmt: Optional[str]
) -> None:
    """Rewrite a spec's paths from the root --from to the root --to.

    For driver containers: e.g. --from /run/nvidia/driver --to / turns a spec written on
    the host into one for a host where the driver sits at /. Only paths at or below
    --from change (compared by path components); the result must be a valid spec. Says
    on stderr how many paths moved.
    """
    from nvshim.cdi.check import check_semantics
    from nvshim.cdi.load import read_input_document
    from nvshim.cdi.transform import transform_root
    from nvshim.cdi.write import dump_spec, write_spec
    from nvshim.errors import CdiError

    document, input_format, label = read_input_document(input_file, _stdin())
    spec, changed = transform_root(document, old, new, relative_to)
    problems = check_semantics(spec, label)
    if problems:
        raise CdiError(f"transformed spec is invalid: {problems[0]}")
    if output and output != "-":
        write_spec(output, spec)
    else:
        click.echo(dump_spec(spec, fmt or input_format), nl=False)
    info(f"moved {changed} path{'s' if changed != 1 else ''} from {old} to {new}")


@click.group("transform")
def transform() -> None:
    """Transform CDI spec files."""


cdi.add_command(transform)
transform.add_command(root_command)
