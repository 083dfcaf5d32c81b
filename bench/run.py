"""Benchmark nvshim-runtime against plain runc, in alternating pairs.

Run as root from the repository root with the installed venv's interpreter::

    /opt/nvshim/venv/bin/python bench/run.py [--pairs 30]

It builds everything it needs in a temporary directory (busybox bundles, a simulated
8-GPU node, an nvshim config pointing ``driver-root`` at that node and compiled with
``nvshim config compile`` so the runtime's hot path is used), then for each case times
runc alone and the same command through the installed ``nvshim-runtime`` trampoline,
one after the other in each pair (the order flips every pair), and prints a table.
Results, samples and a description of the machine go to ``bench/results.json``.

Cases:

* ``state``: ``state <id>`` of one created container (pure passthrough);
* ``delete``: ``delete <id>`` of a container freshly created with plain runc (passthrough);
* ``create+delete gpu=none|1|8|cdi|1+image``: ``create`` then ``delete`` of a busybox
  bundle with no GPU request, ``NVIDIA_VISIBLE_DEVICES=0``, ``=all`` and
  ``=nvidia.com/gpu=0`` (a CDI name, resolved from a YAML spec ``nvshim cdi generate``
  wrote into the configured spec dir) on the 8-GPU node; ``1+image`` is the 1-GPU
  bundle with what a real (Debian- or Ubuntu-based CUDA) image has where nvshim works:
  this host's ``/etc/ld.so.cache`` and up to 300 of its ``lib*.so*`` files and links in
  ``/usr/lib/x86_64-linux-gnu`` (hard links where possible), which nvshim scans, merges
  and rewrites (the cache is restored before each create too); before every create
  (untimed) config.json is restored and everything a previous create added to the rootfs
  (SONAME links, ld.so.cache, mount targets) is removed, so each create meets a fresh
  rootfs as in real life; each round also times the **floor**, runc on the config.json
  the runtime wrote (captured from one untimed create, with the files it added beside
  it) on the same fresh rootfs: the device nodes, mounts and hooks without the runtime.
  The table gives the floor, its per-round difference to runc (what the injection costs
  runc) and the runtime's per-round difference to its floor (what the runtime adds);
* ``shim stage gpu=1|cdi|1+image``: the same creates with the low-level runtime replaced by a
  no-op (config ``runtimes: [/bin/true]``), against ``/bin/true`` alone: what nvshim
  itself costs;
* ``cdi generate``: ``nvshim cdi generate`` for 1, 8, 32, 64 and 256 simulated GPUs, wall
  time and peak RSS of the process (os.wait4), to show how the cost grows. Nodes beyond
  the driver's 32 GPUs come straight from the simulator (scale only). When the command is
  missing the case says so and ``nvshim inspect`` on the 1-GPU bundle is timed instead.

``--agent`` puts the node agent's fast path first: this checkout's trampoline, rendered for a
private agent socket with the C client built from this checkout, and two ``nvshim agent``
processes (the config's, and the no-op config's for the shim stage) started for the run;
the runtime given becomes B (default: the same trampoline for a socket nobody serves, i.e.
this checkout's in-process create; the installed one is not needed), so the ``A vs B``
rows compare the fast path with it.

``--runtime`` given twice (say today's venv trampoline, then the self-contained one that
``install.sh --from`` installs) adds, for each ``shim stage`` bundle, the two runtimes
against each other in alternating pairs (``A vs B``: the first runtime in the runc
column), and each one's own ``shim stage`` row; the other cases use the first.

Nothing here asserts on time; this is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_RUNTIME = "/usr/local/bin/nvshim-runtime"
CDI_SIZES = (1, 8, 32, 64, 256)

Timing = Tuple[float, int, float]
"""(wall milliseconds, peak RSS of the child in KiB, CPU milliseconds).

