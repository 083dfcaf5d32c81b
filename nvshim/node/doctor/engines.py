"""``nvshim doctor``'s checks of the container engines: containerd, Docker and CRI-O.

containerd gives several findings: ``containerd-config`` (the config parses, its imports
exist; no config at all is ``skip``), ``containerd-drop-in`` (nvshim's drop-in still
carries the CRI tables of the files loaded before it), ``containerd-runtime-binary`` (the
nvshim handler's ``options.BinaryName`` is an executable file) and ``default-runtime`` (the
pitfall below); ``containerd-handlers`` is :mod:`nvshim.node.doctor.handlers`'.

Docker and CRI-O give one finding each, ``docker`` / ``crio``, from one check
(:func:`check_engine`) that asks the engine interface (:mod:`nvshim.node.engines.api`) what the
engine loads and how to say it: ``skip`` when the engine has
no config on this node; ``fail`` when the config does not parse, an nvshim runtime points
at a missing or non-executable binary, or the default runtime is the pitfall; ``warn``
when no nvshim runtime is registered; ``ok`` otherwise.

The pitfall, for every engine: the default runtime grants GPUs from the image's env, so
containers that asked for no GPU get every GPU from a CUDA image's
``NVIDIA_VISIBLE_DEVICES=all``. It is either NVIDIA's runtime as the default (what
``nvidia-ctk runtime configure --set-as-default`` writes; recognised by its binary's name,
or by the handler names NVIDIA's tools use; :func:`~nvshim.node.doctor.findings.is_nvidia_runtime`),
whatever nvshim's config says, or nvshim as the default while require-allocation is off.
The fix for both: nvshim with require-allocation as the default, or a plain runtime
(runc) as the default and GPU runtimes picked per container. Each runtime is followed to
what it runs (:mod:`nvshim.node.doctor.reach`): NVIDIA's runtime behind a wrapper counts,
NVIDIA's own ``accept-nvidia-visible-devices-envvar-when-unprivileged = false`` lifts the
pitfall, nvshim is judged by the config its binary reads, and fixes keep the flags the
runtime was registered with.

``cdi-injection`` is :mod:`nvshim.node.doctor.injection`'s.

Why one module: one family of findings, the engines' registration, whose checks share one
rule (the default-runtime pitfall) and the helpers that find nvshim's handlers and word the
fixes; containerd's findings and Docker's and CRI-O's are the same judgement on different
config files.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Tuple

from nvshim.config import Config
from nvshim.errors import NvshimError
from nvshim.node.doctor.findings import (
    DEFAULT_TRAMPOLINE,
    DoctorOptions,
    Finding,
    compile_command,
    is_nvidia_runtime,
    is_nvshim,
)
from nvshim.node.doctor.reach import (
    binary_problems,
    default_config,
    kept_flags,
    nvidia_default,
)

if TYPE_CHECKING:
    from nvshim.node.engines.containerd_read import EffectiveRuntimes

__all__ = [
    "check_containerd_config",
    "check_drop_in_drift",
    "check_runtime_binary",
    "check_default_runtime",
    "check_engine",
    "check_docker",
    "check_crio",
]


def _configure(engine: str, path: str, default: str) -> str:
    """The ``nvshim runtime configure`` command for ``engine``'s config at ``path``."""
    flag = "" if path == default else f" --config {path}"
    return f"nvshim runtime configure --runtime {engine}{flag}"


def _nvshim_as_default(configure: str, options: DoctorOptions, binary: Optional[str] = None) -> str:
    """How to make nvshim the default safely: require-allocation first, in the config the
    runtime ``configure`` registers (``binary``, default the trampoline) reads, then
    configure with --set-as-default (whose guard reads that config: $NVSHIM_CONFIG, or the
    default, when no binary is installed)."""
    from nvshim.config import config_path
    from nvshim.node.doctor.follow import follow

    followed = follow(binary or options.trampoline, None, options.trampoline)
    path = (
        followed.config
        if followed.kind == "nvshim"
        and followed.config
        and (binary is not None or os.path.exists(options.trampoline))
        else options.config_path
    )
    env = "" if path == config_path() or followed.named else f"NVSHIM_CONFIG={path} "
    return (
        f"set require-allocation: true in {path}, then {compile_command(path)} and "
        f"{env}{configure} --set-as-default"
    )


# --------------------------------------------------------------------------- containerd


def _nvshim_handlers(
    effective: EffectiveRuntimes, options: DoctorOptions
) -> Dict[str, Optional[str]]:
    return {
        name: binary
        for name, binary in effective.handlers.items()
        if is_nvshim(name, binary, options)
    }


