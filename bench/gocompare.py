"""nvshim against NVIDIA's Go runtime in CDI mode, on the same 1-GPU work, one interleaved run.

Run as root from the repository root with this checkout's interpreter (NVIDIA's Go
runtime is built on the first run, below)::

    .venv/bin/python bench/gocompare.py [--rounds 60] [--go-bin DIR]
        [--out bench/gocompare-results.json]

It reuses ``bench/run.py``'s world (busybox bundles, the simulated 8-GPU node, the compiled
nvshim config, the CDI spec ``nvshim cdi generate`` wrote for that node) and times, in every
round and in an order that flips every round, ``create`` then ``delete`` of the 1-GPU bundle
(``NVIDIA_VISIBLE_DEVICES=0``; each subject its own copy) through:

* ``runc``: runc alone (the baseline every other row is compared with, round by round);
* ``nvshim fast``: this checkout's trampoline with the C client and a running
  ``nvshim agent`` (the fast path);
* ``nvshim fast cdi``: the same for the bundle asking ``NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0``
  (a CDI name: nvshim reads its own spec);
* ``nvshim in-process``: the same trampoline with ``NVSHIM_AGENT_SOCKET=none`` (Python
  starts, as without an agent);
* ``go cdi``: NVIDIA's ``nvidia-container-runtime`` with ``mode = "cdi"``, its ``runtimes``
  the same runc, reading a CDI spec made from nvshim's for the same node: the same device
  nodes and mounts, and the four ``createContainer`` hooks ``nvidia-ctk cdi generate`` writes
  for a driver (``nvidia-cdi-hook create-symlinks`` with nvshim's links,
  ``enable-cuda-compat --host-driver-version=…``, ``update-ldcache --folder …`` and
  ``disable-device-node-modification``) instead of nvshim's. ``NVIDIA_VISIBLE_DEVICES=0``
  becomes ``nvidia.com/gpu=0`` through ``default-kind``.

Each round also times each runtime's **floor**: runc on the config.json that runtime
wrote (captured from its checked create below, with the files it added beside it), on a
fresh rootfs: the device nodes, mounts and hooks it asks for, without the runtime. The
table gives each floor, its per-round difference to runc, and each runtime's per-round
difference to its own floor; then nvshim's over-floor time against Go's.

Before the timed rounds, one create of each subject is checked: its config.json must name
``/dev/nvidia0`` in ``linux.devices`` and hold the libraries' mounts (the Go runtime really
injected); the counts of devices, mounts and hooks each subject wrote are printed. Every
create meets the engine's config.json and a rootfs without what an earlier create added.

Printed per subject: the median ``create`` wall ms, and the median over rounds of the
difference to runc's create in the same round (``create added``) and of create+delete
(``lifecycle added``); then ``nvshim added / Go added`` for both (issue 34's target for the
1-GPU create: ≤ 0.45). ``cpu`` is the caller's CPU (``wait4``: the runtime, runc, what they
waited for; not the createContainer hooks, which runc's init runs, nor the agent's); the
agent's own CPU per create is given apart (its ``/proc`` utime+stime, a mean over rounds:
clock-tick resolution). Nothing here asserts on time.

NVIDIA's Go runtime (a benchmark artifact only: never committed)
----------------------------------------------------------------
Built from NVIDIA's published Go module, ``github.com/NVIDIA/nvidia-container-toolkit`` at
the version ``tests/go/nvidia-toolkit/go.mod`` pins (v1.20.x), through the Go module proxy,
by the tests' helper (:func:`tests.helpers.gobuild.go_programs`, the same build the
Kubernetes and e2e tests use: ``nvidia-container-runtime``, ``nvidia-ctk`` and
``nvidia-cdi-hook``, cgo, kept in the helper's cache and built once). It needs Go (``go``
on PATH or ``/usr/local/go/bin/go``) and gcc. ``--go-bin DIR`` takes a folder holding those
programs instead.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.run import Bench, Floor, _tree, machine, start_agent, timed  # noqa: E402

SUBJECTS = ("runc", "nvshim fast", "nvshim fast cdi", "nvshim in-process", "go cdi")


def toolkit_bin() -> Path:
    """NVIDIA's toolkit programs built from the published module (the tests' Go helper)."""
    from tests.helpers.gobuild import go_programs

    try:
        return go_programs("nvidia-toolkit")
    except BaseException as exc:  # pytest.skip (no Go) is a BaseException; a failed build
        raise SystemExit(
            f"bench/gocompare.py: cannot build NVIDIA's toolkit from "
            f"tests/go/nvidia-toolkit: {str(exc).splitlines()[0]}"
        ) from exc


def go_spec(nvshim_spec: Path, hook: str, out: Path) -> None:
    """NVIDIA's spec for the node nvshim's spec describes: the same devices and mounts,
    NVIDIA's four createContainer hooks (as ``nvidia-ctk cdi generate`` writes them for a
    driver, ``pkg/nvcdi/driver-nvml.go``) in place of nvshim's."""
    import yaml

    spec = yaml.safe_load(nvshim_spec.read_text())
    edits = spec["containerEdits"]
    links: List[str] = []
    version, folders = "", []
    for h in edits.get("hooks", []):
        args = h.get("args", [])
        for i, a in enumerate(args[:-1]):
            if a == "--link":
                links.append(args[i + 1])
            elif a == "--host-driver-version":
                version = args[i + 1]
            elif a == "--folder":
                folders.append(args[i + 1])

    def one(*args: str) -> Dict[str, Any]:
        return {
            "hookName": "createContainer",
            "path": hook,
            "args": ["nvidia-cdi-hook", *args],
            "env": ["NVIDIA_CTK_DEBUG=false"],
        }

    hooks = [one("create-symlinks", *[w for link in links for w in ("--link", link)])]
    if version:
        hooks.append(one("enable-cuda-compat", f"--host-driver-version={version}"))
    hooks.append(one("update-ldcache", *[w for f in folders for w in ("--folder", f)]))
    hooks.append(one("disable-device-node-modification"))
    edits["hooks"] = hooks
    edits.setdefault("env", []).append("NVIDIA_CTK_LIBCUDA_DIR=" + ":".join(folders))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(spec, indent=1) + "\n")


