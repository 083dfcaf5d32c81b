"""The DRM nodes of a GPU: ``/dev/dri/card<n>``, ``/dev/dri/renderD<m>`` and their links.

nvidia-drm gives each GPU a card node (modesetting, Xorg with ``display``) and a render
node (EGL on GBM or Wayland, Vulkan device matching by DRM, nvidia-vaapi-driver, anything
opening ``/dev/dri/renderD*``). Which nodes belong to which GPU is what sysfs says:
``/sys/bus/pci/devices/<bus id>/drm/`` holds a folder per node, named like it; udev adds
``/dev/dri/by-path/pci-<bus id>-{card,render}`` links to them. All of it is read under the
dev root (``/sys`` is the kernel's, like ``/dev``).

Only the capabilities in :data:`nvshim.host.capabilities.DRM_CAPABILITIES` get them, as
with the reference's graphics modifier; a GPU without them (headless, no nvidia-drm module)
gets none, and ``doctor``/``inspect`` say so (:func:`missing_drm`). Loaded only when such a
capability is asked for and the node plan cache does not answer.
"""

from __future__ import annotations

import os

from nvshim._record import dataclass

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Any, Iterable, List, Optional, Sequence, Tuple

    from nvshim.edits import DeviceNode

__all__ = ["DrmNodes", "find_drm", "missing_drm", "sysfs_folder"]


@dataclass(frozen=True)
class DrmNodes:
    """A GPU's DRM device nodes and the by-path links to them, as (target, link) pairs."""

    nodes: Tuple[DeviceNode, ...] = ()
    links: Tuple[Tuple[str, str], ...] = ()


def sysfs_folder(pci_bus_id: str) -> str:
    """Where sysfs lists a PCI device's DRM nodes (a path under the dev root)."""
    return f"/sys/bus/pci/devices/{pci_bus_id}/drm"


def find_drm(host: Any, pci_bus_id: str) -> DrmNodes:
    """The DRM nodes of the GPU at ``pci_bus_id`` that exist under ``host``'s dev root (a
    :class:`~nvshim.host.discovery.Host`), with the by-path links udev made to them (a
    node or link that is not there is left out)."""
    try:
        names = sorted(os.listdir(host.dev_path(sysfs_folder(pci_bus_id))))
    except OSError:  # no such device or no nvidia-drm: no DRM nodes
        return DrmNodes()
    nodes: List[DeviceNode] = []
    for name in names:
        number = (
            name[4:] if name.startswith("card") else name[7:] if name.startswith("renderD") else ""
        )
        if not number.isdigit():  # connectors and the like are not nodes
            continue
        node = host.device_node(f"/dev/dri/{name}")
        if node is not None:
            nodes.append(node)
    links = []
    have = {n.path.rsplit("/", 1)[1] for n in nodes}
    for kind in ("card", "render"):
        link = f"/dev/dri/by-path/pci-{pci_bus_id}-{kind}"
        target = _readlink(host.dev_path(link))
        if target is not None and target.rsplit("/", 1)[-1] in have:
            links.append((target, link))
    return DrmNodes(tuple(nodes), tuple(links))


def _readlink(path: str) -> Optional[str]:
    try:
        return os.readlink(path)
    except OSError:
        return None


def missing_drm(asking: Sequence[str], gpus: Iterable[Tuple[int, DrmNodes]]) -> Tuple[str, ...]:
    """``"/dev/dri render node of GPU 0 (graphics)"`` for each (index, nodes) of a GPU
    lacking a card or render node that the capabilities ``asking`` for them
    (:func:`nvshim.host.capabilities.drm_capabilities`) get (empty when none asks)."""
    if not asking:
        return ()
    out = []
    for index, drm in gpus:
        names = [n.path.rsplit("/", 1)[1] for n in drm.nodes]
        for kind, prefix in (("card", "card"), ("render", "renderD")):
            if not any(name.startswith(prefix) for name in names):
                out.append(f"/dev/dri {kind} node of GPU {index} ({','.join(asking)})")
    return tuple(out)
