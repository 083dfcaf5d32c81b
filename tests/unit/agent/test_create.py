"""The runtime's create through the resident agent: the trampoline, the C client and the
agent together, with a recorder standing in for runc, on a simulated GPU node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvshim.agent.protocol import Request, encode_reply, parse_request
from tests.helpers.agent import AgentProcess, built_client, fake_agent

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="simulated nodes need mknod")
pytestmark = needs_root


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C client, built from this checkout's source."""
    return built_client(tmp_path_factory.mktemp("client"))


class World:
    """A 2-GPU simulated node, a compiled config, the trampoline and a recorder runtime."""

    def __init__(self, tmp: Path, client: Path) -> None:
        from nvshim.node.compile import compile_node
        from nvshim.node.install.trampoline import render
        from nvshim.sim.build import create_node

        self.tmp = tmp
        self.node = create_node(str(tmp / "node"), gpus=2)
        self.rec = tmp / "rec"
        self.runtime = tmp / "fake-runc"
        self.runtime.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" >> {self.rec}\n")
        self.runtime.chmod(0o755)
        self.config = tmp / "etc" / "config.yaml"
        self.config.parent.mkdir()
        self.write_config()
        compile_node(str(self.config))
        self.socket = tmp / "agent.sock"
        self.tramp = tmp / "nvshim-runtime"
        self.tramp.write_text(
            render(sys.executable, agent_socket=str(self.socket), client=str(client))
        )
        self.tramp.chmod(0o755)
        self.env = {"PATH": "/usr/bin:/bin", "NVSHIM_CONFIG": str(self.config)}
        self.log = tmp / "runc.log"

    def write_config(self, extra: str = "") -> None:
        self.config.write_text(
            f"runtimes: [{self.runtime}]\ndriver-root: {self.node.root}\n"
            f"grants-journal: {self.tmp}/grants.jsonl\n{extra}"
        )

    def agent(self, name: str = "agent") -> AgentProcess:
        return AgentProcess(self.socket, self.config, self.tmp / f"{name}.log").start()

    def bundle(self, name: str, visible: str = "0") -> Path:
        b = self.tmp / name
        (b / "rootfs").mkdir(parents=True)
        (b / "config.json").write_text(
            json.dumps(
                {
                    "ociVersion": "1.0.2",
                    "root": {"path": "rootfs"},
                    "process": {
                        "args": ["true"],
                        "cwd": "/",
                        "env": [f"NVIDIA_VISIBLE_DEVICES={visible}"],
                    },
                }
            )
        )
        return b

    def create(
        self, bundle: Path, env: Optional[Dict[str, str]] = None, cwd: Optional[Path] = None
    ) -> subprocess.CompletedProcess[str]:
        where = os.path.relpath(bundle, cwd) if cwd is not None else str(bundle)
        return subprocess.run(
            [str(self.tramp), "--log", str(self.log), "create", "--bundle", where, bundle.name],
            env=env or self.env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
        )


def spec(bundle: Path) -> Dict[str, Any]:
    doc: Dict[str, Any] = json.loads((bundle / "config.json").read_text())
    return doc


def served_by(bundle: Path) -> str:
    return spec(bundle).get("annotations", {}).get("nvshim.io/served-by", "runtime")


@pytest.fixture
def world(tmp_path: Path, client: Path) -> World:
    return World(tmp_path, client)


def test_agent_serves_a_gpu_create_with_the_runtimes_edits(world: World) -> None:
    """With an agent up, a GPU create is served by it (no Python start) and config.json
    gets exactly the edits the in-process create gives, then runc runs with the same argv."""
    python_bundle, agent_bundle = world.bundle("py"), world.bundle("ag")
    assert world.create(python_bundle).returncode == 0
    agent = world.agent()
    try:
        res = world.create(agent_bundle)
    finally:
        agent.stop()
    assert res.returncode == 0 and res.stderr == ""
    assert served_by(agent_bundle) == "agent" and served_by(python_bundle) == "runtime"
    a, p = spec(agent_bundle), spec(python_bundle)
    del a["annotations"]["nvshim.io/served-by"]
    assert json.dumps(a).replace("/ag/", "/py/") == json.dumps(p)
    assert world.rec.read_text().splitlines()[-6:] == [
        "--log",
        str(world.log),
        "create",
        "--bundle",
        str(agent_bundle),
        "ag",
    ]


