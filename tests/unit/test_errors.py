"""The exception tree's own behaviour: one-line messages, fields instead of spliced text."""

from __future__ import annotations

from nvshim.errors import SPEC_FILE, NvshimError, SpecError
from nvshim.runtime.claim import image_view


def test_spec_error_builds_its_message_from_its_file() -> None:
    """A SpecError keeps its file and detail as fields; the message is ``<file>: <detail>``."""
    error = SpecError("process must be an object", "/b/config.json")
    assert (error.file, error.detail) == ("/b/config.json", "process must be an object")
    assert str(error) == "/b/config.json: process must be an object"
    assert str(SpecError("oci state: bundle must be absolute")) == "oci state: bundle must be absolute"
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
