"""Driver files made for another driver: what makes CDI edits stale, by any file they mount.

A spec generated for driver 535 still mounts ``…so.535.104.05`` files after the node moved
to 550 when the old files linger, and a container then runs the old userspace on the new
kernel module. :func:`driver_version_of` reads the driver version a file name carries (every
NVIDIA driver library is named ``<lib>.so.<driver version>``; links such as
``libcuda.so.1`` and libraries versioned on their own, such as
``libnvidia-egl-wayland.so.1.1.13``, carry none), and :func:`stale_reasons` says why
mounts and hooks were made for another driver: a versioned driver library, a library
folder mounted whole whose ``libcuda.so.1`` or ``libnvidia-ml.so.1`` link names another
version (one ``stat`` per mount that is no library, two ``readlink`` per folder: a folder
is never listed), GSP firmware of another
version, a hook's ``--host-driver-version``.

Both injection roads use it: the specs nvshim injects from (:func:`nvshim.cdi.index.stale_specs`)
and the edits the engine injected itself before nvshim ran (:func:`engine_stale`). The
module imports only ``os`` and ``stat``: it runs inside creates.
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

    from nvshim.config import Config
    from nvshim.edits import Hook, Mount

__all__ = ["driver_version_of", "engine_stale", "stale_reasons"]

#: Library names whose file is always ``<name>.so.<driver version>``, whatever the version's
#: shape (the first rule nvshim had; other driver libraries need a three-digit major).
_ALWAYS_VERSIONED = ("libcuda", "libnvidia-ml")
#: The links a driver's library folder holds, whose targets name the driver's version.
_FOLDER_LINKS = ("libcuda.so.1", "libnvidia-ml.so.1")
_HOOK_FLAG = "--host-driver-version"


def _is_version(text: str) -> bool:
    """``550.54.15``, ``550.54``: numbers with dots (``1``, a SONAME, is not one)."""
    parts = text.split(".")
    return len(parts) > 1 and all(p.isascii() and p.isdigit() for p in parts)


def driver_version_of(name: str) -> str:
    """The driver version the file ``name`` carries, "" when it carries none.

    NVIDIA's driver libraries (``libnv*``, ``libcuda*``, ``lib*_nvidia``) are named
    ``<lib>.so.<driver version>``; a driver version has a major of three digits or more,
    which tells it from a library's own version (``libnvidia-egl-wayland.so.1.1.13``,
    ``libnvidia-nvvm70.so.4``). libcuda and libnvidia-ml count with any dotted number.
    """
    base, sep, version = name.partition(".so.")
    if not sep or not _is_version(version):
        return ""
    if base in _ALWAYS_VERSIONED:
        return version
    if base.startswith(("libnv", "libcuda")) or base.endswith("_nvidia"):
        return version if len(version.split(".", 1)[0]) >= 3 else ""
    return ""


def _firmware_version(path: str) -> str:
    """``550.54.15`` for ``…/firmware/nvidia/550.54.15/gsp_ga10x.bin`` (or its folder)."""
    if "/firmware/" not in path:
        return ""
    parts = path.split("/")
    for i in range(1, len(parts) - 1):
        if parts[i] == "nvidia" and "firmware" in parts[:i] and _is_version(parts[i + 1]):
            return parts[i + 1]
    return ""


def _folder_version(path: str) -> Tuple[str, str]:
    """(link, target name) of the first driver link in the folder ``path`` whose target
    carries a version; ("", "") when ``path`` is no folder or holds none."""
    if ".so" in path.rsplit("/", 1)[-1]:
        return "", ""  # a library or its link: a file, never a folder
    try:
        if not stat.S_ISDIR(os.stat(path).st_mode):
            return "", ""
    except OSError:
        return "", ""  # missing: the missing-file check says; no permission: runc will
    for link in _FOLDER_LINKS:
        try:
            target = os.readlink(os.path.join(path, link))
        except OSError:
            continue
        name = target.rsplit("/", 1)[-1]
        if driver_version_of(name):
            return link, name
    return "", ""


def stale_reasons(
    mounts: Sequence[Mount], hooks: Sequence[Hook], driver_version: str
) -> List[Tuple[str, str]]:
    """Why ``mounts`` and ``hooks`` were made for another driver than ``driver_version``:
    [(reason, the mount's host path or "" for a hook)], the first of a versioned library,
    a folder, firmware, a hook (each says the same: the line stays short); empty when
    nothing says so."""
    found: Dict[str, Tuple[str, str]] = {}
    for mount in mounts:
        source = mount.host_path
        name = source.rsplit("/", 1)[-1]
        version = driver_version_of(name)
        if version and version != driver_version and "library" not in found:
            found["library"] = (f"it mounts {name}, the node's driver is {driver_version}", source)
        firmware = _firmware_version(source)
        if firmware and firmware != driver_version and "firmware" not in found:
            found["firmware"] = (
                f"it mounts {source}, firmware of driver {firmware}, the "
                f"node's driver is {driver_version}",
                source,
            )
        if version or firmware or found:
            continue
        link, target = _folder_version(source)
        if link and driver_version_of(target) != driver_version:
            found["folder"] = (
                f"it mounts {source} whole, whose {link} is {target}, the "
                f"node's driver is {driver_version}",
                source,
            )
    for hook in hooks:
        args = list(hook.args)
        for i, arg in enumerate(args):
            said = (
                args[i + 1]
                if arg == _HOOK_FLAG and i + 1 < len(args)
                else arg.partition("=")[2]
                if arg.startswith(_HOOK_FLAG + "=")
                else ""
            )
            if said and said != driver_version and "hook" not in found:
                found["hook"] = (
                    f"its hook says {_HOOK_FLAG} {said}, the node's driver is {driver_version}",
                    "",
                )
    return [found[k] for k in ("library", "folder", "firmware", "hook") if k in found][:1]


def _spec_of(config: Config, host_path: str) -> str:
    """The spec file of ``config``'s spec dirs that mounts ``host_path`` ("" when none):
    which spec the engine injected it from. A full scan: only a stale create needs it."""
    from nvshim.cdi.registry import load_registry

    for spec in load_registry(config.cdi_spec_dirs).specs:
        edits = [spec.edits, *(d.edits for d in spec.devices)]
        if any(m.host_path == host_path for e in edits for m in e.mounts):
            return spec.path
    return ""


def engine_stale(
    spec: Dict[str, Any],
    mounts: Sequence[Mount],
    config: Config,
    driver_version: Optional[str],
    fix: Callable[[str], str],
) -> Tuple[str, ...]:
    # Any: a decoded config.json
    """The ``stale-cdi-spec`` verdict on what the engine injected into config.json itself
    (``mounts``, the spec's own as the runtime reads them, and its hooks) before nvshim
    ran: one warning line under ``warn``, a :class:`~nvshim.errors.CdiError` under
    ``refuse``; () when it matches the node
    (``driver_version`` None: no driver to compare with). ``fix(spec path)`` ends the line
    when the spec is found in the config's spec dirs."""
    if driver_version is None:
        return ()
    from nvshim.edits import Hook

    hooks = []
    for entries in (
        (spec.get("hooks") or {}).values() if isinstance(spec.get("hooks"), dict) else ()
    ):
        for entry in entries if isinstance(entries, list) else ():
            args = entry.get("args") if isinstance(entry, dict) else None
            if isinstance(args, list) and all(isinstance(a, str) for a in args):
                hooks.append(Hook("createContainer", str(entry.get("path")), tuple(args)))
    reasons = stale_reasons(mounts, hooks, driver_version)
    if not reasons:
        return ()
    why = "; ".join(r for r, _ in reasons)
    path = next((_spec_of(config, p) for _, p in reasons if p), "")
    if path:
        line = (
            f"CDI spec {path}, which the engine injected, does not match this node "
            f"({why}): {fix(path)}"
        )
    else:
        searched = ", ".join(config.cdi_spec_dirs) or "no cdi-spec-dirs"
        line = (
            f"the CDI devices the engine injected do not match this node ({why}): "
            f"regenerate the engine's CDI spec (not found in {searched})"
        )
    if config.stale_cdi_spec == "refuse":
        from nvshim.errors import CdiError

        raise CdiError(f"{line} (stale-cdi-spec: refuse)")
    return (f"{line}; the engine injected it anyway (stale-cdi-spec: warn)",)
