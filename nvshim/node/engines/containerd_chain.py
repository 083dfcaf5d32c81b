"""The files containerd loads for one config, in its order, and the CRI tables they hold.

containerd 1.x (and 2.0) loads the main file, then its ``imports`` breadth first: each
file's imports go to the end of the queue, an entry is resolved against the importing
file's directory, an entry containing ``*`` is a glob (Go's ``filepath.Glob``: ``*`` does
not cross ``/`` but does match dot files, matches sorted byte-wise per directory; ``?`` or
``[`` without a ``*`` are literal), each file is loaded once, and a missing file stops
containerd. Then, before 2.1, a later file's ``plugins.<name>`` table *replaces* an earlier
one whole; 2.1 merges them key by key. A file without ``version`` keeps the main file's CRI
table name.

:func:`load_chain` reads the files (the only I/O here); :func:`cri_tables`,
:func:`effective_cri` and :func:`merged_cri` are pure. Used by
:mod:`nvshim.node.engines.containerd` (what nvshim's drop-in must carry so that no earlier
handler is lost), :mod:`nvshim.node.engines.containerd_read` (what ``nvshim doctor`` sees) and
its handler check.
"""

from __future__ import annotations

import copy
import fnmatch
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from nvshim._record import dataclass
from nvshim.node.engines.containerd_toml import (
    CRI_PLUGINS,
    detect_version,
    import_entries,
    lookup,
    plain,
)
from nvshim.node.engines.files import read_text, read_toml

__all__ = [
    "Loaded",
    "Chain",
    "go_glob",
    "covers",
    "load_chain",
    "cri_tables",
    "effective_cri",
    "merged_cri",
    "merge_tables",
    "position",
]


@dataclass(frozen=True)
class Loaded:
    """One file containerd loads: its absolute path, its text (``None``: nvshim's drop-in,
    which ``load_chain`` was told will exist, has no text yet; the main file's is not kept:
    ``""``) and its import depth (the main file 0, its imports 1, theirs 2, …)."""

    path: str
    text: Optional[str]
    depth: int


@dataclass(frozen=True)
class Chain:
    """The files in containerd's load order and the problems that would stop containerd
    (a missing import, an entry that is not a string)."""

    files: Tuple[Loaded, ...]
    problems: Tuple[str, ...] = ()


def _resolve(entry: str, parent: str) -> str:
    """containerd's ``resolveImports``: cleaned, relative to the importing file's directory."""
    path = os.path.normpath(entry)
    if not os.path.isabs(path):
        path = os.path.normpath(os.path.join(os.path.dirname(parent), path))
    return path


def _has_magic(segment: str) -> bool:
    return any(c in segment for c in "*?[")


def go_glob(pattern: str, listdir: Callable[[str], List[str]] = os.listdir) -> List[str]:
    """Go's ``filepath.Glob`` of an absolute ``pattern``: dot files match ``*``, each
    directory's matches sorted byte-wise, an unreadable directory matches nothing."""
    parts = pattern.split("/")
    found = ["/"]
    for index, segment in enumerate(parts[1:], start=1):
        last = index == len(parts) - 1
        nxt: List[str] = []
        for base in found:
            if not _has_magic(segment):
                candidate = os.path.join(base, segment)
                if os.path.lexists(candidate) and (last or os.path.isdir(candidate)):
                    nxt.append(candidate)
                continue
            try:
                names = listdir(base)
            except OSError:
                continue
            for name in sorted(names, key=lambda n: n.encode("utf-8", "surrogateescape")):
                if fnmatch.fnmatchcase(name, segment):
                    candidate = os.path.join(base, name)
                    if last or os.path.isdir(candidate):
                        nxt.append(candidate)
        found = nxt
    return found


def _expand(entry: str, parent: str, drop_in: str) -> List[str]:
    """The files one import entry names; ``drop_in`` counts as existing for a glob."""
    resolved = _resolve(entry, parent)
    if "*" not in resolved:
        return [resolved]
    matches = go_glob(resolved)
    if drop_in and drop_in not in matches and _go_match(resolved, drop_in):
        matches = sorted(matches + [drop_in], key=lambda p: p.encode("utf-8", "surrogateescape"))
    return matches


def _go_match(pattern: str, path: str) -> bool:
    """Go's ``filepath.Match``: ``*`` does not cross ``/``."""
    pattern_parts, path_parts = pattern.split("/"), path.split("/")
    if len(pattern_parts) != len(path_parts):
        return False
    return all(fnmatch.fnmatchcase(p, q) for q, p in zip(pattern_parts, path_parts, strict=True))