CPU is user + system time of the command and of every child it waited for (``wait4``'s
rusage): sh's ``grep`` and the Python it exec's count, a container's init (still running
after ``create``) does not. It moves far less than wall time when the machine is busy,
so the tables give its per-pair difference next to the wall-time one."""

Sample = Tuple[float, float]
"""(wall milliseconds, CPU milliseconds) of one timed run."""


# --------------------------------------------------------------------------- measuring


def timed(
    argv: Sequence[str],
    env: Optional[Dict[str, str]] = None,
    check: bool = True,
    stdout: Any = subprocess.DEVNULL,
) -> Timing:
    """Run ``argv`` with stdio on /dev/null; wall ms, the child's peak RSS and CPU ms.

    stdio must not be a pipe: a created container keeps its stdio open until it exits,
    so stderr goes to a temporary file (read back only on failure).
    """
    with tempfile.TemporaryFile() as errf:
        start = time.perf_counter()
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=stdout, stderr=errf, env=env
        )
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = (time.perf_counter() - start) * 1000.0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if check and proc.returncode != 0:
            errf.seek(0)
            err = errf.read().decode(errors="replace").strip()
            raise RuntimeError(f"{' '.join(argv)} failed (rc {proc.returncode}): {err}")
    return elapsed, usage.ru_maxrss, (usage.ru_utime + usage.ru_stime) * 1000.0


def summary(samples: Sequence[float]) -> Dict[str, float]:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "n": len(samples),
    }


def paired(
    name: str,
    pairs: int,
    baseline: Callable[[int], Sample],
    subject: Callable[[int], Sample],
    floor: Optional[Callable[[int], Sample]] = None,
) -> Dict[str, Any]:
    """Run ``pairs`` pairs (order flipped every pair); per-pair ratio and difference of
    wall time, and the per-pair difference of CPU time.

    With ``floor`` (runc on the config.json the subject writes, see :class:`Floor`) each
    round times it between the two, and the row adds the floor's median, the floor's
    per-round difference to the baseline (what the injection itself costs runc) and the
    subject's per-round difference to the floor (what the runtime adds on top)."""
    base: List[Sample] = []
    subj: List[Sample] = []
    low: List[Sample] = []
    for i in range(pairs):
        steps: List[Callable[[int], Sample]] = [baseline, *([floor] if floor else []), subject]
        got = [step(i) for step in (steps if i % 2 == 0 else steps[::-1])]
        if i % 2:
            got.reverse()
        base.append(got[0])
        subj.append(got[-1])
        if floor:
            low.append(got[1])
    ratios = [s[0] / b[0] for b, s in zip(base, subj, strict=True)]
    diffs = [s[0] - b[0] for b, s in zip(base, subj, strict=True)]
    cpu_diffs = [s[1] - b[1] for b, s in zip(base, subj, strict=True)]
    extra: Dict[str, Any] = {}
    if floor:
        extra = {
            "floor_ms": summary([f[0] for f in low]),
            "floor_over_runc_ms_median": statistics.median(
                f[0] - b[0] for b, f in zip(base, low, strict=True)
            ),
            "over_floor_ms_median": statistics.median(
                s[0] - f[0] for f, s in zip(low, subj, strict=True)
            ),
            "cpu_over_floor_ms_median": statistics.median(
                s[1] - f[1] for f, s in zip(low, subj, strict=True)
            ),
            "floor_samples": [round(x[0], 3) for x in low],
        }
    return {
        "case": name,
        "runc_ms": summary([b[0] for b in base]),
        "nvshim_ms": summary([s[0] for s in subj]),
        "ratio_median": statistics.median(ratios),
        "overhead_ms_median": statistics.median(diffs),
        "runc_cpu_ms": summary([b[1] for b in base]),
        "nvshim_cpu_ms": summary([s[1] for s in subj]),
        "cpu_overhead_ms_median": statistics.median(cpu_diffs),
        "runc_samples": [round(x[0], 3) for x in base],
        "nvshim_samples": [round(x[0], 3) for x in subj],
        "runc_cpu_samples": [round(x[1], 3) for x in base],
        "nvshim_cpu_samples": [round(x[1], 3) for x in subj],
        **extra,
    }


