"""nvshim's side of the simulated node under test: its config, read-only roots, in-root work.

* :func:`write_nvshim_config` / :func:`nvshim_config_env` — an nvshim YAML config (its grants
  journal kept next to it, never the node's /var/lib/nvshim) and the env (``NVSHIM_CONFIG``)
  to run ``nvshim-runtime`` with, whichever engine calls it.
* :func:`read_only_bind` makes a rootfs read-only for a block; :func:`make_mount_targets`
  pre-creates the mount targets nvshim would need in it; :func:`rootwork_by` reads from
  nvshim's debug log who did each create's in-root work (runtime or hook).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional

import yaml

from tests.helpers.common import PathLike

__all__ = [
    "make_mount_targets",
    "nvshim_config_env",
    "read_only_bind",
    "rootwork_by",
    "write_nvshim_config",
    "runtime_wrapper",
]


def write_nvshim_config(
    dir: PathLike, settings: Mapping[str, Any], name: str = "config.yaml"
) -> Path:
    """Dump ``settings`` (YAML keys, e.g. ``{"runtimes": [crunw], "debug-log": ...}``) to
    ``<dir>/<name>``; return its path. ``grants-journal`` defaults to ``<dir>/grants.jsonl``."""
    path = Path(dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    # Tests never write the node's real journal (/var/lib/nvshim): keep it next to the config.
    settings = {"grants-journal": str(path.parent / "grants.jsonl"), **settings}
    data = {
        k: (
            [str(x) for x in v]
            if isinstance(v, (list, tuple))
            else str(v)
            if isinstance(v, Path)
            else v
        )
        for k, v in settings.items()
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def nvshim_config_env(
    dir: PathLike, settings: Mapping[str, Any], base: Optional[Mapping[str, str]] = None
) -> Dict[str, str]:
    """Write the config (see :func:`write_nvshim_config`) and return ``base`` (default
    ``os.environ``) plus ``NVSHIM_CONFIG=<path>``."""
    path = write_nvshim_config(dir, settings)
    env = dict(os.environ if base is None else base)
    env["NVSHIM_CONFIG"] = str(path)
    return env


# --------------------------------------------------------------------------- rootfs work


@contextlib.contextmanager
def read_only_bind(path: PathLike) -> Iterator[Path]:
    """Make ``path`` a read-only bind mount of itself for the ``with`` body (then unmount).

    What a read-only rootfs looks like to nvshim-runtime (a squashfs, a read-only bind): the
    host cannot write it, so the in-root work goes to the createContainer hook.
    """
    target = Path(path)
    subprocess.run(["mount", "--bind", str(target), str(target)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(target), str(target)], check=True)
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def make_mount_targets(bundle: PathLike, env: Mapping[str, str]) -> None:
    """Create, in ``bundle``'s rootfs, an empty file for each driver file nvshim would mount
    (as an image that already has them): runc cannot create mount targets in a read-only
    rootfs. ``env`` holds the ``NVSHIM_CONFIG`` to plan with."""
    from nvshim.config import load_config
    from nvshim.host import inroot as _inroot
    from nvshim.runtime.create import plan_create

    plan = plan_create(str(bundle), load_config(env["NVSHIM_CONFIG"]))
    # resolved as if chrooted, like runc does: an image symlink must not send us to the host
    with _inroot.open_root(str(Path(bundle) / "rootfs")) as root:
        for mount in plan.edits.mounts:
            if os.path.isdir(mount.host_path):
                os.close(_inroot.resolve_dir(root, mount.container_path, create=True))
            elif _inroot.read_file(root, mount.container_path) is None:
                _inroot.write_file_atomic(root, mount.container_path, b"")


def rootwork_by(debug_log: PathLike) -> List[str]:
    """Who did the in-root work of each create logged in nvshim's debug log, in order
    (``runtime`` or ``hook``), from its ``rootfs`` events."""
    out = []
    for line in Path(debug_log).read_text().splitlines():
        record = json.loads(line)
        if record.get("event") == "rootfs":
            out.append(record["by"])
    return out


def runtime_wrapper(path: Path, config: Path, trampoline: Optional[Path] = None) -> Path:
    """An executable at ``path`` that runs nvshim's runtime with ``config``: the trampoline
    install.sh renders (written beside ``path`` once, for this interpreter), as an engine's
    handler runs it, with ``NVSHIM_CONFIG`` set."""
    import sys

    from nvshim.node.install.trampoline import render

    if trampoline is None:
        trampoline = path.parent / "trampoline"
        if not trampoline.exists():
            trampoline.write_text(render(sys.executable))
            trampoline.chmod(0o755)
    path.write_text(f'#!/bin/sh\nNVSHIM_CONFIG={config} exec {trampoline} "$@"\n')
    path.chmod(0o755)
    return path
