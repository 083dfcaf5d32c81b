"""``nvshim doctor``'s checks of nvshim's own files: the config, its compiled copy, the
low-level runtimes it names, whom require-allocation trusts, and the installed trampoline.

Checks ``config``, ``compiled-config``, ``runtimes``, ``allocation-trust`` and
``trampoline`` (see :mod:`nvshim.node.doctor.checks` for the whole list).
"""

from __future__ import annotations

import json
import os
from typing import Optional, Tuple

from nvshim import __version__
from nvshim.config import (
    Config,
    compiled_path,
    config_named,
    config_path,
    load_config,
    runtimes_path,
)
from nvshim.errors import NvshimError
from nvshim.node.doctor.findings import DoctorOptions, Finding, compile_command
from nvshim.runtime.claim import DEVICE_LIST_DIR

__all__ = [
    "check_config",
    "check_compiled_config",
    "check_runtimes",
    "check_allocation_trust",
    "check_trampoline",
]


def check_config(path: str, required: bool = False) -> Tuple[Finding, Optional[Config]]:
    """Load nvshim's config; the finding, and the config (None when it is invalid, or
    missing while ``required``: named by ``--config``, as ``nvshim config show`` needs it)."""
    try:
        config = load_config(path, required=required)
    except NvshimError as exc:
        if not os.path.exists(path):
            fix = f"create {path}, or name an existing config with --config"
        else:
            fix = f"correct {path}"
        return Finding(
            "config", "fail", str(exc), fix, detail=f"{fix}, then {compile_command(path)}"
        ), None
    if config.source is None:
        named = config_named() if path == config_path() else ""
        if named:  # the runtime fails every create without it (fail closed)
            return Finding(
                "config",
                "fail",
                f"no {path}, named by {named}: nvshim-runtime fails every "
                "create without it (it never falls back to the built-in defaults)",
                f"restore {path} (install.sh writes it), then {compile_command(path)}",
            ), config
        return Finding("config", "ok", f"no {path}: built-in defaults"), config
    mode = "on" if config.require_allocation else "off"
    return Finding("config", "ok", f"{path} is valid (require-allocation {mode})"), config


def _read_bytes(path: str) -> Optional[bytes]:
    """The bytes of ``path``; ``None`` when it cannot be read (a check reports that)."""
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def check_compiled_config(path: str, config: Optional[Config]) -> Finding:
    """The compiled JSON copy and the trampoline's runtime list are current for ``path``."""
    name = "compiled-config"
    if config is None:
        return Finding(name, "skip", f"{path} did not load: nothing to compare")
    data = _read_bytes(path)
    if data is None:
        return Finding(name, "ok", f"no {path}: nothing to compile")
    fix = compile_command(path)
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
            name,
            "warn",
            f"{compiled} was written by nvshim {doc.get('nvshim-version')}, this is {__version__}",
            fix,
        )
    from nvshim.config import compiled_matches

    if not compiled_matches(doc, data):
        return Finding(
            name,
            "warn",
            f"{path} changed since it was compiled",
            fix,
            detail=f"{path} changed since it was compiled into {compiled}",
        )
    listing = runtimes_path(path)
    try:
        os.stat(listing)
    except FileNotFoundError:
        return Finding(
            name,
            "warn",
            f"{listing} is missing: the trampoline starts Python for every command",
            fix,
        )
    except OSError as exc:
        return Finding(name, "warn", f"cannot stat {listing}: {exc.strerror}", fix)
    listed = (_read_bytes(listing) or b"").decode(errors="replace").splitlines()
    from nvshim.config import compiled_lists_fresh

    if not compiled_lists_fresh(path) or listed != list(config.runtimes):
        return Finding(
            name,
            "warn",
            f"{listing} was not compiled from this {path} or lists other runtimes "
            f"({' '.join(listed) or 'none'}; config has {' '.join(config.runtimes)})",
            fix,
        )
    return Finding(name, "ok", f"{compiled} and {listing} match {path}")


