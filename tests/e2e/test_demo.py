"""e2e: ``nvshim demo`` — the README's first command — runs real containers and says so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Optional, Tuple

import pytest

pytestmark = pytest.mark.e2e

JOURNAL = "/var/lib/nvshim/grants.jsonl"


def _journal_state() -> Optional[Tuple[int, int]]:
    try:
        st = os.stat(JOURNAL)
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns


def test_demo_runs_every_container_and_leaves_the_node_journal_alone(nvshim_bin: str) -> None:
    """Four real containers through nvshim-runtime → runc each see exactly their GPUs; the
    simulated node's grants are not written into this node's grant journal."""
    if os.geteuid() != 0:
        pytest.skip("the demo needs root (mknod, runc)")
    for tool in ("runc", "busybox"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    before = _journal_state()
    done = subprocess.run([nvshim_bin, "demo"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "demo finished: all containers saw exactly their GPUs" in done.stdout
    assert done.stdout.count("-> as expected") == 4
    assert _journal_state() == before, "the demo wrote the node's grant journal"


def test_demo_that_cannot_write_says_so_in_one_line(tmp_path: object) -> None:
    """A demo whose temp dir cannot be made fails with one `nvshim: demo: cannot …` line
    naming the path and the reason (an OSError is an NvshimError, never a traceback)."""
    if os.geteuid() != 0:
        pytest.skip("the demo needs root (mknod, runc)")
    for tool in ("runc", "busybox"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    code = (
        "import sys, tempfile; tempfile.tempdir = sys.argv[1]\n"
        "from nvshim.cli.main import main; main(['demo'])"
    )
    missing = f"{tmp_path}/no-such-dir"
    done = subprocess.run(
        [sys.executable, "-c", code, missing], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"nvshim: demo: cannot make a temp dir: {missing}/nvshim-demo-")
    assert lines[0].endswith(": No such file or directory")
