"""e2e: ``nvshim doctor`` on a GPU Operator node (issue 37 item 2).

The GPU Operator's toolkit container installs NVIDIA's runtime as a shell wrapper that sets
the runtime's config inline on the command line (``NAME=value \\`` continuation lines before
the ``.real`` binary), behind a ``/proc/modules`` fallback that execs runc. containerd is
configured as nvidia-ctk does it (default runtime ``nvidia``); ``containerd config dump``
proves containerd loads that default. With
``accept-nvidia-visible-devices-envvar-when-unprivileged = false`` in the file the wrapper
names, doctor must read that file (not /etc/nvidia-container-runtime/config.toml) and say ok,
in short lines.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import tomlkit

from tests.helpers.common import require_binary
from tests.helpers.containerd_samples import nvidia_ctk_drop_in, nvidia_ctk_main

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CRI = "io.containerd.grpc.v1.cri"
SWITCH = "accept-nvidia-visible-devices-envvar-when-unprivileged"


def _wrapper(toolkit: Path, form: str) -> str:
    """The toolkit container's wrapper of nvidia-container-runtime, in one shell ``form``."""
    config = f"{toolkit}/.config/nvidia-container-runtime/config.toml"
    head = (
        "#! /bin/sh\n"
        'cat /proc/modules | grep -e "^nvidia " >/dev/null 2>&1\n'
        'if [ "${?}" != "0" ]; then\n'
        '\techo "nvidia driver modules are not yet loaded, invoking runc directly"\n'
        '\texec runc "$@"\n'
        "fi\n"
    )
    if form == "inline":  # the GPU Operator's toolkit container (v1.14 to v1.16)
        return head + (
            f"LD_LIBRARY_PATH={toolkit}:$LD_LIBRARY_PATH \\\n"
            f"PATH={toolkit}:$PATH \\\n"
            f"NVIDIA_CTK_CONFIG_FILE_PATH={config} \\\n"
            f"\t{toolkit}/nvidia-container-runtime.real \\\n"
            '\t\t"$@"\n'
        )
    if form == "exec-quoted":
        return (
            head
            + f'NVIDIA_CTK_CONFIG_FILE_PATH="{config}" exec "{toolkit}/nvidia-container-runtime.real" "$@"\n'
        )
    if form == "env":
        return (
            head
            + f"exec env 'NVIDIA_CTK_CONFIG_FILE_PATH={config}' {toolkit}/nvidia-container-runtime.real \"$@\"\n"
        )
    assert form == "export"
    return head + (
        f'export NVIDIA_CTK_CONFIG_FILE_PATH="{config}"\n'
        f'exec {toolkit}/nvidia-container-runtime.real "$@"\n'
    )


def _node(root: Path, form: str) -> Path:
    toolkit = root / "usr/local/nvidia/toolkit"
    (toolkit / ".config/nvidia-container-runtime").mkdir(parents=True)
    (toolkit / ".config/nvidia-container-runtime/config.toml").write_text(f"{SWITCH} = false\n")
    wrapper = toolkit / "nvidia-container-runtime"
    wrapper.write_text(_wrapper(toolkit, form))
    wrapper.chmod(0o755)
    real = toolkit / "nvidia-container-runtime.real"
    real.write_bytes(b"\x7fELF stand-in")
    real.chmod(0o755)
    conf_d = root / "etc/containerd/conf.d"
    conf_d.mkdir(parents=True)
    config = root / "etc/containerd/config.toml"
    config.write_text(nvidia_ctk_main(str(conf_d)))
    (conf_d / "99-nvidia.toml").write_text(
        nvidia_ctk_drop_in(str(toolkit), set_as_default=True, runc=True)
    )
    return config


def _doctor(root: Path, config: Path) -> List[Dict[str, Any]]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvshim.cli.main",
            "doctor",
            "--format",
            "json",
            "--config",
            str(root / "nvshim.yaml"),
            "--containerd-config",
            str(config),
            "--docker-config",
            str(root / "none"),
            "--crio-config",
            str(root / "none"),
            "--nvidia-config",
            str(root / "etc/nvidia-container-runtime/config.toml"),
            "--hooks-dir",
            str(root / "hooks.d"),
            "--trampoline",
            str(root / "nvshim-runtime"),
            "--driver-root",
            str(root / "driver"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    findings: List[Dict[str, Any]] = json.loads(done.stdout)
    return findings


@pytest.mark.parametrize("form", ["inline", "exec-quoted", "env", "export"])
def test_operator_wrapper_config_is_followed(tmp_path: Path, form: str) -> None:
    """doctor reads the NVIDIA config the toolkit container's wrapper names, in every shell form."""
    containerd = require_binary("containerd")
    config = _node(tmp_path, form)
    (tmp_path / "nvshim.yaml").write_text("{}\n")
    dumped = subprocess.run(
        [containerd, "--config", str(config), "config", "dump"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert tomlkit.parse(dumped)["plugins"][CRI]["containerd"]["default_runtime_name"] == "nvidia"
    found = {f["check"]: f for f in _doctor(tmp_path, config)}
    default = found["default-runtime"]
    assert default["status"] == "ok", default
    toolkit_config = f"{tmp_path}/usr/local/nvidia/toolkit/.config/nvidia-container-runtime"
    assert toolkit_config in default["message"], default
    line = f"ok    default-runtime: {default['message']}".replace(str(tmp_path), "")
    assert len(line) <= 160, line  # as on a node, where the toolkit is at /usr/local
