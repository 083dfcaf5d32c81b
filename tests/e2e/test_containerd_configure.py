"""e2e: ``nvshim runtime configure`` against real containerd config loading (``config dump``).

``containerd --config X config dump`` loads X and its imports exactly as the daemon would and
prints the merged result; it touches neither ``root`` nor ``state``, so no daemon is started
and nothing under /var/lib/containerd is created. containerd 1.6 knows config versions 1 and
2 only: a version 3 file loads, but its ``io.containerd.cri.v1.runtime`` table is unknown to
it, so for version 3 only the written structure is checked.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import tomlkit

from tests.helpers.common import require_binary
from tests.helpers.containerd_samples import DEBIAN_CONFIG

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CRI = "io.containerd.grpc.v1.cri"
BINARY = "/opt/nvshim/bin/nvshim-runtime"

COMMENTED = """\
# containerd config, managed by hand
version = 2

[plugins."io.containerd.grpc.v1.cri"]
  # mirrored pause image: must survive the drop-in's copy of this table
  sandbox_image = "mirror.local/pause:3.6"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true  # systemd owns cgroups here
"""

DEBIAN = DEBIAN_CONFIG

V1 = """\
# version 1 (no version key)
[plugins.cri]
  sandbox_image = "mirror.local/pause:3.6"
  [plugins.cri.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.cri.containerd.runtimes.runc.options]
      SystemdCgroup = true  # systemd owns cgroups here
