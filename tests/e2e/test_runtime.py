"""The spine, end to end: nvshim-runtime → runc/crun on a simulated GPU node.

runc and crun are the machine's (Debian 12: runc 1.1.5, crun 1.8.1) and Debian 13's (runc
1.1.15, crun 1.21, as nodes run today: :mod:`tests.helpers.debian13`).

Every assertion is about what the process inside the container sees (its /dev, opening a
node, reading and writing a library), or about what the runtime leaves on disk.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from nvshim.node.compile import compile_node
from tests.helpers.bundle import make_bundle
from tests.helpers.common import require_root, unique_id
from tests.helpers.node import write_nvshim_config

pytestmark = pytest.mark.e2e

LIB = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
PROBE = (
    "cd /dev && ls -d nvidia* 2>/dev/null | tr '\\n' ' '; echo; "
    "for n in /dev/nvidia[0-9]*; do head -c0 $n 2>&1 | sed 's/^/OPEN: /'; done; "
    f"grep -c NVSHIM-SIM {LIB} && echo LIB-READABLE; "
    f"(echo x > {LIB}) 2>/dev/null && echo LIB-WRITABLE || echo LIB-READONLY; "
    "(echo x > /rootfs-write-probe) 2>/dev/null && echo ROOT-WRITABLE || echo ROOT-READONLY; "
    "readlink /usr/lib/x86_64-linux-gnu/libcuda.so.1"
)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A simulated 4-GPU node whose device minors are not in PCI order."""
    require_root()
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("sim") / "node"), gpus=4, shuffle_minors=True)


@pytest.fixture(params=["runc", "crun", "runc-1.1.15", "crun-1.21", "runc-1.3", "crun-1.28"])
def engine(request, tmp_path, node, crunw):
    """(Runc-like driver, nvshim env) for runc, and for crun through its wrapper; the
    machine's, Debian 13's and Debian unstable's."""
    from tests.helpers import debian13, debiansid
    from tests.helpers.runc import Runc, make_crun_wrapper

    fetched = {
        "runc-1.1.15": (debian13.engine_or_skip, debian13.runc_debian13),
        "crun-1.21": (debian13.engine_or_skip, debian13.crun_debian13),
        "runc-1.3": (debiansid.engine_or_skip, debiansid.runc_sid),
        "crun-1.28": (debiansid.engine_or_skip, debiansid.crun_sid),
    }
    if request.param == "runc":
        low = "runc"
        driver = request.getfixturevalue("runc")
    elif request.param == "crun":
        low = str(crunw)
        driver = request.getfixturevalue("crun")
    else:
        or_skip, fetch = fetched[request.param]
        low = or_skip(fetch, request.param.replace("-", " "))
        if request.param.startswith("crun"):
            low = str(make_crun_wrapper(tmp_path, low))
        driver = Runc(tmp_path / "low-root", low)
        request.addfinalizer(driver.cleanup)
    cfg = write_nvshim_config(tmp_path / "cfg", {"driver-root": node.root, "runtimes": [low]})
    compile_node(str(cfg))
    env = {
        "NVSHIM_CONFIG": str(cfg),
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    }
    return driver, env, cfg


def nodes_seen(output: str) -> set:
    return set(output.splitlines()[0].split()) if output else set()


