"""``nvshim doctor`` judges the config each engine's runtime will read, not the one it is
given: handlers are followed through wrapper scripts (their ``NVSHIM_CONFIG`` and ``exec``
lines), nvshim's trampoline (the config it embeds) and CRI-O's ``monitor_env``; NVIDIA's
runtime behind a wrapper, NVIDIA's OCI hook in hooks.d and nvshim's ``runtimes:`` chaining
into NVIDIA's runtime are recognised; NVIDIA's own
``accept-nvidia-visible-devices-envvar-when-unprivileged = false`` is honoured; and every
``nvshim runtime configure`` a fix prints keeps the flags the runtime was registered with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
import yaml
from click.testing import CliRunner

from nvshim.cli.cmd_runtime import runtime
from nvshim.config import Config
from nvshim.errors import UsageError
from nvshim.node.doctor import engines as doctor_engines
from nvshim.node.doctor.findings import DoctorOptions
from nvshim.node.engines import containerd
from nvshim.node.install.trampoline import render
from tests.helpers.commands import run_cli

CRI = 'plugins."io.containerd.grpc.v1.cri"'
NVIDIA = "/usr/bin/nvidia-container-runtime"
NVIDIA_HOOK = "/usr/bin/nvidia-container-toolkit"
SWITCH = "accept-nvidia-visible-devices-envvar-when-unprivileged"


@pytest.fixture(autouse=True)
def _no_nvshim_config_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """What configure and doctor read must not depend on the caller's NVSHIM_CONFIG."""
    monkeypatch.delenv("NVSHIM_CONFIG", raising=False)


def nvshim_config(path: Path, require_allocation: bool, **extra: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump(
            {
                "require-allocation": require_allocation,
                "cdi-spec-dirs": [str(path.parent / "cdi")],
                **extra,
            }
        )
    )
    return path


def script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def trampoline(path: Path, config: Path) -> Path:
    """nvshim's installed trampoline as install.sh renders it, embedding ``config``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render("/usr/bin/python3", ["/nonexistent"], str(config)))
    path.chmod(0o755)
    return path


def containerd_toml(path: Path, default: str, handlers: Dict[str, Optional[str]]) -> Path:
    lines = ["version = 2", f"[{CRI}.containerd]", f'  default_runtime_name = "{default}"']
    for name, binary in handlers.items():
        lines += [
            f"[{CRI}.containerd.runtimes.{name}]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{CRI}.containerd.runtimes.{name}.options]",
        ]
        if binary is not None:
            lines.append(f'  BinaryName = "{binary}"')
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def doctor(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    *extra: str,
    config: Optional[Path] = None,
    **engines: Path,
) -> Tuple[int, List[str]]:
    """``nvshim doctor`` looking only at temp files."""
    absent = tmp_path / "absent"
    args = [
        "doctor",
        "--trampoline",
        str(absent / "trampoline"),
        "--driver-root",
        str(absent / "driver"),
        "--nvidia-config",
        str(tmp_path / "nvidia" / "config.toml"),
        "--hooks-dir",
        str(tmp_path / "usr-hooks.d"),
        "--hooks-dir",
        str(tmp_path / "etc-hooks.d"),
    ]
    if config is not None:
        args += ["--config", str(config)]
    for engine in ("containerd", "docker", "crio"):
        args += [f"--{engine}-config", str(engines.get(engine, absent / engine / "config"))]
    rc, out, _ = run_cli([*args, *extra], capsys)
    return rc, out.splitlines()


def line(lines: List[str], check: str) -> str:
    found = [entry for entry in lines if entry.split(":")[0].split()[-1] == check]
    assert len(found) == 1, "\n".join(lines)
    return found[0]


# --------------------------------------------------------------------------- following


def test_follow_reads_the_readme_wrapper_and_the_trampoline(tmp_path: Path) -> None:
    """docs/engines.md's podman wrapper (export NVSHIM_CONFIG, exec nvshim-runtime) leads to the
    trampoline and the wrapper's config; the trampoline alone reads the config it embeds."""
    from nvshim.node.doctor.follow import follow

    embedded = tmp_path / "etc" / "config.yaml"
    tramp = trampoline(tmp_path / "bin" / "nvshim-runtime", embedded)
    wrapper = script(
        tmp_path / "bin" / "nvshim-runtime-sim",
        f'export NVSHIM_CONFIG=/srv/sim/nvshim.yaml\nexec {tramp} "$@"\n',
    )
    via = follow(str(wrapper))
    assert (via.kind, via.chain, via.config, via.named) == (
        "nvshim",
        (str(wrapper), str(tramp)),
        "/srv/sim/nvshim.yaml",
        True,
    )
    direct = follow(str(tramp))
    assert (direct.kind, direct.config) == ("nvshim", str(embedded))


