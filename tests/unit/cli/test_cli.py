"""The ``nvshim`` command as a whole: groups without a command, shell completion, the
global ``--quiet`` and ``--debug``, one-line errors, and DIR/FILE metavars."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator, List, Tuple

import click
import pytest

from nvshim.cli.main import cli
from tests.helpers.commands import nvshim_cli, run_cli

REPO = Path(__file__).resolve().parents[3]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")


def groups(group: click.Group, path: Tuple[str, ...] = ()) -> Iterator[Tuple[str, ...]]:
    """The command path of every group under ``group`` (itself first)."""
    yield path
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # the lazily loaded commands too
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from groups(command, (*path, name))


# --- a group without a command --------------------------------------------------------


@pytest.mark.parametrize("args", [[], ["cdi"], ["runtime"]])
def test_a_group_without_a_command_prints_its_help_and_exits_0(
    args: List[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`nvshim`, `nvshim cdi`, `nvshim runtime` print their help on stdout and exit 0, as
    git and kubectl do (they printed it on stderr and exited 1)."""
    code, out, err = run_cli(args, capsys)
    assert (code, err) == (0, "")
    assert out.startswith(f"Usage: nvshim {' '.join(args)}".rstrip() + " [OPTIONS] COMMAND")
    assert "Commands:" in out


def test_every_group_without_a_command_prints_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    """All groups, nested ones too (cdi transform), behave the same."""
    paths = list(groups(cli))
    assert {("cdi",), ("cdi", "transform"), ("runtime",), ("sim",), ("system",)} <= set(paths)
    for path in paths:
        code, out, err = run_cli(list(path), capsys)
        assert (code, err) == (0, ""), path
        assert out.startswith(f"Usage: nvshim {' '.join(path)}".rstrip() + " [OPTIONS]"), path


@needs_root
@pytest.mark.parametrize("args", [[], ["runtime"], ["cdi", "transform"]])
def test_a_group_without_a_command_prints_its_help_not_an_error_line(args: list) -> None:
    """Issue 11 defect hunt (CLI): `nvshim` (or a group) without a command printed its whole help as
    the error line "nvshim: Usage: …" (click 8.2 raises for it); now the help itself, on stdout,
    exit 0 (as git and kubectl do)."""
    out = nvshim_cli(*args)
    assert out.returncode == 0 and out.stderr == ""
    assert out.stdout.startswith(f"Usage: nvshim {' '.join(args)}".rstrip() + " [OPTIONS]")


def test_a_flag_without_a_command_is_still_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`nvshim --quiet` alone is not a request for help: one line, exit 1."""
    code, out, err = run_cli(["--quiet"], capsys)
    assert code == 1 and out == "" and err == "nvshim: Missing command.\n"


def test_click_errors_listing_choices_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Click spreads the choices of a missing argument over lines; nvshim prints one."""
    code, out, err = run_cli(["completion"], capsys)
    assert code == 1 and out == ""
    assert err == "nvshim: Missing argument 'SHELL'. Choose from: bash, zsh, fish\n"


# --- shell completion -----------------------------------------------------------------


