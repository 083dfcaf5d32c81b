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
from the device plugin's answer) through to the runtime -- unless containerd injects those
CDI devices itself (``enable_cdi`` on, ``--enable-cdi``, or unset in a version 3 config):
then nvshim counts them as an engine grant instead of injecting them again. The pod's
annotations of that name are let through only with ``pod_cdi_annotations``: anyone who
can create a pod can write them, and in the container's spec they look the same as the
device plugin's.

For versions 2 and 3 the handler goes into a drop-in file that the main file imports, by
default ``conf.d/99-nvshim.toml`` beside the main file (:func:`default_drop_in`).
containerd before 2.1 *replaces* a plugin's table with the one from an import instead of
merging them, so the drop-in holds the CRI table of every file containerd loads before it
-- the main file and the imports ahead of it in containerd's order
(:mod:`nvshim.node.engines.containerd_chain`; on a node ``nvidia-ctk runtime configure`` set up,
``conf.d/99-nvidia.toml`` with its ``nvidia``, ``nvidia-cdi``, ``nvidia-legacy``
handlers) -- merged key by key, plus the handler: no handler an earlier file declares is
lost. Run again, it copies what those files hold then. A file loaded after the drop-in
that has its own CRI table would hide the handler: configure warns. ``drop_in=""``
writes everything into the main file instead; version 1 files are always edited in place.
Files are edited with tomlkit, so comments and layout survive.

Before the first write the original bytes of every file it touches (or their absence) are
saved in ``<config>.nvshim-orig.json``; :mod:`nvshim.node.engines.containerd_revert` puts them back
byte for byte (a file edited by hand since, or a config without that backup, gets a
structural revert instead: only nvshim's entries are removed).

:func:`plan_configure` is pure (text in, text out); :func:`configure` reads and writes the
files. The TOML vocabulary lives in :mod:`nvshim.node.engines.containerd_toml`; what containerd
will see after imports (for ``nvshim doctor``) in :mod:`nvshim.node.engines.containerd_read`.

Why one module: containerd's configure is one plan over one document: the CRI table's place
per config version, the handler copied from runc's, the drop-in that must carry the CRI
tables of the files loaded before it, NRI's table. Each step reads what the one before
decided; reading and merging the files live in containerd_read.py, containerd_toml.py and
containerd_chain.py, and revert in containerd_revert.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from nvshim.errors import ConfigError, UsageError
from nvshim.node.engines.containerd_chain import (
    Chain,
    Loaded,
    covers,
    cri_tables,
    load_chain,
    merged_cri,
    position,
)
from nvshim.node.engines.containerd_toml import (
    BACKUP_FORMAT,
    CDI_ANNOTATIONS,
    CDI_SPEC_DIRS,
    CRI_PLUGINS,
    DEFAULT_BINARY,
    DEFAULT_CONFIG,
    DEFAULT_DROP_IN,
    DEFAULT_NAME,
    DEFAULT_RUNTIME_NAME,
    DROP_IN_NAME,
    cri_keys,
    cri_label,
    default_drop_in,
    detect_version,
    dump_toml,
    ensure_table,
    has_keys,
    import_entries,
    is_nvshim_handler,
    is_table,
    lookup,
    plain,
    quote_key,
    resolve_import,
    set_key,
)
from nvshim.node.engines.files import (
    BACKUP_SUFFIX,
    ConfigureOutcome,
    FileChange,
    backup_path,
    carry_out,
    check_binary,
    check_default_takeover,
    check_handler_name,
    default_runtime_guard,
    parse_toml,
    read_text,
)

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_DROP_IN",
    "DROP_IN_NAME",
    "DEFAULT_NAME",
    "DEFAULT_BINARY",
    "CDI_ANNOTATIONS",
    "CDI_SPEC_DIRS",
    "CRI_PLUGINS",
    "BACKUP_SUFFIX",
    "FileChange",
    "ConfigureResult",
    "backup_path",
    "default_drop_in",
    "plan_configure",
    "configure",
]

_RUNC_TYPE = "io.containerd.runc.v2"
_LEGACY_LINUX_TYPE = "io.containerd.runtime.v1.linux"


#: containerd's configure returns the one result type of every engine.
ConfigureResult = ConfigureOutcome


# --------------------------------------------------------------------------- configure


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


