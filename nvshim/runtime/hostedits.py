"""Edits built from discovered host records: one description of what a GPU needs.

Runtime injection and ``nvshim cdi generate`` both build their edits here, so a container
created from a CDI spec and one created from the node's env get the same files; and a
create's CDI names become edits here too, in one call (:func:`inject_cdi`), cut to the
capabilities the container asked for (:func:`restrict_to_capabilities`), and so do its
device tokens (:func:`inject_gpus`: the node's GPUs and MIG devices they name, the driver
files of the capabilities asked for, the requirements checked against those GPUs).
"""

from __future__ import annotations

import os

from nvshim._record import dataclass, field
from nvshim.config import describe_config
from nvshim.edits import HOOK_ENV, IPC_BIND, RO_BIND, DeviceNode, Edits, Hook, Mount
from nvshim.errors import RequestError

TYPE_CHECKING = False  # typing costs ~4 ms to import on the create path
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence, Tuple

    from nvshim.config import Config
    from nvshim.host.devices import MigDevice
    from nvshim.host.discovery import DriverFile, Gpu, Host, Library
    from nvshim.host.drm import DrmNodes

    Migs = Tuple[Tuple[Gpu, MigDevice], ...]
    """(parent GPU, MIG device) pairs."""
    from nvshim.runtime.claim import Claim
    from nvshim.runtime.request import Request


#: Links the reference makes whatever the driver folder has, by library: (the target — the
#: library's ``file`` or its ``soname`` —, the link's name beside it).
EXTRA_LINKS = {
    "libcuda": ("soname", "libcuda.so"),  # many programs dlopen libcuda.so
    "libGLX_nvidia": ("file", "libGLX_indirect.so.0"),  # glvnd's indirect GLX (Xvfb, VNC)
    "libnvidia-opticalflow": ("soname", "libnvidia-opticalflow.so"),  # what the SDK opens
    "libnvidia-vulkan-producer": ("file", "libnvidia-vulkan-producer.so"),
}


def hook_links(libraries: Sequence[Library],
               files: Sequence[DriverFile] = ()) -> Tuple[Tuple[str, str], ...]:
    """The links the container needs, as (target, link) pairs: SONAME links beside each
    library, and the unversioned ``.so`` link where the driver's folder has one
    (:attr:`~nvshim.host.driverfiles.Library.dev_link`); the links the reference always
    makes (:data:`EXTRA_LINKS`: ``libcuda.so``, ``libGLX_indirect.so.0``,
    ``libnvidia-opticalflow.so``, ``libnvidia-vulkan-producer.so``); GBM's
    ``<libdir>/gbm/nvidia-drm_gbm.so`` to the allocator when graphics libraries come with
    it; ``libglxserver_nvidia.so`` beside the Xorg module."""
    links: list[Tuple[str, str]] = []
    allocator = None
    graphics = False
    for lib in libraries:
        directory, filename = lib.container_path.rsplit("/", 1)
        if lib.soname and lib.soname != filename:
            links.append((filename, f"{directory}/{lib.soname}"))
        extra = EXTRA_LINKS.get(lib.base)
        if extra is not None:
            target = {"file": filename, "soname": lib.soname or filename}[extra[0]]
            links.append((target, f"{directory}/{extra[1]}"))
        if lib.dev_link and lib.dev_link != lib.soname:
            links.append((lib.soname or filename, f"{directory}/{lib.dev_link}"))
        if lib.base == "libnvidia-allocator" and lib.soname and lib.capability != "compat32":
            allocator = f"{directory}/{lib.soname}"
        graphics = graphics or lib.capability == "graphics"
    if allocator is not None and graphics:
        import posixpath

        from nvshim.host.capabilities import system_libdir

        gbm = f"{system_libdir(allocator.rsplit('/', 1)[0])}/gbm"
        links.append((posixpath.relpath(allocator, gbm), f"{gbm}/nvidia-drm_gbm.so"))
    for f in files:
        directory, filename = f.container_path.rsplit("/", 1)
        if filename.startswith("libglxserver_nvidia.so."):
            links.append((filename, f"{directory}/libglxserver_nvidia.so"))
    made: dict[str, str] = {}
    for target, link in links:  # one target per link: the first (libcuda.so's is the SONAME)
        made.setdefault(link, target)
    return tuple((target, link) for link, target in made.items())


