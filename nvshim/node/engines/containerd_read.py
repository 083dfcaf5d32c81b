"""What containerd will see: its runtime handlers and CDI switch after imports, its
version, and stale drop-in copies.

Read-only views of containerd for ``nvshim doctor``: :func:`read_handlers` merges the main
file and its imports the way containerd does; :func:`containerd_version` asks the binary
which release it is (the default of ``enable_cdi`` depends on it); :func:`drop_in_drift`
finds nvshim drop-ins whose copy of the CRI table no longer matches the main file's.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from typing import Any, Dict, List, Mapping, Optional, Tuple

from nvshim._record import dataclass, field
from nvshim.node.engines.containerd_chain import (
    cri_tables,
    effective_cri,
    load_chain,
    merged_cri,
    position,
)
from nvshim.node.engines.containerd_toml import (
    CDI_SPEC_DIRS,
    CRI_PLUGINS,
    DEFAULT_CONFIG,
    DEFAULT_RUNTIME_NAME,
    cri_label,
    detect_version,
    is_nvshim_handler,
    is_table,
    lookup,
    plain,
)
from nvshim.node.engines.files import read_text, read_toml

__all__ = ["EffectiveRuntimes", "read_handlers", "containerd_version", "drop_in_drift"]


@dataclass(frozen=True)
class EffectiveRuntimes:
    """The CRI runtime handlers containerd sees once imports are merged.

    ``handlers`` maps a handler name to its ``options.BinaryName`` (``None`` when unset or
    empty), ``container_annotations`` a handler name to the annotation patterns it passes
    from the CRI request into config.json. ``default_runtime_name`` is containerd's own
    default, ``runc``, when no file sets it. ``enable_cdi`` and ``cdi_spec_dirs`` are the
    CRI table's values, ``None`` when unset (containerd's default then applies, which
    depends on its version); ``cri_file`` is the file whose CRI table counts (``None``:
    no file has one). ``problems`` lists imports that could not be read. ``declared`` maps
    every handler name that some file's CRI table holds to those files, in load order: a
    name there but not in ``handlers`` is one containerd lost.
    """

    config_path: str
    version: int
    cri_plugin: str
    default_runtime_name: str
    handlers: Mapping[str, Optional[str]]
    files: Tuple[str, ...]
    problems: Tuple[str, ...] = field(default=())
    container_annotations: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)
    enable_cdi: Optional[bool] = None
    cdi_spec_dirs: Optional[Tuple[str, ...]] = None
    cri_file: Optional[str] = None
    declared: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)


def read_handlers(config_path: str = DEFAULT_CONFIG, merge: bool = False) -> EffectiveRuntimes:
    """The handlers containerd sees: the main file, then its imports, in containerd's order
    (:mod:`nvshim.node.engines.containerd_chain`).

    A later file's CRI table replaces an earlier one whole, as containerd before 2.1 does;
    ``merge`` merges them key by key instead, as 2.1 and later do. ``declared`` names, per
    handler, the files whose CRI table declares it.
    """
    text = read_text(config_path)
    doc = read_toml(text or "", config_path)
    version = detect_version(doc, config_path)
    cri_key = CRI_PLUGINS[version]
    chain = load_chain(config_path, doc)
    tables = cri_tables(chain.files, doc, version)
    cri_file, cri = effective_cri(tables, merge)
    declared: Dict[str, Tuple[str, ...]] = {}
    for path, table in tables:
        for handler_name in _runtimes(table):
            declared[handler_name] = declared.get(handler_name, ()) + (path,)
    handlers: Dict[str, Optional[str]] = {}
    passed: Dict[str, Tuple[str, ...]] = {}
    default = DEFAULT_RUNTIME_NAME
    enable_cdi: Optional[bool] = None
    spec_dirs: Optional[Tuple[str, ...]] = None
    if cri_file is not None:
        for handler_name, handler in _runtimes(cri).items():
            options = handler.get("options") if is_table(handler) else None
            binary = plain(options.get("BinaryName")) if isinstance(options, Mapping) else None
            handlers[handler_name] = binary if isinstance(binary, str) and binary else None
            patterns = plain(handler.get("container_annotations")) if is_table(handler) else None
            passed[handler_name] = _strings(patterns)
        containerd_table = lookup(cri, ("containerd",), "")
        if containerd_table is not None:
            value = plain(containerd_table.get("default_runtime_name"))
            if isinstance(value, str) and value:
                default = value
        switch = plain(cri.get("enable_cdi"))
        enable_cdi = switch if isinstance(switch, bool) else None
        if "cdi_spec_dirs" in cri:
            spec_dirs = _strings(plain(cri["cdi_spec_dirs"]))
    return EffectiveRuntimes(
        config_path=config_path,
        version=version,
        cri_plugin=cri_key,
        default_runtime_name=default,
        handlers=handlers,
        files=tuple(f.path for f in chain.files),
        problems=chain.problems,
        container_annotations=passed,
        enable_cdi=enable_cdi,
        cdi_spec_dirs=spec_dirs,
        cri_file=cri_file,
        declared=declared,
    )


def _runtimes(cri: Mapping[str, Any]) -> Dict[str, Any]:
    """The ``containerd.runtimes`` table of a plain CRI table (empty when it has none)."""
    containerd_table = cri.get("containerd")
    runtimes = containerd_table.get("runtimes") if isinstance(containerd_table, dict) else None
    return {str(k): v for k, v in runtimes.items()} if isinstance(runtimes, dict) else {}


def _strings(value: Any) -> Tuple[str, ...]:
    """The strings of a TOML list (anything else: none)."""
    if not isinstance(value, list):
        return ()
    return tuple(item for item in value if isinstance(item, str))


_VERSION = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")


#: ``containerd --version``'s answers in this process (or the process still answering), by
#: the binary's path and identity (device, inode, size, mtime): doctor's checks ask it up
#: to three times (each a process start of the containerd binary).
_VERSIONS: Dict[Tuple[str, int, int, int, int], Any] = {}


def _version_key(binary: str) -> Optional[Tuple[str, int, int, int, int]]:
    found = shutil.which(binary)
    if found is None:
        return None
    try:
        st = os.stat(found)
    except OSError:
        return None
    return found, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def start_version(binary: str = "containerd") -> None:
    """Start asking ``binary --version`` in the background, for a later
    :func:`containerd_version` (doctor starts it first: the answer comes while it reads
    files)."""
    key = _version_key(binary)
    if key is None or key in _VERSIONS:
        return
    try:
        _VERSIONS[key] = subprocess.Popen(
            [key[0], "--version"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
    except OSError:
        _VERSIONS[key] = None


def containerd_version(binary: str = "containerd") -> Optional[Tuple[int, int, str]]:
    """``(major, minor, text)`` of the containerd that ``binary`` (a name looked up on PATH,
    or a path) runs, from ``containerd --version``; ``None`` when it is not installed or
    does not say (the text: ``1.7.13``, ``2.0.0``, Debian's ``1.6.20~ds1``). Asked once per
    binary and process while the file stays the same."""
    key = _version_key(binary)
    if key is None:
        return None
    if key not in _VERSIONS:
        start_version(binary)
    answer = _VERSIONS[key]
    if isinstance(answer, subprocess.Popen):
        answer = _VERSIONS[key] = _read_version(answer)
    version: Optional[Tuple[int, int, str]] = answer
    return version


def _read_version(proc: subprocess.Popen[str]) -> Optional[Tuple[int, int, str]]:
    try:
        stdout, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None
    words = stdout.split()
    # "containerd github.com/containerd/containerd/v2 v2.0.0 <commit>": the first word
    # after the module path that reads as a version
    for word in words[1:]:
        match = _VERSION.match(word)
        if match:
            return int(match.group(1)), int(match.group(2)), word.lstrip("v")
    return None


_DROP_IN_MARK = "Written by `nvshim runtime configure`"


def _diff_keys(before: Any, after: Any, prefix: str) -> List[str]:
    """Dotted keys whose values differ between two plain TOML values."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: List[str] = []
        for key in sorted(set(before) | set(after), key=str):
            out += _diff_keys(before.get(key), after.get(key), f"{prefix}.{key}")
        return out
    return [] if before == after else [prefix]


_is_nvshim_handler = is_nvshim_handler


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
    # tables left empty by that which no earlier file has (a bare `version = 2` main file)
    if nvshim_names and not runtimes and "runtimes" not in main.get("containerd", {}):
        drop.get("containerd", {}).pop("runtimes", None)
    if "containerd" in drop and not drop["containerd"] and "containerd" not in main:
        del drop["containerd"]
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
    """Differences between the CRI tables containerd loads before each nvshim drop-in
    (merged, as configure copies them) and that drop-in's copy.

    containerd before 2.1 uses the drop-in's table instead of theirs, so a setting edited
    in the main file after ``runtime configure`` (``sandbox_image``, a registry mirror) or
    a handler another tool added to its own drop-in since (``nvidia-ctk runtime
    configure``) is silently not used. One (drop-in path, dotted keys) pair per drop-in
    whose copy differs once nvshim's own additions are set aside; empty when they agree.
    ``runtime configure`` run again re-copies the tables.
    """
    text = read_text(config_path)
    if text is None:
        return []
    doc = read_toml(text, config_path)
    version = detect_version(doc, config_path)
    if version == 1:
        return []
    chain = load_chain(config_path, doc)
    out: List[Tuple[str, List[str]]] = []
    for loaded in chain.files[1:]:
        if loaded.text is None or _DROP_IN_MARK not in loaded.text:
            continue
        drop_table = cri_tables((loaded,), doc, version)
        if not drop_table:
            continue
        at = position(chain, loaded.path)
        before = merged_cri(cri_tables(chain.files[:at], doc, version))
        differ = _diff_keys(before, _without_nvshim(drop_table[0][1], before), cri_label(version))
        if differ:
            out.append((loaded.path, differ))
    return out
