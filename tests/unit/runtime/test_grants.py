"""The grant journal: whole lines only, torn lines skipped and repaired, bounded, kill -9 safe.

The kill tests are real: a writer process (the journal code, or ``nvshim-runtime create``
itself on a simulated node) is SIGKILLed at many different moments, and the journal must
still consist of whole, well-formed records.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

import pytest

from nvshim.node.holders import Holder, conflicts, render_prometheus, render_table
from nvshim.runtime.grants import Grant, append_grant, read_grants

UUID_A = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
UUID_B = "GPU-bbbbbbbb-0000-0000-0000-000000000002"


def grant(
    cid: str,
    gpus=(UUID_A,),
    root: str = "/run/runc",
    shared: bool = False,
    t: float = 0.0,
    pod: str = "",
) -> Grant:
    return Grant(
        time=t or time.time(),
        container_id=cid,
        root=root,
        runtime="/usr/sbin/runc",
        bundle=f"/b/{cid}",
        source="envvar-uuids",
        gpus=tuple(gpus),
        shared=shared,
        namespace="ns" if pod else "",
        pod=pod,
        container="main" if pod else "",
    )


def well_formed(path: Path) -> List[dict]:
    """Every newline-terminated line parses as a record; returns them."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    assert lines[-1] == b"", f"journal does not end with a newline: {lines[-1][:80]!r}"
    docs = []
    for line in lines[:-1]:
        docs.append(json.loads(line))  # raises on a corrupt line
    return docs


def test_append_and_read_round_trip(tmp_path: Path) -> None:
    """Appended records read back in order, each one line; the directory is created."""
    path = tmp_path / "sub" / "grants.jsonl"
    append_grant(str(path), grant("a"), 1 << 20)
    append_grant(str(path), grant("b", (UUID_A, UUID_B), shared=True), 1 << 20)
    got = read_grants(str(path))
    assert [g.container_id for g in got] == ["a", "b"]
    assert got[1].gpus == (UUID_A, UUID_B) and got[1].shared
    assert len(well_formed(path)) == 2