def inspect_nodes(nvshim_bin: str, bundle: Path, env: dict) -> set:
    out = subprocess.run(
        [nvshim_bin, "inspect", "--bundle", str(bundle), "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {p.rsplit("/", 1)[1] for p in json.loads(out)["device_nodes"]}


def test_one_gpu_is_exactly_that_gpu(
    engine, node, rootfs, tmp_path, nvshim_runtime_bin, nvshim_bin
):
    """NVIDIA_VISIBLE_DEVICES=1 shows /dev/nvidia<minor of GPU 1> and the control nodes only;
    the node opens with ENXIO (cgroup rule present) and the library is readable, not writable."""
    driver, env, _ = engine
    bundle = make_bundle(
        tmp_path / "b", rootfs, ["sh", "-c", PROBE], env=["NVIDIA_VISIBLE_DEVICES=1"]
    )
    planned = inspect_nodes(nvshim_bin, bundle, env)
    minor = node.gpus[1].minor
    assert minor != 1, "shuffled minors must make index and minor differ for this test"
    res = driver.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
    seen = nodes_seen(res.stdout)
    assert seen == {f"nvidia{minor}", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}, res.describe()
    assert f"OPEN: head: /dev/nvidia{minor}: No such device or address" in res.stdout
    assert "Operation not permitted" not in res.stdout
    assert "LIB-READABLE" in res.stdout and "LIB-READONLY" in res.stdout
    # the hook made the SONAME link, and a read-only rootfs is read-only again afterwards
    # (crun makes it read-only before createContainer hooks; the hook restores that)
    assert "libcuda.so.550.54.15" in res.stdout and "ROOT-READONLY" in res.stdout
    assert planned == seen  # nvshim inspect predicted exactly what the container saw


def test_two_gpus_and_all(engine, node, rootfs, tmp_path, nvshim_runtime_bin, nvshim_bin):
    """=0,2 gives exactly those two GPUs' nodes; =all gives all four."""
    driver, env, _ = engine
    for value, indices in (("0,2", [0, 2]), ("all", [0, 1, 2, 3])):
        bundle = make_bundle(
            tmp_path / value, rootfs, ["sh", "-c", PROBE], env=[f"NVIDIA_VISIBLE_DEVICES={value}"]
        )
        planned = inspect_nodes(nvshim_bin, bundle, env)
        res = driver.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
        gpu_nodes = {n for n in nodes_seen(res.stdout) if n[6:].isdigit()}
        assert gpu_nodes == {f"nvidia{node.gpus[i].minor}" for i in indices}, res.describe()
        assert planned == nodes_seen(res.stdout)


def test_void_injects_nothing_and_keeps_bytes(engine, rootfs, tmp_path, nvshim_runtime_bin):
    """=void: no NVIDIA nodes in the container and config.json byte-identical."""
    driver, env, _ = engine
    bundle = make_bundle(
        tmp_path / "b", rootfs, ["sh", "-c", PROBE], env=["NVIDIA_VISIBLE_DEVICES=void"]
    )
    before = (bundle / "config.json").read_bytes()
    res = driver.run_detached(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
    assert nodes_seen(res.stdout) == set()
    assert (bundle / "config.json").read_bytes() == before


def test_run_command_is_modified_too(runc, node, rootfs, tmp_path, nvshim_runtime_bin):
    """`run` gets GPUs as well (the reference leaves run untouched; we don't): GPU 3 and
    no other GPU (an "all GPUs" injection must not pass)."""
    cfg = write_nvshim_config(tmp_path / "cfg", {"driver-root": node.root, "runtimes": ["runc"]})
    env = {"NVSHIM_CONFIG": str(cfg), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    bundle = make_bundle(
        tmp_path / "b", rootfs, ["sh", "-c", PROBE], env=["NVIDIA_VISIBLE_DEVICES=3"]
    )
    res = runc.run(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env).check()
    gpu_nodes = {n for n in nodes_seen(res.stdout) if n[6:].isdigit()}
    assert gpu_nodes == {f"nvidia{node.gpus[3].minor}"}, res.describe()


@pytest.mark.parametrize("damage", ["truncated", "truncated-before-request", "unknown-device"])
def test_errors_leave_file_and_report_twice(
    engine, node, rootfs, tmp_path, nvshim_runtime_bin, damage
):
    """A failing create exits 1, appends one JSON error line to --log, prints one stderr line,
    and leaves config.json byte-identical. A spec cut off before it could ask for a GPU is
    runc's to reject (the trampoline hands it over untouched); anything else is nvshim's. An
    unknown device names the driver root and the config file looked at."""
    driver, env, cfg = engine
    bundle = make_bundle(tmp_path / "b", rootfs, ["true"], env=["NVIDIA_VISIBLE_DEVICES=7"])
    spec = bundle / "config.json"
    raw = spec.read_bytes()
    if damage == "truncated":
        cut = raw.index(b"NVIDIA_VISIBLE_DEVICES=7") + len(b"NVIDIA_VISIBLE_DEVICES=7")
        spec.write_bytes(raw[:cut])
        expected = "invalid JSON"
    elif damage == "truncated-before-request":
        spec.write_bytes(raw[: raw.index(b'"env"')])
        expected = ""  # runc's own words ("unexpected EOF" / "error loading config.json")
    else:
        expected = (
            f'unknown device "7": this node has GPUs 0-3 under driver root {node.root} '
            f"(config {cfg})"
        )
    before = spec.read_bytes()
    log = tmp_path / "log.json"
    res = driver.create(bundle, unique_id(), runtime=nvshim_runtime_bin, env=env, log=log)
    assert res.rc == 1
    assert spec.read_bytes() == before
    assert len(res.log_errors) == 1 and expected in res.log_errors[0], res.describe()
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) >= 1 and "Traceback" not in res.stderr
    if damage != "truncated-before-request":
        assert res.log_errors[0].startswith("nvshim: ")
        assert len(lines) == 1 and expected in lines[0]
    assert res.stdout == ""


def test_passthrough_exit_codes_match_runc(runc, node, rootfs, tmp_path, nvshim_runtime_bin):
    """state, kill and delete through nvshim-runtime return exactly what runc returns."""
    cfg = write_nvshim_config(tmp_path / "cfg", {"driver-root": node.root, "runtimes": ["runc"]})
    compile_node(str(cfg))
    env = {"NVSHIM_CONFIG": str(cfg), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    bundle = make_bundle(tmp_path / "b", rootfs, ["sleep", "30"], env=["NVIDIA_VISIBLE_DEVICES=0"])
    cid = unique_id()
    runc.create(bundle, cid, runtime=nvshim_runtime_bin, env=env).check()
    for via in ("runc", nvshim_runtime_bin):
        st = runc.state(cid, runtime=via, env=env)
        assert st.rc == 0 and st.json()["status"] == "created"
    missing = unique_id()
    for sub in (("state", missing), ("kill", missing, "9"), ("delete", missing)):
        plain = subprocess.run(
            runc.argv(*sub, runtime="runc"), env=env, capture_output=True, text=True
        )
        ours = subprocess.run(
            runc.argv(*sub, runtime=nvshim_runtime_bin), env=env, capture_output=True, text=True
        )
        assert (ours.returncode, ours.stdout) == (plain.returncode, plain.stdout), sub
        assert plain.returncode != 0
    assert runc.kill(cid, "KILL", runtime=nvshim_runtime_bin, env=env).rc == 0
    runc.wait_stopped(cid, runtime=nvshim_runtime_bin, env=env)
    assert runc.delete(cid, runtime=nvshim_runtime_bin, env=env).rc == 0
    assert runc.state(cid, runtime="runc", env=env).rc == 1


@pytest.mark.parametrize("flag", ["--help", "-h", "-help"])
def test_create_help_is_runc_help_and_edits_nothing(
    runc, node, rootfs, tmp_path, nvshim_runtime_bin, flag
):
    """`create --help` on a GPU bundle: runc prints the command's help and creates nothing, so
    nvshim-runtime prints the same, exits the same and leaves config.json byte-identical (it
    used to edit it, and journal a grant, for a container that never existed)."""
    journal = tmp_path / "grants.jsonl"
    cfg = write_nvshim_config(
        tmp_path / "cfg",
        {"driver-root": node.root, "runtimes": ["runc"], "grants-journal": str(journal)},
    )
    compile_node(str(cfg))
    env = {"NVSHIM_CONFIG": str(cfg), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    bundle = make_bundle(tmp_path / "b", rootfs, ["true"], env=["NVIDIA_VISIBLE_DEVICES=0"])
    before = (bundle / "config.json").read_bytes()
    sub = ("create", "--bundle", str(bundle), flag, unique_id())
    plain = subprocess.run(runc.argv(*sub, runtime="runc"), env=env, capture_output=True, text=True)
    ours = subprocess.run(
        runc.argv(*sub, runtime=nvshim_runtime_bin), env=env, capture_output=True, text=True
    )
    assert plain.returncode == 0 and "create" in plain.stdout
    assert (ours.returncode, ours.stdout, ours.stderr) == (
        plain.returncode,
        plain.stdout,
        plain.stderr,
    )
    assert (bundle / "config.json").read_bytes() == before
    assert not journal.exists() or journal.read_text() == ""


@pytest.mark.parametrize("fmt", [None, "text", "json"])
def test_failing_create_log_line_has_runcs_format(
    runc, node, rootfs, tmp_path, nvshim_runtime_bin, fmt
):
    """A failing GPU create appends one line to --log in the format runc itself writes there:
    text (logfmt) unless --log-format json, whatever the file is called. nvshim used to write
    JSON into a file named *.json without --log-format, where runc writes text."""
    import re

    cfg = write_nvshim_config(tmp_path / "cfg", {"driver-root": node.root, "runtimes": ["runc"]})
    compile_node(str(cfg))
    env = {"NVSHIM_CONFIG": str(cfg), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    bundle = make_bundle(tmp_path / "b", rootfs, ["true"], env=["NVIDIA_VISIBLE_DEVICES=7"])
    flags = [] if fmt is None else ["--log-format", fmt]
    lines = {}
    for who, runtime, sub in (
        ("runc", "runc", ["state", unique_id()]),
        ("nvshim", nvshim_runtime_bin, ["create", "--bundle", str(bundle), unique_id()]),
    ):
        log = tmp_path / f"{who}.log.json"
        res = subprocess.run(
            [runtime, "--root", str(runc.root_dir), "--log", str(log), *flags, *sub],
            env=env,
            capture_output=True,
            text=True,
        )
        assert res.returncode == 1, res.stderr
        lines[who] = log.read_text().splitlines()
    assert len(lines["runc"]) == 1 and len(lines["nvshim"]) == 1, lines
    if fmt == "json":
        shapes = {who: sorted(json.loads(line[0])) for who, line in lines.items()}
        assert shapes["nvshim"] == shapes["runc"] == ["level", "msg", "time"]
        assert json.loads(lines["nvshim"][0])["level"] == "error"
    else:
        text = re.compile(r'time="[0-9TZ:-]+" level=error msg="(.*)"')
        assert text.fullmatch(lines["runc"][0]), lines["runc"]
        match = text.fullmatch(lines["nvshim"][0])
        assert match and match.group(1).startswith("nvshim: unknown device"), lines["nvshim"]


def test_create_without_a_runtime_on_path_edits_nothing(node, rootfs, tmp_path, nvshim_runtime_bin):
    """A GPU create whose low-level runtime cannot be found fails with one line (stderr and
    --log) and leaves config.json byte-identical and the journal empty: nvshim used to
    write the GPU edit first and only then find that nothing could run it."""
    journal = tmp_path / "grants.jsonl"
    cfg = write_nvshim_config(
        tmp_path / "cfg",
        {"driver-root": node.root, "runtimes": ["runc"], "grants-journal": str(journal)},
    )
    compile_node(str(cfg))
    bundle = make_bundle(tmp_path / "b", rootfs, ["true"], env=["NVIDIA_VISIBLE_DEVICES=0"])
    before = (bundle / "config.json").read_bytes()
    log = tmp_path / "log.json"
    res = subprocess.run(
        [
            nvshim_runtime_bin,
            "--log",
            str(log),
            "--log-format",
            "json",
            "create",
            "--bundle",
            str(bundle),
            unique_id(),
        ],
        env={"NVSHIM_CONFIG": str(cfg), "PATH": str(tmp_path / "empty")},
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and "no low-level runtime found" in res.stderr
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and "no low-level runtime found" in json.loads(lines[0])["msg"]
    assert (bundle / "config.json").read_bytes() == before
    assert not journal.exists() or journal.read_text() == ""


def test_unopenable_debug_log_is_a_log_warning_not_container_stderr(
    runc, node, rootfs, tmp_path, nvshim_runtime_bin
):
    """A debug-log that cannot be opened does not stop a GPU create, and its warning goes to
    runc's --log: during create/run stderr is the container's, and nvshim used to print
    "cannot open debug-log" there on every GPU container."""
    cfg = write_nvshim_config(
        tmp_path / "cfg",
        {
            "driver-root": node.root,
            "runtimes": ["runc"],
            "debug-log": str(tmp_path / "missing" / "d.log"),
        },
    )
    compile_node(str(cfg))
    env = {"NVSHIM_CONFIG": str(cfg), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    bundle = make_bundle(
        tmp_path / "b",
        rootfs,
        ["sh", "-c", "ls /dev | grep -c nvidiactl"],
        env=["NVIDIA_VISIBLE_DEVICES=0"],
    )
    log = tmp_path / "log.json"
    res = subprocess.run(
        [
            nvshim_runtime_bin,
            "--root",
            str(runc.root_dir),
            "--log",
            str(log),
            "--log-format",
            "json",
            "run",
            "--bundle",
            str(bundle),
            unique_id(),
        ],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert (res.returncode, res.stdout, res.stderr) == (0, "1\n", ""), res
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(x["level"], "cannot open debug-log" in x["msg"]) for x in lines] == [("warning", True)]


@pytest.mark.parametrize("given", [".", "b", "./b/."])
def test_debug_log_names_a_relative_bundle_absolute(
    runc, node, rootfs, tmp_path, nvshim_runtime_bin, given
):
    """``--bundle .`` (or any relative bundle, as a person or a script gives it): the
    container gets its GPU, and every record of the debug log names the bundle, and the
    rootfs the runtime wrote, by absolute path; they used to be logged as given."""
    debug = tmp_path / "debug.log"
    cfg = write_nvshim_config(
        tmp_path / "cfg", {"driver-root": node.root, "runtimes": ["runc"], "debug-log": str(debug)}
    )
    compile_node(str(cfg))
    env = {"NVSHIM_CONFIG": str(cfg), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    bundle = make_bundle(
        tmp_path / "b",
        rootfs,
        ["sh", "-c", "ls /dev | grep -c nvidiactl"],
        env=["NVIDIA_VISIBLE_DEVICES=0"],
    )
    cwd = bundle if given == "." else tmp_path
    res = subprocess.run(
        [nvshim_runtime_bin, "--root", str(runc.root_dir), "run", "--bundle", given, unique_id()],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        timeout=60,
    )
    assert (res.returncode, res.stdout, res.stderr) == (0, "1\n", ""), res
    records = [json.loads(line) for line in debug.read_text().splitlines()]
    bundles = [r["bundle"] for r in records if "bundle" in r]
    assert [r["event"] for r in records if "bundle" in r] == ["request", "create"], records
    assert bundles == [str(bundle)] * 2, records
    rootfs_events = [r for r in records if r["event"] == "rootfs"]
    assert [(r["by"], r["detail"]) for r in rootfs_events] == [("runtime", str(bundle / "rootfs"))]


def test_crun_hooks_get_default_sigpipe_through_nvshim(
    crun, crunw, node, rootfs, tmp_path, nvshim_runtime_bin
):
    """A prestart hook under crun sees the same ignored signals with and without nvshim in
    front: CPython ignores SIGPIPE and SIGXFSZ, and crun (unlike runc) passed that on to
    the hooks of every GPU container (`cmd | head` in a hook then met EPIPE, not SIGPIPE)."""
    cfg = write_nvshim_config(
        tmp_path / "cfg", {"driver-root": node.root, "runtimes": [str(crunw)]}
    )
    compile_node(str(cfg))
    env = {"NVSHIM_CONFIG": str(cfg), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    record = tmp_path / "sigign"
    hook = tmp_path / "hook.sh"
    hook.write_text(f"#!/bin/sh\ngrep SigIgn /proc/$$/status >> {record}\n")
    hook.chmod(0o755)
    seen = {}
    for via in (str(crunw), nvshim_runtime_bin):
        record.unlink(missing_ok=True)
        bundle = make_bundle(
            tmp_path / f"b{len(seen)}",
            rootfs,
            ["true"],
            env=["NVIDIA_VISIBLE_DEVICES=0"],
            hooks={"prestart": [{"path": str(hook)}]},
        )
        crun.run(bundle, unique_id(), runtime=via, env=env).check()
        seen[via] = record.read_text()
    assert seen[nvshim_runtime_bin] == seen[str(crunw)] != ""
