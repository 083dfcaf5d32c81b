"""One interface over the engines nvshim registers with: containerd, Docker, CRI-O.

``nvshim runtime configure`` (and doctor's questions about what an engine loads) go
through :func:`engine`: each :class:`Engine` configures a runtime, reverts one, reads the
runtimes the engine will see, and says which of configure's options it takes and how it is
restarted. Every engine returns the same records,
:class:`~nvshim.node.engine_files.ConfigureOutcome` and
:class:`~nvshim.node.engine_files.RevertResult`, so the CLI has no per-engine branches. The
engine modules (:mod:`nvshim.node.containerd`, :mod:`nvshim.node.docker`,
:mod:`nvshim.node.crio`) keep their own vocabulary; this module only adapts their calls
(as NVIDIA's toolkit does in ``pkg/config/engine/api.go``).
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence, Tuple

from nvshim._record import dataclass
from nvshim.errors import UsageError
from nvshim.node.engine_files import ConfigureOutcome, RevertResult

__all__ = ["ENGINES", "ConfigureOptions", "Engine", "engine"]


@dataclass(frozen=True)
class ConfigureOptions:
    """What ``runtime configure`` asks of an engine, whichever it is."""

    name: str
    binary: str
    drop_in: Optional[str] = None
    set_as_default: bool = False
    force: bool = False
    enable_cdi: bool = False
    pod_cdi_annotations: bool = False
    enable_nri: bool = False
    require_allocation: bool = False
    dry_run: bool = False


class Engine:
    """One engine: its name, default config, the options it takes, and four calls."""

    name = ""
    default_config = ""
    process = ""
    """The process to restart (``dockerd``, not ``docker``)."""
    restart = ""
    """How to make it load the written config."""
    #: (flag, why not) for each configure option this engine refuses.
    refuses: Tuple[Tuple[str, str], ...] = ()

    def check(self, options: ConfigureOptions) -> None:
        """A UsageError for an option this engine does not take."""
        given = {"--drop-in": options.drop_in is not None, "--enable-cdi": options.enable_cdi,
                 "--pod-cdi-annotations": options.pod_cdi_annotations,
                 "--enable-nri": options.enable_nri}
        for flag, why in self.refuses:
            if given[flag]:
                raise UsageError(f"{flag} applies to {why}")

    def configure(self, config_path: str, options: ConfigureOptions) -> ConfigureOutcome:
        """Add runtime ``options.name``; every other runtime stays."""
        raise NotImplementedError

    def revert(self, config_path: str, *, name: str, drop_in: Optional[str],
               dry_run: bool) -> RevertResult:
        """Take runtime ``name`` out; the other runtimes nvshim configured stay."""
        raise NotImplementedError

    def runtimes(self, config_path: str) -> Mapping[str, Optional[str]]:
        """The runtimes the engine will load from ``config_path`` (and what it imports or
        merges): name → the binary it runs (None when the entry names none)."""
        raise NotImplementedError

    def restart_hint(self, written: Sequence[str]) -> str:
        """The one clause telling the operator how to make the engine load ``written``."""
        return self.restart


class _Containerd(Engine):
    name = "containerd"
    process = "containerd"
    restart = "restart containerd"

    def __init__(self) -> None:
        from nvshim.node.containerd_toml import DEFAULT_CONFIG

        self.default_config = DEFAULT_CONFIG

    def configure(self, config_path: str, options: ConfigureOptions) -> ConfigureOutcome:
        from nvshim.node import containerd

        return containerd.configure(
            config_path, name=options.name, binary=options.binary, drop_in=options.drop_in,
            set_as_default=options.set_as_default, force=options.force,
            enable_cdi=options.enable_cdi, require_allocation=options.require_allocation,
            dry_run=options.dry_run, pod_cdi_annotations=options.pod_cdi_annotations,
            enable_nri=options.enable_nri)

    def revert(self, config_path: str, *, name: str, drop_in: Optional[str],
               dry_run: bool) -> RevertResult:
        from nvshim.node import containerd_revert

        return containerd_revert.revert(config_path, name=name, drop_in=drop_in,
                                        dry_run=dry_run)

    def runtimes(self, config_path: str) -> Mapping[str, Optional[str]]:
        from nvshim.node.containerd_read import read_handlers

        return dict(read_handlers(config_path).handlers)


class _Docker(Engine):
    name = "docker"
    process = "dockerd"
    restart = "restart dockerd (or send it SIGHUP)"
    refuses = (("--drop-in", "containerd and crio: Docker has no drop-ins"),
               ("--pod-cdi-annotations", "containerd only"),
               ("--enable-nri", "containerd only (CRI-O: [crio.nri] enable_nri = true)"))

    def __init__(self) -> None:
        from nvshim.node.docker import DEFAULT_CONFIG

        self.default_config = DEFAULT_CONFIG

    def configure(self, config_path: str, options: ConfigureOptions) -> ConfigureOutcome:
        from nvshim.node import docker

        return docker.configure(
            config_path, name=options.name, binary=options.binary,
            set_as_default=options.set_as_default, force=options.force,
            enable_cdi=options.enable_cdi, require_allocation=options.require_allocation,
            dry_run=options.dry_run)

    def revert(self, config_path: str, *, name: str, drop_in: Optional[str],
               dry_run: bool) -> RevertResult:
        from nvshim.node import docker

        return docker.revert(config_path, name=name, dry_run=dry_run)

    def runtimes(self, config_path: str) -> Mapping[str, Optional[str]]:
        from nvshim.node.docker import read_runtimes

        return dict(read_runtimes(config_path).runtimes)

    def restart_hint(self, written: Sequence[str]) -> str:
        import os

        from nvshim.node.docker import GPUS_HOOK

        if any(os.path.basename(p) == GPUS_HOOK for p in written):
            return (f"restart dockerd (it looks for {GPUS_HOOK} only when it starts: "
                    "SIGHUP is not enough)")
        return self.restart


class _Crio(Engine):
    name = "crio"
    process = "crio"
    restart = "restart crio (or send it SIGHUP)"
    refuses = (("--enable-cdi", "containerd and docker: CRI-O reads CDI specs without a "
                "switch"),
               ("--pod-cdi-annotations", "containerd only"),
               ("--enable-nri", "containerd only (CRI-O: [crio.nri] enable_nri = true)"))

    def __init__(self) -> None:
        from nvshim.node.crio import DEFAULT_CONFIG

        self.default_config = DEFAULT_CONFIG

    def configure(self, config_path: str, options: ConfigureOptions) -> ConfigureOutcome:
        from nvshim.node import crio

        return crio.configure(
            config_path, drop_in=options.drop_in, name=options.name, binary=options.binary,
            set_as_default=options.set_as_default, force=options.force,
            require_allocation=options.require_allocation, dry_run=options.dry_run)

    def revert(self, config_path: str, *, name: str, drop_in: Optional[str],
               dry_run: bool) -> RevertResult:
        from nvshim.node import crio

        return crio.revert(config_path, drop_in=drop_in, name=name, dry_run=dry_run)

    def runtimes(self, config_path: str) -> Mapping[str, Optional[str]]:
        from nvshim.node.crio import read_handlers

        return dict(read_handlers(config_path).handlers)


ENGINES: Tuple[str, ...] = ("containerd", "docker", "crio")
_MADE: Dict[str, Engine] = {}


def engine(name: str) -> Engine:
    """The engine called ``name`` (one of :data:`ENGINES`)."""
    if name not in _MADE:
        kinds = {"containerd": _Containerd, "docker": _Docker, "crio": _Crio}
        if name not in kinds:
            raise UsageError(f'unknown engine "{name}": one of {", ".join(ENGINES)}')
        _MADE[name] = kinds[name]()
    return _MADE[name]
