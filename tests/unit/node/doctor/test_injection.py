"""``nvshim doctor``'s ``cdi-injection`` finding: which of the engine (containerd's
``enable_cdi``, CRI-O) or nvshim injects CDI devices, and the warning when both would inject
the devices a ``cdi.k8s.io/`` annotation names (nvshim.node.doctor.engines)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List, Optional

import pytest
import yaml

from nvshim.cli.main import main
from nvshim.node.doctor import checks as doctor
from nvshim.node.doctor.findings import DoctorOptions, Finding
from nvshim.node.engines import containerd
from tests.helpers.commands import fake_runtime


def fake_containerd(tmp_path: Path, answer: str) -> Path:
    """A ``containerd`` whose ``--version`` prints ``answer``."""
    path = tmp_path / "bin" / "containerd"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{answer}'\n")
    path.chmod(0o755)
    return path


def nvshim_config(tmp_path: Path, **settings: Any) -> Path:
    """nvshim's config (kebab-case keys from ``_``); no settings: a file of defaults."""
    path = tmp_path / "nvshim.yaml"
    path.write_text(yaml.safe_dump({k.replace("_", "-"): v for k, v in settings.items()}))
    return path


def configured_containerd(tmp_path: Path, main_text: str, enable_cdi: bool) -> Path:
    """containerd's config with nvshim's handler as ``nvshim runtime configure`` writes it
    with containerd's CDI off (it passes ``cdi.k8s.io/*`` container annotations to nvshim);
    ``enable_cdi``: then turned on by hand in the drop-in, as an operator (or an older
    configure) would -- containerd and nvshim both handed the annotations."""
    import tomlkit

    path = tmp_path / "containerd" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(main_text)
    containerd.configure(str(path), binary=str(fake_runtime(tmp_path / "bin")))
    if enable_cdi:
        drop_in = path.parent / "conf.d" / "99-nvshim.toml"
        doc = tomlkit.parse(drop_in.read_text())
        cri = doc["plugins"]["io.containerd.grpc.v1.cri"]
        cri["enable_cdi"] = True
        cri["cdi_spec_dirs"] = ["/etc/cdi", "/var/run/cdi"]
        drop_in.write_text(tomlkit.dumps(doc))
    return path


def options(
    tmp_path: Path,
    config: Path,
    ctrd: Optional[Path] = None,
    crio: Optional[Path] = None,
    binary: Optional[Path] = None,
) -> DoctorOptions:
    """Doctor looking only at temp files; no containerd binary unless ``binary``."""
    return DoctorOptions(
        config_path=str(config),
        containerd_config=str(ctrd or tmp_path / "no-containerd.toml"),
        containerd_binary=str(binary or tmp_path / "no-containerd-binary"),
        docker_config=str(tmp_path / "no-daemon.json"),
        crio_config=str(crio or tmp_path / "no-crio" / "crio.conf"),
        driver_root=str(tmp_path),
        trampoline=str(tmp_path / "no-trampoline"),
    )


def injection(opts: DoctorOptions) -> List[Finding]:
    """The ``cdi-injection`` findings of a whole doctor run."""
    return [f for f in doctor.run_checks(opts) if f.check == "cdi-injection"]


def test_containerd_17_with_enable_cdi_and_default_config_warns_with_the_fix(
    tmp_path: Path,
) -> None:
    """containerd 1.7's enable_cdi = true, nvshim's handler passed cdi.k8s.io/* and nvshim's
    default config (require-allocation off, annotation-prefixes cdi.k8s.io/): both inject
    from the same spec dirs -- a warning whose fix names nvshim's and containerd's side."""
    config = nvshim_config(tmp_path)
    ctrd = configured_containerd(tmp_path, "version = 2\n", enable_cdi=True)
    [finding] = injection(options(tmp_path, config, ctrd))
    assert finding.status == "warn", finding
    assert finding.message == "containerd and nvshim both inject CDI annotations' devices"
    assert (
        'nvshim\'s require-allocation is off, so every annotation under "cdi.k8s.io/" is a request'
    ) in finding.detail
    assert "containerd injects the CDI devices that cdi.k8s.io/ annotations name" in finding.detail
    assert "nvshim injects them again from the same CDI spec dirs" in finding.detail
    drop_in = tmp_path / "containerd" / "conf.d" / "99-nvshim.toml"
    assert f"enable_cdi = true in {drop_in}" in finding.detail
    assert finding.fix == f'drop "cdi.k8s.io/" from annotation-prefixes in {config}'
    assert "counts the devices containerd injected as an engine grant" in finding.detail
    assert (
        f'set enable_cdi = false in plugins."io.containerd.grpc.v1.cri" of {drop_in}'
        in finding.detail
    )


