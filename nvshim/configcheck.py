"""The checked path to a :class:`~nvshim.config.Config`: YAML → mapping → schema.

:func:`checked_mapping` parses the YAML (noting keys given twice, refusing a document
whose aliases expand past :data:`_MAX_VALUES` values: :func:`expanded_size`) and
validates it against ``config/nvshim.schema.json`` with jsonschema; every unknown key and
bad value is found in one pass and reported in one line naming the file, each key and
what is allowed (with the key or value a near miss probably meant:
:func:`describe_problems`).

Off the create path: :func:`nvshim.config.parse_config_text` imports it, and
:func:`nvshim.config.load_config` calls that only when the YAML has no compiled copy that
matches it (``nvshim config compile``, ``nvshim doctor`` and a stale node do).
yaml and jsonschema are imported inside the functions that need them.
"""

from __future__ import annotations

import os

from nvshim.errors import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping

__all__ = ["checked_mapping", "describe_problems", "expanded_size"]


def _schema() -> Dict[str, Any]:
    import json

    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (
        os.path.join(here, "data", "config-schema.json"),
        os.path.join(os.path.dirname(here), "config", "nvshim.schema.json"),
    ):
        if os.path.exists(candidate):
            with open(candidate, encoding="utf-8") as fh:
                loaded: Dict[str, Any] = json.load(fh)
                return loaded
    raise ConfigError("config schema is missing from the nvshim installation")


#: More values than any nvshim config holds (the shipped one has about 40).
_MAX_VALUES = 100_000


def expanded_size(value: Any, limit: int) -> int:
    """How many values a decoded YAML document holds once its aliases are expanded,
    counted up to just past ``limit``.

    YAML aliases make two places of a document one Python object, so a few hundred bytes
    of nested ``&anchor``/``*alias`` pairs (a "billion laughs") decode in microseconds into
    a tree of billions of values, and whatever then walks the tree (a schema validator,
    an error message quoting a value) never finishes. Each distinct list or mapping is
    visited once here, so counting costs what the document's text does. A collection
    that holds itself (``&a [*a]``) is endless, so counts as more than ``limit``.
    """
    return _size(value, limit, {})


def _size(value: Any, limit: int, seen: Dict[int, int]) -> int:
    if not isinstance(value, (list, dict)):
        return 1
    known = seen.get(id(value))
    if known is not None:
        return known
    seen[id(value)] = limit + 1  # met again inside itself: a YAML alias to its own anchor
    total = 1
    for item in value.values() if isinstance(value, dict) else value:
        total += _size(item, limit, seen)
        if total > limit:
            break
    seen[id(value)] = total
    return total


def _quote(value: Any, limit: int = 120) -> str:
    """A value as a message shows it: JSON where it is JSON, cut to ``limit`` characters
    (one long value must not push the other problems out of a message)."""
    import json

    try:
        text = json.dumps(value)
    except TypeError:  # YAML has dates, sets and binary values that JSON has not
        text = (
            str(value)
            if isinstance(value, (list, dict, set))
            else f"{value} (a {type(value).__name__})"
        )
    return text if len(text) <= limit else text[:limit] + "…"


def _describe_allowed(schema: Mapping[str, Any], plural: bool = False) -> str:
    """What ``schema`` accepts, in words: ``an absolute path or null``, ``one of "a", "b"``
    (``plural``: what each item of a list must be)."""
    import json

    if "enum" in schema:
        values = ", ".join(json.dumps(v) for v in schema["enum"])
        return f"values from {values}" if plural else f"one of {values}"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind else []
    words = [_describe_type(k, schema, plural) for k in kinds]
    return " or ".join(words) if words else ("valid values" if plural else "a valid value")


#: How the schema's patterns read in a message (one, several).
_PATTERN_WORDS = {
    "^/": ("an absolute path", "absolute paths"),
    "^[^\\s]+$": ("a string without spaces", "strings without spaces"),
}


def _describe_type(kind: str, schema: Mapping[str, Any], plural: bool) -> str:
    def noun(one: str, many: str) -> str:
        return many if plural else one

    if kind == "null":
        return "null"
    if kind == "string":
        pattern = schema.get("pattern")
        if pattern in _PATTERN_WORDS:
            return noun(*_PATTERN_WORDS[pattern])
        if pattern:
            return noun(f"a string matching {pattern}", f"strings matching {pattern}")
        if schema.get("minLength"):
            return noun("a non-empty string", "non-empty strings")
        return noun("a string", "strings")
    if kind in ("integer", "number"):
        text = noun("an integer", "integers") if kind == "integer" else noun("a number", "numbers")
        bounds = [
            f"{word} {schema[limit]}"
            for limit, word in (
                ("exclusiveMinimum", "above"),
                ("minimum", "at least"),
                ("exclusiveMaximum", "below"),
                ("maximum", "at most"),
            )
            if limit in schema
        ]
        return ", ".join([text, " and ".join(bounds)]) if bounds else text
    if kind == "array":
        items = schema.get("items")
        text = (
            noun("a list", "lists")
            + " of "
            + (_describe_allowed(items, plural=True) if items else "values")
        )
        least = schema.get("minItems", 0)
        if least:
            text += " (at least one)" if least == 1 else f" (at least {least})"
        return text
    if kind == "object":
        return noun("a mapping", "mappings")
    return noun(f"a {kind}", f"{kind}s")


