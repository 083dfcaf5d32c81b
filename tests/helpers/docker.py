"""A private Docker daemon (Debian's docker.io 20.10, or Debian unstable's 28.5) for e2e tests.

:class:`Dockerd` starts ``dockerd`` with its own ``--data-root``, ``--exec-root``, unix
socket, pidfile and ``--cgroup-parent``, no iptables, no bridge, no IP forwarding; it runs
its own containerd (dockerd starts one under ``<exec-root>/containerd`` when
``--containerd`` is not given; 28.5 starts the containerd 2.1 first on its PATH). dockerd 20.10 always writes its trust key to
``/etc/docker/key.json`` and creates ``/run/docker/plugins``; neither path can be moved by
a flag, so the daemon runs in a private mount namespace in which private directories are
bind-mounted over ``/etc/docker`` and ``/run/docker``: nothing of the host's changes.
(containerd's shim sockets still go to ``/run/containerd/s``, as with the private
containerd of :mod:`tests.helpers.containerd`; they leave with their shims.)

Images come from :func:`Dockerd.import_rootfs` (``docker import`` of a tar of a directory),
never from a registry.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import List, Mapping, Optional, Sequence

from tests.helpers.common import (
    RunResult,
    execute,
    pids_with_arg,
    remove_cgroup_tree,
    require_binary,
    terminate_pids,
    unique_id,
    wait_until,
)

__all__ = ["Dockerd", "docker_client"]

_HOST_DIRS = (Path("/etc/docker"), Path("/run/docker"))


def docker_client() -> str:
    """The docker CLI matching the daemon: Debian's /usr/bin/docker, else the one on PATH."""
    if os.access("/usr/bin/docker", os.X_OK):
        return "/usr/bin/docker"
    return require_binary("docker")


