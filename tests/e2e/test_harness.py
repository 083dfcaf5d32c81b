"""The e2e harness itself, proven with plain runc, crun, containerd (ctr) and podman (no nvshim).

If these fail, nvshim e2e failures mean nothing: fix the harness (or the machine) first.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from tests.helpers.bundle import (
    bind_mount,
    char_device,
    device_rule,
    ld_probe_args,
    ld_probe_command,
    make_bundle,
    parse_ld_probe,
    read_config,
    update_ld_cache,
)
from tests.helpers.common import (
    make_env_wrapper,
    make_failing_runtime,
    pids_with_arg,
    require_binary,
    require_root,
    unique_id,
)
from tests.helpers.containerd import Containerd
from tests.helpers.node import nvshim_config_env
from tests.helpers.podman import CDI_DIR, Podman, installed_cdi_spec
from tests.helpers.runc import Runc

pytestmark = pytest.mark.e2e

SEES = "echo hello-from-$0; id -u; echo FOO=$FOO; cat /etc/passwd; ls /data"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    (d / "marker.txt").write_text("marker\n")
    return d


@pytest.fixture
def fake_nvidia0(tmp_path: Path) -> Path:
    """A host character device node 195:0 (no driver behind it)."""
    node = tmp_path / "dev" / "nvidia0"
    node.parent.mkdir()
    os.mknod(node, 0o666 | 0o020000, os.makedev(195, 0))
    return node


def test_bundle_config_is_tab_indented_with_relative_root(
    base_rootfs: Path, tmp_path: Path
) -> None:
    """make_bundle writes a tab-indented config.json with root.path "rootfs" and the rootfs copy."""
    b = make_bundle(tmp_path / "b", base_rootfs, ["true"], env={"FOO": "bar"})
    text = (b / "config.json").read_text()
    assert text.startswith('{\n\t"ociVersion"')
    cfg = read_config(b)
    assert cfg["root"] == {"path": "rootfs", "readonly": True}
    assert cfg["process"]["terminal"] is False
    assert cfg["process"]["env"][0].startswith("PATH=/usr/local/sbin:")
    assert "FOO=bar" in cfg["process"]["env"]
    assert (b / "rootfs" / "bin" / "busybox").is_file()


@pytest.mark.parametrize("engine", ["runc", "crun"])
def test_busybox_container_prints_what_it_sees(
    engine: str, request: pytest.FixtureRequest, base_rootfs: Path, tmp_path: Path, data_dir: Path
) -> None:
    """A busybox container run by runc/crun sees its env, rootfs files and a read-only bind mount."""
    r: Runc = request.getfixturevalue(engine)
    b = make_bundle(
        tmp_path / "b",
        base_rootfs,
        ["sh", "-c", SEES + "; echo x > /data/y || echo RO-OK", engine],
        env={"FOO": "bar"},
        mounts=[bind_mount(data_dir, "/data")],
    )
    res = r.run(b, unique_id(engine)).check()
    assert f"hello-from-{engine}\n0\nFOO=bar\nroot:x:0:0:" in res.stdout
    assert "marker.txt" in res.stdout
    assert "RO-OK" in res.stdout
    assert not (data_dir / "y").exists()


def test_runc_lifecycle_keeps_container_output_and_log(
    runc: Runc, base_rootfs: Path, tmp_path: Path
) -> None:
    """create/start/state/delete drive one container; its output lands in files; errors in --log."""
    b = make_bundle(tmp_path / "b", base_rootfs, ["sh", "-c", "echo out; echo err >&2"])
    cid = unique_id("life")
    log = tmp_path / "runc.log"
    runc.create(b, cid, log=log).check()
    assert runc.state(cid).json()["status"] == "created"
    runc.start(cid, log=log).check()
    final = runc.wait_stopped(cid)
    assert final["status"] == "stopped"
    assert runc.container_output(cid) == ("out\n", "err\n")
    runc.delete(cid, log=log).check()
    gone = runc.state(cid, log=log)
    assert gone.rc != 0
    assert gone.log_errors == ["container does not exist"]


def test_run_detached_returns_container_output(
    runc: Runc, base_rootfs: Path, tmp_path: Path
) -> None:
    """run_detached goes create→start→stopped→delete and returns what the container printed."""
    b = make_bundle(tmp_path / "b", base_rootfs, ["sh", "-c", "echo detached-ok"])
    cid = unique_id("det")
    res = runc.run_detached(b, cid).check()
    assert res.stdout == "detached-ok\n"
    assert cid not in runc.list_ids()


@pytest.mark.parametrize("engine", ["runc", "crun"])
@pytest.mark.parametrize(
    ("rules", "expected"),
    [([device_rule(195)], "No such device or address"), ([], "Operation not permitted")],
    ids=["allowed", "denied"],
)
def test_device_cgroup_rule_decides_enxio_or_eperm(
    engine: str,
    rules: list,
    expected: str,
    request: pytest.FixtureRequest,
    base_rootfs: Path,
    tmp_path: Path,
) -> None:
    """Opening a 195:0 node gives ENXIO when the cgroup allows c 195:* and EPERM when it does not."""
    r: Runc = request.getfixturevalue(engine)
    b = make_bundle(
        tmp_path / "b",
        base_rootfs,
        ["sh", "-c", "ls -l /dev/nvidia0; head -c0 /dev/nvidia0"],
        devices=[char_device("/dev/nvidia0", 195, 0)],
        device_rules=rules,
    )
    res = r.run(b, unique_id(engine))
    assert res.rc == 1, res.describe()
    assert "195,   0" in res.stdout
    assert f"head: /dev/nvidia0: {expected}" in res.stderr


def _host_libz() -> Path:
    lib = Path("/usr/lib/x86_64-linux-gnu/libz.so.1")
    if not lib.exists():
        pytest.skip("host has no libz.so.1 to use as a test library")
    return lib


def test_library_resolves_through_container_ld_so_cache(
    runc: Runc, glibc_rootfs: Path, tmp_path: Path
) -> None:
    """The ld probe shows a library found via the container's ld.so.cache only once it is cached."""
    libdir = glibc_rootfs / "usr/lib/x86_64-linux-gnu"
    shutil.copy2(_host_libz().resolve(), libdir / "libz.so.1.2.99")
    (libdir / "libz.so.1").symlink_to("libz.so.1.2.99")
    args = ["sh", "-c", "ldconfig -p; " + ld_probe_command("libz.so.1")]

    before = runc.run(make_bundle(tmp_path / "b1", glibc_rootfs, args), unique_id("ld")).check()
    uncached = parse_ld_probe(before.stdout, "libz.so.1")
    assert uncached.path == "/usr/lib/x86_64-linux-gnu/libz.so.1"
    assert not uncached.via_cache
    assert "(system search path)" in uncached.searches[-1]

    update_ld_cache(glibc_rootfs)
    after = runc.run(make_bundle(tmp_path / "b2", glibc_rootfs, args), unique_id("ld")).check()
    cached = parse_ld_probe(after.stdout, "libz.so.1")
    assert cached.path == "/usr/lib/x86_64-linux-gnu/libz.so.1"
    assert cached.via_cache, after.stdout
    assert "libz.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libz.so.1" in after.stdout