# --------------------------------------------------------------------------- fixtures


class Floor:
    """What a runtime's create left in a bundle for runc: the config.json it wrote and the
    files it added beside it (nvshim's params copy).

    The floor of a runtime is runc creating this bundle on a fresh rootfs: it pays the
    device nodes, the mounts and the runtime's own hooks that the config.json names, not
    the runtime. A runtime's added time over its own floor is what the runtime itself
    costs; the floor's over plain runc is what the injection costs any runtime."""

    def __init__(self, config: bytes, files: Dict[str, bytes]) -> None:
        self.config = config
        self.files = files


class Bench:
    """The temporary world one benchmark run uses."""

    def __init__(self, work: Path, runtime: str, runc: str, nvshim_cli: List[str]) -> None:
        self.work = work
        self.runtime = runtime
        self.runc = runc
        self.nvshim_cli = nvshim_cli
        self.root = work / "runc-root"
        self.root.mkdir()
        self.counter = 0
        self.live: List[str] = []
        self.keep: Dict[str, Dict[Path, bytes]] = {}
        """Files of a bundle's rootfs that a create rewrites, with their original bytes."""
        self.env = dict(os.environ)

    def cid(self, tag: str) -> str:
        self.counter += 1
        return f"nvb-{tag}-{os.getpid()}-{self.counter}"

    def rt(self, tool: str, *args: str) -> List[str]:
        return [tool, "--root", str(self.root), *args]

    def setup(self) -> None:
        from nvshim.sim.build import create_node
        from tests.helpers.bundle import make_bundle, make_rootfs

        rootfs = make_rootfs(self.work / "rootfs")
        self.node = create_node(str(self.work / "node8"), gpus=8)
        self.bundles = {
            "none": make_bundle(self.work / "b-none", rootfs, ["true"]),
            "1": make_bundle(
                self.work / "b-1", rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "0"}
            ),
            "8": make_bundle(
                self.work / "b-8", rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "all"}
            ),
            "cdi": make_bundle(
                self.work / "b-cdi",
                rootfs,
                ["true"],
                env={"NVIDIA_VISIBLE_DEVICES": "nvidia.com/gpu=0"},
            ),
        }
        if os.path.isfile("/etc/ld.so.cache"):
            self.bundles["1+image"] = make_bundle(
                self.work / "b-1i", rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "0"}
            )
            image_root = self.bundles["1+image"] / "rootfs"
            image_cache = image_root / "etc" / "ld.so.cache"
            shutil.copyfile("/etc/ld.so.cache", image_cache)
            self.keep["1+image"] = {image_cache: image_cache.read_bytes()}
            _image_libraries(
                Path("/usr/lib/x86_64-linux-gnu"),
                image_root / "usr" / "lib" / "x86_64-linux-gnu",
                300,
            )
        self.originals = {k: (b / "config.json").read_bytes() for k, b in self.bundles.items()}
        self.rootfs_paths = {k: _tree(b / "rootfs") for k, b in self.bundles.items()}
        self.bundle_names = {k: set(os.listdir(b)) for k, b in self.bundles.items()}
        spec_dir = self.work / "cdi"
        subprocess.run(
            self.nvshim_cli
            + [
                "cdi",
                "generate",
                "--driver-root",
                self.node.root,
                "--output",
                str(spec_dir / "nvidia.yaml"),
            ],
            check=True,
            capture_output=True,
        )
        self.noop_env = dict(self.env)
        self.noop_env_b = self.noop_env  # runtime B's (--agent: another socket, below)
        for name, runtime, env in (
            ("config", self.runc, self.env),
            ("noop", "/bin/true", self.noop_env),
        ):
            cfg = self.work / "nvshim" / f"{name}.yaml"
            cfg.parent.mkdir(exist_ok=True)
            cfg.write_text(
                f"runtimes: [{runtime}]\n"
                f"driver-root: {self.node.root}\n"
                f"cdi-spec-dirs: [{spec_dir}]\n"
                # the journal stays on (its cost is part of a GPU create) but in the temp dir
                f"grants-journal: {self.work / 'nvshim' / (name + '-grants.jsonl')}\n"
            )
            subprocess.run(
                self.nvshim_cli + ["config", "compile", "--config", str(cfg)],
                check=True,
                capture_output=True,
            )
            env["NVSHIM_CONFIG"] = str(cfg)
        self.config = self.work / "nvshim" / "config.yaml"

    def restore(self, key: str, floor: Optional[Floor] = None) -> None:
        """config.json as the engine wrote it, and the bundle and rootfs without what a
        create added (the params copy nvshim keeps beside config.json, links, caches): an
        engine makes a fresh bundle for every container, so a create never replaces a file
        an earlier create left (replacing one costs an ext4 rename more). With ``floor``,
        the bundle as that runtime's create left it instead, on the same fresh rootfs."""
        (self.bundles[key] / "config.json").write_bytes(
            floor.config if floor else self.originals[key]
        )
        for name in set(os.listdir(self.bundles[key])) - self.bundle_names[key]:
            (self.bundles[key] / name).unlink()
        for name, data in (floor.files if floor else {}).items():
            (self.bundles[key] / name).write_bytes(data)
        for path, data in self.keep.get(key, {}).items():
            path.write_bytes(data)
        rootfs = self.bundles[key] / "rootfs"
        for added in sorted(_tree(rootfs) - self.rootfs_paths[key], reverse=True):
            full = rootfs / added
            if full.is_dir() and not full.is_symlink():
                full.rmdir()
            else:
                full.unlink()

    def floor(self, key: str) -> Floor:
        """The bundle ``key`` as the create just run left it (see :class:`Floor`)."""
        bundle = self.bundles[key]
        added = set(os.listdir(bundle)) - self.bundle_names[key]
        return Floor(
            (bundle / "config.json").read_bytes(),
            {
                n: (bundle / n).read_bytes()
                for n in sorted(added)
                if (bundle / n).is_file() and not (bundle / n).is_symlink()
            },
        )

    def create(self, tool: str, key: str, cid: str, floor: Optional[Floor] = None) -> Sample:
        self.restore(key, floor)
        self.live.append(cid)
        ms, _, cpu = timed(
            self.rt(tool, "create", "--bundle", str(self.bundles[key]), cid), env=self.env
        )
        return ms, cpu

    def delete(self, tool: str, cid: str, force: bool = False) -> Sample:
        args = ["delete"] + (["--force"] if force else []) + [cid]
        ms, _, cpu = timed(self.rt(tool, *args), env=self.env)
        if cid in self.live:
            self.live.remove(cid)
        return ms, cpu

    def cleanup(self) -> None:
        for cid in list(self.live):
            subprocess.run(
                self.rt(self.runc, "delete", "--force", cid), capture_output=True, env=self.env
            )
        self.live.clear()


