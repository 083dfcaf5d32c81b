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
* runc 1.3.6 and crun 1.28 (:func:`runc_sid`, :func:`crun_sid`) need glibc 2.38+ and, crun,
  newer libraries (libjson-c 0.19, libblake3): their set carries sid's ``libc6``,
  ``libseccomp2``, ``libcap2``, ``libjson-c5``, ``libblake3-0`` and ``libsystemd0``, and
  :func:`tests.helpers.debian13.own_libc` points both binaries at them, as for Debian 13's.
* Docker 28.5.2 (:func:`docker_28_dirs`): ``docker.io`` (dockerd, Go, glibc 2.34 and the
  machine's libsystemd) and ``docker-cli``; dockerd starts the containerd 2.1 above.

Cold download: the sid main index ≈ 10 MB (once per set); containerd ≈ 30 MB; runc + crun
and their libraries ≈ 11 MB; docker.io + docker-cli ≈ 28 MB.

:func:`engine_or_skip` skips a test whose engine cannot be fetched, naming why, or fails it
with ``CI`` set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Tuple, TypeVar

from tests.helpers.debian13 import DebianSuite, own_libc

__all__ = ["SID", "containerd_2_dir", "crun_sid", "docker_28_dirs", "engine_or_skip", "runc_sid"]

CACHE_ENV = "NVSHIM_TESTS_DEBIANSID_CACHE"
"""Where the sid package sets are kept (default: ~/.cache/nvshim-tests/debiansid)."""
SID = DebianSuite("sid", "Debian unstable", "debiansid", CACHE_ENV)

_RUNTIMES = ("runc", "crun", "libc6", "patchelf", "libstdc++6", "libgcc-s1",
             "libseccomp2", "libcap2", "libjson-c5", "libblake3-0", "libsystemd0")

T = TypeVar("T")


def containerd_2_dir(cache: Optional[Path] = None) -> Path:
    """The directory of sid's ``containerd`` (2.1), ``containerd-shim-runc-v2`` and ``ctr``."""
    return SID.root("containerd-2", ["containerd"], cache=cache) / "usr" / "bin"


def _runtimes(cache: Optional[Path]) -> Path:
    return SID.root("runtimes", _RUNTIMES, finish=own_libc, cache=cache)


def runc_sid(cache: Optional[Path] = None) -> str:
    """sid's runc (1.3), runnable here through sid's own libc."""
    return str(_runtimes(cache) / "usr" / "sbin" / "runc")


def crun_sid(cache: Optional[Path] = None) -> str:
    """sid's crun (1.28), runnable here through sid's libc and libraries (in this VM's cgroup
    layout only through :func:`tests.helpers.runc.make_crun_wrapper`)."""
    return str(_runtimes(cache) / "usr" / "bin" / "crun")


def docker_28_dirs(cache: Optional[Path] = None) -> Tuple[Path, ...]:
    """sid's ``dockerd`` (28.5), ``docker`` client and containerd 2.1: the directories to put
    first on dockerd's PATH (:class:`tests.helpers.docker.Dockerd`'s ``bin_dirs``)."""
    root = SID.root("docker-28", ["docker.io", "docker-cli"], cache=cache)
    return root / "usr" / "sbin", root / "usr" / "bin", containerd_2_dir(cache)


def engine_or_skip(fetch: Callable[[], T], what: str) -> T:
    """``fetch()``; when it cannot download, skip the test naming why — or fail under CI."""
    return SID.engine_or_skip(fetch, what)