def covers(entries: Sequence[Any], config_path: str, drop_in: str) -> bool:
    """Whether one of the main file's import ``entries`` names ``drop_in`` (by path or glob)."""
    for entry in entries:
        if isinstance(entry, str):
            resolved = _resolve(entry, config_path)
            if resolved == drop_in or ("*" in resolved and _go_match(resolved, drop_in)):
                return True
    return False


def load_chain(
    config_path: str,
    main_doc: Any,
    *,
    drop_in: str = "",
    read: Callable[[str], Optional[str]] = read_text,
) -> Chain:
    """The files containerd loads for ``config_path`` (whose parsed document is
    ``main_doc``), in its order.

    With ``drop_in``, nvshim's drop-in is placed where containerd will load it once
    configure has run: where an import already names it (a glob counting it as existing),
    else at the end of the main file's imports, as configure appends it. Its text is read
    when it exists; the other files must exist (else a problem is listed and they are
    skipped).
    """
    main = os.path.abspath(config_path)
    pending: List[Tuple[str, int]] = [(main, 0)]
    seen: Dict[str, bool] = {}
    files: List[Loaded] = []
    problems: List[str] = []
    while pending:
        path, depth = pending.pop(0)
        if path in seen:
            continue
        seen[path] = True
        text: Optional[str] = ""
        if path == main:
            doc = main_doc
        else:
            text = read(path)
            if text is None:
                if path == drop_in:
                    files.append(Loaded(path, None, depth))
                    continue
                problems.append(f"import {path} does not exist")
                continue
            doc = read_toml(text, path)
        files.append(Loaded(path, text, depth))
        entries = import_entries(doc, path)
        if path == main and drop_in and not covers(entries, main, drop_in):
            entries = entries + [drop_in]
        for entry in entries:
            if not isinstance(entry, str):
                problems.append(f"{path}: import {entry!r} is not a string")
                continue
            pending += [
                (p, depth + 1) for p in _expand(entry, path, drop_in if path == main else "")
            ]
    return Chain(tuple(files), tuple(problems))


def position(chain: Chain, path: str) -> int:
    """The index of ``path`` in the chain (``len(files)`` when it is not there)."""
    for index, loaded in enumerate(chain.files):
        if loaded.path == path:
            return index
    return len(chain.files)


def _cri_key(doc: Any, path: str, main_version: int) -> str:
    """The CRI table's name in one file: its own ``version``'s when it says one, else the
    main file's (containerd looks the merged plugin table up by the main file's name)."""
    if "version" in doc:
        return CRI_PLUGINS[detect_version(doc, path)]
    return CRI_PLUGINS[main_version]


def cri_tables(
    files: Sequence[Loaded], main_doc: Any, main_version: int
) -> List[Tuple[str, Dict[str, Any]]]:
    """``(path, plain CRI table)`` of every one of ``files`` that has one, in order.

    The main file (depth 0) is ``main_doc``; the others are parsed from their texts (a
    file with no text yet has no table)."""
    out: List[Tuple[str, Dict[str, Any]]] = []
    for loaded in files:
        if loaded.depth == 0:
            doc = main_doc
        elif loaded.text is None:
            continue
        else:
            doc = read_toml(loaded.text, loaded.path)
        key = _cri_key(doc, loaded.path, main_version)
        table = lookup(doc, ("plugins", key), loaded.path)
        if table is not None:
            out.append((loaded.path, plain(table)))
    return out


def merge_tables(base: Dict[str, Any], over: Dict[str, Any]) -> Dict[str, Any]:
    """``over`` merged into a copy of ``base``: tables key by key, other values replaced."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_tables(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def effective_cri(
    tables: Sequence[Tuple[str, Dict[str, Any]]], merge: bool = False
) -> Tuple[Optional[str], Dict[str, Any]]:
    """The CRI table containerd uses and the file it came from (``None``: no file has one).

    Before 2.1 (``merge=False``) the last file's table replaces the others whole; with
    ``merge`` they are merged key by key (the file is then the last one with a table).
    """
    if not tables:
        return None, {}
    if not merge:
        path, table = tables[-1]
        return path, copy.deepcopy(table)
    return tables[-1][0], merged_cri(tables)


def merged_cri(tables: Sequence[Tuple[str, Dict[str, Any]]]) -> Dict[str, Any]:
    """Every table merged in order, key by key: what no file loses (what containerd 2.1
    sees; what nvshim's drop-in carries so that containerd before 2.1 sees it too)."""
    out: Dict[str, Any] = {}
    for _, table in tables:
        out = merge_tables(out, table)
    return out
