"""Node roots: Debian trees standing in for the GPU node families, and running a command on one.

A GPU node is whatever its image gives: an old C library, a new one, no Python at all. The
node-root tests install nvshim's self-contained runtime into such trees and start GPU
containers through it with the tree's own runc, as on a real node.

Roots
-----
:data:`ROOTS` names three recipes, each an ``mmdebstrap --variant=essential`` tree (only
Debian's Essential packages: coreutils, grep, sed, dash, bash …) plus ``runc`` from the same
release, merged ``/usr`` where the release has it, no documentation:

* ``debian12-nopython`` — bookworm, the build machine's glibc (2.36) and **no python3**:
  :func:`build_root` checks that no ``python3*`` / ``libpython*`` file is in it;
* ``debian11`` — bullseye: an **older** glibc (2.31) than the build machine's, runc 1.0 rc93;
* ``debian13`` — trixie: a **newer** glibc (2.41) and its own ``python3.13`` (python3-minimal),
  a Python other than the one nvshim's payload was built with.

Cache
-----
:func:`node_root` returns a :class:`NodeRoot` from ``<cache>/<name>/root`` with its
``<cache>/<name>/manifest.json``; the cache is ``$NVSHIM_TESTS_NODEROOT_CACHE``, else
``${XDG_CACHE_HOME:-~/.cache}/nvshim-tests/noderoots``. A cached root is used as it is when its
manifest's ``recipe`` key (a hash of the suite, packages and mmdebstrap options) matches;
otherwise, under an flock on ``<cache>/.lock`` (two pytest processes build once), mmdebstrap
builds it in ``<cache>/.build-<name>-*`` and it is renamed into place whole, so a reader never
sees half a root. mmdebstrap keeps its apt configuration to itself; the machine's is never
read for packages nor written. The mirror is the URI of the machine's Debian source
(:func:`tests.helpers.realdriver.debian_sources_list`), else ``deb.debian.org``. The manifest
records the packages and versions, the glibc version, the Pythons found, the size and the
build time. Failures raise :class:`NodeRootError` with one line.

Cached roots are read-only by convention: :func:`copy_root` makes a private copy to change.

Running on the node
-------------------
:func:`on_node` runs an argv inside a root as if it were the node: a private mount and PID
namespace (``unshare -m -p -f --kill-child``), the root bind-mounted on itself (runc's
``pivot_root`` needs the root to be a mount point), a fresh ``/proc``, the machine's ``/sys``
(cgroups, for runc) and ``/dev`` bound in, a tmpfs on ``/run``, then ``chroot``. Nothing it
mounts is seen outside, and every process it started is gone when it returns (PID 1 of the
namespace exits last). The environment is exactly the ``env`` given (default: a node's PATH).
Host directories can be bound into the node (``binds``) and the tree made read-only for the
call (``read_only``), so a cached root runs as it is, untouched; ``read_only_dirs`` bind node
folders on themselves read-only (``/usr``, as Container-Optimized OS, Flatcar or Talos mount
it). The script mounts nothing unless its mount namespace is not the caller's (exit 97).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from tests.helpers.common import RunResult, cache_dir, locked

__all__ = [
    "CACHE_ENV",
    "NODE_PATH",
    "ROOTS",
    "NodeRoot",
    "NodeRootError",
    "Recipe",
    "build_root",
    "copy_root",
    "debian_mirror",
    "node_root",
    "on_node",
    "python_files",
]

CACHE_ENV = "NVSHIM_TESTS_NODEROOT_CACHE"
"""Where built roots are kept between runs (default: ~/.cache/nvshim-tests/noderoots)."""

NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The PATH a command on the node gets unless told otherwise."""

