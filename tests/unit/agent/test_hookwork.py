"""The agent-served createContainer hook (``nri-inroot: agent``): the plugin's hook entry,
the C client's ``--hook`` mode and the agent's ``hook`` request, on a simulated node, with
nvshim's real Python hook as the fallback."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvshim._record import replace
from nvshim.agent.hookwork import PendingWork, serve_hook
from nvshim.agent.nri import plugin
from nvshim.agent.nri.api import Container, Pod
from nvshim.agent.protocol import ProtocolError, Request, encode_request, parse_request
from nvshim.config import Config
from tests.helpers.agent import RecordingLog as Log
from tests.helpers.agent import built_client, fake_agent

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the agent serves root only")
POD = Pod("sb", "train", "uid-1", "team-a", {}, "")


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C client, built from this checkout's source."""
    return built_client(tmp_path_factory.mktemp("client"))


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("hook") / "node"), gpus=2)


class Agent:
    """An agent socket serving ``hook`` requests from ``pending`` (the agent's own server
    and handler, in this process)."""

    def __init__(self, path: Path, pending: PendingWork) -> None:
        from nvshim.agent.server import AgentServer

        self.log = Log()
        self.server = AgentServer(
            str(path), lambda r, fds, peer: serve_hook(pending, r, fds[0], peer, self.log), self.log
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.server.serve, args=(self.stop,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


@pytest.fixture
def world(tmp_path: Path, sim: Any, client: Path) -> Iterator[Dict[str, Any]]:
    """A bundle with an empty rootfs, the plugin's decision for an allocated container in
    agent mode, and an agent serving its pending work."""
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}}))
    pending = PendingWork(str(tmp_path / "agent.sock"), str(client))
    cfg = replace(
        Config(
            driver_root=sim.root,
            grants_journal=str(tmp_path / "grants.jsonl"),
            runtimes=("runc",),
            nri_inject=True,
        ),
        nri_inroot="agent",
    )
    # the hook runs as this test's child: in this test's cgroup, as runc's hook runs in the
    # container's
    ctr = Container(
        id="c1",
        name="main",
        env=(f"NVIDIA_VISIBLE_DEVICES={sim.gpus[0].uuid}",),
        cgroups_path=own_cgroup(),
    )
    adj = plugin.decide(cfg, POD, ctr, Log(), pending=pending)
    (hook,) = adj.hooks["createContainer"]
    agent = Agent(tmp_path / "agent.sock", pending)
    try:
        yield {
            "bundle": bundle,
            "hook": hook,
            "pending": pending,
            "agent": agent,
            "state": json.dumps(
                {
                    "ociVersion": "1.0.2",
                    "id": "c1",
                    "pid": 42,
                    "status": "creating",
                    "bundle": str(bundle),
                }
            ),
        }
    finally:
        agent.close()


def own_cgroup() -> str:
    """This process's cgroup (the first hierarchy's: v2's only one, v1's first)."""
    return Path("/proc/self/cgroup").read_text().splitlines()[0].split(":", 2)[2]


