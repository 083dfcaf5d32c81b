"""The node plan cache: what discovery finds, computed once and checked by ``stat``.

GPUs (minors, UUIDs, PCI ids, MIG devices and their capability nodes), control nodes,
the driver version (the files') and the kernel module's, the CUDA version libcuda reports,
the driver libraries with their SONAMEs and ld.so.cache flags, binaries, data files and
firmware do not change between creates, but finding them costs a few milliseconds and a
dozen modules on every GPU create (and the CUDA version a child process that loads
libcuda). They are stored as JSON next to
the compiled config (``<stem>.plan.json``): written atomically by ``nvshim config
compile`` (so by ``install.sh``) and by the first create that finds the file missing or
stale.

Each create checks the file with ``stat`` calls only: every path discovery looked at or
found — the driver version file, the procfs GPU directory and GPU entries, the driver
root's ld.so.cache, the library, binary and data-file directories, ``/etc/alternatives``,
the config's ``nvml-facts`` file, every library, binary, data and firmware file and the
folder it lies in, and every device node (present or absent) — must have the
inode, size, mode, device number and modification/change times recorded. Anything else
(another driver root or nvml-facts file, another nvshim version, a field the code no
longer knows, unreadable JSON) is stale: the plan is rebuilt by discovery, never trusted,
and a create never fails because of the cache (a cache that cannot be written is simply
not written). IPC sockets come and go with their daemons and are always looked up live.

The 32-bit libraries ``compat32`` asks for (:mod:`nvshim.host.compat32`) are a section of
their own (``libraries32``, ``elf32``, ``watch32``): found when the plan is built, but
their paths are stat'ed only by a create that asks for ``compat32``, so a
``compute,utility`` create checks no more paths than before. A stale section is
rediscovered live for that create (the rest of the plan still answers). The GPUs' DRM
nodes and by-path links (``drm``, ``watchdrm``) are kept the same way: stat'ed only by a
create that asks for ``graphics`` or ``display``.

Building and writing a plan is :mod:`nvshim.runtime.planbuild`'s, loaded only when one is
written: a create the plan answers loads this module alone. Writes go through
:func:`nvshim.files.write_atomic` (a temp file per process, then rename), so parallel first
creates each write a complete file and the last rename wins.
"""

from __future__ import annotations

import os

from nvshim.edits import DeviceNode
from nvshim.files import stat_signature
from nvshim.host.devices import MigDevice
from nvshim.host.discovery import DriverFile, Gpu, Host, Library

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional, Tuple

    from nvshim.host.drm import DrmNodes

__all__ = ["CachedHost", "FORMAT", "host_for", "load", "refresh", "stamp", "PlanMemo", "use_memo"]

#: Bumped whenever the document's shape changes.
FORMAT = 4

# --------------------------------------------------------------------------- records


def _node(d: Optional[Dict[str, Any]]) -> Optional[DeviceNode]:
    return None if d is None else DeviceNode(**d)


def _unpack_gpu(d: Dict[str, Any]) -> Gpu:
    migs = tuple(
        MigDevice(**dict(m, cap_nodes=tuple(DeviceNode(**n) for n in m["cap_nodes"])))
        for m in d["mig"]
    )
    return Gpu(**dict(d, node=_node(d["node"]), mig=migs))


def _records(doc: Dict[str, Any]) -> Tuple[Any, Any, Any]:
    """The plan's GPUs, control nodes and driver files as frozen records."""
    return (
        tuple(_unpack_gpu(g) for g in doc["gpus"]),
        tuple((path, need, _node(node)) for path, need, node in doc["control-nodes"]),
        tuple(DriverFile(**f) for f in doc["files"]),
    )


def _check_libraries(libs: Dict[str, Optional[Dict[str, Any]]]) -> None:
    """A record shape the document does not match raises TypeError/KeyError here."""
    for lib in libs.values():
        if lib is not None:
            Library(capability="", **lib)


# --------------------------------------------------------------------------- the host


