"""nvshim's two commands run as separate processes, as a user and as an engine run them.

* :func:`nvshim_cli` runs ``nvshim ARGS`` from this checkout in a fresh ``python -I`` (exit
  code, stdout and stderr as the user sees them, nothing shared with the test's process).
* :func:`fake_runtime` writes an executable stand-in for nvshim-runtime (for configs that
  must name one that can be run).
* :func:`run_cli` runs ``nvshim ARGS`` in this process through the console entry point, for
  tests that read its output with pytest's ``capsys``.
* :func:`make_trampoline_world` renders the ``nvshim-runtime`` sh trampoline for this
  interpreter beside a compiled config whose only runtime is a recorder, for tests that
  start the runtime the way containerd does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

__all__ = ["fake_runtime", "make_trampoline_world", "nvshim_cli", "run_cli"]

REPO = Path(__file__).resolve().parents[2]


def nvshim_cli(
    *args: str, env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None
) -> subprocess.CompletedProcess:
    """``nvshim ARGS`` from this checkout, as a user runs it."""
    return subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            "import sys; sys.path.insert(0, sys.argv.pop(1)); "
            "from nvshim.cli.main import main; main()",
            str(REPO),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


def make_trampoline_world(
    tmp_path: Path, record: Optional[str] = None, config_extra: str = ""
) -> Dict[str, Any]:
    """The trampoline rendered for this interpreter, a compiled config and a recorder runtime.

    Keys: ``tramp`` (the script), ``config`` (``etc/config.yaml``, compiled, with
    ``config_extra`` lines), ``runtime`` (the recorder: it writes its argv to ``<tmp>/rec``,
    or runs the sh line ``record``), ``tmp`` and ``env`` (PATH and NVSHIM_CONFIG to run the
    trampoline with)."""
    from nvshim.node.compile import compile_node
    from nvshim.node.install.trampoline import render

    runtime = tmp_path / "fake-runc"
    body = record if record is not None else f"printf '%s\\n' \"$@\" > {tmp_path / 'rec'}"
    runtime.write_text(f"#!/bin/sh\n{body}\n")
    runtime.chmod(0o755)
    config = tmp_path / "etc" / "config.yaml"
    config.parent.mkdir()
    config.write_text(f"runtimes: [{runtime}]\n{config_extra}")
    compile_node(str(config))
    tramp = tmp_path / "nvshim-runtime"
    tramp.write_text(render(sys.executable))
    tramp.chmod(0o755)
    return {
        "tramp": tramp,
        "config": config,
        "runtime": runtime,
        "tmp": tmp_path,
        "env": {"PATH": "/usr/bin:/bin", "NVSHIM_CONFIG": str(config)},
    }


def run_cli(args: List[str], capsys: pytest.CaptureFixture[str]) -> Tuple[int, str, str]:
    """``nvshim ARGS`` in-process through the console entry point: (exit code, out, err)."""
    from nvshim.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    code = exc.value.code
    return (code if isinstance(code, int) else 1), out, err


def fake_runtime(directory: Path) -> Path:
    """An executable stand-in for nvshim-runtime (doctor only checks that it can be run)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "nvshim-runtime"
    path.write_text('#!/bin/sh\nexec runc "$@"\n')
    path.chmod(0o755)
    return path
