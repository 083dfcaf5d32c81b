"""nvshim's params hook (ModifyDeviceFiles: 0 for generated CDI specs): its argv, how the
runtime tells it apart, what the runtime does when it meets it, and the hook's own refusals.

What a container sees through podman, runc and crun: tests/e2e/test_cdi_params_e2e.py.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest

from nvshim.edits import Edits, Hook, Mount
from nvshim.runtime import devparams, hookargs
from nvshim.runtime.cdiedits import restrict_to_capabilities
from nvshim.runtime.devparams import spec_hook, without_modification, without_spec_hooks
from nvshim.runtime.engine import engine_hooks

HOST = "/run/nvidia/driver/proc/driver/nvidia/params"
REPO = Path(__file__).resolve().parents[2]


def params_spec_hook() -> Hook:
    return spec_hook(hookargs.hook_command(devparams.PARAMS_HOOK_MODULE), HOST)


def test_params_hook_is_never_taken_for_the_links_hook() -> None:
    """The params hook's argv (both forms) is recognised as such and never as the links
    hook's, whose pruning and replacement must not touch it; the links hook is not a params
    hook."""
    hook = params_spec_hook()
    assert devparams.runs_params_hook(hook.args)
    assert not hookargs.runs_nvshim_hook(hook.args)
    assert not hookargs.is_nvshim_hook(hook)
    assert devparams.runs_params_hook(("/opt/nvshim/bin/nvshim", "params-hook", "--params", HOST))
    links = hookargs.hook_command() + ("--folder", "/usr/lib")
    assert hookargs.runs_nvshim_hook(links) and not devparams.runs_params_hook(links)


def test_spec_hook_names_nvshims_interpreter_and_an_explicit_env() -> None:
    """The spec's hook: this interpreter by absolute path, -I -S, the params module, the
    host file, and the explicit hook env (nothing of the engine's or image's)."""
    hook = params_spec_hook()
    assert hook.hook_name == "createContainer"
    assert hook.path == os.path.abspath(sys.executable) == hook.args[0]
    assert hook.args[1:3] == ("-I", "-S") and hook.args[-2:] == ("--params", HOST)
    assert "from nvshim.params_hook import main" in hook.args[4]
    assert hook.env == ("PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C")


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--params"],
        ["--params", "relative/params"],
        ["--params", HOST, "--extra"],
        ["--link", "a::/b"],
    ],
)
def test_params_cli_accepts_only_what_the_spec_writes(argv: List[str]) -> None:
    """Anything but `--params ABSOLUTE` is a usage error."""
    from nvshim.errors import UsageError

    with pytest.raises(UsageError):
        devparams.parse_params_cli(argv)


def test_only_the_modify_line_changes() -> None:
    """The copy differs from the host's in the ModifyDeviceFiles line only; 0 or no line
    means nothing to hide."""
    host = b"RmLogonRC: 1\nModifyDeviceFiles: 1\nDeviceFileMode: 438\n"
    assert without_modification(host) == host.replace(b"Files: 1", b"Files: 0")
    assert without_modification(host.replace(b"Files: 1", b"Files: 0")) is None
    assert without_modification(b"RmLogonRC: 1\n") is None


def test_capability_cut_keeps_the_params_hook() -> None:
    """Cutting a spec's edits to the asked capabilities keeps the params hook whatever is
    mounted (it is no links hook to prune)."""
    edits = Edits(
        mounts=(Mount("/x/libcuda.so.1", "/x/libcuda.so.1"),), hooks=(params_spec_hook(),)
    )
    assert restrict_to_capabilities(edits, ["utility"]).hooks == (params_spec_hook(),)


def test_runtime_drops_the_specs_params_hook_for_its_own() -> None:
    """A CDI spec's params hook is taken out of the edits the runtime applies (it adds its
    own sh hook then); other hooks stay."""
    other = Hook("createContainer", "/bin/true", ("true",))
    edits, had = without_spec_hooks(Edits(hooks=(other, params_spec_hook())))
    assert had and edits.hooks == (other,)
    assert without_spec_hooks(Edits(hooks=(other,))) == (Edits(hooks=(other,)), False)


def test_engine_injected_params_hook_is_replaced_by_the_runtimes() -> None:
    """In a config.json an engine injected a generated spec into, the params hook is
    replaced (runnable or not) and becomes the runtime's params work, with a note."""
    hook = params_spec_hook()
    entry = {"path": hook.path, "args": list(hook.args), "env": list(hook.env)}
    found = engine_hooks({"hooks": {"createContainer": [entry]}})
    assert found.params and found.replaced == (("createContainer", entry),)
    assert not found.runnable and not found.links
    assert any("params hook" in n for n in found.notes)


def run_hook(argv: List[str], state: Any, tmp_path: Path) -> "subprocess.CompletedProcess[str]":
    code = (
        "import sys; sys.path[0:0] = [sys.argv.pop(1)]; "
        "from nvshim.params_hook import main; sys.exit(main())"
    )
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(REPO), *argv],
        input=json.dumps(state),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
        timeout=60,
    )


def test_hook_refuses_bad_arguments_in_one_line(tmp_path: Path) -> None:
    """Wrong arguments: one `nvshim params-hook: …` line, exit 1, no traceback."""
    res = run_hook(["--params", "params"], {"bundle": str(tmp_path)}, tmp_path)
    assert res.returncode == 1
    assert res.stderr.startswith("nvshim params-hook: --params params:"), res.stderr
    assert len(res.stderr.splitlines()) == 1


@pytest.mark.parametrize("host", ["missing", "RmLogonRC: 1\nModifyDeviceFiles: 0\n"])
def test_hook_does_nothing_when_the_host_allows_nothing_to_hide(host: str, tmp_path: Path) -> None:
    """No host params, or ModifyDeviceFiles: 0 there: exit 0 and the rootfs is not even
    looked at (a bundle without a rootfs is fine)."""
    params = tmp_path / "params"
    if host != "missing":
        params.write_text(host)
    res = run_hook(["--params", str(params)], {"bundle": str(tmp_path), "root": "nope"}, tmp_path)
    assert (res.returncode, res.stderr) == (0, ""), res.stderr


def test_hook_leaves_a_rootfs_without_the_drivers_file(tmp_path: Path) -> None:
    """The host says 1 but the container's procfs has no nvidia/params: exit 0, nothing
    mounted or made in the rootfs."""
    params = tmp_path / "params"
    params.write_text("ModifyDeviceFiles: 1\n")
    rootfs = tmp_path / "rootfs"
    (rootfs / "proc").mkdir(parents=True)
    res = run_hook(["--params", str(params)], {"bundle": str(tmp_path), "root": "rootfs"}, tmp_path)
    assert (res.returncode, res.stderr) == (0, ""), res.stderr
    assert [p.name for p in rootfs.rglob("*")] == ["proc"]


def test_hook_state_io_is_shared_with_the_links_hook() -> None:
    """Both hooks read the OCI state with the one reader (nvshim/_ocistate.py)."""
    import nvshim.hook
    import nvshim.params_hook
    from nvshim._ocistate import container_root, read_state

    assert nvshim.hook.container_root is container_root
    assert nvshim.params_hook.read_state is read_state
    assert read_state(io.StringIO('{"bundle": "/b"}')) == {"bundle": "/b"}
