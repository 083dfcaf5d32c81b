"""``nvshim doctor``'s checks of the container engines: containerd, Docker and CRI-O.

containerd gives several findings: ``containerd-config`` (the config parses, its imports
exist; no config at all is ``skip``), ``containerd-drop-in`` (nvshim's drop-in still
carries the CRI tables of the files loaded before it), ``containerd-runtime-binary`` (the
nvshim handler's ``options.BinaryName`` is an executable file) and ``default-runtime`` (the
pitfall below); ``containerd-handlers`` is :mod:`nvshim.node.doctor_handlers`'.

Docker and CRI-O give one finding each, ``docker`` / ``crio``: ``skip`` when the engine has
no config on this node; ``fail`` when the config does not parse, an nvshim runtime points
at a missing or non-executable binary, or the default runtime is the pitfall; ``warn``
when no nvshim runtime is registered; ``ok`` otherwise.

The pitfall, for every engine: the default runtime grants GPUs from the image's env, so
containers that asked for no GPU get every GPU from a CUDA image's
``NVIDIA_VISIBLE_DEVICES=all``. It is either NVIDIA's runtime as the default (what
``nvidia-ctk runtime configure --set-as-default`` writes; recognised by its binary's name,
or by the handler names NVIDIA's tools use; :func:`~nvshim.node.findings.is_nvidia_runtime`),
whatever nvshim's config says, or nvshim as the default while require-allocation is off.
The fix for both: nvshim with require-allocation as the default, or a plain runtime
(runc) as the default and GPU runtimes picked per container. Each runtime is followed to
what it runs (:mod:`nvshim.node.doctor_reach`): NVIDIA's runtime behind a wrapper counts,
NVIDIA's own ``accept-nvidia-visible-devices-envvar-when-unprivileged = false`` lifts the
pitfall, nvshim is judged by the config its binary reads, and fixes keep the flags the
runtime was registered with.

``cdi-injection`` (one finding per engine found, containerd and CRI-O) says which path
injects CDI devices: the engine itself -- containerd with ``enable_cdi`` (1.7 and later;
unset, it is off in 1.7 and on in 2.x, so doctor asks ``containerd --version`` when the
config does not settle it), CRI-O always -- from the devices that ``cdi.k8s.io/``
annotations and the CRI ``CDIDevices`` field (DRA claims) name, or nvshim. It warns when
both would inject the devices an annotation names: the engine's CDI is on, nvshim's
handler receives the annotation (containerd: its ``container_annotations``; CRI-O passes
every one), and nvshim's config reads it (``annotation-prefixes`` covering
``cdi.k8s.io/``, and ``cdi-annotations`` in ``allocation-sources`` or require-allocation
off). The fix stops nvshim reading them (it then counts the devices the engine injected
as an engine grant), or turns containerd's CDI off. Docker and podman (CDI devices
named with ``--device``) are not checked.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

from nvshim._record import dataclass
from nvshim.config import DEFAULT_CDI_SPEC_DIRS, Config
from nvshim.errors import NvshimError
from nvshim.node.doctor_reach import (
    binary_problems,
    default_config,
    kept_flags,
    nvidia_default,
)
from nvshim.node.findings import (
    DEFAULT_TRAMPOLINE,
    DoctorOptions,
    Finding,
    compile_command,
    is_nvidia_runtime,
    is_nvshim,
)

if TYPE_CHECKING:
    from nvshim.node.containerd_read import EffectiveRuntimes

__all__ = [
    "check_containerd_config",
    "check_drop_in_drift",
    "check_runtime_binary",
    "check_default_runtime",
    "check_docker",
    "check_crio",
    "check_cdi_injection",
    "EngineCdi",
]


def _configure(engine: str, path: str, default: str) -> str:
    """The ``nvshim runtime configure`` command for ``engine``'s config at ``path``."""
    flag = "" if path == default else f" --config {path}"
    return f"nvshim runtime configure --runtime {engine}{flag}"


