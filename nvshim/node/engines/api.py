"""One interface over the engines nvshim registers with: containerd, Docker, CRI-O.

``nvshim runtime configure`` (and doctor's questions about what an engine loads) go
through :func:`engine`: each :class:`Engine` configures a runtime, reverts one, reads the
runtimes the engine will see, and says which of configure's options it takes and how it is
restarted. Every engine returns the same records,
:class:`~nvshim.node.engines.files.ConfigureOutcome` and
:class:`~nvshim.node.engines.files.RevertResult`, so the CLI has no per-engine branches. The
engine modules (:mod:`nvshim.node.engines.containerd`, :mod:`nvshim.node.engines.docker`,
:mod:`nvshim.node.engines.crio`) keep their own vocabulary; this module only adapts their calls
(as NVIDIA's toolkit does in ``pkg/config/engine/api.go``).
"""

from __future__ import annotations

import os
from typing import Dict, Mapping, Optional, Sequence, Tuple

from nvshim._record import dataclass, field
from nvshim.errors import UsageError
from nvshim.node.engines.files import ConfigureOutcome, RevertResult

__all__ = ["ENGINES", "ConfigureOptions", "Engine", "EngineRuntimes", "Unparsed", "engine"]


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


@dataclass(frozen=True)
class EngineRuntimes:
    """What an engine's config makes it load, whichever engine: runtime name → the binary
    it runs (None when the entry names none), the default runtime (None when no file names
    one and the engine's own default is not fixed), each runtime's environment, the files
    read, and the CDI spec directories the engine injects from (None: its default)."""

    handlers: Mapping[str, Optional[str]]
    default: Optional[str]
    files: Tuple[str, ...]
    envs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    cdi_spec_dirs: Optional[Tuple[str, ...]] = None


@dataclass(frozen=True)
class Unparsed:
    """What doctor says when an engine's config does not parse: message, fix, detail."""

    message: str
    fix: str
    detail: str


class Engine:
    """One engine: its name, default config, the options it takes, and its calls.

    Besides configure and revert, it answers doctor's questions: whether it has a config
    at a path (:meth:`present`), which runtimes that config loads (:meth:`read`), and the
    words doctor's finding uses for it (:attr:`label`, :attr:`binary_key`, ...)."""

    name = ""
    label = ""
    """The engine as doctor names it (``Docker``, ``CRI-O``)."""
    cri = False
    """Any pod can pick one of its runtimes by RuntimeClass (a CRI engine)."""
    binary_key = ""
    """The key naming a runtime's binary in its config."""
    builtin_defaults: Tuple[str, ...] = ()
    """The runtimes that may be the default when no file names one (the first loaded)."""
    default_config = ""
    process = ""
    """The process to restart (``dockerd``, not ``docker``)."""
    restart = ""
    """How to make it load the written config."""
    #: (flag, why not) for each configure option this engine refuses.
    refuses: Tuple[Tuple[str, str], ...] = ()

    def check(self, options: ConfigureOptions) -> None:
        """A UsageError for an option this engine does not take."""
        given = {
            "--drop-in": options.drop_in is not None,
            "--enable-cdi": options.enable_cdi,
            "--pod-cdi-annotations": options.pod_cdi_annotations,
            "--enable-nri": options.enable_nri,
        }
        for flag, why in self.refuses:
            if given[flag]:
                raise UsageError(f"{flag} applies to {why}")

    def configure(self, config_path: str, options: ConfigureOptions) -> ConfigureOutcome:
        """Add runtime ``options.name``; every other runtime stays."""
        raise NotImplementedError

    def revert(
        self, config_path: str, *, name: str, drop_in: Optional[str], dry_run: bool
    ) -> RevertResult:
        """Take runtime ``name`` out; the other runtimes nvshim configured stay."""
        raise NotImplementedError

    def runtimes(self, config_path: str) -> Mapping[str, Optional[str]]:
        """The runtimes the engine will load from ``config_path`` (and what it imports or
        merges): name → the binary it runs (None when the entry names none)."""
        return dict(self.read(config_path).handlers)

    def read(self, config_path: str) -> EngineRuntimes:
        """What the engine loads from ``config_path`` and the files it imports or merges
        (an NvshimError when one does not parse)."""
        raise NotImplementedError

    def present(self, config_path: str) -> bool:
        """The engine has a config to read at ``config_path``."""
        return os.path.exists(config_path)

    def absent(self, config_path: str) -> str:
        """Where doctor looked and found no config."""
        return config_path

    def where(self, config_path: str, seen: EngineRuntimes) -> str:
        """The files read, as doctor's finding names them."""
        return config_path

    def unparsed(self, config_path: str, error: str) -> Unparsed:
        """Doctor's words for a config that does not parse."""
        return Unparsed(
            f"{config_path} does not parse: {self.process} will not start",
            f"correct {config_path}",
            error,
        )

    def plain_default(self, config_path: str) -> str:
        """How to make a plain runtime (runc) the default again, as doctor's fix says it."""
        raise NotImplementedError

    def restart_hint(self, written: Sequence[str]) -> str:
        """The one clause telling the operator how to make the engine load ``written``."""
        return self.restart