class CachedHost(Host):
    """A :class:`~nvshim.host.discovery.Host` answering from a plan document (IPC stays live)."""

    def __init__(
        self,
        driver_root: str,
        dev_root: Optional[str],
        doc: Dict[str, Any],
        nvml_facts: Optional[str] = None,
        records: Optional[Tuple[Any, Any, Any]] = None,
    ) -> None:
        super().__init__(driver_root, dev_root, nvml_facts)
        self._version = doc["driver-version"]
        self._module: Optional[str] = doc["module-version"]
        self._cuda: Optional[str] = doc["cuda-version"]
        # the frozen records (GPUs, control nodes, driver files): given when a resident
        # process already made them from this very document (:func:`load`)
        self._gpus, self._control, self._files = records or _records(doc)
        self.gpu_source = doc["gpu-source"]
        self._libs: Dict[str, Optional[Dict[str, Any]]] = doc["libraries"]
        self._drm: Dict[str, Dict[str, Any]] = doc["drm"]
        self._watchdrm: Optional[List[Any]] = doc["watchdrm"]  # None once checked and fresh
        self._staledrm = False
        self.elf: Dict[str, Tuple[int, Optional[str]]] = {
            path: (flags, soname) for path, flags, soname in doc["elf"]
        }
        self._libs32: Dict[str, Optional[Dict[str, Any]]] = doc["libraries32"]
        self._watch32: Optional[List[Any]] = doc["watch32"]  # None once checked and fresh
        self._elf32: List[Any] = doc["elf32"]
        self._stale32 = False
        if records is None:  # checked when the records were made from this document
            _check_libraries(self._libs)

    def gpus(self, method: str = "auto") -> Tuple[Gpu, ...]:
        if method != "auto":
            return super().gpus(method)
        assert self._gpus is not None
        return self._gpus

    def control_nodes(self, capabilities: Iterable[str]) -> Tuple[DeviceNode, ...]:
        caps = set(capabilities)
        return tuple(
            node
            for _, need, node in self._control
            if node is not None and (need is None or need in caps)
        )

    def find_library(self, base: str, capability: str) -> Optional[Library]:
        if base not in self._libs:
            return super().find_library(base, capability)
        found = self._libs[base]
        return None if found is None else Library(capability=capability, **found)

    def drm(self, gpu: Gpu) -> DrmNodes:
        """The GPU's DRM nodes from the plan, its ``watchdrm`` paths stat'ed on first use (a
        stale section, or a GPU it does not list, is looked up live)."""
        if self._watchdrm is not None:
            self._staledrm = any(stat_signature(path) != sig for path, sig in self._watchdrm)
            self._watchdrm = None
        found = self._drm.get(gpu.pci_bus_id)
        if found is None or self._staledrm:
            return super().drm(gpu)
        from nvshim.host.drm import DrmNodes

        return DrmNodes(
            tuple(DeviceNode(**n) for n in found["nodes"]),
            tuple((target, link) for target, link in found["links"]),
        )

    def find_library32(self, base: str) -> Optional[Library]:
        """The 32-bit library from the plan, its ``watch32`` paths stat'ed on first use (a
        stale section, or a base it does not list, is looked up live)."""
        if self._watch32 is not None:
            self._stale32 = any(stat_signature(path) != sig for path, sig in self._watch32)
            self._watch32 = None
            if not self._stale32:
                self.elf.update((path, (flags, soname)) for path, flags, soname in self._elf32)
        if self._stale32 or base not in self._libs32:
            return super().find_library32(base)
        found = self._libs32[base]
        return None if found is None else Library(capability="compat32", **found)

    def module_version(self) -> Optional[str]:
        return self._module

    def cuda_version(self) -> Optional[str]:
        return self._cuda

    def files(self, capabilities: Iterable[str]) -> Tuple[DriverFile, ...]:
        caps = set(capabilities)
        return tuple(f for f in self._files if f.capability is None or f.capability in caps)

    def elf_info(self, path: str) -> Tuple[Optional[int], Optional[str]]:
        """(cache flags, SONAME) of a driver library, for the in-root work."""
        known = self.elf.get(path)
        if known is not None:
            return known
        from nvshim.runtime.rootcache import elf_info

        return elf_info(path)


# --------------------------------------------------------------------------- load/save


def _key(driver_root: str, dev_root: str, nvml_facts: Optional[str]) -> Dict[str, Any]:
    from nvshim import __version__

    return {
        "nvshim-version": __version__,
        "driver-root": driver_root,
        "dev-root": dev_root,
        "nvml-facts": nvml_facts,
    }


def stamp(host: Host) -> Dict[str, Any]:
    """What marks a plan as this nvshim's for ``host``'s roots: its format and key
    (:func:`nvshim.runtime.planbuild.save` adds it; :func:`load` checks it)."""
    return {"format": FORMAT, "key": _key(host.driver_root, host.dev_root, host.nvml_facts)}


class PlanMemo:
    """A resident process's parsed copy of the plan file (the agent's; a create has none).

    Reused only while ``stat`` says the file is the one parsed (:func:`stat_signature`)
    and it is still trusted as the runtime requires; every other check :func:`load` makes
    (format, key, the watched paths) runs on it as on a freshly read file, so the copy is
    dropped exactly when the runtime would drop the file. ``lock`` serialises the
    rebuilds of a multi-threaded process (the writes' temp file is per process).
    """

    def __init__(self) -> None:
        import threading

        from nvshim.cdi.index import IndexMemo

        self.lock = threading.RLock()
        self.entry: Optional[Tuple[str, List[int], Any]] = None
        # (the document, its records): made once per document the memo holds
        self.records: Optional[Tuple[Any, Tuple[Any, Any, Any]]] = None
        self.cdi = IndexMemo()  # the CDI index's, installed with this one


