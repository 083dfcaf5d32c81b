"""Register nvshim as a CRI-O runtime handler with a drop-in, and take it out again.

``nvshim runtime configure --runtime crio`` lands here. CRI-O reads ``/etc/crio/crio.conf``
and then every file of ``/etc/crio/crio.conf.d/`` in lexical order, each overriding single
keys of the ones before, so nvshim needs no copy of the main file: its drop-in
``99-nvshim.toml`` (by default in ``crio.conf.d`` beside the main file, as install.sh puts
it: :func:`default_drop_in`) holds only ::

    [crio.runtime]                       # only with --set-as-default
    default_runtime = "nvshim"

    [crio.runtime.runtimes.nvshim]
    runtime_path = "/usr/local/bin/nvshim-runtime"
    runtime_type = "oci"
    runtime_root = "/run/runc"
    monitor_cgroup = "pod"
    monitor_env = ["PATH=..."]

``runtime_type = "oci"`` makes CRI-O run the handler through conmon (the monitor) like
runc. ``runtime_root`` is the ``--root`` CRI-O passes to the runtime; nvshim execs runc with
it unchanged, so it is runc's state directory. The monitor settings (``monitor_path``,
``monitor_cgroup``, ``monitor_env``, ``monitor_exec_cgroup``) and ``runtime_root`` are
copied from the main file's ``runc`` handler when it sets them (``monitor_cgroup`` falls
back to the deprecated ``conmon_cgroup``), so conmon runs where runc's does; otherwise
``monitor_cgroup = "pod"`` (valid for both cgroup managers) and CRI-O's default PATH.

The main file is never written. The drop-in's original bytes (normally: absent) are kept
in ``<config>.nvshim-orig.json`` -- outside ``crio.conf.d``, which CRI-O would parse -- for
a byte-exact :func:`revert`, shared with the other engines (:mod:`nvshim.node.engines.files`).

Why one module: CRI-O has one drop-in, and configure and revert are two halves of one
contract over it (what configure writes, revert takes out, the backup between), which read
best side by side, as for the other engines.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from nvshim._record import dataclass, field
from nvshim.errors import ConfigError, UsageError
from nvshim.node.engines.files import (
    ConfigureOutcome,
    FileChange,
    RevertResult,
    apply_restore,
    backup_path,
    carry_out,
    check_binary,
    check_default_takeover,
    check_handler_name,
    default_runtime_guard,
    load_backup,
    parse_toml,
    plan_restore,
    plan_revert_one,
    read_text,
    read_toml,
)
from nvshim.node.install.prefix import DEFAULT_RUNTIME_PATH

__all__ = [
    "DEFAULT_BINARY",
    "DEFAULT_CONFIG",
    "DEFAULT_DROP_IN",
    "DEFAULT_NAME",
    "HANDLER_KEYS",
    "CrioRuntimes",
    "configure",
    "default_drop_in",
    "plan_configure",
    "plan_revert",
    "read_handlers",
    "revert",
]

DEFAULT_CONFIG = "/etc/crio/crio.conf"
_DROP_IN_DIR = "crio.conf.d"
_DROP_IN_NAME = "99-nvshim.toml"
DEFAULT_DROP_IN = f"/etc/crio/{_DROP_IN_DIR}/{_DROP_IN_NAME}"
DEFAULT_NAME = "nvshim"
DEFAULT_BINARY = DEFAULT_RUNTIME_PATH
DEFAULT_RUNTIME_ROOT = "/run/runc"
#: CRI-O's default_runtime when no file sets one: runc, or crun in newer releases.
BUILTIN_DEFAULT_RUNTIMES = ("runc", "crun")
DEFAULT_MONITOR_CGROUP = "pod"
DEFAULT_MONITOR_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
#: Keys of a ``[crio.runtime.runtimes.<handler>]`` table that CRI-O documents (crio.conf(5)).
HANDLER_KEYS = frozenset(
    {
        "runtime_path",
        "runtime_type",
        "runtime_root",
        "runtime_config_path",
        "inherit_default_runtime",
        "monitor_path",
        "monitor_cgroup",
        "monitor_exec_cgroup",
        "monitor_env",
        "privileged_without_host_devices",
        "allowed_annotations",
        "platform_runtime_paths",
        "container_min_memory",
        "no_sync_log",
        "default_annotations",
        "stream_websockets",
    }
)
_COPIED_FROM_RUNC = (
    "runtime_root",
    "monitor_path",
    "monitor_cgroup",
    "monitor_env",
    "monitor_exec_cgroup",
)
_BACKUP_FORMAT = "nvshim-crio-backup/1"


@dataclass(frozen=True)
class CrioRuntimes:
    """The handlers CRI-O sees once drop-ins are merged: name → runtime_path, the default;
    and ``cdi_spec_dirs`` (``None`` when no file sets it)."""

    config_path: str
    handlers: Mapping[str, Optional[str]]
    default_runtime: Optional[str]
    files: Tuple[str, ...]
    cdi_spec_dirs: Optional[Tuple[str, ...]] = None
    envs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Each handler's ``monitor_env`` (conmon's environment, which the runtime inherits)."""


