"""Device numbers in config.json read as runc uses them: runc keeps the low 32 bits of a
``major``/``minor`` (``uint32(int64)``), so a number outside 0..2^32-1 would alias another
device (195 + 2^32 is the GPU major 195); such a spec is refused in one line naming the value
and where it is, before anything else reads its devices (the engine's grant, the journal).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest

from nvshim.config import Config
from nvshim.errors import SpecError
from nvshim.runtime.claim import image_view
from nvshim.runtime.create import plan_create

GPU = {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1}


def spec(devices: Any = (), rules: Any = ()) -> Dict[str, Any]:
    return {
        "process": {"env": ["PATH=/bin"]},
        "root": {"path": "rootfs"},
        "linux": {"devices": list(devices), "resources": {"devices": list(rules)}},
    }


@pytest.mark.parametrize(
    ("text", "where", "value"),
    [
        (spec([{**GPU, "major": 195 + 2**32}]), "linux.devices[0].major", 195 + 2**32),
        (spec([{**GPU, "minor": 1 + 2**32}]), "linux.devices[0].minor", 1 + 2**32),
        (spec([{**GPU, "major": 195 - 2**32}]), "linux.devices[0].major", 195 - 2**32),
        (spec([{**GPU, "major": -1}]), "linux.devices[0].major", -1),
        (
            spec([], [{"allow": True, "type": "c", "major": 195 + 2**32, "access": "rw"}]),
            "linux.resources.devices[0].major",
            195 + 2**32,
        ),
        (
            spec([], [{"allow": True, "type": "c", "major": 195, "minor": -2, "access": "rw"}]),
            "linux.resources.devices[0].minor",
            -2,
        ),
    ],
    ids=[
        "major-alias",
        "minor-alias",
        "negative-alias",
        "device-minus-one",
        "rule-alias",
        "rule-negative",
    ],
)
def test_a_device_number_runc_would_truncate_is_refused(
    text: Dict[str, Any], where: str, value: int
) -> None:
    """A major or minor outside 0..2^32-1 (a cgroup rule's -1 wildcard aside) in linux.devices or its cgroup rules is refused, naming the value and the field."""
    with pytest.raises(SpecError) as info:
        image_view(text)
    msg = str(info.value)
    assert where in msg and str(value) in msg and "\n" not in msg


def test_numbers_runc_uses_as_written_are_read_as_written() -> None:
    """0..2^32-1 and a cgroup rule's -1 wildcard are kept: the GPU is seen as 195:1."""
    view = image_view(
        spec(
            [GPU, {**GPU, "path": "/dev/x", "minor": 2**32 - 1}],
            [{"allow": True, "type": "a", "major": -1, "minor": -1, "access": "rwm"}],
        )
    )
    assert view.char_devices == ((195, 1, "/dev/nvidia1"), (195, 2**32 - 1, "/dev/x"))
    assert view.all_devices_allowed


def test_a_create_holding_an_aliased_gpu_fails_and_leaves_config_json(tmp_path: Path) -> None:
    """A create whose spec names 195+2^32:1 fails in one line and config.json stays byte-identical (the GPU is neither passed unverified nor unjournaled)."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    raw = json.dumps(spec([{**GPU, "major": 195 + 2**32}]))
    (bundle / "config.json").write_text(raw)
    with pytest.raises(SpecError) as info:
        plan_create(str(bundle), Config(require_allocation=True, grants_journal=None))
    assert str(bundle / "config.json") in str(info.value)
    assert (bundle / "config.json").read_text() == raw
