"""Building the node plan cache (:mod:`nvshim.runtime.plancache`): discovery for every
capability, and the paths each section depends on.

Loaded only when a plan is written: by ``nvshim config compile`` and ``nvshim cdi
refresh``, and by a create that finds the plan missing or stale. A create the plan
answers reads it with :mod:`nvshim.runtime.plancache` alone.
"""

from __future__ import annotations

import os

from nvshim import _jsonc
from nvshim.errors import NvshimError
from nvshim.files import stat_signature
from nvshim.host.discovery import (
    BIN_DIRS,
    CONTROL_NODES,
    DATA_FILES,
    LIB_DIRS,
    LIBRARIES,
    LIBRARY_SETS,
    Gpu,
    Host,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

__all__ = ["build", "save"]


def _pack(record: Any) -> Dict[str, Any]:
    return {f.name: getattr(record, f.name) for f in record.__record_fields__}


def _pack_gpu(gpu: Gpu) -> Dict[str, Any]:
    out = _pack(gpu)
    out["node"] = None if gpu.node is None else _pack(gpu.node)
    out["mig"] = [dict(_pack(m), cap_nodes=[_pack(n) for n in m.cap_nodes]) for m in gpu.mig]
    return out


def _watched(host: Host, doc: Dict[str, Any]) -> List[str]:
    """Every host path whose state the document depends on (present or absent)."""
    hp, dp = host.host_path, host.dev_path
    paths = [
        hp("/proc/driver/nvidia/version"),
        hp("/proc/driver/nvidia/gpus"),
        hp("/proc/driver/nvidia/capabilities"),
        hp("/proc/driver/nvidia-caps/mig-minors"),
        hp("/etc/ld.so.cache"),
        dp("/dev/nvidia-caps"),
        hp(f"/lib/firmware/nvidia/{doc['driver-version']}"),
    ]
    if host.nvml_facts is not None:
        paths.append(host.nvml_facts)  # MIG UUIDs come from it when NVML cannot answer
    paths += [hp(d) for d in LIB_DIRS] + [hp(f"{LIB_DIRS[0]}/vdpau")]
    paths += [hp(d) for d in BIN_DIRS]
    # Debian's alternatives: a switched link changes this folder, not the files behind it
    paths.append(hp("/etc/alternatives"))
    version = doc["driver-version"]
    paths += [
        hp(candidate.format(version=version).rsplit("/", 1)[0])
        for _, _, candidates in DATA_FILES
        for candidate in candidates
    ]
    paths += [dp(path) for path, _ in CONTROL_NODES]
    gpus_dir = hp("/proc/driver/nvidia/gpus")
    try:
        paths += [os.path.join(gpus_dir, e, "information") for e in sorted(os.listdir(gpus_dir))]
    except OSError:
        pass  # no procfs GPUs: the directory's own (absent) state is watched
    for gpu in doc["gpus"]:
        paths.append(gpu["node"]["host_path"] if gpu["node"] else dp(f"/dev/nvidia{gpu['minor']}"))
        mig_dir = hp(f"/proc/driver/nvidia/capabilities/gpu{gpu['minor']}/mig")
        paths.append(mig_dir)
        try:
            paths += [os.path.join(mig_dir, e) for e in sorted(os.listdir(mig_dir))]
        except OSError:
            pass  # no MIG directory: its absence is watched
        for mig in gpu["mig"]:
            paths += [n["host_path"] for n in mig["cap_nodes"]]
    found = [lib["host_path"] for lib in doc["libraries"].values() if lib is not None]
    found += [f["host_path"] for f in doc["files"]]
    # the folders the files lie in (links resolved): an upgrade replaces files there
    paths += found + [path.rsplit("/", 1)[0] for path in found]
    return list(dict.fromkeys(paths))


def _watcheddrm(host: Host, doc: Dict[str, Any]) -> List[str]:
    """The paths the DRM section depends on: each GPU's sysfs ``drm`` folder and nodes, and
    ``/dev/dri`` with its ``by-path`` links."""
    dp = host.dev_path
    paths = []
    for gpu in doc["gpus"]:
        paths.append(dp(f"/sys/bus/pci/devices/{gpu['pci_bus_id']}/drm"))
        paths += [n["host_path"] for n in doc["drm"].get(gpu["pci_bus_id"], {"nodes": []})["nodes"]]
    paths += [dp("/dev/dri"), dp("/dev/dri/by-path")]
    return list(dict.fromkeys(paths))


def _watched32(host: Host, libraries32: Dict[str, Optional[Dict[str, Any]]]) -> List[str]:
    """The paths the 32-bit section depends on: the i386 folders and the files found."""
    from nvshim.host.compat32 import LIB32_DIRS

    hp = host.host_path
    paths = [hp(d) for d in LIB32_DIRS] + [hp(f"{d}/vdpau") for d in LIB32_DIRS[:3]]
    found = [lib["host_path"] for lib in libraries32.values() if lib is not None]
    paths += found + [path.rsplit("/", 1)[0] for path in found]
    return list(dict.fromkeys(paths))


def build(host: Host) -> Dict[str, Any]:
    """Run discovery for every capability and return the plan document (HostError as is)."""
    from nvshim.runtime.rootcache import elf_info

    version = host.driver_version()
    module = host.module_version()
    gpus = host.gpus()
    if host.gpu_source != "procfs":
        raise _NotCacheable(f"GPUs come from {host.gpu_source}, not procfs")
    libraries: Dict[str, Optional[Dict[str, Any]]] = {}
    for libset, bases in LIBRARIES.items():
        for base in bases:
            lib = host.find_library(base, libset)
            libraries[base] = (
                None if lib is None else {k: v for k, v in _pack(lib).items() if k != "capability"}
            )
    from nvshim.host.compat32 import bases32

    libraries32: Dict[str, Optional[Dict[str, Any]]] = {}
    for base in bases32(LIBRARY_SETS, LIBRARIES, LIBRARY_SETS):
        lib = host.find_library32(base)
        libraries32[base] = (
            None if lib is None else {k: v for k, v in _pack(lib).items() if k != "capability"}
        )
    doc: Dict[str, Any] = {
        "driver-version": version,
        "module-version": module,
        "cuda-version": host.cuda_version(),
        "gpu-source": host.gpu_source,
        "gpus": [_pack_gpu(g) for g in gpus],
        "control-nodes": [
            [path, need, None if node is None else _pack(node)]
            for path, need in CONTROL_NODES
            for node in (host.device_node(path),)
        ],
        "libraries": libraries,
        "files": [_pack(f) for f in host.files(sorted(LIBRARY_SETS))],
        "drm": {
            g.pci_bus_id: {"nodes": [_pack(n) for n in drm.nodes], "links": drm.links}
            for g in gpus
            for drm in (host.drm(g),)
        },
    }
    doc["elf"] = [
        [lib["host_path"], *elf_info(lib["host_path"])]
        for lib in libraries.values()
        if lib is not None
    ]
    doc["watch"] = [[path, stat_signature(path)] for path in _watched(host, doc)]
    doc["watchdrm"] = [[path, stat_signature(path)] for path in _watcheddrm(host, doc)]
    doc["libraries32"] = libraries32
    doc["elf32"] = [
        [lib["host_path"], *elf_info(lib["host_path"])]
        for lib in libraries32.values()
        if lib is not None
    ]
    doc["watch32"] = [[path, stat_signature(path)] for path in _watched32(host, libraries32)]
    return doc


class _NotCacheable(NvshimError):
    """This node's plan must be discovered live (e.g. GPUs only NVML can list)."""


def _fixed(host: Host) -> List[Optional[List[int]]]:
    """The state of the paths every plan depends on, whatever the node has."""
    hp = host.host_path
    return [
        stat_signature(p)
        for p in (
            hp("/proc/driver/nvidia/version"),
            hp("/proc/driver/nvidia/gpus"),
            hp("/etc/ld.so.cache"),
            *(hp(d) for d in LIB_DIRS),
        )
    ]


def save(path: str, host: Host, stamp: Dict[str, Any]) -> Tuple[Optional[Dict[str, Any]], str]:
    """Build the plan, add ``stamp`` (:func:`nvshim.runtime.plancache.stamp`: its format and
    key) and write it; (the document or None, what happened). Never raises NvshimError: a
    node whose plan cannot be built or written is discovered live."""
    from nvshim.files import write_atomic

    before = _fixed(host)
    try:
        doc = build(host)
    except NvshimError as exc:
        return None, f"not cached: {exc}"
    if _fixed(host) != before:
        return None, "not cached: the node changed during discovery"
    doc.update(stamp)
    try:
        write_atomic(
            path, (_jsonc.dumps(doc, separators=(",", ":")) + "\n").encode(), default_mode=0o644
        )
        os.chmod(path, 0o644)  # never keep a looser mode found on an old copy
    except OSError as exc:
        return doc, f"not cached: cannot chmod {path}: {exc.strerror}"
    except NvshimError as exc:
        return doc, f"not cached: {exc}"
    return doc, f"cache written to {path}"
