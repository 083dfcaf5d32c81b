"""Unit tests for ``nvshim doctor`` (nvshim.node.doctor.checks and its CLI) on crafted files and sim nodes."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
import yaml

from nvshim.cdi.write import write_spec
from nvshim.config import Config, compiled_path
from nvshim.host.discovery import Host
from nvshim.node.compile import compile_node
from nvshim.node.doctor import checks as doctor
from nvshim.node.doctor import config as doctor_config
from nvshim.node.doctor import engines as doctor_engines
from nvshim.node.doctor import host as doctor_host
from nvshim.node.doctor.findings import DoctorOptions, Finding
from nvshim.node.install.trampoline import render, runtimes_path
from nvshim.runtime.hookargs import hook_command
from tests.helpers.commands import fake_runtime, run_cli

PITFALL = (
    "FAIL  default-runtime: default runtime nvshim has require-allocation off: CUDA images get "
    "every GPU — fix: require-allocation: true in {config}"
)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="simulated nodes need root (mknod)")
needs_runc = pytest.mark.skipif(shutil.which("runc") is None, reason="runc is not installed")


# --------------------------------------------------------------------------- helpers


def write_config(directory: Path, compile: bool = True, **settings: Any) -> Path:
    """An nvshim config in ``directory`` (kebab-case keys from ``_``), compiled by default."""
    path = directory / "config.yaml"
    directory.mkdir(parents=True, exist_ok=True)
    doc = {k.replace("_", "-"): v for k, v in settings.items()}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    if compile:
        compile_node(str(path))
    return path


def containerd_config(
    path: Path,
    binary: Optional[Path],
    default: Optional[str] = None,
    version: int = 2,
    name: str = "nvshim",
) -> Path:
    """A containerd config of ``version`` with a runc and an nvshim handler."""
    cri = {
        1: "plugins.cri",
        2: 'plugins."io.containerd.grpc.v1.cri"',
        3: 'plugins."io.containerd.cri.v1.runtime"',
    }[version]
    lines = [] if version == 1 else [f"version = {version}", ""]
    lines.append(f"[{cri}.containerd]")
    if default is not None:
        lines.append(f'  default_runtime_name = "{default}"')
    lines += [
        f"[{cri}.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
        f"[{cri}.containerd.runtimes.{name}]",
        '  runtime_type = "io.containerd.runc.v2"',
        f"[{cri}.containerd.runtimes.{name}.options]",
    ]
    if binary is not None:
        lines.append(f'  BinaryName = "{binary}"')
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def doctor_args(config: Path, ctrd: Path, tmp_path: Path, *extra: str) -> List[str]:
    """Doctor CLI args that look only at temp files (no installed trampoline)."""
    return [
        "doctor",
        "--config",
        str(config),
        "--containerd-config",
        str(ctrd),
        "--trampoline",
        str(tmp_path / "no-trampoline"),
        "--nvidia-config",
        str(tmp_path / "no-nvidia.toml"),
        "--hooks-dir",
        str(tmp_path / "no-hooks.d"),
        *extra,
    ]


def by_check(findings: List[Finding], check: str) -> List[Finding]:
    return [f for f in findings if f.check == check]


@pytest.fixture
def sim(tmp_path: Path) -> Any:
    """A simulated node with 2 GPUs (needs root)."""
    if os.geteuid() != 0:
        pytest.skip("simulated nodes need root (mknod)")
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path / "node"), gpus=2)


# --------------------------------------------------------------------------- the pitfall


def test_pitfall_detected_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """nvshim as containerd's default runtime, require-allocation off: the pitfall line, exit 1."""
    config = write_config(
        tmp_path / "etc", require_allocation=False, cdi_spec_dirs=[str(tmp_path / "cdi")]
    )
    ctrd = containerd_config(tmp_path / "containerd.toml", fake_runtime(tmp_path / "bin"), "nvshim")
    rc, out, _ = run_cli(doctor_args(config, ctrd, tmp_path), capsys)
    assert rc == 1
    assert PITFALL.format(config=config) in out.splitlines()


