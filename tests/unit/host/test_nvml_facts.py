"""Facts only NVML knows (MIG UUIDs, CUDA version, compute capability, brand) have one
reader, :class:`nvshim.host.nvml.NvmlFacts`, and one documented seam for nodes NVML cannot
describe: the file the config names as ``nvml-facts``. Production code knows nothing of
the simulator: a simulated node's MIG devices exist only when a config names its facts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict

import pytest

from nvshim.config import Config, load_config
from nvshim.errors import ConfigError, HostError
from nvshim.host.nvml import FACTS_FORMAT, NvmlFacts
from nvshim.runtime import plancache

REPO = Path(__file__).resolve().parents[3]


#: Why NvmlFacts does not ask NVML for a driver root with no driver loaded (none here).
NO_DRIVER = (
    "no NVML: no NVIDIA driver is loaded on this host (none of /sys/module/nvidia, "
    "/proc/driver/nvidia, /dev/nvidiactl, /dev/dxg): the NVML under {} is not asked"
)


@pytest.fixture(scope="module")
def mig_node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if os.geteuid() != 0:
        pytest.skip("creating a simulated node needs root (mknod)")
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("sim") / "node"), gpus=2, mig=True)


def write_facts(path: Path, doc: Dict[str, Any]) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


# -- no simulator knowledge in production code -------------------------------------------


def test_production_code_never_names_the_simulator() -> None:
    """Only the simulator's own modules (and the commands that run it) name its files or
    import it."""
    offenders = []
    for path in sorted((REPO / "nvshim").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith("nvshim/sim/") or rel.startswith("nvshim/cli/"):
            continue  # the simulator itself; the CLI's `nvshim sim` command runs it
        if rel in ("nvshim/node/demo.py",):
            continue  # the demo builds a simulated node on purpose
        text = path.read_text()
        for needle in (
            "nvshim-sim.json",
            "nvml-facts.json",
            "SIM_METADATA",
            "from nvshim.sim",
            "import nvshim.sim",
            "from nvshim import sim",
        ):
            if needle in text:
                offenders.append(f"{rel}: {needle}")
    assert offenders == []


def test_simulated_mig_devices_are_named_by_nvml_or_the_configured_facts(
    mig_node: Any, tmp_path: Path
) -> None:
    """procfs lists MIG instances but not their UUIDs: they are named by the driver root's
    own NVML (the simulated node's library) on a host whose driver is loaded, else by the
    nvml-facts file; with neither (this host: no driver; or the library a stub without
    NVML's symbols) and no file they cannot be named."""
    import subprocess
    import sys

    from nvshim.host.elf import build_shared_object
    from nvshim.sim.build import create_node
    from nvshim.sim.model import LIB_DIR
    from tests.helpers.driverhost import as_driver_host

    want = [[m.gi, m.ci, m.uuid, m.profile] for m in mig_node.gpus[0].mig]
    stub_root = tmp_path / "stub"  # the same node (same seed), its NVML a stub
    create_node(str(stub_root), gpus=2, mig=True)
    lib = stub_root / LIB_DIR / f"libnvidia-ml.so.{mig_node.driver_version}"
    lib.write_bytes(build_shared_object("libnvidia-ml.so.1", "stub"))
    script = (
        "import json, sys\nfrom nvshim.host.discovery import Host\n"
        "facts = sys.argv[2] if len(sys.argv) > 2 else None\n"
        "print(json.dumps([[[m.gi, m.ci, m.uuid, m.profile] for m in g.mig]\n"
        "                  for g in Host(sys.argv[1], nvml_facts=facts).gpus()]))"
    )

    def named(root: str, *facts: str, driver: bool = True) -> Any:
        argv = [sys.executable, "-c", script, root, *facts]
        res = subprocess.run(
            as_driver_host(argv) if driver else argv,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    assert named(mig_node.root) == [want, []]
    assert named(str(stub_root), mig_node.nvml_facts) == [want, []]
    assert named(str(stub_root)) == [[], []]
    assert named(mig_node.root, driver=False) == [[], []]


def test_the_simulator_writes_exactly_the_facts_format(mig_node: Any) -> None:
    """The sim's nvml-facts.json is a format-1 document NvmlFacts reads back: every fact."""
    doc = json.loads(Path(mig_node.nvml_facts).read_text())
    assert doc["format"] == FACTS_FORMAT
    assert set(doc) == {"format", "cuda_version", "gpus"}
    gpu = mig_node.gpus[0]
    with NvmlFacts(mig_node.root, mig_node.nvml_facts) as facts:
        reasons: list = []
        assert facts.cuda_version(reasons) == mig_node.cuda_version
        assert facts.compute_capability(gpu.uuid, gpu.minor, reasons) == gpu.compute_capability
        assert facts.brand(gpu.uuid, gpu.minor, reasons) == gpu.brand
        assert facts.mig_devices(gpu.minor) == {(m.gi, m.ci): (m.uuid, m.profile) for m in gpu.mig}


# -- the facts file ----------------------------------------------------------------------


def test_no_facts_file_configured_says_so(tmp_path: Path) -> None:
    with NvmlFacts(str(tmp_path), None) as facts:
        reasons: list = []
        assert facts.cuda_version(reasons) is None
        assert facts.mig_devices(0) == {}
    assert reasons == [NO_DRIVER.format(tmp_path), "no nvml-facts file configured"]


def test_missing_facts_file_is_an_unknown_fact(tmp_path: Path) -> None:
    with NvmlFacts(str(tmp_path), str(tmp_path / "absent.json")) as facts:
        reasons: list = []
        assert facts.brand("GPU-x", 0, reasons) is None
        assert facts.mig_devices(0) == {}
    assert reasons[-1] == f"no nvml-facts file at {tmp_path}/absent.json"


@pytest.mark.parametrize(
    "text,message",
    [
        ("[1]", "top level must be a JSON object"),
        ('{"cuda_version": "12.4"}', "format None is not 1"),
        ('{"format": 2}', "format 2 is not 1"),
        ("{oops", "not valid JSON"),
    ],
)
def test_bad_facts_file_is_a_host_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "facts.json"
    path.write_text(text)
    with NvmlFacts(str(tmp_path), str(path)) as facts:
        with pytest.raises(HostError, match=f"^{path}: {message}"):
            facts.cuda_version([])


def test_malformed_mig_entry_names_the_file_and_gpu(tmp_path: Path) -> None:
    path = write_facts(
        tmp_path / "f.json",
        {"format": 1, "gpus": [{"minor": 3, "mig": [{"gi": "one", "ci": 0, "uuid": "MIG-x"}]}]},
    )
    with NvmlFacts(str(tmp_path), path) as facts:
        with pytest.raises(HostError, match=f"^{path}: MIG entry .* of GPU minor 3 needs"):
            facts.mig_devices(3)


def test_gpu_facts_match_by_uuid_then_minor(tmp_path: Path) -> None:
    path = write_facts(
        tmp_path / "f.json",
        {
            "format": 1,
            "gpus": [
                {"minor": 0, "uuid": "GPU-aaaa", "compute_capability": [8, 0], "brand": "Tesla"},
                {"minor": 1, "compute_capability": 9.0, "brand": "nvidia"},
            ],
        },
    )
    with NvmlFacts(str(tmp_path), path) as facts:
        reasons: list = []
        assert facts.compute_capability("gpu-AAAA", 7, reasons) == "8.0"
        assert facts.brand("GPU-aaaa", 7, reasons) == "tesla"
        assert facts.compute_capability("GPU-bbbb", 1, reasons) == "9.0"
        reasons = []
        assert facts.brand("GPU-cccc", 5, reasons) is None
    assert reasons == [NO_DRIVER.format(tmp_path), f"{path} does not list GPU-cccc"]


# -- the config key ----------------------------------------------------------------------


def test_config_key_defaults_to_none_and_takes_an_absolute_path(tmp_path: Path) -> None:
    assert Config().nvml_facts is None
    good = tmp_path / "good.yaml"
    good.write_text("nvml-facts: /run/nvidia/nvml-facts.json\n")
    assert load_config(str(good)).nvml_facts == "/run/nvidia/nvml-facts.json"
    bad = tmp_path / "bad.yaml"
    bad.write_text("nvml-facts: facts.json\n")
    with pytest.raises(ConfigError, match="nvml-facts"):
        load_config(str(bad))


# -- the plan cache notices the facts ----------------------------------------------------


def test_plan_cache_watches_the_facts_file(mig_node: Any, tmp_path: Path) -> None:
    """MIG UUIDs are cached: a changed facts file, or another one named, makes the plan stale."""
    facts = tmp_path / "facts.json"
    facts.write_text(Path(mig_node.nvml_facts).read_text())
    source = str(tmp_path / "config.yaml")
    config = Config(driver_root=mig_node.root, nvml_facts=str(facts), source=source)
    assert plancache.refresh(config).startswith("cache written to ")
    path = source[: -len(".yaml")] + ".plan.json"
    root = mig_node.root

    cached, why = plancache.load(path, root, root, str(facts))
    assert cached is not None, why
    assert [m.uuid for m in cached.gpus()[0].mig] == [m.uuid for m in mig_node.gpus[0].mig]

    cached, why = plancache.load(path, root, root, None)
    assert cached is None and "nvml-facts" in why

    doc = json.loads(facts.read_text())
    doc["gpus"][0]["mig"][0]["uuid"] = "MIG-11111111-2222-3333-4444-555555555555"
    facts.write_text(json.dumps(doc))
    cached, why = plancache.load(path, root, root, str(facts))
    assert cached is None and why == f"plan cache is stale: {facts} changed"
