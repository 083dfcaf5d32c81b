"""Spec YAML through libyaml and nvshim's own writer: the same documents, texts and error
words as PyYAML's pure-Python parser and emitter, only faster (the speed: bench/cli.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from nvshim.cdi import _plainyaml
from nvshim.cdi.load import decode_document
from nvshim.cdi.write import _ordered as dump_ordered
from nvshim.cdi.write import dump_spec
from nvshim.errors import CdiSpecError

pytestmark = pytest.mark.skipif(
    not getattr(yaml, "__with_libyaml__", False), reason="this PyYAML has no libyaml"
)

DEV0 = {"name": "0", "containerEdits": {"env": ["A=1"]}}


def _pure_dump(doc: Dict[str, Any]) -> str:
    return yaml.dump(
        doc,
        Dumper=yaml.SafeDumper,
        explicit_start=True,
        sort_keys=False,
        default_flow_style=False,
        width=2**30,
    )


@pytest.mark.parametrize(
    "value",
    [
        "",
        "0",
        "yes",
        "null",
        "~",
        "=",
        "<<",
        "1.5",
        "1:20",
        "0x1f",
        "2024-01-01",
        " lead",
        "trail ",
        "a: b",
        "a #b",
        "#c",
        "- x",
        "--link",
        "a::b",
        "é",
        "日本",
        "\U0001f600",
        "tab\there",
        "line\nbreak",
        'q"uote',
        "it's",
        "\\back",
        "x" * 300,
        "\x07",
        "\u2028",
        "a:",
        "-",
        "-I",
        "--",
        "--link",
        "---x",
        "./x",
        "../x",
        "...x",
        ".5",
        "-1",
        "0:1",
        "1:0",
        "00",
        "0.5.0",
        "1.0",
        "a b",
        "a  b",
        "x" * 127,
        "x" * 128,
        "a [b] {c}, d; e",
        "é" * 70,
    ],
)
def test_yaml_dump_is_pyyaml_own_text(value: str) -> None:
    """A spec holding an awkward string (as a value, a list item and an annotation key)
    is written in exactly the bytes PyYAML's pure-Python emitter writes."""
    doc = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "annotations": {value: value, "k": value},
        "devices": [
            dict(
                DEV0,
                containerEdits={
                    "env": [f"A={value}"],
                    "hooks": [{"hookName": "createContainer", "path": "/h", "args": ["h", value]}],
                },
            )
        ],
    }
    assert dump_spec(doc) == _pure_dump(doc)


def test_yaml_dump_of_an_empty_key_is_pyyaml_own_text() -> None:
    """An empty annotation key (libyaml writes it as a simple key, PyYAML as a complex
    one) is written as PyYAML writes it."""
    doc = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [DEV0],
        "containerEdits": {"env": ["A=1"]},
        "annotations": {"": "x"},
    }
    assert "? ''" in dump_spec(doc)


@pytest.mark.parametrize(
    "text",
    [
        "kind: a\t\n",  # a tab after a value
        "kind: |#\n",  # a block scalar header followed by a comment mark
        "kind: a\n\t\n",  # a tab on a line of its own
    ],
)
def test_yaml_that_pyyaml_refuses_stays_refused(text: str) -> None:
    """A text libyaml would accept but PyYAML's parser refuses is still invalid YAML."""
    with pytest.raises(CdiSpecError) as caught:
        decode_document(text.encode(), "s.yaml", ".yaml")
    assert "invalid YAML" in str(caught.value)


@pytest.mark.parametrize(
    "text, words",
    [
        (
            "kind: [a\n",
            "while parsing a flow sequence: expected ',' or ']', but got '<stream end>'",
        ),
        (
            "a: [1,\n",
            "while parsing a flow node: expected the node content, but found '<stream end>'",
        ),
        ("a: 1\nb: 2\na: 3\n", 'at line 3, column 1: duplicate key "a"'),
    ],
)
def test_yaml_errors_keep_pyyaml_words(text: str, words: str) -> None:
    """Where libyaml words a syntax error otherwise, the problem still quotes PyYAML."""
    with pytest.raises(CdiSpecError) as caught:
        decode_document(text.encode(), "s.yaml", ".yaml")
    assert words in str(caught.value)


