"""Register nvshim as a containerd runtime handler, and take it out again.

``nvshim runtime configure --runtime containerd`` lands here. The CRI plugin's table
depends on the config ``version``: no file or an empty one counts as version 2, a file
without ``version`` as version 1::

    1  plugins.cri
    2  plugins."io.containerd.grpc.v1.cri"
    3  plugins."io.containerd.cri.v1.runtime"

The handler ``<cri>.containerd.runtimes.<name>`` is a copy of the runc handler (all its
options, ``SystemdCgroup`` included) with ``options.BinaryName`` pointing at
nvshim-runtime, and it lets the container's ``cdi.k8s.io/*`` annotations (set by the kubelet
from the device plugin's answer) through to the runtime. The pod's annotations of that
name are let through only with ``pod_cdi_annotations``: anyone who can create a pod can
write them, and in the container's spec they look the same as the device plugin's.

For versions 2 and 3 the handler goes into a drop-in file that the main file imports.
containerd before 2.1 *replaces* a plugin's table with the one from an import instead of
merging them, so the drop-in holds a copy of the main file's whole CRI table plus the
handler. ``drop_in=""`` writes everything into the main file instead; version 1 files are
always edited in place. Files are edited with tomlkit, so comments and layout survive.

Before the first write the original bytes of every file it touches (or their absence) are
saved in ``<config>.nvshim-orig.json``; :func:`revert` puts them back byte for byte. A file
edited by hand since nvshim wrote it, or a config without that backup, gets a structural
revert instead: only nvshim's entries are removed.

:func:`plan_configure` and :func:`plan_revert` are pure (text in, text out);
:func:`configure` and :func:`revert` read and write the files. :func:`read_handlers`
reports the handlers containerd will see after imports, for ``nvshim doctor``.
"""

from __future__ import annotations

import copy
import fnmatch
import glob
import json
import os
import re
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

from nvshim._record import dataclass, field
from nvshim.config import DEFAULT_CDI_SPEC_DIRS
from nvshim.errors import ConfigError, UsageError
from nvshim.node.engine_files import (
    BACKUP_SUFFIX,
    FileChange,
    RevertResult,
    apply_restore,
    backup_path,
    check_handler_name,
    default_runtime_guard,
    load_backup,
    plan_restore,
    read_text,
    set_as_default_pitfall,
    write_changes,
)

if TYPE_CHECKING:
    from tomlkit.toml_document import TOMLDocument

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_DROP_IN",
    "DEFAULT_NAME",
    "DEFAULT_BINARY",
    "CDI_ANNOTATIONS",
    "CDI_SPEC_DIRS",
    "CRI_PLUGINS",
    "BACKUP_SUFFIX",
    "FileChange",
    "ConfigureResult",
    "RevertResult",
    "EffectiveRuntimes",
    "backup_path",
    "plan_configure",
    "plan_revert",
    "configure",
    "revert",
    "read_handlers",
    "drop_in_drift",
    "set_as_default_pitfall",
]

DEFAULT_CONFIG = "/etc/containerd/config.toml"
DEFAULT_DROP_IN = "/etc/containerd/conf.d/99-nvshim.toml"
DEFAULT_NAME = "nvshim"
DEFAULT_BINARY = "/usr/local/bin/nvshim-runtime"
#: Annotation patterns the handler passes to the runtime, so CDI requests reach nvshim.
CDI_ANNOTATIONS = ("cdi.k8s.io/*",)
CDI_SPEC_DIRS = DEFAULT_CDI_SPEC_DIRS
#: Name of the CRI plugin's table under ``plugins``, by config version.
CRI_PLUGINS: Mapping[int, str] = {
    1: "cri",
    2: "io.containerd.grpc.v1.cri",
    3: "io.containerd.cri.v1.runtime",
}

