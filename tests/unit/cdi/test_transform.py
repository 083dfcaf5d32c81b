"""``nvshim cdi transform root`` and ``nvshim cdi generate --hook-path``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml
from click.testing import CliRunner

from nvshim.cdi.check import check_semantics
from nvshim.cdi.transform import transform_root
from nvshim.cli.cmd_cdi import generate, transform
from nvshim.errors import UsageError

DRIVER = "/run/nvidia/driver"
SPEC: Dict[str, Any] = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "devices": [
        {
            "name": "0",
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": f"{DRIVER}/dev/nvidia0"}]
            },
        }
    ],
    "containerEdits": {
        "deviceNodes": [{"path": "/run/nvidia/driver/dev/nvidiactl"}],
        "mounts": [
            {
                "hostPath": f"{DRIVER}/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
                "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
                "options": ["ro", "nosuid", "nodev", "bind"],
            },
            {"hostPath": "/run/nvidia/driver2/keep", "containerPath": "/keep", "options": ["bind"]},
        ],
        "hooks": [
            {
                "hookName": "createContainer",
                "path": f"{DRIVER}/usr/bin/nvshim",
                "args": ["nvshim", "hook"],
            }
        ],
    },
}


def test_transform_moves_host_paths_by_components() -> None:
    """hostPaths, a node's implied host path and the hook path move; a sibling prefix
    (/run/nvidia/driver2) and container paths do not."""
    out, changed = transform_root(SPEC, DRIVER, "/")
    edits = out["containerEdits"]
    assert out["devices"][0]["containerEdits"]["deviceNodes"][0] == {"path": "/dev/nvidia0"}
    assert edits["deviceNodes"][0] == {
        "path": DRIVER + "/dev/nvidiactl",
        "hostPath": "/dev/nvidiactl",
    }
    assert edits["mounts"][0]["hostPath"] == "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
    assert edits["mounts"][1]["hostPath"] == "/run/nvidia/driver2/keep"
    assert edits["hooks"][0]["path"] == "/usr/bin/nvshim"
    assert changed == 4
    assert SPEC["containerEdits"]["mounts"][0]["hostPath"].startswith(DRIVER)  # input intact
    assert check_semantics(out) == []


def test_transform_round_trip_and_container_side() -> None:
    """/ → A → / is the identity for host paths; --relative-to container moves only those."""
    there, _ = transform_root(SPEC, DRIVER, "/")
    back, _ = transform_root(there, "/", "/srv/drv")
    assert back["containerEdits"]["mounts"][0]["hostPath"].startswith("/srv/drv/usr/lib/")
    moved, changed = transform_root(SPEC, "/usr/lib", "/opt/lib", relative_to="container")
    assert (
        moved["containerEdits"]["mounts"][0]["containerPath"]
        == "/opt/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
    )
    assert moved["containerEdits"]["mounts"][0]["hostPath"].startswith(DRIVER)
    assert changed == 1


@pytest.mark.parametrize(("old", "new"), [("relative", "/"), ("/", "x")])
def test_transform_needs_absolute_roots(old: str, new: str) -> None:
    with pytest.raises(UsageError, match="not an absolute path"):
        transform_root(SPEC, old, new)


def test_transform_cli(tmp_path: Path) -> None:
    """The command reads a file, writes the result (format by extension) and counts moves."""
    source = tmp_path / "in.yaml"
    source.write_text(yaml.safe_dump(SPEC))
    out = tmp_path / "out.json"
    result = CliRunner().invoke(
        transform,
        ["root", "--from", DRIVER, "--to", "/", "--input", str(source), "--output", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert "moved 4 paths" in result.stderr
    assert json.loads(out.read_text())["containerEdits"]["hooks"][0]["path"] == "/usr/bin/nvshim"
    stdout = CliRunner().invoke(
        transform, ["root", "--from", DRIVER, "--to", "/", "--input", str(source)]
    )
    assert yaml.safe_load(stdout.stdout)["kind"] == "nvidia.com/gpu"
    help_text = CliRunner().invoke(transform, ["root", "--help"]).output
    assert "--relative-to" in help_text and "/run/nvidia/driver" in help_text


@pytest.mark.skipif(os.geteuid() != 0, reason="simulated nodes need root (mknod)")
def test_generate_hook_path(tmp_path: Path) -> None:
    """--hook-path makes the spec's hook `PATH hook …`, naming no venv interpreter."""
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=1)
    result = CliRunner().invoke(
        generate,
        ["--driver-root", node.root, "--format", "json", "--hook-path", "/usr/local/bin/nvshim"],
    )
    assert result.exit_code == 0, result.output
    hooks = json.loads(result.stdout)["containerEdits"]["hooks"]
    assert hooks[0]["path"] == "/usr/local/bin/nvshim"
    assert hooks[0]["args"][:2] == ["/usr/local/bin/nvshim", "hook"]
    assert "venv" not in json.dumps(hooks) and "python" not in json.dumps(hooks)
    bad = CliRunner().invoke(generate, ["--driver-root", node.root, "--hook-path", "nvshim"])
    assert bad.exit_code != 0


def test_transform_moves_the_params_hooks_host_file() -> None:
    """The host file after nvshim's params hook's --params moves with the driver root (it
    is the driver's proc/driver/nvidia/params); other hook arguments stay."""
    spec = json.loads(json.dumps(SPEC))
    spec["containerEdits"]["hooks"].append(
        {
            "hookName": "createContainer",
            "path": "/usr/bin/nvshim",
            "args": ["nvshim", "params-hook", "--params", f"{DRIVER}/proc/driver/nvidia/params"],
        }
    )
    out, _ = transform_root(spec, DRIVER, "/")
    assert out["containerEdits"]["hooks"][-1]["args"] == [
        "nvshim",
        "params-hook",
        "--params",
        "/proc/driver/nvidia/params",
    ]
    assert spec["containerEdits"]["hooks"][-1]["args"][-1].startswith(DRIVER)
