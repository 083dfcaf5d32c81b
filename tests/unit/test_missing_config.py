"""A named config that is missing fails a create closed, in one line naming it.

Named: by ``NVSHIM_CONFIG`` (a ``.yml``/``.yaml`` typo), or by the installed trampoline,
which embeds the config install.sh wrote (a deleted ``/etc/nvshim/config.yaml`` on a node
where nvshim is the default runtime). The built-in defaults have require-allocation off, so
falling back to them would hand out GPUs. Other commands still reach the low-level runtime
(containers can be stopped and deleted), and an ``nvshim-runtime`` that nobody named a
config for (podman or runc with the pip entry point, no config at all) keeps the defaults.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from tests.helpers.commands import make_trampoline_world

SPEC = json.dumps(
    {"process": {"args": ["true"], "env": ["PATH=/bin"]}, "root": {"path": "rootfs"}}
).encode()
"""A spec that asks for nothing (no NVIDIA_ text): the trampoline used to hand it to runc."""


def _bundle(tmp: Path, spec: bytes = SPEC) -> Path:
    bundle = tmp / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_bytes(spec)
    return bundle


def _recorder(bindir: Path, name: str = "runc") -> Path:
    bindir.mkdir(exist_ok=True)
    path = bindir / name
    path.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {bindir}/{name}.argv\n")
    path.chmod(0o755)
    return path


def _run(argv: List[str], env: Dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=60)


@pytest.mark.parametrize(
    "spec",
    [
        SPEC,
        json.dumps(
            {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}, "root": {"path": "rootfs"}}
        ).encode(),
    ],
    ids=["asks-nothing", "asks-all"],
)
def test_nvshim_config_naming_a_missing_file_fails_the_create(tmp_path: Path, spec: bytes) -> None:
    """NVSHIM_CONFIG naming a file that does not exist fails create in one line naming it; config.json stays byte-identical and runc never runs."""
    bindir = tmp_path / "bin"
    _recorder(bindir)
    bundle = _bundle(tmp_path, spec)
    typo = tmp_path / "etc" / "config.yml"
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "NVSHIM_CONFIG": str(typo)}
    res = _run(
        [
            sys.executable,
            "-I",
            "-m",
            "nvshim.runtime.main",
            "create",
            "--bundle",
            str(bundle),
            "c1",
        ],
        env,
        tmp_path,
    )
    assert res.returncode == 1, res.stderr
    assert res.stderr.splitlines() == [
        f"nvshim: config {typo} does not exist (named by NVSHIM_CONFIG): nvshim-runtime "
        "creates no container with the built-in defaults (require-allocation off) in its "
        "place; restore it, or name the config that exists"
    ]
    assert (bundle / "config.json").read_bytes() == spec
    assert not (bindir / "runc.argv").exists()
    # anything but create/run still reaches runc: containers can be stopped and deleted
    res = _run([sys.executable, "-I", "-m", "nvshim.runtime.main", "delete", "c1"], env, tmp_path)
    assert res.returncode == 0, res.stderr
    assert (bindir / "runc.argv").read_text().split() == ["delete", "c1"]


def test_installed_trampoline_with_its_config_deleted_fails_every_create(tmp_path: Path) -> None:
    """The trampoline's embedded config deleted: a create asking for nothing (once handed straight to runc) fails in one line naming the file; start and delete still reach runc."""
    from nvshim.node.install.trampoline import render

    world = make_trampoline_world(tmp_path)
    config: Path = world["config"]
    tramp = tmp_path / "installed-nvshim-runtime"
    tramp.write_text(render(sys.executable, config=str(config)))
    tramp.chmod(0o755)
    bindir = tmp_path / "bin"
    _recorder(bindir)
    config.unlink()
    bundle = _bundle(tmp_path)
    env = {"PATH": f"{bindir}:/usr/bin:/bin"}  # no NVSHIM_CONFIG: the script names it
    res = _run([str(tramp), "create", "--bundle", str(bundle), "c1"], env, tmp_path)
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
    assert f"config {config} does not exist (named by the installed nvshim-runtime)" in res.stderr
    assert not (bindir / "runc.argv").exists()
    assert (bundle / "config.json").read_bytes() == SPEC
    res = _run([str(tramp), "start", "c1"], env, tmp_path)
    assert res.returncode == 0 and (bindir / "runc.argv").read_text().split() == ["start", "c1"]


def test_unnamed_default_config_missing_means_built_in_defaults(tmp_path: Path) -> None:
    """An nvshim-runtime nobody named a config for (the pip entry point, podman, no NVSHIM_CONFIG) still creates with the built-in defaults when the default file is absent."""
    bindir = tmp_path / "bin"
    _recorder(bindir)
    bundle = _bundle(tmp_path)
    boot = (
        f"import nvshim.config as c; c.DEFAULT_CONFIG_PATH = {str(tmp_path / 'none.yaml')!r}; "
        "from nvshim.runtime.main import main; main()"
    )
    res = _run(
        [sys.executable, "-I", "-c", boot, "create", "--bundle", str(bundle), "c1"],
        {"PATH": f"{bindir}:/usr/bin:/bin"},
        tmp_path,
    )
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert (bindir / "runc.argv").read_text().split()[0] == "create"


def test_doctor_fails_a_missing_named_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """doctor FAILs a config that NVSHIM_CONFIG names but that does not exist (every create would fail), and still says ok for an unnamed default path."""
    from nvshim.node.doctor.config import check_config

    missing = tmp_path / "config.yml"
    monkeypatch.setenv("NVSHIM_CONFIG", str(missing))
    finding, _ = check_config(str(missing))
    assert finding.status == "fail" and f"no {missing}, named by NVSHIM_CONFIG" in finding.message
    assert f"restore {missing}" in finding.fix
    monkeypatch.delenv("NVSHIM_CONFIG")
    finding, _ = check_config(str(missing))
    assert finding.status == "ok"
