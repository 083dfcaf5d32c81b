"""The self-contained runtime: a payload installed with ``install.sh --from`` runs GPU
containers on a host whose own Python is gone, and names only paths under its prefix.

The payload is built once per source state (:mod:`tests.helpers.payload`); each test
installs it into its own temporary prefix. Inside a private mount namespace the host's
python3.11, its standard library and the dev venv (/opt/nvshim) are hidden, so anything
that still needed them fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, Tuple

import pytest

from tests.helpers.bundle import make_bundle
from tests.helpers.common import require_binary, require_root, unique_id
from tests.helpers.node import write_nvshim_config
from tests.helpers.payload import payload_dir

pytestmark = pytest.mark.e2e

LIBDIR = "/usr/lib/x86_64-linux-gnu"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Hide the host's Python (and the dev install) for the rest of the script: private mount
# namespace only. A bind mount over /usr/bin/python3.11 leaves a character device there.
HIDE_PYTHON = r"""
set -e
for exe in /usr/bin/python3.*; do
    case $exe in *-config) continue ;; esac
    [ -f "$exe" ] && mount --bind /dev/null "$exe"
done
for dir in /usr/lib/python3 /usr/lib/python3.* /usr/local/lib/python3.* /opt/nvshim; do
    [ -d "$dir" ] && mount -t tmpfs tmpfs "$dir"
done
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
if python3 -c pass 2>/dev/null; then echo "python3 still runs"; exit 1; fi
"""


@pytest.fixture(scope="module")
def payload() -> Path:
    """This checkout's payload (cached build)."""
    require_root()
    return payload_dir()


def moved_env(t: Path) -> Dict[str, str]:
    """install.sh's paths moved under ``t`` (nothing of the host's is written)."""
    return dict(
        os.environ,
        NVSHIM_PREFIX=str(t / "opt" / "nvshim"),
        NVSHIM_BINDIR=str(t / "bin"),
        NVSHIM_ETCDIR=str(t / "etc" / "nvshim"),
        NVSHIM_SKIP_APT="1",
        NVSHIM_CONTAINERD_CONFIG=str(t / "etc" / "containerd" / "config.toml"),
        T=str(t),
    )


