"""Programs nvshim runs as root, or puts into config.json for runc to run as root, are held to
the config files' trust rule (:func:`nvshim.files.executable_problem`): owned by root, writable
by root only, reached through directories only root can change. The low-level runtime of
``runtimes:`` (every command, through Python and through the sh trampoline) and every hook a
create adds (a CDI spec's, nvshim's own, the params hook) are refused in one line naming the
file, with config.json left byte-identical; ``nvshim doctor`` names each one with its fix.

Root only: the files are chown'ed to another user (the rule protects root).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from nvshim.files import executable_problem
from tests.helpers.commands import make_trampoline_world

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the trust rule protects root only")

NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]


def program(directory: Path, name: str = "prog") -> Path:
    """A root-owned 0755 script that leaves ``<directory>/ran`` when it runs."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    path = directory / name
    path.write_text(f"#!/bin/sh\ntouch {directory}/ran\n")
    path.chmod(0o755)
    return path


def untrust(path: Path, how: str) -> str:
    """Make ``path`` fail the rule one way; the words the refusal holds."""
    if how == "owner":
        os.chown(path, NOBODY, NOBODY)
        return f"{path} is owned by uid {NOBODY}, not root"
    if how == "mode":
        path.chmod(0o777)
        return f"{path} is writable by group or others (mode 0777)"
    if how == "dir":
        path.parent.chmod(0o777)
        return f"directory {path.parent} can be written by others"
    if how == "dir-owner":
        os.chown(path.parent, NOBODY, NOBODY)
        return f"directory {path.parent} can be written by others (uid {NOBODY}"
    # a root-owned symlink in a root-only directory, to a program in a directory others own
    real = program(path.parent.parent / "users", "real")
    os.chown(real.parent, NOBODY, NOBODY)
    path.unlink()
    path.symlink_to(real)
    return f"directory {real.parent} (on the way to {path}) can be written by others"


HOWS = ["owner", "mode", "dir", "dir-owner", "symlink"]


@pytest.mark.parametrize("how", HOWS)
def test_an_executable_others_could_write_is_named_with_its_fix(tmp_path: Path, how: str) -> None:
    """A program owned by another uid, mode 0777, in a 0777 or another user's directory, or reached through a symlink into one, is refused in one line naming it and the fix; a root-only one is not."""
    prog = program(tmp_path / "bin")
    assert executable_problem(str(prog), "runtime") == ""
    words = untrust(prog, how)
    problem = executable_problem(str(prog), "runtime")
    assert words in problem and "\n" not in problem and "run ch" in problem, problem
    assert problem.startswith(f"runtime {prog} "), problem


def nvshim_runtime(args: List[str], config: Path, cwd: Path) -> subprocess.CompletedProcess:
    """nvshim-runtime in Python, as the trampoline starts it."""
    return subprocess.run(
        [sys.executable, "-I", "-m", "nvshim.runtime.main", *args],
        env={"PATH": "/usr/bin:/bin", "NVSHIM_CONFIG": str(config)},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(REPO),
    )


def bundle(tmp_path: Path, spec: Dict[str, Any]) -> Path:
    b = tmp_path / "bundle"
    b.mkdir()
    (b / "config.json").write_text(json.dumps(spec, indent=1))
    return b


@pytest.mark.parametrize("how", HOWS)
def test_an_untrusted_runtime_is_never_executed(tmp_path: Path, how: str) -> None:
    """A runtimes: entry others could write fails every command (state, create) in one line naming it, before it runs; config.json stays byte-identical."""
    runtime = program(tmp_path / "bin", "runc")
    words = untrust(runtime, how)
    config = tmp_path / "etc" / "config.yaml"
    config.parent.mkdir()
    config.write_text(f"runtimes: [{runtime}]\n")
    b = bundle(
        tmp_path, {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}, "root": {"path": "rootfs"}}
    )
    before = (b / "config.json").read_bytes()
    for args in (["state", "x"], ["create", "--bundle", str(b), "x"]):
        res = nvshim_runtime(args, config, tmp_path)
        assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
        assert words in res.stderr and "runtimes: in" in res.stderr, res.stderr
    assert not (runtime.parent / "ran").exists() and not (tmp_path / "users" / "ran").exists()
    assert (b / "config.json").read_bytes() == before


