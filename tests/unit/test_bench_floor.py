"""The benches' floor: runc on the config.json a runtime wrote, timed in every round.

Pure parts of ``bench/run.py`` and ``bench/gocompare.py`` (no runc, no root): how a round
orders the baseline, the floor and the subject, what the per-round differences are, and
that a bundle captured after a create comes back byte for byte on the next restore.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, List, Tuple

from bench.gocompare import Subject, report
from bench.run import Bench, Floor, paired


def _clock(
    calls: List[str], name: str, values: List[Tuple[float, float]]
) -> Callable[[int], Tuple[float, float]]:
    """A timed step that records its name and returns its next sample."""

    def step(_i: int) -> Tuple[float, float]:
        calls.append(name)
        return values.pop(0)

    return step


def test_paired_times_the_floor_between_and_flips_the_order() -> None:
    """Each round runs baseline, floor, subject, and the next round the reverse."""
    calls: List[str] = []
    result = paired(
        "x",
        2,
        _clock(calls, "runc", [(100.0, 1.0), (102.0, 1.0)]),
        _clock(calls, "subject", [(130.0, 5.0), (128.0, 5.0)]),
        floor=_clock(calls, "floor", [(110.0, 2.0), (114.0, 2.0)]),
    )
    assert calls == ["runc", "floor", "subject", "subject", "floor", "runc"]
    assert result["floor_samples"] == [110.0, 114.0]


def test_paired_gives_the_floor_over_runc_and_the_subject_over_its_floor() -> None:
    """The differences are per round (medians of pairs), not differences of medians."""
    result = paired(
        "x",
        3,
        _clock([], "runc", [(100.0, 1.0), (200.0, 1.0), (100.0, 1.0)]),
        _clock([], "subject", [(130.0, 9.0), (232.0, 9.0), (131.0, 9.0)]),
        floor=_clock([], "floor", [(110.0, 3.0), (212.0, 3.0), (111.0, 3.0)]),
    )
    assert result["floor_over_runc_ms_median"] == 11.0
    assert result["over_floor_ms_median"] == 20.0
    assert result["cpu_over_floor_ms_median"] == 6.0
    assert result["overhead_ms_median"] == 31.0


def test_paired_without_a_floor_has_no_floor_columns() -> None:
    """The passthrough and shim-stage cases, which have no floor, keep their two columns."""
    result = paired("x", 1, _clock([], "a", [(1.0, 0.0)]), _clock([], "b", [(2.0, 0.0)]))
    assert "floor_ms" not in result


def test_a_captured_floor_comes_back_on_a_fresh_rootfs(tmp_path: Path) -> None:
    """restore(key, floor) writes the runtime's config.json and the files it added beside
    it, and still removes what the last create put in the rootfs."""
    bundle = tmp_path / "b"
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_bytes(b"engine")
    b = Bench.__new__(Bench)
    b.bundles = {"1": bundle}
    b.originals = {"1": b"engine"}
    b.bundle_names = {"1": {"config.json", "rootfs"}}
    b.rootfs_paths = {"1": set()}
    b.keep = {}
    (bundle / "config.json").write_bytes(b"runtime's")  # what a create left
    (bundle / "params").write_bytes(b"p")
    floor = b.floor("1")
    assert (floor.config, floor.files) == (b"runtime's", {"params": b"p"})
    b.restore("1")
    assert (bundle / "config.json").read_bytes() == b"engine"
    assert not (bundle / "params").exists()
    (bundle / "rootfs" / "lib.so.1").write_bytes(b"")  # what the floor's create adds
    b.restore("1", floor)
    assert (bundle / "config.json").read_bytes() == b"runtime's"
    assert (bundle / "params").read_bytes() == b"p"
    assert list((bundle / "rootfs").iterdir()) == []


def test_gocompare_reports_each_runtime_over_its_own_floor() -> None:
    """A subject's floor columns come from its own floor's rounds, paired with its own."""

    def subject(name: str, creates: List[float]) -> Subject:
        s = Subject(name, "x", {}, "k", Floor(b"", {}) if name.startswith("floor") else None)
        s.create = [(c, 1.0) for c in creates]
        s.delete = [(100.0, 1.0) for _ in creates]
        return s

    runc, fast = subject("runc", [20.0, 30.0]), subject("nvshim fast", [40.0, 52.0])
    floors = {"nvshim fast": subject("floor of nvshim fast", [25.0, 36.0])}
    out = report([runc, fast], floors, [])
    assert out["nvshim fast"]["create_over_floor_ms"] == 15.5
    assert out["nvshim fast"]["floor_lifecycle_over_runc_ms"] == 5.5
    assert "floor_lifecycle_ms" not in out["runc"]
