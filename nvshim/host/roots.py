"""The two roots discovery reads the machine through, and paths resolved inside them.

A node is read through a driver root (libraries, programs, ``/proc`` files, ``/etc``) and
a dev root (device nodes): ``/`` on a real node, a simulated node's folder in tests
(``nvshim sim create``). :class:`Roots` is the base every finder of
:class:`nvshim.host.discovery.Host` builds on; :func:`resolve_in` follows links inside a
root as if chrooted there, so a root's absolute link never reaches the host's files.
"""

from __future__ import annotations

import os

from nvshim.errors import HostError

TYPE_CHECKING = False  # typing costs ~4 ms to import on the create path
if TYPE_CHECKING:
    from typing import List, Optional

__all__ = ["Roots", "resolve_in"]


class Roots:
    """A driver root and a dev root, and the paths of the node's files under them."""

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