def test_require_allocation_fix_drops_cdi_annotations_from_allocation_sources(
    tmp_path: Path,
) -> None:
    """Under require-allocation the fix is taking cdi-annotations out of allocation-sources;
    once out, the line is ok and says containerd injects."""
    ctrd = configured_containerd(tmp_path, "version = 2\n", enable_cdi=True)
    config = nvshim_config(tmp_path, require_allocation=True)
    [warned] = injection(options(tmp_path, config, ctrd))
    assert warned.status == "warn"
    assert f"drop cdi-annotations from allocation-sources in {config}" in warned.fix
    config = nvshim_config(
        tmp_path, require_allocation=True, allocation_sources=["volume-mounts", "envvar-uuids"]
    )
    [fine] = injection(options(tmp_path, config, ctrd))
    assert fine.status == "ok", fine
    assert fine.detail.startswith("containerd injects the CDI devices")
    assert "cdi-annotations is not in nvshim's allocation-sources" in fine.detail


def test_disjoint_spec_dirs_still_warn_naming_nvshims_own(tmp_path: Path) -> None:
    """nvshim reading other spec dirs than containerd's does not make one injection of two."""
    ctrd = configured_containerd(tmp_path, "version = 2\n", enable_cdi=True)
    config = nvshim_config(tmp_path, cdi_spec_dirs=[str(tmp_path / "cdi")])
    [finding] = injection(options(tmp_path, config, ctrd))
    assert finding.status == "warn"
    assert f"from its own cdi-spec-dirs, {tmp_path / 'cdi'}," in finding.detail


def test_enable_cdi_on_containerd_16_is_ignored(tmp_path: Path) -> None:
    """containerd before 1.7 has no CDI: enable_cdi = true there leaves nvshim injecting."""
    ctrd = configured_containerd(tmp_path, "version = 2\n", enable_cdi=True)
    binary = fake_containerd(
        tmp_path, "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3"
    )
    [finding] = injection(options(tmp_path, nvshim_config(tmp_path), ctrd, binary=binary))
    assert finding.status == "ok", finding
    assert finding.detail.startswith("nvshim injects the CDI devices")
    assert "containerd 1.6.20~ds1 has no CDI support, enable_cdi = true in" in finding.detail


def test_enable_cdi_false_says_nvshim_injects(tmp_path: Path) -> None:
    """enable_cdi = false: ok, nvshim is the one that injects."""
    ctrd = configured_containerd(
        tmp_path,
        'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\nenable_cdi = false\n',
        enable_cdi=False,
    )
    [finding] = injection(options(tmp_path, nvshim_config(tmp_path), ctrd))
    assert finding.status == "ok", finding
    assert finding.detail.startswith(
        "nvshim injects the CDI devices that cdi.k8s.io/ "
        "annotations name, from /etc/cdi, /var/run/cdi"
    )
    assert f"containerd injects none (enable_cdi = false in {ctrd.parent}" in finding.detail


@pytest.mark.parametrize("passed", [True, False], ids=["annotations-passed", "not-passed"])
def test_containerd_2_version_3_default_is_the_engine(tmp_path: Path, passed: bool) -> None:
    """A version 3 config without enable_cdi is containerd 2.x, where CDI is on: containerd
    injects; nvshim injects too only when its handler is passed the annotations."""
    binary = fake_runtime(tmp_path / "bin")
    ctrd = tmp_path / "config.toml"
    cri = 'plugins."io.containerd.cri.v1.runtime"'
    annotations = 'container_annotations = ["cdi.k8s.io/*"]\n' if passed else ""
    ctrd.write_text(
        f"version = 3\n[{cri}.containerd.runtimes.nvshim]\n{annotations}"
        f'[{cri}.containerd.runtimes.nvshim.options]\nBinaryName = "{binary}"\n'
    )
    [finding] = injection(options(tmp_path, nvshim_config(tmp_path), ctrd))
    said = finding.detail  # the line stays short
    assert said.startswith("containerd injects the CDI devices")
    assert "is a version 3 config, containerd 2.x's, where enable_cdi defaults to true" in said
    if passed:
        assert finding.status == "warn" and "annotation-prefixes" in finding.fix
        assert f"set enable_cdi = false in {cri} of {ctrd}" in finding.detail
    else:
        assert finding.status == "ok", finding
        assert "none of its container_annotations covers them" in finding.detail


@pytest.mark.parametrize(
    "answer, injects",
    [
        (
            "containerd github.com/containerd/containerd/v2 v2.0.0 207ad711eabd375a01713109a8a197d197ff6542",
            True,
        ),
        (
            "containerd github.com/containerd/containerd v1.7.13 7c3aca7a610df76212171d200ca3811ff6096eb8",
            False,
        ),
        ("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3", False),
    ],
)
def test_version_2_config_without_enable_cdi_asks_the_binary(
    tmp_path: Path, answer: str, injects: bool
) -> None:
    """A version 2 config that does not set enable_cdi: the default is containerd's own --
    on in 2.x, off in 1.7, absent in 1.6 -- so doctor asks ``containerd --version``."""
    ctrd = configured_containerd(tmp_path, "version = 2\n", enable_cdi=False)
    opts = options(
        tmp_path, nvshim_config(tmp_path), ctrd, binary=fake_containerd(tmp_path, answer)
    )
    [finding] = injection(opts)
    if injects:
        assert finding.status == "warn"
        assert "enable_cdi is unset: containerd 2.0.0 turns CDI on by default" in finding.detail
    else:
        assert finding.status == "ok", finding
        assert finding.detail.startswith("nvshim injects the CDI devices")


