"""What the in-root work of one GPU create costs, in a CUDA-like image (issue 44 item 4).

Run as root from the repository root with a venv that has nvshim and the test extras::

    .venv/bin/python bench/inroot.py [--rounds 200] [--caps compute,utility] [--no-strace]
        [--image cuda|small]

The image (made once in a temp dir, never touching the host's ``/etc`` or ``/usr``): the
host's ``/usr/lib/x86_64-linux-gnu`` ``lib*.so*`` files copied (the links recreated as they
are), ``/lib`` a link to ``usr/lib`` (merged ``/usr``), a ``/usr/local/cuda/compat`` with
an older libcuda, and the image's ``/etc/ld.so.cache`` written by the host's
``ldconfig -r`` over that tree (about 500 entries, as a CUDA runtime image has). With
``--image small``, a busybox-like image instead: ``/bin`` and an ``/etc`` with a
``passwd``, no library folder, no loader files, no cache (the floor of the work: the
links, the folder, the drop-in, ``ld.so.conf`` and a cache of the driver's names). The
driver is a simulated node's (:func:`nvshim.sim.build.create_node`); the work is what
the create road plans for one GPU (:func:`nvshim.runtime.create.plan_create`, the same
:class:`~nvshim.runtime.rootwork.RootWork` the NRI plugin hands the agent).

Each round gets a fresh copy of the image (``cp -al`` of the template, untimed) and times,
in turn:

- ``agent``: the agent's hook (:mod:`nvshim.agent.hookwork`'s ``_do``, what
  ``serve_hook`` calls once the work is claimed: config.json read through the caller's
  root, the rootfs resolved, :func:`~nvshim.runtime.rootwork.prepare_in` and the ``/dev``
  links), in a rootfs where runc has mounted the driver's libraries (copied there);
- ``prepare_in``: :func:`~nvshim.runtime.rootwork.prepare_in` alone in that rootfs, the
  in-root work's own time (the figure the agent logs as ``inroot_ms``);
- ``runtime``: :func:`~nvshim.runtime.rootwork.prepare` as nvshim-runtime calls it before
  runc (the driver's libraries not mounted yet: their facts come from the plan), timed in a
  process of its own that empties the per-process memos before each round: every
  nvshim-runtime is a new process, while the agent, resident, keeps them warm across the
  creates of an image (sort keys, the parsed image cache, the merged cache, the driver's
  planned entries).

Printed (JSON): the median and p90 in ms of each, wall time and (``<mode>_cpu``) the
calling thread's CPU time, which the load around it changes least; the load average
before and after (the wall times are only as steady as the machine); the syscalls one
``prepare_in`` makes (counted from an ``strace -f`` of one round between two marker calls;
skipped without strace or with ``--no-strace``) and cProfile's top functions over the
rounds of ``prepare_in``.
Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

HOST_LIBS = "/usr/lib/x86_64-linux-gnu"
LIBDIR = "usr/lib/x86_64-linux-gnu"
_MARK_START, _MARK_END = "/nvshim-bench-inroot-start", "/nvshim-bench-inroot-end"


def make_image(dest: Path, driver_version: str) -> Path:
    """The CUDA-like image template at ``dest`` (see the module docstring)."""
    from nvshim.host.elf import build_shared_object

    libdir = dest / LIBDIR
    libdir.mkdir(parents=True)
    (dest / "lib").symlink_to("usr/lib")
    (dest / "lib64").mkdir()
    for entry in sorted(os.scandir(HOST_LIBS), key=lambda e: e.name):
        if not (entry.name.startswith("lib") and ".so" in entry.name):
            continue
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), libdir / entry.name)
        elif entry.is_file(follow_symlinks=False):
            shutil.copyfile(entry.path, libdir / entry.name)
    cuda = dest / "usr/local/cuda"
    (cuda / "lib64").mkdir(parents=True)
    (cuda / "compat").mkdir()
    major = int(driver_version.split(".")[0])
    older = f"{major - 5}.54.14"
    (cuda / "compat" / f"libcuda.so.{older}").write_bytes(build_shared_object("libcuda.so.1"))
    (cuda / "compat/libcuda.so.1").symlink_to(f"libcuda.so.{older}")
    (cuda / "lib64/libcudart.so.12.4.127").write_bytes(build_shared_object("libcudart.so.12"))
    (cuda / "lib64/libcudart.so.12").symlink_to("libcudart.so.12.4.127")
    etc = dest / "etc"
    (etc / "ld.so.conf.d").mkdir(parents=True)
    (etc / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (etc / "ld.so.conf.d/x86_64-linux-gnu.conf").write_text(
        "/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n"
    )
    (etc / "ld.so.conf.d/000_cuda.conf").write_text("/usr/local/cuda/lib64\n")
    subprocess.run(["ldconfig", "-X", "-r", str(dest)], check=True, capture_output=True)
    return dest


def make_small_image(dest: Path) -> Path:
    """The busybox-like image template at ``dest`` (``--image small``)."""
    (dest / "bin").mkdir(parents=True)
    (dest / "etc").mkdir()
    (dest / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    return dest


def plan_work(tmp: Path, caps: str) -> Tuple[Any, Any, Path]:
    """(the simulated node, the planned RootWork, the bundle) for a one-GPU container."""
    from nvshim.config import Config
    from nvshim.runtime.create import plan_create
    from nvshim.sim.build import create_node

    sim = create_node(str(tmp / "node"), gpus=1)
    bundle = tmp / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_text(
        json.dumps(
            {
                "ociVersion": "1.0.2",
                "root": {"path": "rootfs"},
                "process": {
                    "args": ["sh"],
                    "cwd": "/",
                    "env": ["NVIDIA_VISIBLE_DEVICES=0", f"NVIDIA_DRIVER_CAPABILITIES={caps}"],
                },
            }
        )
    )
    plan = plan_create(str(bundle), Config(driver_root=sim.root, runtimes=("runc",)))
    work = plan.rootfs.work
    if work is None:
        raise SystemExit(f"the plan has no in-root work ({plan.rootfs.why})")
    shutil.rmtree(bundle / "rootfs")
    return sim, plan, bundle


def mounted_libraries(plan: Any) -> List[Tuple[str, str]]:
    """(host file, rootfs-relative path) of each library the plan mounts into a folder of
    the in-root work: what runc will have mounted when the agent's hook runs."""
    work = plan.rootfs.work
    out = []
    for mount in plan.grant.edits.mounts:
        folder = mount.container_path.rpartition("/")[0]
        if folder in work.folders and os.path.isfile(mount.host_path):
            out.append((mount.host_path, mount.container_path.lstrip("/")))
    return out