"""

DOTTED = """\
version = 2
plugins."io.containerd.grpc.v1.cri".sandbox_image = "mirror.local/pause:3.6"  # dotted keys

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true
[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"  # defined after its sub-tables
"""

V3 = """\
version = 3

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
"""


@pytest.fixture(scope="module")
def containerd_bin() -> str:
    """The containerd binary (config dump needs no root and no daemon)."""
    return require_binary("containerd")


def _default_config(containerd_bin: str) -> str:
    return subprocess.run(
        [containerd_bin, "config", "default"], check=True, capture_output=True, text=True
    ).stdout


def _nvshim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nvshim.cli.main", "runtime", "configure", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
    )


def _dump(containerd_bin: str, config: Path) -> Dict[str, Any]:
    done = subprocess.run(
        [containerd_bin, "--config", str(config), "config", "dump"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return tomlkit.parse(done.stdout).unwrap()


def _snapshot(root: Path) -> Dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


CASES = ["missing", "empty", "default", "debian", "commented", "dotted", "v1"]


def _original(case: str, containerd_bin: str) -> Optional[str]:
    if case == "missing":
        return None
    if case == "default":
        return _default_config(containerd_bin)
    return {"empty": "", "debian": DEBIAN, "commented": COMMENTED, "dotted": DOTTED, "v1": V1}[case]


# Version 1 files are always edited in place, so they have no drop-in case.
@pytest.mark.parametrize(
    ("case", "in_place"),
    [(case, in_place) for case in CASES for in_place in (False, True) if case != "v1" or in_place],
    ids=lambda value: value if isinstance(value, str) else ("in-place" if value else "drop-in"),
)
def test_containerd_loads_handler_and_revert_restores(
    case: str, in_place: bool, containerd_bin: str, tmp_path: Path
) -> None:
    """containerd's merged config has the nvshim handler with BinaryName; --revert restores the bytes."""
    etc = tmp_path / "etc"
    etc.mkdir()
    config = etc / "config.toml"
    original = _original(case, containerd_bin)
    if original is not None:
        config.write_text(original)
    before = _snapshot(tmp_path)
    drop_in = "" if in_place else str(etc / "conf.d" / "99-nvshim.toml")
    args = ["--config", str(config), "--drop-in", drop_in, "--binary", BINARY]

    done = _nvshim(*args, "--set-as-default", "--force")
    assert done.returncode == 0, done.stderr
    assert "restart containerd" in done.stderr

    merged = _dump(containerd_bin, config)
    containerd_table = merged["plugins"][CRI]["containerd"]
    handler = containerd_table["runtimes"]["nvshim"]
    assert handler["options"]["BinaryName"] == BINARY
    assert handler["runtime_type"] == "io.containerd.runc.v2"
    assert "cdi.k8s.io/*" in handler["container_annotations"]
    assert containerd_table["default_runtime_name"] == "nvshim"
    if case in ("commented", "dotted", "v1"):
        assert merged["plugins"][CRI]["sandbox_image"] == "mirror.local/pause:3.6"
        assert handler["options"]["SystemdCgroup"] is True
        text = config.read_text()
        for line in (original or "").splitlines():
            if "#" in line:
                assert line in text
    if case == "debian":
        assert merged["plugins"][CRI]["cni"]["bin_dir"] == "/usr/lib/cni"

    done = _nvshim("--config", str(config), "--drop-in", drop_in, "--revert")
    assert done.returncode == 0, done.stderr
    assert _snapshot(tmp_path) == before
    assert config.exists() == (original is not None)
    assert not (etc / "conf.d").exists()


def test_without_drop_in_copy_containerd_16_would_lose_cri_settings(
    containerd_bin: str, tmp_path: Path
) -> None:
    """The drop-in's copy of the CRI table matters: a partial CRI table in an import drops the main one's settings."""
    config = tmp_path / "config.toml"
    partial = tmp_path / "partial.toml"
    config.write_text(COMMENTED.replace("version = 2\n", f'version = 2\nimports = ["{partial}"]\n'))
    partial.write_text(
        f'version = 2\n[plugins."{CRI}".containerd.runtimes.x.options]\nBinaryName = "/x"\n'
    )
    assert (
        _dump(containerd_bin, config)["plugins"][CRI]["sandbox_image"] != "mirror.local/pause:3.6"
    )

    config.write_text(COMMENTED)
    done = _nvshim("--config", str(config), "--drop-in", str(tmp_path / "conf.d" / "n.toml"))
    assert done.returncode == 0, done.stderr
    assert (
        _dump(containerd_bin, config)["plugins"][CRI]["sandbox_image"] == "mirror.local/pause:3.6"
    )


def test_dry_run_output_is_what_containerd_loads(containerd_bin: str, tmp_path: Path) -> None:
    """The files printed by --dry-run, written out, load in containerd with the handler; nothing is written."""
    config = tmp_path / "config.toml"
    config.write_text(DEBIAN)
    drop_in = tmp_path / "conf.d" / "99-nvshim.toml"
    done = _nvshim("--config", str(config), "--drop-in", str(drop_in), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert config.read_text() == DEBIAN and not drop_in.parent.exists()
    files: Dict[str, List[str]] = {}
    current: List[str] = []
    for line in done.stdout.splitlines():
        if line.startswith("# --- ") and line.endswith(" ---"):
            current = files.setdefault(line[len("# --- ") : -len(" ---")], [])
        else:
            current.append(line)
    assert list(files) == [str(drop_in), str(config)]
    drop_in.parent.mkdir()
    for path, lines in files.items():
        Path(path).write_text("\n".join(lines) + "\n")
    handler = _dump(containerd_bin, config)["plugins"][CRI]["containerd"]["runtimes"]["nvshim"]
    assert handler["options"]["BinaryName"] == "/usr/local/bin/nvshim-runtime"


def test_config_alone_puts_the_drop_in_beside_it_and_containerd_loads_it(
    containerd_bin: str, tmp_path: Path
) -> None:
    """--config without --drop-in: the drop-in lands in conf.d beside the config (not in the
    live /etc/containerd/conf.d), the import points there, containerd loads the handler
    through it, and --revert without --drop-in restores the directory."""
    config = tmp_path / "config.toml"
    config.write_text(COMMENTED)
    before = _snapshot(tmp_path)
    drop_in = tmp_path / "conf.d" / "99-nvshim.toml"
    dry = _nvshim("--config", str(config), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"# --- {drop_in} ---" in dry.stdout.splitlines()  # before anything is written
    done = _nvshim("--config", str(config))
    assert done.returncode == 0, done.stderr
    assert drop_in.is_file()
    assert tomlkit.parse(config.read_text()).unwrap()["imports"] == [str(drop_in)]
    merged = _dump(containerd_bin, config)
    assert (
        merged["plugins"][CRI]["containerd"]["runtimes"]["nvshim"]["options"]["BinaryName"]
        == "/usr/local/bin/nvshim-runtime"
    )
    assert merged["plugins"][CRI]["sandbox_image"] == "mirror.local/pause:3.6"
    done = _nvshim("--config", str(config), "--revert")
    assert done.returncode == 0, done.stderr
    assert _snapshot(tmp_path) == before and not drop_in.parent.exists()


def test_version_3_structure_and_revert(containerd_bin: str, tmp_path: Path) -> None:
    """A version 3 file gets a version 3 drop-in under io.containerd.cri.v1.runtime (structure only: containerd 1.6 lacks that plugin) and reverts byte-exactly."""
    config = tmp_path / "config.toml"
    config.write_text(V3)
    drop_in = tmp_path / "conf.d" / "99-nvshim.toml"
    done = _nvshim("--config", str(config), "--drop-in", str(drop_in), "--enable-cdi")
    assert done.returncode == 0, done.stderr
    data = tomlkit.parse(drop_in.read_text()).unwrap()
    assert data["version"] == 3
    cri = data["plugins"]["io.containerd.cri.v1.runtime"]
    assert cri["enable_cdi"] is True
    assert cri["containerd"]["runtimes"]["nvshim"]["options"]["BinaryName"] == (
        "/usr/local/bin/nvshim-runtime"
    )
    assert tomlkit.parse(config.read_text()).unwrap()["imports"] == [str(drop_in)]
    _dump(containerd_bin, config)  # still loads: the import resolves
    done = _nvshim("--config", str(config), "--drop-in", str(drop_in), "--revert")
    assert done.returncode == 0, done.stderr
    assert config.read_text() == V3 and not drop_in.parent.exists()


def test_refusal_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    """--set-as-default without require-allocation exits 1 with one ``nvshim:`` line and writes nothing."""
    config = tmp_path / "config.toml"
    nvshim_config = tmp_path / "nvshim.yaml"
    nvshim_config.write_text("require-allocation: false\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvshim.cli.main",
            "runtime",
            "configure",
            "--config",
            str(config),
            "--set-as-default",
            "--binary",
            "/nonexistent/nvshim-runtime",
        ],  # no config embedded
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"NVSHIM_CONFIG": str(nvshim_config), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("nvshim: refusing")
    assert f"require-allocation is off in {nvshim_config}, the config " in done.stderr
    assert list(tmp_path.iterdir()) == [nvshim_config]