@pytest.mark.parametrize(
    "body, kind",
    [
        (f'exec {NVIDIA} "$@"\n', "nvidia"),
        (
            f'NVIDIA_CTK_CONFIG_FILE_PATH=/x.toml\nexport NVIDIA_CTK_CONFIG_FILE_PATH\nexec {NVIDIA}.cdi "$@"\n',
            "nvidia",
        ),
        (f'exec env FOO=1 {NVIDIA} "$@"\n', "nvidia"),
        ('exec /usr/sbin/runc "$@"\n', "plain"),
        ('/usr/sbin/runc "$@"\nstatus=$?\n', "unknown"),
        ('/usr/sbin/runc "$@"\n', "plain"),
    ],
    ids=["exec", "export-later", "exec-env", "runc", "no-exec", "last-command"],
)
def test_follow_a_wrapper(tmp_path: Path, body: str, kind: str) -> None:
    """A wrapper script is followed through its exec line or its last command (env
    assignments included); a command with more lines after it is unknown, never guessed."""
    from nvshim.node.doctor.follow import follow

    assert follow(str(script(tmp_path / "gpu-runtime", body))).kind == kind


# --------------------------------------------------------------------------- NVIDIA's runtime


def test_wrapper_around_nvidia_runtime_as_default_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """containerd's default handler "gpu" runs a wrapper script around NVIDIA's runtime: the
    pitfall, named with the chain (main said ok: the binary's name is not NVIDIA's)."""
    wrapper = script(tmp_path / "bin" / "gpu-runtime", f'exec {NVIDIA} "$@"\n')
    ctrd = containerd_toml(tmp_path / "containerd.toml", "gpu", {"gpu": str(wrapper)})
    rc, lines = doctor(
        tmp_path,
        capsys,
        "--verbose",
        config=nvshim_config(tmp_path / "n.yaml", True),
        containerd=ctrd,
    )
    assert rc == 1
    found = line(lines, "default-runtime")
    assert found.startswith(
        "FAIL  default-runtime: containerd's default \"gpu\" is NVIDIA's runtime: "
    )
    assert lines[lines.index(found) + 1].startswith(
        f"      containerd's default runtime \"gpu\" is NVIDIA's runtime ({wrapper} → {NVIDIA}): "
    )


@pytest.mark.parametrize("via_env", [False, True], ids=["default-path", "ctk-env"])
def test_nvidia_runtime_with_its_env_switch_off_is_ok(tmp_path: Path, via_env: bool) -> None:
    """NVIDIA's runtime as the default is no pitfall when the config it reads (the default
    path, or NVIDIA_CTK_CONFIG_FILE_PATH set by its wrapper) sets
    accept-nvidia-visible-devices-envvar-when-unprivileged = false (main: FAIL)."""
    toml = tmp_path / ("ctk.toml" if via_env else "config.toml")
    toml.write_text(f"{SWITCH} = false\n")
    binary = NVIDIA
    if via_env:
        binary = str(
            script(
                tmp_path / "nv", f'export NVIDIA_CTK_CONFIG_FILE_PATH={toml}\nexec {NVIDIA} "$@"\n'
            )
        )
    ctrd = containerd_toml(tmp_path / "c.toml", "nvidia", {"nvidia": binary})
    options = DoctorOptions(
        config_path=str(tmp_path / "none.yaml"),
        containerd_config=str(ctrd),
        trampoline=str(tmp_path / "none"),
        nvidia_config=str(tmp_path / ("absent.toml" if via_env else "config.toml")),
    )
    _, effective = doctor_engines.check_containerd_config(str(ctrd))
    assert effective is not None
    finding = doctor_engines.check_default_runtime(effective, Config(), options)
    assert finding.status == "ok", finding
    assert f"{toml} turns its env grants off" in finding.message
    assert f"{toml} sets {SWITCH} = false" in finding.detail
    toml.write_text(f"{SWITCH} = true\n")
    assert doctor_engines.check_default_runtime(effective, Config(), options).status == "fail"


