"""``nvshim doctor``: check a node and explain each finding in one line, with a fix.

Every check is a function that reads what it needs (files, PATH, the driver root, the
version containerd reports) and returns :class:`~nvshim.node.doctor.findings.Finding` values;
nothing is written. The checks live
by subject in :mod:`nvshim.node.doctor.config` (nvshim's own files),
:mod:`nvshim.node.doctor.engines` (containerd, Docker, CRI-O),
:mod:`nvshim.node.doctor.handlers` (containerd's handlers across its files),
:mod:`nvshim.node.doctor.install` (what install.sh set up) and
:mod:`nvshim.node.doctor.host` (GPUs, CDI specs, device links). :func:`run_checks` runs
them all in a fixed order, :func:`render_text` / :func:`render_json` format the result and
:func:`exit_code` is 1 when any finding failed.

The checks, by name:

``config``
    nvshim's YAML config validates (a :class:`~nvshim.errors.ConfigError` is a failure);
    a config named by ``--config`` must exist (no file at the default path means defaults).
``compiled-config``
    ``<stem>.compiled.json`` exists and matches the YAML (hash and nvshim version), and the
    trampoline's ``<stem>.runtimes`` is not older than the YAML and lists the same runtimes.
``default-runtime-config``
    where ``install.sh --set-as-default`` left its mark (``<stem>.default-runtime``), the
    config has require-allocation on and holds settings (:mod:`nvshim.node.doctor.install`);
    ``skip`` without the mark.
``runtimes``
    at least one of ``runtimes`` (runc, crun, an absolute path) is an executable.
``executable-trust``
    every program nvshim runs as root or lets runc run because of its config or a CDI spec
    (runtimes, CDI spec hooks, its own hook's interpreter, its Docker ``--gpus`` stand-in)
    passes the config files' trust rule; one failure per program others could write
    (:mod:`nvshim.node.doctor.exec`).
``containerd-config``
    containerd's config parses and its imports exist; no config at all is ``skip``.
``containerd-drop-in``
    nvshim's drop-in still carries the CRI tables of the files loaded before it (only
    when it does not).
``configured``
    every runtime ``nvshim runtime configure`` recorded in an engine's backup
    (``<config>.nvshim-orig.json``) is one that engine still loads (only when one is not:
    another tool or a hand edit took it out).
``containerd-handlers``
    every runtime handler that containerd's main file or a drop-in declares is in the
    config containerd uses (before 2.1 a later file's CRI table hides an earlier one's
    handlers); the fix re-runs configure with the flags nvshim's drop-in was written with.
``containerd-runtime-binary``
    the nvshim handler's ``options.BinaryName`` is an executable file.
``default-runtime``
    the pitfall: NVIDIA's runtime as containerd's default runtime (it grants GPUs from the
    image's env), or nvshim as the default with require-allocation off.
``docker`` / ``crio``
    the same questions for Docker's daemon.json and CRI-O's config and drop-ins.
``cdi-injection``
    which path injects CDI devices, one line per engine found: containerd itself
    (``enable_cdi``; its default depends on the version, so ``containerd --version`` is
    asked when the config does not set it), CRI-O itself (always), or nvshim; a warning
    when the engine and nvshim would both inject the devices a ``cdi.k8s.io/``
    annotation names.
``dev-char-links``
    every NVIDIA device node under the dev root has its ``/dev/char/<major>:<minor>``
    link (systemd re-applies device rules by those on ``daemon-reload``).
``allocation-trust``
    require-allocation on, but it trusts claims a pod can write itself (``envvar-uuids``,
    ``volume-mounts``, ``cdi-annotations``) without ``verify-with: kubelet``.
``gpus``
    discovery finds GPUs under the driver root; the line lists them and their MIG devices.
``driver-files``
    the driver's files are the loaded module's version (a skew fails), and the
    ``compute`` and ``utility`` files (libcuda, libnvidia-ml, nvidia-smi) exist; other
    capabilities' missing files are named.
``cdi-specs``
    every ``nvidia.com`` CDI spec in ``cdi-spec-dirs`` still describes this node (driver
    version, devices, driver files); broken spec files and unlistable spec dirs are
    reported too.
``cdi-spec-trust``
    every spec file of ``cdi-spec-dirs`` passes the config files' trust rule; one a create
    skips (owned by another uid, writable by others, in a directory others can write) fails.
``trampoline``
    the installed ``nvshim-runtime`` sh trampoline (in ``$NVSHIM_BINDIR``, which the
    installed ``nvshim`` command carries, else ``/usr/local/bin``) is what this nvshim renders.
``handler-config``
    the config each engine runtime that leads to nvshim-runtime reads -- through wrapper
    scripts, the trampoline's embedded path, CRI-O's ``monitor_env``, and the
    ``--runtime-binary`` ones -- exists, loads, does not chain into NVIDIA's runtime
    (``runtimes:``), and has require-allocation on where a pod can pick it by RuntimeClass
    (:mod:`nvshim.node.doctor.reach`). ``default-runtime``, ``docker`` and ``crio`` judge
    a default runtime by the config it reads, and NVIDIA's runtime by its own
    ``accept-nvidia-visible-devices-envvar-when-unprivileged``. A ``config`` that no runtime
    found reads is not failed for being missing.
``oci-hooks``
    NVIDIA's hook in podman's and CRI-O's hooks.d, for every container (``"always": true``)
    or a matching few (:mod:`nvshim.node.doctor.hooks`).
"""

from __future__ import annotations

import json
import os
from typing import List, Sequence