_RUNC_TYPE = "io.containerd.runc.v2"
_LEGACY_LINUX_TYPE = "io.containerd.runtime.v1.linux"
_CONTAINERD_DEFAULT_RUNTIME = "runc"
_BACKUP_FORMAT = "nvshim-containerd-backup/1"


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class ConfigureResult:
    """What :func:`configure` did (or, with ``dry_run``, would do)."""

    version: int
    cri_plugin: str
    handler_file: str
    files: Tuple[FileChange, ...]
    written: Tuple[str, ...]
    warnings: Tuple[str, ...] = ()


@dataclass(frozen=True)
class EffectiveRuntimes:
    """The CRI runtime handlers containerd sees once imports are merged.

    ``handlers`` maps a handler name to its ``options.BinaryName`` (``None`` when unset or
    empty). ``default_runtime_name`` is containerd's own default, ``runc``, when no file
    sets it. ``problems`` lists imports that could not be read.
    """

    config_path: str
    version: int
    cri_plugin: str
    default_runtime_name: str
    handlers: Mapping[str, Optional[str]]
    files: Tuple[str, ...]
    problems: Tuple[str, ...] = field(default=())


# --------------------------------------------------------------------------- TOML helpers


def _parse(text: str, path: str) -> TOMLDocument:
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        return tomlkit.parse(text)
    except TOMLKitError as exc:
        message = str(exc).replace(". at line", " at line")
        message = message[:1].lower() + message[1:]
        raise ConfigError(f"{path}: invalid TOML: {message}") from exc


def _dumps(doc: Any, before: Optional[str] = None) -> str:
    """``doc`` as text; a changed file always ends in a newline, an unchanged one stays as is."""
    import tomlkit

    text = tomlkit.dumps(doc)
    if text != before and text and not text.endswith("\n"):
        text += "\n"
    return text


def _is_table(value: Any) -> bool:
    return isinstance(value, Mapping)


def _sub(container: Any, key: str, label: str) -> Any:
    """``container[key]`` when it is a table, ``None`` when absent; ``label`` names it."""
    if key not in container:
        return None
    value = container[key]
    if not _is_table(value):
        raise ConfigError(f"{label} is not a table")
    return value


def _lookup(container: Any, keys: Tuple[str, ...], path: str) -> Any:
    """The table at ``keys`` under ``container``, or ``None`` when a part is missing."""
    current = container
    for depth, key in enumerate(keys, start=1):
        label = ".".join(_quote(k) for k in keys[:depth])
        current = _sub(current, key, f"{path}: {label}" if path else label)
        if current is None:
            return None
    return current


def _ensure(container: Any, key: str, label: str) -> Any:
    """The table ``container[key]``, created (header-less until it holds values) if missing."""
    import tomlkit

    table = _sub(container, key, label)
    if table is None:
        container[key] = tomlkit.table(is_super_table=True)
        table = container[key]
    return table


def _set(table: Any, key: str, value: Any) -> None:
    """``table[key] = value``, indented like the table's other keys when tomlkit laid it out."""
    from tomlkit.items import AbstractTable

    indent = None
    body = getattr(getattr(table, "value", None), "body", None)
    if key not in table and body is not None:
        for existing_key, item in body:
            if existing_key is not None and not isinstance(item, AbstractTable):
                indent = item.trivia.indent
                break
    table[key] = value
    if indent is not None:
        table.value.item(key).trivia.indent = indent


