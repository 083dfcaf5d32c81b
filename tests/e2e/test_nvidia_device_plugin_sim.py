"""NVIDIA's k8s-device-plugin (v0.17.4, built from its Go module) on simulated nodes of 1, 8
and 256 GPUs and one with MIG, asked as the kubelet asks it (ListAndWatch, Allocate over
its gRPC socket): it lists what the node's model holds and allocates in NVIDIA's
``envvar``, ``volume-mounts`` and ``cdi-annotations`` strategies (the last with a CDI spec
of its own, for the driver root as it sees it). tests/k8s/test_nvidia_device_plugin.py runs it
with the real kubelet; this asks it directly, on the node sizes the cluster does not.

The plugin asks the node's libnvidia-ml (``LD_LIBRARY_PATH``) and serves under
``/var/lib/kubelet/device-plugins/`` whatever it is told: it runs in a private mount
namespace (proved so before anything is mounted) where that path is a directory of the
test's, with no kubelet to register with (``--kubelet-socket ""``), and where
``/proc/driver`` shows the node's procfs tree (NVIDIA reads MIG capabilities from the
host's ``/proc`` whatever its driver root).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from tests.helpers.common import require_root, wait_until
from tests.helpers.deviceplugin import DEVICE_LIST_DIR, ask_plugin

pytestmark = pytest.mark.e2e


def serving(
    tmp: Path, root: str, strategy: str, mig: str
) -> Tuple["subprocess.Popen[bytes]", Path, Path]:
    from tests.helpers.gobuild import go_programs

    binary = go_programs("nvidia-device-plugin") / "nvidia-device-plugin"
    hook = go_programs("nvidia-toolkit") / "nvidia-cdi-hook"
    sockets = tmp / "device-plugins"
    sockets.mkdir()
    (tmp / "cdi").mkdir()
    log = tmp / "plugin.log"
    outside = os.readlink("/proc/self/ns/mnt")
    script = (
        f'[ "$(readlink /proc/self/ns/mnt)" != "{outside}" ] || '
        '{ echo "not in a private mount namespace: nothing mounted" >&2; exit 99; }\n'
        "mount -t tmpfs -o size=64k nvshim-dp /var/lib\n"
        # NVIDIA reads MIG capabilities from the host's /proc whatever its driver
        # root: the node's, as a host with this driver loaded shows them
        "mount -t tmpfs -o size=4m nvshim-dp /proc/driver\n"
        f"cp -a {root}/proc/driver/nvidia {root}/proc/driver/nvidia-caps /proc/driver/\n"
        "mkdir -p /var/lib/kubelet/device-plugins\n"
        f"mount --bind {sockets} /var/lib/kubelet/device-plugins\n"
        # its CDI spec goes to /var/run/cdi whatever it is told: the test's folder
        "mount -t tmpfs -o size=64k nvshim-dp /run\n"
        f"mkdir -p /run/cdi && mount --bind {tmp / 'cdi'} /run/cdi\n"
        'exec "$@"\n'
    )
    argv = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "sh",
        str(binary),
        "--kubelet-socket",
        "",
        "--driver-root",
        root,
        "--dev-root",
        root,
        "--driver-root-ctr-path",
        root,
        "--nvidia-cdi-hook-path",
        str(hook),
        "--device-list-strategy",
        strategy,
        "--mig-strategy",
        mig,
    ]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env={**os.environ, "LD_LIBRARY_PATH": f"{root}/usr/lib/x86_64-linux-gnu"},
            start_new_session=True,
        )
    return proc, sockets, log


@pytest.fixture
def stop_after() -> Iterator[List["subprocess.Popen[bytes]"]]:
    procs: List["subprocess.Popen[bytes]"] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.mark.parametrize(
    "gpus,mig,strategy",
    [
        (1, False, "envvar"),
        (8, False, "volume-mounts"),
        (256, False, "envvar"),
        (3, True, "envvar"),
        (8, False, "cdi-annotations"),
    ],
    ids=["1-gpu", "8-gpus", "256-gpus", "mig", "8-gpus-cdi"],
)
def test_nvidias_plugin_lists_and_allocates_the_model(
    tmp_path: Path, stop_after: List["subprocess.Popen[bytes]"], gpus: int, mig: bool, strategy: str
) -> None:
    """NVIDIA's device plugin, on the simulated node's NVML, lists every GPU of the model by UUID as a healthy nvidia.com/gpu (with MIG, mig-strategy mixed: the MIG-enabled GPU's MIG devices as nvidia.com/mig-<profile> instead of it), and allocates one in its strategy: NVIDIA_VISIBLE_DEVICES=<uuid> (envvar) or /dev/null at /var/run/nvidia-container-devices/<uuid> (volume-mounts)."""
    require_root()
    from nvshim.sim.build import create_node

    node = create_node(str(tmp_path / "node"), gpus=gpus, mig=mig)
    proc, sockets, log = serving(tmp_path, node.root, strategy, "mixed" if mig else "none")
    stop_after.append(proc)
    gpu_sock = sockets / "nvidia-gpu.sock"
    wait_until(
        lambda: proc.poll() is not None or gpu_sock.exists(), 120, "NVIDIA's device plugin to serve"
    )
    assert proc.poll() is None, log.read_text()[-3000:]
    time.sleep(0.2)
    whole = [g.uuid for g in node.gpus if not g.mig]
    devices, answer = ask_plugin(gpu_sock, allocate=whole[:1])
    assert sorted(devices) == sorted((u, "Healthy") for u in whole)
    if strategy == "envvar":
        assert answer["envs"].get("NVIDIA_VISIBLE_DEVICES") == whole[0], answer
    elif strategy == "cdi-annotations":
        # the annotation names its own spec's device; that spec, which nvshim reads like
        # any other, gives each UUID the device node the model gives it
        ((key, value),) = answer["annotations"].items()
        assert key.startswith("cdi.k8s.io/nvidia-device-plugin_"), answer
        assert value == f"k8s.device-plugin.nvidia.com/gpu={whole[0]}", answer
        spec = json.loads((tmp_path / "cdi" / "k8s.device-plugin.nvidia.com-gpu.json").read_text())
        nodes = {
            d["name"]: [n["hostPath"] for n in d["containerEdits"]["deviceNodes"]]
            for d in spec["devices"]
        }
        assert nodes == {g.uuid: [f"{node.root}/dev/nvidia{g.minor}"] for g in node.gpus}
        listed = subprocess.run(
            [
                shutil.which("nvshim") or "nvshim",
                "cdi",
                "list",
                "--spec-dir",
                str(tmp_path / "cdi"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert listed.returncode == 0, listed.stderr
        assert sorted(listed.stdout.split()) == sorted(
            f"k8s.device-plugin.nvidia.com/gpu={u}" for u in whole
        )
    else:
        assert answer["envs"].get("NVIDIA_VISIBLE_DEVICES") == DEVICE_LIST_DIR, answer
        assert answer["mounts"] == [(f"{DEVICE_LIST_DIR}/{whole[0]}", "/dev/null")], answer
    if mig:
        migs = [m for g in node.gpus for m in g.mig]
        profiles = {m.profile for m in migs}
        for profile in profiles:
            sock = sockets / f"nvidia-mig-{profile}.sock"
            wait_until(sock.exists, 30, f"the plugin's {profile} socket")
            devices, answer = ask_plugin(sock, allocate=[migs[0].uuid])
            assert sorted(devices) == sorted(
                (m.uuid, "Healthy") for m in migs if m.profile == profile
            )
            assert answer["envs"].get("NVIDIA_VISIBLE_DEVICES") == migs[0].uuid, answer
    assert "symbol lookup error" not in log.read_text()
