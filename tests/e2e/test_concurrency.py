"""Many containers created at once through the installed nvshim-runtime on one GPU node.

A node's containerd starts pods in parallel, so the runtime runs concurrently for distinct
bundles against the same driver root. 50 creates run in parallel through the installed
trampoline (``/usr/local/bin/nvshim-runtime``, or ``$NVSHIM_RUNTIME_BIN``) with real runc
and a private ``--root``, each bundle asking for GPU ``i % 8`` of a simulated 8-GPU node;
then every container is started, waited for and deleted.
"""

from __future__ import annotations

import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List

import pytest

from tests.helpers.bundle import make_bundle
from tests.helpers.common import require_binary, require_root, unique_id
from tests.helpers.runc import Runc

CONTAINERS = 50
GPUS = 8
INSTALLED = "/usr/local/bin/nvshim-runtime"


def installed_runtime() -> str:
    explicit = os.environ.get("NVSHIM_RUNTIME_BIN")
    if explicit:
        return explicit
    if not os.access(INSTALLED, os.X_OK):
        pytest.skip(
            f"{INSTALLED} is not installed (run ./install.sh) and $NVSHIM_RUNTIME_BIN is unset"
        )
    return INSTALLED


def test_fifty_parallel_gpu_creates(tmp_path: Path, base_rootfs: Path) -> None:
    """50 parallel creates of distinct GPU containers all succeed, leave no temp files, and each container sees only its own /dev/nvidia<i>."""
    require_root()
    runc_bin = require_binary("runc")
    runtime = installed_runtime()
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=GPUS)
    cfg = tmp_path / "nvshim" / "config.yaml"
    cfg.parent.mkdir()
    cfg.write_text(
        f"runtimes: [{runc_bin}]\ndriver-root: {node.root}\n"
        f"grants-journal: {cfg.parent}/grants.jsonl\n"
    )
    nvshim_cli = Path(runtime).with_name("nvshim")
    compile_cmd = [str(nvshim_cli)] if nvshim_cli.exists() else ["python3", "-m", "nvshim.cli.main"]
    subprocess.run(
        compile_cmd + ["config", "compile", "--config", str(cfg)], check=True, capture_output=True
    )
    env = dict(os.environ, NVSHIM_CONFIG=str(cfg))

    bundles: Dict[str, Path] = {}
    wanted: Dict[str, int] = {}
    for i in range(CONTAINERS):
        cid = unique_id(f"conc{i}")
        bundles[cid] = make_bundle(
            tmp_path / f"b{i}",
            base_rootfs,
            ["sh", "-c", "ls -1 /dev/ | grep '^nvidia'"],
            env={"NVIDIA_VISIBLE_DEVICES": str(i % GPUS)},
        )
        wanted[cid] = i % GPUS

    r = Runc(tmp_path / "runc-root", runtime, env=env)
    try:
        with ThreadPoolExecutor(max_workers=CONTAINERS) as pool:
            created = dict(
                zip(
                    bundles,
                    pool.map(
                        lambda cid: r.create(
                            bundles[cid], cid, runtime=runtime, env=env, timeout=300
                        ),
                        bundles,
                    ),
                    strict=True,
                )
            )
        failed = [res.describe() for res in created.values() if res.rc != 0]
        assert failed == [], "\n\n".join(failed[:3])

        leftovers = [str(p) for b in bundles.values() for p in b.glob(".config.json.nvshim-*")]
        assert leftovers == []
        # 50 concurrent appends to the grant journal: one whole record per container
        from nvshim.runtime.grants import read_grants

        journal = cfg.parent / "grants.jsonl"
        records = {g.container_id: g.gpus for g in read_grants(str(journal))}
        assert records == {cid: (node.gpus[wanted[cid]].uuid,) for cid in bundles}
        assert journal.read_bytes().count(b"\n") == CONTAINERS

        for cid in bundles:
            r.start(cid, runtime=runtime, env=env).check()
        seen: Dict[str, List[str]] = {}
        for cid in bundles:
            r.wait_stopped(cid, timeout=60, runtime=runtime, env=env)
            r.delete(cid, runtime=runtime, env=env).check()
            out, _ = r.container_output(cid)
            seen[cid] = sorted(x for x in out.split() if re.fullmatch(r"nvidia[0-9]+", x))

        wrong = {
            cid: (f"nvidia{wanted[cid]}", got)
            for cid, got in seen.items()
            if got != [f"nvidia{node.gpus[wanted[cid]].minor}"]
        }
        assert wrong == {}
        assert r.list_ids() == []
    finally:
        r.cleanup()