def test_torn_last_line_is_skipped_and_repaired(tmp_path: Path) -> None:
    """A record cut short by a crash is skipped; the next append starts a new line, so nothing is glued onto it."""
    path = tmp_path / "grants.jsonl"
    append_grant(str(path), grant("a"), 1 << 20)
    whole = grant("torn").to_line()
    with open(path, "ab") as fh:
        fh.write(whole[: len(whole) // 2])  # what a crash mid-write could leave
    assert [g.container_id for g in read_grants(str(path))] == ["a"]
    append_grant(str(path), grant("c"), 1 << 20)
    assert [g.container_id for g in read_grants(str(path))] == ["a", "c"]
    lines = path.read_bytes().split(b"\n")
    assert lines[1] == whole[: len(whole) // 2]  # the fragment stands alone on its line


def test_append_is_not_fsynced_but_compaction_is(tmp_path: Path, monkeypatch) -> None:
    """An append (every GPU create) pays no fsync; a compaction, which replaces old records, does."""
    synced: List[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    path = tmp_path / "grants.jsonl"
    for i in range(20):
        append_grant(str(path), grant(f"c{i}", t=time.time() - 3600), 1 << 20)
    assert synced == []
    append_grant(str(path), grant("new"), 512)  # past max-bytes: compacted first
    assert synced, "compaction must be durable"
    assert [g.container_id for g in read_grants(str(path))] == ["new"]


def test_foreign_and_corrupt_lines_are_skipped(tmp_path: Path) -> None:
    """Lines that are not our records (garbage, other JSON, wrong types) are ignored, not fatal."""
    path = tmp_path / "grants.jsonl"
    path.write_bytes(
        b'garbage\n{"v": 1}\n[1,2]\n{"v":1,"t":1,"id":"x","root":"/r","runtime":"r",'
        b'"source":"s","gpus":"notalist"}\n' + grant("ok").to_line()
    )
    assert [g.container_id for g in read_grants(str(path))] == ["ok"]


def test_a_line_nested_past_the_recursion_limit_is_skipped(tmp_path: Path) -> None:
    """A foreign line nested deeper than the JSON decoder can recurse is skipped like any
    other; it raised RecursionError out of `nvshim grants` and out of compaction, which
    runs inside create once the journal is over grants-journal-max-bytes."""
    path = tmp_path / "grants.jsonl"
    path.write_bytes(b"[" * 100000 + b"\n" + grant("ok").to_line())
    assert [g.container_id for g in read_grants(str(path))] == ["ok"]
    append_grant(str(path), grant("next"), 1)  # over the limit: compacts
    assert [d["id"] for d in well_formed(path)] == ["ok", "next"]


def test_compaction_keeps_existing_containers_and_new_records(tmp_path: Path) -> None:
    """Past max-bytes the journal is rewritten with only live (state dir exists) or young records."""
    root = tmp_path / "runc-root"
    (root / "alive").mkdir(parents=True)
    path = tmp_path / "grants.jsonl"
    old = time.time() - 3600
    for i in range(300):
        append_grant(str(path), grant(f"dead-{i}", root=str(root), t=old), 1 << 30)
    append_grant(str(path), grant("alive", root=str(root), t=old), 1 << 30)
    big = path.stat().st_size
    append_grant(str(path), grant("new", root=str(root)), 4096)
    assert path.stat().st_size < big / 50
    assert [g.container_id for g in read_grants(str(path))] == ["alive", "new"]
    well_formed(path)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".grants")], "temp file left"


def test_concurrent_appends_with_compaction_lose_nothing(tmp_path: Path) -> None:
    """Several processes appending while the file is compacted under them: every young record survives."""
    path = tmp_path / "grants.jsonl"
    code = (
        "import sys, time\n"
        "from nvshim.runtime.grants import Grant, append_grant\n"
        "for i in range(60):\n"
        "    g = Grant(time=time.time(), container_id=f'{sys.argv[2]}-{i}', root='/nonexistent',"
        " runtime='runc', bundle='', source='env', gpus=('GPU-x',))\n"
        "    append_grant(sys.argv[1], g, 2048)\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), f"w{n}"]) for n in range(4)]
    for p in procs:
        assert p.wait(60) == 0
    ids = {g.container_id for g in read_grants(str(path))}
    assert ids == {f"w{n}-{i}" for n in range(4) for i in range(60)}
    well_formed(path)


def _young_records(path: Path, count: int) -> None:
    """``count`` young records of containers that do not exist: compaction keeps them all."""
    path.write_bytes(
        b"".join(
            Grant(
                time=time.time(),
                container_id=f"young-{i}",
                root="/nonexistent",
                runtime="runc",
                bundle="/b" * 40,
                source="env",
                gpus=(UUID_A,),
            ).to_line()
            for i in range(count)
        )
    )


def test_200_concurrent_appends_to_a_journal_that_cannot_shrink_all_succeed(tmp_path: Path) -> None:
    """Issue 28 item 8: 200 concurrent appends (40 processes) to a journal past max-bytes whose
    records are all young, so no compaction can shrink it, every one succeed and are kept;
    they failed with "the file keeps being replaced" and "Bad file descriptor"."""
    path = tmp_path / "grants.jsonl"
    _young_records(path, 400)
    assert path.stat().st_size > 65536
    code = (
        "import sys, time\n"
        "from nvshim.runtime.grants import Grant, append_grant\n"
        "from nvshim.errors import HostError\n"
        "failed = []\n"
        "while time.time() < float(sys.argv[3]):\n"  # all start together, as a burst does
        "    time.sleep(0.001)\n"
        "for i in range(5):\n"
        "    g = Grant(time=time.time(), container_id=f'{sys.argv[2]}-{i}', root='/nonexistent',"
        " runtime='runc', bundle='/b' * 40, source='env', gpus=('GPU-x',))\n"
        "    try:\n"
        "        warning = append_grant(sys.argv[1], g, 65536)\n"
        "    except HostError as exc:\n"
        "        failed.append(str(exc))\n"
        "    else:\n"
        "        assert warning is None, warning\n"
        "print('\\n'.join(failed), end='')\n"
    )
    start = str(time.time() + 5)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(path), f"w{n}", start],
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(40)
    ]
    errors = [p.communicate(timeout=300)[0] for p in procs]
    assert "".join(errors) == ""
    assert [p.returncode for p in procs] == [0] * 40
    ids = {g.container_id for g in read_grants(str(path))}
    assert {f"w{n}-{i}" for n in range(40) for i in range(5)} <= ids
    assert len(ids) == 600
    well_formed(path)


def test_a_journal_that_cannot_shrink_is_not_rewritten(tmp_path: Path) -> None:
    """Past max-bytes with every record young, an append leaves the file in place (same
    inode, no rewrite) and adds its line: a burst is not one rewrite per create."""
    path = tmp_path / "grants.jsonl"
    _young_records(path, 400)
    inode = path.stat().st_ino
    assert append_grant(str(path), grant("next"), 65536) is None
    assert path.stat().st_ino == inode
    assert [g.container_id for g in read_grants(str(path))][-1] == "next"
    assert len(read_grants(str(path))) == 401


def test_a_compaction_that_cannot_write_still_appends_the_record(
    tmp_path: Path, monkeypatch
) -> None:
    """A compaction that fails (its new file cannot be written: disk full) never fails the
    create: the record is appended to the journal as it is, and a warning says why."""
    import nvshim.files
    from nvshim.errors import HostError

    path = tmp_path / "grants.jsonl"
    for i in range(20):
        append_grant(str(path), grant(f"old{i}", t=time.time() - 3600), 1 << 20)

    def disk_full(target: str, data: bytes, **_: object) -> None:
        raise HostError(f"cannot write {target}: No space left on device")

    monkeypatch.setattr(nvshim.files, "write_atomic", disk_full)
    warning = append_grant(str(path), grant("new"), 512)
    assert warning == (
        f"cannot compact {path} (record appended): cannot write {path}: No space left on device"
    )
    assert [g.container_id for g in read_grants(str(path))] == [f"old{i}" for i in range(20)] + [
        "new"
    ]
    well_formed(path)


def test_kill_9_of_a_writer_never_leaves_a_corrupt_line(tmp_path: Path) -> None:
    """A writer appending in a loop is SIGKILLed 40 times at random moments; the journal stays whole lines."""
    path = tmp_path / "grants.jsonl"
    code = (
        "import sys, time\n"
        "from nvshim.runtime.grants import Grant, append_grant\n"
        "i = 0\n"
        "while True:\n"
        "    g = Grant(time=time.time(), container_id=f'k-{i}', root='/nonexistent', runtime='runc',"
        " bundle='/b' * 200, source='env', gpus=tuple(f'GPU-{n}' for n in range(40)))\n"
        "    append_grant(sys.argv[1], g, 1 << 16)\n"
        "    i += 1\n"
    )
    rng = random.Random(7)
    for _ in range(40):
        proc = subprocess.Popen([sys.executable, "-c", code, str(path)])
        time.sleep(0.05 + rng.random() * 0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if path.exists() and path.stat().st_size:
            well_formed(path)
    assert len(read_grants(str(path))) > 40


def test_kill_9_of_the_runtime_during_create(tmp_path: Path) -> None:
    """``nvshim-runtime create`` on a GPU request, SIGKILLed at 40 points from start to end: whole records only."""
    if os.geteuid() != 0:
        pytest.skip("the simulated GPU node needs root (mknod)")
    from nvshim.node.compile import compile_node
    from nvshim.sim.build import create_node
    from tests.helpers.bundle import make_bundle, make_rootfs

    node = create_node(str(tmp_path / "node"), gpus=2)
    journal = tmp_path / "grants.jsonl"
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"runtimes: [/bin/true]\ndriver-root: {node.root}\ngrants-journal: {journal}\n")
    compile_node(str(cfg))
    rootfs = make_rootfs(tmp_path / "rootfs")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVSHIM_CONFIG": str(cfg)}
    argv = [sys.executable, "-I", "-m", "nvshim.runtime.main", "create", "--bundle"]

    def fresh_bundle(n: int) -> Path:
        return make_bundle(
            tmp_path / f"b{n}", rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "0"}
        )

    start = time.monotonic()
    subprocess.run(argv + [str(fresh_bundle(0)), "c0"], env=env, check=True, cwd=tmp_path)
    full = time.monotonic() - start
    rng = random.Random(11)
    for n in range(1, 41):
        bundle = fresh_bundle(n)
        proc = subprocess.Popen(argv + [str(bundle), f"c{n}"], env=env, cwd=tmp_path)
        time.sleep(full * n / 40 * (0.8 + rng.random() * 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        well_formed(journal)
    ids = [g.container_id for g in read_grants(str(journal))]
    assert ids[0] == "c0" and len(ids) == len(set(ids))


def test_conflicts_ignore_replica_grants() -> None:
    """Two live holders of one GPU conflict unless both grants named time-slicing replicas."""
    a, b = Holder(grant("a"), "running", 1), Holder(grant("b"), "created", 2)
    assert set(conflicts([a, b])) == {UUID_A}
    sa = Holder(grant("a", shared=True), "running", 1)
    sb = Holder(grant("b", shared=True), "running", 2)
    assert conflicts([sa, sb]) == {}
    assert set(conflicts([sa, b])) == {UUID_A}  # one exclusive claim spoils the sharing
    table = render_table([a, b])
    assert "CONFLICT" in table and f"conflict: {UUID_A} is held by 2 live containers" in table


def test_prometheus_text_has_one_sample_per_gpu_and_container() -> None:
    """The textfile lines carry gpu, namespace, pod and container labels, escaped."""
    h = Holder(grant("c1", (UUID_A, UUID_B), pod='we"ird'), "running", 1)
    text = render_prometheus([h])
    assert (
        f'nvshim_gpu_grants{{gpu="{UUID_A}",namespace="ns",pod="we\\"ird",container="main"' in text
    )
    assert text.count("nvshim_gpu_grants{") == 2
    assert "nvshim_gpu_grant_conflicts{" not in text


def nvshim_grants(*args: str, env: Optional[dict] = None) -> "subprocess.CompletedProcess[str]":
    """``nvshim grants ARGS`` as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "nvshim.cli.main", "grants", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_grants_help_names_file_metavars() -> None:
    """`nvshim grants --help` documents its options, each path option taking a FILE."""
    res = nvshim_grants("--help")
    assert res.returncode == 0
    for flag in ("--journal FILE", "--format", "--prometheus FILE", "--config FILE"):
        assert flag in res.stdout, res.stdout


def test_a_missing_journal_named_with_journal_is_an_error(tmp_path: Path) -> None:
    """`grants --journal <missing>` printed an empty list and exited 0 (a typo looked like
    "no GPU is held"); now one line naming the path, exit 1, nothing on stdout."""
    missing = tmp_path / "none.jsonl"
    for fmt in ("text", "json"):
        res = nvshim_grants("--journal", str(missing), "--format", fmt)
        assert res.returncode == 1 and res.stdout == ""
        assert res.stderr == f"nvshim: grant journal {missing} does not exist\n"


def test_the_configured_journal_not_yet_written_means_no_grants(tmp_path: Path) -> None:
    """The config's grants-journal that does not exist yet (no GPU granted on this node so
    far) is no error: stderr says so, stdout has the header or the empty JSON, exit 0."""
    journal = tmp_path / "grants.jsonl"
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"grants-journal: {journal}\ndriver-root: {tmp_path}\n")
    res = nvshim_grants("--config", str(cfg), "--format", "json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"grants": [], "conflicts": {}}
    assert (
        res.stderr == f"nvshim: no grants yet: {journal} does not exist (nvshim-runtime "
        "creates it at the first GPU grant)\n"
    )
    res = nvshim_grants("--config", str(cfg))
    assert res.returncode == 0 and res.stdout.split() == [
        "GPU",
        "UUID",
        "CONTAINER",
        "POD",
        "SOURCE",
        "VERIFIED",
        "STATUS",
        "NOTE",
    ]


def test_a_journal_of_garbage_is_an_error_naming_its_lines(tmp_path: Path) -> None:
    """A non-empty file with no grant record in it (the wrong file passed as --journal)
    showed only a header, exit 0; now one line naming the file and its unreadable lines."""
    path = tmp_path / "grants.jsonl"
    path.write_text('garbage\n\n{"v": 1}\nnot json either')  # line 4 has no newline
    res = nvshim_grants("--journal", str(path))
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr == (
        f"nvshim: {path} holds no grant record, only 3 unreadable lines "
        "(1,3-4): is it the grant journal?\n"
    )
    path.write_text("\n\n")  # blank lines: an empty journal, not garbage
    res = nvshim_grants("--journal", str(path), "--format", "json")
    assert res.returncode == 0 and res.stderr == ""
    assert json.loads(res.stdout) == {"grants": [], "conflicts": {}}


def test_a_missing_config_named_with_config_is_an_error(tmp_path: Path) -> None:
    """`grants --config <missing>` read the defaults instead (as `config show` no longer
    does): one line naming the file, exit 1."""
    journal = tmp_path / "grants.jsonl"
    journal.write_bytes(b"")
    missing = tmp_path / "none.yaml"
    res = nvshim_grants("--config", str(missing), "--journal", str(journal))
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr == f"nvshim: config {missing} does not exist\n"


def fake_runtime(tmp_path: Path) -> str:
    """A runtime whose ``state`` says every container is running (pid 4242)."""
    path = tmp_path / "fake-runc"
    path.write_text('#!/bin/sh\necho \'{"status": "running", "pid": 4242}\'\n')
    path.chmod(0o755)
    return str(path)


def live_grant(tmp_path: Path, cid: str, gpus: Sequence[str]) -> bytes:
    """A journal line for container ``cid`` holding ``gpus``, which the fake runtime keeps
    live (its state directory exists under the root)."""
    root = tmp_path / "runc-root"
    (root / cid).mkdir(parents=True, exist_ok=True)
    return Grant(
        time=time.time(),
        container_id=cid,
        root=str(root),
        runtime=fake_runtime(tmp_path),
        bundle=f"/b/{cid}",
        source="envvar-uuids",
        gpus=tuple(gpus),
    ).to_line()


def test_unreadable_lines_among_records_are_skipped_with_a_warning(tmp_path: Path) -> None:
    """Records are listed; the lines that are not records are counted and numbered in one
    warning on stderr naming the journal (they were skipped without a word)."""
    path = tmp_path / "grants.jsonl"
    path.write_bytes(
        b"garbage\n"
        + live_grant(tmp_path, "c1", [UUID_A])
        + b"[1]\n"
        + b"{not json\n"
        + live_grant(tmp_path, "c2", [UUID_B])
    )
    res = nvshim_grants(
        "--journal",
        str(path),
        "--format",
        "json",
        env=dict(os.environ, NVSHIM_CONFIG=str(tmp_path / "none.yaml")),
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr == f"nvshim: warning: {path}: skipped 3 unreadable lines (1,3-4)\n"
    doc = json.loads(res.stdout)
    assert [(g["container_id"], g["status"], g["pid"]) for g in doc["grants"]] == [
        ("c1", "running", 4242),
        ("c2", "running", 4242),
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="the simulated GPU node needs root (mknod)")
def test_grants_show_each_gpus_index_on_this_node(tmp_path: Path) -> None:
    """Each granted GPU is shown by its index as nvidia-smi numbers it, beside its UUID (the
    table showed UUIDs only): the text's GPU column and JSON's gpu_indices, aligned with
    gpus; a UUID the node does not have (any more) is `?` / null."""
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=3)
    g1, g2 = node.gpus[1].uuid, node.gpus[2].uuid
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"driver-root: {node.root}\ngrants-journal: {tmp_path / 'grants.jsonl'}\n")
    (tmp_path / "grants.jsonl").write_bytes(
        live_grant(tmp_path, "two", [g2, g1]) + live_grant(tmp_path, "gone", [UUID_A])
    )
    res = nvshim_grants("--config", str(cfg), "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = {g["container_id"]: g for g in json.loads(res.stdout)["grants"]}
    assert doc["two"]["gpus"] == [g2, g1] and doc["two"]["gpu_indices"] == ["2", "1"]
    assert doc["gone"]["gpu_indices"] == [None]
    res = nvshim_grants("--config", str(cfg))
    assert res.returncode == 0, res.stderr
    rows = [line.split()[:3] for line in res.stdout.splitlines()[1:]]
    assert rows == [["1", g1, "two"], ["2", g2, "two"], ["?", UUID_A, "gone"]]


def test_a_fifo_as_journal_is_refused_by_writer_and_reader(tmp_path: Path) -> None:
    """A FIFO at the configured path (a careless grants-journal) swallowed every record the
    runtime appended, and `nvshim grants` blocked forever waiting for a writer. Both now
    refuse it in one line, at once."""
    from nvshim.errors import HostError

    fifo = tmp_path / "grants.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(HostError, match=r"grants\.jsonl is a FIFO"):
        append_grant(str(fifo), grant("c1"), 1 << 20)
    with pytest.raises(HostError, match=r"grants\.jsonl is a FIFO"):
        read_grants(str(fifo))
    res = subprocess.run(
        [sys.executable, "-m", "nvshim.cli.main", "grants", "--journal", str(fifo)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert res.returncode == 1
    assert res.stderr.count("\n") == 1 and "is a FIFO" in res.stderr
    assert res.stdout == ""


def test_a_directory_as_journal_is_refused_by_the_writer(tmp_path: Path) -> None:
    from nvshim.errors import HostError

    (tmp_path / "grants.jsonl").mkdir()
    with pytest.raises(HostError, match="cannot record the grant"):
        append_grant(str(tmp_path / "grants.jsonl"), grant("c1"), 1 << 20)


#: What a container controls, as an attack writes it: a line break that forges a row, a
#: carriage return, an ANSI colour, a C1 NEL, a Unicode line separator, a bidi override.
HOSTILE = "x\n0  GPU-forged  granted\r\x1b[32mok\x1b[0m\x85\u2028\u202e"


def printable_lines(text: str) -> List[str]:
    lines = text.split("\n")
    assert all(line.isprintable() for line in lines), [ln for ln in lines if not ln.isprintable()]
    return lines


def test_a_grant_record_caps_and_escapes_what_the_container_controls(tmp_path: Path) -> None:
    """A grant's pod names (annotations: a container run by hand can write any) are escaped
    and cut to 253 characters before they are journaled, so a record stays small and
    parses back without a control character; the engine's id, root and bundle stay exact."""
    path = tmp_path / "grants.jsonl"
    big = Grant(
        time=time.time(),
        container_id="c1",
        root="/run/runc",
        runtime="runc",
        bundle="/b/c1",
        source="envvar-uuids",
        gpus=(UUID_A,),
        namespace=HOSTILE,
        pod="p" * 300_000 + HOSTILE,
        pod_uid=HOSTILE,
        container=HOSTILE,
        claims=((HOSTILE * 1000, (UUID_A,)),),
    )
    append_grant(str(path), big, 1 << 20)
    assert path.stat().st_size < 2048
    [got] = read_grants(str(path))
    assert (got.container_id, got.root, got.bundle, got.gpus) == (
        "c1",
        "/run/runc",
        "/b/c1",
        (UUID_A,),
    )
    for value in (got.namespace, got.pod, got.pod_uid, got.container, got.claims[0][0]):
        assert value.isprintable() and len(value) <= 253
    assert got.namespace.startswith("x\\n0  GPU-forged  granted\\r\\x1b[32m")
    assert got.pod.startswith("ppp") and got.pod.endswith("more characters)")


def test_the_grants_table_escapes_every_value_of_a_record(tmp_path: Path) -> None:
    """`nvshim grants` prints each record on its own row whatever its values hold (a record
    written by hand or by an older nvshim): control characters, line separators and bidi
    overrides are escaped, never printed."""
    forged = Grant(
        time=time.time(),
        container_id="c\rid",
        root="/r",
        runtime="runc",
        bundle="/b",
        source="env\x1b[2K",
        gpus=(UUID_A,),
        namespace="ns",
        pod=HOSTILE,
        container="main",
    )
    table = render_table([Holder(forged, "running", 1), Holder(grant("b"), "running", 2)])
    lines = printable_lines(table)
    assert len(lines) == 5  # header, two rows, blank, the conflict line
    assert (
        "x\\n0  GPU-forged  granted\\r\\x1b[32mok\\x1b[0m\\x85\\u2028\\u202e" in lines[1] + lines[2]
    )
    assert "c\\rid" in lines[-1]
