"""``nvshim doctor``'s ``cdi-injection`` check: who injects the CDI devices that
``cdi.k8s.io/`` annotations and the CRI ``CDIDevices`` field name.

One finding per engine found, containerd and CRI-O) says which path
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
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from nvshim._record import dataclass
from nvshim.config import DEFAULT_CDI_SPEC_DIRS, Config
from nvshim.errors import NvshimError
from nvshim.node.doctor.engines import _nvshim_handlers
from nvshim.node.doctor.findings import DoctorOptions, Finding, compile_command, is_nvshim

if TYPE_CHECKING:
    from nvshim.node.engines.containerd_read import EffectiveRuntimes

__all__ = ["check_cdi_injection", "EngineCdi", "CDI_ANNOTATION_PREFIX"]


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
    handlers: Tuple[Tuple[str, Optional[str], Tuple[Tuple[str, str], ...]], ...] = ()
    """(name, binary, env) of each nvshim runtime the annotations reach: each is judged by
    the config it reads (:func:`nvshim.node.doctor.reach.handler_config`)."""


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
    return "/" not in namespace[len(literal) :] or "/" in rest


def _containerd_cdi(
    effective: Optional[EffectiveRuntimes], options: DoctorOptions
) -> Optional[EngineCdi]:
    """containerd's CDI injection; None when there is neither a config nor a binary.

    ``enable_cdi`` as set; unset, containerd's default: on in 2.x (a version 3 config is
    2.x's), off in 1.7. Before 1.7 containerd has no CDI, whatever the config says: the
    binary is asked unless a version 3 config or ``enable_cdi = false`` settles it."""
    from nvshim.node.engines.containerd_read import containerd_version
    from nvshim.node.engines.containerd_toml import cri_label

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
        why = (
            f"enable_cdi is unset in {where}: off by default in containerd 1.7, on in 2.x, "
            f"and `{options.containerd_binary} --version` did not say which runs here"
        )
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
        passing = [
            h
            for h in ours
            if any(_may_match_namespace(p) for p in effective.container_annotations.get(h, ()))
        ]
    named = ", ".join(f'"{h}"' for h in (passing or ours))
    if passing:
        hand_off = f"nvshim's handler {named} passes them on through container_annotations"
    elif ours:
        hand_off = (
            f"nvshim's handler {named} is not passed {CDI_ANNOTATION_PREFIX}* "
            "annotations: none of its container_annotations covers them"
        )
    else:
        hand_off = "no containerd runtime handler runs nvshim"
    binaries = effective.handlers if effective is not None else {}
    return EngineCdi(
        "containerd",
        injects,
        why,
        spec_dirs,
        bool(passing),
        hand_off,
        f"{cri_label(config_version)} of {where}",
        tuple((h, binaries.get(h), ()) for h in passing),
    )


def _crio_cdi(options: DoctorOptions) -> Optional[EngineCdi]:
    """CRI-O's CDI injection (always on); None when CRI-O has no config or it does not
    load (the ``crio`` finding says so)."""
    from nvshim.node.engines.api import engine

    crio, path = engine("crio"), options.crio_config
    if not crio.present(path):
        return None
    try:
        seen = crio.read(path)
    except NvshimError:
        return None
    spec_dirs = seen.cdi_spec_dirs if seen.cdi_spec_dirs is not None else DEFAULT_CDI_SPEC_DIRS
    ours = sorted(n for n, b in seen.handlers.items() if is_nvshim(n, b, options))
    if ours:
        named = ", ".join(f'"{n}"' for n in ours)
        hand_off = f"CRI-O passes every container annotation on to nvshim's runtime {named}"
    else:
        hand_off = "no CRI-O runtime runs nvshim"
    return EngineCdi(
        "CRI-O",
        True,
        "CRI-O's CDI has no off switch",
        spec_dirs,
        bool(ours),
        hand_off,
        handlers=tuple(
            (n, seen.handlers.get(n), tuple(sorted(seen.envs.get(n, {}).items()))) for n in ours
        ),
    )


def _nvshim_reads(config: Config, path: str) -> Tuple[bool, str, str]:
    """Whether nvshim injects the devices ``cdi.k8s.io/`` annotations name, why (or why
    not), and the change to its config at ``path`` that stops it."""
    prefixes = [
        p
        for p in config.annotation_prefixes
        if p.startswith(CDI_ANNOTATION_PREFIX) or CDI_ANNOTATION_PREFIX.startswith(p)
    ]
    if not prefixes:
        return False, f"nvshim's annotation-prefixes do not cover {CDI_ANNOTATION_PREFIX}", ""
    shown = ", ".join(f'"{p}"' for p in prefixes)
    if not config.require_allocation:
        return (
            True,
            f"nvshim's require-allocation is off, so every annotation under {shown} is a request",
            f"drop {shown} from annotation-prefixes in {path}",
        )
    if "cdi-annotations" in config.allocation_sources:
        return (
            True,
            "cdi-annotations is in nvshim's allocation-sources",
            f"drop cdi-annotations from allocation-sources in {path}",
        )
    return False, "cdi-annotations is not in nvshim's allocation-sources", ""


def _handlers_read(
    e: EngineCdi, config: Config, options: DoctorOptions
) -> Tuple[bool, str, str, str]:
    """:func:`_nvshim_reads` for the config each of ``e``'s nvshim runtimes reads (the
    one answer to "which config does this handler read", as doctor's other checks use it):
    the first that reads ``cdi.k8s.io/`` annotations, else the first's answer; doctor's own
    config when no runtime is reached. Also the config's path."""
    from nvshim.node.doctor.follow import follow
    from nvshim.node.doctor.reach import handler_config

    answers = []
    for name, binary, env in e.handlers:
        path, loaded, _ = handler_config(
            follow(binary, dict(env), options.trampoline), config, options
        )
        if loaded is None:
            continue  # handler-config says why it does not load
        reads, reason, fix = _nvshim_reads(loaded, path)
        if len(e.handlers) > 1 or path != options.config_path:
            reason = f'runtime "{name}" reads {path}: {reason}'
        answers.append((reads, reason, fix, path))
    if not answers:
        return (*_nvshim_reads(config, options.config_path), options.config_path)
    return next((a for a in answers if a[0]), answers[0])


