"""NVML, and the facts only NVML knows.

``with nvml("what failed") as pynvml``: an initialised pynvml for the body, shut down
after (discovery's ``nvml`` GPU source). :class:`NvmlFacts`: the one reader of the facts
procfs does not have — MIG UUIDs, the CUDA driver version, compute capability, brand —
from NVML on a real node, else from the facts file the config names (``nvml-facts``,
format below). Production code asks these facts nowhere else.

Imported only where such a fact is needed (the ``nvml`` source, MIG devices, CUDA
requirement checks): pynvml is loaded only when NVML itself is asked.

Why one module: most of it is :class:`NvmlFacts`, which must stay one reader. Every fact
only NVML knows comes through it, from NVML or from the facts file whose format it owns, so
moving the file's reading out would give that format a second home.
"""

from __future__ import annotations

import os
import re

from nvshim import _jsonc
from nvshim.errors import HostError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple


class NvmlUnavailable(HostError):
    """NVML cannot be used on this host (library missing, or no driver to talk to)."""


#: Where a driver root keeps its NVML (NVIDIA's installer, the GPU Operator's driver
#: container, a simulated node).
NVML_LIBRARY = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"

#: The driver root whose NVML pynvml has loaded in this process ("/" for the loader's own).
_loaded_root: List[str] = []


def load_pynvml(driver_root: str) -> Any:
    """pynvml, its library the driver root's own NVML: the loader's ``libnvidia-ml.so.1``
    for ``/``, else ``<driver root>/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1`` (links
    followed inside the root), which describes the driver installed there, as NVIDIA's
    toolkit loads it, once this host has a driver loaded (:func:`nvshim.host.driver_loaded`:
    NVIDIA's NVML initialised as root without one makes ``/dev/nvidiactl``). As root the
    file is held to the config files' trust rule
    (:func:`nvshim.files.check_trusted`: it runs in this process). NvmlUnavailable when
    pynvml or the library is missing or not trusted.

    pynvml keeps one library per process (its ``nvmlLib``, and the function pointers it
    looked up): a different driver root replaces both, under pynvml's own lock."""
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable("nvidia-ml-py is not installed; cannot query NVML") from exc
    if _loaded_root == [driver_root]:
        return pynvml
    path = None
    if driver_root != "/":
        from ctypes import CDLL

        from nvshim.errors import ConfigError
        from nvshim.files import check_trusted
        from nvshim.host import DRIVER_SIGNS, driver_loaded, resolve_in

        if not driver_loaded():
            # NVIDIA's NVML, initialised as root where no driver is loaded, makes
            # /dev/nvidiactl on the host itself: a driver root's files alone are not asked
            raise NvmlUnavailable(
                f"no NVIDIA driver is loaded on this host (none of "
                f"{', '.join(DRIVER_SIGNS)}): the NVML under "
                f"{driver_root} is not asked"
            )
        inside = resolve_in(driver_root, NVML_LIBRARY)
        if inside is None:
            raise NvmlUnavailable(
                f"no NVML in the driver root ({driver_root}{NVML_LIBRARY} does not exist)"
            )
        path = driver_root.rstrip("/") + inside
        try:
            check_trusted(path, os.stat(path), "NVML library")
            library = CDLL(path)
        except (ConfigError, OSError) as exc:
            raise NvmlUnavailable(f"cannot load {path}: {exc}") from exc
    with pynvml.libLoadLock:
        pynvml.nvmlLib = library if path is not None else None
        pynvml._nvmlGetFunctionPointer_cache.clear()  # the old library's pointers
    _loaded_root[:] = [driver_root]
    return pynvml


