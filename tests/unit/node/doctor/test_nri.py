"""Unit tests of the doctor's NRI check: whether containerd's NRI is on, by config and version."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvshim.node.doctor.nri import DEFAULT_NRI_SOCKET, check_nri, nri_enabled

ON = '[plugins."io.containerd.nri.v1.nri"]\n  disable = false\n  socket_path = "/x/nri.sock"\n'
OFF = '[plugins."io.containerd.nri.v1.nri"]\n  disable = true\n'


@pytest.mark.parametrize("text,version,want", [
    ("", (1, 7), (False, DEFAULT_NRI_SOCKET)),
    ("", (2, 1), (True, DEFAULT_NRI_SOCKET)),
    (ON, (1, 7), (True, "/x/nri.sock")),
    (OFF, (2, 0), (False, DEFAULT_NRI_SOCKET)),
    (ON, (1, 6), (None, "/x/nri.sock")),
])
def test_nri_enabled(tmp_path: Path, text: str, version: tuple, want: tuple) -> None:
    """containerd 1.7 has NRI off unless disable = false; 2.x on unless disable = true; 1.6 has none."""
    config = tmp_path / "config.toml"
    config.write_text("version = 2\n" + text)
    assert nri_enabled(str(config), version)[:2] == want


def test_check_nri_without_engine_skips(tmp_path: Path) -> None:
    """No containerd and no CRI-O: the check is skipped, not failed."""
    found = check_nri(str(tmp_path / "c.toml"), str(tmp_path / "no-containerd"),
                      str(tmp_path / "agent.sock"), str(tmp_path / "crio.conf"))
    assert found.status == "skip"
