"""Edits built from discovered host records: one description of what a GPU needs.

Runtime injection and ``nvshim cdi generate`` both build their edits here, so a container
created from a CDI spec and one created from the node's env get the same files; a
create's device tokens become edits here (:func:`inject_gpus`: the node's GPUs and MIG
devices they name, the driver files of the capabilities asked for, the requirements
checked against those GPUs). A create's CDI names become edits in
:mod:`nvshim.runtime.cdiedits`, which only such a create loads.
"""

from __future__ import annotations

import os

from nvshim._record import dataclass, field
from nvshim.config import describe_config
from nvshim.edits import HOOK_ENV, IPC_BIND, RO_BIND, DeviceNode, Edits, Hook, Mount
from nvshim.errors import RequestError

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import List, Optional, Sequence, Tuple

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


def hook_links(
    libraries: Sequence[Library], files: Sequence[DriverFile] = ()
) -> Tuple[Tuple[str, str], ...]:
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


def hook_for_libraries(
    libraries: Sequence[Library],
    hook_command: Sequence[str],
    files: Sequence[DriverFile] = (),
    dev_links: Sequence[Tuple[str, str]] = (),
    egl_profile: bool = False,
) -> Optional[Hook]:
    """The one createContainer hook: the links (:func:`hook_links`) and ld.so.cache
    entries for the injected library folders (``vdpau/`` is a plugin folder, not one);
    for graphics, the GPUs' ``/dev/dri/by-path`` links (``dev_links``, made for the nodes
    the container has) and the EGL application profile (``egl_profile``)."""
    if not hook_command or not (libraries or dev_links or egl_profile):
        return None
    from nvshim.runtime.hookargs import build_hook_args

    parents = (lib.container_path.rsplit("/", 1)[0] for lib in libraries)
    folders = tuple(dict.fromkeys(p for p in parents if not p.endswith("/vdpau")))
    version = next(
        (
            lib.container_path.rsplit("/libcuda.so.", 1)[1]
            for lib in libraries
            if "/libcuda.so." in lib.container_path
        ),
        None,
    )
    args = tuple(hook_command) + tuple(
        build_hook_args(hook_links(libraries, files), folders, version, dev_links, egl_profile)
    )
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
    return (
        f"the NVIDIA kernel module is {module} but the driver's files are {files}: "
        f"containers get the {files} libraries, which cannot talk to a {module} module "
        "until it is reloaded (reboot the node, or unload and load the nvidia modules)"
    )


def gpu_edits(gpu: Gpu, drm: Optional[DrmNodes] = None) -> Edits:
    """What one full GPU adds: its ``/dev/nvidia<minor>`` node, and its DRM card and render
    nodes when the capabilities get them (``drm``: :meth:`~nvshim.host.discovery.Host.drm`)."""
    nodes = ((gpu.node,) if gpu.node is not None else ()) + (drm.nodes if drm else ())
    return Edits(device_nodes=nodes) if nodes else Edits()


def mig_edits(parent: Gpu, mig: MigDevice) -> Edits:
    """What one MIG device adds: the parent's node and its GI/CI access capability nodes."""
    nodes = ((parent.node,) if parent.node is not None else ()) + tuple(mig.cap_nodes)
    return Edits(device_nodes=nodes)


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


def inject_gpus(
    host: Host, request: Request, tokens: Sequence[str], claim: Claim, config: Config
) -> GpuInjection:
    """The GPUs and MIG devices ``tokens`` name on this node, and their edits (discovery's,
    shared with ``nvshim cdi generate``); the requirements checked against them."""
    gpus = host.gpus()
    refs = tuple(g.ref() for g in gpus)
    from nvshim.host.devices import select_gpus

    try:
        chosen_refs, chosen_migs = (
            select_gpus(tokens, refs, _looked_under(config, host)) if tokens else ((), ())
        )
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
        # only then can there be a requirement (the module's import cost: BENCHMARKS.md, figures)
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
    edits = driver_edits(
        host.control_nodes(caps),
        libraries,
        files,
        hook_command(),
        dev_links=dev_links,
        egl_profile=bool(drm),
    )
    missing = missing_files(caps, libraries, files)
    for gpu in chosen:
        nodes = nodes_of.get(gpu.index)
        edits = edits + gpu_edits(gpu, nodes)
        if nodes is not None:  # a headless GPU: the container starts, inspect says so
            from nvshim.host.drm import missing_drm

            missing += missing_drm(drm, ((gpu.index, nodes),))
    for parent, mig in migs:
        edits = edits + mig_edits(parent, mig)
    return GpuInjection(chosen, tuple(migs), edits, missing, (*notes, *warnings), warnings)


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
