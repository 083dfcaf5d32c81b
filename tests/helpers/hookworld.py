"""The bundle, OCI state and hook invocation the hook's and the in-root work's unit tests share."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, Union

import pytest

from nvshim import hook
from nvshim.host.elf import build_shared_object
from nvshim.host.ldcache import parse_ldcache

REPO = Path(__file__).resolve().parents[2]
LIBDIR = "/usr/lib/x86_64-linux-gnu"
VERSION = "550.54.15"
LINKS = [
    (f"libcuda.so.{VERSION}", f"{LIBDIR}/libcuda.so.1"),
    ("libcuda.so.1", f"{LIBDIR}/libcuda.so"),
    (f"libnvidia-ml.so.{VERSION}", f"{LIBDIR}/libnvidia-ml.so.1"),
]
X86_64, I386 = 0x0303, 0x0003


def make_bundle(tmp_path: Path, root_path: str = "rootfs") -> tuple[Path, Path]:
    """A bundle whose rootfs holds two injected driver libraries and an empty /etc."""
    bundle = tmp_path / "bundle"
    rootfs = bundle / root_path
    libdir = rootfs / LIBDIR.lstrip("/")
    libdir.mkdir(parents=True)
    (rootfs / "etc").mkdir()
    (libdir / f"libcuda.so.{VERSION}").write_bytes(build_shared_object("libcuda.so.1"))
    (libdir / f"libnvidia-ml.so.{VERSION}").write_bytes(build_shared_object("libnvidia-ml.so.1"))
    config = {"ociVersion": "1.0.2", "root": {"path": root_path}, "process": {"args": ["sh"]}}
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle, rootfs


def runc_state(bundle: Path) -> dict[str, Any]:
    return {"ociVersion": "1.0.2-dev", "id": "t1", "status": "creating", "pid": 1,
            "bundle": str(bundle)}  # fmt: skip


def run_hook(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    state: Union[dict[str, Any], str],
    cwd: Path,
) -> tuple[int, str]:
    text = state if isinstance(state, str) else json.dumps(state)
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    monkeypatch.chdir(cwd)
    rc = hook.main(argv)
    return rc, capsys.readouterr().err


def default_args() -> list[str]:
    return hook.build_hook_args(LINKS, [LIBDIR])


def cache_of(rootfs: Path) -> dict[tuple[str, int], str]:
    entries = parse_ldcache((rootfs / "etc/ld.so.cache").read_bytes())
    return {(e.key, e.flags): e.value for e in entries}


def snapshot(top: Path) -> dict[str, tuple[int, str]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st_ = path.lstat()
            data = os.readlink(path) if path.is_symlink() else (
                path.read_bytes().hex() if path.is_file() else "")  # fmt: skip
            out[str(path.relative_to(top))] = (st_.st_mode, data)
    return out


def hook_python() -> str:
    venv = REPO / ".venv/bin/python"
    return str(venv) if venv.exists() else sys.executable


def check_injected(rootfs: Path) -> None:
    libdir = rootfs / LIBDIR.lstrip("/")
    assert os.readlink(libdir / "libcuda.so.1") == f"libcuda.so.{VERSION}"
    assert os.readlink(libdir / "libcuda.so") == "libcuda.so.1"
    assert os.readlink(libdir / "libnvidia-ml.so.1") == f"libnvidia-ml.so.{VERSION}"
    conf = (rootfs / "etc/ld.so.conf.d/00-nvshim.conf").read_text()
    assert LIBDIR in conf.splitlines()
    assert (rootfs / "etc/ld.so.conf").read_text() == "include /etc/ld.so.conf.d/*.conf\n"
    cache = cache_of(rootfs)
    assert cache[("libcuda.so.1", X86_64)] == f"{LIBDIR}/libcuda.so.1"
    assert cache[("libcuda.so", X86_64)] == f"{LIBDIR}/libcuda.so"
    assert cache[("libnvidia-ml.so.1", X86_64)] == f"{LIBDIR}/libnvidia-ml.so.1"
    assert cache[(f"libcuda.so.{VERSION}", X86_64)] == f"{LIBDIR}/libcuda.so.{VERSION}"
    for name in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d/00-nvshim.conf"):
        assert stat.S_IMODE((rootfs / "etc" / name).stat().st_mode) == 0o644