class _Containerd(Engine):
    name = "containerd"
    label = "containerd"
    cri = True
    binary_key = "BinaryName"
    process = "containerd"
    restart = "restart containerd"

    def __init__(self) -> None:
        from nvshim.node.engines.containerd_toml import DEFAULT_CONFIG

        self.default_config = DEFAULT_CONFIG

    def configure(self, config_path: str, options: ConfigureOptions) -> ConfigureOutcome:
        from nvshim.node.engines import containerd

        return containerd.configure(
            config_path,
            name=options.name,
            binary=options.binary,
            drop_in=options.drop_in,
            set_as_default=options.set_as_default,
            force=options.force,
            enable_cdi=options.enable_cdi,
            require_allocation=options.require_allocation,
            dry_run=options.dry_run,
            pod_cdi_annotations=options.pod_cdi_annotations,
            enable_nri=options.enable_nri,
        )

    def revert(
        self, config_path: str, *, name: str, drop_in: Optional[str], dry_run: bool
    ) -> RevertResult:
        from nvshim.node.engines import containerd_revert

        return containerd_revert.revert(config_path, name=name, drop_in=drop_in, dry_run=dry_run)

    def read(self, config_path: str) -> EngineRuntimes:
        from nvshim.node.engines.containerd_read import read_handlers

        seen = read_handlers(config_path)
        return EngineRuntimes(
            seen.handlers, seen.default_runtime_name, seen.files, cdi_spec_dirs=seen.cdi_spec_dirs
        )

    def plain_default(self, config_path: str) -> str:
        return (
            f"make runc the default again (default_runtime_name in {config_path} or its "
            "drop-ins) and select GPU runtimes by RuntimeClass"
        )


class _Docker(Engine):
    name = "docker"
    label = "Docker"
    binary_key = "path"
    process = "dockerd"
    restart = "restart dockerd (or send it SIGHUP)"
    refuses = (
        ("--drop-in", "containerd and crio: Docker has no drop-ins"),
        ("--pod-cdi-annotations", "containerd only"),
        ("--enable-nri", "containerd only (CRI-O: [crio.nri] enable_nri = true)"),
    )

    def __init__(self) -> None:
        from nvshim.node.engines.docker import DEFAULT_CONFIG

        self.default_config = DEFAULT_CONFIG

    def configure(self, config_path: str, options: ConfigureOptions) -> ConfigureOutcome:
        from nvshim.node.engines import docker

        return docker.configure(
            config_path,
            name=options.name,
            binary=options.binary,
            set_as_default=options.set_as_default,
            force=options.force,
            enable_cdi=options.enable_cdi,
            require_allocation=options.require_allocation,
            dry_run=options.dry_run,
        )

    def revert(
        self, config_path: str, *, name: str, drop_in: Optional[str], dry_run: bool
    ) -> RevertResult:
        from nvshim.node.engines import docker

        return docker.revert(config_path, name=name, dry_run=dry_run)

    def read(self, config_path: str) -> EngineRuntimes:
        from nvshim.node.engines.docker import read_runtimes

        seen = read_runtimes(config_path)
        return EngineRuntimes(seen.runtimes, seen.default_runtime, (config_path,))

    def plain_default(self, config_path: str) -> str:
        return (
            f'take "default-runtime" out of {config_path} (Docker then runs runc) and '
            "pick a GPU runtime per container with docker run --runtime"
        )

    def restart_hint(self, written: Sequence[str]) -> str:
        from nvshim.node.engines.docker import GPUS_HOOK

        if any(os.path.basename(p) == GPUS_HOOK for p in written):
            return (
                f"restart dockerd (it looks for {GPUS_HOOK} only when it starts: "
                "SIGHUP is not enough)"
            )
        return self.restart


