"""The engine interface (:mod:`nvshim.node.engines.api`): containerd, Docker and CRI-O answer
configure's and doctor's questions through the same calls and records."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from nvshim.node.engines.api import ENGINES, EngineRuntimes, engine

DOCTOR = Path(__file__).resolve().parents[4] / "nvshim" / "node" / "doctor"


def write_config(name: str, tmp_path: Path) -> str:
    """A config for engine ``name`` that names runtime ``nvshim`` (binary /x/nvshim-runtime)
    and makes runc the default."""
    if name == "containerd":
        path = tmp_path / "config.toml"
        path.write_text(
            'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
            'default_runtime_name = "runc"\n'
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvshim]\n'
            'runtime_type = "io.containerd.runc.v2"\n'
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvshim.options]\n'
            'BinaryName = "/x/nvshim-runtime"\n'
        )
    elif name == "docker":
        path = tmp_path / "daemon.json"
        path.write_text(
            json.dumps(
                {"default-runtime": "runc", "runtimes": {"nvshim": {"path": "/x/nvshim-runtime"}}}
            )
        )
    else:
        path = tmp_path / "crio.conf"
        path.write_text(
            '[crio.runtime]\ndefault_runtime = "runc"\n'
            '[crio.runtime.runtimes.nvshim]\nruntime_path = "/x/nvshim-runtime"\n'
        )
    return str(path)


@pytest.mark.parametrize("name", ENGINES)
def test_every_engine_reads_its_runtimes_into_one_record(name: str, tmp_path: Path) -> None:
    """Each engine reads its config into an EngineRuntimes: the nvshim runtime with its
    binary, runc as the default, and a label, binary key and fix text for doctor."""
    chosen = engine(name)
    path = write_config(name, tmp_path)
    assert chosen.present(path)
    assert not chosen.present(str(tmp_path / "none" / "config"))
    seen = chosen.read(path)
    assert isinstance(seen, EngineRuntimes)
    assert seen.handlers["nvshim"] == "/x/nvshim-runtime"
    assert seen.default == "runc"
    assert chosen.runtimes(path)["nvshim"] == "/x/nvshim-runtime"
    assert chosen.label and chosen.binary_key and path in chosen.plain_default(path)


def test_doctor_asks_engines_through_the_interface() -> None:
    """No doctor module reads Docker's or CRI-O's config through the engine's own module:
    they ask :func:`nvshim.node.engines.api.engine` (only Docker's ``--gpus`` hook names, a
    Docker-only question, come from its module)."""
    direct = []
    for module in sorted(DOCTOR.glob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in (
                "nvshim.node.engines.docker",
                "nvshim.node.engines.crio",
            ):
                direct += [
                    f"{module.name}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name not in ("GPUS_HOOK", "DOCKERD_PATH", "is_gpus_hook")
                ]
    assert direct == []
