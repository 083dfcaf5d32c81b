"""deploy/installer.sh, the DaemonSet container's entrypoint, run against a temp node.

The "node" is a temp dir: every node path the installer and install.sh use is moved under it
(NVSHIM_PREFIX, NVSHIM_BINDIR, NVSHIM_ETCDIR, NVSHIM_STAGE, NVSHIM_CONTAINERD_CONFIG, …),
NVSHIM_HOST_ROOT is empty (the container's view of a node path is the path itself, as
through a hostPath) and NVSHIM_NODE_EXEC is empty (no nsenter: this mount namespace is the
node's). The node's containerd is a real containerd 1.6 with a private root, state and
socket, supervised by a small sh loop that starts it again whenever it exits, as systemd
or k3s would: that is what NVSHIM_RESTART_MODE=signal relies on. Running the pod itself
through a node's CRI is tests/e2e's DaemonSet test; this one pins what the entrypoint and
install.sh do to the node.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

from nvshim import _protobuf as proto
from nvshim.node.engines import restart as engine_restart
from tests.helpers.common import require_binary, require_root, wait_until
from tests.helpers.containerd import containerd_private_config
from tests.helpers.payload import payload_dir

REPO = Path(__file__).resolve().parents[2]
INSTALLER = REPO / "deploy" / "installer.sh"
_RUN_CONTAINERD = Path("/run/containerd")


def build_payload(dest: Path) -> Path:
    """The image's /payload: ``install.sh --payload`` (nvshim's self-contained runtime)."""
    done = subprocess.run(
        ["sh", str(REPO / "install.sh"), "--payload", str(dest)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dest


CRI_TABLE = """\
  [plugins."io.containerd.grpc.v1.cri"]
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "{base}/cni/bin"
      conf_dir = "{base}/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