def in_namespace(script: str, env: Dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def tree(top: Path) -> Tuple[str, ...]:
    return tuple(sorted(str(p.relative_to(top)) for p in top.rglob("*"))) if top.exists() else ()


RUN_GPU = (
    HIDE_PYTHON
    + r"""
sh "$PAYLOAD/install.sh" --from "$PAYLOAD"
"$T/bin/nvshim" config compile --config "$CFG" >/dev/null
NVSHIM_CONFIG=$CFG "$T/bin/nvshim-runtime" --root "$T/runc-root" run --bundle "$BUNDLE" "$CID"
echo "=== spec"
NVSHIM_CONFIG=$CFG "$T/bin/nvshim" cdi generate --driver-root "$NODE" --output "$T/cdi/nvidia.json" >/dev/null
cat "$T/cdi/nvidia.json"
"""
)


def test_payload_runs_a_gpu_container_without_the_hosts_python(payload, tmp_path):
    """Installed with --from on a host whose python3 is gone, nvshim-runtime gives runc's
    container GPU 0 only, its createContainer hook (the bundled interpreter: a tmpfs over
    the library folder sends the in-root work there) makes libcuda.so.1's link, and the
    config.json hook and the CDI spec name only the prefix's launcher and its
    version-independent site directory."""
    require_root()
    require_binary("runc")
    from nvshim.sim.build import create_node
    from tests.helpers.bundle import make_glibc_rootfs

    node = create_node(str(tmp_path / "node"), gpus=2)
    cfg = write_nvshim_config(tmp_path / "cfg", {"driver-root": node.root, "runtimes": ["runc"]})
    rootfs = make_glibc_rootfs(tmp_path / "rootfs")
    script = f"ls /dev; echo '=== probe'; readlink {LIBDIR}/libcuda.so.1"
    # links written before runc would be hidden under this mount: the hook makes them
    mount = {"destination": LIBDIR, "type": "tmpfs", "source": "tmpfs", "options": ["mode=755"]}
    bundle = make_bundle(
        tmp_path / "bundle",
        rootfs,
        ["/bin/sh", "-c", script],
        env=["NVIDIA_VISIBLE_DEVICES=0"],
        mounts=[mount],
    )
    env = moved_env(tmp_path)
    env.update(
        PAYLOAD=str(payload), CFG=str(cfg), BUNDLE=str(bundle), CID=unique_id("sc"), NODE=node.root
    )
    res = in_namespace(RUN_GPU, env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    devices, _, rest = res.stdout.partition("=== probe")
    probe_out, _, spec_text = rest.partition("=== spec")
    assert "nvidia0" in devices.split() and "nvidia1" not in devices.split(), devices
    assert probe_out.split() == ["libcuda.so.550.54.15"], res.stdout

    prefix = tmp_path / "opt" / "nvshim"
    launcher = str(prefix / "bin" / "python3")
    hooks = json.loads((bundle / "config.json").read_text())["hooks"]["createContainer"]
    mine = [h for h in hooks if any("nvshim.hook" in a for a in h["args"])]
    assert mine and mine[0]["path"] == launcher, hooks
    assert f'["{prefix}/site"]' in " ".join(mine[0]["args"]), mine[0]["args"]
    spec_hooks = [
        h
        for h in json.loads(spec_text)["containerEdits"]["hooks"]
        if h["hookName"] == "createContainer"
    ]
    assert spec_hooks and all(h["path"] == launcher for h in spec_hooks), spec_hooks
    assert "python3." not in json.dumps(spec_hooks)  # no interpreter version in a CDI spec


def test_installed_files_name_only_the_prefix(payload, tmp_path):
    """After --from, the commands name no interpreter outside the prefix and no venv, every
    executable script under the prefix starts with /bin/sh, and --uninstall run from the
    prefix's own install.sh removes the prefix and the commands."""
    require_root()
    (tmp_path / "bin").mkdir()
    env = moved_env(tmp_path)
    res = subprocess.run(
        ["sh", str(payload / "install.sh"), "--from", str(payload)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    prefix = tmp_path / "opt" / "nvshim"
    for command in ("nvshim", "nvshim-runtime"):
        text = (tmp_path / "bin" / command).read_text()
        assert text.startswith("#!/bin/sh\n")
        pythons = set(re.findall(r"/[\w./-]*python[\w.-]*", text))
        assert pythons and all(p.startswith(f"{prefix}/") for p in pythons), pythons
        assert "venv" not in text and "/usr/bin/python" not in text
    for path in prefix.rglob("*"):
        if path.is_file() and os.access(path, os.X_OK):
            with open(path, "rb") as f:
                head = f.read(64)
            if head.startswith(b"#!"):
                assert head.startswith(b"#!/bin/sh\n"), path
        # (a dist-info's METADATA is the README, which describes --dev's venv)
        if (
            path.is_file()
            and path.suffix in ("", ".sh", ".json", ".txt", ".cfg")
            and not any(part.endswith(".dist-info") for part in path.parts)
        ):
            assert b"/venv/bin/python" not in path.read_bytes(), path
    version = subprocess.run(
        [str(tmp_path / "bin" / "nvshim"), "--version"], capture_output=True, text=True
    )
    assert version.returncode == 0 and "0.1.0" in version.stdout
    gone = subprocess.run(
        ["sh", str(prefix / "install.sh"), "--uninstall"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert gone.returncode == 0, gone.stderr
    assert not (tmp_path / "opt").exists() or tree(tmp_path / "opt") == ()
    assert tree(tmp_path / "bin") == ()


FAKE_NVML = r"""
#include <pthread.h>
#include <dlfcn.h>
int nvmlInit_v2(void) { return pthread_self() != 0 && dlerror() == 0 ? 0 : 1; }
"""

MAPS = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
assert lib.nvmlInit_v2() == 0
for line in open("/proc/self/maps"):
    path = line.split()[-1]
    if path.startswith("/") and ".so" in path:
        print(path)
"""


def test_a_node_library_loads_against_the_bundled_glibc(payload, tmp_path):
    """A node library that needs libpthread and libdl (as libnvidia-ml does), dlopen'ed by
    the bundled interpreter through ctypes (as pynvml does), gets the payload's glibc: every
    C library piece mapped in the process comes from the prefix, none from the node."""
    require_root()
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is needed (install.sh --dev installs it)")
    source = tmp_path / "fake.c"
    source.write_text(FAKE_NVML)
    lib = tmp_path / "libnvidia-ml.so.1"
    # linked to the files, as a library built before glibc 2.34 is (DT_NEEDED on both)
    stubs = [
        subprocess.run(
            [gcc, f"-print-file-name={name}"], capture_output=True, text=True, check=True
        ).stdout.strip()
        for name in ("libpthread.so.0", "libdl.so.2")
    ]
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-o", str(lib), str(source), "-Wl,--no-as-needed", *stubs],
        check=True,
    )
    needed = subprocess.run(["ldd", str(lib)], capture_output=True, text=True).stdout
    assert "libpthread.so.0" in needed and "libdl.so.2" in needed, needed
    launcher = payload / "opt" / "nvshim" / "bin" / "python3"
    res = subprocess.run(
        [str(launcher), "-I", "-S", "-c", MAPS, str(lib)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr
    mapped = set(res.stdout.split())
    glibc = {
        p for p in mapped if re.search(r"/(ld-linux[^/]*|lib(c|m|pthread|dl|rt)\.so[^/]*)$", p)
    }
    assert {os.path.basename(p) for p in glibc} >= {"libc.so.6", "libpthread.so.0", "libdl.so.2"}
    lib_dir = f"{payload}/opt/nvshim/lib/"
    assert all(p.startswith(lib_dir) for p in glibc), sorted(glibc)
    assert str(lib) in mapped


def fails_cleanly(res: subprocess.CompletedProcess, t: Path, message: str) -> None:
    """One line naming the problem, exit 1, and nothing installed under ``t``."""
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert "Traceback" not in res.stderr
    assert not (t / "opt" / "nvshim").exists(), tree(t / "opt")
    assert tree(t / "bin") == () and not (t / "etc" / "nvshim").exists()


def test_from_refuses_an_incomplete_payload(payload, tmp_path):
    """A payload missing one of its files (the bundled libc) is refused before anything is
    written, naming the missing file."""
    require_root()
    copy = tmp_path / "payload"
    shutil.copytree(payload, copy, symlinks=True)
    (copy / "opt" / "nvshim" / "lib" / "libc.so.6").unlink()
    t = tmp_path / "t"
    (t / "bin").mkdir(parents=True)
    res = subprocess.run(
        ["sh", str(copy / "install.sh"), "--from", str(copy)],
        env=moved_env(t),
        capture_output=True,
        text=True,
        timeout=600,
    )
    fails_cleanly(
        res, t, f"payload {copy} is incomplete: {copy}/opt/nvshim/lib/libc.so.6 is missing"
    )


def test_from_refuses_a_read_only_bindir(payload, tmp_path):
    """A read-only BINDIR (a node whose /usr is read-only) is refused before the prefix is
    written, naming the directory."""
    require_root()
    (tmp_path / "bin").mkdir()
    script = (
        'mount --bind "$T/bin" "$T/bin" && mount -o remount,bind,ro "$T/bin" && '
        'sh "$PAYLOAD/install.sh" --from "$PAYLOAD"'
    )
    env = dict(moved_env(tmp_path), PAYLOAD=str(payload))
    res = in_namespace(script, env)
    fails_cleanly(res, tmp_path, f"cannot write {tmp_path}/bin (read-only file system?)")


def test_from_refuses_a_node_without_bin_sh(payload, tmp_path):
    """A node root whose /bin/sh does not run is refused (the installed commands are /bin/sh
    scripts), before anything is written."""
    require_root()
    (tmp_path / "bin").mkdir()
    shell = tmp_path / "dash"
    shutil.copy2(os.path.realpath("/bin/sh"), shell)
    # /bin/sh's target becomes a character device: not a shell any more
    script = f'mount --bind /dev/null "$(readlink -f /bin/sh)" && {shell} "$PAYLOAD/install.sh" --from "$PAYLOAD"'
    env = dict(moved_env(tmp_path), PAYLOAD=str(payload))
    res = in_namespace(script, env)
    fails_cleanly(res, tmp_path, "no usable /bin/sh on this node")
