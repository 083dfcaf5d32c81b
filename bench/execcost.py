"""What each program in the runtime fast path's chain costs just to start (issue 44 item 2).

Run from the repository root with a venv that has nvshim (root is not needed)::

    .venv/bin/python bench/execcost.py [--rounds 300]

A GPU create through the fast path runs, before runc: the trampoline's ``/bin/sh``, one
``grep -E`` over config.json and the static client (``nvshim-agent-client``); runc's floor
runs none of them. This times ``posix_spawn`` + ``waitpid`` of each, in rounds that take
them in turn (the order reversed every other round), and of a static program that returns
0 at once (built here with the C compiler the client is built with), the least any
process in the chain can cost:

- ``static``: the static no-op;
- ``true``: ``/bin/true`` (dynamically linked, what any dynamic program pays to load);
- ``sh``: ``/bin/sh -c :``;
- ``grep``: the trampoline's own ``grep -q -s -D skip -E`` with its patterns
  (:data:`nvshim.node.install.trampoline.MAJOR_PATTERN` and the fixed strings) over a
  1-GPU config.json as containerd writes it (one line);
- ``client``: the client built from this checkout (static, as shipped), asked to hand a
  create to a socket that does not exist (it exits 2 after one failed ``connect``).

Printed (JSON): each program's median wall time and its median per-round difference from
``static``; the load average before and after. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

#: A 1-GPU container's config.json as the engine hands it over (one line): what grep reads.
SPEC = {
    "ociVersion": "1.2.0",
    "process": {
        "args": ["sh", "-c", "true"],
        "env": [
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOSTNAME=bench",
            "NVIDIA_VISIBLE_DEVICES=0",
        ]
        + [f"VAR_{i}=value-{i}" for i in range(20)],
        "cwd": "/",
    },
    "root": {"path": "rootfs"},
    "mounts": [
        {"destination": d, "type": "bind", "source": f"/var/lib/x{d}", "options": ["rbind"]}
        for d in ("/etc/hosts", "/etc/resolv.conf", "/etc/hostname", "/dev/shm")
    ],
    "linux": {
        "resources": {"devices": [{"allow": False, "access": "rwm"}]},
        "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")],
    },
}


def spawn_ms(argv: Sequence[str]) -> float:
    """Wall ms of one posix_spawn + waitpid of ``argv``, its output discarded."""
    actions = [(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)]
    actions.append((os.POSIX_SPAWN_DUP2, 1, 2))
    start = time.perf_counter()
    pid = os.posix_spawn(argv[0], list(argv), os.environ, file_actions=actions)
    os.waitpid(pid, 0)
    return (time.perf_counter() - start) * 1000


def programs(tmp: Path) -> Dict[str, List[str]]:
    """The chain's programs, built or written in ``tmp``."""
    from nvshim.agent.client import build_client, compiler_of
    from nvshim.node.install.trampoline import MAJOR_PATTERN

    cc = compiler_of()
    if cc is None:
        raise SystemExit("bench/execcost.py: no C compiler for the static no-op and the client")
    (tmp / "noop.c").write_text("int main(void) { return 0; }\n")
    static = str(tmp / "noop")
    if os.spawnv(os.P_WAIT, cc, [cc, "-O2", "-static", "-o", static, str(tmp / "noop.c")]):
        raise SystemExit(f"bench/execcost.py: {cc} cannot build a static program")
    client = build_client(str(tmp / "client"))
    spec = tmp / "config.json"
    spec.write_text(json.dumps(SPEC, separators=(",", ":")))
    prefixes = tmp / "prefixes"
    prefixes.write_text("nvidia\\.com/\n")
    grep = "/usr/bin/grep" if os.path.exists("/usr/bin/grep") else "/bin/grep"
    fixed = ["NVIDIA_", "CUDA_VERSION", "nvidia-container-devices", "/dev/nvidia"]
    fixed += ["nvidia-container-runtime-hook", "\\\\u", "\\\\/", MAJOR_PATTERN]
    grep_argv = [grep, "-q", "-s", "-D", "skip", "-E"]
    for pattern in fixed:
        grep_argv += ["-e", pattern]
    grep_argv += ["-f", str(prefixes), "--", str(spec)]
    socket = str(tmp / "no-agent.sock")
    return {
        "static": [static],
        "true": ["/bin/true"],
        "sh": ["/bin/sh", "-c", ":"],
        "grep": grep_argv,
        "client": [client, socket, "0", str(tmp / "config.yaml"), static, str(tmp), "create"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="nvshim-execcost-") as tmp:
        chain = programs(Path(tmp))
        names = list(chain)
        times: Dict[str, List[float]] = {name: [] for name in names}
        for name in names:  # warm the page cache: the first spawn of each reads it in
            spawn_ms(chain[name])
        for round_ in range(args.rounds):
            for name in names if round_ % 2 == 0 else reversed(names):
                times[name].append(spawn_ms(chain[name]))
    out: Dict[str, object] = {
        "rounds": args.rounds,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "nproc": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    for name in names:
        diffs = [a - b for a, b in zip(times[name], times["static"], strict=True)]
        out[name] = {
            "median_ms": round(statistics.median(times[name]), 3),
            "over_static_ms": round(statistics.median(diffs), 3),
        }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
