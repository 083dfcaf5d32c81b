"""crun's own argv grammar through nvshim-runtime with real crun, end to end (issue 12
item 6; the parser is nvshim.runtime.argv, its unit tests test_argv.py)."""

from __future__ import annotations

import json
import subprocess

import pytest

from nvshim.node.compile import compile_node
from tests.helpers.bundle import make_bundle
from tests.helpers.common import require_root, unique_id
from tests.helpers.node import write_nvshim_config

LIST_NODES = "ls /dev | grep '^nvidia' | tr '\\n' ' '; echo"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A simulated 2-GPU node."""
    require_root()
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("sim") / "node"), gpus=2)


@pytest.fixture
def crun_env(tmp_path, node, crunw):
    """nvshim configured with crun (through its mount-namespace wrapper) as the runtime."""
    cfg = write_nvshim_config(
        tmp_path / "cfg", {"driver-root": node.root, "runtimes": [str(crunw)]}
    )
    compile_node(str(cfg))
    return {
        "NVSHIM_CONFIG": str(cfg),
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["--cgroup-manager", "cgroupfs", "run", "--bundle", "{b}", "{id}"],
        ["--cgroup-manager=cgroupfs", "run", "--bund", "{b}", "{id}"],
        ["run", "-b{b}", "{id}"],
    ],
    ids=["global-value", "prefix", "attached-short"],
)
def test_crun_grammar_gets_the_gpu(argv, crun_env, node, rootfs, tmp_path, nvshim_runtime_bin):
    """Issue 12 item 6: crun argv forms runc does not have (`--cgroup-manager VALUE`, `--bund`,
    `-bDIR`) still reach nvshim: the container sees the GPU it asked for."""
    bundle = make_bundle(
        tmp_path / "b", rootfs, ["sh", "-c", LIST_NODES], env=["NVIDIA_VISIBLE_DEVICES=1"]
    )
    cid = unique_id()
    root = tmp_path / "crun-root"
    args = [a.format(b=bundle, id=cid) for a in argv]
    res = subprocess.run(
        [nvshim_runtime_bin, "--root", str(root), *args],
        env=crun_env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert res.returncode == 0, res.stderr
    seen = set(res.stdout.split())
    assert f"nvidia{node.gpus[1].minor}" in seen and "nvidiactl" in seen, res.stdout
    assert {n for n in seen if n[6:].isdigit()} == {f"nvidia{node.gpus[1].minor}"}, res.stdout


def test_crun_config_file_is_refused_not_ignored(crun_env, rootfs, tmp_path, nvshim_runtime_bin):
    """Issue 12 item 6: `create -f FILE` (crun reads FILE, not config.json) fails in one line;
    neither file is touched and crun never runs."""
    bundle = make_bundle(tmp_path / "b", rootfs, ["true"], env=["NVIDIA_VISIBLE_DEVICES=0"])
    other = bundle / "other.json"
    other.write_bytes((bundle / "config.json").read_bytes())
    before = (bundle / "config.json").read_bytes()
    log = tmp_path / "log.json"
    res = subprocess.run(
        [
            nvshim_runtime_bin,
            "--root",
            str(tmp_path / "crun-root"),
            "--log",
            str(log),
            "--log-format",
            "json",
            "create",
            "-f",
            "other.json",
            "--bundle",
            str(bundle),
            unique_id(),
        ],
        env=crun_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1
    assert len(res.stderr.splitlines()) == 1 and "cannot follow crun's --config" in res.stderr
    assert json.loads(log.read_text().splitlines()[-1])["level"] == "error"
    assert (bundle / "config.json").read_bytes() == before
    assert other.read_bytes() == before
    assert not (tmp_path / "crun-root").exists() or not any((tmp_path / "crun-root").iterdir())