def fresh_rootfs(template: Path, rootfs: Path, mounted: List[Tuple[str, str]]) -> None:
    """``rootfs`` as a new copy of the image (hard links of the template: never written, as
    every write renames over), with ``mounted`` copied in (runc's bind mounts)."""
    if rootfs.exists():
        shutil.rmtree(rootfs)
    subprocess.run(["cp", "-al", str(template), str(rootfs)], check=True)
    for host, rel in mounted:
        target = rootfs / rel
        target.parent.mkdir(parents=True, exist_ok=True)  # runc makes the mount points
        if target.is_symlink() or target.exists():
            target.unlink()
        os.link(host, target)  # the sim node's file, in this temp dir


def quantiles(values: List[float]) -> Dict[str, float]:
    ordered = sorted(values)
    return {
        "median_ms": round(statistics.median(ordered), 3),
        "p90_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))], 3),
        "min_ms": round(ordered[0], 3),
        "rounds": len(ordered),
    }


def one_round(mode: str, bundle: Path, work: Any, dev_links: Any) -> Callable[[], Any]:
    """The timed call of ``mode`` (see the module docstring)."""
    from nvshim.agent import hookwork
    from nvshim.host import inroot
    from nvshim.runtime import rootwork

    rootfs = str(bundle / "rootfs")
    if mode == "agent":
        state = {
            "ociVersion": "1.0.2",
            "id": "c1",
            "pid": 1,
            "status": "creating",
            "bundle": str(bundle),
        }

        def agent() -> Any:
            fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                return hookwork._do(fd, state, work, dev_links)
            finally:
                os.close(fd)

        return agent
    if mode == "prepare_in":  # the rootfs opened untimed: prepare_in's own time
        root = inroot.RootFd(os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), rootfs)

        def own() -> Any:
            with root:
                return rootwork.prepare_in(root, work)

        return own
    from nvshim.host import ldcache
    from nvshim.runtime import rootcache

    for memo in (ldcache._KEYS, ldcache._PARSED, rootcache._MERGED, rootcache._PLANNED):
        memo.clear()  # as in a fresh process
    return lambda: rootwork.prepare(rootfs, work)


def timed(
    modes: List[str],
    rounds: int,
    template: Path,
    bundle: Path,
    work: Any,
    dev_links: Any,
    mounted: List[Tuple[str, str]],
) -> Dict[str, List[float]]:
    """Wall and thread CPU ms (``<mode>`` and ``<mode>_cpu``) of ``rounds`` rounds of
    each of ``modes``, their order reversed every other round."""
    times: Dict[str, List[float]] = {}
    for i in range(rounds):
        for mode in modes if i % 2 == 0 else list(reversed(modes)):
            fresh_rootfs(template, bundle / "rootfs", [] if mode == "runtime" else mounted)
            run = one_round(mode, bundle, work, dev_links)
            started, started_cpu = time.perf_counter(), time.thread_time()
            run()
            times.setdefault(f"{mode}_cpu", []).append((time.thread_time() - started_cpu) * 1e3)
            times.setdefault(mode, []).append((time.perf_counter() - started) * 1e3)
    return times


