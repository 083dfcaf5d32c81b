"""``nvshim cdi refresh``: after a driver change the CDI specs the config keeps, the node plan
and the CDI index describe the new driver, with no operator action (the watcher), and a
second refresh writes nothing.

A driver change is the simulated node rebuilt in place with another version: the old
``libcuda.so.<version>`` and friends are gone, ``/proc/driver/nvidia/version`` and the
library links are new, as after a package upgrade and a module reload.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from nvshim.cdi import index as cdiindex
from nvshim.cdi.schema import validate_spec
from nvshim.config import cdi_index_path, plan_path
from nvshim.runtime import plancache
from tests.helpers.common import require_root, wait_until
from tests.helpers.node import write_nvshim_config

OLD, NEW = "550.54.15", "560.35.03"


def swap_driver(root: str, version: str) -> None:
    """The node's driver replaced by ``version``: every file of the old one gone."""
    from nvshim.sim.build import create_node

    shutil.rmtree(root)
    create_node(root, gpus=2, driver_version=version)


@pytest.fixture
def node(tmp_path: Path) -> Any:
    """A fresh simulated 2-GPU node with driver 550 (the tests upgrade it)."""
    require_root()
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path / "node"), gpus=2, driver_version=OLD)


def make_config(tmp_path: Path, node: Any, refresh: List[str]) -> Path:
    return write_nvshim_config(
        tmp_path / "cfg",
        {
            "driver-root": node.root,
            "runtimes": ["runc"],
            "cdi-spec-dirs": [str(tmp_path / "cdi")],
            "cdi-refresh": refresh,
        },
    )


@pytest.fixture
def cfg(tmp_path: Path, node: Any) -> Path:
    """The node's config: its spec dir, and one spec kept fresh (cdi/nvidia.yaml)."""
    return make_config(tmp_path, node, [f"--output {tmp_path}/cdi/nvidia.yaml"])


