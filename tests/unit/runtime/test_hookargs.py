"""runtime/hookargs owns the createContainer hook's command line: the command that starts
nvshim's hook, its arguments, how to recognise it and how to rewrite its links."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import nvshim
from nvshim.edits import HOOK_ENV, Hook
from nvshim.errors import UsageError
from nvshim.runtime.hookargs import (
    HOOK_MODULE,
    build_hook_args,
    hook_command,
    is_nvshim_hook,
    parse_hook_args,
    parse_hook_cli,
    parse_host_driver_version,
    runs_nvshim_hook,
    split_hook_argv,
    with_links,
)

LIB = "/usr/lib/x86_64-linux-gnu"
LINKS = [("libcuda.so.550.54.15", f"{LIB}/libcuda.so.1"), ("libcuda.so.1", f"{LIB}/libcuda.so")]
FOLDERS = [LIB, "/usr/lib/i386-linux-gnu"]


def test_a_built_hook_parses_back_in_the_runtime_and_in_the_hook() -> None:
    """hook_command + build_hook_args: the runtime's reader and the hook's own parser both
    read back exactly the links, folders and driver version written."""
    argv = [*hook_command(), *build_hook_args(LINKS, FOLDERS, "550.54.15")]
    assert parse_hook_args(argv) == (LINKS, FOLDERS)
    assert parse_host_driver_version(argv) == "550.54.15"
    head, rest = split_hook_argv(argv)
    assert head == list(hook_command())
    ns = parse_hook_cli(rest)
    assert (ns.link, ns.folder, ns.host_driver_version) == (LINKS, FOLDERS, "550.54.15")


def test_hook_command_starts_the_hook_module(tmp_path: Path) -> None:
    """The command really runs nvshim's hook (its --help names the module), isolated."""
    cmd = hook_command()
    assert cmd[0] == str(Path(sys.executable).absolute())
    assert cmd[1:3] == ("-I", "-S") and runs_nvshim_hook(cmd)
    res = subprocess.run(
        [*cmd, "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert f"python -I -m {HOOK_MODULE}" in res.stdout and "--link" in res.stdout


@pytest.mark.parametrize(
    "name, args, ours",
    [
        ("createContainer", [*hook_command(), "--folder", LIB], True),
        ("createContainer", ["/usr/bin/python3", "-I", "-m", "nvshim.hook", "--folder", LIB], True),
        ("prestart", [*hook_command(), "--folder", LIB], False),
        ("createContainer", ["/usr/bin/nvidia-ctk", "hook", "create-symlinks"], False),
    ],
)
def test_is_nvshim_hook(name: str, args: list, ours: bool) -> None:
    assert is_nvshim_hook(Hook(name, args[0], tuple(args), HOOK_ENV)) is ours


def test_with_links_keeps_the_command_folders_and_driver_version() -> None:
    """The -m form too: only the --link pairs change."""
    argv = [
        "/usr/bin/python3",
        "-I",
        "-m",
        "nvshim.hook",
        *build_hook_args(LINKS, FOLDERS, "550.54.15"),
    ]
    out = with_links(argv, LINKS[:1])
    assert out[:4] == argv[:4]
    assert parse_hook_args(out) == (LINKS[:1], FOLDERS)
    assert parse_host_driver_version(out) == "550.54.15"
    assert parse_hook_args(with_links(argv, [])) == ([], FOLDERS)
    plain = ["/usr/bin/python3", "-I", "-m", "nvshim.hook", *build_hook_args(LINKS, FOLDERS)]
    assert parse_host_driver_version(with_links(plain, LINKS)) is None


def test_a_cdi_device_keeps_the_cuda_compat_check(tmp_path: Path) -> None:
    """A CDI device's hook, pruned to the container's capabilities, still carries the host
    driver version, so the in-root work still puts a newer CUDA compat libcuda first (the
    pruning used to rebuild the hook without it)."""
    if os.geteuid() != 0:
        pytest.skip("the simulated GPU node needs root (mknod)")
    from nvshim.cdi.write import write_spec
    from nvshim.config import Config
    from nvshim.host.discovery import Host
    from nvshim.node.cdigen import generate_spec
    from nvshim.runtime.create import plan_create
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=1)
    host = Host(node.root)
    version = host.driver_version()
    spec = generate_spec(
        host, capabilities=("compute", "utility", "video"), hook_command=hook_command()
    )
    write_spec(str(tmp_path / "cdi" / "nvidia.yaml"), spec)
    config = Config(driver_root=node.root, cdi_spec_dirs=(str(tmp_path / "cdi"),))
    bundle = tmp_path / "b"
    bundle.mkdir()
    env = ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0"]  # compute,utility: graphics etc. pruned
    (bundle / "config.json").write_text(json.dumps({"process": {"env": env}, "mounts": []}))
    plan = plan_create(str(bundle), config)
    hooks = [h for h in plan.edits.hooks if is_nvshim_hook(h)]
    assert len(hooks) == 1 and any("libcuda" in a for a in hooks[0].args)
    assert parse_host_driver_version(spec["containerEdits"]["hooks"][0]["args"]) == version
    assert parse_host_driver_version(hooks[0].args) == version
    assert plan.rootfs.work is not None and plan.rootfs.work.host_driver_version == version


def test_the_hooks_parser_refuses_what_the_builder_never_writes() -> None:
    for bad in (["--link", "a"], ["--folder", "rel/dir"], ["--link", "a::rel"], ["--bogus"]):
        with pytest.raises(UsageError):
            parse_hook_cli(bad)
    with pytest.raises(UsageError):
        build_hook_args([("a", "rel")], [])


def test_no_other_module_recognises_the_hook_by_its_name() -> None:
    """Only hookargs spells the hook's module name in code (nvshim.hook is the module
    itself); every other reader goes through hookargs."""
    root = Path(nvshim.__file__).parent
    spelled = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in ("runtime/hookargs.py", "hook.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value == HOOK_MODULE:
                spelled.append(f"{rel}:{node.lineno}")
    assert spelled == []