@needs_root
@needs_runc
@pytest.mark.parametrize(
    "require_allocation, default",
    [(True, "nvshim"), (False, "runc"), (False, None)],
    ids=["nvshim-default-with-require-allocation", "runc-default", "containerd-default"],
)
def test_good_node_exits_0(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sim: Any,
    require_allocation: bool,
    default: Optional[str],
) -> None:
    """A node with GPUs and either require-allocation on or runc as default passes every check;
    with require-allocation off the one warning is handler-config's (any pod that names
    RuntimeClass nvshim picks its own GPUs)."""
    (tmp_path / "kubelet.sock").touch()
    verify = (
        {"verify_with": "kubelet", "kubelet_socket": str(tmp_path / "kubelet.sock")}
        if require_allocation
        else {}
    )
    config = write_config(
        tmp_path / "etc",
        require_allocation=require_allocation,
        driver_root=sim.root,
        runtimes=["runc"],
        cdi_spec_dirs=[str(tmp_path / "cdi")],
        **verify,
    )
    ctrd = containerd_config(tmp_path / "containerd.toml", fake_runtime(tmp_path / "bin"), default)
    rc, out, _ = run_cli(doctor_args(config, ctrd, tmp_path), capsys)
    assert rc == 0, out
    warned = [line for line in out.splitlines() if line.startswith("warn")]
    assert "FAIL" not in out, out
    assert [w.split(":")[0] for w in warned] == (
        [] if require_allocation else ["warn  handler-config"]
    ), out
    assert any(line.startswith("ok    default-runtime: ") for line in out.splitlines())


@pytest.mark.parametrize("version", [1, 2, 3])
def test_pitfall_in_every_config_version(tmp_path: Path, version: int) -> None:
    """The default runtime is read from the CRI table of config versions 1, 2 and 3."""
    ctrd = containerd_config(tmp_path / "c.toml", fake_runtime(tmp_path / "bin"), "nvshim", version)
    options = DoctorOptions(config_path=str(tmp_path / "none.yaml"), containerd_config=str(ctrd))
    _, effective = doctor_engines.check_containerd_config(str(ctrd))
    finding = doctor_engines.check_default_runtime(
        effective, Config(require_allocation=False), options
    )
    assert finding.status == "fail"
    assert "require-allocation is off" in finding.detail


def test_pitfall_through_drop_in_and_other_handler_name(tmp_path: Path) -> None:
    """A drop-in making a handler that runs nvshim-runtime (any name) the default: the pitfall."""
    main_file = tmp_path / "config.toml"
    main_file.write_text('version = 2\nimports = ["conf.d/*.toml"]\n')
    containerd_config(
        tmp_path / "conf.d" / "99-gpu.toml", fake_runtime(tmp_path / "bin"), "gpu", name="gpu"
    )
    options = DoctorOptions(config_path=str(tmp_path / "c.yaml"), containerd_config=str(main_file))
    _, effective = doctor_engines.check_containerd_config(str(main_file))
    bad = doctor_engines.check_default_runtime(effective, Config(require_allocation=False), options)
    good = doctor_engines.check_default_runtime(effective, Config(require_allocation=True), options)
    assert bad.status == "fail" and 'handler "gpu"' in bad.detail
    assert good.status == "ok"


# --------------------------------------------------------------------------- containerd


def test_allocation_trust_warns_about_forgeable_sources_with_the_fix(tmp_path: Path) -> None:
    """require-allocation trusting env UUIDs/mounts/annotations without the kubelet warns, naming the fix."""
    config = write_config(tmp_path / "etc", require_allocation=True)
    finding = doctor_config.check_allocation_trust(Config(require_allocation=True), str(config))
    assert finding.status == "warn"
    assert finding.message.endswith(": volume-mounts, cdi-annotations, envvar-uuids")
    assert finding.fix == f"verify-with: kubelet in {config}"
    assert f"set verify-with: kubelet in {config} (then nvshim config compile)" in finding.detail
    socket = tmp_path / "kubelet.sock"
    socket.touch()
    ok = doctor_config.check_allocation_trust(
        Config(require_allocation=True, verify_with="kubelet", kubelet_socket=str(socket)),
        str(config),
    )
    assert ok.status == "ok"
    missing = doctor_config.check_allocation_trust(
        Config(
            require_allocation=True,
            verify_with="kubelet",
            kubelet_socket=str(tmp_path / "none.sock"),
        ),
        str(config),
    )
    assert missing.status == "warn" and "none.sock does not exist" in missing.message
    narrow = doctor_config.check_allocation_trust(
        Config(require_allocation=True, allocation_sources=("kubelet", "privileged")), str(config)
    )
    assert narrow.status == "ok"
    assert doctor_config.check_allocation_trust(Config(), str(config)).status == "skip"
    findings = doctor.run_checks(
        DoctorOptions(
            config_path=str(config),
            containerd_config=str(tmp_path / "none.toml"),
            trampoline=str(tmp_path / "none"),
            driver_root=str(tmp_path),
        )
    )
    assert [f.status for f in by_check(findings, "allocation-trust")] == ["warn"]


