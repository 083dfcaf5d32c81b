"""nvshim.runtime.extras: who gets IMEX channels and NVSwitch/GDS/MOFED/gdrcopy devices (tables), the
edits a simulated node gives for them, and the IMEX CDI spec."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from nvshim.cdi.schema import validate_spec
from nvshim.config import Config
from nvshim.errors import CdiError, RequestError
from nvshim.runtime.claim import image_view, read_claim
from nvshim.runtime.extras import (
    FEATURE_ENV,
    IMEX_ENV,
    Extras,
    extras_edits,
    generate_imex_spec,
    resolve_extras,
)
from nvshim.runtime.request import resolve_request

UUID = "GPU-11111111-2222-3333-4444-555555555555"
IMEX_MOUNT = "/var/run/nvidia-container-devices/imex/"


def decide(
    env: Dict[str, str],
    config: Config,
    mounts: Optional[List[str]] = None,
    privileged: bool = False,
) -> Extras:
    spec: Dict[str, Any] = {
        "process": {
            "env": [f"{k}={v}" for k, v in env.items()],
            "capabilities": {"bounding": ["CAP_SYS_ADMIN"] if privileged else []},
        },
        "mounts": [{"destination": IMEX_MOUNT + m, "source": "/dev/null"} for m in mounts or []],
        "linux": {"resources": {"devices": [{"allow": privileged, "access": "rwm"}]}},
    }
    claim = read_claim(image_view(spec), config)
    return resolve_extras(claim, config, resolve_request(claim, config))


OPEN = Config()
STRICT = Config(require_allocation=True)


@pytest.mark.parametrize(
    ("env", "features"),
    [
        ({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_GDS": "enabled"}, ("gds",)),
        ({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_MOFED": " Enabled "}, ("mofed",)),
        (
            {
                "NVIDIA_VISIBLE_DEVICES": "0",
                "NVIDIA_NVSWITCH": "enabled",
                "NVIDIA_GDRCOPY": "enabled",
            },
            ("nvswitch", "gdrcopy"),
        ),
        ({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_GDS": "true"}, ()),
        ({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_GDS": ""}, ()),
        ({"NVIDIA_VISIBLE_DEVICES": "none", "NVIDIA_GDS": "enabled"}, ("gds",)),
        ({"NVIDIA_VISIBLE_DEVICES": "void", "NVIDIA_GDS": "enabled"}, ()),
        ({"NVIDIA_GDS": "enabled"}, ()),
    ],
)
def test_feature_flags(env: Dict[str, str], features: tuple) -> None:
    """A feature is on only with the value "enabled" and only for a container granted GPUs
    (or driver files)."""
    assert decide(env, OPEN).features == features


def test_features_follow_require_allocation() -> None:
    """An image's =all stripped by require-allocation brings no features either."""
    extras = decide({"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_GDS": "enabled"}, STRICT)
    assert extras.features == () and any("granted no GPU" in n for n in extras.notes)
    granted = decide({"NVIDIA_VISIBLE_DEVICES": UUID, "NVIDIA_GDS": "enabled"}, STRICT)
    assert granted.features == ("gds",)


def test_fabric_flags_are_off_under_require_allocation_unless_configured() -> None:
    """Under require-allocation a container holding one GPU gets no MOFED or NVSwitch
    devices from its own env (no allocation covers them), with a note naming the key that
    allows them; require-allocation-features turns each on; GDS and gdrcopy stay on."""
    env = {"NVIDIA_VISIBLE_DEVICES": UUID, **{v: "enabled" for v in FEATURE_ENV.values()}}
    strict = decide(env, STRICT)
    assert strict.features == ("gds", "gdrcopy")
    assert [n for n in strict.notes if "require-allocation-features" in n] == [
        "NVIDIA_NVSWITCH=enabled ignored: require-allocation is on and nvswitch is not in "
        "require-allocation-features (no allocation covers the node's nvswitch devices)",
        "NVIDIA_MOFED=enabled ignored: require-allocation is on and mofed is not in "
        "require-allocation-features (no allocation covers the node's mofed devices)",
    ]
    allowed = Config(require_allocation=True, require_allocation_features=("mofed",))
    assert decide(env, allowed).features == ("mofed",)
    assert decide(env, OPEN).features == ("nvswitch", "gds", "mofed", "gdrcopy")


