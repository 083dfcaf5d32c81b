"""The self-contained runtime's payload (``install.sh --payload``), built once per source.

:func:`payload_dir` returns a payload built from this checkout for the default prefix
(``/opt/nvshim``, ``/usr/local/bin``, ``/etc/nvshim``). Building runs pip for nvshim's
dependencies (tens of seconds), so the result is cached under
``${XDG_CACHE_HOME:-~/.cache}/nvshim-tests/payload/<key>/`` (``$NVSHIM_TESTS_PAYLOAD_CACHE``
overrides the folder), the key being a hash of everything that goes into it: nvshim's
sources and data, ``install.sh``, ``pyproject.toml``, ``config/config.yaml`` and the
interpreter the payload bundles. Under an flock on ``<cache>/.lock`` (two pytest processes
build once) it is built into a temporary sibling and renamed into place; older keys are
a day old
are removed then (the others may be another checkout's, in use). Without the cache (a clean CI machine) it is simply built.

The tree is read-only by convention: tests install it with ``install.sh --from`` (which
copies) or copy it, never edit it in place.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

__all__ = ["payload_dir", "payload_key", "BUILD_PYTHON"]

REPO = Path(__file__).resolve().parents[2]
BUILD_PYTHON = os.environ.get("NVSHIM_PYTHON", "/usr/bin/python3")


def _cache_root() -> Path:
    explicit = os.environ.get("NVSHIM_TESTS_PAYLOAD_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "nvshim-tests" / "payload"


def payload_key() -> str:
    """A hash of every input of the payload (sources, installer, interpreter)."""
    h = hashlib.sha256()
    inputs = [REPO / "install.sh", REPO / "pyproject.toml", REPO / "config" / "config.yaml"]
    inputs += sorted(
        p for p in (REPO / "nvshim").rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    for path in inputs:
        h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    python = os.path.realpath(BUILD_PYTHON)
    st = os.stat(python)
    h.update(f"{python}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def payload_dir() -> Path:
    """The payload for this checkout (built now unless cached); see the module docstring."""
    root = _cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / payload_key()
    if (final / ".nvshim-payload").is_file():
        return final
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / ".nvshim-payload").is_file():
            return final
        work = root / f".build-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("NVSHIM_")}
        env["NVSHIM_PYTHON"] = BUILD_PYTHON
        res = subprocess.run(
            ["sh", str(REPO / "install.sh"), "--payload", str(work)],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if res.returncode != 0:
            shutil.rmtree(work, ignore_errors=True)
            raise RuntimeError(f"install.sh --payload failed: {res.stderr.strip()[-2000:]}")
        os.rename(work, final)
        # other keys may be another checkout's, in use now: only day-old ones go
        for old in root.iterdir():
            if old.is_dir() and old != final and old.stat().st_mtime < time.time() - 86400:
                shutil.rmtree(old, ignore_errors=True)
        return final