def _nvshim_as_default(configure: str, options: DoctorOptions,
                       binary: Optional[str] = None) -> str:
    """How to make nvshim the default safely: require-allocation first, in the config the
    runtime ``configure`` registers (``binary``, default the trampoline) reads, then
    configure with --set-as-default (whose guard reads that config: $NVSHIM_CONFIG, or the
    default, when no binary is installed)."""
    from nvshim.config import config_path
    from nvshim.node.doctor_follow import follow

    followed = follow(binary or options.trampoline, None, options.trampoline)
    path = followed.config if followed.kind == "nvshim" and followed.config and (
        binary is not None or os.path.exists(options.trampoline)) else options.config_path
    env = "" if path == config_path() or followed.named else f"NVSHIM_CONFIG={path} "
    return (f"set require-allocation: true in {path}, then {compile_command(path)} and "
            f"{env}{configure} --set-as-default")


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
    from nvshim.node.containerd_read import read_handlers

    try:
        effective = read_handlers(path)
    except NvshimError as exc:
        fix = f"correct {path}: containerd will not start with it"
        return Finding(name, "fail", str(exc), fix), None
    if effective.problems:
        return Finding(
            name, "warn", "; ".join(effective.problems),
            f"create the missing file, or take its import out of {path}",
        ), effective
    handlers = ", ".join(sorted(effective.handlers)) or "none"
    return Finding(
        name, "ok",
        f"{path} (version {effective.version}, {len(effective.files)} file(s)): "
        f"runtime handlers {handlers}; default {effective.default_runtime_name}",
    ), effective


def check_drop_in_drift(path: str, options: Optional[DoctorOptions] = None) -> Optional[Finding]:
    """nvshim's drop-in still carries the CRI tables of the files loaded before it (None:
    no nvshim drop-in, or it does)."""
    from nvshim.node.containerd_read import drop_in_drift

    try:
        drift = drop_in_drift(path)
    except NvshimError as exc:
        return Finding("containerd-drop-in", "warn", f"cannot compare drop-ins: {exc}")
    if not drift:
        return None
    lines = []
    for drop_in, keys in drift:
        shown = ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
        lines.append(f"{drop_in} has a stale copy of the CRI tables loaded before it: "
                     f"{shown} differ")
    from nvshim.node.containerd_read import read_handlers
    from nvshim.node.doctor_handlers import reconfigure_command

    command = reconfigure_command(path, drift[0][0], read_handlers(path).version,
                                  options or DoctorOptions(containerd_config=path))
    return Finding(
        "containerd-drop-in", "fail",
        "; ".join(lines) + " (containerd before 2.1 uses the drop-in's table, not theirs)",
        f"{command} (copies the tables again)",
    )


def _configure_containerd(path: str) -> str:
    from nvshim.node.containerd_toml import DEFAULT_CONFIG

    return _configure("containerd", path, DEFAULT_CONFIG)


def _containerd_configure(effective: EffectiveRuntimes, options: DoctorOptions,
                          binary: Optional[str] = None) -> str:
    """``nvshim runtime configure`` for containerd with the flags nvshim's handler was
    written with (read back from its drop-in), ``binary`` replacing its BinaryName."""
    from nvshim.node.doctor_handlers import is_nvshim_drop_in, reconfigure_command

    for handler in sorted(_nvshim_handlers(effective, options)):
        for path in effective.declared.get(handler, ()):
            if path != effective.config_path and is_nvshim_drop_in(path):
                return reconfigure_command(effective.config_path, path, effective.version,
                                           options, binary=binary)
    command = _configure_containerd(effective.config_path)
    return command + (f" --binary {binary}" if binary and binary != DEFAULT_TRAMPOLINE else "")


def check_runtime_binary(effective: EffectiveRuntimes, options: DoctorOptions) -> Finding:
    """The nvshim handler's BinaryName exists and is executable."""
    name = "containerd-runtime-binary"
    ours = _nvshim_handlers(effective, options)
    if not ours:
        return Finding(
            name, "warn",
            f"containerd config {effective.config_path} has no nvshim runtime handler",
            _configure_containerd(effective.config_path),
        )
    bad = binary_problems(ours, "handler", "BinaryName",
                           "has no options.BinaryName, so containerd runs plain runc")
    good = [f'handler "{handler}" runs {binary}' for handler, binary in sorted(ours.items())]
    if bad:
        return Finding(
            name, "fail", "; ".join(bad) + ": its containers get no GPUs or fail to start",
            f"install nvshim (./install.sh), or re-run "
            f"{_containerd_configure(effective, options, DEFAULT_TRAMPOLINE)}",
        )
    return Finding(name, "ok", "; ".join(good))


