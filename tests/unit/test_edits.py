"""apply_edits: CDI semantics, unknown fields survive, applying twice equals once."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from nvshim.edits import DeviceNode, Edits, Hook, Mount, apply_edits


def base_spec():
    return {
        "ociVersion": "1.0.2-dev",
        "process": {
            "env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"],
            "user": {"uid": 0, "gid": 0},
        },
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts"},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs"},
        ],
        "linux": {
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "x-unknown": [1, 2],
        },
        "fooBar": {"kept": True},
    }


NODE0 = DeviceNode("/dev/nvidia0", "/sim/dev/nvidia0", "c", 195, 0, 0o666)
CTL = DeviceNode("/dev/nvidiactl", "/sim/dev/nvidiactl", "c", 195, 255, 0o666)
LIB = Mount(
    "/sim/usr/lib/libcuda.so.1.2",
    "/usr/lib/libcuda.so.1.2",
    None,
    ("ro", "nosuid", "nodev", "bind"),
)
HOOK = Hook("createContainer", "/py", ("/py", "-I", "-m", "nvshim.hook"), ("PATH=/bin",))
EDITS = Edits(
    env=("NVIDIA_VISIBLE_DEVICES=void",), device_nodes=(CTL, NODE0), mounts=(LIB,), hooks=(HOOK,)
)


def test_apply_adds_nodes_rules_mounts_hooks_env():
    """Nodes become linux.devices plus allow rules after the deny rule; mounts sort by depth; env is replaced."""
    out = apply_edits(base_spec(), EDITS)
    assert [d["path"] for d in out["linux"]["devices"]] == ["/dev/nvidiactl", "/dev/nvidia0"]
    assert out["linux"]["devices"][1] == {
        "path": "/dev/nvidia0",
        "type": "c",
        "major": 195,
        "minor": 0,
        "fileMode": 0o666,
    }
    rules = out["linux"]["resources"]["devices"]
    assert rules[0] == {"allow": False, "access": "rwm"}
    assert rules[1:] == [
        {"allow": True, "type": "c", "major": 195, "minor": 255, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"},
    ]
    assert [m["destination"] for m in out["mounts"]] == [
        "/proc",
        "/dev",
        "/sys",
        "/dev/pts",
        "/usr/lib/libcuda.so.1.2",
    ]
    assert out["mounts"][-1]["options"] == ["ro", "nosuid", "nodev", "bind"]
    assert out["process"]["env"] == ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"]
    assert out["hooks"]["createContainer"] == [
        {"path": "/py", "args": ["/py", "-I", "-m", "nvshim.hook"], "env": ["PATH=/bin"]}
    ]


def test_unknown_fields_survive_and_input_untouched():
    """Fields nvshim doesn't know are kept, and the input dict is not mutated."""
    spec = base_spec()
    before = copy.deepcopy(spec)
    out = apply_edits(spec, EDITS)
    assert spec == before
    assert out["fooBar"] == {"kept": True}
    assert out["linux"]["x-unknown"] == [1, 2]


def test_process_user_ids_apply_to_nodes():
    """A non-root process user owns the injected nodes, as CDI does."""
    spec = base_spec()
    spec["process"]["user"] = {"uid": 1000, "gid": 1001}
    out = apply_edits(spec, Edits(device_nodes=(NODE0,)))
    assert out["linux"]["devices"][0]["uid"] == 1000 and out["linux"]["devices"][0]["gid"] == 1001


def test_existing_device_with_same_path_is_replaced():
    """A device already in the spec at the same path is replaced, not duplicated."""
    spec = base_spec()
    spec["linux"]["devices"] = [{"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 1}]
    out = apply_edits(spec, Edits(device_nodes=(NODE0,)))
    assert out["linux"]["devices"] == [
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 0o666}
    ]


def test_empty_edits_is_identity():
    """Edits() changes nothing."""
    assert apply_edits(base_spec(), Edits()) == base_spec()


paths = st.sampled_from(
    ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/x/y"]
)
nodes = st.builds(
    DeviceNode,
    path=paths,
    host_path=st.none(),
    type=st.just("c"),
    major=st.integers(0, 511),
    minor=st.integers(0, 255),
    permissions=st.sampled_from([None, "rw", "rwm", "r"]),
)
mounts = st.builds(
    Mount,
    host_path=st.text(min_size=1, max_size=5).map(lambda s: "/h/" + s),
    container_path=st.sampled_from(
        ["/usr/lib/a", "/usr/bin/x", "/a", "/dev/pts", "/lib/firmware/n/g.bin"]
    ),
    type=st.sampled_from([None, "bind"]),
    options=st.just(("ro", "bind")),
)
hooks = st.builds(
    Hook,
    hook_name=st.sampled_from(["createContainer", "prestart", "poststop"]),
    path=st.sampled_from(["/a", "/b"]),
    args=st.tuples(st.sampled_from(["x", "y"])),
)
envs = st.tuples(st.sampled_from(["A", "B", "NVIDIA_VISIBLE_DEVICES"]), st.text(max_size=3)).map(
    lambda t: f"{t[0]}={t[1]}"
)
edits = st.builds(
    Edits,
    env=st.lists(envs, max_size=4).map(tuple),
    device_nodes=st.lists(nodes, max_size=5).map(tuple),
    mounts=st.lists(mounts, max_size=5).map(tuple),
    hooks=st.lists(hooks, max_size=3).map(tuple),
    additional_gids=st.lists(st.integers(0, 5), max_size=3).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(edits)
def test_apply_twice_equals_once(e):
    """Applying the same edits twice gives the same spec as applying them once."""
    once = apply_edits(base_spec(), e)
    assert apply_edits(once, e) == once


@settings(max_examples=200, deadline=None)
@given(edits, edits)
def test_plus_is_concatenation(a, b):
    """a + b concatenates each list and Edits() is the identity of +."""
    merged = a + b
    assert merged.device_nodes == a.device_nodes + b.device_nodes
    assert merged.env == a.env + b.env
    assert (a + Edits()) == a and (Edits() + a) == a
