"""Spec YAML through libyaml: the same documents, texts and error words as PyYAML's own
parser and emitter, only faster (the speed itself: bench/cli.py)."""

from __future__ import annotations

from typing import Any, Dict

import pytest
import yaml

from nvshim.cdi.load import decode_document
from nvshim.cdi.write import dump_spec
from nvshim.errors import CdiSpecError

pytestmark = pytest.mark.skipif(not getattr(yaml, "__with_libyaml__", False),
                                reason="this PyYAML has no libyaml")

DEV0 = {"name": "0", "containerEdits": {"env": ["A=1"]}}


def _pure_dump(doc: Dict[str, Any]) -> str:
    return yaml.dump(doc, Dumper=yaml.SafeDumper, explicit_start=True, sort_keys=False,
                     default_flow_style=False, width=2**30)


@pytest.mark.parametrize("value", [
    "", "0", "yes", "null", "~", "=", "<<", "1.5", "1:20", "0x1f", "2024-01-01", " lead",
    "trail ", "a: b", "a #b", "#c", "- x", "--link", "a::b", "é", "日本", "\U0001F600",
    "tab\there", "line\nbreak", 'q"uote', "it's", "\\back", "x" * 300, "\x07", "\u2028",
])
def test_yaml_dump_is_pyyaml_own_text(value: str) -> None:
    """A spec holding an awkward string (as a value, a list item and an annotation key)
    is written in exactly the bytes PyYAML's pure-Python emitter writes."""
    doc = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
           "annotations": {value: value, "k": value},
           "devices": [dict(DEV0, containerEdits={"env": [f"A={value}"],
                                                   "hooks": [{"hookName": "createContainer",
                                                              "path": "/h",
                                                              "args": ["h", value]}]})]}
    assert dump_spec(doc) == _pure_dump(doc)


def test_yaml_dump_of_an_empty_key_is_pyyaml_own_text() -> None:
    """An empty annotation key (libyaml writes it as a simple key, PyYAML as a complex
    one) is written as PyYAML writes it."""
    doc = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [DEV0],
           "containerEdits": {"env": ["A=1"]}, "annotations": {"": "x"}}
    assert "? ''" in dump_spec(doc)


@pytest.mark.parametrize("text", [
    "kind: a\t\n",                     # a tab after a value
    "kind: |#\n",                      # a block scalar header followed by a comment mark
    "kind: a\n\t\n",                   # a tab on a line of its own
])
def test_yaml_that_pyyaml_refuses_stays_refused(text: str) -> None:
    """A text libyaml would accept but PyYAML's parser refuses is still invalid YAML."""
    with pytest.raises(CdiSpecError) as caught:
        decode_document(text.encode(), "s.yaml", ".yaml")
    assert "invalid YAML" in str(caught.value)


@pytest.mark.parametrize("text, words", [
    ("kind: [a\n", "while parsing a flow sequence: expected ',' or ']', but got "
                   "'<stream end>'"),
    ("a: [1,\n", "while parsing a flow node: expected the node content, but found "
                 "'<stream end>'"),
    ("a: 1\nb: 2\na: 3\n", 'at line 3, column 1: duplicate key "a"'),
])
def test_yaml_errors_keep_pyyaml_words(text: str, words: str) -> None:
    """Where libyaml words a syntax error otherwise, the problem still quotes PyYAML."""
    with pytest.raises(CdiSpecError) as caught:
        decode_document(text.encode(), "s.yaml", ".yaml")
    assert words in str(caught.value)


@pytest.mark.parametrize("text", [
    "kind: nvidia.com/gpu\nn: 0\nm: 0755\no: 0x1f\np: 1_000\nq: 1:20\nr: yes\ns: ~\n"
    "t: 2024-01-01\nu: .inf\nv: '0'\nw: \"x\\u00e9\"\nx: [a, {b: c}]\ny: &a z\nz: *a\n",
    "---\nkind: a/b\nlist:\n- - 1\n  - 2\n- {}\n- []\n...\n",
    "kind: é\nname: 日本\n",               # not ASCII: PyYAML's own parser
    "kind: a\r\nb: c\r\n",               # CRLF: PyYAML's own parser
])
def test_yaml_documents_equal_pyyaml_own(text: str) -> None:
    """A YAML spec decodes to the very document PyYAML's pure-Python parser gives."""
    expected = yaml.load(text, Loader=yaml.SafeLoader)  # noqa: S506 - SafeLoader itself
    assert decode_document(text.encode(), "s.yaml", ".yaml") == expected
