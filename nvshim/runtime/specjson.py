"""config.json as text: read the bundle's file (:func:`read_spec`) and decode it so that a
rewrite keeps what nvshim does not edit.

Python's json module re-encodes numbers (``1E2`` → ``100.0``, ``1e999`` → ``Infinity``,
which is not JSON, long decimals lose digits, ``-0`` → ``0``, a 5,000-digit integer is
refused), drops a UTF-8 byte-order mark and cannot encode a lone surrogate (``"\\ud800"``)
as UTF-8. runc reads config.json with Go's encoding/json, which sees none of that the same
way. So:

* a number whose Python value would not print back as written stays a
  :class:`NumberLiteral` holding its text, and is written back verbatim;
* a BOM is kept (runc rejects it either way: the file means what it meant);
* a lone surrogate is written back as its ``\\uXXXX`` escape;
* nesting deeper than :data:`MAX_DEPTH` is refused with one line (the copies and the
  encoder recurse; Go's own limit is 10,000, real specs nest less than 10 deep);
* a key twice in one object is refused with one line: Go decodes the second copy of an
  object *into* the first (``"process"`` twice: runc takes ``user`` from the first and
  ``env`` from the second), Python keeps only the last, so a rewrite would silently drop
  what runc would have used (a ``process.user`` lost makes the container run as root);
* keys are read as runc reads them (:func:`runc_keys`): Go's encoding/json matches an
  object's key to a struct field case-insensitively (``"Linux"`` is ``linux``, and the
  Kelvin sign U+212A and long s U+017F fold to ``k`` and ``s``), so a key spelled
  another way is renamed to the field's name, and two keys of one object naming the same
  field are refused like a key twice (runc would merge them; verification and the journal
  would see one while runc applied both). Map-valued fields (``annotations``,
  ``linux.sysctl``) keep their keys: Go matches those exactly.

Plain integers and floats that round-trip (every number containerd, podman and runc
write) stay ``int``/``float``: the request and apply code read them as numbers, and the
common path pays one cheap hook call per number.

Why one module: the decoder and the encoder are one format, held together by the promise
that a rewrite keeps every byte nvshim does not edit; a reader and a writer kept apart would
drift apart.
"""

from __future__ import annotations

import os
import stat

from nvshim import _jsonc
from nvshim.errors import SpecError
from nvshim.files import read_upto

# On every GPU create: json (with re, enum …) and typing are costly imports (BENCHMARKS.md).
# nvshim._jsonc drives the same C decoder/encoder; re is imported only for the rare
# number literal or lone surrogate.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

__all__ = [
    "NumberLiteral",
    "MAX_DEPTH",
    "MAX_SPEC_BYTES",
    "BOM",
    "decode_spec",
    "encode_spec",
    "dumps",
    "SpecDepthError",
    "SpecDuplicateKeyError",
    "read_spec",
    "runc_keys",
]

BOM = b"\xef\xbb\xbf"

#: Deepest nesting nvshim handles (objects and arrays); deeper specs fail with one line.
MAX_DEPTH = 200

#: The largest config.json nvshim reads; a larger one fails the create in one line, before
#: it is read whole. Engines write tens of KiB (a pod's whole spec is under etcd's 1.5 MiB);
#: a 200 MB config.json held a create for 12 s and 1.5 GB, while reading and decoding 16 MiB
#: of env entries takes 0.4 s and 70 MB here, and a larger file is refused in 0.2 s.
MAX_SPEC_BYTES = 16 << 20

#: Python refuses int() of longer digit strings (sys.get_int_max_str_digits, 4300).
_INT_DIGITS = 4000


class SpecDepthError(SpecError):
    """The document nests deeper than :data:`MAX_DEPTH`."""


class SpecDuplicateKeyError(SpecError):
    """An object of the document has the same key twice."""