def test_ld_probe_reports_unloadable_library(
    runc: Runc, glibc_rootfs: Path, tmp_path: Path
) -> None:
    """A SONAME with no loadable file parses as path None, not as a resolution."""
    b = make_bundle(tmp_path / "b", glibc_rootfs, ld_probe_args("libcuda.so.1"))
    res = runc.run(b, unique_id("ld")).check()
    probe = parse_ld_probe(res.stdout, "libcuda.so.1")
    assert probe.path is None
    assert not probe.via_cache
    assert "cannot be preloaded" in res.stdout


def test_ctr_run_returns_container_output(
    containerd: Containerd, rootfs: Path, data_dir: Path
) -> None:
    """ctr run (private containerd) returns the container's output, env, mounts and exit status."""
    res = containerd.ctr_run(
        rootfs,
        unique_id("ctr"),
        ["sh", "-c", SEES + "; exit 7", "ctr"],
        env={"FOO": "bar"},
        mounts=[(data_dir, "/data")],
    )
    assert res.rc == 7, res.describe()
    assert "hello-from-ctr\n0\nFOO=bar\n" in res.stdout
    assert "marker.txt" in res.stdout


def test_ctr_shows_runtime_error_from_log_json(
    containerd: Containerd, rootfs: Path, tmp_path: Path
) -> None:
    """A failing runtime's --log JSON error line is what ctr reports (its stderr is lost)."""
    fail = make_failing_runtime(
        tmp_path / "fail-runtime", "nvshim-e2e: injected failure via log.json", to_stderr=True
    )
    res = containerd.ctr_run(rootfs, unique_id("ctrfail"), ["true"], runc_binary=fail)
    assert res.rc != 0
    assert "OCI runtime create failed: nvshim-e2e: injected failure via log.json" in res.stderr


def test_podman_run_returns_container_output(podman: Podman, rootfs: Path, data_dir: Path) -> None:
    """podman run --rootfs (private storage) returns the container's output, env and mounts."""
    res = podman.podman_run(
        rootfs, ["sh", "-c", SEES, "podman"], env={"FOO": "bar"}, mounts=[(data_dir, "/data")]
    )
    res.check()
    assert "hello-from-podman\n0\nFOO=bar\n" in res.stdout
    assert "marker.txt" in res.stdout


