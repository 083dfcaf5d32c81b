"""The engines nodes run today, from Debian 13's packages, for e2e tests on this Debian 12 machine.

Debian 12 ships containerd 1.6 (no CDI), runc 1.1.5 and crun 1.8.1; Debian 13 ("trixie")
ships containerd 1.7.24 (native CDI), runc 1.1.15 and crun 1.21. :func:`debian13_root`
fetches a set of Debian 13 packages with ``apt-get download`` through a private apt
configuration (its own sources list: the machine's Debian archive with suite ``trixie``,
component main; its own lists and archives, :func:`tests.helpers.realdriver._apt_options`)
and unpacks them with ``dpkg-deb -x`` into ``<cache>/<set>/root``, once, under an flock on
``<cache>/.lock``; ``root`` appears with one rename when the set is complete. The cache is
``$NVSHIM_TESTS_DEBIAN13_CACHE``, else ``${XDG_CACHE_HOME:-~/.cache}/nvshim-tests/debian13``.
Nothing of the machine's apt configuration, /usr, /etc or /lib is touched.

* containerd 1.7 (:func:`containerd_17_dir`): static Go binaries; the directory holds
  ``containerd``, its shim ``containerd-shim-runc-v2`` and ``ctr``.
* runc 1.1.15 and crun 1.21 (:func:`runc_debian13`, :func:`crun_debian13`) are linked
  against glibc 2.38+ (Debian 12 has 2.36). Their set carries Debian 13's ``libc6``, and its
  ``patchelf`` (run through that libc's loader) points both binaries' ELF interpreter and
  run path at it, by absolute path: runc re-executes itself from a memfd, where ``$ORIGIN``
  means nothing. Their other libraries (libseccomp, libcap, libsystemd, libyajl) are the
  machine's, new enough for both.

Cold download: containerd ≈ 33 MB; runc + crun + libc6 + patchelf (+ libstdc++6,
libgcc-s1 for patchelf) ≈ 7.3 MB; the trixie main index ≈ 10 MB (fetched once per set).

:func:`engine_or_skip` turns a :class:`~tests.helpers.realdriver.DownloadError` into a skip
that names it, or, with ``CI`` set (``CI=true``, as CI services set it), into a failure: CI
never loses these engines silently.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple, TypeVar

import pytest

from tests.helpers.common import cache_dir, locked, require_binary
from tests.helpers.realdriver import DownloadError, _apt_options, _run, debian_sources_list

__all__ = [
    "DebianSuite",
    "TRIXIE",
    "containerd_17_dir",
    "containerd_node_engines",
    "crun_debian13",
    "debian13_root",
    "engine_or_skip",
    "own_libc",
    "runc_debian13",
]

CACHE_ENV = "NVSHIM_TESTS_DEBIAN13_CACHE"
"""Where the Debian 13 package sets are kept (default: ~/.cache/nvshim-tests/debian13)."""
_LIBDIR = "usr/lib/x86_64-linux-gnu"
_LOADER = "ld-linux-x86-64.so.2"
_RUNTIMES = ("runc", "crun", "libc6", "patchelf", "libstdc++6", "libgcc-s1")

T = TypeVar("T")


@dataclass(frozen=True)
class DebianSuite:
    """One Debian suite's packages, fetched and unpacked through a private apt configuration.

    ``suite`` is apt's name for it (``trixie``, ``sid``), ``label`` what messages call it;
    its sets live under :func:`~tests.helpers.common.cache_dir` ``(cache_name, cache_env)``,
    each suite with its own apt lists.
    """

    suite: str
    label: str
    cache_name: str
    cache_env: str

    def sources(self) -> str:
        """The machine's Debian archive (not -security) with this suite, main only."""
        lines: List[str] = []
        for line in debian_sources_list().splitlines():
            words = line.split()
            uri = next(w for w in words[1:] if "://" in w)
            if uri.rstrip("/").endswith("/debian"):
                opts = " ".join(w for w in words[1:] if w.startswith("["))
                entry = f"deb {opts + ' ' if opts else ''}{uri} {self.suite} main\n"
                if entry not in lines:
                    lines.append(entry)
        if not lines:
            raise DownloadError(
                f"no Debian archive (…/debian) in /etc/apt to fetch {self.label} from"
            )
        return "".join(lines)

    def root(
        self,
        name: str,
        packages: Sequence[str],
        finish: Optional[Callable[[Path, Path], None]] = None,
        cache: Optional[Path] = None,
    ) -> Path:
        """``<cache>/<name>/root``: this suite's ``packages`` unpacked there (fetched on
        first use).

        ``finish(staging, root)`` runs on the unpacked tree ``staging`` before it is renamed
        to ``root`` (the path it will have). Raises :class:`DownloadError` (one line) when
        apt or dpkg-deb fails.
        """
        base = cache or cache_dir(self.cache_name, self.cache_env)
        root = base / name / "root"
        if root.is_dir():
            return root
        try:
            (base / name).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DownloadError(
                f"cannot create the {self.label} cache {base}: {exc.strerror}"
            ) from exc
        with locked(base / ".lock"):
            if root.is_dir():  # another process fetched it meanwhile
                return root
            apt_dir = base / ".apt"
            for sub in ("lists/partial", "archives/partial", "cache"):
                (apt_dir / sub).mkdir(parents=True, exist_ok=True)
            (apt_dir / "sources.list").write_text(self.sources())
            options = _apt_options(apt_dir)
            staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=base / name))
            try:
                _run(["apt-get", *options, "update"], f"apt-get update ({self.suite})")
                _run(
                    ["apt-get", *options, "download", *packages],
                    f"apt-get download {' '.join(packages)} ({self.suite})",
                    cwd=staging,
                )
                debs = sorted(staging.glob("*.deb"))
                if len(debs) != len(packages):
                    raise DownloadError(
                        f"apt-get download {' '.join(packages)} ({self.suite}) "
                        f"gave {len(debs)} packages"
                    )
                tree = staging / "root"
                for deb in debs:
                    _run(["dpkg-deb", "-x", str(deb), str(tree)], f"dpkg-deb -x {deb.name}")
                if finish is not None:
                    finish(tree, root)
                os.replace(tree, root)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        return root

    def engine_or_skip(self, fetch: Callable[[], T], what: str) -> T:
        """``fetch()``; when it cannot download, skip the test naming why — or fail under CI."""
        try:
            return fetch()
        except DownloadError as exc:
            reason = f"{what} from {self.label} unavailable: {exc}"
            if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
                pytest.fail(f"{reason} (CI is set: a missing engine fails the run)", pytrace=False)
            pytest.skip(reason)


