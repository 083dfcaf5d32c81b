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
from nvshim.runtime.denials import (
    KEEP_RECORDS,
    Denial,
    append_denial,
    compact_denials,
    denials_path,
    read_denials,
)
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
    return {
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.sandbox-name": pod,
        "io.kubernetes.cri.sandbox-namespace": namespace,
        "io.kubernetes.cri.sandbox-uid": "uid-mine",
        "io.kubernetes.cri.container-name": container,
    }


def write_config(node: Any, tmp_path: Path, extra: str = "") -> Path:
    cfg = tmp_path / "etc" / "config.yaml"
    cfg.parent.mkdir(exist_ok=True)
    cfg.write_text(
        f"runtimes: [/bin/true]\ndriver-root: {node.root}\nnvml-facts: {node.nvml_facts}\n"
        f"grants-journal: {tmp_path}/journal/grants.jsonl\n"
        f"kubelet-socket: {tmp_path}/kubelet.sock\n"
        f"kubelet-checkpoint: {tmp_path}/no-checkpoint\n" + extra
    )
    return cfg


def create(
    cfg: Path,
    tmp_path: Path,
    env: List[str],
    cid: str,
    annotations: Optional[Dict[str, str]] = None,
) -> subprocess.CompletedProcess:
    """``nvshim-runtime create`` of a fresh bundle with ``env`` and CRI ``annotations``."""
    bundle = tmp_path / f"bundle-{cid}"
    (bundle / "rootfs").mkdir(parents=True)
    spec = {
        "process": {"env": ["PATH=/bin"] + env, "cwd": "/"},
        "root": {"path": "rootfs"},
        "annotations": cri() if annotations is None else annotations,
    }
    raw = json.dumps(spec, indent=2).encode()
    (bundle / "config.json").write_bytes(raw)
    res = subprocess.run(
        [
            sys.executable,
            "-I",
            "-m",
            "nvshim.runtime.main",
            "--root",
            str(tmp_path / "state"),
            "create",
            "--bundle",
            str(bundle),
            cid,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVSHIM_CONFIG": str(cfg)},
    )
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


def test_a_refusal_is_recorded_with_the_error_line(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """A container naming another pod's GPU is refused by the kubelet check (exit 1,
    config.json byte-identical) and the denial journal keeps the same line as its reason."""
    victim = node.gpus[1]
    kubelet.set(
        [("team-b", "victim", {"train": {GPU: [victim.uuid]}}), ("team-a", "mine", {"main": {}})]
    )
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
    for cid, env in (
        ("plain", []),
        ("void", ["NVIDIA_VISIBLE_DEVICES=void"]),
        ("granted", ["NVIDIA_VISIBLE_DEVICES=0"]),
    ):
        assert create(cfg, tmp_path, env, cid).returncode == 0
    assert not Path(denials_path(str(tmp_path / "journal" / "grants.jsonl"))).exists()
    res = CliRunner().invoke(grants, ["--config", str(cfg), "--denied"])
    assert res.exit_code == 0 and "no denials yet" in res.stderr


def test_the_denial_journal_keeps_its_newest_records_past_the_limit(tmp_path: Path) -> None:
    """Past max-bytes the denial journal (a history) keeps its newest records: half the
    limit's worth, or the KEEP_RECORDS newest when those alone are more, and the new one is
    appended."""
    path = tmp_path / "grants.denied.jsonl"

    def rec(i: int) -> Denial:
        return Denial(
            time=time.time(),
            container_id=f"d{i}",
            root="/r",
            runtime="runc",
            bundle="/b" * 30,
            action="stripped",
            reason="r" * 100,
        )

    for i in range(200):
        assert append_denial(str(path), rec(i), 1 << 20) is None
    assert append_denial(str(path), rec(200), 16384) is None
    got = [d.container_id for d in read_denials(str(path)) or []]
    assert got[-1] == "d200" and got == [f"d{i}" for i in range(201 - len(got), 201)]
    assert len(got) == KEEP_RECORDS + 1  # 64 records of ~260 bytes: more than half of 16 KiB
    assert append_denial(str(path), rec(201), 1 << 20) is None
    assert len(read_denials(str(path)) or []) == KEEP_RECORDS + 2


def test_the_denial_journal_is_the_grant_journals_sibling() -> None:
    """grants.jsonl -> grants.denied.jsonl in the same directory; another name keeps its stem."""
    assert denials_path("/var/lib/nvshim/grants.jsonl") == "/var/lib/nvshim/grants.denied.jsonl"
    assert denials_path("/j/journal.log") == "/j/journal.denied.jsonl"
    assert denials_path("/j/grants") == "/j/grants.denied.jsonl"


HOSTILE = "x\n2026-01-01T00:00:00Z  c-forged  -  granted\r\x1b[32mok\x1b[0m\x85\u2028\u202e"


def test_a_create_with_huge_hostile_values_journals_a_small_escaped_record(
    node: Any, tmp_path: Path
) -> None:
    """A pod's NVIDIA_VISIBLE_DEVICES of 300 kB holding line breaks, ESC and bidi controls
    (with as long pod names) is stripped and leaves a denial record of a few KiB with every
    value escaped and cut (reason, asked, names); `nvshim grants --denied` shows it on its
    own two lines."""
    cfg = write_config(node, tmp_path, "require-allocation: true\n")
    value = "0," * 150_000 + HOSTILE
    annotations = dict(cri(pod="p" * 100_000 + HOSTILE, namespace=HOSTILE, container=HOSTILE))
    res = create(cfg, tmp_path, [f"NVIDIA_VISIBLE_DEVICES={value}"], "c-huge", annotations)
    assert res.returncode == 0, res.stderr
    journal = Path(denials_path(str(tmp_path / "journal" / "grants.jsonl")))
    assert journal.stat().st_size < 4096
    [record] = denied(cfg, "--format", "json")["denied"]
    values = [
        record["reason"],
        record["namespace"],
        record["pod"],
        record["container"],
        *record["asked"],
    ]
    assert all(v.isprintable() for v in values)
    assert record["asked"][0].startswith("NVIDIA_VISIBLE_DEVICES=0,0,0,")
    assert len(record["asked"][0]) <= 512 and len(record["reason"]) <= 1024
    assert len(record["pod"]) <= 253 and record["namespace"].startswith("x\\n2026")
    lines = denied(cfg).rstrip("\n").split("\n")
    assert len(lines) == 3 and all(line.isprintable() for line in lines)  # header, row, reason


def test_a_denial_record_keeps_at_most_16_asked_entries() -> None:
    """A container asking through 40 CDI annotations or mounts is journaled with 15 of them,
    each cut to 512 characters, and a last entry counting the rest."""
    denial = Denial(
        time=1.0,
        container_id="c",
        root="/r",
        runtime="runc",
        bundle="/b",
        action="refused",
        reason="r",
        asked=tuple(f"annotation cdi.k8s.io/x{i}={HOSTILE * 100}" for i in range(40)),
    )
    doc = json.loads(denial.to_line())
    assert len(doc["asked"]) == 16 and doc["asked"][-1] == "… and 25 more"
    assert all(len(a) <= 512 and a.isprintable() for a in doc["asked"])


def test_the_denied_table_escapes_a_record_written_by_hand(tmp_path: Path) -> None:
    """A denial record written raw (by an older nvshim, or by hand) with \\n, \\r, ESC, NEL,
    U+2028 and a bidi override in its values cannot forge a line of `grants --denied`."""
    journal = tmp_path / "grants.jsonl"
    doc = {
        "v": 1,
        "t": 1.0,
        "id": "c\rx",
        "root": "/r",
        "runtime": "runc",
        "bundle": "/b",
        "action": "stripped",
        "reason": HOSTILE,
        "asked": [HOSTILE],
        "namespace": "ns",
        "pod": HOSTILE,
        "pod_uid": "",
        "container": "main",
    }
    Path(denials_path(str(journal))).write_text(json.dumps(doc) + "\n")
    res = CliRunner().invoke(grants, ["--journal", str(journal), "--denied"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.rstrip("\n").split("\n")
    assert len(lines) == 3 and all(line.isprintable() for line in lines)
    assert "c-forged  -  granted\\r\\x1b[32mok\\x1b[0m\\x85\\u2028\\u202e" in lines[2]


def noisy(i: int, size: int = 100) -> Denial:
    """One of a noisy tenant's denials: one pod restarting, with a long value."""
    return Denial(
        time=1000.0 + i,
        container_id=f"noisy-{i}",
        root="/r",
        runtime="runc",
        bundle="/b",
        action="stripped",
        reason="r" * size,
        asked=(f"NVIDIA_VISIBLE_DEVICES={'0,' * size}",),
        namespace="attacker",
        pod="loop",
        container="main",
    )


def quiet(i: int) -> Denial:
    return Denial(
        time=float(i),
        container_id=f"quiet-{i}",
        root="/r",
        runtime="runc",
        bundle="/b",
        action="refused",
        reason="no allocation",
        asked=("NVIDIA_VISIBLE_DEVICES=all",),
        namespace=f"team-{i % 5}",
        pod=f"job-{i}",
        container="main",
    )


def test_one_tenant_denied_again_and_again_cannot_erase_the_others(tmp_path: Path) -> None:
    """A pod restarting in a loop with the longest values it can journal, past every
    compaction, leaves at least KEEP_RECORDS // 2 (32) of the other tenants' newest records
    (all 40 here, as they fit), and every one of the others' tenants keeps its newest."""
    path = tmp_path / "grants.denied.jsonl"
    for i in range(40):
        append_denial(str(path), quiet(i), 65536)
    for i in range(400):
        assert append_denial(str(path), noisy(i, 300_000), 65536) is None
    records = read_denials(str(path)) or []
    others = [d.container_id for d in records if d.namespace != "attacker"]
    assert others == [f"quiet-{i}" for i in range(40)]
    assert records[-1].container_id == "noisy-399"
    assert path.stat().st_size < 65536 + KEEP_RECORDS * 8192


def test_compaction_keeps_every_tenants_newest_records_first() -> None:
    """Compaction keeps records in turns (each tenant's newest, then each one's second
    newest...): with two tenants and a budget of a few records, a tenant with many records
    keeps no more than the one with few, and the first KEEP_RECORDS of that order are kept
    whatever their size, half of them the other tenant's."""
    data = b"".join(quiet(i).to_line() for i in range(0, 200, 5))  # team-0: 40 records
    data += b"".join(noisy(i, 400).to_line() for i in range(200))
    kept = [
        d
        for d in (
            Denial.from_doc(json.loads(line)) for line in compact_denials(data, 1).split(b"\n")[:-1]
        )
        if d is not None
    ]
    assert len(kept) == KEEP_RECORDS
    assert [d.container_id for d in kept if d.namespace == "team-0"] == [
        f"quiet-{i}" for i in range(200 - 5 * KEEP_RECORDS // 2, 200, 5)
    ]
    assert [d.container_id for d in kept if d.namespace == "attacker"] == [
        f"noisy-{i}" for i in range(200 - KEEP_RECORDS // 2, 200)
    ]
    roomy = compact_denials(data, 1 << 30)
    assert len(roomy.split(b"\n")) - 1 == 240  # within the budget: every record


def test_a_denial_that_cannot_be_recorded_fails_the_create_as_a_grant_does(
    node: Any, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """Record or fail: with the journal's directory unusable, a stripped create fails
    (exit 1, config.json byte-identical) naming the journal, as a grant does; a refusal
    still fails with its own line, which says it was not recorded."""
    cfg = write_config(node, tmp_path, "require-allocation: true\nverify-with: kubelet\n")
    (tmp_path / "journal").write_text("a file where the journal's directory should be\n")
    res = create(cfg, tmp_path, ["NVIDIA_VISIBLE_DEVICES=0"], "c-strip")
    assert res.returncode == 1
    assert (
        res.stderr.startswith("nvshim: cannot record the denial in ")
        and "grants.denied.jsonl" in res.stderr
    )
    kubelet.set([("team-a", "mine", {"main": {GPU: [node.gpus[0].uuid]}})])
    res = create(cfg, tmp_path, [f"NVIDIA_VISIBLE_DEVICES={node.gpus[0].uuid}"], "c-grant")
    # the neighbour: a grant in the same state
    assert res.returncode == 1 and res.stderr.startswith("nvshim: cannot record the grant in ")
    kubelet.set(
        [
            ("team-b", "victim", {"train": {GPU: [node.gpus[1].uuid]}}),
            ("team-a", "mine", {"main": {}}),
        ]
    )
    res = create(cfg, tmp_path, [f"NVIDIA_VISIBLE_DEVICES={node.gpus[1].uuid}"], "c-refused")
    assert res.returncode == 1
    assert "is not this container's allocation" in res.stderr
    assert "(not recorded: cannot record the denial in " in res.stderr
    assert len(res.stderr.splitlines()) == 1
