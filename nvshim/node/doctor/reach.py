"""``nvshim doctor``: judge the config each engine's runtime will read, not the one doctor
was given.

Every runtime an engine can run -- containerd's CRI handlers, Docker's ``runtimes``, CRI-O's
handlers (with their ``monitor_env``), and the binaries named with ``--runtime-binary``
(``podman --runtime``) -- is followed to what it runs (:mod:`nvshim.node.doctor.follow`):

``handler-config`` (one finding per config an nvshim runtime reads)
    the config exists (a named one that is missing fails every create), loads, does not
    hand nvshim's containers on to NVIDIA's runtime through ``runtimes:`` (which would grant
    again, from the env or mount nvshim refused, every GPU it names), and has
    require-allocation on where any pod can pick the runtime by RuntimeClass (containerd's
    and CRI-O's handlers: a warning otherwise, as a pod that names the RuntimeClass gets the
    GPUs its own env names). The line names the runtime, the wrappers and the config.

:func:`nvidia_default` and :func:`handler_config` serve the ``default-runtime``,
``docker`` and ``crio`` checks (:mod:`nvshim.node.doctor.engines`): NVIDIA's runtime
reached through a wrapper is NVIDIA's runtime, and it is no pitfall when NVIDIA's own
``accept-nvidia-visible-devices-envvar-when-unprivileged = false`` is set in the config
that runtime reads; nvshim as a default is judged by the config *its* binary reads.
"""

from __future__ import annotations

import os
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from nvshim._record import dataclass
from nvshim.config import Config
from nvshim.errors import NvshimError
from nvshim.node.doctor.findings import DoctorOptions, Finding, compile_command, is_nvidia_runtime
from nvshim.node.doctor.follow import Followed, follow, nvidia_env_policy

__all__ = [
    "Runtime",
    "engine_runtimes",
    "handler_config",
    "nvidia_default",
    "runtimes_problem",
    "check_handler_configs",
    "shown",
    "default_config",
    "kept_flags",
    "config_readers",
    "binary_problems",
]

_CHECK = "handler-config"
_ENV_SWITCH = "accept-nvidia-visible-devices-envvar-when-unprivileged"


@dataclass(frozen=True)
class Runtime:
    """One runtime an engine can run: ``engine`` (containerd, Docker, CRI-O, or ``runtime``
    for a ``--runtime-binary``), its ``name``, the ``binary`` the engine names and the
    ``env`` it gives it; ``default``: the engine's default; ``cri``: any pod can pick it by
    RuntimeClass."""

    engine: str
    name: str
    binary: Optional[str]
    env: Tuple[Tuple[str, str], ...] = ()
    default: bool = False
    cri: bool = False

    def follow(self, options: DoctorOptions) -> Followed:
        return follow(self.binary, dict(self.env), options.trampoline)

    def label(self) -> str:
        if self.engine == "runtime":
            return f"runtime {self.binary}"
        noun = "handler" if self.cri else "runtime"
        return f'{self.engine} {noun} "{self.name}"'


def shown(binary: Optional[str], followed: Followed) -> str:
    """The program the engine names as it names it, then the programs it leads to."""
    return " → ".join([binary or followed.binary, *followed.chain[1:]])


def handler_config(
    followed: Followed, doctor_config: Optional[Config], options: DoctorOptions
) -> Tuple[str, Optional[Config], str]:
    """The config an nvshim runtime reads: its path, the loaded config (None when it does
    not load) and why not. The config doctor loaded itself is not loaded again."""
    path = followed.config or options.config_path
    if _same_file(path, options.config_path):
        return path, doctor_config, "" if doctor_config is not None else "it did not load"
    from nvshim.config import load_config

    try:
        return path, load_config(path, required=followed.named), ""
    except NvshimError as exc:
        return path, None, str(exc)


