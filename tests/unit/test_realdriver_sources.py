"""The real-driver helper's apt sources and alternatives links, for Debian's i386 packages.

Checked on text alone (no apt, no network): tests/e2e/test_real_driver_compat32.py uses them.
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers.realdriver import alternatives_links, debian_sources_list

KEY = "/usr/share/keyrings/debian-archive-keyring.gpg"
SOURCES = f"""Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: {KEY}

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: {KEY}
"""


def write_etc(tmp_path: Path) -> Path:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(SOURCES)
    return tmp_path


def test_i386_gets_its_own_lines_main_only_for_the_release_suite(tmp_path: Path) -> None:
    """With i386: the amd64 lines keep every component and say arch=amd64; each suite gets
    an arch=i386 line with contrib non-free, and main only for the release suite (a failing
    security main i386 index must not drop the driver's suite)."""
    lines = debian_sources_list(write_etc(tmp_path), i386=True).splitlines()
    d, s = "http://deb.debian.org/debian", "http://deb.debian.org/debian-security"
    every = "main contrib non-free non-free-firmware"
    assert lines == [
        f"deb [signed-by={KEY} arch=amd64] {d} bookworm {every}",
        f"deb [signed-by={KEY} arch=i386] {d} bookworm main contrib non-free",
        f"deb [signed-by={KEY} arch=amd64] {d} bookworm-updates {every}",
        f"deb [signed-by={KEY} arch=i386] {d} bookworm-updates contrib non-free",
        f"deb [signed-by={KEY} arch=amd64] {s} bookworm-security {every}",
        f"deb [signed-by={KEY} arch=i386] {s} bookworm-security contrib non-free",
    ]


def test_without_i386_the_list_names_no_architecture(tmp_path: Path) -> None:
    """Without i386 the lines are as before: no arch option, every component."""
    text = debian_sources_list(write_etc(tmp_path))
    assert "arch=" not in text and len(text.splitlines()) == 3


def test_multiarch_alternatives_are_made_for_the_i386_triplet_too() -> None:
    """An add_multiarch_slave call gives a link for x86_64 and one for i386, each named with
    its triplet, as the postinst's loop over triplets does."""
    postinst = (
        'slaves="\n$(add_multiarch_slave /usr/lib "" libcuda.so.1 /usr/lib nvidia/current/)\n"\n'
    )
    links = [(a.link, a.name, a.source) for a in alternatives_links(postinst)]
    assert links == [
        (
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "libcuda.so.1-x86_64-linux-gnu",
            "/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1",
        ),
        (
            "/usr/lib/i386-linux-gnu/libcuda.so.1",
            "libcuda.so.1-i386-linux-gnu",
            "/usr/lib/i386-linux-gnu/nvidia/current/libcuda.so.1",
        ),
    ]