def _build_handler(
    cri: Any,
    name: str,
    binary: str,
    where: str,
    pod_cdi_annotations: bool = False,
    cdi_annotations: bool = True,
) -> Dict[str, Any]:
    """The handler table: the runc (or default) handler's copy pointed at ``binary``;
    ``cdi_annotations``: it lets ``cdi.k8s.io/*`` through to nvshim-runtime."""
    runtimes = lookup(cri, ("containerd", "runtimes"), "")
    containerd_table = lookup(cri, ("containerd",), "")
    source = None
    if runtimes is not None:
        source = runtimes.get(DEFAULT_RUNTIME_NAME)
        if source is None and containerd_table is not None:
            default = plain(containerd_table.get("default_runtime_name"))
            if isinstance(default, str) and default != name:
                source = runtimes.get(default)
    handler: Dict[str, Any] = plain(source) if is_table(source) else {}
    if not handler.get("runtime_type"):
        handler["runtime_type"] = _RUNC_TYPE
    handler_where = f"{where}.containerd.runtimes.{quote_key(name)}"
    keys = (
        ("container_annotations", "pod_annotations")
        if pod_cdi_annotations
        else ("container_annotations",)
    )
    for key in keys if cdi_annotations else ():
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
    version: int = 2,
) -> None:
    """Add the handler (and the default name, CDI switch) to the CRI table ``cri``.

    Where containerd injects CDI devices itself -- ``enable_cdi`` on (or ``--enable-cdi``),
    or unset in a version 3 config (containerd 2.x, on by default) -- the handler is not
    passed ``cdi.k8s.io/*``: containerd injects the devices those annotations name, and
    nvshim counts them as an engine grant instead of injecting them a second time."""
    switch = plain(cri.get("enable_cdi"))
    engine_cdi = enable_cdi or switch is True or (version == 3 and switch is None)
    if engine_cdi and pod_cdi_annotations:
        warnings.append(
            "--pod-cdi-annotations: nothing passed: containerd injects the CDI "
            f"devices cdi.k8s.io/ annotations name itself (enable_cdi in {where})"
        )
    handler = _build_handler(
        cri, name, binary, where, pod_cdi_annotations, cdi_annotations=not engine_cdi
    )
    containerd_table = ensure_table(cri, "containerd", f"{where}.containerd")
    runtimes = ensure_table(containerd_table, "runtimes", f"{where}.containerd.runtimes")
    existing = runtimes.get(name)
    # without --set-as-default a default_runtime_name naming `name` is removed below, and
    # containerd falls back to runc
    named = plain(containerd_table.get("default_runtime_name"))
    default = (
        named if isinstance(named, str) and named and named != name else (DEFAULT_RUNTIME_NAME)
    )
    check_default_takeover(name, (default,), set_as_default, "containerd")
    if existing is None or plain(existing) != handler:
        runtimes[name] = handler
    default = plain(containerd_table.get("default_runtime_name"))
    if set_as_default:
        if default != name:
            set_key(containerd_table, "default_runtime_name", name)
    elif default == name:
        del containerd_table["default_runtime_name"]
        warnings.append(
            f'removed default_runtime_name = "{name}" from {where}.containerd '
            "(pass --set-as-default to keep it)"
        )
    if enable_cdi:
        if plain(cri.get("enable_cdi")) is not True:
            set_key(cri, "enable_cdi", True)
        if "cdi_spec_dirs" not in cri:
            set_key(cri, "cdi_spec_dirs", list(CDI_SPEC_DIRS))


#: containerd's NRI plugin table (containerd 1.7 has it off by default, 2.x on).
NRI_PLUGIN = "io.containerd.nri.v1.nri"


def _enable_nri(plugins: Any, main_plugins: Any, version: int, warnings: List[str]) -> None:
    """``--enable-nri``: ``disable = false`` in ``plugins``' NRI table, for a version 2
    config (containerd 1.7). The table is copied from ``main_plugins`` (the main file's) so
    that a drop-in, which replaces the whole plugin table, keeps its other keys. Version 3
    (containerd 2.x, NRI on by default) is left unchanged; version 1 has no NRI."""
    if version != 2:
        warnings.append(
            "--enable-nri: nothing changed: "
            + (
                "containerd 2.x (config version 3) runs NRI by default"
                if version == 3
                else "a version 1 config is containerd 1.6 or older, which has no NRI"
            )
        )
        return
    import tomlkit

    current = main_plugins.get(NRI_PLUGIN) if hasattr(main_plugins, "get") else None
    if plugins is main_plugins and current is not None:
        if plain(current.get("disable")) is not False:
            set_key(current, "disable", False)
        return
    table = tomlkit.table()
    for key, value in (plain(current) or {}).items():
        table[key] = value
    table["disable"] = False
    plugins[NRI_PLUGIN] = table