def go_config(path: Path, runc: str, spec_dir: Path, go_bin: str) -> None:
    """config.toml for ``mode = "cdi"`` (no debug file, log level info: the toolkit's
    defaults, without the per-call debug log)."""
    path.write_text(
        "[nvidia-container-runtime]\n"
        'mode = "cdi"\n'
        'log-level = "info"\n'
        f'runtimes = ["{runc}"]\n'
        "[nvidia-container-runtime.modes.cdi]\n"
        'default-kind = "nvidia.com/gpu"\n'
        f'spec-dirs = ["{spec_dir}"]\n'
        'annotation-prefixes = ["cdi.k8s.io/"]\n'
        "[nvidia-ctk]\n"
        f'path = "{go_bin}/nvidia-ctk"\n'
    )


def agent_cpu_ms(pid: int) -> float:
    """utime + stime of process ``pid`` (every thread, the finished ones too), in ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000.0 / os.sysconf("SC_CLK_TCK")


def injected(config: Path) -> Dict[str, int]:
    """Devices, mounts and hooks in a config.json, and whether /dev/nvidia0 is there."""
    spec = json.loads(config.read_text())
    devices = [d.get("path") for d in spec.get("linux", {}).get("devices") or []]
    hooks = spec.get("hooks") or {}
    return {
        "devices": len(devices),
        "nvidia0": int("/dev/nvidia0" in devices),
        "mounts": len(spec.get("mounts") or []),
        "hooks": sum(len(v) for v in hooks.values()),
        "served_by_agent": int("nvshim.io/served-by" in (spec.get("annotations") or {})),
    }


def own_bundles(b: Bench, keys: Tuple[str, ...]) -> None:
    """A copy of the 1-GPU bundle per key, so that each subject's creates meet a rootfs
    only its own earlier creates (and their removal) went through: a directory the other
    subjects' files came and went in ran slower for the one using it."""
    from tests.helpers.bundle import make_bundle

    for key in keys:
        b.bundles[key] = make_bundle(
            b.work / f"b-{key}", b.work / "rootfs", ["true"], env={"NVIDIA_VISIBLE_DEVICES": "0"}
        )
        b.originals[key] = (b.bundles[key] / "config.json").read_bytes()
        b.rootfs_paths[key] = _tree(b.bundles[key] / "rootfs")
        b.bundle_names[key] = set(os.listdir(b.bundles[key]))


