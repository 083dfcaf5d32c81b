"""The simulated node's NVML: a real ``libnvidia-ml.so.<version>`` (SONAME
``libnvidia-ml.so.1``) compiled from ``nvshim/data/sim-libnvml.c`` with the machine's C
compiler, answering NVML's C ABI from the node's model.

The library reads :data:`MODEL_FILE` at the node's root (found from its own path), which
:func:`model_text` writes from the same :class:`~nvshim.sim.model.SimNode` as the device
nodes, procfs and ``nvml-facts.json``, so they agree by construction. The object is
compiled once per process (it does not depend on the node) and written into each node's
library folder with the ``NVSHIM-SIM`` marker appended (bytes after an ELF's sections, which
the loader never maps). Without a compiler the library stays the symbol-less stub and
:func:`write_nvml` says why.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile

from nvshim.sim.model import LIB_DIR, SimNode, write_bytes, write_text

__all__ = [
    "MODEL_FILE",
    "ARCHITECTURES",
    "SOURCE",
    "compiled_library",
    "memory_mib",
    "model_text",
    "profile_slices",
    "write_nvml",
]

#: The model the library reads, at the node's root.
MODEL_FILE = "nvshim-sim-nvml.txt"
#: The C source.
SOURCE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "sim-libnvml.c"
)
#: The model's architectures as NVML's ``nvmlDeviceArchitecture_t``.
ARCHITECTURES = {
    "kepler": 2,
    "maxwell": 3,
    "pascal": 4,
    "volta": 5,
    "turing": 6,
    "ampere": 7,
    "ada-lovelace": 8,
    "hopper": 9,
    "blackwell": 10,
}

_compiled: dict[str, bytes | str] = {}
_GB = re.compile(r"([0-9]+)\s*GB", re.IGNORECASE)
_PROFILE = re.compile(r"^(?:([0-9]+)c\.)?([0-9]+)g\.([0-9]+)gb")


def memory_mib(model: str) -> int:
    """A GPU's memory as NVML reports it (``NVIDIA H100 80GB HBM3``: 81,559 MiB, the
    part of 80 GiB the driver does not reserve); 0 when the name gives none."""
    found = _GB.search(model)
    return int(int(found.group(1)) * 1024 * 0.9956) if found else 0


def profile_slices(profile: str) -> tuple[int, int, int]:
    """(GPU instance slices, compute instance slices, memory MiB) of a MIG profile name
    (``3g.40gb``, ``1c.3g.40gb``): the memory a little under the name's, as NVML says it
    (go-nvlib rounds it back to the name's GB)."""
    found = _PROFILE.match(profile)
    if not found:
        return 0, 0, 0
    gi = int(found.group(2))
    return gi, int(found.group(1) or gi), int(int(found.group(3)) * 1024 * 0.98)


def model_text(node: SimNode) -> str:
    """The model file of ``node`` (its format is in the C source's header)."""
    from nvshim.host.nvml import BRANDS

    brands = {name: code for code, name in BRANDS.items()}
    major, _, minor = node.cuda_version.partition(".")
    lines = [f"driver {node.driver_version}", f"cuda {int(major) * 1000 + int(minor or 0) * 10}"]
    for gpu in node.gpus:
        cc_major, _, cc_minor = gpu.compute_capability.partition(".")
        lines.append(
            f"gpu {gpu.index} {gpu.minor} {gpu.uuid} {gpu.pci_bus_id} "
            f"{ARCHITECTURES.get(gpu.arch, 0)} {brands.get(gpu.brand, 0)} "
            f"{int(cc_major)} {int(cc_minor or 0)} {1 if gpu.mig else 0} "
            f"{memory_mib(gpu.model)} {gpu.model}"
        )
    for gpu in node.gpus:
        for mig in gpu.mig:
            gi, ci, mib = profile_slices(mig.profile)
            lines.append(
                f"mig {gpu.index} {mig.gi} {mig.ci} {mig.uuid} {mig.profile} {gi} {ci} {mib}"
            )
    return "\n".join(lines) + "\n"


def compiled_library(compiler: str | None = None) -> bytes | str:
    """The compiled library's bytes, or why there are none (no compiler, a compile error):
    compiled once per process and source."""
    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return "no C compiler (cc) to build the simulated libnvidia-ml"
    with open(SOURCE, "rb") as fh:
        source = fh.read()
    key = hashlib.sha256(source + b"\0" + cc.encode()).hexdigest()
    if key not in _compiled:
        _compiled[key] = _compile(cc, source)
    return _compiled[key]


def _compile(cc: str, source: bytes) -> bytes | str:
    with tempfile.TemporaryDirectory(prefix="nvshim-sim-nvml.") as tmp:
        out = os.path.join(tmp, "libnvidia-ml.so")
        argv = [
            cc,
            "-O2",
            "-Wall",
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            "-Wl,-soname,libnvidia-ml.so.1",
            "-o",
            out,
            "-x",
            "c",
            "-",
            "-lpthread",
        ]
        try:
            res = subprocess.run(argv, input=source, capture_output=True, timeout=120, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"cannot run {cc}: {exc}"
        if res.returncode != 0:
            first = (res.stderr.decode(errors="replace").strip().splitlines() or ["?"])[0]
            return f"{cc} could not build the simulated libnvidia-ml: {first}"
        with open(out, "rb") as fh:
            return fh.read()


def write_nvml(node: SimNode) -> str:
    """Write the model file and, where it compiles, the library over the stub in the
    node's library folder; "" or why the stub stays."""
    write_text(os.path.join(node.root, MODEL_FILE), model_text(node))
    if not node.driver_files:
        return "no driver files"
    library = compiled_library()
    if isinstance(library, str):
        return library
    name = f"libnvidia-ml.so.{node.driver_version}"
    marker = f"\0NVSHIM-SIM {name} {node.driver_version}\0".encode()
    write_bytes(os.path.join(node.root, LIB_DIR, name), library + marker, 0o644)
    return ""