def _quote(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _plain(value: Any) -> Any:
    unwrap = getattr(value, "unwrap", None)
    return copy.deepcopy(unwrap() if unwrap is not None else value)


def _has_keys(doc: Any) -> bool:
    return len(doc) > 0


def _detect_version(doc: Any, path: str) -> int:
    if not _has_keys(doc):
        return 2
    if "version" not in doc:
        return 1
    version = _plain(doc["version"])
    if isinstance(version, bool) or version not in CRI_PLUGINS:
        raise ConfigError(
            f"{path}: unsupported containerd config version {json.dumps(version)}: "
            "nvshim knows versions 1, 2 and 3"
        )
    return int(version)


def _cri_keys(version: int) -> Tuple[str, str]:
    return ("plugins", CRI_PLUGINS[version])


def _cri_label(version: int) -> str:
    return "plugins." + _quote(CRI_PLUGINS[version])


def _merge_list(existing: Any, extra: Tuple[str, ...], where: str) -> List[Any]:
    if existing is None:
        existing = []
    if not isinstance(existing, list):
        raise ConfigError(f"{where} is not a list")
    merged = list(existing)
    for value in extra:
        if value not in merged:
            merged.append(value)
    return merged


# --------------------------------------------------------------------------- configure


def _check_arguments(name: str, binary: str) -> None:
    check_handler_name(name)
    if not os.path.isabs(binary):
        raise UsageError(f'runtime binary "{binary}" is not an absolute path')


def _build_handler(cri: Any, name: str, binary: str, where: str,
                   pod_cdi_annotations: bool = False) -> Dict[str, Any]:
    """The handler table: the runc (or default) handler's copy pointed at ``binary``."""
    runtimes = _lookup(cri, ("containerd", "runtimes"), "")
    containerd_table = _lookup(cri, ("containerd",), "")
    source = None
    if runtimes is not None:
        source = runtimes.get(_CONTAINERD_DEFAULT_RUNTIME)
        if source is None and containerd_table is not None:
            default = _plain(containerd_table.get("default_runtime_name"))
            if isinstance(default, str) and default != name:
                source = runtimes.get(default)
    handler: Dict[str, Any] = _plain(source) if _is_table(source) else {}
    if not handler.get("runtime_type"):
        handler["runtime_type"] = _RUNC_TYPE
    handler_where = f"{where}.containerd.runtimes.{_quote(name)}"
    keys = ("container_annotations", "pod_annotations") if pod_cdi_annotations else (
        "container_annotations",)
    for key in keys:
        handler[key] = _merge_list(handler.get(key), CDI_ANNOTATIONS, f"{handler_where}.{key}")
    options = handler.get("options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise ConfigError(f"{handler_where}.options is not a table")
    options["BinaryName"] = binary
    if handler["runtime_type"] == _LEGACY_LINUX_TYPE:
        options["Runtime"] = binary  # that shim's options call the runc binary "Runtime"
    handler["options"] = options
    return handler


def _apply_to_cri(
    cri: Any,
    *,
    name: str,
    binary: str,
    set_as_default: bool,
    enable_cdi: bool,
    where: str,
    warnings: List[str],
    pod_cdi_annotations: bool = False,
) -> None:
    """Add the handler (and the default name, CDI switch) to the CRI table ``cri``."""
    handler = _build_handler(cri, name, binary, where, pod_cdi_annotations)
    containerd_table = _ensure(cri, "containerd", f"{where}.containerd")
    runtimes = _ensure(containerd_table, "runtimes", f"{where}.containerd.runtimes")
    existing = runtimes.get(name)
    if existing is None or _plain(existing) != handler:
        runtimes[name] = handler
    default = _plain(containerd_table.get("default_runtime_name"))
    if set_as_default:
        if default != name:
            _set(containerd_table, "default_runtime_name", name)
    elif default == name:
        del containerd_table["default_runtime_name"]
        warnings.append(
            f'removed default_runtime_name = "{name}" from {where}.containerd '
            "(pass --set-as-default to keep it)"
        )
    if enable_cdi:
        if _plain(cri.get("enable_cdi")) is not True:
            _set(cri, "enable_cdi", True)
        if "cdi_spec_dirs" not in cri:
            _set(cri, "cdi_spec_dirs", list(CDI_SPEC_DIRS))


def _import_entries(doc: Any, path: str) -> List[Any]:
    if "imports" not in doc:
        return []
    entries = _plain(doc["imports"])
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: imports is not a list")
    return entries


def _resolve_import(entry: str, config_path: str) -> str:
    if os.path.isabs(entry):
        return os.path.normpath(entry)
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(config_path)), entry))


def _path_match(pattern: str, path: str) -> bool:
    """Go's ``filepath.Match``: ``*`` does not cross ``/``."""
    pattern_parts = pattern.split("/")
    path_parts = path.split("/")
    if len(pattern_parts) != len(path_parts):
        return False
    return all(fnmatch.fnmatchcase(p, q) for q, p in zip(pattern_parts, path_parts))


