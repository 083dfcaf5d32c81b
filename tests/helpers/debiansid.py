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
* podman 5.8.6 (:func:`podman_5`) needs glibc 2.38+, gpgme 2 (libgpgme45, libassuan9, a newer
  libgpg-error0), libsubid6 and libseccomp 2.6: its set carries sid's, and its other
  libraries (libsystemd, libselinux, PAM …) are the machine's, found through the loader's
  default paths. podman is patched with a DT_RPATH (``--force-rpath``: it also serves
  gpgme's and libsubid's own dependencies, which a DT_RUNPATH would not) and ``--no-sort``
  (patchelf's default section sorting makes this Go binary segfault at start). podman 5
  refuses to start without netavark, even for ``--network none``: the set carries sid's
  (patched alike) and a containers.conf override naming it. It runs the machine's conmon
  (2.1.6) and, here, the sid runc under nvshim.

Cold download: the sid main index ≈ 10 MB (once per set); containerd ≈ 30 MB; runc + crun
and their libraries ≈ 11 MB; docker.io + docker-cli ≈ 28 MB; podman, netavark and their
libraries ≈ 33 MB. All four sets fetched and unpacked cold: 44 s on this 2-core machine
(containerd 17 s, runtimes 6, Docker 12, podman 8), ≈ 400 MB on disk.

:func:`engine_or_skip` skips a test whose engine cannot be fetched, naming why, or fails it
with ``CI`` set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Optional, Tuple, TypeVar

from tests.helpers.debian13 import DebianSuite, own_libc

__all__ = [
    "PODMAN_5_HOST_PATHS",
    "SID",
    "containerd_2_dir",
    "crun_sid",
    "docker_28_dirs",
    "engine_or_skip",
    "podman_5",
    "runc_sid",
]

CACHE_ENV = "NVSHIM_TESTS_DEBIANSID_CACHE"
"""Where the sid package sets are kept (default: ~/.cache/nvshim-tests/debiansid)."""
SID = DebianSuite("sid", "Debian unstable", "debiansid", CACHE_ENV)

_RUNTIMES = (
    "runc",
    "crun",
    "libc6",
    "patchelf",
    "libstdc++6",
    "libgcc-s1",
    "libseccomp2",
    "libcap2",
    "libjson-c5",
    "libblake3-0",
    "libsystemd0",
)

_PODMAN = (
    "podman",
    "netavark",
    "libc6",
    "patchelf",
    "libstdc++6",
    "libgcc-s1",
    "libgpgme45",
    "libassuan9",
    "libgpg-error0",
    "libsubid6",
    "libseccomp2",
    "libsqlite3-0",
)

PODMAN_CONF = "etc/containers/nvshim-tests.conf"
PODMAN_5_HOST_PATHS = (
    Path("/run/containers/networks"),
    Path("/run/containers"),
    Path("/run/lock/netavark.lock"),
)
"""What rootful podman 5 creates on the host even for ``--network none`` (netavark's run dir
is fixed for root): :class:`tests.helpers.podman.Podman`'s ``host_paths``."""

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


def _podman_finish(tree: Path, root: Path) -> None:
    own_libc(
        tree,
        root,
        binaries=["usr/bin/podman", "usr/lib/podman/netavark"],
        flags=["--force-rpath", "--no-sort"],
    )
    conf = tree / PODMAN_CONF
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(f'[engine]\nhelper_binaries_dir = ["{root}/usr/lib/podman"]\n')


def podman_5(cache: Optional[Path] = None) -> Tuple[str, Dict[str, str]]:
    """sid's podman (5.8), runnable here through sid's libc and libraries, and the env it
    needs: ``CONTAINERS_CONF_OVERRIDE`` naming the set's netavark (podman 5 requires one,
    even for ``--network none``), and the cgroup v1 deprecation warning off."""
    root = SID.root("podman-5", _PODMAN, cache=cache, finish=_podman_finish)
    return str(root / "usr" / "bin" / "podman"), {
        "CONTAINERS_CONF_OVERRIDE": str(root / PODMAN_CONF),
        "PODMAN_IGNORE_CGROUPSV1_WARNING": "1",
    }


def engine_or_skip(fetch: Callable[[], T], what: str) -> T:
    """``fetch()``; when it cannot download, skip the test naming why — or fail under CI."""
    return SID.engine_or_skip(fetch, what)
