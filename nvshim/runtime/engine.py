"""What the engine already injected: GPUs in config.json before nvshim runs, and their hooks.

containerd 1.7+ and CRI-O inject the CDI devices the kubelet names (a device plugin's CDI
strategy, Kubernetes DRA), podman and Docker those of ``--device nvidia.com/gpu=N``, before
they call the runtime: the spec nvshim reads already holds ``/dev/nvidiaN``, its cgroup rule,
driver mounts and hooks. That injection is the container's grant, source ``engine``: create
records it in the grant journal, ``inspect`` shows it, ``verify-with: kubelet`` checks it,
and image env never widens it (:func:`nvshim.runtime.request.resolve_request`).

Recognised by number, never by path text: a character device in ``linux.devices`` whose
major is the NVIDIA driver's (``/proc/devices`` under the driver root: ``nvidia-frontend``
or ``nvidia``, ``nvidia-caps``, ``nvidia-caps-imex-channels``) and whose minor is one of
the node's GPUs, both capabilities of a MIG device, or an IMEX channel. Loaded only for a
spec with character devices (:attr:`~nvshim.runtime.claim.ImageView.char_devices`); one
read of ``/proc/devices`` decides whether the node plan is needed at all.

Also here, because only such specs need it: which edits the spec already carries
(:func:`without_present`: a mount or device node the engine put there is not added twice),
and the in-root hooks it carries (:func:`engine_hooks`): nvshim's own, or NVIDIA's
``nvidia-cdi-hook``/``nvidia-ctk hook`` ones. A hook whose binary this node lacks would make
runc fail the create; it is replaced by nvshim's in-root work (links, ld.so.cache, CUDA
compat, ``ModifyDeviceFiles: 0``), done by the runtime or by nvshim's hook.

Why one module: it holds what only a spec the engine already put devices or hooks into needs
(the grant read by device number, the edits already present, the hooks kept or replaced),
and is imported as one for such specs only. Split, such a create would load two modules, and
any other create would gain nothing.
"""

from __future__ import annotations

import os
import posixpath

from nvshim._record import dataclass
from nvshim.edits import Edits, Hook, Mount

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

    from nvshim.config import Config
    from nvshim.edits import DeviceNode
    from nvshim.host.devices import MigDevice
    from nvshim.host.discovery import Gpu, Host

    #: A decoded config.json object: JSON values of any shape (Any: nvshim keeps what it
    #: does not edit, unknown fields included, so the dict is never typed further).
    SpecDict = Dict[str, Any]

__all__ = [
    "EngineGrant",
    "char_majors",
    "EngineHooks",
    "engine_hooks",
    "find_engine_grant",
    "privileged_holding",
    "fit_edits",
    "gpus_of_numbers",
    "nvidia_majors",
    "spec_mounts",
    "without_hooks",
    "without_present",
]

_GPU_NAMES = ("nvidia-frontend", "nvidia")
_CAPS_NAME = "nvidia-caps"
_IMEX_NAME = "nvidia-caps-imex-channels"
#: Minors of the driver's control nodes on the GPU major (nvidiactl, nvidia-modeset).
_CONTROL_MINORS = (255, 254)


@dataclass(frozen=True)
class EngineGrant:
    """GPUs (discovery :class:`~nvshim.host.discovery.Gpu`), (parent, MIG device) pairs and
    IMEX channel numbers whose device nodes the engine put in config.json, and one note per
    device saying so."""

    gpus: Tuple[Gpu, ...] = ()
    migs: Tuple[Tuple[Gpu, MigDevice], ...] = ()
    imex: Tuple[int, ...] = ()
    notes: Tuple[str, ...] = ()
    privileged: bool = False
    """A privileged container's: every host device is in its spec and its device cgroup
    allows all (:func:`privileged_holding`). It is journaled, not a grant: the request,
    verification and the engine's rules ignore it."""

    @property
    def holds_gpus(self) -> bool:
        return bool(self.gpus or self.migs)

    @property
    def summary(self) -> str:
        """``GPU 1``, ``GPUs 0, 1``, ``MIG device 0:1``: what the request note names."""
        parts = []
        if self.gpus:
            word = "GPU" if len(self.gpus) == 1 else "GPUs"
            parts.append(f"{word} {', '.join(str(g.index) for g in self.gpus)}")
        if self.migs:
            word = "MIG device" if len(self.migs) == 1 else "MIG devices"
            parts.append(f"{word} {', '.join(f'{p.index}:{m.index}' for p, m in self.migs)}")
        return " and ".join(parts)


