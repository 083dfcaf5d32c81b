"""``nvshim doctor``: check a node and explain each finding in one line, with a fix.

Every check is a function that reads what it needs (files, PATH, the driver root) and
returns :class:`Finding` values; nothing is written. :func:`run_checks` runs them all in
a fixed order, :func:`render_text` / :func:`render_json` format the result and
:func:`exit_code` is 1 when any finding failed.

The checks, by name:

``config``
    nvshim's YAML config validates (a :class:`~nvshim.errors.ConfigError` is a failure).
``compiled-config``
    ``<stem>.compiled.json`` exists and matches the YAML (hash and nvshim version), and the
    trampoline's ``<stem>.runtimes`` is not older than the YAML and lists the same runtimes.
``runtimes``
    at least one of ``runtimes`` (runc, crun, an absolute path) is an executable.
``containerd-config``
    containerd's config parses and its imports exist; no config at all is ``skip``.
``containerd-runtime-binary``
    the nvshim handler's ``options.BinaryName`` is an executable file.
``default-runtime``
    the pitfall: nvshim as containerd's default runtime with require-allocation off.
``docker`` / ``crio``
    the same three questions for Docker's daemon.json and CRI-O's config and drop-ins
    (see :mod:`nvshim.node.doctor_engines`).
``dev-char-links``
    every NVIDIA device node under the dev root has its ``/dev/char/<major>:<minor>``
    link (systemd re-applies device rules by those on ``daemon-reload``).
``allocation-trust``
    require-allocation on, but it trusts claims a pod can write itself (``envvar-uuids``,
    ``volume-mounts``, ``cdi-annotations``) without ``verify-with: kubelet``.
``gpus``
    discovery finds GPUs under the driver root.
``cdi-specs``
    every ``nvidia.com`` CDI spec in ``cdi-spec-dirs`` still describes this node (driver
    version, devices, driver files); broken spec files are reported too.
``trampoline``
    the installed ``nvshim-runtime`` sh trampoline is what this nvshim renders.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any, Dict, List, Optional, Sequence, Tuple

from nvshim import __version__
from nvshim.config import (
    DEFAULT_CONFIG_PATH,
    Config,
    compiled_path,
    load_config,
    runtimes_path,
)
from nvshim.errors import NvshimError

__all__ = [
    "Finding",
    "DoctorOptions",
    "STATUSES",
    "DEFAULT_TRAMPOLINE",
    "check_config",
    "check_compiled_config",
    "check_runtimes",
    "check_containerd_config",
    "check_runtime_binary",
    "check_default_runtime",
    "check_allocation_trust",
    "check_gpus",
    "check_cdi_specs",
    "check_trampoline",
    "run_checks",
    "render_text",
    "render_json",
    "exit_code",
]

from nvshim.node.findings import (  # noqa: E402 - re-exported: the checks' vocabulary
    DEFAULT_TRAMPOLINE,
    STATUSES,
    DoctorOptions,
    Finding,
    is_nvshim,
)

_LABELS = {"ok": "ok", "warn": "warn", "fail": "FAIL", "skip": "skip"}
_INDEXED = re.compile(r"^[0-9]+(:[0-9]+)?$")


def _compile_fix(path: str) -> str:
    flag = "" if path == DEFAULT_CONFIG_PATH else f" --config {path}"
    return f"nvshim config compile{flag}"


# --------------------------------------------------------------------------- nvshim config


def check_config(path: str) -> Tuple[Finding, Optional[Config]]:
    """Load nvshim's config; the finding, and the config (None when it is invalid)."""
    try:
        config = load_config(path)
    except NvshimError as exc:
        return Finding("config", "fail", str(exc), f"fix {path}, then {_compile_fix(path)}"), None
    if config.source is None:
        return Finding("config", "ok", f"no {path}: built-in defaults"), config
    mode = "on" if config.require_allocation else "off"
    return Finding("config", "ok", f"{path} is valid (require-allocation {mode})"), config