def hook_for_libraries(libraries: Sequence[Library], hook_command: Sequence[str],
                       files: Sequence[DriverFile] = (),
                       dev_links: Sequence[Tuple[str, str]] = (),
                       egl_profile: bool = False) -> Optional[Hook]:
    """The one createContainer hook: the links (:func:`hook_links`) and ld.so.cache
    entries for the injected library folders (``vdpau/`` is a plugin folder, not one);
    for graphics, the GPUs' ``/dev/dri/by-path`` links (``dev_links``, made for the nodes
    the container has) and the EGL application profile (``egl_profile``)."""
    if not hook_command or not (libraries or dev_links or egl_profile):
        return None
    from nvshim.runtime.hookargs import build_hook_args

    parents = (lib.container_path.rsplit("/", 1)[0] for lib in libraries)
    folders = tuple(dict.fromkeys(p for p in parents if not p.endswith("/vdpau")))
    version = next((lib.container_path.rsplit("/libcuda.so.", 1)[1] for lib in libraries
                    if "/libcuda.so." in lib.container_path), None)
    args = tuple(hook_command) + tuple(
        build_hook_args(hook_links(libraries, files), folders, version, dev_links,
                        egl_profile))
    return Hook("createContainer", hook_command[0], args, HOOK_ENV)


def driver_edits(
    control_nodes: Sequence[DeviceNode],
    libraries: Sequence[Library],
    files: Sequence[DriverFile],
    hook_command: Sequence[str] = (),
    env: Sequence[str] = ("NVIDIA_VISIBLE_DEVICES=void",),
    dev_links: Sequence[Tuple[str, str]] = (),
    egl_profile: bool = False,
) -> Edits:
    """What every GPU container of a node needs: control nodes, driver files, the hook.

    ``libraries`` are :class:`nvshim.host.discovery.Library`, ``files`` are
    :class:`nvshim.host.discovery.DriverFile`; both carry host and container paths.
    ``dev_links`` and ``egl_profile``: see :func:`hook_for_libraries` (graphics, display).
    """
    mounts = [Mount(lib.host_path, lib.container_path, None, RO_BIND) for lib in libraries]
    for f in files:
        options = IPC_BIND if f.kind == "ipc" else RO_BIND
        mounts.append(Mount(f.host_path, f.container_path, None, options))
    hook = hook_for_libraries(libraries, hook_command, files, dev_links, egl_profile)
    return Edits(
        env=tuple(env),
        device_nodes=tuple(control_nodes),
        mounts=tuple(mounts),
        hooks=(hook,) if hook else (),
    )


def skew_message(module: str, files: str) -> str:
    """The one line a version skew gets (create warning, ``doctor``, ``inspect``)."""
    return (f"the NVIDIA kernel module is {module} but the driver's files are {files}: "
            f"containers get the {files} libraries, which cannot talk to a {module} module "
            "until it is reloaded (reboot the node, or unload and load the nvidia modules)")


def gpu_edits(gpu: Gpu, drm: Optional[DrmNodes] = None) -> Edits:
    """What one full GPU adds: its ``/dev/nvidia<minor>`` node, and its DRM card and render
    nodes when the capabilities get them (``drm``: :meth:`~nvshim.host.discovery.Host.drm`)."""
    nodes = ((gpu.node,) if gpu.node is not None else ()) + (drm.nodes if drm else ())
    return Edits(device_nodes=nodes) if nodes else Edits()


def mig_edits(parent: Gpu, mig: MigDevice) -> Edits:
    """What one MIG device adds: the parent's node and its GI/CI access capability nodes."""
    nodes = ((parent.node,) if parent.node is not None else ()) + tuple(mig.cap_nodes)
    return Edits(device_nodes=nodes)


def _capabilities_of(basename: str) -> Tuple[str, ...]:
    """The library sets or capabilities a driver file belongs to (none: not a known one)."""
    from nvshim.host.capabilities import BINARIES, DATA_FILES, LIBRARIES

    owners = [libset for libset, bases in LIBRARIES.items()
              if any(basename.startswith(base + ".so") for base in bases)]
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
        n for n in edits.device_nodes
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
            graphics and (dev_links or egl)):
        return ()
    kept_sorted = [pair for pair in links if pair in kept]
    return (Hook(hook.hook_name, hook.path,
                 tuple(with_links(hook.args, kept_sorted, graphics)), hook.env, hook.timeout),)


@dataclass(frozen=True)
class CdiInjection:
    """What :func:`inject_cdi` decided: the edits, where the registry came from (the spec
    index, or a scan and why), and the ``stale-cdi-spec: warn`` lines (a note for
    ``inspect`` and a warning for runc's ``--log`` each)."""

    edits: Edits
    source: str
    warnings: Tuple[str, ...] = ()


def inject_cdi(names: Sequence[str], config: Config, capabilities: Sequence[str], node: Host,
               save: bool = False, paths: Optional[Host] = None) -> CdiInjection:
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
        config.cdi_spec_dirs, names, cdi_index_path(config.source or config_path()), save)
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
        raise CdiError(f"CDI spec {spec} mounts {files[0]}, which this node does not have"
                       f"{more}: the spec is older than the driver; {refresh_fix(config, spec)}")
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


