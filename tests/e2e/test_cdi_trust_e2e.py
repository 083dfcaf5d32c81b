"""e2e through real runc: a CDI spec others could have written never reaches a container,
and its ``createRuntime`` hook (which runc runs as root on the host) never runs.

The spec of ``acme.com/dev=a`` sets an env variable and carries a hook that writes a marker
file on the host. Owned by root and 0644 it is injected: the hook runs and the container
sees the variable (so the marker would show a hook that ran). Owned by uid 65534, 0666, or
in a 0777 directory, the create fails before runc in one line naming the device, the spec
and the rule; the marker is never written and config.json stays byte-identical.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict

import pytest

from nvshim.node.compile import compile_node
from tests.helpers.bundle import make_bundle
from tests.helpers.common import require_root, unique_id
from tests.helpers.node import write_nvshim_config
from tests.helpers.runc import Runc

pytestmark = pytest.mark.e2e

PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def write_spec(tmp_path: Path) -> Path:
    """cdi/acme.json: device ``a`` gives ACME=injected and a host hook writing ``marker``."""
    cdi = tmp_path / "cdi"
    cdi.mkdir(mode=0o755)
    marker = tmp_path / "marker"
    doc = {
        "cdiVersion": "0.5.0",
        "kind": "acme.com/dev",
        "devices": [
            {
                "name": "a",
                "containerEdits": {
                    "env": ["ACME=injected"],
                    "hooks": [
                        {
                            "hookName": "createRuntime",
                            "path": "/bin/sh",
                            "args": ["sh", "-c", f"id -u > {marker}"],
                            "env": [f"PATH={PATH_ENV}"],
                        }
                    ],
                },
            }
        ],
    }
    spec = cdi / "acme.json"
    spec.write_text(json.dumps(doc))
    os.chmod(spec, 0o644)
    return spec


def driver_root(tmp_path: Path) -> Path:
    """An empty driver root: the device asked for is no GPU, no driver is needed."""
    root = tmp_path / "no-driver"
    root.mkdir(exist_ok=True)
    return root


def env_for(tmp_path: Path, spec_dir: Path) -> Dict[str, str]:
    cfg = write_nvshim_config(
        tmp_path / "cfg",
        {
            "driver-root": str(driver_root(tmp_path)),
            "runtimes": ["runc"],
            "cdi-spec-dirs": [str(spec_dir)],
        },
    )
    compile_node(str(cfg))  # the index is written here, while the spec may be trusted
    return {"NVSHIM_CONFIG": str(cfg), "PATH": PATH_ENV}


def test_a_root_owned_spec_is_injected_and_its_hook_runs(
    runc: Runc, rootfs: Path, tmp_path: Path, nvshim_runtime_bin: str
) -> None:
    """The harness can see a hook run: a trusted spec's createRuntime hook writes the marker
    as uid 0 and the container sees the spec's env."""
    require_root()
    spec = write_spec(tmp_path)
    env = env_for(tmp_path, spec.parent)
    bundle = make_bundle(
        tmp_path / "b",
        rootfs,
        ["sh", "-c", "echo ACME=$ACME"],
        env=["NVIDIA_VISIBLE_DEVICES=acme.com/dev=a"],
    )
    res = runc.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
    assert "ACME=injected" in res.stdout, res.describe()
    assert (tmp_path / "marker").read_text().strip() == "0"


@pytest.mark.parametrize("how", ["owner", "mode", "dir"])
@pytest.mark.parametrize("when", ["before-compile", "after-compile"])
def test_an_untrusted_spec_fails_the_create_and_its_hook_never_runs(
    runc: Runc, rootfs: Path, tmp_path: Path, nvshim_runtime_bin: str, how: str, when: str
) -> None:
    """A spec owned by uid 65534, a 0666 spec, or a spec in a 0777 directory — made so
    before `config compile` or after it (the index then vouched for it) — fails the create
    with one line (stderr and runc's --log) naming the device, the spec and the rule; the
    host hook never ran and config.json is byte-identical."""
    require_root()
    spec = write_spec(tmp_path)

    def untrust() -> str:
        if how == "owner":
            os.chown(spec, 65534, 65534)
            return f"CDI spec {spec} is owned by uid 65534, not root"
        if how == "mode":
            os.chmod(spec, 0o666)
            return f"CDI spec {spec} is writable by group or others (mode 0666)"
        os.chmod(spec.parent, 0o777)
        return f"CDI spec directory {spec.parent} can be written by others (uid 0, mode 0777)"

    rule = untrust() if when == "before-compile" else ""
    env = env_for(tmp_path, spec.parent)
    rule = rule or untrust()
    bundle = make_bundle(
        tmp_path / "b", rootfs, ["true"], env=["NVIDIA_VISIBLE_DEVICES=acme.com/dev=a"]
    )
    before = (bundle / "config.json").read_bytes()
    res = runc.create(
        bundle, unique_id(), runtime=nvshim_runtime_bin, env=env, log=tmp_path / "log.json"
    )
    lines = [res.refusal()]
    assert lines[0].startswith(
        f"nvshim: CDI device acme.com/dev=a is defined only by CDI spec {spec}, which nvshim "
        f"does not trust and skips: {rule}"
    ), lines[0]
    assert not (tmp_path / "marker").exists()
    assert (bundle / "config.json").read_bytes() == before
