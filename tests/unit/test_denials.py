"""Denials are visible: a container stripped of the GPUs it asked for, or refused, leaves a
record in the denial journal (beside the grant journal) that ``nvshim grants --denied``
shows with the reason.

The creates are real ``nvshim-runtime create`` runs (low-level runtime ``/bin/true``) on a
simulated node, with a gRPC PodResources server standing in for the kubelet's socket.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
from click.testing import CliRunner

from nvshim.cli.cmd_grants import grants
from nvshim.runtime.denials import Denial, append_denial, denials_path, read_denials
from tests.helpers.podresources import PodResourcesServer

GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if os.geteuid() != 0:
        pytest.skip("the simulated GPU node needs root (mknod)")
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("node") / "n"), gpus=2)


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[PodResourcesServer]:
    server = PodResourcesServer(str(tmp_path / "kubelet.sock")).start()
    yield server
    server.stop()


def cri(pod: str = "mine", container: str = "main", namespace: str = "team-a") -> Dict[str, str]:
    return {"io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.sandbox-name": pod, "io.kubernetes.cri.sandbox-namespace": namespace,
            "io.kubernetes.cri.sandbox-uid": "uid-mine", "io.kubernetes.cri.container-name": container}


def write_config(node: Any, tmp_path: Path, extra: str = "") -> Path:
    cfg = tmp_path / "etc" / "config.yaml"
    cfg.parent.mkdir(exist_ok=True)
    cfg.write_text(f"runtimes: [/bin/true]\ndriver-root: {node.root}\nnvml-facts: {node.nvml_facts}\n"
                   f"grants-journal: {tmp_path}/journal/grants.jsonl\n"
                   f"kubelet-socket: {tmp_path}/kubelet.sock\n"
                   f"kubelet-checkpoint: {tmp_path}/no-checkpoint\n" + extra)
    return cfg


def create(cfg: Path, tmp_path: Path, env: List[str], cid: str,
           annotations: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """``nvshim-runtime create`` of a fresh bundle with ``env`` and CRI ``annotations``."""
    bundle = tmp_path / f"bundle-{cid}"
    (bundle / "rootfs").mkdir(parents=True)
    spec = {"process": {"env": ["PATH=/bin"] + env, "cwd": "/"}, "root": {"path": "rootfs"},
            "annotations": cri() if annotations is None else annotations}
    raw = json.dumps(spec, indent=2).encode()
    (bundle / "config.json").write_bytes(raw)
    res = subprocess.run([sys.executable, "-I", "-m", "nvshim.runtime.main", "--root",
                          str(tmp_path / "state"), "create", "--bundle", str(bundle), cid],
                         capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVSHIM_CONFIG": str(cfg)})
    if res.returncode != 0:
        assert (bundle / "config.json").read_bytes() == raw  # byte-identical on a refusal
    return res


def denied(cfg: Path, *args: str) -> Any:
    res = CliRunner().invoke(grants, ["--config", str(cfg), "--denied", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout) if "json" in args else res.stdout


def test_a_stripped_request_is_recorded_with_its_reason(node: Any, tmp_path: Path) -> None:
    """Under require-allocation a pod's container whose image asks for GPU 0 without an
    allocation is created without it, and `nvshim grants --denied` names the pod, what it
    asked and why it was stripped."""
    cfg = write_config(node, tmp_path, "require-allocation: true\n")
    res = create(cfg, tmp_path, ["NVIDIA_VISIBLE_DEVICES=0"], "c-strip")
    assert res.returncode == 0, res.stderr
    doc = denied(cfg, "--format", "json")
    assert len(doc["denied"]) == 1
    record = doc["denied"][0]
    assert record["action"] == "stripped" and record["container_id"] == "c-strip"
    assert (record["namespace"], record["pod"], record["container"]) == ("team-a", "mine", "main")
    assert record["asked"] == ["NVIDIA_VISIBLE_DEVICES=0"]
    assert record["reason"].startswith("NVIDIA_VISIBLE_DEVICES=0 ignored: require-allocation is on")
    text = denied(cfg)
    assert "team-a/mine/main" in text and "stripped" in text
    assert "  reason: NVIDIA_VISIBLE_DEVICES=0 ignored: require-allocation is on" in text


def test_a_refusal_is_recorded_with_the_error_line(node: Any, tmp_path: Path,
                                                   kubelet: PodResourcesServer) -> None:
    """A container naming another pod's GPU is refused by the kubelet check (exit 1,
    config.json byte-identical) and the denial journal keeps the same line as its reason."""
    victim = node.gpus[1]
    kubelet.set([("team-b", "victim", {"train": {GPU: [victim.uuid]}}),
                 ("team-a", "mine", {"main": {}})])
    cfg = write_config(node, tmp_path, "require-allocation: true\nverify-with: kubelet\n")
    res = create(cfg, tmp_path, [f"NVIDIA_VISIBLE_DEVICES={victim.uuid}"], "c-refused")
    assert res.returncode == 1
    error = res.stderr.strip().removeprefix("nvshim: ")
    assert error.startswith(f"GPU 1 ({victim.uuid}) is not this container's allocation")
    [record] = denied(cfg, "--format", "json")["denied"]
    assert record["action"] == "refused" and record["reason"] == error
    assert record["asked"] == [f"NVIDIA_VISIBLE_DEVICES={victim.uuid}"]
    assert (record["namespace"], record["pod"], record["container"]) == ("team-a", "mine", "main")
    assert not (tmp_path / "journal" / "grants.jsonl").exists()  # nothing was granted


def test_on_missing_allocation_fail_is_recorded_as_refused(node: Any, tmp_path: Path) -> None:
    """`on-missing-allocation: fail` refuses an image asking for GPUs with no allocation:
    recorded as refused, with the error line."""
    cfg = write_config(node, tmp_path, "require-allocation: true\non-missing-allocation: fail\n")
    res = create(cfg, tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"], "c-fail")
    assert res.returncode == 1
    [record] = denied(cfg, "--format", "json")["denied"]
    assert record["action"] == "refused" and "no device-plugin allocation" in record["reason"]
    assert record["asked"] == ["NVIDIA_VISIBLE_DEVICES=all"]


def test_a_container_asking_nothing_or_granted_leaves_no_denial(node: Any, tmp_path: Path) -> None:
    """A container asking for no GPU, or void, or granted what it asked, is not a denial:
    no denial journal is written."""
    cfg = write_config(node, tmp_path)
    for cid, env in (("plain", []), ("void", ["NVIDIA_VISIBLE_DEVICES=void"]),
                     ("granted", ["NVIDIA_VISIBLE_DEVICES=0"])):
        assert create(cfg, tmp_path, env, cid).returncode == 0
    assert not Path(denials_path(str(tmp_path / "journal" / "grants.jsonl"))).exists()
    res = CliRunner().invoke(grants, ["--config", str(cfg), "--denied"])
    assert res.exit_code == 0 and "no denials yet" in res.stderr


def test_the_denial_journal_keeps_its_newest_half_past_the_limit(tmp_path: Path) -> None:
    """Past max-bytes the denial journal (a history) keeps its newest records, at most half
    the limit, and the new one is appended."""
    path = tmp_path / "grants.denied.jsonl"

    def rec(i: int) -> Denial:
        return Denial(time=time.time(), container_id=f"d{i}", root="/r", runtime="runc",
                      bundle="/b" * 30, action="stripped", reason="r" * 100)

    for i in range(200):
        assert append_denial(str(path), rec(i), 1 << 20) is None
    assert append_denial(str(path), rec(200), 16384) is None
    got = [d.container_id for d in read_denials(str(path)) or []]
    assert got[-1] == "d200" and got == [f"d{i}" for i in range(201 - len(got), 201)]
    assert path.stat().st_size <= 8192 + len(rec(200).to_line())


def test_the_denial_journal_is_the_grant_journals_sibling() -> None:
    """grants.jsonl -> grants.denied.jsonl in the same directory; another name keeps its stem."""
    assert denials_path("/var/lib/nvshim/grants.jsonl") == "/var/lib/nvshim/grants.denied.jsonl"
    assert denials_path("/j/journal.log") == "/j/journal.denied.jsonl"
    assert denials_path("/j/grants") == "/j/grants.denied.jsonl"