def test_runtime_binary_missing_or_not_executable_fails(tmp_path: Path) -> None:
    """The nvshim handler's BinaryName must exist and be executable; a good one passes."""
    options = DoctorOptions()
    good = fake_runtime(tmp_path / "bin")
    plain = tmp_path / "bin" / "not-exec"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    results = {}
    for label, binary in (
        ("good", good),
        ("missing", tmp_path / "nope" / "nvshim-runtime"),
        ("plain", plain),
        ("unset", None),
    ):
        ctrd = containerd_config(tmp_path / f"{label}.toml", binary)
        _, effective = doctor_engines.check_containerd_config(str(ctrd))
        results[label] = doctor_engines.check_runtime_binary(effective, options)
    assert results["good"].status == "ok"
    assert results["missing"].status == "fail" and "does not exist" in results["missing"].message
    assert results["plain"].status == "fail" and "not executable" in results["plain"].message
    assert results["unset"].status == "fail" and "no options.BinaryName" in results["unset"].message


def test_no_containerd_config_is_skip_not_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node without a containerd config gets a skip line and no containerd failures."""
    config = write_config(tmp_path / "etc", cdi_spec_dirs=[str(tmp_path / "cdi")])
    rc, out, _ = run_cli(doctor_args(config, tmp_path / "absent.toml", tmp_path), capsys)
    lines = out.splitlines()
    assert (
        f"skip  containerd-config: no containerd config at {tmp_path / 'absent.toml'}: "
        "containerd defaults apply" in lines
    )
    checks = [line[6:].split(":")[0] for line in lines]
    assert "default-runtime" not in checks and "containerd-runtime-binary" not in checks


def test_invalid_containerd_toml_fails(tmp_path: Path) -> None:
    """A containerd config that is not TOML fails containerd-config, naming the file."""
    bad = tmp_path / "config.toml"
    bad.write_text("version = 2\n[plugins\n")
    finding, effective = doctor_engines.check_containerd_config(str(bad))
    assert finding.status == "fail" and str(bad) in finding.message
    assert effective is None


# --------------------------------------------------------------------------- nvshim config


@needs_runc
def test_runtimes_none_found_fails_and_runc_passes(tmp_path: Path) -> None:
    """runtimes: fails when no entry is executable, passes when runc is on PATH."""
    bad = doctor_config.check_runtimes(
        Config(runtimes=(str(tmp_path / "runc"), "no-such-runtime-x"))
    )
    good = doctor_config.check_runtimes(Config(runtimes=("no-such-runtime-x", "runc")))
    assert bad.status == "fail" and "no-such-runtime-x" in bad.message
    assert good.status == "ok" and shutil.which("runc") in good.message


def test_runtimes_names_the_binary_a_create_would_exec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """runtimes: doctor finds runtimes with the runtime's own lookup, so an empty PATH entry
    (the working directory, where a create runs in the bundle) is searched the same way and
    the finding names the very path nvshim-runtime would exec."""
    from nvshim.runtime.main import find_runtime

    cwd = tmp_path / "bundle"
    cwd.mkdir()
    runc = cwd / "runc-x"
    runc.write_text("#!/bin/sh\n")
    runc.chmod(0o755)
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("PATH", f"{tmp_path / 'empty'}::/nonexistent")
    expected = find_runtime(("runc-x",), os.environ["PATH"])
    assert expected == "./runc-x"
    finding = doctor_config.check_runtimes(Config(runtimes=("runc-x",)))
    assert finding.status == "ok"
    assert finding.message == f"low-level runtime runc-x found at {expected}"


def test_invalid_config_fails_with_its_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An invalid nvshim config fails the config check with load_config's one-line message."""
    config = tmp_path / "config.yaml"
    config.write_text("require-allocation: maybe\n")
    rc, out, _ = run_cli(doctor_args(config, tmp_path / "absent.toml", tmp_path), capsys)
    assert rc == 1
    line = next(x for x in out.splitlines() if x.startswith("FAIL  config: "))
    assert f'config {config}: "require-allocation" is "maybe", must be a boolean' in line
    good, loaded = doctor_config.check_config(str(write_config(tmp_path / "ok")))
    assert good.status == "ok" and loaded is not None


