"""podman 4.3.1 with private storage, and CDI specs where podman reads them.

* :class:`Podman` — private ``--root/--runroot/--tmpdir``, cgroupfs (with a private
  ``--cgroup-parent``), file events, overlay storage, and :meth:`Podman.podman_run`
  (``--rootfs``, ``--network none``, the ulimits this VM needs).
* :func:`installed_cdi_spec` puts a CDI spec in :data:`CDI_DIR` for the duration of a block.

* :func:`private_image_cache` runs a podman (or skopeo) command as root in a private mount
  namespace whose ``/var/lib`` is an overlay writing into the test's directory: the image
  library keeps its blob info cache in ``/var/lib/containers/cache`` whatever ``--root``
  says (``import``, ``save``, ``build``, ``pull``, ``skopeo copy``). :meth:`Podman.podman`
  runs its image commands that way.

What a session leaves behind: podman passes no ``--root`` to its runtime, so runc/crun use
``/run/runc``/``/run/crun``, which :meth:`Podman.cleanup` removes again when it created them
and they are empty; the ``--cgroup-parent`` cgroups are removed there too. Storage lives under
pytest's tmp dirs, the (short) runroot under ``/tmp``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from tests.helpers.common import (
    EnvArg,
    PathLike,
    RunResult,
    env_dict,
    execute,
    mounts_under,
    pids_with_arg,
    remove_cgroup_tree,
    require_binary,
    terminate_pids,
    unique_id,
    wait_until,
)

__all__ = ["CDI_DIR", "IMAGE_COMMANDS", "Podman", "installed_cdi_spec", "private_image_cache"]

CDI_DIR = Path("/var/run/cdi")
"""A directory podman 4.3.1 reads CDI specs from (the other is /etc/cdi)."""


_DEFAULT_STATE_DIRS = (Path("/run/runc"), Path("/run/crun"))

#: podman commands that copy images (and so write containers/image's blob info cache).
IMAGE_COMMANDS = frozenset(("build", "commit", "import", "load", "pull", "push", "save"))

# Refuses to mount (exit 97) unless its mount namespace is not the caller's ($1).
_PRIVATE_VAR_LIB = (
    '[ "$(readlink /proc/self/ns/mnt)" != "$1" ] || exit 97; '
    'mount -t overlay nvshim-tests -o "lowerdir=/var/lib,upperdir=$2/upper,workdir=$2/work" '
    '/var/lib || exit 98; shift 2; exec "$@"'
)


def private_image_cache(argv: Sequence[PathLike], scratch: PathLike) -> List[str]:
    """``argv`` (podman or skopeo, as root) in a private mount namespace in which ``/var/lib``
    is an overlay whose writes land in ``scratch`` (its ``upper``/``work`` are made here):
    containers/image writes ``/var/lib/containers/cache/blob-info-cache-v1.boltdb`` for
    root whatever ``--root`` says. As another user ``argv`` is returned unchanged (the
    cache is then under ``$HOME``)."""
    if os.geteuid() != 0:
        return [str(a) for a in argv]
    for sub in ("upper", "work"):
        Path(scratch, sub).mkdir(parents=True, exist_ok=True)
    return [
        require_binary("unshare"),
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        _PRIVATE_VAR_LIB,
        "sh",
        os.readlink("/proc/self/ns/mnt"),
        str(scratch),
        *map(str, argv),
    ]


@dataclass
class Podman:
    """podman 4.3.1 with private storage under ``base`` (nothing under /var/lib/containers)."""

    base: Path
    runtime: Optional[PathLike] = None
    """Default ``--runtime`` (None: runc on PATH)."""
    cgroup_parent: str = field(default_factory=lambda: "/" + unique_id("nvshim-e2e-podman"))
    """``--cgroup-parent`` of every container (conmon's cgroup goes under it too), removed by
    :meth:`cleanup`; podman's default ``/libpod_parent`` would stay behind."""
    runroot: Path = field(init=False)
    """``--runroot``: podman refuses one longer than 50 characters, so it is a short
    ``/tmp/nvshim-podrun-*`` directory (removed by :meth:`cleanup`), not under ``base``."""
    binary: Optional[str] = None
    """The podman binary (None: podman on PATH; Debian unstable's:
    :func:`tests.helpers.debiansid.podman_5`)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Added to podman's environment on every call (a podman 5's containers.conf override)."""
    cdi_spec_dirs: Sequence[PathLike] = ()
    """``--cdi-spec-dir`` of every call (podman 5; 4.3.1 lacks the flag and reads
    :data:`CDI_DIR`)."""
    host_paths: Sequence[Path] = ()
    """Host files and folders this podman creates where no flag moves them (podman 5's
    netavark run dir and lock): :meth:`cleanup` removes those that did not exist before, a
    folder only when empty, in the order given (deepest first)."""
    _absent_state_dirs: List[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        # podman passes no --root, so runc/crun keep state in their default dirs; remember
        # which of those did not exist yet so cleanup() can remove them again (when empty).
        self._absent_state_dirs = [
            d for d in (*_DEFAULT_STATE_DIRS, *self.host_paths) if not os.path.lexists(d)
        ]
        self.base = Path(self.base)
        self.base.mkdir(parents=True, exist_ok=True)
        self.runroot = Path(tempfile.mkdtemp(prefix="nvshim-podrun-", dir="/tmp"))

    def global_args(self, runtime: Optional[PathLike] = None) -> List[str]:
        """The global flags every call gets."""
        rt = runtime or self.runtime or require_binary("runc")
        cdi = [arg for d in self.cdi_spec_dirs for arg in ("--cdi-spec-dir", str(d))]
        return [
            "--root",
            str(self.base / "root"),
            "--runroot",
            str(self.runroot),
            "--tmpdir",
            str(self.base / "tmp"),
            "--cgroup-manager",
            "cgroupfs",
            "--events-backend",
            "file",
            "--storage-driver",
            "overlay",
            "--runtime",
            str(rt),
            *cdi,
        ]

    def podman(
        self,
        *args: PathLike,
        runtime: Optional[PathLike] = None,
        env: EnvArg = None,
        log_level: Optional[str] = None,
        timeout: float = 120,
    ) -> RunResult:
        """``podman <global flags> [--log-level L] *args``; ``env`` is podman's (and so the
        runtime's) environment."""
        argv = [self.binary or require_binary("podman"), *self.global_args(runtime)]
        if log_level:
            argv += ["--log-level", log_level]
        argv += list(map(str, args))
        if args and str(args[0]) in IMAGE_COMMANDS:
            argv = private_image_cache(argv, self.base / "var-lib")
        if self.env:
            env = {**(env_dict(env) or os.environ), **self.env}
        return execute(argv, env=env, timeout=timeout, cwd=self.base)

    def podman_run(
        self,
        rootfs: PathLike,
        args: Sequence[str],
        *,
        env: EnvArg = None,
        devices: Iterable[str] = (),
        runtime: Optional[PathLike] = None,
        mounts: Iterable[Union[Tuple[PathLike, str], Tuple[PathLike, str, str]]] = (),
        annotations: Optional[Mapping[str, str]] = None,
        extra_flags: Sequence[str] = (),
        podman_env: EnvArg = None,
        log_level: Optional[str] = None,
        timeout: float = 120,
    ) -> RunResult:
        """``podman run --rm --network none --ulimit ... [--device D] --rootfs R args``.

        ``env``: container env (``--env``). ``devices``: ``--device`` values, CDI names
        (``nvidia.com/gpu=0``, see :func:`installed_cdi_spec`) or host paths. ``mounts``:
        ``(src, dst)`` → ``--volume src:dst:ro``, or ``(src, dst, "rw")``. ``podman_env`` is the
        env of podman and so of the runtime it calls (e.g.
        :func:`~tests.helpers.node.nvshim_config_env`).
        Podman shows the runtime's stderr, not its ``--log`` (it passes none).
        """
        flags: List[str] = [
            "--rm",
            "--network",
            "none",
            "--cgroup-parent",
            self.cgroup_parent,
            "--ulimit",
            "nofile=20000:20000",
            "--ulimit",
            "nproc=4096:4096",
        ]
        for k, v in (env_dict(env) or {}).items():
            flags += ["--env", f"{k}={v}"]
        for d in devices:
            flags += ["--device", d]
        for m in mounts:
            opts = m[2] if len(m) > 2 else "ro"  # type: ignore[misc]
            flags += ["--volume", f"{m[0]}:{m[1]}:{opts}"]
        for k, v in (annotations or {}).items():
            flags += ["--annotation", f"{k}={v}"]
        flags += list(extra_flags)
        return self.podman(
            "run",
            *flags,
            "--rootfs",
            str(rootfs),
            *args,
            runtime=runtime,
            env=podman_env,
            log_level=log_level,
            timeout=timeout,
        )

    def cleanup(self) -> None:
        """Remove all containers of this storage and wait for podman helpers to exit."""
        if (self.base / "root").exists():
            self.podman("rm", "--all", "--force", timeout=60)
        # conmon and `podman container cleanup` carry our --root in their argv.
        needle = str(self.base / "root")
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not pids_with_arg(needle), 15, "podman helper processes to exit")
        terminate_pids(pids_with_arg(needle))
        remove_cgroup_tree(self.cgroup_parent)
        for d in self._absent_state_dirs:
            with contextlib.suppress(OSError):
                if d.is_dir() and not d.is_symlink():
                    d.rmdir()
                else:
                    d.unlink()
        if self.runroot.exists() and not mounts_under(self.runroot):
            shutil.rmtree(self.runroot, ignore_errors=True)


@contextlib.contextmanager
def installed_cdi_spec(spec: Union[PathLike, str], name: str) -> Iterator[Path]:
    """Install a CDI spec as ``/var/run/cdi/<name>`` for the duration of the block.

    ``spec`` is a path to a spec file or the spec's text (YAML or JSON; ``name`` should end in
    ``.yaml`` or ``.json`` to match). Refuses (AssertionError) to overwrite an existing file;
    removes the file afterwards, and the directory too when this created it and it is empty.
    """
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"bad CDI spec file name {name!r}")
    text = (
        Path(spec).read_text()
        if isinstance(spec, Path) or ("\n" not in str(spec) and Path(str(spec)).is_file())
        else str(spec)
    )
    created_dir = not CDI_DIR.exists()
    CDI_DIR.mkdir(parents=True, exist_ok=True)
    target = CDI_DIR / name
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise AssertionError(f"refusing to overwrite existing CDI spec {target}") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        yield target
    finally:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        if created_dir:
            with contextlib.suppress(OSError):
                CDI_DIR.rmdir()
