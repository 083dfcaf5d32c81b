"""host/devices.py's token grammars are string checks; each must accept exactly what the regular
expression it replaced (kept here as the specification) accepts."""

from __future__ import annotations

import re

from hypothesis import example, given, settings
from hypothesis import strategies as st

from nvshim.host import devices as grammar

UUID_BODY = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
GPU_UUID = re.compile(r"GPU-" + UUID_BODY, re.IGNORECASE)
MIG_UUID = re.compile(r"MIG-" + UUID_BODY, re.IGNORECASE)
REPLICA = re.compile(r"(.+?)::[0-9]+")
PCI = re.compile(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])", re.IGNORECASE)
DIGITS = re.compile(r"[0-9]+")
MIG_PAIR = re.compile(r"([0-9]+):([0-9]+)")

# tokens built from the grammars' own alphabet, so that matches are common
alphabet = st.sampled_from(list("0123456789abcdefABCDEFgG-:.PUIM \n٣x"))
tokens = st.text(alphabet, max_size=44) | st.builds(
    lambda p, u: p + u,
    st.sampled_from(["GPU-", "gpu-", "MIG-", "Mig-", "GPU"]),
    st.uuids().map(str) | st.text(alphabet, max_size=40),
)


@settings(max_examples=3000, deadline=None)
@given(tokens)
@example("GPU-70584e2c-7203-4e18-325a-c29c710dfa45")
@example("0000:18:00.0")
@example("a::1::2")
def test_string_grammars_match_the_regexes(token):
    """UUIDs, replicas, PCI ids, digits and MIG pairs: same verdict (and parts) as the regex."""
    assert grammar._gpu_uuid(token) == bool(GPU_UUID.fullmatch(token))
    assert grammar._mig_uuid(token) == bool(MIG_UUID.fullmatch(token))
    m = REPLICA.fullmatch(token)
    assert grammar._replica_of(token) == (m.group(1) if m else None)
    assert grammar._digits(token) == bool(DIGITS.fullmatch(token))
    m = MIG_PAIR.fullmatch(token)
    assert grammar._mig_pair(token) == (m.groups() if m else None)
    m = PCI.fullmatch(token.strip())
    expected = None
    if m:
        expected = "%04x:%02x:%02x.%s" % (
            int(m.group(1) or "0", 16),
            int(m.group(2), 16),
            int(m.group(3), 16),
            m.group(4),
        )
    assert grammar.normalize_pci(token) == expected