@pytest.mark.parametrize(
    ("value", "channels"),
    [
        ("0", (0,)),
        ("3,1, 3", (3, 1)),
        ("channel2", (2,)),
        ("", ()),
        ("void", ()),
        ("none", ()),
        ("all", ()),
        ("1048575", (1048575,)),
    ],
)
def test_imex_env_grammar(value: str, channels: tuple) -> None:
    assert decide({"NVIDIA_IMEX_CHANNELS": value}, OPEN).imex_channels == channels


@pytest.mark.parametrize("value", ["1048576", "-1", "x", "channel", "0x1", "chan1"])
def test_imex_env_bad_tokens(value: str) -> None:
    with pytest.raises(RequestError, match="IMEX channel"):
        decide({"NVIDIA_IMEX_CHANNELS": value}, OPEN)


def test_imex_mount_id_with_a_trailing_newline_is_no_channel() -> None:
    """A device-plugin mount .../imex/1<newline> names no channel: refused, not read as channel 1."""
    with pytest.raises(RequestError, match="IMEX channel .* in device-plugin mounts"):
        decide({}, OPEN, mounts=["1\n"])


def test_imex_sources_and_require_allocation() -> None:
    """Mounts win over env; under require-allocation env counts only when privileged with the
    privileged source, mounts only with the volume-mounts source."""
    both = decide({"NVIDIA_IMEX_CHANNELS": "0"}, OPEN, mounts=["4"])
    assert (both.imex_channels, both.imex_source) == ((4,), "volume-mounts")
    assert decide({"NVIDIA_IMEX_CHANNELS": "0"}, STRICT).imex_channels == ()
    assert decide({"NVIDIA_IMEX_CHANNELS": "0"}, STRICT, privileged=True).imex_channels == (0,)
    sys_admin_only = image_view(
        {
            "process": {
                "env": ["NVIDIA_IMEX_CHANNELS=0"],
                "capabilities": {"bounding": ["CAP_SYS_ADMIN"]},
            },
            "linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}]}},
        }
    )
    claim = read_claim(sys_admin_only, STRICT)
    assert resolve_extras(claim, STRICT, resolve_request(claim, STRICT)).imex_channels == ()
    assert decide({}, STRICT, mounts=["1", "2"]).imex_channels == (1, 2)
    no_mounts = Config(require_allocation=True, allocation_sources=("envvar-uuids",))
    assert decide({}, no_mounts, mounts=["1"]).imex_channels == ()
    shy = Config(accept_envvar_when_unprivileged=False)
    assert decide({"NVIDIA_IMEX_CHANNELS": "0"}, shy).imex_channels == ()


@pytest.fixture
def node(tmp_path: Path) -> Any:
    if os.geteuid() != 0:
        pytest.skip("simulated nodes need root (mknod)")
    from nvshim.host.discovery import Host
    from nvshim.sim.build import create_node

    sim = create_node(
        str(tmp_path / "node"),
        gpus=1,
        imex_channels=3,
        nvswitches=1,
        gds=True,
        mofed=True,
        gdrcopy=True,
    )
    return Host(sim.root)


def test_edits_per_feature(node: Any) -> None:
    """Each feature brings exactly its class's nodes (stat'ed: type, major, minor)."""

    def paths(**kw: Any) -> List[str]:
        return sorted(n.path for n in extras_edits(node, Extras(**kw)).edits.device_nodes)

    assert paths(features=("gdrcopy",)) == ["/dev/gdrdrv"]
    assert paths(features=("gds",)) == [f"/dev/nvidia-fs{i}" for i in range(4)]
    assert paths(features=("nvswitch",)) == ["/dev/nvidia-nvswitch0", "/dev/nvidia-nvswitchctl"]
    assert paths(features=("mofed",)) == ["/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0"]
    assert paths(imex_channels=(2, 0)) == [
        "/dev/nvidia-caps-imex-channels/channel0",
        "/dev/nvidia-caps-imex-channels/channel2",
    ]
    gds = extras_edits(node, Extras(features=("gds",))).edits
    assert [m.container_path for m in gds.mounts] == ["/etc/cufile.json"]
    assert "ro" in gds.mounts[0].options
    node_rec = extras_edits(node, Extras(features=("gdrcopy",))).edits.device_nodes[0]
    assert (node_rec.type, node_rec.major, node_rec.minor) == ("c", 509, 0)