@pytest.mark.parametrize(
    "text",
    [
        "kind: nvidia.com/gpu\nn: 0\nm: 0755\no: 0x1f\np: 1_000\nq: 1:20\nr: yes\ns: ~\n"
        "t: 2024-01-01\nu: .inf\nv: '0'\nw: \"x\\u00e9\"\nx: [a, {b: c}]\ny: &a z\nz: *a\n",
        "---\nkind: a/b\nlist:\n- - 1\n  - 2\n- {}\n- []\n...\n",
        "kind: é\nname: 日本\n",  # not ASCII: PyYAML's own parser
        "kind: a\r\nb: c\r\n",  # CRLF: PyYAML's own parser
    ],
)
def test_yaml_documents_equal_pyyaml_own(text: str) -> None:
    """A YAML spec decodes to the very document PyYAML's pure-Python parser gives."""
    expected = yaml.load(text, Loader=yaml.SafeLoader)  # noqa: S506 - SafeLoader itself
    assert decode_document(text.encode(), "s.yaml", ".yaml") == expected


_TEXT = st.lists(
    st.sampled_from(
        list("aZ09/_.-:=,+@ #'\"[]{}!&*|>%`?~\\\té\n")
        + ["yes", "null", "On", "..", "--", ": ", "0:1", "1:20", "0.5.0", "1.0"]
    ),
    max_size=6,
).map("".join)
_VALUES = st.recursive(
    st.one_of(_TEXT, st.integers(-5, 10**6), st.booleans(), st.none()),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_TEXT, inner, max_size=3)),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_TEXT, _VALUES, min_size=1, max_size=4))
def test_yaml_dump_of_any_document_is_pyyaml_own_text(doc: Dict[str, Any]) -> None:
    """Whichever writer runs (nvshim's own for plain specs, libyaml, PyYAML), the YAML
    text is byte for byte what PyYAML's pure-Python emitter writes."""
    assert dump_spec(doc) == _pure_dump(dump_ordered(doc))


@pytest.mark.skipif(os.geteuid() != 0, reason="simulated nodes need root (mknod)")
@pytest.mark.parametrize("caps", ["compute,utility", "all"])
def test_a_generated_spec_is_written_without_pyyaml(tmp_path: Path, caps: str) -> None:
    """A generated spec (MIG devices, graphics links, the hook's arguments) is written by
    nvshim's own writer, in exactly PyYAML's text, and read back by nvshim's own reader."""
    from nvshim.node.cdigen import generate_for_node
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=2, mig=True, imex_channels=1)
    spec, _ = generate_for_node(
        node.root, None, "gpu", "nvidia.com", ("index", "uuid"), caps, "auto", None
    )
    text = _plainyaml.dump(dump_ordered(spec))
    assert text is not None
    assert text == _pure_dump(dump_ordered(spec))
    assert _plainyaml.load(text) == spec


def _pure_load(text: str) -> Any:
    return yaml.load(text, Loader=yaml.SafeLoader)  # noqa: S506 - SafeLoader itself


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_TEXT, _VALUES, min_size=1, max_size=4))
def test_plain_yaml_reads_what_pyyaml_writes_as_pyyaml_reads_it(doc: Dict[str, Any]) -> None:
    """nvshim's reader reads PyYAML's text of any document either to the document PyYAML
    reads from it, or not at all; whatever nvshim's writer wrote it reads back."""
    text = _pure_dump(doc)
    got = _plainyaml.load(text)
    assert got is None or repr(got) == repr(_pure_load(text))
    if _plainyaml.dump(doc) is not None:
        assert got == doc


_LINES = st.lists(
    st.sampled_from(
        [
            "---",
            "kind: a/b",
            "devices:",
            "- name: '0'",
            "  containerEdits:",
            "    env:",
            "    - A=1",
            "  - x",
            "- 1",
            "- -5",
            "- 1:20",
            "- 0:1",
            "- true",
            "- yes",
            "- 'yes'",
            "a:",
            "a: b",
            "a: null",
            "a: ~",
            "a: []",
            "a: {}",
            "a: [1]",
            "- {}",
            "  a: 1",
            "  b: c",
            "# c",
            "a: b # c",
            "",
            "  ",
            "a: 'x''y'",
            'a: "x"',
            "a: &x b",
            "b: *x",
            "...",
            "\ta: 1",
            "a:\t1",
            "a: b ",
            "'a': 1",
            "0: x",
            "-I: x",
            "- - x",
            "-",
            "- ",
            "? a",
            "a: |",
            "  text",
            "a: 1.5",
            "a: 0x1f",
            "a: 012",
            "a: '0'",
            "a: b: c",
            "x: \x07",
        ]
    ),
    min_size=1,
    max_size=10,
).map(lambda lines: "\n".join(lines) + "\n")