def _char_majors(text: str) -> Dict[str, int]:
    """The ``Character devices:`` section of ``/proc/devices``: name → major (first wins).
    (``nvshim.host.system.read_proc_devices`` reads the same for the CLI, with ``re``.)"""
    majors: Dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith("devices:"):
            in_char = stripped == "Character devices:"
            continue
        parts = stripped.split()
        if in_char and len(parts) == 2 and parts[0].isascii() and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


def char_majors(driver_root: str) -> Optional[Dict[str, int]]:
    """Character device name → major from ``<driver_root>/proc/devices``; None when that
    file cannot be read."""
    path = os.path.join(driver_root, "proc/devices")
    try:
        with open(path, "rb") as fh:
            text = fh.read(1 << 16).decode("ascii", "replace")
    except OSError:
        return None
    return _char_majors(text)


def nvidia_majors(driver_root: str) -> Optional[Tuple[Optional[int], Optional[int], Optional[int]]]:
    """(GPU, nvidia-caps, IMEX channel) majors from ``<driver_root>/proc/devices`` (None for
    a driver not loaded); None when that file cannot be read (then the node plan decides)."""
    majors = char_majors(driver_root)
    if majors is None:
        return None
    gpu = next((majors[n] for n in _GPU_NAMES if n in majors), None)
    return gpu, majors.get(_CAPS_NAME), majors.get(_IMEX_NAME)


def gpus_of_numbers(
    gpus: Sequence[Gpu],
    numbers: Set[Tuple[int, int]],
    gpu_major: Optional[int] = None,
    caps_major: Optional[int] = None,
) -> Tuple[Tuple[Gpu, ...], Tuple[Tuple[Gpu, MigDevice], ...]]:
    """(whole GPUs, (parent, MIG device) pairs) whose device numbers are in ``numbers``.

    A GPU is its ``/dev/nvidia<minor>`` (major ``gpu_major``, else its node's); a MIG device
    is held when both its capability nodes are (major ``caps_major``, else the node's), and
    its parent's node then belongs to the MIG device, not to a whole-GPU grant.
    """

    def cap(c: DeviceNode) -> Tuple[Optional[int], Optional[int]]:
        return (caps_major if caps_major is not None else c.major, c.minor)

    migs = [
        (g, m)
        for g in gpus
        for m in g.mig
        if m.cap_nodes and all(cap(c) in numbers for c in m.cap_nodes)
    ]
    mig_parents = {g.index for g, _ in migs}
    whole = []
    for g in gpus:
        if g.node is None or g.index in mig_parents:
            continue
        major = gpu_major if gpu_major is not None else g.node.major
        if (major, g.minor) in numbers:
            whole.append(g)
    return tuple(whole), tuple(migs)


def find_engine_grant(
    devices: Sequence[Tuple[int, int, str]],
    config: Config,
    host: Optional[Host],
    save_cache: bool,
    privileged: bool = False,
) -> Tuple[Optional[EngineGrant], Optional[Host], str]:
    """(the engine's grant or None, the host (loaded only when needed), where its plan came
    from (``""``: not loaded here)).

    ``devices`` are the spec's (major, minor, path) character devices. When
    ``/proc/devices`` names no NVIDIA major among them the node plan is not loaded. A
    ``privileged`` container's are the host's: :func:`privileged_holding` answers.
    """
    if privileged:
        return privileged_holding(devices, config, host, save_cache)
    majors = nvidia_majors(config.driver_root)
    if majors is not None:
        wanted = {m for m in majors if m is not None}
        devices = [d for d in devices if d[0] in wanted]
        if not devices:
            return None, host, ""
    source = ""
    if host is None:
        from nvshim.runtime.plancache import host_for

        host, source = host_for(config, save_cache)
    gpu_major, caps_major, imex_major = majors if majors is not None else (None, None, None)
    numbers = {(major, minor) for major, minor, _ in devices}
    path_of: Dict[Tuple[Optional[int], Optional[int]], str] = {
        (major, minor): path for major, minor, path in reversed(devices)
    }
    gpus, migs = gpus_of_numbers(host.gpus(), numbers, gpu_major, caps_major)

    def number(
        major: Optional[int], node: Optional[DeviceNode]
    ) -> Tuple[Optional[int], Optional[int]]:
        if node is None:  # never for a GPU gpus_of_numbers matched: it had a node
            return (None, None)
        return (major if major is not None else node.major, node.minor)

    notes = [
        f"GPU {g.index} ({g.uuid}) was injected by the engine "
        f"({path_of[number(gpu_major, g.node)]} in config.json): the container holds it"
        for g in gpus
    ]
    for parent, mig in migs:
        paths = [path_of[number(caps_major, c)] for c in mig.cap_nodes]
        notes.append(
            f"MIG device {parent.index}:{mig.index} ({mig.uuid}) was injected by the "
            f"engine ({', '.join(paths)} in config.json): the container holds it"
        )
    known = {number(gpu_major, g.node) for g in host.gpus() if g.node is not None}
    imex: List[int] = []
    for major, minor, path in devices:
        if imex_major is not None and major == imex_major:
            imex.append(minor)
            notes.append(
                f"IMEX channel {minor} was injected by the engine ({path} in "
                "config.json): the container holds it"
            )
        elif (
            gpu_major is not None
            and major == gpu_major
            and (major, minor) not in known
            and minor not in _CONTROL_MINORS
        ):
            notes.append(
                f"config.json holds {path} ({major}:{minor}), which is no GPU of this "
                "node: the engine's CDI spec may be stale"
            )
    if not (gpus or migs or imex):
        return None, host, source
    return EngineGrant(gpus, migs, tuple(dict.fromkeys(imex)), tuple(notes)), host, source


