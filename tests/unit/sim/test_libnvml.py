"""The simulated node's libnvidia-ml (nvshim/sim/libnvml.py, nvshim/data/sim-libnvml.c):
a real shared library that pynvml loads, answering from the node's model; nvshim's NVML
path (the driver root's own NVML) held to the procfs path and the facts file."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from nvshim.host.elf import read_soname
from nvshim.sim.build import create_node
from nvshim.sim.libnvml import MODEL_FILE, SOURCE, compiled_library
from nvshim.sim.model import LIB_DIR
from tests.helpers.driverhost import as_driver_host

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc)")
pytestmark = needs_cc

#: Asked in a child process: pynvml keeps one library per process, and a test's answer must
#: be what a fresh nvshim would see.
PROBE = r"""
import json, sys
import pynvml as p
from nvshim.host.nvml import load_pynvml
load_pynvml(sys.argv[1])
out = {}
try:
    p.nvmlDeviceGetCount()
except p.NVMLError as e:
    out["before_init"] = e.value
p.nvmlInit()
out["driver"] = p.nvmlSystemGetDriverVersion()
out["cuda"] = p.nvmlSystemGetCudaDriverVersion_v2()
gpus = []
for i in range(p.nvmlDeviceGetCount()):
    h = p.nvmlDeviceGetHandleByIndex(i)
    g = {"uuid": p.nvmlDeviceGetUUID(h), "minor": p.nvmlDeviceGetMinorNumber(h),
         "bus": p.nvmlDeviceGetPciInfo(h).busId, "name": p.nvmlDeviceGetName(h),
         "cc": list(p.nvmlDeviceGetCudaComputeCapability(h)),
         "brand": p.nvmlDeviceGetBrand(h), "arch": p.nvmlDeviceGetArchitecture(h),
         "mig_mode": list(p.nvmlDeviceGetMigMode(h)),
         "memory": p.nvmlDeviceGetMemoryInfo(h).total, "migs": []}
    assert p.nvmlDeviceGetIndex(p.nvmlDeviceGetHandleByUUID(g["uuid"])) == i
    if g["mig_mode"][0]:
        for j in range(p.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                m = p.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except p.NVMLError as e:
                assert e.value == p.NVML_ERROR_NOT_FOUND
                continue
            parent = p.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
            assert p.nvmlDeviceGetUUID(parent) == g["uuid"]
            g["migs"].append({"uuid": p.nvmlDeviceGetUUID(m),
                              "gi": p.nvmlDeviceGetGpuInstanceId(m),
                              "ci": p.nvmlDeviceGetComputeInstanceId(m),
                              "name": p.nvmlDeviceGetName(m)})
    gpus.append(g)
out["gpus"] = gpus
errors = {}
for name, call in [("index", lambda: p.nvmlDeviceGetHandleByIndex(len(gpus))),
                   ("uuid", lambda: p.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")),
                   ("mig_of_whole", lambda: p.nvmlDeviceGetGpuInstanceId(p.nvmlDeviceGetHandleByIndex(0)))]:
    try:
        call()
        errors[name] = 0
    except p.NVMLError as e:
        errors[name] = e.value
out["errors"] = errors
p.nvmlShutdown()
print(json.dumps(out))
"""


def probe(root: str) -> Dict[str, Any]:
    res = subprocess.run(
        as_driver_host([sys.executable, "-c", PROBE, root]),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("gpus,mig", [(1, False), (8, False), (256, False), (4, True)])
def test_pynvml_sees_the_model(tmp_path: Path, gpus: int, mig: bool) -> None:
    """pynvml, loading the node's own libnvidia-ml.so.1, answers what the model says: driver and CUDA versions, each GPU's UUID, minor, PCI bus id (NVML's 8-digit domain), name, compute capability, brand, architecture, MIG mode and memory, every MIG device with its instance ids and parent; NVML's codes for a call before nvmlInit (Uninitialized), an index past the last GPU (Invalid Argument), an unknown UUID (Not Found) and a MIG-only call on a whole GPU (Not Supported)."""
    node = create_node(str(tmp_path / "node"), gpus=gpus, mig=mig)
    got = probe(node.root)
    assert (got["driver"], got["cuda"]) == (node.driver_version, 12040)
    assert got["before_init"] == 1
    assert got["errors"] == {"index": 2, "uuid": 6, "mig_of_whole": 3}
    assert len(got["gpus"]) == gpus
    for seen, gpu in zip(got["gpus"], node.gpus, strict=True):
        assert seen["uuid"] == gpu.uuid and seen["minor"] == gpu.minor
        assert seen["bus"] == "0000" + gpu.pci_bus_id.upper()
        assert seen["name"] == gpu.model and seen["cc"] == [9, 0]
        assert (seen["brand"], seen["arch"]) == (14, 9)  # NVIDIA, Hopper
        assert seen["mig_mode"] == [int(bool(gpu.mig))] * 2
        assert seen["memory"] == 81559 << 20
        assert [(m["uuid"], m["gi"], m["ci"]) for m in seen["migs"]] == [
            (m.uuid, m.gi, m.ci) for m in gpu.mig
        ]
        assert all(
            m["name"] == f"{gpu.model} MIG {m2.profile}"
            for m, m2 in zip(seen["migs"], gpu.mig, strict=True)
        )


def test_the_library_is_a_real_nvml_with_its_soname_and_versioned_symbols(tmp_path: Path) -> None:
    """The node's libnvidia-ml.so.<version> has SONAME libnvidia-ml.so.1, exports the versioned entry points the real library does (nvmlInit_v2, nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetPciInfo_v3, nvmlComputeInstanceGetInfo_v2) beside the plain ones, keeps the simulator's marker, and the model file agrees with the node it was written from."""
    node = create_node(str(tmp_path / "node"), gpus=2, mig=True)
    lib = Path(node.root) / LIB_DIR / f"libnvidia-ml.so.{node.driver_version}"
    assert read_soname(str(lib)) == "libnvidia-ml.so.1"
    assert f"NVSHIM-SIM {lib.name} {node.driver_version}".encode() in lib.read_bytes()
    loaded = ctypes.CDLL(str(lib))
    for name in (
        "nvmlInit",
        "nvmlInit_v2",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlComputeInstanceGetInfo_v2",
        "nvmlDeviceGetMigDeviceHandleByIndex",
    ):
        assert hasattr(loaded, name), name
    assert not hasattr(loaded, "load")  # internals stay hidden
    model = (Path(node.root) / MODEL_FILE).read_text().splitlines()
    assert [line.split()[3] for line in model if line.startswith("gpu ")] == [
        g.uuid for g in node.gpus
    ]
    assert [line.split()[4] for line in model if line.startswith("mig ")] == [
        m.uuid for g in node.gpus for m in g.mig
    ]


def test_bad_handles_and_pointers_get_nvml_codes_not_a_crash(tmp_path: Path) -> None:
    """Called through ctypes as any C program would: a handle the library never gave (a stray pointer, NULL), NULL output pointers and a buffer too small are Invalid Argument or Insufficient Size, never a crash; after the last nvmlShutdown every call is Uninitialized."""
    node = create_node(str(tmp_path / "node"), gpus=2)
    script = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
h = ctypes.c_void_p()
buf = ctypes.create_string_buffer(96)
out = [lib.nvmlInit_v2(), lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)),
       lib.nvmlDeviceGetUUID(ctypes.c_void_p(12345), buf, 96),
       lib.nvmlDeviceGetUUID(None, buf, 96),
       lib.nvmlDeviceGetUUID(h, None, 96),
       lib.nvmlDeviceGetUUID(h, buf, 5),
       lib.nvmlDeviceGetCount_v2(None),
       lib.nvmlDeviceGetHandleByUUID(None, ctypes.byref(h)),
       lib.nvmlShutdown(), lib.nvmlDeviceGetCount_v2(ctypes.byref(ctypes.c_uint())),
       lib.nvmlShutdown()]
print(out)
"""
    lib = str(Path(node.root) / LIB_DIR / "libnvidia-ml.so.1")
    res = subprocess.run(
        [sys.executable, "-c", script, lib], capture_output=True, text=True, timeout=60, check=False
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[0, 0, 2, 2, 2, 7, 2, 2, 0, 1, 1]"


def test_without_its_model_the_library_says_no_driver(tmp_path: Path) -> None:
    """The library away from its node (mounted into a container, say: no model at the root its path implies) fails nvmlInit with Driver Not Loaded, as NVML on a machine without the driver does."""
    node = create_node(str(tmp_path / "node"), gpus=1)
    (Path(node.root) / MODEL_FILE).unlink()
    lib = str(Path(node.root) / LIB_DIR / "libnvidia-ml.so.1")
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "import ctypes, sys; print(ctypes.CDLL(sys.argv[1]).nvmlInit_v2())",
            lib,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.stdout.strip() == "9", res.stderr


def test_nvshims_nvml_path_gives_what_procfs_and_the_facts_file_give(tmp_path: Path) -> None:
    """On a simulated node with MIG, run as on a host whose driver is loaded, nvshim's discovery through NVML (the driver root's own library) lists the same GPUs as its procfs path, with the same MIG devices (UUID, instance ids, profile), and NVML's CUDA version, compute capabilities and brands are the facts file's: the model is the single source of all three."""
    node = create_node(str(tmp_path / "node"), gpus=3, mig=True)
    script = r"""
import json, sys
from nvshim.host.discovery import Host
from nvshim.host.gpus import find_gpus
from nvshim.host.nvml import NvmlFacts
root, facts_file = sys.argv[1], sys.argv[2]
def gpus(method):
    found, source = find_gpus(Host(root), method)
    return source, [[g.index, g.minor, g.uuid, g.pci_bus_id, g.model,
                     [[m.gi, m.ci, m.uuid, m.profile] for m in g.mig]] for g in found]
def facts(f):
    r = []
    return [f.cuda_version(r), [[f.compute_capability(g.uuid, g.minor, r),
                                  f.brand(g.uuid, g.minor, r), sorted(f.mig_devices(g.minor).items())]
                                 for g in find_gpus(Host(root), "procfs")[0]], r]
with NvmlFacts(root, None) as f:
    nvml = facts(f)
    used = f.session() is not None
with NvmlFacts("/nonexistent-root", facts_file) as f:
    filed = facts(f)
print(json.dumps({"nvml": gpus("nvml"), "procfs": gpus("procfs"), "facts_nvml": nvml,
                  "facts_file": filed, "used": used}))
"""
    res = subprocess.run(
        as_driver_host([sys.executable, "-c", script, node.root, node.nvml_facts]),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["used"] is True
    assert got["nvml"][0] == "nvml" and got["procfs"][0] == "procfs"
    assert got["nvml"][1] == got["procfs"][1]
    assert [g[5] for g in got["procfs"][1]][0]  # GPU 0's MIG devices, named through NVML
    nvml_facts, file_facts = got["facts_nvml"], got["facts_file"]
    assert nvml_facts[:2] == file_facts[:2] and nvml_facts[2] == []


def test_the_library_builds_and_runs_under_asan(tmp_path: Path) -> None:
    """The library's source, built with AddressSanitizer and UndefinedBehaviorSanitizer into a program that walks a MIG node through every entry point with good and bad input, twice (init, use, shutdown), finishes with no report."""
    node = create_node(str(tmp_path / "node"), gpus=3, mig=True)
    driver = tmp_path / "walk.c"
    driver.write_text(WALK)
    # the program stands where the library would, so that it finds the node's model
    exe = Path(node.root) / LIB_DIR / "nvml-walk"
    res = subprocess.run(
        [
            "cc",
            "-g",
            "-O1",
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer",
            "-o",
            str(exe),
            SOURCE,
            str(driver),
            "-ldl",
            "-lpthread",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if res.returncode != 0 and "asan" in res.stderr.lower():
        pytest.skip(f"no AddressSanitizer runtime here: {res.stderr.splitlines()[0]}")
    assert res.returncode == 0, res.stderr
    run = subprocess.run(
        [str(exe)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "ASAN_OPTIONS": "detect_leaks=1"},
    )
    assert (run.returncode, run.stderr) == (0, ""), run.stderr
    assert run.stdout.split() == ["gpus=3", "migs=2", "gpus=3", "migs=2"]


WALK = r"""
#include <stdio.h>
#include <string.h>
typedef void *h_t;
typedef struct { char a[16]; unsigned d, b, v, p, s; char id[32]; } pci_t;
typedef struct { unsigned long long t, f, u; } mem_t;
typedef struct { h_t dev; unsigned id, prof, start, size; } gii_t;
typedef struct { h_t dev; h_t gi; unsigned id, prof, start, size; } cii_t;
typedef struct { unsigned n[10]; unsigned long long mb; } gpi_t;
typedef struct { unsigned n[9]; } cpi_t;
typedef struct { unsigned n[8]; unsigned long long mb; } attr_t;
int nvmlInit_v2(void); int nvmlShutdown(void);
int nvmlDeviceGetCount_v2(unsigned *); int nvmlDeviceGetHandleByIndex_v2(unsigned, h_t *);
int nvmlDeviceGetUUID(h_t, char *, unsigned); int nvmlDeviceGetName(h_t, char *, unsigned);
int nvmlDeviceGetPciInfo_v3(h_t, pci_t *); int nvmlDeviceGetMemoryInfo(h_t, mem_t *);
int nvmlDeviceGetHandleByUUID(const char *, h_t *);
int nvmlDeviceGetHandleByPciBusId_v2(const char *, h_t *);
int nvmlDeviceGetMaxMigDeviceCount(h_t, unsigned *);
int nvmlDeviceGetMigDeviceHandleByIndex(h_t, unsigned, h_t *);
int nvmlDeviceGetGpuInstanceId(h_t, unsigned *); int nvmlDeviceGetComputeInstanceId(h_t, unsigned *);
int nvmlDeviceGetGpuInstanceById(h_t, unsigned, h_t *); int nvmlGpuInstanceGetInfo(h_t, gii_t *);
int nvmlGpuInstanceGetComputeInstanceById(h_t, unsigned, h_t *);
int nvmlComputeInstanceGetInfo_v2(h_t, cii_t *);
int nvmlDeviceGetGpuInstanceProfileInfo(h_t, unsigned, gpi_t *);
int nvmlGpuInstanceGetComputeInstanceProfileInfo(h_t, unsigned, unsigned, cpi_t *);
int nvmlDeviceGetAttributes_v2(h_t, attr_t *);
int nvmlSystemGetDriverVersion(char *, unsigned); int nvmlSystemGetNVMLVersion(char *, unsigned);
const char *nvmlErrorString(int);
int nvmlEventSetCreate(h_t *); int nvmlEventSetFree(h_t);
int nvmlDeviceGetSupportedEventTypes(h_t, unsigned long long *);
int nvmlDeviceRegisterEvents(h_t, unsigned long long, h_t);
int nvmlEventSetWait_v2(h_t, void *, unsigned);
int nvmlDeviceGetTopologyCommonAncestor(h_t, h_t, int *);
int nvmlDeviceGetNvLinkState(h_t, unsigned, int *);
int main(void) {
    char s[96];
    for (int round = 0; round < 2; round++) {
        if (nvmlInit_v2() || nvmlInit_v2()) return 1;
        unsigned n = 0, migs = 0;
        nvmlDeviceGetCount_v2(&n);
        nvmlSystemGetDriverVersion(s, 1); nvmlSystemGetNVMLVersion(s, sizeof s);
        for (unsigned i = 0; i <= n; i++) {
            h_t d = 0, back = 0, m = 0, gi = 0, ci = 0;
            pci_t pci; mem_t mem; gii_t gii; cii_t cii; gpi_t gpi; cpi_t cpi; attr_t at;
            unsigned max = 0, x;
            if (nvmlDeviceGetHandleByIndex_v2(i, &d)) continue;
            nvmlDeviceGetUUID(d, s, sizeof s); nvmlDeviceGetHandleByUUID(s, &back);
            nvmlDeviceGetName(d, s, 3); nvmlDeviceGetPciInfo_v3(d, &pci);
            nvmlDeviceGetHandleByPciBusId_v2(pci.id, &back);
            nvmlDeviceGetHandleByPciBusId_v2("0", &back);
            nvmlDeviceGetMemoryInfo(d, &mem); nvmlDeviceGetAttributes_v2(d, &at);
            for (unsigned p = 0; p < 40; p++) nvmlDeviceGetGpuInstanceProfileInfo(d, p, &gpi);
            nvmlDeviceGetMaxMigDeviceCount(d, &max);
            for (unsigned j = 0; j <= max + 1; j++) {
                if (nvmlDeviceGetMigDeviceHandleByIndex(d, j, &m)) continue;
                migs++;
                nvmlDeviceGetUUID(m, s, sizeof s); nvmlDeviceGetName(m, s, sizeof s);
                nvmlDeviceGetAttributes_v2(m, &at);
                nvmlDeviceGetGpuInstanceId(m, &x);
                if (nvmlDeviceGetGpuInstanceById(d, x, &gi)) return 2;
                nvmlGpuInstanceGetInfo(gi, &gii);
                nvmlDeviceGetComputeInstanceId(m, &x);
                if (nvmlGpuInstanceGetComputeInstanceById(gi, x, &ci)) return 3;
                nvmlComputeInstanceGetInfo_v2(ci, &cii);
                for (unsigned p = 0; p < 12; p++)
                    for (unsigned e = 0; e < 2; e++)
                        nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, p, e, &cpi);
                nvmlGpuInstanceGetInfo(d, &gii);  /* a whole GPU is no instance */
            }
            nvmlDeviceGetUUID((h_t)((char *)d + 1), s, sizeof s);  /* a stray pointer */
            h_t set = 0, first = 0;
            unsigned long long types = 0, data[4];
            int level, on;
            nvmlDeviceGetHandleByIndex_v2(0, &first);
            if (nvmlDeviceGetTopologyCommonAncestor(d, first, &level)) return 5;
            if (nvmlDeviceGetNvLinkState(d, 0, &on) != 3) return 6;
            if (nvmlEventSetCreate(&set) || nvmlDeviceGetSupportedEventTypes(d, &types)
                || nvmlDeviceRegisterEvents(d, types, set)
                || nvmlEventSetWait_v2(set, data, 1) != 10 || nvmlEventSetFree(set)
                || nvmlEventSetFree(set) != 2 || nvmlDeviceRegisterEvents(d, types, set) != 2)
                return 7;
        }
        for (int e = 0; e < 1000; e++) strlen(nvmlErrorString(e));
        printf("gpus=%u migs=%u\n", n, migs);
        if (nvmlShutdown() || nvmlShutdown() || !nvmlShutdown()) return 4;
    }
    return 0;
}
"""


def test_no_compiler_keeps_the_stub_and_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without a C compiler the simulator says why, and the node keeps the symbol-less stub (with its model written): the node is still built."""
    assert compiled_library(str(tmp_path / "no-cc")).startswith("cannot run")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    assert compiled_library() == "no C compiler (cc) to build the simulated libnvidia-ml"
    node = create_node(str(tmp_path / "node"), gpus=1)
    lib = Path(node.root) / LIB_DIR / f"libnvidia-ml.so.{node.driver_version}"
    assert b"nvmlInit" not in lib.read_bytes()
    assert (Path(node.root) / MODEL_FILE).is_file()