# --------------------------------------------------------------------------- hooks.d


def hook_file(directory: Path, name: str, when: Dict[str, object], path: str = NVIDIA_HOOK) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / name
    target.write_text(
        json.dumps(
            {
                "version": "1.0.0",
                "hook": {"path": path, "args": ["nvidia-container-toolkit", "prestart"]},
                "when": when,
                "stages": ["prestart"],
            }
        )
    )
    return target


def test_nvidia_oci_hook_always_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """NVIDIA's OCI-hook mode ("always": true in hooks.d) gives every podman/CRI-O container
    NVIDIA's hook: FAIL naming the file, with the fix masking it from the later directory."""
    hooks = hook_file(
        tmp_path / "usr-hooks.d", "oci-nvidia-hook.json", {"always": True, "commands": [".*"]}
    )
    rc, lines = doctor(
        tmp_path, capsys, "--verbose", config=nvshim_config(tmp_path / "n.yaml", True)
    )
    assert rc == 1
    found = line(lines, "oci-hooks")
    assert found == (
        "FAIL  oci-hooks: NVIDIA's hook in oci-nvidia-hook.json: containers asking "
        "no GPU get every GPU — fix: mask it (--verbose: how)"
    )
    detail = lines[lines.index(found) + 1]
    assert detail.startswith(
        f"      {hooks} adds NVIDIA's hook {NVIDIA_HOOK} to every container podman and CRI-O start"
    )
    assert f"mask it with a file of the same name in {tmp_path / 'etc-hooks.d'}" in detail


def test_oci_hooks_masked_limited_or_switched_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A same-named file in the later directory masks NVIDIA's; a hook limited by an
    annotation warns; NVIDIA's env switch off makes it ok."""
    hook_file(tmp_path / "usr-hooks.d", "oci-nvidia-hook.json", {"always": True})
    hook_file(tmp_path / "etc-hooks.d", "oci-nvidia-hook.json", {"always": False}, "/bin/true")
    config = nvshim_config(tmp_path / "n.yaml", True)
    assert line(doctor(tmp_path, capsys, config=config)[1], "oci-hooks").startswith("ok    ")
    hook_file(tmp_path / "etc-hooks.d", "gpu.json", {"always": True, "annotations": {"gpu": "yes"}})
    assert line(doctor(tmp_path, capsys, config=config)[1], "oci-hooks").startswith("warn  ")
    (tmp_path / "nvidia").mkdir()
    (tmp_path / "nvidia" / "config.toml").write_text(f"{SWITCH} = false\n")
    assert line(doctor(tmp_path, capsys, config=config)[1], "oci-hooks").startswith("ok    ")


# --------------------------------------------------------------------------- nvshim's config


def test_runtimes_chaining_into_nvidia_runtime_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """nvshim's runtimes: naming NVIDIA's runtime (here behind a wrapper) hands every
    container on to it, which grants again what nvshim refused: runtimes FAILs."""
    wrapper = script(tmp_path / "bin" / "low", f'exec {NVIDIA} "$@"\n')
    config = nvshim_config(tmp_path / "n.yaml", True, runtimes=[str(wrapper), "runc"])
    rc, lines = doctor(tmp_path, capsys, "--verbose", config=config)
    assert rc == 1
    found = line(lines, "runtimes")
    assert found == (
        f"FAIL  runtimes: runtimes in {config} hand every container on to another "
        f"GPU runtime — fix: list runc or crun under runtimes: in {config}"
    )
    assert lines[lines.index(found) + 1].startswith(
        f"      runtimes in {config} hand every container on to another GPU runtime: "
        f"{wrapper} → {NVIDIA} is NVIDIA's runtime"
    )