def _same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def nvidia_default(
    check: str,
    engine: str,
    default: str,
    binary: Optional[str],
    env: Mapping[str, str],
    options: DoctorOptions,
    fix: str,
) -> Optional[Finding]:
    """The finding for ``engine``'s default runtime when it is NVIDIA's (None otherwise):
    the pitfall, unless the config NVIDIA's runtime reads turns its image-env path off."""
    if not is_nvidia_runtime(default, binary, options, env):
        return None
    followed = follow(binary, env, options.trampoline) if binary else None
    runs = shown(binary, followed) if followed is not None else "NVIDIA's runtime"
    policy = nvidia_env_policy(dict(followed.env) if followed else dict(env), options.nvidia_config)
    if not policy.accepts_env:
        return Finding(
            check,
            "ok",
            f'{engine} default "{default}" is NVIDIA\'s; {policy.path} turns its env grants off',
            detail=f'"{default}" runs {runs}; {policy.path} sets '
            f"{_ENV_SWITCH} = false: an unprivileged container's "
            "NVIDIA_VISIBLE_DEVICES grants no GPU, so CUDA images' "
            "NVIDIA_VISIBLE_DEVICES=all gives containers that request none nothing",
        )
    seen = (
        f"{policy.path} does not parse ({policy.problem})"
        if policy.problem
        else f"{policy.path} leaves {_ENV_SWITCH} at true"
        if policy.exists
        else f"no {policy.path}: {_ENV_SWITCH} defaults to true"
    )
    full_fix = (
        f"{fix}; or set {_ENV_SWITCH} = false in {policy.path} (NVIDIA's own "
        "switch; GPUs then come from device-plugin mounts or CDI only)"
    )
    return Finding(
        check,
        "fail",
        f"{engine}'s default \"{default}\" is NVIDIA's runtime: pods asking no GPU get every GPU",
        "make runc the default (more: --verbose)",
        detail=f"{engine}'s default runtime \"{default}\" is NVIDIA's runtime ({runs}): every "
        "container that names no runtime runs through it, and it grants GPUs from the "
        "image's env, so containers that request no GPU get every GPU from CUDA images' "
        f"NVIDIA_VISIBLE_DEVICES=all ({seen}). Fix: {full_fix}",
    )


def default_config(
    binary: Optional[str], env: Mapping[str, str], config: Optional[Config], options: DoctorOptions
) -> Tuple[str, Optional[Config], str]:
    """The config an nvshim default runtime running ``binary`` reads: its path, the config
    (None: it did not load) and `` in <path> (the config <binary> reads)`` when that is not
    the config doctor was given ("" when it is)."""
    followed = follow(binary, env, options.trampoline)
    path, loaded, _ = handler_config(followed, config, options)
    if os.path.realpath(path) == os.path.realpath(options.config_path):
        return path, loaded, ""
    return path, loaded, f" in {path} (the config {shown(binary, followed)} reads)"


def kept_flags(
    ours: Mapping[str, Optional[str]], default: Optional[str], binary: Optional[str] = None
) -> str:
    """The ``--name``/``--binary``/``--set-as-default`` flags nvshim's runtime was registered
    with (``binary`` replacing its path), so that a fix run as printed keeps them."""
    from nvshim.node.engines.containerd_toml import DEFAULT_BINARY, DEFAULT_NAME

    if not ours:
        return ""
    name, path = sorted(ours.items())[0]
    path = binary or path
    flags = "" if name == DEFAULT_NAME else f" --name {name}"
    flags += f" --binary {path}" if path and path != DEFAULT_BINARY else ""
    return flags + (" --set-as-default" if default == name else "")


def binary_problems(
    ours: Mapping[str, Optional[str]], noun: str, key: str, unset: str = ""
) -> List[str]:
    """One line per runtime whose binary (its ``key``) is unset, relative, missing or not
    executable; ``unset`` says what an unset one means (default: ``has no <key>``)."""
    problems = []
    for name, binary in sorted(ours.items()):
        who = f'{noun} "{name}"'
        if binary is None:
            problems.append(f"{who} {unset or f'has no {key}'}")
        elif not os.path.isabs(binary):
            problems.append(f"{who} {key} {binary} is not an absolute path")
        elif not os.path.isfile(binary):
            problems.append(f"{who} {key} {binary} does not exist")
        elif not os.access(binary, os.X_OK):
            problems.append(f"{who} {key} {binary} is not executable")
    return problems


def runtimes_problem(config: Config, options: DoctorOptions) -> Optional[str]:
    """What is wrong with the low-level runtimes nvshim hands containers to: one that leads
    to NVIDIA's runtime (it grants again from the env and mounts nvshim refused) or back to
    nvshim; None when none does."""
    bad: List[str] = []
    for entry in config.runtimes:
        followed = follow(entry, None, options.trampoline)
        if followed.kind == "nvidia":
            bad.append(f"{shown(entry, followed)} is NVIDIA's runtime")
        elif followed.kind == "nvshim":
            bad.append(f"{shown(entry, followed)} is nvshim-runtime itself")
    if not bad:
        return None
    return "; ".join(bad)


