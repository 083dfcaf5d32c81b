"""``nvshim``'s click-free forms (nvshim.cli.fast): they answer exactly as click would, their
option tables agree with the click declarations, they never import click, and every other
form still reaches click."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import click
import pytest

from nvshim.cli import app, fast
from nvshim.cli.main import main

REPO = Path(__file__).resolve().parents[3]

#: doctor's engine configs and trampoline, none of them there: the host's are not read
DOCTOR_FILES = [
    f"--{name}={{tmp}}/none.{name}"
    for name in ("containerd-config", "docker-config", "crio-config", "nvidia-config", "trampoline")
]


def _command(path: Tuple[str, ...]) -> click.Command:
    command: Any = app.cli
    for name in path:
        command = command.get_command(click.Context(command), name)
    assert isinstance(command, click.Command), path
    return command


def _loaded_after(args: List[str], kept: str, env: Dict[str, str]) -> Tuple[str, List[str]]:
    """(stderr, the modules ``kept`` selects) after `nvshim ARGS` in a fresh interpreter;
    ``kept`` is a condition on ``m``, a module name. Its exit status is on stderr (``EXIT``)."""
    code = (
        "import sys\nfrom nvshim.cli.main import main\ntry:\n    main(sys.argv[1:])\n"
        "except SystemExit as e:\n    sys.stderr.write(f'EXIT {e.code}\\n')\n"
        f"sys.stderr.write('LOADED ' + ' '.join(sorted(m for m in sys.modules if {kept})))"
    )
    res = subprocess.run(
        [sys.executable, "-I", "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", **env},
    )
    return res.stderr, res.stderr.rsplit("LOADED", 1)[1].split()


def _click_modules_after(args: List[str]) -> List[str]:
    """The click modules and click command modules `nvshim ARGS` loads."""
    kept = "m == 'click' or m.startswith(('click.', 'nvshim.cli.cmd_', 'nvshim.cli.app'))"
    return _loaded_after(args, kept, {"COLUMNS": "80"})[1]


def _run(runner: Any, args: List[str], capsys: pytest.CaptureFixture[str]) -> Tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        runner(args)
    out, err = capsys.readouterr()
    code = exc.value.code
    return (code if isinstance(code, int) else 1), out, err


def test_the_top_level_help_is_clicks_at_80_columns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """TOP_HELP is what click prints for `nvshim --help` on a terminal of 80 columns or more
    (regenerate it from this test's output when a command or the group's text changes)."""
    monkeypatch.setenv("COLUMNS", str(fast.HELP_WIDTH))
    code, out, _ = _run(app.run, ["--help"], capsys)
    assert code == 0
    assert fast.TOP_HELP == out, out


@pytest.mark.parametrize("path", sorted(fast.FORMS))
def test_each_forms_table_agrees_with_its_click_declaration(path: Tuple[str, ...]) -> None:
    """Flags (short ones too), destinations, flag-ness, multiple, choices, path rules and
    defaults of every option the fast form parses are the click command's, and it parses
    every option but --help."""
    options, defaults = fast.FORMS[path]
    command = _command(path)
    seen = set()
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        flags = [f for f in param.opts + param.secondary_opts if f in options]
        if not flags:
            assert param.opts == ["--help"], (path, param.opts)
            continue
        # every spelling click takes is served (or none is); short flags only where given
        assert flags == param.opts, (path, param.opts)
        for flag in flags:
            opt = options[flag]
            seen.add(flag)
            assert opt.dest == param.name, flag
            assert opt.flag == param.is_flag, flag
            assert opt.multiple == param.multiple, flag
            choices = tuple(param.type.choices) if isinstance(param.type, click.Choice) else ()
            assert opt.choices == choices, flag
            is_path = isinstance(param.type, click.Path)
            assert opt.is_dir == (is_path and param.type.exists and not param.type.file_okay), flag
            assert opt.not_dir == (is_path and not param.type.dir_okay and not opt.is_dir), flag
            assert opt.not_file == (
                is_path and not param.type.file_okay and not param.type.exists
            ), flag
            default = param.get_default(click.Context(command), call=True)
            if param.multiple:  # without a default (None, or click 8.3's UNSET) it is ()
                want = tuple(default) if isinstance(default, (tuple, list)) else ()
            else:
                want = default
            assert defaults[opt.dest] == want, flag
    assert seen == set(options), path


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["--help"],
        ["-h"],
        [],
        ["grants", "--journal", "{tmp}/grants.jsonl"],
        ["grants", "--format", "json", "--journal={tmp}/grants.jsonl"],
        ["grants", "--denied", "--journal", "{tmp}/grants.jsonl"],
        ["grants", "--config", "{tmp}/config.yaml"],
        ["cdi", "list", "--spec-dir", "{tmp}/cdi"],
        ["cdi", "list", "--spec-dir", "{tmp}/cdi", "--format", "json"],
        ["cdi", "list", "--spec-dir", "{tmp}/empty"],
        ["doctor", *DOCTOR_FILES],
        ["doctor", "--format", "json", *DOCTOR_FILES],
        [
            "doctor",
            "-v",
            "--driver-root",
            "{tmp}/empty",
            "--hooks-dir",
            "{tmp}/empty",
            "--hooks-dir={tmp}/cdi",
            "--runtime-binary",
            "{tmp}/runc",
            *DOCTOR_FILES,
        ],
        ["doctor", "--verbose", "--config", "{tmp}/none.yaml", *DOCTOR_FILES],
    ],
)
def test_a_fast_form_answers_as_click_does(
    args: List[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Exit status, stdout and stderr of the fast form equal click's run of the same
    arguments (journals present and absent, a spec dir with a device and an empty one,
    doctor on engine configs of the tmp dir, with and without a config that exists)."""
    monkeypatch.setenv("COLUMNS", str(fast.HELP_WIDTH))
    (tmp_path / "empty").mkdir()
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / "gpu.json").write_text(
        json.dumps(
            {
                "cdiVersion": "0.5.0",
                "kind": "nvidia.com/gpu",
                "devices": [
                    {
                        "name": "0",
                        "containerEdits": {
                            "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/null"}]
                        },
                    }
                ],
            }
        )
    )
    os.chmod(tmp_path / "cdi" / "gpu.json", 0o644)
    (tmp_path / "grants.jsonl").write_text("")
    (tmp_path / "config.yaml").write_text(f"grants-journal: {tmp_path}/none.jsonl\n")
    os.chmod(tmp_path / "config.yaml", 0o644)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert fast.serve(argv) is not None or argv == [], argv  # served (it printed too)
    capsys.readouterr()
    assert _run(main, argv, capsys) == _run(app.run, argv, capsys)