def fake_nvshim(tmp_path: Path) -> Path:
    """A directory holding an ``nvshim`` command that runs this checkout's CLI."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "nvshim"
    script.write_text(
        f"#!/bin/sh\nexec {sys.executable} -I -c 'import sys; "
        f'sys.path.insert(0, "{REPO}"); '
        'from nvshim.cli.main import main; main()\' "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bindir


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_clicks_script(
    shell: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`nvshim completion SHELL` prints the script `_NVSHIM_COMPLETE=SHELL_source nvshim`
    prints, naming nvshim and its completion variable."""
    code, script, err = run_cli(["completion", shell], capsys)
    assert (code, err) == (0, "")
    assert "_NVSHIM_COMPLETE" in script and "nvshim" in script and script.endswith("\n")
    monkeypatch.setenv("_NVSHIM_COMPLETE", f"{shell}_source")
    code, source, _ = run_cli([], capsys)
    assert code == 0 and source.rstrip("\n") == script.rstrip("\n")
    if shell == "bash":
        assert "complete " in script


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completion_completes_commands_and_choices(tmp_path: Path) -> None:
    """Sourced in bash, the script completes `nvshim cd` to cdi and `--format` to its
    choices, by running nvshim with _NVSHIM_COMPLETE=bash_complete."""
    env = {"PATH": f"{fake_nvshim(tmp_path)}:/usr/bin:/bin", "HOME": str(tmp_path)}
    direct = subprocess.run(
        ["nvshim"],
        env={
            **env,
            "COMP_WORDS": "nvshim cd",
            "COMP_CWORD": "1",
            "_NVSHIM_COMPLETE": "bash_complete",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert direct.returncode == 0 and "plain,cdi" in direct.stdout.split(), direct.stderr
    shell = (
        "source <(nvshim completion bash) && complete -p nvshim && "
        "COMP_WORDS=(nvshim cd); COMP_CWORD=1; _nvshim_completion nvshim; "
        'echo "got: ${COMPREPLY[*]}"; COMPREPLY=(); '
        'COMP_WORDS=(nvshim system create-device-nodes --format ""); COMP_CWORD=4; '
        '_nvshim_completion nvshim; echo "got: ${COMPREPLY[*]}"'
    )
    res = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", shell],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    got = [line for line in res.stdout.splitlines() if line.startswith("got: ")]
    assert got == ["got: cdi", "got: text json"], res.stdout
    assert "-F _nvshim_completion nvshim" in res.stdout


def test_completion_help_says_how_to_install(capsys: pytest.CaptureFixture[str]) -> None:
    """--help names the file each shell loads the script from."""
    code, out, _ = run_cli(["completion", "--help"], capsys)
    assert code == 0
    for where in (
        "bash-completion/completions/nvshim",
        "~/.zfunc/_nvshim",
        "fish/completions/nvshim.fish",
        'eval "$(nvshim completion bash)"',
    ):
        assert where in out


# --- --quiet and --debug --------------------------------------------------------------


def test_info_prints_unless_quiet(capsys: pytest.CaptureFixture[str]) -> None:
    """info() writes to stderr outside a run and under a context without --quiet; never
    under --quiet."""
    from nvshim.cli.output import Output, info

    info("outside")
    with click.Context(cli, obj=Output(quiet=False)):
        info("loud")
    with click.Context(cli, obj=Output(quiet=True)):
        info("hushed")
    assert capsys.readouterr() == ("", "outside\nloud\n")


def test_debug_shows_the_traceback_of_an_nvshim_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An NvshimError is one line; with --debug the traceback comes first, the same line
    last; --quiet never hides it."""
    missing = str(tmp_path / "nope")
    line = f"nvshim: cannot read {missing}/config.json: no such file"
    code, _, err = run_cli(["inspect", "--bundle", missing], capsys)
    assert (code, err) == (1, line + "\n")
    code, _, err = run_cli(["--quiet", "inspect", "--bundle", missing], capsys)
    assert (code, err) == (1, line + "\n")
    code, _, err = run_cli(["--debug", "inspect", "--bundle", missing], capsys)
    assert code == 1 and err.startswith("Traceback (most recent call last):")
    assert "SpecError" in err and err.splitlines()[-1] == line


def test_an_unexpected_error_is_one_line_and_its_traceback_under_debug(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug (an exception that is no NvshimError) is one `internal error` line naming the
    exception (a line break in it escaped), exit 1, and how to see more; --debug shows the
    traceback."""

    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("boom\nsecond line")

    monkeypatch.setattr("nvshim.cli.cmd_system.create_dev_char_symlinks", broken)
    args = ["system", "create-dev-char-symlinks", "--dev-root", str(tmp_path)]
    code, out, err = run_cli(args, capsys)
    assert (code, out) == (1, "")
    assert err == (
        "nvshim: internal error: ValueError: boom\\nsecond line "
        "(nvshim --debug shows the traceback)\n"
    )
    code, _, err = run_cli(["--debug", *args], capsys)
    assert code == 1 and "Traceback (most recent call last):" in err and "in broken" in err
    assert err.splitlines()[-1] == "nvshim: internal error: ValueError: boom\\nsecond line"


@needs_root
def test_quiet_sim_create_prints_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`nvshim --quiet sim create DIR` builds the node and prints nothing; without --quiet
    it lists what it built."""
    code, out, err = run_cli(
        ["--quiet", "sim", "create", str(tmp_path / "a"), "--gpus", "1"], capsys
    )
    assert (code, out, err) == (0, "", "")
    assert (tmp_path / "a" / "dev" / "nvidiactl").exists()
    code, out, _ = run_cli(["sim", "create", str(tmp_path / "b"), "--gpus", "1"], capsys)
    assert code == 0 and "GPU 0: /dev/nvidia" in out


def test_quiet_demo_prints_the_verdict_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`nvshim --quiet demo` prints only the demo's last line when every container behaved,
    and everything when one did not (exit 1)."""
    import nvshim.node.demo as demo

    def fake_run(failures: int) -> Callable[..., int]:
        def run(echo: Callable[[str], None], keep: bool = False) -> int:
            for line in ("Simulated node in /x", "  -> as expected", "demo finished: verdict"):
                echo(line)
            return failures

        return run

    monkeypatch.setattr(demo, "run_demo", fake_run(0))
    assert run_cli(["--quiet", "demo"], capsys) == (0, "demo finished: verdict\n", "")
    assert run_cli(["demo"], capsys)[1].count("\n") == 3
    monkeypatch.setattr(demo, "run_demo", fake_run(1))
    code, out, _ = run_cli(["--quiet", "demo"], capsys)
    assert code == 1 and out.count("\n") == 3


# --- metavars -------------------------------------------------------------------------


def commands(group: click.Group) -> Iterator[click.Command]:
    """Every command under ``group``, nested ones too."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # the lazily loaded commands too
        command = group.get_command(ctx, name)
        assert command is not None, name
        yield command
        if isinstance(command, click.Group):
            yield from commands(command)


def test_directories_show_dir_and_files_show_file(capsys: pytest.CaptureFixture[str]) -> None:
    """Every path option and argument of the commands defined in the click app and cmd_system
    shows DIR when it takes a directory and FILE when it takes a file."""
    from nvshim.cli import app, cmd_system

    ctx = click.Context(cli)
    checked = []
    for command in commands(cli):
        if command.callback is None or command.callback.__module__ not in (
            app.__name__,
            cmd_system.__name__,
        ):
            continue
        for param in command.params:
            if not isinstance(param.type, click.Path):
                continue
            want = {(True, False): "FILE", (False, True): "DIR"}.get(
                (param.type.file_okay, param.type.dir_okay)
            )
            shown = param.make_metavar(ctx)
            checked.append((command.name, param.name))
            assert shown == want, (command.name, param.name, shown)
    assert ("create", "directory") in checked and ("create-device-nodes", "driver_root") in checked
    assert ("create-dev-char-symlinks", "dev_root") in checked
    code, out, _ = run_cli(["sim", "create", "--help"], capsys)
    assert code == 0 and "Usage: nvshim sim create [OPTIONS] DIR" in out
    assert "--dev-root DIR" in out and "DIRECTORY" not in out


def test_quiet_config_compile_and_cdi_validate_print_no_progress_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The `wrote …` lines of config compile and the count line of cdi validate are
    informational: gone under --quiet, there without it."""
    config = tmp_path / "config.yaml"
    config.write_text(
        f"driver-root: {tmp_path}\ncdi-spec-dirs: [{tmp_path}/cdi]\ngrants-journal: null\n"
    )
    code, out, err = run_cli(["--quiet", "config", "compile", "--config", str(config)], capsys)
    assert (code, out, err) == (0, "", "")
    code, _, err = run_cli(["config", "compile", "--config", str(config)], capsys)
    assert code == 0 and "wrote " in err
    spec = tmp_path / "spec.json"
    spec.write_text(
        '{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": '
        '[{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}]}'
    )
    code, out, err = run_cli(["--quiet", "cdi", "validate", str(spec)], capsys)
    assert (code, out, err) == (0, "", "")
    code, _, err = run_cli(["cdi", "validate", str(spec)], capsys)
    assert code == 0 and "1 file, 0 problems" in err