def _image_libraries(source: Path, dest: Path, most: int) -> None:
    """Up to ``most`` of the host's ``lib*.so*`` entries into ``dest``: links as links,
    files hard-linked (copied when that fails and they are under 4 MiB). NVIDIA's own
    names are left out: they are what nvshim injects."""
    dest.mkdir(parents=True, exist_ok=True)
    if not source.is_dir():
        return
    taken = 0
    for entry in sorted(source.iterdir()):
        name = entry.name
        if taken >= most or not name.startswith("lib") or ".so" not in name:
            continue
        if name.startswith(
            ("libcuda", "libnvidia", "libnvcuvid", "libGLX_nvidia", "libEGL_nvidia")
        ):
            continue
        target = dest / name
        if entry.is_symlink():
            target.symlink_to(os.readlink(entry))
        elif entry.is_file():
            try:
                os.link(entry, target)
            except OSError:
                if entry.stat().st_size > 4 << 20:
                    continue
                shutil.copy2(entry, target)
        else:
            continue
        taken += 1


def _tree(top: Path) -> Set[str]:
    """Every path under ``top``, relative, symlinks not followed."""
    out: Set[str] = set()
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, name), top))
    return out


# --------------------------------------------------------------------------- cases


def case_state(b: Bench, pairs: int) -> Dict[str, Any]:
    cid = b.cid("state")
    b.create(b.runc, "none", cid)
    try:

        def run(tool: str) -> Sample:
            ms, _, cpu = timed(b.rt(tool, "state", cid), env=b.env)
            return ms, cpu

        return paired("state (passthrough)", pairs, lambda i: run(b.runc), lambda i: run(b.runtime))
    finally:
        b.delete(b.runc, cid, force=True)


