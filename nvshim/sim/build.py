"""A simulated GPU node: the driver root a real NVIDIA host has, as a directory tree.

:func:`create_node` writes, under ``root`` (device nodes under ``dev_root`` when given):

* ``dev/nvidia<minor>`` (char 195:minor) per GPU, ``dev/nvidiactl`` (195:255),
  ``dev/nvidia-modeset`` (195:254), ``dev/nvidia-uvm`` and ``dev/nvidia-uvm-tools``
  (510:0, 510:1), all mode 0666; with MIG, ``dev/nvidia-caps/nvidia-cap<m>`` (237:m).
* ``proc/devices`` (the character-device majors: ``nvidia-frontend`` 195, ``nvidia-uvm``
  510, ``nvidia-caps`` 237), ``proc/driver/nvidia/version``, ``params`` and
  ``gpus/<pci bus id>/information`` in the kernel module's formats; with MIG,
  ``proc/driver/nvidia-caps/mig-minors`` and ``proc/driver/nvidia/capabilities/...``
  access files (:mod:`nvshim.sim.kernel`).
* the driver branch's libraries in ``usr/lib/x86_64-linux-gnu/`` (``lib<X>.so.<version>``,
  each a tiny loadable ELF with the real SONAME and a ``NVSHIM-SIM <file> <version>`` marker
  string, plus SONAME links and ``.so`` links for libcuda/libnvidia-ml), ``vdpau/``,
  ``etc/ld.so.cache`` listing the links (new layout), ``etc/ld.so.conf``
  (:mod:`nvshim.sim.driver`, as the next item); the 32-bit copies of libcuda, NVML, the
  GL/EGL and video libraries … (ELF32 i386 stubs, ``SIM_LIBRARIES32``) in
  ``usr/lib/i386-linux-gnu/`` with their SONAME links and i386 cache entries.
* ``usr/bin/nvidia-smi`` (a POSIX sh script labelled ``SIMULATED nvidia-smi (nvshim sim)``
  that lists the GPUs whose ``/dev/nvidia<minor>`` it can see; ``NVSHIM_SIM_DEV``
  overrides ``/dev``), labelled stubs of the other driver binaries, GSP firmware files,
  the ``run/nvidia-persistenced/socket`` UNIX socket, ``tmp/nvidia-mps``. With
  ``driver_files=False`` (``--no-driver-files``) the libraries, ``ld.so.*``, programs and
  firmware are left out: the tree is the kernel side only, for real user-space files.
* ``libnvidia-ml.so.<version>`` is a real NVML where the machine has a C compiler: it
  answers NVML's C ABI (pynvml, go-nvml) from ``nvshim-sim-nvml.txt``, the model written
  at the root from the same records (:mod:`nvshim.sim.libnvml`); else the stub.
* ``nvml-facts.json``: what NVML would say and procfs does not (MIG UUIDs, CUDA version,
  compute capability, brand), in the format :class:`nvshim.host.nvml.NvmlFacts` defines.
  Production code reads it only when a config names it (``nvml-facts:
  <root>/nvml-facts.json``, :attr:`SimNode.nvml_facts`), as it would any such file.
* ``nvshim-sim.json``: the simulator's own record of what it made, for :func:`load_node`
  (never read by production code). Format 1::

    {
      "format": 1,
      "simulated": true,
      "generator": "nvshim sim",
      "seed": 0,
      "driver_version": "550.54.15",
      "cuda_version": "12.4",           # the newest CUDA this driver's branch supports
      "dev_root": "/abs/path",          # where dev/ was made (informational)
      "driver_files": true,             # false: kernel side only (--no-driver-files)
      "gpus": [                         # index order = PCI bus id order (NVML's)
        {"index": 0, "minor": 0, "uuid": "GPU-…", "pci_bus_id": "0000:18:00.0",
         "model": "NVIDIA H100 80GB HBM3", "arch": "hopper", "brand": "nvidia",
         "compute_capability": "9.0", "mig_enabled": true,
         "mig": [{"gi": 1, "ci": 0, "uuid": "MIG-…", "profile": "3g.40gb",
                  "gi_cap_minor": 12, "ci_cap_minor": 13}]}
      ]
    }

PCI bus ids use the procfs form ``0000:18:00.0`` (4-digit domain, lower case); NVML's own
form is ``00000000:18:00.0``. The tree is deterministic for a given set of arguments; GPU
``i``'s UUID depends only on ``seed`` and ``i``. Creating it needs root (``mknod``).

This module builds and loads a node; the model and its plan are :mod:`nvshim.sim.model`,
the writers :mod:`nvshim.sim.kernel` (``dev/``, ``proc/``) and
:mod:`nvshim.sim.driver` (libraries, programs, firmware, sockets).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from nvshim.errors import HostError, UsageError
from nvshim.host.nvml import FACTS_FORMAT
from nvshim.sim.driver import (
    write_binaries,
    write_daemon_files,
    write_firmware,
    write_libraries,
)
from nvshim.sim.kernel import write_devices, write_drm, write_procfs
from nvshim.sim.model import (
    CAPS_MAJOR,
    NVIDIA_MAJOR,
    NVML_FACTS_FILE,
    SIM_FILE,
    SIM_LIBRARIES,
    UVM_MAJOR,
    SimGpu,
    SimMig,
    SimNode,
    check_arguments,
    cuda_for_driver,
    libraries_for_driver,
    mig_cap_minor,
    plan_gpus,
    write_text,
)

__all__ = [
    "CAPS_MAJOR",
    "NVIDIA_MAJOR",
    "SIM_FILE",
    "NVML_FACTS_FILE",
    "SIM_LIBRARIES",
    "UVM_MAJOR",
    "SimGpu",
    "SimMig",
    "SimNode",
    "create_node",
    "cuda_for_driver",
    "libraries_for_driver",
    "load_node",
    "mig_cap_minor",
    "nvml_facts_document",
]


def _prepare_root(root: str) -> None:
    try:
        entries = os.listdir(root)
    except FileNotFoundError:
        entries = []
    except NotADirectoryError as exc:
        raise HostError(f"simulated node root {root} is not a directory") from exc
    except OSError as exc:
        raise HostError(f"cannot read simulated node root {root}: {exc.strerror}") from exc
    if entries:
        raise HostError(
            f"simulated node root {root} is not empty ({len(entries)} entries): "
            "give a new or empty directory"
        )


def create_node(
    root: str,
    gpus: int = 2,
    driver_version: str = "550.54.15",
    shuffle_minors: bool = False,
    mig: bool = False,
    dev_root: str | None = None,
    cuda_version: str | None = None,
    model: str = "NVIDIA H100 80GB HBM3",
    seed: int = 0,
    imex_channels: int = 0,
    nvswitches: int = 0,
    gds: bool = False,
    mofed: bool = False,
    gdrcopy: bool = False,
    driver_files: bool = True,
    drm: bool = True,
) -> SimNode:
    """Build a simulated GPU node under ``root`` and describe it (see the module doc).

    ``root`` must be new or an empty directory; with ``dev_root`` the device nodes go to
    ``<dev_root>/dev`` (existing nodes there are refused, not replaced). Minors equal
    indices unless ``shuffle_minors`` (a seeded permutation, never the identity for two or
    more GPUs). ``mig`` makes GPU 0 MIG-enabled with GPU instances 1 and 2, one compute
    instance each. ``imex_channels`` makes ``dev/nvidia-caps-imex-channels/channel0..N-1``;
    ``nvswitches`` ``dev/nvidia-nvswitchctl``, ``nvidia-nvswitch0..N-1`` and the fabric
    manager socket; ``gds`` ``dev/nvidia-fs0..3`` and ``etc/cufile.json``; ``mofed``
    ``dev/infiniband/{uverbs0,umad0,issm0,rdma_cm}``; ``gdrcopy`` ``dev/gdrdrv``; each with
    its ``proc/devices`` line. ``drm`` (default) gives each GPU nvidia-drm's card and render
    nodes with their by-path links and sysfs folder (:func:`~nvshim.sim.kernel.write_drm`);
    ``drm=False`` is a headless node. ``cuda_version`` is the newest CUDA the driver supports
    (``nvml-facts.json``, ``nvidia-smi``); None takes the driver branch's
    (:func:`cuda_for_driver`), as the libraries follow the branch
    (:func:`libraries_for_driver`: 535 and older have no libnvidia-gpucomp).
    ``driver_files=False`` builds only the kernel side (``dev/``, ``proc/``, the daemons'
    sockets and the two JSON files): no libraries, ``ld.so.cache`` or ``ld.so.conf``,
    programs or firmware, so that real driver user space (a distribution's packages) can be
    unpacked under the same root. Raises :class:`UsageError` for bad
    arguments and :class:`HostError` when not root, when ``root`` is not empty, or when the
    tree cannot be written.
    """
    check_arguments(gpus, driver_version, cuda_version, mig, model)
    if cuda_version is None:
        cuda_version = cuda_for_driver(driver_version)
    if not 0 <= imex_channels <= 2048 or not 0 <= nvswitches <= 64:
        raise UsageError(
            f"--imex-channels {imex_channels} / --nvswitches {nvswitches}: a "
            "simulated node has 0-2048 channels and 0-64 NVSwitches"
        )
    if os.geteuid() != 0:
        raise HostError(
            f"creating a simulated node needs root for mknod: running as uid {os.geteuid()}"
        )
    root = os.path.abspath(root)
    dev_base = os.path.abspath(dev_root) if dev_root else root
    _prepare_root(root)
    node = SimNode(
        root=root,
        dev_root=dev_base,
        driver_version=driver_version,
        cuda_version=cuda_version,
        gpus=plan_gpus(gpus, shuffle_minors, mig, model, seed),
        imex_channels=imex_channels,
        nvswitches=nvswitches,
        gds=gds,
        mofed=mofed,
        gdrcopy=gdrcopy,
        driver_files=driver_files,
        drm=drm,
    )
    try:
        os.makedirs(root, exist_ok=True)
        write_devices(node)
        write_drm(node)
        write_procfs(node)
        if driver_files:
            write_libraries(node)
            write_binaries(node)
            write_firmware(node)
        write_daemon_files(node)
        write_text(os.path.join(root, SIM_FILE), json.dumps(_to_json(node, seed), indent=2))
        write_text(node.nvml_facts, json.dumps(nvml_facts_document(node), indent=2))
        from nvshim.sim.libnvml import write_nvml

        write_nvml(node)
    except OSError as exc:
        where = exc.filename or root
        raise HostError(
            f"cannot create simulated node under {root}: {where}: {exc.strerror}"
        ) from exc
    return node


# -- metadata ---------------------------------------------------------------------------


def _to_json(node: SimNode, seed: int) -> dict[str, Any]:
    return {
        "format": 1,
        "simulated": True,
        "generator": "nvshim sim",
        "seed": seed,
        "driver_version": node.driver_version,
        "cuda_version": node.cuda_version,
        "dev_root": node.dev_root,
        "driver_files": node.driver_files,
        "drm": node.drm,
        "gpus": [
            {
                "index": gpu.index,
                "minor": gpu.minor,
                "uuid": gpu.uuid,
                "pci_bus_id": gpu.pci_bus_id,
                "model": gpu.model,
                "arch": gpu.arch,
                "brand": gpu.brand,
                "compute_capability": gpu.compute_capability,
                "mig_enabled": bool(gpu.mig),
                "mig": [
                    {
                        "gi": m.gi,
                        "ci": m.ci,
                        "uuid": m.uuid,
                        "profile": m.profile,
                        "gi_cap_minor": m.gi_cap_minor,
                        "ci_cap_minor": m.ci_cap_minor,
                    }
                    for m in gpu.mig
                ],
            }
            for gpu in node.gpus
        ],
    }


def nvml_facts_document(node: SimNode) -> dict[str, Any]:
    """What NVML would say about ``node`` and procfs does not, in the ``nvml-facts`` format
    (:class:`nvshim.host.nvml.NvmlFacts`): a config names the file to use it."""
    return {
        "format": FACTS_FORMAT,
        "cuda_version": node.cuda_version,
        "gpus": [
            {
                "uuid": gpu.uuid,
                "minor": gpu.minor,
                "compute_capability": gpu.compute_capability,
                "brand": gpu.brand,
                "mig": [
                    {"gi": m.gi, "ci": m.ci, "uuid": m.uuid, "profile": m.profile} for m in gpu.mig
                ],
            }
            for gpu in node.gpus
        ],
    }


def load_node(root: str) -> SimNode:
    """Read ``<root>/nvshim-sim.json`` back into a :class:`SimNode`.

    Raises :class:`HostError` when the file is missing, not JSON, or not format 1.
    """
    root = os.path.abspath(root)
    path = os.path.join(root, SIM_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            meta = json.load(handle)
    except FileNotFoundError as exc:
        raise HostError(f"{path} does not exist: {root} is not a simulated node") from exc
    except (OSError, ValueError) as exc:
        raise HostError(f"cannot read {path}: {exc}") from exc
    try:
        if meta["format"] != 1 or meta["simulated"] is not True:
            raise HostError(f"{path}: unsupported format {meta['format']!r}")
        gpus: Sequence[dict[str, Any]] = meta["gpus"]
        return SimNode(
            root=root,
            dev_root=str(meta.get("dev_root") or root),
            driver_version=str(meta["driver_version"]),
            cuda_version=str(meta["cuda_version"]),
            driver_files=bool(meta.get("driver_files", True)),
            drm=bool(meta.get("drm", True)),
            gpus=tuple(
                SimGpu(
                    index=int(g["index"]),
                    minor=int(g["minor"]),
                    uuid=str(g["uuid"]),
                    pci_bus_id=str(g["pci_bus_id"]),
                    model=str(g["model"]),
                    arch=str(g["arch"]),
                    brand=str(g["brand"]),
                    compute_capability=str(g["compute_capability"]),
                    mig=tuple(
                        SimMig(
                            gpu_index=int(g["index"]),
                            gi=int(m["gi"]),
                            ci=int(m["ci"]),
                            uuid=str(m["uuid"]),
                            profile=str(m["profile"]),
                            gi_cap_minor=int(m["gi_cap_minor"]),
                            ci_cap_minor=int(m["ci_cap_minor"]),
                        )
                        for m in g["mig"]
                    ),
                )
                for g in gpus
            ),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise HostError(f"{path}: missing or malformed field {exc}") from exc