def run_hook(
    hook: Any,
    state: str,
    args: Optional[List[str]] = None,
) -> subprocess.CompletedProcess[str]:
    """Run the hook entry as runc does: its path and argv, its env only, state on stdin."""
    argv = list(hook.args) if args is None else args
    return subprocess.run(
        argv,
        executable=hook.path,
        input=state,
        env=dict(e.partition("=")[::2] for e in hook.env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def made(rootfs: Path) -> Tuple[Optional[str], bool]:
    """(where libcuda.so.1 points, whether the rootfs has an ld.so.cache naming it)."""
    link = rootfs / "usr/lib/x86_64-linux-gnu/libcuda.so.1"
    cache = rootfs / "etc/ld.so.cache"
    return (
        os.readlink(link) if link.is_symlink() else None,
        cache.exists() and b"libcuda.so.1" in cache.read_bytes(),
    )


@needs_root
def test_agent_does_the_planned_work_through_the_callers_root(
    world: Dict[str, Any], client: Path
) -> None:
    """In agent mode the adjustment's hook is the client asking the agent, and the agent makes the plan's links and ld.so.cache in the rootfs the OCI state names, with no Python hook run."""
    hook = world["hook"]
    assert hook.path == str(client) and hook.args[1:2] == ("--hook",)
    assert any("nvshim.hook" in a for a in hook.args)  # the fallback is the Python hook
    res = run_hook(hook, world["state"])
    assert (res.returncode, res.stderr) == (0, ""), res.stderr
    assert made(world["bundle"] / "rootfs") == ("libcuda.so.550.54.15", True)
    assert [e for _, e, kw in world["agent"].log.lines] == ["nri in-root work"]
    assert len(world["pending"]) == 0


@needs_root
def test_agent_logs_the_in_root_works_own_time(world: Dict[str, Any]) -> None:
    """The agent's ``nri in-root work`` line carries ``inroot_ms``, the time of the work
    itself (links, cache, profile), apart from ``ms``, the whole request's (state, claim,
    config.json, rootfs), which holds it."""
    res = run_hook(world["hook"], world["state"])
    assert (res.returncode, res.stderr) == (0, ""), res.stderr
    ((_, event, kw),) = world["agent"].log.lines
    assert event == "nri in-root work"
    assert 0 < kw["inroot_ms"] <= kw["ms"], kw


@needs_root
@pytest.mark.parametrize(
    "case", ["no work waits", "no agent", "another version", "a state too big to send"]
)
def test_hook_falls_back_to_the_python_hook_with_the_same_state(
    world: Dict[str, Any], case: str
) -> None:
    """Whatever keeps the agent from doing the work (none waits for the container: an agent restarted since CreateContainer; no agent; another nvshim version; a state longer than one request), the client execs nvshim's Python hook with the same argv and the whole state on stdin, and the rootfs gets the same links and a cache."""
    hook, state = world["hook"], world["state"]
    args = list(hook.args)
    if case == "no work waits":
        world["pending"].drop("c1")
    elif case == "no agent":
        world["agent"].close()
    elif case == "another version":
        args[3] = "0.0.1"
    else:
        doc = json.loads(state)
        doc["annotations"] = {"big": "x" * 100_000}
        state = json.dumps(doc)
    res = run_hook(hook, state, args)
    assert res.returncode == 0, res.stderr
    # the Python hook reads the libraries runc mounted (none here): the cache without them
    assert made(world["bundle"] / "rootfs")[0] == "libcuda.so.550.54.15"
    assert (world["bundle"] / "rootfs/etc/ld.so.cache").exists()
    assert not any(e == "nri in-root work" for _, e, _kw in world["agent"].log.lines)


@needs_root
def test_a_hook_outside_the_containers_cgroup_does_not_take_its_work(
    world: Dict[str, Any], tmp_path: Path
) -> None:
    """A forged hook request (a root process that is not the container's hook: outside the cgroup the engine gave the container at CreateContainer) naming a waiting container's id gets fallback with the reason, the agent writes nothing, and the work stays for the container's own hook, which then takes it."""
    pending, hook = world["pending"], world["hook"]
    work = pending._work["c1"]
    pending._work["c1"] = (work[0], work[1], "/nvshim-test/another-container")
    forged_root = tmp_path / "forged"
    (forged_root / "rootfs").mkdir(parents=True)
    (forged_root / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}}))
    state = json.loads(world["state"])
    state["bundle"] = str(forged_root)
    fallback = _echo_fallback(tmp_path)
    res = run_hook(hook, json.dumps(state), [*hook.args[:4], *fallback])
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "args").exists()  # the fallback ran: the agent did not serve it
    assert made(forged_root / "rootfs") == (None, False)
    (line,) = [kw for _, e, kw in world["agent"].log.lines]
    assert "is not its own: peer pid" in line["reason"], line
    assert "not /nvshim-test/another-container" in line["reason"], line
    assert len(pending) == 1
    pending._work["c1"] = work  # the container's own hook, in its cgroup
    res = run_hook(hook, world["state"])
    assert (res.returncode, res.stderr) == (0, ""), res.stderr
    assert made(world["bundle"] / "rootfs") == ("libcuda.so.550.54.15", True)
    assert len(pending) == 0