def test_compiled_config_missing_stale_and_current(tmp_path: Path) -> None:
    """compiled-config warns when the JSON copy is missing or older than the YAML, else passes."""
    config = write_config(tmp_path, compile=False, runtimes=["runc"])
    loaded = Config(runtimes=("runc",))
    missing = doctor_config.check_compiled_config(str(config), loaded)
    assert missing.status == "warn" and "is missing" in missing.message
    assert missing.fix == f"nvshim config compile --config {config}"

    compile_node(str(config))
    assert doctor_config.check_compiled_config(str(config), loaded).status == "ok"

    config.write_text("runtimes: [runc]\nrequire-allocation: false\n")
    edited = doctor_config.check_compiled_config(str(config), loaded)
    assert edited.status == "warn" and "changed since it was compiled" in edited.message

    compile_node(str(config))
    listing = runtimes_path(str(config))
    stamp = os.stat(listing).st_mtime_ns
    os.utime(config, ns=(stamp + 10**9, stamp + 10**9))
    older = doctor_config.check_compiled_config(str(config), loaded)
    assert older.status == "warn" and listing in older.message
    assert os.path.exists(compiled_path(str(config)))


# --------------------------------------------------------------------------- GPUs and CDI


def test_no_gpus_fails_and_sim_node_passes(tmp_path: Path, sim: Any) -> None:
    """gpus fails on an empty driver root and lists the GPUs of a simulated node."""
    empty = doctor_host.check_gpus(Host(str(tmp_path / "empty")), "/etc/nvshim/config.yaml")
    assert empty.status == "fail" and "no GPUs found under" in empty.message
    found = doctor_host.check_gpus(Host(sim.root), "/etc/nvshim/config.yaml")
    assert found.status == "ok" and found.message.startswith("2 GPU(s)")


def test_cdi_specs_are_listed_by_the_registry_rule(tmp_path: Path) -> None:
    """doctor lists spec files with nvshim.cdi.registry.spec_files, the rule a create uses:
    a spec dir that is not a directory is reported (not silently skipped), and a .json
    symlink to a directory counts as a file (not followed), so it shows up as broken."""
    from nvshim.cdi.registry import spec_files
    from nvshim.errors import CdiProblem

    not_a_dir = tmp_path / "cdi-file"
    not_a_dir.write_text("")
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (tmp_path / "elsewhere").mkdir()
    link = cdi / "link.json"
    link.symlink_to(tmp_path / "elsewhere")
    problems: List[CdiProblem] = []
    assert spec_files(str(cdi), problems) == [str(link)] and problems == []
    found = doctor_host.check_cdi_specs(
        Host(str(tmp_path / "no-driver")), [str(not_a_dir), str(cdi)]
    )
    dir_finding = next(f for f in found if str(not_a_dir) in f.message)
    assert dir_finding.status == "warn"
    assert dir_finding.message == (
        f"cannot read CDI spec dir: {not_a_dir}: $: spec directory is not a directory"
    )
    link_finding = next(f for f in found if str(link) in f.message)
    assert link_finding.status == "warn" and "broken CDI spec" in link_finding.message


