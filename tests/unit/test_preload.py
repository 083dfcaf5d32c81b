"""nvshim._preload: modules served from one preload file behave as the path finder's do, the
file follows the folder it is in, and a file it cannot use changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nvshim import _preload

CHECK = textwrap.dedent("""
    import sys
    sys.path[0:0] = [sys.argv[1]]
    import nvshim._preload as p
    print(p.install(sys.argv[2]))
    import pkgx.sub, plain
    print(pkgx.sub.__file__)
    print(pkgx.__path__[0])
    print(pkgx.sub.VALUE, plain.VALUE, pkgx.sub.__spec__.loader is sys.meta_path[0])
""")


def write_preload(site: Path) -> Path:
    """A preload file for a package ``pkgx`` (with ``pkgx.sub``) and a module ``plain``."""
    sources = {
        "pkgx/__init__.py": "VALUE = 'pkg'\n",
        "pkgx/sub.py": "from pkgx import VALUE as P\nVALUE = P + '.sub'\n",
        "plain.py": "VALUE = 'plain'\n",
    }
    modules = {}
    for rel, text in sources.items():
        is_package = rel.endswith("__init__.py")
        name = rel[: -len("/__init__.py")] if is_package else rel[:-3].replace("/", ".")
        modules[name] = (is_package, rel, compile(text, str(site / rel), "exec"))
    path = site / _preload.FILE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_preload.dumps(modules))
    return path


def run(site: Path, preload: Path) -> subprocess.CompletedProcess:
    repo = str(Path(_preload.__file__).parents[1])
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", CHECK, repo, str(preload)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=site,
    )


def test_preloaded_modules_have_the_path_finders_file_and_path(tmp_path: Path) -> None:
    """A package and its submodule load from the preload file alone (no source on disk),
    with __file__ and __path__ under the file's folder, and run their code."""
    site = tmp_path / "site"
    preload = write_preload(site)
    res = run(site, preload)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        "True",
        f"{site}/pkgx/sub.py",
        f"{site}/pkgx",
        "pkg.sub plain True",
    ]


def test_a_moved_preload_file_names_its_new_folder(tmp_path: Path) -> None:
    """The paths follow the file: a prefix installed elsewhere gets its own paths."""
    preload = write_preload(tmp_path / "a")
    moved = tmp_path / "b" / "site"
    moved.mkdir(parents=True)
    os.replace(preload, moved / _preload.FILE_NAME)
    res = run(moved, moved / _preload.FILE_NAME)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[1] == f"{moved}/pkgx/sub.py"


@pytest.mark.parametrize("content", [None, b"", b"\x00\x01\x02\x03junk", b"bad magic" * 20])
def test_an_unusable_file_changes_nothing(tmp_path: Path, content: bytes) -> None:
    """A missing, empty, truncated or foreign file: install says False and adds no finder."""
    path = tmp_path / _preload.FILE_NAME
    if content is not None:
        path.write_bytes(content)
    before = list(sys.meta_path)
    assert _preload.install(str(path)) is False
    assert sys.meta_path == before


def test_the_files_descriptor_does_not_reach_an_exec(tmp_path: Path) -> None:
    """The preload file stays open for lazy reads but is close-on-exec: runc never gets it."""
    preload = write_preload(tmp_path / "site")
    before = list(sys.meta_path)
    installed = _preload.install(str(preload))
    finder = sys.meta_path[0]
    try:
        assert installed is True and finder not in before
        assert os.get_inheritable(finder.fd) is False
    finally:
        if finder not in before:
            sys.meta_path.remove(finder)
            os.close(finder.fd)
    assert sys.meta_path == before