def test_unknown_containerd_version_warns_to_set_enable_cdi(tmp_path: Path) -> None:
    """enable_cdi unset in a version 2 config and no containerd to ask: the injection path
    changes with containerd's version, so the fix is setting enable_cdi explicitly."""
    ctrd = configured_containerd(tmp_path, "version = 2\n", enable_cdi=False)
    [finding] = injection(options(tmp_path, nvshim_config(tmp_path), ctrd))
    assert finding.status == "warn"
    assert "off by default in containerd 1.7, on in 2.x" in finding.detail
    assert finding.fix == "set enable_cdi explicitly (--verbose: where)"
    assert 'set enable_cdi in plugins."io.containerd.grpc.v1.cri" of ' in finding.detail


def test_crio_config_present_is_the_engine(tmp_path: Path) -> None:
    """CRI-O injects CDI devices always, from its cdi_spec_dirs; with nvshim as one of its
    runtimes and nvshim's default config both inject -- CRI-O has no switch, so the fix
    is nvshim's side only."""
    binary = fake_runtime(tmp_path / "bin")
    crio = tmp_path / "crio" / "crio.conf"
    crio.parent.mkdir()
    crio.write_text('[crio.runtime]\ncdi_spec_dirs = ["/var/run/cdi"]\n')
    (crio.parent / "crio.conf.d").mkdir()
    (crio.parent / "crio.conf.d" / "99-nvshim.toml").write_text(
        f'[crio.runtime.runtimes.nvshim]\nruntime_path = "{binary}"\n'
    )
    config = nvshim_config(tmp_path)
    [finding] = injection(options(tmp_path, config, crio=crio))
    assert finding.status == "warn", finding
    assert finding.detail.startswith(
        "CRI-O injects the CDI devices that cdi.k8s.io/ "
        "annotations name, from /var/run/cdi (CRI-O's CDI has "
        "no off switch)"
    )
    assert "enable_cdi" not in finding.fix
    config = nvshim_config(tmp_path, annotation_prefixes=[])
    [fine] = injection(options(tmp_path, config, crio=crio))
    assert fine.status == "ok", fine
    assert fine.detail.startswith(
        "CRI-O injects the CDI devices that cdi.k8s.io/ annotations "
        "and CRI CDIDevices (DRA claims) name, from /var/run/cdi"
    )


def test_no_engine_is_skip(tmp_path: Path) -> None:
    """Neither containerd (config or binary) nor CRI-O: one skip line."""
    [finding] = injection(options(tmp_path, nvshim_config(tmp_path)))
    assert finding.status == "skip"


def test_doctor_cli_prints_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``nvshim doctor`` prints the cdi-injection warning with its fix; the containerd it
    asks is the one on PATH."""
    ctrd = configured_containerd(tmp_path, "version = 2\n", enable_cdi=True)
    binary = fake_containerd(tmp_path, "containerd github.com/containerd/containerd v1.7.13 x")
    monkeypatch.setenv("PATH", f"{binary.parent}:{os.environ.get('PATH', '')}")
    config = nvshim_config(tmp_path)
    with pytest.raises(SystemExit):
        main(
            [
                "doctor",
                "--config",
                str(config),
                "--containerd-config",
                str(ctrd),
                "--crio-config",
                str(tmp_path / "no-crio" / "crio.conf"),
                "--trampoline",
                str(tmp_path / "no-trampoline"),
            ]
        )
    out = capsys.readouterr().out
    [line] = [x for x in out.splitlines() if "cdi-injection:" in x]
    assert (
        line.startswith("warn  cdi-injection: containerd and nvshim both inject")
        and " — fix: " in line
    )


@pytest.mark.parametrize(
    "pattern, matches",
    [
        ("cdi.k8s.io/*", True),
        ("*/*", True),
        ("cdi.k8s.io/nvidia*", True),
        ("cdi.*/*", True),
        ("*", False),
        ("cdi.*", False),
        ("nvidia.com/*", False),
        ("cdi.k8s.io", False),
    ],
)
def test_annotation_pattern_reaches_the_cdi_namespace(pattern: str, matches: bool) -> None:
    """containerd's pass-through patterns (Go path.Match: * stops at /) that reach cdi.k8s.io/."""
    from nvshim.node.doctor.injection import _may_match_namespace

    assert _may_match_namespace(pattern) is matches


def test_help_says_who_injects_cdi_devices(capsys: pytest.CaptureFixture[str]) -> None:
    """``nvshim doctor --help`` tells that doctor reports the CDI injection path."""
    with pytest.raises(SystemExit):
        main(["doctor", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "or nvshim injects CDI devices, and warns when both would" in text
