"""nvshim.cdi.index: a CDI name resolves from the spec index exactly as from a full scan,
loading only the specs of the requested kinds, and a stale or broken index is rebuilt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from nvshim.cdi import index as cdiindex
from nvshim.cdi.model import Registry
from nvshim.cdi.registry import load_registry, resolve_devices
from nvshim.cdi.write import dump_spec


def spec(kind: str, devices: dict) -> dict:
    return {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [{"name": n, "containerEdits": {"env": [e]}} for n, e in devices.items()],
    }


def put(directory: Path, name: str, doc) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    if isinstance(doc, str):
        path.write_text(doc)
    else:
        path.write_text(dump_spec(doc, "json" if name.endswith(".json") else "yaml"))
    return path


def node_dirs(tmp_path: Path) -> list:
    """Two spec dirs: JSON and YAML specs of two kinds, a broken file, a conflict, an override."""
    low, high = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    put(low, "a.yaml", spec("nvidia.com/gpu", {"0": "G=low0", "1": "G=low1"}))
    put(low, "b.json", spec("acme.com/fpga", {"f0": "F=0"}))
    put(low, "c.yaml", spec("nvidia.com/gpu", {"1": "G=conflict"}))
    put(low, "d.json", "{broken")
    put(high, "z.json", spec("nvidia.com/gpu", {"0": "G=high0"}))
    return [str(low), str(high)]


def problems(registry: Registry) -> list:
    return [str(p) for p in registry.problems]


def test_index_resolves_like_a_full_scan_and_loads_only_the_kind(tmp_path):
    """Devices, priority, conflicts and the problem list match load_registry; only specs of
    the requested kind are loaded."""
    dirs = node_dirs(tmp_path)
    index = str(tmp_path / "index.json")
    full = load_registry(dirs)
    for save in (True, False):  # the first builds and writes the index, the second reads it
        reg, source = cdiindex.registry_for(dirs, ["nvidia.com/gpu=0"], index, save)
        assert {n: d.device.edits for n, d in reg.devices.items()} == {
            n: d.device.edits for n, d in full.devices.items() if n.startswith("nvidia.com/gpu=")
        }
        assert problems(reg) == problems(full)
        assert {s.kind for s in reg.specs} == {"nvidia.com/gpu"}
    assert source == f"CDI index {index}"
    assert resolve_devices(reg, ["nvidia.com/gpu=0"]).env == ("G=high0",)


def test_yaml_spec_is_read_from_the_index(tmp_path):
    """A fresh index answers for a YAML spec without reading the file: its decoded document
    is in the index (so the create path never needs yaml)."""
    dirs = node_dirs(tmp_path)
    index = str(tmp_path / "index.json")
    cdiindex.refresh(dirs, index)
    doc = json.loads(Path(index).read_text())
    yaml_entry = next(e for e in doc["entries"] if e["path"].endswith("a.yaml"))
    assert yaml_entry["doc"]["devices"][0]["containerEdits"]["env"] == ["G=low0"]
    code = (
        "from nvshim.cdi import index as cdiindex; import sys\n"
        "from nvshim.cdi.registry import resolve_devices\n"
        f"reg, src = cdiindex.registry_for({dirs!r}, ['nvidia.com/gpu=1'], {index!r}, False)\n"
        "print(src.split()[1], 'nvidia.com/gpu=1' in reg.devices, "
        "resolve_devices(reg, ['nvidia.com/gpu=0']).env, 'yaml' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import sys; sys.path[0:0] = {sys.path!r}\n{code}"],
        capture_output=True,
        text=True,
    )
    # from the index; the same-directory conflict still drops gpu=1; no yaml imported
    assert out.stdout.split() == ["index", "False", "('G=high0',)", "False"], out.stderr


def test_changed_added_and_removed_specs_are_seen(tmp_path):
    """Editing, adding and removing spec files invalidates the index; the next resolution sees
    the change and writes a fresh index."""
    dirs = node_dirs(tmp_path)
    index = str(tmp_path / "index.json")
    cdiindex.refresh(dirs, index)
    high = Path(dirs[1])
    put(high, "z.json", spec("nvidia.com/gpu", {"0": "G=edited"}))
    reg, source = cdiindex.registry_for(dirs, ["nvidia.com/gpu=0"], index, True)
    assert "stale" in source and resolve_devices(reg, ["nvidia.com/gpu=0"]).env == ("G=edited",)
    put(high, "y.json", spec("nvidia.com/gpu", {"7": "G=7"}))
    reg, _ = cdiindex.registry_for(dirs, ["nvidia.com/gpu=7"], index, True)
    assert resolve_devices(reg, ["nvidia.com/gpu=7"]).env == ("G=7",)
    (high / "z.json").unlink()
    reg, _ = cdiindex.registry_for(dirs, ["nvidia.com/gpu=0"], index, True)
    assert resolve_devices(reg, ["nvidia.com/gpu=0"]).env == ("G=low0",)
    _, source = cdiindex.registry_for(dirs, ["nvidia.com/gpu=0"], index, True)
    assert source == f"CDI index {index}"


def test_corrupt_index_is_rebuilt(tmp_path):
    """An index that is not JSON, or not an index, is never trusted; it is rebuilt."""
    dirs = node_dirs(tmp_path)
    index = tmp_path / "index.json"
    for garbage in ("", "{nope", "[]", '{"format": 1, "key": {}}'):
        index.write_text(garbage)
        reg, source = cdiindex.registry_for(dirs, ["nvidia.com/gpu=0"], str(index), True)
        assert source.startswith("CDI spec scan")
        assert resolve_devices(reg, ["nvidia.com/gpu=0"]).env == ("G=high0",)
        assert cdiindex.load(str(index), dirs)[1] == ""


def test_index_others_could_write_is_not_trusted(tmp_path):
    """A group/world-writable index (it carries hooks and mounts) is ignored and rewritten 0644,
    as the config and the plan cache are, when running as root."""
    if os.geteuid() != 0:
        return  # the rule protects root only
    dirs = node_dirs(tmp_path)
    index = tmp_path / "index.json"
    cdiindex.refresh(dirs, str(index))
    doc = json.loads(index.read_text())
    for entry in doc["entries"]:  # a planted device whose env would show it was used
        if entry["doc"] is not None:
            entry["doc"]["devices"][0]["containerEdits"]["env"] = ["G=planted"]
    index.write_text(json.dumps(doc))
    os.chmod(index, 0o666)
    reg, source = cdiindex.registry_for(dirs, ["nvidia.com/gpu=0"], str(index), True)
    assert "not trusted" in source
    assert all(d.device.edits.env != ("G=planted",) for d in reg.devices.values())
    assert os.stat(index).st_mode & 0o777 == 0o644


def _gpu_spec(libs: list, nodes: list) -> dict:
    """An nvidia.com/gpu spec: ``libs`` mounted by the spec, one device per (name, node)."""
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "containerEdits": {"mounts": [{"hostPath": p, "containerPath": p} for p in libs]},
        "devices": [
            {"name": name, "containerEdits": {"deviceNodes": [node]}} for name, node in nodes
        ],
    }


def test_stale_specs_names_the_used_spec_and_every_reason(tmp_path):
    """Another driver's libcuda/libnvidia-ml, a missing device node and one numbered otherwise
    make the spec a device is injected from stale; SONAME links, own-versioned libraries and
    the node's own version do not, and neither do specs (or devices) not injected."""
    lib = "/usr/lib/x86_64-linux-gnu"
    null = {"path": "/dev/nvnull", "hostPath": "/dev/null", "type": "c", "major": 1, "minor": 3}
    odd = dict(null, minor=5)
    gone = {
        "path": "/dev/nvidia7",
        "hostPath": str(tmp_path / "dev" / "nvidia7"),
        "type": "c",
        "major": 195,
        "minor": 7,
    }
    put(
        tmp_path / "cdi",
        "old.yaml",
        _gpu_spec(
            [
                f"{lib}/libcuda.so.1",
                f"{lib}/libnvidia-egl-wayland.so.1.1.13",
                f"{lib}/libnvidia-ml.so.535.104.05",
            ],
            [("0", null), ("1", odd), ("7", gone)],
        ),
    )
    put(
        tmp_path / "cdi",
        "ok.json",
        dict(_gpu_spec([f"{lib}/libcuda.so.550.54.15"], [("x", null)]), kind="acme.com/gpu"),
    )
    reg = load_registry([str(tmp_path / "cdi")])
    old = str(tmp_path / "cdi" / "old.yaml")
    head = f"CDI spec {old} does not match this node ("
    tail = f"): regenerate it with nvshim cdi generate --output {old}"
    version = "it mounts libnvidia-ml.so.535.104.05, the node's driver is 550.54.15"

    assert cdiindex.stale_specs(reg, ["acme.com/gpu=x"], "550.54.15") == []
    assert cdiindex.stale_specs(reg, ["nvidia.com/gpu=0"], "550.54.15") == [head + version + tail]
    assert cdiindex.stale_specs(reg, ["nvidia.com/gpu=0"], "535.104.05") == []
    assert cdiindex.stale_specs(reg, ["nvidia.com/gpu=0"], None) == []
    assert cdiindex.stale_specs(
        reg, ["nvidia.com/gpu=1", "nvidia.com/gpu=7", "nvidia.com/gpu=9"], "535.104.05"
    ) == [
        head
        + f"/dev/null is 1:3 on the node, 1:5 in the spec; {gone['hostPath']} does not exist"
        + tail
    ]