_FORMAT = 1  # bump to rebuild every cached root after a change to how roots are made
_DEFAULT_MIRROR = "http://deb.debian.org/debian"
_HOOKS = "/usr/share/mmdebstrap/hooks/maybe-merged-usr"  # merged /usr where the suite has it
_EXCLUDED = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/usr/share/info/*")
_PYTHON_NAME = re.compile(r"^(python3.*|libpython.*)$")


class NodeRootError(Exception):
    """A node root cannot be built or run; the message is one line."""


@dataclass(frozen=True)
class Recipe:
    """How one node root is made."""

    name: str
    suite: str
    include: Tuple[str, ...]
    """Packages on top of the Essential set."""
    stands_for: str
    python: bool
    """Whether the root must have a python3 (False: it must have none at all)."""

    def key(self) -> str:
        """A hash of everything that shapes the tree (the cache's validity key)."""
        text = json.dumps([_FORMAT, self.suite, sorted(self.include), _HOOKS, _EXCLUDED])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


ROOTS: Dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "debian12-nopython",
            "bookworm",
            ("runc",),
            "the distroless node families (COS, Bottlerocket, Flatcar, Talos): no python3",
            False,
        ),
        Recipe(
            "debian11",
            "bullseye",
            ("runc",),
            "an older C library than the build machine's (glibc 2.31)",
            False,
        ),
        Recipe(
            "debian13",
            "trixie",
            ("runc", "python3-minimal"),
            "a newer C library (glibc 2.41) and a node python3 (3.13) other than nvshim's",
            True,
        ),
    )
}


@dataclass(frozen=True)
class NodeRoot:
    """A built (cached) node root."""

    name: str
    path: Path
    """The tree; read-only by convention (see :func:`copy_root`)."""
    manifest: Dict[str, Any]
    """What :func:`build_root` recorded: ``packages``, ``glibc``, ``pythons``, ``size_bytes``,
    ``build_seconds`` …"""


# --------------------------------------------------------------------------- building


def debian_mirror() -> str:
    """The machine's Debian archive URI (its ``…/debian`` source), else deb.debian.org."""
    from tests.helpers.realdriver import debian_sources_list

    try:
        lines = debian_sources_list().splitlines()
    except OSError:
        lines = []
    for line in lines:
        for word in line.split()[1:]:
            if word.startswith(("http://", "https://")) and word.rstrip("/").endswith("/debian"):
                return word.rstrip("/")
    return _DEFAULT_MIRROR


def node_root(name: str, cache: Optional[Path] = None) -> NodeRoot:
    """The root ``name`` of :data:`ROOTS`, from the cache or built into it."""
    recipe = ROOTS[name]
    base = cache or cache_dir("noderoots", CACHE_ENV)
    found = _cached(base, recipe)
    if found is not None:
        return found
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise NodeRootError(f"cannot create the node root cache {base}: {exc.strerror}") from exc
    with locked(base / ".lock"):
        found = _cached(base, recipe)  # another process may have built it meanwhile
        if found is not None:
            return found
        return build_root(recipe, base)


def _cached(base: Path, recipe: Recipe) -> Optional[NodeRoot]:
    entry = base / recipe.name
    try:
        manifest = json.loads((entry / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("recipe") != recipe.key() or not (entry / "root" / "usr").is_dir():
        return None
    return NodeRoot(recipe.name, entry / "root", manifest)


def build_root(recipe: Recipe, base: Path) -> NodeRoot:
    """Build ``recipe`` with mmdebstrap into ``base/<name>`` (replacing what is there); the
    caller holds the cache's lock."""
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise NodeRootError("mmdebstrap is not installed (./install.sh --dev installs it)")
    staging = Path(tempfile.mkdtemp(prefix=f".build-{recipe.name}-", dir=base))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the tree from the node's other users
    try:
        tree = staging / "root"
        argv = [
            mmdebstrap,
            "--quiet",
            "--mode=root",
            "--variant=essential",
            "--include=" + ",".join(recipe.include),
            f"--hook-dir={_HOOKS}",
            *[f"--dpkgopt=path-exclude={p}" for p in _EXCLUDED],
            recipe.suite,
            str(tree),
            debian_mirror(),
        ]
        started = time.monotonic()
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL
        )
        seconds = round(time.monotonic() - started, 1)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            raise NodeRootError(
                f"mmdebstrap {recipe.suite} for node root {recipe.name} failed: {last}"
            )
        manifest = _describe(recipe, tree, seconds)
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
        entry = base / recipe.name
        if entry.exists():  # an older recipe: out of the way first, then gone
            old = Path(tempfile.mkdtemp(prefix=f".old-{recipe.name}-", dir=base))
            os.replace(entry, old / "entry")
            shutil.rmtree(old, ignore_errors=True)
        os.replace(staging, entry)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return NodeRoot(recipe.name, entry / "root", manifest)


def _describe(recipe: Recipe, tree: Path, seconds: float) -> Dict[str, Any]:
    """The manifest of a freshly built tree; raises when the tree is not what it stands for."""
    packages = _dpkg_packages(tree)
    glibc = packages.get("libc6", "").split("-", 1)[0]
    pythons = python_files(tree)
    if not recipe.python and pythons:
        raise NodeRootError(
            f"node root {recipe.name} must have no python, yet has {', '.join(pythons[:5])}"
        )
    if recipe.python and "/usr/bin/python3" not in pythons:
        raise NodeRootError(f"node root {recipe.name} has no /usr/bin/python3")
    if not (tree / "usr/sbin/runc").is_file():
        raise NodeRootError(f"node root {recipe.name} has no /usr/sbin/runc")
    return {
        "name": recipe.name,
        "recipe": recipe.key(),
        "suite": recipe.suite,
        "stands_for": recipe.stands_for,
        "include": list(recipe.include),
        "glibc": glibc,
        "runc": packages.get("runc", ""),
        "pythons": pythons,
        "packages": packages,
        "size_bytes": _tree_size(tree),
        "build_seconds": seconds,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _dpkg_packages(tree: Path) -> Dict[str, str]:
    """Package → version of every installed package, from the tree's dpkg status file."""
    out: Dict[str, str] = {}
    text = (tree / "var/lib/dpkg/status").read_text(errors="replace")
    for stanza in text.split("\n\n"):
        fields = dict(re.findall(r"^([\w-]+): (.*)$", stanza, re.M))
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            out[fields["Package"]] = fields.get("Version", "")
    return out


def python_files(tree: Path) -> List[str]:
    """Every path (as on the node) in ``tree`` named ``python3*`` or ``libpython*``, sorted."""
    found = []
    for dirpath, dirs, files in os.walk(tree):
        for name in files + dirs:
            if _PYTHON_NAME.match(name):
                found.append("/" + str((Path(dirpath) / name).relative_to(tree)))
    return sorted(found)


def _tree_size(tree: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(tree):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            total += st.st_size
    return total


def copy_root(root: NodeRoot, dest: Path) -> Path:
    """A private copy of ``root``'s tree at ``dest`` (new), owners, modes and links kept."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["cp", "-a", "--reflink=auto", str(root.path), str(dest)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise NodeRootError(
            f"copying node root {root.name} to {dest} failed: {proc.stderr.strip()}"
        )
    return dest


# --------------------------------------------------------------------------- running

_ON_NODE = r"""
set -e
[ "$(readlink /proc/self/ns/mnt)" != "$1" ] || { echo "on-node: not in a private mount namespace" >&2; exit 97; }
r=$2; ro=$3; shift 3
mount --bind "$r" "$r"
while [ "$1" != -- ]; do mount --bind "$r$1" "$r$1"; mount -o remount,bind,ro "$r$1"; shift; done
shift
while [ "$1" != -- ]; do mount --bind "$1" "$r$2"; shift 2; done
shift
if [ "$ro" = 1 ]; then mount -o remount,bind,ro "$r"; fi
mount -t proc proc "$r/proc"
mount --rbind /sys "$r/sys"
mount --rbind /dev "$r/dev"
mount -t tmpfs -o mode=0755 tmpfs "$r/run"
exec chroot "$r" "$@"
"""


def on_node(
    tree: Path,
    argv: Sequence[str],
    *,
    env: Optional[Mapping[str, str]] = None,
    binds: Optional[Mapping[str, Path]] = None,
    read_only: bool = False,
    read_only_dirs: Sequence[str] = (),
    timeout: float = 300,
    stdin: Optional[str] = None,
) -> RunResult:
    """Run ``argv`` inside ``tree`` as on the node (see the module docstring); the node's
    programs, its C library, its runc. ``env`` is the whole environment (default: PATH).

    ``binds`` maps a directory on the node (it must exist in ``tree``) to a host directory
    bound there; ``read_only`` makes the rest of the tree read-only (a cached root can then
    be run without a copy: nothing it does reaches the tree); ``read_only_dirs`` (node paths,
    e.g. ``/usr``) are bound on themselves read-only, as COS, Flatcar or Talos mount ``/usr``.
    The script mounts nothing unless its mount namespace differs from the caller's (exit 97).
    """
    for tool in ("unshare", "mount", "chroot"):
        if shutil.which(tool) is None:
            raise NodeRootError(f"{tool} is not installed: running on a node root needs it")
    pairs: List[str] = []
    for inside, host_dir in (binds or {}).items():
        if not (tree / inside.lstrip("/")).is_dir():
            raise NodeRootError(f"cannot bind {host_dir} to {inside}: no such directory in {tree}")
        pairs += [str(host_dir), inside]
    for inside in read_only_dirs:
        if not inside.startswith("/") or not (tree / inside.lstrip("/")).is_dir():
            raise NodeRootError(f"cannot make {inside} read-only: no such directory in {tree}")
    host = [
        "unshare",
        "-m",
        "-p",
        "-f",
        "--kill-child",
        "--propagation",
        "private",
        "sh",
        "-c",
        _ON_NODE,
        "on-node",
        os.readlink("/proc/self/ns/mnt"),
        str(tree),
        "1" if read_only else "0",
        *read_only_dirs,
        "--",
        *pairs,
        "--",
        *argv,
    ]
    environment = dict(env) if env is not None else {"PATH": NODE_PATH}
    environment.setdefault("PATH", NODE_PATH)  # the host's sh, mount and chroot need one too
    proc = subprocess.run(
        host,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
    )
    return RunResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)