def _drop_in_dir(config_path: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(config_path)), _DROP_IN_DIR)


def default_drop_in(config_path: str) -> str:
    """Where nvshim's drop-in goes for the main config ``config_path``:
    ``crio.conf.d/99-nvshim.toml`` beside it (install.sh's rule too), so a config outside
    /etc never writes /etc/crio."""
    return os.path.join(_drop_in_dir(config_path), _DROP_IN_NAME)


def _drop_in_path(drop_in: Optional[str], config_path: str) -> str:
    """The drop-in as an absolute path: :func:`default_drop_in` for None; "" is refused
    (containerd's "edit the main file in place" has no CRI-O counterpart: its main file is
    only read)."""
    if drop_in == "":
        raise UsageError("CRI-O is configured through a drop-in: --drop-in cannot be empty")
    return os.path.abspath(drop_in) if drop_in is not None else default_drop_in(config_path)


def _parse(text: Optional[str], path: str) -> Dict[str, Any]:
    return read_toml(text or "", path)


def _table(data: Any, keys: Tuple[str, ...], path: str) -> Optional[Dict[str, Any]]:
    current = data
    for depth, key in enumerate(keys, start=1):
        if not isinstance(current, dict) or key not in current:
            return None
        current = current[key]
        if not isinstance(current, dict):
            raise ConfigError(f"{path}: {'.'.join(keys[:depth])} is not a table")
    table: Dict[str, Any] = current
    return table


def _handler(main: Mapping[str, Any], binary: str, config_path: str) -> Dict[str, Any]:
    runtime = _table(main, ("crio", "runtime"), config_path) or {}
    runc = _table(main, ("crio", "runtime", "runtimes", "runc"), config_path) or {}
    handler: Dict[str, Any] = {"runtime_path": binary, "runtime_type": "oci"}
    for key in _COPIED_FROM_RUNC:
        if runc.get(key) not in (None, "", []):
            handler[key] = runc[key]
    handler.setdefault("runtime_root", DEFAULT_RUNTIME_ROOT)
    if "monitor_cgroup" not in handler:
        handler["monitor_cgroup"] = runtime.get("conmon_cgroup") or DEFAULT_MONITOR_CGROUP
    if "monitor_env" not in handler:
        handler["monitor_env"] = list(runtime.get("conmon_env") or DEFAULT_MONITOR_ENV)
    return handler


def _render(
    handlers: Mapping[str, Mapping[str, Any]], default: Optional[str], config_path: str
) -> str:
    """The drop-in: ``handlers`` (name → table) and, when set, ``default_runtime``."""
    import tomlkit

    names = '", "'.join(handlers)
    doc = tomlkit.document()
    for line in (
        "Written by `nvshim runtime configure --runtime crio`; `--revert` removes it.",
        f'The CRI-O runtime handler{"s" if len(handlers) > 1 else ""} "{names}": '
        "nvshim-runtime, which runs runc. Settings not",
        f"here come from {config_path} and the other drop-ins, as CRI-O merges them.",
    ):
        doc.add(tomlkit.comment(line))
    doc.add(tomlkit.nl())
    crio = tomlkit.table(is_super_table=True)
    runtime = tomlkit.table(is_super_table=default is None)
    if default is not None:
        runtime["default_runtime"] = default
    runtimes = tomlkit.table(is_super_table=True)
    for name, handler in handlers.items():
        table = tomlkit.table()
        for key, value in handler.items():
            table[key] = value
        runtimes[name] = table
    runtime["runtimes"] = runtimes
    crio["runtime"] = runtime
    doc["crio"] = crio
    return tomlkit.dumps(doc)


