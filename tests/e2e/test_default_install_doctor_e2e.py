"""e2e: a README install passes doctor, or says in one line why its default is so (issue 37.3).

``./install.sh --containerd`` on containerd's own default config -- ``containerd config
default`` of Debian 13's 1.7 (a version 2 config) and of Debian unstable's 2.1.9 (version 3,
where containerd injects CDI devices itself) -- is ``nvshim runtime configure --runtime
containerd`` with the shipped ``config/config.yaml``, compiled. doctor on that node (a
simulated GPU node as driver root) reports only ok and skip, but for the one warning a
default carries on purpose: require-allocation off, in one line that says why.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import tomlkit

from tests.helpers.common import require_root

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
MAX_LINE = 160


@pytest.fixture(scope="module", params=["1.7", "2.1"])
def containerd_dir(request: pytest.FixtureRequest) -> Path:
    """Debian 13's containerd 1.7 and Debian unstable's 2.1.9, from the test cache."""
    from tests.helpers.debian13 import engine_or_skip

    if request.param == "1.7":
        from tests.helpers.debian13 import containerd_17_dir as where
    else:
        from tests.helpers.debiansid import containerd_2_dir as where
    return engine_or_skip(where, f"containerd {request.param}")


def _run(args: List[str], path: str, config: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nvshim.cli.main", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"PATH": path, "NVSHIM_CONFIG": str(config)},
    )


def test_readme_install_on_containerds_default_config(containerd_dir: Path, tmp_path: Path) -> None:
    """doctor after a default install: ok/skip, and require-allocation's warning in one line."""
    require_root()
    from nvshim.node.install.trampoline import render
    from nvshim.sim.build import create_node

    path = f"{containerd_dir}:/usr/sbin:/usr/bin:/sbin:/bin"
    sim = create_node(str(tmp_path / "sim"), gpus=2)
    config = tmp_path / "etc/nvshim/config.yaml"
    config.parent.mkdir(parents=True)
    shutil.copy(REPO / "config/config.yaml", config)
    config.write_text(
        config.read_text()
        .replace("driver-root: /\n", f"driver-root: {sim.root}\n")
        .replace("cdi-spec-dirs: [/etc/cdi, /var/run/cdi]", f"cdi-spec-dirs: [{tmp_path / 'cdi'}]")
    )
    trampoline = tmp_path / "bin/nvshim-runtime"  # install.sh's, embedding the config
    trampoline.parent.mkdir()
    trampoline.write_text(render(sys.executable, config=str(config)))
    trampoline.chmod(0o755)
    ctrd = tmp_path / "etc/containerd/config.toml"
    ctrd.parent.mkdir(parents=True)
    default = subprocess.run(
        [str(containerd_dir / "containerd"), "config", "default"],
        capture_output=True,
        text=True,
        check=True,
    )
    ctrd.write_text(default.stdout)
    for args in (
        ["config", "compile", "--config", str(config)],
        [
            "runtime",
            "configure",
            "--runtime",
            "containerd",
            "--config",
            str(ctrd),
            "--binary",
            str(trampoline),
        ],
    ):
        done = _run(args, path, config)
        assert done.returncode == 0, done.stderr
    dump = subprocess.run(
        [str(containerd_dir / "containerd"), "--config", str(ctrd), "config", "dump"],
        capture_output=True,
        text=True,
        check=True,
    )
    plugins = tomlkit.parse(dump.stdout).unwrap()["plugins"]
    cri = plugins.get("io.containerd.cri.v1.runtime") or plugins["io.containerd.grpc.v1.cri"]
    handler: Dict[str, Any] = cri["containerd"]["runtimes"]["nvshim"]
    # containerd 2.x injects CDI devices itself: nvshim is not handed the annotations too
    assert handler["container_annotations"] == (
        [] if cri.get("enable_cdi") else ["cdi.k8s.io/*"]
    ), handler

    common = [
        "--config",
        str(config),
        "--containerd-config",
        str(ctrd),
        "--docker-config",
        str(tmp_path / "none"),
        "--crio-config",
        str(tmp_path / "none"),
        "--trampoline",
        str(trampoline),
        "--hooks-dir",
        str(tmp_path / "hooks"),
        "--agent-socket",
        str(tmp_path / "agent.sock"),
    ]
    found = json.loads(_run(["doctor", "--format", "json", *common], path, config).stdout)
    warned = [f for f in found if f["status"] not in ("ok", "skip")]
    assert [(f["check"], f["status"]) for f in warned] == [("handler-config", "warn")], warned
    assert warned[0]["message"] == (
        "require-allocation is off: the default, as nvshim is not the default runtime"
    ), warned
    text = _run(["doctor", *common], path, config).stdout
    assert [
        line for line in text.splitlines() if len(line.replace(str(tmp_path), "")) > MAX_LINE
    ] == [], text
