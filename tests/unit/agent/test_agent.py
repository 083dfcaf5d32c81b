"""``nvshim agent``'s life and socket: readiness, root-only peers, clean stop, bad requests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvshim.agent.protocol import (
    MAGIC,
    MAX_MESSAGE,
    ProtocolError,
    Request,
    encode_request,
    parse_reply,
    parse_request,
)
from nvshim.agent.server import ask
from nvshim.agent.state import generation_of
from tests.helpers.agent import AgentProcess, nvshim_bin, running_agent
from tests.helpers.common import wait_until

REPO = Path(__file__).resolve().parents[3]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the agent serves root peers only")


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_bytes((REPO / "config" / "config.yaml").read_bytes())
    return path


def _ready(sock: Path) -> "tuple[str, str]":
    return parse_reply(ask(str(sock), MAGIC + b"\0ready\0"))


@needs_root
def test_agent_answers_ready_and_removes_its_socket_on_sigterm(
    tmp_path: Path, config: Path
) -> None:
    """With --nri-socket none the agent is ready once its socket serves (saying which
    config and generation it serves); SIGTERM stops it with exit 0 and removes the socket
    and the folder it created for it."""
    agent = AgentProcess(tmp_path / "run" / "a.sock", config, tmp_path / "a.log").start()
    try:
        status, message = _ready(agent.socket)
        assert status == "ready"
        from nvshim import __version__

        assert json.loads(message) == {
            "config": str(config),
            "generation": generation_of(str(config)),
            "serving": True,
            "nri": "none",
            "version": __version__,
        }
        assert (agent.socket.stat().st_mode & 0o777) == 0o600
        probe = subprocess.run(
            nvshim_bin() + ["agent", "--socket", str(agent.socket), "--ready"],
            capture_output=True,
            text=True,
        )
        assert probe.returncode == 0, probe.stderr
    finally:
        assert agent.stop(signal.SIGTERM) == 0
    assert not agent.socket.exists()
    assert not (tmp_path / "run").exists()  # the folder it made for the socket
    assert '"agent stopped"' in agent.log.read_text()


@needs_root
def test_agent_ready_probe_fails_in_one_line_without_an_agent(tmp_path: Path) -> None:
    """``nvshim agent --ready`` on a socket nobody serves: exit 1, one line naming it."""
    probe = subprocess.run(
        nvshim_bin() + ["agent", "--socket", str(tmp_path / "x.sock"), "--ready"],
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 1
    assert probe.stderr.count("\n") == 1 and str(tmp_path / "x.sock") in probe.stderr


@needs_root
def test_agent_with_nri_requested_is_not_ready_until_registered(
    tmp_path: Path, config: Path
) -> None:
    """With an NRI socket named, ready waits for the plugin's registration: an agent that
    is not registered answers not-ready, naming the NRI socket."""
    with running_agent(tmp_path, config, nri_socket=str(tmp_path / "nri.sock")) as agent:
        status, message = _ready(agent.socket)
    assert status == "not-ready" and str(tmp_path / "nri.sock") in message


@needs_root
def test_agent_refuses_a_peer_that_is_not_root(tmp_path: Path, config: Path) -> None:
    """A peer with uid != 0 (SO_PEERCRED) gets ``fallback`` and its request is not parsed."""
    import shutil
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="nvshim-agent-"))  # tmp_path's parents are 0700
    try:
        _refuses_peer(where, config)
    finally:
        shutil.rmtree(where)


def _refuses_peer(where: Path, config: Path) -> None:
    with running_agent(where, config) as agent:
        os.chmod(where, 0o755)
        os.chmod(agent.socket, 0o666)  # let the unprivileged peer connect at all
        code = (
            "import sys; from nvshim.agent.server import ask; "
            "from nvshim.agent.protocol import parse_reply, MAGIC; "
            f"print(parse_reply(ask({str(agent.socket)!r}, MAGIC + b'\\0ready\\0')))"
        )
        # the peer needs only the standard library: the system's python3, which uid 65534 can
        # run (a venv of .ci/run's lies under a 0700 temp dir)
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        out = subprocess.run(
            [python, "-c", code],
            capture_output=True,
            text=True,
            user=65534,
            group=65534,
            cwd="/",
            env={"PYTHONPATH": str(REPO)},
        )
        assert out.returncode == 0, out.stderr
        assert "'fallback', 'peer uid 65534 is not root'" in out.stdout


@needs_root
def test_agent_answers_bad_requests_in_one_line_and_keeps_serving(
    tmp_path: Path, config: Path
) -> None:
    """Another protocol version, a truncated or oversized message: ``fallback`` with one
    line each, and the next request is served."""
    with running_agent(tmp_path, config) as agent:
        for payload in (
            b"nvshim-agent 2\0ready\0",
            b"nvshim-agent 1\0rea",
            MAGIC + b"\0create\0" + b"x" * (MAX_MESSAGE + 10) + b"\0",
        ):
            status, message = parse_reply(ask(str(agent.socket), payload))
            assert status == "fallback" and "\n" not in message
        assert _ready(agent.socket)[0] == "ready"
        assert "Traceback" not in agent.log.read_text()


def test_agent_help_names_its_options() -> None:
    """``nvshim agent --help`` documents --config, --socket, --nri-socket and the defaults."""
    out = subprocess.run(nvshim_bin() + ["agent", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for word in (
        "--config",
        "--socket",
        "--nri-socket",
        "/run/nvshim/agent.sock",
        "/var/run/nri/nri.sock",
        "none",
    ):
        assert word in out.stdout


# --- the request parser ---------------------------------------------------------------


def test_parse_request_reads_a_create_and_a_ready() -> None:
    """A create's fields come back as sent; ready takes no fields."""
    req = Request(
        "create",
        "0.1.0",
        "/etc/nvshim/config.yaml",
        "1:2:3:4",
        "/usr/bin/runc",
        "/run/x",
        "b",
        ("create", "--bundle", "b", "id"),
    )
    assert parse_request(encode_request(req), 1) == req
    assert parse_request(MAGIC + b"\0ready\0", 0) == Request("ready")