def plan_configure(
    main_text: Optional[str],
    drop_in_text: Optional[str] = None,
    *,
    config_path: str = DEFAULT_CONFIG,
    drop_in: Optional[str] = None,
    name: str = DEFAULT_NAME,
    binary: str = DEFAULT_BINARY,
    set_as_default: bool = False,
    force: bool = False,
    require_allocation: bool = False,
) -> ConfigureOutcome:
    """The drop-in's new text; pure. The main file is only read (runc's handler settings).
    ``drop_in=None``: :func:`default_drop_in` of ``config_path``."""
    check_handler_name(name)
    check_binary(binary)
    warnings = default_runtime_guard(name, set_as_default, force, require_allocation)
    drop_in = _drop_in_path(drop_in, config_path)
    if drop_in == os.path.abspath(config_path):
        raise UsageError(
            f'drop-in "{drop_in}" is the main config itself: name a file in '
            f"{_drop_in_dir(config_path)}"
        )
    main = _parse(main_text, config_path)
    # an unreadable drop-in is reported before it is replaced; the handlers configured
    # into it before (another --name) stay, so configuring one never removes another
    previous = _parse(drop_in_text, drop_in)
    kept = {
        other: table
        for other, table in sorted(
            (_table(previous, ("crio", "runtime", "runtimes"), drop_in) or {}).items()
        )
        if other != name and isinstance(table, dict)
    }
    kept_default = (_table(previous, ("crio", "runtime"), drop_in) or {}).get("default_runtime")
    runtime = _table(main, ("crio", "runtime"), config_path) or {}
    default = runtime.get("default_runtime")  # nvshim never edits the main file
    check_default_takeover(
        name,
        (default,) if isinstance(default, str) and default else BUILTIN_DEFAULT_RUNTIMES,
        set_as_default,
        "CRI-O",
    )
    if not set_as_default and runtime.get("default_runtime") == name:
        warnings.append(
            f'{config_path} itself sets default_runtime = "{name}"; nvshim leaves '
            "the main file alone"
        )
    handlers = dict(kept)
    handlers[name] = _handler(main, binary, config_path)
    default_name = (
        name
        if set_as_default
        else (kept_default if isinstance(kept_default, str) and kept_default in kept else None)
    )
    after = _render(handlers, default_name, config_path)
    return ConfigureOutcome(
        engine="crio",
        handler_file=drop_in,
        files=(FileChange(drop_in, drop_in_text, after),),
        written=(),
        warnings=tuple(warnings),
        handlers=tuple(sorted(handlers)),
    )


def configure(
    config_path: str = DEFAULT_CONFIG,
    *,
    drop_in: Optional[str] = None,
    name: str = DEFAULT_NAME,
    binary: str = DEFAULT_BINARY,
    set_as_default: bool = False,
    force: bool = False,
    require_allocation: bool = False,
    dry_run: bool = False,
) -> ConfigureOutcome:
    """Write the drop-in; its original bytes (or absence) go to the backup first."""
    config_path = os.path.abspath(config_path)
    drop_in = _drop_in_path(drop_in, config_path)
    plan = plan_configure(
        read_text(config_path, "CRI-O config"),
        read_text(drop_in, "CRI-O drop-in"),
        config_path=config_path,
        drop_in=drop_in,
        name=name,
        binary=binary,
        set_as_default=set_as_default,
        force=force,
        require_allocation=require_allocation,
    )
    return carry_out(plan, config_path, _BACKUP_FORMAT, dry_run, name)


