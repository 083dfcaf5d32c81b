"""A create's CDI names, and the CDI edits an engine injected, as edits this container may get.

:func:`inject_cdi` resolves the names in one call (as CDI's ``InjectDevices``) from the
spec index, refuses what nvshim cannot apply or this node does not have, says or refuses
a spec made for another driver (``stale-cdi-spec``; :func:`engine_stale` for what the
engine injected itself) and cuts the driver files to the capabilities the container asked
for (:func:`restrict_to_capabilities`: CDI specs carry every file they were generated
with). A create whose devices are tokens (``NVIDIA_VISIBLE_DEVICES=0``) never loads this
module: its edits come from :mod:`nvshim.runtime.hostedits`, built from the same host
records ``nvshim cdi generate`` writes into specs.
"""

from __future__ import annotations

import os

from nvshim._record import dataclass
from nvshim.config import describe_config
from nvshim.edits import Edits, Hook

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Any, Dict, Optional, Sequence, Tuple

    from nvshim.config import Config
    from nvshim.host.discovery import Host

__all__ = ["CdiInjection", "engine_stale", "inject_cdi", "refresh_fix", "restrict_to_capabilities"]


#: :func:`_capabilities_of`'s answers (a pure function of the name and constant tables): a
#: resident agent classifies each spec's files once, not on every create.
_OWNERS: Dict[str, Tuple[str, ...]] = {}


def _capabilities_of(basename: str) -> Tuple[str, ...]:
    """The library sets or capabilities a driver file belongs to (none: not a known one)."""
    found = _OWNERS.get(basename)
    if found is None:
        if len(_OWNERS) >= 4096:  # names of many driver versions: start again
            _OWNERS.clear()
        found = _OWNERS[basename] = _classify(basename)
    return found


def _classify(basename: str) -> Tuple[str, ...]:
    from nvshim.host.capabilities import BINARIES, DATA_FILES, LIBRARIES

    owners = [
        libset
        for libset, bases in LIBRARIES.items()
        if any(basename.startswith(base + ".so") for base in bases)
    ]
    owners += [cap for cap, names in BINARIES.items() if basename in names]
    for cap, _, paths in DATA_FILES:
        for path in paths:
            name = path.rsplit("/", 1)[1]
            stem, versioned, _ = name.partition("{version}")  # libglxserver_nvidia.so.{…}
            if basename == name or (versioned and basename.startswith(stem)):
                owners.append(cap)
    return tuple(dict.fromkeys(owners))


def restrict_to_capabilities(edits: Edits, capabilities: Sequence[str]) -> Edits:
    """Drop driver files and nodes of capabilities the container did not ask for (a known
    driver library in a 32-bit folder also needs ``compat32``).

    CDI specs carry every driver file they were generated with; the reference injects all
    of them. We keep only what NVIDIA_DRIVER_CAPABILITIES selects (unknown files are
    kept), and prune hook ``--link`` pairs whose target is no longer injected (and the
    hook's ``/dev`` links and EGL profile unless graphics or display is asked for).
    """
    from nvshim.host.capabilities import CONTROL_NODES, LIBRARY_SETS, wants_drm

    caps = set(capabilities)
    allowed_sets = {s for cap in caps for s in LIBRARY_SETS.get(cap, ())} | caps
    node_needs = {path: need for path, need in CONTROL_NODES}
    drm = wants_drm(caps)
    nodes = tuple(
        n
        for n in edits.device_nodes
        if (node_needs.get(n.path) is None or node_needs[n.path] in caps)
        and (drm or not n.path.startswith("/dev/dri/"))
    )
    from nvshim.host.compat32 import is_lib32_path

    mounts = []
    for m in edits.mounts:
        owners = _capabilities_of(m.container_path.rsplit("/", 1)[-1])
        if owners and "compat32" not in caps and is_lib32_path(m.container_path):
            continue  # a 32-bit copy: only compat32 asks for those
        if not owners or any(owner in allowed_sets for owner in owners):
            mounts.append(m)
    present = {m.container_path for m in mounts}
    from nvshim.runtime.hookargs import runs_nvshim_hook

    hooks = []
    for hook in edits.hooks:
        if not runs_nvshim_hook(hook.args):
            hooks.append(hook)
            continue
        hooks.extend(_prune_hook(hook, present, drm))
    return Edits(edits.env, nodes, tuple(mounts), tuple(hooks), edits.additional_gids)


def _prune_hook(hook: Hook, present: set[str], graphics: bool) -> Tuple[Hook, ...]:
    """nvshim's hook without links to files that are not injected (``present``: the
    container paths mounted; nothing left to do: no hook), and without its ``/dev`` links
    and EGL profile unless ``graphics``. Compared by path, not name: a 64-bit and a 32-bit
    library share their file names."""
    import posixpath

    from nvshim.runtime.hookargs import parse_graphics_args, parse_hook_args, with_links

    links, _ = parse_hook_args(hook.args)
    paths = set(present)
    kept: list[Tuple[str, str]] = []
    changed = True
    while changed:  # a link may point at another link (libcuda.so -> libcuda.so.1)
        changed = False
        for target, link in links:
            # the file the link names: a relative target lies beside the link
            path = posixpath.normpath(posixpath.join(posixpath.dirname(link), target))
            if (target, link) not in kept and path in paths:
                kept.append((target, link))
                paths.add(link)
                changed = True
    dev_links, egl = parse_graphics_args(hook.args)
    if not any(".so" in p.rsplit("/", 1)[-1] for p in present) and not (
        graphics and (dev_links or egl)
    ):
        return ()
    kept_sorted = [pair for pair in links if pair in kept]
    return (
        Hook(
            hook.hook_name,
            hook.path,
            tuple(with_links(hook.args, kept_sorted, graphics)),
            hook.env,
            hook.timeout,
        ),
    )