def _imports_cover(doc: Any, config_path: str, drop_in: str) -> bool:
    for entry in _import_entries(doc, config_path):
        if isinstance(entry, str):
            resolved = _resolve_import(entry, config_path)
            if resolved == drop_in or _path_match(resolved, drop_in):
                return True
    return False


def _drop_in_header(config_path: str, name: str) -> str:
    return (
        "# Written by `nvshim runtime configure`; `nvshim runtime configure --revert` removes it.\n"
        f"# A copy of the whole CRI plugin table of {config_path} plus the runtime handler\n"
        f'# "{name}": containerd before 2.1 replaces a plugin\'s table from an import instead\n'
        "# of merging it, so a partial table here would drop the main file's CRI settings.\n"
        "# Run the command again after editing that table in the main file.\n"
    )


def plan_configure(
    main_text: Optional[str],
    drop_in_text: Optional[str] = None,
    *,
    config_path: str = DEFAULT_CONFIG,
    name: str = DEFAULT_NAME,
    binary: str = DEFAULT_BINARY,
    drop_in: Optional[str] = None,
    set_as_default: bool = False,
    force: bool = False,
    enable_cdi: bool = False,
    require_allocation: bool = False,
    pod_cdi_annotations: bool = False,
) -> ConfigureResult:
    """Compute the new texts of the main file and drop-in; pure, writes nothing.

    ``main_text``/``drop_in_text`` are the current contents (``None``: no such file).
    ``drop_in=None`` means the default drop-in for versions 2 and 3 (version 1: in place);
    ``""`` means in place. The result's ``files`` list the drop-in (if any) first.
    """
    import tomlkit

    _check_arguments(name, binary)
    warnings: List[str] = []
    warnings += default_runtime_guard(name, set_as_default, force, require_allocation)

    doc = _parse(main_text or "", config_path)
    empty = not _has_keys(doc)
    version = _detect_version(doc, config_path)
    plugins_key, cri_key = _cri_keys(version)
    where = _cri_label(version)
    if version == 1:
        if drop_in:
            raise UsageError(
                f'{config_path} is a version 1 containerd config, which cannot take the drop-in '
                f'"{drop_in}": pass --drop-in "" to edit it in place, or convert it to version 2'
            )
        drop_in = ""
    elif drop_in is None:
        drop_in = DEFAULT_DROP_IN
    if drop_in:
        drop_in = os.path.abspath(drop_in)
        if drop_in == os.path.abspath(config_path):
            raise UsageError(
                f'drop-in "{drop_in}" is the main config itself: pass --drop-in "" to edit it in place'
            )

    if not drop_in:
        if empty:
            doc["version"] = version
        cri = _ensure(_ensure(doc, plugins_key, f"{config_path}: plugins"), cri_key, where)
        _apply_to_cri(
            cri,
            name=name,
            binary=binary,
            set_as_default=set_as_default,
            enable_cdi=enable_cdi,
            where=where,
            warnings=warnings,
            pod_cdi_annotations=pod_cdi_annotations,
        )
        main_after = _dumps(doc, main_text)
        return ConfigureResult(
            version=version,
            cri_plugin=cri_key,
            handler_file=config_path,
            files=(FileChange(config_path, main_text, main_after),),
            written=(),
            warnings=tuple(warnings),
        )

    source = _lookup(doc, (plugins_key, cri_key), config_path)
    cri_copy: Dict[str, Any] = _plain(source) if source is not None else {}
    _apply_to_cri(
        cri_copy,
        name=name,
        binary=binary,
        set_as_default=set_as_default,
        enable_cdi=enable_cdi,
        where=where,
        warnings=warnings,
        pod_cdi_annotations=pod_cdi_annotations,
    )
    drop_doc = tomlkit.document()
    for line in _drop_in_header(config_path, name).splitlines():
        drop_doc.add(tomlkit.comment(line[2:]))
    drop_doc.add(tomlkit.nl())
    drop_doc["version"] = version
    plugins = tomlkit.table(is_super_table=True)
    plugins[cri_key] = cri_copy
    drop_doc[plugins_key] = plugins
    drop_after = _dumps(drop_doc)

    if empty:
        doc["version"] = version
    if not _imports_cover(doc, config_path, drop_in):
        if "imports" in doc:
            doc["imports"].append(drop_in)
        else:
            doc["imports"] = [drop_in]
    main_after = _dumps(doc, main_text)
    return ConfigureResult(
        version=version,
        cri_plugin=cri_key,
        handler_file=drop_in,
        files=(
            FileChange(drop_in, drop_in_text, drop_after),
            FileChange(config_path, main_text, main_after),
        ),
        written=(),
        warnings=tuple(warnings),
    )