def count_syscalls(tmp: Path, args: argparse.Namespace) -> Dict[str, Any]:
    """Syscalls of one ``prepare_in`` round (this script under strace, ``--one``)."""
    if shutil.which("strace") is None:
        return {"skipped": "no strace"}
    trace = tmp / "strace.txt"
    subprocess.run(
        [
            "strace",
            "-f",
            "-o",
            str(trace),
            sys.executable,
            __file__,
            "--one",
            "--tmp",
            str(tmp),
            "--caps",
            args.caps,
            "--image",
            args.image,
        ],
        check=True,
    )
    inside = False
    counts: Counter[str] = Counter()
    for line in trace.read_text().splitlines():
        if _MARK_START in line:
            inside = True
            continue
        if _MARK_END in line:
            inside = False
            continue
        m = re.match(r"^\d+\s+([a-z_0-9]+)\(", line)
        if inside and m:
            counts[m.group(1)] += 1
    return {"total": sum(counts.values()), **dict(counts.most_common())}


def profile(
    rounds: int,
    template: Path,
    bundle: Path,
    work: Any,
    dev_links: Any,
    mounted: List[Tuple[str, str]],
) -> List[str]:
    """cProfile's top functions (by own time) over ``rounds`` rounds of ``prepare_in``."""
    prof = cProfile.Profile()
    for _ in range(rounds):
        fresh_rootfs(template, bundle / "rootfs", mounted)
        run = one_round("prepare_in", bundle, work, dev_links)
        prof.enable()
        run()
        prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    return [re.sub(r"\s+", " ", ln.strip()).replace(str(REPO) + "/", "") for ln in lines[start:]]


def setup(
    tmp: Path, caps: str, image: str = "cuda"
) -> Tuple[Path, Path, Any, List[Tuple[str, str]], Any]:
    from nvshim.runtime.hookargs import is_nvshim_hook, parse_graphics_args

    sim, plan, bundle = plan_work(tmp, caps)
    template = tmp / "image"
    if not template.exists():
        if image == "small":
            make_small_image(template)
        else:
            make_image(template, sim.driver_version)
    dev_links: Tuple[Tuple[str, str], ...] = ()
    for hook in plan.grant.edits.hooks:
        if is_nvshim_hook(hook):
            dev_links += tuple(parse_graphics_args(hook.args)[0])
    return template, bundle, plan.rootfs.work, mounted_libraries(plan), dev_links


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument(
        "--caps", default="compute,utility", help="NVIDIA_DRIVER_CAPABILITIES of the container"
    )
    parser.add_argument("--no-strace", action="store_true")
    parser.add_argument(
        "--image", choices=("cuda", "small"), default="cuda", help="the image (see above)"
    )
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    parser.add_argument("--runtime-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run as root (the simulated node's device nodes)")
    from nvshim.host.ldcache import parse_ldcache

    if args.one:  # under strace: one prepare_in round between two markers
        tmp = Path(args.tmp) / "one"
        tmp.mkdir()
        template, bundle, work, mounted, dev_links = setup(tmp, args.caps, args.image)
        fresh_rootfs(Path(args.tmp) / "image", bundle / "rootfs", mounted)
        run = one_round("prepare_in", bundle, work, dev_links)
        os.access(_MARK_START, os.F_OK)
        run()
        os.access(_MARK_END, os.F_OK)
        return 0
    if args.runtime_only:  # a process of its own, as nvshim-runtime: its times as JSON
        tmp = Path(args.tmp) / "runtime"
        tmp.mkdir()
        _template, bundle, work, mounted, dev_links = setup(tmp, args.caps, args.image)
        print(
            json.dumps(
                timed(
                    ["runtime"],
                    args.rounds,
                    Path(args.tmp) / "image",
                    bundle,
                    work,
                    dev_links,
                    mounted,
                )
            )
        )
        return 0
    with tempfile.TemporaryDirectory(prefix="nvshim-bench-inroot-") as name:
        tmp = Path(name)
        template, bundle, work, mounted, dev_links = setup(tmp, args.caps, args.image)
        cache = template / "etc/ld.so.cache"
        image_entries = len(parse_ldcache(cache.read_bytes())) if cache.exists() else 0
        load_before = Path("/proc/loadavg").read_text().split()[:3]
        times = timed(
            ["agent", "prepare_in"], args.rounds, template, bundle, work, dev_links, mounted
        )
        times.update(
            json.loads(
                subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--runtime-only",
                        "--rounds",
                        str(args.rounds),
                        "--tmp",
                        str(tmp),
                        "--caps",
                        args.caps,
                        "--image",
                        args.image,
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
            )
        )
        prof_top = profile(min(args.rounds, 50), template, bundle, work, dev_links, mounted)
        load_after = Path("/proc/loadavg").read_text().split()[:3]
        libs = os.listdir(template / LIBDIR) if (template / LIBDIR).is_dir() else []
        report = {
            "image": {
                "ldcache_entries": image_entries,
                "libdir_names": len(libs),
                "driver_libraries_mounted": len(mounted),
                "links": len(work.links),
                "folders": list(work.folders),
            },
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            # <mode>_cpu: the thread's CPU time (user + system), what the load changes least
            **{mode: quantiles(values) for mode, values in sorted(times.items())},
            "syscalls_prepare_in": (
                {"skipped": "--no-strace"} if args.no_strace else count_syscalls(tmp, args)
            ),
            "cprofile_prepare_in_tottime": prof_top,
        }
        print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