def test_agent_resolves_a_relative_bundle_against_the_callers_cwd(world: World) -> None:
    """``--bundle`` relative to the caller's working directory is served on that bundle."""
    b = world.bundle("rel")
    with_agent = world.agent()
    try:
        res = world.create(b, cwd=world.tmp)
    finally:
        with_agent.stop()
    assert res.returncode == 0, res.stderr
    assert served_by(b) == "agent"


def test_agent_refusal_is_the_creates_refusal_in_one_line(world: World) -> None:
    """An agent's refusal: exit 1, the same one line as the in-process create's on stderr
    and in --log, config.json byte-identical, runc never run."""
    without = world.bundle("py", visible="7")
    res_py = world.create(without)
    log_py = world.log.read_text()
    world.log.unlink()
    b = world.bundle("ag", visible="7")
    before = (b / "config.json").read_bytes()
    agent = world.agent()
    try:
        res = world.create(b)
    finally:
        agent.stop()
    assert res.returncode == res_py.returncode == 1
    assert res.stderr == res_py.stderr  # the line names the node and config, not the bundle
    assert res.stderr.count("\n") == 1
    assert world.log.read_text().split("msg=")[1] == log_py.split("msg=")[1]
    assert (b / "config.json").read_bytes() == before
    assert not world.rec.exists()


def test_no_agent_or_another_config_falls_back_to_python(world: World, tmp_path: Path) -> None:
    """No agent on the socket, or an agent serving another config file: the in-process
    create runs (config.json edited, not by the agent)."""
    b1 = world.bundle("noagent")
    assert world.create(b1).returncode == 0
    assert served_by(b1) == "runtime" and spec(b1)["linux"]["devices"]
    other = tmp_path / "other" / "config.yaml"
    other.parent.mkdir()
    other.write_bytes(world.config.read_bytes())
    from nvshim.node.compile import compile_node

    compile_node(str(other))
    agent = AgentProcess(world.socket, other, tmp_path / "other.log").start()
    try:
        b2 = world.bundle("otherconfig")
        res = world.create(b2)
    finally:
        agent.stop()
    assert res.returncode == 0, res.stderr
    assert served_by(b2) == "runtime" and spec(b2)["linux"]["devices"]


def test_agent_restarted_with_another_config_serves_it(world: World) -> None:
    """An agent restarted after the config changed serves the new config: a setting the
    new config adds shows in the next create it serves."""
    agent = world.agent()
    try:
        b1 = world.bundle("one")
        assert world.create(b1).returncode == 0 and served_by(b1) == "agent"
    finally:
        agent.stop()
    world.write_config("require-allocation: true\nallocation-sources: [volume-mounts]\n")
    from nvshim.node.compile import compile_node

    compile_node(str(world.config))
    agent = world.agent("agent2")
    try:
        b2 = world.bundle("two")
        res = world.create(b2)
    finally:
        agent.stop()
    # require-allocation without an allocation strips the request: the new config's rule
    assert res.returncode == 0, res.stderr
    assert served_by(b2) == "agent"
    assert "NVIDIA_VISIBLE_DEVICES=void" in spec(b2)["process"]["env"]


def test_agent_serves_a_config_edited_while_it_runs(world: World) -> None:
    """A config edited and compiled while the agent runs: the next create is served with
    the new generation (the agent reloads), not with the old config."""
    agent = world.agent()
    try:
        world.write_config("require-allocation: true\nallocation-sources: [volume-mounts]\n")
        from nvshim.node.compile import compile_node

        compile_node(str(world.config))
        b = world.bundle("edited")
        res = world.create(b)
    finally:
        agent.stop()
    assert res.returncode == 0, res.stderr
    assert "NVIDIA_VISIBLE_DEVICES=void" in spec(b)["process"]["env"]


def test_two_hundred_concurrent_creates_through_one_agent(world: World) -> None:
    """200 concurrent GPU creates through one agent: every one served by it, every
    config.json whole, one journal record each."""
    bundles = [world.bundle(f"c{i}", visible=str(i % 2)) for i in range(200)]
    agent = world.agent()
    try:
        with ThreadPoolExecutor(max_workers=200) as pool:
            results = list(pool.map(world.create, bundles))
    finally:
        agent.stop()
    assert [r.stderr for r in results if r.returncode != 0] == []
    assert {served_by(b) for b in bundles} == {"agent"}
    from nvshim.runtime.grants import read_grants

    records = read_grants(str(world.tmp / "grants.jsonl"))
    assert sorted(r.container_id for r in records) == sorted(b.name for b in bundles)


