"""``nvshim demo``: real containers through nvshim-runtime → runc on a simulated 4-GPU node.

Builds a simulated node (shuffled device minors, as on real hosts) and a busybox bundle
in a temp dir, runs one container per request, prints what each container saw, and
removes everything again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from nvshim.errors import HostError
from nvshim.node.install.prefix import DEFAULT_RUNTIME_PATH

__all__ = ["run_demo", "REQUESTS"]

REQUESTS = ("1", "0,2", "all", "void")

_PROBE = (
    "echo \"  /dev:        $(cd /dev && ls -d nvidia* 2>/dev/null | tr '\\n' ' ')\"; "
    'echo "  libraries:   '
    "$(ls /usr/lib/x86_64-linux-gnu 2>/dev/null | grep -c 'so\\.' ) files\"; "
    "if [ -e /usr/bin/nvidia-smi ]; then nvidia-smi -L | sed 's/^/  nvidia-smi:  /'; "
    "else echo '  nvidia-smi:  (not injected)'; fi; "
    'echo "  env:         '
    "$(env | grep '^NVIDIA_VISIBLE_DEVICES=' || echo 'NVIDIA_VISIBLE_DEVICES unset')\""
)


def _runtime_binary() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "nvshim-runtime")
    for candidate in (DEFAULT_RUNTIME_PATH, beside, shutil.which("nvshim-runtime")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise HostError("nvshim-runtime is not installed: run ./install.sh first")


def _preflight() -> Tuple[str, str]:
    if os.geteuid() != 0:
        raise HostError("nvshim demo needs root (it creates device nodes with mknod and runs runc)")
    runc = shutil.which("runc")
    if runc is None:
        raise HostError("nvshim demo needs runc: apt-get install runc (or run ./install.sh)")
    busybox = shutil.which("busybox") or "/bin/busybox"
    if not os.path.exists(busybox):
        raise HostError("nvshim demo needs busybox-static: apt-get install busybox-static")
    return runc, busybox


def _failed(what: str, exc: OSError) -> HostError:
    """``exc`` as the demo's one-line error: what it was doing, the file, why."""
    where = f" {exc.filename}" if exc.filename else ""
    return HostError(f"demo: cannot {what}:{where}: {exc.strerror or exc}")


def _make_rootfs(dest: str, busybox: str) -> None:
    try:
        for d in ("bin", "dev", "proc", "sys", "etc", "tmp", "usr/bin", "usr/lib/x86_64-linux-gnu"):
            os.makedirs(os.path.join(dest, d), exist_ok=True)
        shutil.copy2(busybox, os.path.join(dest, "bin", "busybox"))
        applets = subprocess.run(
            [busybox, "--list"], capture_output=True, text=True, check=True
        ).stdout
        for applet in applets.split():
            link = os.path.join(dest, "bin", applet)
            if not os.path.lexists(link):
                os.symlink("busybox", link)
    except subprocess.CalledProcessError as exc:
        raise HostError(
            f"demo: {busybox} --list failed (exit {exc.returncode}): is it busybox-static?"
        ) from exc
    except OSError as exc:
        raise _failed(f"build the container rootfs in {dest}", exc) from exc


def _spec(env: List[str], rootfs: str) -> Dict[str, Any]:
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": ["/bin/sh", "-c", _PROBE],
            "env": ["PATH=/usr/bin:/bin"] + env,
            "cwd": "/",
            "capabilities": {
                k: ["CAP_KILL", "CAP_NET_BIND_SERVICE"]
                for k in ("bounding", "effective", "permitted")
            },
            "noNewPrivileges": True,
        },
        "root": {"path": rootfs, "readonly": True},
        "hostname": "nvshim-demo",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {
                "destination": "/dev",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
            },
            {
                "destination": "/sys",
                "type": "sysfs",
                "source": "sysfs",
                "options": ["nosuid", "noexec", "nodev", "ro"],
            },
        ],
        "linux": {
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")],
        },
    }


def _make_bundle(work: str, n: int, rootfs: str, request: str) -> Tuple[str, bytes]:
    """Bundle ``n`` for ``request`` with its own hard-linked rootfs; (config.json, its bytes)."""
    bundle = os.path.join(work, f"bundle-{n}")
    try:
        os.makedirs(bundle)
        # a fresh rootfs per container (hard links: cheap), so no container sees the
        # mountpoints runc created for another
        own_rootfs = os.path.join(bundle, "rootfs")
        shutil.copytree(rootfs, own_rootfs, symlinks=True, copy_function=os.link)
        spec_path = os.path.join(bundle, "config.json")
        data = json.dumps(
            _spec([f"NVIDIA_VISIBLE_DEVICES={request}"], own_rootfs), indent="\t"
        ).encode()
        with open(spec_path, "wb") as fh:
            fh.write(data)
    except OSError as exc:
        raise _failed(f"make the bundle {bundle}", exc) from exc
    return spec_path, data


