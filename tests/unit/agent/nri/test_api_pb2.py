"""The generated NRI messages (``nvshim/agent/nri/api_pb2.py``) against their source: NRI's
api.proto at the pinned tag, regenerated (:mod:`tests.helpers.nriproto`) and compared byte
for byte, and the pin against the NRI the tested containerd vendors."""

from __future__ import annotations

import pytest

from tests.helpers.nriproto import GROUP, MODULE, REPO, generate, pinned_nri

#: Go's words when the module proxy cannot be reached (the only reason to skip)
UNREACHABLE = (
    "dial tcp",
    "no such host",
    "connection refused",
    "i/o timeout",
    "network is unreachable",
    "tls handshake timeout",
    "proxyconnect",
    "lookup disabled by goproxy=off",
)


def test_generated_module_is_what_the_pinned_api_proto_generates() -> None:
    """api_pb2.py is byte for byte what protoc (the pinned grpcio-tools) makes of the pinned
    NRI tag's api.proto: a hand edit, a new pin or a new protoc without a regeneration
    fails here."""
    try:
        fresh = generate()
    except AssertionError as exc:
        if f"tests/go/{GROUP} does not build" in str(exc) and any(
            word in str(exc).lower() for word in UNREACHABLE
        ):
            pytest.skip(
                f"the Go module proxy is unreachable: NRI's api.proto not fetched "
                f"({str(exc).splitlines()[-1][:200]})"
            )
        raise
    checked_in = (REPO / (MODULE + ".py")).read_bytes()
    assert fresh == checked_in, (
        f"{MODULE}.py drifted from NRI {pinned_nri()}'s api.proto: "
        "run python -m tests.helpers.nriproto"
    )


def test_pinned_nri_is_the_one_the_tested_containerd_vendors() -> None:
    """tests/go/nri-proto pins the github.com/containerd/nri version the containerd the
    tests build (tests/go/containerd) compiles in."""
    assert pinned_nri(GROUP) == pinned_nri("containerd")
