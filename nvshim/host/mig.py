"""MIG devices: which exist, their UUIDs, and the capability nodes that grant access.

A MIG device ``<gpu>:<mig>`` (or ``MIG-<uuid>``) is reached through its parent's
``/dev/nvidia<minor>`` plus two ``/dev/nvidia-caps/nvidia-cap<N>`` nodes: the GPU
instance's and the compute instance's ``access`` capability. Their minors come from
``/proc/driver/nvidia-caps/mig-minors`` (``gpu<minor>/gi<g>/access <N>`` lines). Which
instances exist is read from ``/proc/driver/nvidia/capabilities/gpu<minor>/mig/``.

procfs has no MIG UUIDs: NVML gives them on a real node (driver root ``/``), and a
simulated node records them in ``nvshim-sim.json``.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Optional, Tuple

from nvshim.errors import HostError

__all__ = ["discover_mig", "read_mig_minors"]

_GI = re.compile(r"^gi([0-9]+)$")
_CI = re.compile(r"^ci([0-9]+)$")


def read_mig_minors(host: Any) -> Dict[str, int]:
    """``gpu0/gi1/access`` → capability minor, from the driver's mig-minors file."""
    text = host.read_text("/proc/driver/nvidia-caps/mig-minors")
    out: Dict[str, int] = {}
    if not text:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _instances(host: Any, minor: int) -> List[Tuple[int, int]]:
    base = host.host_path(f"/proc/driver/nvidia/capabilities/gpu{minor}/mig")
    found: List[Tuple[int, int]] = []
    try:
        gis = os.listdir(base)
    except OSError:
        return found
    for gi_name in gis:
        gi = _GI.match(gi_name)
        if not gi:
            continue
        try:
            cis = os.listdir(os.path.join(base, gi_name))
        except OSError:
            continue
        for ci_name in cis:
            ci = _CI.match(ci_name)
            if ci and os.path.exists(os.path.join(base, gi_name, ci_name, "access")):
                found.append((int(gi.group(1)), int(ci.group(1))))
    return sorted(found)


def _sim_uuids(host: Any, minor: int) -> Dict[Tuple[int, int], Tuple[str, str]]:
    text = host.read_text("/nvshim-sim.json")
    if not text:
        return {}
    try:
        meta = json.loads(text)
    except ValueError as exc:
        raise HostError(f"{host.host_path('/nvshim-sim.json')}: not valid JSON") from exc
    out: Dict[Tuple[int, int], Tuple[str, str]] = {}
    for gpu in meta.get("gpus", []):
        if gpu.get("minor") != minor:
            continue
        for m in gpu.get("mig", []):
            out[(int(m["gi"]), int(m["ci"]))] = (str(m["uuid"]), str(m.get("profile", "")))
    return out


def _nvml_uuids(minor: int) -> Dict[Tuple[int, int], Tuple[str, str]]:
    from nvshim.host.nvml import NvmlUnavailable, as_text, nvml

    out: Dict[Tuple[int, int], Tuple[str, str]] = {}
    try:
        with nvml(f"NVML MIG query failed for GPU minor {minor}") as pynvml:
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                if int(pynvml.nvmlDeviceGetMinorNumber(handle)) != minor:
                    continue
                for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
                    try:
                        mh = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
                    except pynvml.NVMLError:
                        continue  # an empty MIG slot
                    gi = int(pynvml.nvmlDeviceGetGpuInstanceId(mh))
                    ci = int(pynvml.nvmlDeviceGetComputeInstanceId(mh))
                    out[(gi, ci)] = (as_text(pynvml.nvmlDeviceGetUUID(mh)),
                                     as_text(pynvml.nvmlDeviceGetName(mh)))
    except NvmlUnavailable:
        return out  # no NVML: MIG devices stay unnamed, as on a procfs-only node
    return out


def discover_mig(host: Any, index: int, minor: int) -> Tuple[Any, ...]:
    """The MIG devices of GPU ``index`` (device minor ``minor``), ordered by (gi, ci)."""
    from nvshim.host.devices import MigDevice

    instances = _instances(host, minor)
    if not instances:
        return ()
    uuids = _sim_uuids(host, minor)
    if not uuids and host.driver_root == "/":
        uuids = _nvml_uuids(minor)
    minors = read_mig_minors(host)
    devices = []
    for j, (gi, ci) in enumerate(instances):
        uuid, profile = uuids.get((gi, ci), ("", ""))
        if not uuid:
            continue  # a MIG device we cannot name cannot be requested
        nodes = []
        for cap in (f"gpu{minor}/gi{gi}/access", f"gpu{minor}/gi{gi}/ci{ci}/access"):
            cap_minor: Optional[int] = minors.get(cap)
            if cap_minor is None:
                raise HostError(
                    f"MIG device {index}:{j} needs capability {cap}, which "
                    f"{host.host_path('/proc/driver/nvidia-caps/mig-minors')} does not list"
                )
            node = host.device_node(f"/dev/nvidia-caps/nvidia-cap{cap_minor}")
            if node is None:
                raise HostError(
                    f"MIG device {index}:{j} needs {host.dev_path(f'/dev/nvidia-caps/nvidia-cap{cap_minor}')}, "
                    "which does not exist"
                )
            nodes.append(node)
        devices.append(MigDevice(index, j, gi, ci, uuid, profile, tuple(nodes)))
    return tuple(devices)
