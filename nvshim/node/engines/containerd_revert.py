"""Take nvshim out of containerd's config again (``runtime configure --revert``).

With the backup ``<config>.nvshim-orig.json`` that configure saved, every file still as
nvshim wrote it gets its original bytes back and a drop-in nvshim created is removed,
wherever it was (the backup names it). Without a backup the drop-in looked for is
``--drop-in``, else the one configure writes by default: ``conf.d/99-nvshim.toml`` beside
the main file. A
main file edited by hand since, or a config without a backup, gets a structural revert:
only nvshim's entries (its handler, a ``default_runtime_name`` naming it, its import,
``enable_cdi``/``cdi_spec_dirs`` it added) are taken out, comments and layout kept.

:func:`plan_revert` is pure (texts in, texts out); :func:`revert` reads and writes.
"""

from __future__ import annotations

import os
from typing import Any, Collection, List, Mapping, Optional, Tuple

from nvshim.node.engines.containerd_toml import (
    BACKUP_FORMAT,
    DEFAULT_CONFIG,
    DEFAULT_NAME,
    cri_keys,
    cri_label,
    default_drop_in,
    detect_version,
    dump_toml,
    import_entries,
    is_nvshim_handler,
    is_table,
    lookup,
    plain,
    resolve_import,
)
from nvshim.node.engines.files import (
    FileChange,
    RevertResult,
    apply_restore,
    backup_path,
    load_backup,
    parse_toml,
    plan_restore,
    plan_revert_one,
    read_text,
)

__all__ = ["plan_revert", "revert"]


def _strip(
    doc: Any,
    *,
    path: str,
    name: str,
    drop_ins: Tuple[str, ...],
    original: Optional[Any],
    warnings: List[str],
    shared: bool = True,
) -> None:
    """Remove nvshim's entries from ``doc`` in place.

    With ``original`` (the document before configure) known, everything it lacked is
    removed and changed values are put back; without it, only the handler named ``name``,
    a default runtime naming it, and imports of ``drop_ins`` go. ``shared=False`` (other
    nvshim runtimes stay): no warning about ``enable_cdi``, which they share.
    """
    version = detect_version(doc, path)
    plugins_key, cri_key = cri_keys(version)
    where = cri_label(version)
    cri = lookup(doc, (plugins_key, cri_key), path)
    orig_cri = lookup(original, (plugins_key, cri_key), path) if original is not None else None
    orig_containerd = lookup(orig_cri, ("containerd",), "") if orig_cri is not None else None
    orig_runtimes = None
    if orig_cri is not None:
        orig_runtimes = lookup(orig_cri, ("containerd", "runtimes"), "")
    if cri is not None:
        containerd_table = lookup(cri, ("containerd",), "")
        runtimes = lookup(cri, ("containerd", "runtimes"), "")
        if runtimes is not None and name in runtimes:
            if orig_runtimes is not None and name in orig_runtimes:
                runtimes[name] = plain(orig_runtimes[name])
            else:
                del runtimes[name]
        default = (
            plain(containerd_table.get("default_runtime_name"))
            if (containerd_table is not None)
            else None
        )
        if containerd_table is not None and default == name:
            before = None
            if orig_containerd is not None:
                before = orig_containerd.get("default_runtime_name")
            if before is not None:
                containerd_table["default_runtime_name"] = plain(before)
            else:
                del containerd_table["default_runtime_name"]
        if original is not None:
            for key in ("enable_cdi", "cdi_spec_dirs"):
                if key in cri and (orig_cri is None or key not in orig_cri):
                    del cri[key]
        elif "enable_cdi" in cri and shared:
            warnings.append(
                f"left {where}.enable_cdi in {path}: without a backup nvshim cannot tell who set it"
            )
        _prune(doc, (plugins_key, cri_key, "containerd", "runtimes"), original)
    if "imports" in doc:
        entries = import_entries(doc, path)
        if original is not None:
            keep = import_entries(original, path)
            remaining = [e for e in entries if e in keep]
        else:
            ours = set(drop_ins)
            remaining = [
                e for e in entries if not (isinstance(e, str) and resolve_import(e, path) in ours)
            ]
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
        parent = lookup(doc, keys[: depth - 1], "")
        if parent is None or keys[depth - 1] not in parent:
            continue
        table = parent[keys[depth - 1]]
        if not is_table(table) or len(table) > 0:
            return
        if original is not None and lookup(original, keys[:depth], "") is not None:
            return
        del parent[keys[depth - 1]]


def _drop_in_path(drop_in: Optional[str], config_path: str) -> str:
    """The drop-in a revert without backup looks at: ``drop_in``, else configure's default
    beside ``config_path``."""
    return os.path.abspath(drop_in) if drop_in else default_drop_in(config_path)


def plan_revert(
    current: Mapping[str, Optional[str]],
    backup: Optional[Mapping[str, Any]],
    *,
    config_path: str = DEFAULT_CONFIG,
    name: str = DEFAULT_NAME,
    drop_in: Optional[str] = None,
    inherited: Collection[str] = (),
) -> RevertResult:
    """Compute what revert leaves in each file; pure.

    When the backup's files still hold runtimes other than ``name`` that configure added
    (``inherited``: the handlers the drop-in copies from the files loaded before it), only
    ``name`` is taken out and the backup stays for them.

    ``current`` maps every file involved (the main file, drop-ins, the backup's files) to
    its text. A file still as nvshim wrote it gets its original text back; a main file
    edited since (or any file without a backup) gets ``_strip``; a drop-in is removed.
    """
    if backup is not None:
        return _revert_with_backup(current, backup, config_path, name, inherited)
    return _revert_without_backup(current, config_path, name, drop_in)


