"""The doctor's vocabulary: a :class:`Finding`, the options saying where to look, and how
an engine's runtime is recognised as nvshim's or as NVIDIA's own. Shared by
:mod:`nvshim.node.doctor.checks` and the checks in :mod:`nvshim.node.doctor.config`,
:mod:`nvshim.node.doctor.engines` and :mod:`nvshim.node.doctor.host`.
"""

from __future__ import annotations

import os
from typing import Dict, Mapping, Optional, Tuple

from nvshim._record import dataclass, field
from nvshim.agent import AGENT_SOCKET
from nvshim.config import DEFAULT_CONFIG_PATH, config_path

#: Finding statuses; ``skip`` = the check does not apply to this node.
STATUSES = ("ok", "warn", "fail", "skip")
# where the installed trampoline is: doctor.follow owns it (it tells runtimes apart)
from nvshim.node.doctor.follow import (  # noqa: E402 - after findings' own constants
    DEFAULT_TRAMPOLINE as DEFAULT_TRAMPOLINE,
)

#: Where podman and CRI-O read OCI hook files, lowest precedence first (a file of the same
#: name in a later directory masks an earlier one's).
DEFAULT_HOOKS_DIRS = ("/usr/share/containers/oci/hooks.d", "/etc/containers/oci/hooks.d")
#: Handler names NVIDIA's tools give its runtime (nvidia-ctk; the GPU operator adds the others).
NVIDIA_RUNTIME_NAMES = ("nvidia", "nvidia-cdi", "nvidia-legacy")


@dataclass(frozen=True)
class Finding:
    """One result: which check, ``ok``/``warn``/``fail``/``skip``, what was seen, the fix."""

    check: str
    status: str
    message: str
    fix: str = ""
    detail: str = ""
    """What the short ``message`` leaves out (the chain of programs followed, why it
    matters): shown by ``doctor --verbose`` and in JSON (``detail``, only when set)."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown finding status {self.status!r}")

    def to_dict(self) -> Dict[str, str]:
        out = {"check": self.check, "status": self.status, "message": self.message, "fix": self.fix}
        if self.detail:
            out["detail"] = self.detail
        return out


@dataclass(frozen=True)
class DoctorOptions:
    """What to look at. Every path is overridable so tests can point at temp files."""

    config_path: str = field(default_factory=config_path)
    config_required: bool = False
    """The config was named explicitly (``--config``): a missing file fails, not defaults."""
    containerd_config: str = "/etc/containerd/config.toml"
    containerd_binary: str = "containerd"
    """Asked for its version (a name looked up on PATH, or a path) when the default of
    ``enable_cdi`` depends on it."""
    docker_config: str = "/etc/docker/daemon.json"
    crio_config: str = "/etc/crio/crio.conf"
    driver_root: Optional[str] = None
    """Overrides the config's ``driver-root`` (and its ``dev-root`` unless ``dev_root``)."""
    dev_root: Optional[str] = None
    trampoline: str = DEFAULT_TRAMPOLINE
    handler_name: str = "nvshim"
    """The containerd handler name that means nvshim (besides a BinaryName of nvshim-runtime)."""
    nvidia_config: str = "/etc/nvidia-container-runtime/config.toml"
    """NVIDIA's runtime config, unless the runtime's env names another."""
    hooks_dirs: Tuple[str, ...] = DEFAULT_HOOKS_DIRS
    """OCI hook directories (podman, CRI-O), lowest precedence first."""
    runtime_binaries: Tuple[str, ...] = ()
    """Runtimes an engine runs that no config doctor reads names (``podman --runtime``)."""
    agent_socket: str = AGENT_SOCKET
    """The node agent's socket (:mod:`nvshim.node.doctor.agent`)."""

    def engine_config(self, engine: str) -> str:
        """The config doctor reads for ``engine`` (one of
        :data:`nvshim.node.engines.api.ENGINES`)."""
        path: str = getattr(self, f"{engine}_config")
        return path


def compile_command(path: str) -> str:
    """``nvshim config compile`` for the config at ``path`` (``--config`` unless the default)."""
    flag = "" if path == DEFAULT_CONFIG_PATH else f" --config {path}"
    return f"nvshim config compile{flag}"


def is_nvshim(
    name: str,
    binary: Optional[str],
    options: DoctorOptions,
    env: Optional[Mapping[str, str]] = None,
) -> bool:
    """The runtime ``name`` (running ``binary`` with ``env``) is nvshim: its handler name,
    the installed trampoline, or a binary that leads to nvshim-runtime (by its name, its
    content, or through wrapper scripts: :func:`nvshim.node.doctor.follow.follow`)."""
    if name == options.handler_name:
        return True
    if binary is None:
        return False
    if os.path.realpath(binary) == os.path.realpath(options.trampoline):
        return True
    from nvshim.node.doctor.follow import follow

    return follow(binary, env, options.trampoline).kind == "nvshim"


def is_nvidia_runtime(
    name: str,
    binary: Optional[str],
    options: DoctorOptions,
    env: Optional[Mapping[str, str]] = None,
) -> bool:
    """The runtime ``name`` (running ``binary``) is NVIDIA's, which grants GPUs from the
    image's env: a binary that leads to NVIDIA's (its name, or a wrapper script that execs
    it), whatever the handler's name, or one of NVIDIA's handler names when it does not run
    nvshim."""
    if binary is not None:
        from nvshim.node.doctor.follow import follow

        if follow(binary, env, options.trampoline).kind == "nvidia":
            return True
    return name in NVIDIA_RUNTIME_NAMES and not is_nvshim(name, binary, options, env)
