"""``nvshim cdi generate``: a CDI spec for this node, from the same edits as injection.

Spec-level ``containerEdits`` hold what every GPU needs
(:func:`nvshim.runtime.hostedits.driver_edits`: control nodes, driver libraries and binaries,
the hook, ``NVIDIA_VISIBLE_DEVICES=void``); each device holds what it adds
(:func:`~nvshim.runtime.hostedits.gpu_edits`, :func:`~nvshim.runtime.hostedits.mig_edits`).
With graphics or display the one hook also carries every GPU's ``/dev/dri/by-path`` links
(``--dev-link``: made for the DRM nodes the container got) and ``--egl-profile`` (the EGL
application profile of the ``/dev/nvidia<N>`` it got): which devices a container gets is
known only when it starts, so the hook reads it from the container's ``/dev``.
So a container that gets ``nvidia.com/gpu=1`` from this spec sees exactly what
``NVIDIA_VISIBLE_DEVICES=1`` gives through nvshim-runtime, ``ModifyDeviceFiles: 0``
included: the spec-level edits carry nvshim's params hook
(:func:`nvshim.runtime.devparams.spec_hook`, run by :mod:`nvshim.params_hook`) where the
runtime writes its bundle copy, unless ``disable-device-node-modification`` is off.
"""

from __future__ import annotations

import re

from nvshim.config import DEFAULT_CAPABILITIES, Config
from nvshim.edits import DeviceNode, Edits
from nvshim.errors import CdiError, UsageError
from nvshim.runtime.hostedits import driver_edits, gpu_edits, mig_edits

TYPE_CHECKING = False  # typing is most of `cdi generate --check`'s imports (BENCHMARKS.md)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = [
    "generate_spec",
    "stale_reasons",
    "staleness",
    "fresh_like",
    "strategies_of",
    "generate_for_node",
    "generate_text",
    "check_current",
    "STRATEGIES",
    "IMEX_CLASS",
]

STRATEGIES = ("index", "uuid")
IMEX_CLASS = "imex-channel"
_INDEXED = re.compile(r"^[0-9]+(:[0-9]+)?$")


def _dedupe_nodes(nodes: Sequence[DeviceNode]) -> Tuple[DeviceNode, ...]:
    seen: Dict[str, DeviceNode] = {}
    for node in nodes:
        seen.setdefault(node.path, node)
    return tuple(seen.values())


def generate_spec(
    host: Any,
    vendor: str = "nvidia.com",
    class_: str = "gpu",
    strategies: Sequence[str] = STRATEGIES,
    capabilities: Sequence[str] = DEFAULT_CAPABILITIES,
    hook_command: Sequence[str] = (),
    gpu_method: str = "auto",
    params_command: Sequence[str] = (),
) -> Dict[str, Any]:
    """Build the spec document for ``host`` (a :class:`nvshim.host.discovery.Host`).

    ``params_command`` (empty: none) starts the params hook, which reads the host's
    ``<driver root>/proc/driver/nvidia/params`` at container start."""
    from nvshim.cdi.write import spec_to_dict

    for s in strategies:
        if s not in STRATEGIES:
            raise UsageError(f'unknown device name strategy "{s}": expected index or uuid')
    if not strategies:
        raise UsageError("at least one device name strategy is needed (index, uuid)")
    from nvshim.host.capabilities import wants_drm

    gpus = host.gpus(gpu_method)
    devices: List[Tuple[str, Edits]] = []
    all_nodes: List[DeviceNode] = []
    dev_links: List[Tuple[str, str]] = []
    drm = wants_drm(capabilities)
    for gpu in gpus:
        nodes = host.drm(gpu) if drm else None
        dev_links += nodes.links if nodes is not None else ()
        edits = gpu_edits(gpu, nodes)
        all_nodes.extend(edits.device_nodes)
        if "index" in strategies:
            devices.append((str(gpu.index), edits))
        if "uuid" in strategies:
            devices.append((gpu.uuid, edits))
    for gpu in gpus:
        for mig in gpu.mig:
            edits = mig_edits(gpu, mig)
            all_nodes.extend(edits.device_nodes)
            if "index" in strategies:
                devices.append((f"{gpu.index}:{mig.index}", edits))
            if "uuid" in strategies:
                devices.append((mig.uuid, edits))
    if all_nodes:
        devices.append(("all", Edits(device_nodes=_dedupe_nodes(all_nodes))))
    if not devices:
        raise CdiError(f"no GPUs found under {host.driver_root}: nothing to put in a CDI spec")
    # one hook for every device: each GPU's by-path links (the hook makes those whose node
    # the container got) and the EGL profile (of the /dev/nvidia<N> it got)
    common = driver_edits(
        host.control_nodes(capabilities),
        host.libraries(capabilities),
        host.driver_files(capabilities),
        hook_command,
        dev_links=dev_links,
        egl_profile=drm,
    )
    if params_command:
        import os

        from nvshim.runtime.devparams import PARAMS, spec_hook

        host_params = os.path.join(os.path.abspath(host.driver_root), PARAMS)
        common = common + Edits(hooks=(spec_hook(params_command, host_params),))
    return spec_to_dict(f"{vendor}/{class_}", devices, common)


