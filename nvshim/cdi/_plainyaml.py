"""The YAML of plain CDI specs, without PyYAML: what ``nvshim cdi generate`` writes, read
and written in a few milliseconds where PyYAML takes tens (even through libyaml: its
representer and constructor are Python, one call per value).

A plain spec is mappings and lists of strings, integers and booleans whose every string
is one PyYAML writes plain (unquoted) or single-quoted by the rules below — paths, flags,
versions, device names, YAML 1.1's boolean words and integers — in PyYAML's block style.
:func:`dump` writes such a document in exactly the text PyYAML's ``safe_dump`` (explicit
start, no sorting, block style, no wrapping) writes, and :func:`load` reads exactly such
texts, to exactly the document PyYAML's ``safe_load`` gives. Anything else is not theirs:
:func:`dump` and :func:`load` answer None and the caller uses PyYAML (a string to quote
or escape, a float, null, a list in a list, a comment, a blank line, flow style, another
indentation, a duplicate key). ``tests/unit/cdi/test_plainyaml.py`` holds both to
PyYAML's pure-Python emitter and parser.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any, Dict, List, Optional, Tuple

__all__ = ["dump", "load"]

#: The characters a plain string may start with (``/``, ``_``, letters), after at most two
#: ``-`` (``-I``, ``--link``); ``./`` and ``../`` start one too (a relative link target).
_START = frozenset("/_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
#: The plain words YAML 1.1 reads as booleans or null: PyYAML single-quotes them.
_WORDS = frozenset(
    "yes Yes YES no No NO true True TRUE false False FALSE on On ON off Off OFF "
    "null Null NULL".split()
)
#: (No regular expressions here: importing ``re`` costs more than reading an 8-GPU spec.)


def _plain_start(text: str) -> bool:
    """Whether ``text`` starts as a plain string PyYAML writes unquoted may."""
    dashes = 2 if text[:2] == "--" else 1 if text[:1] == "-" else 0
    return (
        text[dashes : dashes + 1] in _START
        and len(text) > dashes
        or text[:2] == "./"
        or text[:3] == "../"
    )


def _decimal(text: str) -> bool:
    """``0`` or digits without a leading zero (what PyYAML reads as a decimal integer)."""
    return text.isdigit() and text.isascii() and (text == "0" or text[0] != "0")


def _digits(text: str) -> Optional[bool]:
    """For a decimal ``N`` or ``N:M`` (digits): whether PyYAML reads it as an integer
    (``N``, and base 60 ``1:20`` — not ``0:1``, a MIG device's name, nor ``1:60``);
    None for any other text."""
    head, colon, tail = text.partition(":")
    if not _decimal(head):
        return None
    if not colon:
        return True
    if not (tail.isdigit() and tail.isascii()):
        return None
    return head != "0" and (len(tail) == 1 or len(tail) == 2 and tail[0] in "012345")


def _dotted(text: str) -> bool:
    """A version (``0.5.0``, ``550.54.15``): no YAML 1.1 number, a plain string."""
    parts = text.split(".")
    return len(parts) == 3 and all(p.isdigit() and p.isascii() for p in parts)


def _scalar(value: Any) -> Optional[str]:
    """``value`` as PyYAML's SafeDumper writes it in block style, for the few shapes a
    spec's strings, integers and booleans take (None for any other)."""
    if value.__class__ is str:
        if (
            _plain_start(value)
            and value.isascii()
            and value.isprintable()
            and ": " not in value
            and " #" not in value
            and value[-1] not in ": "
        ):
            return f"'{value}'" if value in _WORDS else value
        number = _digits(value)
        if number is not None:
            return f"'{value}'" if number else value
        return value if _dotted(value) else None
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
    text = "[]" if value.__class__ is list else "{}" if value.__class__ is dict else _scalar(value)
    lines.append(f"{head} {text}")
    return text is not None


def dump(spec: Dict[str, Any]) -> Optional[str]:
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


def _member_parts(rest: str) -> Optional[Tuple[str, Optional[str]]]:
    """A member's line less its indentation, ``key:`` or ``key: value``, as (key, value
    or None); None for any other line. The key is plain or single-quoted: neither holds
    ``: ``, so the first one ends it."""
    if rest[:1] == "'":
        end = rest.find("'", 1) + 1
        if not end:
            return None
    elif rest[:1] in ("", " "):
        return None
    else:
        end = rest.find(": ")
        if end < 0:
            end = len(rest) - 1
    key, after = rest[:end], rest[end:]
    if after == ":":
        return key, None
    if after[:2] == ": " and len(after) > 2:
        return key, after[2:]
    return None


class _Text:
    """The lines of a text being read, and the index of the next one."""

    __slots__ = ("lines", "at", "values")

    def __init__(self, lines: List[str]) -> None:
        self.lines = lines
        self.at = 0
        #: scalar text -> its value (a spec repeats most of its words)
        self.values: Dict[str, Any] = {}

    def value(self, text: str) -> Any:
        """:func:`_value` of ``text``, each text judged once."""
        found = self.values.get(text, _NO)
        if found is _NO:
            found = self.values[text] = _value(text)
        return found


#: What :func:`_value` answers for a value that is not plain.
_NO = object()


def _value(text: str) -> Any:
    """The value of a scalar as :func:`_scalar` writes it (:data:`_NO` for any other);
    ``text`` is ASCII (:func:`load` checked)."""
    if text[0] in _START:  # the common case, a word or a path: as _scalar judges it
        if text.isprintable() and ": " not in text and " #" not in text and text[-1] not in ": ":
            if text in _WORDS:
                return text == "true" if text in ("true", "false") else _NO
            return text
        return _NO
    if text[0] == "'":
        inner = text[1:-1]
        if len(text) < 2 or text[-1] != "'" or "'" in inner or not inner.isprintable():
            return _NO
        # single-quoted: only _WORDS and integers are written so, but any such text is
        # that string
        return inner
    if len(text) > 40 and text.lstrip("-")[:1].isdigit():
        return _NO  # a long number: PyYAML's limits on digits are its own
    number = _digits(text)
    if number is not None:
        return int(text) if ":" not in text else _NO if number else text
    if text[0] == "-" and text[1:2].isdigit():
        return int(text) if _decimal(text[1:]) and text != "-0" else _NO
    if text in ("true", "false"):
        return text == "true"
    if _scalar(text) == text:
        return text
    return _NO


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _read_mapping(src: _Text, indent: int, first: Optional[str]) -> Any:
    """The mapping whose members are ``indent`` deep from line ``src.at`` on; ``first``:
    its first member's text when it started on a list item's line (``- key: …``)."""
    out: Dict[str, Any] = {}
    lines = src.lines
    pad = " " * indent
    while True:
        if first is not None:
            rest, first = first, None
        else:
            if src.at >= len(lines):
                return out
            line = lines[src.at]
            if (
                not line.startswith(pad)
                or line[indent : indent + 1] in ("", " ")
                or line[indent : indent + 2] == "- "
            ):
                return out  # less deep (or a list of the mapping above): the mapping ends
            rest = line[indent:]
            src.at += 1
        parts = _member_parts(rest)
        if parts is None:
            return _NO
        key = src.value(parts[0]) if parts[0] else _NO
        if key.__class__ is not str or key in out:
            return _NO
        text = parts[1]
        if text is not None:
            value = [] if text == "[]" else {} if text == "{}" else src.value(text)
        else:
            value = _read_block(src, indent)
        if value is _NO:
            return _NO
        out[key] = value


def _read_block(src: _Text, indent: int) -> Any:
    """The value of a member ``key:`` at depth ``indent``, on the lines below it: a list
    at the key's depth or a mapping two deeper."""
    if src.at >= len(src.lines):
        return _NO
    line = src.lines[src.at]
    depth = _indent(line)
    if depth == indent and line[indent : indent + 2] == "- ":
        return _read_list(src, indent)
    if depth == indent + 2 and line[depth : depth + 2] != "- ":
        return _read_mapping(src, indent + 2, None)
    return _NO  # null, or another indentation


def _read_list(src: _Text, indent: int) -> Any:
    """The list whose items (``- …``) are ``indent`` deep from line ``src.at`` on."""
    out: List[Any] = []
    lines = src.lines
    prefix = " " * indent + "- "
    while src.at < len(lines) and lines[src.at].startswith(prefix):
        rest = lines[src.at][indent + 2 :]
        src.at += 1
        if rest == "[]" or rest == "{}":
            item: Any = [] if rest == "[]" else {}
        elif (": " in rest or rest[-1:] == ":") and not (
            rest[0] == "'" and rest[-1] == "'" and "'" not in rest[1:-1]
        ):
            item = _read_mapping(src, indent + 2, rest)
        else:
            item = src.value(rest) if rest else _NO
        if item is _NO:
            return _NO
        out.append(item)
    return out


def load(text: str) -> Optional[Dict[str, Any]]:
    """The document of a plain spec's YAML ``text`` (see the module), or None: not such a
    text, PyYAML must read it."""
    lines = text.split("\n")
    if lines[-1] != "":
        return None  # written texts end with a newline
    lines.pop()
    if lines and lines[0] == "---":
        del lines[0]
    if (
        not lines
        or not text.isascii()
        or "#" in text
        and (text[0] == "#" or " #" in text or "\n#" in text)
    ):
        return None  # a comment (or not ASCII): PyYAML's
    src = _Text(lines)
    doc = _read_mapping(src, 0, None)
    if doc is _NO or src.at != len(lines) or not doc:
        return None
    result: Dict[str, Any] = doc
    return result
