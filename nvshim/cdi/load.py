"""Loading CDI spec files: strict decoding (JSON; YAML lazily) and building a
:class:`~nvshim.cdi.model.Spec` from a checked document.

:func:`read_document` reads one file and decodes it strictly (duplicate keys, an empty
or non-mapping document are errors); :func:`parse_spec` runs the checker and converts
what it accepted; :func:`load_spec_file` does both. Every failure is a
:class:`~nvshim.errors.CdiSpecError` naming the file. ``yaml`` is imported only when a
``.yaml`` file is read: a create that loads JSON specs needs only the standard library.

A spec's hooks run as root on the host and its mounts and device nodes go into
containers, so a scan of the spec dirs (``check_trust``) holds each file to the config
files' rule (:func:`nvshim.files.check_trusted`: owned by root, writable by root only, in
a directory others cannot write). The check is made on the file descriptor the bytes are
read from, so a spec swapped between a ``stat`` and the read is judged as what was read.
A refused spec is one :class:`UntrustedProblem`, which also carries the device names the
file declares, so that a create asking for one of them can say why it is missing.
"""

from __future__ import annotations

import os
import stat

from nvshim import _jsonc
from nvshim.cdi.check import check_semantics, type_name
from nvshim.cdi.model import NO_FILE, SPEC_EXTENSIONS, UNAPPLIED_EDITS, CdiDevice, Spec
from nvshim.edits import Edits
from nvshim.errors import CdiProblem, CdiSpecError
from nvshim.files import read_upto

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any, BinaryIO, Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = [
    "MAX_SPEC_BYTES",
    "STDIN",
    "UntrustedProblem",
    "read_document",
    "decode_document",
    "read_input_document",
    "parse_spec",
    "load_spec_file",
]

#: The largest spec file read (a spec for a full 8-GPU MIG node is well under 1 MiB).
MAX_SPEC_BYTES = 16 << 20
#: The most values a YAML spec may expand to: what a spec file of MAX_SPEC_BYTES could
#: hold without aliases (every value, "1," or "[]", takes at least two bytes).
MAX_SPEC_VALUES = MAX_SPEC_BYTES // 2 + 1
_IS_A_DIRECTORY = "is a directory, not a spec file"
#: How problems of a spec read from standard input (a path of ``-``) name it.
STDIN = "<stdin>"


def _json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _decode_json(text: str, path: str) -> Any:
    def pairs(items: List[Tuple[str, Any]]) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for key, value in items:
            if key in out:
                problem = CdiProblem(path, "$", f'invalid JSON: duplicate key "{key}"')
                raise CdiSpecError([problem])
            out[key] = value
        return out

    try:
        return _jsonc.loads(text, object_pairs_hook=pairs, parse_constant=_json_constant)
    except ValueError as exc:
        if getattr(exc, "colno", None) is None:  # not a json.JSONDecodeError
            raise CdiSpecError([CdiProblem(path, "$", f"invalid JSON: {exc}")]) from exc
        where = f"line {exc.lineno}, column {exc.colno}"  # type: ignore[attr-defined]
        reason = f"invalid JSON at {where}: {exc.msg}"  # type: ignore[attr-defined]
        raise CdiSpecError([CdiProblem(path, "$", reason)]) from exc
    except RecursionError as exc:
        raise CdiSpecError([CdiProblem(path, "$", f"invalid JSON: {exc}")]) from exc


_YAML_LOADERS: Dict[str, Any] = {}


