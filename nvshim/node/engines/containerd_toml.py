"""containerd's config as a TOML document: table lookup and edits, versions and imports.

The shared vocabulary of :mod:`nvshim.node.engines.containerd` (configure),
:mod:`nvshim.node.engines.containerd_revert` and
:mod:`nvshim.node.engines.containerd_read`. Documents are tomlkit's (parsed by
:func:`nvshim.node.engines.files.parse_toml`), so comments and layout survive an edit.
The CRI plugin's table depends on the config ``version`` (no file or an empty one counts
as version 2, a file without ``version`` as version 1): see :data:`CRI_PLUGINS`.
"""

from __future__ import annotations

import copy
import json
import os
import re
from typing import Any, List, Mapping, Optional, Tuple

from nvshim.config import DEFAULT_CDI_SPEC_DIRS
from nvshim.errors import ConfigError
from nvshim.node.engines.files import BOM
from nvshim.node.install.prefix import DEFAULT_RUNTIME_PATH

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_DROP_IN",
    "DROP_IN_NAME",
    "DEFAULT_NAME",
    "DEFAULT_BINARY",
    "DEFAULT_RUNTIME_NAME",
    "BACKUP_FORMAT",
    "CDI_ANNOTATIONS",
    "CDI_SPEC_DIRS",
    "CRI_PLUGINS",
    "dump_toml",
    "is_table",
    "lookup",
    "ensure_table",
    "set_key",
    "quote_key",
    "plain",
    "has_keys",
    "detect_version",
    "cri_keys",
    "cri_label",
    "import_entries",
    "resolve_import",
    "default_drop_in",
]

DEFAULT_CONFIG = "/etc/containerd/config.toml"
#: The drop-in's file name, in ``conf.d`` beside the main config (see :func:`default_drop_in`).
DROP_IN_NAME = "99-nvshim.toml"
DEFAULT_DROP_IN = "/etc/containerd/conf.d/" + DROP_IN_NAME
DEFAULT_NAME = "nvshim"
DEFAULT_BINARY = DEFAULT_RUNTIME_PATH
#: containerd's own default runtime handler when no file names one.
DEFAULT_RUNTIME_NAME = "runc"
#: Format tag of ``<config>.nvshim-orig.json`` for containerd.
BACKUP_FORMAT = "nvshim-containerd-backup/1"
#: Annotation patterns the handler passes to the runtime, so CDI requests reach nvshim.
CDI_ANNOTATIONS = ("cdi.k8s.io/*",)
CDI_SPEC_DIRS = DEFAULT_CDI_SPEC_DIRS
#: Name of the CRI plugin's table under ``plugins``, by config version.
CRI_PLUGINS: Mapping[int, str] = {
    1: "cri",
    2: "io.containerd.grpc.v1.cri",
    3: "io.containerd.cri.v1.runtime",
}


def _faithful(doc: Any, path: str, warnings: Optional[List[str]]) -> str:
    """``doc`` as tomlkit lays it out when that text means what ``doc`` holds; else ``doc``
    written afresh (comments and layout lost, with a warning).

    tomlkit misplaces a table added under one written with dotted keys inside a table
    (``[plugins]`` then ``"io.containerd.grpc.v1.cri".containerd.snapshotter = …``): the new
    header lacks the outer table's name, which would put nvshim's handler at the top level
    where containerd never looks, while configure reported success.
    """
    import tomllib

    import tomlkit

    text = tomlkit.dumps(doc)
    meant = plain(doc)
    if tomllib.loads(text) == meant:
        return text
    fresh = tomlkit.dumps(meant)
    if tomllib.loads(fresh) != meant:
        raise ConfigError(f"{path}: cannot write the edited TOML so that it means the same")
    if warnings is not None:
        warnings.append(
            f"{path}: rewritten without its comments and layout: tomlkit cannot "
            "add tables under its dotted keys in place"
        )
    return fresh


def dump_toml(
    doc: Any, before: Optional[str] = None, path: str = "", warnings: Optional[List[str]] = None
) -> str:
    """``doc`` as text; a changed file always ends in a newline, an unchanged one stays as is
    (a byte order mark that ``before`` starts with, which the parser skipped, included), and
    a file whose lines all end in CRLF keeps that for the lines added. The text is checked
    to mean what ``doc`` holds (see :func:`_faithful`); ``path`` names the file."""
    text = _faithful(doc, path, warnings)
    if before is not None and before.startswith(BOM):
        text = BOM + text
    if before and "\r\n" in before and before.count("\n") == before.count("\r\n"):
        # a CRLF file: tomlkit keeps the lines it parsed and ends the ones it adds with LF
        text = re.sub(r"(?<!\r)\n", "\r\n", text)
    if text != before and text and not text.endswith("\n"):
        text += "\r\n" if before and before.endswith("\r\n") else "\n"
    return text


