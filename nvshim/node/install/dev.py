"""The ``nvshim`` command ``install.sh --dev`` writes: a Python script its venv's interpreter
runs (the venv has the checkout editable), ``NVSHIM_CONFIG`` defaulting to the installed
config. The self-contained prefix's command is :func:`nvshim.node.install.prefix.render_cli`.
"""

from __future__ import annotations

import json

from nvshim.node.install.trampoline import UnsafeValue

__all__ = ["render_dev_cli"]


def render_dev_cli(python: str, config: str) -> str:
    """The script: ``#!python -I`` (containerd's PATH and environment are not ours), then
    the config as a Python string literal and nvshim's CLI."""
    if not python.startswith("/") or any(c.isspace() for c in python):
        # the kernel ends a #! line's interpreter at the first blank
        raise UnsafeValue(f"venv interpreter must be absolute, without blanks: {python!r}")
    return (
        f"#!{python} -I\n"
        "import os\n"
        f'os.environ.setdefault("NVSHIM_CONFIG", {json.dumps(config)})\n'
        "from nvshim.cli.main import main\n"
        "main()\n"
    )
