"""doctor's mechanics that keep it fast, without changing what it reports: containerd is
asked its version once per binary, in the background."""

from __future__ import annotations

import os
from pathlib import Path

from nvshim.node.engines import containerd_read


def _fake_containerd(path: Path, version: str, log: Path) -> None:
    path.write_text(
        f"#!/bin/sh\necho asked >> {log}\n"
        f"echo containerd github.com/containerd/containerd {version} abc\n"
    )
    os.chmod(path, 0o755)


def test_containerd_is_asked_its_version_once_per_binary(tmp_path: Path) -> None:
    """start_version then three containerd_version calls run `containerd --version` once;
    a replaced binary is asked again."""
    binary, log = tmp_path / "containerd", tmp_path / "asked.log"
    _fake_containerd(binary, "v1.7.24", log)
    containerd_read.start_version(str(binary))
    for _ in range(3):
        assert containerd_read.containerd_version(str(binary)) == (1, 7, "1.7.24")
    assert log.read_text().count("asked") == 1
    binary.unlink()
    _fake_containerd(binary, "v2.1.9", log)
    assert containerd_read.containerd_version(str(binary)) == (2, 1, "2.1.9")
    assert log.read_text().count("asked") == 2


def test_no_containerd_has_no_version(tmp_path: Path) -> None:
    """A binary that is not there: no process, no version."""
    containerd_read.start_version(str(tmp_path / "none"))
    assert containerd_read.containerd_version(str(tmp_path / "none")) is None


def test_no_driver_no_pynvml() -> None:
    """GPU discovery on driver root / of a host without a loaded NVIDIA driver finds none by
    procfs and never imports pynvml (NVML could not answer)."""
    import subprocess
    import sys

    from nvshim import host

    if host.driver_loaded():
        import pytest

        pytest.skip("this host has an NVIDIA driver: NVML is asked")
    code = (
        "import sys\nfrom nvshim.host.discovery import Host\n"
        "from nvshim.host.gpus import find_gpus\n"
        "print(find_gpus(Host('/'), 'auto'), 'pynvml' in sys.modules)"
    )
    res = subprocess.run(
        [sys.executable, "-I", "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[4])},
    )
    assert res.stdout.split() == ["((),", "'procfs')", "False"], res.stderr
