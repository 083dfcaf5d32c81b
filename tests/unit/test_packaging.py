"""Packaging: the wheel builds without setuptools warnings and ships every package and data file.

Built the way a user's ``pip install .`` builds it (isolated build env, setuptools from the
index), from a copy of the source tree.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def source_copy(dest: Path) -> Path:
    """What a source tree hands the build backend: pyproject, README and the package
    (without bytecode caches)."""
    for name in ("pyproject.toml", "README.md"):
        (dest / name).write_bytes((REPO / name).read_bytes())
    for src in (REPO / "nvshim").rglob("*"):
        if src.is_file() and "__pycache__" not in src.parts:
            dst = dest / src.relative_to(REPO)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
    return dest


@pytest.fixture(scope="module")
def built(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    src = source_copy(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("wheel")
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if (
        res.returncode != 0
        and "No matching distribution found for setuptools" in res.stdout + res.stderr
    ):
        pytest.skip("no package index to fetch setuptools from")
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    wheels = list(out.glob("nvshim-*.whl"))
    assert len(wheels) == 1
    return res, wheels[0]


def test_build_prints_no_packaging_warning(
    built: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    res, _ = built
    lines = (res.stdout + res.stderr).splitlines()
    # pip's notes about this machine's index configuration are not about nvshim's packaging
    warnings = [
        line
        for line in lines
        if ("warn" in line.lower() or "deprecat" in line.lower()) and "Location 'file:" not in line
    ]
    assert warnings == []


def test_wheel_ships_every_package_data_file_and_entry_point(
    built: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, wheel = built
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {str(p.relative_to(REPO)) for p in (REPO / "nvshim").rglob("*.py")}
    assert sources - names == set()
    data = {str(p.relative_to(REPO)) for p in (REPO / "nvshim" / "data").iterdir()}
    assert data and data - names == set()
    assert "nvshim/py.typed" in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry).decode()
    assert "nvshim = nvshim.cli.main:main" in text
    assert "nvshim-runtime = nvshim.runtime.main:main" in text


def test_no_stray_shell_artifacts_at_the_repo_root() -> None:
    """Issue 12 item 16: no file like `=12.4` (an unquoted `pip install x>=12.4`) sits at the repo
    root.

    Reads the directory, not `git ls-files`: the README's test command must pass where git is not
    installed (install.sh --dev does not install it)."""
    assert [n for n in os.listdir(REPO) if n[:1] in "=<>"] == []