def test_memo_parses_once_and_sees_an_edited_spec_at_once(tmp_path):
    """With a resident process's IndexMemo the index and its YAML specs are parsed once and
    reused while unchanged, and a YAML spec edited afterwards resolves to its new content
    on the very next call, as without the memo."""
    dirs = [str(tmp_path / "cdi")]
    put(tmp_path / "cdi", "a.yaml", spec("nvidia.com/gpu", {"0": "G=old"}))
    index = str(tmp_path / "index.json")
    cdiindex.registry_for(dirs, ["nvidia.com/gpu=0"], index, True)  # writes the index
    cdiindex.use_memo(cdiindex.IndexMemo())
    try:
        seen = []
        for _ in range(2):
            reg, source = cdiindex.registry_for(dirs, ["nvidia.com/gpu=0"], index, True)
            assert source == f"CDI index {index}"
            seen.append(reg.devices["nvidia.com/gpu=0"])
        assert seen[0].spec is seen[1].spec  # parsed once
        put(tmp_path / "cdi", "a.yaml", spec("nvidia.com/gpu", {"0": "G=new"}))
        for _ in range(2):  # the first rebuilds the index, the second reads the new one
            reg, _ = cdiindex.registry_for(dirs, ["nvidia.com/gpu=0"], index, True)
            assert reg.devices["nvidia.com/gpu=0"].device.edits.env == ("G=new",)
    finally:
        cdiindex.use_memo(None)
