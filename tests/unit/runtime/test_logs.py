"""The debug log (config ``debug-log``): structlog's JSON-lines format, written without it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from nvshim.runtime.logs import open_debug_log


def test_records_are_byte_for_byte_what_structlog_rendered(tmp_path: Path) -> None:
    """Each record is the line structlog's JSONRenderer(sort_keys=True) gives for the same
    event dict (keys sorted at every level, its separators and escaping, repr of what JSON
    cannot hold), with the level, the pid and the bound context."""
    import structlog

    path = tmp_path / "debug.log"
    log = open_debug_log(str(path), id="ctr-1")
    fields = {
        "bundle": '/b/é"x',
        "devices": ["0", "1"],
        "edits": {"z": 1, "a": {"y": [1, 2.5]}},
        "ok": True,
        "none": None,
        "thing": Path("/p"),
    }
    log.event("request", **fields)
    log.error("create failed", error="boom")
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    render = structlog.processors.JSONRenderer(sort_keys=True)
    for line, (level, event, extra) in zip(
        lines,
        [("info", "request", fields), ("error", "create failed", {"error": "boom"})],
        strict=True,
    ):
        got = json.loads(line)
        assert got["level"] == level and got["event"] == event and got["id"] == "ctr-1"
        assert isinstance(got["pid"], int)
        expected = dict(
            extra, event=event, level=level, id="ctr-1", pid=got["pid"], timestamp=got["timestamp"]
        )
        assert line == render(None, "info", expected)


def test_the_timestamp_is_structlogs_iso_utc(tmp_path: Path) -> None:
    """The timestamp is what TimeStamper(fmt="iso", utc=True) writes: ISO 8601 with
    microseconds and a Z."""
    path = tmp_path / "debug.log"
    open_debug_log(str(path)).event("plan", source="cache")
    stamp = json.loads(path.read_text())["timestamp"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z", stamp), stamp