@dataclass(frozen=True)
class CdiInjection:
    """What :func:`inject_cdi` decided: the edits, where the registry came from (the spec
    index, or a scan and why), and the ``stale-cdi-spec: warn`` lines (a note for
    ``inspect`` and a warning for runc's ``--log`` each)."""

    edits: Edits
    source: str
    warnings: Tuple[str, ...] = ()


def inject_cdi(
    names: Sequence[str],
    config: Config,
    capabilities: Sequence[str],
    node: Host,
    save: bool = False,
    paths: Optional[Host] = None,
) -> CdiInjection:
    """The edits the CDI devices ``names`` give a container on this node, in one call (as
    CDI's ``InjectDevices``).

    The registry comes from the spec index (only the names' kinds loaded; written back
    when stale and ``save``); unknown names are one :class:`CdiError` naming the config;
    edits setting a field nvshim cannot apply are refused; so is a spec that would
    bind-mount a file this node does not have (the old driver's libraries after an upgrade:
    runc would fail on it), whatever ``stale-cdi-spec`` says; a spec made for another
    driver or other device nodes than ``node``'s is said or refused (``stale-cdi-spec``);
    device nodes get their type and numbers from the host nodes, stat'ed through
    ``paths`` (a :class:`~nvshim.host.discovery.Host` of the machine's ``/``, since CDI
    host paths are absolute; one is made when None); driver files are cut to
    ``capabilities``.
    """
    from nvshim.cdi import index as cdiindex
    from nvshim.cdi.registry import fill_device_nodes, refuse_unapplied, resolve_devices
    from nvshim.config import cdi_index_path, config_path
    from nvshim.errors import CdiError, HostError

    registry, source = cdiindex.registry_for(
        config.cdi_spec_dirs, names, cdi_index_path(config.source or config_path()), save
    )
    try:
        edits = resolve_devices(registry, names)
    except CdiError as exc:
        raise CdiError(f"{exc} ({describe_config(config)})") from exc
    refuse_unapplied(registry, names)
    edits = restrict_to_capabilities(edits, capabilities)
    missing = cdiindex.missing_mounts(registry, names, edits.mounts)
    if missing is not None:  # runc would fail on it anyway, with a worse message
        spec, files = missing
        more = f" (and {len(files) - 1} more)" if len(files) > 1 else ""
        raise CdiError(
            f"CDI spec {spec} mounts {files[0]}, which this node does not have"
            f"{more}: the spec is older than the driver; {refresh_fix(config, spec)}"
        )
    try:
        version: Optional[str] = node.driver_version()
    except HostError:
        version = None  # no driver under the root: there is nothing to compare with
    warnings = []
    for line in cdiindex.stale_specs(registry, names, version, lambda p: refresh_fix(config, p)):
        if config.stale_cdi_spec == "refuse":
            raise CdiError(f"{line} (stale-cdi-spec: refuse)")
        warnings.append(f"{line}; injected anyway (stale-cdi-spec: warn)")
    if paths is None:
        from nvshim.host.discovery import Host

        paths = Host("/", "/")
    return CdiInjection(fill_device_nodes(edits, paths), source, tuple(warnings))


def engine_stale(spec: Dict[str, Any], config: Config, node: Host) -> Tuple[str, ...]:
    # Any: a decoded config.json
    """``stale-cdi-spec`` on what the engine injected itself (its CDI mounts and hooks in
    ``spec``, config.json as the engine wrote it), against ``node``'s driver: the warning
    lines (:func:`nvshim.cdi.stale.engine_stale`; a CdiError under ``refuse``)."""
    from nvshim.cdi.stale import engine_stale as judge
    from nvshim.errors import HostError
    from nvshim.runtime.engine import spec_mounts

    try:
        version: Optional[str] = node.driver_version()
    except HostError:
        version = None  # no driver under the root: there is nothing to compare with
    return judge(spec, spec_mounts(spec), config, version, lambda p: refresh_fix(config, p))


def refresh_fix(config: Config, spec: str, driver_root: Optional[str] = None) -> str:
    """How to make the spec at ``spec`` current: ``run nvshim cdi refresh`` when the config's
    ``cdi-refresh`` keeps it, else regenerate it with ``nvshim cdi generate --output`` (with
    ``--driver-root`` when the checked ``driver_root`` is not the config's). The one fix text
    of the create, doctor and ``cdi generate --check``. Only a failing or warning create
    calls it (shlex costs an import)."""
    import shlex

    from nvshim.cdi.index import regenerate_fix

    for entry in config.cdi_refresh:
        try:
            args = shlex.split(entry)
        except ValueError:
            continue  # nvshim cdi refresh says what is wrong with the entry
        for i, arg in enumerate(args):
            if arg in ("--output", "-o"):
                value = args[i + 1] if i + 1 < len(args) else None
            elif arg.startswith("--output="):
                value = arg.split("=", 1)[1]
            else:
                value = arg[2:] if arg.startswith("-o") else None
            if value == spec:
                return "run nvshim cdi refresh"
    other_root = driver_root is not None and os.path.abspath(driver_root) != os.path.abspath(
        config.driver_root
    )
    return regenerate_fix(spec, driver_root if other_root and driver_root else "")