def test_agent_killed_mid_creates_each_completes_or_fails_in_one_line(world: World) -> None:
    """SIGKILL to the agent in the middle of 50 concurrent creates: each create completes
    (through the agent or the in-process fallback) or fails in one line; every config.json
    is whole JSON (a temp file the killed agent left is never config.json); the journal
    holds only whole records."""
    bundles = [world.bundle(f"k{i}", visible=str(i % 2)) for i in range(50)]
    agent = world.agent()
    started = threading.Event()

    def create(b: Path) -> subprocess.CompletedProcess[str]:
        started.set()
        return world.create(b)

    assert agent.proc is not None
    try:
        with ThreadPoolExecutor(max_workers=50) as pool:
            futures = [pool.submit(create, b) for b in bundles]
            started.wait(10)
            for done in futures[:5]:
                done.result()
            agent.proc.send_signal(signal.SIGKILL)
            results = [f.result() for f in futures]
    finally:
        agent.stop()
    for r in results:
        assert r.returncode == 0 or r.stderr.count("\n") == 1, r.stderr
    assert sum(r.returncode == 0 for r in results) >= 45
    for b in bundles:
        spec(b)  # whole JSON
        # a temp file only the killed agent may have left (the next write removes it)
        assert {p.name for p in b.glob(".config.json.nvshim-*")} <= {
            f".config.json.nvshim-{agent.proc.pid}"
        }
    from nvshim.runtime.grants import read_grants

    journal = world.tmp / "grants.jsonl"
    lines = journal.read_bytes().splitlines()
    assert all(json.loads(line) for line in lines)
    assert len(read_grants(str(journal))) == len(lines)


# --- the C client alone ---------------------------------------------------------------


def _run_client(
    client: Path, sock: Path, bundle: Path, config: Path, *argv: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(client), str(sock), "0.1.0", str(config), "/usr/bin/runc", str(bundle), *argv],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=30,
    )


@pytest.mark.parametrize(
    "reply,rc,stderr",
    [
        (encode_reply("ok"), 0, ""),
        (encode_reply("refused", 'unknown device "7"'), 1, 'nvshim: unknown device "7"\n'),
        (encode_reply("fallback", "why"), 2, ""),
        (encode_reply("ready"), 2, ""),
        (b"nvshim-agent 2\0ok\0\0", 2, ""),
        (b"nvshim-agent 1\0ok\0", 2, ""),
        (b"nvshim-agent 1\0ok\0\0extra\0", 2, ""),
        (b"garbage", 2, ""),
        (None, 2, ""),
    ],
)
def test_client_sends_the_request_and_maps_the_reply(
    tmp_path: Path, client: Path, reply: Optional[bytes], rc: int, stderr: str
) -> None:
    """The client's request is what the agent's parser reads (with the bundle directory
    as the one descriptor); ok is exit 0, refused exit 1 with its line, anything else
    (another version, a malformed or missing reply) exit 2."""
    bundle = tmp_path / "b"
    bundle.mkdir()
    config = tmp_path / "c.yaml"
    config.write_text("{}\n")
    thread, seen = fake_agent(tmp_path / "s", reply)
    res = _run_client(
        client, tmp_path / "s", bundle, config, "create", "--bundle", str(bundle), "id"
    )
    thread.join(10)
    assert (res.returncode, res.stderr) == (rc, stderr)
    data, fds = seen[0]
    from nvshim.agent.state import generation_of

    assert parse_request(data, len(fds)) == Request(
        "create",
        "0.1.0",
        str(config),
        generation_of(str(config)),
        "/usr/bin/runc",
        os.getcwd(),
        str(bundle),
        ("create", "--bundle", str(bundle), "id"),
    )
    st = bundle.stat()
    assert (fds[0].st_dev, fds[0].st_ino) == (st.st_dev, st.st_ino)


def test_client_without_an_agent_exits_2(tmp_path: Path, client: Path) -> None:
    """No socket, a missing bundle, too few arguments: exit 2, nothing printed."""
    (tmp_path / "b").mkdir()
    res = _run_client(client, tmp_path / "none.sock", tmp_path / "b", tmp_path / "c")
    assert (res.returncode, res.stdout, res.stderr) == (2, "", "")
    res = _run_client(client, tmp_path / "none.sock", tmp_path / "missing", tmp_path / "c", "x")
    assert (res.returncode, res.stderr) == (2, "")
    res = subprocess.run([str(client)], capture_output=True, text=True)
    assert (res.returncode, res.stderr) == (2, "")


# --- inspect and doctor ---------------------------------------------------------------