def test_cgroup_binding_reads_cgroupfs_systemd_and_namespaced_paths() -> None:
    """The cgroups path a runtime is given matches the cgroup the kernel shows: cgroupfs paths as they are, systemd's slice:prefix:name as its expanded slice and scope, a relative path by its tail, a path seen from another cgroup namespace by what follows its ``..``; nothing else, and no path at all never matches."""
    from nvshim.agent.hookwork import cgroup_candidates, cgroup_matches, outside_cgroup

    pod = "kubepods-besteffort-pod1a2b.slice:cri-containerd:c0ffee"
    scope = (
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1a2b.slice/"
        "cri-containerd-c0ffee.scope"
    )
    assert cgroup_candidates(pod)[1] == scope
    assert cgroup_candidates("system.slice:docker:abc")[1] == "/system.slice/docker-abc.scope"
    assert cgroup_candidates("-.slice::x")[1] == "/x.scope"
    for path, cgroups_path, ok in [
        (scope, pod, True),
        ("/kubepods/besteffort/pod1/c1", "/kubepods/besteffort/pod1/c1", True),
        ("/kubepods/besteffort/pod1/c2", "/kubepods/besteffort/pod1/c1", False),
        ("/kubepods/besteffort/pod1/c1/x", "/kubepods/besteffort/pod1/c1", False),
        ("/user.slice/default/c1", "default/c1", True),
        ("/user.slice/mydefault/c1", "default/c1", False),
        ("/../../kubepods/pod1/c1", "/kubepods/pod1/c1", True),
        ("/../../kubepods/pod1/c2", "/kubepods/pod1/c1", False),
        ("/", "/kubepods/pod1/c1", False),
    ]:
        assert cgroup_matches(path, cgroups_path) is ok, (path, cgroups_path)
    assert outside_cgroup(os.getpid(), own_cgroup()) == ""
    assert outside_cgroup(os.getpid(), "") == "the engine gave the container no cgroups path"
    assert outside_cgroup(os.getpid(), "/nvshim-test/x").startswith(f"peer pid {os.getpid()} runs")
    assert outside_cgroup(0, own_cgroup()) == "the peer is outside the agent's pid namespace"


@needs_root
def test_hook_fallback_failure_is_the_hooks_failure(world: Dict[str, Any]) -> None:
    """With no work waiting and a state the Python hook cannot parse, the hook fails with the Python hook's one line (exit 1): never a silent success."""
    world["pending"].drop("c1")
    res = run_hook(world["hook"], "{not json")
    assert res.returncode == 1
    assert res.stderr.startswith("nvshim hook: cannot parse the oci state"), res.stderr
    assert made(world["bundle"] / "rootfs") == (None, False)