# --------------------------------------------------------------------------- file access


def configure(
    config_path: str = DEFAULT_CONFIG,
    *,
    name: str = DEFAULT_NAME,
    binary: str = DEFAULT_BINARY,
    drop_in: Optional[str] = None,
    set_as_default: bool = False,
    force: bool = False,
    enable_cdi: bool = False,
    require_allocation: bool = False,
    dry_run: bool = False,
    pod_cdi_annotations: bool = False,
) -> ConfigureResult:
    """Add the runtime handler to containerd's config; see the module docstring.

    Writes only files whose text changes; the first time a file is changed its original
    bytes (or absence) go to :func:`backup_path` so :func:`revert` can restore them.
    """
    config_path = os.path.abspath(config_path)
    main_text = read_text(config_path)
    doc_version = _detect_version(_parse(main_text or "", config_path), config_path)
    planned_drop_in = drop_in
    if planned_drop_in is None and doc_version != 1:
        planned_drop_in = DEFAULT_DROP_IN
    drop_in_text = read_text(planned_drop_in) if planned_drop_in else None
    plan = plan_configure(
        main_text,
        drop_in_text,
        config_path=config_path,
        name=name,
        binary=binary,
        drop_in=drop_in,
        set_as_default=set_as_default,
        force=force,
        enable_cdi=enable_cdi,
        require_allocation=require_allocation,
        pod_cdi_annotations=pod_cdi_annotations,
    )
    if dry_run:
        return plan
    # the drop-in before the main file that imports it
    written = write_changes(backup_path(config_path), _BACKUP_FORMAT, plan.files)
    return ConfigureResult(
        version=plan.version,
        cri_plugin=plan.cri_plugin,
        handler_file=plan.handler_file,
        files=plan.files,
        written=written,
        warnings=plan.warnings,
    )


# --------------------------------------------------------------------------- revert


