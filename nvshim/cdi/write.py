"""Building and writing CDI specs: a checked document from :class:`~nvshim.edits.Edits`
values (:func:`spec_to_dict`), its stable text (:func:`dump_spec`, YAML or JSON) and an
atomic write (:func:`write_spec`). Used by ``nvshim cdi generate``/``transform`` and the
IMEX spec; never by a create.
"""

from __future__ import annotations

import os

from nvshim import _jsonc
from nvshim.cdi.check import check_semantics
from nvshim.cdi.model import SPEC_EXTENSIONS
from nvshim.cdi.version import required_version
from nvshim.errors import CdiError, CdiSpecError

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

    from nvshim.edits import Edits

__all__ = ["spec_to_dict", "dump_spec", "write_spec"]

_KEY_ORDER = ("cdiVersion", "kind", "annotations", "devices", "containerEdits")


def spec_to_dict(
    kind: str,
    devices: Sequence[Tuple[str, Edits]],
    edits: Edits,
    version: Optional[str] = None,
) -> Dict[str, Any]:
    """A spec document for ``kind`` with ``devices`` (name, edits) and spec-level ``edits``.

    ``cdiVersion`` is the minimum the content needs unless ``version`` is given. The
    result is checked; raises :class:`CdiSpecError` if it would not load.
    """
    spec: Dict[str, Any] = {
        "cdiVersion": "",
        "kind": kind,
        "devices": [{"name": name, "containerEdits": dev.to_cdi()} for name, dev in devices],
    }
    if edits:
        spec["containerEdits"] = edits.to_cdi()
    spec["cdiVersion"] = version if version is not None else required_version(spec)
    problems = check_semantics(spec)
    if problems:
        raise CdiSpecError(problems)
    return spec


def _ordered(spec: Mapping[str, Any]) -> Dict[str, Any]:
    out = {key: spec[key] for key in _KEY_ORDER if key in spec}
    out.update((key, value) for key, value in spec.items() if key not in out)
    return out


def dump_spec(spec: Mapping[str, Any], fmt: str = "yaml") -> str:
    """Serialise a spec document: ``yaml`` (starts with ``---``) or ``json``.

    Top-level keys come in the order cdiVersion, kind, annotations, devices,
    containerEdits; inner keys keep their order. Output is stable for equal input.
    """
    ordered = _ordered(spec)
    if fmt == "json":
        return _jsonc.dumps(ordered, indent=2, ensure_ascii=False) + "\n"
    if fmt == "yaml":
        from nvshim.cdi import _plainyaml

        text = _plainyaml.dump(ordered)
        if text is not None:
            return text
        import yaml

        # else libyaml's emitter when PyYAML has it: the same text as PyYAML's own but
        # for an empty or a long key (an annotation's)
        fast = getattr(yaml, "__with_libyaml__", False) and not _odd_key(ordered)
        dumped: str = yaml.dump(
            ordered,
            Dumper=yaml.CSafeDumper if fast else yaml.SafeDumper,
            explicit_start=True,
            sort_keys=False,
            default_flow_style=False,
            width=2**30,
        )
        return dumped
    raise CdiError(f'unknown spec format "{fmt}": expected yaml or json')


def _odd_key(value: Any) -> bool:
    """Whether a mapping anywhere in ``value`` has a key libyaml writes otherwise than
    PyYAML: ``""``, one of about 120 characters (simple for one, complex for the other)
    or one that is not ASCII (its escapes count otherwise)."""
    if isinstance(value, dict):
        return any(not k or len(str(k)) > 100 or not str(k).isascii() for k in value) or any(
            _odd_key(v) for v in value.values()
        )
    if isinstance(value, list):
        return any(_odd_key(v) for v in value)
    return False


def _format_for(path: str) -> str:
    ext = os.path.splitext(path)[1]
    if ext not in SPEC_EXTENSIONS:
        raise CdiError(f"cannot write CDI spec {path}: the name must end in .json or .yaml")
    return ext[1:]


def write_spec(path: str, spec: Mapping[str, Any]) -> bool:
    """Write ``spec`` to ``path`` atomically, format from the extension; whether it changed.

    A file that already holds exactly these bytes is left alone (same inode and mtime: the
    CDI index and engines' caches stay valid). The directory is created (0755) if needed;
    a new file gets mode 0644 (an existing file keeps its mode). Readers never see a
    partial file: the temporary file's name does not end in .json/.yaml, so registries
    ignore it.
    """
    from nvshim.files import write_atomic

    data = dump_spec(spec, _format_for(path)).encode("utf-8")
    if _holds(path, data):
        return False
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
    except OSError as exc:
        raise CdiError(f"cannot create CDI spec directory {directory}: {exc.strerror}") from exc
    write_atomic(path, data, default_mode=0o644)
    return True


def _holds(path: str, data: bytes) -> bool:
    """Whether ``path`` is a regular file with exactly ``data`` (never blocks on a FIFO)."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # missing or unreadable: the write reports a real problem
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        return fh.read(len(data) + 1) == data
