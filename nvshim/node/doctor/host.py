"""``nvshim doctor``'s checks of the host: GPUs, CDI specs and ``/dev/char`` links.

``gpus``
    discovery finds GPUs under the driver root; the line lists them and their MIG devices.
``driver-files``
    the driver's files are the loaded module's version, and hold what each capability
    needs (libcuda, libnvidia-ml, nvidia-smi …).
``cdi-specs``
    every ``nvidia.com`` CDI spec in ``cdi-spec-dirs`` still describes this node (driver
    version, devices, driver files); broken spec files, and spec dirs that cannot be
    listed, are reported too. Files are listed by the CDI registry's own rule
    (:func:`nvshim.cdi.registry.spec_files`).
``cdi-spec-trust``
    every spec file of ``cdi-spec-dirs`` passes the config files' trust rule (owned by
    root, writable by root only, in a directory others cannot write): a spec that fails
    it is skipped by every create (its hooks would run as root on the host), so each is a
    failure naming the file and the rule.
``dev-char-links``
    every NVIDIA device node under the dev root has its ``/dev/char/<major>:<minor>``
    link (systemd re-applies device rules by those on ``daemon-reload``).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence

from nvshim.config import Config
from nvshim.errors import CdiProblem, NvshimError
from nvshim.host.discovery import Host
from nvshim.node.doctor.findings import DoctorOptions, Finding

if TYPE_CHECKING:
    from nvshim.cdi.model import Spec

__all__ = [
    "host_for",
    "check_gpus",
    "check_driver_files",
    "check_cdi_specs",
    "check_cdi_spec_trust",
    "check_dev_char_links",
]

_INDEXED = re.compile(r"^[0-9]+(:[0-9]+)?$")


def host_for(config: Config, options: DoctorOptions) -> Host:
    """The host to look at: the options' driver root (and dev root) over the config's."""
    if options.driver_root is not None:
        return Host(options.driver_root, options.dev_root)
    return Host(config.driver_root, options.dev_root or config.dev_root, config.nvml_facts)


def check_gpus(host: Host, config_file: str) -> Finding:
    """Discovery finds at least one GPU under the driver root."""
    fix = f"load the NVIDIA driver, or set driver-root in {config_file}"
    why = (
        "load the NVIDIA driver (nvidia-smi should list GPUs), or set driver-root in "
        f"{config_file} to the driver's root (/run/nvidia/driver for a containerised driver)"
    )
    try:
        gpus = host.gpus()
    except NvshimError as exc:
        return Finding("gpus", "fail", str(exc), fix, detail=why)
    if not gpus:
        return Finding(
            "gpus",
            "fail",
            f"no GPUs found under {host.driver_root}",
            fix,
            detail=f"/proc/driver/nvidia/gpus under {host.driver_root} is empty or missing; {why}",
        )
    try:
        version = f", driver {host.driver_version()}"
    except NvshimError:
        version = ", driver version unknown"
    listing = ", ".join(f"{g.index}=/dev/nvidia{g.minor}" for g in gpus)
    migs = [
        f"{len(g.mig)} MIG device{'' if len(g.mig) == 1 else 's'} on GPU {g.index} ("
        + ", ".join(f"{m.gpu_index}:{m.index} {m.profile}".rstrip() for m in g.mig)
        + ")"
        for g in gpus
        if g.mig
    ]
    mig_count = sum(len(g.mig) for g in gpus)
    return Finding(
        "gpus",
        "ok",
        f"{len(gpus)} GPU(s) via {host.gpu_source or 'procfs'} under {host.driver_root}"
        f"{version}" + (f", {mig_count} MIG device(s)" if migs else ""),
        detail=listing + "".join(f"; {m}" for m in migs),
    )


def check_driver_files(host: Host, capabilities: Sequence[str]) -> Finding:
    """The driver's userspace matches the loaded module, and every capability containers
    may ask for (``supported-driver-capabilities``) has its essential files.

    A version skew and missing ``compute``/``utility`` files (what a container gets by
    default) fail; other capabilities' missing files are named in the message only, since
    a headless node has no graphics files by design.
    """
    from nvshim.runtime.hostedits import skew_message

    name = "driver-files"
    try:
        version = host.driver_version()
        skew = host.version_skew()
        missing = host.missing(capabilities)
    except NvshimError as exc:
        return Finding(
            name,
            "skip",
            f"cannot look at the driver files: no driver version under {host.driver_root}",
            detail=str(exc),
        )
    if skew is not None:
        return Finding(
            name,
            "fail",
            skew_message(*skew),
            "reboot the node (or unload and load the nvidia kernel modules) so the "
            "module matches the installed driver",
        )
    default = [m for m in missing if m.endswith(("(compute)", "(utility)"))]
    others = [m for m in missing if m not in default]
    where = f"under {host.driver_root}"
    if default:
        return Finding(
            name,
            "fail",
            f"driver {version} {where} lacks {', '.join(default)}: containers get a driver "
            "they cannot use",
            "install the driver's userspace packages (or set driver-root to where they are)",
        )
    module = "the loaded module's" if host.module_version() else "no module loaded"
    tail = f"; not found: {', '.join(others)}" if others else ""
    return Finding(name, "ok", f"driver {version} files {where} ({module}){tail}")


def check_cdi_specs(
    host: Host,
    spec_dirs: Sequence[str],
    config: Optional[Config] = None,
    load_spec: Optional[Callable[[str], Spec]] = None,
) -> List[Finding]:
    """Every nvidia.com spec in ``spec_dirs`` against what ``nvshim cdi generate`` would
    write now (:func:`nvshim.node.cdigen.staleness`, the judgement ``--check`` makes too,
    with the create's fix text); broken files. ``config``: the node's (default: built-in
    defaults, and the fix names the driver root); ``load_spec``: how a file is loaded
    (default: ``load_spec_file``)."""
    from nvshim.cdi.load import load_spec_file
    from nvshim.cdi.registry import spec_files
    from nvshim.node.cdigen import staleness
    from nvshim.runtime.cdiedits import refresh_fix

    read = load_spec_file if load_spec is None else load_spec
    name = "cdi-specs"
    findings: List[Finding] = []
    if config is None:
        config = Config()
    fix_root = (
        host.driver_root
        if os.path.abspath(host.driver_root) != os.path.abspath(config.driver_root)
        else None
    )
    for directory in spec_dirs:
        # the registry's own listing rule: doctor checks exactly the files a create reads
        unlisted: List[CdiProblem] = []
        paths = spec_files(directory, unlisted)
        for problem in unlisted:
            findings.append(
                Finding(
                    name,
                    "warn",
                    f"cannot read CDI spec dir: {problem}",
                    f"make {directory} a directory of CDI specs, or take it out of cdi-spec-dirs "
                    "(engines skip it)",
                )
            )
        for path in paths:
            try:
                spec = read(path)
            except NvshimError as exc:
                findings.append(
                    Finding(
                        name,
                        "warn",
                        f"broken CDI spec: {exc}",
                        f"nvshim cdi validate {path}, then fix or remove it (engines skip it)",
                    )
                )
                continue
            if spec.vendor != "nvidia.com":
                continue
            fix = refresh_fix(config, path, fix_root)
            try:
                reasons = staleness(dict(spec.raw), host)
            except NvshimError as exc:
                findings.append(Finding(name, "skip", f"cannot check {path}: {exc}"))
                continue
            if not reasons:
                findings.append(Finding(name, "ok", f"{path} is current for this node"))
                continue
            driver_gone = any(r.startswith("driver is ") for r in reasons)
            findings.append(
                Finding(
                    name,
                    "fail" if driver_gone else "warn",
                    f"{path} is stale: {'; '.join(reasons)}",
                    fix,
                )
            )
    if not findings:
        findings.append(
            Finding(
                name,
                "ok",
                f"no nvidia.com CDI specs in {', '.join(spec_dirs) or '(no directories)'} "
                "(nvshim-runtime does not need them)",
            )
        )
    return findings


def check_cdi_spec_trust(spec_dirs: Sequence[str]) -> List[Finding]:
    """One failure per spec file of ``spec_dirs`` that the config files' trust rule
    refuses (:func:`nvshim.files.check_trusted`, as a create's scan applies it), else one
    ok; ``skip`` when not root (the rule protects root only)."""
    from nvshim.cdi.registry import spec_files
    from nvshim.errors import ConfigError
    from nvshim.files import check_trusted

    name = "cdi-spec-trust"
    where = ", ".join(spec_dirs) or "(no directories)"
    if os.geteuid() != 0:
        return [
            Finding(
                name,
                "skip",
                "not running as root: nvshim-runtime (root) refuses CDI "
                "specs others could have written; run doctor as root to check them",
            )
        ]
    findings: List[Finding] = []
    count = 0
    for directory in spec_dirs:
        for path in spec_files(directory, []):  # unlistable dirs: the cdi-specs check says
            try:
                st = os.stat(path)
            except OSError:
                continue  # gone or unreadable: the cdi-specs check says
            count += 1
            try:
                check_trusted(path, st, "CDI spec")
            except ConfigError as exc:
                findings.append(
                    Finding(
                        name,
                        "fail",
                        f"{exc}; nvshim-runtime skips it (its hooks would run as root on the "
                        "host), so its devices cannot be injected",
                        f"chown root {path} {directory} && chmod go-w {path} {directory}, after "
                        f"checking who wrote {path} (or remove it)",
                    )
                )
    if not findings:
        plural = "" if count == 1 else "s"
        findings.append(
            Finding(
                name,
                "ok",
                f"{count} CDI spec file{plural} in {where}: each "
                "owned by root and writable by root only",
            )
        )
    return findings


def check_dev_char_links(dev_root: str, systemd: Optional[bool] = None) -> Finding:
    """Every NVIDIA device node has its /dev/char/<major>:<minor> link (systemd needs it).

    ``systemd`` (default: whether /run/systemd/system exists) says if systemd runs here;
    without it nothing re-applies device rules and the check is ``skip``.
    """
    from nvshim.host.system import create_dev_char_symlinks

    if systemd is None:
        systemd = os.path.isdir("/run/systemd/system")
    if not systemd:
        return Finding(
            "dev-char-links",
            "skip",
            "systemd does not run here: no daemon-reload "
            "can take devices away, /dev/char links are not needed",
        )
    try:
        outcomes = create_dev_char_symlinks(dev_root, dry_run=True)
    except NvshimError as exc:
        return Finding("dev-char-links", "skip", str(exc))
    missing = [
        f"{os.path.basename(o.path)} ({o.detail.split(',')[0]})"
        for o in outcomes
        if o.action != "exists"
    ]
    if not missing:
        return Finding(
            "dev-char-links",
            "ok",
            f"{len(outcomes)} NVIDIA device node(s), each with its /dev/char link",
        )
    shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
    where = "" if dev_root in ("", "/") else f" --dev-root {dev_root}"
    return Finding(
        "dev-char-links",
        "warn",
        f"/dev/char links missing or foreign: {shown}; a `systemctl daemon-reload` takes those "
        "devices away from running containers that use the systemd cgroup driver",
        f"nvshim system create-dev-char-symlinks{where}",
    )