def _strip(
    doc: Any,
    *,
    path: str,
    name: str,
    drop_ins: Tuple[str, ...],
    original: Optional[Any],
    warnings: List[str],
) -> None:
    """Remove nvshim's entries from ``doc`` in place.

    With ``original`` (the document before configure) known, everything it lacked is
    removed and changed values are put back; without it, only the handler named ``name``,
    a default runtime naming it, and imports of ``drop_ins`` go.
    """
    version = _detect_version(doc, path)
    plugins_key, cri_key = _cri_keys(version)
    where = _cri_label(version)
    cri = _lookup(doc, (plugins_key, cri_key), path)
    orig_cri = _lookup(original, (plugins_key, cri_key), path) if original is not None else None
    orig_containerd = _lookup(orig_cri, ("containerd",), "") if orig_cri is not None else None
    orig_runtimes = _lookup(orig_cri, ("containerd", "runtimes"), "") if orig_cri is not None else None
    if cri is not None:
        containerd_table = _lookup(cri, ("containerd",), "")
        runtimes = _lookup(cri, ("containerd", "runtimes"), "")
        if runtimes is not None and name in runtimes:
            if orig_runtimes is not None and name in orig_runtimes:
                runtimes[name] = _plain(orig_runtimes[name])
            else:
                del runtimes[name]
        if containerd_table is not None and _plain(containerd_table.get("default_runtime_name")) == name:
            before = orig_containerd.get("default_runtime_name") if orig_containerd is not None else None
            if before is not None:
                containerd_table["default_runtime_name"] = _plain(before)
            else:
                del containerd_table["default_runtime_name"]
        if original is not None:
            for key in ("enable_cdi", "cdi_spec_dirs"):
                if key in cri and (orig_cri is None or key not in orig_cri):
                    del cri[key]
        elif "enable_cdi" in cri:
            warnings.append(f"left {where}.enable_cdi in {path}: without a backup nvshim cannot tell who set it")
        _prune(doc, (plugins_key, cri_key, "containerd", "runtimes"), original)
    if "imports" in doc:
        entries = _import_entries(doc, path)
        if original is not None:
            keep = _import_entries(original, path)
            remaining = [e for e in entries if e in keep]
        else:
            ours = set(drop_ins)
            remaining = [e for e in entries if not (isinstance(e, str) and _resolve_import(e, path) in ours)]
        if remaining != entries:
            if remaining or (original is not None and "imports" in original):
                array = doc["imports"]
                for index in reversed(range(len(entries))):
                    if entries[index] not in remaining:
                        del array[index]  # in place, so the array's layout and comments stay
            else:
                del doc["imports"]


def _prune(doc: Any, keys: Tuple[str, ...], original: Optional[Any]) -> None:
    """Drop the tables along ``keys`` that are now empty and that ``original`` lacked."""
    for depth in range(len(keys), 0, -1):
        parent = _lookup(doc, keys[: depth - 1], "")
        if parent is None or keys[depth - 1] not in parent:
            continue
        table = parent[keys[depth - 1]]
        if not _is_table(table) or len(table) > 0:
            return
        if original is not None and _lookup(original, keys[:depth], "") is not None:
            return
        del parent[keys[depth - 1]]


def plan_revert(
    current: Mapping[str, Optional[str]],
    backup: Optional[Mapping[str, Any]],
    *,
    config_path: str = DEFAULT_CONFIG,
    name: str = DEFAULT_NAME,
    drop_in: Optional[str] = None,
) -> RevertResult:
    """Compute what revert leaves in each file; pure.

    ``current`` maps every file involved (the main file, drop-ins, the backup's files) to
    its text. A file still as nvshim wrote it gets its original text back; a main file
    edited since (or any file without a backup) gets :func:`_strip`; a drop-in is removed.
    """
    if backup is not None:
        entries: Mapping[str, Any] = backup["files"]
        config_abs = os.path.abspath(config_path)
        drop_ins = tuple(os.path.abspath(p) for p in entries if os.path.abspath(p) != config_abs)

        def strip(path: str, now: str, original: Optional[str], warnings: List[str]) -> str:
            doc = _parse(now, path)
            _strip(
                doc,
                path=path,
                name=name,
                drop_ins=drop_ins,
                original=_parse(original or "", path),
                warnings=warnings,
            )
            return _dumps(doc, now)

        return plan_restore(current, backup, main_path=config_path, strip=strip)

    warnings: List[str] = []
    files: List[FileChange] = []
    edited: List[str] = []
    removed: List[str] = []
    warnings.append(
        f"no backup {backup_path(config_path)}: removing only nvshim's entries "
        f'(runtime "{name}", its default_runtime_name, its import and drop-in)'
    )
    now = current.get(config_path)
    doc = _parse(now or "", config_path)
    version = _detect_version(doc, config_path)
    managed: Tuple[str, ...] = ()
    if version != 1 and drop_in != "":
        managed = (os.path.abspath(drop_in or DEFAULT_DROP_IN),)
    if now is not None:
        _strip(doc, path=config_path, name=name, drop_ins=managed, original=None, warnings=warnings)
        after = _dumps(doc, now)
        if after != now:
            files.append(FileChange(config_path, now, after))
            edited.append(config_path)
    for path in managed:
        text = current.get(path)
        if text is None:
            continue
        drop_doc = _parse(text, path)
        drop_version = _detect_version(drop_doc, path)
        runtimes = _lookup(drop_doc, _cri_keys(drop_version) + ("containerd", "runtimes"), path)
        if runtimes is None or name not in runtimes:
            warnings.append(f'left {path}: it has no runtime "{name}"')
            continue
        files.append(FileChange(path, text, None))
        removed.append(path)
    return RevertResult(
        files=tuple(files),
        restored=(),
        edited=tuple(edited),
        removed=tuple(removed),
        used_backup=False,
        warnings=tuple(warnings),
    )