def case_delete(b: Bench, pairs: int) -> Dict[str, Any]:
    def run(tool: str) -> Sample:
        cid = b.cid("del")
        b.create(b.runc, "none", cid)  # untimed: always plain runc
        return b.delete(tool, cid)

    return paired("delete (passthrough)", pairs, lambda i: run(b.runc), lambda i: run(b.runtime))


def start_agent(config: Path, sock: Path, log: Path) -> "subprocess.Popen[bytes]":
    """``nvshim agent`` (this checkout's) for ``config`` on ``sock``, once it serves."""
    code = (
        "import sys; sys.path.insert(0, sys.argv.pop(1)); from nvshim.cli.main import main; main()"
    )
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-c",
                code,
                str(REPO),
                "agent",
                "--config",
                str(config),
                "--socket",
                str(sock),
                "--nri-socket",
                "none",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    deadline = time.monotonic() + 30
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"bench: the agent did not start: {log.read_text()[-500:]}")
        time.sleep(0.05)
    return proc


def _agent_runtime(b: Bench) -> Tuple[str, str, List["subprocess.Popen[bytes]"]]:
    """The fast path's trampoline for ``b``, the same trampoline for a socket nobody serves
    (the in-process create of this checkout), and the two agents (config and no-op
    config)."""
    from nvshim.agent.client import build_client
    from nvshim.node.install.trampoline import render

    client = build_client(str(b.work / "nvshim-agent-client"))
    sock, noop_sock = b.work / "agent.sock", b.work / "agent-noop.sock"
    tramp, alone = b.work / "nvshim-runtime-agent", b.work / "nvshim-runtime-no-agent"
    tramp.write_text(render(sys.executable, agent_socket=str(sock), client=client))
    alone.write_text(
        render(sys.executable, agent_socket=str(b.work / "no-agent.sock"), client=client)
    )
    for path in (tramp, alone):
        path.chmod(0o755)
    agents = [
        start_agent(b.work / "nvshim" / "config.yaml", sock, b.work / "agent.log"),
        start_agent(b.work / "nvshim" / "noop.yaml", noop_sock, b.work / "agent-noop.log"),
    ]
    b.noop_env["NVSHIM_AGENT_SOCKET"] = str(noop_sock)
    # B, the in-process create, must not reach the no-op agent through that variable
    b.noop_env_b = {**b.noop_env, "NVSHIM_AGENT_SOCKET": str(b.work / "no-agent.sock")}
    return str(tramp), str(alone), agents


def case_create(b: Bench, pairs: int, key: str) -> Dict[str, Any]:
    """create+delete of bundle ``key``: runc, the floor (runc on the config.json the
    runtime wrote, captured from one untimed create first) and the runtime, each round."""
    parts: Dict[str, List[float]] = {"runc": [], "floor": [], "nvshim": []}
    cid = b.cid(f"f{key}")
    b.create(b.runtime, key, cid)
    floor = b.floor(key)
    b.delete(b.runtime, cid)

    def run(tool: str, label: str, with_floor: Optional[Floor] = None) -> Sample:
        cid = b.cid(f"c{key}")
        c = b.create(tool, key, cid, with_floor)
        d = b.delete(tool, cid)
        parts[label].append(c[0])
        return c[0] + d[0], c[1] + d[1]

    result = paired(
        f"create+delete gpu={key}",
        pairs,
        lambda i: run(b.runc, "runc"),
        lambda i: run(b.runtime, "nvshim"),
        floor=lambda i: run(b.runc, "floor", floor),
    )
    result["create_only_floor_ms"] = summary(parts["floor"])
    result["create_only_runc_ms"] = summary(parts["runc"])
    result["create_only_nvshim_ms"] = summary(parts["nvshim"])
    b.restore(key)
    return result


