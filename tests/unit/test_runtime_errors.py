"""Every error nvshim raises is an NvshimError (one line, exit 1), never a bare
ValueError/OSError/KeyError that would surface as an "internal error". The runtime package
and the hook are checked closest; the static checks cover the whole package."""

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
OWNED = sorted(ROOT.rglob("*.py"))
NOT_CHECKED: set = set()
#: Raised on purpose, never reaching a user:
#: - specjson's TypeError is json's protocol for an unknown object in ``default``; it never
#:   leaves the encoder;
#: - cdi/load's ValueError is json's protocol for a ``parse_constant`` hook; the decoder
#:   turns it into the file's CdiSpecError;
#: - host/inroot's OSErrors keep the errno of the confined system call they stand for, as
#:   the os functions they replace do; every caller turns them into a HostError;
#: - _record's TypeErrors are Python's own answer to a constructor called with wrong
#:   arguments (as dataclasses give), and findings' ValueError guards the doctor's own
#:   code against an unknown status: both are programming errors, not user input.
ALLOWED = {
    ("runtime/specjson.py", "TypeError"),
    ("cdi/load.py", "ValueError"),
    ("host/inroot.py", "OSError"),
    ("host/inroot.py", "FileNotFoundError"),
    ("_record.py", "TypeError"),
    ("node/doctor/findings.py", "ValueError"),
}
#: Exception classes outside the tree on purpose: internal signals caught in the same module
#: (_jsonc's fallback to the json package, config's duplicate-key hook for yaml and its
#: not-a-regular-file signal) and
#: dataclasses' FrozenInstanceError, which records mirror.
INTERNAL = {
    "nvshim._jsonc._Fallback",
    "nvshim.node.cdirefresh._Stop",
    "nvshim.config._DuplicateKey",
    "nvshim.files._NotAFile",
    "nvshim._record.FrozenInstanceError",
    # the NRI transport's own: caught in the plugin's loop, one log line or an error
    # reply to the engine, never a user's error
    "nvshim.agent.nri.transport.RpcError",
    # the agent hook's "the Python hook does it": a fallback reply, never a user's error
    "nvshim.agent.hookwork._NotServed",
}
BUILTIN = {
    "ValueError",
    "OSError",
    "KeyError",
    "TypeError",
    "RuntimeError",
    "Exception",
    "IndexError",
    "LookupError",
    "IOError",
    "FileNotFoundError",
    "PermissionError",
}


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
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == name
                and not issubclass(value, NvshimError)
                and f"{name}.{attr}" not in INTERNAL
            ):
                outside.append(f"{name}.{attr}")
    assert outside == []


def test_a_spec_nested_too_deep_is_a_spec_error() -> None:
    from nvshim.runtime.specjson import MAX_DEPTH, decode_spec

    with pytest.raises(SpecError, match=f"nested deeper than {MAX_DEPTH} levels"):
        decode_spec(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))


@pytest.mark.parametrize(
    "raw",
    [b'{"a":1,"a":1}', b'\xef\xbb\xbf[{"b":{"c":[{"d":0,"e":1,"d":2}]}}]', b'{"f":{},"f":{}}'],
)
def test_a_key_twice_in_one_object_is_a_spec_error(raw: bytes) -> None:
    """decode_spec refuses a key that occurs twice in one object, naming it (with or without a
    BOM, at any depth); the same key in different objects is fine."""
    from nvshim.runtime.specjson import SpecDuplicateKeyError, decode_spec

    with pytest.raises(SpecDuplicateKeyError, match='^duplicate key "[adf]" in an object'):
        decode_spec(raw)
    assert decode_spec(b'{"a":{"a":{"a":1}},"b":[{"a":1},{"a":2}]}') == {
        "a": {"a": {"a": 1}},
        "b": [{"a": 1}, {"a": 2}],
    }


@pytest.mark.parametrize("data", [b"\x08", b"\x80" * 11, b"\x0a\x05ab", b"\x0b", b"\x00"])
def test_a_malformed_kubelet_message_is_a_host_error(data: bytes) -> None:
    from nvshim._protobuf import by_number as decode

    with pytest.raises(HostError):
        decode(data)


def test_an_unsafe_trampoline_path_is_a_usage_error() -> None:
    from nvshim.node.install.trampoline import render

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
    code = (
        "import os, sys; os.rmdir(os.getcwd()); "
        "from nvshim.runtime.main import main; main(['create', 'c0'])"
    )
    res = subprocess.run(
        [sys.executable, "-I", "-c", code],
        cwd=gone,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NVSHIM_CONFIG": str(cfg)},
    )
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "no --bundle and no current directory" in lines[0]
    assert "internal error" not in lines[0]


