"""The self-contained runtime's import shortcut: nvshim's runtime modules from one file.

A GPU create imports ~27 of nvshim's modules; through the path finder each costs a few
directory lookups, a stat, an open and a read. The payload (:mod:`nvshim.node.install.payload`)
writes their code into one file, ``nvshim-preload.bin`` beside the package: the interpreter's
magic number, the length of an index, the index (marshalled ``{module: (is_package,
source path relative to the file's folder, offset, size)}``) and each module's
marshalled code. :func:`install` reads
the index and puts a finder first on ``sys.meta_path`` that serves exactly those modules,
each read with one ``pread`` and unmarshalled only when imported, with the ``__file__``,
``__path__`` and ``__spec__.origin`` the path finder would give. Anything else (a module
not in the file, a file written by another interpreter) goes to the usual finders.

The file is built with the sources and interpreter it ships with and never changed in
place; its descriptor is close-on-exec (nothing reaches runc). Relative source paths keep
it right wherever install.sh puts the prefix.
"""

from __future__ import annotations

import marshal
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Optional, Sequence, Tuple

__all__ = ["install", "dumps", "FILE_NAME"]

FILE_NAME = "nvshim-preload.bin"

# the import system's own classes, without importing importlib (not frozen: BENCHMARKS.md)
_bootstrap = sys.modules["_frozen_importlib"]
_MAGIC_NUMBER: bytes = sys.modules["_frozen_importlib_external"].MAGIC_NUMBER


class _Finder:
    """Meta path finder and loader for the modules of one preload file."""

    def __init__(self, fd: int, index: Dict[str, Tuple[bool, str, int, int]], base: str) -> None:
        self.fd = fd
        self.index = index
        self.base = base

    def find_spec(self, name: str, path: Optional[Sequence[str]] = None, target: Any = None) -> Any:
        entry = self.index.get(name)
        if entry is None:
            return None
        is_package, relative, _, _ = entry
        origin = f"{self.base}/{relative}"
        if relative.startswith("../"):
            origin = os.path.normpath(origin)
        spec = _bootstrap.ModuleSpec(name, self, origin=origin, is_package=is_package)
        spec.has_location = True  # __file__ = origin, as the path finder sets it
        if is_package:
            spec.submodule_search_locations = [origin.rpartition("/")[0]]
        return spec

    def create_module(self, spec: Any) -> None:
        return None  # the default module object

    def exec_module(self, module: Any) -> None:
        _, _, offset, size = self.index[module.__name__]
        exec(marshal.loads(os.pread(self.fd, size, offset)), module.__dict__)


_HEAD = len(_MAGIC_NUMBER) + 8  # the magic number, then where the index starts


def install(path: str) -> bool:
    """Serve the modules of the preload file ``path`` first; False (and nothing changed)
    when it is missing or was written by another interpreter."""
    try:
        fd = os.open(path, os.O_RDONLY)  # close-on-exec (PEP 446)
    except OSError:
        return False
    index = None
    try:
        head = os.pread(fd, _HEAD, 0)
        if len(head) == _HEAD and head[: len(_MAGIC_NUMBER)] == _MAGIC_NUMBER:
            start = int.from_bytes(head[len(_MAGIC_NUMBER) :], "little")
            index = marshal.loads(os.pread(fd, os.fstat(fd).st_size - start, start))
    except (OSError, ValueError, EOFError, TypeError):
        index = None  # a truncated or foreign file: the usual finders serve everything
    if not isinstance(index, dict):
        os.close(fd)
        return False
    sys.meta_path.insert(0, _Finder(fd, index, os.path.dirname(os.path.abspath(path))))
    return True


def dumps(modules: Dict[str, Tuple[bool, str, Any]]) -> bytes:
    """The preload file for ``{module: (is_package, source path relative to the file's
    folder, code object)}``: the magic number, the index's offset, each module's code, the
    index."""
    body = bytearray()
    index: Dict[str, Tuple[bool, str, int, int]] = {}
    for name, (pkg, origin, code) in modules.items():
        data = marshal.dumps(code)
        index[name] = (pkg, origin, _HEAD + len(body), len(data))
        body += data
    start = _HEAD + len(body)
    return _MAGIC_NUMBER + start.to_bytes(8, "little") + bytes(body) + marshal.dumps(index)
