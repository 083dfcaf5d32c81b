"""JSON on the create path without the ``json`` package: CPython's ``_json`` directly.

``import json`` is costly (BENCHMARKS.md, figures), nearly all of it ``re`` (compiled at import for
the decoder's whitespace and number patterns), which pulls in ``enum``, ``functools`` and
``collections`` — as much as the rest of a GPU create's imports together. The parsing and
string escaping are done by the ``_json`` accelerator module either way; this module calls
it without the package around it.

- :func:`loads` gives exactly what ``json.loads`` gives. Anything the fast path does not
  handle (invalid JSON, a BOM, UTF-16, surrogates) is handed to ``json.loads`` itself, so
  results and error messages (``JSONDecodeError`` with line and column) are the same.
- :func:`dumps` gives exactly what ``json.dumps`` gives for JSON data (dict/list/tuple/
  str/int/float/bool/None with string keys) with ``indent`` (None, an int or a string)
  and ``separators``; anything else goes to ``json.dumps``. The compact form is encoded
  by the C encoder; the indented one, which the C encoder in 3.11 cannot do, by a small
  recursive writer using the C string escaper.

A differential property test (tests/unit/test_jsonc.py) checks both against ``json``.
"""

from __future__ import annotations

import _json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple, Union

__all__ = ["dumps", "loads"]

_INF = float("inf")
_CONSTANTS = {"NaN": float("nan"), "Infinity": _INF, "-Infinity": -_INF}
_WS = " \t\n\r"


class _Context:
    """The attributes ``_json.make_scanner`` reads (those of a default JSONDecoder)."""

    strict = True
    object_hook = None
    object_pairs_hook: Any = None
    parse_float: Any = float
    parse_int: Any = int
    parse_constant = _CONSTANTS.__getitem__


_scan = _json.make_scanner(_Context())  # type: ignore[arg-type]  # duck-typed decoder


_SCANNERS: Dict[Tuple[Any, Any, Any, Any], Any] = {(None, None, None, None): _scan}


def loads(
    data: Union[str, bytes],
    object_pairs_hook: Any = None,
    parse_constant: Any = None,
    parse_int: Any = None,
    parse_float: Any = None,
) -> Any:
    """``json.loads(data, ...)``, without importing ``json`` for well-formed UTF-8 input.

    An exception raised by a hook (e.g. a duplicate-key check) is raised again by
    ``json.loads`` itself, so callers see exactly what json would give them.
    """
    key = (object_pairs_hook, parse_constant, parse_int, parse_float)
    scan = _SCANNERS.get(key)
    if scan is None:
        context = _Context()
        context.object_pairs_hook = object_pairs_hook
        if parse_constant is not None:
            context.parse_constant = parse_constant  # type: ignore[method-assign]
        if parse_int is not None:
            context.parse_int = parse_int
        if parse_float is not None:
            context.parse_float = parse_float
        scan = _SCANNERS[key] = _json.make_scanner(context)  # type: ignore[arg-type]
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        start = len(text) - len(text.lstrip(_WS))
        value, end = scan(text, start)
        if end == len(text) or not text[end:].strip(_WS):
            return value
    except (ValueError, StopIteration, RecursionError, SystemError):
        # Not the simple case: json.loads below decides, with its own messages. (The C
        # scanner raises json.decoder.JSONDecodeError only when json.decoder is already
        # imported; before that, malformed input ends in a SystemError.)
        pass
    import json

    return json.loads(
        data,
        object_pairs_hook=object_pairs_hook,
        parse_constant=parse_constant,
        parse_int=parse_int,
        parse_float=parse_float,
    )


def _float(value: float) -> str:
    if value != value:
        return "NaN"
    if value == _INF:
        return "Infinity"
    if value == -_INF:
        return "-Infinity"
    return float.__repr__(value)


class _Fallback(Exception):
    """A value this writer does not handle: json.dumps decides."""


def _write(
    value: Any,
    out: List[str],
    indent: str,
    level: int,
    item_sep: str,
    key_sep: str,
    quote: Any,
    default: Any,
) -> None:
    if isinstance(value, str):
        out.append(quote(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(_float(value))
    elif isinstance(value, (list, tuple)):
        if not value:
            out.append("[]")
            return
        inner = "\n" + indent * (level + 1)
        out.append("[" + inner)
        for i, item in enumerate(value):
            if i:
                out.append(item_sep + inner)
            _write(item, out, indent, level + 1, item_sep, key_sep, quote, default)
        out.append("\n" + indent * level + "]")
    elif isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        inner = "\n" + indent * (level + 1)
        out.append("{" + inner)
        first = True
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Fallback
            if not first:
                out.append(item_sep + inner)
            first = False
            out.append(quote(key) + key_sep)
            _write(item, out, indent, level + 1, item_sep, key_sep, quote, default)
        out.append("\n" + indent * level + "}")
    elif default is not None:
        _write(default(value), out, indent, level, item_sep, key_sep, quote, default)
    else:
        raise _Fallback


def _no_default(value: Any) -> Any:
    raise _Fallback


def dumps(
    value: Any,
    indent: Union[None, int, str] = None,
    separators: Optional[Tuple[str, str]] = None,
    ensure_ascii: bool = True,
    default: Any = None,
) -> str:
    """``json.dumps(value, indent=..., separators=..., ensure_ascii=..., default=...)``."""
    if separators is None:
        separators = (", ", ": ") if indent is None else (",", ": ")
    item_sep, key_sep = separators
    quote = _json.encode_basestring_ascii if ensure_ascii else _json.encode_basestring
    try:
        if indent is None:
            encoder = _json.make_encoder(
                {}, default or _no_default, quote, None, key_sep, item_sep, False, False, True
            )
            return "".join(encoder(value, 0))
        out: List[str] = []
        pad = " " * indent if isinstance(indent, int) else indent
        _write(value, out, pad, 0, item_sep, key_sep, quote, default)
        return "".join(out)
    except (_Fallback, RecursionError, ValueError, TypeError):
        pass  # not plain JSON data: json.dumps below decides (and raises what it raises)
    import json

    return json.dumps(
        value, indent=indent, separators=separators, ensure_ascii=ensure_ascii, default=default
    )
