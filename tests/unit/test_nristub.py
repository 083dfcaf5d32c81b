"""bench/nri.py's stub modes: NRI's own floor from a Go ``pkg/stub`` plugin.

The stub (``tests/go/nri-stub``, built from the published containerd/nri module) takes
nvshim's plugin's subscription or CreateContainer's alone, refuses a bad invocation in one
line, and its modes become rows of BENCHMARKS.md's table. Its registration with containerd
is exercised by the bench itself, which fails unless the stub answered every create.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.nri import MODES, STUB_EVENTS
from bench.table import rows_nri
from nvshim.agent.nri import plugin
from nvshim.agent.nri.api import Event, event_mask
from tests.helpers.agent import RecordingLog
from tests.helpers.nristub import EVENTS, stub_binary


def test_same_is_every_event_nvshim_handles(tmp_path: Path) -> None:
    """``same`` is the mask of every event nvshim's plugin handles (what it subscribes
    with before a config loads); ``create`` is CreateContainer's alone; each stub mode is
    a bench mode."""
    from nvshim.agent.state import AgentState

    nvshim = plugin.Plugin(AgentState(str(tmp_path / "absent.yaml"), RecordingLog()))
    assert EVENTS["same"] == event_mask(*nvshim.handlers) == nvshim.events()
    assert EVENTS["create"] == event_mask(Event.CREATE_CONTAINER)
    assert set(STUB_EVENTS) <= set(MODES) and set(STUB_EVENTS.values()) == set(EVENTS)


def test_stub_modes_are_table_rows() -> None:
    """bench/table.py makes ``nri.stub`` and ``nri.stub-create`` rows, over no plugin."""
    results = {
        "containerd": "1.7",
        "runs_per_mode": 40,
        "create_start_ms": {"none": 100.0, "stub": 101.5, "stub_create": 101.0},
        "added_ms_paired_blocks": {"stub": 1.5, "stub_create": -0.25},
        "agent_rss_mb": 28.0,
        "agent_start_to_registered_ms": 150.0,
        "machine": {"date_utc": "2026-12-07T18:00:00Z", "nproc": 2},
    }
    rows = {key: (label, value) for key, label, value in rows_nri(results)[0]}
    assert rows["nri.stub"][1] == "+1.5 ms" and "over no plugin" in rows["nri.stub"][0]
    assert rows["nri.stub-create"][1] == "−0.2 ms"


def test_stub_builds_and_refuses_a_bad_call(tmp_path: Path) -> None:
    """The stub builds from the published module; an unknown subscription is refused in
    one line with exit 2; an NRI socket that is not there ends it with exit 1, its last
    line naming the socket (pkg/stub's own log lines come first)."""
    binary = stub_binary()

    def stub(events: str) -> "subprocess.CompletedProcess[str]":
        argv = [str(binary), str(tmp_path / "nri.sock"), "10", events]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)

    bad = stub("start")
    assert bad.returncode == 2, bad
    assert bad.stderr == 'nri-stub: unknown events "start": choose create or same\n'
    absent = stub("same")
    assert absent.returncode == 1, absent
    last = absent.stderr.strip().splitlines()[-1]
    assert last.startswith("nri-stub: ") and "nri.sock" in last, absent.stderr