def check_default_runtime(
    effective: EffectiveRuntimes, config: Optional[Config], options: DoctorOptions
) -> Finding:
    """The pitfall: containerd's default runtime is NVIDIA's, or nvshim with
    require-allocation off."""
    name = "default-runtime"
    default = effective.default_runtime_name
    ours = _nvshim_handlers(effective, options)
    if default in effective.handlers:
        ours_binary = next(iter(ours.values()), None) if ours else None
        nvidia = nvidia_default(
            name, "containerd", default, effective.handlers[default], {}, options,
            f"{_nvshim_as_default(_containerd_configure(effective, options), options, ours_binary)}"
            f"; or make runc the default again (default_runtime_name in "
            f"{effective.config_path} or its drop-ins) and select GPU runtimes by RuntimeClass")
        if nvidia is not None:
            return nvidia
    if default not in ours:
        if default not in effective.handlers and default != "runc":
            return Finding(
                name, "fail",
                f'containerd\'s default runtime "{default}" is not a configured runtime handler',
                f"set default_runtime_name to runc in {effective.config_path}",
            )
        return Finding(
            name, "ok",
            f'containerd\'s default runtime is "{default}"; GPU pods select nvshim by RuntimeClass',
        )
    path, config, reads = default_config(effective.handlers[default], {}, config, options)
    if config is None:
        return Finding(
            name, "skip", f"containerd's default runtime is nvshim; {path}, the config it "
            "reads, did not load"
        )
    if config.require_allocation:
        return Finding(
            name, "ok",
            f"containerd's default runtime is nvshim and require-allocation is on{reads}: "
            "only device-plugin allocations grant GPUs",
        )
    which = "" if default == "nvshim" else f' (handler "{default}")'
    return Finding(
        name, "fail",
        f"containerd's default runtime is nvshim{which} but require-allocation is off{reads}: "
        "pods that request no GPU get every GPU from CUDA images' NVIDIA_VISIBLE_DEVICES=all",
        f"set require-allocation: true in {path} (then "
        f"{compile_command(path)}), or make runc the default and use "
        "RuntimeClass nvshim",
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
            check, engine, default, handlers[default], envs.get(default, {}), options,
            f"{_nvshim_as_default(kept, options, next(iter(ours.values()), None))}; "
            f"or {plain_default}")
        if nvidia is not None:
            return nvidia
    if not ours:
        return Finding(check, "warn", f"{where} has no nvshim runtime", configure)
    problems = binary_problems(ours, "runtime", key)
    if problems:
        return Finding(check, "fail", "; ".join(problems) + f": {engine} cannot start it",
                       f"install nvshim (./install.sh), or re-run "
                       f"{configure + kept_flags(ours, default, DEFAULT_TRAMPOLINE)}")
    if default in ours:
        path, loaded, reads = default_config(ours[default], envs.get(default, {}), config,
                                              options)
        if loaded is None:
            return Finding(check, "skip", f"{engine}'s default runtime is nvshim; {path}, "
                           "the config it reads, did not load")
        if not loaded.require_allocation:
            return Finding(
                check, "fail",
                f"{engine}'s default runtime is nvshim but require-allocation is off{reads}: "
                "containers that request no GPU get every GPU from CUDA images' "
                "NVIDIA_VISIBLE_DEVICES=all",
                f"set require-allocation: true in {path} (then "
                f"{compile_command(path)}), or {configure + kept_flags(ours, None)} without "
                "--set-as-default",
            )
    names = ", ".join(f"{n} ({b})" for n, b in sorted(ours.items()))
    return Finding(check, "ok", f"{where}: nvshim runtime {names}; default "
                   f"{default or 'the engine default'}")


def check_docker(path: str, config: Optional[Config], options: DoctorOptions) -> Finding:
    """Docker's daemon.json: nvshim runtime present, its path executable, the default pitfall."""
    from nvshim.node.docker import DEFAULT_CONFIG, read_runtimes

    if not os.path.exists(path):
        return Finding("docker", "skip", f"no Docker config at {path}")
    try:
        seen = read_runtimes(path)
    except NvshimError as exc:
        return Finding("docker", "fail", str(exc),
                       f"correct {path}: dockerd will not start with it")
    return _check("docker", "Docker", path, seen.runtimes, seen.default_runtime, "path",
                  config, options, _configure("docker", path, DEFAULT_CONFIG),
                  f'take "default-runtime" out of {path} (Docker then runs runc) and pick a '
                  "GPU runtime per container with docker run --runtime", {})


def _crio_files(path: str, drop_in_dir: str, files: Sequence[str]) -> str:
    """The CRI-O files read, said truthfully: ``crio.conf + 1 drop-in``."""
    count = sum(1 for f in files if f != path)
    drop_ins = f"{count} drop-in{'' if count == 1 else 's'}"
    if path not in files:
        return f"{drop_ins} in {drop_in_dir} (no {path})"
    return f"{path} (no drop-ins)" if count == 0 else f"{path} + {drop_ins}"