def _read_bytes(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def check_compiled_config(path: str, config: Optional[Config]) -> Finding:
    """The compiled JSON copy and the trampoline's runtime list are current for ``path``."""
    name = "compiled-config"
    if config is None:
        return Finding(name, "skip", f"{path} is invalid: nothing to compare")
    data = _read_bytes(path)
    if data is None:
        return Finding(name, "ok", f"no {path}: nothing to compile")
    fix = _compile_fix(path)
    compiled = compiled_path(path)
    raw = _read_bytes(compiled)
    if raw is None:
        return Finding(name, "warn", f"{compiled} is missing: every create parses the YAML", fix)
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return Finding(name, "warn", f"{compiled} is not a compiled nvshim config", fix)
    if doc.get("nvshim-version") != __version__:
        return Finding(
            name, "warn",
            f"{compiled} was written by nvshim {doc.get('nvshim-version')}, this is {__version__}",
            fix,
        )
    from nvshim.config import compiled_matches

    if not compiled_matches(doc, data):
        return Finding(name, "warn", f"{path} changed since it was compiled into {compiled}", fix)
    listing = runtimes_path(path)
    try:
        os.stat(listing)
    except FileNotFoundError:
        return Finding(
            name, "warn", f"{listing} is missing: the trampoline starts Python for every command",
            fix,
        )
    except OSError as exc:
        return Finding(name, "warn", f"cannot stat {listing}: {exc.strerror}", fix)
    listed = (_read_bytes(listing) or b"").decode(errors="replace").splitlines()
    from nvshim.config import compiled_lists_fresh

    if not compiled_lists_fresh(path) or listed != list(config.runtimes):
        return Finding(
            name, "warn",
            f"{listing} was not compiled from this {path} or lists other runtimes "
            f"({' '.join(listed) or 'none'}; config has {' '.join(config.runtimes)})",
            fix,
        )
    return Finding(name, "ok", f"{compiled} and {listing} match {path}")


def _find_runtime(name: str) -> Optional[str]:
    if os.path.isabs(name):
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    if "/" in name:
        return None
    return shutil.which(name)


def check_runtimes(config: Config) -> Finding:
    """At least one configured low-level runtime can be executed."""
    for name in config.runtimes:
        found = _find_runtime(name)
        if found is not None:
            return Finding("runtimes", "ok", f"low-level runtime {name} found at {found}")
    where = ", ".join(config.runtimes)
    source = config.source or "the built-in defaults"
    return Finding(
        "runtimes", "fail",
        f"none of the configured runtimes ({where}) is an executable on PATH or an absolute path: "
        "every container fails",
        f"install runc (apt-get install runc) or fix runtimes: in {source}",
    )


# --------------------------------------------------------------------------- containerd


def _nvshim_handlers(effective: Any, options: DoctorOptions) -> Dict[str, Optional[str]]:
    return {
        name: binary
        for name, binary in effective.handlers.items()
        if is_nvshim(name, binary, options)
    }


def check_containerd_config(path: str) -> Tuple[Finding, Optional[Any]]:
    """Read containerd's handlers; the finding and the :class:`EffectiveRuntimes` (or None)."""
    name = "containerd-config"
    if not os.path.exists(path):
        message = f"no containerd config at {path}: containerd defaults apply"
        return Finding(name, "skip", message), None
    from nvshim.node.containerd import read_handlers

    try:
        effective = read_handlers(path)
    except NvshimError as exc:
        fix = f"fix {path}: containerd will not start with it"
        return Finding(name, "fail", str(exc), fix), None
    if effective.problems:
        return Finding(
            name, "warn", "; ".join(effective.problems),
            f"fix or remove the import in {path}",
        ), effective
    handlers = ", ".join(sorted(effective.handlers)) or "none"
    return Finding(
        name, "ok",
        f"{path} (version {effective.version}, {len(effective.files)} file(s)): "
        f"runtime handlers {handlers}; default {effective.default_runtime_name}",
    ), effective


def check_drop_in_drift(path: str) -> Optional[Finding]:
    """nvshim's drop-in still carries the main file's CRI table (None: no nvshim drop-in)."""
    from nvshim.node.containerd import drop_in_drift

    try:
        drift = drop_in_drift(path)
    except NvshimError as exc:
        return Finding("containerd-drop-in", "warn", f"cannot compare drop-ins: {exc}")
    if not drift:
        return None
    lines = []
    for drop_in, keys in drift:
        shown = ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
        lines.append(f"{drop_in} has a stale copy of {path}: {shown} differ")
    from nvshim.node.containerd import DEFAULT_DROP_IN

    first = drift[0][0]
    flag = "" if first == DEFAULT_DROP_IN else f" --drop-in {first}"
    return Finding(
        "containerd-drop-in", "fail",
        "; ".join(lines) + " (containerd before 2.1 uses the drop-in's table, not the main file's)",
        f"nvshim runtime configure --runtime containerd --config {path}{flag} (copies the table again)",
    )


def check_runtime_binary(effective: Any, options: DoctorOptions) -> Finding:
    """The nvshim handler's BinaryName exists and is executable."""
    name = "containerd-runtime-binary"
    ours = _nvshim_handlers(effective, options)
    if not ours:
        return Finding(
            name, "warn",
            f"containerd config {effective.config_path} has no nvshim runtime handler",
            "nvshim runtime configure --runtime containerd",
        )
    bad: List[str] = []
    good: List[str] = []
    for handler, binary in sorted(ours.items()):
        if binary is None:
            bad.append(
                f'handler "{handler}" has no options.BinaryName, so containerd runs plain runc'
            )
        elif not os.path.isabs(binary):
            bad.append(f'handler "{handler}" BinaryName {binary} is not an absolute path')
        elif not os.path.isfile(binary):
            bad.append(f'handler "{handler}" BinaryName {binary} does not exist')
        elif not os.access(binary, os.X_OK):
            bad.append(f'handler "{handler}" BinaryName {binary} is not executable')
        else:
            good.append(f'handler "{handler}" runs {binary}')
    if bad:
        return Finding(
            name, "fail", "; ".join(bad) + ": its containers get no GPUs or fail to start",
            f"install nvshim (./install.sh), or re-run nvshim runtime configure "
            f"--binary {DEFAULT_TRAMPOLINE}",
        )
    return Finding(name, "ok", "; ".join(good))


def check_default_runtime(
    effective: Any, config: Optional[Config], options: DoctorOptions
) -> Finding:
    """The pitfall: nvshim is containerd's default runtime but require-allocation is off."""
    name = "default-runtime"
    default = effective.default_runtime_name
    ours = _nvshim_handlers(effective, options)
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
    if config is None:
        return Finding(
            name, "skip", "containerd's default runtime is nvshim; nvshim's config is invalid"
        )
    if config.require_allocation:
        return Finding(
            name, "ok",
            "containerd's default runtime is nvshim and require-allocation is on: "
            "only device-plugin allocations grant GPUs",
        )
    which = "" if default == "nvshim" else f' (handler "{default}")'
    return Finding(
        name, "fail",
        f"containerd's default runtime is nvshim{which} but require-allocation is off: pods that "
        "request no GPU get every GPU from CUDA images' NVIDIA_VISIBLE_DEVICES=all",
        f"set require-allocation: true in {options.config_path} (then nvshim config compile), "
        "or make runc the default and use RuntimeClass nvshim",
    )


#: allocation-sources whose evidence a pod can write into its own spec (env, hostPath, annotation).
_FORGEABLE = ("envvar-uuids", "volume-mounts", "cdi-annotations")


def check_allocation_trust(config: Optional[Config], path: str) -> Finding:
    """require-allocation that still believes claims a pod can forge."""
    name = "allocation-trust"
    if config is None:
        return Finding(name, "skip", f"{path} is invalid: nothing to check")
    if not config.require_allocation:
        return Finding(name, "skip", "require-allocation is off: every claim is granted anyway")
    if config.verify_with == "kubelet":
        if not os.path.exists(config.kubelet_socket) and config.kubelet_unreachable == "fail":
            return Finding(
                name, "warn",
                f"verify-with: kubelet, but the kubelet's PodResources socket "
                f"{config.kubelet_socket} does not exist: every GPU claim of a pod will fail",
                f"start the kubelet, or set kubelet-socket in {path} to where it listens",
            )
        return Finding(name, "ok", "require-allocation checks every claim against the kubelet's "
                       f"record (kubelet-unreachable: {config.kubelet_unreachable})")
    forgeable = [s for s in config.allocation_sources if s in _FORGEABLE]
    if config.accept_all_from_mounts and "volume-mounts" in config.allocation_sources:
        forgeable.append("accept-all-from-mounts")
    if not forgeable:
        return Finding(name, "ok", "require-allocation trusts only " +
                       ", ".join(config.allocation_sources))
    return Finding(
        name, "warn",
        f"require-allocation trusts claims a pod can write itself ({', '.join(forgeable)}): a pod "
        "that sets NVIDIA_VISIBLE_DEVICES=GPU-<uuid> or mounts a hostPath under "
        "/var/run/nvidia-container-devices gets another tenant's GPU",
        f"set verify-with: kubelet in {path} (then nvshim config compile)",
    )


# --------------------------------------------------------------------------- host


def _host(config: Config, options: DoctorOptions) -> Any:
    from nvshim.host.discovery import Host

    if options.driver_root is not None:
        return Host(options.driver_root, options.dev_root)
    return Host(config.driver_root, options.dev_root or config.dev_root)


def check_gpus(host: Any, config_file: str) -> Finding:
    """Discovery finds at least one GPU under the driver root."""
    fix = (
        "load the NVIDIA driver (nvidia-smi should list GPUs), or set driver-root in "
        f"{config_file} to the driver's root (/run/nvidia/driver for a containerised driver)"
    )
    try:
        gpus = host.gpus()
    except NvshimError as exc:
        return Finding("gpus", "fail", str(exc), fix)
    if not gpus:
        return Finding(
            "gpus", "fail",
            f"no GPUs found under {host.driver_root} "
            "(/proc/driver/nvidia/gpus is empty or missing)",
            fix,
        )
    try:
        version = f", driver {host.driver_version()}"
    except NvshimError:
        version = ", driver version unknown"
    listing = ", ".join(f"{g.index}=/dev/nvidia{g.minor}" for g in gpus)
    return Finding(
        "gpus", "ok",
        f"{len(gpus)} GPU(s) via {host.gpu_source or 'procfs'} under {host.driver_root}"
        f"{version}: {listing}",
    )


def _spec_files(directory: str) -> List[str]:
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    return [
        os.path.join(directory, n) for n in names
        if n.endswith((".json", ".yaml")) and not os.path.isdir(os.path.join(directory, n))
    ]


def _strategies(raw: Any) -> Tuple[str, ...]:
    names = [str(d.get("name", "")) for d in raw.get("devices") or [] if isinstance(d, dict)]
    found: List[str] = []
    if any(_INDEXED.match(n) for n in names):
        found.append("index")
    if any(n.startswith(("GPU-", "MIG-")) for n in names):
        found.append("uuid")
    return tuple(found) or ("index", "uuid")


def check_cdi_specs(host: Any, spec_dirs: Sequence[str]) -> List[Finding]:
    """Every nvidia.com spec in ``spec_dirs`` against a freshly generated one; broken files."""
    from nvshim.cdi.load import load_spec_file
    from nvshim.node.cdigen import generate_spec, stale_reasons
    from nvshim.runtime.create import hook_command

    name = "cdi-specs"
    findings: List[Finding] = []
    fresh: Dict[Tuple[str, ...], Any] = {}
    checked = 0
    for directory in spec_dirs:
        for path in _spec_files(directory):
            try:
                spec = load_spec_file(path)
            except NvshimError as exc:
                findings.append(Finding(
                    name, "warn", f"broken CDI spec: {exc}",
                    f"nvshim cdi validate {path}, then fix or remove it (engines skip it)",
                ))
                continue
            if spec.vendor != "nvidia.com":
                continue
            checked += 1
            strategies = _strategies(spec.raw)
            root = "" if host.driver_root == "/" else f" --driver-root {host.driver_root}"
            fix = f"nvshim cdi generate{root} --output {path}"
            if strategies not in fresh:
                try:
                    fresh[strategies] = generate_spec(
                        host, spec.vendor, spec.class_, strategies, hook_command=hook_command()
                    )
                except NvshimError as exc:
                    fresh[strategies] = exc
            current = fresh[strategies]
            if isinstance(current, NvshimError):
                findings.append(Finding(name, "skip", f"cannot check {path}: {current}"))
                continue
            try:
                reasons = stale_reasons(dict(spec.raw), current, host)
            except NvshimError as exc:
                findings.append(Finding(name, "skip", f"cannot check {path}: {exc}"))
                continue
            if not reasons:
                findings.append(Finding(name, "ok", f"{path} is current for this node"))
                continue
            driver_gone = any(r.startswith("driver is ") for r in reasons)
            findings.append(Finding(
                name, "fail" if driver_gone else "warn",
                f"{path} is stale: {'; '.join(reasons)}", fix,
            ))
    if not findings:
        findings.append(Finding(
            name, "ok",
            f"no nvidia.com CDI specs in {', '.join(spec_dirs) or '(no directories)'} "
            "(nvshim-runtime does not need them)",
        ))
    return findings


# --------------------------------------------------------------------------- install


def check_trampoline(path: str) -> Finding:
    """The installed ``nvshim-runtime`` is the trampoline this nvshim would install."""
    from nvshim.runtime.trampoline import render

    name = "trampoline"
    fix = "re-run nvshim's install.sh"
    data = _read_bytes(path)
    if data is None:
        return Finding(name, "skip", f"{path} is not installed")
    text = data.decode(errors="replace")
    python = None
    for line in text.splitlines():
        if line.startswith("py="):
            python = line[len("py="):].strip()
            break
    if python is None:
        return Finding(name, "warn", f"{path} is not nvshim's sh trampoline (no py= line)", fix)
    if not os.access(path, os.X_OK):
        return Finding(name, "fail", f"{path} is not executable: containerd cannot run it", fix)
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        return Finding(
            name, "fail", f"{path} starts {python}, which is not an executable: every create fails",
            fix,
        )
    try:
        expected = render(python)
    except ValueError as exc:
        return Finding(name, "warn", f"{path}: {exc}", fix)
    if text != expected:
        return Finding(
            name, "warn",
            f"{path} differs from the trampoline this nvshim ({__version__}) renders: "
            "installed by another version or edited",
            fix,
        )
    return Finding(name, "ok", f"{path} is current (python {python})")


# --------------------------------------------------------------------------- all


def run_checks(options: DoctorOptions) -> List[Finding]:
    """Every check, in a fixed order (see the module docstring)."""
    findings: List[Finding] = []
    config_finding, config = check_config(options.config_path)
    findings.append(config_finding)
    findings.append(check_compiled_config(options.config_path, config))
    usable = config if config is not None else Config()
    findings.append(check_runtimes(usable))

    containerd_finding, effective = check_containerd_config(options.containerd_config)
    findings.append(containerd_finding)
    if effective is not None:
        drift = check_drop_in_drift(options.containerd_config)
        if drift is not None:
            findings.append(drift)
        findings.append(check_runtime_binary(effective, options))
        findings.append(check_default_runtime(effective, config, options))
    from nvshim.node.doctor_engines import check_crio, check_docker

    findings.append(check_docker(options.docker_config, config, options))
    findings.append(check_crio(options.crio_config, config, options))
    findings.append(check_allocation_trust(config, options.config_path))

    host = _host(usable, options)
    findings.append(check_gpus(host, options.config_path))
    findings.extend(check_cdi_specs(host, usable.cdi_spec_dirs))
    from nvshim.node.doctor_engines import check_dev_char_links

    findings.append(check_dev_char_links(host.dev_root))
    findings.append(check_trampoline(options.trampoline))
    return findings


def render_text(findings: Sequence[Finding]) -> str:
    """One line per finding: ``ok    check: message`` / ``FAIL  check: message — fix: …``."""
    lines = []
    for f in findings:
        line = f"{_LABELS[f.status]:<6}{f.check}: {f.message}"
        if f.fix and f.status in ("warn", "fail"):
            line += f" — fix: {f.fix}"
        lines.append(" ".join(line.split("\n")))
    return "\n".join(lines)


def render_json(findings: Sequence[Finding]) -> str:
    """A JSON list of ``{"check", "status", "message", "fix"}`` objects."""
    return json.dumps([f.to_dict() for f in findings], indent=2)


def exit_code(findings: Sequence[Finding]) -> int:
    """1 when any finding failed, else 0."""
    return 1 if any(f.status == "fail" for f in findings) else 0

