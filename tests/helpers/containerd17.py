"""containerd 1.7 for config-loading tests: Debian 13's package, unpacked into a cache.

Debian 12 ships containerd 1.6; 1.7 (Debian 13's ``containerd`` package, a static Go
binary that runs here) is fetched with ``apt-get download`` through a private apt
configuration (its own sources list naming the machine's Debian archive with suite
``trixie``, its own lists and archives; see :func:`tests.helpers.realdriver._apt_options`)
and unpacked with ``dpkg-deb -x`` into ``$NVSHIM_TESTS_CACHE`` or
``~/.cache/nvshim-tests/containerd-1.7/``, under an flock, once. Nothing of the machine's
apt configuration, /usr or /etc is touched. Only ``containerd --config X config dump`` is
used: it loads a config and its imports as the daemon would, and starts nothing.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from tests.helpers.realdriver import DownloadError, _apt_options, debian_sources_list

__all__ = ["containerd_17"]

_SUITE = "trixie"


def _cache() -> Path:
    base = os.environ.get("NVSHIM_TESTS_CACHE")
    if base:
        return Path(base) / "containerd-1.7"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "nvshim-tests" / "containerd-1.7"


def _sources() -> str:
    """The machine's Debian archive (not -security) with suite trixie, main only."""
    lines = []
    for line in debian_sources_list().splitlines():
        words = line.split()
        uri = next(w for w in words[1:] if "://" in w)
        if uri.rstrip("/").endswith("/debian"):
            opts = " ".join(w for w in words[1:] if w.startswith("["))
            entry = f"deb {opts + ' ' if opts else ''}{uri} {_SUITE} main\n"
            if entry not in lines:
                lines.append(entry)
    if not lines:
        raise DownloadError("no Debian archive in /etc/apt to fetch containerd 1.7 from")
    return "".join(lines)


def containerd_17(cache: Optional[Path] = None) -> str:
    """The path of a containerd 1.7 binary (downloaded and unpacked on first use)."""
    base = cache or _cache()
    binary = base / "root" / "usr" / "bin" / "containerd"
    if binary.is_file():
        return str(binary)
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.is_file():
            return str(binary)
        apt_dir = base / ".apt"
        for sub in ("lists/partial", "archives/partial", "cache"):
            (apt_dir / sub).mkdir(parents=True, exist_ok=True)
        (apt_dir / "sources.list").write_text(_sources())
        options = _apt_options(apt_dir)
        with tempfile.TemporaryDirectory(dir=base) as staging:
            for args in (["update"], ["download", "containerd"]):
                done = subprocess.run(["apt-get", *options, *args], cwd=staging,
                                      capture_output=True, text=True, timeout=600)
                if done.returncode != 0:
                    raise DownloadError(f"apt-get {' '.join(args)} (trixie): "
                                        f"{done.stderr.strip()[-300:]}")
            debs = sorted(Path(staging).glob("containerd_1.7*.deb"))
            if not debs:
                raise DownloadError("apt-get download containerd gave no 1.7 package")
            unpack = Path(tempfile.mkdtemp(dir=base))
            subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(unpack)], check=True)
            os.replace(unpack, base / "root")
    return str(binary)