"""


class SupervisedContainerd:
    """A private containerd 1.6 under a restart loop (``while :; do containerd; done``).

    ``hide`` names a directory that containerd, and only containerd, sees as an empty tmpfs
    (its own mount namespace, as a confined daemon has): a drop-in written there is missing
    for it, and containerd refuses a config whose import it cannot read.
    """

    def __init__(self, base: Path, config: Path, hide: Optional[Path] = None) -> None:
        self.base, self.config, self.hide = base, config, hide
        self.socket = str(base / "containerd.sock")
        self.log = base / "containerd.log"
        self.proc: Optional["subprocess.Popen[bytes]"] = None
        self._created: List[Path] = []

    def start(self) -> None:
        require_binary("containerd")
        assert len(self.socket) < 100, self.socket
        for d in (_RUN_CONTAINERD, _RUN_CONTAINERD / "s"):
            if not d.exists():
                self._created.insert(0, d)
        run = f'exec containerd --config "{self.config}"'
        if self.hide is not None:
            run = (
                f"exec unshare -m --propagation private sh -c 'mount -t tmpfs tmpfs "
                f'"{self.hide}" && exec containerd --config "{self.config}"\''
            )
        loop = f"while :; do ( {run} ) >> '{self.log}' 2>&1; sleep 0.2; done"
        with open(self.log, "ab") as log:  # the loop's own lines too ("Hangup")
            self.proc = subprocess.Popen(
                ["sh", "-c", loop],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        wait_until(lambda: engine_restart.answers(self.socket, 2), 60, "containerd to answer")

    def pid(self) -> Optional[int]:
        return engine_restart.socket_owner(self.socket)

    def runtimes(self) -> Dict[str, object]:
        """The CRI runtime handlers the running containerd has loaded (CRI Status, verbose)."""
        from tests.helpers.cri import CriClient

        reply = CriClient(self.socket, timeout=10).call("Status", b"\x08\x01")
        info = {
            proto.read_string(e, 1): proto.read_string(e, 2)
            for e in (proto.by_number(b) for b in proto.messages(proto.by_number(reply), 2))
        }
        return dict(json.loads(info["config"])["containerd"]["runtimes"])

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the loop's group: sh, unshare, containerd
        self.proc.wait(30)
        self.proc = None
        for d in self._created:
            with contextlib.suppress(OSError):
                d.rmdir()


class Node:
    """A temp node: its paths, the env that moves every installer path onto them."""

    def __init__(self, root: Path, payload: Path) -> None:
        self.root = root
        self.etc = root / "etc" / "nvshim"
        self.bin = root / "bin"
        self.prefix = root / "opt" / "nvshim"
        self.stage = root / "var" / "lib" / "nvshim-installer" / "payload"
        self.ctrd = root / "ctrd"
        self.containerd_config = root / "etc" / "containerd" / "config.toml"
        self.drop_in = self.containerd_config.parent / "conf.d" / "99-nvshim.toml"
        self.configmap = root / "configmap"
        self.ready = root / "run" / "ready"
        self.node_paths = root / "run" / "nvshim" / "node-paths"
        self.payload = payload
        self.configmap_revision = 0
        self.ctrd.mkdir(parents=True)
        self.bin.mkdir()  # a node has /usr/local/bin already
        self.containerd_config.parent.mkdir(parents=True)
        self.original = (
            containerd_private_config(self.ctrd) + CRI_TABLE.format(base=self.ctrd)
        ).encode()
        self.containerd_config.write_bytes(self.original)

    def env(self, **extra: str) -> Dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NVSHIM_")}
        env.update(
            NVSHIM_HOST_ROOT="",
            NVSHIM_NODE_EXEC="",
            NVSHIM_PAYLOAD=str(self.payload),
            NVSHIM_STAGE=str(self.stage),
            NVSHIM_CONFIGMAP_FILE=str(self.configmap / "config.yaml"),
            NVSHIM_READY_FILE=str(self.ready),
            NVSHIM_WATCH_INTERVAL="1",
            NVSHIM_NODE_PATHS=str(self.node_paths),
            NVSHIM_PREFIX=str(self.prefix),
            NVSHIM_BINDIR=str(self.bin),
            NVSHIM_ETCDIR=str(self.etc),
            NVSHIM_CONTAINERD_CONFIG=str(self.containerd_config),
            NVSHIM_CONTAINERD_SOCKET=str(self.ctrd / "containerd.sock"),
            NVSHIM_RESTART_MODE="signal",
            NVSHIM_RESTART_TIMEOUT="20",
        )
        env.update(extra)
        return env

    def set_configmap(self, text: str) -> None:
        """Write the ConfigMap volume as the kubelet does: a new timestamped dir, then swap
        the ``..data`` symlink; ``config.yaml`` is a symlink through ``..data``."""
        self.configmap.mkdir(exist_ok=True)
        self.configmap_revision += 1
        rev = f"..rev{self.configmap_revision}"
        (self.configmap / rev).mkdir()
        (self.configmap / rev / "config.yaml").write_text(text)
        tmp = self.configmap / "..data_tmp"
        tmp.symlink_to(rev)
        os.replace(tmp, self.configmap / "..data")
        link = self.configmap / "config.yaml"
        if not link.is_symlink():
            link.symlink_to("..data/config.yaml")

    def nvshim_files(self) -> List[str]:
        """What nvshim left on the node besides containerd's own config."""
        found = []
        for top in (
            self.etc,
            self.prefix,
            self.stage.parent,
            self.drop_in,
            Path(f"{self.containerd_config}.nvshim-orig.json"),
        ):
            if top.exists():
                found += [str(p) for p in [top, *top.rglob("*")]] if top.is_dir() else [str(top)]
        return found + [str(p) for p in self.bin.iterdir()]


class Installer:
    """deploy/installer.sh running as the pod's process; its stderr is the pod's log."""

    def __init__(self, node: Node, env: Dict[str, str]) -> None:
        self.log = node.root / f"installer-{time.monotonic_ns()}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                ["sh", str(INSTALLER)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, needle: str, timeout: float = 600) -> None:
        def seen() -> bool:
            if self.proc.poll() is not None and needle not in self.text():
                raise AssertionError(f"installer exited {self.proc.returncode}:\n{self.text()}")
            return needle in self.text()

        try:
            wait_until(seen, timeout, f"{needle!r} in the installer's log", interval=0.2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.text()}") from None

    def terminate(self, timeout: float = 120) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


