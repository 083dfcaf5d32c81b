"""The guard on the config a default runtime reads: require-allocation on, never blank.

A default runtime runs every container of its engine, GPU request or not, and nvshim there
grants a CUDA image's ``NVIDIA_VISIBLE_DEVICES=all`` unless require-allocation is on. So
every path that changes the config a default runtime reads refuses one without
``require-allocation: true``, and refuses a file that holds no settings at all (empty, or
only comments and blank lines: read as the built-in defaults) the same way, keeping the
previous config:

* ``install.sh --set-as-default`` compiles with ``--default-runtime``, which also writes
  the mark (:func:`nvshim.config.default_mark_path`, ``config.default-runtime`` beside the
  YAML; uninstall removes it);
* ``nvshim config compile`` applies the guard whenever the mark is there;
* the DaemonSet installer checks a new ConfigMap (``nvshim config compile --check``) before
  it replaces the node's config, with ``--default-runtime`` when it made nvshim the default
  or the mark is there.

``nvshim doctor`` says in one line when the mark is there and the config has
require-allocation off (an edit by hand after the install).
"""

from __future__ import annotations

import os

from nvshim.config import Config, default_mark_path
from nvshim.errors import ConfigError
from nvshim.files import read_bytes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

__all__ = ["is_blank", "marked_default", "guard_default", "write_mark", "MARK_TEXT"]

MARK_TEXT = (
    "# Written by nvshim config compile --default-runtime (install.sh --set-as-default):\n"
    "# a default runtime reads the config beside this file, so every compile refuses\n"
    "# it without require-allocation: true. Removed by install.sh --uninstall.\n"
)


def is_blank(data: bytes) -> bool:
    """Whether the YAML holds nothing: empty, or only comments, blank lines and document
    markers, or a lone null (what the config reads as the built-in defaults)."""
    import yaml

    try:
        node = yaml.compose(data, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return False  # not blank: the parse reports it
    return node is None or node.tag == "tag:yaml.org,2002:null"


def marked_default(path: str) -> bool:
    """Whether the mark says a default runtime reads ``path``."""
    return os.path.lexists(default_mark_path(path))


def guard_default(path: str, data: bytes, config: Config, why: Optional[str] = None) -> None:
    """Refuse ``path`` (its bytes ``data``, parsed to ``config``) as the config of a default
    runtime: blank, or require-allocation off. ``why`` says who made it the default."""
    why = why or f"marked by {default_mark_path(path)}"
    if is_blank(data):
        raise ConfigError(
            f"config {path} holds no settings (only comments or blank lines), the same as an "
            f"empty file: refused, nvshim is a default runtime ({why}) and the built-in "
            "defaults have require-allocation off; set require-allocation: true in it"
        )
    if not config.require_allocation:
        raise ConfigError(
            f"config {path} has require-allocation off: refused, nvshim is a default runtime "
            f"({why}) and pods that request no GPU would get every GPU from CUDA images' "
            "NVIDIA_VISIBLE_DEVICES=all; set require-allocation: true in it"
        )


def write_mark(path: str) -> str:
    """Write the mark beside ``path`` (root's, 0644); return its path."""
    from nvshim.files import write_atomic

    mark = default_mark_path(path)
    if read_bytes(mark) != MARK_TEXT.encode():
        write_atomic(mark, MARK_TEXT.encode(), default_mode=0o644)
    os.chmod(mark, 0o644)
    return mark
