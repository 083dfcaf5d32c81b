"""Who makes the SONAME links and the ld.so.cache: nvshim-runtime before runc, or the hook.

The runtime does the in-root work itself when it can write the container's rootfs (the
common case: one Python process per create, no createContainer hook); it falls back to
the hook for a rootfs it cannot write. Each test asserts what the container's own loader
sees and which way the work went (``nvshim inspect`` and the debug log say it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from nvshim.node.compile import compile_node
from tests.helpers.bundle import ld_probe_command, make_bundle, parse_ld_probe, read_config
from tests.helpers.common import require_root, unique_id
from tests.helpers.node import make_mount_targets, read_only_bind, rootwork_by, write_nvshim_config

pytestmark = pytest.mark.e2e

LIBDIR = "/usr/lib/x86_64-linux-gnu"
VERSIONED = "libcuda.so.550.54.15"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PROBE = f"readlink {LIBDIR}/libcuda.so.1; {ld_probe_command('libcuda.so.1')}"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A simulated 2-GPU node."""
    require_root()
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("sim") / "node"), gpus=2)


def config_env(node, tmp_path: Path, runtime: str = "runc") -> dict:
    """nvshim-runtime's environment: the simulated node, ``runtime`` below, a debug log."""
    cfg = write_nvshim_config(
        tmp_path / "cfg",
        {
            "driver-root": node.root,
            "runtimes": [runtime],
            "debug-log": str(tmp_path / "debug.log"),
        },
    )
    compile_node(str(cfg))
    return {"NVSHIM_CONFIG": str(cfg), "PATH": PATH}


def nvshim_hooks(bundle: Path) -> list:
    hooks = read_config(bundle).get("hooks", {}).get("createContainer", [])
    return [h for h in hooks if any("nvshim.hook" in a for a in h.get("args", []))]