def privileged_holding(
    devices: Sequence[Tuple[int, int, str]],
    config: Config,
    host: Optional[Host],
    save_cache: bool,
) -> Tuple[Optional[EngineGrant], Optional[Host], str]:
    """(what a privileged container holds: the whole GPUs whose nodes its spec lists, or
    None, the host, where its plan came from), as :func:`find_engine_grant` answers.

    Engines copy every host device into a privileged container's spec; the journal shows
    it holding those GPUs (source ``privileged``), so ``nvshim grants`` sees it.
    """
    majors = nvidia_majors(config.driver_root)
    if majors is not None and not any(d[0] == majors[0] for d in devices):
        return None, host, ""
    source = ""
    if host is None:
        from nvshim.runtime.plancache import host_for

        host, source = host_for(config, save_cache)
    gpu_major = majors[0] if majors is not None else None
    numbers = {(major, minor) for major, minor, _ in devices}
    held = tuple(
        g
        for g in host.gpus()
        if g.node is not None
        and (gpu_major if gpu_major is not None else g.node.major, g.minor) in numbers
    )
    if not held:
        return None, host, source
    word = "GPU" if len(held) == 1 else "GPUs"
    note = (
        f"privileged container: its spec lists the host's devices, {word} "
        f"{', '.join(str(g.index) for g in held)} among them, and its device cgroup allows "
        "every device: it holds them (journaled as source privileged)"
    )
    return EngineGrant(gpus=held, notes=(note,), privileged=True), host, source


# --------------------------------------------------------------------------- the spec's edits


def _destination(dest: str) -> str:
    """Where runc mounts ``dest``: relative to the container's /, ``//x`` is ``/x``."""
    return posixpath.normpath("/" + dest.lstrip("/"))


def without_present(edits: Edits, spec: SpecDict) -> Edits:
    """``edits`` without the mounts and device nodes the spec already has (the engine's):
    a mount at a destination the spec mounts, a device node at a path ``linux.devices``
    lists (so no second cgroup rule either)."""
    mounts = spec.get("mounts")
    present = {
        _destination(m["destination"])
        for m in mounts or ()
        if isinstance(m, dict) and isinstance(m.get("destination"), str)
    }
    linux = spec.get("linux")
    devices = linux.get("devices") if isinstance(linux, dict) else None
    paths = {
        d["path"] for d in devices or () if isinstance(d, dict) and isinstance(d.get("path"), str)
    }
    return Edits(
        env=edits.env,
        device_nodes=tuple(n for n in edits.device_nodes if n.path not in paths),
        mounts=tuple(m for m in edits.mounts if _destination(m.container_path) not in present),
        hooks=edits.hooks,
        additional_gids=edits.additional_gids,
    )


def spec_mounts(spec: SpecDict) -> Tuple[Mount, ...]:
    """The spec's bind mounts as edits :class:`~nvshim.edits.Mount` (the in-root work plans
    the libraries the engine mounts from their host files, as it does nvshim's own)."""
    out = []
    for m in spec.get("mounts") or ():
        if not isinstance(m, dict):
            continue
        source, dest = m.get("source"), m.get("destination")
        if isinstance(source, str) and isinstance(dest, str) and source.startswith("/"):
            out.append(Mount(source, _destination(dest)))
    return tuple(out)


