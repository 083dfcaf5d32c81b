"""``nvshim doctor`` on nodes whose engine runs NVIDIA's own runtime by default.

NVIDIA's runtime grants GPUs from the image's env, so as an engine's default runtime it gives
containers that request no GPU every GPU of the node (CUDA images set
``NVIDIA_VISIBLE_DEVICES=all``): the pitfall nvshim exists to close, whatever nvshim's own
config says. The configs below are what ``nvidia-ctk runtime configure --set-as-default``
writes (NVIDIA's toolkit v1.20, its ``runtime configure`` for each engine).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional, Tuple

import pytest
import yaml

from nvshim.cli.main import main
from nvshim.config import Config
from nvshim.node.doctor import engines as doctor_engines
from nvshim.node.doctor.findings import DoctorOptions, is_nvidia_runtime

NVIDIA_CTK_BINARY = "/usr/bin/nvidia-container-runtime"
CRI = 'plugins."io.containerd.grpc.v1.cri"'
PITFALL = (
    "is NVIDIA's runtime ({binary}): every container that names no runtime runs through it, "
    "and it grants GPUs from the image's env, so containers that request no GPU get every GPU "
    "from CUDA images' NVIDIA_VISIBLE_DEVICES=all (no {nvidia}: "
    "accept-nvidia-visible-devices-envvar-when-unprivileged defaults to true)"
)
SWITCH = (
    "; or set accept-nvidia-visible-devices-envvar-when-unprivileged = false in {nvidia} "
    "(NVIDIA's own switch; GPUs then come from device-plugin mounts or CDI only)"
)


@pytest.fixture(autouse=True)
def _no_nvshim_config_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fix names NVSHIM_CONFIG=<config> unless it already points there: keep it unset."""
    monkeypatch.delenv("NVSHIM_CONFIG", raising=False)


def nvshim_config(tmp_path: Path, require_allocation: bool) -> Path:
    path = tmp_path / "nvshim" / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump(
            {"require-allocation": require_allocation, "cdi-spec-dirs": [str(tmp_path / "cdi")]}
        )
    )
    return path


def nvidia_ctk_containerd(tmp_path: Path) -> Path:
    """containerd after ``nvidia-ctk runtime configure --runtime=containerd --set-as-default``:
    the main file imports a drop-in holding the CRI table with the nvidia handler as default."""
    main_file = tmp_path / "containerd" / "config.toml"
    drop_in = tmp_path / "containerd" / "conf.d" / "99-nvidia.toml"
    drop_in.parent.mkdir(parents=True)
    main_file.write_text(f'imports = ["{drop_in.parent}/*.toml"]\nversion = 2\n')
    drop_in.write_text(
        "version = 2\n\n"
        f"[{CRI}.containerd]\n"
        '  default_runtime_name = "nvidia"\n\n'
        f"[{CRI}.containerd.runtimes.nvidia]\n"
        "  privileged_without_host_devices = false\n"
        '  runtime_engine = ""\n'
        '  runtime_root = ""\n'
        '  runtime_type = "io.containerd.runc.v2"\n\n'
        f"[{CRI}.containerd.runtimes.nvidia.options]\n"
        f'  BinaryName = "{NVIDIA_CTK_BINARY}"\n'
    )
    return main_file


def nvidia_ctk_docker(tmp_path: Path) -> Path:
    """daemon.json as ``nvidia-ctk runtime configure --runtime=docker --set-as-default`` writes it."""
    path = tmp_path / "docker" / "daemon.json"
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps(
            {
                "default-runtime": "nvidia",
                "features": {"cdi": True},
                "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}},
            },
            indent=4,
        )
    )
    return path


def nvidia_ctk_crio(tmp_path: Path) -> Path:
    """CRI-O's crio.conf plus the drop-in ``nvidia-ctk --runtime=crio --set-as-default`` writes."""
    main_file = tmp_path / "crio" / "crio.conf"
    (main_file.parent / "crio.conf.d").mkdir(parents=True)
    main_file.write_text('[crio.runtime]\ncgroup_manager = "systemd"\n')
    (main_file.parent / "crio.conf.d" / "99-nvidia.toml").write_text(
        '[crio.runtime]\ndefault_runtime = "nvidia"\n\n'
        f'[crio.runtime.runtimes.nvidia]\nruntime_path = "{NVIDIA_CTK_BINARY}"\n'
        'runtime_type = "oci"\n'
    )
    return main_file


def run_doctor(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str], **engines: Path
) -> Tuple[int, List[str]]:
    """``nvshim doctor`` in-process, looking only at ``engines``' files (others absent)."""
    absent = tmp_path / "absent"
    args = [
        "doctor",
        "--config",
        str(config),
        "--trampoline",
        str(absent / "trampoline"),
        "--driver-root",
        str(absent / "driver"),
        "--nvidia-config",
        str(nvidia_toml(tmp_path)),
        "--hooks-dir",
        str(absent / "hooks.d"),
    ]
    for engine in ("containerd", "docker", "crio"):
        args += [f"--{engine}-config", str(engines.get(engine, absent / engine / "config"))]
    with pytest.raises(SystemExit) as exc:
        main([*args, "--verbose"])
    return int(exc.value.code or 0), capsys.readouterr().out.splitlines()


