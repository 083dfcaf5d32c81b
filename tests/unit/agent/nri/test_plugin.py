"""Unit tests of the NRI plugin's decisions, on a simulated node (no engine)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from nvshim._record import replace
from nvshim.agent.nri import plugin
from nvshim.agent.nri.api import Container, Mount, Pod
from nvshim.agent.nri.transport import RpcError
from nvshim.config import Config
from tests.helpers.agent import RecordingLog as Log


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import subprocess
    import sys

    from nvshim.sim.build import create_node

    base = tmp_path_factory.mktemp("nri")
    node = create_node(str(base / "node"), gpus=2)
    # nvshim's CDI spec for the node: what NVIDIA's NRI plugin injects from
    (base / "cdi").mkdir()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "nvshim.cli.main",
            "cdi",
            "generate",
            "--driver-root",
            node.root,
            "--output",
            str(base / "cdi" / "nvidia.json"),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return node


def config(sim: Any, tmp: Path, **kw: Any) -> Config:
    return replace(
        Config(
            driver_root=sim.root,
            grants_journal=str(tmp / "grants.jsonl"),
            runtimes=("runc",),
            nri_inject=True,
            cdi_spec_dirs=(str(Path(sim.root).parent / "cdi"),),
        ),
        **kw,
    )


POD = Pod("sb", "train", "uid-1", "team-a", {}, "")


def test_guard_voids_unallocated_and_removes_claims(sim: Any, tmp_path: Path) -> None:
    """An unallocated container asking for every GPU gets NVIDIA_VISIBLE_DEVICES=void, its device-list mount replaced by an empty tmpfs and its CDI annotation removed."""
    ctr = Container(
        id="c",
        name="main",
        env=("NVIDIA_VISIBLE_DEVICES=all",),
        annotations={"cdi.k8s.io/x": "nvidia.com/gpu=9"},
        mounts=(Mount("/var/run/nvidia-container-devices/all", "bind", "/dev/null"),),
    )
    adj = plugin.decide(
        config(sim, tmp_path, annotation_prefixes=("nope/",)),
        dataclasses.replace(POD, runtime_handler="nvidia"),
        ctr,
        Log(),
    )
    assert adj.env == (("NVIDIA_VISIBLE_DEVICES", "void"),)
    assert [(m.destination, m.source) for m in adj.mounts] == [
        ("/var/run/nvidia-container-devices/all", "tmpfs")
    ]


def test_verify_refusal_is_an_error_naming_the_pod(sim: Any, tmp_path: Path) -> None:
    """A plan the runtime would refuse (on-missing-allocation: fail) is an error reply naming the pod and container, journaled as refused."""
    ctr = Container(id="c", name="main", env=("NVIDIA_VISIBLE_DEVICES=all",))
    cfg = config(sim, tmp_path, on_missing_allocation="fail")
    with pytest.raises(RpcError, match=r"^nvshim: pod team-a/train container main: "):
        plugin.decide(cfg, POD, ctr, Log())
    assert '"refused"' in (tmp_path / "grants.denied.jsonl").read_text()


def test_inject_gives_the_allocated_gpu_only(sim: Any, tmp_path: Path) -> None:
    """Under plain runc an allocated UUID gets its device node (and the control nodes), nothing for the other GPU."""
    gpu = sim.gpus[1]
    ctr = Container(id="c", name="main", env=(f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}",))
    adj = plugin.decide(config(sim, tmp_path), POD, ctr, Log())
    paths = {d.path for d in adj.devices}
    assert f"/dev/nvidia{gpu.minor}" in paths and f"/dev/nvidia{sim.gpus[0].minor}" not in paths
    assert "createContainer" in adj.hooks
    assert gpu.uuid in (tmp_path / "grants.jsonl").read_text()


def test_gpu_and_nvshim_handlers_are_not_injected(sim: Any, tmp_path: Path) -> None:
    """A handler that injects GPUs itself gets no injection; one running nvshim-runtime is left alone."""
    gpu = sim.gpus[0]
    ctr = Container(id="c", name="main", env=(f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}",))
    cfg = config(sim, tmp_path)
    assert not plugin.decide(cfg, dataclasses.replace(POD, runtime_handler="nvidia"), ctr, Log())
    bare = Container(id="c", name="main", env=("NVIDIA_VISIBLE_DEVICES=all",))
    assert not plugin.decide(cfg, dataclasses.replace(POD, runtime_handler="nvshim"), bare, Log())


def test_sandbox_and_no_claim_are_untouched(sim: Any, tmp_path: Path) -> None:
    """A container that names no GPU gets no adjustment and no record."""
    assert not plugin.decide(config(sim, tmp_path), POD, Container(id="c", name="main"), Log())
    assert not (tmp_path / "grants.jsonl").exists()


def test_guard_refuses_a_visible_devices_set_twice(sim: Any, tmp_path: Path) -> None:
    """An unallocated container whose env sets NVIDIA_VISIBLE_DEVICES twice (image ENV and pod env) is refused: containerd voids only the first entry and keeps the last, so stripping cannot hold."""
    ctr = Container(
        id="c", name="main", env=("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=all")
    )
    pod = dataclasses.replace(POD, runtime_handler="nvidia")
    with pytest.raises(RpcError, match=r"NVIDIA_VISIBLE_DEVICES is set 2 times"):
        plugin.decide(config(sim, tmp_path), pod, ctr, Log())
    assert '"refused"' in (tmp_path / "grants.denied.jsonl").read_text()


def test_guard_leaves_a_repeated_variable_whose_last_entry_is_void(
    sim: Any, tmp_path: Path
) -> None:
    """A repeated NVIDIA_VISIBLE_DEVICES whose last entry (the one the engine keeps) is void claims nothing from env: no refusal, no env adjustment."""
    ctr = Container(
        id="c", name="main", env=("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=void")
    )
    pod = dataclasses.replace(POD, runtime_handler="nvidia")
    assert not plugin.decide(config(sim, tmp_path), pod, ctr, Log())


@pytest.mark.parametrize(
    "dest",
    [
        "/var/run/nvidia-container-devices/all",
        "/var/run//nvidia-container-devices/all",
        "/var/run/./nvidia-container-devices/all",
        "var/run/nvidia-container-devices/all",
        "//var/run/nvidia-container-devices/all/",
        "/var/run/nvidia-container-devicesall",
    ],
)
@pytest.mark.parametrize("source", ["/dev/null", "/dev//null", "//dev/null"])
def test_guard_strips_a_claim_made_only_by_a_device_list_mount(
    sim: Any, tmp_path: Path, dest: str, source: str
) -> None:
    """An unallocated container whose only claim is a /dev/null mount under the device-list directory (however the path is spelled, as NVIDIA's runtime cleans it) has the mount replaced at its raw destination by an empty tmpfs, gets void, and is journaled as stripped."""
    ctr = Container(id="c", name="main", mounts=(Mount(dest, "bind", source, ("ro",)),))
    pod = dataclasses.replace(POD, runtime_handler="nvidia")
    log = Log()
    adj = plugin.decide(config(sim, tmp_path), pod, ctr, log)
    assert [(m.destination, m.type, m.source) for m in adj.mounts] == [(dest, "tmpfs", "tmpfs")]
    assert adj.env == (("NVIDIA_VISIBLE_DEVICES", "void"),)
    assert '"stripped"' in (tmp_path / "grants.denied.jsonl").read_text()
    assert [e for _lvl, e, _kw in log.lines] == ["nri guard"]


def test_guard_refuses_a_device_list_mount_made_twice(sim: Any, tmp_path: Path) -> None:
    """The same device-list destination mounted twice is refused: NRI removes one mount per destination."""
    m = Mount("/var/run/nvidia-container-devices/all", "bind", "/dev/null")
    ctr = Container(id="c", name="main", mounts=(m, m))
    with pytest.raises(RpcError, match=r"mounted 2 times"):
        plugin.decide(
            config(sim, tmp_path), dataclasses.replace(POD, runtime_handler="nvidia"), ctr, Log()
        )


@pytest.mark.parametrize(
    "key", ["nvidia.cdi.k8s.io/container.main", "nvidia.cdi.k8s.io/pod", "nvidia.cdi.k8s.io"]
)
@pytest.mark.parametrize("handler", ["nvidia", "runc", "nvshim"])
def test_nvidia_nri_annotation_unallocated_is_refused(
    sim: Any, tmp_path: Path, key: str, handler: str
) -> None:
    """A pod annotation NVIDIA's NRI plugin injects CDI devices from (container, pod or bare key) naming GPUs the container was not allocated fails the create, whatever the handler, and is journaled."""
    pod = Pod("sb", "train", "uid-1", "team-a", {key: "nvidia.com/gpu=all"}, handler)
    with pytest.raises(
        RpcError,
        match=r"^nvshim: pod team-a/train container main: annotation "
        + key.replace(".", r"\.")
        + r" names CDI device nvidia\.com/gpu=all",
    ):
        plugin.decide(config(sim, tmp_path), pod, Container(id="c", name="main"), Log())
    assert '"refused"' in (tmp_path / "grants.denied.jsonl").read_text()


def test_nvidia_nri_annotation_for_another_container_is_not_this_ones(
    sim: Any, tmp_path: Path
) -> None:
    """NVIDIA's container-scoped annotation for another container claims nothing for this one."""
    pod = Pod(
        "sb",
        "train",
        "uid-1",
        "team-a",
        {"nvidia.cdi.k8s.io/container.other": "nvidia.com/gpu=all"},
        "nvidia",
    )
    assert not plugin.decide(config(sim, tmp_path), pod, Container(id="c", name="main"), Log())


def test_nvidia_nri_annotation_within_the_allocation_passes(sim: Any, tmp_path: Path) -> None:
    """NVIDIA's annotation naming only the GPU the device plugin allocated (its UUID env) is let through; naming the other GPU too is refused with that GPU's UUID."""
    gpu, other = sim.gpus[0], sim.gpus[1]
    ctr = Container(id="c", name="main", env=(f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}",))
    cfg = config(sim, tmp_path)
    pod = Pod(
        "sb",
        "train",
        "uid-1",
        "team-a",
        {"nvidia.cdi.k8s.io/pod": f"nvidia.com/gpu={gpu.index}"},
        "nvidia",
    )
    assert not plugin.decide(cfg, pod, ctr, Log())
    pod = dataclasses.replace(
        pod,
        annotations={
            "nvidia.cdi.k8s.io/pod": f"nvidia.com/gpu={gpu.index},nvidia.com/gpu={other.index}"
        },
    )
    with pytest.raises(RpcError, match=other.uuid):
        plugin.decide(cfg, pod, ctr, Log())


def test_a_denial_that_cannot_be_recorded_fails_the_create(sim: Any, tmp_path: Path) -> None:
    """Record or fail: a stripped container whose denial cannot be journaled (the journal's directory is a file) is refused, the reason in the error line; a refusal says it went unrecorded."""
    (tmp_path / "file").write_text("")
    cfg = config(sim, tmp_path, grants_journal=str(tmp_path / "file" / "grants.jsonl"))
    ctr = Container(id="c", name="main", env=("NVIDIA_VISIBLE_DEVICES=all",))
    pod = dataclasses.replace(POD, runtime_handler="nvidia")
    with pytest.raises(RpcError, match=r"its denial cannot be recorded"):
        plugin.decide(cfg, pod, ctr, Log())
    twice = Container(
        id="c", name="main", env=("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=all")
    )
    with pytest.raises(RpcError, match=r"\(not recorded: "):
        plugin.decide(cfg, pod, twice, Log())


def test_work_held_for_start_is_bounded_and_taken_once() -> None:
    """The in-root work held for containers not started yet keeps at most its cap (the oldest goes first), and each container's work is taken by one pop only, also when eight threads pop at once."""
    import threading

    later = plugin.Later()
    for i in range(plugin._LATER_MAX + 3):
        later.put(f"c{i}", i)
    assert len(later) == plugin._LATER_MAX
    assert later.pop("c0") is None and later.pop("c3") == 3
    taken: list = []
    threads = [threading.Thread(target=lambda: taken.append(later.pop("c4"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken, key=str) == [4] + [None] * 7


def test_guard_strips_without_the_kubelet_and_refuses_what_it_cannot_confirm(
    sim: Any, tmp_path: Path
) -> None:
    """With verify-with: kubelet and the kubelet's socket gone, an unallocated container whose image says all is stripped (stripping needs no allocation record), while one naming a GPU's UUID is still refused: only the kubelet could confirm that grant."""
    cfg = config(
        sim,
        tmp_path,
        verify_with="kubelet",
        kubelet_socket=str(tmp_path / "gone.sock"),
        kubelet_checkpoint=None,
    )
    pod = dataclasses.replace(POD, runtime_handler="nvidia")
    ctr = Container(id="c", name="main", env=("NVIDIA_VISIBLE_DEVICES=all",))
    adj = plugin.decide(cfg, pod, ctr, Log())
    assert adj.env == (("NVIDIA_VISIBLE_DEVICES", "void"),)
    assert '"stripped"' in (tmp_path / "grants.denied.jsonl").read_text()
    named = Container(id="c2", name="main", env=(f"NVIDIA_VISIBLE_DEVICES={sim.gpus[0].uuid}",))
    with pytest.raises(RpcError, match=r"cannot ask the kubelet"):
        plugin.decide(cfg, pod, named, Log())


def test_a_grant_let_through_to_nvidias_runtime_is_journaled(sim: Any, tmp_path: Path) -> None:
    """On a guard node, an allocated container under a handler that injects GPUs itself (NVIDIA's runtime) gets no adjustment, and its grant is journaled as let through (source nri-guard:…), so nvshim grants covers the GPUs that runtime hands out."""
    import json

    gpu = sim.gpus[1]
    ctr = Container(id="c9", name="main", env=(f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}",))
    pod = dataclasses.replace(POD, runtime_handler="nvidia")
    assert not plugin.decide(config(sim, tmp_path), pod, ctr, Log())
    (record,) = [json.loads(line) for line in (tmp_path / "grants.jsonl").read_text().splitlines()]
    assert record["gpus"] == [gpu.uuid] and record["source"].startswith("nri-guard:"), record
    assert record["id"] == "c9" and record["pod"] == "train", record


def test_an_allocated_pod_cannot_widen_its_gpus_through_its_own_env(
    sim: Any, tmp_path: Path
) -> None:
    """Under NVIDIA's runtime (which injects from the env's last entry), a container allocated one GPU by device-plugin mount that also says NVIDIA_VISIBLE_DEVICES=all gets the variable narrowed to its GPU's UUID; with the variable set twice (the device plugin's, then the pod's all) it is refused, since NRI can rewrite only the first entry; an env naming only its GPU is left alone."""
    gpu = sim.gpus[0]
    mount = Mount(f"/var/run/nvidia-container-devices/{gpu.uuid}", "bind", "/dev/null")
    pod = dataclasses.replace(POD, runtime_handler="nvidia")
    cfg = config(sim, tmp_path)
    wide = Container(id="c", name="main", env=("NVIDIA_VISIBLE_DEVICES=all",), mounts=(mount,))
    assert plugin.decide(cfg, pod, wide, Log()).env == (("NVIDIA_VISIBLE_DEVICES", gpu.uuid),)
    twice = Container(
        id="c2",
        name="main",
        mounts=(mount,),
        env=(f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}", "NVIDIA_VISIBLE_DEVICES=all"),
    )
    with pytest.raises(RpcError, match=r"names more than its allocation"):
        plugin.decide(cfg, pod, twice, Log())
    exact = Container(
        id="c3", name="main", env=(f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}",), mounts=(mount,)
    )
    assert not plugin.decide(cfg, pod, exact, Log())


def test_a_grant_that_cannot_be_recorded_fails_the_create(sim: Any, tmp_path: Path) -> None:
    """Record or fail for grants too: an injection (plain runc) and a grant let through to NVIDIA's runtime whose journal cannot be written (its directory is a file) are refused, naming the GPU and the error."""
    (tmp_path / "file").write_text("")
    cfg = config(sim, tmp_path, grants_journal=str(tmp_path / "file" / "grants.jsonl"))
    gpu = sim.gpus[0]
    ctr = Container(id="c", name="main", env=(f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}",))
    for handler in ("runc", "nvidia"):
        with pytest.raises(RpcError, match=rf"the grant of {gpu.uuid} cannot be recorded"):
            plugin.decide(cfg, dataclasses.replace(POD, runtime_handler=handler), ctr, Log())


# --- the Plugin service: one table of handlers -------------------------------------------


def _plugin(tmp_path: Path) -> "plugin.Plugin":
    from nvshim.agent.state import AgentState

    return plugin.Plugin(AgentState(str(tmp_path / "absent.yaml"), Log()))


def _state_change(event: int, cid: str, pid: int = 0) -> bytes:
    from nvshim import _protobuf as proto

    ctr = proto.string_field(1, cid) + proto.varint_field(12, pid)
    return proto.varint_field(1, event) + proto.message_field(3, ctr)


def test_configure_subscribes_to_the_events_of_the_handler_table(tmp_path: Path) -> None:
    """Configure's reply subscribes to CreateContainer, StartContainer and RemoveContainer
    (mask 1064, as the engine has always been told), computed from the handler table: a
    handler added to the table is subscribed and called, directly and through StateChange."""
    from nvshim.agent.nri.api import Event, encode_configure_reply

    p = _plugin(tmp_path)
    assert p.handle("Configure", b"") == encode_configure_reply(1064)
    seen: list = []
    p.handlers[Event.STOP_CONTAINER] = lambda call: seen.append(call.method) or b"stopped"
    assert p.handle("Configure", b"") == encode_configure_reply(1064 | 1 << 9)
    assert p.handle("StopContainer", b"") == b"stopped"
    assert p.handle("StateChange", _state_change(Event.STOP_CONTAINER, "c")) == b"stopped"
    assert seen == ["StopContainer", "StateChange"]


def test_methods_without_a_handler_are_answered_and_unknown_ones_unimplemented(
    tmp_path: Path,
) -> None:
    """An NRI event nvshim has no handler for (directly or in a StateChange) and Shutdown
    get an empty reply; a method NRI does not have is an UNIMPLEMENTED error naming it."""
    from nvshim.agent.nri.api import Event
    from nvshim.agent.nri.transport import UNIMPLEMENTED

    p = _plugin(tmp_path)
    for method in (
        "RunPodSandbox",
        "StopContainer",
        "PostCreateContainer",
        "Shutdown",
        "UpdatePodSandbox",
    ):
        assert p.handle(method, b"") == b""
    assert p.handle("StateChange", _state_change(Event.RUN_POD_SANDBOX, "c")) == b""
    with pytest.raises(RpcError, match="method Frobnicate is not implemented") as err:
        p.handle("Frobnicate", b"")
    assert err.value.code == UNIMPLEMENTED


def test_remove_drops_the_work_held_for_a_container_that_never_started(tmp_path: Path) -> None:
    """A RemoveContainer event (as a StateChange) takes the in-root work held for that
    container's start; another container's stays."""
    from nvshim.agent.nri.api import Event

    p = _plugin(tmp_path)
    p.later.put("gone", object())  # type: ignore[arg-type]
    p.later.put("kept", object())  # type: ignore[arg-type]
    assert p.handle("StateChange", _state_change(Event.REMOVE_CONTAINER, "gone")) == b""
    assert p.later.pop("gone") is None and p.later.pop("kept") is not None


def test_start_and_remove_are_subscribed_only_where_work_waits_for_them(tmp_path: Path) -> None:
    """Configure subscribes StartContainer only under nri-inject with nri-inroot: start and
    RemoveContainer only under nri-inject (each costs the engine a round trip per container
    and has nothing to do otherwise); with no config loaded, all three."""
    from nvshim.agent.nri.api import Event, encode_configure_reply, event_mask
    from nvshim.agent.state import AgentState
    from tests.helpers.node import write_nvshim_config

    create, start, remove = Event.CREATE_CONTAINER, Event.START_CONTAINER, Event.REMOVE_CONTAINER
    cases = [
        ({"nri-inject": False, "nri-guard": True}, event_mask(create)),
        ({"nri-inject": False, "nri-guard": False, "nri-verify": False}, event_mask(create)),
        ({"nri-inject": True}, event_mask(create, remove)),
        ({"nri-inject": True, "nri-inroot": "start"}, event_mask(create, start, remove)),
    ]
    for i, (settings, mask) in enumerate(cases):
        path = write_nvshim_config(tmp_path / str(i), settings)
        p = plugin.Plugin(AgentState(str(path), Log()))
        assert p.handle("Configure", b"") == encode_configure_reply(mask), settings
    assert _plugin(tmp_path).handle("Configure", b"") == encode_configure_reply(
        event_mask(create, start, remove)
    )


def test_work_is_held_for_start_only_when_start_is_subscribed(sim: Any, tmp_path: Path) -> None:
    """A config changed to nri-inroot: start after Configure subscribed no StartContainer:
    the in-root work stays with a createContainer hook (no start would come to do it),
    nothing is held for a start, and one warning says so."""
    from nvshim.agent.nri import api_pb2 as pb
    from nvshim.agent.state import AgentState
    from tests.helpers.node import write_nvshim_config

    values = {
        "driver-root": sim.root,
        "runtimes": ["runc"],
        "grants-journal": str(tmp_path / "grants.jsonl"),
        "nri-inject": True,
        "require-allocation": False,
    }
    path = write_nvshim_config(tmp_path, values)
    p = plugin.Plugin(AgentState(str(path), Log()))
    p.handle("Configure", b"")
    write_nvshim_config(tmp_path, {**values, "nri-inroot": "start"})
    p.state.reload()
    assert p.state.config is not None and p.state.config.nri_inroot == "start"
    gpu = sim.gpus[0]
    body = pb.CreateContainerRequest(
        pod=pb.PodSandbox(id="sb", name="train", uid="u", namespace="team-a"),
        container=pb.Container(id="c", name="main", env=[f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}"]),
    ).SerializeToString()
    reply = pb.CreateContainerResponse.FromString(p.handle("CreateContainer", body))
    assert len(p.later) == 0
    assert len(reply.adjust.hooks.create_container) == 1
    p.handle("CreateContainer", body)
    warned = [e for level, e, _kw in p.log.lines if level == "warning"]  # type: ignore[attr-defined]
    assert warned == ["nri-inroot: start waits for the next registration (restart the agent)"]


def test_no_duty_answers_create_without_reading_it(tmp_path: Path) -> None:
    """With nri-inject, nri-guard and nri-verify all off, CreateContainer is answered with
    nothing before the request is decoded (even one that is not a request); with a duty on,
    an undecodable request is still a WireError (the engine's error reply)."""
    from nvshim._protobuf import WireError
    from nvshim.agent.state import AgentState
    from tests.helpers.node import write_nvshim_config

    off = {"nri-inject": False, "nri-guard": False, "nri-verify": False}
    p = plugin.Plugin(AgentState(str(write_nvshim_config(tmp_path / "off", off)), Log()))
    assert p.handle("CreateContainer", b"\x0a\x05abc") == b""
    on = {"nri-inject": False, "nri-guard": True}
    p = plugin.Plugin(AgentState(str(write_nvshim_config(tmp_path / "on", on)), Log()))
    with pytest.raises(WireError):
        p.handle("CreateContainer", b"\x0a\x05abc")


def test_an_internal_error_answers_create_with_nothing_and_one_line(
    sim: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nvshim's own failure while deciding (a module of its install gone under the agent,
    any bug) never fails the create: no adjustment, and one error line naming the
    container and the error."""
    from nvshim.agent.nri import api_pb2 as pb
    from nvshim.agent.state import AgentState
    from tests.helpers.node import write_nvshim_config

    values = {"driver-root": sim.root, "runtimes": ["runc"], "nri-inject": True}
    p = plugin.Plugin(AgentState(str(write_nvshim_config(tmp_path, values)), Log()))

    def broken(*_a: Any, **_kw: Any) -> Any:
        raise ModuleNotFoundError("No module named 'nvshim.runtime.grants'")

    monkeypatch.setattr(plugin, "decide", broken)
    body = pb.CreateContainerRequest(
        pod=pb.PodSandbox(id="sb", name="train", uid="u", namespace="team-a"),
        container=pb.Container(id="c", name="main", env=["NVIDIA_VISIBLE_DEVICES=all"]),
    ).SerializeToString()
    assert p.handle("CreateContainer", body) == b""
    errors = [(e, kw) for level, e, kw in p.log.lines if level == "error"]  # type: ignore[attr-defined]
    assert errors == [
        (
            "nri create not adjusted: internal error",
            {
                "who": "pod team-a/train container main",
                "error": "ModuleNotFoundError: No module named 'nvshim.runtime.grants'",
            },
        )
    ]