def is_table(value: Any) -> bool:
    """Whether ``value`` is a TOML table (tomlkit's or a plain dict)."""
    return isinstance(value, Mapping)


def _sub(container: Any, key: str, label: str) -> Any:
    """``container[key]`` when it is a table, ``None`` when absent; ``label`` names it."""
    if key not in container:
        return None
    value = container[key]
    if not is_table(value):
        raise ConfigError(f"{label} is not a table")
    return value


def lookup(container: Any, keys: Tuple[str, ...], path: str) -> Any:
    """The table at ``keys`` under ``container``, or ``None`` when a part is missing."""
    current = container
    for depth, key in enumerate(keys, start=1):
        label = ".".join(quote_key(k) for k in keys[:depth])
        current = _sub(current, key, f"{path}: {label}" if path else label)
        if current is None:
            return None
    return current


def ensure_table(container: Any, key: str, label: str) -> Any:
    """The table ``container[key]``, created (header-less until it holds values) if missing."""
    import tomlkit
    from tomlkit.items import InlineTable

    table = _sub(container, key, label)
    if table is None:
        # an inline table (`plugins = {}`) can hold only inline tables
        inline = isinstance(container, InlineTable)
        container[key] = tomlkit.inline_table() if inline else tomlkit.table(is_super_table=True)
        table = container[key]
    return table


def set_key(table: Any, key: str, value: Any) -> None:
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


def quote_key(key: str) -> str:
    """``key`` as it is written in a dotted TOML path (quoted unless bare)."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def plain(value: Any) -> Any:
    """A deep copy of ``value`` as plain Python (dicts, lists), without tomlkit's layout."""
    unwrap = getattr(value, "unwrap", None)
    return copy.deepcopy(unwrap() if unwrap is not None else value)


def has_keys(doc: Any) -> bool:
    """Whether the document holds any key (an empty file counts as version 2)."""
    return len(doc) > 0


def detect_version(doc: Any, path: str) -> int:
    """The config ``version``: 2 for an empty document, 1 when unset; 1-3 or a ConfigError."""
    if not has_keys(doc):
        return 2
    if "version" not in doc:
        return 1
    version = plain(doc["version"])
    if not isinstance(version, int) or isinstance(version, bool) or version not in CRI_PLUGINS:
        raise ConfigError(
            f"{path}: unsupported containerd config version {json.dumps(version)}: "
            "nvshim knows versions 1, 2 and 3"
        )
    return int(version)


def cri_keys(version: int) -> Tuple[str, str]:
    """The keys of the CRI plugin's table for ``version``."""
    return ("plugins", CRI_PLUGINS[version])


def cri_label(version: int) -> str:
    """The CRI plugin's table as a dotted TOML path, for messages."""
    return "plugins." + quote_key(CRI_PLUGINS[version])


def import_entries(doc: Any, path: str) -> List[Any]:
    """The ``imports`` list of ``doc`` (empty when unset); a ConfigError when not a list."""
    if "imports" not in doc:
        return []
    entries = plain(doc["imports"])
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: imports is not a list")
    return entries


def resolve_import(entry: str, config_path: str) -> str:
    """An import entry as an absolute path: relative ones resolve next to the importing file."""
    if os.path.isabs(entry):
        return os.path.normpath(entry)
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(config_path)), entry))


def default_drop_in(config_path: str) -> str:
    """Where nvshim's drop-in goes for the main config ``config_path``: ``conf.d/99-nvshim.toml``
    beside it (install.sh's rule too), so a config outside /etc never writes /etc/containerd.

    The path is taken as given, not through symlinks: a config.toml linked to a managed
    copy elsewhere keeps its drop-in in the directory containerd reads it from.
    """
    return os.path.join(os.path.dirname(os.path.abspath(config_path)), "conf.d", DROP_IN_NAME)


def is_nvshim_handler(handler: Any) -> bool:
    """Whether a plain handler table runs an nvshim-runtime (``options.BinaryName``'s file
    name starts with ``nvshim``): one that ``runtime configure`` wrote."""
    options = handler.get("options") if isinstance(handler, dict) else None
    binary = options.get("BinaryName") if isinstance(options, dict) else None
    return isinstance(binary, str) and os.path.basename(binary).startswith("nvshim")
