"""NRI's cheapest external plugin, for the bench: ``tests/go/nri-stub``.

``nri-stub`` is our ``main.go`` around ``pkg/stub`` of the published
``github.com/containerd/nri`` module (the tag ``tests/go/nri-stub/go.mod`` pins, v0.6.1:
the NRI Debian 13's containerd 1.7.24 is built with), built and cached like the other Go
groups (:func:`tests.helpers.gobuild.go_programs`). It answers every event it subscribes to
at once with no adjustment: what containerd's round trips to an external plugin cost, apart
from any plugin's own work. ``EVENTS`` picks the subscription: ``create`` (CreateContainer
only, what nvshim's plugin takes with inject off) or ``same`` (CreateContainer,
StartContainer, RemoveContainer: every event nvshim's plugin handles, its subscription
under ``nri-inroot: start``).

:class:`NriStub` starts it on an NRI socket, waits for its ``nri-stub synchronized`` line
(containerd configured and synchronized it) and stops it, reading how many of each event it
answered from its last line (``nri-stub answered create=N start=N remove=N``).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Dict, Optional

from tests.helpers.gobuild import go_programs

__all__ = ["GROUP", "EVENTS", "stub_binary", "NriStub"]

#: the Go group that builds it
GROUP = "nri-stub"
#: each subscription the stub takes, and its NRI event mask
EVENTS = {"create": 1 << 3, "same": (1 << 3) | (1 << 5) | (1 << 10)}


def stub_binary() -> Path:
    """``nri-stub``, built now unless the cache has it."""
    return go_programs(GROUP) / "nri-stub"


class NriStub:
    """One ``nri-stub`` process registered on ``socket`` at plugin index ``index``."""

    def __init__(self, binary: Path, socket: Path, log: Path, index: str = "10") -> None:
        self.binary, self.socket, self.log, self.index = binary, socket, log, index
        self.proc: Optional["subprocess.Popen[bytes]"] = None
        self._said = 0

    def start(self, events: str, timeout: float = 20) -> float:
        """Start it subscribed to ``events`` (a key of :data:`EVENTS`); returns the ms from
        its start to its ``synchronized`` line, which names the mask it subscribed with."""
        if events not in EVENTS:
            raise ValueError(f"nri-stub events {events!r}: choose from {', '.join(EVENTS)}")
        line = f"nri-stub synchronized {EVENTS[events]}\n"
        before = self.log.read_text().count(line) if self.log.exists() else 0
        self._said = len(self._answered())
        t0 = time.perf_counter()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(self.binary), str(self.socket), self.index, events],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        while self.log.read_text().count(line) <= before:
            if self.proc.poll() is not None or time.perf_counter() - t0 > timeout:
                self.stop()
                raise AssertionError(
                    f"nri-stub ({events}) did not register on {self.socket}:\n"
                    f"{self.log.read_text()[-2000:]}"
                )
            time.sleep(0.002)
        return (time.perf_counter() - t0) * 1e3

    def _answered(self) -> list[str]:
        text = self.log.read_text() if self.log.exists() else ""
        return [line for line in text.splitlines() if line.startswith("nri-stub answered ")]

    def stop(self) -> Dict[str, int]:
        """Stop it (SIGTERM: it closes its connection; containerd drops the plugin); the
        events it answered (``create``, ``start``, ``remove``). A stub that ends without
        saying so fails, with its log's tail."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        if self.proc is None:
            return {}
        code, self.proc = self.proc.returncode, None
        said = self._answered()
        if len(said) <= self._said:
            raise AssertionError(
                f"nri-stub ended (exit {code}) without its answered line:\n"
                f"{self.log.read_text()[-3000:]}"
            )
        return {
            key: int(value) for key, value in (field.split("=") for field in said[-1].split()[2:])
        }