def revert(
    config_path: str = DEFAULT_CONFIG,
    *,
    name: str = DEFAULT_NAME,
    drop_in: Optional[str] = None,
    dry_run: bool = False,
) -> RevertResult:
    """Undo :func:`configure`: restore original bytes from the backup, else strip entries."""
    config_path = os.path.abspath(config_path)
    backup_file = backup_path(config_path)
    backup = load_backup(backup_file, _BACKUP_FORMAT)
    paths = [config_path]
    if backup is not None:
        paths += list(backup["files"])
    elif drop_in != "":
        paths.append(os.path.abspath(drop_in or DEFAULT_DROP_IN))
    current = {path: read_text(path) for path in dict.fromkeys(paths)}
    plan = plan_revert(current, backup, config_path=config_path, name=name, drop_in=drop_in)
    if dry_run:
        return plan
    # the main file first, so it never imports a missing drop-in
    apply_restore(plan, backup, backup_file)
    return plan


# --------------------------------------------------------------------------- read


def read_handlers(config_path: str = DEFAULT_CONFIG) -> EffectiveRuntimes:
    """The handlers containerd sees: the main file, then its imports, in containerd's order.

    Imports are resolved like containerd does (relative to the importing file, globs
    sorted, each file once, imports of imports too); a later file's CRI table replaces an
    earlier one whole, as containerd before 2.1 does.
    """
    text = read_text(config_path)
    doc = _parse(text or "", config_path)
    version = _detect_version(doc, config_path)
    cri_key = CRI_PLUGINS[version]
    pending = [os.path.abspath(config_path)]
    seen: List[str] = []
    problems: List[str] = []
    cri: Any = None
    while pending:
        path = pending.pop(0)
        if path in seen:
            continue
        seen.append(path)
        if path == os.path.abspath(config_path):
            file_doc = doc
        else:
            file_text = read_text(path)
            if file_text is None:
                problems.append(f"import {path} does not exist")
                continue
            file_doc = _parse(file_text, path)
        file_version = _detect_version(file_doc, path) if path != seen[0] else version
        table = _lookup(file_doc, _cri_keys(file_version), path)
        if table is not None:
            cri = table
        for entry in _import_entries(file_doc, path):
            if not isinstance(entry, str):
                problems.append(f"{path}: import {json.dumps(entry)} is not a string")
                continue
            resolved = _resolve_import(entry, path)
            if glob.has_magic(resolved):
                pending += sorted(glob.glob(resolved))
            else:
                pending.append(resolved)
    handlers: Dict[str, Optional[str]] = {}
    default = _CONTAINERD_DEFAULT_RUNTIME
    if cri is not None:
        runtimes = _lookup(cri, ("containerd", "runtimes"), "")
        for handler_name, handler in (runtimes or {}).items():
            options = handler.get("options") if _is_table(handler) else None
            binary = _plain(options.get("BinaryName")) if isinstance(options, Mapping) else None
            handlers[str(handler_name)] = binary if isinstance(binary, str) and binary else None
        containerd_table = _lookup(cri, ("containerd",), "")
        if containerd_table is not None:
            value = _plain(containerd_table.get("default_runtime_name"))
            if isinstance(value, str) and value:
                default = value
    return EffectiveRuntimes(
        config_path=config_path,
        version=version,
        cri_plugin=cri_key,
        default_runtime_name=default,
        handlers=handlers,
        files=tuple(seen),
        problems=tuple(problems),
    )


