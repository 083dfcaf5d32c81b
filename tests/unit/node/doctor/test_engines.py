"""``nvshim doctor`` on Docker's daemon.json and CRI-O's config (nvshim.node.doctor.engines)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import pytest

from nvshim.config import Config
from nvshim.node.doctor import checks as doctor
from nvshim.node.doctor.engines import check_crio, check_docker
from nvshim.node.doctor.findings import DoctorOptions
from tests.helpers.commands import fake_runtime


def options(tmp_path: Path) -> DoctorOptions:
    return DoctorOptions(
        config_path=str(tmp_path / "nvshim.yaml"), trampoline=str(tmp_path / "no-trampoline")
    )


def daemon_json(tmp_path: Path, runtimes: dict, default: str = "") -> Path:
    path = tmp_path / "daemon.json"
    data: dict = {"runtimes": runtimes}
    if default:
        data["default-runtime"] = default
    path.write_text(json.dumps(data))
    return path


def test_docker_missing_config_is_skip(tmp_path: Path) -> None:
    assert check_docker(str(tmp_path / "none.json"), Config(), options(tmp_path)).status == "skip"


def test_docker_ok_warn_fail(tmp_path: Path) -> None:
    """A registered executable runtime is ok; none is warn; a missing binary is fail."""
    binary = fake_runtime(tmp_path / "bin")
    good = check_docker(
        str(daemon_json(tmp_path, {"nvshim": {"path": str(binary)}})), Config(), options(tmp_path)
    )
    assert good.status == "ok" and str(binary) in good.message
    none = check_docker(
        str(daemon_json(tmp_path, {"kata": {"path": "/x"}})), Config(), options(tmp_path)
    )
    assert none.status == "warn" and "--runtime docker" in none.fix
    missing = check_docker(
        str(daemon_json(tmp_path, {"nvshim": {"path": "/no/such"}})), Config(), options(tmp_path)
    )
    assert missing.status == "fail" and "/no/such does not exist" in missing.message


@pytest.mark.parametrize("require_allocation, status", [(False, "fail"), (True, "ok")])
def test_docker_default_runtime_pitfall(
    tmp_path: Path, require_allocation: bool, status: str
) -> None:
    """nvshim as Docker's default runtime fails unless require-allocation is on."""
    binary = fake_runtime(tmp_path / "bin")
    path = daemon_json(tmp_path, {"gpu": {"path": str(binary)}}, default="gpu")
    finding = check_docker(
        str(path), Config(require_allocation=require_allocation), options(tmp_path)
    )
    assert finding.status == status, finding
    if status == "fail":
        assert "NVIDIA_VISIBLE_DEVICES=all" in finding.detail


def test_docker_invalid_json_fails(tmp_path: Path) -> None:
    path = tmp_path / "daemon.json"
    path.write_text("{")
    finding = check_docker(str(path), Config(), options(tmp_path))
    assert finding.status == "fail" and str(path) in finding.message


def test_crio_pitfall_through_drop_in(tmp_path: Path) -> None:
    """CRI-O: a drop-in making nvshim the default, require-allocation off → fail; on → ok."""
    binary = fake_runtime(tmp_path / "bin")
    conf = tmp_path / "crio.conf"
    conf.write_text('[crio.runtime]\ndefault_runtime = "runc"\n')
    (tmp_path / "crio.conf.d").mkdir()
    (tmp_path / "crio.conf.d" / "99-nvshim.toml").write_text(
        f'[crio.runtime]\ndefault_runtime = "nvshim"\n'
        f'[crio.runtime.runtimes.nvshim]\nruntime_path = "{binary}"\n'
    )
    assert check_crio(str(conf), Config(), options(tmp_path)).status == "fail"
    assert check_crio(str(conf), Config(require_allocation=True), options(tmp_path)).status == "ok"