class _Crio(Engine):
    name = "crio"
    label = "CRI-O"
    cri = True
    binary_key = "runtime_path"
    process = "crio"
    restart = "restart crio (or send it SIGHUP)"
    refuses = (
        ("--enable-cdi", "containerd and docker: CRI-O reads CDI specs without a switch"),
        ("--pod-cdi-annotations", "containerd only"),
        ("--enable-nri", "containerd only (CRI-O: [crio.nri] enable_nri = true)"),
    )

    def __init__(self) -> None:
        from nvshim.node.engines.crio import BUILTIN_DEFAULT_RUNTIMES, DEFAULT_CONFIG

        self.default_config = DEFAULT_CONFIG
        self.builtin_defaults = BUILTIN_DEFAULT_RUNTIMES

    def configure(self, config_path: str, options: ConfigureOptions) -> ConfigureOutcome:
        from nvshim.node.engines import crio

        return crio.configure(
            config_path,
            drop_in=options.drop_in,
            name=options.name,
            binary=options.binary,
            set_as_default=options.set_as_default,
            force=options.force,
            require_allocation=options.require_allocation,
            dry_run=options.dry_run,
        )

    def revert(
        self, config_path: str, *, name: str, drop_in: Optional[str], dry_run: bool
    ) -> RevertResult:
        from nvshim.node.engines import crio

        return crio.revert(config_path, drop_in=drop_in, name=name, dry_run=dry_run)

    @staticmethod
    def drop_ins(config_path: str) -> str:
        """CRI-O's drop-in directory for the main config ``config_path``."""
        return os.path.join(os.path.dirname(config_path), "crio.conf.d")

    def read(self, config_path: str) -> EngineRuntimes:
        from nvshim.node.engines.crio import read_handlers

        seen = read_handlers(config_path, self.drop_ins(config_path))
        return EngineRuntimes(
            seen.handlers, seen.default_runtime, seen.files, seen.envs, seen.cdi_spec_dirs
        )

    def present(self, config_path: str) -> bool:
        return os.path.exists(config_path) or os.path.isdir(self.drop_ins(config_path))

    def absent(self, config_path: str) -> str:
        return f"{config_path} or {self.drop_ins(config_path)}"

    def where(self, config_path: str, seen: EngineRuntimes) -> str:
        """The CRI-O files read, said truthfully: ``crio.conf + 1 drop-in``."""
        count = sum(1 for f in seen.files if f != config_path)
        drop_ins = f"{count} drop-in{'' if count == 1 else 's'}"
        if config_path not in seen.files:
            return f"{drop_ins} in {self.drop_ins(config_path)} (no {config_path})"
        return f"{config_path} (no drop-ins)" if count == 0 else f"{config_path} + {drop_ins}"

    def unparsed(self, config_path: str, error: str) -> Unparsed:
        return Unparsed(
            "a CRI-O config file does not parse: crio will not start",
            "correct the file --verbose names",
            f"{error} (in {config_path} or {self.drop_ins(config_path)})",
        )

    def plain_default(self, config_path: str) -> str:
        return (
            f"make runc the default again (default_runtime in {config_path} or a drop-in "
            f"in {self.drop_ins(config_path)}) and select GPU runtimes by RuntimeClass"
        )


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