def nvidia_toml(tmp_path: Path) -> Path:
    """Where these tests' NVIDIA runtime config goes (absent unless a test writes it)."""
    return tmp_path / "nvidia-container-runtime" / "config.toml"


def fail_line(lines: List[str], check: str) -> str:
    found = [line for line in lines if line.startswith(f"FAIL  {check}: ")]
    assert len(found) == 1, "\n".join(lines)
    return found[0]


def detail_line(lines: List[str], check: str) -> str:
    """The --verbose line under ``check``'s short FAIL line (the whole story and fix)."""
    found = fail_line(lines, check)
    assert found.endswith(
        "is NVIDIA's runtime: pods asking no GPU get every GPU — fix: make "
        "runc the default (more: --verbose)"
    ), found
    return lines[lines.index(found) + 1]


@pytest.mark.parametrize("require_allocation", [False, True], ids=["ra-off", "ra-on"])
def test_containerd_with_nvidia_as_default_fails_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], require_allocation: bool
) -> None:
    """containerd's default handler "nvidia" running nvidia-container-runtime is the pitfall,
    whatever nvshim's require-allocation says; the fix makes nvshim (with require-allocation)
    the default or takes NVIDIA's runtime out of it."""
    config = nvshim_config(tmp_path, require_allocation)
    ctrd = nvidia_ctk_containerd(tmp_path)
    rc, lines = run_doctor(tmp_path, config, capsys, containerd=ctrd)
    assert rc == 1
    assert detail_line(lines, "default-runtime") == (
        '      containerd\'s default runtime "nvidia" '
        + PITFALL.format(binary=NVIDIA_CTK_BINARY, nvidia=nvidia_toml(tmp_path))
        + f". Fix: set require-allocation: true in {config}, then nvshim config compile "
        f"--config {config} and NVSHIM_CONFIG={config} nvshim runtime configure --runtime "
        f"containerd --config {ctrd} --set-as-default; or make runc the default again "
        f"(default_runtime_name in {ctrd} or its drop-ins) and select GPU runtimes by "
        "RuntimeClass" + SWITCH.format(nvidia=nvidia_toml(tmp_path))
    )


@pytest.mark.parametrize("require_allocation", [False, True], ids=["ra-off", "ra-on"])
def test_docker_with_nvidia_as_default_fails_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], require_allocation: bool
) -> None:
    """Docker's "default-runtime": "nvidia" (path nvidia-container-runtime) is the pitfall:
    a FAIL line for docker with the fix, though no nvshim runtime is registered at all."""
    config = nvshim_config(tmp_path, require_allocation)
    daemon = nvidia_ctk_docker(tmp_path)
    rc, lines = run_doctor(tmp_path, config, capsys, docker=daemon)
    assert rc == 1
    assert detail_line(lines, "docker") == (
        '      Docker\'s default runtime "nvidia" '
        + PITFALL.format(binary="nvidia-container-runtime", nvidia=nvidia_toml(tmp_path))
        + f". Fix: set require-allocation: true in {config}, then nvshim config compile "
        f"--config {config} and NVSHIM_CONFIG={config} nvshim runtime configure --runtime "
        f'docker --config {daemon} --set-as-default; or take "default-runtime" out of '
        f"{daemon} (Docker then runs runc) and pick a GPU runtime per container with "
        "docker run --runtime" + SWITCH.format(nvidia=nvidia_toml(tmp_path))
    )


@pytest.mark.parametrize("require_allocation", [False, True], ids=["ra-off", "ra-on"])
def test_crio_with_nvidia_as_default_fails_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], require_allocation: bool
) -> None:
    """CRI-O's default_runtime "nvidia" (set by a drop-in, runtime_path
    nvidia-container-runtime) is the pitfall: a FAIL line for crio with the fix."""
    config = nvshim_config(tmp_path, require_allocation)
    crio = nvidia_ctk_crio(tmp_path)
    rc, lines = run_doctor(tmp_path, config, capsys, crio=crio)
    assert rc == 1
    assert detail_line(lines, "crio") == (
        '      CRI-O\'s default runtime "nvidia" '
        + PITFALL.format(binary=NVIDIA_CTK_BINARY, nvidia=nvidia_toml(tmp_path))
        + f". Fix: set require-allocation: true in {config}, then nvshim config compile "
        f"--config {config} and NVSHIM_CONFIG={config} nvshim runtime configure --runtime "
        f"crio --config {crio} --set-as-default; or make runc the default again "
        f"(default_runtime in {crio} or a drop-in in {crio.parent / 'crio.conf.d'}) and "
        "select GPU runtimes by RuntimeClass" + SWITCH.format(nvidia=nvidia_toml(tmp_path))
    )