@pytest.mark.parametrize(
    "args",
    [
        ["grants", "--format", "xml"],  # a choice click refuses
        ["cdi", "list", "--spec-dir", "/nonexistent/nvshim"],  # a directory that is not there
        ["grants", "--help"],  # a command's help
        ["-q", "grants"],  # a global option
        ["cdi", "generate", "--output", "/"],  # a directory where a file is due
        ["cdi", "generate", "--format", "xml"],  # a choice click refuses
        ["grants", "--denied=1"],  # a flag given a value
        ["cdi", "list", "--spec-dir"],  # an option without its value
        ["cdi", "generate", "-o"],  # an option without its value
        ["doctor", "--driver-root", "/etc/hostname"],  # a file where a directory is due
        ["doctor", "--config", "/"],  # a directory where a file is due
        ["doctor", "-vv"],  # short flags bundled
        ["doctor", "--format", "yaml"],  # a choice click refuses
    ],
)
def test_other_forms_are_left_to_click(args: List[str]) -> None:
    """serve() answers None (without printing) for anything click must judge or run."""
    assert fast.serve(args) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="simulated nodes need root (mknod)")
@pytest.mark.parametrize(
    "args",
    [
        ["--output", "{tmp}/out/nvidia.yaml"],
        ["-o", "{tmp}/out/nvidia.json", "--device-name-strategy", "uuid"],
        ["--format", "json", "--driver-capabilities", "all"],
        ["-o", "-"],
        ["--class", "imex-channel"],
    ],
)
def test_generate_served_without_click_writes_what_click_writes(
    args: List[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cdi generate` (to a file or stdout) runs without click, and its exit status,
    stdout, stderr and the file it writes are click's."""
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=2, mig=True, imex_channels=2)
    argv = [
        "cdi",
        "generate",
        "--driver-root",
        node.root,
        *[a.replace("{tmp}", str(tmp_path)) for a in args],
    ]
    out_file = next((a for a in argv if a.startswith(str(tmp_path / "out"))), None)
    served = _run(main, argv, capsys)
    written = Path(out_file).read_bytes() if out_file else b""
    if out_file:
        os.unlink(out_file)
    assert served == _run(app.run, argv, capsys)
    assert served[0] == 0 and (written or served[1])
    assert (Path(out_file).read_bytes() if out_file else b"") == written
    loaded = _click_modules_after(argv)
    assert loaded == [], (argv, loaded)


def test_a_form_click_refuses_gets_clicks_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """`nvshim grants --format xml` still fails with click's message, in one line."""
    code, out, err = _run(main, ["grants", "--format", "xml"], capsys)
    assert (code, out) == (1, "")
    assert err.startswith("nvshim: Invalid value for '--format'") and err.count("\n") == 1


def test_help_on_a_narrow_terminal_is_clicks(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under 80 columns click wraps the help itself: the fast form steps aside."""
    monkeypatch.setenv("COLUMNS", "60")
    assert fast.serve(["--help"]) is None
    code, out, _ = _run(main, ["--help"], capsys)
    assert code == 0 and out != fast.TOP_HELP and max(map(len, out.splitlines())) <= 60


def test_completion_is_clicks(monkeypatch: pytest.MonkeyPatch) -> None:
    """With _NVSHIM_COMPLETE set, even `nvshim` alone is click's (it prints the script)."""
    monkeypatch.setenv(fast.COMPLETE_VAR, "bash_source")
    assert fast.serve([]) is None


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["--help"],
        ["grants", "--journal", "/nonexistent/j"],
        ["cdi", "list", "--spec-dir", "/"],
        ["doctor", "--containerd-config", "/nonexistent/c.toml"],
    ],
)
def test_a_fast_form_imports_no_click(args: List[str]) -> None:
    """The served forms load neither click nor a click command module."""
    loaded = _click_modules_after(args)
    assert loaded == [], (args, loaded)


def test_a_served_failure_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """An nvshim error in a served form is the same `nvshim: …` line and status as click's."""
    args = ["grants", "--journal", "/nonexistent/nvshim/grants.jsonl"]
    fast_result = _run(main, args, capsys)
    assert fast_result == _run(app.run, args, capsys)
    code, out, err = fast_result
    assert (
        code == 1
        and out == ""
        and err == ("nvshim: grant journal /nonexistent/nvshim/grants.jsonl does not exist\n")
    )


def _spec_dirs(tmp_path: Path) -> Tuple[Path, Path]:
    """A config naming two spec dirs: YAML and JSON specs, a broken one and one others could
    have written (skipped with a warning); compiled, so its CDI index exists."""
    low, high = tmp_path / "low", tmp_path / "high"
    for d in (low, high):
        d.mkdir()
    (low / "a.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
        "- name: '0'\n  containerEdits:\n    deviceNodes:\n"
        "    - {path: /dev/nvidia0, hostPath: /dev/null}\n"
    )
    (high / "b.json").write_text(
        json.dumps(
            {
                "cdiVersion": "0.5.0",
                "kind": "example.com/net",
                "devices": [{"name": "eth", "containerEdits": {"env": ["A=1"]}}],
            }
        )
    )
    (high / "broken.yaml").write_text("cdiVersion: [\n")
    (high / "loose.yaml").write_text("cdiVersion: 0.5.0\nkind: x.com/y\ndevices: []\n")
    for f in (low / "a.yaml", high / "b.json", high / "broken.yaml"):
        os.chmod(f, 0o644)
    os.chmod(high / "loose.yaml", 0o666)
    config = tmp_path / "config.yaml"
    config.write_text(f"cdi-spec-dirs: [{low}, {high}]\n")
    os.chmod(config, 0o644)
    return config, tmp_path


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_cdi_list_of_the_configs_dirs_through_the_index_reads_as_a_full_scan(
    fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cdi list` (the config's dirs, through the compiled CDI index) prints what
    `cdi list --spec-dir …` (a full scan of the same dirs) prints, before and after compile."""
    config, tmp = _spec_dirs(tmp_path)
    monkeypatch.setenv("NVSHIM_CONFIG", str(config))
    scan = _run(
        main,
        ["cdi", "list", "--format", fmt, "--spec-dir", f"{tmp}/low", "--spec-dir", f"{tmp}/high"],
        capsys,
    )
    assert _run(main, ["cdi", "list", "--format", fmt], capsys) == scan  # no index yet
    assert _run(main, ["config", "compile", "--config", str(config)], capsys)[0] == 0
    assert list(tmp.glob("*.cdi-index.json")), "compile writes the index"
    assert _run(main, ["cdi", "list", "--format", fmt], capsys) == scan
    assert "nvidia.com/gpu=0" in scan[1] and "loose.yaml" in scan[1 if fmt == "json" else 2]


def _modules_after(args: List[str], env: Dict[str, str]) -> List[str]:
    """yaml, click and typing, of what a successful `nvshim ARGS` loads."""
    stderr, loaded = _loaded_after(args, "m in ('yaml', 'click', 'typing')", env)
    assert "EXIT 0" in stderr, stderr
    return loaded


def test_cdi_list_with_a_fresh_index_parses_no_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the config compiled, `cdi list` reads its YAML specs from the index: yaml is
    never imported (it costs more than the rest of the command)."""
    config, _ = _spec_dirs(tmp_path)
    assert _run(main, ["config", "compile", "--config", str(config)], capsys)[0] == 0
    assert "yaml" not in _modules_after(["cdi", "list"], {"NVSHIM_CONFIG": str(config)})


@pytest.mark.skipif(os.geteuid() != 0, reason="the simulated node needs mknod (root)")
def test_generate_check_of_an_indexed_spec_parses_no_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cdi generate --check` of the config's own YAML spec, current and indexed, says current
    without importing yaml or typing; once the spec changes it reads the file and says stale."""
    node, spec_dir = tmp_path / "node", tmp_path / "cdi"
    spec_dir.mkdir()
    config = tmp_path / "config.yaml"
    config.write_text(f"driver-root: {node}\ncdi-spec-dirs: [{spec_dir}]\n")
    os.chmod(config, 0o644)
    assert _run(main, ["--quiet", "sim", "create", str(node), "--gpus", "2"], capsys)[0] == 0
    spec = spec_dir / "nvidia.yaml"
    assert (
        _run(main, ["cdi", "generate", "--driver-root", str(node), "--output", str(spec)], capsys)[
            0
        ]
        == 0
    )
    assert _run(main, ["config", "compile", "--config", str(config)], capsys)[0] == 0
    env = {"NVSHIM_CONFIG": str(config)}
    args = ["cdi", "generate", "--check", str(spec), "--driver-root", str(node)]
    assert _modules_after(args, env) == []
    spec.write_text(spec.read_text().replace("550.54.15", "550.54.14"))  # another driver
    code, _, err = _run(main, args, capsys)
    assert code == 1 and "is stale" in err


@pytest.mark.skipif(os.geteuid() != 0, reason="the simulated node needs mknod (root)")
def test_doctor_reads_indexed_yaml_specs_without_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the config compiled, doctor judges the config's YAML spec from the CDI index:
    the same findings as before compile, and yaml is never imported."""
    node, spec_dir = tmp_path / "node", tmp_path / "cdi"
    spec_dir.mkdir()
    config = tmp_path / "config.yaml"
    config.write_text(f"driver-root: {node}\ncdi-spec-dirs: [{spec_dir}]\n")
    os.chmod(config, 0o644)
    assert _run(main, ["--quiet", "sim", "create", str(node), "--gpus", "2"], capsys)[0] == 0
    assert (
        _run(
            main,
            [
                "cdi",
                "generate",
                "--driver-root",
                str(node),
                "--output",
                str(spec_dir / "nvidia.yaml"),
            ],
            capsys,
        )[0]
        == 0
    )
    args = [
        "doctor",
        "--format",
        "json",
        "--config",
        str(config),
        *[a.replace("{tmp}", str(tmp_path)) for a in DOCTOR_FILES],
    ]
    before = _run(main, args, capsys)
    assert _run(main, ["config", "compile", "--config", str(config)], capsys)[0] == 0
    after = _run(main, args, capsys)

    def specs(result: Tuple[int, str, str]) -> List[Any]:
        return [f for f in json.loads(result[1]) if f["check"] in ("cdi-specs", "executable-trust")]

    assert specs(after) == specs(before)
    assert any("nvidia.yaml is current" in f["message"] for f in specs(after)), after
    code = (
        "import sys\nfrom nvshim.cli.main import main\ntry:\n    main(sys.argv[1:])\n"
        "except SystemExit:\n    pass\n"
        "sys.stderr.write('LOADED ' + ' '.join(sorted(m for m in sys.modules "
        "if m in ('yaml', 'click', 'tomlkit', 'pynvml'))))"
    )
    res = subprocess.run(
        [sys.executable, "-I", "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert res.stderr.rsplit("LOADED", 1)[1].split() == [], res.stderr