def check_crio(path: str, config: Optional[Config], options: DoctorOptions) -> Finding:
    """CRI-O's config and drop-ins: the same three questions."""
    from nvshim.node.crio import BUILTIN_DEFAULT_RUNTIMES, DEFAULT_CONFIG, read_handlers

    drop_ins = _crio_drop_ins(path)
    if not os.path.exists(path) and not os.path.isdir(drop_ins):
        return Finding("crio", "skip", f"no CRI-O config at {path} or {drop_ins}")
    try:
        seen = read_handlers(path, drop_ins)
    except NvshimError as exc:
        return Finding("crio", "fail", str(exc),
                       f"correct the file named (in {path} or {drop_ins}): crio will not "
                       "start with it")
    default = seen.default_runtime
    if default is None:
        # no file names one: CRI-O's own default (runc, or crun in newer releases) counts,
        # and a handler of that name that runs nvshim-runtime or NVIDIA's runtime is the
        # same pitfall
        default = next((name for name in BUILTIN_DEFAULT_RUNTIMES if name in seen.handlers
                        and (is_nvshim(name, seen.handlers[name], options)
                             or is_nvidia_runtime(name, seen.handlers[name], options))), None)
    return _check("crio", "CRI-O", _crio_files(path, drop_ins, seen.files), seen.handlers,
                  default, "runtime_path", config, options,
                  _configure("crio", path, DEFAULT_CONFIG),
                  f"make runc the default again (default_runtime in {path} or a drop-in in "
                  f"{drop_ins}) and select GPU runtimes by RuntimeClass", seen.envs)


# --------------------------------------------------------------------------- CDI injection

#: The annotation namespace of CDI requests (device plugins' CDI strategy, the kubelet).
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
_CHECK_CDI = "cdi-injection"


@dataclass(frozen=True)
class EngineCdi:
    """Whether an engine injects CDI devices itself, as its config and version say.

    ``injects`` is ``None`` when that depends on a version doctor could not learn; ``why``
    says where the answer came from. ``hands_over``: nvshim's runtime receives the
    container's ``cdi.k8s.io/`` annotations; ``hand_off`` says how, or why not.
    ``switch`` is where the engine's ``enable_cdi`` goes ("" when it has no switch).
    """

    engine: str
    injects: Optional[bool]
    why: str
    spec_dirs: Tuple[str, ...]
    hands_over: bool
    hand_off: str
    switch: str = ""


def _may_match_namespace(pattern: str, namespace: str = CDI_ANNOTATION_PREFIX) -> bool:
    """Whether containerd's annotation pattern (Go ``path.Match``: ``*`` and ``?`` never
    match ``/``) can match some key under ``namespace``."""
    cut = min((i for i, c in enumerate(pattern) if c in "*?[\\"), default=len(pattern))
    literal, rest = pattern[:cut], pattern[cut:]
    if literal.startswith(namespace):
        return True
    if not rest or not namespace.startswith(literal):
        return False  # a plain key outside the namespace, or a literal that leaves it
    # the wildcards cannot match the namespace's "/": the pattern must spell it
    return "/" not in namespace[len(literal):] or "/" in rest


