"""The newest engines, from Debian unstable ("sid"), for e2e tests on this Debian 12 machine.

The same private apt configuration as :mod:`tests.helpers.debian13` (its
:class:`~tests.helpers.debian13.DebianSuite`, suite ``sid``): ``apt-get download`` with the
machine's Debian archive and suite ``sid``, own lists and archives, ``dpkg-deb -x`` into
``<cache>/<set>/root`` once, under an flock. The cache is ``$NVSHIM_TESTS_DEBIANSID_CACHE``,
else ``${XDG_CACHE_HOME:-~/.cache}/nvshim-tests/debiansid``. Sid moves: a set is whatever sid
held when it was first fetched (the versions below are those of November 2026); a test that
needs a feature checks the version it got.

* containerd 2.1.9 (:func:`containerd_2_dir`): Go binaries needing glibc 2.34 (Debian 12 has
  2.36); the directory holds ``containerd``, ``containerd-shim-runc-v2`` and ``ctr``. Its
  default config is version 3, its CRI plugin ``io.containerd.cri.v1.runtime``.

Cold download: the sid main index ≈ 10 MB (once per set); containerd ≈ 30 MB.

:func:`engine_or_skip` skips a test whose engine cannot be fetched, naming why, or fails it
with ``CI`` set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, TypeVar

from tests.helpers.debian13 import DebianSuite

__all__ = ["SID", "containerd_2_dir", "engine_or_skip"]

CACHE_ENV = "NVSHIM_TESTS_DEBIANSID_CACHE"
"""Where the sid package sets are kept (default: ~/.cache/nvshim-tests/debiansid)."""
SID = DebianSuite("sid", "Debian unstable", "debiansid", CACHE_ENV)

T = TypeVar("T")


def containerd_2_dir(cache: Optional[Path] = None) -> Path:
    """The directory of sid's ``containerd`` (2.1), ``containerd-shim-runc-v2`` and ``ctr``."""
    return SID.root("containerd-2", ["containerd"], cache=cache) / "usr" / "bin"


def engine_or_skip(fetch: Callable[[], T], what: str) -> T:
    """``fetch()``; when it cannot download, skip the test naming why — or fail under CI."""
    return SID.engine_or_skip(fetch, what)