@pytest.mark.parametrize("how", ["owner", "dir-owner"])
def test_the_trampoline_hands_a_runtime_others_own_to_python(tmp_path: Path, how: str) -> None:
    """The sh trampoline never execs a listed runtime (or one in a directory) another uid owns: the passthrough goes to Python, which refuses it in one line."""
    from nvshim.node.compile import compile_node

    (tmp_path / "w").mkdir()
    world = make_trampoline_world(tmp_path / "w")
    runtime = program(tmp_path / "bin", "runc")
    Path(world["config"]).write_text(f"runtimes: [{runtime}]\n")
    compile_node(str(world["config"]))
    res = subprocess.run(
        [str(world["tramp"]), "state", "x"],
        env=world["env"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0 and (runtime.parent / "ran").exists(), res.stderr
    (runtime.parent / "ran").unlink()
    words = untrust(runtime, how)
    res = subprocess.run(
        [str(world["tramp"]), "state", "x"],
        env=world["env"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
    assert words in res.stderr, res.stderr
    assert not (runtime.parent / "ran").exists()


@pytest.mark.parametrize("how", HOWS)
def test_a_cdi_hook_others_could_write_fails_the_create(tmp_path: Path, how: str) -> None:
    """A create injecting a CDI device whose spec (trusted itself) names a hook others could write fails in one line naming the hook; config.json stays byte-identical and nothing runs."""
    hook = program(tmp_path / "hooks", "hook")
    words = untrust(hook, how)
    runtime = program(tmp_path / "bin", "runc")
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "acme.json").write_text(
        json.dumps(
            {
                "cdiVersion": "0.5.0",
                "kind": "acme.com/dev",
                "devices": [{"name": "x", "containerEdits": {"env": ["ACME=1"]}}],
                "containerEdits": {"hooks": [{"hookName": "createContainer", "path": str(hook)}]},
            }
        )
    )
    config = tmp_path / "etc" / "config.yaml"
    config.parent.mkdir()
    config.write_text(
        f"runtimes: [{runtime}]\ncdi-spec-dirs: [{cdi}]\n"
        f"driver-root: {tmp_path / 'noroot'}\ngrants-journal: null\n"
    )
    b = bundle(
        tmp_path,
        {
            "process": {"env": ["PATH=/bin"]},
            "root": {"path": "rootfs"},
            "annotations": {"cdi.k8s.io/x": "acme.com/dev=x"},
        },
    )
    before = (b / "config.json").read_bytes()
    res = nvshim_runtime(["create", "--bundle", str(b), "x"], config, tmp_path)
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
    assert res.stderr.startswith(f"nvshim: hook {hook} "), res.stderr
    assert words in res.stderr, res.stderr
    assert (b / "config.json").read_bytes() == before
    assert not (runtime.parent / "ran").exists()


def test_doctor_names_each_untrusted_program_and_its_fix(tmp_path: Path) -> None:
    """doctor's executable-trust check fails once per untrusted runtime and CDI spec hook, in one line naming the file, what names it and the fix; root-only ones are ok."""
    from nvshim.config import Config
    from nvshim.node.doctor.checks import render_text
    from nvshim.node.doctor.exec import check_executables

    runtime = program(tmp_path / "bin", "runc")
    hook = program(tmp_path / "hooks", "hook")
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    spec = cdi / "acme.json"
    spec.write_text(
        json.dumps(
            {
                "cdiVersion": "0.5.0",
                "kind": "acme.com/dev",
                "devices": [
                    {
                        "name": "x",
                        "containerEdits": {
                            "hooks": [{"hookName": "createContainer", "path": str(hook)}]
                        },
                    }
                ],
            }
        )
    )
    config = Config(
        runtimes=(str(runtime),), cdi_spec_dirs=(str(cdi),), source=str(tmp_path / "config.yaml")
    )
    assert [f.status for f in check_executables(config)] == ["ok"]
    untrust(runtime, "owner")
    untrust(hook, "dir")
    findings = check_executables(config)
    assert [(f.check, f.status) for f in findings] == [("executable-trust", "fail")] * 2
    first, second = findings
    assert first.message.startswith(f"program {runtime} is owned by uid {NOBODY}, not root")
    assert f"(runtimes: in {config.source})" in first.message
    assert first.fix.startswith(f"chown root {runtime}")
    assert second.message.startswith(f"program {hook} would run as root, but ")
    assert f"(a hook of CDI spec {spec})" in second.message
    assert second.fix.startswith(f"chmod go-w {hook.parent}")
    lines = render_text(findings).splitlines()
    assert len(lines) == 2 and all(line.startswith("FAIL  executable-trust: ") for line in lines)


@pytest.mark.parametrize("how", ["mode", "dir"])
def test_compile_refuses_a_runtime_others_could_write_so_the_trampoline_never_execs_it(
    tmp_path: Path, how: str
) -> None:
    """nvshim config compile refuses a runtimes: entry others could write (a root-owned 0777 one, or one in a 0777 directory: modes the sh trampoline cannot see) in one line and writes no list, so the trampoline hands even a passthrough to Python, which refuses it."""
    from nvshim.config import runtimes_path
    from nvshim.errors import ConfigError
    from nvshim.node.compile import compile_node

    (tmp_path / "w").mkdir()
    world = make_trampoline_world(tmp_path / "w")
    runtime = program(tmp_path / "bin", "runc")
    words = untrust(runtime, how)
    Path(runtimes_path(str(world["config"]))).unlink()
    Path(world["config"]).write_text(f"runtimes: [{runtime}]\n")
    with pytest.raises(ConfigError) as info:
        compile_node(str(world["config"]))
    assert words in str(info.value) and "\n" not in str(info.value)
    assert not Path(runtimes_path(str(world["config"]))).exists()
    res = subprocess.run(
        [str(world["tramp"]), "state", "x"],
        env=world["env"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 1 and words in res.stderr, res.stderr
    assert not (runtime.parent / "ran").exists()


def test_nvshims_own_hook_from_an_interpreter_others_could_replace_fails_the_create(
    tmp_path: Path,
) -> None:
    """A GPU create whose own hook would run an interpreter reached through a directory others can write (a 0777 dir holding the python link) fails in one line naming it; config.json stays byte-identical."""
    import sysconfig

    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=1)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    python = open_dir / "python3"
    python.symlink_to(os.path.realpath(sys.executable))
    open_dir.chmod(0o777)
    runtime = program(tmp_path / "bin", "runc")
    config = tmp_path / "etc" / "config.yaml"
    config.parent.mkdir()
    config.write_text(f"runtimes: [{runtime}]\ndriver-root: {node.root}\ngrants-journal: null\n")
    (tmp_path / "bundle" / "rootfs").mkdir(parents=True)
    b = tmp_path / "bundle"
    (b / "config.json").write_text(
        json.dumps(
            {
                "process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"]},
                "root": {"path": "rootfs", "readonly": True},
            },
            indent=1,
        )
    )
    before = (b / "config.json").read_bytes()
    paths = [str(REPO), sysconfig.get_paths()["purelib"]]
    boot = f"import sys; sys.path[0:0] = {paths!r}; from nvshim.runtime.main import main; main()"
    res = subprocess.run(
        [str(python), "-I", "-S", "-c", boot, "create", "--bundle", str(b), "x"],
        env={"PATH": "/usr/bin:/bin", "NVSHIM_CONFIG": str(config)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
    assert res.stderr.startswith(f"nvshim: hook {python} would run as root"), res.stderr
    assert (b / "config.json").read_bytes() == before
    assert not (runtime.parent / "ran").exists()