def check_containerd_config(path: str) -> Tuple[Finding, Optional[EffectiveRuntimes]]:
    """Read containerd's handlers; the finding and the :class:`EffectiveRuntimes` (or None)."""
    name = "containerd-config"
    if not os.path.exists(path):
        message = f"no containerd config at {path}: containerd defaults apply"
        return Finding(name, "skip", message), None
    from nvshim.node.engines.containerd_read import read_handlers

    try:
        effective = read_handlers(path)
    except NvshimError as exc:
        fix = f"correct {path}: containerd will not start with it"
        return Finding(name, "fail", str(exc), fix), None
    if effective.problems:
        return Finding(
            name,
            "warn",
            "; ".join(effective.problems),
            f"create the missing file, or take its import out of {path}",
        ), effective
    handlers = ", ".join(sorted(effective.handlers)) or "none"
    return Finding(
        name,
        "ok",
        f"{path} (version {effective.version}, {len(effective.files)} file(s)): "
        f"runtime handlers {handlers}; default {effective.default_runtime_name}",
    ), effective


def check_drop_in_drift(path: str, options: Optional[DoctorOptions] = None) -> Optional[Finding]:
    """nvshim's drop-in still carries the CRI tables of the files loaded before it (None:
    no nvshim drop-in, or it does)."""
    from nvshim.node.engines.containerd_read import drop_in_drift

    try:
        drift = drop_in_drift(path)
    except NvshimError as exc:
        return Finding("containerd-drop-in", "warn", f"cannot compare drop-ins: {exc}")
    if not drift:
        return None
    lines = []
    for drop_in, keys in drift:
        shown = ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
        lines.append(
            f"{drop_in} has a stale copy of the CRI tables loaded before it: {shown} differ"
        )
    from nvshim.node.doctor.handlers import reconfigure_command
    from nvshim.node.engines.containerd_read import read_handlers

    command = reconfigure_command(
        path,
        drift[0][0],
        read_handlers(path).version,
        options or DoctorOptions(containerd_config=path),
    )
    return Finding(
        "containerd-drop-in",
        "fail",
        f"{drift[0][0]} is a stale copy of the CRI tables before it",
        "re-run runtime configure (--verbose)",
        detail="; ".join(lines) + " (containerd before 2.1 uses the drop-in's table, not "
        f"theirs). Fix: {command} (copies the tables again)",
    )


def _configure_containerd(path: str) -> str:
    from nvshim.node.engines.containerd_toml import DEFAULT_CONFIG

    return _configure("containerd", path, DEFAULT_CONFIG)


def _containerd_configure(
    effective: EffectiveRuntimes, options: DoctorOptions, binary: Optional[str] = None
) -> str:
    """``nvshim runtime configure`` for containerd with the flags nvshim's handler was
    written with (read back from its drop-in), ``binary`` replacing its BinaryName."""
    from nvshim.node.doctor.handlers import is_nvshim_drop_in, reconfigure_command

    for handler in sorted(_nvshim_handlers(effective, options)):
        for path in effective.declared.get(handler, ()):
            if path != effective.config_path and is_nvshim_drop_in(path):
                return reconfigure_command(
                    effective.config_path, path, effective.version, options, binary=binary
                )
    command = _configure_containerd(effective.config_path)
    return command + (f" --binary {binary}" if binary and binary != DEFAULT_TRAMPOLINE else "")


def check_runtime_binary(effective: EffectiveRuntimes, options: DoctorOptions) -> Finding:
    """The nvshim handler's BinaryName exists and is executable."""
    name = "containerd-runtime-binary"
    ours = _nvshim_handlers(effective, options)
    if not ours:
        return Finding(
            name,
            "warn",
            "containerd has no nvshim runtime handler",
            _configure_containerd(effective.config_path),
            detail=f"no runtime handler in {effective.config_path} or its imports runs nvshim",
        )
    bad = binary_problems(
        ours, "handler", "BinaryName", "has no options.BinaryName, so containerd runs plain runc"
    )
    good = [f'handler "{handler}" runs {binary}' for handler, binary in sorted(ours.items())]
    if bad:
        return Finding(
            name,
            "fail",
            "; ".join(bad),
            "./install.sh, or nvshim runtime configure (--verbose)",
            detail="; ".join(bad) + ": its containers get no GPUs or fail to start. Fix: install "
            "nvshim (./install.sh), or re-run "
            f"{_containerd_configure(effective, options, DEFAULT_TRAMPOLINE)}",
        )
    return Finding(name, "ok", "; ".join(good))