def test_runtime_class_with_require_allocation_off_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A containerd handler running nvshim, not the default, with require-allocation off in
    the config it reads: any pod naming the RuntimeClass picks its GPUs (main: ok)."""
    config = nvshim_config(tmp_path / "etc" / "config.yaml", False)
    tramp = trampoline(tmp_path / "bin" / "nvshim-runtime", config)
    ctrd = containerd_toml(tmp_path / "c.toml", "runc", {"runc": None, "nvshim": str(tramp)})
    _, lines = doctor(tmp_path, capsys, "--verbose", config=config, containerd=ctrd)
    assert line(lines, "default-runtime").startswith("ok    ")
    assert line(lines, "handler-config") == (
        "warn  handler-config: require-allocation is off: the default, as nvshim is not the "
        f"default runtime — fix: require-allocation: true in {config}"
    )
    detail = lines[lines.index(line(lines, "handler-config")) + 1]
    assert detail == (
        f'      containerd handler "nvshim" runs {tramp}, which reads {config}: '
        'require-allocation is off, so any pod that names containerd handler "nvshim" by '
        "RuntimeClass gets the GPUs its own env or image names (NVIDIA_VISIBLE_DEVICES=all: "
        "every GPU), allocated or not; pods that name no such RuntimeClass never reach nvshim. "
        f"Where pods must not pick their GPUs: set require-allocation: true in {config}, "
        f"then nvshim config compile --config {config}"
    )


def test_default_handler_judged_by_the_config_its_trampoline_embeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """nvshim as containerd's default: require-allocation is read from the config its
    trampoline embeds (off), not doctor's --config (on): FAIL naming that file (main: ok)."""
    embedded = nvshim_config(tmp_path / "etc" / "config.yaml", False)
    tramp = trampoline(tmp_path / "bin" / "nvshim-runtime", embedded)
    ctrd = containerd_toml(tmp_path / "c.toml", "nvshim", {"nvshim": str(tramp)})
    rc, lines = doctor(
        tmp_path,
        capsys,
        "--verbose",
        config=nvshim_config(tmp_path / "given.yaml", True),
        containerd=ctrd,
    )
    assert rc == 1
    found = line(lines, "default-runtime")
    assert found.endswith(f"— fix: require-allocation: true in {embedded}"), found
    assert lines[lines.index(found) + 1].startswith(
        "      containerd's default runtime is nvshim but require-allocation is "
        f"off in {embedded} (the config {tramp} reads): "
    )


def test_crio_monitor_env_names_the_config(tmp_path: Path) -> None:
    """CRI-O's monitor_env reaches the runtime: its NVSHIM_CONFIG is the config judged."""
    good = nvshim_config(tmp_path / "good.yaml", True)
    tramp = trampoline(tmp_path / "bin" / "nvshim-runtime", tmp_path / "missing.yaml")
    conf = tmp_path / "crio" / "crio.conf"
    conf.parent.mkdir()
    conf.write_text(
        f'[crio.runtime]\ndefault_runtime = "nvshim"\n[crio.runtime.runtimes.nvshim]\n'
        f'runtime_path = "{tramp}"\nmonitor_env = ["NVSHIM_CONFIG={good}"]\n'
    )
    options = DoctorOptions(config_path=str(tmp_path / "off.yaml"), trampoline=str(tramp))
    finding = doctor_engines.check_crio(str(conf), Config(require_allocation=False), options)
    assert finding.status == "ok", finding


def test_readme_podman_wrapper_no_false_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The installed nvshim CLI names /etc/nvshim/config.yaml (NVSHIM_CONFIG); on a node whose
    runtimes all use docs/engines.md's wrapper and its config, that file's absence fails no
    create, and the wrapper's config (require-allocation on) is what Docker's default is
    judged by: no FAIL (main failed both config and docker)."""
    monkeypatch.setenv("NVSHIM_CONFIG", str(tmp_path / "etc" / "config.yaml"))
    srv = nvshim_config(tmp_path / "srv" / "nvshim.yaml", True)
    tramp = trampoline(tmp_path / "bin" / "nvshim-runtime", tmp_path / "etc" / "config.yaml")
    wrapper = script(
        tmp_path / "bin" / "nvshim-runtime-sim", f'export NVSHIM_CONFIG={srv}\nexec {tramp} "$@"\n'
    )
    daemon = tmp_path / "daemon.json"
    daemon.write_text(
        json.dumps({"default-runtime": "nvshim", "runtimes": {"nvshim": {"path": str(wrapper)}}})
    )
    _, lines = doctor(tmp_path, capsys, "--runtime-binary", str(wrapper), docker=daemon)
    failed = [entry.split(":")[0] for entry in lines if entry.startswith("FAIL")]
    assert failed == ["FAIL  gpus"], "\n".join(lines)  # no driver root here
    assert line(lines, "config").startswith("skip  config: ")
    assert line(lines, "docker").startswith("ok    docker: ")
    assert line(lines, "handler-config") == (
        f'ok    handler-config: Docker runtime "nvshim" runs {wrapper} → {tramp}; runtime '
        f"{wrapper} runs {wrapper} → {tramp}, which reads {srv}: require-allocation on"
    )


def test_named_config_a_runtime_reads_missing_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A runtime whose wrapper names a config that does not exist fails every create:
    handler-config FAILs naming the file."""
    wrapper = script(
        tmp_path / "w",
        "export NVSHIM_CONFIG=/nonexistent/nvshim.yaml\n"
        'exec /nonexistent/bin/nvshim-runtime "$@"\n',
    )
    rc, lines = doctor(
        tmp_path,
        capsys,
        "--runtime-binary",
        str(wrapper),
        "--verbose",
        config=nvshim_config(tmp_path / "n.yaml", True),
    )
    assert rc == 1
    found = line(lines, "handler-config")
    assert found == (
        "FAIL  handler-config: nvshim reads /nonexistent/nvshim.yaml, which does not "
        "exist: every create fails — fix: create /nonexistent/nvshim.yaml"
    )
    assert lines[lines.index(found) + 1].startswith(
        f"      runtime {wrapper} runs {wrapper} → /nonexistent/bin/nvshim-runtime"
        ", which reads /nonexistent/nvshim.yaml: it does not exist, so every create fails"
    )


