"""Every shell file nvshim ships or runs passes shellcheck, generated ones included.

The files in the checkout are found by their ``#!`` line (sh or bash), so a new script is
checked without being listed here; the sh nvshim writes at install or create time (the
``nvshim-runtime`` trampoline, the ``nvshim`` command, the params hook's script, the docker
hook stand-in) is rendered and checked as text. The exclusions are ``.shellcheckrc``'s, each
justified there; others are ``# shellcheck disable=`` lines next to what they excuse.
shellcheck is a Debian package that ``install.sh --dev`` installs; where it is missing the
test skips, and with ``CI`` set it fails instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest

REPO = Path(__file__).resolve().parents[2]
SKIP_DIRS = {
    ".git",
    ".venv",
    "venv",
    "build",
    "dist",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    "node_modules",
}
SHEBANG = re.compile(rb"^#!\s*(/bin/sh|/bin/bash|/usr/bin/env (ba)?sh)\b")


def shell_files() -> List[Path]:
    """The checkout's files whose first line starts sh or bash."""
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(files):
            path = Path(root) / name
            try:
                with open(path, "rb") as f:
                    head = f.read(64)
            except OSError:
                continue
            if SHEBANG.match(head):
                found.append(path)
    return found


def rendered_scripts() -> Dict[str, str]:
    """The sh nvshim writes onto a node or into a spec, as text."""
    from nvshim.node.engines.docker import gpus_hook_script
    from nvshim.node.install.prefix import render_cli, render_runtime
    from nvshim.node.install.trampoline import render
    from nvshim.runtime.devparams import params_hook

    hook = params_hook("/run/bundle/rootfs", "/run/bundle/.nvshim-nvidia-params")
    scripts = {
        "trampoline (venv)": render("/opt/nvshim/venv/bin/python"),
        "trampoline (self-contained)": render_runtime("/opt/nvshim", "/etc/nvshim/config.yaml"),
        "nvshim command": render_cli("/opt/nvshim", "/etc/nvshim/config.yaml"),
        # the createContainer hook is `/bin/sh -c SCRIPT sh ARGS…`
        "params hook": "#!/bin/sh\n" + hook.args[2] + "\n",
        "docker --gpus hook stand-in": gpus_hook_script("it's-nvshim"),
    }
    return scripts


def excluded() -> List[str]:
    """The codes .shellcheckrc disables, for text that lives in no folder of the checkout."""
    codes = []
    for line in (REPO / ".shellcheckrc").read_text().splitlines():
        if line.startswith("disable="):
            codes += line.split("=", 1)[1].split(",")
    return codes


def shellcheck() -> str:
    found = shutil.which("shellcheck")
    if found:
        return found
    if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
        pytest.fail("shellcheck is not installed (install.sh --dev installs it)")
    pytest.skip("shellcheck is not installed (apt-get install shellcheck)")


def test_the_checkout_has_the_shell_files_we_ship() -> None:
    """The shebang scan finds the installer, the DaemonSet's entry and the GPU test script
    (a scan that finds nothing would pass vacuously)."""
    names = {str(p.relative_to(REPO)) for p in shell_files()}
    assert {"install.sh", "deploy/installer.sh", "tests/gpu/run.sh", ".ci/run"} <= names


def test_shell_files_pass_shellcheck() -> None:
    """shellcheck finds nothing in any shell file of the checkout."""
    binary = shellcheck()
    files = [str(p.relative_to(REPO)) for p in shell_files()]
    res = subprocess.run(
        [binary, "-f", "gcc", *files], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert res.stdout == "" and res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("name", sorted(rendered_scripts()))
def test_rendered_sh_passes_shellcheck(name: str, tmp_path: Path) -> None:
    """The sh nvshim generates (trampolines, the nvshim command, the params hook) passes
    shellcheck as POSIX sh, with .shellcheckrc's exclusions only."""
    binary = shellcheck()
    script = tmp_path / "script.sh"
    script.write_text(rendered_scripts()[name])
    res = subprocess.run(
        [binary, "--norc", "-s", "sh", "-f", "gcc", "-e", ",".join(excluded()), str(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.stdout == "" and res.returncode == 0, res.stdout + res.stderr