def _containerd_cdi(effective: Optional[EffectiveRuntimes],
                    options: DoctorOptions) -> Optional[EngineCdi]:
    """containerd's CDI injection; None when there is neither a config nor a binary.

    ``enable_cdi`` as set; unset, containerd's default: on in 2.x (a version 3 config is
    2.x's), off in 1.7. Before 1.7 containerd has no CDI, whatever the config says: the
    binary is asked unless a version 3 config or ``enable_cdi = false`` settles it."""
    from nvshim.node.containerd_read import containerd_version
    from nvshim.node.containerd_toml import cri_label

    path = options.containerd_config
    explicit = effective.enable_cdi if effective is not None else None
    version = None
    if effective is None or (effective.version < 3 and explicit is not False):
        version = containerd_version(options.containerd_binary)
        if effective is None and version is None:
            return None
    if effective is not None:
        config_version = effective.version
    else:
        config_version = 3 if version is not None and version[0] >= 2 else 2
    where = (effective.cri_file if effective is not None else None) or path
    injects: Optional[bool]
    if version is not None and version[:2] < (1, 7):
        injects = False
        ignored = f", enable_cdi = true in {where} is ignored" if explicit else ""
        why = f"containerd {version[2]} has no CDI support{ignored}"
    elif explicit is not None:
        injects = explicit
        why = f"enable_cdi = {'true' if explicit else 'false'} in {where}"
    elif config_version == 3:
        injects = True
        why = f"{path} is a version 3 config, containerd 2.x's, where enable_cdi defaults to true"
    elif version is None:
        injects = None
        why = (f"enable_cdi is unset in {where}: off by default in containerd 1.7, on in 2.x, "
               f"and `{options.containerd_binary} --version` did not say which runs here")
    else:
        major, _, text = version
        injects = major >= 2
        unset = "enable_cdi is unset" if effective is not None else f"no {path}"
        state = "turns CDI on" if injects else "leaves CDI off"
        why = f"{unset}: containerd {text} {state} by default"
    spec_dirs = DEFAULT_CDI_SPEC_DIRS
    ours: List[str] = []
    passing: List[str] = []
    if effective is not None:
        if effective.cdi_spec_dirs is not None:
            spec_dirs = effective.cdi_spec_dirs
        ours = sorted(_nvshim_handlers(effective, options))
        passing = [h for h in ours if any(
            _may_match_namespace(p) for p in effective.container_annotations.get(h, ()))]
    named = ", ".join(f'"{h}"' for h in (passing or ours))
    if passing:
        hand_off = f"nvshim's handler {named} passes them on through container_annotations"
    elif ours:
        hand_off = (f"nvshim's handler {named} is not passed {CDI_ANNOTATION_PREFIX}* "
                    "annotations: none of its container_annotations covers them")
    else:
        hand_off = "no containerd runtime handler runs nvshim"
    return EngineCdi("containerd", injects, why, spec_dirs, bool(passing), hand_off,
                     f"{cri_label(config_version)} of {where}")


def _crio_drop_ins(path: str) -> str:
    """CRI-O's drop-in directory for the main config ``path``."""
    return os.path.join(os.path.dirname(path), "crio.conf.d")


def _crio_cdi(options: DoctorOptions) -> Optional[EngineCdi]:
    """CRI-O's CDI injection (always on); None when CRI-O has no config or it does not
    load (the ``crio`` finding says so)."""
    from nvshim.node.crio import read_handlers

    path = options.crio_config
    drop_ins = _crio_drop_ins(path)
    if not os.path.exists(path) and not os.path.isdir(drop_ins):
        return None
    try:
        seen = read_handlers(path, drop_ins)
    except NvshimError:
        return None
    spec_dirs = seen.cdi_spec_dirs if seen.cdi_spec_dirs is not None else DEFAULT_CDI_SPEC_DIRS
    ours = sorted(n for n, b in seen.handlers.items() if is_nvshim(n, b, options))
    if ours:
        named = ", ".join(f'"{n}"' for n in ours)
        hand_off = f"CRI-O passes every container annotation on to nvshim's runtime {named}"
    else:
        hand_off = "no CRI-O runtime runs nvshim"
    return EngineCdi("CRI-O", True, "CRI-O's CDI has no off switch", spec_dirs, bool(ours),
                     hand_off)


def _nvshim_reads(config: Config, path: str) -> Tuple[bool, str, str]:
    """Whether nvshim injects the devices ``cdi.k8s.io/`` annotations name, why (or why
    not), and the change to its config at ``path`` that stops it."""
    prefixes = [p for p in config.annotation_prefixes
                if p.startswith(CDI_ANNOTATION_PREFIX) or CDI_ANNOTATION_PREFIX.startswith(p)]
    if not prefixes:
        return False, f"nvshim's annotation-prefixes do not cover {CDI_ANNOTATION_PREFIX}", ""
    shown = ", ".join(f'"{p}"' for p in prefixes)
    if not config.require_allocation:
        return (True, f"nvshim's require-allocation is off, so every annotation under {shown} "
                "is a request", f"take {shown} out of annotation-prefixes in {path}")
    if "cdi-annotations" in config.allocation_sources:
        return (True, "cdi-annotations is in nvshim's allocation-sources",
                f"take cdi-annotations out of allocation-sources in {path}")
    return False, "cdi-annotations is not in nvshim's allocation-sources", ""


def _same_dirs(a: Sequence[str], b: Sequence[str]) -> bool:
    """Whether two CDI spec dir lists share a directory (``/var/run`` links to ``/run``)."""
    return bool({os.path.realpath(d) for d in a} & {os.path.realpath(d) for d in b})