def _yaml_loader(fast: bool = False) -> Any:
    """A SafeLoader that rejects duplicate mapping keys (built on first use); ``fast``: on
    libyaml's parser (``yaml.CSafeLoader``, several times faster on a large spec) when
    PyYAML has it, else the same pure-Python one."""
    kind = "fast" if fast else "pure"
    if kind in _YAML_LOADERS:
        return _YAML_LOADERS[kind]
    import yaml  # heavy: only YAML files need it

    base = (
        yaml.CSafeLoader if fast and getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader
    )

    class StrictLoader(base):  # type: ignore[misc,valid-type]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if isinstance(node, yaml.MappingNode):
                # Only keys written in this mapping: a "<<" merge may be overridden.
                seen: List[Any] = []
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=deep)
                    try:
                        duplicate = key in seen
                    except TypeError:
                        duplicate = False  # unhashable key: the base class reports it
                    if duplicate:
                        raise yaml.constructor.ConstructorError(
                            None,
                            None,
                            f"duplicate key {_jsonc.dumps(str(key))}",
                            key_node.start_mark,
                        )
                    seen.append(key)
            return super().construct_mapping(node, deep=deep)

    _YAML_LOADERS[kind] = StrictLoader
    return StrictLoader


#: What keeps a YAML text from libyaml's parser: characters where it accepts what PyYAML's
#: own parser refuses (tabs, carriage returns, block scalars, directives; a differential
#: fuzz found no other), so both accept exactly the same documents.
_PURE_ONLY = ("\t", "\r", "|", ">", "\n%")


def _decode_yaml(text: str, path: str) -> Any:
    """The document of YAML ``text``: read without PyYAML when it is a plain spec's text
    (:mod:`nvshim.cdi._plainyaml`, what ``nvshim cdi generate`` writes), else parsed by
    libyaml when PyYAML has it and the text is plain ASCII (see :data:`_PURE_ONLY`), else
    by PyYAML's own parser, which also parses again whatever libyaml refuses: a problem
    quotes its words, whichever parser ran."""
    from nvshim.cdi import _plainyaml

    plain = _plainyaml.load(text)  # a generated spec: read without PyYAML
    if plain is not None:
        return plain
    import yaml

    if text.isascii() and not text.startswith("%") and not any(c in text for c in _PURE_ONLY):
        try:
            return _checked_yaml(yaml.load(text, Loader=_yaml_loader(fast=True)), path)  # noqa: S506
        except (yaml.YAMLError, RecursionError, ValueError):
            pass  # said as the pure parser says it, below
    return _decode_yaml_pure(text, path)


def _checked_yaml(raw: Any, path: str) -> Any:
    """``raw`` unless YAML aliases expand it past :data:`MAX_SPEC_VALUES` values."""
    from nvshim.configcheck import expanded_size

    if expanded_size(raw, MAX_SPEC_VALUES) > MAX_SPEC_VALUES:
        # nested aliases: the checkers and their messages would walk billions of values
        reason = f"more than {MAX_SPEC_VALUES} values once YAML aliases are expanded"
        raise CdiSpecError([CdiProblem(path, "$", reason)])
    return raw


def _decode_yaml_pure(text: str, path: str) -> Any:
    import yaml

    try:
        raw = yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - SafeLoader subclass
        return _checked_yaml(raw, path)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        reason = exc.problem or "syntax error"
        if exc.context:
            reason = f"{exc.context}: {reason}"
        raise CdiSpecError([CdiProblem(path, "$", f"invalid YAML{where}: {reason}")]) from exc
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        # ValueError: a scalar yaml cannot convert (an integer over Python's digit limit,
        # a date like 2024-13-45); it must not escape as a bare ValueError
        raise CdiSpecError([CdiProblem(path, "$", f"invalid YAML: {exc}")]) from exc


class UntrustedProblem(CdiProblem):
    """A spec file the trust rule refuses (``message`` says which rule and the fix);
    ``devices``: the qualified device names the file declares, none when it cannot be
    decoded. It is skipped as any broken spec is."""

    __slots__ = ("devices",)

    devices: Tuple[str, ...]

    def __init__(self, path: str, message: str, devices: Sequence[str] = ()) -> None:
        super().__init__(path, "$", message)
        object.__setattr__(self, "devices", tuple(devices))


