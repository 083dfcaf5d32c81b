"""Shared pytest setup: markers, import path, and the nvshim executables under test.

Fixtures:

* ``repo_root`` (session) -> Path of the repository.
* ``nvshim_runtime_bin`` (session) -> str: the ``nvshim-runtime`` executable to test —
  ``$NVSHIM_RUNTIME_BIN``, else ``nvshim-runtime`` on PATH (the installed trampoline), else
  ``<repo>/.venv/bin/nvshim-runtime``, else the test is skipped.
* ``nvshim_bin`` (session) -> str: the same for ``nvshim`` (``$NVSHIM_BIN``).

Guard: tests must never write the node's grant journal (``/var/lib/nvshim/grants.jsonl``,
the built-in default of ``grants-journal``) nor the denial journal beside it. A test whose
nvshim config grants, strips or refuses a GPU must point ``grants-journal`` into its tmp dir (``tests.helpers.node.write_nvshim_config``
does). At the end of the session, a record in the node's journal whose bundle lies under
this session's tmp dir fails the run, naming the bundles.

Guard: tests must never leave driver files on the host. NVIDIA-looking files that appear in
the host's driver folders (``/usr/bin``, the library folder, ``/lib/firmware/nvidia`` ...)
between session start and finish fail the run, naming up to five
(:mod:`tests.helpers.hostguard`; about 15 ms each way).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# `from tests.helpers... import ...` and `import nvshim` work without an installed package.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


NODE_JOURNAL = Path("/var/lib/nvshim/grants.jsonl")


_HOST_FILES = pytest.StashKey[set]()


def _host() -> str:
    """The directory the host guard watches: ``/``, or ``$NVSHIM_TEST_HOST_ROOT`` (the guard's
    own test points it at a temp dir)."""
    return os.environ.get("NVSHIM_TEST_HOST_ROOT") or "/"


def pytest_sessionstart(session: pytest.Session) -> None:
    from tests.helpers.hostguard import snapshot

    session.config.stash[_HOST_FILES] = snapshot(_host())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _check_host_files(session)
    _check_node_journal(session)


def _check_host_files(session: pytest.Session) -> None:
    """Fail the run when driver files appeared on the host during it."""
    from tests.helpers.hostguard import guard_message, new_files, snapshot

    before = session.config.stash.get(_HOST_FILES, None)
    if before is None:
        return
    new = new_files(before, snapshot(_host()))
    if new:
        sys.stderr.write(f"\n{guard_message(new)}\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _check_node_journal(session: pytest.Session) -> None:
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None or not NODE_JOURNAL.parent.is_dir():
        return
    try:
        base = str(factory.getbasetemp())
    except (OSError, ValueError):
        return
    from nvshim.runtime.denials import denials_path, read_denials
    from nvshim.runtime.grants import read_grants

    leaked = sorted(
        {g.bundle for g in read_grants(str(NODE_JOURNAL)) or () if g.bundle.startswith(base + "/")}
        | {
            d.bundle
            for d in read_denials(denials_path(str(NODE_JOURNAL))) or ()
            if d.bundle.startswith(base + "/")
        }
    )
    if leaked:
        sys.stderr.write(
            f"\nFAILED: tests wrote {len(leaked)} record(s) to the node's grant or denial journal "
            f"beside {NODE_JOURNAL}; "
            "set grants-journal in their nvshim config (bundles: " + ", ".join(leaked[:5]) + ")\n"
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: runs real containers (needs root and the engine named in the test)"
    )


def _find_executable(env_var: str, name: str) -> str:
    explicit = os.environ.get(env_var)
    if explicit:
        if not os.access(explicit, os.X_OK):
            pytest.fail(f"${env_var}={explicit} is not an executable file")
        return explicit
    # The installed command first (for nvshim-runtime: the sh trampoline), so a developer's
    # run tests what CI and users run; the checkout's venv script otherwise.
    found = shutil.which(name)
    if found is not None:
        return found
    venv = REPO_ROOT / ".venv" / "bin" / name
    if venv.is_file() and os.access(venv, os.X_OK):
        return str(venv)
    pytest.skip(f"{name} not found: run ./install.sh, or set ${env_var}")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def nvshim_runtime_bin() -> str:
    """Path of the nvshim-runtime executable under test."""
    return _find_executable("NVSHIM_RUNTIME_BIN", "nvshim-runtime")


@pytest.fixture(scope="session")
def nvshim_bin() -> str:
    """Path of the nvshim CLI executable under test."""
    return _find_executable("NVSHIM_BIN", "nvshim")