# --------------------------------------------------------------------------- fixes keep flags


def test_docker_binary_fix_keeps_name_and_default(tmp_path: Path) -> None:
    """Docker's runtime "gpu" (the default) points at a missing nvshim-runtime: the fix
    re-runs configure with --name gpu and --set-as-default (main dropped both)."""
    daemon = tmp_path / "daemon.json"
    daemon.write_text(
        json.dumps(
            {"default-runtime": "gpu", "runtimes": {"gpu": {"path": "/opt/x/nvshim-runtime"}}}
        )
    )
    options = DoctorOptions(config_path=str(tmp_path / "none.yaml"), trampoline=str(tmp_path / "t"))
    finding = doctor_engines.check_docker(str(daemon), Config(require_allocation=True), options)
    assert finding.status == "fail"
    assert finding.fix.endswith(
        f"nvshim runtime configure --runtime docker --config {daemon} --name gpu --set-as-default"
    )


def test_containerd_binary_fix_keeps_the_drop_ins_flags(tmp_path: Path) -> None:
    """nvshim's drop-in written with --name gpu --binary <gone> --set-as-default: the
    containerd-runtime-binary fix re-runs configure with --name gpu and --set-as-default and
    the installed binary (main printed only --binary)."""
    config = tmp_path / "config.toml"
    drop_in = tmp_path / "conf.d" / "50-gpu.toml"
    containerd.configure(
        str(config),
        drop_in=str(drop_in),
        name="gpu",
        binary="/gone/nvshim-runtime",
        set_as_default=True,
        force=True,
    )
    options = DoctorOptions(
        config_path=str(tmp_path / "none.yaml"),
        containerd_config=str(config),
        trampoline=str(tmp_path / "t"),
    )
    _, effective = doctor_engines.check_containerd_config(str(config))
    assert effective is not None
    finding = doctor_engines.check_runtime_binary(effective, options)
    assert finding.status == "fail"
    assert finding.detail.endswith(
        f"install nvshim (./install.sh), or re-run nvshim runtime configure --runtime containerd "
        f"--config {config} --drop-in {drop_in} --name gpu --set-as-default"
    )


# --------------------------------------------------------------------------- the guard


def test_set_as_default_guard_reads_the_config_the_binary_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--set-as-default with --binary an installed trampoline: the guard reads the config
    the trampoline embeds (require-allocation off), not $NVSHIM_CONFIG (on), and names it."""
    embedded = nvshim_config(tmp_path / "etc" / "config.yaml", False)
    monkeypatch.setenv("NVSHIM_CONFIG", str(nvshim_config(tmp_path / "other.yaml", True)))
    tramp = trampoline(tmp_path / "bin" / "nvshim-runtime", embedded)
    result = CliRunner().invoke(
        runtime,
        [
            "configure",
            "--config",
            str(tmp_path / "c.toml"),
            "--drop-in",
            "",
            "--binary",
            str(tramp),
            "--set-as-default",
        ],
        standalone_mode=False,
    )
    assert isinstance(result.exception, UsageError)
    assert f"require-allocation is off in {embedded}, the config {tramp} reads:" in str(
        result.exception
    )
    assert not (tmp_path / "c.toml").exists()
