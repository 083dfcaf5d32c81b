"""The config trust rule follows the whole lookup: ancestors, and past a symlink its target's
directories — a config refused by its real path is refused through a symlink to it.

Root only (the rule protects root; the files are chown'ed to another user). Each case also
runs the runtime's create exactly as the trampoline does, which must fail in one line and
leave config.json byte-identical.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from nvshim.config import load_config
from nvshim.errors import ConfigError

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the trust rule applies to root")


def _config(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.yaml"
    path.write_text("require-allocation: true\n")
    return path


def _symlink_to_open_dir(tmp: Path) -> Path:
    real = _config(tmp / "open")
    (tmp / "open").chmod(0o777)
    (tmp / "etc").mkdir()
    (tmp / "etc" / "config.yaml").symlink_to(real)
    return tmp / "etc" / "config.yaml"


def _symlinked_directory(tmp: Path) -> Path:
    _config(tmp / "users" / "nv")
    (tmp / "users").chmod(0o777)
    (tmp / "etc").mkdir()
    (tmp / "etc" / "nvshim").symlink_to(tmp / "users" / "nv")
    return tmp / "etc" / "nvshim" / "config.yaml"


def _relative_symlink_up(tmp: Path) -> Path:
    _config(tmp / "open" / "deep")
    (tmp / "open").chmod(0o777)
    (tmp / "etc").mkdir()
    (tmp / "etc" / "config.yaml").symlink_to("../open/deep/config.yaml")
    return tmp / "etc" / "config.yaml"


def _open_ancestor(tmp: Path) -> Path:
    path = _config(tmp / "open" / "nvshim")
    (tmp / "open").chmod(0o777)
    return path


def _others_symlink_in_sticky_dir(tmp: Path) -> Path:
    real = _config(tmp / "real")
    (tmp / "sticky").mkdir()
    (tmp / "sticky").chmod(0o1777)
    link = tmp / "sticky" / "config.yaml"
    link.symlink_to(real)
    os.lchown(link, 65534, 65534)
    return link


@needs_root
@pytest.mark.parametrize(
    ("make", "weak"),
    [
        (_symlink_to_open_dir, "open"),
        (_symlinked_directory, "users"),
        (_relative_symlink_up, "open"),
        (_open_ancestor, "open"),
        (_others_symlink_in_sticky_dir, "sticky/config.yaml"),
    ],
    ids=[
        "symlink-to-open-dir",
        "symlinked-dir",
        "relative-symlink",
        "open-ancestor",
        "others-symlink-in-sticky-dir",
    ],
)
def test_a_config_reached_through_a_replaceable_place_is_refused(
    tmp_path: Path, make: Callable[[Path], Path], weak: str
) -> None:
    """A config whose lookup passes a directory (or a sticky directory's entry) another user could change is refused, naming that place, by load_config and by the runtime's create."""
    path = make(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    msg = str(info.value)
    assert f"{tmp_path}/{weak} " in msg and "\n" not in msg
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    spec = json.dumps({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}}).encode()
    (bundle / "config.json").write_bytes(spec)
    res = subprocess.run(
        [
            sys.executable,
            "-I",
            "-m",
            "nvshim.runtime.main",
            "create",
            "--bundle",
            str(bundle),
            "c1",
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "NVSHIM_CONFIG": str(path)},
        timeout=60,
    )
    assert res.returncode == 1 and res.stderr.splitlines() == [f"nvshim: {msg}"]
    assert (bundle / "config.json").read_bytes() == spec


@needs_root
def test_a_symlink_within_root_only_directories_is_trusted(tmp_path: Path) -> None:
    """A config symlinked to a file in a root-only directory, or kept in a sticky directory as root's, is read."""
    real = _config(tmp_path / "real")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "config.yaml").symlink_to(real)
    assert load_config(str(tmp_path / "etc" / "config.yaml")).require_allocation
    (tmp_path / "sticky").mkdir()
    (tmp_path / "sticky").chmod(0o1777)
    (tmp_path / "sticky" / "config.yaml").symlink_to(real)
    assert load_config(str(tmp_path / "sticky" / "config.yaml")).require_allocation