def stale_reasons(existing: Dict[str, Any], fresh: Dict[str, Any], host: Any) -> List[str]:
    """Why an existing spec no longer describes the node (empty: it is current)."""
    reasons: List[str] = []
    from nvshim.host.discovery import OWN_VERSION_LIBRARIES

    version = host.driver_version()
    for mount in (existing.get("containerEdits") or {}).get("mounts") or []:
        path = str(mount.get("hostPath", ""))
        own = path.rsplit("/", 1)[-1].startswith(tuple(f"{b}.so" for b in OWN_VERSION_LIBRARIES))
        if ".so." in path and not own and not path.endswith(f".so.{version}"):
            reasons.append(f"driver is {version} but the spec mounts {path}")
            break
    if existing.get("devices") != fresh.get("devices"):
        old = sorted(d.get("name", "") for d in existing.get("devices") or [])
        new = sorted(d.get("name", "") for d in fresh.get("devices") or [])
        if old != new:
            reasons.append(f"devices differ: spec has {', '.join(old)}; node has {', '.join(new)}")
        else:
            reasons.append("device nodes differ from the node's")
    if existing.get("containerEdits") != fresh.get("containerEdits") and not reasons:
        reasons.append("driver files, control nodes or hooks differ from the node's")
    return reasons


def generate_for_node(
    driver_root: Optional[str],
    dev_root: Optional[str],
    class_: str,
    vendor: str,
    strategies: Sequence[str],
    driver_capabilities: str,
    gpu_source: str,
    hook_path: Optional[str],
    config: Optional[Config] = None,
) -> Tuple[Dict[str, Any], Any]:
    """The spec ``nvshim cdi generate`` writes for this node, and the host it describes.

    ``class_`` ``imex-channel`` gives the node's IMEX channels instead of its GPUs.
    ``config`` (default: the node's) gives the driver root, dev root and nvml-facts file.
    """
    from nvshim.config import ALL_CAPABILITIES, load_config
    from nvshim.host.discovery import Host
    from nvshim.runtime.devparams import PARAMS_HOOK_COMMAND, PARAMS_HOOK_MODULE
    from nvshim.runtime.hookargs import hook_command
    from nvshim.runtime.request import parse_capabilities

    if config is None:
        config = load_config()
    root = driver_root or config.driver_root
    host = Host(
        root,
        dev_root or (None if driver_root else config.dev_root),
        None if driver_root else config.nvml_facts,
    )
    caps = parse_capabilities(driver_capabilities, ALL_CAPABILITIES, False)
    if class_ == IMEX_CLASS:
        from nvshim.runtime.extras import generate_imex_spec

        return generate_imex_spec(host, vendor), host
    hook: Tuple[str, ...] = hook_command()
    params: Tuple[str, ...] = hook_command(PARAMS_HOOK_MODULE)
    if hook_path is not None:
        if not hook_path.startswith("/"):
            raise UsageError(f'--hook-path "{hook_path}" is not an absolute path')
        hook, params = (hook_path, "hook"), (hook_path, PARAMS_HOOK_COMMAND)
    if not config.disable_device_node_modification:
        params = ()
    return generate_spec(host, vendor, class_, strategies, caps, hook, gpu_source, params), host


def generate_text(
    driver_root: Optional[str],
    dev_root: Optional[str],
    output: Optional[str],
    fmt: Optional[str],
    class_: str,
    vendor: str,
    strategies: Sequence[str],
    driver_capabilities: str,
    gpu_source: str,
    hook_path: Optional[str],
) -> str:
    """``nvshim cdi generate`` without ``--check`` (both ways of running it: click's and
    :mod:`nvshim.cli.fast`): the spec written to ``output`` atomically ("" returned), or,
    without one (or ``-``), its text for stdout in ``fmt`` (default yaml)."""
    from nvshim.cdi.write import dump_spec, write_spec

    spec, _ = generate_for_node(
        driver_root,
        dev_root,
        class_,
        vendor,
        strategies,
        driver_capabilities,
        gpu_source,
        hook_path,
    )
    if output and output != "-":
        write_spec(output, spec)
        return ""
    return dump_spec(spec, fmt or "yaml")