@pytest.mark.parametrize(
    "data,fds,says",
    [
        (b"", 0, "NUL"),
        (MAGIC + b"\0ready", 0, "NUL"),
        (b"nvshim-agent 9\0ready\0", 0, "unknown protocol"),
        (MAGIC + b"\0dance\0", 0, "unknown operation"),
        (MAGIC + b"\0ready\0", 1, "no descriptor"),
        (MAGIC + b"\0create\0v\0/c\0g\0/r\0/cwd\0b\0create\0", 0, "descriptor"),
        (MAGIC + b"\0create\0v\0/c\0g\0/r\0/cwd\0b\0", 1, "fields"),
        (MAGIC + b"\0create\0v\0c\0g\0/r\0/cwd\0b\0create\0", 1, "config"),
        (MAGIC + b"\0create\0v\0/c\0g\0/r\0cwd\0b\0create\0", 1, "cwd"),
        (MAGIC + b"\0" + b"\0" * 5000, 0, "fields"),
    ],
)
def test_parse_request_refuses_in_one_line(data: bytes, fds: int, says: str) -> None:
    """Each malformed request is one ProtocolError line naming what is wrong."""
    with pytest.raises(ProtocolError, match=says) as info:
        parse_request(data, fds)
    assert "\n" not in str(info.value)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=512), st.integers(min_value=0, max_value=4))
def test_parse_request_never_raises_anything_else(data: bytes, fds: int) -> None:
    """Arbitrary bytes: a Request or a one-line ProtocolError, never another exception."""
    for payload in (data, MAGIC + b"\0" + data, MAGIC + b"\0create\0" + data):
        try:
            parse_request(payload, fds)
        except ProtocolError as exc:
            assert "\n" not in str(exc)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.binary(min_size=0, max_size=40).filter(lambda b: b"\0" not in b), min_size=7, max_size=20
    )
)
def test_parse_request_round_trips_any_create(fields: "list[bytes]") -> None:
    """Any create the C client can send (NUL-free fields, absolute paths) decodes to the
    fields it was built from."""
    version, conf, gen, runtime, cwd, bundle, *argv = fields
    req = Request(
        "create",
        os.fsdecode(version),
        "/" + os.fsdecode(conf),
        os.fsdecode(gen),
        "/" + os.fsdecode(runtime),
        "/" + os.fsdecode(cwd),
        os.fsdecode(bundle),
        tuple(os.fsdecode(a) for a in argv),
    )
    if not req.argv:
        return
    assert parse_request(encode_request(req), 1) == req


@needs_root
def test_idle_peers_never_stall_accepting_or_stopping(tmp_path: Path, config: Path) -> None:
    """With 70 peers connected and silent (more than the agent's 64 workers), a ready request is still answered within the client's 5 s timeout; with 300 more (past the 256 connections held while their request has not arrived, the rest closed at once with one log line), SIGTERM stops the agent within 5 s: a silent peer holds no worker and is closed at stop."""
    import socket as sockets

    agent = AgentProcess(tmp_path / "a.sock", config, tmp_path / "a.log").start()
    idle = []
    try:
        for _ in range(70):
            peer = sockets.socket(sockets.AF_UNIX, sockets.SOCK_SEQPACKET)
            peer.connect(str(agent.socket))
            idle.append(peer)
        status, _message = parse_reply(ask(str(agent.socket), MAGIC + b"\0ready\0", timeout=5.0))
        assert status == "ready"
        for _ in range(300):
            peer = sockets.socket(sockets.AF_UNIX, sockets.SOCK_SEQPACKET)
            peer.connect(str(agent.socket))
            idle.append(peer)
        wait_until(
            lambda: "too many connections waiting" in agent.log.read_text(),
            10,
            "the agent's one line about the connections it closed",
        )
        assert agent.proc is not None
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(timeout=5) == 0
    finally:
        for peer in idle:
            peer.close()
        if agent.proc is not None and agent.proc.poll() is None:
            agent.stop()
    assert agent.log.read_text().count("too many connections waiting for their request") == 1