def _nvshim(*args: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess[str]:
    from tests.helpers.agent import nvshim_bin

    return subprocess.run(
        nvshim_bin() + list(args), capture_output=True, text=True, timeout=120, env=env
    )


def test_inspect_says_which_path_served_a_create(world: World) -> None:
    """``nvshim inspect`` on a live bundle names the path that served its create: the
    agent's fast path, or nvshim-runtime's own Python."""
    py = world.bundle("py")
    assert world.create(py).returncode == 0
    agent = world.agent()
    try:
        ag = world.bundle("ag")
        assert world.create(ag).returncode == 0
    finally:
        agent.stop()
    shown = {
        b.name: _nvshim(
            "inspect", "--config", str(world.config), "--bundle", str(b), "--format", "json"
        )
        for b in (py, ag)
    }
    assert json.loads(shown["ag"].stdout)["served_by"] == "agent"
    assert json.loads(shown["py"].stdout)["served_by"] == "nvshim-runtime"
    text = _nvshim("inspect", "--config", str(world.config), "--bundle", str(ag)).stdout
    assert "served by:     the nvshim agent (fast path)" in text


def test_doctor_says_whether_the_agent_is_reachable(world: World) -> None:
    """doctor's agent check: skip without an agent (creates start Python, said with the
    fix), ok with one serving this config and a trampoline that has the client, warn for
    an agent serving another config."""
    from nvshim.node.doctor.agent import check_agent

    sock, conf, tramp = str(world.socket), str(world.config), str(world.tramp)
    finding = check_agent(sock, conf, tramp)
    assert finding.status == "skip" and "GPU creates start Python" in finding.message
    agent = world.agent()
    try:
        finding = check_agent(sock, conf, tramp)
        assert finding.status == "ok" and "GPU creates go through it" in finding.message
        other = check_agent(sock, str(world.tmp / "other.yaml"), tramp)
        assert other.status == "warn" and f"serves config {conf}" in other.message
        out = _nvshim(
            "doctor",
            "--config",
            conf,
            "--agent-socket",
            sock,
            "--trampoline",
            tramp,
            "--format",
            "json",
        )
        (mine,) = [f for f in json.loads(out.stdout) if f["check"] == "agent"]
        assert mine["status"] == "ok"
    finally:
        agent.stop()


def test_sigterm_lets_creates_in_flight_finish(world: World) -> None:
    """SIGTERM during 20 concurrent creates: the agent removes its socket, lets the creates
    it took finish, and exits 0; every create completes (the rest in-process)."""
    bundles = [world.bundle(f"t{i}") for i in range(20)]
    agent = world.agent()
    assert agent.proc is not None
    with ThreadPoolExecutor(max_workers=20) as pool:
        futures = [pool.submit(world.create, b) for b in bundles]
        futures[0].result()
        agent.proc.send_signal(signal.SIGTERM)
        results = [f.result() for f in futures]
    assert agent.proc.wait(30) == 0
    assert [r.stderr for r in results if r.returncode != 0] == []
    assert all(spec(b)["linux"]["devices"] for b in bundles)
    assert not world.socket.exists()


@settings(max_examples=40, deadline=None)
@given(
    st.binary(max_size=64)
    | st.builds(
        lambda status, msg: b"nvshim-agent 1\0" + status + b"\0" + msg + b"\0",
        st.sampled_from([b"ok", b"refused", b"fallback", b"ready", b"OK", b""]),
        st.binary(max_size=32),
    )
)
def test_client_reply_parser_fuzzed(
    client: Path, tmp_path_factory: pytest.TempPathFactory, reply: bytes
) -> None:
    """Any reply bytes: exit 0 only for a well-formed ``ok``, 1 only for a well-formed
    ``refused`` (its message on stderr), 2 for everything else."""
    tmp = tmp_path_factory.mktemp("fz")
    (tmp / "b").mkdir()
    thread, _ = fake_agent(tmp / "s", reply)
    res = _run_client(client, tmp / "s", tmp / "b", tmp / "c", "create", "x")
    thread.join(10)
    fields = reply.split(b"\0")
    well_formed = len(fields) == 4 and fields[0] == b"nvshim-agent 1" and fields[3] == b""
    expected = 2
    if well_formed and fields[1] == b"ok":
        expected = 0
    elif well_formed and fields[1] == b"refused":
        expected = 1
    assert res.returncode == expected
    assert (res.stderr != "") == (expected == 1)


def test_agent_plan_cache_sees_a_gpu_removed_and_added(world: World) -> None:
    """The agent's in-memory plan is dropped exactly when the on-disk plan cache is: GPU 1
    removed (procfs entry and device node), then added back, changes what
    NVIDIA_VISIBLE_DEVICES=all gets on the very next agent-served create."""
    import shutil

    def nodes(b: Path) -> List[str]:
        return sorted(
            d["path"]
            for d in spec(b)["linux"]["devices"]
            if d["path"][len("/dev/nvidia") :].isdigit()
        )

    gpus_dir = Path(world.node.root, "proc/driver/nvidia/gpus")
    entries = sorted(gpus_dir.iterdir())
    dev = Path(world.node.root, "dev/nvidia1")
    st = dev.stat()
    agent = world.agent()
    try:
        seen = []
        for step in ("both", "gone", "back"):
            if step == "gone":
                shutil.move(str(entries[1]), world.tmp / "gpu1")
                dev.unlink()
            elif step == "back":
                shutil.move(str(world.tmp / "gpu1"), entries[1])
                os.mknod(dev, st.st_mode, st.st_rdev)
            b = world.bundle(step, visible="all")
            assert world.create(b).returncode == 0
            seen.append((served_by(b), nodes(b)))
    finally:
        agent.stop()
    assert seen == [
        ("agent", ["/dev/nvidia0", "/dev/nvidia1"]),
        ("agent", ["/dev/nvidia0"]),
        ("agent", ["/dev/nvidia0", "/dev/nvidia1"]),
    ]


# --- what the agent checks before it serves a create -------------------------------------


def _serve(world: World, bundle: Path, held: Path, log: Any) -> Tuple[str, str]:
    """serve_create for ``create --bundle <bundle>`` from this process, with ``held`` as
    the directory descriptor the client opened."""
    from nvshim import __version__
    from nvshim.agent.create import serve_create
    from nvshim.agent.server import Peer
    from nvshim.agent.state import AgentState, generation_of

    state = AgentState(str(world.config), log)
    request = Request(
        "create",
        __version__,
        str(world.config),
        generation_of(str(world.config)),
        str(world.runtime),
        str(world.tmp),
        str(bundle),
        ("create", "--bundle", str(bundle), bundle.name),
    )
    fd = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return serve_create(state, request, fd, Peer(os.getpid(), 0, 0))
    finally:
        os.close(fd)


def test_agent_serves_only_the_bundle_directory_the_caller_opened(tmp_path: Path) -> None:
    """A bundle path that is no longer the directory the client opened (swapped for
    another between the client's open and the agent's check) is not served: fallback
    naming the bundle, its config.json byte-identical, nothing journaled; the same
    directory is served."""
    from tests.helpers.agent import RecordingLog

    world = World(tmp_path, tmp_path / "no-client")
    bundle = world.bundle("b")
    before = (bundle / "config.json").read_bytes()
    opened = bundle.rename(tmp_path / "opened")  # the directory the client opened ...
    world.bundle("b")  # ... and another one put at its path
    log = RecordingLog()
    assert _serve(world, bundle, opened, log) == (
        "fallback",
        f"bundle {bundle} is not the directory the caller opened",
    )
    assert (bundle / "config.json").read_bytes() == before
    assert not (tmp_path / "grants.jsonl").exists()
    assert [e for _lvl, e, _kw in log.lines][-1] == "create not served"
    assert _serve(world, bundle, bundle, RecordingLog()) == ("ok", "")
    assert (bundle / "config.json").read_bytes() != before


def test_agent_abandons_a_create_not_planned_within_its_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create whose plan is done later than DEADLINE seconds after it arrived (a clock
    that jumps past it) is abandoned before its first write: fallback (the caller runs
    its own create), config.json byte-identical, no grant journaled."""
    from nvshim.agent import create as agent_create

    class Clock:
        """time.monotonic: the arrival at 0, every later reading past the deadline."""

        def __init__(self) -> None:
            self.readings = 0

        def monotonic(self) -> float:
            self.readings += 1
            return 0.0 if self.readings == 1 else agent_create.DEADLINE + 0.5

    from tests.helpers.agent import RecordingLog

    world = World(tmp_path, tmp_path / "no-client")
    bundle = world.bundle("late")
    before = (bundle / "config.json").read_bytes()
    monkeypatch.setattr(agent_create, "time", Clock())
    assert _serve(world, bundle, bundle, RecordingLog()) == (
        "fallback",
        f"not planned within {agent_create.DEADLINE:g} s",
    )
    assert (bundle / "config.json").read_bytes() == before
    assert not (tmp_path / "grants.jsonl").exists()