def _did_you_mean(word: Any, choices: Any) -> str:
    """`` (did you mean "x"?)`` when ``word`` is a near miss of one of ``choices``, else ""."""
    import difflib

    if not isinstance(word, str):
        return ""
    strings = [c for c in choices if isinstance(c, str)]
    close = difflib.get_close_matches(word, strings, n=1) or difflib.get_close_matches(
        word.lower(), strings, n=1
    )
    return f' (did you mean "{close[0]}"?)' if close else ""


def _unique_key_loader(yaml: Any, duplicates: List[str]) -> Any:
    """yaml's SafeLoader, noting in ``duplicates`` each key given twice in one mapping.

    ``require-allocation: true`` followed later by ``require-allocation: false`` is a
    mistake either way; silently keeping one of them (what YAML does) hides it.
    """

    class UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: Dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: SafeLoader reports it itself
                    continue
                if first is not None:
                    duplicates.append(f'line {line}: duplicate key "{key}" (first on line {first})')
                else:
                    seen[key] = line
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def _load_yaml(data: bytes, path: str, duplicates: List[str]) -> Dict[Any, Any]:
    """The YAML's top-level mapping; a file YAML cannot read at all is one ConfigError."""
    import yaml

    try:
        doc = yaml.load(data, Loader=_unique_key_loader(yaml, duplicates)) if data.strip() else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"config {path}:{where} {problem}") from exc
    except RecursionError as exc:  # yaml composes nested collections recursively
        raise ConfigError(f"config {path}: invalid YAML: nested too deeply") from exc
    except ValueError as exc:
        # a scalar yaml cannot convert: a date like 2024-13-45, an integer over Python's
        # digit limit
        raise ConfigError(f"config {path}: invalid YAML: {exc}") from exc
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(
            f"config {path}: top level must be a mapping of keys, got {type(doc).__name__}"
        )
    if expanded_size(doc, _MAX_VALUES) > _MAX_VALUES:
        # YAML aliases share one object, so a few hundred bytes can stand for billions of
        # values: validating or printing them would never end
        raise ConfigError(
            f"config {path}: more than {_MAX_VALUES} values once YAML aliases are expanded"
        )
    return doc


def _key_problems(doc: Mapping[Any, Any]) -> List[str]:
    """Everything wrong with the keys and values of ``doc``, in the document's order: each
    unknown key (with the key it may have meant) and each value the schema refuses (with
    what it allows)."""
    import jsonschema

    schema = _schema()
    props: Mapping[str, Any] = schema["properties"]
    known = {key: value for key, value in doc.items() if key in props}
    by_key: Dict[str, List[Any]] = {}
    for err in jsonschema.Draft202012Validator(schema).iter_errors(known):
        parts = list(err.absolute_path)
        by_key.setdefault(str(parts[0]) if parts else "", []).append(err)
    problems: List[str] = []
    listed_allowed = False
    for key in [*doc, *(k for k in by_key if k not in doc)]:
        if key not in props and key != "":
            hint = _did_you_mean(str(key), props)
            if not hint and not listed_allowed:  # the whole list once is enough
                hint = f" (allowed: {', '.join(sorted(props))})"
                listed_allowed = True
            problems.append(f'unknown key "{key}"{hint}')
            continue
        for err in sorted(by_key.get(key, []), key=lambda e: list(e.absolute_path)[1:]):
            problems.append(_value_problem(err, props))
    return problems


def _value_problem(err: Any, props: Mapping[str, Any]) -> str:
    """One jsonschema error as ``"key[i]" is VALUE, must be WHAT``."""
    parts = list(err.absolute_path)
    key = str(parts[0]) if parts else "?"
    sub = "".join(f"[{p}]" for p in parts[1:])
    key_schema: Mapping[str, Any] = props.get(key, {})
    target = key_schema.get("items", key_schema) if sub else key_schema
    if err.validator == "uniqueItems":
        allowed = "a list without duplicates"
    else:
        allowed = _describe_allowed(target)
    hint = _did_you_mean(err.instance, target["enum"]) if err.validator == "enum" else ""
    return f'"{key}{sub}" is {_quote(err.instance)}, must be {allowed}{hint}'


def describe_problems(path: str, problems: List[str]) -> str:
    """One line for any number of problems: ``config PATH: P`` or
    ``config PATH: N problems: P1; P2`` (a terminal and containerd's log show one line)."""
    if len(problems) == 1:
        return f"config {path}: {problems[0]}"
    return f"config {path}: {len(problems)} problems: " + "; ".join(problems)


def checked_mapping(data: bytes, path: str) -> Dict[Any, Any]:
    """The YAML's mapping, checked: YAML → mapping → jsonschema (for
    :func:`nvshim.config.parse_config_text`, which makes the :class:`~nvshim.config.Config`).

    Every problem is found in one pass (keys given twice, unknown keys, values of the wrong
    type or out of range) and reported in one ConfigError.
    """
    duplicates: List[str] = []
    doc = _load_yaml(data, path, duplicates)
    problems = duplicates + _key_problems(doc)
    if problems:
        raise ConfigError(describe_problems(path, problems))
    return doc
