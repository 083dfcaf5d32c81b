"""What ``verify-with: kubelet`` adds to a GPU create.

Run as root from the repository root with the installed venv's interpreter::

    /opt/nvshim/venv/bin/python bench/kubelet.py [--runs 30] [--pods 110]

It starts a PodResources server (tests/helpers/podresources.py: real gRPC on a unix
socket) reporting ``--pods`` pods with one GPU container each (110 is the kubelet's default
pod limit), builds a simulated 4-GPU node and a bundle with containerd's CRI annotations
and a UUID claim, and times, in alternating pairs, ``nvshim-runtime create`` (Python entry,
``-I``, low-level runtime ``/bin/true`` so only nvshim's work is measured) with
``verify-with: none``, with ``verify-with: kubelet`` answered by the PodResources API (no
checkpoint) and answered by the device manager checkpoint (the same 110 pods written as the
kubelet writes them; no gRPC call). It also times ``import grpc`` alone
in a fresh interpreter and one ``List`` call from a warm process. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


#: no verification; verified by the PodResources API; verified by the checkpoint
MODES = ("none", "kubelet", "checkpoint")


def ms(samples: List[float]) -> str:
    return (
        f"median {statistics.median(samples):.1f} ms "
        f"[{min(samples):.1f}–{max(samples):.1f}] over {len(samples)}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--pods", type=int, default=110)
    args = parser.parse_args()

    from nvshim.node.compile import compile_config
    from nvshim.sim.build import create_node
    from tests.helpers.podresources import PodResourcesServer

    with tempfile.TemporaryDirectory(prefix="nvshim-bench-kubelet-") as tmp:
        work = Path(tmp)
        node = create_node(str(work / "node"), gpus=4)
        gpu = node.gpus[1]
        server = PodResourcesServer(str(work / "kubelet.sock")).start()
        pods = [
            (
                "ns",
                f"pod-{i}",
                {"main": {"nvidia.com/gpu": [f"GPU-{i:08d}-0000-0000-0000-000000000000"]}},
            )
            for i in range(args.pods - 1)
        ]
        server.set(pods + [("team", "mine", {"main": {"nvidia.com/gpu": [gpu.uuid]}})])
        spec = {
            "process": {"env": ["PATH=/bin", f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}"]},
            "root": {"path": "rootfs"},
            "annotations": {
                "io.kubernetes.cri.container-type": "container",
                "io.kubernetes.cri.sandbox-name": "mine",
                "io.kubernetes.cri.sandbox-namespace": "team",
                "io.kubernetes.cri.sandbox-uid": "u",
                "io.kubernetes.cri.container-name": "main",
            },
        }
        original = json.dumps(spec, indent=2).encode()
        bundle = work / "bundle"
        bundle.mkdir()
        checkpoint = work / "kubelet_internal_checkpoint"
        checkpoint.write_text(
            json.dumps(
                {
                    "Data": {
                        "PodDeviceEntries": [
                            {
                                "PodUID": "u" if pod == "mine" else f"uid-{pod}",
                                "ContainerName": "main",
                                "ResourceName": "nvidia.com/gpu",
                                "DeviceIDs": {"0": c["main"]["nvidia.com/gpu"]},
                                "AllocResp": "",
                            }
                            for _, pod, c in server.pods
                        ],
                        "RegisteredDevices": {},
                    },
                    "Checksum": 0,
                }
            )
        )
        configs: Dict[str, Path] = {}
        for mode in MODES:
            cfg = work / mode / "config.yaml"
            cfg.parent.mkdir()
            cfg.write_text(
                f"runtimes: [/bin/true]\ndriver-root: {node.root}\nrequire-allocation: true\n"
                f"verify-with: {'none' if mode == 'none' else 'kubelet'}\n"
                f"kubelet-socket: {work / 'kubelet.sock'}\n"
                f"kubelet-checkpoint: {checkpoint if mode == 'checkpoint' else 'null'}\n"
                "grants-journal: null\n"
            )
            compile_config(str(cfg))
            configs[mode] = cfg

        def create(mode: str) -> float:
            (bundle / "config.json").write_bytes(original)
            env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVSHIM_CONFIG": str(configs[mode])}
            start = time.perf_counter()
            subprocess.run(
                [
                    sys.executable,
                    "-I",
                    "-m",
                    "nvshim.runtime.main",
                    "create",
                    "--bundle",
                    str(bundle),
                    "c",
                ],
                env=env,
                check=True,
                cwd=str(REPO),
            )
            return (time.perf_counter() - start) * 1000

        samples: Dict[str, List[float]] = {mode: [] for mode in MODES}
        for mode in MODES:
            create(mode)  # warm the page cache
        for i in range(args.runs):
            for mode in MODES if i % 2 == 0 else MODES[::-1]:
                samples[mode].append(create(mode))
        diffs = [k - n for k, n in zip(samples["kubelet"], samples["none"], strict=True)]
        ckpt_diffs = [k - n for k, n in zip(samples["checkpoint"], samples["none"], strict=True)]

        imports = []
        for _ in range(args.runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-I", "-c", "import grpc"], check=True)
            imports.append((time.perf_counter() - start) * 1000)
        baseline = []
        for _ in range(args.runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-I", "-c", "pass"], check=True)
            baseline.append((time.perf_counter() - start) * 1000)

        import grpc

        from nvshim.runtime.allocation.kubelet import LIST_METHOD, decode_list_response

        calls = []
        with grpc.insecure_channel(f"unix://{work / 'kubelet.sock'}") as channel:
            lister = channel.unary_unary(
                LIST_METHOD,
                request_serializer=lambda b: b,
                response_deserializer=decode_list_response,
            )
            for _ in range(args.runs):
                start = time.perf_counter()
                lister(b"", timeout=2.0)
                calls.append((time.perf_counter() - start) * 1000)
        server.stop()

    print(f"pods reported by the kubelet: {args.pods}")
    print(f"create, verify-with none:     {ms(samples['none'])}")
    print(f"create, verify via the API:   {ms(samples['kubelet'])}")
    print(f"create, verify via checkpoint: {ms(samples['checkpoint'])}")
    print(f"per-run difference, API:        median {statistics.median(diffs):+.1f} ms")
    print(f"per-run difference, checkpoint: median {statistics.median(ckpt_diffs):+.1f} ms")
    print(f"python -I -c 'import grpc':   {ms(imports)} (bare interpreter {ms(baseline)})")
    print(f"one List call, warm channel:  {ms(calls)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