# --------------------------------------------------------------------------- drift


_DROP_IN_MARK = "Written by `nvshim runtime configure`"


def _diff_keys(before: Any, after: Any, prefix: str) -> List[str]:
    """Dotted keys whose values differ between two plain TOML values."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: List[str] = []
        for key in sorted(set(before) | set(after), key=str):
            out += _diff_keys(before.get(key), after.get(key), f"{prefix}.{key}")
        return out
    return [] if before == after else [prefix]


def _is_nvshim_handler(handler: Any) -> bool:
    options = handler.get("options") if isinstance(handler, dict) else None
    binary = options.get("BinaryName") if isinstance(options, dict) else None
    return isinstance(binary, str) and os.path.basename(binary).startswith("nvshim")


def _without_nvshim(drop: Dict[str, Any], main: Dict[str, Any]) -> Dict[str, Any]:
    """The drop-in's CRI table minus what configure adds to the main file's copy: the
    nvshim handlers, a default_runtime_name naming one, enable_cdi/cdi_spec_dirs it set."""
    drop = copy.deepcopy(drop)
    runtimes = drop.get("containerd", {}).get("runtimes", {})
    main_runtimes = main.get("containerd", {}).get("runtimes", {})
    nvshim_names = [n for n, h in runtimes.items() if _is_nvshim_handler(h)]
    for handler_name in nvshim_names:
        if handler_name in main_runtimes and not _is_nvshim_handler(main_runtimes[handler_name]):
            continue  # the main file's own handler of that name: a real difference
        if handler_name in main_runtimes:
            runtimes[handler_name] = copy.deepcopy(main_runtimes[handler_name])
        else:
            del runtimes[handler_name]
    containerd_table = drop.get("containerd", {})
    if containerd_table.get("default_runtime_name") in nvshim_names:
        main_default = main.get("containerd", {}).get("default_runtime_name")
        if main_default is None:
            del containerd_table["default_runtime_name"]
        else:
            containerd_table["default_runtime_name"] = main_default
    if drop.get("enable_cdi") is True and main.get("enable_cdi") is not True:
        if "enable_cdi" in main:
            drop["enable_cdi"] = main["enable_cdi"]
        else:
            del drop["enable_cdi"]
    if "cdi_spec_dirs" not in main and drop.get("cdi_spec_dirs") == list(CDI_SPEC_DIRS):
        del drop["cdi_spec_dirs"]
    return drop


def drop_in_drift(config_path: str = DEFAULT_CONFIG) -> List[Tuple[str, List[str]]]:
    """Differences between the main file's CRI table and the copy in nvshim's drop-ins.

    containerd before 2.1 uses the drop-in's table instead of the main file's, so a
    setting edited in the main file after ``runtime configure`` (``sandbox_image``, a
    registry mirror) is silently not used. One (drop-in path, dotted keys) pair per
    drop-in whose copy differs once nvshim's own additions are set aside; empty when
    they agree. ``runtime configure`` run again re-copies the table.
    """
    text = read_text(config_path)
    if text is None:
        return []
    doc = _parse(text, config_path)
    version = _detect_version(doc, config_path)
    if version == 1:
        return []
    keys = _cri_keys(version)
    main_table = _lookup(doc, keys, config_path)
    main = _plain(main_table) if main_table is not None else {}
    out: List[Tuple[str, List[str]]] = []
    for entry in _import_entries(doc, config_path):
        if not isinstance(entry, str):
            continue
        resolved = _resolve_import(entry, config_path)
        for path in (sorted(glob.glob(resolved)) if glob.has_magic(resolved) else [resolved]):
            drop_text = read_text(path)
            if drop_text is None or _DROP_IN_MARK not in drop_text:
                continue
            drop_table = _lookup(_parse(drop_text, path), keys, path)
            if drop_table is None:
                continue
            differ = _diff_keys(main, _without_nvshim(_plain(drop_table), main), _cri_label(version))
            if differ:
                out.append((path, differ))
    return out