class NumberLiteral:
    """A JSON number kept as written, because Python's value would print differently."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NumberLiteral) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return self.text  # as written: error messages quote it like the file does

    def __copy__(self) -> "NumberLiteral":
        return self

    def __deepcopy__(self, memo: Dict[int, Any]) -> "NumberLiteral":
        return self  # immutable


def _parse_int(text: str) -> Any:
    if len(text) > _INT_DIGITS or text == "-0":
        return NumberLiteral(text)
    return int(text)


def _parse_float(text: str) -> Any:
    value = float(text)
    return value if repr(value) == text else NumberLiteral(text)


def _too_deep(doc: Any, limit: int) -> bool:
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node if isinstance(v, (dict, list)))
    return False


def _object(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):  # rare: find the key to name it
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise SpecDuplicateKeyError(
                    f'duplicate key "{key}" in an object (runc would '
                    "merge the copies, a rewrite would keep the last)"
                )
            seen.add(key)
    return obj


_HOOKS = {
    "parse_int": _parse_int,
    "parse_float": _parse_float,
    "parse_constant": NumberLiteral,
    "object_pairs_hook": _object,
}


#: Every byte but ``[`` and ``{``: one translate pass counts the openers.
_NOT_OPENERS = bytes(b for b in range(256) if b not in b"[{")


# --------------------------------------------------------------------------- runc's key matching

#: The OCI runtime-spec structs as runc decodes them (runtime-spec's Go types): field name →
#: None (a value nvshim does not descend into), the struct it holds, or ``[struct]`` for a
#: list of them. Maps (annotations, sysctl, unified, rdma) are leaves: Go matches map keys
#: exactly.
_HOOK: Dict[str, Any] = dict.fromkeys(("path", "args", "env", "timeout"))
_SCHEMA: Dict[str, Any] = {
    **dict.fromkeys(
        ("ociVersion", "hostname", "domainname", "annotations", "solaris", "windows", "vm", "zos")
    ),
    "process": {
        **dict.fromkeys(
            (
                "terminal",
                "consoleSize",
                "args",
                "commandLine",
                "env",
                "cwd",
                "rlimits",
                "noNewPrivileges",
                "apparmorProfile",
                "oomScoreAdj",
                "scheduler",
                "selinuxLabel",
                "ioPriority",
                "execCPUAffinity",
            )
        ),
        "user": dict.fromkeys(("uid", "gid", "umask", "additionalGids", "username")),
        "capabilities": dict.fromkeys(
            ("bounding", "effective", "inheritable", "permitted", "ambient")
        ),
    },
    "root": dict.fromkeys(("path", "readonly")),
    "mounts": [
        dict.fromkeys(("destination", "type", "source", "options", "uidMappings", "gidMappings"))
    ],
    "hooks": {
        name: [_HOOK]
        for name in (
            "prestart",
            "createRuntime",
            "createContainer",
            "startContainer",
            "poststart",
            "poststop",
        )
    },
    "linux": {
        **dict.fromkeys(
            (
                "uidMappings",
                "gidMappings",
                "sysctl",
                "cgroupsPath",
                "namespaces",
                "seccomp",
                "rootfsPropagation",
                "maskedPaths",
                "readonlyPaths",
                "mountLabel",
                "intelRdt",
                "personality",
                "timeOffsets",
            )
        ),
        "devices": [dict.fromkeys(("path", "type", "major", "minor", "fileMode", "uid", "gid"))],
        "resources": {
            **dict.fromkeys(
                ("memory", "cpu", "pids", "blockIO", "hugepageLimits", "network", "rdma", "unified")
            ),
            "devices": [dict.fromkeys(("allow", "type", "major", "minor", "access"))],
        },
    },
}


def _fold(key: str) -> str:
    """``key`` as Go's case-insensitive field match sees it (simple case folding: ASCII
    letters, and the two non-ASCII letters that fold onto ASCII ones)."""
    if not key.isascii():
        key = key.replace("\u212a", "k").replace("\u017f", "s")
    return key.lower()


_FOLDED: Dict[int, Dict[str, str]] = {}


def _folded(schema: Dict[str, Any]) -> Dict[str, str]:
    """folded name → field name of one struct of :data:`_SCHEMA` (built once per process)."""
    table = _FOLDED.get(id(schema))
    if table is None:
        table = _FOLDED[id(schema)] = {_fold(name): name for name in schema}
    return table


def _struct_keys(obj: Dict[str, Any], schema: Dict[str, Any], where: str) -> Dict[str, Any]:
    """``obj`` with runc's field names (a new dict when one is renamed), its structs too;
    ``where`` names it in a refusal (``""``: the top level)."""
    renamed: Optional[Dict[str, str]] = None
    for key in obj:
        if key not in schema:
            name = _folded(schema).get(_fold(key))
            if name is not None:
                renamed = renamed or {}
                renamed[key] = name
    if renamed:
        seen: Dict[str, str] = {}
        for key in obj:
            name = renamed.get(key, key)
            if name in seen:
                raise SpecDuplicateKeyError(
                    f'keys "{seen[name]}" and "{key}" of {where or "the top level"} both name '
                    f'"{name}" (runc matches keys case-insensitively and would merge them)'
                )
            seen[name] = key
        obj = {renamed.get(k, k): v for k, v in obj.items()}
    for name, sub in schema.items():
        value = obj.get(name)
        if sub is None or value is None:
            continue
        inner = f"{where}.{name}" if where else name
        if isinstance(sub, dict):
            if isinstance(value, dict):
                obj[name] = _struct_keys(value, sub, inner)
        elif isinstance(value, list):
            obj[name] = [
                _struct_keys(v, sub[0], f"{inner}[{i}]") if isinstance(v, dict) else v
                for i, v in enumerate(value)
            ]
    return obj


def runc_keys(doc: Any) -> Any:
    """``doc`` (a decoded config.json) with every key of the OCI structs nvshim reads named
    as runc will read it (see the module docstring); SpecDuplicateKeyError when two keys of
    one object name the same field. Objects are rebuilt only where a key is renamed."""
    if not isinstance(doc, dict):
        return doc
    return _struct_keys(doc, _SCHEMA, "")


def decode_spec(raw: bytes) -> Any:
    """Decode config.json bytes (UTF-8, optional BOM), keys read as runc reads them
    (:func:`runc_keys`).

    Raises UnicodeDecodeError, ValueError (invalid JSON), :class:`SpecDepthError` or
    :class:`SpecDuplicateKeyError`.
    """
    text = (raw[len(BOM) :] if raw.startswith(BOM) else raw).decode("utf-8")
    try:
        if text.startswith("\ufeff"):  # a second BOM: JSONDecoder.decode's own message
            import json

            doc = json.JSONDecoder(**_HOOKS).decode(text)  # type: ignore[arg-type]
        else:
            doc = _jsonc.loads(text, **_HOOKS)  # = JSONDecoder(**_HOOKS).decode(text)
    except RecursionError as exc:
        raise SpecDepthError(f"nested deeper than {MAX_DEPTH} levels") from exc
    # A document with fewer brackets than the limit cannot be deeper: skip the walk.
    if len(raw.translate(None, _NOT_OPENERS)) > MAX_DEPTH and _too_deep(doc, MAX_DEPTH):
        raise SpecDepthError(f"nested deeper than {MAX_DEPTH} levels")
    return runc_keys(doc)


def encode_spec(spec: Any, original: bytes) -> bytes:
    """Encode ``spec`` in the layout of ``original`` (tabs, spaces or compact; final
    newline and BOM kept), number literals verbatim."""
    if b"\n\t" in original:
        text = dumps(spec, original, indent="\t")
    elif b"\n " in original:
        text = dumps(spec, original, indent=2)
    else:
        text = dumps(spec, original, separators=(",", ":"))
    if original.endswith(b"\n"):
        text += "\n"
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        import re

        # lone surrogates only occur inside string literals; their escape means the same
        escaped = re.compile("[\ud800-\udfff]").sub(lambda m: f"\\u{ord(m.group()):04x}", text)
        data = escaped.encode("utf-8")
    return BOM + data if original.startswith(BOM) else data


def dumps(spec: Any, original: bytes = b"", **options: Any) -> str:
    """``json.dumps(spec, ensure_ascii=False, **options)`` with number literals verbatim
    (``original``: text the placeholder must not occur in)."""
    literals: List[str] = []
    marker: Optional[str] = None

    def default(obj: Any) -> str:
        nonlocal marker
        if not isinstance(obj, NumberLiteral):
            raise TypeError(f"cannot encode {type(obj).__name__} in config.json")
        if marker is None:
            # a private-use string that occurs nowhere in the input: it cannot collide
            marker = "\ue000nvshim-number-"
            while marker.encode() in original:
                marker += "\ue000"
        literals.append(obj.text)
        return f"{marker}{len(literals) - 1}"

    if set(options) <= {"indent", "separators"}:  # the create path: no json import
        text = _jsonc.dumps(spec, ensure_ascii=False, default=default, **options)
    else:  # e.g. inspect's sort_keys=True
        import json

        text = json.dumps(spec, ensure_ascii=False, default=default, **options)
    if literals:
        import re

        assert marker is not None
        pattern = re.compile('"' + re.escape(marker) + '([0-9]+)"')
        text = pattern.sub(lambda m: literals[int(m.group(1))], text)
    return text


def read_spec(bundle: str) -> Tuple[str, bytes, Dict[str, Any]]:
    """Read and decode ``<bundle>/config.json``; SpecError names the file on any problem."""
    path = os.path.join(bundle, "config.json")
    raw = _read_regular(path)
    try:
        spec = decode_spec(raw)
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text") from exc
    except SpecDepthError as exc:
        raise SpecError(f"{path}: invalid JSON: {exc}") from exc
    except SpecDuplicateKeyError as exc:
        raise SpecError(f"{path}: {exc}") from exc
    except ValueError as exc:
        msg = getattr(exc, "msg", str(exc))
        line = getattr(exc, "lineno", None)
        col = getattr(exc, "colno", None)
        where = f" at line {line} column {col}" if line is not None else ""
        raise SpecError(f"{path}: invalid JSON{where}: {msg.lower()}") from exc
    if not isinstance(spec, dict):
        raise SpecError(f"{path}: top level must be a JSON object")
    return path, raw, spec


def _read_regular(path: str) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most :data:`MAX_SPEC_BYTES`;
    never blocks on a FIFO or device."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError as exc:
        raise SpecError(f"cannot read {path}: no such file") from exc
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise SpecError(f"cannot read {path}: {kind}")
        raw = read_upto(fd, st.st_size, MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(
            f"cannot read {path}: larger than the {MAX_SPEC_BYTES} bytes nvshim "
            f"reads ({MAX_SPEC_BYTES >> 20} MiB)"
        )
    return raw
