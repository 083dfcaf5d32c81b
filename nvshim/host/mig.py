"""MIG devices: which exist, their UUIDs, and the capability nodes that grant access.

A MIG device ``<gpu>:<mig>`` (or ``MIG-<uuid>``) is reached through its parent's
``/dev/nvidia<minor>`` plus two ``/dev/nvidia-caps/nvidia-cap<N>`` nodes: the GPU
instance's and the compute instance's ``access`` capability. Their minors come from
``/proc/driver/nvidia-caps/mig-minors`` (``gpu<minor>/gi<g>/access <N>`` lines). Which
instances exist is read from ``/proc/driver/nvidia/capabilities/gpu<minor>/mig/``.

procfs has no MIG UUIDs: they are facts only NVML knows, asked through
:class:`nvshim.host.nvml.NvmlFacts` (NVML on a real node, else the configured
``nvml-facts`` file). A MIG device without a UUID cannot be requested and is left out.
"""

from __future__ import annotations

import os
import re

from nvshim.errors import HostError

TYPE_CHECKING = False  # typing: discovery imports this module on a create (BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

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


def discover_mig(host: Any, index: int, minor: int) -> Tuple[Any, ...]:
    """The MIG devices of GPU ``index`` (device minor ``minor``), ordered by (gi, ci)."""
    from nvshim.host.devices import MigDevice

    instances = _instances(host, minor)
    if not instances:
        return ()
    from nvshim.host.nvml import NvmlFacts

    with NvmlFacts(host.driver_root, host.nvml_facts) as facts:
        uuids = facts.mig_devices(minor)
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
            cap_node = f"/dev/nvidia-caps/nvidia-cap{cap_minor}"
            node = host.device_node(cap_node)
            if node is None:
                raise HostError(
                    f"MIG device {index}:{j} needs {host.dev_path(cap_node)}, which does not exist"
                )
            nodes.append(node)
        devices.append(MigDevice(index, j, gi, ci, uuid, profile, tuple(nodes)))
    return tuple(devices)
