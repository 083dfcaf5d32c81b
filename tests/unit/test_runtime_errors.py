"""Every error the runtime package and the hook raise is an NvshimError (one line, exit 1),
never a bare ValueError/OSError/KeyError that would surface as an "internal error"."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import nvshim
from nvshim.errors import HostError, NvshimError, SpecError, UsageError

ROOT = Path(nvshim.__file__).parent
OWNED = sorted([*(ROOT / "runtime").glob("*.py"), ROOT / "hook.py"])
#: specjson's TypeError is json's protocol for an unknown object in ``default`` and never
#: leaves the encoder.
NOT_CHECKED: set = set()
ALLOWED = {("runtime/specjson.py", "TypeError")}
BUILTIN = {"ValueError", "OSError", "KeyError", "TypeError", "RuntimeError", "Exception",
           "IndexError", "LookupError", "IOError", "FileNotFoundError", "PermissionError"}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_no_builtin_exception_is_raised() -> None:
    raised = []
    for path in OWNED:
        if _rel(path) in NOT_CHECKED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            name = exc.id if isinstance(exc, ast.Name) else ""
            if name in BUILTIN and (_rel(path), name) not in ALLOWED:
                raised.append(f"{_rel(path)}:{node.lineno} raises {name}")
    assert raised == []


def test_every_exception_class_is_in_the_error_tree() -> None:
    outside = []
    for path in OWNED:
        name = "nvshim." + _rel(path)[:-3].replace("/", ".").replace(".__init__", "")
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) \
                    and value.__module__ == name and not issubclass(value, NvshimError):
                outside.append(f"{name}.{attr}")
    assert outside == []


def test_a_spec_nested_too_deep_is_a_spec_error() -> None:
    from nvshim.runtime.specjson import MAX_DEPTH, decode_spec

    with pytest.raises(SpecError, match=f"nested deeper than {MAX_DEPTH} levels"):
        decode_spec(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))


@pytest.mark.parametrize("data", [b"\x08", b"\x80" * 11, b"\x0a\x05ab", b"\x0b", b"\x00"])
def test_a_malformed_kubelet_message_is_a_host_error(data: bytes) -> None:
    from nvshim.runtime.podresources import decode

    with pytest.raises(HostError):
        decode(data)


def test_an_unsafe_trampoline_path_is_a_usage_error() -> None:
    from nvshim.runtime.trampoline import render

    with pytest.raises(UsageError, match="interpreter path must be absolute"):
        render("python3")
    with pytest.raises(ValueError):  # what nvshim doctor catches
        render("/x/$(id)")


def test_create_in_a_removed_directory_says_so_in_one_line(tmp_path: Path) -> None:
    """``create`` without --bundle takes the current directory (runc's rule); when that is
    gone the error names the cause instead of an internal FileNotFoundError."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text("runtimes: [/bin/true]\n")
    gone = tmp_path / "gone"
    gone.mkdir()
    code = ("import os, sys; os.rmdir(os.getcwd()); "
            "from nvshim.runtime.main import main; main(['create', 'c0'])")
    res = subprocess.run([sys.executable, "-I", "-c", code], cwd=gone, capture_output=True,
                         text=True, timeout=60,
                         env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                              "NVSHIM_CONFIG": str(cfg)})
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "no --bundle and no current directory" in lines[0]
    assert "internal error" not in lines[0]