from nvshim.cdi.index import spec_reader
from nvshim.config import Config, cdi_index_path
from nvshim.errors import one_line
from nvshim.node.doctor.config import (
    check_allocation_trust,
    check_compiled_config,
    check_config,
    check_runtimes,
    check_trampoline,
)
from nvshim.node.doctor.engines import (
    check_configured_runtimes,
    check_containerd_config,
    check_crio,
    check_default_runtime,
    check_docker,
    check_drop_in_drift,
    check_runtime_binary,
)
from nvshim.node.doctor.exec import check_executables
from nvshim.node.doctor.findings import DoctorOptions, Finding
from nvshim.node.doctor.handlers import check_lost_handlers
from nvshim.node.doctor.hooks import check_oci_hooks
from nvshim.node.doctor.host import (
    check_cdi_spec_trust,
    check_cdi_specs,
    check_dev_char_links,
    check_driver_files,
    check_gpus,
    host_for,
)
from nvshim.node.doctor.injection import check_cdi_injection
from nvshim.node.doctor.install import check_default_mark
from nvshim.node.doctor.reach import check_handler_configs, config_readers, engine_runtimes
from nvshim.node.engines.containerd_read import start_version

__all__ = ["run_checks", "render_text", "render_json", "exit_code"]

_LABELS = {"ok": "ok", "warn": "warn", "fail": "FAIL", "skip": "skip"}


def run_checks(options: DoctorOptions) -> List[Finding]:
    """Every check, in a fixed order (see the module docstring)."""
    findings: List[Finding] = []
    # containerd --version (a Go program's start) answers while the checks read files
    start_version(options.containerd_binary)
    config_finding, config = check_config(options.config_path, options.config_required)
    runtimes = engine_runtimes(options)
    readers = config_readers(runtimes, options)
    if (
        config_finding.status == "fail"
        and config is not None
        and readers
        and not any(os.path.realpath(r) == os.path.realpath(options.config_path) for r in readers)
    ):
        # missing but named (NVSHIM_CONFIG): no runtime found reads it, so no create fails
        config_finding = Finding(
            "config",
            "skip",
            f"no {options.config_path}, and no engine runtime found reads "
            f"it: they read {', '.join(readers)} (handler-config)",
        )
    findings.append(config_finding)
    findings.append(check_compiled_config(options.config_path, config))
    findings.append(check_default_mark(options.config_path))
    usable = config if config is not None else Config()
    # the spec files two checks read, each loaded once; YAML ones from a fresh CDI index
    load_spec = spec_reader(
        usable.cdi_spec_dirs, cdi_index_path(usable.source or options.config_path)
    )
    findings.append(check_runtimes(usable, options))
    findings.extend(check_executables(usable, load_spec))

    containerd_finding, effective = check_containerd_config(options.containerd_config)
    findings.append(containerd_finding)
    if effective is not None:
        drift = check_drop_in_drift(options.containerd_config, options)
        if drift is not None:
            findings.append(drift)
        findings.append(check_lost_handlers(effective, options))
        findings.append(check_runtime_binary(effective, options))
        from nvshim.node.doctor.nri import nri_guard

        findings.append(
            check_default_runtime(effective, config, options, nri_guard(options.agent_socket))
        )
    findings.extend(check_configured_runtimes(options))
    findings.append(check_docker(options.docker_config, config, options))
    findings.append(check_crio(options.crio_config, config, options))
    findings.extend(check_cdi_injection(effective, config, options))
    findings.append(check_allocation_trust(config, options.config_path))

    host = host_for(usable, options)
    findings.append(check_gpus(host, options.config_path))
    findings.append(check_driver_files(host, usable.supported_driver_capabilities))
    findings.extend(check_cdi_specs(host, usable.cdi_spec_dirs, usable, load_spec))
    findings.extend(check_cdi_spec_trust(usable.cdi_spec_dirs))
    findings.append(check_dev_char_links(host.dev_root))
    findings.append(check_trampoline(options.trampoline))
    findings.extend(check_handler_configs(runtimes, config, options))
    findings.append(check_oci_hooks(options))
    from nvshim.node.doctor.agent import check_agent

    findings.append(check_agent(options.agent_socket, options.config_path, options.trampoline))
    from nvshim.node.doctor.nri import check_nri

    inject = options.config_path if config is not None and config.nri_inject else ""
    findings.append(
        check_nri(
            options.containerd_config,
            options.containerd_binary,
            options.agent_socket,
            options.crio_config,
            inject,
        )
    )
    return findings


def render_text(findings: Sequence[Finding], verbose: bool = False) -> str:
    """One line per finding: ``ok    check: message`` / ``FAIL  check: message — fix: …``;
    ``verbose`` adds a finding's ``detail`` on an indented line below it."""
    lines = []
    for f in findings:
        line = f"{_LABELS[f.status]:<6}{f.check}: {f.message}"
        if f.fix and f.status in ("warn", "fail"):
            line += f" — fix: {f.fix}"
        # our own line breaks read as spaces; any other control character (a file's text
        # holding ESC or \r) is escaped: a finding is one line of what the operator reads
        lines.append(one_line(" ".join(line.split("\n")), None))
        if verbose and f.detail:
            lines.append("      " + one_line(" ".join(f.detail.split("\n")), None))
    return "\n".join(lines)


def render_json(findings: Sequence[Finding]) -> str:
    """A JSON list of ``{"check", "status", "message", "fix"}`` objects."""
    return json.dumps([f.to_dict() for f in findings], indent=2)


def exit_code(findings: Sequence[Finding]) -> int:
    """1 when any finding failed, else 0."""
    return 1 if any(f.status == "fail" for f in findings) else 0