def check_default_runtime(
    effective: EffectiveRuntimes,
    config: Optional[Config],
    options: DoctorOptions,
    guard: Optional[Tuple[str, Tuple[str, ...]]] = None,
) -> Finding:
    """The pitfall: containerd's default runtime is NVIDIA's, or nvshim with
    require-allocation off. ``guard``: who strips unallocated pods' claims at
    CreateContainer (:func:`nvshim.node.doctor.nri.nri_guard`) and the handlers it leaves
    to nvshim's runtime: NVIDIA's default is then guarded, not the pitfall."""
    name = "default-runtime"
    default = effective.default_runtime_name
    ours = _nvshim_handlers(effective, options)
    if default in effective.handlers:
        ours_binary = next(iter(ours.values()), None) if ours else None
        nvidia = nvidia_default(
            name,
            "containerd",
            default,
            effective.handlers[default],
            {},
            options,
            f"{_nvshim_as_default(_containerd_configure(effective, options), options, ours_binary)}"
            f"; or make runc the default again (default_runtime_name in "
            f"{effective.config_path} or its drop-ins) and select GPU runtimes by RuntimeClass",
        )
        if nvidia is not None:
            return _guarded(nvidia, default, "NVIDIA's runtime", guard)
    if default not in ours:
        if default not in effective.handlers and default != "runc":
            return Finding(
                name,
                "fail",
                f'containerd\'s default runtime "{default}" is not a configured runtime handler',
                f"set default_runtime_name to runc in {effective.config_path}",
            )
        return Finding(
            name,
            "ok",
            f'containerd\'s default runtime is "{default}"; GPU pods select nvshim by RuntimeClass',
        )
    path, config, reads = default_config(effective.handlers[default], {}, config, options)
    if config is None:
        return Finding(
            name,
            "skip",
            f"containerd's default runtime is nvshim; {path}, the config it reads, did not load",
        )
    if config.require_allocation:
        return Finding(
            name,
            "ok",
            f"containerd's default runtime is nvshim and require-allocation is on{reads}: "
            "only device-plugin allocations grant GPUs",
        )
    which = "" if default == "nvshim" else f' (handler "{default}")'
    return _guarded(
        Finding(
            name,
            "fail",
            "default runtime nvshim has require-allocation off: CUDA images get every GPU",
            f"require-allocation: true in {path}",
            detail=f"containerd's default runtime is nvshim{which} but require-allocation is "
            f"off{reads}: pods that request no GPU get every GPU from CUDA images' "
            f"NVIDIA_VISIBLE_DEVICES=all. Fix: set require-allocation: true in {path} (then "
            f"{compile_command(path)}), or make runc the default and use RuntimeClass nvshim",
        ),
        default,
        "nvshim with require-allocation off",
        guard,
    )


def _guarded(
    finding: Finding, default: str, what: str, guard: Optional[Tuple[str, Tuple[str, ...]]]
) -> Finding:
    """``finding`` (the pitfall) as ok when ``guard`` strips what the default handler
    ``default`` would grant from image env (it is not one the guard leaves to nvshim's
    runtime); ``finding`` itself otherwise."""
    if finding.status != "fail" or guard is None or default in guard[1]:
        return finding
    return Finding(
        finding.check,
        "ok",
        f'containerd\'s default "{default}" is {what}, guarded by '
        f"{guard[0]}: pods with no allocation get NVIDIA_VISIBLE_DEVICES=void, and what it "
        "cannot strip is refused",
        detail=f"{finding.detail} Guarded while the agent stays registered: an engine "
        "creates containers without a plugin that is down (the nri check says so).",
    )


# --------------------------------------------------------------------------- Docker, CRI-O