def _run_container(
    runtime: str, work: str, spec_path: str, name: str, env: Dict[str, str]
) -> subprocess.CompletedProcess[str]:
    bundle = os.path.dirname(spec_path)
    argv = [runtime, "--root", os.path.join(work, "runc-state"), "run", "--bundle", bundle, name]
    try:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        raise HostError(f"demo: container {name} did not finish within 60 s") from exc
    except OSError as exc:
        raise _failed(f"run {runtime}", exc) from exc


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise _failed("read", exc) from exc


def run_demo(echo: Callable[[str], None] = print, keep: bool = False) -> int:
    """Run the demo; returns the number of containers that did not behave as expected."""
    from nvshim.node.compile import compile_node
    from nvshim.sim.build import create_node

    runc, busybox = _preflight()
    runtime = _runtime_binary()
    try:
        work = tempfile.mkdtemp(prefix="nvshim-demo-")
    except OSError as exc:
        raise _failed("make a temp dir", exc) from exc
    failures = 0
    try:
        node = create_node(os.path.join(work, "node"), gpus=4, shuffle_minors=True)
        echo(
            f"Simulated node in {node.root}: driver {node.driver_version}, 4 GPUs "
            "(minors shuffled as on real hosts):"
        )
        for g in node.gpus:
            echo(f"  GPU {g.index}  /dev/nvidia{g.minor}  {g.uuid}  {g.pci_bus_id}")
        config = os.path.join(work, "nvshim.yaml")
        # the demo's containers are not the node's: their grants stay in the temp dir
        text = (
            f"driver-root: {node.root}\nruntimes: [{runc}]\n"
            f"grants-journal: {os.path.join(work, 'grants.jsonl')}\n"
        )
        try:
            with open(config, "w") as fh:
                fh.write(text)
        except OSError as exc:
            raise _failed("write the demo config", exc) from exc
        compile_node(config)
        rootfs = os.path.join(work, "rootfs")
        _make_rootfs(rootfs, busybox)
        env = dict(os.environ, NVSHIM_CONFIG=config)
        for n, request in enumerate(REQUESTS):
            spec_path, before = _make_bundle(work, n, rootfs, request)
            echo("")
            echo(f"$ nvshim-runtime run   (NVIDIA_VISIBLE_DEVICES={request})")
            proc = _run_container(runtime, work, spec_path, f"nvshim-demo-{os.getpid()}-{n}", env)
            for line in (proc.stdout + proc.stderr).rstrip().splitlines():
                echo(line)
            unchanged = _read(spec_path) == before
            expected = _expected_nodes(request, [g.minor for g in node.gpus])
            seen = _seen_nodes(proc.stdout)
            ok = proc.returncode == 0 and seen == expected
            if request == "void":
                ok = ok and unchanged
                shown = "byte-identical (nothing injected)" if unchanged else "CHANGED"
                echo(f"  config.json: {shown}")
            verdict = (
                "as expected"
                if ok
                else (f"UNEXPECTED (rc={proc.returncode}, wanted {sorted(expected)})")
            )
            echo(f"  -> {verdict}")
            failures += 0 if ok else 1
    finally:
        if keep:
            echo(f"\nkept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    echo("")
    echo(
        "demo finished: "
        + (
            "all containers saw exactly their GPUs"
            if not failures
            else f"{failures} container(s) did not behave as expected"
        )
    )
    return failures


def _expected_nodes(request: str, minors_by_index: List[int]) -> Set[str]:
    if request == "void":
        return set()
    if request == "all":
        picked = minors_by_index
    else:
        picked = [minors_by_index[int(i)] for i in request.split(",")]
    return {f"nvidia{m}" for m in picked}


def _seen_nodes(output: str) -> Set[str]:
    for line in output.splitlines():
        if line.strip().startswith("/dev:"):
            names = line.split(":", 1)[1].split()
            return {n for n in names if n[len("nvidia") :].isdigit()}
    return set()


def main(argv: Optional[List[str]] = None) -> int:
    return run_demo()