def test_podman_consumes_installed_cdi_spec(
    podman: Podman, rootfs: Path, fake_nvidia0: Path
) -> None:
    """A spec installed with installed_cdi_spec is used by podman --device and removed afterwards."""
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvshim-e2e.example.com/gpu",
        "devices": [
            {
                "name": "0",
                "containerEdits": {
                    "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": str(fake_nvidia0)}]
                },
            }
        ],
        "containerEdits": {"env": ["FROM_CDI=yes"]},
    }
    name = f"{unique_id('harness')}.yaml"
    with installed_cdi_spec(yaml.safe_dump(spec), name) as path:
        assert path == CDI_DIR / name
        with pytest.raises(AssertionError, match="refusing to overwrite"):
            with installed_cdi_spec("{}", name):
                pass
        res = podman.podman_run(
            rootfs,
            ["sh", "-c", "echo FROM_CDI=$FROM_CDI; head -c0 /dev/nvidia0"],
            devices=["nvshim-e2e.example.com/gpu=0"],
        )
    assert not (CDI_DIR / name).exists()
    assert "FROM_CDI=yes" in res.stdout, res.describe()
    assert "No such device or address" in res.stderr, res.describe()


def test_nvshim_config_env_points_at_written_yaml(tmp_path: Path, crunw: Path) -> None:
    """nvshim_config_env writes the settings as YAML and sets NVSHIM_CONFIG to that file."""
    env = nvshim_config_env(tmp_path / "cfg", {"runtimes": [crunw], "debug-log": "/tmp/x.log"})
    assert yaml.safe_load(Path(env["NVSHIM_CONFIG"]).read_text()) == {
        "runtimes": [str(crunw)],
        "debug-log": "/tmp/x.log",
        "grants-journal": str(tmp_path / "cfg" / "grants.jsonl"),
    }  # never the node's journal
    assert env["PATH"] == os.environ["PATH"]


def _cgroup_dirs(name: str) -> list:
    return sorted(str(p) for p in Path("/sys/fs/cgroup").glob(f"*/{name.strip('/')}"))


def test_containerd_stop_leaves_no_process_or_cgroup(rootfs: Path, tmp_path: Path) -> None:
    """A private containerd that ran a container leaves no daemon, shim or cgroup after stop()."""
    require_root()
    require_binary("containerd")
    daemon = Containerd(tmp_path / "ctrd")
    try:
        daemon.start()
        assert daemon.ctr_run(rootfs, unique_id("leak"), ["true"]).check().rc == 0
        assert _cgroup_dirs(daemon.namespace)
    finally:
        daemon.stop()
    assert daemon.pid is not None and not Path(f"/proc/{daemon.pid}").exists()
    assert pids_with_arg(daemon.address) == []
    assert _cgroup_dirs(daemon.namespace) == []
    assert list(daemon.runc_root.rglob("*")) in ([], [daemon.runc_root / daemon.namespace])


def test_podman_cleanup_leaves_no_process_or_cgroup(rootfs: Path, tmp_path: Path) -> None:
    """A private podman that ran a container leaves no conmon and no cgroup after cleanup()."""
    require_root()
    require_binary("podman")
    p = Podman(tmp_path / "podman")
    try:
        p.podman_run(rootfs, ["true"]).check()
    finally:
        p.cleanup()
    assert pids_with_arg(str(p.base / "root")) == []
    assert _cgroup_dirs(p.cgroup_parent) == []


def test_env_wrapper_carries_env_to_runtime_under_containerd(
    containerd: Containerd, rootfs: Path, tmp_path: Path
) -> None:
    """make_env_wrapper gets NVSHIM_CONFIG to the runtime, which containerd starts with its own env."""
    seen = tmp_path / "seen-config"
    spy = tmp_path / "spy-runtime"
    spy.write_text(
        f'#!/bin/sh\necho "$NVSHIM_CONFIG" >> {seen}\nexec {shutil.which("runc")} "$@"\n'
    )
    spy.chmod(0o755)
    wrapper = make_env_wrapper(tmp_path / "wrapped", spy, {"NVSHIM_CONFIG": "/x/it's.yaml"})
    containerd.ctr_run(rootfs, unique_id("envw"), ["true"], runc_binary=wrapper).check()
    assert set(seen.read_text().splitlines()) == {"/x/it's.yaml"}


def test_podman_image_commands_leave_nothing_in_var_lib_containers(
    podman: Podman, base_rootfs: Path, tmp_path: Path
) -> None:
    """podman import and save through the helper (image copies, which write containers/image's
    blob info cache for root whatever --root says) change nothing under /var/lib/containers."""
    from tests.helpers.hostguard import snapshot

    tar = tmp_path / "rootfs.tar"
    shutil.make_archive(str(tar)[:-4], "tar", base_rootfs)
    before = snapshot("/")
    name = f"localhost/nvshim-harness/{unique_id('img')}:1"
    podman.podman("import", str(tar), name).check()
    podman.podman(
        "save", "--format", "docker-archive", "-o", str(tmp_path / "out.tar"), name
    ).check()
    podman.podman("rmi", name).check()
    assert (tmp_path / "out.tar").stat().st_size > 0
    assert [p for p in sorted(snapshot("/") - before) if "/var/lib/containers" in p] == []