class Subject:
    """One row: a runtime on its own bundle, or (``floor`` given) runc on the bundle as
    that runtime's create left it (:class:`bench.run.Floor`)."""

    def __init__(
        self, name: str, tool: str, env: Dict[str, str], key: str, floor: Optional[Floor] = None
    ) -> None:
        self.name, self.tool, self.env, self.key, self.floor = name, tool, env, key, floor
        self.create: List[Tuple[float, float]] = []
        self.delete: List[Tuple[float, float]] = []
        self.captured: Optional[Floor] = None


def run(b: Bench, s: Subject, check: bool = False) -> Optional[Dict[str, int]]:
    """One create + delete of ``s``'s bundle; with ``check``, what its create wrote (and
    the bundle it left, kept as ``s.captured`` for its floor)."""
    b.restore(s.key, s.floor)
    cid = b.cid("go")
    b.live.append(cid)
    bundle = str(b.bundles[s.key])
    ms, _, cpu = timed(b.rt(s.tool, "create", "--bundle", bundle, cid), env=s.env)
    s.create.append((ms, cpu))
    seen = injected(b.bundles[s.key] / "config.json") if check else None
    if check:
        s.captured = b.floor(s.key)
    ms, _, cpu = timed(b.rt(s.tool, "delete", cid), env=s.env)
    b.live.remove(cid)
    s.delete.append((ms, cpu))
    return seen


def _lifecycle(s: Subject) -> Tuple[List[float], List[float], List[float]]:
    """Per round: create ms, create+delete ms, create+delete CPU ms."""
    return (
        [c[0] for c in s.create],
        [c[0] + d[0] for c, d in zip(s.create, s.delete, strict=True)],
        [c[1] + d[1] for c, d in zip(s.create, s.delete, strict=True)],
    )


def _per_round(xs: List[float], ys: List[float], ratio: bool = False) -> float:
    """The median over rounds of ``x - y`` (or ``x / y``), each pair from one round."""
    return statistics.median(x / y if ratio else x - y for x, y in zip(xs, ys, strict=True))


