"""Every line ``nvshim doctor`` prints (text mode, without ``--verbose``) is at most 160
characters, over representative node states built with the doctor tests' fixtures (issue 37
item 2): what a line leaves out is its ``detail``. A state's temp directory stands for the
root of the node's files, so a line is measured with that prefix taken out."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List

import pytest
import tomlkit
import yaml

from nvshim.node.doctor.checks import render_text, run_checks
from nvshim.node.doctor.findings import DoctorOptions
from nvshim.node.engines import containerd
from tests.helpers.commands import fake_runtime
from tests.unit.node.doctor.test_doctor import containerd_config, write_config
from tests.unit.node.doctor.test_doctor_nvidia_default import (
    nvidia_ctk_containerd,
    nvidia_ctk_crio,
    nvidia_ctk_docker,
)
from tests.unit.node.doctor.test_reach import NVIDIA, hook_file, script, trampoline

MAX_LINE = 160


def _nvshim(tmp: Path, **settings: object) -> Path:
    path = tmp / "etc" / "nvshim" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"cdi-spec-dirs": [str(tmp / "cdi")], **settings}))
    return path


def _configured(tmp: Path, main_text: str, enable_cdi: bool = False) -> Path:
    """containerd's config after ``nvshim runtime configure`` (and CDI turned on by hand)."""
    path = tmp / "etc" / "containerd" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(main_text)
    containerd.configure(
        str(path), binary=str(trampoline(tmp / "bin" / "nvshim-runtime", _nvshim(tmp)))
    )
    if enable_cdi:
        drop_in = path.parent / "conf.d" / "99-nvshim.toml"
        doc = tomlkit.parse(drop_in.read_text())
        doc["plugins"]["io.containerd.grpc.v1.cri"]["enable_cdi"] = True
        drop_in.write_text(tomlkit.dumps(doc))
    return path


def _readme_install(tmp: Path) -> Dict[str, Path]:
    return {"containerd": _configured(tmp, "version = 2\n")}


def _double_cdi(tmp: Path) -> Dict[str, Path]:
    return {
        "containerd": _configured(
            tmp,
            'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\nenable_cdi = false\n',
            enable_cdi=True,
        )
    }


def _unknown_containerd_version(tmp: Path) -> Dict[str, Path]:
    return {"containerd": _configured(tmp, "version = 2\n")}  # no containerd binary to ask


def _nvidia_defaults(tmp: Path) -> Dict[str, Path]:
    return {
        "containerd": nvidia_ctk_containerd(tmp),
        "docker": nvidia_ctk_docker(tmp),
        "crio": nvidia_ctk_crio(tmp),
    }


def _nvshim_default_off(tmp: Path) -> Dict[str, Path]:
    ctrd = containerd_config(
        tmp / "etc" / "containerd" / "config.toml", fake_runtime(tmp / "bin"), "nvshim"
    )
    return {"containerd": ctrd, "config": write_config(tmp / "etc" / "nvshim")}


def _forgeable_and_hooks(tmp: Path) -> Dict[str, Path]:
    hook_file(tmp / "usr-hooks.d", "oci-nvidia-hook.json", {"always": True, "commands": [".*"]})
    hook_file(tmp / "etc-hooks.d", "gpu.json", {"annotations": {"gpu": ".*"}})
    wrapper = script(tmp / "bin" / "low", f'exec {NVIDIA} "$@"\n')
    return {
        "config": _nvshim(tmp, **{"require-allocation": True, "runtimes": [str(wrapper), "runc"]})
    }


def _broken(tmp: Path) -> Dict[str, Path]:
    config = _nvshim(tmp)
    config.write_text("require-allocation: maybe\n")
    daemon = tmp / "etc" / "docker" / "daemon.json"
    daemon.parent.mkdir(parents=True)
    daemon.write_text("{ nope")
    crio = tmp / "etc" / "crio" / "crio.conf"
    crio.parent.mkdir(parents=True)
    crio.write_text("[crio\n")
    ctrd = containerd_config(
        tmp / "etc" / "containerd" / "config.toml", tmp / "gone" / "nvshim-runtime"
    )
    return {"config": config, "docker": daemon, "crio": crio, "containerd": ctrd}


def _handler_config_missing(tmp: Path) -> Dict[str, Path]:
    tramp = trampoline(tmp / "bin" / "nvshim-runtime", tmp / "etc" / "nvshim" / "gone.yaml")
    wrapper = script(tmp / "bin" / "nvshim-wrapper", f'exec {tramp} "$@"\n')
    ctrd = containerd_config(tmp / "etc" / "containerd" / "config.toml", wrapper)
    return {"containerd": ctrd}


def _default_mark_off(tmp: Path) -> Dict[str, Path]:
    """install.sh --set-as-default's mark, then the config edited to require-allocation off."""
    from nvshim.node.compile import compile_config

    config = _nvshim(tmp, **{"require-allocation": True})
    compile_config(str(config), default_runtime=True)
    config.write_text("# everything commented out\n")
    return {"config": config}


STATES: Dict[str, Callable[[Path], Dict[str, Path]]] = {
    "default-mark-off": _default_mark_off,
    "readme-install": _readme_install,
    "double-cdi": _double_cdi,
    "unknown-containerd": _unknown_containerd_version,
    "nvidia-defaults": _nvidia_defaults,
    "nvshim-default-off": _nvshim_default_off,
    "forgeable-hooks-chain": _forgeable_and_hooks,
    "broken-files": _broken,
    "handler-config-missing": _handler_config_missing,
}


@pytest.mark.parametrize("state", sorted(STATES))
def test_every_doctor_line_is_at_most_160_characters(
    tmp_path: Path, state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each state's text-mode lines fit in 160 characters; their details are in JSON."""
    monkeypatch.delenv("NVSHIM_CONFIG", raising=False)
    files = STATES[state](tmp_path)
    absent = tmp_path / "absent"
    options = DoctorOptions(
        config_path=str(files.get("config", _nvshim(tmp_path))),
        config_required=True,
        containerd_config=str(files.get("containerd", absent / "containerd.toml")),
        containerd_binary=str(absent / "containerd"),
        docker_config=str(files.get("docker", absent / "daemon.json")),
        crio_config=str(files.get("crio", absent / "crio.conf")),
        driver_root=str(absent / "driver"),
        trampoline=str(tmp_path / "bin" / "nvshim-runtime"),
        nvidia_config=str(absent / "nvidia.toml"),
        hooks_dirs=(str(tmp_path / "usr-hooks.d"), str(tmp_path / "etc-hooks.d")),
        agent_socket=str(absent / "agent.sock"),
    )
    findings = run_checks(options)
    lines = render_text(findings).splitlines()
    assert len(lines) == len(findings)
    long: List[str] = [line for line in lines if len(line.replace(str(tmp_path), "")) > MAX_LINE]
    assert long == [], "\n".join(long)