@needs_root
def test_cdi_spec_stale_for_driver_fails_current_passes_broken_warns(tmp_path: Path) -> None:
    """A spec of another driver version fails naming the file; a current one passes; junk warns."""
    from nvshim.sim.build import create_node

    old = create_node(str(tmp_path / "old"), gpus=2, driver_version="535.104.05")
    new = create_node(str(tmp_path / "new"), gpus=2)
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    stale = cdi / "nvidia-old.yaml"
    write_spec(str(stale), _spec(Host(old.root)))
    broken = cdi / "broken.json"
    broken.write_text('{"cdiVersion": "0.5.0"}')
    findings = doctor_host.check_cdi_specs(Host(new.root), [str(cdi)])
    broken_finding = next(f for f in findings if str(broken) in f.message)
    assert broken_finding.status == "warn" and "broken CDI spec" in broken_finding.message
    stale_finding = next(f for f in findings if str(stale) in f.message)
    assert stale_finding.status == "fail"
    assert "driver is 550.54.15" in stale_finding.message
    assert stale_finding.fix == (
        f"regenerate it with nvshim cdi generate --driver-root {new.root} --output {stale}"
    )

    stale.unlink()
    broken.unlink()
    write_spec(str(cdi / "nvidia.yaml"), _spec(Host(new.root), ("uuid",)))
    current = doctor_host.check_cdi_specs(Host(new.root), [str(cdi)])
    assert [f.status for f in current] == ["ok"], current


def _spec(host: Host, strategies: Tuple[str, ...] = ("index", "uuid")) -> Dict[str, Any]:
    from nvshim.node.cdigen import generate_spec

    return generate_spec(host, strategies=strategies, hook_command=hook_command())


# --------------------------------------------------------------------------- trampoline


def test_trampoline_current_edited_missing(tmp_path: Path) -> None:
    """trampoline: ok when current, warn when edited, fail when its interpreter is gone."""
    path = tmp_path / "nvshim-runtime"
    assert doctor_config.check_trampoline(str(path)).status == "skip"
    path.write_text(render(sys.executable))
    path.chmod(0o755)
    assert doctor_config.check_trampoline(str(path)).status == "ok"
    path.write_text(render(sys.executable) + "# local change\n")
    edited = doctor_config.check_trampoline(str(path))
    assert edited.status == "warn" and edited.fix == "re-run nvshim's install.sh"
    path.write_text(render(str(tmp_path / "gone" / "python3")))
    lost = doctor_config.check_trampoline(str(path))
    assert lost.status == "fail" and "gone/python3" in lost.message


# --------------------------------------------------------------------------- output


def test_json_format_parses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--format json prints a list of {check, status, message, fix} objects, pitfall included."""
    config = write_config(tmp_path / "etc", cdi_spec_dirs=[str(tmp_path / "cdi")])
    ctrd = containerd_config(tmp_path / "containerd.toml", fake_runtime(tmp_path / "bin"), "nvshim")
    rc, out, _ = run_cli(doctor_args(config, ctrd, tmp_path, "--format", "json"), capsys)
    findings = json.loads(out)
    assert rc == 1
    assert all(set(f) - {"detail"} == {"check", "status", "message", "fix"} for f in findings)
    assert {"check": "default-runtime", "status": "fail"}.items() <= next(
        f for f in findings if f["check"] == "default-runtime"
    ).items()


def test_text_format_and_exit_code() -> None:
    """Text is `<status>  <check>: <message>`, the fix only on warn/FAIL; warnings exit 0."""
    findings = [
        Finding("a", "ok", "fine", "unused"),
        Finding("b", "warn", "meh", "do x"),
        Finding("c", "skip", "n/a"),
    ]
    assert doctor.render_text(findings).splitlines() == [
        "ok    a: fine",
        "warn  b: meh — fix: do x",
        "skip  c: n/a",
    ]
    assert doctor.exit_code(findings) == 0
    assert doctor.exit_code(findings + [Finding("d", "fail", "bad", "fix")]) == 1


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    """`nvshim doctor --help` exits 0 and documents its options."""
    rc, out, _ = run_cli(["doctor", "--help"], capsys)
    assert rc == 0
    for option in ("--format", "--containerd-config", "--config", "--driver-root", "--trampoline"):
        assert option in out


# --------------------------------------------------------------------------- wrong paths, wording


def test_a_missing_config_named_by_option_fails_like_config_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`doctor --config <missing>` fails the config check naming the path, as `config show
    --config <missing>` does; without --config a missing file still means built-in defaults."""
    missing = tmp_path / "etc" / "nvshim.yaml"
    rc, out, _ = run_cli(doctor_args(missing, tmp_path / "absent.toml", tmp_path), capsys)
    assert rc == 1
    assert (
        f"FAIL  config: config {missing} does not exist — fix: create {missing}, or name an "
        "existing config with --config" in out.splitlines()
    )
    assert f"skip  compiled-config: {missing} did not load: nothing to compare" in out.splitlines()
    rc, _, err = run_cli(["config", "show", "--config", str(missing)], capsys)
    assert rc == 1 and str(missing) in err
    implicit = doctor.run_checks(
        DoctorOptions(
            config_path=str(missing),
            containerd_config=str(tmp_path / "absent.toml"),
            trampoline=str(tmp_path / "none"),
            driver_root=str(tmp_path),
        )
    )
    assert by_check(implicit, "config")[0] == Finding(
        "config", "ok", f"no {missing}: built-in defaults"
    )


