"""The doctor's vocabulary: a :class:`Finding`, the options saying where to look, and how
a containerd handler is recognised as nvshim. Shared by :mod:`nvshim.node.doctor` and the
checks in :mod:`nvshim.node.doctor_config`, :mod:`nvshim.node.doctor_engines` and
:mod:`nvshim.node.doctor_host`.
"""

from __future__ import annotations

import os
from typing import Dict, Optional

from nvshim._record import dataclass, field
from nvshim.config import config_path

#: Finding statuses; ``skip`` = the check does not apply to this node.
STATUSES = ("ok", "warn", "fail", "skip")
DEFAULT_TRAMPOLINE = "/usr/local/bin/nvshim-runtime"
RUNTIME_BASENAME = "nvshim-runtime"


@dataclass(frozen=True)
class Finding:
    """One result: which check, ``ok``/``warn``/``fail``/``skip``, what was seen, the fix."""

    check: str
    status: str
    message: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown finding status {self.status!r}")

    def to_dict(self) -> Dict[str, str]:
        return {
            "check": self.check, "status": self.status, "message": self.message, "fix": self.fix
        }


@dataclass(frozen=True)
class DoctorOptions:
    """What to look at. Every path is overridable so tests can point at temp files."""

    config_path: str = field(default_factory=config_path)
    containerd_config: str = "/etc/containerd/config.toml"
    docker_config: str = "/etc/docker/daemon.json"
    crio_config: str = "/etc/crio/crio.conf"
    driver_root: Optional[str] = None
    """Overrides the config's ``driver-root`` (and its ``dev-root`` unless ``dev_root``)."""
    dev_root: Optional[str] = None
    trampoline: str = DEFAULT_TRAMPOLINE
    handler_name: str = "nvshim"
    """The containerd handler name that means nvshim (besides a BinaryName of nvshim-runtime)."""


def is_nvshim(name: str, binary: Optional[str], options: DoctorOptions) -> bool:
    if name == options.handler_name:
        return True
    if binary is None:
        return False
    if os.path.basename(binary) == RUNTIME_BASENAME:
        return True
    return os.path.realpath(binary) == os.path.realpath(options.trampoline)
