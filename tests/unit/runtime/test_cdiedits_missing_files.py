"""A create's CDI injection refuses a spec that bind-mounts a file the node lost, whatever
stale-cdi-spec says, and both that line and the stale-spec line name the fix the config
makes right: ``nvshim cdi refresh`` for a spec ``cdi-refresh`` keeps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest

from nvshim.config import Config
from nvshim.errors import CdiError
from nvshim.host.discovery import Host
from nvshim.runtime.cdiedits import inject_cdi, refresh_fix


def config_for(tmp_path: Path, **kw: Any) -> Config:
    return Config(
        driver_root=str(tmp_path / "noroot"),
        cdi_spec_dirs=(str(tmp_path / "cdi"),),
        source=str(tmp_path / "config.yaml"),
        **kw,
    )


def put_spec(tmp_path: Path, mounts: list, device_mounts: list = ()) -> str:
    (tmp_path / "cdi").mkdir(exist_ok=True)
    path = tmp_path / "cdi" / "acme.json"
    doc: Dict[str, Any] = {
        "cdiVersion": "0.5.0",
        "kind": "acme.com/dev",
        "devices": [
            {"name": "a", "containerEdits": {"env": ["A=1"], "mounts": list(device_mounts)}}
        ],
        "containerEdits": {"mounts": mounts},
    }
    path.write_text(json.dumps(doc))
    return str(path)


def bind(host: str, container: str = "/x") -> Dict[str, Any]:
    return {"hostPath": host, "containerPath": container, "options": ["ro", "bind"]}


@pytest.mark.parametrize("policy", ["warn", "refuse"])
def test_a_missing_bind_source_is_refused_naming_spec_file_count_and_fix(
    tmp_path: Path, policy: str
) -> None:
    """Two of three bind sources gone (one spec-level, one the device's): one CdiError naming
    the spec, the first missing file and the count, under warn and refuse alike."""
    gone, other = tmp_path / "libcuda.so.535.104.05", tmp_path / "libnvidia-ml.so.535.104.05"
    path = put_spec(
        tmp_path, [bind("/dev/null", "/n"), bind(str(gone), "/g")], [bind(str(other), "/o")]
    )
    config = config_for(tmp_path, stale_cdi_spec=policy)
    with pytest.raises(CdiError) as err:
        inject_cdi(["acme.com/dev=a"], config, ("compute",), Host(config.driver_root))
    assert str(err.value) == (
        f"CDI spec {path} mounts {gone}, which this node does not have (and 1 more): the spec "
        f"is older than the driver; regenerate it with nvshim cdi generate --output {path}"
    )


def test_only_bind_mounts_the_container_gets_are_checked(tmp_path: Path) -> None:
    """A tmpfs mount (its hostPath is no file) and a missing library of a capability the
    container did not ask for (libnvidia-encode: video) fail nothing."""
    put_spec(
        tmp_path,
        [
            {"hostPath": "tmpfs", "containerPath": "/t", "type": "tmpfs"},
            bind(
                str(tmp_path / "libnvidia-encode.so.550.54.15"),
                "/usr/lib/x86_64-linux-gnu/libnvidia-encode.so.550.54.15",
            ),
        ],
    )
    config = config_for(tmp_path)
    got = inject_cdi(["acme.com/dev=a"], config, ("compute",), Host(config.driver_root))
    assert [m.host_path for m in got.edits.mounts] == ["tmpfs"]
    with pytest.raises(CdiError, match="libnvidia-encode.so.550.54.15, which this node"):
        inject_cdi(["acme.com/dev=a"], config, ("compute", "video"), Host(config.driver_root))


@pytest.mark.parametrize(
    "entry",
    [
        "--output {p}",
        "-o {p}",
        "--output={p}",
        "-o{p}",
        "--class gpu --output '{p}'",
    ],
)
def test_a_spec_cdi_refresh_keeps_is_fixed_by_refresh(tmp_path: Path, entry: str) -> None:
    """Whatever way a cdi-refresh entry spells --output, its spec's fix is `run nvshim cdi
    refresh`; another spec's is `nvshim cdi generate --output`."""
    spec = str(tmp_path / "cdi" / "acme.json")
    config = config_for(
        tmp_path,
        cdi_refresh=("--output /elsewhere.yaml", entry.format(p=spec), "--output '/broken"),
    )
    assert refresh_fix(config, spec) == "run nvshim cdi refresh"
    assert refresh_fix(config, "/other.yaml") == (
        "regenerate it with nvshim cdi generate --output /other.yaml"
    )


def test_the_stale_spec_warning_names_refresh_for_a_kept_spec(tmp_path: Path) -> None:
    """A kept spec made for driver 535 (its files still there) on a 550 node warns with the
    refresh fix (stale-cdi-spec: warn)."""
    old = tmp_path / "libcuda.so.535.104.05"
    old.write_bytes(b"")
    path = put_spec(tmp_path, [bind(str(old), "/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05")])
    config = config_for(tmp_path, cdi_refresh=(f"--output {path}",))
    version = tmp_path / "noroot" / "proc" / "driver" / "nvidia" / "version"
    version.parent.mkdir(parents=True)
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar 5\n")
    got = inject_cdi(["acme.com/dev=a"], config, ("compute",), Host(config.driver_root))
    assert got.warnings == (
        f"CDI spec {path} does not match this node (it mounts libcuda.so.535.104.05, the "
        "node's driver is 550.54.15): run nvshim cdi refresh; injected anyway "
        "(stale-cdi-spec: warn)",
    )
