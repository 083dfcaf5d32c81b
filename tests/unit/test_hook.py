"""nvshim.hook: the createContainer hook's command line, its errors, and the real
interpreter running it (imports, planted modules). What it does in the rootfs (links,
ld.so.cache, hostile images) is in test_rootwork.py."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nvshim import hook
from nvshim.errors import UsageError
from nvshim.runtime.hookargs import parse_hook_cli
from tests.helpers.hookworld import (
    LIBDIR,
    LINKS,
    VERSION,
    check_injected,
    default_args,
    hook_python,
    make_bundle,
    run_hook,
    runc_state,
    snapshot,
)

# --- the CLI ----------------------------------------------------------------------------


def test_build_hook_args_round_trips_through_the_parser() -> None:
    """What build_hook_args emits is exactly what the hook's parser reads back."""
    links = [*LINKS, ("../libnvidia-allocator.so.1", f"{LIBDIR}/gbm/nvidia-drm_gbm.so")]
    folders = [LIBDIR, "/usr/lib/i386-linux-gnu"]
    args = hook.build_hook_args(links, folders)
    assert args[:4] == ["--folder", LIBDIR, "--folder", "/usr/lib/i386-linux-gnu"]
    assert f"libcuda.so.{VERSION}::{LIBDIR}/libcuda.so.1" in args
    ns = parse_hook_cli(args)
    assert ns.link == links
    assert ns.folder == folders


@pytest.mark.parametrize(
    "links, folders, message",
    [
        ([("a::b", "/l")], [], "may appear only once"),
        ([("libx.so.1", "relative/l")], [], "absolute"),
        ([("", "/l")], [], "must not be empty"),
        ([("-libx.so.1", "/l")], [], "must not start with '-'"),
        ([], ["lib"], "absolute container path"),
    ],
)
def test_build_hook_args_rejects_what_the_parser_cannot_read(
    links: list[tuple[str, str]], folders: list[str], message: str
) -> None:
    """Links with '::', relative link paths, empty or '-' targets and relative folders are refused."""
    with pytest.raises(UsageError, match=message):
        hook.build_hook_args(links, folders)


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    """--help prints the usage with both options and exits 0."""
    with pytest.raises(SystemExit) as info:
        hook.main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--link TARGET::LINK" in out and "--folder DIR" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--link", "no-separator"], "expected TARGET::LINK"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--folder", "relative"], "absolute container path"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_1(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    """A usage error is one 'nvshim hook: ' line on stderr and exit 1, not argparse's exit 2."""
    bundle, rootfs = make_bundle(tmp_path)
    rc, err = run_hook(monkeypatch, capsys, argv, runc_state(bundle), rootfs)
    assert rc == 1
    assert err.startswith("nvshim hook: ") and err.count("\n") == 1
    assert message in err


