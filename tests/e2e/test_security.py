"""Security regressions of the classes the NVIDIA toolkit had CVEs for, through runc.

Each test says in its docstring what a naive implementation does and why the test would
fail on it. The hostile input is always the image (rootfs content, image env); the host
side is a simulated node and files the test owns, compared byte for byte before/after.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, Tuple

import pytest

from nvshim.node.compile import compile_node
from tests.helpers.bundle import make_bundle, read_config
from tests.helpers.common import require_root, unique_id
from tests.helpers.node import make_mount_targets, read_only_bind, rootwork_by, write_nvshim_config

pytestmark = pytest.mark.e2e

LIBDIR = "usr/lib/x86_64-linux-gnu"
VERSIONED = "libcuda.so.550.54.15"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A simulated 2-GPU node."""
    require_root()
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("sim") / "node"), gpus=2)


@pytest.fixture
def env(node, tmp_path):
    """nvshim-runtime's environment: config for the simulated node, runc below, a debug log."""
    cfg = write_nvshim_config(
        tmp_path / "cfg",
        {"driver-root": node.root, "runtimes": ["runc"], "debug-log": str(tmp_path / "debug.log")},
    )
    compile_node(str(cfg))
    return {"NVSHIM_CONFIG": str(cfg), "PATH": PATH}


@contextlib.contextmanager
def work_by(by: str, bundle: Path, env: Dict[str, str]) -> Iterator[None]:
    """Make the in-root work of a create of ``bundle`` go to ``by``: ``runtime`` (before
    runc; the bundle's /tmp tmpfs is dropped so that image symlinks into /tmp are not hidden
    under it) or ``hook`` (the rootfs is a read-only bind mount, which the runtime cannot
    write; the driver files' mount targets are made first, as runc cannot create them in a
    read-only rootfs either)."""
    if by == "runtime":
        path = bundle / "config.json"
        spec = json.loads(path.read_text())
        spec["mounts"] = [m for m in spec["mounts"] if m["destination"] != "/tmp"]
        path.write_text(json.dumps(spec, indent="\t"))
        yield
    else:
        make_mount_targets(bundle, env)
        with read_only_bind(bundle / "rootfs"):
            yield