def engine_runtimes(options: DoctorOptions) -> List[Runtime]:
    """Every runtime the engines' configs name (files that do not load give none: their
    own checks say so), then the ``--runtime-binary`` ones."""
    from nvshim.node.engines.api import ENGINES, engine

    found: List[Runtime] = []
    for name in ENGINES:
        chosen = engine(name)
        path = options.engine_config(name)
        if not chosen.present(path):
            continue
        try:
            seen = chosen.read(path)
        except NvshimError:
            continue
        found += [
            Runtime(
                chosen.label,
                runtime,
                binary,
                tuple(sorted(seen.envs.get(runtime, {}).items())),
                default=runtime == seen.default,
                cri=chosen.cri,
            )
            for runtime, binary in sorted(seen.handlers.items())
        ]
    found += [Runtime("runtime", os.path.basename(b), b) for b in options.runtime_binaries]
    return found


@dataclass(frozen=True)
class _Reader:
    runtime: Runtime
    followed: Followed


def _readers(runtimes: Sequence[Runtime], options: DoctorOptions) -> Dict[str, List[_Reader]]:
    """The nvshim runtimes by the config they read."""
    readers: Dict[str, List[_Reader]] = {}
    for runtime in runtimes:
        followed = runtime.follow(options)
        if followed.kind != "nvshim":
            continue
        path = followed.config or options.config_path
        readers.setdefault(path, []).append(_Reader(runtime, followed))
    return readers


def config_readers(runtimes: Sequence[Runtime], options: DoctorOptions) -> List[str]:
    """The configs the nvshim runtimes among ``runtimes`` read."""
    return sorted(_readers(runtimes, options))


def check_handler_configs(
    runtimes: Sequence[Runtime], doctor_config: Optional[Config], options: DoctorOptions
) -> List[Finding]:
    """One finding per config an nvshim runtime reads (see the module docstring)."""
    readers = _readers(runtimes, options)
    if not readers:
        return [Finding(_CHECK, "skip", "no engine runtime found leads to nvshim-runtime")]
    findings = []
    for path, group in sorted(readers.items()):
        who = "; ".join(
            f"{r.runtime.label()} runs {shown(r.runtime.binary, r.followed)}" for r in group
        )
        named = any(r.followed.named for r in group)
        _, config, problem = handler_config(
            Followed("nvshim", (), path, named), doctor_config, options
        )
        reads = f"{who}, which reads {path}"
        if config is None:
            if not os.path.exists(path):
                findings.append(
                    Finding(
                        _CHECK,
                        "fail",
                        f"nvshim reads {path}, which does not exist: every create fails",
                        f"create {path}",
                        detail=f"{reads}: it does not exist, so every create fails. Fix: create "
                        f"{path} (install.sh writes it; then {compile_command(path)}), or "
                        "name an existing config in the wrapper's NVSHIM_CONFIG",
                    )
                )
            else:
                findings.append(
                    Finding(
                        _CHECK,
                        "fail",
                        f"{reads}: {problem}",
                        f"correct {path}, then {compile_command(path)}",
                    )
                )
            continue
        chained = runtimes_problem(config, options)
        if chained is not None:
            findings.append(
                Finding(
                    _CHECK,
                    "fail",
                    f"{reads}, whose runtimes hand every container on to another GPU runtime: "
                    f"{chained}; it grants GPUs again from the env and mounts nvshim refused",
                    f"list runc or crun (or their absolute paths) under runtimes: in {path}, "
                    f"then {compile_command(path)}",
                )
            )
            continue
        open_to_pods = [r.runtime.label() for r in group if r.runtime.cri and not r.runtime.default]
        if not config.require_allocation and open_to_pods:
            # the shipped default, on purpose: nvshim as a default runtime is refused (and
            # FAILs in default-runtime) while it is off; one line says so, the rest is detail
            findings.append(
                Finding(
                    _CHECK,
                    "warn",
                    "require-allocation is off: the default, as nvshim is not the default runtime",
                    f"require-allocation: true in {path}",
                    detail=f"{reads}: require-allocation is off, so any pod that names "
                    f"{', '.join(open_to_pods)} by RuntimeClass gets the GPUs its own env "
                    "or image names (NVIDIA_VISIBLE_DEVICES=all: every GPU), allocated or "
                    "not; pods that name no such RuntimeClass never reach nvshim. Where "
                    f"pods must not pick their GPUs: set require-allocation: true in {path}, "
                    f"then {compile_command(path)}",
                )
            )
            continue
        mode = "on" if config.require_allocation else "off"
        source = "" if config.source is not None else " (built-in defaults: no such file)"
        findings.append(Finding(_CHECK, "ok", f"{reads}{source}: require-allocation {mode}"))
    return findings