def test_client_hook_usage_and_missing_fallback(client: Path, tmp_path: Path) -> None:
    """--hook without a fallback argv is a usage line and exit 1; a fallback that cannot be run is one line and exit 1."""
    res = subprocess.run(
        [str(client), "--hook", str(tmp_path / "s"), "0.1.0"],
        input="{}",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 1 and res.stderr.startswith("nvshim: usage:"), res.stderr
    res = subprocess.run(
        [str(client), "--hook", str(tmp_path / "s"), "0.1.0", str(tmp_path / "missing")],
        input="{}",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (
        res.returncode == 1
        and res.stderr == f"nvshim: cannot run {tmp_path}/missing: No such file or directory\n"
    ), res.stderr


def _echo_fallback(tmp_path: Path) -> List[str]:
    script = tmp_path / "fallback"
    script.write_text(f'#!/bin/sh\ncat > {tmp_path}/stdin\necho "$@" > {tmp_path}/args\n')
    script.chmod(0o755)
    return [str(script), "a b", "c"]


@settings(max_examples=30, deadline=None)
@given(
    reply=st.binary(max_size=48)
    | st.builds(
        lambda status, msg: b"nvshim-agent 1\0" + status + b"\0" + msg + b"\0",
        st.sampled_from([b"ok", b"refused", b"fallback", b"OK", b""]),
        st.binary(max_size=24),
    ),
    state=st.text(max_size=200).filter(lambda s: "\0" not in s),
)
def test_client_hook_reply_fuzzed(
    client: Path, tmp_path_factory: pytest.TempPathFactory, reply: bytes, state: str
) -> None:
    """Any reply: exit 0 without the fallback only for a well-formed ``ok``; otherwise the fallback runs with its argv and exactly the state the client read; the request is the agent parser's ``hook`` with the caller's / as its descriptor."""
    tmp = tmp_path_factory.mktemp("hz")
    thread, seen = fake_agent(tmp / "s", reply)
    fallback = _echo_fallback(tmp)
    res = subprocess.run(
        [str(client), "--hook", str(tmp / "s"), "9.9", *fallback],
        input=state.encode(),
        capture_output=True,
        timeout=30,
    )
    thread.join(10)
    data, fds = seen[0]
    assert parse_request(data, len(fds)) == Request("hook", version="9.9", state=state)
    root = os.stat("/")
    assert (fds[0].st_dev, fds[0].st_ino) == (root.st_dev, root.st_ino)
    fields = reply.split(b"\0")
    ok = (
        len(fields) == 4
        and fields[0] == b"nvshim-agent 1"
        and fields[1] == b"ok"
        and fields[3] == b""
    )
    assert res.returncode == 0
    if ok:
        assert not (tmp / "args").exists()
    else:
        assert (tmp / "args").read_text() == "a b c\n"
        assert (tmp / "stdin").read_bytes() == state.encode()


def test_parse_request_reads_a_hook_and_refuses_a_malformed_one() -> None:
    """A hook request is the version and the state with exactly one descriptor; other shapes are one-line protocol errors."""
    req = Request("hook", version="0.1.0", state='{"id": "x"}')
    assert parse_request(encode_request(req), 1) == req
    with pytest.raises(ProtocolError, match="hook takes 2 fields"):
        parse_request(encode_request(req), 0)
    with pytest.raises(ProtocolError, match="hook takes 2 fields"):
        parse_request(b"nvshim-agent 1\0hook\0v\0", 1)


def test_serve_hook_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    """A state that is not JSON, lacks an id or an absolute bundle, or names a bundle with no config.json: fallback with one line, the waiting work kept only when the state named no container."""
    from nvshim.agent.server import Peer

    pending = PendingWork(str(tmp_path / "s"), str(tmp_path / "no-client"))
    pending.put("c", object(), (), own_cgroup())
    root = os.open("/", os.O_PATH | os.O_DIRECTORY)
    try:

        def ask(state: str) -> Tuple[str, str]:
            from nvshim import __version__

            return serve_hook(
                pending,
                Request("hook", version=__version__, state=state),
                root,
                Peer(os.getpid(), 0, 0),
                Log(),
            )

        assert ask("[")[0] == "fallback"
        assert ask('{"bundle": "/x"}') == ("fallback", "the oci state has no container id")
        assert ask('{"id": "c", "bundle": "rel"}')[1].startswith("oci state: bundle must")
        assert len(pending) == 1
        status, why = ask(json.dumps({"id": "c", "bundle": str(tmp_path / "none")}))
        assert status == "fallback" and why.startswith(f"bundle {tmp_path}/none:"), why
        assert ask(json.dumps({"id": "c", "bundle": "/"}))[1].startswith("no in-root work")
    finally:
        os.close(root)
    assert pending.hook_entry({"path": "/p", "args": ["/p"]}) is None  # no client here


def test_a_client_without_the_hook_mode_keeps_the_python_hook(
    tmp_path: Path, sim: Any, client: Path
) -> None:
    """A client that does not answer ``--hook`` with its usage line (one built before the mode) is not put in the adjustment: the Python hook stays and no work waits."""
    old = tmp_path / "old-client"
    old.write_text("#!/bin/sh\nexit 2\n")
    old.chmod(0o755)
    cfg = replace(
        Config(
            driver_root=sim.root,
            grants_journal=str(tmp_path / "g.jsonl"),
            runtimes=("runc",),
            nri_inject=True,
        ),
        nri_inroot="agent",
    )
    ctr = Container(id="c2", name="main", env=(f"NVIDIA_VISIBLE_DEVICES={sim.gpus[0].uuid}",))
    for path, ours in ((old, False), (client, True)):
        pending = PendingWork(str(tmp_path / "s"), str(path))
        (hook,) = plugin.decide(cfg, POD, ctr, Log(), pending=pending).hooks["createContainer"]
        assert (hook.path == str(path), len(pending)) == (ours, int(ours))