def _declared(data: bytes, path: str, ext: str) -> Tuple[str, ...]:
    """The qualified device names a spec's bytes declare (best effort: none when they do
    not decode); only to name an untrusted spec, never to inject from it."""
    try:
        raw = decode_document(data, path, ext)
    except CdiSpecError:
        return ()
    kind = raw.get("kind")
    devices = raw.get("devices")
    if not isinstance(kind, str) or not isinstance(devices, list):
        return ()
    return tuple(
        f"{kind}={d['name']}"
        for d in devices
        if isinstance(d, dict) and isinstance(d.get("name"), str)
    )


def _check_trust(path: str, info: os.stat_result, data: bytes, ext: str) -> None:
    """CdiSpecError (one :class:`UntrustedProblem`) when the file read (``info``: its fstat)
    or its directory fails the config files' trust rule."""
    from nvshim.errors import ConfigError
    from nvshim.files import check_trusted

    try:
        check_trusted(path, info, "CDI spec")
    except ConfigError as exc:
        raise CdiSpecError([UntrustedProblem(path, str(exc), _declared(data, path, ext))]) from exc


def _read_bytes(path: str) -> Tuple[bytes, os.stat_result]:
    """The bytes of the regular file ``path``, at most :data:`MAX_SPEC_BYTES`, and the
    ``fstat`` of the descriptor they were read from.

    Anything else in a spec directory (a FIFO, a symlink to ``/dev/zero`` or a tty) is a
    problem, never read: reading it would block forever or never end, and a scan of the
    spec dirs runs inside ``nvshim-runtime create`` as well as the CLI.
    """
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise CdiSpecError([CdiProblem(path, "$", _IS_A_DIRECTORY)])
        if not stat.S_ISREG(mode):
            raise CdiSpecError([CdiProblem(path, "$", "not a regular file")])
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise CdiSpecError([CdiProblem(path, "$", f"cannot read: {exc.strerror}")]) from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # replaced since the stat above
            raise CdiSpecError([CdiProblem(path, "$", "not a regular file")])
        data = read_upto(fd, info.st_size, MAX_SPEC_BYTES + 1)
        if len(data) > MAX_SPEC_BYTES:
            reason = f"larger than {MAX_SPEC_BYTES >> 20} MiB: not a CDI spec"
            raise CdiSpecError([CdiProblem(path, "$", reason)])
    except OSError as exc:
        raise CdiSpecError([CdiProblem(path, "$", f"cannot read: {exc.strerror}")]) from exc
    finally:
        os.close(fd)
    return data, info


