"""The guard on the config a default runtime reads (nvshim.node.configguard): compile,
--check, the mark, doctor's line, and the paths install.sh records."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvshim.config import compiled_path, default_mark_path
from nvshim.errors import ConfigError
from nvshim.node.compile import check_config, compile_config
from nvshim.node.configguard import is_blank
from nvshim.node.doctor.install import check_default_mark, default_trampoline
from nvshim.node.install.payload import first_error
from nvshim.node.install.prefix import render_cli
from nvshim.runtime.denials import denials_path
from tests.helpers.commands import run_cli

ON = "require-allocation: true\ndriver-root: /\n"


@pytest.mark.parametrize(
    "text, blank",
    [
        ("", True),
        ("\n\n", True),
        ("# only\n  # comments\n", True),
        ("---\n# c\n...\n", True),
        ("{}\n", False),
        ("require-allocation: false\n", False),
        ("[oops\n", False),
    ],
)
def test_is_blank(text: str, blank: bool) -> None:
    """A file YAML reads no document from (empty, comments, markers) is blank; {} is not."""
    assert is_blank(text.encode()) is blank


@pytest.mark.parametrize(
    "text, why",
    [
        ("require-allocation: false\n", "has require-allocation off"),
        ("# require-allocation: true\n", "holds no settings"),
        ("", "holds no settings"),
    ],
)
def test_default_runtime_refuses_and_writes_nothing(tmp_path: Path, text: str, why: str) -> None:
    """compile --default-runtime refuses require-allocation off and a comments-only or
    empty file alike, in one line naming the file, writing neither copy nor mark."""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        compile_config(str(path), default_runtime=True)
    assert why in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_the_mark_makes_every_later_compile_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After compile --default-runtime, a plain compile of an edit that turns
    require-allocation off is refused and the compiled copy stays byte for byte; --check
    writes nothing."""
    path = tmp_path / "config.yaml"
    path.write_text(ON)
    compile_config(str(path), default_runtime=True)
    assert Path(default_mark_path(str(path))).is_file()
    compiled = Path(compiled_path(str(path))).read_bytes()
    path.write_text("require-allocation: false\n")
    with pytest.raises(ConfigError, match="marked by .*config.default-runtime"):
        compile_config(str(path))
    assert Path(compiled_path(str(path))).read_bytes() == compiled
    code, _, err = run_cli(["config", "compile", "--check", "--config", str(path)], capsys)
    assert code == 1 and "require-allocation off" in err and err.count("\n") == 1
    path.write_text(ON + "runtimes: [runc]\n")
    check_config(str(path))  # fine again
    assert Path(compiled_path(str(path))).read_bytes() == compiled  # --check wrote nothing


def test_doctor_names_the_file_and_the_fix_in_one_line(tmp_path: Path) -> None:
    """doctor's default-runtime-config: skip without the mark; with it, fail in one line
    naming the config, the fix naming the file; the mark and the compile in its detail."""
    path = tmp_path / "config.yaml"
    path.write_text(ON)
    assert check_default_mark(str(path)).status == "skip"
    compile_config(str(path), default_runtime=True)
    assert check_default_mark(str(path)).status == "ok"
    path.write_text("# everything commented out\n")
    found = check_default_mark(str(path))
    assert found.status == "fail" and "\n" not in found.message
    assert str(path) in found.message and "config.default-runtime" in found.detail
    assert found.fix == f"require-allocation: true in {path}"
    assert found.detail.endswith(
        f"set require-allocation: true in {path}, then nvshim config compile --config {path}"
    )


def test_config_paths_names_the_denial_journal_as_the_runtime_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """nvshim config paths gives the denial journal from the same function the runtime
    uses, also where a folder name has a dot and the journal has no extension (a shell's
    ${journal%.*} would cut the folder's name)."""
    journal = tmp_path / "var.lib" / "grants"
    path = tmp_path / "config.yaml"
    path.write_text(f"grants-journal: {journal}\n")
    code, out, err = run_cli(["config", "paths", "--config", str(path)], capsys)
    assert code == 0, err
    lines = dict(line.split(" ", 1) for line in out.splitlines())
    assert lines["grants-journal"] == str(journal)
    assert lines["denied-journal"] == denials_path(str(journal)) == f"{journal}.denied.jsonl"
    assert lines["default-runtime-mark"] == default_mark_path(str(path))


def test_pip_failure_shows_its_first_real_error() -> None:
    """A failed pip shows the first ERROR line, not its closing "originates from a
    subprocess" note."""
    out = (
        "Collecting nvshim\n  Preparing metadata (pyproject.toml): started\n"
        "error: subprocess-exited-with-error\n  × Getting requirements to build wheel\n"
        "ERROR: Could not find a version that satisfies the requirement click>=8\n"
        "ERROR: No matching distribution found for click>=8\n"
        "note: This error originates from a subprocess, and is likely not a problem with pip.\n"
    )
    assert first_error(out, 1) == (
        "ERROR: Could not find a version that satisfies the requirement click>=8"
    )
    assert first_error("just one line\n", 1) == "just one line"
    assert first_error("", 2) == "exit status 2"


def test_the_installed_command_carries_its_bin_dir() -> None:
    """The nvshim command rendered for a bin dir other than /usr/local/bin sets
    NVSHIM_BINDIR, where doctor then looks for nvshim-runtime."""
    assert "NVSHIM_BINDIR" not in render_cli(
        "/opt/nvshim", "/etc/nvshim/config.yaml", bindir="/usr/local/bin"
    )
    text = render_cli("/opt/nvshim", "/etc/nvshim/config.yaml", bindir="/opt/bin")
    assert 'os.environ.setdefault("NVSHIM_BINDIR", "/opt/bin")' in text
    assert default_trampoline({"NVSHIM_BINDIR": "/opt/bin"}) == "/opt/bin/nvshim-runtime"
    assert default_trampoline({}) == "/usr/local/bin/nvshim-runtime"