def _same_dirs(a: Sequence[str], b: Sequence[str]) -> bool:
    """Whether two CDI spec dir lists share a directory (``/var/run`` links to ``/run``)."""
    return bool({os.path.realpath(d) for d in a} & {os.path.realpath(d) for d in b})


def _injection_finding(e: EngineCdi, config: Optional[Config], options: DoctorOptions) -> Finding:
    """One engine's line: who injects the CDI devices a container is given, and whether
    the engine and nvshim both would. The line stays short; the sources, spec dirs and
    reasons are its ``detail``."""
    dirs = ", ".join(e.spec_dirs) or "no directory"
    named = f"the CDI devices that {CDI_ANNOTATION_PREFIX} annotations"
    engine_line = (
        f"{e.engine} injects {named} and CRI CDIDevices (DRA claims) name, from {dirs} ({e.why})"
    )
    if config is None:
        return Finding(
            _CHECK_CDI,
            "skip",
            "nvshim's config did not load: cannot tell whether nvshim injects CDI devices too",
            detail=engine_line if e.injects else e.why,
        )
    reads, reason, nvshim_fix, path = _handlers_read(e, config, options)
    # why nvshim does not inject what the engine hands it (when it does not)
    why_not = e.hand_off if reads else reason
    if e.injects is False:
        if reads and e.hands_over:
            own = ", ".join(config.cdi_spec_dirs) or "no directory"
            return Finding(
                _CHECK_CDI,
                "ok",
                "nvshim injects the CDI devices "
                f"{CDI_ANNOTATION_PREFIX} annotations name; {e.engine}'s CDI is "
                "off, DRA claims get none",
                detail=f"nvshim injects {named} name, from {own}; {e.engine} "
                f"injects none ({e.why}), so CRI CDIDevices (DRA claims) "
                "get no devices",
            )
        return Finding(
            _CHECK_CDI,
            "ok",
            f"no one injects CDI devices: {e.engine}'s CDI is off "
            f"and nvshim takes no {CDI_ANNOTATION_PREFIX} annotations",
            detail=f"no one injects {named} name: {e.engine}'s CDI is off ({e.why}) and {why_not}",
        )
    if not (reads and e.hands_over):
        if e.injects is None:
            return Finding(
                _CHECK_CDI,
                "ok",
                f"nvshim does not inject CDI devices; {e.engine} may (its version did not say)",
                detail=f"{e.why}; either way nvshim does not inject {named} name ({why_not})",
            )
        return Finding(
            _CHECK_CDI,
            "ok",
            f"{e.engine} injects CDI devices (annotations, DRA "
            "claims); nvshim counts them as an engine grant",
            detail=f"{engine_line}; nvshim does not inject them again ({why_not}) "
            f"and counts what {e.engine} injected as an engine grant",
        )
    compile_it = compile_command(path)
    both = f"{e.engine} and nvshim both inject CDI annotations' devices"
    if e.injects is None:
        return Finding(
            _CHECK_CDI,
            "warn",
            "on containerd 2.x containerd and nvshim both inject CDI devices (enable_cdi unset)",
            "set enable_cdi explicitly (--verbose: where)",
            detail=f"{e.why}: on containerd 2.x both containerd and nvshim inject {named} name "
            f"({e.hand_off}; {reason}). Fix: set enable_cdi in {e.switch} explicitly: "
            f"false for nvshim alone, or true and {nvshim_fix} (then {compile_it})",
        )
    if _same_dirs(e.spec_dirs, config.cdi_spec_dirs):
        again = "from the same CDI spec dirs"
    else:
        again = f"from its own cdi-spec-dirs, {', '.join(config.cdi_spec_dirs) or 'none'},"
    fix = (
        f"{nvshim_fix}, then {compile_it}: nvshim then counts the devices {e.engine} "
        "injected as an engine grant"
    )
    if e.switch:
        fix += f"; or set enable_cdi = false in {e.switch} so that only nvshim injects"
    return Finding(
        _CHECK_CDI,
        "warn",
        both,
        nvshim_fix,
        detail=f"{e.engine} injects {named} name, from {dirs} ({e.why}), and nvshim injects "
        f"them again {again} ({e.hand_off}; {reason}): two injections of one request, "
        f"recorded as nvshim's cdi-annotations grant rather than the engine's. "
        f"Fix: {fix}",
    )


