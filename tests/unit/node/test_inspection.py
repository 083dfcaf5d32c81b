"""node/inspection and `nvshim inspect`: what the command shows of a create plan."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from nvshim.cli.cmd_inspect import inspect
from nvshim.config import Config
from nvshim.node.inspection import env_set, plan_diff, plan_summary, render_text
from nvshim.runtime.create import plan_create
from tests.helpers.commands import nvshim_cli

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod)")


def bundle_with(tmp_path: Path, env: list) -> Path:
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    spec = {"ociVersion": "1.0.2", "process": {"env": env, "cwd": "/"}, "root": {"path": "rootfs"}}
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


@needs_root
def test_a_granted_gpu_is_summarised_rendered_and_diffed(tmp_path: Path) -> None:
    """A request for GPU 1 of two: the summary grants index 1 by its minor, the text lists it
    and says config.json would be rewritten, and the diff adds its device node."""
    from nvshim.sim.build import create_node

    sim = create_node(str(tmp_path / "node"), gpus=2)
    gpu = sim.gpus[1]
    bundle = bundle_with(tmp_path, ["NVIDIA_VISIBLE_DEVICES=1"])
    config = Config(driver_root=sim.root)
    plan = plan_create(str(bundle), config)
    summary = plan_summary(plan, config)
    assert summary["requested"] == ["1"]
    assert [g["index"] for g in summary["granted_gpus"]] == [1]
    assert summary["granted_gpus"][0]["minor"] == gpu.minor
    assert f"/dev/nvidia{gpu.minor}" in summary["device_nodes"]
    assert [p for p in summary["device_nodes"] if p[len("/dev/nvidia") :].isdigit()] == [
        f"/dev/nvidia{gpu.minor}"
    ]  # and no other GPU's node
    assert summary["changes_config"] is True
    assert summary["env_set"] == env_set(plan) == ["NVIDIA_VISIBLE_DEVICES=void"]
    json.dumps(summary)  # plain JSON values only
    lines = render_text(plan, config).splitlines()
    assert lines[0] == f"bundle:        {bundle / 'config.json'}"
    assert f"granted GPUs:  1  {gpu.uuid}" in lines
    assert f"GPU 1:         /dev/nvidia{gpu.minor}  {gpu.pci_bus_id}  {gpu.model}" in lines
    assert "config.json:   would be rewritten" in lines
    diff = plan_diff(plan)
    assert diff.startswith("--- config.json\n+++ config.json (after nvshim)\n")
    assert f'"/dev/nvidia{gpu.minor}"' in diff


def test_a_bundle_that_asks_for_nothing_shows_no_change(tmp_path: Path) -> None:
    """No request: nothing granted, no env set, an empty diff, and the text says config.json
    stays byte-identical."""
    bundle = bundle_with(tmp_path, ["PATH=/bin"])
    config = Config(driver_root=str(tmp_path / "no-driver"))
    plan = plan_create(str(bundle), config)
    summary = plan_summary(plan, config)
    assert summary["granted_gpus"] == [] and summary["changes_config"] is False
    assert env_set(plan) == [] and plan_diff(plan) == ""
    text = render_text(plan, config)
    assert "requested:     -" in text.splitlines()
    assert text.endswith("config.json:   unchanged (byte-identical)")


# --- the command: a summary that fits a screen, details, the diff ---------------------------


def run_inspect(*args: str) -> str:
    """``nvshim inspect ARGS`` (the click command itself); its stdout, after exit 0."""
    res = CliRunner().invoke(inspect, list(args))
    assert res.exit_code == 0, res.output
    return res.stdout


@pytest.fixture
def one_gpu(tmp_path: Path) -> dict:
    """A simulated node with one GPU, its config file and a bundle asking for GPU 0."""
    from nvshim.sim.build import create_node

    if os.geteuid() != 0:
        pytest.skip("needs root (mknod)")
    sim = create_node(str(tmp_path / "node"), gpus=1)
    config = tmp_path / "config.yaml"
    config.write_text(f"driver-root: {sim.root}\n")
    bundle = bundle_with(tmp_path, ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"])
    return {
        "gpu": sim.gpus[0],
        "args": ["--bundle", str(bundle), "--config", str(config)],
        "bundle": bundle,
    }


def test_one_gpu_without_the_diff_fits_a_screen_summary_first(one_gpu: dict) -> None:
    """For one GPU, `inspect --no-diff` is at most 40 lines (it was 40 before its 280-line
    diff, the hook script inlined); the summary comes first: the GPU by index and UUID,
    the capabilities, the counts of edits, who does the in-root work, where the node plan
    came from, and whether config.json changes, before any detail line."""
    text = run_inspect(*one_gpu["args"], "--no-diff")
    lines = text.splitlines()
    assert len(lines) <= 40, text
    summary = lines[: lines.index("")]
    labels = [line.split(":", 1)[0] for line in summary]
    assert labels[:4] == ["bundle", "config", "request from", "requested"]
    assert f"granted GPUs:  0  {one_gpu['gpu'].uuid}" in summary
    assert "capabilities:  compute, utility" in summary
    edits = next(line for line in summary if line.startswith("edits:"))
    assert edits.startswith("edits:         4 device nodes, ") and ", 1 hook, 1 env entry" in edits
    assert "in-root work:  by nvshim-runtime before runc, in " in text.split("\n\n")[0]
    assert any(line.startswith("node plan:     discovery") for line in summary)
    assert summary[-1] == "config.json:   would be rewritten"
    assert "device nodes:" not in labels and "mounts" not in labels  # those are details


def test_the_hook_is_one_line_without_its_script(one_gpu: dict) -> None:
    """The params hook is named by its path and arguments on one line, its shell script
    elided (`<script, N lines>`), never inlined; so is nvshim's own hook, which the text
    describes (its SONAME links and ld.so.cache folder) instead of listing its argv."""
    text = run_inspect(*one_gpu["args"], "--no-diff")
    hooks = [line for line in text.splitlines() if line.startswith("hook:")]
    assert hooks == [
        f"hook:          createContainer: /bin/sh -c <script, 8 lines> nvshim-params "
        f"{one_gpu['bundle']}/rootfs {one_gpu['bundle']}/.nvshim-nvidia-params"
    ]
    assert "mount --bind" not in text and "cd -P" not in text
    spec = json.loads((one_gpu["bundle"] / "config.json").read_text())
    spec["root"]["path"] = "no-such-rootfs"  # the runtime cannot do the work: the hook does
    (one_gpu["bundle"] / "config.json").write_text(json.dumps(spec))
    text = run_inspect(*one_gpu["args"], "--no-diff")
    hooks = [line for line in text.splitlines() if line.startswith("hook:")]
    assert len(hooks) == 2 and "nvshim hook (" in hooks[0], hooks
    assert "SONAME links, ld.so.cache of /usr/lib/x86_64-linux-gnu" in hooks[0]
    assert "sys.path" not in text and "--link" not in text


def test_no_diff_leaves_the_diff_out_of_text_and_json(one_gpu: dict) -> None:
    """By default the text ends with the unified diff of config.json and the JSON has it
    under "diff"; `--no-diff` leaves both out."""
    full = run_inspect(*one_gpu["args"])
    assert "\n\n--- config.json\n+++ config.json (after nvshim)\n@@ " in full
    short = run_inspect(*one_gpu["args"], "--no-diff")
    assert full.startswith(short)
    assert not [x for x in short.splitlines() if x.startswith(("---", "+++", "@@", "+ ", "- "))]
    doc = json.loads(run_inspect(*one_gpu["args"], "--format", "json"))
    assert doc["diff"].startswith("--- config.json\n") and '"/dev/nvidia0"' in doc["diff"]
    doc = json.loads(run_inspect(*one_gpu["args"], "--format", "json", "--no-diff"))
    assert "diff" not in doc and doc["granted_gpus"][0]["uuid"] == one_gpu["gpu"].uuid


def test_inspect_help_shows_dir_and_file_metavars() -> None:
    """`inspect --help` names what each path option takes: DIR for the bundle, driver and
    dev roots, FILE for the config (they showed TEXT), and documents --no-diff."""
    res = CliRunner().invoke(inspect, ["--help"], terminal_width=200)
    assert res.exit_code == 0
    for option in (
        "--bundle DIR",
        "--driver-root DIR",
        "--dev-root DIR",
        "--config FILE",
        "--no-diff",
    ):
        assert option in res.stdout, res.stdout


@needs_root
def test_every_granted_gpu_and_mig_device_has_one_summary_line(tmp_path: Path) -> None:
    """`all` on a MIG node: one summary line per GPU (index, UUID) and per MIG device
    (gpu:mig, UUID), each list labelled once, in index order."""
    from nvshim.sim.build import create_node

    sim = create_node(str(tmp_path / "node"), gpus=2, mig=True)
    bundle = bundle_with(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"])
    config = Config(driver_root=sim.root, nvml_facts=sim.nvml_facts)
    lines = render_text(plan_create(str(bundle), config), config).splitlines()
    migs = sim.gpus[0].mig
    start = lines.index(f"granted GPUs:  0  {sim.gpus[0].uuid}")
    assert lines[start : start + 2 + len(migs)] == [
        f"granted GPUs:  0  {sim.gpus[0].uuid}",
        f"               1  {sim.gpus[1].uuid}",
        *(
            f"{'granted MIG:' if i == 0 else '':<15}0:{i}  {m.uuid}"  # ordered by (gi, ci)
            for i, m in enumerate(sorted(migs, key=lambda m: (m.gi, m.ci)))
        ),
    ]


@needs_root
def test_inspect_reports_the_void_env_and_each_node_once(tmp_path: Path) -> None:
    """Issue 12 item 14: `nvshim inspect` says the env becomes NVIDIA_VISIBLE_DEVICES=void (text and
    JSON set_void) and lists /dev/nvidia0 once for `all` on a MIG node, as config.json will have it."""
    from nvshim.sim.build import create_node

    sim = create_node(str(tmp_path / "node"), gpus=2, mig=True)
    config = tmp_path / "config.yaml"
    config.write_text(f"driver-root: {sim.root}\n")
    bundle = bundle_with(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"])
    res = nvshim_cli(
        "inspect", "--bundle", str(bundle), "--config", str(config), "--format", "json"
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["set_void"] is True and summary["env_set"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    nodes = summary["device_nodes"]
    assert len(nodes) == len(set(nodes)) and nodes.count("/dev/nvidia0") == 1
    text = nvshim_cli("inspect", "--bundle", str(bundle), "--config", str(config))
    assert "env:           NVIDIA_VISIBLE_DEVICES=void (after injection" in text.stdout
    line = next(x for x in text.stdout.splitlines() if x.startswith("device nodes:"))
    assert line.split().count("/dev/nvidia0") == 1


# --- a live bundle: config.json already rewritten by nvshim-runtime --------------------------


def _runtime_create(config: Path, bundle: Path, cid: str) -> None:
    """``nvshim-runtime create`` of ``bundle`` as containerd runs it (runtime /bin/true)."""
    import subprocess
    import sys

    res = subprocess.run(
        [
            sys.executable,
            "-I",
            "-m",
            "nvshim.runtime.main",
            "--root",
            str(bundle.parent / "state"),
            "create",
            "--bundle",
            str(bundle),
            cid,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVSHIM_CONFIG": str(config)},
    )
    assert res.returncode == 0, res.stderr


@needs_root
def test_a_live_granted_bundle_shows_the_journals_grant_not_an_engine_grant(tmp_path: Path) -> None:
    """Issue 28 item 14: `inspect` on a bundle nvshim-runtime already rewrote (a GPU granted)
    says so and shows the grant journal's record for it; it read the device node nvshim
    had added as "injected by the engine"."""
    from nvshim.sim.build import create_node

    sim = create_node(str(tmp_path / "node"), gpus=2)
    gpu = sim.gpus[1]
    config = tmp_path / "config.yaml"
    config.write_text(
        f"runtimes: [/bin/true]\ndriver-root: {sim.root}\ngrants-journal: {tmp_path}/grants.jsonl\n"
    )
    bundle = bundle_with(tmp_path, ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=1"])
    _runtime_create(config, bundle, "live-1")
    text = run_inspect("--bundle", str(bundle), "--config", str(config))
    lines = text.splitlines()
    assert "engine" not in text, text
    assert (
        "config.json:   already rewritten by nvshim-runtime (live bundle): not planned again"
        in lines
    )
    assert f"granted:       {gpu.uuid}  (source env, verified none)" in lines
    assert "journal:       grant of container live-1" in "\n".join(lines)
    doc = json.loads(
        run_inspect("--bundle", str(bundle), "--config", str(config), "--format", "json")
    )
    assert doc["rewritten_by_nvshim"] is True
    assert doc["grant"]["gpus"] == [gpu.uuid] and doc["grant"]["container_id"] == "live-1"
    assert doc["denial"] is None


@needs_root
def test_a_live_stripped_bundle_shows_the_denial_not_request_none(tmp_path: Path) -> None:
    """Issue 28 item 14: `inspect` on a pod's bundle whose request require-allocation
    stripped says it was rewritten and shows the denial record with its reason, where it
    said "request from: none"."""
    from nvshim.sim.build import create_node

    sim = create_node(str(tmp_path / "node"), gpus=1)
    config = tmp_path / "config.yaml"
    config.write_text(
        f"runtimes: [/bin/true]\ndriver-root: {sim.root}\nrequire-allocation: true\n"
        f"grants-journal: {tmp_path}/grants.jsonl\n"
    )
    bundle = bundle_with(tmp_path, ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["annotations"] = {
        "io.kubernetes.cri.sandbox-name": "p",
        "io.kubernetes.cri.sandbox-namespace": "ns",
        "io.kubernetes.cri.container-name": "c",
    }
    (bundle / "config.json").write_text(json.dumps(spec))
    _runtime_create(config, bundle, "live-2")
    text = run_inspect("--bundle", str(bundle), "--config", str(config))
    assert "request from:  none" not in text, text
    lines = text.splitlines()
    assert (
        "config.json:   already rewritten by nvshim-runtime (live bundle): not planned again"
        in lines
    )
    assert "container:     ns/p/c" in lines
    assert "denied:        stripped: asked NVIDIA_VISIBLE_DEVICES=0" in lines
    assert any(
        line.startswith("reason:        NVIDIA_VISIBLE_DEVICES=0 ignored: require-allocation is on")
        for line in lines
    ), text


HOSTILE = "0\n0  GPU-forged  granted\r\x1b[32mok\x1b[0m\x85\u2028\u202e"


@needs_root
def test_inspect_escapes_what_the_bundle_and_the_journal_hold(tmp_path: Path) -> None:
    """`inspect` of a bundle whose NVIDIA_VISIBLE_DEVICES and pod name hold line breaks, ESC,
    NEL, U+2028 and a bidi override prints them escaped, one line each: planned, and live
    (from the denial record the create left)."""
    from nvshim.sim.build import create_node

    sim = create_node(str(tmp_path / "node"), gpus=1)
    config = tmp_path / "config.yaml"
    config.write_text(
        f"runtimes: [/bin/true]\ndriver-root: {sim.root}\nrequire-allocation: true\n"
        f"grants-journal: {tmp_path}/grants.jsonl\n"
    )
    bundle = bundle_with(tmp_path, ["PATH=/bin", f"NVIDIA_VISIBLE_DEVICES={HOSTILE}"])
    spec = json.loads((bundle / "config.json").read_text())
    spec["annotations"] = {
        "io.kubernetes.cri.sandbox-name": HOSTILE,
        "io.kubernetes.cri.sandbox-namespace": "ns",
        "io.kubernetes.cri.container-name": "c",
    }
    (bundle / "config.json").write_text(json.dumps(spec))
    shown = "0\\n0  GPU-forged  granted\\r\\x1b[32mok\\x1b[0m\\x85\\u2028\\u202e"
    for live in (False, True):
        if live:
            _runtime_create(config, bundle, "live-3")
        text = run_inspect("--bundle", str(bundle), "--config", str(config), "--no-diff")
        lines = text.rstrip("\n").split("\n")
        assert all(line.isprintable() for line in lines), text
        assert f"container:     ns/{shown}/c" in lines
        assert any(shown in line for line in lines if line.startswith(("note:", "reason:")))
