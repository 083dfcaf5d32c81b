"""Fixtures for e2e tests: root filesystems and real engines (see tests/helpers/).

Every engine fixture skips the test (with the reason) when not root or the binary is missing.

Rootfs (``Path``):
* ``base_rootfs`` / ``glibc_base_rootfs`` (session): built once; read-only by convention —
  hand them to ``make_bundle`` (which copies) but never directly to an engine.
* ``rootfs`` / ``glibc_rootfs`` (function): a fresh private copy at ``tmp_path/"rootfs"``
  (``tmp_path/"glibc-rootfs"``), for ``ctr_run``/``podman_run`` or for editing.

Engines:
* ``runc`` (function) -> ``Runc`` with a private root, default runtime = runc on PATH;
  leftover containers are force-deleted at teardown.
* ``crunw`` (session) -> Path of the crun mount-namespace wrapper.
* ``crun`` (function) -> ``Runc`` whose default runtime is ``crunw``.
* ``containerd`` (session) -> started private ``Containerd``; stopped at session end.
* ``containerd_bin`` (module, two params) -> the containerd binary: the machine's 1.6, Debian
  13's 1.7 (a module may define its own).
* ``podman`` (session) -> ``Podman`` with private storage; cleaned at session end.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers.bundle import copy_rootfs, make_glibc_rootfs, make_rootfs
from tests.helpers.common import require_binary, require_root
from tests.helpers.containerd import Containerd
from tests.helpers.podman import Podman
from tests.helpers.runc import Runc, make_crun_wrapper


def pytest_collection_modifyitems(items: list) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def base_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Session busybox rootfs; copy it before use."""
    if shutil.which("busybox") is None:
        pytest.skip("busybox is not installed (apt-get install busybox-static)")
    return make_rootfs(tmp_path_factory.mktemp("base") / "rootfs")


@pytest.fixture(scope="session")
def glibc_base_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Session busybox + glibc loader rootfs with an ld.so.cache; copy it before use."""
    require_root()  # ldconfig -r chroots
    if shutil.which("busybox") is None:
        pytest.skip("busybox is not installed (apt-get install busybox-static)")
    return make_glibc_rootfs(tmp_path_factory.mktemp("glibc-base") / "rootfs")


@pytest.fixture
def rootfs(base_rootfs: Path, tmp_path: Path) -> Path:
    """A private copy of the busybox rootfs."""
    return copy_rootfs(base_rootfs, tmp_path / "rootfs")


@pytest.fixture
def glibc_rootfs(glibc_base_rootfs: Path, tmp_path: Path) -> Path:
    """A private copy of the glibc rootfs."""
    return copy_rootfs(glibc_base_rootfs, tmp_path / "glibc-rootfs")


@pytest.fixture
def runc(tmp_path: Path) -> Iterator[Runc]:
    """runc with a private --root; leftovers force-deleted at teardown."""
    require_root()
    r = Runc(tmp_path / "runc-root", require_binary("runc"))
    yield r
    r.cleanup()


@pytest.fixture(scope="session")
def crunw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The crun wrapper script (private mount ns without /sys/fs/cgroup/unified)."""
    require_root()
    return make_crun_wrapper(tmp_path_factory.mktemp("crunw"))


@pytest.fixture
def crun(tmp_path: Path, crunw: Path) -> Iterator[Runc]:
    """crun (through crunw) with a private --root; leftovers force-deleted at teardown."""
    r = Runc(tmp_path / "crun-root", crunw)
    yield r
    r.cleanup()


@pytest.fixture(scope="session")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    """A private containerd 1.6 daemon for the session."""
    require_root()
    require_binary("containerd")
    require_binary("ctr")
    daemon = Containerd(tmp_path_factory.mktemp("ctrd"))
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    """podman with private storage for the session."""
    require_root()
    require_binary("podman")
    require_binary("conmon")
    p = Podman(tmp_path_factory.mktemp("podman"))
    try:
        yield p
    finally:
        p.cleanup()


@pytest.fixture(scope="module", params=["1.6", "1.7"])
def containerd_bin(request: pytest.FixtureRequest) -> str:
    """The machine's containerd 1.6, and Debian 13's 1.7 from the test cache."""
    if request.param == "1.6":
        return require_binary("containerd")
    from tests.helpers.debian13 import containerd_17_dir, engine_or_skip

    return str(engine_or_skip(containerd_17_dir, "containerd 1.7") / "containerd")
