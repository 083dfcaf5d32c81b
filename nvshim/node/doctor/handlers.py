"""``nvshim doctor``'s check that containerd keeps every runtime handler its files declare.

containerd before 2.1 replaces the CRI plugin table of an earlier file with a later
import's whole. A handler that the main file or a drop-in declares is then simply not
there: on a node that ``nvidia-ctk runtime configure`` set up (``conf.d/99-nvidia.toml``
with ``nvidia``, ``nvidia-cdi``, ``nvidia-legacy``), nvshim's drop-in as earlier releases
wrote it (a copy of the main file's table only), sorting after NVIDIA's, dropped all three,
and every pod with ``runtimeClassName: nvidia`` failed while containerd started fine.

``containerd-handlers`` fails naming each lost handler, the file that declares it and the
file whose table hid it. The fix, when that file is nvshim's drop-in, is
``nvshim runtime configure`` again with the flags it was written with (read back from the
drop-in: ``--name``, ``--binary``, ``--set-as-default``, ``--pod-cdi-annotations``,
``--enable-cdi``, ``--config``, ``--drop-in``), which merges every earlier table; for any
other file, carrying the earlier tables into it. containerd 2.1 and later merge the
tables key by key: when ``containerd --version`` says so, nothing is lost.

:func:`reconfigure_command` also gives ``containerd-drop-in`` (a stale copy) its fix.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from nvshim.errors import NvshimError
from nvshim.node.doctor.findings import DoctorOptions, Finding

TYPE_CHECKING = False
if TYPE_CHECKING:
    from nvshim.node.engines.containerd_read import EffectiveRuntimes

__all__ = ["check_lost_handlers", "reconfigure_command", "is_nvshim_drop_in"]

_CHECK = "containerd-handlers"
_DROP_IN_MARK = "Written by `nvshim runtime configure`"


def _plain_cri(path: str, version: int) -> Optional[Dict[str, Any]]:
    """The CRI table of the file at ``path`` as plain values (None: none, unreadable)."""
    from nvshim.node.engines.containerd_chain import Loaded, cri_tables
    from nvshim.node.engines.files import read_text

    text = read_text(path)
    if text is None:
        return None
    tables = cri_tables((Loaded(path, text, 1),), {}, version)
    return tables[0][1] if tables else None


def _nvshim_handler(
    cri: Dict[str, Any], options: DoctorOptions
) -> Optional[Tuple[str, Dict[str, Any]]]:
    """(name, table) of the handler in ``cri`` that runs nvshim."""
    from nvshim.node.doctor.findings import is_nvshim

    runtimes = (cri.get("containerd") or {}).get("runtimes") or {}
    for name, handler in runtimes.items():
        opts = handler.get("options") if isinstance(handler, dict) else None
        binary = opts.get("BinaryName") if isinstance(opts, dict) else None
        if is_nvshim(str(name), binary if isinstance(binary, str) else None, options):
            return str(name), handler
    return None


def reconfigure_command(
    config_path: str,
    drop_in: str,
    version: int,
    options: DoctorOptions,
    before: Optional[Dict[str, Any]] = None,
    binary: Optional[str] = None,
) -> str:
    """``nvshim runtime configure`` for containerd with the flags nvshim's ``drop_in`` was
    written with, so that running it changes nothing but the tables copied.

    ``before`` is the merged CRI table of the files loaded ahead of the drop-in (what
    configure copies): ``--enable-cdi`` is named only when the drop-in's ``enable_cdi``
    did not come from there. ``binary`` replaces the handler's BinaryName (a fix for a
    missing one).
    """
    from nvshim.node.engines.containerd_toml import (
        CDI_ANNOTATIONS,
        DEFAULT_BINARY,
        DEFAULT_CONFIG,
        DEFAULT_NAME,
        default_drop_in,
    )

    flags: List[str] = []
    if os.path.abspath(config_path) != DEFAULT_CONFIG:
        flags.append(f"--config {config_path}")
    if drop_in != default_drop_in(config_path):
        flags.append(f"--drop-in {drop_in}")
    cri = _plain_cri(drop_in, version) or {}
    found = _nvshim_handler(cri, options)
    if found is not None:
        name, handler = found
        if name != DEFAULT_NAME:
            flags.append(f"--name {name}")
        written = (handler.get("options") or {}).get("BinaryName")
        binary = binary or (written if isinstance(written, str) else None)
        if binary is not None and binary != DEFAULT_BINARY:
            flags.append(f"--binary {binary}")
        if (cri.get("containerd") or {}).get("default_runtime_name") == name:
            flags.append("--set-as-default")
        pod = handler.get("pod_annotations")
        if isinstance(pod, list) and all(a in pod for a in CDI_ANNOTATIONS):
            flags.append("--pod-cdi-annotations")
    if cri.get("enable_cdi") is True and (before or {}).get("enable_cdi") is not True:
        flags.append("--enable-cdi")
    return " ".join(["nvshim runtime configure --runtime containerd", *flags])


def is_nvshim_drop_in(path: str) -> bool:
    """The file at ``path`` is a drop-in ``nvshim runtime configure`` wrote."""
    from nvshim.node.engines.files import read_text

    text = read_text(path)
    return text is not None and _DROP_IN_MARK in text


def _merges(options: DoctorOptions) -> Optional[str]:
    """The containerd version text when it merges CRI tables key by key (2.1 and later)."""
    from nvshim.node.engines.containerd_read import containerd_version

    version = containerd_version(options.containerd_binary)
    if version is not None and version[:2] >= (2, 1):
        return version[2]
    return None


def check_lost_handlers(effective: EffectiveRuntimes, options: DoctorOptions) -> Finding:
    """Every handler a file of containerd's config declares is one containerd sees."""
    lost = {
        name: files for name, files in effective.declared.items() if name not in effective.handlers
    }
    total = len(effective.declared)
    if not lost:
        return Finding(
            _CHECK,
            "ok",
            f"containerd sees every runtime handler its "
            f"{len(effective.files)} file(s) declare ({total})",
        )
    merged_by = _merges(options)
    if merged_by is not None:
        return Finding(
            _CHECK,
            "ok",
            f"containerd {merged_by} merges the CRI tables of its "
            f"{len(effective.files)} file(s): it sees all {total} handlers",
        )
    hider = effective.cri_file or effective.config_path
    named = "; ".join(
        f'"{name}" (declared in {", ".join(files)})' for name, files in sorted(lost.items())
    )
    message = (
        f"containerd does not see runtime handler(s) {named}: {hider}, loaded after, "
        "has a CRI plugin table of its own without them, and containerd before 2.1 "
        "uses only the last file's table; pods whose RuntimeClass names them fail "
        "to start"
    )
    if is_nvshim_drop_in(hider):
        from nvshim.node.engines.containerd_chain import (
            cri_tables,
            load_chain,
            merged_cri,
            position,
        )
        from nvshim.node.engines.files import read_text, read_toml

        before: Optional[Dict[str, Any]] = None
        try:
            doc = read_toml(read_text(effective.config_path) or "", effective.config_path)
            chain = load_chain(effective.config_path, doc)
            at = position(chain, hider)
            before = merged_cri(cri_tables(chain.files[:at], doc, effective.version))
        except NvshimError:
            pass
        command = reconfigure_command(
            effective.config_path, hider, effective.version, options, before
        )
        return Finding(
            _CHECK,
            "fail",
            message,
            f"{command} (its drop-in then carries every earlier file's table), "
            "then restart containerd",
        )
    from nvshim.node.engines.containerd_toml import cri_label

    return Finding(
        _CHECK,
        "fail",
        message,
        f"copy the {cri_label(effective.version)} tables of the files loaded "
        f"before {hider} into it (containerd before 2.1 does not merge them), or "
        "move the handlers there; then restart containerd",
    )