class Dockerd:
    """A private dockerd; :meth:`start` it with a ``daemon.json`` path, :meth:`stop` it.
    ``bin_dirs``: the directories of another dockerd, docker client and containerd (Debian
    unstable's: :func:`tests.helpers.debiansid.docker_28_dirs`), first on dockerd's PATH."""

    def __init__(
        self,
        config_file: Path,
        base: Path,
        env: Optional[Mapping[str, str]] = None,
        bin_dirs: Sequence[Path] = (),
    ) -> None:
        self.env = dict(os.environ if env is None else env)
        if bin_dirs:  # another dockerd, docker and the containerd it starts: first on PATH
            self.env["PATH"] = os.pathsep.join([*map(str, bin_dirs), self.env.get("PATH", "")])
            found = {
                name: shutil.which(name, path=os.pathsep.join(map(str, bin_dirs)))
                for name in ("dockerd", "docker", "containerd")
            }
            missing = [name for name, path in found.items() if path is None]
            if missing:
                raise AssertionError(f"{', '.join(missing)} not in {list(map(str, bin_dirs))}")
            self.binary, self.client = str(found["dockerd"]), str(found["docker"])
        else:
            self.binary = require_binary("dockerd")
            self.client = docker_client()
            require_binary("containerd")
        self.config_file = Path(config_file)
        # under pytest's tmp dir (concurrent host-file checks skip it); unix socket paths are
        # limited to 108 bytes, so the base must stay short
        self.base = Path(tempfile.mkdtemp(prefix="dk", dir=str(base)))
        if len(str(self.base / "exec" / "containerd" / "containerd.sock.ttrpc")) > 100:
            raise AssertionError(f"dockerd base {self.base} is too long for its sockets")
        self.cgroup_parent = "/" + unique_id("nvshim-e2e-docker")
        self._created_host_dirs: List[Path] = []
        self._proc: Optional["subprocess.Popen[bytes]"] = None

    @property
    def socket(self) -> Path:
        return self.base / "docker.sock"

    @property
    def log_path(self) -> Path:
        return self.base / "dockerd.log"

    @property
    def pidfile(self) -> Path:
        return self.base / "dockerd.pid"

    def argv(self) -> List[str]:
        return [
            self.binary,
            "--config-file",
            str(self.config_file),
            "--data-root",
            str(self.base / "data"),
            "--exec-root",
            str(self.base / "exec"),
            "--pidfile",
            str(self.pidfile),
            "-H",
            f"unix://{self.socket}",
            "--iptables=false",
            "--ip-forward=false",
            "--ip-masq=false",
            "--bridge=none",
            "--cgroup-parent",
            self.cgroup_parent,
        ]

    def start(self, timeout: float = 60) -> None:
        """Start the daemon in a private mount namespace; wait until ``docker version`` answers."""
        unshare = require_binary("unshare")
        for host_dir in _HOST_DIRS:
            if not host_dir.exists():
                host_dir.mkdir(mode=0o700)
                self._created_host_dirs.insert(0, host_dir)
        binds = []
        for host_dir in _HOST_DIRS:
            private = self.base / ("private" + str(host_dir).replace("/", "-"))
            private.mkdir()
            binds.append(f"mount --bind {private} {host_dir}")
        script = " && ".join(binds) + ' && exec "$@"'
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [unshare, "-m", "--propagation", "private", "sh", "-c", script, "sh", *self.argv()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self.env,
                start_new_session=True,
            )

        def up() -> bool:
            if self._proc is not None and self._proc.poll() is not None:
                raise AssertionError(
                    f"dockerd exited with {self._proc.returncode}:\n"
                    + self.log_path.read_text(errors="replace")[-3000:]
                )
            return self.docker("version", timeout=10).rc == 0

        wait_until(up, timeout, "dockerd to answer `docker version`", interval=0.2)

    def docker(self, *args: str, timeout: float = 120, stdin: Optional[str] = None) -> RunResult:
        """``docker -H unix://<socket> *args``."""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.base),
            "DOCKER_CONFIG": str(self.base / "client"),
        }
        return execute(
            [self.client, "-H", f"unix://{self.socket}", *args],
            env=env,
            timeout=timeout,
            stdin=stdin,
        )

    def reload(self, expect_default: str, timeout: float = 30) -> None:
        """SIGHUP: dockerd re-reads ``runtimes`` and ``default-runtime`` from its config file."""
        os.kill(int(self.pidfile.read_text().strip()), signal.SIGHUP)

        def reloaded() -> bool:
            info = self.docker("info", "--format", "{{.DefaultRuntime}}", timeout=10)
            return info.rc == 0 and info.stdout.strip() == expect_default

        wait_until(reloaded, timeout, f"dockerd's default runtime to become {expect_default}")

    def import_rootfs(self, rootfs: Path, tag: str, env: Sequence[str] = ()) -> None:
        """``docker import`` a tar of ``rootfs`` as ``tag`` with image ``ENV`` lines ``env``."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(str(rootfs), arcname=".")
        tar_path = self.base / "rootfs.tar"
        tar_path.write_bytes(buffer.getvalue())
        changes: List[str] = []
        for entry in env:
            changes += ["--change", f"ENV {entry}"]
        self.docker("import", *changes, str(tar_path), tag).check()
        tar_path.unlink()

    def run(
        self,
        image: str,
        args: Sequence[str],
        *,
        runtime: Optional[str] = None,
        env: Mapping[str, str] = {},
        timeout: float = 120,
    ) -> RunResult:  # noqa: B006
        """``docker run --rm --network none [--runtime R] [-e K=V] image args``."""
        flags = ["run", "--rm", "--network", "none"]
        if runtime is not None:
            flags += ["--runtime", runtime]
        for key, value in env.items():
            flags += ["-e", f"{key}={value}"]
        return self.docker(*flags, image, *args, timeout=timeout)

    def stop(self, timeout: float = 30) -> None:
        """Remove containers, TERM the daemon (it stops its containerd), remove what it left."""
        if self._proc is not None:
            with contextlib.suppress(Exception):
                listed = self.docker("ps", "-aq", timeout=30)
                if listed.rc == 0 and listed.stdout.split():
                    self.docker("rm", "-f", *listed.stdout.split(), timeout=60)
            proc, self._proc = self._proc, None
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
            # its containerd and shims carry our base directory in their argv
            terminate_pids(pids_with_arg(str(self.base)))
        remove_cgroup_tree(self.cgroup_parent)
        for host_dir in self._created_host_dirs:
            with contextlib.suppress(OSError):
                host_dir.rmdir()  # empty: the daemon wrote into its private bind mount
        # every mount dockerd made lived in its own namespace, gone with it
        shutil.rmtree(self.base, ignore_errors=True)