# --------------------------------------------------------------------------- the spec's hooks

#: NVIDIA's hook commands nvshim does itself (links, ld.so.cache, CUDA compat, params).
_NVIDIA_WORK = (
    "create-symlinks",
    "update-ldcache",
    "enable-cuda-compat",
    "disable-device-node-modification",
    "update-application-profile",
)


@dataclass(frozen=True)
class EngineHooks:
    """The in-root hooks of an engine's spec (createContainer hooks only).

    ``runnable``: a hook that makes the links and ld.so.cache is there and its binary is on
    this node. ``replaced``: (hook list, OCI hook) of those whose binary is not, to drop from
    config.json; their work becomes ``links`` (those under ``/dev`` made by the hook),
    ``folders``, ``host_driver_version``, ``params`` (``ModifyDeviceFiles: 0``) and
    ``egl_profile`` (the EGL application profile), and ``notes`` say so. nvshim's own
    params hook (a generated spec's) is always replaced: the runtime's sh hook does the
    same, cheaper.
    """

    runnable: bool = False
    replaced: Tuple[Tuple[str, SpecDict], ...] = ()
    links: Tuple[Tuple[str, str], ...] = ()
    folders: Tuple[str, ...] = ()
    host_driver_version: Optional[str] = None
    params: bool = False
    notes: Tuple[str, ...] = ()
    egl_profile: bool = False


def _nvidia_command(hook: SpecDict) -> Optional[Tuple[str, List[str]]]:
    """(command, its arguments) of an ``nvidia-cdi-hook CMD …`` or ``nvidia-ctk hook CMD …``
    hook; None for any other."""
    args = hook.get("args")
    path = hook.get("path")
    if (
        not isinstance(args, list)
        or not all(isinstance(a, str) for a in args)
        or not isinstance(path, str)
    ):
        return None
    name = posixpath.basename(path)
    first = posixpath.basename(args[0]) if args else name
    if "nvidia-cdi-hook" in (name, first) and len(args) >= 2:
        return args[1], args[2:]
    if "nvidia-ctk" in (name, first) and len(args) >= 3 and args[1] == "hook":
        return args[2], args[3:]
    return None


def _flag_values(args: Sequence[str], flag: str) -> List[str]:
    """The values of ``--flag V`` and ``--flag=V`` in ``args``."""
    out = []
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            out.append(args[i + 1])
        elif arg.startswith(flag + "="):
            out.append(arg[len(flag) + 1 :])
    return out


def _runnable(path: object) -> bool:
    return isinstance(path, str) and os.path.isfile(path) and os.access(path, os.X_OK)


# Long on purpose: one pass over the createContainer hooks, each sorted into one field of
# EngineHooks; the cases are the reasons, side by side.
def engine_hooks(spec: SpecDict) -> EngineHooks:
    """Classify the spec's createContainer hooks (see :class:`EngineHooks`); stat only."""
    from nvshim.runtime.devparams import runs_params_hook
    from nvshim.runtime.hookargs import (
        parse_graphics_args,
        parse_hook_args,
        parse_host_driver_version,
        runs_nvshim_hook,
    )

    hooks = spec.get("hooks")
    listed = hooks.get("createContainer") if isinstance(hooks, dict) else None
    if not isinstance(listed, list):
        return EngineHooks()
    runnable = False
    replaced: List[Tuple[str, SpecDict]] = []
    links: List[Tuple[str, str]] = []
    folders: List[str] = []
    version: Optional[str] = None
    params = False
    egl = False
    notes: List[str] = []
    for hook in listed:
        if not isinstance(hook, dict):
            continue
        args = hook.get("args")
        path = hook.get("path")
        if (
            isinstance(args, list)
            and all(isinstance(a, str) for a in args)
            and runs_params_hook(args)
        ):
            replaced.append(("createContainer", hook))
            params = True
            notes.append(
                f"config.json's nvshim params hook {path}: nvshim shows "
                "ModifyDeviceFiles: 0 with its own hook instead"
            )
            continue
        if (
            isinstance(args, list)
            and all(isinstance(a, str) for a in args)
            and runs_nvshim_hook(args)
        ):
            if _runnable(path):
                runnable = True
                continue
            more_links, more_folders = parse_hook_args(args)
            dev_links, more_egl = parse_graphics_args(args)
            links += more_links + dev_links
            folders += more_folders
            egl = egl or more_egl
            version = version or parse_host_driver_version(args)
            replaced.append(("createContainer", hook))
            notes.append(
                f"config.json's nvshim hook {path} is not on this node: nvshim "
                "does its in-root work instead"
            )
            continue
        command = _nvidia_command(hook)
        if command is None:
            continue
        name, rest = command
        if _runnable(path):
            runnable = runnable or name == "update-ldcache"
            continue
        replaced.append(("createContainer", hook))
        if name == "create-symlinks":
            for value in _flag_values(rest, "--link"):
                target, sep, link = value.partition("::")
                if sep and target and link.startswith("/"):
                    links.append((target, link))
        elif name == "update-ldcache":
            folders += [f for f in _flag_values(rest, "--folder") if f.startswith("/")]
        elif name == "enable-cuda-compat":
            version = version or next(iter(_flag_values(rest, "--host-driver-version")), None)
        elif name == "disable-device-node-modification":
            params = True
        elif name == "update-application-profile":
            egl = True
        what = "does it instead" if name in _NVIDIA_WORK else "drops it"
        notes.append(f"config.json's hook {path} {name} is not on this node: nvshim {what}")
    return EngineHooks(
        runnable,
        tuple(replaced),
        tuple(dict.fromkeys(links)),
        tuple(dict.fromkeys(folders)),
        version,
        params,
        tuple(notes),
        egl,
    )


