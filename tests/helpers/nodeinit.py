"""PID 1 of a test node (:mod:`tests.helpers.k8snode`): its mounts, then containerd, supervised.

Run as ``unshare --pid --mount --net --uts --fork --propagation private --mount-proc
python3 -I nodeinit.py SPEC.json``. SPEC holds ``hostname``, ``overlays`` (``[path, upper,
work]``: an overlayfs over the host's ``path`` whose writes land in ``upper``), ``binds``
(``[source, path]``: a directory of the test's bound over the node's ``path``, created in
the node's view first), ``read_only`` (paths then bound on themselves read-only, in order),
``containerd`` (its argv), ``log`` and ``status`` (files of the test's), and
``caller_mnt_ns`` (the launcher's ``/proc/self/ns/mnt``: nothing is mounted unless this
process's differs).

Then, as systemd would with ``Restart=always``: start containerd, reap every orphan that
the kernel reparents here (shims, hook processes), and start containerd again whenever it
exits (so the installer's ``signal`` restart mode works: the signal ends containerd, this
brings it back); each start is appended to ``status`` as ``start <pid>``, each exit as
``exit <status>``. SIGTERM: stop containerd (TERM, then KILL after 10 s) and exit; the
kernel then kills what is left in the node's PID namespace and its mounts go with it.
Standard library only: it runs before anything of the test's is importable.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

__all__: List[str] = []


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def _set_up(spec: Dict[str, Any]) -> None:
    if os.readlink("/proc/self/ns/mnt") == spec["caller_mnt_ns"]:
        sys.exit("nodeinit: not in a private mount namespace: nothing mounted")
    for path, upper, work in spec["overlays"]:
        _mount(
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={path},upperdir={upper},workdir={work}",
            path,
        )
    for source, path in spec["binds"]:
        os.makedirs(path, exist_ok=True)  # in an overlay or an earlier bind: the test's dirs
        _mount("--bind", source, path)
    for path in spec.get("read_only", []):  # with what is bound under it, as COS mounts /usr
        _mount("--rbind", path, path)
        _mount("-o", "remount,bind,ro", path)
    subprocess.run(["hostname", spec["hostname"]], check=True)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)


class _Init:
    def __init__(self, spec: Dict[str, Any]) -> None:
        self.spec = spec
        self.stopping = False
        self.containerd: Optional[int] = None

    def note(self, line: str) -> None:
        with open(self.spec["status"], "a") as f:
            f.write(line + "\n")

    def start(self) -> None:
        with open(self.spec["log"], "ab") as log:
            proc = subprocess.Popen(
                self.spec["containerd"], stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        self.containerd = proc.pid
        self.note(f"start {proc.pid}")

    def term(self, signum: int, frame: Any) -> None:
        self.stopping = True
        self.signal(signal.SIGTERM)
        signal.alarm(10)

    def signal(self, signum: int, frame: Any = None) -> None:
        if self.containerd is not None:
            os.kill(self.containerd, signum)

    def run(self) -> int:
        # a node's init hands its daemons default dispositions: a test run under nohup (CI)
        # must not leave containerd ignoring the installer's SIGHUP
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, self.term)
        signal.signal(signal.SIGINT, self.term)
        signal.signal(signal.SIGALRM, lambda n, f: self.signal(signal.SIGKILL))
        self.start()
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                if self.stopping:
                    return 0
                time.sleep(0.1)
                continue
            except InterruptedError:
                continue
            if pid != self.containerd:
                continue
            self.note(f"exit {status}")
            self.containerd = None
            if self.stopping:
                return 0
            time.sleep(0.2)  # a new daemon must not race the old one's boltdb lock
            self.start()


def main() -> int:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    _set_up(spec)
    return _Init(spec).run()


if __name__ == "__main__":
    sys.exit(main())
