"""The device-token grammar (NVIDIA_VISIBLE_DEVICES and the ids device plugins hand over)
and tokens onto this node's GPUs and MIG devices: nvshim.host.devices."""

from __future__ import annotations

import pytest

from nvshim.errors import RequestError
from nvshim.host.devices import (
    GpuRef,
    MigRef,
    describe_indices,
    normalize_pci,
    parse_visible_devices,
    select_gpus,
)

U0 = "GPU-11111111-2222-3333-4444-555555555550"
U1 = "GPU-11111111-2222-3333-4444-555555555551"
M0 = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeee0"

GRAMMAR = [
    ("", ()),
    ("   ", ()),
    ("void", ()),
    ("VOID", ()),
    ("0,void", ()),
    (",,", ()),
    ("none", ("none",)),
    ("None", ("none",)),
    ("all", ("all",)),
    ("ALL", ("all",)),
    ("0,all", ("all",)),
    ("none,0", ("none",)),
    ("0", ("0",)),
    (" 0 , 1 ", ("0", "1")),
    ("1,0", ("1", "0")),
    ("0,0", ("0",)),
    ("0,1,0, 1", ("0", "1")),
    (U0, (U0,)),
    (U0.lower(), (U0,)),
    ("gpu-" + U0[4:].upper(), (U0,)),
    (f"{U0},{U0.upper().replace('GPU-', 'gpu-')}", (U0,)),
    (f"{U0}::3", (U0,)),
    ("0::1,0::2", ("0",)),
    (M0, (M0,)),
    ("0:1", ("0:1",)),
    ("0000:18:00.0", ("0000:18:00.0",)),
    ("nvidia.com/gpu=1", ("nvidia.com/gpu=1",)),
    ("nvidia.com/gpu=all", ("nvidia.com/gpu=all",)),
    ("0,nvidia.com/gpu=1", ("0", "nvidia.com/gpu=1")),
]


@pytest.mark.parametrize("value,expected", GRAMMAR)
def test_visible_devices_grammar(value, expected):
    """Every form of NVIDIA_VISIBLE_DEVICES normalises to the expected tokens."""
    assert parse_visible_devices(value) == expected


GPUS = (
    GpuRef(0, U0, "0000:18:00.0"),
    GpuRef(1, U1, "0000:3b:00.0", (MigRef(1, 0, M0),)),
    GpuRef(2, "GPU-11111111-2222-3333-4444-555555555552", "0000:86:00.0"),
    GpuRef(3, "GPU-11111111-2222-3333-4444-555555555553", "0000:af:00.0"),
)


@pytest.mark.parametrize(
    "tokens,indices,migs",
    [
        (("all",), [0, 1, 2, 3], [M0]),
        (("1",), [1], []),
        (("01",), [1], []),
        (("2", "0"), [2, 0], []),
        ((U1,), [1], []),
        ((U1.lower(),), [1], []),
        (("0000:3b:00.0",), [1], []),
        (("3b:00.0",), [1], []),
        (("00000000:3B:00.0",), [1], []),
        ((M0,), [], [M0]),
        (("1:0",), [], [M0]),
        (("0", U0), [0], []),
    ],
)
def test_select_gpus(tokens, indices, migs):
    """Indices, UUIDs, PCI ids and MIG forms select the right devices, duplicates collapse."""
    gpus, mig = select_gpus(tokens, GPUS)
    assert [g.index for g in gpus] == indices
    assert [m.uuid for m in mig] == migs


@pytest.mark.parametrize(
    "token,message",
    [
        ("7", 'unknown device "7": this node has GPUs 0-3'),
        (
            "GPU-11111111-2222-3333-4444-55555555555",
            'unknown device "GPU-11111111-2222-3333-4444-55555555555": this node has GPUs 0-3',
        ),
        ("GPU-99999999-2222-3333-4444-555555555550", "unknown device"),
        ("0000:99:00.0", 'unknown device "0000:99:00.0"'),
        ("0:5", 'unknown device "0:5": this node has GPUs 0-3 and MIG devices 1:0'),
        ("../etc", 'unknown device "../etc"'),
        ("gpu0", 'unknown device "gpu0"'),
    ],
)
def test_unknown_tokens(token, message):
    """An unknown token is one error naming it and what the node has."""
    with pytest.raises(RequestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        select_gpus((token,), GPUS)


def test_unknown_mig_on_a_node_without_named_mig_devices_points_at_nvml_facts():
    """No MIG device known at all: the error says where MIG names come from."""
    plain = tuple(g for g in GPUS if not g.mig)
    with pytest.raises(RequestError, match="MIG devices none; .*config nvml-facts$"):
        select_gpus(("0:0",), plain)


@pytest.mark.parametrize(
    "token,gpus,message",
    [
        (
            "7",
            GPUS,
            'unknown device "7": this node has GPUs 0-3 under driver root /r (config /c.yaml)',
        ),
        (
            "0",
            (),
            'unknown device "0": this node has no GPUs under driver root /r (config /c.yaml)',
        ),
        (
            "0:5",
            GPUS,
            'unknown device "0:5": this node has GPUs 0-3 and MIG devices 1:0 under '
            "driver root /r (config /c.yaml)",
        ),
        (
            "0:0",
            (),
            'unknown device "0:0": this node has no GPUs and MIG devices none under '
            "driver root /r (config /c.yaml); MIG devices are named by NVML or, "
            "without it, by config nvml-facts",
        ),
    ],
)
def test_unknown_tokens_say_where_they_were_looked_up(token, gpus, message):
    """The caller's ``where`` (driver root and config) follows what the node has, before any hint."""
    with pytest.raises(RequestError) as info:
        select_gpus((token,), gpus, "under driver root /r (config /c.yaml)")
    assert str(info.value) == message


def test_unknown_on_empty_node():
    """On a node without GPUs the error says so."""
    with pytest.raises(RequestError, match='unknown device "0": this node has no GPUs'):
        select_gpus(("0",), ())


@pytest.mark.parametrize(
    "ids,text",
    [([], "none"), ([0], "0"), ([0, 1, 2, 3], "0-3"), ([0, 2, 3], "0,2-3"), ([3, 1], "1,3")],
)
def test_describe_indices(ids, text):
    """GPU index sets are summarised as ranges."""
    assert describe_indices(ids) == text


@pytest.mark.parametrize(
    "raw,norm",
    [
        ("18:00.0", "0000:18:00.0"),
        ("00000000:18:00.0", "0000:18:00.0"),
        ("0000:AF:00.1", "0000:af:00.1"),
        ("zz:00.0", None),
        ("18:00", None),
    ],
)
def test_normalize_pci(raw, norm):
    """PCI bus ids compare in one canonical form."""
    assert normalize_pci(raw) == norm
