"""podman through nvshim-runtime: pointing podman at an nvshim config.

podman passes its OCI runtime only ``XDG_RUNTIME_DIR`` and ``PWD`` (and ``PATH`` for
``create``), so an ``NVSHIM_CONFIG`` in podman's environment never reaches nvshim-runtime.
A wrapper script given as ``--runtime`` sets it; without one nvshim reads
``/etc/nvshim/config.yaml``, and its errors say so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nvshim.node.compile import compile_node
from tests.helpers.common import require_root
from tests.helpers.node import write_nvshim_config
from tests.helpers.podman import Podman

pytestmark = pytest.mark.e2e

PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LIB = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
PROBE = (
    'for n in /dev/nvidia*; do [ -c "$n" ] && stat -c \'DEV %n %t:%T\' "$n"; done; '
    f"grep -c NVSHIM-SIM {LIB} >/dev/null && echo LIB-READABLE"
)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A simulated 2-GPU node whose minors are swapped (GPU 1 is /dev/nvidia0)."""
    require_root()
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("sim") / "node"), gpus=2, shuffle_minors=True)


def write_wrapper(path: Path, config: Path, runtime: str) -> Path:
    """docs/engines.md's wrapper: set NVSHIM_CONFIG, then exec nvshim-runtime with podman's argv."""
    path.write_text(f'#!/bin/sh\nexport NVSHIM_CONFIG={config}\nexec {runtime} "$@"\n')
    path.chmod(0o755)
    return path


def test_podman_through_a_wrapper_uses_its_config(
    podman: Podman, node: Any, rootfs: Path, tmp_path: Path, nvshim_runtime_bin: str
) -> None:
    """``podman --runtime <wrapper>`` where the wrapper exports NVSHIM_CONFIG: the container
    asking for GPU 1 of the simulated node sees that GPU's node (by its minor), the control
    node and the node's libcuda."""
    cfg = write_nvshim_config(tmp_path / "cfg", {"driver-root": node.root, "runtimes": ["runc"]})
    compile_node(str(cfg))
    wrapper = write_wrapper(tmp_path / "nvshim-runtime-sim", cfg, nvshim_runtime_bin)
    res = podman.podman_run(
        rootfs,
        ["sh", "-c", PROBE],
        env={"NVIDIA_VISIBLE_DEVICES": "1"},
        runtime=wrapper,
        podman_env={"PATH": PATH_ENV},
    )
    assert res.rc == 0, res.describe()
    minor = node.gpus[1].minor
    assert f"DEV /dev/nvidia{minor} c3:{minor:x}" in res.stdout, res.describe()
    assert "DEV /dev/nvidiactl c3:ff" in res.stdout, res.describe()
    assert f"DEV /dev/nvidia{node.gpus[0].minor} " not in res.stdout, res.describe()
    assert "LIB-READABLE" in res.stdout, res.describe()
    assert (cfg.parent / "grants.jsonl").read_text().count("\n") == 1  # the wrapper's config


def test_podman_drops_nvshim_config_and_the_error_names_the_default(
    podman: Podman, node: Any, rootfs: Path, tmp_path: Path, nvshim_runtime_bin: str
) -> None:
    """NVSHIM_CONFIG in podman's own environment does not reach nvshim-runtime: a GPU the
    default config's node lacks fails with one line naming /etc/nvshim/config.yaml (or the
    built-in defaults) and the driver root looked under, never the config podman was given."""
    from nvshim.config import DEFAULT_CONFIG_PATH, load_config
    from nvshim.errors import NvshimError

    try:
        default = load_config(DEFAULT_CONFIG_PATH)
    except NvshimError as exc:
        pytest.skip(f"this host's default config does not load: {exc}")
    cfg = write_nvshim_config(tmp_path / "cfg", {"driver-root": node.root, "runtimes": ["runc"]})
    compile_node(str(cfg))
    # the default config journals its refusal in the node's /var/lib/nvshim: the runtime runs
    # in a mount namespace of its own where /var/lib is an empty tmpfs (its env untouched)
    isolated = tmp_path / "isolated-runtime"
    isolated.write_text(
        "#!/bin/sh\nexec /usr/bin/unshare -m /bin/sh -c "
        '\'/bin/mount -t tmpfs nvshim-test /var/lib && exec "$0" "$@"\' '
        f'{nvshim_runtime_bin} "$@"\n'
    )
    isolated.chmod(0o755)
    res = podman.podman_run(
        rootfs,
        ["true"],
        env={"NVIDIA_VISIBLE_DEVICES": "97"},
        runtime=isolated,
        podman_env={"PATH": PATH_ENV, "NVSHIM_CONFIG": str(cfg)},
    )
    assert res.rc != 0, res.describe()
    used = (
        f"(config {DEFAULT_CONFIG_PATH})"
        if default.source
        else f"(built-in defaults: no config {DEFAULT_CONFIG_PATH})"
    )
    lines = [line for line in res.stderr.splitlines() if "nvshim:" in line]
    assert len(lines) == 1, res.describe()
    assert 'nvshim: unknown device "97": this node has ' in lines[0], res.describe()
    assert f" under driver root {default.driver_root} {used}" in lines[0], res.describe()
    assert str(cfg) not in res.stderr