def case_shim(b: Bench, pairs: int, key: str, b_side: bool = False) -> Dict[str, Any]:
    """nvshim-runtime create with a no-op low-level runtime, against the no-op alone
    (``b_side``: runtime B's, with B's environment)."""

    def run(tool: str, env: Dict[str, str]) -> Sample:
        b.restore(key)
        ms, _, cpu = timed(
            [tool, "create", "--bundle", str(b.bundles[key]), b.cid("shim")], env=env
        )
        return ms, cpu

    result = paired(
        f"shim stage gpu={key}",
        pairs,
        lambda i: run("/bin/true", b.env),
        lambda i: run(b.runtime, b.noop_env_b if b_side else b.noop_env),
    )
    b.restore(key)
    return result


def case_versus(b: Bench, pairs: int, key: str, other: str) -> Dict[str, Any]:
    """Two nvshim-runtimes' shim stage (no-op low-level runtime) against each other."""

    def run(tool: str, env: Dict[str, str]) -> Sample:
        b.restore(key)
        ms, _, cpu = timed([tool, "create", "--bundle", str(b.bundles[key]), b.cid("vs")], env=env)
        return ms, cpu

    result = paired(
        f"shim stage gpu={key}: A vs B",
        pairs,
        lambda i: run(b.runtime, b.noop_env),
        lambda i: run(other, b.noop_env_b),
    )
    b.restore(key)
    return result


