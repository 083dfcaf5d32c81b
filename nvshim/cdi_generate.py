"""``nvshim cdi generate``: a CDI spec for this node, from the same edits as injection.

Spec-level ``containerEdits`` hold what every GPU needs (:func:`nvshim.edits.driver_edits`:
control nodes, driver libraries and binaries, the hook, ``NVIDIA_VISIBLE_DEVICES=void``);
each device holds what it adds (:func:`~nvshim.edits.gpu_edits`,
:func:`~nvshim.edits.mig_edits`). So a container that gets ``nvidia.com/gpu=1`` from this
spec sees exactly what ``NVIDIA_VISIBLE_DEVICES=1`` gives through nvshim-runtime.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import click

from nvshim.edits import DeviceNode, Edits, driver_edits, gpu_edits, mig_edits
from nvshim.errors import CdiError, UsageError

__all__ = ["generate_spec", "stale_reasons", "generate"]

STRATEGIES = ("index", "uuid")
IMEX_CLASS = "imex-channel"


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
    capabilities: Sequence[str] = ("compute", "utility"),
    hook_command: Sequence[str] = (),
    gpu_method: str = "auto",
) -> Dict[str, Any]:
    """Build the spec document for ``host`` (a :class:`nvshim.discovery.Host`)."""
    from nvshim.cdi import spec_to_dict

    for s in strategies:
        if s not in STRATEGIES:
            raise UsageError(f'unknown device name strategy "{s}": expected index or uuid')
    if not strategies:
        raise UsageError("at least one device name strategy is needed (index, uuid)")
    gpus = host.gpus(gpu_method)
    devices: List[Tuple[str, Edits]] = []
    all_nodes: List[DeviceNode] = []
    for gpu in gpus:
        edits = gpu_edits(gpu)
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
    files = host.binaries(capabilities) + host.ipc(capabilities) + host.firmware()
    common = driver_edits(
        host.control_nodes(capabilities), host.libraries(capabilities), files, hook_command
    )
    return spec_to_dict(f"{vendor}/{class_}", devices, common)


def stale_reasons(existing: Dict[str, Any], fresh: Dict[str, Any], host: Any) -> List[str]:
    """Why an existing spec no longer describes the node (empty: it is current)."""
    reasons: List[str] = []
    version = host.driver_version()
    for mount in (existing.get("containerEdits") or {}).get("mounts") or []:
        path = str(mount.get("hostPath", ""))
        if ".so." in path and not path.endswith(f".so.{version}"):
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
        reasons.append("driver files or control nodes differ from the node's")
    return reasons


@click.command()
@click.option("--driver-root", default=None, help="Driver root (default: from config, usually /).")
@click.option("--dev-root", default=None, help="Where /dev/nvidia* are (default: driver root).")
@click.option("--output", "-o", default=None,
              help="Write here atomically (mode 0644; .json or .yaml picks the format). Default: stdout.")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default=None,
              help="Output format for stdout (default yaml; --output uses its extension).")
@click.option("--vendor", default="nvidia.com", show_default=True, help="CDI vendor.")
@click.option("--class", "class_", default="gpu", show_default=True,
              help="CDI device class. imex-channel: a spec of the node's IMEX channels "
                   "(<vendor>/imex-channel=N, one /dev/nvidia-caps-imex-channels/channelN each).")
@click.option("--device-name-strategy", "strategies", multiple=True, default=STRATEGIES,
              show_default=True, type=click.Choice(STRATEGIES),
              help="How devices are named: index (0, 0:1) and/or uuid (GPU-…, MIG-…).")
@click.option("--driver-capabilities", default="compute,utility", show_default=True,
              help="Which driver files the spec injects (NVIDIA_DRIVER_CAPABILITIES syntax).")
@click.option("--gpu-source", type=click.Choice(["auto", "procfs", "nvml"]), default="auto",
              show_default=True, help="Where GPUs are read from.")
@click.option("--hook-path", default=None, metavar="PATH",
              help="Absolute path of an `nvshim` command on the hosts that will use the spec; "
                   "its hook then runs as `PATH hook …` instead of naming this nvshim's venv "
                   "interpreter, so the spec works where nvshim is installed elsewhere.")
@click.option("--check", "check_file", default=None, metavar="FILE",
              help="Do not write: exit 1 with the reasons if FILE is stale for this node.")
def generate(driver_root: Optional[str], dev_root: Optional[str], output: Optional[str],
             fmt: Optional[str], vendor: str, class_: str, strategies: Tuple[str, ...],
             driver_capabilities: str, gpu_source: str, hook_path: Optional[str],
             check_file: Optional[str]) -> None:
    """Generate a CDI spec for this node's GPUs (devices by index, UUID, MIG, and all).

    With --class imex-channel: a spec of the node's IMEX channels instead (write it to a
    second file, e.g. /var/run/cdi/nvidia-imex.yaml).

    cdiVersion is the minimum the content needs (0.5.0 for a typical spec, which
    podman 4.x accepts). Works from procfs under any driver root, and with NVML on a
    real host.
    """
    from nvshim import cdi
    from nvshim.config import ALL_CAPABILITIES, load_config
    from nvshim.create import hook_command
    from nvshim.discovery import Host
    from nvshim.request import parse_capabilities

    config = load_config()
    root = driver_root or config.driver_root
    host = Host(root, dev_root or (None if driver_root else config.dev_root))
    caps = parse_capabilities(driver_capabilities, ALL_CAPABILITIES, False)
    if class_ == IMEX_CLASS:
        from nvshim.extras import generate_imex_spec

        spec = generate_imex_spec(host, vendor)
    else:
        hook: Tuple[str, ...] = hook_command()
        if hook_path is not None:
            if not hook_path.startswith("/"):
                raise UsageError(f'--hook-path "{hook_path}" is not an absolute path')
            hook = (hook_path, "hook")
        spec = generate_spec(host, vendor, class_, strategies, caps, hook, gpu_source)
    if check_file:
        existing = cdi.load_spec_file(check_file).raw
        reasons = stale_reasons(dict(existing), spec, host)
        if reasons:
            raise CdiError(f"{check_file} is stale: {'; '.join(reasons)}; regenerate it with nvshim cdi generate")
        click.echo(f"{check_file}: current", err=True)
        return
    if output:
        cdi.write_spec(output, spec)
        return
    click.echo(cdi.dump_spec(spec, fmt or "yaml"), nl=False)