def plan_revert(
    current: Mapping[str, Optional[str]],
    backup: Optional[Mapping[str, Any]],
    *,
    config_path: str = DEFAULT_CONFIG,
    drop_in: Optional[str] = None,
    name: str = DEFAULT_NAME,
) -> RevertResult:
    """What revert does; pure. With a backup the drop-in gets its original bytes back
    (usually: it is removed); without one, a drop-in holding handler ``name`` is removed."""

    def keep(path: str, now: str, original: Optional[str], warnings: List[str]) -> str:
        return now  # the main file is never nvshim's to edit

    def handlers(path: str, text: Optional[str]) -> Dict[str, Any]:
        return _table(_parse(text, path), ("crio", "runtime", "runtimes"), path) or {}

    def others(path: str, now: Optional[str], original: Optional[str]) -> List[str]:
        if path == os.path.abspath(config_path) or now is None:
            return []
        return sorted(set(handlers(path, now)) - set(handlers(path, original)) - {name})

    def strip_one(
        path: str, now: str, original: Optional[str], warnings: List[str]
    ) -> Optional[str]:
        if path == os.path.abspath(config_path):
            return now
        doc = parse_toml(now, path)
        runtime = doc.get("crio", {}).get("runtime", {})
        if name in runtime.get("runtimes", {}):
            del runtime["runtimes"][name]
        if runtime.get("default_runtime") == name:
            del runtime["default_runtime"]
        return doc.as_string()

    if backup is not None:
        one = plan_revert_one(current, backup, name=name, others=others, strip_one=strip_one)
        if one is not None:
            return one
        return plan_restore(current, backup, main_path=config_path, strip=keep)
    drop_in = _drop_in_path(drop_in, config_path)
    warnings = [
        f'no backup {backup_path(config_path)}: removing {drop_in} if it holds runtime "{name}"'
    ]
    text = current.get(drop_in)
    files: Tuple[FileChange, ...] = ()
    if text is not None:
        if _table(_parse(text, drop_in), ("crio", "runtime", "runtimes", name), drop_in) is None:
            warnings.append(f'left {drop_in}: it has no runtime "{name}"')
        else:
            files = (FileChange(drop_in, text, None),)
    return RevertResult(
        files=files,
        restored=(),
        edited=(),
        removed=tuple(change.path for change in files),
        used_backup=False,
        warnings=tuple(warnings),
    )


def revert(
    config_path: str = DEFAULT_CONFIG,
    *,
    drop_in: Optional[str] = None,
    name: str = DEFAULT_NAME,
    dry_run: bool = False,
) -> RevertResult:
    """Undo :func:`configure`."""
    config_path = os.path.abspath(config_path)
    backup_file = backup_path(config_path)
    backup = load_backup(backup_file, _BACKUP_FORMAT)
    paths = [config_path, _drop_in_path(drop_in, config_path)]
    if backup is not None:
        paths += list(backup["files"])
    current = {path: read_text(path, "CRI-O config") for path in dict.fromkeys(paths)}
    plan = plan_revert(current, backup, config_path=config_path, drop_in=drop_in, name=name)
    if not dry_run:
        apply_restore(plan, backup, backup_file)
    return plan


def read_handlers(
    config_path: str = DEFAULT_CONFIG, drop_in_dir: Optional[str] = None
) -> CrioRuntimes:
    """The handlers CRI-O sees: the main file, then each drop-in (sorted), key by key."""
    directory = drop_in_dir or _drop_in_dir(config_path)
    paths = [config_path]
    try:
        paths += [
            os.path.join(directory, entry)
            for entry in sorted(os.listdir(directory))
            if os.path.isfile(os.path.join(directory, entry))
        ]
    except FileNotFoundError:
        pass  # no drop-in directory: only the main file counts
    except OSError as exc:
        raise ConfigError(f"cannot list {directory}: {exc.strerror}") from exc
    handlers: Dict[str, Optional[str]] = {}
    default: Optional[str] = None
    spec_dirs: Optional[Tuple[str, ...]] = None
    envs: Dict[str, Dict[str, str]] = {}
    seen = []
    for path in paths:
        text = read_text(path, "CRI-O config")
        if text is None:
            continue
        seen.append(path)
        data = _parse(text, path)
        runtime = _table(data, ("crio", "runtime"), path) or {}
        if isinstance(runtime.get("default_runtime"), str) and runtime["default_runtime"]:
            default = runtime["default_runtime"]
        if isinstance(runtime.get("cdi_spec_dirs"), list):
            spec_dirs = tuple(d for d in runtime["cdi_spec_dirs"] if isinstance(d, str))
        for handler_name, table in (
            _table(data, ("crio", "runtime", "runtimes"), path) or {}
        ).items():
            value = table.get("runtime_path") if isinstance(table, dict) else None
            if isinstance(value, str) and value:
                handlers[handler_name] = value
            else:
                handlers.setdefault(handler_name, None)
            if isinstance(table, dict) and isinstance(table.get("monitor_env"), list):
                envs[handler_name] = {
                    k: v
                    for k, _, v in (
                        e.partition("=")
                        for e in table["monitor_env"]
                        if isinstance(e, str) and "=" in e
                    )
                }
    return CrioRuntimes(
        config_path=config_path,
        handlers=handlers,
        default_runtime=default,
        files=tuple(seen),
        cdi_spec_dirs=spec_dirs,
        envs=envs,
    )