@pytest.fixture(scope="module")
def payload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_root()
    return build_payload(tmp_path_factory.mktemp("payload") / "payload")


@pytest.fixture
def node(tmp_path: Path, payload: Path) -> Iterator[Node]:
    yield Node(tmp_path, payload)


@contextlib.contextmanager
def running(node: Node, hide: Optional[Path] = None) -> Iterator[SupervisedContainerd]:
    daemon = SupervisedContainerd(node.ctrd, node.containerd_config, hide)
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.stop()


CONFIG_V1 = "runtimes: [runc]\nrequire-allocation: true\n"
CONFIG_V2 = "runtimes: [runc, crun]\nrequire-allocation: true\n"
CONFIG_BROKEN = "runtimes: [runc]\nrequire-allocation: maybe\n"


def test_signal_mode_install_configmap_watch_keep_and_uninstall(node: Node) -> None:
    """The entrypoint installs (containerd restarted by a signal and loading the nvshim
    handler), applies a ConfigMap change without restarting containerd, keeps a broken one
    out with one line, stays installed on SIGTERM with NVSHIM_KEEP_ON_EXIT=true, re-runs
    without bouncing containerd, and on a plain SIGTERM puts containerd's config back byte
    for byte, restarts it and removes every nvshim file."""
    node.set_configmap(CONFIG_V1)
    with running(node) as daemon:
        first_pid = daemon.pid()
        pod = Installer(node, node.env(NVSHIM_KEEP_ON_EXIT="true"))
        try:
            pod.wait_for("installed; watching")
            assert node.ready.exists()
            # where the agent container finds the installed nvshim (one setting)
            assert node.node_paths.read_text() == f"bindir={node.bin}\netcdir={node.etc}\n"
            installed_pid = daemon.pid()
            assert installed_pid not in (None, first_pid)  # restarted by SIGHUP, back again
            assert "nvshim" in daemon.runtimes() and "runc" in daemon.runtimes()
            assert (node.etc / "config.yaml").read_text() == CONFIG_V1
            compiled = node.etc / "config.runtimes"  # one of the files compile writes
            assert compiled.read_text() == "runc\n"

            node.set_configmap(CONFIG_V2)
            pod.wait_for("applied the ConfigMap's new config.yaml")
            assert (node.etc / "config.yaml").read_text() == CONFIG_V2
            assert compiled.read_text() == "runc\ncrun\n"
            assert daemon.pid() == installed_pid  # only nvshim's config changed

            node.set_configmap(CONFIG_BROKEN)
            pod.wait_for("kept the previous")
            refused = [line for line in pod.text().splitlines() if "kept the previous" in line]
            assert len(refused) == 1 and "require-allocation" in refused[0], pod.text()
            assert (node.etc / "config.yaml").read_text() == CONFIG_V2
            assert compiled.read_text() == "runc\ncrun\n"
            assert node.ready.exists()

            assert pod.terminate() == 0
            assert "NVSHIM_KEEP_ON_EXIT=true" in pod.text()
            assert node.drop_in.exists() and (node.bin / "nvshim-runtime").exists()
            assert daemon.pid() == installed_pid and "nvshim" in daemon.runtimes()
        finally:
            pod.kill()

        node.set_configmap(CONFIG_V2)
        pod = Installer(node, node.env())
        try:
            pod.wait_for("installed; watching")
            assert daemon.pid() == installed_pid  # nothing to write: containerd not bounced
            # no systemd here: the entrypoint follows driver changes itself
            (pidfile,) = node.stage.parent.glob("cdi-refresh.*.pid")  # this pod's
            watcher = int(pidfile.read_text())
            argv = Path(f"/proc/{watcher}/cmdline").read_bytes().split(b"\0")
            assert [b"cdi", b"refresh", b"--watch"] == argv[argv.index(b"cdi") :][:3], argv
            assert pod.terminate() == 0, pod.text()
        finally:
            pod.kill()
        assert not Path(f"/proc/{watcher}").exists() and not pidfile.exists()
        assert "uninstalled nvshim from this node" in pod.text()
        assert node.containerd_config.read_bytes() == node.original
        assert node.nvshim_files() == []
        assert not node.ready.exists()
        assert not node.node_paths.exists() and not node.node_paths.parent.exists()
        back = daemon.pid()
        assert back not in (None, installed_pid)  # restarted to drop the handler
        assert "nvshim" not in daemon.runtimes()