class nvml:  # noqa: N801 - used as ``with nvml(...) as pynvml``, like a function
    """An initialised pynvml for the ``with`` body, shut down after; failures are HostError.
    NVML is the driver root's own (:func:`load_pynvml`).

    A class rather than ``@contextmanager``: ``contextlib`` is an import (BENCHMARKS.md) on the
    create path, which never uses NVML.
    """

    def __init__(self, failure: str, driver_root: str = "/") -> None:
        self.failure = failure
        self.driver_root = driver_root
        self.pynvml: Any = None

    def __enter__(self) -> Any:
        pynvml = load_pynvml(self.driver_root)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"cannot initialise NVML: {exc}") from exc
        self.pynvml = pynvml
        return pynvml

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        pynvml = self.pynvml
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass  # shutting down a library we are done with; nothing to recover
        if exc is not None and isinstance(exc, pynvml.NVMLError):
            raise HostError(f"{self.failure}: {exc}") from exc


def as_text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- facts only NVML knows ---------------------------------------------------------------

#: The version of the facts file format below.
FACTS_FORMAT = 1

#: NVML's nvmlBrandType_t → the names CUDA images use in ``brand=`` constraints.
BRANDS: Dict[int, str] = {
    0: "unknown",
    1: "quadro",
    2: "tesla",
    3: "nvs",
    4: "grid",
    5: "geforce",
    6: "titan",
    7: "vapps",
    8: "vpc",
    9: "vcs",
    10: "vws",
    11: "cloudgaming",
    12: "quadrortx",
    13: "nvidiartx",
    14: "nvidia",
    15: "geforcertx",
    16: "titanrtx",
    # Newer NVML values; no CUDA image names them yet, so these spellings are ours.
    17: "dla",
    18: "vgamedev",
    19: "npu",
}

_BRAND = re.compile(r"^[A-Za-z0-9_-]+$")
_VERSION = re.compile(r"^[0-9]+(?:\.[0-9]+)*$")


def _version_text(raw: Any) -> Optional[str]:
    """A facts-file version (``"12.4"``, ``12.4``, ``[12, 4]``) as text; None if it is none."""
    if isinstance(raw, bool):
        return None
    text: Optional[str] = None
    if isinstance(raw, str):
        text = raw.strip()
    elif isinstance(raw, (int, float)):
        text = str(raw)
    elif (
        isinstance(raw, (list, tuple))
        and raw
        and all(isinstance(p, int) and not isinstance(p, bool) for p in raw)
    ):
        text = ".".join(str(p) for p in raw)
    return text if text is not None and _VERSION.match(text) else None