def check_cdi_injection(
    effective: Optional[EffectiveRuntimes], config: Optional[Config], options: DoctorOptions
) -> List[Finding]:
    """Which path injects CDI devices on this node -- containerd's (``enable_cdi``, 1.7
    and later, on by default in 2.x), CRI-O's (always on) or nvshim's -- one finding per
    engine found; a warning when the engine and nvshim would both inject the devices a
    ``cdi.k8s.io/`` annotation names. ``effective`` is containerd's config as read (None:
    there is none, or it did not load)."""
    findings: List[Finding] = []
    path = options.containerd_config
    if effective is None and os.path.exists(path):
        findings.append(
            Finding(
                _CHECK_CDI,
                "skip",
                f"{path} did not load: cannot tell whether containerd injects CDI devices",
            )
        )
    else:
        containerd = _containerd_cdi(effective, options)
        if containerd is not None:
            findings.append(_injection_finding(containerd, config, options))
    crio = _crio_cdi(options)
    if crio is not None:
        findings.append(_injection_finding(crio, config, options))
    if not findings:
        findings.append(
            Finding(
                _CHECK_CDI,
                "skip",
                "no containerd and no CRI-O config: no engine injects CDI devices",
                detail=f"no containerd ({path}, or {options.containerd_binary} "
                f"on PATH) and no CRI-O config ({options.crio_config})",
            )
        )
    return findings
