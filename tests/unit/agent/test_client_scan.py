"""The agent's client reads config.json as the trampoline's grep does (``--scan``): every
spec grep would send on, the client sends on; a spec grep keeps on the fast path, the
client keeps there too; what it cannot judge as grep would, it sends on."""

from __future__ import annotations

import codecs
import os
import re
import subprocess
from pathlib import Path
from typing import List, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvshim.agent import client as client_module
from nvshim.agent.protocol import Request, parse_request
from nvshim.node.install import trampoline
from nvshim.node.install.trampoline import MAJOR_PATTERN, ere_literal
from tests.helpers.agent import built_client, fake_agent

PREFIXES = ("nvidia.com/", "a+b/", "cdi.k8s.io/")


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The client, built from this checkout."""
    return built_client(tmp_path_factory.mktemp("client"))


@pytest.fixture(scope="module")
def scan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle folder and the compiled prefixes file, as ``nvshim config compile`` writes
    it (ERE literals, one a line)."""
    where = tmp_path_factory.mktemp("scan")
    (where / "prefixes").write_text("".join(ere_literal(p) + "\n" for p in PREFIXES))
    (where / "bundle").mkdir()
    return where


def fixed_strings_of_the_trampoline() -> List[str]:
    """The literal strings the trampoline's grep looks for (its ``-e`` words other than
    the major's ERE), each as the text it matches."""
    script = trampoline._TEMPLATE
    grep = script[script.index('"$grep" -q') : script.index('-f "$prefixes"')]
    words = re.findall(r"-e ('[^']*'|[^\s'@]+)", grep)
    return [re.sub(r"\\(.)", r"\1", w.strip("'")) for w in words]


def fixed_strings_of_the_client() -> List[str]:
    """client.c's ``FIXED``, each C string literal decoded."""
    source = Path(client_module.SOURCE).read_text()
    block = source[source.index("FIXED[] = {") : source.index("};", source.index("FIXED[]"))]
    return [
        codecs.decode(lit, "unicode_escape") for lit in re.findall(r'"((?:[^"\\]|\\.)*)"', block)
    ]


def grep_asks(spec: Path, prefixes: Path) -> bool:
    """Whether the trampoline's grep sends ``spec`` on (its exit status is not 1)."""
    grep = "/usr/bin/grep" if os.path.exists("/usr/bin/grep") else "/bin/grep"
    argv = [grep, "-q", "-s", "-D", "skip", "-E"]
    for pattern in [*(ere_literal(s) for s in fixed_strings_of_the_trampoline()), MAJOR_PATTERN]:
        argv += ["-e", pattern]
    argv += ["-f", str(prefixes), "--", str(spec)]
    res = subprocess.run(argv, env={"LC_ALL": "C"}, stdin=subprocess.DEVNULL, timeout=10)
    return res.returncode != 1


def scan(
    client: Path, bundle: Path, prefixes: Path, major: str = MAJOR_PATTERN, sock: str = ""
) -> subprocess.CompletedProcess[str]:
    """The client's ``--scan`` create of ``bundle`` (no agent at ``sock`` unless one is
    started there)."""
    sock = sock or str(bundle.parent / "no-agent.sock")
    config = str(bundle.parent / "missing.yaml")
    argv = [str(client), "--scan", str(prefixes), major, sock, "0.1.0", config]
    argv += ["/usr/bin/runc", str(bundle), "create", "--bundle", str(bundle), "id"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=10)


def client_asks(client: Path, bundle: Path, prefixes: Path, major: str = MAJOR_PATTERN) -> bool:
    """Whether the client sends the create on: exit 2 (no agent there), not 3 (nothing
    asked)."""
    res = scan(client, bundle, prefixes, major)
    assert res.returncode in (2, 3) and (res.stdout, res.stderr) == ("", ""), res
    return res.returncode == 2


def test_the_client_looks_for_the_trampolines_fixed_strings() -> None:
    """client.c's fixed strings are the ones the trampoline's grep is given, no more and
    no fewer."""
    assert fixed_strings_of_the_trampoline() == fixed_strings_of_the_client()
    assert "\\u" in fixed_strings_of_the_client()  # decoded: one backslash


