"""The exception tree's own behaviour: one-line messages, fields instead of spliced text."""

from __future__ import annotations

from nvshim.errors import SPEC_FILE, NvshimError, SpecError
from nvshim.runtime.claim import image_view


def test_spec_error_builds_its_message_from_its_file() -> None:
    """A SpecError keeps its file and detail as fields; the message is ``<file>: <detail>``."""
    error = SpecError("process must be an object", "/b/config.json")
    assert (error.file, error.detail) == ("/b/config.json", "process must be an object")
    assert str(error) == "/b/config.json: process must be an object"
    assert (
        str(SpecError("oci state: bundle must be absolute")) == "oci state: bundle must be absolute"
    )
    assert SpecError("x").file is None and isinstance(SpecError("x"), NvshimError)


def test_spec_error_in_file_names_another_file_without_touching_text() -> None:
    """in_file gives the same detail about another file: a pure reader's generic config.json
    becomes the bundle's path by field, whatever the detail says."""
    try:
        image_view({"process": []})
    except SpecError as exc:
        assert exc.file == SPEC_FILE and str(exc) == "config.json: process must be an object"
        named = exc.in_file("/run/b/config.json")
    assert str(named) == "/run/b/config.json: process must be an object"
    # a detail that itself starts with "config.json: " is kept as it is
    tricky = SpecError("config.json: x", SPEC_FILE).in_file("/b/config.json")
    assert str(tricky) == "/b/config.json: config.json: x"


def test_one_line_escapes_every_control_character_and_is_idempotent() -> None:
    """The one helper for container-controlled text escapes C0/C1 controls, DEL, ESC, line
    and paragraph separators, bidi controls and lone surrogates as repr does, keeps
    backslashes and printable text, cuts past its limit, and changes nothing it returned."""
    from nvshim.errors import one_line

    hostile = "a\nb\rc\td\x1b[31me\x7f\x85\u2028\u2029\u202e\u2066\u200f\ud800\\n é 日本"
    shown = one_line(hostile)
    assert shown == (
        "a\\nb\\rc\\td\\x1b[31me\\x7f\\x85\\u2028\\u2029\\u202e\\u2066\\u200f\\ud800\\n é 日本"
    )
    assert shown.isprintable() and one_line(shown) == shown
    cut = one_line("v" * 300_000 + "\n", 253)
    assert len(cut) <= 253 and cut.endswith("more characters)") and one_line(cut, 253) == cut
    assert one_line("x" * 5000, None) == "x" * 5000


def test_an_error_quoting_a_container_value_is_one_escaped_line() -> None:
    """An NvshimError quoting a value the container wrote (ESC, CR, a bidi override) prints
    it escaped, on one line."""
    from nvshim.errors import RequestError

    text = str(RequestError('unknown device "0\r\x1b[2Kgranted\u202e"'))
    assert text == 'unknown device "0\\r\\x1b[2Kgranted\\u202e"'
