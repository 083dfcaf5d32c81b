"""The bodies of the read-only commands operators run in loops: ``grants``, ``cdi list``,
``cdi generate --check`` and ``doctor``, without click.

Both ways of running them call these functions: the click commands (:mod:`cmd_grants`,
:mod:`cmd_cdi`, :mod:`cmd_doctor`) after click parsed the options, and :mod:`nvshim.cli.fast`
for the plain forms, which never imports click. They print through :mod:`nvshim.cli.report`
(results on stdout, warnings and notes on stderr), return the exit status, and raise
:class:`NvshimError` for the one-line failures.
"""

from __future__ import annotations

from nvshim.cli.report import err, out

TYPE_CHECKING = False  # typing alone costs about the interpreter's start (BENCHMARKS.md)
if TYPE_CHECKING:
    from typing import Any, Dict, Optional, Sequence, Tuple

    from nvshim.config import Config
    from nvshim.errors import CdiProblem

__all__ = ["grants", "cdi_list", "cdi_check", "doctor", "echo_json", "problem_json"]

#: Unreadable line numbers a warning lists before it says "…".
_SHOWN_LINES = 10


# --- grants -------------------------------------------------------------------------------


def _unreadable(numbers: Sequence[int]) -> str:
    """``3 unreadable lines (1-2,7)``: the count, and the first line numbers as ranges."""
    from nvshim.host.devices import describe_indices

    shown = describe_indices(list(numbers[:_SHOWN_LINES]))
    more = ",…" if len(numbers) > _SHOWN_LINES else ""
    return f"{len(numbers)} unreadable line{'s' if len(numbers) > 1 else ''} ({shown}{more})"


def _indices(config: Config) -> Dict[str, str]:
    """UUID → index on this node (the plan cache, else discovery, as create sees it); empty,
    with a warning, when the node cannot be read: the holders are still worth showing."""
    from nvshim.errors import NvshimError
    from nvshim.node.holders import gpu_indices
    from nvshim.runtime.plancache import host_for

    try:
        host, _ = host_for(config, save=False)
        return gpu_indices(host)
    except NvshimError as exc:
        err(f"nvshim: warning: GPU indices unknown: {exc}")
        return {}


def _show_denied(journal: str, fmt: str) -> None:
    from nvshim.node.denied import render_denied_json, render_denied_table
    from nvshim.runtime.denials import denials_path, read_denials

    path = denials_path(journal)
    records = read_denials(path)
    if records is None:
        err(
            f"nvshim: no denials yet: {path} does not exist (nvshim-runtime creates it "
            "at the first container it strips or refuses)"
        )
        records = []
    out(render_denied_json(records) if fmt == "json" else render_denied_table(records))


def grants(
    config_file: Optional[str],
    journal: Optional[str],
    fmt: str,
    prom_file: Optional[str],
    denied: bool,
) -> int:
    """``nvshim grants``: the live holders of GPUs (1 when two hold one GPU unshared)."""
    from nvshim.config import load_config
    from nvshim.errors import ConfigError, HostError
    from nvshim.node.holders import (
        conflicts,
        live_grants,
        read_journal,
        render_json,
        render_prometheus,
        render_table,
    )

    config = load_config(config_file, required=config_file is not None)
    path = journal or config.grants_journal
    if not path:
        raise ConfigError(
            f"grants-journal is off (null) in {config.source or 'the config'}; pass --journal FILE"
        )
    if denied:
        _show_denied(path, fmt)
        return 0
    doc = read_journal(path)
    if doc is None and journal is not None:
        raise HostError(f"grant journal {path} does not exist")
    if doc is None:
        err(
            f"nvshim: no grants yet: {path} does not exist (nvshim-runtime creates it "
            "at the first GPU grant)"
        )
    elif doc.unreadable and not doc.grants:
        raise HostError(
            f"{path} holds no grant record, only {_unreadable(doc.unreadable)}: "
            "is it the grant journal?"
        )
    elif doc.unreadable:
        err(f"nvshim: warning: {path}: skipped {_unreadable(doc.unreadable)}")
    holders = live_grants(doc.grants if doc is not None else ())
    indices = _indices(config) if holders else {}
    if prom_file:
        from nvshim.files import write_atomic

        write_atomic(prom_file, render_prometheus(holders).encode(), default_mode=0o644)
    out(render_json(holders, indices) if fmt == "json" else render_table(holders, indices))
    return 1 if conflicts(holders) else 0


# --- cdi list -----------------------------------------------------------------------------


def problem_json(problem: CdiProblem) -> Dict[str, str]:
    """A CDI problem as ``--format json`` shows it."""
    return {"file": problem.path, "json_path": problem.json_path, "message": problem.message}