def _other_nvshim_imports(doc: Any, config_path: str, drop_in: str) -> List[str]:
    """Imports of another ``99-nvshim.toml`` than ``drop_in``: an earlier nvshim put the
    drop-in of every ``--config`` in /etc/containerd/conf.d, wherever the config was."""
    return [
        resolved
        for entry in import_entries(doc, config_path)
        if isinstance(entry, str)
        for resolved in (resolve_import(entry, config_path),)
        if os.path.basename(resolved) == DROP_IN_NAME and resolved != drop_in
    ]


def _resolve_drop_in(drop_in: Optional[str], version: int, config_path: str) -> str:
    """The drop-in to write as an absolute path, or ``""`` for "edit the main file in place".

    ``None`` means :func:`default_drop_in` of ``config_path`` (version 1: in place); a
    version 1 file cannot take a drop-in, and the drop-in cannot be the main file itself.
    """
    if version == 1:
        if drop_in:
            raise UsageError(
                f"{config_path} is a version 1 containerd config, which cannot take the drop-in "
                f'"{drop_in}": pass --drop-in "" to edit it in place, or convert it to version 2'
            )
        return ""
    if drop_in is None:
        return default_drop_in(config_path)
    if not drop_in:
        return ""
    drop_in = os.path.abspath(drop_in)
    if drop_in == os.path.abspath(config_path):
        raise UsageError(
            f'drop-in "{drop_in}" is the main config itself: pass --drop-in "" to edit it in place'
        )
    return drop_in


def _drop_in_header(config_path: str, names: Sequence[str], sources: Sequence[str]) -> str:
    """The drop-in's opening comment; ``names`` are the nvshim handlers it holds."""
    name = '", "'.join(names)
    handler = "handlers" if len(names) > 1 else "handler"
    head = (
        "# Written by `nvshim runtime configure`; `nvshim runtime configure --revert` removes it.\n"
    )
    if not sources:
        return head + (
            f'# The runtime {handler} "{name}": {config_path} and the files containerd loads\n'
            "# before this one have no CRI plugin table. Run the command again after adding one.\n"
        )
    listed = "".join(f"#   {path}\n" for path in sources)
    return head + (
        "# The CRI plugin tables of the files containerd loads before this one, merged:\n"
        f"{listed}"
        f'# plus the runtime {handler} "{name}". containerd before 2.1 replaces a plugin\'s\n'
        "# table from an import instead of merging it, so a partial table here would drop\n"
        "# their CRI settings and runtime handlers. Run the command again after editing them.\n"
    )


def _keep_from_drop_in(
    cri: Dict[str, Any], text: Optional[str], path: str, version: int, name: str
) -> List[str]:
    """Put into ``cri`` (the earlier files' merged CRI table) what the drop-in now holds
    beyond it -- the other nvshim handlers configured into it (``--name``; a copied handler
    its file no longer declares is not kept), a default_runtime_name
    naming one, ``enable_cdi``/``cdi_spec_dirs`` -- so configuring one handler never
    removes another; the names of those handlers, sorted."""
    if not text:
        return []
    drop = parse_toml(text, path)
    table = lookup(drop, cri_keys(detect_version(drop, path)), path)
    if not is_table(table):
        return []
    table = plain(table)
    runtimes = lookup(table, ("containerd", "runtimes"), path) or {}
    inherited = lookup(cri, ("containerd", "runtimes"), "") or {}
    kept = sorted(
        n for n in runtimes if n != name and n not in inherited and is_nvshim_handler(runtimes[n])
    )
    if kept:
        where = f"{cri_label(version)}.containerd"
        containerd_table = ensure_table(cri, "containerd", where)
        into = ensure_table(containerd_table, "runtimes", f"{where}.runtimes")
        for other in kept:
            into[other] = runtimes[other]
        default = lookup(table, ("containerd",), path).get("default_runtime_name")
        if default in kept:
            containerd_table["default_runtime_name"] = default
    for key in ("enable_cdi", "cdi_spec_dirs"):
        if key in table and key not in cri:
            cri[key] = table[key]
    return kept


