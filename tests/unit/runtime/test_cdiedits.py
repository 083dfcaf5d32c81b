"""A create's CDI names become edits in one call (cdiedits.inject_cdi): resolved from the
spec index, checked against what nvshim can apply and against the node, device nodes filled
through the host seam, driver files cut to the capabilities asked for."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nvshim.config import Config
from nvshim.errors import CdiError, HostError
from nvshim.host.discovery import Host
from nvshim.runtime.cdiedits import inject_cdi
from nvshim.runtime.create import plan_create

NULL = {"path": "/dev/nvnull", "hostPath": "/dev/null"}  # a real node on every machine


def config_for(tmp_path: Path, **kw) -> Config:
    """A config whose spec dir and CDI index live in ``tmp_path`` (nothing read from /etc)."""
    return Config(
        driver_root=str(tmp_path / "noroot"),
        cdi_spec_dirs=(str(tmp_path / "cdi"),),
        source=str(tmp_path / "config.yaml"),
        **kw,
    )


def put_spec(tmp_path: Path, name: str, doc: dict) -> str:
    (tmp_path / "cdi").mkdir(exist_ok=True)
    path = tmp_path / "cdi" / name
    path.write_text(json.dumps(doc))
    return str(path)


def spec(kind: str, devices: dict, edits: dict | None = None) -> dict:
    doc = {
        "cdiVersion": "1.1.0",
        "kind": kind,
        "devices": [{"name": n, "containerEdits": e} for n, e in devices.items()],
    }
    if edits is not None:
        doc["containerEdits"] = edits
    return doc


def create(tmp_path: Path, config: Config, visible: str):
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "config.json").write_text(
        json.dumps({"process": {"env": [f"NVIDIA_VISIBLE_DEVICES={visible}"]}, "mounts": []})
    )
    return plan_create(str(bundle), config)


def test_one_call_resolves_fills_and_says_where_the_registry_came_from(tmp_path: Path) -> None:
    """inject_cdi gives the names' edits with the device node's type and numbers filled from
    the host node (/dev/null is c 1:3), and the registry's source."""
    put_spec(
        tmp_path, "acme.json", spec("acme.com/dev", {"a": {"deviceNodes": [NULL], "env": ["A=1"]}})
    )
    config = config_for(tmp_path)
    got = inject_cdi(["acme.com/dev=a"], config, ("compute",), Host(config.driver_root))
    (node,) = got.edits.device_nodes
    assert (node.path, node.type, node.major, node.minor) == ("/dev/nvnull", "c", 1, 3)
    assert got.edits.env == ("A=1",) and got.warnings == ()
    assert got.source.startswith("CDI spec scan (")


def test_device_nodes_are_stated_through_the_host_it_is_given(tmp_path: Path) -> None:
    """The host paths of a spec's device nodes are read through the Host seam inject_cdi is
    given (a fake machine root here), not through a Host of its own."""
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    root = tmp_path / "machine"
    (root / "dev").mkdir(parents=True)
    os.mknod(root / "dev" / "nvidia9", 0o666 | 0o020000, os.makedev(195, 9))
    put_spec(
        tmp_path,
        "gpu.json",
        spec("nvidia.com/gpu", {"9": {"deviceNodes": [{"path": "/dev/nvidia9"}]}}),
    )
    config = config_for(tmp_path)
    with pytest.raises(HostError, match='CDI device node host path "/dev/nvidia9" does not exist'):
        inject_cdi(
            ["nvidia.com/gpu=9"],
            config,
            ("compute",),
            Host(config.driver_root),
            paths=Host(str(tmp_path / "empty")),
        )
    got = inject_cdi(
        ["nvidia.com/gpu=9"], config, ("compute",), Host(config.driver_root), paths=Host(str(root))
    )
    (node,) = got.edits.device_nodes
    assert (node.type, node.major, node.minor) == ("c", 195, 9)


@pytest.mark.parametrize(
    "where,field,value",
    [
        ("device", "netDevices", [{"hostInterfaceName": "eth1", "name": "net0"}]),
        ("device", "intelRdt", {"closID": "gpu"}),
        ("spec", "intelRdt", {}),
        ("spec", "netDevices", [{"hostInterfaceName": "ib0", "name": "ib0"}]),
    ],
)
def test_edits_nvshim_cannot_apply_are_refused_not_dropped(
    tmp_path: Path, where: str, field: str, value
) -> None:
    """A CDI device whose edits (its own or its spec's) set netDevices or intelRdt fails the
    create in one line naming the device, the field and the spec file: the container would
    otherwise run without its NIC or its RDT class, silently."""
    edits = {"env": ["A=1"], field: value} if where == "device" else {"env": ["A=1"]}
    top = {field: value, "env": ["S=1"]} if where == "spec" else None
    path = put_spec(tmp_path, "acme.json", spec("acme.com/nic", {"eth": edits}, top))
    with pytest.raises(CdiError) as err:
        create(tmp_path, config_for(tmp_path), "acme.com/nic=eth")
    line = str(err.value)
    assert line.startswith("CDI device acme.com/nic=eth: ") and "\n" not in line
    assert f"set {field} ({path}), which nvshim-runtime cannot apply" in line


def test_a_device_without_such_fields_is_not_refused_for_its_neighbour(tmp_path: Path) -> None:
    """Only what is injected counts: another device of the same spec may carry netDevices."""
    put_spec(
        tmp_path,
        "acme.json",
        spec(
            "acme.com/nic",
            {
                "eth": {"netDevices": [{"hostInterfaceName": "eth1", "name": "net0"}]},
                "plain": {"env": ["P=1"]},
            },
        ),
    )
    plan = create(tmp_path, config_for(tmp_path), "acme.com/nic=plain")
    assert "P=1" in plan.new_spec["process"]["env"]


def test_unknown_name_names_the_config(tmp_path: Path) -> None:
    """An unresolvable name is one CdiError that also says which config was used."""
    put_spec(tmp_path, "acme.json", spec("acme.com/dev", {"a": {"env": ["A=1"]}}))
    config = config_for(tmp_path)
    with pytest.raises(CdiError, match=r"unresolvable CDI devices acme.com/dev=b .*\(config "):
        inject_cdi(["acme.com/dev=b"], config, ("compute",), Host(config.driver_root))