def _injection_finding(e: EngineCdi, config: Optional[Config],
                       options: DoctorOptions) -> Finding:
    """One engine's line: who injects the CDI devices a container is given, and whether
    the engine and nvshim both would."""
    dirs = ", ".join(e.spec_dirs) or "no directory"
    named = f"the CDI devices that {CDI_ANNOTATION_PREFIX} annotations"
    engine_line = (f"{e.engine} injects {named} and CRI CDIDevices (DRA claims) name, "
                   f"from {dirs} ({e.why})")
    if config is None:
        return Finding(_CHECK_CDI, "skip", f"{engine_line if e.injects else e.why}; nvshim's "
                       "config did not load: cannot tell whether nvshim injects them too")
    path = options.config_path
    reads, reason, nvshim_fix = _nvshim_reads(config, path)
    # why nvshim does not inject what the engine hands it (when it does not)
    why_not = e.hand_off if reads else reason
    if e.injects is False:
        if reads and e.hands_over:
            own = ", ".join(config.cdi_spec_dirs) or "no directory"
            return Finding(_CHECK_CDI, "ok", f"nvshim injects {named} name, from {own}; "
                           f"{e.engine} injects none ({e.why}), so CRI CDIDevices (DRA "
                           "claims) get no devices")
        return Finding(_CHECK_CDI, "ok", f"no one injects {named} name: {e.engine}'s CDI is "
                       f"off ({e.why}) and {why_not}")
    if not (reads and e.hands_over):
        if e.injects is None:
            return Finding(_CHECK_CDI, "ok", f"{e.why}; either way nvshim does not inject "
                           f"{named} name ({why_not})")
        return Finding(_CHECK_CDI, "ok", f"{engine_line}; nvshim does not inject them again "
                       f"({why_not}) and counts what {e.engine} injected as an engine grant")
    compile_it = compile_command(path)
    if e.injects is None:
        return Finding(
            _CHECK_CDI, "warn",
            f"{e.why}: on containerd 2.x both containerd and nvshim inject {named} name "
            f"({e.hand_off}; {reason})",
            f"set enable_cdi in {e.switch} explicitly: false for nvshim alone, or true and "
            f"{nvshim_fix} (then {compile_it})",
        )
    if _same_dirs(e.spec_dirs, config.cdi_spec_dirs):
        again = "from the same CDI spec dirs"
    else:
        again = f"from its own cdi-spec-dirs, {', '.join(config.cdi_spec_dirs) or 'none'},"
    fix = (f"{nvshim_fix}, then {compile_it}: nvshim then counts the devices {e.engine} "
           "injected as an engine grant")
    if e.switch:
        fix += f"; or set enable_cdi = false in {e.switch} so that only nvshim injects"
    return Finding(
        _CHECK_CDI, "warn",
        f"{e.engine} injects {named} name, from {dirs} ({e.why}), and nvshim injects them "
        f"again {again} ({e.hand_off}; {reason}): two injections of one request, recorded "
        "as nvshim's cdi-annotations grant rather than the engine's",
        fix,
    )


def check_cdi_injection(effective: Optional[EffectiveRuntimes], config: Optional[Config],
                        options: DoctorOptions) -> List[Finding]:
    """Which path injects CDI devices on this node -- containerd's (``enable_cdi``, 1.7
    and later, on by default in 2.x), CRI-O's (always on) or nvshim's -- one finding per
    engine found; a warning when the engine and nvshim would both inject the devices a
    ``cdi.k8s.io/`` annotation names. ``effective`` is containerd's config as read (None:
    there is none, or it did not load)."""
    findings: List[Finding] = []
    path = options.containerd_config
    if effective is None and os.path.exists(path):
        findings.append(Finding(_CHECK_CDI, "skip", f"{path} did not load: cannot tell "
                                "whether containerd injects CDI devices"))
    else:
        containerd = _containerd_cdi(effective, options)
        if containerd is not None:
            findings.append(_injection_finding(containerd, config, options))
    crio = _crio_cdi(options)
    if crio is not None:
        findings.append(_injection_finding(crio, config, options))
    if not findings:
        findings.append(Finding(_CHECK_CDI, "skip", f"no containerd ({path}, or "
                                f"{options.containerd_binary} on PATH) and no CRI-O config "
                                f"({options.crio_config}): no engine injects CDI devices"))
    return findings