def test_a_rollouts_old_pod_leaves_the_new_pods_install_alone(node: Node) -> None:
    """A rollout as the DaemonSet's maxSurge runs it: a new installer pod installs beside
    the old one, then the old one gets SIGTERM. It stops without uninstalling (one line
    says why): containerd keeps the handler and is not restarted, the agent container's
    node-paths file and the new pod's driver watcher stay. The new pod's SIGTERM then
    uninstalls everything, containerd's config back byte for byte."""
    node.set_configmap(CONFIG_V1)
    run = node.root / "run"
    with running(node) as daemon:
        old = Installer(node, node.env(NVSHIM_READY_FILE=str(run / "old" / "ready")))
        new = None
        try:
            old.wait_for("installed; watching")
            new = Installer(node, node.env(NVSHIM_READY_FILE=str(run / "new" / "ready")))
            new.wait_for("installed; watching")
            tokens = {(run / pod / "owner-token").read_text() for pod in ("old", "new")}
            assert len(tokens) == 2
            owner = node.stage.parent / "owner"
            assert owner.read_text() == (run / "new" / "owner-token").read_text()
            watchers = sorted(node.stage.parent.glob("cdi-refresh.*.pid"))
            assert len(watchers) == 2
            installed_pid = daemon.pid()

            assert old.terminate() == 0, old.text()
            assert "a newer installer pod installed it" in old.text()
            assert "uninstalling" not in old.text()
            assert daemon.pid() == installed_pid and "nvshim" in daemon.runtimes()
            assert node.drop_in.exists() and (node.bin / "nvshim-runtime").exists()
            assert node.node_paths.exists() and (node.etc / "config.yaml").exists()
            (left,) = node.stage.parent.glob("cdi-refresh.*.pid")
            assert (run / "new" / "owner-token").read_text().strip() in left.name
            assert Path(f"/proc/{int(left.read_text())}").exists()

            assert new.terminate() == 0, new.text()
            assert "uninstalled nvshim from this node" in new.text()
        finally:
            old.kill()
            if new is not None:
                new.kill()
    assert node.containerd_config.read_bytes() == node.original
    assert node.nvshim_files() == []
    assert not node.node_paths.exists()


def test_containerd_that_does_not_come_back_gets_its_previous_config(node: Node) -> None:
    """containerd that cannot load the changed config (the drop-in is on a path it does not
    see) does not come back: install.sh puts the previous config back byte for byte, restarts
    containerd, which answers again, and fails with one line naming the config and the
    socket; the pod stays not ready and its SIGTERM still removes nvshim's files."""
    node.drop_in.parent.mkdir()
    node.set_configmap(CONFIG_V1)
    with running(node, hide=node.drop_in.parent) as daemon:
        first_pid = daemon.pid()
        pod = Installer(node, node.env(NVSHIM_RESTART_TIMEOUT="8"))
        try:
            pod.wait_for("this pod stays not ready")
            lines = [line for line in pod.text().splitlines() if "did not come back" in line]
            assert len(lines) == 1, pod.text()
            line = lines[0]
            assert line.startswith(
                f"install.sh: containerd did not come back with {node.containerd_config} "
            )
            assert f"it answers again on {node.ctrd}/containerd.sock" in line
            assert node.containerd_config.read_bytes() == node.original
            assert not node.drop_in.exists()
            assert not Path(f"{node.containerd_config}.nvshim-orig.json").exists()
            assert daemon.pid() not in (None, first_pid) and "nvshim" not in daemon.runtimes()
            assert not node.ready.exists()
            assert pod.terminate() == 0, pod.text()
        finally:
            pod.kill()
        assert node.containerd_config.read_bytes() == node.original
        assert node.nvshim_files() == []