def replacement_hook(hooks: EngineHooks, hook_command: Sequence[str]) -> Optional[Hook]:
    """nvshim's hook doing the replaced hooks' links, ld.so.cache and EGL profile (None: no
    such work); :mod:`nvshim.runtime.rootwork` then decides whether the runtime does it
    instead (links under ``/dev``, such as the DRM by-path ones, stay the hook's)."""
    if not (hooks.links or hooks.folders or hooks.egl_profile):
        return None
    from nvshim.edits import HOOK_ENV
    from nvshim.runtime.hookargs import build_hook_args

    dev = [(t, link) for t, link in hooks.links if link.startswith("/dev/")]
    root = [(t, link) for t, link in hooks.links if not link.startswith("/dev/")]
    args = tuple(hook_command) + tuple(
        build_hook_args(root, hooks.folders, hooks.host_driver_version, dev, hooks.egl_profile)
    )
    return Hook("createContainer", hook_command[0], args, HOOK_ENV)


def without_hooks(spec: SpecDict, replaced: Sequence[Tuple[str, SpecDict]]) -> SpecDict:
    """A copy of ``spec`` whose hook lists lack the ``replaced`` entries (compared by value;
    ``spec`` is left untouched). The lists it does not touch are shared, not copied."""
    if not replaced:
        return spec
    out = dict(spec)
    hooks = dict(out["hooks"])
    for name in {n for n, _ in replaced}:
        gone = [h for n, h in replaced if n == name]
        hooks[name] = [h for h in hooks[name] if h not in gone]
    out["hooks"] = hooks
    return out


def fit_edits(spec: SpecDict, edits: Edits, hooks: EngineHooks) -> Tuple[Edits, Optional[SpecDict]]:
    """(``edits`` fitted to a spec the engine injected into, the spec to apply them to when
    it is not ``spec``).

    Nothing the spec already mounts or lists is added again (:func:`without_present`);
    nvshim's own in-root work goes when runnable hooks in the spec do it and nvshim adds no
    library; the engine's hooks whose binary this node lacks are dropped from the spec and
    their work becomes nvshim's hook (:func:`replacement_hook`), which the runtime may do
    itself (:mod:`nvshim.runtime.rootwork`).
    """
    from nvshim.runtime.hookargs import hook_command, is_nvshim_hook

    edits = without_present(edits, spec)
    names = [m.container_path.rsplit("/", 1)[-1] for m in edits.mounts]
    adds_library = any(n.startswith("lib") and ".so" in n for n in names)
    if hooks.runnable and not adds_library:
        edits = Edits(
            edits.env,
            edits.device_nodes,
            edits.mounts,
            tuple(h for h in edits.hooks if not is_nvshim_hook(h)),
            edits.additional_gids,
        )
    if not hooks.replaced:
        return edits, None
    extra = replacement_hook(hooks, hook_command())
    if extra is not None:
        edits = edits + Edits(hooks=(extra,))
    return edits, without_hooks(spec, hooks.replaced)