def test_crio_builtin_default_handler_running_nvidia_runtime_fails(tmp_path: Path) -> None:
    """No file sets default_runtime, but CRI-O's own default handler (runc) runs NVIDIA's
    runtime: the same pitfall."""
    conf = tmp_path / "crio.conf"
    conf.write_text(f'[crio.runtime.runtimes.runc]\nruntime_path = "{NVIDIA_CTK_BINARY}"\n')
    options = DoctorOptions(config_path=str(tmp_path / "none.yaml"))
    finding = doctor_engines.check_crio(str(conf), Config(require_allocation=True), options)
    assert finding.status == "fail"
    assert finding.detail.startswith("CRI-O's default runtime \"runc\" is NVIDIA's runtime")


def test_nvshim_config_env_already_naming_the_config_is_not_repeated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fix prefixes NVSHIM_CONFIG=<config> only when configure would read another file."""
    config = nvshim_config(tmp_path, True)
    monkeypatch.setenv("NVSHIM_CONFIG", str(config))
    options = DoctorOptions(config_path=str(config))
    daemon = nvidia_ctk_docker(tmp_path)
    finding = doctor_engines.check_docker(str(daemon), Config(require_allocation=True), options)
    assert finding.status == "fail"
    assert (
        f" and nvshim runtime configure --runtime docker --config {daemon} "
        "--set-as-default;" in finding.detail
    )


def _containerd(tmp_path: Path, default: str, handlers: List[Tuple[str, Optional[str]]]) -> Path:
    lines = ["version = 2", f"[{CRI}.containerd]", f'  default_runtime_name = "{default}"']
    for name, binary in handlers:
        lines += [
            f"[{CRI}.containerd.runtimes.{name}]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{CRI}.containerd.runtimes.{name}.options]",
        ]
        if binary is not None:
            lines.append(f'  BinaryName = "{binary}"')
    path = tmp_path / f"containerd-{default}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    "default, handlers, status",
    [
        # GPU operator's toolkit: its own path, the mode-forcing variants, extra handler names
        ("nvidia", [("nvidia", "/usr/local/nvidia/toolkit/nvidia-container-runtime")], "fail"),
        (
            "nvidia-cdi",
            [("nvidia-cdi", "/usr/local/nvidia/toolkit/nvidia-container-runtime.cdi")],
            "fail",
        ),
        ("nvidia-legacy", [("nvidia-legacy", "/opt/nv/wrapper")], "fail"),
        ("gpu", [("gpu", "/usr/bin/nvidia-container-runtime-experimental")], "fail"),
        ("runc", [("runc", "/usr/bin/nvidia-container-runtime.legacy")], "fail"),
        # NVIDIA's runtime registered but not the default: GPU pods choose it by RuntimeClass
        ("runc", [("runc", None), ("nvidia", NVIDIA_CTK_BINARY)], "ok"),
        # nvshim under NVIDIA's handler name (a binary doctor knows by its name only, so judged
        # by doctor's config), require-allocation on: nvshim, not the pitfall
        ("nvidia", [("nvidia", "/nonexistent/bin/nvshim-runtime")], "ok"),
    ],
    ids=[
        "operator",
        "cdi-variant",
        "legacy-name",
        "experimental",
        "runc-handler",
        "not-default",
        "nvshim-named-nvidia",
    ],
)
def test_containerd_default_recognised_by_binary_or_name(
    tmp_path: Path, default: str, handlers: List[Tuple[str, Optional[str]]], status: str
) -> None:
    """NVIDIA's runtime is recognised by its binary's basename or by NVIDIA's handler names,
    never when the handler runs nvshim-runtime; only as the default is it the pitfall."""
    ctrd = _containerd(tmp_path, default, handlers)
    options = DoctorOptions(
        config_path=str(tmp_path / "none.yaml"),
        containerd_config=str(ctrd),
        trampoline=str(tmp_path / "none"),
    )
    _, effective = doctor_engines.check_containerd_config(str(ctrd))
    assert effective is not None
    finding = doctor_engines.check_default_runtime(
        effective, Config(require_allocation=True), options
    )
    assert finding.status == status, finding
    if status == "fail":
        assert f'default runtime "{default}" is NVIDIA\'s runtime' in finding.detail


@pytest.mark.parametrize(
    "name, binary, expected",
    [
        ("nvidia", None, True),
        ("x", "/usr/bin/nvidia-container-runtime", True),
        ("x", "nvidia-container-runtime.cdi", True),
        ("x", "/usr/bin/nvidia-container-toolkit", False),
        ("runc", "/usr/bin/runc", False),
        ("nvidia", "/usr/local/bin/nvshim-runtime", False),
        ("nvshim", "/usr/bin/nvidia-container-runtime", True),
    ],
)
def test_is_nvidia_runtime(name: str, binary: Optional[str], expected: bool) -> None:
    """What counts as NVIDIA's runtime: its binary under any handler name, or NVIDIA's
    handler names unless the handler runs nvshim-runtime."""
    assert is_nvidia_runtime(name, binary, DoctorOptions()) is expected