def test_missing_containerd_config_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    """install.sh --containerd with no containerd config at NVSHIM_CONTAINERD_CONFIG fails
    with one line naming it and how to proceed, before writing anything."""
    require_root()
    missing = tmp_path / "etc" / "containerd" / "config.toml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVSHIM_")}
    env.update(
        NVSHIM_PREFIX=str(tmp_path / "opt"),
        NVSHIM_BINDIR=str(tmp_path / "bin"),
        NVSHIM_ETCDIR=str(tmp_path / "etc" / "nvshim"),
        NVSHIM_SKIP_APT="1",
        NVSHIM_CONTAINERD_CONFIG=str(missing),
        NVSHIM_RESTART_MODE="signal",
    )
    done = subprocess.run(
        ["sh", str(REPO / "install.sh"), "--containerd"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"install.sh: containerd config {missing} does not exist: ")
    assert "NVSHIM_CONTAINERD_CONFIG" in done.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == []


K3S_HEADER = "# File generated by k3s. DO NOT EDIT. Use config.toml.tmpl instead.\n"


def test_seeded_template_is_created_then_removed_on_uninstall(tmp_path: Path) -> None:
    """k3s/RKE2 layout: with the .tmpl missing, NVSHIM_CONTAINERD_CONFIG_SEED copies the
    generated config.toml to it (less k3s's "DO NOT EDIT" header: the template is the file
    to edit) before adding the handler, and --uninstall removes the copy again, leaving the
    generated file as it was."""
    require_root()
    agent = tmp_path / "k3s" / "agent" / "etc" / "containerd"
    agent.mkdir(parents=True)
    generated = agent / "config.toml"
    generated.write_bytes(
        K3S_HEADER.encode()
        + containerd_private_config(tmp_path / "ctrd").encode()
        + CRI_TABLE.format(base=tmp_path / "ctrd").encode()
    )
    before = generated.read_bytes()
    template = agent / "config.toml.tmpl"
    (tmp_path / "bin").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVSHIM_")}
    env.update(
        NVSHIM_PREFIX=str(tmp_path / "opt"),
        NVSHIM_BINDIR=str(tmp_path / "bin"),
        NVSHIM_ETCDIR=str(tmp_path / "etc" / "nvshim"),
        NVSHIM_SKIP_APT="1",
        NVSHIM_CONTAINERD_CONFIG=str(template),
        NVSHIM_CONTAINERD_CONFIG_SEED=str(generated),
        NVSHIM_RESTART_MODE="none",
    )

    def install(*args: str) -> subprocess.CompletedProcess:
        source = [] if "--uninstall" in args else ["--from", str(payload_dir())]
        return subprocess.run(
            ["sh", str(REPO / "install.sh"), *source, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    done = install("--containerd")
    assert done.returncode == 0, done.stderr
    assert f"seeded {template} from {generated}" in done.stderr
    assert "did not restart containerd (NVSHIM_RESTART_MODE=none)" in done.stderr
    text = template.read_text()
    assert "DO NOT EDIT" not in text
    assert text.startswith(before.decode().split("\n")[1])
    assert str(agent / "conf.d" / "99-nvshim.toml") in text  # imports the drop-in
    assert generated.read_bytes() == before
    gone = install("--uninstall")
    assert gone.returncode == 0, gone.stderr
    assert not template.exists() and not (agent / "conf.d" / "99-nvshim.toml").exists()
    assert generated.read_bytes() == before
    assert sorted(p.name for p in agent.iterdir()) == ["config.toml"]


def test_uninstall_leaves_a_forwarder_while_containers_run_through_nvshim_runtime(
    tmp_path: Path,
) -> None:
    """A containerd task whose shim names nvshim-runtime (its options.json, as containerd's
    runc shim writes it) still runs at uninstall: nvshim-runtime is replaced by a forwarder
    to the runtime nvshim handed to (containerd stops and deletes the container through that
    path), one line says so, and everything else goes. A later --uninstall keeps it while
    the task is there and removes it once the task is gone."""
    require_root()
    ctrd, bindir = tmp_path / "ctrd", tmp_path / "bin"
    config = tmp_path / "etc" / "containerd" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(containerd_private_config(ctrd) + CRI_TABLE.format(base=ctrd))
    before = config.read_bytes()
    bindir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVSHIM_")}
    env.update(
        NVSHIM_PREFIX=str(tmp_path / "opt"),
        NVSHIM_BINDIR=str(bindir),
        NVSHIM_ETCDIR=str(tmp_path / "etc" / "nvshim"),
        NVSHIM_SKIP_APT="1",
        NVSHIM_CONTAINERD_CONFIG=str(config),
        NVSHIM_RESTART_MODE="none",
    )

    def install(*args: str) -> subprocess.CompletedProcess:
        source = [] if "--uninstall" in args else ["--from", str(payload_dir())]
        return subprocess.run(
            ["sh", str(REPO / "install.sh"), *source, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    assert install("--containerd").returncode == 0
    runtime = bindir / "nvshim-runtime"
    task = ctrd / "state" / "io.containerd.runtime.v2.task" / "k8s.io" / ("c" * 64)
    task.mkdir(parents=True)
    (task / "options.json").write_text(
        json.dumps(
            {"binary_name": str(runtime), "root": str(ctrd / "runc-root")}, separators=(",", ":")
        )
    )

    gone = install("--uninstall")
    assert gone.returncode == 0, gone.stderr
    said = [line for line in gone.stderr.splitlines() if "forwarder" in line]
    assert len(said) == 1 and "1 container(s) created through it still run" in said[0], gone.stderr
    assert config.read_bytes() == before
    assert sorted(p.name for p in bindir.iterdir()) == ["nvshim-runtime"]
    assert not (tmp_path / "opt").exists() and not (tmp_path / "etc" / "nvshim").exists()
    runc = shutil.which("runc")
    assert runc and f'exec {shlex.quote(runc)} "$@"' in runtime.read_text()
    version = subprocess.run(
        [str(runtime), "--version"], capture_output=True, text=True, timeout=30
    )
    assert version.returncode == 0 and version.stdout.startswith("runc version"), version

    kept = install("--uninstall")
    assert kept.returncode == 0 and "still run through it" in kept.stderr, kept.stderr
    assert runtime.exists()
    shutil.rmtree(task)
    removed = install("--uninstall")
    assert removed.returncode == 0 and "removed the forwarder" in removed.stderr, removed.stderr
    assert list(bindir.iterdir()) == []


def test_a_reinstall_fails_no_create_running_beside_it(tmp_path: Path) -> None:
    """install.sh over an install (an upgrade, a DaemonSet rollout) while creates run through
    nvshim-runtime's Python path (the config newer than its compiled copies, as while an
    installer writes it): every create gets to runc (its refusal of this test's bundle,
    which has no rootfs, is in the --log file), none meets a prefix half gone. With two renames instead
    of one exchange, some creates failed here in every run, with no log line (python3 not found,
    a stdlib module missing)."""
    require_root()
    import threading

    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVSHIM_")}
    env.update(
        NVSHIM_PREFIX=str(root / "opt" / "nvshim"),
        NVSHIM_BINDIR=str(root / "bin"),
        NVSHIM_ETCDIR=str(root / "etc" / "nvshim"),
        NVSHIM_SKIP_APT="1",
        NVSHIM_AGENT_UNIT="off",
    )

    def install() -> None:
        done = subprocess.run(
            ["sh", str(REPO / "install.sh"), "--from", str(payload_dir())],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr

    install()
    config = root / "etc" / "nvshim" / "config.yaml"
    # no rootfs: runc refuses the bundle before it mounts or starts anything
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(
        json.dumps(
            {
                "ociVersion": "1.0.2",
                "process": {"args": ["true"], "cwd": "/", "env": ["PATH=/bin"]},
                "root": {"path": "no-rootfs"},
                "linux": {"namespaces": [{"type": "mount"}]},
            }
        )
    )
    running = threading.Event()
    running.set()
    bad: List[str] = []
    tries = [0]

    def creates(worker: int) -> None:
        log = tmp_path / f"log.{worker}.json"
        while running.is_set():
            tries[0] += 1
            log.unlink(missing_ok=True)
            done = subprocess.run(
                [
                    str(root / "bin" / "nvshim-runtime"),
                    "--log",
                    str(log),
                    "create",
                    "--bundle",
                    str(bundle),
                    f"c{worker}-{tries[0]}",
                ],
                env={**env, "NVSHIM_CONFIG": str(config)},
                capture_output=True,
                text=True,
                timeout=60,
            )
            said = log.read_text() if log.exists() else ""
            if "runc create failed: invalid rootfs" not in said:
                bad.append(f"rc={done.returncode} {done.stderr.strip()[-300:]} log={said[-200:]}")

    workers = [threading.Thread(target=creates, args=(w,)) for w in range(4)]
    for w in workers:
        w.start()
    try:
        for _ in range(6):
            os.utime(config)  # newer than config.runtimes: the trampoline starts Python
            install()
            os.utime(config)
    finally:
        running.clear()
        for w in workers:
            w.join(60)
    print(f"{tries[0]} creates beside 6 reinstalls")
    assert tries[0] > 30 and bad == [], (tries[0], bad[:5])


def test_configmap_turning_require_allocation_off_under_the_default_runtime_is_kept_out(
    node: Node,
) -> None:
    """With NVSHIM_SET_AS_DEFAULT=true, a ConfigMap change to require-allocation: false, or
    to a file of only comments, never reaches the node's config.yaml: the previous one
    stays, compiled, with one line each in the log; a good change is applied; SIGTERM
    removes the default-runtime mark with the rest."""
    journal = f"grants-journal: {node.root}/journal/grants.jsonl\n"
    good, better = CONFIG_V1 + journal, CONFIG_V2 + journal
    node.set_configmap(good)
    pod = Installer(node, node.env(NVSHIM_SET_AS_DEFAULT="true", NVSHIM_RESTART_MODE="none"))
    try:
        pod.wait_for("installed; watching")
        compiled = (node.etc / "config.compiled.json").read_bytes()
        for text, why in (
            ("runtimes: [runc]\nrequire-allocation: false\n" + journal, "require-allocation off"),
            ("# require-allocation: true\n# runtimes: [runc]\n", "only comments"),
        ):
            seen = pod.text().count("kept the previous")
            node.set_configmap(text)
            wait_until(
                lambda n=seen: pod.text().count("kept the previous") > n,
                60,
                "the refusal",
                interval=0.2,
            )
            refused = [line for line in pod.text().splitlines() if "kept the previous" in line]
            assert len(refused) == seen + 1 and why in refused[-1], pod.text()
            assert (node.etc / "config.yaml").read_text() == good
            assert (node.etc / "config.compiled.json").read_bytes() == compiled
            assert not (node.etc / ".config.yaml.new").exists()
        assert (node.etc / "config.default-runtime").exists()
        node.set_configmap(better)
        pod.wait_for("applied the ConfigMap's new config.yaml")
        assert (node.etc / "config.yaml").read_text() == better
        assert pod.terminate() == 0, pod.text()
    finally:
        pod.kill()
    assert node.containerd_config.read_bytes() == node.original
    assert node.nvshim_files() == []
