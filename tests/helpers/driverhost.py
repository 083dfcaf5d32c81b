"""A command run as on a host whose NVIDIA driver is loaded, with nothing of the host's
changed: a private mount namespace (proved so before anything is mounted) whose
``/proc/driver`` is a tmpfs holding ``nvidia/`` (what the kernel module shows) and, from a
simulated node, ``nvidia-caps/mig-minors``.

nvshim asks a driver root's own NVML only on such a host (``nvshim.host.gpus.driver_loaded``),
and NVIDIA's MIG discovery reads the host's ``mig-minors`` whatever its driver root: the
simulated node's libnvidia-ml answers both without a driver.
"""

from __future__ import annotations

import os
import shlex
from typing import List, Optional, Sequence

__all__ = ["as_driver_host"]


def as_driver_host(argv: Sequence[str], sim_root: Optional[str] = None) -> List[str]:
    """``argv`` wrapped to run as on a host with the driver loaded (see the module doc)."""
    outside = os.readlink("/proc/self/ns/mnt")
    lines = [
        f'[ "$(readlink /proc/self/ns/mnt)" != "{outside}" ] || '
        '{ echo "not in a private mount namespace: nothing mounted" >&2; exit 99; }',
        "mount -t tmpfs -o size=64k,mode=0555 nvshim-driver /proc/driver",
        "mkdir /proc/driver/nvidia",
    ]
    if sim_root is not None:
        minors = os.path.join(sim_root, "proc/driver/nvidia-caps/mig-minors")
        lines += [
            "mkdir /proc/driver/nvidia-caps",
            f"cp {shlex.quote(minors)} /proc/driver/nvidia-caps/",
        ]
    lines.append('exec "$@"')
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", "\n".join(lines), "sh", *argv]