#: Set by :func:`use_memo` in a resident process; None on the runtime's path.
_MEMO: Optional[PlanMemo] = None


def use_memo(memo: Optional[PlanMemo]) -> None:
    """Keep the parsed plan in ``memo`` from now on (None: read the file each time), and
    the parsed CDI index in its ``cdi`` (:class:`nvshim.cdi.index.IndexMemo`)."""
    global _MEMO
    from nvshim.cdi import index as cdiindex

    _MEMO = memo
    cdiindex.use_memo(None if memo is None else memo.cdi)


def _read(path: str) -> Tuple[Optional[Any], str]:
    """The plan document at ``path``, through the memo when one is in use."""
    from nvshim.files import read_trusted_cache, read_trusted_held

    memo = _MEMO
    if memo is None:
        return read_trusted_cache(path, "plan cache")
    doc, why, memo.entry = read_trusted_held(path, "plan cache", memo.entry)
    return doc, why


def load(
    path: str, driver_root: str, dev_root: str, nvml_facts: Optional[str] = None
) -> Tuple[Optional[CachedHost], str]:
    """The cached host when ``path`` holds a valid, fresh plan; else (None, why not)."""
    doc, why = _read(path)
    if why:
        return None, why
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None, "plan cache has another format"
    if doc.get("key") != _key(driver_root, dev_root, nvml_facts):
        return None, "plan cache is for another driver root, nvml-facts file or nvshim version"
    try:
        for watched, sig in doc["watch"]:
            if stat_signature(watched) != sig:
                return None, f"plan cache is stale: {watched} changed"
    except OSError as exc:
        return None, f"plan cache is stale: {exc.filename}: {exc.strerror}"
    except (TypeError, ValueError, KeyError):
        return None, "plan cache is malformed"
    try:
        return CachedHost(driver_root, dev_root, doc, nvml_facts, _memo_records(doc)), "plan cache"
    except (TypeError, ValueError, KeyError, AttributeError):
        return None, "plan cache is malformed"


def _memo_records(doc: Any) -> Optional[Tuple[Any, Any, Any]]:
    """The records of ``doc`` made once when it is the memo's document (frozen: shared by
    every create it serves), else None (each :class:`CachedHost` makes its own)."""
    memo = _MEMO
    if memo is None or memo.entry is None or memo.entry[2] is not doc:
        return None
    held = memo.records
    if held is None or held[0] is not doc:
        records = _records(doc)
        _check_libraries(doc["libraries"])
        memo.records = held = (doc, records)
    return held[1]


def host_for(config: Any, save: bool) -> Tuple[Host, str]:
    """The :class:`Host` a create uses, and where its plan came from (for inspect/logs).

    A fresh cache gives a :class:`CachedHost`; otherwise discovery runs and, with
    ``save``, the plan is rebuilt and written for the next create.
    """
    if _MEMO is not None:
        with _MEMO.lock:
            return _host_for(config, save)
    return _host_for(config, save)


def _host_for(config: Any, save: bool) -> Tuple[Host, str]:
    from nvshim.config import config_path, plan_path

    live = Host(config.driver_root, config.dev_root, config.nvml_facts)
    path = plan_path(config.source or config_path())
    cached, why = load(path, live.driver_root, live.dev_root, live.nvml_facts)
    if cached is not None:
        return cached, f"cache {path}"
    if not save:
        return live, f"discovery ({why})"
    if not os.path.isdir(os.path.dirname(path) or "."):
        return live, f"discovery ({why}; no directory for {path})"
    from nvshim.runtime.planbuild import save as build_and_save

    doc, outcome = build_and_save(path, live, stamp(live))
    if doc is not None:
        return (
            CachedHost(live.driver_root, live.dev_root, doc, live.nvml_facts),
            f"discovery ({why}; {outcome})",
        )
    return live, f"discovery ({why}; {outcome})"


def refresh(config: Any) -> str:
    """Rebuild and write the plan cache for ``config`` (``nvshim config compile``)."""
    from nvshim.config import config_path, plan_path

    path = plan_path(config.source or config_path())
    from nvshim.runtime.planbuild import save as build_and_save

    host = Host(config.driver_root, config.dev_root, config.nvml_facts)
    return build_and_save(path, host, stamp(host))[1]
