"""The trampoline's fast path finds a GPU the engine injected at any container path, by its
device number in config.json, and keeps every pod without one off Python.

The trampoline is the rendered sh script with a recorder as its "python" and another as
its runtime (tests/unit/node/install/test_trampoline.py's ``world``): which one ran says which path the
create took. Each case runs on both of the trampoline's roads (``road``): its own ``grep``,
and the agent's client reading config.json itself (``--scan``) when the agent's socket and
client are there, with a socket that refuses every connection, so that a create the scan
sends on reaches Python.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from nvshim.config import prefixes_path
from nvshim.node.compile import compile_node
from nvshim.node.install.trampoline import ere_literal, render
from tests.helpers.agent import built_client
from tests.unit.node.install.test_trampoline import (  # noqa: F401 - world is a fixture
    mark_compiled,
    run_tramp,
    world,
)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent's client, built from this checkout."""
    return built_client(tmp_path_factory.mktemp("client"))


@pytest.fixture(params=["grep", "client"])
def road(
    request: pytest.FixtureRequest,
    world: Dict[str, Path],  # noqa: F811 - the fixture's value
    client: Path,
) -> Iterator[Dict[str, Path]]:
    """``world`` on one of the trampoline's two roads: ``grep`` (no agent's client) or
    ``client`` (its socket there, bound but not listening: the client's scan decides,
    and a create it sends on finds no agent and reaches Python). Its compiled annotation
    prefixes are written as ``nvshim config compile`` writes them (ERE literals)."""
    Path(prefixes_path(str(world["config"]))).write_text(ere_literal("cdi.k8s.io/") + "\n")
    mark_compiled(world["config"])
    if request.param == "grep":
        yield world
        return
    path = world["tmp"] / "agent.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as refusing:
        refusing.bind(str(path))
        tramp = render(str(world["tmp"] / "fakepython"), agent_socket=str(path), client=str(client))
        world["tramp"].write_text(tramp)
        yield world


def create(world: Dict[str, Path], spec: str) -> bool:  # noqa: F811 - the fixture's value
    """Write ``spec`` as the bundle's config.json, run create; True when Python ran."""
    (world["cwd"] / "config.json").write_text(spec)
    res = run_tramp(world, ["create", "--bundle", str(world["cwd"]), "x"], {})
    assert res.returncode == 0, res.stderr
    ran = (world["tmp"] / "py.argv").exists()
    for rec in ("py.argv", "py.env", "rt.argv", "rt.env"):
        (world["tmp"] / rec).unlink(missing_ok=True)
    return ran


def pod(devices: Any, rules: Any = ()) -> Dict[str, Any]:
    """A containerd-like spec with no NVIDIA text, ``devices`` in linux.devices and the
    default cgroup rules (/dev/null, ttys, /dev/pts, tun) plus ``rules``."""
    defaults = [{"allow": False, "access": "rwm"}] + [
        {"allow": True, "type": "c", "major": m, "minor": n, "access": "rwm"}
        for m, n in (
            (1, 3),
            (1, 5),
            (1, 7),
            (5, 0),
            (5, 1),
            (1, 8),
            (1, 9),
            (5, 2),
            (136, None),
            (10, 200),
            (10, 229),
        )
    ]
    return {
        "ociVersion": "1.0.2",
        "process": {"env": ["PATH=/bin", "HOME=/root"]},
        "root": {"path": "rootfs"},
        "linux": {"devices": list(devices), "resources": {"devices": defaults + list(rules)}},
    }


GPU1 = {"path": "/dev/gpu1", "type": "c", "major": 195, "minor": 1}
CARD1 = {"path": "/dev/dri/card1", "type": "c", "major": 195, "minor": 1}
CAPS = {"path": "/dev/mig-cap", "type": "c", "major": 237, "minor": 12}
FUSE = {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}


@pytest.mark.parametrize(
    "text",
    [
        json.dumps(pod([GPU1])),
        json.dumps(pod([CARD1]), indent="\t"),
        json.dumps(pod([CAPS]), indent=2),
        json.dumps(pod([FUSE], [{"allow": True, "type": "c", "major": 195, "access": "rw"}])),
        json.dumps(pod([GPU1])).replace('"major"', '"MAJOR"'),
        json.dumps(pod([GPU1])).replace('"major": 195', '"major":\n195'),
        json.dumps(pod([GPU1])).replace('"major": 195', '"major"\r\n :195'),
        json.dumps(pod([{**GPU1, "major": 511}])),
        json.dumps(pod([{**GPU1, "major": 195 + 2**32}])),
        json.dumps(pod([{**GPU1, "major": 195 - 2**32}])),
        json.dumps(
            pod([FUSE], [{"allow": True, "type": "c", "major": 195 + 2**33, "access": "rw"}])
        ),
    ],
    ids=[
        "gpu1",
        "dri-card1-tabs",
        "dynamic-major",
        "cgroup-rule-only",
        "key-case",
        "value-next-line",
        "key-alone-on-its-line",
        "major-511",
        "major-195-plus-2-32",
        "major-negative-alias",
        "cgroup-rule-alias",
    ],
)
def test_a_spec_holding_a_gpu_by_number_reaches_python(road: Dict[str, Path], text: str) -> None:
    """A device numbered like an NVIDIA node (195, or a dynamic major, or a number outside
    32 bits whose low 32 bits runc keeps) anywhere in the spec, at any path, in any layout
    or key case, sends the create to Python."""
    assert create(road, text)


@pytest.mark.parametrize(
    "text",
    [
        json.dumps(pod([])),
        json.dumps(pod([FUSE]), indent=2),
        json.dumps(pod([{**FUSE, "major": 1950}])),
        json.dumps(pod([{**FUSE, "major": 19}])),
    ],
    ids=["no-device", "fuse", "major-1950", "major-19"],
)
def test_a_pod_without_an_nvidia_number_stays_off_python(road: Dict[str, Path], text: str) -> None:
    """containerd's default device rules and another driver's fixed-major node keep the
    no-Python fast path."""
    assert not create(road, text)


def test_compiled_annotation_prefixes_match_literally(road: Dict[str, Path]) -> None:
    """Prefixes are compiled as grep -E literals: ``a+b/`` matches itself, not ``aab/``;
    ``example.com/`` does not match ``exampleXcom/`` (the client reads them back as
    literals)."""
    road["config"].write_text(
        f"runtimes: [{road['runtime']}]\nannotation-prefixes: [a+b/, example.com/]\n"
    )
    compile_node(str(road["config"]))

    def annotated(key: str) -> str:
        return json.dumps({**pod([]), "annotations": {key: "x"}})

    assert create(road, annotated("a+b/dev"))
    assert create(road, annotated("example.com/dev"))
    assert not create(road, annotated("aab/dev"))
    assert not create(road, annotated("exampleXcom/dev"))