def test_no_fix_reads_fix_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Over broken configs of every kind (nvshim's, containerd's TOML and a missing import,
    daemon.json, crio.conf) every problem line has a fix and none reads "fix: fix"."""
    bad_config = tmp_path / "config.yaml"
    bad_config.write_text("require-allocation: maybe\n")
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("version = 2\n[plugins\n")
    lost_import = tmp_path / "imports.toml"
    lost_import.write_text(f'version = 2\nimports = ["{tmp_path}/gone.toml"]\n')
    bad_json = tmp_path / "daemon.json"
    bad_json.write_text("{")
    (tmp_path / "crio").mkdir()
    bad_crio = tmp_path / "crio" / "crio.conf"
    bad_crio.write_text("[crio\n")
    seen = set()
    for ctrd in (bad_toml, lost_import):
        _, out, _ = run_cli(
            doctor_args(
                bad_config,
                ctrd,
                tmp_path,
                "--docker-config",
                str(bad_json),
                "--crio-config",
                str(bad_crio),
            ),
            capsys,
        )
        for line in out.splitlines():
            assert "fix: fix" not in line, line
            if line.startswith(("FAIL", "warn")):
                assert " — fix: " in line, line
                seen.add(line[:6] + line[6:].split(":")[0])
    assert {
        "FAIL  config",
        "FAIL  containerd-config",
        "warn  containerd-config",
        "FAIL  docker",
        "FAIL  crio",
    } <= seen, seen


@needs_root
def test_gpus_line_lists_mig_devices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A node whose GPU 0 is MIG-enabled: the gpus line counts its MIG devices, --verbose names them."""
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=2, mig=True)
    config = write_config(
        tmp_path / "etc",
        compile=False,
        driver_root=node.root,
        nvml_facts=node.nvml_facts,
        cdi_spec_dirs=[str(tmp_path / "cdi")],
    )
    _, out, _ = run_cli(
        doctor_args(config, tmp_path / "absent.toml", tmp_path, "--verbose"), capsys
    )
    lines = out.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("ok    gpus: "))
    assert lines[at] == (
        f"ok    gpus: 2 GPU(s) via procfs under {node.root}, driver 550.54.15, 2 MIG device(s)"
    )
    assert lines[at + 1] == (
        "      0=/dev/nvidia0, 1=/dev/nvidia1; 2 MIG devices on GPU 0 (0:0 3g.40gb, 0:1 3g.40gb)"
    )


def test_help_shows_file_and_dir_metavars(capsys: pytest.CaptureFixture[str]) -> None:
    """Options taking a file show FILE, those taking a directory DIR."""
    rc, out, _ = run_cli(["doctor", "--help"], capsys)
    assert rc == 0
    words = out.split()
    for option, metavar in (
        ("--config", "FILE"),
        ("--containerd-config", "FILE"),
        ("--docker-config", "FILE"),
        ("--crio-config", "FILE"),
        ("--trampoline", "FILE"),
        ("--driver-root", "DIR"),
        ("--dev-root", "DIR"),
    ):
        assert words[words.index(option) + 1] == metavar, option


def test_text_format_escapes_control_characters_of_a_finding() -> None:
    """A finding quoting a file's text (ESC, \\r, a bidi override, U+2028) is one line with
    them escaped; its own line breaks read as spaces."""
    findings = [Finding("a", "warn", "wrapper line \x1b[2K\rok\u202e\u2028", "fix\nit")]
    assert doctor.render_text(findings).split("\n") == [
        "warn  a: wrapper line \\x1b[2K\\rok\\u202e\\u2028 — fix: fix it"
    ]