def refresh(nvshim_bin: str, cfg: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [nvshim_bin, "cdi", "refresh", "--config", str(cfg), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def libcuda_mounts(spec: Path) -> List[str]:
    import yaml

    doc = yaml.safe_load(spec.read_text())
    assert validate_spec(doc) == []
    return [
        m["hostPath"].rsplit("/", 1)[1]
        for m in doc["containerEdits"]["mounts"]
        if "/libcuda.so." in m["hostPath"]
    ]


def plan_version(cfg: Path, node: Any) -> str:
    """The driver version of the node plan cache (it must be fresh to count)."""
    cached, why = plancache.load(plan_path(str(cfg)), node.root, node.root)
    assert cached is not None, why
    return cached.driver_version()


def index_is_fresh(cfg: Path, spec_dir: Path) -> bool:
    _, why = cdiindex.load(cdi_index_path(str(cfg)), [str(spec_dir)])
    return why == ""


def states(*dirs: Path) -> Dict[str, Tuple[int, int, int]]:
    """(inode, size, mtime) of every file in ``dirs``: what a rewrite would change."""
    out = {}
    for d in dirs:
        for p in sorted(d.iterdir()):
            st = p.stat()
            out[str(p)] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def test_refresh_writes_spec_plan_and_index_then_writes_nothing(
    node: Any, cfg: Path, tmp_path: Path, nvshim_bin: str
) -> None:
    """The first refresh writes the listed spec, the node plan and the CDI index; a second
    one rewrites no file and says everything is current."""
    first = refresh(nvshim_bin, cfg)
    assert first.returncode == 0, first.stderr
    spec = tmp_path / "cdi" / "nvidia.yaml"
    assert libcuda_mounts(spec) == [f"libcuda.so.{OLD}"]
    assert f"{spec}: regenerated for driver {OLD}" in first.stderr
    assert plan_version(cfg, node) == OLD and index_is_fresh(cfg, tmp_path / "cdi")
    assert first.stdout == ""

    before = states(tmp_path / "cfg", tmp_path / "cdi")
    second = refresh(nvshim_bin, cfg)
    assert second.returncode == 0, second.stderr
    assert second.stderr == (
        "nothing to refresh: 1 CDI spec, the node plan and the CDI index "
        f"are current for driver {OLD}\n"
    )
    assert states(tmp_path / "cfg", tmp_path / "cdi") == before


def test_watcher_regenerates_spec_plan_and_index_after_a_driver_swap(
    node: Any, cfg: Path, tmp_path: Path, nvshim_bin: str
) -> None:
    """`nvshim cdi refresh --watch` writes the spec at start and, once the node's driver is
    swapped from 550 to 560, the spec, plan and index of the 560 driver, by itself; SIGTERM
    stops it with exit 0. Its log (stderr, not a terminal) is structlog's JSON lines."""
    spec = tmp_path / "cdi" / "nvidia.yaml"
    log = (tmp_path / "watch.err").open("w+")
    watcher = subprocess.Popen(
        [nvshim_bin, "cdi", "refresh", "--config", str(cfg), "--watch", "--interval", "0.1"],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        wait_until(
            lambda: spec.exists() and libcuda_mounts(spec) == [f"libcuda.so.{OLD}"],
            60,
            "the watcher's first spec",
        )
        swap_driver(node.root, NEW)
        wait_until(
            lambda: libcuda_mounts(spec) == [f"libcuda.so.{NEW}"], 60, "the spec of the new driver"
        )
        wait_until(lambda: index_is_fresh(cfg, tmp_path / "cdi"), 30, "a fresh CDI index")
        assert plan_version(cfg, node) == NEW
    finally:
        watcher.send_signal(signal.SIGTERM)
        out, _ = watcher.communicate(timeout=30)
    log.seek(0)
    said = log.read()
    assert watcher.returncode == 0, said
    assert out == ""
    assert "Traceback" not in said
    records = [json.loads(line) for line in said.splitlines()]
    assert {"event": f"{spec}: regenerated for driver {NEW}", "level": "info"} in [
        {"event": r["event"], "level": r["level"]} for r in records
    ], said
    assert all(r["timestamp"].endswith("Z") for r in records), said


def test_refresh_without_a_driver_exits_1_and_writes_nothing(
    node: Any, cfg: Path, tmp_path: Path, nvshim_bin: str
) -> None:
    """With the driver gone (uninstalled, not yet reinstalled) refresh exits 1 with one line
    and leaves the spec and the caches as they were."""
    assert refresh(nvshim_bin, cfg).returncode == 0
    shutil.rmtree(node.root)
    os.mkdir(node.root)
    before = states(tmp_path / "cfg", tmp_path / "cdi")
    res = refresh(nvshim_bin, cfg)
    assert res.returncode == 1
    assert res.stderr == (
        f"nvshim: cannot find the NVIDIA driver version under {node.root}: "
        "no /proc/driver/nvidia/version and no libcuda.so.<version>: "
        "nothing refreshed (the driver is not installed, or its module not "
        "loaded, yet)\n"
    )
    assert states(tmp_path / "cfg", tmp_path / "cdi") == before


def test_a_failing_entry_writes_no_spec(node: Any, tmp_path: Path, nvshim_bin: str) -> None:
    """When one cdi-refresh entry cannot be made (IMEX channels on a node without any) no
    spec is written, not even the one that could be: one line names the entry."""
    cfg = make_config(
        tmp_path,
        node,
        [
            f"--output {tmp_path}/cdi/nvidia.yaml",
            f"--class imex-channel --output {tmp_path}/cdi/imex.yaml",
        ],
    )
    (tmp_path / "cdi").mkdir()
    res = refresh(nvshim_bin, cfg)
    assert res.returncode == 1
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f'nvshim: cannot refresh {tmp_path}/cdi/imex.yaml (cdi-refresh entry "--class '
        f'imex-channel --output {tmp_path}/cdi/imex.yaml"): no IMEX channels'
    ), lines
    assert lines[0].endswith("; nothing refreshed")
    assert os.listdir(tmp_path / "cdi") == []


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("--outptu /x.yaml", "no such option '--outptu'; did you mean '--output'?"),
        ("--class gpu", "needs --output with an absolute path"),
        ("--output relative.yaml", "needs --output with an absolute path"),
        ("--output -", "needs --output with an absolute path"),
        ("--driver-root /tmp --output /x.yaml", "--driver-root cannot be used here"),
        ("--check=/x.yaml --output /y.yaml", "--check cannot be used here"),
        ("--output '/x.yaml", "no closing quotation"),
        (
            "--device-name-strategy name --output /x.yaml",
            "invalid value for '--device-name-strategy'",
        ),
    ],
)
def test_bad_entries_are_one_line_naming_the_entry(
    tmp_path: Path, nvshim_bin: str, entry: str, why: str
) -> None:
    """A cdi-refresh entry that `nvshim cdi generate` would not take, or that does not write
    a file, fails refresh (and --print-watch-paths, which install.sh runs) in one line that
    names the config, the entry and the problem."""
    cfg = write_nvshim_config(tmp_path / "cfg", {"cdi-refresh": [entry]})
    for args in ((), ("--print-watch-paths",)):
        res = refresh(nvshim_bin, cfg, *args)
        assert res.returncode == 1
        lines = res.stderr.splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith(f'nvshim: config {cfg}: "cdi-refresh[0]" is "'), lines
        assert why in lines[0], lines


def test_two_entries_writing_one_file_are_refused(tmp_path: Path, nvshim_bin: str) -> None:
    """Two cdi-refresh entries with the same output are refused (they would overwrite each
    other at every refresh)."""
    cfg = write_nvshim_config(
        tmp_path / "cfg",
        {"cdi-refresh": ["--output /x.yaml", "--vendor example.com --output /x.yaml"]},
    )
    res = refresh(nvshim_bin, cfg)
    assert res.returncode == 1
    assert res.stderr.strip().endswith(": /x.yaml is also cdi-refresh[0]'s output"), res.stderr


def test_print_watch_paths_names_the_drivers_files(node: Any, cfg: Path, nvshim_bin: str) -> None:
    """--print-watch-paths names the module's version file and libcuda.so.1 under the driver
    root, the running kernel's modules.dep, and the config."""
    res = refresh(nvshim_bin, cfg, "--print-watch-paths")
    assert res.returncode == 0, res.stderr
    paths = res.stdout.splitlines()
    release = os.uname().release
    assert paths[0] == f"{node.root}/proc/driver/nvidia/version"
    for path in (
        f"/lib/modules/{release}/modules.dep",
        f"/lib/modules/{release}/modules.dep.bin",
        f"{node.root}/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        str(cfg),
    ):
        assert path in paths, paths
    assert res.stderr == ""


def test_refresh_help_names_its_options(nvshim_bin: str) -> None:
    """`nvshim cdi refresh --help` documents --config, --watch, --interval and
    --print-watch-paths."""
    res = subprocess.run(
        [nvshim_bin, "cdi", "refresh", "--help"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0
    for text in (
        "--config FILE",
        "--watch",
        "--interval SECONDS",
        "--print-watch-paths",
        "cdi-refresh",
    ):
        assert text in res.stdout, res.stdout