def nvshim_hook(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    state: dict[str, Any],
    cwd: Path,
) -> tuple[int, str, str]:
    """``nvshim hook ARGV`` through the nvshim command: (exit code, stdout, stderr)."""
    from nvshim.cli.main import main as nvshim_main

    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(state)))
    monkeypatch.chdir(cwd)
    with pytest.raises(SystemExit) as info:
        nvshim_main(["hook", *argv])
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["--folder", LIBDIR, "--help"]])
def test_nvshim_hook_help_is_the_clis_and_lists_the_hooks_options(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    """`nvshim hook --help` is click's help like every other command's, named `nvshim hook`,
    with each option the hook's parser takes and its metavar (it was argparse's usage of
    `python -I -m nvshim.hook`)."""
    from nvshim.runtime.hookargs import HOOK_OPTIONS

    bundle, rootfs = make_bundle(tmp_path)
    code, out, err = nvshim_hook(monkeypatch, capsys, argv, runc_state(bundle), rootfs)
    assert (code, err) == (0, "")
    assert out.startswith("Usage: nvshim hook [OPTIONS]\n") and "usage:" not in out
    assert "python -I -m" not in out and "Options:" in out
    for flag, metavar, _, _ in HOOK_OPTIONS:
        assert (f"{flag} {metavar}" if metavar else f"{flag} ") in out
    assert not (rootfs / "etc" / "ld.so.cache").exists()


def test_nvshim_hook_does_what_the_hook_module_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`nvshim hook ARGS` (a CDI spec made with --hook-path runs it so) writes the same
    links and cache as the hook module runc starts."""
    by_module, module_root = make_bundle(tmp_path / "module")
    rc, err = run_hook(monkeypatch, capsys, default_args(), runc_state(by_module), module_root)
    assert (rc, err) == (0, "")
    by_cli, cli_root = make_bundle(tmp_path / "cli")
    assert nvshim_hook(monkeypatch, capsys, default_args(), runc_state(by_cli), cli_root) == (
        0,
        "",
        "",
    )
    assert snapshot(cli_root) == snapshot(module_root)
    assert (cli_root / LIBDIR.lstrip("/") / "libcuda.so.1").is_symlink()


@pytest.mark.parametrize(
    "argv",
    [["--link", "no-separator"], ["--bogus"], ["--folder", "relative"], ["stray"]],
)
def test_nvshim_hook_refuses_as_the_hook_module_does(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    """Bad arguments to `nvshim hook` meet the hook's own parser: the same one line."""
    bundle, rootfs = make_bundle(tmp_path)
    rc, err = run_hook(monkeypatch, capsys, argv, runc_state(bundle), rootfs)
    assert rc == 1 and err.startswith("nvshim hook: ") and err.count("\n") == 1
    assert nvshim_hook(monkeypatch, capsys, argv, runc_state(bundle), rootfs) == (1, "", err)


@pytest.mark.parametrize(
    "state, message",
    [
        ("", "cannot parse the oci state"),
        ("[1]", "must be a json object"),
        ('{"bundle": "relative"}', "bundle must be an absolute path"),
        ('{"bundle": "/nonexistent-bundle"}', "cannot read /nonexistent-bundle/config.json"),
        ('{"bundle": "/", "root": 7}', "oci state root must be a non-empty string"),
        ('{"bundle": "/", "root": "/r\\u0000"}', "oci state root must be a non-empty string"),
    ],
)
def test_bad_state_is_one_line_and_exit_1(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    state: str,
    message: str,
) -> None:
    """An unreadable OCI state or bundle config fails with one line naming what is wrong."""
    rc, err = run_hook(monkeypatch, capsys, default_args(), state, tmp_path)
    assert rc == 1
    assert err.startswith("nvshim hook: ") and err.count("\n") == 1
    assert message in err


def test_container_root_prefers_state_root_and_joins_relative_to_bundle(tmp_path: Path) -> None:
    """State 'root' (crun) wins over config root.path; relative paths join the bundle."""
    bundle, _ = make_bundle(tmp_path, root_path="rootfs")
    assert hook.container_root({"bundle": str(bundle)}) == f"{bundle}/rootfs"
    assert hook.container_root({"bundle": str(bundle), "root": "other"}) == f"{bundle}/other"
    assert hook.container_root({"bundle": str(bundle), "root": "/abs/root"}) == "/abs/root"


# --- the real interpreter and the real loader ---------------------------------------------


def test_subprocess_with_tiny_env_works_and_imports_nothing_heavy(tmp_path: Path) -> None:
    """`python -I -m nvshim.hook` with only PATH and LC_ALL works and loads no click/yaml/etc."""
    bundle, rootfs = make_bundle(tmp_path)
    proc = subprocess.run(
        [hook_python(), "-I", "-X", "importtime", "-m", "nvshim.hook", *default_args()],
        input=json.dumps(runc_state(bundle)),
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
        cwd=rootfs,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = proc.stderr.splitlines()
    other = [line for line in lines if not line.startswith("import time:")]
    assert (proc.returncode, other) == (0, [])
    modules = {line.rsplit("|", 1)[-1].strip() for line in lines[1:]}
    assert "nvshim.hook" in modules or "nvshim.host.inroot" in modules
    heavy = {"click", "yaml", "structlog", "jsonschema", "pynvml", "ctypes"}
    assert {m.split(".")[0] for m in modules} & heavy == set()
    check_injected(rootfs)


def test_python_modules_planted_in_the_rootfs_are_not_imported(tmp_path: Path) -> None:
    """With cwd = rootfs (runc), image files named json.py or nvshim/ are never imported (-I)."""
    bundle, rootfs = make_bundle(tmp_path)
    marker = tmp_path / "PWNED"
    payload = f"open({str(marker)!r}, 'w').close()\n"
    for name in ("json.py", "argparse.py", "struct.py", "nvshim/__init__.py", "nvshim/hook.py"):
        (rootfs / name).parent.mkdir(exist_ok=True)
        (rootfs / name).write_text(payload)
    proc = subprocess.run(
        [hook_python(), "-I", "-m", "nvshim.hook", *default_args()],
        input=json.dumps(runc_state(bundle)), env={"LC_ALL": "C"}, cwd=rootfs,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (proc.returncode, proc.stderr) == (0, "")
    assert not marker.exists()
