"""The example specs in cdi-specs/examples/ are what ``nvshim cdi generate`` makes today.

Each example is regenerated from a fresh simulated node at a fixed path
(:data:`EXAMPLE_ROOT`, so the host paths in the files are stable) with fixed hook
commands (the links hook and the params hook), and compared byte for byte with the committed file. With
``NVSHIM_REGENERATE_EXAMPLES=1`` the files are rewritten instead (see cdi-specs/README.md).
Building a simulated node needs root.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from nvshim.cdi.write import dump_spec
from nvshim.host.discovery import Host
from nvshim.node.cdigen import generate_spec

REPO_ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = REPO_ROOT / "cdi-specs" / "examples"
EXAMPLE_ROOT = "/tmp/nvshim-example-node"
HOOK = ("/opt/nvshim/venv/bin/python3", "-I", "-m", "nvshim.hook")
PARAMS_HOOK = ("/opt/nvshim/venv/bin/python3", "-I", "-m", "nvshim.params_hook")
REGENERATE = os.environ.get("NVSHIM_REGENERATE_EXAMPLES") == "1"

# file name -> create_node keyword arguments
NODES: Dict[str, Dict[str, Any]] = {
    "nvidia-2gpu.yaml": {"gpus": 2},
    "nvidia-mig.yaml": {"gpus": 1, "mig": True},
}


@contextlib.contextmanager
def _example_node(**kwargs: Any) -> Iterator[str]:
    """A fresh simulated node at EXAMPLE_ROOT, held under a lock and removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("building a simulated GPU node needs root (mknod)")
    from nvshim.sim.build import create_node

    with open(EXAMPLE_ROOT + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(EXAMPLE_ROOT, ignore_errors=True)  # a crashed run's leftover
        try:
            yield create_node(EXAMPLE_ROOT, seed=0, **kwargs).root
        finally:
            shutil.rmtree(EXAMPLE_ROOT, ignore_errors=True)


def _generate(name: str) -> str:
    with _example_node(**NODES[name]) as root:
        facts = f"{root}/nvml-facts.json"
        return dump_spec(
            generate_spec(
                Host(root, nvml_facts=facts), hook_command=HOOK, params_command=PARAMS_HOOK
            ),
            "yaml",
        )


@pytest.mark.parametrize("name", sorted(NODES))
def test_example_matches_generator(name: str) -> None:
    """The committed example equals what generate_spec makes for its simulated node."""
    text = _generate(name)
    path = EXAMPLES / name
    if REGENERATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.read_text(encoding="utf-8") == text, (
        f"{path} is out of date: regenerate with NVSHIM_REGENERATE_EXAMPLES=1 "
        "(see cdi-specs/README.md)"
    )


@pytest.mark.parametrize("name", sorted(NODES))
def test_example_validates(name: str, nvshim_bin: str) -> None:
    """`nvshim cdi validate` accepts the example with zero problems."""
    path = EXAMPLES / name
    res = subprocess.run(
        [nvshim_bin, "cdi", "validate", str(path)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout == "" and "0 problems" in res.stderr


def test_examples_directory_has_only_tested_files() -> None:
    """Every file in cdi-specs/examples/ is one this test regenerates (none goes stale unseen)."""
    assert sorted(p.name for p in EXAMPLES.iterdir()) == sorted(NODES)