def test_fabric_features_give_what_the_reference_gives(node: Any) -> None:
    """MOFED is the verbs nodes and rdma_cm only (never umad, nor issm, which lets a process
    act as the subnet manager); NVSwitch is its device nodes only (the fabric manager's
    socket comes with the utility capability, as in the reference)."""
    ib = node.dev_path("/dev/infiniband")
    assert sorted(os.listdir(ib)) == ["issm0", "rdma_cm", "umad0", "uverbs0"]
    mofed = extras_edits(node, Extras(features=("mofed",))).edits
    assert sorted(n.path for n in mofed.device_nodes) == [
        "/dev/infiniband/rdma_cm",
        "/dev/infiniband/uverbs0",
    ]
    nvswitch = extras_edits(node, Extras(features=("nvswitch",))).edits
    assert nvswitch.mounts == ()
    assert sorted(n.path for n in nvswitch.device_nodes) == [
        "/dev/nvidia-nvswitch0",
        "/dev/nvidia-nvswitchctl",
    ]


def test_missing_channel_and_missing_feature(node: Any, tmp_path: Path) -> None:
    """An absent channel is an error listing the node's; an absent feature is a note."""
    with pytest.raises(
        RequestError,
        match=r"IMEX channel 9 \(from env\) does not exist: "
        r"this node has channels 0, 1, 2",
    ):
        extras_edits(node, Extras(imex_channels=(9,), imex_source="env"))
    from nvshim.host.discovery import Host
    from nvshim.sim.build import create_node

    bare = Host(create_node(str(tmp_path / "bare"), gpus=1).root)
    got = extras_edits(bare, Extras(features=("gds",)))
    assert not got.edits
    assert got.notes == ("NVIDIA_GDS=enabled: this node has no gds devices",)


def test_imex_cdi_spec(node: Any, tmp_path: Path) -> None:
    """The IMEX spec: kind nvidia.com/imex-channel, one device per channel, valid CDI."""
    spec = generate_imex_spec(node)
    assert spec["kind"] == "nvidia.com/imex-channel"
    assert [d["name"] for d in spec["devices"]] == ["0", "1", "2"]
    assert (
        spec["devices"][1]["containerEdits"]["deviceNodes"][0]["path"]
        == "/dev/nvidia-caps-imex-channels/channel1"
    )
    assert validate_spec(spec) == []
    from nvshim.host.discovery import Host
    from nvshim.sim.build import create_node

    with pytest.raises(CdiError, match="no IMEX channels"):
        generate_imex_spec(Host(create_node(str(tmp_path / "bare"), gpus=1).root))


@pytest.mark.parametrize(
    "env,mounts,asks",
    [
        ({"NVIDIA_IMEX_CHANNELS": ""}, [], True),
        ({"NVIDIA_NVSWITCH": "enabled"}, [], True),
        ({"NVIDIA_GDS": "x"}, [], True),
        ({"NVIDIA_MOFED": "enabled"}, [], True),
        ({"NVIDIA_GDRCOPY": "enabled"}, [], True),
        ({}, ["3"], True),
        ({"NVIDIA_VISIBLE_DEVICES": "0"}, [], False),
    ],
)
def test_the_claim_says_whether_extras_are_asked_for(
    env: Dict[str, str], mounts: List[str], asks: bool
) -> None:
    """create loads nvshim.runtime.extras only when the claim names an IMEX channel or a
    feature variable (FEATURE_ENV, IMEX_ENV: the claim's own names, re-exported here)."""
    from nvshim.runtime.claim import FEATURE_ENV as CLAIMED
    from nvshim.runtime.claim import IMEX_ENV as CLAIMED_IMEX

    assert (FEATURE_ENV, IMEX_ENV) == (CLAIMED, CLAIMED_IMEX)
    spec: Dict[str, Any] = {
        "process": {"env": [f"{k}={v}" for k, v in env.items()]},
        "mounts": [{"destination": IMEX_MOUNT + m, "source": "/dev/null"} for m in mounts],
    }
    assert read_claim(image_view(spec), OPEN).asks_for_extras is asks
