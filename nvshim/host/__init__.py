"""Facts about this machine: GPUs, MIG devices, driver files, and safe access to a rootfs.

Owns: discovery of GPUs and driver files (``discovery``, the seam, calling ``gpus``,
``driverfiles`` and ``versions`` only when a question needs them; ``capabilities``, the
tables of what each capability gets; ``devices``, ``mig``, ``drm``, ``compat32``); NVML and
the facts only it knows, with the ``nvml-facts`` file for nodes NVML cannot describe
(``nvml``); the ELF and ``ld.so.cache`` codecs (``elf``, ``ldcache``); file access confined
to a container rootfs (``inroot``); device node creation (``system``). The simulated GPU
node tests and demos run on is not here: it is :mod:`nvshim.sim`, which builds on these
modules and which none of them imports.

This file holds the one class every reader of the node builds on: :class:`Roots`, the
driver root (libraries, programs, ``/proc`` files, ``/etc``) and the dev root (device
nodes) — ``/`` on a real node, a simulated node's folder in tests (``nvshim sim create``)
—, and :func:`resolve_in`, which follows links inside a root as if chrooted there, so a
root's absolute link never reaches the host's files. Kept here, not in a module of its own:
every GPU create imports this package anyway.

May import only the base modules (``errors``, ``_record``, ``_jsonc``, ``files``,
``config``, ``edits``). Production modules never read what only the simulator writes.
"""

from __future__ import annotations

import os

from nvshim.errors import HostError

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Dict, List, Optional

    from nvshim.edits import DeviceNode
    from nvshim.host.capabilities import Library

__all__ = ["DRIVER_SIGNS", "Roots", "driver_loaded", "resolve_in"]


class Roots:
    """A driver root and a dev root, and the paths of the node's files under them.

    The finders (:mod:`nvshim.host.gpus`, :mod:`nvshim.host.driverfiles`,
    :mod:`nvshim.host.versions`) take the :class:`~nvshim.host.discovery.Host` as a
    :class:`Roots` and ask it the questions declared below, which it answers (or its node
    plan cache does)."""

    if TYPE_CHECKING:
        nvml_facts: Optional[str]

        def driver_version(self) -> str:
            """:meth:`nvshim.host.discovery.Host.driver_version`."""

        def ldcache(self) -> Dict[str, str]:
            """:meth:`nvshim.host.discovery.Host.ldcache`."""

        def device_node(self, container_path: str) -> Optional[DeviceNode]:
            """:meth:`nvshim.host.discovery.Host.device_node`."""

        def find_library(self, base: str, capability: str) -> Optional[Library]:
            """:meth:`nvshim.host.discovery.Host.find_library`."""

    def __init__(self, driver_root: str = "/", dev_root: Optional[str] = None) -> None:
        self.driver_root = os.path.abspath(driver_root or "/")
        self.dev_root = os.path.abspath(dev_root or self.driver_root)

    def host_path(self, container_path: str) -> str:
        """``/usr/lib/x`` → the same file under the driver root."""
        if self.driver_root == "/":
            return container_path
        return self.driver_root + container_path

    def dev_path(self, container_path: str) -> str:
        if self.dev_root == "/":
            return container_path
        return self.dev_root + container_path

    def read_text(self, container_path: str) -> Optional[str]:
        try:
            with open(self.host_path(container_path), encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            where = self.host_path(container_path)
            raise HostError(f"cannot read {where}: {exc.strerror}") from exc

    def resolve(self, path: str) -> Optional[str]:
        """:func:`resolve_in` the driver root."""
        return resolve_in(self.driver_root, path)

    def _regular_file(self, path: str) -> Optional[str]:
        """The in-root path of the regular file ``path`` names (links followed in the root)."""
        resolved = self.resolve(path)
        if resolved is None or not os.path.isfile(self.host_path(resolved)):
            return None
        return resolved


#: What a loaded NVIDIA driver leaves (its module, its procfs tree; WSL's GPU device): without
#: any, NVML has no driver to ask, and pynvml (an import of ~ the interpreter's start) is not
#: loaded for an answer known to be none.
DRIVER_SIGNS = ("/sys/module/nvidia", "/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg")


def driver_loaded() -> bool:
    """Whether this host has an NVIDIA driver NVML could talk to."""
    return any(os.path.exists(sign) for sign in DRIVER_SIGNS)


def resolve_in(root: str, path: str) -> Optional[str]:
    """``path`` with every link followed inside ``root``, as if chrooted there.

    Absolute link targets and ``..`` stay inside the root (``/etc/alternatives/x`` is the
    root's, never the host's), so what it returns, under ``root``, is a file of the root.
    None when a component does not exist, is not a folder where one is needed, or links
    loop (more than 40 links, as the kernel allows).
    """
    prefix = "" if root == "/" else root
    parts = [p for p in path.split("/") if p]
    done: List[str] = []
    links = 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        current = prefix + "/" + "/".join(done + [part])
        try:
            target = os.readlink(current)
        except FileNotFoundError:
            return None
        except OSError:  # EINVAL: not a link; ENOTDIR: a file where a folder is needed
            if parts and not os.path.isdir(current):
                return None
            done.append(part)
            continue
        links += 1
        if links > 40:
            return None
        if target.startswith("/"):
            done = []
        parts[0:0] = [p for p in target.split("/") if p]
    return "/" + "/".join(done)
