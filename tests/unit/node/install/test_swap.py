"""The prefix exchange install.sh --from makes (``nvshim.node.install.swap``): both names
swapped in one step, a failure that leaves both as they were, the command line install.sh
runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nvshim.errors import HostError
from nvshim.node.install.swap import exchange

REPO = Path(__file__).resolve().parents[4]


def tree(root: Path, marker: str) -> Path:
    root.mkdir()
    (root / "bin").mkdir()
    (root / "bin" / "python3").write_text(marker)
    return root


def run_main(*args: str) -> subprocess.CompletedProcess[str]:
    """install.sh's call, through the prefix's form: the sources' folder first."""
    return subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            "-B",
            "-c",
            "import sys; sys.path[0:0] = [sys.argv.pop(1)]; "
            "from nvshim.node.install.swap import main; main(sys.argv[1:])",
            str(REPO),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_exchange_swaps_two_folders(tmp_path: Path) -> None:
    """Each name holds the other's tree afterwards (the old prefix at the new one's name,
    for install.sh to remove)."""
    new, prefix = tree(tmp_path / "opt.new", "new"), tree(tmp_path / "opt", "old")
    exchange(str(new), str(prefix))
    assert (prefix / "bin" / "python3").read_text() == "new"
    assert (new / "bin" / "python3").read_text() == "old"


def test_exchange_with_a_missing_name_changes_nothing(tmp_path: Path) -> None:
    """An exchange with a name that does not exist raises HostError naming both and the
    reason, and moves nothing (install.sh then falls back to two renames)."""
    new = tree(tmp_path / "opt.new", "new")
    with pytest.raises(HostError) as caught:
        exchange(str(new), str(tmp_path / "opt"))
    assert str(caught.value) == (
        f"cannot exchange {new} and {tmp_path / 'opt'}: no such file or directory"
    )
    assert (new / "bin" / "python3").read_text() == "new"
    assert not (tmp_path / "opt").exists()


def test_main_exits_0_when_exchanged_and_1_with_one_line_when_not(tmp_path: Path) -> None:
    """install.sh's command line: exit 0 and nothing said on an exchange; exit 1 and one
    lower-case line naming both paths when it cannot be done."""
    new, prefix = tree(tmp_path / "opt.new", "new"), tree(tmp_path / "opt", "old")
    done = run_main(str(new), str(prefix))
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert (prefix / "bin" / "python3").read_text() == "new"
    failed = run_main(str(new), str(tmp_path / "gone"))
    assert failed.returncode == 1
    assert failed.stderr == (
        f"install.sh: cannot exchange {new} and {tmp_path}/gone: no such file or directory\n"
    )