def check_runtimes(config: Config, options: Optional[DoctorOptions] = None) -> Finding:
    """At least one configured low-level runtime can be executed, and none leads to NVIDIA's
    runtime (which would grant again, from the env and mounts nvshim refused) or back to
    nvshim-runtime."""
    from nvshim.node.doctor.reach import runtimes_problem
    from nvshim.runtime.main import find_runtime

    source = config.source or "the built-in defaults"
    chained = runtimes_problem(config, options or DoctorOptions())
    if chained is not None:
        return Finding(
            "runtimes",
            "fail",
            f"runtimes in {source} hand every container on to another GPU runtime",
            f"list runc or crun under runtimes: in {source}",
            detail=f"runtimes in {source} hand every container on to another GPU runtime: "
            f"{chained}; it grants GPUs again from the env and mounts nvshim refused. "
            "Fix: list runc or crun (or their absolute paths) under runtimes: in "
            f"{source}, then {compile_command(source)}",
        )
    path_env = os.environ.get("PATH")
    for name in config.runtimes:
        # the runtime's own lookup: doctor names exactly the binary a create would exec
        found = find_runtime((name,), path_env)
        if found is not None:
            return Finding("runtimes", "ok", f"low-level runtime {name} found at {found}")
    where = ", ".join(config.runtimes)
    return Finding(
        "runtimes",
        "fail",
        f"none of the configured runtimes ({where}) is an executable on PATH or an absolute path: "
        "every container fails",
        f"install runc (apt-get install runc) or fix runtimes: in {source}",
    )


#: allocation-sources whose evidence a pod can write into its own spec (env, hostPath, annotation).
_FORGEABLE = ("envvar-uuids", "volume-mounts", "cdi-annotations")


def check_allocation_trust(config: Optional[Config], path: str) -> Finding:
    """require-allocation that still believes claims a pod can forge."""
    name = "allocation-trust"
    if config is None:
        return Finding(name, "skip", f"{path} did not load: nothing to check")
    if not config.require_allocation:
        return Finding(name, "skip", "require-allocation is off: every claim is granted anyway")
    if config.verify_with == "kubelet":
        if not os.path.exists(config.kubelet_socket) and config.kubelet_unreachable == "fail":
            return Finding(
                name,
                "warn",
                f"verify-with: kubelet, but the kubelet's PodResources socket "
                f"{config.kubelet_socket} does not exist: every GPU claim of a pod will fail",
                f"start the kubelet, or set kubelet-socket in {path} to where it listens",
            )
        return Finding(
            name,
            "ok",
            "require-allocation checks every claim against the kubelet's "
            f"record (kubelet-unreachable: {config.kubelet_unreachable})",
        )
    forgeable = [s for s in config.allocation_sources if s in _FORGEABLE]
    if config.accept_all_from_mounts and "volume-mounts" in config.allocation_sources:
        forgeable.append("accept-all-from-mounts")
    if not forgeable:
        return Finding(
            name, "ok", "require-allocation trusts only " + ", ".join(config.allocation_sources)
        )
    return Finding(
        name,
        "warn",
        f"require-allocation trusts claims a pod can write itself: {', '.join(forgeable)}",
        f"verify-with: kubelet in {path}",
        detail=f"require-allocation trusts claims a pod can write itself ({', '.join(forgeable)})"
        ": a pod that sets NVIDIA_VISIBLE_DEVICES=GPU-<uuid> or mounts a hostPath under "
        f"{DEVICE_LIST_DIR} gets another tenant's GPU. Fix: set "
        f"verify-with: kubelet in {path} (then nvshim config compile)",
    )


def check_trampoline(path: str) -> Finding:
    """The installed ``nvshim-runtime`` is the trampoline this nvshim would install."""
    from nvshim.node.install.prefix import installed_prefix, render_runtime
    from nvshim.node.install.trampoline import render

    name = "trampoline"
    fix = "re-run nvshim's install.sh"
    data = _read_bytes(path)
    if data is None:
        return Finding(name, "skip", f"{path} is not installed")
    text = data.decode(errors="replace")
    python = config = None
    for line in text.splitlines():
        if line.startswith("py=") and python is None:
            python = line[len("py=") :].strip()
        elif line.startswith("conf=${NVSHIM_CONFIG:-") and line.endswith("}") and config is None:
            config = line[len("conf=${NVSHIM_CONFIG:-") : -1]  # the install's config default
    if python is None:
        return Finding(name, "warn", f"{path} is not nvshim's sh trampoline (no py= line)", fix)
    if not os.access(path, os.X_OK):
        return Finding(name, "fail", f"{path} is not executable: containerd cannot run it", fix)
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        return Finding(
            name,
            "fail",
            f"{path} starts {python}, which is not an executable: every create fails",
            fix,
        )
    try:
        prefix = installed_prefix(python)
        expected = (
            render(python, config=config) if prefix is None else render_runtime(prefix, config)
        )
    except ValueError as exc:
        return Finding(name, "warn", f"{path}: {exc}", fix)
    if text != expected:
        return Finding(
            name,
            "warn",
            f"{path} is not the trampoline this nvshim renders",
            fix,
            detail=f"{path} differs from the trampoline this nvshim ({__version__}) renders: "
            "installed by another version or edited",
        )
    return Finding(name, "ok", f"{path} is current (python {python})")