def _nvshim_names(doc: Any, version: int, path: str, name: str) -> List[str]:
    """``name`` and the other handlers in ``doc`` that run an nvshim-runtime (edited in
    place, the main file holds every handler configure put there)."""
    runtimes = lookup(doc, cri_keys(version) + ("containerd", "runtimes"), path) or {}
    names = {name} | {str(n) for n, table in runtimes.items() if is_nvshim_handler(plain(table))}
    return sorted(names)


def _hidden_by(
    tables: Sequence[Tuple[str, Any]], where: str, name: str, drop_in: str, noun: str
) -> List[str]:
    """Warnings for files loaded after the handler's file that carry their own CRI table."""
    return [
        f"{path}, loaded after {drop_in}, has its own {where} table: containerd before "
        f'2.1 uses that one, without the runtime "{name}"; {noun}'
        for path, _ in tables
    ]


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
    chain: Optional[Chain] = None,
    enable_nri: bool = False,
) -> ConfigureResult:
    """Compute the new texts of the main file and drop-in; pure, writes nothing.

    ``main_text``/``drop_in_text`` are the current contents (``None``: no such file).
    ``drop_in=None`` means ``conf.d/99-nvshim.toml`` beside ``config_path`` for versions 2
    and 3 (version 1: in place); ``""`` means in place. ``chain`` is what containerd loads
    (:func:`~nvshim.node.engines.containerd_chain.load_chain` with this drop-in); without it, the
    main file and the drop-in alone. The result's ``files`` list the drop-in (if any) first.
    """
    check_handler_name(name)
    check_binary(binary)
    warnings: List[str] = []
    warnings += default_runtime_guard(name, set_as_default, force, require_allocation)

    doc = parse_toml(main_text or "", config_path)
    empty = not has_keys(doc)
    version = detect_version(doc, config_path)
    handler = _Handler(
        name=name,
        binary=binary,
        set_as_default=set_as_default,
        enable_cdi=enable_cdi,
        pod_cdi_annotations=pod_cdi_annotations,
        enable_nri=enable_nri,
        version=version,
    )
    drop_in = _resolve_drop_in(drop_in, version, config_path)

    if chain is None:
        chain = Chain(
            (Loaded(os.path.abspath(config_path), "", 0),)
            + ((Loaded(drop_in, drop_in_text, 1),) if drop_in else ())
        )
    warnings += chain.problems
    at = position(chain, drop_in or os.path.abspath(config_path))
    later = cri_tables(chain.files[at + 1 :], doc, version)
    if not drop_in:
        return _plan_in_place(handler, doc, main_text, config_path, empty, later, warnings)
    before = cri_tables(chain.files[:at], doc, version)
    return _plan_drop_in(
        handler, doc, main_text, config_path, empty, drop_in, drop_in_text, before, later, warnings
    )


@dataclass(frozen=True)
class _Handler:
    """The handler configure adds: what :func:`_apply_to_cri` writes into a CRI table."""

    name: str
    binary: str
    set_as_default: bool
    enable_cdi: bool
    pod_cdi_annotations: bool
    enable_nri: bool
    version: int

    @property
    def where(self) -> str:
        """The CRI table's name in messages."""
        return cri_label(self.version)

    def apply(self, cri: Any, warnings: List[str]) -> None:
        _apply_to_cri(
            cri,
            name=self.name,
            binary=self.binary,
            set_as_default=self.set_as_default,
            enable_cdi=self.enable_cdi,
            where=self.where,
            warnings=warnings,
            pod_cdi_annotations=self.pod_cdi_annotations,
            version=self.version,
        )


def _plan_in_place(
    handler: _Handler,
    doc: Any,
    main_text: Optional[str],
    config_path: str,
    empty: bool,
    later: Sequence[Tuple[str, Any]],
    warnings: List[str],
) -> ConfigureResult:
    """The handler written into the main file itself (no drop-in)."""
    warnings += _hidden_by(
        later,
        handler.where,
        handler.name,
        config_path,
        "pass --drop-in to put the handler in a file loaded after it",
    )
    if empty:
        doc["version"] = handler.version
    plugins_key, cri_key = cri_keys(handler.version)
    plugins_table = ensure_table(doc, plugins_key, f"{config_path}: plugins")
    handler.apply(ensure_table(plugins_table, cri_key, handler.where), warnings)
    if handler.enable_nri:
        _enable_nri(plugins_table, plugins_table, handler.version, warnings)
    main_after = dump_toml(doc, main_text, config_path, warnings)
    return ConfigureResult(
        engine="containerd",
        handlers=tuple(sorted(_nvshim_names(doc, handler.version, config_path, handler.name))),
        version=handler.version,
        cri_plugin=cri_key,
        handler_file=config_path,
        files=(FileChange(config_path, main_text, main_after),),
        written=(),
        warnings=tuple(warnings),
    )