@pytest.mark.parametrize("handler", ["runc", "crun"])
def test_crio_pitfall_through_the_builtin_default(tmp_path: Path, handler: str) -> None:
    """No file sets default_runtime, so CRI-O runs its own default (runc, or crun in newer
    releases); a handler of that name running nvshim-runtime is nvshim as the default. The
    check said ok ("default the engine default") and missed the pitfall."""
    binary = fake_runtime(tmp_path / "bin")
    conf = tmp_path / "crio.conf"
    conf.write_text(f'[crio.runtime.runtimes.{handler}]\nruntime_path = "{binary}"\n')
    finding = check_crio(str(conf), Config(), options(tmp_path))
    assert finding.status == "fail" and "NVIDIA_VISIBLE_DEVICES=all" in finding.detail
    assert check_crio(str(conf), Config(require_allocation=True), options(tmp_path)).status == "ok"


def test_crio_absent_is_skip_and_broken_is_fail(tmp_path: Path) -> None:
    assert check_crio(str(tmp_path / "crio.conf"), Config(), options(tmp_path)).status == "skip"
    (tmp_path / "crio.conf").write_text("[crio\n")
    assert check_crio(str(tmp_path / "crio.conf"), Config(), options(tmp_path)).status == "fail"


def test_run_checks_includes_docker_and_crio(tmp_path: Path) -> None:
    """The full doctor run reports docker and crio findings."""
    opts = DoctorOptions(
        config_path=str(tmp_path / "none.yaml"),
        containerd_config=str(tmp_path / "c.toml"),
        docker_config=str(tmp_path / "d.json"),
        crio_config=str(tmp_path / "crio.conf"),
        driver_root=str(tmp_path),
        trampoline=str(tmp_path / "t"),
    )
    checks: List[str] = [f.check for f in doctor.run_checks(opts)]
    assert "docker" in checks and "crio" in checks


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="simulated nodes need root")
def test_dev_char_links_warn_then_ok(tmp_path: Path) -> None:
    """Nodes without /dev/char links warn with the fix; after the command, ok."""
    from nvshim.host.system import create_dev_char_symlinks
    from nvshim.node.doctor.host import check_dev_char_links
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=2)
    finding = check_dev_char_links(node.dev_root, systemd=True)
    assert finding.status == "warn" and "daemon-reload" in finding.message
    assert "195:254 (-> ../nvidia-modeset)" in finding.message
    assert finding.fix == f"nvshim system create-dev-char-symlinks --dev-root {node.dev_root}"
    assert check_dev_char_links(node.dev_root, systemd=False).status == "skip"
    create_dev_char_symlinks(node.dev_root)
    assert check_dev_char_links(node.dev_root, systemd=True).status == "ok"


def test_crio_line_counts_the_main_file_apart_from_drop_ins(tmp_path: Path) -> None:
    """The crio line says "crio.conf + 1 drop-in", not "(+2 file(s))", for one drop-in
    beside crio.conf; a lone crio.conf has no drop-ins; drop-ins alone name their folder."""
    binary = fake_runtime(tmp_path / "bin")
    conf = tmp_path / "crio.conf"
    conf.write_text(f'[crio.runtime.runtimes.nvshim]\nruntime_path = "{binary}"\n')
    alone = check_crio(str(conf), Config(), options(tmp_path))
    assert alone.status == "ok" and alone.message.startswith(f"{conf} (no drop-ins): ")
    drop_ins = tmp_path / "crio.conf.d"
    drop_ins.mkdir()
    (drop_ins / "10-a.toml").write_text('[crio.runtime]\nlog_level = "info"\n')
    one = check_crio(str(conf), Config(), options(tmp_path))
    assert one.message.startswith(f"{conf} + 1 drop-in: nvshim runtime nvshim ({binary})")
    conf.unlink()
    (drop_ins / "20-b.toml").write_text(
        f'[crio.runtime.runtimes.nvshim]\nruntime_path = "{binary}"\n'
    )
    two = check_crio(str(conf), Config(), options(tmp_path))
    assert two.message.startswith(f"2 drop-ins in {drop_ins} (no {conf}): ")