def echo_json(doc: Any) -> None:
    """One JSON document on stdout, indented, as every ``--format json`` prints."""
    from nvshim import _jsonc

    out(_jsonc.dumps(doc, indent=2, ensure_ascii=False))


def cdi_list(spec_dirs: Sequence[str], fmt: str) -> int:
    """``nvshim cdi list``: every resolvable qualified device name."""
    if spec_dirs:
        from nvshim.cdi.registry import load_registry

        registry = load_registry(spec_dirs)
    else:
        from nvshim.cdi.index import registry_for
        from nvshim.config import cdi_index_path, config_path, load_config

        # the directories the runtime resolves CDI names from, through the same CDI index
        # (a YAML spec unchanged since it was indexed is not parsed again), so the list
        # matches what a create resolves
        config = load_config()
        index = cdi_index_path(config.source or config_path())
        registry, _ = registry_for(config.cdi_spec_dirs, None, index, save=False)
    if fmt == "json":
        devices = []
        for name in registry.names():
            resolved = registry.devices[name]
            devices.append(
                {
                    "name": name,
                    "kind": resolved.spec.kind,
                    "device": resolved.device.name,
                    "spec_file": resolved.spec.path,
                }
            )
        echo_json(
            {
                "spec_dirs": list(registry.spec_dirs),
                "devices": devices,
                "problems": [problem_json(p) for p in registry.problems],
            }
        )
        return 0
    for problem in registry.problems:
        err(f"warning: {problem}")
    for name in registry.names():
        out(name)
    if not registry.devices:
        searched = ", ".join(registry.spec_dirs) or "no spec directories (cdi-spec-dirs is empty)"
        err(f"no CDI devices found in {searched}")
    return 0


# --- cdi generate --check -----------------------------------------------------------------


def cdi_check(
    check_file: str,
    quiet: bool,
    driver_root: Optional[str],
    dev_root: Optional[str],
    class_: str,
    vendor: str,
    strategies: Sequence[str],
    driver_capabilities: str,
    gpu_source: str,
    hook_path: Optional[str],
) -> int:
    """``nvshim cdi generate --check FILE``: 0 when FILE is what generate would write now;
    a stale one raises the reasons."""
    import os

    from nvshim.cdi.index import indexed_document
    from nvshim.config import cdi_index_path, config_path, load_config
    from nvshim.node.cdigen import check_current, generate_for_node

    config = load_config()
    spec, host = generate_for_node(
        driver_root,
        dev_root,
        class_,
        vendor,
        tuple(strategies),
        driver_capabilities,
        gpu_source,
        hook_path,
        config,
    )
    # a spec in the config's spec dirs is decoded already in a fresh CDI index: a YAML one
    # is then compared without importing yaml
    existing = indexed_document(
        os.path.abspath(check_file),
        config.cdi_spec_dirs,
        cdi_index_path(config.source or config_path()),
    )
    check_current(check_file, spec, host, config, existing)
    if not quiet:
        err(f"{check_file}: current")
    return 0


# --- doctor -------------------------------------------------------------------------------


def doctor(
    fmt: str,
    config_file: Optional[str],
    containerd_config: str,
    docker_config: str,
    crio_config: str,
    driver_root: Optional[str],
    dev_root: Optional[str],
    trampoline: Optional[str],
    nvidia_config: str,
    hooks_dirs: Tuple[str, ...],
    runtime_binaries: Tuple[str, ...],
    agent_socket: str,
    verbose: bool,
) -> int:
    """``nvshim doctor``: one line per finding; 1 when any check failed."""
    import os

    from nvshim.node.doctor.checks import exit_code, render_json, render_text, run_checks
    from nvshim.node.doctor.findings import DoctorOptions
    from nvshim.node.doctor.install import default_trampoline

    kwargs: Dict[str, Any] = {
        "containerd_config": containerd_config,
        "docker_config": docker_config,
        "crio_config": crio_config,
        "driver_root": driver_root,
        "dev_root": dev_root,
        "trampoline": trampoline or default_trampoline(),
        "nvidia_config": nvidia_config,
        "runtime_binaries": tuple(os.path.abspath(b) for b in runtime_binaries),
        "agent_socket": agent_socket,
    }
    if hooks_dirs:
        kwargs["hooks_dirs"] = tuple(hooks_dirs)
    if config_file is not None:
        kwargs["config_path"] = config_file
        kwargs["config_required"] = True
    findings = run_checks(DoctorOptions(**kwargs))
    out(render_json(findings) if fmt == "json" else render_text(findings, verbose))
    return exit_code(findings)