def refresh_fix(config: Config, spec: str) -> str:
    """How to make the spec at ``spec`` current: ``run nvshim cdi refresh`` when the config's
    ``cdi-refresh`` keeps it, else regenerate it with ``nvshim cdi generate --output``.
    Only a failing or warning create calls it (shlex costs an import)."""
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
    return regenerate_fix(spec)


# --- a create's device tokens: the node's GPUs and MIG devices ----------------------------


@dataclass(frozen=True)
class GpuInjection:
    """What the node's GPUs give a container asking by device token (or for driver files):
    :func:`inject_gpus`'s answer."""

    gpus: Tuple[Gpu, ...] = ()
    migs: Migs = ()
    edits: Edits = field(default_factory=Edits)
    missing: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()
    warnings: Tuple[str, ...] = ()


def inject_gpus(host: Host, request: Request, tokens: Sequence[str], claim: Claim,
                config: Config) -> GpuInjection:
    """The GPUs and MIG devices ``tokens`` name on this node, and their edits (discovery's,
    shared with ``nvshim cdi generate``); the requirements checked against them."""
    gpus = host.gpus()
    refs = tuple(g.ref() for g in gpus)
    from nvshim.host.devices import select_gpus

    try:
        chosen_refs, chosen_migs = (select_gpus(tokens, refs, _looked_under(config, host))
                                    if tokens else ((), ()))
    except RequestError as exc:
        if refs or os.path.isdir(host.driver_root):
            raise
        # no GPU at all under a driver root that is not there: most likely a typo
        raise RequestError(f"{exc}; driver root {host.driver_root} does not exist") from None
    by_index = {g.index: g for g in gpus}
    chosen = tuple(by_index[r.index] for r in chosen_refs)
    migs = []
    for m in chosen_migs:
        parent = by_index[m.gpu_index]
        migs.append((parent, next(x for x in parent.mig if x.uuid == m.uuid)))

    notes: List[str] = []
    caps = request.capabilities
    env = claim.view.env
    if "CUDA_VERSION" in env or any(name.startswith("NVIDIA_REQUIRE_") for name in env):
        # only then can there be a requirement (the module costs ~2 ms to import)
        from nvshim.runtime.requirements import check_requirements

        selected = chosen + tuple(parent for parent, _ in migs)
        check_requirements(claim.view, host, selected, notes, config.disable_require)

    from nvshim.runtime.hookargs import hook_command  # a create naming no device never loads it

    skew = host.version_skew()
    warnings = (skew_message(*skew),) if skew is not None else ()
    libraries, files = host.libraries(caps), host.driver_files(caps)
    from nvshim.host.capabilities import drm_capabilities, missing_files

    drm = drm_capabilities(caps)  # DRM nodes only for the capabilities that get them
    nodes_of = {gpu.index: host.drm(gpu) for gpu in chosen} if drm else {}
    dev_links = tuple(link for nodes in nodes_of.values() for link in nodes.links)
    edits = driver_edits(host.control_nodes(caps), libraries, files, hook_command(),
                         dev_links=dev_links, egl_profile=bool(drm))
    missing = missing_files(caps, libraries, files)
    for gpu in chosen:
        nodes = nodes_of.get(gpu.index)
        edits = edits + gpu_edits(gpu, nodes)
        if nodes is not None:  # a headless GPU: the container starts, inspect says so
            from nvshim.host.drm import missing_drm

            missing += missing_drm(drm, ((gpu.index, nodes),))
    for parent, mig in migs:
        edits = edits + mig_edits(parent, mig)
    return GpuInjection(chosen, tuple(migs), edits, missing,
                      (*notes, *warnings), warnings)


def _looked_under(config: Config, host: Host) -> str:
    """Where a create looked for GPUs: ``under driver root / (config /etc/nvshim/config.yaml)``."""
    return f"under driver root {host.driver_root} ({describe_config(config)})"


def gpus_of_edits(host: Host, edits: Edits) -> Tuple[Tuple[Gpu, ...], Migs]:
    """(whole GPUs, (parent, MIG device) pairs) whose device nodes the edits inject.

    A MIG device is granted when all its capability nodes are; its parent's node then
    belongs to the MIG device, not to a whole-GPU grant.
    """
    from nvshim.runtime.engine import gpus_of_numbers

    numbers = {(n.major, n.minor or 0) for n in edits.device_nodes if n.major is not None}
    return gpus_of_numbers(host.gpus(), numbers)