@settings(max_examples=1500, deadline=None)
@given(_LINES)
def test_plain_yaml_never_reads_a_text_otherwise_than_pyyaml(text: str) -> None:
    """Whatever text nvshim's reader accepts, PyYAML reads to the same document (what it
    does not accept — comments, null, flow style, anchors, a duplicate key — PyYAML
    reads)."""
    got = _plainyaml.load(text)
    if got is not None:
        assert repr(got) == repr(_pure_load(text))


_SCALARS = [
    "1:20",
    "1:60",
    "0:1",
    "10:3",
    "yes",
    "'yes'",
    "True",
    "true",
    "false",
    "-5",
    "-0",
    "012",
    "08",
    "0.5.0",
    "1.0",
    ".5",
    "1e5",
    "-I",
    "--link",
    "---x",
    "./x",
    "../x",
    "x:y",
    "a::b",
    "'0'",
    "0",
    "7",
    "-1:20",
    "'1:20'",
    "~",
    "null",
    "=",
    "<<",
    "x'y",
    "'x'y'",
    "a [b] {c}, d",
    "1" * 50,
    "-" + "1" * 50,
]


@pytest.mark.parametrize("scalar", _SCALARS)
@pytest.mark.parametrize(
    "shape", ["a: {}\n", "a:\n- {}\n", "- {}: a\n", "{}: a\n", "a:\n- b: {}\n  c: d\n"]
)
def test_plain_yaml_reads_a_scalar_as_pyyaml_or_not_at_all(scalar: str, shape: str) -> None:
    """Each awkward scalar (base-60 numbers, YAML 1.1 booleans, octal, versions, flags,
    relative paths) as a value, a list item and a key: read to PyYAML's value or left to
    PyYAML."""
    text = shape.format(scalar)
    if text.startswith("- "):
        text = "a:\n" + text
    got = _plainyaml.load(text)
    assert got is None or repr(got) == repr(_pure_load(text)), text


@pytest.mark.parametrize(
    "text",
    [
        "a: 1\na: 2\n",  # a duplicate key: the strict loader names it
        "a: b\n# note\n",
        "a: b # note\n",
        "a: null\n",
        "a:\nb: 1\n",
        "a: [1]\n",
        "a: b\n\nc: d\n",
        "a:\n  - 1\n",
        "a: 1.5\n",
        "a: 'x''y'\n",
        "a: b",
        "a: é\n",
    ],
)
def test_plain_yaml_leaves_other_texts_to_pyyaml(text: str) -> None:
    """Comments, null, flow lists, blank lines, another list indentation, floats, escapes,
    a duplicate key, no final newline, non-ASCII: not read without PyYAML."""
    assert _plainyaml.load(text) is None


def test_a_generated_spec_is_read_without_importing_yaml(tmp_path: Path) -> None:
    """Loading a spec file nvshim wrote (YAML) imports no PyYAML."""
    import subprocess
    import sys

    doc = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {
                "name": "0",
                "containerEdits": {
                    "deviceNodes": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]
                },
            }
        ],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "hooks": [
                {
                    "hookName": "createContainer",
                    "path": "/usr/bin/nvshim",
                    "args": ["/usr/bin/nvshim", "hook", "--folder", "/usr/lib"],
                }
            ],
        },
    }
    (tmp_path / "gpu.yaml").write_text(dump_spec(doc))
    code = (
        "import sys\nfrom nvshim.cdi.load import load_spec_file\n"
        "spec = load_spec_file(sys.argv[1])\n"
        "print(len(spec.devices), 'yaml' in sys.modules)"
    )
    repo = Path(__file__).resolve().parents[3]
    res = subprocess.run(
        [sys.executable, "-I", "-c", code, str(tmp_path / "gpu.yaml")],
        capture_output=True,
        text=True,
        cwd=repo,
        env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    assert res.stdout.split() == ["1", "False"]