FRAGMENTS = [
    '{"linux":{"devices":[{',
    '"major"',
    '"MAJOR"',
    '"Major"',
    '"majo"',
    '"minor"',
    ":",
    " ",
    "\n",
    "\r",
    "\t",
    "195",
    "19",
    "1950",
    "234",
    "254",
    "255",
    "383",
    "511",
    "512",
    "-",
    "4294967491",
    "123456789",
    ",",
    "}",
    "]",
    '"NVIDIA_VISIBLE_DEVICES=0"',
    '"NVIDIA"',
    '"annotations":{"nvidia.com/gpu":"1"}',
    '"annotations":{"nvidiaXcom/gpu":"1"}',
    '"a+b/x"',
    '"aab/x"',
    '"cdi.k8s.io/x"',
    "\\u0041",
    "\\/",
    "\\",
    '"/dev/nvidia0"',
    '"/dev/fuse"',
    "é",
]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=14))
def test_the_client_asks_exactly_when_grep_does(
    client: Path, scan_dir: Path, parts: List[str]
) -> None:
    """On specs made of what decides grep (the major key in any case, NVIDIA numbers and
    others, line breaks, prefixes and their look-alikes, escapes), the client sends a
    create on exactly when the trampoline's grep would."""
    spec = scan_dir / "bundle" / "config.json"
    spec.write_text("".join(parts))
    prefixes = scan_dir / "prefixes"
    assert client_asks(client, scan_dir / "bundle", prefixes) == grep_asks(spec, prefixes)


@pytest.mark.parametrize(
    "what, spec, prefixes",
    [
        ("a NUL byte", b'{"a":"x\0"}', None),
        ("a prefix with a bare ERE character", b'{"a":"x"}', "gpu.example/\n"),
        ("an empty prefix line", b'{"a":"x"}', "nvidia\\.com/\n\n"),
        ("a prefix ending in a backslash", b'{"a":"x"}', "gpu\\\n"),
    ],
)
def test_what_the_client_cannot_judge_as_grep_it_sends_on(
    client: Path, tmp_path: Path, what: str, spec: bytes, prefixes: Optional[str]
) -> None:
    """A spec or a prefixes file the client cannot read as grep would (a NUL byte, a prefix
    that is not an ERE literal) is sent on, never kept off nvshim."""
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "config.json").write_bytes(spec)
    listing = tmp_path / "prefixes"
    listing.write_text(prefixes if prefixes is not None else "nvidia\\.com/\n")
    assert client_asks(client, tmp_path / "bundle", listing), what


def test_an_unreadable_spec_is_sent_on_and_a_fifo_is_not_read(client: Path, tmp_path: Path) -> None:
    """A missing config.json, a FIFO in its place (never opened for a blocking read), a
    missing prefixes file and a major ERE that does not compile: each sent on."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    listing = tmp_path / "prefixes"
    listing.write_text("nvidia\\.com/\n")
    assert client_asks(client, bundle, listing)
    os.mkfifo(bundle / "config.json")
    assert client_asks(client, bundle, listing)
    (bundle / "config.json").unlink()
    (bundle / "config.json").write_text('{"linux":{"devices":[{"major":1}]}}')
    assert not client_asks(client, bundle, listing)
    assert client_asks(client, bundle, tmp_path / "missing")
    assert client_asks(client, bundle, listing, major='"major"(')


def test_a_spec_that_asks_goes_to_the_agent_as_a_plain_create(client: Path, tmp_path: Path) -> None:
    """With --scan, a spec that asks is sent as the same create request as without it (the
    scan's arguments are not in it); one that asks for nothing exits 3 and sends nothing."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    listing = tmp_path / "prefixes"
    listing.write_text("nvidia\\.com/\n")
    sock = tmp_path / "agent.sock"
    thread, seen = fake_agent(sock, b"nvshim-agent 1\0ok\0\0")
    (bundle / "config.json").write_text('{"process":{"env":["A=1"]}}')
    res = scan(client, bundle, listing, sock=str(sock))
    assert (res.returncode, res.stderr, seen) == (3, "", [])
    (bundle / "config.json").write_text('{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}}')
    res = scan(client, bundle, listing, sock=str(sock))
    thread.join(10)
    assert (res.returncode, res.stderr) == (0, "")
    data, fds = seen[0]
    assert parse_request(data, len(fds)) == Request(
        "create",
        "0.1.0",
        str(tmp_path / "missing.yaml"),
        "",
        "/usr/bin/runc",
        os.getcwd(),
        str(bundle),
        ("create", "--bundle", str(bundle), "id"),
    )


def test_the_scan_needs_every_argument(client: Path, tmp_path: Path) -> None:
    """--scan without the create's arguments after it is not served (exit 2, nothing
    printed)."""
    res = subprocess.run(
        [str(client), "--scan", "p", "m", "s", "v", "c", "r"], capture_output=True, text=True
    )
    assert (res.returncode, res.stdout, res.stderr) == (2, "", "")
