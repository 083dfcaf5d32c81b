"""``nvshim doctor`` names the config a real engine's runtime reads: podman runs docs/engines.md's
wrapper (``export NVSHIM_CONFIG=…; exec nvshim-runtime "$@"``) around an installed trampoline
that embeds another config, and the config doctor says the wrapper reads is the one whose
settings the container got and whose grant journal recorded it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, List

import pytest
import yaml

from nvshim.node.compile import compile_node
from nvshim.node.install.trampoline import render
from tests.helpers.commands import run_cli
from tests.helpers.common import require_root
from tests.helpers.podman import Podman

pytestmark = pytest.mark.e2e

PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROBE = 'for n in /dev/nvidia*; do [ -c "$n" ] && echo "DEV $n"; done; true'


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A simulated 2-GPU node."""
    require_root()
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("sim") / "node"), gpus=2)


def config(path: Path, node: Any, require_allocation: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # the journal beside the config: tests never write the node's /var/lib/nvshim
    path.write_text(
        yaml.safe_dump(
            {
                "driver-root": node.root,
                "runtimes": ["runc"],
                "require-allocation": require_allocation,
                "grants-journal": str(path.parent / "grants.jsonl"),
                "cdi-spec-dirs": [str(path.parent / "cdi")],
            }
        )
    )
    compile_node(str(path))
    return path


def handler_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], given: Path, binary: Path
) -> str:
    absent = tmp_path / "absent"
    _, out, _ = run_cli(
        [
            "doctor",
            "--config",
            str(given),
            "--runtime-binary",
            str(binary),
            "--trampoline",
            str(absent / "t"),
            "--nvidia-config",
            str(absent / "nvidia.toml"),
            "--hooks-dir",
            str(absent / "hooks.d"),
            "--containerd-config",
            str(absent / "c"),
            "--docker-config",
            str(absent / "d"),
            "--crio-config",
            str(absent / "crio"),
        ],
        capsys,
    )
    found: List[str] = [line for line in out.splitlines() if " handler-config: " in line]
    assert len(found) == 1, out
    return found[0]


def test_doctor_names_the_config_podmans_wrapper_makes_the_runtime_read(
    podman: Podman, node: Any, rootfs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through docs/engines.md's wrapper podman's container gets GPU 1 under the wrapper's config
    (require-allocation off; its journal records the grant), and doctor says the wrapper reads
    that config; through the trampoline alone the GPU is stripped under the embedded config
    (require-allocation on), which doctor names for it."""
    embedded = config(tmp_path / "etc" / "config.yaml", node, True)
    wrapped = config(tmp_path / "srv" / "nvshim.yaml", node, False)
    tramp = tmp_path / "bin" / "nvshim-runtime"
    tramp.parent.mkdir()
    tramp.write_text(render(sys.executable, None, str(embedded)))
    tramp.chmod(0o755)
    wrapper = tmp_path / "bin" / "nvshim-runtime-sim"
    wrapper.write_text(f'#!/bin/sh\nexport NVSHIM_CONFIG={wrapped}\nexec {tramp} "$@"\n')
    wrapper.chmod(0o755)

    res = podman.podman_run(
        rootfs,
        ["sh", "-c", PROBE],
        env={"NVIDIA_VISIBLE_DEVICES": "1"},
        runtime=wrapper,
        podman_env={"PATH": PATH_ENV},
    )
    assert res.rc == 0, res.describe()
    assert f"DEV /dev/nvidia{node.gpus[1].minor}" in res.stdout, res.describe()
    assert (wrapped.parent / "grants.jsonl").read_text().count("\n") == 1
    assert handler_config(tmp_path, capsys, embedded, wrapper) == (
        f"ok    handler-config: runtime {wrapper} runs {wrapper} → {tramp}, which reads "
        f"{wrapped}: require-allocation off"
    )

    res = podman.podman_run(
        rootfs,
        ["sh", "-c", PROBE],
        env={"NVIDIA_VISIBLE_DEVICES": "1"},
        runtime=tramp,
        podman_env={"PATH": PATH_ENV},
    )
    assert res.rc == 0, res.describe()
    assert "DEV /dev/nvidia" not in res.stdout.replace("DEV /dev/nvidiactl", ""), res.describe()
    assert handler_config(tmp_path, capsys, wrapped, tramp) == (
        f"ok    handler-config: runtime {tramp} runs {tramp}, which reads {embedded}: "
        "require-allocation on"
    )
