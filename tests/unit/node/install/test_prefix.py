"""The self-contained prefix's commands: the trampoline and ``nvshim`` exec the prefix's own
loader and interpreter, name only paths under the prefix, and survive a move of the prefix;
the hook command a bundled interpreter writes names the prefix's launcher."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import nvshim
from nvshim.errors import HostError
from nvshim.node.doctor.config import check_trampoline
from nvshim.node.install.prefix import (
    installed_prefix,
    launch_argv,
    loader_name,
    render_cli,
    render_runtime,
)

PREFIX = "/opt/nvshim"
LOADER = f"{PREFIX}/lib/{loader_name('x86_64')}"

RECORDER = """#!/bin/sh
# a stand-in loader: records its argv (one per line) and the variables it got
out=$(dirname "$0")/../argv
: > "$out"
for a in "$@"; do printf '%s\\n' "$a" >> "$out"; done
env > "$(dirname "$0")/../env"
"""


def fake_prefix(root: Path) -> Path:
    """A prefix whose loader records how it was started; launcher and interpreter exist."""
    for rel, text in (
        (f"lib/{loader_name()}", RECORDER),
        ("bin/python3", "#!/bin/sh\n"),
        ("libexec/python3", ""),
    ):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    return root


def test_launch_words_are_the_loader_line() -> None:
    """The prefix's Python starts as loader --library-path lib --argv0 launcher interpreter."""
    assert launch_argv(PREFIX, "x86_64") == [
        LOADER,
        "--library-path",
        f"{PREFIX}/lib",
        "--argv0",
        f"{PREFIX}/bin/python3",
        f"{PREFIX}/libexec/python3",
    ]
    assert loader_name("aarch64") == "ld-linux-aarch64.so.1"
    with pytest.raises(HostError, match="no self-contained runtime for machine 'sparc'"):
        loader_name("sparc")


def test_runtime_trampoline_names_only_the_prefix() -> None:
    """Every interpreter path in the rendered trampoline is under the prefix, its python()
    execs the bundled loader directly, and no Python version appears (an upgrade of the
    bundled Python keeps it valid)."""
    text = render_runtime(PREFIX, "/etc/nvshim/config.yaml", "x86_64")
    assert f"py={PREFIX}/bin/python3\n" in text
    launch = " ".join(launch_argv(PREFIX, "x86_64"))
    assert text.count(f"exec {launch} -I -S -X ") == 2
    paths = set(re.findall(r"/[\w./-]*(?:python|site|preload)[\w./-]*", text))
    assert paths and all(p.startswith(f"{PREFIX}/") for p in paths), paths
    assert f'"{PREFIX}/site/nvshim-preload.bin"' in text and f'["{PREFIX}/site"]' in text
    assert not re.search(r"python3\.\d", text) and "venv" not in text


