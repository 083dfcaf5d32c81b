"""Programs built from their published Go modules for the tests.

Each program group is a directory ``tests/go/<name>/`` of ours: a ``go.mod`` that pins the
published module (``go.sum`` beside it), our own ``main.go`` where the module has no main
package to build, and a ``build.sh`` that runs ``go build`` into ``$OUT``. Their source is
fetched by ``go build`` from the module proxy into Go's module cache, never kept here.

:func:`go_programs` builds a group once and keeps it in a cache keyed by the hash of its
directory's files and the Go version (``~/.cache/nvshim-tests/go/<name>-<key>``,
``$NVSHIM_TESTS_GO_CACHE``), under a lock, so parallel sessions build it once. A group
that does not build fails the test in one line naming it and Go's last words: it is never
skipped while Go is here.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from tests.helpers.common import cache_dir, locked

__all__ = ["GO_MODULES", "go_binary", "go_programs", "build_go"]

#: The Go program groups of the tests, one directory each.
GO_MODULES = Path(__file__).resolve().parents[1] / "go"


def go_binary() -> str:
    """``go`` on PATH, else the toolchain's usual place; the test is skipped without one."""
    found = shutil.which("go") or (
        "/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None
    )
    if found is None:
        import pytest

        pytest.skip("no Go toolchain (go on PATH or /usr/local/go/bin/go)")
    return found


def _key(name: str, go: str) -> str:
    """The cache key of group ``name``: its files' bytes and the Go version."""
    digest = hashlib.sha256()
    for path in sorted((GO_MODULES / name).rglob("*")):
        if path.is_file():
            digest.update(
                str(path.relative_to(GO_MODULES / name)).encode()
                + b"\0"
                + path.read_bytes()
                + b"\0"
            )
    version = subprocess.run(
        [go, "env", "GOVERSION"], capture_output=True, text=True, timeout=60, check=False
    ).stdout.strip()
    digest.update(version.encode())
    return digest.hexdigest()[:16]


def go_programs(name: str, timeout: float = 1800) -> Path:
    """The directory holding group ``name``'s programs (``tests/go/<name>/build.sh``'s
    ``$OUT``), built now unless the cache has them."""
    go = go_binary()
    root = cache_dir("go", "NVSHIM_TESTS_GO_CACHE")
    root.mkdir(parents=True, exist_ok=True)
    out = root / f"{name}-{_key(name, go)}"
    with locked(root / f".{name}.lock"):
        if (out / ".built").is_file():
            return out
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        env = dict(
            os.environ,
            OUT=str(out),
            GOFLAGS="-mod=readonly",
            GOTOOLCHAIN="local",
            PATH=f"{os.path.dirname(go)}:{os.environ.get('PATH', '')}",
        )
        started = time.monotonic()
        res = subprocess.run(
            ["bash", str(GO_MODULES / name / "build.sh")],
            cwd=GO_MODULES / name,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
        if res.returncode != 0:
            shutil.rmtree(out, ignore_errors=True)
            raise AssertionError(
                f"tests/go/{name} does not build (go build failed):\n"
                f"{(res.stdout + res.stderr)[-4000:]}"
            )
        (out / ".built").write_text(f"{time.monotonic() - started:.0f} s\n")
    return out


def build_go(name: str, program: str, out: Path, timeout: float = 1800) -> Path:
    """Group ``name``'s ``program``, copied to ``out``."""
    shutil.copy2(go_programs(name, timeout) / program, out)
    return out
