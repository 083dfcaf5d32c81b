"""nvshim._jsonc: the create path's JSON, checked against the json package it stands in for."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvshim import _jsonc

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text()
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=30,
)
INDENTS = [None, 0, 2, "\t", "  "]
SEPARATORS = [None, (",", ":"), (", ", ": "), (",", ": ")]


def same(a, b) -> bool:
    """Equal, with NaN equal to NaN (json round-trips it as NaN)."""
    return json.dumps(a) == json.dumps(b)


@settings(max_examples=300, deadline=None)
@given(values, st.sampled_from(INDENTS), st.sampled_from(SEPARATORS), st.booleans())
def test_dumps_is_json_dumps(value, indent, separators, ensure_ascii):
    """Every JSON value encodes to the same text as json.dumps with the same layout options."""
    assert _jsonc.dumps(value, indent, separators, ensure_ascii) == json.dumps(
        value, indent=indent, separators=separators, ensure_ascii=ensure_ascii
    )


@settings(max_examples=300, deadline=None)
@given(values, st.sampled_from(INDENTS))
def test_loads_is_json_loads(value, indent):
    """Text json.dumps wrote (str and UTF-8 bytes) decodes to the same value as json.loads."""
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    assert same(_jsonc.loads(text), json.loads(text))
    assert same(_jsonc.loads(text.encode()), json.loads(text.encode()))


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"  ",
        b"{",
        b'{"a": 1} x',
        b'{"a": 1}{}',
        b"\xef\xbb\xbf{}",
        b"[1,]",
        b'{"a":\x01}',
        b"\xff",
        "{}".encode("utf-16"),
        b'"\\ud800"',
        b"NaN",
        b" -Infinity ",
        b"1e400",
        b"-0",
    ],
)
def test_odd_input_gives_what_json_gives(raw):
    """Malformed or unusual input gives json.loads's value, or its error with the same message."""
    try:
        expected = ("ok", json.loads(raw))
    except ValueError as exc:
        expected = ("error", type(exc), str(exc))
    try:
        got = ("ok", _jsonc.loads(raw))
    except ValueError as exc:
        got = ("error", type(exc), str(exc))
    if expected[0] == "ok" and isinstance(expected[1], float) and math.isnan(expected[1]):
        assert got[0] == "ok" and math.isnan(got[1])
    else:
        assert got == expected


def test_non_json_values_go_to_json_dumps():
    """Values json.dumps rejects (a set) or converts (a non-string key) get json's answer."""
    assert _jsonc.dumps({1: 2}, indent=2) == json.dumps({1: 2}, indent=2)
    with pytest.raises(TypeError):
        _jsonc.dumps({1, 2})


def test_importing_it_does_not_import_json_or_re():
    """The point of the module: loads/dumps of ordinary data load neither json nor re."""
    code = (
        "import sys; from nvshim import _jsonc; "
        "_jsonc.dumps(_jsonc.loads(b'{\"a\": [1, 2.5, null]}'), indent='\\t'); "
        "print(sorted(m for m in ('json', 're', 'enum') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import sys; sys.path[0:0] = {sys.path!r}; {code}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "[]"


def test_malformed_input_in_a_fresh_process_is_json_decode_error():
    """Before json is imported, the C scanner cannot raise JSONDecodeError itself; the
    error still comes out as json's, with line and column."""
    code = (
        "from nvshim import _jsonc\n"
        "try:\n    _jsonc.loads(b'{\"a\": 1,')\n"
        "except ValueError as exc:\n    print(type(exc).__name__, exc.lineno, exc.colno)\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import sys; sys.path[0:0] = {sys.path!r}\n{code}"],
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == "JSONDecodeError 1 9", out.stderr
