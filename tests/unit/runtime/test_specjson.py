"""config.json's keys are read as runc reads them: Go's encoding/json matches an object's
key to a struct field case-insensitively (Kelvin sign and long s folding to k and s), so
verification and the journal see the devices runc will create; two keys naming one field
are refused in one line, config.json left byte-identical."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict

import pytest

from nvshim.config import Config
from nvshim.errors import SpecError
from nvshim.runtime.create import plan_create
from nvshim.runtime.specjson import decode_spec

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod)")


@pytest.mark.parametrize(
    "raw,expected",
    [
        (
            '{"Linux":{"Devices":[{"PATH":"/dev/x","Major":195}]}}',
            {"linux": {"devices": [{"path": "/dev/x", "major": 195}]}},
        ),
        (
            '{"PROCESS":{"Env":["A=1"],"Capabilities":{"Bounding":["CAP_SYS_ADMIN"]}}}',
            {"process": {"env": ["A=1"], "capabilities": {"bounding": ["CAP_SYS_ADMIN"]}}},
        ),
        (
            '{"hoo\\u212as":{"CreateContainer":[{"Path":"/x"}]},"mount\\u017f":[{"Source":"/d"}]}',
            {"hooks": {"createContainer": [{"path": "/x"}]}, "mounts": [{"source": "/d"}]},
        ),
        (
            '{"Annotations":{"Io.Kubernetes":"x"},"linux":{"Sysctl":{"Net.X":"1"}}}',
            {"annotations": {"Io.Kubernetes": "x"}, "linux": {"sysctl": {"Net.X": "1"}}},
        ),
        (
            '{"Linux":{"Resources":{"Devices":[{"Allow":true,"MAJOR":195}]}}}',
            {"linux": {"resources": {"devices": [{"allow": True, "major": 195}]}}},
        ),
        ('{"ociversion":"1","Unknown":{"Linux":1}}', {"ociVersion": "1", "Unknown": {"Linux": 1}}),
    ],
    ids=[
        "linux-devices",
        "process-env-caps",
        "kelvin-and-long-s",
        "maps-keep-keys",
        "cgroup-rules",
        "unknown-kept",
    ],
)
def test_keys_get_the_field_names_runc_gives_them(raw: str, expected: Dict[str, Any]) -> None:
    """A key spelled in another case (or with a letter folding to ASCII) is the field runc
    fills; map keys and unknown objects are left as written."""
    assert decode_spec(raw.encode()) == expected


@pytest.mark.parametrize(
    "raw,message",
    [
        (
            '{"linux":{},"Linux":{"devices":[]}}',
            'keys "linux" and "Linux" of the top level both name "linux"',
        ),
        (
            '{"linux":{"devices":[],"DEVICES":[]}}',
            'keys "devices" and "DEVICES" of linux both name "devices"',
        ),
        ('{"process":{"env":[],"ENV":[]}}', 'keys "env" and "ENV" of process both name "env"'),
        (
            '{"linux":{"devices":[{"major":1,"Major":195}]}}',
            'keys "major" and "Major" of linux.devices[0] both name "major"',
        ),
    ],
    ids=["top", "linux", "process", "device"],
)
def test_two_keys_naming_one_field_are_refused(raw: str, message: str) -> None:
    """runc would merge the two; nvshim refuses the spec, naming both keys and where."""
    with pytest.raises(SpecError) as info:
        decode_spec(raw.encode())
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if os.geteuid() != 0:
        pytest.skip("the simulated GPU node needs root (mknod)")
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("keys") / "n"), gpus=2, shuffle_minors=True)


def write_bundle(tmp_path: Path, text: str) -> Path:
    bundle = tmp_path / "b"
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_text(text)
    return bundle


@needs_root
def test_a_gpu_under_a_second_linux_key_is_refused_byte_identical(
    tmp_path: Path, node: Any
) -> None:
    """A spec whose second top-level "Linux" key holds GPU 1 (runc would create it) is
    refused in one line naming the keys and the file; config.json is not touched."""
    gpu = node.gpus[1]
    text = (
        '{"process":{"env":["PATH=/bin"]},"root":{"path":"rootfs"},"linux":{},'
        f'"Linux":{{"devices":[{{"path":"/dev/gpu1","type":"c","major":195,'
        f'"minor":{gpu.minor}}}]}}}}'
    )
    bundle = write_bundle(tmp_path, text)
    with pytest.raises(SpecError) as info:
        plan_create(str(bundle), Config(driver_root=node.root))
    assert str(info.value) == (
        f'{bundle}/config.json: keys "linux" and "Linux" of the top level both name "linux" '
        "(runc matches keys case-insensitively and would merge them)"
    )
    assert (bundle / "config.json").read_text() == text


@needs_root
def test_a_gpu_under_a_miscased_linux_key_is_the_engines_grant(tmp_path: Path, node: Any) -> None:
    """A spec whose only "Linux" key holds GPU 1 is read as runc reads it: the container
    holds GPU 1 (journaled), and image env all adds no other GPU."""
    gpu = node.gpus[1]
    spec = {
        "process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]},
        "root": {"path": "rootfs"},
        "Linux": {
            "Devices": [{"Path": "/dev/gpu1", "Type": "c", "Major": 195, "Minor": gpu.minor}]
        },
    }
    plan = plan_create(str(write_bundle(tmp_path, json.dumps(spec))), Config(driver_root=node.root))
    assert plan.granted_uuids == (gpu.uuid,) and plan.request.source == "engine"
    assert plan.new_spec is not None and "Linux" not in plan.new_spec
    assert [
        d["path"]
        for d in plan.new_spec["linux"]["devices"]
        if d["major"] == 195 and d["minor"] < 254
    ] == ["/dev/gpu1"]


def test_reading_a_small_config_json_allocates_about_its_size(tmp_path: Path) -> None:
    """read_spec of a few-KiB config.json allocates a few KiB, not a buffer of the 16 MiB
    bound (reading up to the bound in one call mapped and unmapped 16 MiB per create), and
    gives the file's bytes; one over the bound is still refused."""
    import tracemalloc

    from nvshim.runtime.specjson import MAX_SPEC_BYTES, read_spec

    raw = json.dumps({"ociVersion": "1.0.2", "process": {"env": ["A=1"] * 200}}).encode()
    (tmp_path / "config.json").write_bytes(raw)
    tracemalloc.start()
    try:
        _, got, _ = read_spec(str(tmp_path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == raw
    assert peak < 1 << 20, peak
    (tmp_path / "config.json").write_bytes(b" " * MAX_SPEC_BYTES + b"{}")
    with pytest.raises(SpecError, match="larger than the"):
        read_spec(str(tmp_path))
