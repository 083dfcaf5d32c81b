"""Benchmark the node agent's fast path: where a GPU create's milliseconds go, the agent's
memory with 256 simulated GPUs, and 200 concurrent creates through one agent.

Run as root from the repository root with this checkout's interpreter::

    .venv/bin/python bench/agent.py [--rounds 40] [--out bench/agent-results.json]

Everything lives in a temporary directory: a simulated node, compiled configs, the C client
built from this checkout, this checkout's trampoline rendered for a private agent socket,
and real ``nvshim agent`` processes. Each create meets its bundle as an engine makes it
(config.json restored, nothing an earlier create added beside it or in its rootfs). Each
figure of the breakdown is the median of ``--rounds`` interleaved rounds, in wall time
(fork to exit) and CPU time (user + system of the processes timed and what they waited
for, ``wait4``: steadier than wall time on a busy machine):

* ``sh trampoline``: a create whose spec asks for nothing through the trampoline (no-op
  runtime), minus the no-op runtime alone: what every create pays before the runtime,
  the sh and, with the agent's socket there, the client reading config.json (``--scan``,
  in place of the grep);
* ``client + socket``: the client against the agent answering at once (a request of
  another version: connect, send the descriptor, the agent's thread, the reply, exit);
* ``agent's create``: :func:`nvshim.runtime.main.create` in this process, as the agent runs
  it (plan from the warm plan cache, journal, in-root work, config.json written);
* ``fast path shim stage``: the trampoline, client and agent together for a 1-GPU create
  with a no-op runtime, minus the no-op alone (the first three plus what joins them);
* ``in-process shim stage``: the same create with no agent (today's path: Python starts);
* ``runc's extra mounts``: ``runc create`` + ``delete`` of the config.json nvshim wrote (its
  hooks taken out) minus the same for the engine's unedited config.json;
* ``hooks``: ``runc create`` + ``delete`` of nvshim's config.json with its hooks minus
  without them (the hooks' CPU is runc init's child's, so mostly not in the CPU column);
* ``delete``: ``delete`` of a runc-created container through the trampoline minus runc's
  own (every container pays it once);
* ``runc``: ``runc create`` + ``delete`` of the engine's config.json, the baseline
  ``bench/run.py`` divides by (the ≤ 1.10× target leaves a tenth of it for all the rows
  above that a create pays: fast path, mounts, hooks, delete).

The fast path's CPU adds the agent's own: what its threads ran during each round's fast
create (``/proc/<pid>/task/*/schedstat``, in ns), shown alone as ``the agent's CPU``
(the create as the agent runs it, with its socket's thread hand-off, its checks of the
caller and its memos; the median over rounds). The client's row counts only the client.

Then the agent's resident memory (VmRSS, VmHWM) after serving creates on a 256-GPU node,
and 200 creates started at once through one agent (no-op runtime): median and p99 of the
per-create wall time. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.run import _tree, start_agent  # noqa: E402


def timed(argv: Sequence[str], env: Dict[str, str], check: bool = False) -> Tuple[float, float]:
    """(wall ms, CPU ms) of ``argv``: CPU is user + system of it and what it waited for
    (``wait4``); its stderr goes to a file (a created container keeps a pipe open until it
    starts)."""
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(
            list(argv), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err
        )
        _, status, usage = os.wait4(proc.pid, 0)
        ms = (time.perf_counter() - t) * 1000
        if check and os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise SystemExit(f"bench: {argv[0]} failed: {err.read().decode()[-300:]}")
    return ms, (usage.ru_utime + usage.ru_stime) * 1000


def wall(argv: Sequence[str], env: Dict[str, str], check: bool = False) -> float:
    """Wall ms of ``argv`` (see :func:`timed`)."""
    return timed(argv, env, check)[0]


def agent_cpu_ms(pid: int) -> float:
    """CPU time of process ``pid``'s live threads in ms, to the nanosecond (the sum of
    ``/proc/<pid>/task/*/schedstat``; the agent's workers live as long as it does).
    ``/proc/<pid>/stat``'s utime + stime count in clock ticks, too coarse for one
    create."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            pass  # a thread that ended meanwhile
    return total / 1e6


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


class World:
    def __init__(self, work: Path, gpus: int, runc: str) -> None:
        from nvshim.agent.client import build_client
        from nvshim.node.compile import compile_node
        from nvshim.node.install.trampoline import render
        from nvshim.sim.build import create_node
        from tests.helpers.bundle import make_bundle, make_rootfs

        self.work = work
        self.node = create_node(str(work / "node"), gpus=gpus)
        self.rootfs = make_rootfs(work / "rootfs")
        self.client = build_client(str(work / "nvshim-agent-client"))
        self.runc = runc
        self.configs: Dict[str, Path] = {}
        for name, runtime in (("runc", runc), ("noop", "/bin/true")):
            cfg = work / name / "config.yaml"
            cfg.parent.mkdir()
            cfg.write_text(
                f"runtimes: [{runtime}]\ndriver-root: {self.node.root}\n"
                f"grants-journal: {cfg.parent}/grants.jsonl\n"
            )
            compile_node(str(cfg))
            self.configs[name] = cfg
        self.sock = work / "agent.sock"
        self.tramp = work / "nvshim-runtime"
        self.tramp.write_text(
            render(sys.executable, agent_socket=str(self.sock), client=self.client)
        )
        self.tramp.chmod(0o755)
        self.bundles = {
            "none": make_bundle(work / "b-none", self.rootfs, ["true"]),
            "1": make_bundle(
                work / "b-1", self.rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "0"}
            ),
            "all": make_bundle(
                work / "b-all", self.rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "all"}
            ),
        }
        self.originals = {k: (b / "config.json").read_bytes() for k, b in self.bundles.items()}
        self.names = {k: set(os.listdir(b)) for k, b in self.bundles.items()}
        self.trees = {k: _tree(b / "rootfs") for k, b in self.bundles.items()}
        self.base_env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        self.n = 0

    def env(self, config: str, agent: bool = True) -> Dict[str, str]:
        return dict(
            self.base_env,
            NVSHIM_CONFIG=str(self.configs[config]),
            NVSHIM_AGENT_SOCKET=str(self.sock) if agent else "none",
        )

    def restore(self, key: str) -> None:
        """The bundle as the engine made it: its config.json, and nothing a create added
        beside it (the params copy) or in its rootfs (links, ld.so.cache)."""
        (self.bundles[key] / "config.json").write_bytes(self.originals[key])
        for name in set(os.listdir(self.bundles[key])) - self.names[key]:
            (self.bundles[key] / name).unlink()
        rootfs = self.bundles[key] / "rootfs"
        for path in sorted(_tree(rootfs) - self.trees[key], reverse=True):
            full = rootfs / path
            if full.is_dir() and not full.is_symlink():
                full.rmdir()
            else:
                full.unlink()

    def cid(self) -> str:
        self.n += 1
        return f"nvba-{os.getpid()}-{self.n}"

    def create(self, key: str, env: Dict[str, str], tool: Optional[str] = None) -> float:
        return self.timed_create(key, env, tool)[0]

    def timed_create(
        self, key: str, env: Dict[str, str], tool: Optional[str] = None
    ) -> Tuple[float, float]:
        self.restore(key)
        return timed(
            [tool or str(self.tramp), "create", "--bundle", str(self.bundles[key]), self.cid()],
            env,
            check=True,
        )


#: The breakdown's rows: (key, what it is). Each is a median over rounds of the samples,
#: or a difference of two such medians (see :func:`breakdown`).
ROWS = (
    ("sh", "sh trampoline (argv, compiled lists, the client's scan; no-op runtime)"),
    ("client", "client + socket round trip (the agent answers at once)"),
    ("agent", "agent's create (plan, journal, rootfs, config.json; in-process)"),
    ("served", "the agent's CPU per fast create (all its threads; schedstat)"),
    ("fast", "fast path shim stage (the three above, joined)"),
    ("python", "in-process shim stage (no agent: Python starts)"),
    ("mounts", "runc's extra mounts and devices (nvshim's config.json, no hooks)"),
    ("hooks", "hooks (runc runs nvshim's createContainer hooks)"),
    ("delete", "delete through the trampoline (sh passthrough)"),
    ("runc", "runc create+delete of the engine's config.json (the baseline)"),
)


def breakdown(w: World, rounds: int, agent_pid: int) -> Dict[str, Dict[str, float]]:
    """Per row of :data:`ROWS`: ``ms`` (wall) and ``cpu`` (CPU ms of the processes timed;
    for the fast path the agent's own share is added as a mean: clock ticks)."""
    from nvshim.config import load_config
    from nvshim.runtime.argv import parse_argv
    from nvshim.runtime.main import create

    samples: Dict[str, List[Tuple[float, float]]] = {
        k: []
        for k in (
            "noop",
            "sh",
            "client",
            "agent",
            "fast",
            "python",
            "runc_plain",
            "runc_edited",
            "runc_nohooks",
            "runc_delete",
            "tramp_delete",
        )
    }
    agent_ms: List[float] = []
    noop_cfg = load_config(str(w.configs["noop"]))
    edited_dir = w.work / "edited"
    shutil.copytree(w.bundles["1"], edited_dir, symlinks=True)
    nohooks_dir = w.work / "edited-nohooks"
    shutil.copytree(w.bundles["1"], nohooks_dir, symlinks=True)
    # nvshim's config.json for the 1-GPU bundle (written once, by the in-process create)
    w.create("1", w.env("noop", agent=False))
    edited = json.loads((w.bundles["1"] / "config.json").read_text())
    (edited_dir / "config.json").write_text(json.dumps(edited))
    nohooks = dict(edited)
    nohooks.pop("hooks", None)
    (nohooks_dir / "config.json").write_text(json.dumps(nohooks))
    plain = w.bundles["none"]
    root = w.work / "runc-root"

    def runc_pair(bundle: Path) -> Tuple[float, float]:
        cid = w.cid()
        t = timed(
            [w.runc, "--root", str(root), "create", "--bundle", str(bundle), cid],
            w.base_env,
            check=True,
        )
        d = timed([w.runc, "--root", str(root), "delete", "--force", cid], w.base_env)
        return t[0] + d[0], t[1] + d[1]

    def delete_by(tool: str) -> Tuple[float, float]:
        cid = w.cid()
        timed(
            [w.runc, "--root", str(root), "create", "--bundle", str(plain), cid],
            w.base_env,
            check=True,
        )
        return timed([tool, "--root", str(root), "delete", cid], w.env("runc"), check=True)

    version_mismatch = [
        w.client,
        str(w.sock),
        "0.0.0-other",
        str(w.configs["noop"]),
        "/bin/true",
        str(w.bundles["1"]),
        "create",
        "--bundle",
        str(w.bundles["1"]),
        "x",
    ]
    for _ in range(rounds):
        samples["noop"].append(
            timed(["/bin/true", "create", "--bundle", str(plain), "x"], w.base_env)
        )
        samples["sh"].append(w.timed_create("none", w.env("noop")))
        samples["client"].append(timed(version_mismatch, w.base_env))
        w.restore("1")
        inv = parse_argv(["create", "--bundle", str(w.bundles["1"]), w.cid()])
        t, c = time.perf_counter(), time.thread_time()
        assert create(inv, noop_cfg, "/bin/true", None, None, "agent") is None
        samples["agent"].append(((time.perf_counter() - t) * 1000, (time.thread_time() - c) * 1000))
        before = agent_cpu_ms(agent_pid)
        samples["fast"].append(w.timed_create("1", w.env("noop")))
        time.sleep(0.002)  # the agent's worker closes the connection after its reply
        agent_ms.append(agent_cpu_ms(agent_pid) - before)
        samples["python"].append(w.timed_create("1", w.env("noop", agent=False)))
        samples["runc_plain"].append(runc_pair(plain))
        samples["runc_edited"].append(runc_pair(nohooks_dir))
        samples["runc_nohooks"].append(runc_pair(edited_dir))
        samples["runc_delete"].append(delete_by(w.runc))
        samples["tramp_delete"].append(delete_by(str(w.tramp)))
    m = {k: (median([x[0] for x in v]), median([x[1] for x in v])) for k, v in samples.items()}

    def less(a: str, b: str) -> Dict[str, float]:
        return {"ms": m[a][0] - m[b][0], "cpu": m[a][1] - m[b][1]}

    fast = less("fast", "noop")
    fast["cpu"] += median(agent_ms)
    return {
        "sh": less("sh", "noop"),
        "client": {"ms": m["client"][0], "cpu": m["client"][1]},
        "agent": {"ms": m["agent"][0], "cpu": m["agent"][1]},
        "served": {"cpu": median(agent_ms)},  # CPU only: the agent's wall is the fast path's
        "fast": fast,
        "python": less("python", "noop"),
        "mounts": less("runc_edited", "runc_plain"),
        "hooks": less("runc_nohooks", "runc_edited"),
        "delete": less("tramp_delete", "runc_delete"),
        "runc": {"ms": m["runc_plain"][0], "cpu": m["runc_plain"][1]},
    }


def rss_kib(pid: int) -> Dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":")[0]
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(line.split()[1])
    return out


def concurrent(w: World, n: int) -> Dict[str, float]:
    keys = []
    for i in range(n):
        b = w.work / f"c{i}"
        shutil.copytree(w.bundles["1"], b, symlinks=True)
        (b / "config.json").write_bytes(w.originals["1"])
        keys.append(b)
    env = w.env("noop")
    times: List[float] = [0.0] * n
    go = threading.Event()

    def one(i: int) -> None:
        go.wait()
        times[i] = wall(
            [str(w.tramp), "create", "--bundle", str(keys[i]), f"cc{i}"], env, check=True
        )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    go.set()
    for t in threads:
        t.join()
    total = (time.perf_counter() - t0) * 1000
    served = sum("nvshim.io/served-by" in (k / "config.json").read_text() for k in keys)
    ordered = sorted(times)
    return {
        "n": n,
        "median_ms": median(ordered),
        "p99_ms": ordered[int(0.99 * (n - 1))],
        "p99_over_median": ordered[int(0.99 * (n - 1))] / median(ordered),
        "all_done_ms": total,
        "served_by_agent": served,
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--concurrent", type=int, default=200)
    parser.add_argument("--runc", default=shutil.which("runc") or "/usr/sbin/runc")
    parser.add_argument("--out", default=str(REPO / "bench" / "agent-results.json"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/agent.py: needs root", file=sys.stderr)
        return 1
    results: Dict[str, Any] = {
        "rounds": args.rounds,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "nproc": os.cpu_count(),
        "load": os.getloadavg(),
    }
    from nvshim.runtime.plancache import PlanMemo, use_memo

    with tempfile.TemporaryDirectory(prefix="nvshim-bench-agent-") as tmp:
        w = World(Path(tmp) / "w8", 8, args.runc)
        agent = start_agent(w.configs["noop"], w.sock, w.work / "agent.log")
        try:
            use_memo(PlanMemo())  # this process plays the agent in "agent's create"
            w.create("1", w.env("noop"))  # warm
            gc.collect()  # and freezes what it holds, as the agent does after its warm-up
            gc.freeze()
            results["breakdown"] = breakdown(w, args.rounds, agent.pid)
            results["concurrent"] = concurrent(w, args.concurrent)
        finally:
            agent.terminate()
            agent.wait(30)
            use_memo(None)
        big = World(Path(tmp) / "w256", 256, args.runc)
        agent = start_agent(big.configs["noop"], big.sock, big.work / "agent.log")
        try:
            results["rss_idle_kib"] = rss_kib(agent.pid)
            for key in ("1", "all", "1", "all"):
                big.create(key, big.env("noop"))
            results["rss_256_gpus_kib"] = rss_kib(agent.pid)
        finally:
            agent.terminate()
            agent.wait(30)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(
        f"where a 1-GPU create's milliseconds go (median of {args.rounds} rounds; load "
        f"{results['load'][0]:.2f} at the start):"
    )
    print(f"  {'piece':66} {'wall ms':>8} {'cpu ms':>7}")
    for key, name in ROWS:
        row = results["breakdown"][key]
        shown = f"{row['ms']:8.2f}" if "ms" in row else f"{'-':>8}"
        print(f"  {name:66} {shown} {row['cpu']:7.2f}")
    c = results["concurrent"]
    print(
        f"{c['n']} concurrent creates through one agent: median {c['median_ms']:.1f} ms, "
        f"p99 {c['p99_ms']:.1f} ms (p99/median {c['p99_over_median']:.2f}), "
        f"served by the agent {c['served_by_agent']}/{c['n']}"
    )
    r = results["rss_256_gpus_kib"]
    print(
        f"agent with 256 GPUs: VmRSS {r['VmRSS'] / 1024:.1f} MiB, VmHWM "
        f"{r['VmHWM'] / 1024:.1f} MiB (idle {results['rss_idle_kib']['VmRSS'] / 1024:.1f})"
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
