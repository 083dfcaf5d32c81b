"""NVML, used as ``with nvml("what failed") as pynvml``: initialised for the body, shut down after.

Imported only where NVML is asked (discovery's ``nvml`` source, MIG UUIDs, CUDA requirement
checks): pynvml is never loaded on the create path of a node that uses procfs.
"""

from __future__ import annotations

from nvshim.errors import HostError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class NvmlUnavailable(HostError):
    """NVML cannot be used on this host (library missing, or no driver to talk to)."""


class nvml:  # noqa: N801 - used as ``with nvml(...) as pynvml``, like a function
    """An initialised pynvml for the ``with`` body, shut down after; failures are HostError.

    A class rather than ``@contextmanager``: ``contextlib`` costs ~1 ms to import on the
    create path, which never uses NVML.
    """

    def __init__(self, failure: str) -> None:
        self.failure = failure
        self.pynvml: Any = None

    def __enter__(self) -> Any:
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable("nvidia-ml-py is not installed; cannot query NVML") from exc
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