def _not_a_spec_name(path: str, ext: str) -> CdiSpecError:
    """The error for a name without .json/.yaml: what the path is, if it is not a file."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return CdiSpecError([CdiProblem(path, "$", f"cannot read: {exc.strerror}")])
    if stat.S_ISDIR(mode):
        return CdiSpecError([CdiProblem(path, "$", _IS_A_DIRECTORY)])
    reason = f'unknown extension "{ext}": CDI spec files end in .json or .yaml'
    return CdiSpecError([CdiProblem(path, "$", reason)])


def read_document(path: str, check_trust: bool = False) -> Any:
    """Read and strictly decode one spec file into a mapping (CdiSpecError if not);
    ``check_trust``: refuse a file others could have written (the spec dirs' scans)."""
    ext = os.path.splitext(path)[1]
    if ext not in SPEC_EXTENSIONS:
        raise _not_a_spec_name(path, ext)
    data, info = _read_bytes(path)
    if check_trust:
        _check_trust(path, info, data, ext)
    return decode_document(data, path, ext)


def _sniff_format(data: bytes) -> str:
    """How a spec read without a name (stdin) is decoded: ``.json`` when its first
    non-blank character is ``{``, else ``.yaml``."""
    return ".json" if data.lstrip()[:1] == b"{" else ".yaml"


def _read_stream(stream: BinaryIO) -> bytes:
    try:
        data = stream.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise CdiSpecError([CdiProblem(STDIN, "$", f"cannot read: {exc.strerror}")]) from exc
    if len(data) > MAX_SPEC_BYTES:
        reason = f"larger than {MAX_SPEC_BYTES >> 20} MiB: not a CDI spec"
        raise CdiSpecError([CdiProblem(STDIN, "$", reason)])
    return data


def read_input_document(path: str, stdin: Optional[BinaryIO] = None) -> Tuple[Any, str, str]:
    """A spec named on the command line: (the document, its format ``json``/``yaml``, the
    name its problems carry). ``-`` reads ``stdin`` (problems name :data:`STDIN`; JSON if
    it starts with ``{``, else YAML; None: stdin is closed); else as :func:`read_document`.
    """
    if path == "-":
        if stdin is None:
            raise CdiSpecError([CdiProblem(STDIN, "$", "cannot read: standard input is closed")])
        data = _read_stream(stdin)
        ext = _sniff_format(data)
        return decode_document(data, STDIN, ext), ext[1:], STDIN
    return read_document(path), "json" if path.endswith(".json") else "yaml", path


def decode_document(data: bytes, path: str, ext: str) -> Any:
    """Strictly decode the bytes of a spec (``ext`` ``.json`` or ``.yaml``) into a mapping;
    problems name ``path``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CdiSpecError(
            [CdiProblem(path, "$", f"not UTF-8 text: invalid byte at offset {exc.start}")]
        ) from exc
    if not text.strip():
        raise CdiSpecError([CdiProblem(path, "$", "empty document")])
    raw = _decode_json(text, path) if ext == ".json" else _decode_yaml(text, path)
    if raw is None:
        raise CdiSpecError([CdiProblem(path, "$", "empty document")])
    if not isinstance(raw, dict):
        raise CdiSpecError(
            [CdiProblem(path, "$", f"top level must be a mapping, got {type_name(raw)}")]
        )
    return raw


def parse_spec(raw: Mapping[str, Any], path: str = NO_FILE) -> Spec:
    """Build a :class:`Spec` from a decoded document after the semantic checks.

    The checker owns every rule; what it accepts is converted without a second check.
    Raises :class:`CdiSpecError` listing every problem.
    """
    problems = check_semantics(raw, path)
    if problems:
        raise CdiSpecError(problems)
    devices = tuple(
        CdiDevice(
            name=device["name"],
            edits=Edits.from_cdi(device["containerEdits"]),
            unapplied=_unapplied(device["containerEdits"]),
        )
        for device in raw["devices"]
    )
    kind = raw["kind"]
    vendor, class_ = kind.split("/", 1)
    return Spec(
        path=path,
        version=raw["cdiVersion"],
        kind=kind,
        vendor=vendor,
        class_=class_,
        devices=devices,
        edits=Edits.from_cdi(raw.get("containerEdits")),
        raw=raw,
        unapplied=_unapplied(raw.get("containerEdits")),
    )


def _unapplied(edits: Optional[Mapping[str, Any]]) -> Tuple[str, ...]:
    """The :data:`~nvshim.cdi.model.UNAPPLIED_EDITS` fields ``edits`` (a checked
    ``containerEdits``) sets, as CDI counts them: any intelRdt object (even ``{}``: CDI
    would set the container's ``linux.intelRdt``), a non-empty netDevices list."""
    if not edits:
        return ()
    found = [key for key in UNAPPLIED_EDITS if edits.get(key)]
    if edits.get("intelRdt") is not None and "intelRdt" not in found:
        found.insert(0, "intelRdt")
    return tuple(found)


def load_spec_file(path: str, check_trust: bool = False) -> Spec:
    """Read, strictly decode and check one spec file (``.json`` or ``.yaml``).

    Duplicate keys, an empty document, a non-mapping document, and any semantic problem
    are errors: raises :class:`CdiSpecError` (a :class:`CdiError`); so is, with
    ``check_trust``, a file others could have written (an :class:`UntrustedProblem`).
    """
    return parse_spec(read_document(path, check_trust), path)