def _revert_with_backup(
    current: Mapping[str, Optional[str]],
    backup: Mapping[str, Any],
    config_path: str,
    name: str,
    inherited: Collection[str],
) -> RevertResult:
    """Revert by the backup: runtime ``name`` alone taken out while configure's other
    runtimes stay in its files, else every file given back its original text (or stripped
    of nvshim's entries where edited since)."""
    entries: Mapping[str, Any] = backup["files"]
    config_abs = os.path.abspath(config_path)

    def names(path: str, text: Optional[str]) -> List[str]:
        doc = parse_toml(text or "", path)
        table = lookup(doc, cri_keys(detect_version(doc, path)) + ("containerd", "runtimes"), path)
        return (
            [str(n) for n in table if is_nvshim_handler(plain(table[n]))]
            if (table is not None)
            else []
        )

    def others(path: str, now: Optional[str], original: Optional[str]) -> List[str]:
        if now is None:
            return []
        skip = {name} | set(names(path, original))
        if os.path.abspath(path) != config_abs:
            skip |= set(inherited)  # the drop-in's copies of the earlier files' handlers
        return [n for n in names(path, now) if n not in skip]

    def strip_one(
        path: str, now: str, original: Optional[str], warnings: List[str]
    ) -> Optional[str]:
        doc = parse_toml(now, path)
        _strip(
            doc, path=path, name=name, drop_ins=(), original=None, warnings=warnings, shared=False
        )
        return dump_toml(doc, now, path, warnings)

    one = plan_revert_one(current, backup, name=name, others=others, strip_one=strip_one)
    if one is not None:
        return one
    drop_ins = tuple(os.path.abspath(p) for p in entries if os.path.abspath(p) != config_abs)

    def strip(path: str, now: str, original: Optional[str], warnings: List[str]) -> str:
        doc = parse_toml(now, path)
        _strip(
            doc,
            path=path,
            name=name,
            drop_ins=drop_ins,
            original=parse_toml(original or "", path),
            warnings=warnings,
        )
        return dump_toml(doc, now, path, warnings)

    return plan_restore(current, backup, main_path=config_path, strip=strip)


def _revert_without_backup(
    current: Mapping[str, Optional[str]], config_path: str, name: str, drop_in: Optional[str]
) -> RevertResult:
    """Revert with no backup: nvshim's entries stripped from the main file, and the
    drop-in removed where it holds runtime ``name``."""
    warnings: List[str] = []
    files: List[FileChange] = []
    edited: List[str] = []
    removed: List[str] = []
    warnings.append(
        f"no backup {backup_path(config_path)}: removing only nvshim's entries "
        f'(runtime "{name}", its default_runtime_name, its import and drop-in)'
    )
    now = current.get(config_path)
    doc = parse_toml(now or "", config_path)
    version = detect_version(doc, config_path)
    managed: Tuple[str, ...] = ()
    if version != 1 and drop_in != "":
        managed = (_drop_in_path(drop_in, config_path),)
    if now is not None:
        _strip(doc, path=config_path, name=name, drop_ins=managed, original=None, warnings=warnings)
        after = dump_toml(doc, now, config_path, warnings)
        if after != now:
            files.append(FileChange(config_path, now, after))
            edited.append(config_path)
    for path in managed:
        text = current.get(path)
        if text is None:
            continue
        drop_doc = parse_toml(text, path)
        drop_version = detect_version(drop_doc, path)
        runtimes = lookup(drop_doc, cri_keys(drop_version) + ("containerd", "runtimes"), path)
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


def _inherited(
    config_path: str, current: Mapping[str, Optional[str]], backup: Optional[Mapping[str, Any]]
) -> List[str]:
    """The handlers of the files containerd loads before nvshim's drop-ins (which copy them)."""
    from nvshim.node.engines.containerd_chain import cri_tables, load_chain, merged_cri, position

    text = current.get(config_path)
    if backup is None or text is None:
        return []
    doc = parse_toml(text, config_path)
    version = detect_version(doc, config_path)
    if version == 1:
        return []
    names: List[str] = []
    for drop_in in backup["files"]:
        if os.path.abspath(drop_in) == config_path:
            continue
        chain = load_chain(config_path, doc, drop_in=os.path.abspath(drop_in))
        before = merged_cri(
            cri_tables(chain.files[: position(chain, os.path.abspath(drop_in))], doc, version)
        )
        names += list(lookup(before, ("containerd", "runtimes"), "") or {})
    return names


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
    backup = load_backup(backup_file, BACKUP_FORMAT)
    paths = [config_path]
    if backup is not None:
        paths += list(backup["files"])
    elif drop_in != "":
        paths.append(_drop_in_path(drop_in, config_path))
    current = {path: read_text(path) for path in dict.fromkeys(paths)}
    plan = plan_revert(
        current,
        backup,
        config_path=config_path,
        name=name,
        drop_in=drop_in,
        inherited=_inherited(config_path, current, backup),
    )
    if dry_run:
        return plan
    # the main file first, so it never imports a missing drop-in
    apply_restore(plan, backup, backup_file)
    return plan