def _check(
    check: str,
    engine: str,
    where: str,
    handlers: Mapping[str, Optional[str]],
    default: Optional[str],
    key: str,
    config: Optional[Config],
    options: DoctorOptions,
    configure: str,
    plain_default: str,
    envs: Mapping[str, Mapping[str, str]],
) -> Finding:
    """Docker's or CRI-O's finding; ``where`` names the files read, ``configure`` is the
    ``nvshim runtime configure`` command, ``plain_default`` how to make runc the default,
    ``envs`` each runtime's environment (CRI-O's monitor_env)."""
    ours = {n: b for n, b in handlers.items() if is_nvshim(n, b, options, envs.get(n))}
    kept = configure + kept_flags(ours, default)
    if default is not None and default in handlers:
        nvidia = nvidia_default(
            check,
            engine,
            default,
            handlers[default],
            envs.get(default, {}),
            options,
            f"{_nvshim_as_default(kept, options, next(iter(ours.values()), None))}; "
            f"or {plain_default}",
        )
        if nvidia is not None:
            return nvidia
    if not ours:
        return Finding(check, "warn", f"{where} has no nvshim runtime", configure)
    problems = binary_problems(ours, "runtime", key)
    if problems:
        return Finding(
            check,
            "fail",
            "; ".join(problems) + f": {engine} cannot start it",
            f"install nvshim (./install.sh), or re-run "
            f"{configure + kept_flags(ours, default, DEFAULT_TRAMPOLINE)}",
        )
    if default in ours:
        path, loaded, reads = default_config(ours[default], envs.get(default, {}), config, options)
        if loaded is None:
            return Finding(
                check,
                "skip",
                f"{engine}'s default runtime is nvshim; {path}, the config it reads, did not load",
            )
        if not loaded.require_allocation:
            return Finding(
                check,
                "fail",
                f"{engine}'s default nvshim has require-allocation off: CUDA images get every GPU",
                f"require-allocation: true in {path}",
                detail=f"{engine}'s default runtime is nvshim but require-allocation is "
                f"off{reads}: containers that request no GPU get every GPU from CUDA "
                "images' NVIDIA_VISIBLE_DEVICES=all. Fix: set require-allocation: true "
                f"in {path} (then {compile_command(path)}), or "
                f"{configure + kept_flags(ours, None)} without --set-as-default",
            )
    names = ", ".join(f"{n} ({b})" for n, b in sorted(ours.items()))
    return Finding(
        check, "ok", f"{where}: nvshim runtime {names}; default {default or 'the engine default'}"
    )


def check_engine(name: str, path: str, config: Optional[Config], options: DoctorOptions) -> Finding:
    """Docker's or CRI-O's finding (the check is named after the engine), asked through
    :mod:`nvshim.node.engines.api`: nvshim runtime present, its binary executable, the default
    pitfall."""
    from nvshim.node.engines.api import engine

    chosen = engine(name)
    if not chosen.present(path):
        return Finding(name, "skip", f"no {chosen.label} config at {chosen.absent(path)}")
    try:
        seen = chosen.read(path)
    except NvshimError as exc:
        unparsed = chosen.unparsed(path, str(exc))
        return Finding(name, "fail", unparsed.message, unparsed.fix, detail=unparsed.detail)
    default = seen.default
    if default is None:
        # no file names one: the engine's own default (CRI-O: runc, or crun in newer
        # releases) counts, and a runtime of that name that runs nvshim-runtime or NVIDIA's
        # runtime is the same pitfall
        default = next(
            (
                n
                for n in chosen.builtin_defaults
                if n in seen.handlers
                and (
                    is_nvshim(n, seen.handlers[n], options)
                    or is_nvidia_runtime(n, seen.handlers[n], options)
                )
            ),
            None,
        )
    return _check(
        name,
        chosen.label,
        chosen.where(path, seen),
        seen.handlers,
        default,
        chosen.binary_key,
        config,
        options,
        _configure(name, path, chosen.default_config),
        chosen.plain_default(path),
        seen.envs,
    )


def check_docker(path: str, config: Optional[Config], options: DoctorOptions) -> Finding:
    """Docker's daemon.json: nvshim runtime present, its path executable, the default pitfall."""
    return check_engine("docker", path, config, options)


def check_crio(path: str, config: Optional[Config], options: DoctorOptions) -> Finding:
    """CRI-O's config and drop-ins: the same three questions."""
    return check_engine("crio", path, config, options)


# --------------------------------------------------------------------------- CDI injection


def check_configured_runtimes(options: DoctorOptions) -> List[Finding]:
    """A ``configured`` failure per engine that no longer loads a runtime ``nvshim runtime
    configure`` recorded in its config's backup (another tool, a hand edit, or an older
    nvshim rewrote the file without it: pods or containers naming it fail); nothing when
    every recorded runtime is there. Asks each engine through :mod:`nvshim.node.engines.api`."""
    from nvshim.node.engines.api import ENGINES, engine
    from nvshim.node.engines.files import configured_handlers

    findings: List[Finding] = []
    for name in ENGINES:
        chosen = engine(name)
        path = options.engine_config(name)
        recorded = configured_handlers(path)
        if not recorded:
            continue
        try:
            loaded = chosen.runtimes(path)
        except NvshimError:
            continue  # that engine's own check says its config does not load
        missing = [h for h in recorded if h not in loaded]
        if not missing:
            continue
        listed = ", ".join(f'"{h}"' for h in missing)
        findings.append(
            Finding(
                "configured",
                "fail",
                f"{name} no longer loads runtime {listed} that nvshim runtime configure wrote to "
                f"{path}",
                f"nvshim runtime configure --runtime {name} --config {path} --name NAME "
                "--binary FILE for each, then restart the engine",
            )
        )
    return findings