def inspect_work(nvshim_bin: str, bundle: Path, env: dict) -> dict:
    out = subprocess.run(
        [nvshim_bin, "inspect", "--bundle", str(bundle), "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)["rootfs_work"]


def check_loader_sees_libcuda(res) -> None:
    """The container's readlink and its loader (through its own ld.so.cache) find libcuda."""
    first, _, rest = res.stdout.partition("\n")
    assert first == VERSIONED, res.describe()
    probe = parse_ld_probe(rest, "libcuda.so.1")
    assert probe.path == f"{LIBDIR}/libcuda.so.1" and probe.via_cache, res.describe()


@pytest.fixture(params=["runc", "crun"])
def engine(request, crunw):
    """(driver, low-level runtime for nvshim's config) for runc and for crun."""
    if request.param == "runc":
        return request.getfixturevalue("runc"), "runc"
    return request.getfixturevalue("crun"), str(crunw)


def test_runtime_does_the_work_before_runc_and_adds_no_hook(
    engine, node, glibc_rootfs, tmp_path, nvshim_runtime_bin, nvshim_bin
):
    """A writable rootfs (crun with a read-only root included) gets the links and the cache
    from the runtime itself: config.json has no nvshim hook, and the container's loader
    finds libcuda.so.1 through its own ld.so.cache."""
    driver, low = engine
    env = config_env(node, tmp_path, low)
    bundle = make_bundle(
        tmp_path / "b",
        glibc_rootfs,
        ["sh", "-c", PROBE],
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
        readonly_root=True,
    )
    assert inspect_work(nvshim_bin, bundle, env)["by"] == "runtime"
    text = subprocess.run(
        [nvshim_bin, "inspect", "--bundle", str(bundle)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "in-root work:  by nvshim-runtime before runc" in text, text
    assert "node plan:     cache " in text, text  # written by config compile
    res = driver.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
    check_loader_sees_libcuda(res)
    assert nvshim_hooks(bundle) == []
    assert rootwork_by(tmp_path / "debug.log") == ["runtime"]
    assert os.readlink(bundle / "rootfs" / LIBDIR.lstrip("/") / "libcuda.so.1") == VERSIONED


def test_read_only_rootfs_falls_back_to_the_hook(
    engine, node, glibc_rootfs, tmp_path, nvshim_runtime_bin, nvshim_bin
):
    """A rootfs on a read-only mount cannot be written by the runtime: the createContainer
    hook is added (inspect and the debug log say so) and the container still resolves
    libcuda.so.1 through its ld.so.cache."""
    driver, low = engine
    env = config_env(node, tmp_path, low)
    bundle = make_bundle(
        tmp_path / "b", glibc_rootfs, ["sh", "-c", PROBE], env={"NVIDIA_VISIBLE_DEVICES": "0"}
    )
    make_mount_targets(bundle, env)  # runc cannot create them in a read-only rootfs either
    with read_only_bind(bundle / "rootfs"):
        work = inspect_work(nvshim_bin, bundle, env)
        assert work["by"] == "hook" and "read-only" in work["detail"], work
        res = driver.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
    check_loader_sees_libcuda(res)
    assert len(nvshim_hooks(bundle)) == 1
    assert rootwork_by(tmp_path / "debug.log") == ["hook"]


def test_mount_over_the_library_dir_sends_the_work_to_the_hook(
    runc, node, glibc_rootfs, tmp_path, nvshim_runtime_bin
):
    """A config.json mount over the library directory would hide links written before runc:
    the hook makes them after the mounts, and the container sees them."""
    env = config_env(node, tmp_path)
    mount = {"destination": LIBDIR, "type": "tmpfs", "source": "tmpfs", "options": ["mode=755"]}
    bundle = make_bundle(
        tmp_path / "b",
        glibc_rootfs,
        ["sh", "-c", f"readlink {LIBDIR}/libcuda.so.1"],
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
        mounts=[mount],
    )
    res = runc.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
    assert res.stdout.strip() == VERSIONED, res.describe()
    assert rootwork_by(tmp_path / "debug.log") == ["hook"]
    assert not os.path.lexists(bundle / "rootfs" / LIBDIR.lstrip("/") / "libcuda.so.1")


# ---------------------------------------------------------------- the runtime alone (no runc)


def create_only(
    nvshim_runtime_bin: str, bundle: str, env: dict, cwd: Path, log: Path = None
) -> subprocess.CompletedProcess:
    """``nvshim-runtime create`` with a no-op low-level runtime (config ``runtimes: [/bin/true]``)."""
    argv = [nvshim_runtime_bin]
    if log is not None:
        argv += ["--log", str(log), "--log-format", "json"]
    argv += ["create", "--bundle", bundle, unique_id()]
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_relative_root_path_is_joined_to_the_bundle_not_the_cwd(
    node, rootfs, tmp_path, nvshim_runtime_bin
):
    """``root.path`` "rootfs" means <bundle>/rootfs whatever the runtime's cwd is (runc's rule),
    also for a relative --bundle: a decoy rootfs in the cwd is never written."""
    env = config_env(node, tmp_path, "/bin/true")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "rootfs" / "etc").mkdir(parents=True)
    for bundle_arg, cwd in ((str(tmp_path / "b1"), elsewhere), ("b2", tmp_path)):
        bundle = make_bundle(
            tmp_path / Path(bundle_arg).name, rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "0"}
        )
        assert read_config(bundle)["root"]["path"] == "rootfs"
        res = create_only(nvshim_runtime_bin, bundle_arg, env, cwd)
        assert res.returncode == 0, res.stderr
        assert os.readlink(bundle / "rootfs" / LIBDIR.lstrip("/") / "libcuda.so.1") == VERSIONED
        assert (bundle / "rootfs" / "etc" / "ld.so.cache").exists()
    assert sorted(p.name for p in (elsewhere / "rootfs").rglob("*")) == ["etc"]
    assert rootwork_by(tmp_path / "debug.log") == ["runtime", "runtime"]


def test_rootfs_that_is_a_symlink_is_not_written_through(
    node, rootfs, tmp_path, nvshim_runtime_bin
):
    """A bundle whose rootfs is a symlink (runc refuses to run one) gets nothing written through
    it by the runtime: the work is left to the hook, and the directory it points at is unchanged."""
    env = config_env(node, tmp_path, "/bin/true")
    bundle = make_bundle(tmp_path / "b", rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "0"})
    real = tmp_path / "real-rootfs"
    shutil.move(str(bundle / "rootfs"), real)
    os.symlink(real, bundle / "rootfs")
    before = sorted(str(p) for p in real.rglob("*"))
    res = create_only(nvshim_runtime_bin, str(bundle), env, tmp_path)
    assert res.returncode == 0, res.stderr
    assert sorted(str(p) for p in real.rglob("*")) == before
    assert len(nvshim_hooks(bundle)) == 1
    assert rootwork_by(tmp_path / "debug.log") == ["hook"]


def test_full_rootfs_is_one_clear_error_and_config_json_is_untouched(
    node, rootfs, tmp_path, nvshim_runtime_bin
):
    """ENOSPC while writing in the rootfs (a small tmpfs, filled up): create fails with one
    line naming the full rootfs, on stderr and in runc's --log, and config.json keeps its bytes
    (the hook would hit the same full filesystem, so there is no fallback)."""
    env = config_env(node, tmp_path, "/bin/true")
    bundle = tmp_path / "b"
    (bundle / "rootfs").mkdir(parents=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(bundle / "rootfs")], check=True
    )
    try:
        shutil.copytree(rootfs, bundle / "rootfs", symlinks=True, dirs_exist_ok=True)
        make_bundle(bundle, bundle / "rootfs", ["true"], env={"NVIDIA_VISIBLE_DEVICES": "0"})
        with open(bundle / "rootfs" / "filler", "wb") as fh:
            try:
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
            except OSError as exc:
                assert exc.errno == 28  # ENOSPC: the rootfs is full
        before = (bundle / "config.json").read_bytes()
        log = tmp_path / "runc-log.json"
        res = create_only(nvshim_runtime_bin, str(bundle), env, tmp_path, log=log)
        assert res.returncode == 1
        lines = res.stderr.splitlines()
        assert len(lines) == 1 and "full" in lines[0] and "no space left" in lines[0], res.stderr
        assert "Traceback" not in res.stderr
        assert json.loads(log.read_text().splitlines()[-1])["msg"] == lines[0]
        assert (bundle / "config.json").read_bytes() == before
    finally:
        subprocess.run(["umount", "-l", str(bundle / "rootfs")], check=False)


