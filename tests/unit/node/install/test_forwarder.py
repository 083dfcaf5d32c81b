"""The forwarder install.sh --uninstall leaves while containers still run through
nvshim-runtime (``nvshim.node.install.forwarder``): the runtime it picks, the script it
writes and runs, what it refuses to write, and install.sh reading the same marks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from nvshim.node.install.forwarder import MARK, STATE, pick_target, render_forwarder

REPO = Path(__file__).resolve().parents[4]


def tool(folder: Path, name: str, body: str = 'echo "$0 $*"') -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_pick_takes_the_first_runtime_that_resolves(tmp_path: Path) -> None:
    """Absolute paths as they are (if executable), names on PATH, in config.runtimes'
    order; a relative path with a slash never resolves."""
    crun = tool(tmp_path / "bin", "crun")
    runc = tool(tmp_path / "bin", "runc")
    path_env = str(tmp_path / "bin")
    assert pick_target(["/nowhere/runc", "crun", "runc"], path_env) == str(crun)
    assert pick_target(["./runc", str(runc)], path_env) == str(runc)


def test_pick_falls_back_to_runc_on_path_then_the_word(tmp_path: Path) -> None:
    """Nothing of the list resolves: runc on PATH, else the bare word (the shell's lookup
    at exec time is all that is left)."""
    runc = tool(tmp_path / "bin", "runc")
    assert pick_target(["gone"], str(tmp_path / "bin")) == str(runc)
    assert pick_target([], str(tmp_path / "empty")) == "runc"


def test_pick_skips_a_runtime_with_a_control_character(tmp_path: Path) -> None:
    """A listed path with a line break is never the target, even if it exists."""
    odd = tool(tmp_path / "a\nb", "runc")
    runc = tool(tmp_path / "bin", "runc")
    assert pick_target([str(odd)], str(tmp_path / "bin")) == str(runc)


def test_the_script_is_marked_names_its_states_and_execs_the_target(tmp_path: Path) -> None:
    """Line 2 is the mark install.sh reads; each state folder once, sorted; the target is
    run with the arguments as given, a quote in its path included."""
    target = tool(tmp_path / "it's", "runc")
    text = render_forwarder(str(target), 3, ["/run/b", "/run/a", "/run/b", ""], "WHEN")
    lines = text.splitlines()
    assert lines[:2] == ["#!/bin/sh", MARK]
    assert "(WHEN): 3 container(s)" in lines[2]
    assert [line for line in lines if line.startswith(STATE)] == [
        f"{STATE}/run/a",
        f"{STATE}/run/b",
    ]
    script = tmp_path / "fwd"
    script.write_text(text)
    script.chmod(0o755)
    ran = subprocess.run([str(script), "kill", "a b", "--"], capture_output=True, text=True)
    assert ran.stdout == f"{target} kill a b --\n"


def test_no_state_line_can_break_out_of_its_comment() -> None:
    """A state folder with a line break is left out rather than written."""
    text = render_forwarder("/usr/bin/runc", 1, ["/run/x\nexec /bin/evil"], "WHEN")
    assert "evil" not in text
    assert text.count("exec ") == 1


def run_main(tmp_path: Path, states: str, runtimes: str) -> subprocess.CompletedProcess[str]:
    """install.sh's call (nvshim_module), with the state folders on stdin."""
    (tmp_path / "config.runtimes").write_text(runtimes)
    return subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            "import sys, importlib; sys.path[0:0] = [sys.argv.pop(1)]; "
            "importlib.import_module(sys.argv.pop(1)).main(sys.argv[1:])",
            str(REPO),
            "nvshim.node.install.forwarder",
            "--path",
            str(tmp_path / "bin" / "nvshim-runtime"),
            "--runtimes",
            str(tmp_path / "config.runtimes"),
            "--users",
            "2",
        ],
        input=states,
        capture_output=True,
        text=True,
        env={"PATH": str(tmp_path / "path")},
        timeout=60,
    )


def test_main_replaces_the_runtime_and_says_so(tmp_path: Path) -> None:
    """The installed nvshim-runtime becomes the forwarder (mode 0755, nothing on stdout)
    and one line on stderr names the target and how many containers keep it."""
    tool(tmp_path / "bin", "nvshim-runtime", "exit 9")
    crun = tool(tmp_path / "path", "crun")
    done = run_main(tmp_path, "/run/containerd\n", "crun\nrunc\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith(
        f"install.sh: left {tmp_path}/bin/nvshim-runtime as a forwarder to {crun}: 2 container(s)"
    )
    forwarder = tmp_path / "bin" / "nvshim-runtime"
    assert os.stat(forwarder).st_mode & 0o7777 == 0o755
    assert forwarder.read_text().splitlines()[1] == MARK
    assert f"{STATE}/run/containerd" in forwarder.read_text()


def test_main_that_cannot_write_fails_in_one_line(tmp_path: Path) -> None:
    """A folder that is not there: exit 1, one line naming the file, nothing written."""
    done = run_main(tmp_path, "", "runc\n")
    assert done.returncode == 1
    assert done.stderr.startswith(f"install.sh: cannot write the forwarder {tmp_path}/bin/")
    assert len(done.stderr.splitlines()) == 1
    assert not (tmp_path / "bin").exists()


def test_install_sh_reads_the_marks_the_module_writes() -> None:
    """install.sh's is_forwarder and containerd_states read the forwarder's own mark and
    state lines (one spelling each, the module's)."""
    script = (REPO / "install.sh").read_text()
    assert re.search(rf'^FORWARDER_MARK="{re.escape(MARK)}"$', script, re.M)
    assert f"s/^{STATE}//p" in script