@needs_root
def test_an_agent_whose_install_is_replaced_stops_serving(tmp_path: Path, config: Path) -> None:
    """An agent running from an nvshim whose files are then replaced (an upgrade or reinstall under it) says not-ready with the reason and answers every create with fallback (the client's own create runs the installed code), rather than mixing its loaded code with the new files; it says its version while ready."""
    import shutil

    from nvshim import __version__

    copy = tmp_path / "site"
    shutil.copytree(REPO / "nvshim", copy / "nvshim", ignore=shutil.ignore_patterns("__pycache__"))
    agent = AgentProcess(tmp_path / "a.sock", config, tmp_path / "a.log")
    agent.args = [
        sys.executable,
        "-I",
        "-c",
        "import sys; sys.path.insert(0, sys.argv.pop(1)); from nvshim.cli.main import main; main()",
        str(copy),
    ] + agent.args[agent.args.index("agent") :]
    agent.start()
    try:
        status, message = _ready(agent.socket)
        assert status == "ready" and json.loads(message)["version"] == __version__
        marker = copy / "nvshim" / "__init__.py"
        fresh = marker.with_suffix(".new")
        fresh.write_bytes(marker.read_bytes())
        os.replace(fresh, marker)  # what an install does: new files, not edits
        status, message = _ready(agent.socket)
        assert status == "not-ready" and "reinstalled or upgraded" in message, message
        create = Request(
            "create",
            __version__,
            str(config),
            "0:0:0:0",
            "/usr/sbin/runc",
            "/",
            "/b",
            ("runc", "create", "c1"),
        )
        root = os.open("/", os.O_PATH)
        try:
            reply = parse_reply(ask(str(agent.socket), encode_request(create), [root]))
        finally:
            os.close(root)
        assert reply[0] == "fallback" and "reinstalled or upgraded" in reply[1], reply
    finally:
        agent.stop()


@needs_root
def test_a_waiting_agent_takes_the_socket_over_when_the_serving_one_stops(
    tmp_path: Path, config: Path
) -> None:
    """Without --wait a second agent on a served socket fails in one line; with --wait it
    waits (the first keeps serving: its pid answers), takes the socket over within a
    second of the first's stop, and a SIGTERM while it waits stops it cleanly (exit 0)."""
    sock = tmp_path / "run" / "a.sock"
    first = AgentProcess(sock, config, tmp_path / "first.log").start()
    started = [first]
    try:
        refused = subprocess.run(
            nvshim_bin() + ["agent", "--socket", str(sock), "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 1
        assert "another agent is serving it" in refused.stderr.strip().splitlines()[-1]
        second = AgentProcess(sock, config, tmp_path / "second.log")
        second.args.append("--wait")
        started.append(second)
        assert second.start().proc is not None  # the socket exists: the first's
        wait_until(
            lambda: "waiting for it to stop" in second.log.read_text(),
            60,
            "the second agent to wait",
        )
        assert _ready(sock)[0] == "ready"
        assert '"agent serving"' not in second.log.read_text()
        assert first.stop(signal.SIGTERM) == 0
        wait_until(
            lambda: '"agent serving"' in second.log.read_text(),
            5,
            "the waiting agent to take the socket over",
        )
        assert _ready(sock)[0] == "ready"
        assert second.stop(signal.SIGTERM) == 0
        assert not sock.exists()

        third = AgentProcess(sock, config, tmp_path / "third.log").start()
        waiter = AgentProcess(sock, config, tmp_path / "waiter.log")
        waiter.args.append("--wait")
        started += [third, waiter]
        waiter.start()
        wait_until(
            lambda: "waiting for it to stop" in waiter.log.read_text(), 60, "the waiter to wait"
        )
        assert waiter.stop(signal.SIGTERM) == 0
        assert _ready(sock)[0] == "ready"  # the serving one is untouched
        assert third.stop(signal.SIGTERM) == 0
    finally:
        for agent in started:
            if agent.proc is not None:
                agent.stop(signal.SIGKILL)


def test_warm_up_freezes_what_it_loaded_and_leaves_the_collector_on() -> None:
    """The agent's warm-up leaves the cyclic collector on and the objects loaded so far
    frozen (a full collection no longer walks every module at each create)."""
    import gc

    from nvshim.agent.daemon import _warm_up

    was_enabled = gc.isenabled()
    gc.disable()  # as the runtime entry leaves it
    try:
        _warm_up()
        assert gc.isenabled()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        if not was_enabled:
            gc.disable()