_HOST_ROOT_SCRIPT = r"""
set -u
for d in $DIRS; do
  n=$(echo "$d" | tr / _)
  mkdir -p "$OV/$n-up" "$OV/$n-work"
  mount -t overlay overlay -o "lowerdir=$d,upperdir=$OV/$n-up,workdir=$OV/$n-work" "$d" || exit 99
done
"$RUNTIME" --root "$OV/runc-root" run --bundle "$BUNDLE" "$ID" > "$OV/run.out" 2>&1
echo "$?" > "$OV/run.rc"
runc --root "$OV/runc-root" delete -f "$ID" > /dev/null 2>&1
printf '{"ociVersion": "1.0.2", "id": "x", "status": "creating", "pid": 1, "bundle": "%s", "root": "/"}' \
  "$BUNDLE" | "$PYTHON" -I -m nvshim.hook --link libcuda.so.550.54.15::"$LIBDIR"/libcuda.so.1 \
  --folder "$LIBDIR" > "$OV/hook.out" 2>&1
echo "$?" > "$OV/hook.rc"
"""
#: The host folders a GPU create's mount targets and in-root work would land in, were the
#: container's rootfs the host's / (each an overlay in the test's private mount namespace).
_HOST_DIRS = ("/etc", LIBDIR, "/usr/bin", "/usr/sbin", "/usr/lib/firmware", "/lib/firmware")


def _host_root_refusal(root_path: str, bundle: Path) -> str:
    return (
        f"nvshim: the container's rootfs {root_path} is the host's /: nvshim injects no "
        f"driver files into the host (bundle {bundle})"
    )


def test_rootfs_that_is_the_host_root_is_refused_and_never_written(
    node, rootfs, tmp_path, nvshim_runtime_bin, nvshim_bin
):
    """root.path "/" (or a symlink to it) with a GPU request: runc makes every mount target (empty
    files in the host's /usr/bin, library folder, /lib/firmware) and runs createContainer hooks
    before its pivot_root fails on such a root, and --no-pivot starts the container there. So
    the create fails in one line naming the rootfs (inspect says the same), config.json keeps
    its bytes, runc never runs, nothing at all appears in the host's folders, and the hook
    given such a root warns and leaves it alone. (Those folders are overlay mounts in a
    private mount namespace here, so a regression writes the overlay.)"""
    import sys

    require_root()
    env = config_env(node, tmp_path)
    bundle = make_bundle(tmp_path / "b", rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "0"})
    spec = read_config(bundle)
    spec["root"] = {"path": "/"}
    spec["mounts"] = [m for m in spec["mounts"] if m["destination"] == "/proc"]
    (tmp_path / "root-link").symlink_to("/")
    for root_path in ("/", str(tmp_path / "root-link")):
        spec["root"]["path"] = root_path
        (bundle / "config.json").write_text(json.dumps(spec, indent="\t"))
        shown = subprocess.run(
            [nvshim_bin, "inspect", "--bundle", str(bundle), "--format", "json"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert shown.returncode == 1, shown.stdout
        assert shown.stderr.splitlines() == [_host_root_refusal(root_path, bundle)]
    spec["root"]["path"] = "/"  # runc refuses a symlink before any hook; "/" it runs them for
    (bundle / "config.json").write_text(json.dumps(spec, indent="\t"))
    before = (bundle / "config.json").read_bytes()
    overlay = tmp_path / "ov"
    overlay.mkdir()
    dirs = list(dict.fromkeys(os.path.realpath(d) for d in _HOST_DIRS if os.path.isdir(d)))
    res = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", _HOST_ROOT_SCRIPT],
        env={
            **env,
            "OV": str(overlay),
            "LIBDIR": LIBDIR,
            "RUNTIME": nvshim_runtime_bin,
            "BUNDLE": str(bundle),
            "ID": unique_id(),
            "PYTHON": sys.executable,
            "DIRS": " ".join(dirs),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    if res.returncode == 99:
        pytest.skip(f"cannot mount an overlay over the host's folders here: {res.stderr.strip()}")
    assert res.returncode == 0, res.stdout + res.stderr
    assert (overlay / "run.rc").read_text().strip() == "1"
    assert (overlay / "run.out").read_text().splitlines() == [_host_root_refusal("/", bundle)]
    assert (bundle / "config.json").read_bytes() == before
    assert (overlay / "hook.rc").read_text().strip() == "0"
    assert (overlay / "hook.out").read_text() == (
        "nvshim hook: warning: the container rootfs / is the host's /: nothing is written in it\n"
    )
    created = {
        d: sorted(p.name for p in (overlay / f"{d.replace('/', '_')}-up").iterdir()) for d in dirs
    }
    assert created == {d: [] for d in dirs}