def report(
    subjects: List[Subject], floors: Dict[str, Subject], agent_ms: List[float]
) -> Dict[str, Any]:
    """Each subject against runc (``subjects[0]``) and against its own floor, per round."""
    b_create, b_life, b_cpu = _lifecycle(subjects[0])
    out: Dict[str, Any] = {}
    for s in subjects:
        create, life, cpu = _lifecycle(s)
        out[s.name] = {
            "create_ms": statistics.median(create),
            "lifecycle_ms": statistics.median(life),
            "create_added_ms": _per_round(create, b_create),
            "lifecycle_added_ms": _per_round(life, b_life),
            "lifecycle_ratio": _per_round(life, b_life, ratio=True),
            "cpu_added_ms": _per_round(cpu, b_cpu),
            "create_samples": [round(x, 3) for x in create],
            "lifecycle_samples": [round(x, 3) for x in life],
        }
        floor = floors.get(s.name)
        if floor is not None:
            f_create, f_life, f_cpu = _lifecycle(floor)
            out[s.name].update(
                {
                    "floor_create_ms": statistics.median(f_create),
                    "floor_lifecycle_ms": statistics.median(f_life),
                    "floor_lifecycle_over_runc_ms": _per_round(f_life, b_life),
                    "create_over_floor_ms": _per_round(create, f_create),
                    "lifecycle_over_floor_ms": _per_round(life, f_life),
                    "cpu_over_floor_ms": _per_round(cpu, f_cpu),
                    "floor_lifecycle_samples": [round(x, 3) for x in f_life],
                }
            )
    out["nvshim fast"]["agent_cpu_ms_mean"] = statistics.mean(agent_ms) if agent_ms else None
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument(
        "--go-bin",
        default=None,
        help="folder with nvidia-container-runtime, nvidia-ctk and "
        "nvidia-cdi-hook (default: built from NVIDIA's published module, "
        "tests/go/nvidia-toolkit)",
    )
    parser.add_argument("--runc", default=shutil.which("runc") or "/usr/sbin/runc")
    parser.add_argument("--out", default=str(REPO / "bench" / "gocompare-results.json"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/gocompare.py: needs root", file=sys.stderr)
        return 1
    if args.go_bin is None:
        args.go_bin = str(toolkit_bin())
    go_runtime = os.path.join(args.go_bin, "nvidia-container-runtime")
    go_hook = os.path.join(args.go_bin, "nvidia-cdi-hook")
    for path in (go_runtime, go_hook, args.runc):
        if not os.access(path, os.X_OK):
            print(f"bench/gocompare.py: {path} is not executable", file=sys.stderr)
            return 1
    from nvshim.agent.client import build_client
    from nvshim.node.install.trampoline import render

    results: Dict[str, Any] = {"rounds": args.rounds, "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="nvshim-gocompare-") as tmp:
        work = Path(tmp)
        b = Bench(work, "", args.runc, [sys.executable, "-I", "-m", "nvshim.cli.main"])
        agent = None
        try:
            b.setup()
            own_bundles(b, ("1-fast", "1-in-process", "1-go"))
            client = build_client(str(work / "nvshim-agent-client"))
            sock = work / "agent.sock"
            tramp = work / "nvshim-runtime"
            tramp.write_text(render(sys.executable, agent_socket=str(sock), client=client))
            tramp.chmod(0o755)
            agent = start_agent(b.config, sock, work / "agent.log")
            go_spec(work / "cdi" / "nvidia.yaml", go_hook, work / "go-cdi" / "nvidia.json")
            go_config(work / "go-config.toml", args.runc, work / "go-cdi", args.go_bin)
            go_env = dict(b.env, NVIDIA_CTK_CONFIG_FILE_PATH=str(work / "go-config.toml"))
            go_env.pop("NVSHIM_CONFIG", None)
            subjects = [
                Subject("runc", args.runc, b.env, "1"),
                Subject(
                    "nvshim fast", str(tramp), dict(b.env, NVSHIM_AGENT_SOCKET=str(sock)), "1-fast"
                ),
                Subject(
                    "nvshim fast cdi", str(tramp), dict(b.env, NVSHIM_AGENT_SOCKET=str(sock)), "cdi"
                ),
                Subject(
                    "nvshim in-process",
                    str(tramp),
                    dict(b.env, NVSHIM_AGENT_SOCKET="none"),
                    "1-in-process",
                ),
                Subject("go cdi", go_runtime, go_env, "1-go"),
            ]
            seen: Dict[str, Any] = {}
            for s in subjects:  # warm-up and the check that each one injected
                seen[s.name] = run(b, s, check=True)
                fast = s.name.startswith("nvshim fast")
                if (s.name != "runc" and not seen[s.name]["nvidia0"]) or (
                    fast and not seen[s.name]["served_by_agent"]
                ):
                    raise SystemExit(
                        f"bench/gocompare.py: {s.name} did not inject "
                        f"/dev/nvidia0 (or the agent did not serve it): "
                        f"{seen[s.name]}"
                    )
                s.create.clear()
                s.delete.clear()
            results["injected"] = seen
            # each runtime's floor: runc on the bundle its checked create left
            floors = {
                s.name: Subject(f"floor of {s.name}", args.runc, b.env, s.key, s.captured)
                for s in subjects[1:]
                if s.captured is not None
            }
            for f in floors.values():  # one untimed create each: the floor must run
                run(b, f)
                f.create.clear()
                f.delete.clear()
            everyone = subjects + list(floors.values())
            agent_ms: List[float] = []
            for i in range(args.rounds):
                order = everyone if i % 2 == 0 else everyone[::-1]
                for s in order:
                    before = agent_cpu_ms(agent.pid) if s.name == "nvshim fast" else 0.0
                    run(b, s)
                    if s.name == "nvshim fast":
                        agent_ms.append(agent_cpu_ms(agent.pid) - before)
            results["subjects"] = report(subjects, floors, agent_ms)
        finally:
            b.cleanup()
            if agent is not None:
                agent.terminate()
                agent.wait(30)
    results["load_after"] = os.getloadavg()
    results["machine"] = machine(args.runc, "this checkout's trampoline")
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print_report(results)
    print(f"\nwrote {args.out}")
    return 0


def print_report(results: Dict[str, Any]) -> None:
    print(
        f"{results['rounds']} rounds, order flipped each round; load "
        f"{results['load_before'][0]:.2f} before, {results['load_after'][0]:.2f} after"
    )
    print("what each create wrote (devices, mounts, hooks):")
    for name, seen in results["injected"].items():
        print(
            f"  {name:20} {seen['devices']:3d} devices {seen['mounts']:3d} mounts "
            f"{seen['hooks']:2d} hooks"
            + ("  (served by the agent)" if seen["served_by_agent"] else "")
        )
    print(
        "floor: runc on the config.json the subject wrote, fresh rootfs (its mounts, "
        "device nodes and hooks; not the runtime); +ms: over runc, per round; floor +ms: "
        "the floor over runc; over floor: the subject over its own floor (create+delete)"
    )
    head = (
        f"{'subject':20} {'create ms':>10} {'create +ms':>11} {'create+delete':>14} "
        f"{'+ms':>7} {'ratio':>6} {'floor':>7} {'floor +ms':>9} {'over floor':>10} "
        f"{'+cpu ms':>8}"
    )
    print(head)
    print("-" * len(head))
    subj = results["subjects"]
    for name in SUBJECTS:
        r = subj[name]
        floor = (
            f"{r['floor_lifecycle_ms']:7.1f} {r['floor_lifecycle_over_runc_ms']:+9.1f} "
            f"{r['lifecycle_over_floor_ms']:+10.1f}"
            if "floor_lifecycle_ms" in r
            else f"{'':7} {'':9} {'':10}"
        )
        print(
            f"{name:20} {r['create_ms']:10.1f} {r['create_added_ms']:+11.1f} "
            f"{r['lifecycle_ms']:14.1f} {r['lifecycle_added_ms']:+7.1f} "
            f"{r['lifecycle_ratio']:5.2f}x {floor} {r['cpu_added_ms']:+8.1f}"
        )
    agent = subj["nvshim fast"].get("agent_cpu_ms_mean")
    if agent is not None:
        print(
            f"the agent's own CPU per fast-path create: {agent:.1f} ms (a mean of clock-tick "
            "samples: coarse; bench/agent.py measures it precisely)"
        )
    go = subj["go cdi"]
    for name in ("nvshim fast", "nvshim fast cdi", "nvshim in-process"):
        r = subj[name]
        c = r["create_added_ms"] / go["create_added_ms"] if go["create_added_ms"] else float("nan")
        lc = (
            r["lifecycle_added_ms"] / go["lifecycle_added_ms"]
            if go["lifecycle_added_ms"]
            else float("nan")
        )
        print(f"{name + ' / go cdi':32} create added {c:5.2f}x   lifecycle added {lc:5.2f}x")
    if "lifecycle_over_floor_ms" in go and go["lifecycle_over_floor_ms"]:
        for name in ("nvshim fast", "nvshim fast cdi", "nvshim in-process"):
            r = subj[name]
            if "lifecycle_over_floor_ms" in r:
                print(
                    f"{name + ' / go cdi':32} lifecycle over own floor "
                    f"{r['lifecycle_over_floor_ms'] / go['lifecycle_over_floor_ms']:5.2f}x"
                )


if __name__ == "__main__":
    sys.exit(main())
