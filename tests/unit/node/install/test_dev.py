"""The ``nvshim`` command install.sh --dev writes (``nvshim.node.install.dev``): the text it
wrote before it moved here, a config path of any spelling carried exactly, an interpreter
a #! line cannot name refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvshim.node.install.dev import render_dev_cli
from nvshim.node.install.trampoline import UnsafeValue


def test_renders_what_install_sh_wrote() -> None:
    """/opt/nvshim/venv and /etc/nvshim give the bytes install.sh's inline print() gave."""
    assert render_dev_cli("/opt/nvshim/venv/bin/python3", "/etc/nvshim/config.yaml") == (
        "#!/opt/nvshim/venv/bin/python3 -I\n"
        "import os\n"
        'os.environ.setdefault("NVSHIM_CONFIG", "/etc/nvshim/config.yaml")\n'
        "from nvshim.cli.main import main\n"
        "main()\n"
    )


@pytest.mark.parametrize(
    "config", ['/etc/my "nv"shim/config.yaml', "/e\\tc/é/$x'.yaml", "/a\nb/config.yaml"]
)
def test_config_path_reaches_the_cli_exactly(tmp_path: Path, config: str) -> None:
    """The script, run, sets NVSHIM_CONFIG to the path byte for byte, quotes, backslashes,
    line breaks and non-ASCII letters included (main() stubbed to print it)."""
    script = render_dev_cli(sys.executable, config)
    stub = tmp_path / "nvshim" / "cli"
    stub.mkdir(parents=True)
    (tmp_path / "nvshim" / "__init__.py").write_text("")
    (stub / "__init__.py").write_text("")
    (stub / "main.py").write_text(
        "import os\ndef main():\n    print(repr(os.environ['NVSHIM_CONFIG']))\n"
    )
    path = tmp_path / "nvshim-cmd"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if k != "NVSHIM_CONFIG"}
    # the script's own -I drops every path but the interpreter's: run its text with the
    # stub package's folder first on sys.path
    res = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            f"import sys; sys.path.insert(0, {str(tmp_path)!r}); exec(open({str(path)!r}).read())",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == repr(config) + "\n"


@pytest.mark.parametrize(
    "python", ["venv/bin/python3", "/opt/my venv/bin/python3", "/opt/venv\n/python3"]
)
def test_interpreter_a_shebang_cannot_name_is_refused(python: str) -> None:
    """A relative interpreter, or one with a blank (where the kernel ends the #! line's
    interpreter), is refused naming it."""
    with pytest.raises(UnsafeValue, match="venv interpreter must be absolute") as caught:
        render_dev_cli(python, "/etc/nvshim/config.yaml")
    assert repr(python) in str(caught.value)