class NvmlFacts:
    """The one reader of what only NVML knows: MIG UUIDs, CUDA driver version, compute
    capability and brand (procfs has none of them).

    Two sources, in this order:

    1. NVML itself: the driver root's own library (:func:`load_pynvml`, which describes the
       driver installed there); pynvml is imported on first use.
    2. When NVML cannot answer, the facts file the configuration names (config key
       ``nvml-facts``, default null = none), a JSON document of this shape::

           {"format": 1,
            "cuda_version": "12.4",
            "gpus": [{"uuid": "GPU-…", "minor": 0,
                      "compute_capability": "9.0", "brand": "nvidia",
                      "mig": [{"gi": 1, "ci": 0, "uuid": "MIG-…", "profile": "3g.40gb"}]}]}

       A GPU entry is matched by ``uuid`` (case-insensitive), else by ``minor``; every key
       but ``format`` is optional, and a value that is missing or malformed is an unknown
       fact (said why), never a guess. A file that is not JSON, or not format 1, is a
       :class:`HostError`. Use it where NVML is not available to nvshim (a driver installed
       under another root, or a test node); whoever writes it vouches for it.

    Use as ``with NvmlFacts(driver_root, facts_file) as facts``: NVML is shut down on exit.
    """

    def __init__(self, driver_root: str, facts_file: Optional[str]) -> None:
        self.driver_root = driver_root
        self.facts_file = facts_file
        self.nvml_why = ""
        self._session: Any = None
        self._tried = False
        self._doc: Optional[Dict[str, Any]] = None
        self._read = False

    def __enter__(self) -> "NvmlFacts":
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        self.close()

    # -- NVML ----------------------------------------------------------------------------

    def session(self) -> Any:
        """The initialised pynvml module, or None (why in :attr:`nvml_why`)."""
        if not self._tried:
            self._tried = True
            try:
                pynvml = load_pynvml(self.driver_root)
            except NvmlUnavailable as exc:
                self.nvml_why = f"no NVML: {exc}"
                return None
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                self.nvml_why = f"no NVML: {exc}"
                return None
            self._session = pynvml
        return self._session

    def close(self) -> None:
        if self._session is not None:
            try:
                self._session.nvmlShutdown()
            except self._session.NVMLError:
                pass  # shutting down a library we are done with; nothing to recover
            self._session = None

    # -- the facts file ------------------------------------------------------------------

    def document(self) -> Tuple[Optional[Dict[str, Any]], str]:
        """The facts file's document, or (None, why there is none); HostError if unreadable."""
        if self.facts_file is None:
            return None, "no nvml-facts file configured"
        if not self._read:
            self._read = True
            self._doc = self._load(self.facts_file)
        if self._doc is None:
            return None, f"no nvml-facts file at {self.facts_file}"
        return self._doc, ""

    @staticmethod
    def _load(path: str) -> Optional[Dict[str, Any]]:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise HostError(f"cannot read nvml-facts file {path}: {exc.strerror}") from exc
        try:
            doc = _jsonc.loads(text)
        except ValueError as exc:
            raise HostError(f"{path}: not valid JSON") from exc
        if not isinstance(doc, dict):
            raise HostError(f"{path}: top level must be a JSON object")
        if doc.get("format") != FACTS_FORMAT:
            raise HostError(
                f"{path}: format {doc.get('format')!r} is not {FACTS_FORMAT} (an nvml-facts file)"
            )
        return doc

    def _gpu_entry(self, uuid: str, minor: int) -> Tuple[Optional[Dict[str, Any]], str]:
        doc, why = self.document()
        if doc is None:
            return None, why
        gpus = doc.get("gpus")
        entries = [g for g in gpus if isinstance(g, dict)] if isinstance(gpus, list) else []
        for entry in entries:
            if str(entry.get("uuid", "")).lower() == uuid.lower():
                return entry, ""
        for entry in entries:
            if entry.get("minor") == minor:
                return entry, ""
        return None, f"{self.facts_file} does not list {uuid}"

    # -- the facts -----------------------------------------------------------------------

    def cuda_version(self, reasons: List[str]) -> Optional[str]:
        """The newest CUDA version the driver supports (``12.4``); None with ``reasons``."""
        nvml = self.session()
        if nvml is not None:
            try:
                raw = int(nvml.nvmlSystemGetCudaDriverVersion_v2())
            except nvml.NVMLError as exc:
                reasons.append(f"NVML: {exc}")
            else:
                return f"{raw // 1000}.{raw % 1000 // 10}"
        else:
            reasons.append(self.nvml_why)
        doc, why = self.document()
        if doc is None:
            reasons.append(why)
            return None
        if doc.get("cuda_version") is None:
            reasons.append(f"{self.facts_file} has no cuda_version")
            return None
        text = _version_text(doc["cuda_version"])
        if text is None:
            reasons.append(
                f'cuda_version in {self.facts_file} is "{doc["cuda_version"]}", not a version'
            )
        return text

    def _gpu_handle(self, uuid: str, reasons: List[str]) -> Tuple[Any, Any]:
        nvml = self.session()
        if nvml is None:
            reasons.append(self.nvml_why)
            return None, None
        try:
            return nvml, nvml.nvmlDeviceGetHandleByUUID(uuid)
        except nvml.NVMLError as exc:
            reasons.append(f"NVML: {exc}")
            return None, None

    def compute_capability(self, uuid: str, minor: int, reasons: List[str]) -> Optional[str]:
        """GPU ``uuid``'s compute capability (``9.0``); None with ``reasons``."""
        nvml, handle = self._gpu_handle(uuid, reasons)
        if handle is not None:
            try:
                major, low = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            except nvml.NVMLError as exc:
                reasons.append(f"NVML: {exc}")
            else:
                return f"{int(major)}.{int(low)}"
        entry, why = self._gpu_entry(uuid, minor)
        if entry is None:
            reasons.append(why)
            return None
        text = _version_text(entry.get("compute_capability"))
        if text is None:
            reasons.append(f"{self.facts_file} has no compute_capability for {uuid}")
        return text

    def brand(self, uuid: str, minor: int, reasons: List[str]) -> Optional[str]:
        """GPU ``uuid``'s product brand, lower case (``tesla``); None with ``reasons``."""
        nvml, handle = self._gpu_handle(uuid, reasons)
        if handle is not None:
            try:
                code = int(nvml.nvmlDeviceGetBrand(handle))
            except nvml.NVMLError as exc:
                reasons.append(f"NVML: {exc}")
            else:
                if code in BRANDS:
                    return BRANDS[code]
                reasons.append(f"NVML brand {code} has no name")
        entry, why = self._gpu_entry(uuid, minor)
        if entry is None:
            reasons.append(why)
            return None
        raw = entry.get("brand")
        if isinstance(raw, str) and _BRAND.match(raw.strip()):
            return raw.strip().lower()
        reasons.append(f"{self.facts_file} has no brand for {uuid}")
        return None

    def mig_devices(self, minor: int) -> Dict[Tuple[int, int], Tuple[str, str]]:
        """(GPU instance, compute instance) → (MIG UUID, profile) of GPU ``minor``'s MIG
        devices; empty when neither NVML nor the facts file names them."""
        nvml = self.session()
        if nvml is not None:
            return self._nvml_migs(nvml, minor)
        entry = self._file_gpu_by_minor(minor)
        out: Dict[Tuple[int, int], Tuple[str, str]] = {}
        migs = entry.get("mig") if entry is not None else None
        for m in migs if isinstance(migs, list) else []:
            try:
                out[(int(m["gi"]), int(m["ci"]))] = (str(m["uuid"]), str(m.get("profile", "")))
            except (KeyError, TypeError, ValueError) as exc:
                raise HostError(
                    f"{self.facts_file}: MIG entry {m!r} of GPU minor {minor} needs "
                    "integer gi and ci and a uuid"
                ) from exc
        return out

    def _file_gpu_by_minor(self, minor: int) -> Optional[Dict[str, Any]]:
        doc, _ = self.document()
        gpus = doc.get("gpus") if doc is not None else None
        for entry in gpus if isinstance(gpus, list) else []:
            if isinstance(entry, dict) and entry.get("minor") == minor:
                return entry
        return None

    @staticmethod
    def _nvml_migs(nvml: Any, minor: int) -> Dict[Tuple[int, int], Tuple[str, str]]:
        out: Dict[Tuple[int, int], Tuple[str, str]] = {}
        try:
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                if int(nvml.nvmlDeviceGetMinorNumber(handle)) != minor:
                    continue
                for j in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
                    try:
                        mh = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
                    except nvml.NVMLError:
                        continue  # an empty MIG slot
                    gi = int(nvml.nvmlDeviceGetGpuInstanceId(mh))
                    ci = int(nvml.nvmlDeviceGetComputeInstanceId(mh))
                    # NVML names a MIG device "<GPU name> MIG <profile>"
                    name = as_text(nvml.nvmlDeviceGetName(mh))
                    out[(gi, ci)] = (
                        as_text(nvml.nvmlDeviceGetUUID(mh)),
                        name.rpartition(" MIG ")[2],
                    )
        except nvml.NVMLError as exc:
            raise HostError(f"NVML MIG query failed for GPU minor {minor}: {exc}") from exc
        return out