TRIXIE = DebianSuite("trixie", "Debian 13", "debian13", CACHE_ENV)
SUITE = TRIXIE.suite


def debian13_root(
    name: str,
    packages: Sequence[str],
    finish: Optional[Callable[[Path, Path], None]] = None,
    cache: Optional[Path] = None,
) -> Path:
    """``<cache>/<name>/root``: Debian 13's ``packages`` unpacked there
    (:meth:`DebianSuite.root`)."""
    return TRIXIE.root(name, packages, finish=finish, cache=cache)


def containerd_17_dir(cache: Optional[Path] = None) -> Path:
    """The directory of Debian 13's ``containerd`` (1.7), ``containerd-shim-runc-v2``, ``ctr``."""
    return debian13_root("containerd-1.7", ["containerd"], cache=cache) / "usr" / "bin"


def own_libc(
    tree: Path,
    root: Path,
    binaries: Sequence[str] = ("usr/sbin/runc", "usr/bin/crun"),
    flags: Sequence[str] = (),
) -> None:
    """Point ``binaries``' ELF interpreter and run path at the set's own libc (the set
    carries ``libc6`` and ``patchelf``; patchelf runs through that libc's loader) with
    patchelf's extra ``flags``."""
    libdir = root / _LIBDIR
    here = tree / _LIBDIR
    patchelf = [str(here / _LOADER), "--library-path", str(here), str(tree / "usr/bin/patchelf")]
    for binary in binaries:
        _run(
            [
                *patchelf,
                *flags,
                "--set-interpreter",
                str(libdir / _LOADER),
                "--set-rpath",
                str(libdir),
                str(tree / binary),
            ],
            f"patchelf {binary}",
        )


def _runtimes(cache: Optional[Path]) -> Path:
    return debian13_root("runtimes", _RUNTIMES, finish=own_libc, cache=cache)


def runc_debian13(cache: Optional[Path] = None) -> str:
    """Debian 13's runc (1.1.15), runnable here."""
    return str(_runtimes(cache) / "usr" / "sbin" / "runc")


def crun_debian13(cache: Optional[Path] = None) -> str:
    """Debian 13's crun (1.21), runnable here (in this VM's cgroup layout only through
    :func:`tests.helpers.runc.make_crun_wrapper`)."""
    return str(_runtimes(cache) / "usr" / "bin" / "crun")


def engine_or_skip(fetch: Callable[[], T], what: str) -> T:
    """``fetch()``; when it cannot download, skip the test naming why — or fail under CI."""
    return TRIXIE.engine_or_skip(fetch, what)


def containerd_node_engines(version: str) -> Tuple[Optional[Path], str]:
    """(containerd's bin dir for :class:`~tests.helpers.containerd.Containerd`, the runc under
    nvshim) of a node: "1.6" is the machine's containerd and runc (bin dir None), "1.7"
    Debian 13's containerd 1.7 and runc 1.1.15, "2.1" Debian unstable's containerd 2.1 and
    runc 1.3 (:mod:`tests.helpers.debiansid`); skips (fails under CI) as
    :func:`engine_or_skip` says."""
    if version == "1.6":
        require_binary("containerd")
        return None, require_binary("runc")
    if version == "2.1":
        from tests.helpers import debiansid

        return (
            debiansid.engine_or_skip(debiansid.containerd_2_dir, "containerd 2.1"),
            debiansid.engine_or_skip(debiansid.runc_sid, "runc 1.3"),
        )
    bin_dir = engine_or_skip(containerd_17_dir, "containerd 1.7")
    return bin_dir, engine_or_skip(runc_debian13, "runc 1.1.15")
