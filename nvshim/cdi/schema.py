"""The JSON-schema layer of CDI validation (``nvshim cdi validate``): the schema
``cdi-specs/schema.json`` on top of the semantic checker.

Imports jsonschema (heavy) when first used; never on the create path, which applies only
:func:`nvshim.cdi.check.check_semantics`.
"""

from __future__ import annotations

import os
from _collections_abc import Mapping  # loaded by os at start-up; collections.abc is not

from nvshim import _jsonc
from nvshim.cdi.check import check_semantics, key_path
from nvshim.cdi.load import read_input_document
from nvshim.cdi.model import NO_FILE
from nvshim.errors import CdiError, CdiProblem, CdiSpecError

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any, BinaryIO, List, Optional, Sequence

    import jsonschema

__all__ = ["schema_path", "check_schema", "validate_spec", "validate_file"]


def schema_path() -> str:
    """The CDI JSON schema: the packaged copy if installed, else the repository's."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # nvshim/
    packaged = os.path.join(here, "data", "cdi-schema.json")
    if os.path.exists(packaged):
        return packaged
    return os.path.join(os.path.dirname(here), "cdi-specs", "schema.json")


_VALIDATOR: List["jsonschema.protocols.Validator"] = []


def _validator() -> "jsonschema.protocols.Validator":
    if not _VALIDATOR:
        import jsonschema  # heavy: only validation needs it

        location = schema_path()
        try:
            with open(location, encoding="utf-8") as stream:
                schema = _jsonc.loads(stream.read())
        except (OSError, ValueError) as exc:
            raise CdiError(f"cannot read the CDI schema {location}: {exc}") from exc
        cls = jsonschema.validators.validator_for(schema)
        try:
            cls.check_schema(schema)
        except jsonschema.exceptions.SchemaError as exc:
            raise CdiError(f"the CDI schema {location} is invalid: {exc.message}") from exc
        _VALIDATOR.append(cls(schema))
    return _VALIDATOR[0]


def _json_path(parts: Sequence[Any]) -> str:
    out = "$"
    for part in parts:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            out = key_path(out, part)
    return out


def _schema_error_problems(error: Any, file: str) -> List[CdiProblem]:
    """One problem per schema error; required/additionalProperties point at the key."""
    where = _json_path(list(error.absolute_path))
    if error.validator in ("anyOf", "oneOf") and error.context:
        # "null or X": report why the X branch failed, not "not valid under any of".
        real = [
            sub
            for sub in error.context
            if not (sub.validator == "type" and sub.validator_value == "null")
        ]
        if real:
            return [p for sub in real for p in _schema_error_problems(sub, file)]
    if error.validator == "required" and isinstance(error.instance, Mapping):
        return [
            CdiProblem(file, key_path(where, key), "required field is missing")
            for key in error.validator_value
            if key not in error.instance
        ]
    if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
        known = error.schema.get("properties", {})
        return [
            CdiProblem(file, key_path(where, key), f'unknown field "{key}"')
            for key in error.instance
            if key not in known
        ]
    return [CdiProblem(file, where, error.message)]


def check_schema(raw: Any, path: str = NO_FILE) -> List[CdiProblem]:
    """Problems found by the JSON schema alone (imports jsonschema)."""
    problems: List[CdiProblem] = []
    for error in _validator().iter_errors(raw):
        for problem in _schema_error_problems(error, path):
            if problem not in problems:
                problems.append(problem)
    return problems


def validate_spec(raw: Any, path: str = NO_FILE) -> List[CdiProblem]:
    """Every problem of a decoded spec: semantic rules plus the JSON schema.

    Where both layers report at the same JSON path, the semantic message (which names
    the value and the rule) is kept. Semantic problems come first, in the order the
    reference implementation checks; then any the schema alone found. Never raises for
    any input shape.
    """
    semantic = check_semantics(raw, path)
    covered = {p.json_path for p in semantic}
    extra = [p for p in check_schema(raw, path) if p.json_path not in covered]
    return semantic + extra


def validate_file(path: str, stdin: Optional[BinaryIO] = None) -> List[CdiProblem]:
    """Every problem of one spec file (``-``: ``stdin``, when given); decoding errors are
    one problem each."""
    try:
        raw, _, label = read_input_document(path, stdin)
    except CdiSpecError as exc:
        return exc.problems
    return validate_spec(raw, label)