def test_runtime_trampoline_execs_the_loader_with_argv_and_env_untouched(tmp_path: Path) -> None:
    """For a GPU create the trampoline execs the prefix's loader with the launch words, -I -S,
    the boot code and runc's argv, and adds nothing to the environment (no LD_LIBRARY_PATH
    reaches Python, runc or the hooks)."""
    prefix = fake_prefix(tmp_path / "p")
    trampoline = tmp_path / "nvshim-runtime"
    trampoline.write_text(render_runtime(str(prefix), str(tmp_path / "missing.yaml")))
    trampoline.chmod(0o755)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text('{"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}}')
    env = {"PATH": "/usr/bin:/bin", "KEEP": "me"}
    res = subprocess.run(
        [str(trampoline), "create", "--bundle", str(bundle), "c1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    argv = (prefix / "argv").read_text().splitlines()
    assert argv[:5] == launch_argv(str(prefix))[1:]
    assert argv[5:10] == ["-I", "-S", "-X", "nvshim-lc-ctype-unset", "-c"]
    assert argv[11:] == ["create", "--bundle", str(bundle), "c1"]
    assert f'p.install("{prefix}/site/nvshim-preload.bin")' in argv[10]
    got = dict(
        line.split("=", 1) for line in (prefix / "env").read_text().splitlines() if "=" in line
    )
    assert not any(k.startswith("LD_") or k.startswith("PYTHON") for k in got), got
    assert got["KEEP"] == "me"


def test_cli_command_execs_the_loader_with_the_config_default(tmp_path: Path) -> None:
    """The nvshim command is sh that execs the prefix's loader (no launcher in between) with
    NVSHIM_CONFIG defaulting to the install's config and the user's arguments last."""
    prefix = fake_prefix(tmp_path / "p")
    cli = tmp_path / "nvshim"
    cli.write_text(render_cli(str(prefix), "/etc/x/config.yaml"))
    cli.chmod(0o755)
    res = subprocess.run(
        [str(cli), "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr
    argv = (prefix / "argv").read_text().splitlines()
    assert argv[:5] == launch_argv(str(prefix))[1:]
    assert argv[5:8] == ["-I", "-S", "-c"] and argv[-2:] == ["doctor", "--json"]
    assert 'os.environ.setdefault("NVSHIM_CONFIG", "/etc/x/config.yaml")' in argv[8]
    assert f'sys.path[0:0] = ["{prefix}/site"]' in argv[8]
    with pytest.raises(ValueError):
        render_cli("/opt/a b", "/etc/x/config.yaml")


def test_installed_prefix_needs_the_loader_and_the_interpreter(tmp_path: Path) -> None:
    """A launcher path is a prefix's only when that prefix has its loader and interpreter."""
    prefix = fake_prefix(tmp_path / "p")
    assert installed_prefix(f"{prefix}/bin/python3") == str(prefix)
    assert installed_prefix("/opt/nvshim/venv/bin/python3") is None
    (prefix / "libexec" / "python3").unlink()
    assert installed_prefix(f"{prefix}/bin/python3") is None


def test_doctor_accepts_the_self_contained_trampoline(tmp_path: Path) -> None:
    """nvshim doctor's trampoline check recognises a prefix's trampoline as current, also
    for an install whose config is not /etc/nvshim's (NVSHIM_ETCDIR), and still flags an
    edited one."""
    prefix = fake_prefix(tmp_path / "p")
    trampoline = tmp_path / "nvshim-runtime"
    for config in (None, f"{tmp_path}/etc/nvshim/config.yaml"):
        trampoline.write_text(render_runtime(str(prefix), config))
        trampoline.chmod(0o755)
        finding = check_trampoline(str(trampoline))
        assert finding.status == "ok", finding
    trampoline.write_text(trampoline.read_text() + "# edited\n")
    assert check_trampoline(str(trampoline)).status == "warn"


def test_hook_command_names_the_prefix_launcher_and_site(tmp_path: Path) -> None:
    """Run from a prefix (launcher bin/python3, nvshim in site/), the hook command is that
    launcher with the site folder on sys.path, and it starts the hook."""
    prefix = tmp_path / "p"
    (prefix / "bin").mkdir(parents=True)
    os.symlink(os.path.realpath(sys.executable), prefix / "bin" / "python3")
    shutil.copytree(
        Path(nvshim.__file__).parent,
        prefix / "site" / "nvshim",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    code = (
        "import json, sys; sys.path[0:0] = [sys.argv[1]]; "
        "from nvshim.runtime.hookargs import hook_command; print(json.dumps(hook_command()))"
    )
    res = subprocess.run(
        [str(prefix / "bin" / "python3"), "-I", "-S", "-c", code, str(prefix / "site")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    command = json.loads(res.stdout)
    assert command[:4] == [str(prefix / "bin" / "python3"), "-I", "-S", "-c"]
    assert f'sys.path[0:0] = ["{prefix}/site"]' in command[4]
    started = subprocess.run(command + ["--help"], capture_output=True, text=True, timeout=60)
    assert started.returncode == 0 and "--link" in started.stdout, started.stderr