def case_cdi(b: Bench, repeats: int) -> Dict[str, Any]:
    from nvshim.sim.build import create_node

    probe = subprocess.run(
        b.nvshim_cli + ["cdi", "generate", "--help"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        out: Dict[str, Any] = {
            "available": False,
            "why": "nvshim cdi generate is not available: "
            + (probe.stderr.strip().splitlines() or ["?"])[-1],
        }
        samples = []
        for _ in range(repeats):
            samples.append(
                timed(b.nvshim_cli + ["inspect", "--bundle", str(b.bundles["1"])], env=b.env)[0]
            )
        out["inspect_1gpu_ms"] = summary(samples)
        return out
    help_text = probe.stdout
    rows: List[Dict[str, Any]] = []
    for n in CDI_SIZES:
        root = b.work / f"cdi-node{n}"
        create_node(str(root), gpus=n)  # the sim builds large nodes (minors skip 254/255)
        argv = b.nvshim_cli + ["cdi", "generate", "--driver-root", str(root)]
        if "--output" in help_text:
            argv += ["--output", str(b.work / f"cdi-{n}.json")]
        ms_list, rss_list = [], []
        size = 0
        for _ in range(repeats):
            with open(b.work / f"cdi-{n}.out", "wb") as fh:
                ms, rss, _ = timed(argv, env=b.env, stdout=fh)
            ms_list.append(ms)
            rss_list.append(rss)
        produced = b.work / f"cdi-{n}.json"
        if not produced.exists():
            produced = b.work / f"cdi-{n}.out"
        size = produced.stat().st_size
        rows.append(
            {"gpus": n, "ms": summary(ms_list), "peak_rss_kib": max(rss_list), "spec_bytes": size}
        )
    base = rows[0]["ms"]["median"]
    for row in rows:
        row["ms_over_1gpu"] = row["ms"]["median"] - base
    return {"available": True, "argv": argv[:-2] if "--output" in argv else argv, "rows": rows}


# --------------------------------------------------------------------------- report


def machine(runc: str, runtime: str) -> Dict[str, Any]:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    runc_version = subprocess.run(
        [runc, "--version"], capture_output=True, text=True
    ).stdout.splitlines()
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "os": platform.platform(),
        "runc": runc,
        "runc_version": runc_version[0] if runc_version else "?",
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "nvshim_runtime": runtime,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def print_table(results: Dict[str, Any]) -> None:
    print(
        f"\n{results['pairs']} alternating pairs; ms: median [min-max]; ratio, +ms: median "
        "of per-pair wall-time ratios and differences; +cpu ms: of per-pair CPU-time "
        "differences"
    )
    if any(r["case"].endswith("A vs B") for r in results["cases"]):
        print(
            f"A vs B: A = {results['machine']['nvshim_runtime']} in the runc column, "
            f"B = {results['machine']['nvshim_runtime_b']} in the nvshim-runtime column"
        )
    print(
        "floor: runc on the config.json nvshim-runtime wrote, fresh rootfs (its mounts, "
        "device nodes and hooks; not the runtime); floor +ms: the floor over runc, "
        "+ms over floor: nvshim-runtime over its floor, both per round"
    )
    head = (
        f"{'case':30} {'runc':>24} {'floor':>24} {'nvshim-runtime':>24} {'ratio':>7} "
        f"{'+ms':>7} {'floor +ms':>9} {'+ms over floor':>14} {'+cpu ms':>8}"
    )
    print(head)
    print("-" * len(head))

    def cell(s: Dict[str, float]) -> str:
        return f"{s['median']:7.1f} [{s['min']:.1f}-{s['max']:.1f}]"

    for r in results["cases"]:
        has_floor = "floor_ms" in r
        floor = cell(r["floor_ms"]) if has_floor else "(the baseline)"
        lift = f"{r['floor_over_runc_ms_median']:+9.1f}" if has_floor else f"{'':9}"
        over = f"{r['over_floor_ms_median']:+14.1f}" if has_floor else f"{'':14}"
        print(
            f"{r['case']:30} {cell(r['runc_ms']):>24} {floor:>24} {cell(r['nvshim_ms']):>24} "
            f"{r['ratio_median']:6.2f}x {r['overhead_ms_median']:+7.1f} {lift} {over} "
            f"{r['cpu_overhead_ms_median']:+8.1f}"
        )
        if "create_only_runc_ms" in r:
            print(
                f"{'  of which create':30} {cell(r['create_only_runc_ms']):>24} "
                f"{cell(r['create_only_floor_ms']):>24} "
                f"{cell(r['create_only_nvshim_ms']):>24}"
            )
    cdi = results.get("cdi_generate")
    if cdi is None:
        return
    print()
    if not cdi["available"]:
        print(f"cdi generate: {cdi['why']}")
        print(f"  nvshim inspect (1 GPU) instead: {cell(cdi['inspect_1gpu_ms'])} ms")
        return
    print(f"{'nvshim cdi generate':30} {'ms':>24} {'peak RSS':>12} {'spec bytes':>12}")
    for row in cdi["rows"]:
        print(
            f"{str(row['gpus']) + ' GPUs':30} {cell(row['ms']):>24} "
            f"{row['peak_rss_kib'] / 1024:9.1f} MiB {row['spec_bytes']:12d}"
        )


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=30, help="pairs per case (default 30)")
    parser.add_argument(
        "--runtime",
        action="append",
        default=[],
        help=f"nvshim-runtime under test (default {DEFAULT_RUNTIME}); given "
        "twice, also the two against each other (A = the first)",
    )
    parser.add_argument("--runc", default=shutil.which("runc") or "/usr/sbin/runc")
    parser.add_argument(
        "--cases",
        default="state,delete,create,shim,cdi",
        help="comma-separated subset of state,delete,create,shim,cdi",
    )
    parser.add_argument("--cdi-repeats", type=int, default=5)
    parser.add_argument("--out", default=str(REPO / "bench" / "results.json"))
    parser.add_argument(
        "--agent",
        action="store_true",
        help="A = the node agent's fast path (this checkout), B = --runtime",
    )
    args = parser.parse_args(argv)
    # with --agent and no --runtime, B is this checkout's own in-process create (below)
    runtimes: List[str] = args.runtime or ([] if args.agent else [DEFAULT_RUNTIME])
    if args.agent and len(runtimes) > 1:
        print("bench/run.py: --agent takes at most one --runtime (B)", file=sys.stderr)
        return 1
    if len(runtimes) > 2:
        print("bench/run.py: --runtime at most twice", file=sys.stderr)
        return 1
    args.runtime = runtimes[0] if runtimes else ""

    if os.geteuid() != 0:
        print(
            "bench/run.py: needs root (runc containers, mknod for the simulated node)",
            file=sys.stderr,
        )
        return 1
    for path in (*runtimes, args.runc):
        if not os.access(path, os.X_OK):
            print(f"bench/run.py: {path} is not executable", file=sys.stderr)
            return 1
    cli = shutil.which("nvshim") if args.runtime == DEFAULT_RUNTIME else None  # else ours
    nvshim_cli = [cli] if cli else [sys.executable, "-I", "-m", "nvshim.cli.main"]
    wanted = set(args.cases.split(","))

    results: Dict[str, Any] = {
        "pairs": args.pairs,
        "load_before": os.getloadavg(),
        "machine": machine(args.runc, args.runtime),
        "cases": [],
    }
    if len(runtimes) == 2:
        results["machine"]["nvshim_runtime_b"] = runtimes[1]
    with tempfile.TemporaryDirectory(prefix="nvshim-bench-") as tmp:
        b = Bench(Path(tmp), args.runtime, args.runc, nvshim_cli)
        agents: List[subprocess.Popen[bytes]] = []
        try:
            b.setup()
            if args.agent:
                fast, alone, agents = _agent_runtime(b)
                runtimes = [fast, *(runtimes or [alone])]
                args.runtime = b.runtime = fast
                results["machine"]["nvshim_runtime"] = fast
                results["machine"]["nvshim_runtime_b"] = runtimes[1]
            # warm caches (page cache, pyc) once per tool; not recorded
            if wanted & {"state", "delete", "create"}:
                for tool in (b.runc, *runtimes):
                    cid = b.cid("warm")
                    b.create(tool, "1", cid)
                    b.delete(tool, cid)
            else:  # no container is started (a run under chrt may not move into a cgroup)
                for tool in runtimes:
                    b.restore("1")
                    timed(
                        [tool, "create", "--bundle", str(b.bundles["1"]), b.cid("warm")],
                        env=b.noop_env,
                    )
                b.restore("1")
            if "state" in wanted:
                results["cases"].append(case_state(b, args.pairs))
            if "delete" in wanted:
                results["cases"].append(case_delete(b, args.pairs))
            if "create" in wanted:
                for key in ("none", "1", "8", "cdi", "1+image"):
                    if key not in b.bundles:
                        continue
                    results["cases"].append(case_create(b, args.pairs, key))
            if "shim" in wanted:
                for key in ("1", "cdi", "1+image"):
                    if key not in b.bundles:
                        continue
                    results["cases"].append(case_shim(b, args.pairs, key))
                    if len(runtimes) == 2:
                        b.runtime = runtimes[1]
                        row = case_shim(b, args.pairs, key, b_side=True)
                        row["case"] += " (B)"
                        results["cases"].append(row)
                        b.runtime = runtimes[0]
                        results["cases"].append(case_versus(b, args.pairs, key, runtimes[1]))
            if "cdi" in wanted:
                results["cdi_generate"] = case_cdi(b, args.cdi_repeats)
        finally:
            b.cleanup()
            for agent in agents:
                agent.terminate()
                agent.wait(30)
    results["load_after"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