def snapshot(top: Path) -> Dict[str, Tuple[str, bytes]]:
    """path → (kind, content or link target) for everything under ``top`` (no symlinks followed)."""
    out: Dict[str, Tuple[str, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                out[p] = ("link", os.readlink(p).encode())
            elif os.path.isdir(p):
                out[p] = ("dir", oct(os.lstat(p).st_mode).encode())
            else:
                out[p] = ("file", Path(p).read_bytes())
    return out


# --------------------------------------------------------------------- CVE-2025-23266 class

_EVIL_PY = "open({marker!r} + '/{name}', 'w').write('ran')\n"
_EVIL_C = r"""
#include <stdio.h>
__attribute__((constructor)) static void evil(void) {
    FILE *f = fopen("%s/ld_preload", "w");
    if (f) { fputs("ran", f); fclose(f); }
}
"""


def plant_payloads(rootfs: Path, markers: Path, tmp_path: Path) -> Dict[str, str]:
    """Put Python and (with gcc) LD_PRELOAD payloads in the rootfs root; return the image env
    that would activate them in a process whose cwd is the rootfs."""
    (rootfs / "pp" / "nvshim").mkdir(parents=True)
    (rootfs / "nvshim").mkdir()
    payloads = {
        "evil.py": "pythonstartup",
        "pp/sitecustomize.py": "pythonpath_sitecustomize",
        "pp/usercustomize.py": "pythonpath_usercustomize",
        "pp/nvshim/__init__.py": "pythonpath_nvshim",
        "nvshim/__init__.py": "cwd_nvshim",
    }
    for rel, name in payloads.items():
        (rootfs / rel).write_text(_EVIL_PY.format(marker=str(markers), name=name))
    env = {
        "PYTHONSTARTUP": "/proc/self/cwd/evil.py",
        "PYTHONPATH": "/proc/self/cwd/pp",
        "PYTHONINSPECT": "1",
    }
    if shutil.which("gcc"):
        src = tmp_path / "evil.c"
        src.write_text(_EVIL_C % markers)
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-o", str(rootfs / "evil.so"), str(src)], check=True
        )
        env["LD_PRELOAD"] = "/proc/self/cwd/evil.so"
    return env


@pytest.mark.parametrize("by", ["runtime", "hook"])
def test_image_env_cannot_run_code_in_the_hook(
    runc, node, rootfs, tmp_path, nvshim_runtime_bin, env, by
):
    """CVE-2025-23266 (NVIDIAScape): image env LD_PRELOAD/PYTHONPATH/PYTHONSTARTUP pointing at
    /proc/self/cwd/... must not run in the hook, which runs as host root with cwd = rootfs,
    nor in the runtime when it does the in-root work itself before runc.

    A naive hook entry without ``env`` inherits the container's environment (LD_PRELOAD runs
    the image's .so, PYTHONPATH imports the image's sitecustomize/nvshim); one without ``-I``
    puts cwd (the rootfs) first on sys.path, so the rootfs's ``nvshim/`` shadows ours. Each
    payload writes a marker into a host directory (visible to the hook before pivot_root);
    a control run of the same interpreter without those protections proves they fire.
    """
    markers = tmp_path / "markers"
    markers.mkdir()
    image_env = plant_payloads(rootfs, markers, tmp_path)

    # Control: the payloads fire in a naive invocation (inherited env, cwd first on sys.path).
    subprocess.run(
        [sys.executable, "-c", "import nvshim"],
        cwd=rootfs,
        env={"PATH": PATH, **image_env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
    )
    fired = {p.name for p in markers.iterdir()}
    assert {"pythonpath_sitecustomize", "cwd_nvshim"} <= fired, fired
    if "LD_PRELOAD" in image_env:
        assert "ld_preload" in fired
    for p in markers.iterdir():
        p.unlink()

    script = f"readlink /{LIBDIR}/libcuda.so.1"
    bundle = make_bundle(
        tmp_path / "b",
        rootfs,
        ["sh", "-c", script],
        env={"NVIDIA_VISIBLE_DEVICES": "0", **image_env},
    )
    with work_by(by, bundle, env):
        res = runc.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
    assert res.stdout.strip() == VERSIONED, res.describe()  # the links were made
    assert rootwork_by(tmp_path / "debug.log") == [by]
    assert sorted(p.name for p in markers.iterdir()) == []


# ------------------------------------------------------- CVE-2024-0132 / CVE-2025-23267 class


def _host_target(tmp_path: Path) -> Path:
    host = tmp_path / "host-target"
    host.mkdir()
    (host / "libc.so.6").write_bytes(b"host file: must not change\n")
    (host / "ld.so.cache").write_bytes(b"host cache: must not change\n")
    (host / "x86_64-linux-gnu.conf").write_text("/host/only\n")
    (host / "sub").mkdir()
    (host / "sub" / "keep").write_text("keep\n")
    return host


def _symlink_libdir(rootfs: Path, host: Path) -> None:
    shutil.rmtree(rootfs / LIBDIR)
    os.symlink(str(host), rootfs / LIBDIR)


def _symlink_confdir(rootfs: Path, host: Path) -> None:
    shutil.rmtree(rootfs / "etc" / "ld.so.conf.d")
    os.symlink(str(host), rootfs / "etc" / "ld.so.conf.d")


def _symlink_soname(rootfs: Path, host: Path) -> None:
    os.symlink(str(host / "libc.so.6"), rootfs / LIBDIR / "libcuda.so.1")


def _symlink_ldcache(rootfs: Path, host: Path) -> None:
    (rootfs / "etc" / "ld.so.cache").unlink()
    os.symlink(str(host / "ld.so.cache"), rootfs / "etc" / "ld.so.cache")


def _symlink_ldcache_relative(rootfs: Path, host: Path) -> None:
    (rootfs / "etc" / "ld.so.cache").unlink()
    depth = len(rootfs.parts) + 3
    os.symlink(
        "../" * depth + str(host / "ld.so.cache").lstrip("/"), rootfs / "etc" / "ld.so.cache"
    )


@pytest.mark.parametrize("by", ["runtime", "hook"])
@pytest.mark.parametrize(
    "plant",
    [
        _symlink_libdir,
        _symlink_confdir,
        _symlink_soname,
        _symlink_ldcache,
        _symlink_ldcache_relative,
    ],
    ids=[
        "libdir->host",
        "ld.so.conf.d->host",
        "soname->host-file",
        "ld.so.cache->host-file",
        "ld.so.cache->../../host-file",
    ],
)
def test_image_symlinks_cannot_reach_host_files(
    runc, glibc_rootfs, tmp_path, nvshim_runtime_bin, env, plant, by
):
    """CVE-2024-0132 / CVE-2025-23267: image symlinks pointing out of the rootfs (library dir,
    ld.so.conf.d, the SONAME link, ld.so.cache) must be resolved inside the rootfs, by the
    runtime's writes before runc as by the hook's.

    A naive hook joins rootfs + path and follows symlinks with the host's view (or runs the
    host's ldconfig -r over them), so it writes the SONAME link, the conf drop-in or the new
    cache into the host directory/file the image pointed at. The host target is compared byte
    for byte; the container must start (the links resolve as if chrooted) with no traceback.
    """
    host = _host_target(tmp_path)
    before = snapshot(host)
    plant(glibc_rootfs, host)
    bundle = make_bundle(
        tmp_path / "b",
        glibc_rootfs,
        ["sh", "-c", f"readlink /{LIBDIR}/libcuda.so.1"],
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
    )
    with work_by(by, bundle, env):
        res = runc.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env)
    assert snapshot(host) == before
    assert "Traceback" not in res.stderr + res.stdout
    assert res.rc == 0, res.describe()
    assert res.stdout.strip() == VERSIONED, res.describe()
    assert rootwork_by(tmp_path / "debug.log") == [by]


# ------------------------------------------------------------------- CVE-2024-0133 class

_WATCH = ("/tmp", "/etc", "/run", "/var/run", "/dev", "/usr/lib/x86_64-linux-gnu", "/usr/bin")


def _host_listing(skip: Tuple[str, ...]) -> set:
    seen = set()
    for top in _WATCH:
        for dirpath, dirnames, filenames in os.walk(top):
            if dirpath.startswith(skip) or dirpath.startswith("/tmp/pytest-of-"):
                dirnames[:] = []
                continue
            dirnames[:] = [d for d in dirnames if not os.path.join(dirpath, d).startswith(skip)]
            for name in dirnames + filenames:
                seen.add(os.path.join(dirpath, name))
    return seen


@pytest.mark.parametrize("by", ["runtime", "hook"])
def test_no_file_is_created_on_the_host(
    runc, node, glibc_rootfs, tmp_path, nvshim_runtime_bin, env, by
):
    """CVE-2024-0133: a create/start/delete with GPUs leaves no new file on the host outside
    the bundle and the debug log.

    A naive implementation creates mount targets or the hook's files (SONAME links,
    ld.so.conf.d drop-in, ld.so.cache temp files) at host paths instead of inside the
    rootfs, or leaves temp files next to config.json's directory's siblings. Other engineers
    may run tests concurrently, so a new path counts when its name is one nvshim would create
    (a driver file, device node, hook output) or carries the container id.
    """
    cid = unique_id()
    bundle = make_bundle(
        tmp_path / "b",
        glibc_rootfs,
        ["true"],
        env={"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "all"},
    )
    skip = (str(tmp_path), str(node.root))
    before = _host_listing(skip)
    with work_by(by, bundle, env):
        res = runc.run_detached(bundle, cid, runtime=nvshim_runtime_bin, env=env).check()
    new = _host_listing(skip) - before
    assert rootwork_by(tmp_path / "debug.log") == [by]
    spec = read_config(bundle)
    names = {m["destination"].rsplit("/", 1)[1] for m in spec.get("mounts", [])}
    names |= {d["path"].rsplit("/", 1)[1] for d in spec["linux"].get("devices", [])}
    names |= {
        "libcuda.so.1",
        "libcuda.so",
        "libnvidia-ml.so.1",
        "ld.so.cache",
        "ld.so.conf",
        "00-nvshim.conf",
        "config.json",
    }
    suspicious = sorted(
        p
        for p in new
        if os.path.basename(p) in names or cid in p or "nvshim" in os.path.basename(p)
    )
    assert suspicious == [], (suspicious, res.describe())
    assert (tmp_path / "debug.log").exists()  # the debug log was the one expected write


# ------------------------------------------------------------------------ read-only files


def test_injected_files_are_read_only(runc, node, glibc_rootfs, tmp_path, nvshim_runtime_bin, env):
    """Injected libraries and binaries are read-only bind mounts even in a writable rootfs.

    A naive rbind without ``ro`` lets root in the container rewrite the host's libcuda and
    nvidia-smi; the write must fail and the host files must keep their bytes.
    """
    lib = Path(node.root, LIBDIR, VERSIONED)
    smi = Path(node.root, "usr/bin/nvidia-smi")
    before = (lib.read_bytes(), smi.read_bytes())
    script = (
        f"(echo x >> /{LIBDIR}/{VERSIONED}) 2>/dev/null && echo LIB-WRITTEN || echo LIB-RO; "
        "(echo x >> /usr/bin/nvidia-smi) 2>/dev/null && echo SMI-WRITTEN || echo SMI-RO; "
        "(echo x > /usr/bin/probe-writable) 2>/dev/null && echo ROOT-RW || echo ROOT-RO"
    )
    bundle = make_bundle(
        tmp_path / "b",
        glibc_rootfs,
        ["sh", "-c", script],
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
        readonly_root=False,
    )
    res = runc.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
    assert res.stdout.split() == ["LIB-RO", "SMI-RO", "ROOT-RW"], res.describe()
    assert (lib.read_bytes(), smi.read_bytes()) == before


# ----------------------------------------------------------------------------- hook entry


def test_hook_entry_has_explicit_env_and_isolated_interpreter(
    runc, rootfs, tmp_path, nvshim_runtime_bin, env
):
    """The createContainer hook entry names an absolute interpreter started with -I and carries
    its own env, with nothing from the image's environment.

    A naive entry (``path: python`` or ``nvshim-hook`` from PATH, no ``env``) is what made
    CVE-2025-23266 possible; this pins the shape in the config.json runc actually reads.
    """
    bundle = make_bundle(
        tmp_path / "b",
        rootfs,
        ["true"],
        env={"NVIDIA_VISIBLE_DEVICES": "0", "LD_PRELOAD": "/x.so", "PYTHONPATH": "/pp"},
    )
    cid = unique_id()
    with work_by("hook", bundle, env):  # a rootfs the runtime cannot write: the hook is added
        runc.create(bundle, cid, runtime=nvshim_runtime_bin, env=env).check()
    try:
        hooks = read_config(bundle).get("hooks", {}).get("createContainer", [])
        ours = [h for h in hooks if any("nvshim.hook" in a for a in h.get("args", []))]
        assert len(ours) == 1, hooks
        hook = ours[0]
        assert os.path.isabs(hook["path"]) and os.access(hook["path"], os.X_OK)
        assert hook["args"][:4] == [hook["path"], "-I", "-S", "-c"]
        assert "from nvshim.hook import main" in hook["args"][4]
        assert isinstance(hook.get("env"), list) and hook["env"], hook
        names = {e.split("=", 1)[0] for e in hook["env"]}
        assert not names & {"LD_PRELOAD", "LD_LIBRARY_PATH", "NVIDIA_VISIBLE_DEVICES"}
        assert not any(n.startswith("PYTHON") for n in names), hook["env"]
    finally:
        runc.delete(cid, force=True, runtime=nvshim_runtime_bin, env=env)