def _plan_drop_in(
    handler: _Handler,
    doc: Any,
    main_text: Optional[str],
    config_path: str,
    empty: bool,
    drop_in: str,
    drop_in_text: Optional[str],
    before: Sequence[Tuple[str, Any]],
    later: Sequence[Tuple[str, Any]],
    warnings: List[str],
) -> ConfigureResult:
    """The handler written into the drop-in (a copy of the whole CRI table the files loaded
    ``before`` it make), and the main file made to import it."""
    cri_copy: Dict[str, Any] = merged_cri(before)
    kept = _keep_from_drop_in(cri_copy, drop_in_text, drop_in, handler.version, handler.name)
    warnings += _hidden_by(
        later,
        handler.where,
        handler.name,
        drop_in,
        "rename it to sort before the drop-in, or pass a --drop-in that containerd loads after it",
    )
    handler.apply(cri_copy, warnings)
    drop_after = _drop_in_text(
        handler,
        doc,
        cri_copy,
        config_path,
        drop_in,
        kept + [handler.name],
        [p for p, _ in before],
        warnings,
    )
    for other in _other_nvshim_imports(doc, config_path, drop_in):
        warnings.append(
            f"{config_path} also imports {other}, an nvshim drop-in from an earlier run; "
            f"{drop_in}, imported after it, now holds the handler: pass --drop-in {other} to "
            "keep using that one instead"
        )
    if empty:
        doc["version"] = handler.version
    if not covers(import_entries(doc, config_path), os.path.abspath(config_path), drop_in):
        if "imports" in doc:
            doc["imports"].append(drop_in)
        else:
            doc["imports"] = [drop_in]
    main_after = dump_toml(doc, main_text, config_path, warnings)
    return ConfigureResult(
        engine="containerd",
        handlers=tuple(sorted(kept + [handler.name])),
        version=handler.version,
        cri_plugin=cri_keys(handler.version)[1],
        handler_file=drop_in,
        files=(
            FileChange(drop_in, drop_in_text, drop_after),
            FileChange(config_path, main_text, main_after),
        ),
        written=(),
        warnings=tuple(warnings),
    )


def _drop_in_text(
    handler: _Handler,
    doc: Any,
    cri: Dict[str, Any],
    config_path: str,
    drop_in: str,
    names: List[str],
    sources: List[str],
    warnings: List[str],
) -> str:
    """The drop-in's text: its header comment, the version, and the plugins table holding
    the CRI table ``cri`` (and, with ``--enable-nri``, NRI's copied from the main file
    ``doc``)."""
    import tomlkit

    plugins_key, cri_key = cri_keys(handler.version)
    drop_doc = tomlkit.document()
    for line in _drop_in_header(config_path, names, sources).splitlines():
        drop_doc.add(tomlkit.comment(line[2:]))
    drop_doc.add(tomlkit.nl())
    drop_doc["version"] = handler.version
    plugins = tomlkit.table(is_super_table=True)
    plugins[cri_key] = cri
    if handler.enable_nri:
        _enable_nri(plugins, doc.get(plugins_key) or {}, handler.version, warnings)
    drop_doc[plugins_key] = plugins
    return dump_toml(drop_doc, None, drop_in, warnings)


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
    enable_nri: bool = False,
) -> ConfigureResult:
    """Add the runtime handler to containerd's config; see the module docstring.

    Writes only files whose text changes; the first time a file is changed its original
    bytes (or absence) go to :func:`backup_path` so ``revert`` can restore them.
    """
    config_path = os.path.abspath(config_path)
    main_text = read_text(config_path)
    main_doc = parse_toml(main_text or "", config_path)
    doc_version = detect_version(main_doc, config_path)
    drop_in = _resolve_drop_in(drop_in, doc_version, config_path)
    drop_in_text = read_text(drop_in) if drop_in else None
    chain = load_chain(config_path, main_doc, drop_in=drop_in)
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
        chain=chain,
        enable_nri=enable_nri,
    )
    # the drop-in before the main file that imports it
    return carry_out(plan, config_path, BACKUP_FORMAT, dry_run, name)
