"""The DaemonSet's installer image, built here from ``deploy/Containerfile`` without a registry.

* :func:`base_image_archive` — a Debian 12 root made by ``mmdebstrap`` from Debian's own
  packages (variant ``minbase``, docs/man/locales left out like ``debian:12-slim``), as a
  tar that ``podman import`` turns into the ``BASE`` the Containerfile builds FROM.
* :func:`installer_image_archive` — deploy/README.md's build command, word for word
  (:func:`build_argv`: ``podman build --isolation=chroot --network=host --build-arg
  BASE=<that import> -f deploy/Containerfile -t NAME .``; the builder stage's apt-get and
  pip reach Debian's and PyPI's mirrors through the host's network and pip config, passed
  as the README's ``PIP_*`` build arguments), run with private storage, then
  ``podman save`` to its standard output (deploy/README.md's pipe; docker-archive, podman's
  default): the tar a node's containerd imports from stdin (``ctr -n k8s.io images import -``).

Both are cached under ``$NVSHIM_TESTS_IMAGE_CACHE`` (default
``${XDG_CACHE_HOME:-~/.cache}/nvshim-tests/installer-image``), keyed by a hash of their
inputs: the base by the mmdebstrap command line, the image by the base's key plus every file
the build context holds (:data:`CONTEXT_INPUTS`, minus ``.containerignore``'s caches). A
cache hit runs neither mmdebstrap nor podman. Builds run under an flock on
``<cache>/.lock`` (two pytest processes build once); each archive is renamed into place
atomically. podman runs with private storage under a temp dir removed afterwards, and its
image cache in an overlay of ``/var/lib`` there (:func:`tests.helpers.podman.private_image_cache`),
so nothing is left in ``/var/lib/containers``. :class:`BuildResult` says what it cost
(seconds per step, image size) for the closing note; failures raise :class:`BuildError`
with one line naming the step and podman's last words.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

__all__ = [
    "BASE_NAME",
    "CACHE_ENV",
    "CONTEXT_INPUTS",
    "BuildError",
    "BuildResult",
    "base_image_archive",
    "build_argv",
    "image_size",
    "installer_image_archive",
]

CACHE_ENV = "NVSHIM_TESTS_IMAGE_CACHE"
BASE_NAME = "localhost/nvshim-test/debian:12-minbase"
"""What the mmdebstrap root is imported as (the Containerfile's ``BASE`` build argument)."""

REPO = Path(__file__).resolve().parents[2]
CONTEXT_INPUTS: Sequence[str] = (
    ".containerignore",
    "deploy",
    "install.sh",
    "pyproject.toml",
    "README.md",
    "nvshim",
    "config",
)
"""What of the repository the build context carries (see .containerignore); hashed."""

_MMDEBSTRAP = (
    "mmdebstrap",
    "--variant=minbase",
    "--mode=root",
    "--format=tar",
    # what debian:12-slim leaves out (its /etc/dpkg/dpkg.cfg.d/docker)
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--customize-hook=rm -rf $1/var/lib/apt/lists/* $1/var/cache/apt/*.bin",
    "bookworm",
)


class BuildError(AssertionError):
    """A step of the image build failed; the message is one line naming it."""


@dataclass
class BuildResult:
    """An image archive and what making it cost (seconds; 0 for a cache hit)."""

    archive: Path
    name: str
    cached: bool
    seconds: Dict[str, float] = field(default_factory=dict)
    size: int = 0
    """The image's unpacked size in bytes (the sum of its layers)."""


def _cache_dir() -> Path:
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "nvshim-tests" / "installer-image"


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(
    step: str,
    argv: Sequence[str],
    timeout: float,
    log: Path,
    cwd: Optional[Path] = None,
    stdout: Optional[Path] = None,
) -> None:
    """``argv``, its output appended to ``log`` (``stdout``: its standard output to that file
    instead, as a shell's ``> FILE`` or the README's pipe gives it)."""
    with open(log, "ab") as out, open(stdout or os.devnull, "wb") as to:
        out.write(f"\n$ {' '.join(argv)}{f' > {stdout}' if stdout else ''}\n".encode())
        out.flush()
        try:
            rc = subprocess.run(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=to if stdout else out,
                stderr=out,
                timeout=timeout,
                cwd=cwd,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            rc = -1
    if rc != 0:
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-3:]
        raise BuildError(f"{step} failed (rc {rc}, log {log}): " + " | ".join(tail))


def _context_hash(repo: Path) -> str:
    h = hashlib.sha256()
    for top in CONTEXT_INPUTS:
        root = repo / top
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in paths:
            if "__pycache__" in path.parts or not path.is_file():
                continue
            h.update(str(path.relative_to(repo)).encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def base_image_archive(mirror: str = "http://deb.debian.org/debian") -> BuildResult:
    """The mmdebstrap Debian 12 root (tar), built once per command line and cached."""
    argv = [*_MMDEBSTRAP, "-", mirror]
    key = hashlib.sha256("\0".join(argv).encode()).hexdigest()[:16]
    cache = _cache_dir()
    dest = cache / f"base-{key}.tar"
    if dest.exists():
        return BuildResult(dest, BASE_NAME, cached=True)
    if shutil.which("mmdebstrap") is None:
        raise BuildError("mmdebstrap is not installed (apt-get install mmdebstrap)")
    with _locked(cache):
        if dest.exists():
            return BuildResult(dest, BASE_NAME, cached=True)
        tmp = cache / f".base-{key}.{os.getpid()}.tar"
        started = time.monotonic()
        try:
            _run("mmdebstrap", [*_MMDEBSTRAP, str(tmp), mirror], 900, cache / "build.log")
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return BuildResult(
            dest, BASE_NAME, cached=False, seconds={"mmdebstrap": time.monotonic() - started}
        )


class _Podman:
    """podman with throw-away private storage (nothing in /var/lib/containers)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        # podman refuses a --runroot longer than 50 characters
        self.runroot = Path(tempfile.mkdtemp(prefix="nvshim-imgrun-", dir="/tmp"))

    def argv(self, *args: str) -> List[str]:
        from tests.helpers.podman import private_image_cache  # /var/lib/containers/cache

        return private_image_cache(
            [
                "podman",
                "--root",
                str(self.base / "root"),
                "--runroot",
                str(self.runroot),
                "--tmpdir",
                str(self.base / "tmp"),
                "--cgroup-manager",
                "cgroupfs",
                "--events-backend",
                "file",
                "--storage-driver",
                "overlay",
                *args,
            ],
            self.base / "var-lib",
        )

    def close(self) -> None:
        subprocess.run(
            self.argv("system", "reset", "--force"), capture_output=True, timeout=300, check=False
        )
        for d in (self.base, self.runroot):
            with contextlib.suppress(OSError):
                subprocess.run(["umount", "-R", "-l", str(d)], capture_output=True, check=False)
            shutil.rmtree(d, ignore_errors=True)


_BUILD_CERT = "/run/nvshim-build/pip-cert.pem"


def _pip_setting(name: str) -> str:
    """The build machine's pip setting ``name`` (``cert``, ``index-url`` …): its ``PIP_*``
    env, else its pip config (``global.<name>``), else ''."""
    env = os.environ.get("PIP_" + name.upper().replace("-", "_"))
    if env:
        return env
    res = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", f"global.{name}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return res.stdout.strip() if res.returncode == 0 else ""


def _pip_build_args() -> List[str]:
    """What makes pip inside the build reach the index the way it does here: the index URLs
    (http(s) only: a file:// index is not in the build) and the CA bundle (a TLS-inspecting
    proxy's CA is in the machine's bundle, not in the image's), mounted read-only."""
    args: List[str] = []
    for name in ("index-url", "extra-index-url"):
        urls = [u for u in _pip_setting(name).split() if u.startswith(("http://", "https://"))]
        if urls:
            args += ["--build-arg", f"PIP_{name.upper().replace('-', '_')}={' '.join(urls)}"]
    cert = _pip_setting("cert")
    if cert and os.path.isfile(cert):
        args += ["--volume", f"{cert}:{_BUILD_CERT}:ro", "--build-arg", f"PIP_CERT={_BUILD_CERT}"]
    return args


def build_argv(name: str, base: Optional[str] = None, extra: Sequence[str] = ()) -> List[str]:
    """deploy/README.md's ``podman build`` command for image ``name`` (``base``: the ``BASE``
    build argument, ``extra``: more flags, e.g. pip's build arguments), run in the checkout;
    tests/unit/test_deploy.py holds the README to it."""
    argv = ["podman", "build", "--isolation=chroot", "--network=host"]
    if base is not None:
        argv += ["--build-arg", f"BASE={base}"]
    return [*argv, *extra, "-f", "deploy/Containerfile", "-t", name, "."]


def installer_image_archive(name: str, repo: Path = REPO) -> BuildResult:
    """The installer image tagged ``name`` as a docker-archive, built from ``repo``'s
    ``deploy/Containerfile`` on the mmdebstrap base, cached by a hash of its inputs."""
    base = base_image_archive()
    key = hashlib.sha256(f"{base.archive.name}\0{name}\0{_context_hash(repo)}".encode())
    cache = _cache_dir()
    dest = cache / f"installer-{key.hexdigest()[:16]}.tar"
    if dest.exists():
        return BuildResult(dest, name, cached=True, size=image_size(dest))
    if shutil.which("podman") is None:
        raise BuildError("podman is not installed (apt-get install podman)")
    with _locked(cache):
        if dest.exists():
            return BuildResult(dest, name, cached=True, size=image_size(dest))
        seconds = dict(base.seconds)
        log = cache / "build.log"
        work = Path(tempfile.mkdtemp(prefix="nvshim-imgbuild-", dir=cache))
        podman = _Podman(work)
        tmp = cache / f".installer.{os.getpid()}.tar"
        try:
            started = time.monotonic()
            _run("podman import", podman.argv("import", str(base.archive), BASE_NAME), 600, log)
            seconds["import"] = time.monotonic() - started
            started = time.monotonic()
            mark = log.stat().st_size if log.exists() else 0
            # as the README says; the private storage is what podman.argv adds
            _run(
                "podman build",
                podman.argv(*build_argv(name, BASE_NAME, _pip_build_args())[1:]),
                1800,
                log,
                cwd=repo,
            )
            seconds["build"] = time.monotonic() - started
            _no_build_arg_warnings(log, mark)
            started = time.monotonic()
            # deploy/README.md's `podman save IMAGE | ctr … import -`: the archive is what
            # podman writes to a pipe (its default format), imported from stdin by the node
            _run("podman save", podman.argv("save", name), 600, log, stdout=tmp)
            seconds["save"] = time.monotonic() - started
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
            podman.close()
        return BuildResult(dest, name, cached=False, seconds=seconds, size=image_size(dest))


def _no_build_arg_warnings(log: Path, start: int) -> None:
    """A build that warns about a build argument (buildah: 'missing "PIP_CERT" build
    argument') fails: the Containerfile gives every ARG a default."""
    with open(log, "rb") as fh:
        fh.seek(start)
        text = fh.read().decode(errors="replace")
    warned = [ln.strip() for ln in text.splitlines() if "build argument" in ln]
    if warned:
        raise BuildError(f"podman build warned about build arguments: {warned[0]}")


def image_size(archive: Path) -> int:
    """The unpacked size of a docker-archive's image: the bytes of its layer tars' files."""
    total = 0
    with tarfile.open(archive) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))  # type: ignore[arg-type]
        for layer in manifest[0]["Layers"]:
            blob = outer.extractfile(layer)
            assert blob is not None
            with tarfile.open(fileobj=blob, mode="r|") as inner:
                total += sum(m.size for m in inner if m.isfile())
    return total