@pytest.mark.parametrize("kind", ["missing", "empty"])
def test_a_gpu_request_on_a_wrong_driver_root_names_the_root(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A careless ``driver-root`` (a typo, a node not built yet) must not read like a node
    without GPUs: the one line names the root looked under, the config (here none: the
    built-in defaults and the file looked for) and, when the root is missing, says so."""
    from nvshim.config import Config
    from nvshim.errors import RequestError
    from nvshim.runtime.create import plan_create
    from tests.helpers.bundle import make_bundle, make_rootfs

    absent = tmp_path / "absent.yaml"
    monkeypatch.setenv("NVSHIM_CONFIG", str(absent))
    bundle = make_bundle(
        tmp_path / "b",
        make_rootfs(tmp_path / "rootfs"),
        ["true"],
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
    )
    root = tmp_path / "driver"
    if kind == "empty":
        root.mkdir()
    before = (bundle / "config.json").read_bytes()
    with pytest.raises(RequestError) as info:
        plan_create(str(bundle), Config(driver_root=str(root)))
    expected = (
        f'unknown device "0": this node has no GPUs under driver root {root} '
        f"(built-in defaults: no config {absent})"
    )
    if kind == "missing":
        expected += f"; driver root {root} does not exist"
    assert str(info.value) == expected
    assert (bundle / "config.json").read_bytes() == before


def test_a_gpu_request_on_the_host_root_names_root_and_config(tmp_path: Path) -> None:
    """On ``driver-root: /`` too, "no GPUs" says where it looked and which config said so."""
    from nvshim.config import Config
    from nvshim.errors import RequestError
    from nvshim.runtime.create import plan_create
    from tests.helpers.bundle import make_bundle, make_rootfs

    if os.path.exists("/proc/driver/nvidia/gpus") and os.listdir("/proc/driver/nvidia/gpus"):
        pytest.skip("this host has NVIDIA GPUs")
    bundle = make_bundle(
        tmp_path / "b",
        make_rootfs(tmp_path / "rootfs"),
        ["true"],
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
    )
    cfg = tmp_path / "config.yaml"
    with pytest.raises(RequestError) as info:
        plan_create(str(bundle), Config(driver_root="/", source=str(cfg)))
    assert str(info.value) == (
        f'unknown device "0": this node has no GPUs under driver root / (config {cfg})'
    )


def _runtime_create(
    runtime: str, bundle: Path, log: Path, environ: dict
) -> "subprocess.CompletedProcess[str]":
    """``nvshim-runtime --log LOG --log-format json create --bundle BUNDLE c0``."""
    return subprocess.run(
        [
            runtime,
            "--log",
            str(log),
            "--log-format",
            "json",
            "create",
            "--bundle",
            str(bundle),
            "c0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **environ},
    )


@pytest.mark.parametrize("configured", [True, False])
def test_unknown_device_from_the_runtime_names_config_and_driver_root(
    tmp_path: Path, configured: bool, nvshim_runtime_bin: str
) -> None:
    """``nvshim-runtime create`` asking for a GPU the node lacks: the stderr line and the
    ``--log`` JSON error line both name the driver root looked under and the config used —
    or, when the config NVSHIM_CONFIG names is absent, that file and who named it (a named
    config that is missing fails closed, never the built-in defaults); config.json stays
    byte-identical."""
    import json

    from tests.helpers.bundle import make_bundle, make_rootfs

    cfg = tmp_path / "cfg" / "config.yaml"
    if configured:
        if os.geteuid() != 0:
            pytest.skip("a simulated node needs root (mknod)")
        from nvshim.sim.build import create_node

        node = create_node(str(tmp_path / "node"), gpus=1)
        cfg.parent.mkdir()
        cfg.write_text(
            f"driver-root: {node.root}\nruntimes: [/bin/true]\n"
            f"grants-journal: {tmp_path / 'grants.jsonl'}\n"
        )
        expected = (
            f'unknown device "1": this node has GPUs 0 under driver root {node.root} (config {cfg})'
        )
    else:
        if os.path.exists("/proc/driver/nvidia/gpus") and os.listdir("/proc/driver/nvidia/gpus"):
            pytest.skip("this host has NVIDIA GPUs")
        expected = (
            f"config {cfg} does not exist (named by NVSHIM_CONFIG): nvshim-runtime "
            "creates no container with the built-in defaults (require-allocation off) "
            "in its place; restore it, or name the config that exists"
        )
    bundle = make_bundle(
        tmp_path / "b",
        make_rootfs(tmp_path / "rootfs"),
        ["true"],
        env={"NVIDIA_VISIBLE_DEVICES": "1"},
    )
    before = (bundle / "config.json").read_bytes()
    log = tmp_path / "runc.log"
    res = _runtime_create(nvshim_runtime_bin, bundle, log, {"NVSHIM_CONFIG": str(cfg)})
    assert res.returncode == 1, res.stderr
    assert res.stderr == f"nvshim: {expected}\n"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["level"], r["msg"]) for r in records] == [("error", f"nvshim: {expected}")]
    assert (bundle / "config.json").read_bytes() == before
