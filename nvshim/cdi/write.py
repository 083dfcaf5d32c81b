"""Building and writing CDI specs: a checked document from :class:`~nvshim.edits.Edits`
values (:func:`spec_to_dict`), its stable text (:func:`dump_spec`, YAML or JSON) and an
atomic write (:func:`write_spec`). Used by ``nvshim cdi generate``/``transform`` and the
IMEX spec; never by a create.
"""

from __future__ import annotations

import os
import re

from nvshim import _jsonc
from nvshim.cdi.check import check_semantics
from nvshim.cdi.model import SPEC_EXTENSIONS
from nvshim.cdi.version import required_version
from nvshim.errors import CdiError, CdiSpecError

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

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
        text = _plain_yaml(ordered)
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


#: How a string PyYAML writes plain (unquoted) in block style may start: a letter, ``/``,
#: ``_``, or one or two ``-`` before one of those (``-I``, ``--link``), or ``./``/``../``
#: (a relative link target); see :func:`_scalar`.
_PLAIN = re.compile(r"-{0,2}[A-Za-z/_]|\.\.?/")
#: The plain words YAML 1.1 reads as booleans or null: PyYAML single-quotes them.
_WORDS = frozenset("yes Yes YES no No NO true True TRUE false False FALSE on On ON off Off OFF "
                   "null Null NULL".split())
#: Digits PyYAML reads as an integer (decimal, or base 60 ``1:20``): single-quoted; other
#: ``N:M`` (``0:1``, a MIG device's name) is a plain string.
_INT = re.compile(r"(?:0|[1-9][0-9]*|[1-9][0-9]*:[0-5]?[0-9])\Z")
_DIGITS = re.compile(r"(?:0|[1-9][0-9]*)(?::[0-9]+)?\Z")
#: A version (``0.5.0``, ``550.54.15``): no YAML 1.1 number, a plain string.
_DOTTED = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+\Z")


def _scalar(value: Any) -> Optional[str]:
    """``value`` as PyYAML's SafeDumper writes it in block style, for the few shapes a
    spec's strings, integers and booleans take (None for any other)."""
    if value.__class__ is str:
        if _PLAIN.match(value) and value.isascii() and value.isprintable() \
                and ": " not in value and " #" not in value and value[-1] not in ": ":
            return f"'{value}'" if value in _WORDS else value
        if _DIGITS.match(value):
            return f"'{value}'" if _INT.match(value) else value
        if _DOTTED.match(value):
            return value
        return None
    if value.__class__ is int:
        return str(value)
    if value.__class__ is bool:
        return "true" if value else "false"
    return None


def _key(key: Any) -> Optional[str]:
    """A mapping key as PyYAML writes a simple one (from about 120 characters PyYAML
    writes a complex ``? key``: left to it)."""
    if key.__class__ is not str or len(key) > 100:
        return None
    return _scalar(key)


def _item(value: Any, indent: str, lines: List[str]) -> bool:
    """Append list item ``value`` of a list under a key ``indent`` deep (``- …``); False
    when this writer leaves ``value`` to PyYAML."""
    if value.__class__ is dict and value:
        head = f"{indent}- "
        for key, member in value.items():
            name = _key(key)
            if name is None or not _member(member, f"{head}{name}:", indent + "  ", lines):
                return False
            head = indent + "  "
        return True
    if value.__class__ is list:
        if value:
            return False  # a list in a list
        lines.append(f"{indent}- []")
        return True
    if value.__class__ is dict:
        lines.append(f"{indent}- {{}}")
        return True
    text = _scalar(value)
    lines.append(f"{indent}- {text}")
    return text is not None


def _member(value: Any, head: str, indent: str, lines: List[str]) -> bool:
    """Append a mapping member: ``head`` (``key:`` with what goes before it) and ``value``
    (a list at the key's depth ``indent``, a mapping two deeper); False when this writer
    leaves ``value`` to PyYAML."""
    if value.__class__ is list and value:
        lines.append(head)
        return all(_item(item, indent, lines) for item in value)
    if value.__class__ is dict and value:
        lines.append(head)
        for key, member in value.items():
            name = _key(key)
            if name is None or not _member(member, f"{indent}  {name}:", indent + "  ", lines):
                return False
        return True
    text = "[]" if value.__class__ is list else "{}" if value.__class__ is dict \
        else _scalar(value)
    lines.append(f"{head} {text}")
    return text is not None


def _plain_yaml(spec: Dict[str, Any]) -> Optional[str]:
    """The text PyYAML's SafeDumper writes for ``spec`` (explicit start, block style, keys
    in order), written directly, or None when ``spec`` holds a value this writer leaves to
    PyYAML (a string to quote or escape, a float, null, a list in a list): a generated
    node's spec takes a few milliseconds instead of PyYAML's tens."""
    lines = ["---"]
    for key, value in spec.items():
        name = _key(key)
        if name is None or not _member(value, f"{name}:", "", lines):
            return None
    if len(lines) == 1:
        return None
    lines.append("")
    return "\n".join(lines)


def _odd_key(value: Any) -> bool:
    """Whether a mapping anywhere in ``value`` has a key libyaml writes otherwise than
    PyYAML: ``""``, one of about 120 characters (simple for one, complex for the other)
    or one that is not ASCII (its escapes count otherwise)."""
    if isinstance(value, dict):
        return any(not k or len(str(k)) > 100 or not str(k).isascii() for k in value) \
            or any(_odd_key(v) for v in value.values())
    if isinstance(value, list):
        return any(_odd_key(v) for v in value)
    return False


def _format_for(path: str) -> str:
    ext = os.path.splitext(path)[1]
    if ext not in SPEC_EXTENSIONS:
        raise CdiError(f'cannot write CDI spec {path}: the name must end in .json or .yaml')
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