def strategies_of(raw: Any) -> Tuple[str, ...]:
    """The device name strategies a spec's device names show (index, uuid)."""
    names = [str(d.get("name", "")) for d in raw.get("devices") or [] if isinstance(d, dict)]
    found: List[str] = []
    if any(_INDEXED.match(n) for n in names):
        found.append("index")
    if any(n.startswith(("GPU-", "MIG-")) for n in names):
        found.append("uuid")
    return tuple(found) or STRATEGIES


def _hook_path_of(raw: Any) -> Optional[str]:
    """The ``--hook-path`` a spec was generated with: its hook runs ``PATH hook …``."""
    hooks = (raw.get("containerEdits") or {}).get("hooks") or []
    for hook in hooks if isinstance(hooks, list) else ():
        args = hook.get("args") if isinstance(hook, dict) else None
        if (
            isinstance(args, list)
            and len(args) > 1
            and args[1] == "hook"
            and args[0] == hook.get("path")
        ):
            return str(args[0])
    return None


def _has_params_hook(raw: Any) -> bool:
    from nvshim.runtime.devparams import runs_params_hook

    hooks = (raw.get("containerEdits") or {}).get("hooks") or []
    return any(
        isinstance(h, dict)
        and isinstance(h.get("args"), list)
        and runs_params_hook([str(a) for a in h["args"]])
        for h in hooks
    )


def fresh_like(existing: Dict[str, Any], host: Any) -> Dict[str, Any]:
    """The spec ``nvshim cdi generate`` would write now in place of ``existing``: its kind,
    its naming strategies, its hook command (``--hook-path``) and its params hook or none
    (``disable-device-node-modification``, a choice, not staleness)."""
    from nvshim.runtime.devparams import PARAMS_HOOK_COMMAND, PARAMS_HOOK_MODULE
    from nvshim.runtime.hookargs import hook_command

    vendor, _, class_ = str(existing.get("kind") or "nvidia.com/gpu").partition("/")
    if class_ == IMEX_CLASS:
        from nvshim.runtime.extras import generate_imex_spec

        return generate_imex_spec(host, vendor)
    hook: Tuple[str, ...] = hook_command()
    params: Tuple[str, ...] = hook_command(PARAMS_HOOK_MODULE)
    hook_path = _hook_path_of(existing)
    if hook_path is not None:
        hook, params = (hook_path, "hook"), (hook_path, PARAMS_HOOK_COMMAND)
    if not _has_params_hook(existing):
        params = ()  # written without it (disable-device-node-modification off): not stale
    return generate_spec(
        host,
        vendor,
        class_ or "gpu",
        strategies_of(existing),
        hook_command=hook,
        params_command=params,
    )


def staleness(
    existing: Dict[str, Any], host: Any, fresh: Optional[Dict[str, Any]] = None
) -> List[str]:
    """The one staleness judgement of a spec file (doctor's ``cdi-specs`` and ``cdi generate
    --check``): why ``existing`` no longer describes ``host``, against ``fresh`` (default:
    :func:`fresh_like`, what ``cdi generate`` would write now); empty when current."""
    return stale_reasons(existing, fresh if fresh is not None else fresh_like(existing, host), host)


def check_current(
    check_file: str,
    spec: Dict[str, Any],
    host: Any,
    config: Optional[Config] = None,
    existing: Optional[Any] = None,
) -> None:
    """Raise :class:`CdiError` naming why ``check_file`` differs from ``spec`` (stale),
    ending with the fix every check gives (:func:`nvshim.runtime.cdiedits.refresh_fix`);
    ``existing``: its document already decoded (from the CDI index), else it is read."""
    from nvshim.config import load_config
    from nvshim.runtime.cdiedits import refresh_fix

    if existing is None:
        from nvshim.cdi.load import load_spec_file

        existing = load_spec_file(check_file).raw
    config = config if config is not None else load_config()
    reasons = staleness(dict(existing), host, spec)
    if reasons:
        raise CdiError(
            f"{check_file} is stale: {'; '.join(reasons)}; "
            f"{refresh_fix(config, check_file, host.driver_root)}"
        )
