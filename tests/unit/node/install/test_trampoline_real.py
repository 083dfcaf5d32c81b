"""The rendered trampoline with the real interpreter: the boot code runs nvshim, and the
no-marker shortcut leaves config.json alone without starting Python."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nvshim.node.compile import compile_node
from nvshim.node.install.trampoline import render


def setup(tmp_path: Path, env_list):
    rec = tmp_path / "rec"
    runtime = tmp_path / "fake-runc"
    runtime.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {rec}\n")
    runtime.chmod(0o755)
    config = tmp_path / "config.yaml"
    config.write_text(f"runtimes: [{runtime}]\ndebug-log: {tmp_path / 'debug.log'}\n")
    compile_node(str(config))
    tramp = tmp_path / "nvshim-runtime"
    tramp.write_text(render(sys.executable))
    tramp.chmod(0o755)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"process": {"env": env_list}}, indent="\t"))
    env = {"PATH": "/usr/bin:/bin", "NVSHIM_CONFIG": str(config)}
    return tramp, bundle, env, rec, tmp_path / "debug.log"


def test_create_with_marker_runs_real_python(tmp_path):
    """A create whose spec names NVIDIA_ reaches nvshim's Python runtime, which then execs the runtime."""
    tramp, bundle, env, rec, debug = setup(tmp_path, ["NVIDIA_VISIBLE_DEVICES=void"])
    res = subprocess.run(
        [str(tramp), "create", "--bundle", str(bundle), "id"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    assert rec.read_text().split() == ["create", "--bundle", str(bundle), "id"]
    assert '"event": "create"' in debug.read_text()  # Python ran and logged the create


def test_create_without_marker_skips_python(tmp_path):
    """A spec that cannot ask for a GPU goes straight to the runtime: no Python, file untouched."""
    tramp, bundle, env, rec, debug = setup(tmp_path, ["PATH=/bin", "FOO=bar"])
    before = (bundle / "config.json").read_bytes()
    res = subprocess.run(
        [str(tramp), "create", "--bundle", str(bundle), "id"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    assert rec.read_text().split() == ["create", "--bundle", str(bundle), "id"]
    assert not os.path.exists(debug)
    assert (bundle / "config.json").read_bytes() == before


def test_escaped_marker_still_reaches_python(tmp_path):
    """A JSON escape that could hide NVIDIA_ sends the create to Python, which injects or refuses."""
    tramp, bundle, env, rec, debug = setup(tmp_path, [])
    (bundle / "config.json").write_text('{"process":{"env":["\\u004eVIDIA_VISIBLE_DEVICES=void"]}}')
    res = subprocess.run(
        [str(tramp), "create", "--bundle", str(bundle), "id"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    assert debug.exists()


@pytest.mark.parametrize(
    "caller_locale",
    [{}, {"LC_CTYPE": "C"}, {"LANG": "C"}, {"LC_CTYPE": "POSIX", "LANG": "C.UTF-8"}],
)
def test_create_through_python_hands_runc_the_callers_env(tmp_path, caller_locale):
    """A create that goes through Python execs the runtime with the caller's environment
    exactly: CPython's C-locale coercion (PEP 538) used to add LC_CTYPE=C.UTF-8 (or replace
    the caller's LC_CTYPE=C) on the way to runc."""
    tramp, bundle, env, rec, debug = setup(tmp_path, ["NVIDIA_VISIBLE_DEVICES=void"])
    envrec = tmp_path / "env.rec"
    runtime = tmp_path / "fake-runc"
    runtime.write_text(f"#!/bin/sh\n{shutil.which('env')} -0 > {envrec}\n")
    env = {**env, "ODD": "a b\nc", **caller_locale}
    res = subprocess.run(
        [str(tramp), "create", "--bundle", str(bundle), "id"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert debug.exists()  # Python ran
    got = dict(e.split("=", 1) for e in envrec.read_bytes().decode().split("\0") if e)
    got.pop("PWD", None)  # sh exports it for its children
    assert got == env


@pytest.mark.parametrize("caller_ignores", [(), ("SIGHUP",)])
def test_create_through_python_hands_runc_default_sigpipe(tmp_path, caller_ignores):
    """The runtime starts with SIGPIPE and SIGXFSZ at their default and other ignored
    signals as the caller had them: CPython ignores SIGPIPE and SIGXFSZ at start-up, exec
    keeps them ignored, and crun passed that on to the container's hooks."""
    import signal

    tramp, bundle, env, rec, debug = setup(tmp_path, ["NVIDIA_VISIBLE_DEVICES=void"])
    status = tmp_path / "status.rec"
    runtime = tmp_path / "fake-runc"
    runtime.write_text(f"#!/bin/sh\ncat /proc/$$/status > {status}\n")

    def ignore() -> None:
        # set SIGHUP both ways: under nohup the test runner itself ignores it, and the
        # child would inherit that
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        for name in caller_ignores:
            signal.signal(getattr(signal, name), signal.SIG_IGN)

    res = subprocess.run(
        [str(tramp), "create", "--bundle", str(bundle), "id"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        preexec_fn=ignore,
    )
    assert res.returncode == 0, res.stderr
    assert debug.exists()  # Python ran
    line = next(x for x in status.read_text().splitlines() if x.startswith("SigIgn:"))
    ignored = int(line.split()[1], 16)
    got = {
        s.name for s in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGHUP) if ignored & (1 << (s - 1))
    }
    assert got == set(caller_ignores)
