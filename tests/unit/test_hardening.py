"""Defects found trying nvshim as an operator and as an attacker (issue 12), one test each.

Each test names its item number; the fuzz classes live in ``test_fuzz.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod, ownership)")


def nvshim_cli(*args: str, env: dict | None = None, cwd: str | None = None) -> subprocess.CompletedProcess:
    """``nvshim ARGS`` from this checkout, as a user runs it."""
    return subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); "
                           "from nvshim.cli.main import main; main()", str(REPO), *args],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


# --- 15: large simulated nodes -------------------------------------------------------------


@needs_root
@pytest.mark.parametrize("args", [[], ["runtime"], ["cdi", "transform"]])
def test_a_group_without_a_command_prints_its_help_not_an_error_line(args: list) -> None:
    """`nvshim` (or a group) without a command printed its whole help as the error line
    "nvshim: Usage: …" (click 8.2 raises for it); now the help itself, on stdout, exit 0
    (as git and kubectl do)."""
    out = nvshim_cli(*args)
    assert out.returncode == 0 and out.stderr == ""
    assert out.stdout.startswith(f"Usage: nvshim {' '.join(args)}".rstrip() + " [OPTIONS]")


def test_15_sim_creates_large_nodes_with_valid_minors_and_bus_ids(tmp_path: Path) -> None:
    """`nvshim sim create --gpus 256` builds a node discovery reads back: 256 GPUs, distinct
    minors that skip nvidia-modeset (254) and nvidiactl (255), valid ascending PCI bus ids."""
    res = nvshim_cli("sim", "create", str(tmp_path / "n"), "--gpus", "256")
    assert res.returncode == 0, res.stderr
    from nvshim.host.discovery import Host

    gpus = Host(str(tmp_path / "n")).gpus()
    assert len(gpus) == 256
    minors = [g.minor for g in gpus]
    assert len(set(minors)) == 256 and not {254, 255} & set(minors)
    assert [g.index for g in gpus] == list(range(256))
    buses = [g.pci_bus_id for g in gpus]
    assert buses == sorted(buses) and all(len(b) == 12 for b in buses)
    assert nvshim_cli("sim", "create", str(tmp_path / "m"), "--gpus", "64", "--mig").returncode == 0


@needs_root
def test_sim_create_says_which_config_makes_its_mig_devices_visible(tmp_path: Path) -> None:
    """`nvshim sim create --mig` ends with the driver-root and nvml-facts lines to configure;
    with those, discovery names the MIG devices it printed (without nvml-facts it cannot)."""
    res = nvshim_cli("sim", "create", str(tmp_path / "n"), "--gpus", "2", "--mig")
    assert res.returncode == 0, res.stderr
    last = res.stdout.splitlines()[-1]
    root, facts = str(tmp_path / "n"), str(tmp_path / "n" / "nvml-facts.json")
    assert last == f"use it with config driver-root: {root} and nvml-facts: {facts}"
    from nvshim.host.discovery import Host

    printed = {line.split()[-2] for line in res.stdout.splitlines() if line.startswith("    MIG ")}
    assert printed and {m.uuid for g in Host(root, nvml_facts=facts).gpus() for m in g.mig} == printed
    assert [m for g in Host(root).gpus() for m in g.mig] == []


# --- 8, 10: the config file ------------------------------------------------------------------


def test_08_duplicate_yaml_key_is_refused(tmp_path: Path) -> None:
    """A key given twice (`require-allocation: true` then `false`) is an error naming the key and both lines."""
    from nvshim.config import load_config
    from nvshim.errors import ConfigError

    path = tmp_path / "config.yaml"
    path.write_text("require-allocation: true\ndebug-log: /tmp/x\nrequire-allocation: false\n")
    with pytest.raises(ConfigError, match=r'line 3: duplicate key "require-allocation" \(first on line 1\)'):
        load_config(str(path))
    res = nvshim_cli("config", "show", "--config", str(path))
    assert res.returncode == 1 and res.stderr.count("\n") == 1 and "duplicate key" in res.stderr


def test_10_explicitly_named_missing_config_is_an_error(tmp_path: Path) -> None:
    """`nvshim config show --config /nonexistent` (and inspect) fail in one line instead of showing defaults."""
    missing = str(tmp_path / "nonexistent.yaml")
    res = nvshim_cli("config", "show", "--config", missing)
    assert res.returncode == 1, res.stdout
    assert res.stderr == f"nvshim: config {missing} does not exist\n"
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.json").write_text("{}")
    res = nvshim_cli("inspect", "--bundle", str(tmp_path / "b"), "--config", missing)
    assert res.returncode == 1 and res.stderr == f"nvshim: config {missing} does not exist\n"
    # the runtime's default (NVSHIM_CONFIG unset/missing) still means defaults
    env = dict(os.environ, NVSHIM_CONFIG=missing)
    assert nvshim_cli("config", "show", env=env).returncode == 0


# --- 12: cdi list ------------------------------------------------------------------------------


def test_12_cdi_list_reads_the_configs_cdi_spec_dirs(tmp_path: Path) -> None:
    """`nvshim cdi list` without --spec-dir lists the devices of the config's cdi-spec-dirs, as the runtime resolves them."""
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "nvidia.yaml").write_text((REPO / "cdi-specs" / "examples" / "nvidia-2gpu.yaml").read_text())
    config = tmp_path / "config.yaml"
    config.write_text(f"cdi-spec-dirs: [{specs}]\n")
    res = nvshim_cli("cdi", "list", env=dict(os.environ, NVSHIM_CONFIG=str(config)))
    assert res.returncode == 0, res.stderr
    assert "nvidia.com/gpu=0" in res.stdout.splitlines()


# --- 2, 4, 5: config.json survives a rewrite as runc would read it ----------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A simulated 2-GPU node, a compiled config naming it and a recorder as the low-level runtime."""
    if os.geteuid() != 0:
        pytest.skip("the simulated GPU node needs root (mknod)")
    from nvshim.host.sim import create_node
    from nvshim.runtime.compile import compile_node

    base = tmp_path_factory.mktemp("hardening")
    sim = create_node(str(base / "node"), gpus=2)
    recorder = base / "recorder"
    recorder.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {base}/recorded\n")
    recorder.chmod(0o755)
    cfg = base / "etc" / "config.yaml"
    cfg.parent.mkdir()
    cfg.write_text(f"runtimes: [{recorder}]\ndriver-root: {sim.root}\n"
                   f"grants-journal: {base}/grants.jsonl\n")  # never the node's journal
    compile_node(str(cfg))
    return {"base": base, "config": cfg, "recorder": recorder}


def runtime_create(node: dict, bundle: Path, *extra: str, argv: list | None = None,
                   timeout: int = 60) -> subprocess.CompletedProcess:
    """``python -I -m nvshim.runtime.main --log L create --bundle B id`` as containerd runs it."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVSHIM_CONFIG": str(node["config"]), **dict(
        e.split("=", 1) for e in extra)}
    args = argv if argv is not None else ["--log", str(bundle / "log.json"), "--log-format", "json",
                                          "create", "--bundle", str(bundle), "cid-12"]
    return subprocess.run([sys.executable, "-I", "-m", "nvshim.runtime.main", *args],
                          capture_output=True, env=env, timeout=timeout, cwd=str(REPO))


def make_bundle(tmp_path: Path, raw: bytes, name: str = "b") -> Path:
    bundle = tmp_path / name
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_bytes(raw)
    return bundle


GPU_SPEC = b'{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=0"],"cwd":"/"},"root":{"path":"rootfs"}'


def test_02_number_literals_of_unknown_fields_survive_a_rewrite(node: dict, tmp_path: Path) -> None:
    """Numbers nvshim does not edit are written back as written: 1e999, 1E2, -0, long decimals, huge ints."""
    big = "9" * 5000
    literals = f"[1e999,1E2,-0,0.1000000000000000055511151231257827,{big},-{big},1.5,7,-0.0,2e-5]"
    raw = GPU_SPEC + f',"x-unknown":{{"n":{literals},"deep":{{"f":1.0E+2}}}}}}'.encode()
    bundle = make_bundle(tmp_path, raw)
    for fmt in ("text", "json"):  # inspect's diff encodes them too
        shown = nvshim_cli("inspect", "--bundle", str(bundle), "--config", str(node["config"]),
                           "--format", fmt)
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    res = runtime_create(node, bundle)
    assert res.returncode == 0, res.stderr
    after = (bundle / "config.json").read_bytes()
    assert after != raw and b"/dev/nvidia0" in after
    assert f'"x-unknown":{{"n":{literals},"deep":{{"f":1.0E+2}}}}'.encode() in after
    assert b"Infinity" not in after
    # and the same in the indented layout containerd writes
    bundle2 = make_bundle(tmp_path, b'{\n  "n": 1E2,\n  "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]},'
                          b' "root": {"path": "rootfs"}\n}\n', "b2")
    assert runtime_create(node, bundle2).returncode == 0
    assert b'"n": 1E2,' in (bundle2 / "config.json").read_bytes()


def test_04_lone_surrogate_in_an_untouched_field_round_trips(node: dict, tmp_path: Path) -> None:
    """A lone surrogate escape ("\\ud800") in a field nvshim does not touch is written back as that escape."""
    raw = GPU_SPEC + b',"annotations":{"x":"a\\ud800b","y":"\\udfff"}}'
    bundle = make_bundle(tmp_path, raw)
    res = runtime_create(node, bundle)
    assert res.returncode == 0, res.stderr
    after = (bundle / "config.json").read_bytes()
    assert b'"x":"a\\ud800b","y":"\\udfff"' in after
    assert json.loads(after)["annotations"] == {"x": "a\ud800b", "y": "\udfff"}


@pytest.mark.parametrize("raw,message", [
    (b'{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]},"x":' + b"[" * 5000 + b"]" * 5000 + b"}",
     "nested deeper than 200 levels"),
    (b'{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]},"x":' + b"[" * 300 + b"]" * 300 + b"}",
     "nested deeper than 200 levels"),
    (b'{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]},"x":' + b'{"a":' * 900 + b"1" + b"}" * 900 + b"}",
     "nested deeper than 200 levels"),
])
def test_04_deep_nesting_is_one_clear_line(node: dict, tmp_path: Path, raw: bytes, message: str) -> None:
    """JSON nested thousands of levels deep fails with one line naming the problem, not a RecursionError."""
    bundle = make_bundle(tmp_path, raw)
    res = runtime_create(node, bundle)
    assert res.returncode == 1
    lines = res.stderr.decode().splitlines()
    assert len(lines) == 1 and message in lines[0] and "internal error" not in lines[0], lines
    assert (bundle / "config.json").read_bytes() == raw


def test_04_huge_integer_is_kept_not_python_wording(node: dict, tmp_path: Path) -> None:
    """A 5,000-digit integer where nvshim reads a number fails (or passes) without Python's int-limit wording."""
    raw = (b'{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"],"user":{"uid":' + b"1" * 5000
           + b',"gid":0}},"root":{"path":"rootfs"}}')
    bundle = make_bundle(tmp_path, raw)
    res = runtime_create(node, bundle)
    assert b"int_max_str_digits" not in res.stderr and b"Exceeds the limit" not in res.stderr
    if res.returncode == 0:
        assert b'"uid":' + b"1" * 5000 + b"," in (bundle / "config.json").read_bytes()
    else:
        assert len(res.stderr.splitlines()) == 1


def test_05_utf8_bom_is_kept_on_rewrite(node: dict, tmp_path: Path) -> None:
    """A config.json starting with a UTF-8 BOM keeps it when rewritten (runc judges the file as it was)."""
    raw = b"\xef\xbb\xbf" + GPU_SPEC + b"}"
    bundle = make_bundle(tmp_path, raw)
    res = runtime_create(node, bundle)
    assert res.returncode == 0, res.stderr
    after = (bundle / "config.json").read_bytes()
    assert after.startswith(b"\xef\xbb\xbf{") and b"/dev/nvidia0" in after


# --- 3: config.json that is not a regular file -----------------------------------------------


def processes_mentioning(text: str) -> list:
    """Command lines of running processes that contain ``text`` (an orphaned grep would)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(cmdline)
    return found


@pytest.fixture
def tramp_world(tmp_path: Path) -> dict:
    """The trampoline rendered for this interpreter, a compiled config and a recorder runtime."""
    from nvshim.runtime.compile import compile_node
    from nvshim.runtime.trampoline import render

    runtime = tmp_path / "fake-runc"
    runtime.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path / 'rec'}\n")
    runtime.chmod(0o755)
    config = tmp_path / "etc" / "config.yaml"
    config.parent.mkdir()
    config.write_text(f"runtimes: [{runtime}]\n")
    compile_node(str(config))
    tramp = tmp_path / "nvshim-runtime"
    tramp.write_text(render(sys.executable))
    tramp.chmod(0o755)
    return {"tramp": tramp, "config": config, "runtime": runtime, "tmp": tmp_path,
            "env": {"PATH": "/usr/bin:/bin", "NVSHIM_CONFIG": str(config)}}


@pytest.mark.parametrize("kind", ["missing", "directory", "fifo", "dev-zero", "char-device"])
def test_03_config_json_not_a_regular_file_is_one_line_fast_no_orphan(tramp_world: dict, kind: str) -> None:
    """A missing, directory, FIFO or device config.json gives one stderr line, exit 1, quickly, and leaves no process behind."""
    bundle = tramp_world["tmp"] / f"bundle-{kind}"
    bundle.mkdir()
    spec = bundle / "config.json"
    if kind == "directory":
        spec.mkdir()
    elif kind == "fifo":
        os.mkfifo(spec)
    elif kind == "dev-zero":
        spec.symlink_to("/dev/zero")
    elif kind == "char-device":
        if os.geteuid() != 0:
            pytest.skip("mknod needs root")
        os.mknod(spec, 0o666 | 0o020000, os.makedev(1, 5))  # a second /dev/zero
    log = tramp_world["tmp"] / f"log-{kind}.json"
    res = subprocess.run([str(tramp_world["tramp"]), "--log", str(log), "--log-format", "json",
                          "create", "--bundle", str(bundle), "id"],
                         env=tramp_world["env"], capture_output=True, text=True, timeout=20)
    assert res.returncode == 1
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"nvshim: cannot read {spec}"), res.stderr
    assert len(log.read_text().splitlines()) == 1
    assert not (tramp_world["tmp"] / "rec").exists()
    assert processes_mentioning(str(bundle)) == []


# --- 7: temp files of killed creates ---------------------------------------------------------


def test_07_next_create_removes_temp_files_of_dead_pids_only(node: dict, tmp_path: Path) -> None:
    """A `.config.json.nvshim-<pid>` left by a SIGKILLed create is removed by the next create of
    the bundle; one of a live process (a create in progress) is kept."""
    dead = subprocess.Popen(["sleep", "60"])
    dead.kill()
    dead.wait()
    alive = subprocess.Popen(["sleep", "60"])
    try:
        bundle = make_bundle(tmp_path, GPU_SPEC + b"}")
        stale = bundle / f".config.json.nvshim-{dead.pid}"
        stale.write_bytes(b"{" * 1_000_000)
        busy = bundle / f".config.json.nvshim-{alive.pid}"
        busy.write_bytes(b"{}")
        other = bundle / f".other.nvshim-{dead.pid}"
        other.write_bytes(b"{}")
        res = runtime_create(node, bundle)
        assert res.returncode == 0, res.stderr
        assert not stale.exists()
        assert busy.exists() and other.exists()
        assert b"/dev/nvidia0" in (bundle / "config.json").read_bytes()
    finally:
        alive.kill()
        alive.wait()


# --- 9: config files others can write ----------------------------------------------------------


@needs_root
@pytest.mark.parametrize("target", ["yaml", "compiled", "runtimes", "prefixes", "directory", "owner"])
def test_09_config_writable_by_others_is_refused(tramp_world: dict, target: str) -> None:
    """A config.yaml, compiled copy or trampoline list that group/others can write (or a
    non-root user owns), or a directory others can replace it in, fails every Python command in one line."""
    from nvshim.config import compiled_path, prefixes_path, runtimes_path

    config = tramp_world["config"]
    path = {"yaml": config, "compiled": Path(compiled_path(str(config))),
            "runtimes": Path(runtimes_path(str(config))), "prefixes": Path(prefixes_path(str(config))),
            "directory": config.parent, "owner": config}[target]
    if target == "owner":
        os.chown(path, 65534, -1)
        expected = f"config {path} is owned by uid 65534, not root"
    elif target == "directory":
        path.chmod(0o777)
        expected = f"config directory {path} can be written by others"
    else:
        path.chmod(0o666)
        expected = f"config {path} is writable by group or others (mode 0666)"
    env = dict(os.environ, NVSHIM_CONFIG=str(config))
    res = nvshim_cli("config", "show", env=env)
    assert res.returncode == 1 and res.stderr.splitlines() == [f"nvshim: {expected}" + res.stderr.split(expected, 1)[1].rstrip("\n")]
    bundle = tramp_world["tmp"] / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text('{"process":{"env":["NVIDIA_VISIBLE_DEVICES=void"]}}')
    res = subprocess.run([str(tramp_world["tramp"]), "create", "--bundle", str(bundle), "id"],
                         env=tramp_world["env"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1 and expected in res.stderr
    assert not (tramp_world["tmp"] / "rec").exists()
    if target == "directory":
        path.chmod(0o1777)  # sticky, like /tmp: others cannot replace root's files
        assert nvshim_cli("config", "show", env=env).returncode == 0


@needs_root
def test_09_trampoline_never_execs_a_runtime_list_written_by_another_user(tramp_world: dict) -> None:
    """A .runtimes list made world-writable and then rewritten by another user (nobody) is not
    exec'd by the trampoline: the passthrough goes to Python, which refuses the list."""
    import shutil
    import tempfile

    from nvshim.config import runtimes_path
    from nvshim.runtime.compile import compile_node

    etc = Path(tempfile.mkdtemp(prefix="nvshim-12-09-", dir="/tmp"))  # reachable for nobody
    try:
        etc.chmod(0o755)
        config = etc / "config.yaml"
        config.write_text(f"runtimes: [{tramp_world['runtime']}]\n")
        compile_node(str(config))
        listing = Path(runtimes_path(str(config)))
        evil = etc / "evil"
        evil.write_text(f"#!/bin/sh\ntouch {etc}/pwned\n")
        evil.chmod(0o755)
        listing.chmod(0o666)
        wrote = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh",
                                "-c", f"printf '%s\\n' {evil} > {listing}"], capture_output=True, text=True)
        assert wrote.returncode == 0, wrote.stderr
        assert listing.read_text() == f"{evil}\n"
        env = dict(tramp_world["env"], NVSHIM_CONFIG=str(config))
        res = subprocess.run([str(tramp_world["tramp"]), "state", "x"], env=env,
                             capture_output=True, text=True, timeout=30)
        assert not (etc / "pwned").exists()
        assert res.returncode == 1 and "writable by group or others" in res.stderr, res.stderr
        assert len(res.stderr.splitlines()) == 1
    finally:
        shutil.rmtree(etc)


# --- 16: version, container id in the debug log, no stray files -------------------------------


@pytest.mark.parametrize("flag", ["--version", "-v"])
def test_16_version_shows_nvshim_then_the_runtime(tramp_world: dict, flag: str) -> None:
    """`nvshim-runtime --version` prints nvshim's version, then execs the low-level runtime's --version."""
    from nvshim import __version__

    runtime = tramp_world["runtime"]
    runtime.write_text("#!/bin/sh\necho \"runc version 9.9.9 ($*)\"\n")
    from nvshim.runtime.compile import compile_node

    compile_node(str(tramp_world["config"]))
    for script in ([str(tramp_world["tramp"])], [sys.executable, "-I", "-m", "nvshim.runtime.main"]):
        res = subprocess.run([*script, flag], env=tramp_world["env"], capture_output=True,
                             text=True, timeout=30, cwd=str(REPO))
        assert res.returncode == 0, res.stderr
        assert res.stdout == f"nvshim-runtime version {__version__}\n\nrunc version 9.9.9 ({flag})\n"


def test_16_debug_log_records_carry_the_container_id(node: dict, tmp_path: Path) -> None:
    """Every debug-log record of a create names the container id."""
    debug = tmp_path / "debug.log"
    cfg = tmp_path / "etc" / "config.yaml"
    cfg.parent.mkdir()
    cfg.write_text(node["config"].read_text() + f"debug-log: {debug}\n")
    bundle = make_bundle(tmp_path, GPU_SPEC + b"}")
    res = runtime_create(dict(node, config=cfg), bundle, argv=[
        "--root", "/r", "create", "--bundle", str(bundle), "--pid-file", "/p", "ctr-12-16"])
    assert res.returncode == 0, res.stderr
    records = [json.loads(line) for line in debug.read_text().splitlines()]
    assert {r["event"] for r in records} >= {"request", "create"}
    assert all(r.get("id") == "ctr-12-16" for r in records), records


def test_16_no_stray_shell_artifacts_at_the_repo_root() -> None:
    """No file like `=12.4` (an unquoted `pip install x>=12.4`) sits at the repo root.

    Reads the directory, not `git ls-files`: the README's test command must pass where
    git is not installed (install.sh --dev does not install it)."""
    assert [n for n in os.listdir(REPO) if n[:1] in "=<>"] == []


def test_01_compiling_twice_leaves_one_source_link_and_no_temp_files(tmp_path: Path) -> None:
    """compile twice: the lists, the compiled copy, the CDI index and one hard link to the
    YAML, nothing else."""
    from nvshim.config import compiled_lists_fresh, source_link_path
    from nvshim.runtime.compile import compile_node

    config = tmp_path / "config.yaml"
    config.write_text("runtimes: [runc]\n")
    compile_node(str(config))
    compile_node(str(config))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.annotation-prefixes", "config.cdi-index.json", "config.compiled.json",
        "config.runtimes", "config.source-link", "config.yaml"]
    assert os.path.samefile(config, source_link_path(str(config)))
    assert compiled_lists_fresh(str(config))
    config.write_text("runtimes: [crun]\n")
    assert not compiled_lists_fresh(str(config))


@needs_root
def test_09_world_writable_plan_cache_is_ignored_and_rewritten(node: dict, tmp_path: Path) -> None:
    """The node plan cache names host files that get bind-mounted: one that others can write
    (and did: a firmware entry now points at /etc/hostname) is not used; the create discovers
    live, and the cache is rewritten with mode 0644."""
    from nvshim.config import plan_path
    from nvshim.runtime.compile import compile_node

    cfg = tmp_path / "etc" / "config.yaml"
    cfg.parent.mkdir()
    cfg.write_text(node["config"].read_text())
    compile_node(str(cfg))
    plan = Path(plan_path(str(cfg)))
    doc = json.loads(plan.read_text())
    next(f for f in doc["files"] if f["kind"] == "firmware")["host_path"] = "/etc/hostname"
    plan.write_text(json.dumps(doc))
    plan.chmod(0o666)
    bundle = make_bundle(tmp_path, GPU_SPEC + b"}")
    res = runtime_create(dict(node, config=cfg), bundle)
    assert res.returncode == 0, res.stderr
    mounts = json.loads((bundle / "config.json").read_bytes())["mounts"]
    assert "/etc/hostname" not in {m.get("source") for m in mounts}
    assert any(str(m.get("source", "")).endswith(".bin") for m in mounts)  # firmware from live discovery
    assert plan.stat().st_mode & 0o777 == 0o644 and "/etc/hostname" not in plan.read_text()


# --- 14: inspect tells what the container will see -------------------------------------------


@needs_root
def test_14_inspect_reports_the_void_env_and_each_node_once(tmp_path: Path) -> None:
    """`nvshim inspect` says the env becomes NVIDIA_VISIBLE_DEVICES=void (text and JSON
    set_void) and lists /dev/nvidia0 once for `all` on a MIG node, as config.json will have it."""
    from nvshim.host.sim import create_node

    sim = create_node(str(tmp_path / "node"), gpus=2, mig=True)
    config = tmp_path / "config.yaml"
    config.write_text(f"driver-root: {sim.root}\n")
    bundle = make_bundle(tmp_path, b'{"process":{"env":["NVIDIA_VISIBLE_DEVICES=all"]},"root":{"path":"rootfs"}}')
    res = nvshim_cli("inspect", "--bundle", str(bundle), "--config", str(config), "--format", "json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["set_void"] is True and summary["env_set"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    nodes = summary["device_nodes"]
    assert len(nodes) == len(set(nodes)) and nodes.count("/dev/nvidia0") == 1
    text = nvshim_cli("inspect", "--bundle", str(bundle), "--config", str(config))
    assert "env:           NVIDIA_VISIBLE_DEVICES=void (after injection" in text.stdout
    line = next(x for x in text.stdout.splitlines() if x.startswith("device nodes:"))
    assert line.split().count("/dev/nvidia0") == 1


# --- 11: the containerd drop-in's copy of the CRI table drifts ---------------------------------

MAIN_TOML = '''version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.6"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = true
'''


@pytest.mark.parametrize("extra", [{}, {"enable_cdi": True},
                                   {"set_as_default": True, "require_allocation": True}])
def test_11_doctor_finds_a_stale_drop_in_and_configure_resyncs_it(tmp_path: Path, extra: dict) -> None:
    """After `runtime configure` with a drop-in, an edit of the main file's CRI table
    (sandbox_image) is shadowed by the drop-in's copy: doctor fails naming the key and the
    fix, and running configure again copies the table anew (doctor quiet again)."""
    from nvshim.node import doctor, doctor_engines
    from nvshim.node.containerd import configure
    from nvshim.node.containerd_read import drop_in_drift
    from nvshim.node.findings import DoctorOptions

    main_file = tmp_path / "config.toml"
    main_file.write_text(MAIN_TOML)
    drop_in = tmp_path / "conf.d" / "99-nvshim.toml"
    binary = tmp_path / "nvshim-runtime"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    args = dict(drop_in=str(drop_in), binary=str(binary), **extra)
    configure(str(main_file), **args)
    assert drop_in_drift(str(main_file)) == []  # nvshim's own additions are not drift
    assert doctor_engines.check_drop_in_drift(str(main_file)) is None

    main_file.write_text(main_file.read_text().replace("pause:3.6", "pause:3.9"))  # an operator edit
    drift = drop_in_drift(str(main_file))
    assert drift == [(str(drop_in), ['plugins."io.containerd.grpc.v1.cri".sandbox_image'])]
    finding = doctor_engines.check_drop_in_drift(str(main_file))
    assert finding is not None and finding.status == "fail"
    assert "sandbox_image" in finding.message
    # the drop-in sits where configure puts it for this config (beside it): no --drop-in
    assert finding.fix == (f"nvshim runtime configure --runtime containerd --config {main_file} "
                           "(copies the table again)")
    options = DoctorOptions(config_path=str(tmp_path / "none.yaml"),
                                   containerd_config=str(main_file))
    assert any(f.check == "containerd-drop-in" and f.status == "fail" for f in doctor.run_checks(options))

    configure(str(main_file), **args)  # the fix doctor names
    assert drop_in_drift(str(main_file)) == []
    assert 'sandbox_image = "registry.k8s.io/pause:3.9"' in drop_in.read_text()


# --- defect hunt (hostile images and bundles): NUL bytes in the paths of config.json ----------


def test_nul_byte_in_root_path_is_one_clear_line(node: dict, tmp_path: Path) -> None:
    """A root.path with a NUL byte (runc cannot use it either) fails the create with one line
    naming root.path, not an "internal error: ValueError", and config.json keeps its bytes."""
    raw = GPU_SPEC.replace(b'"path":"rootfs"', b'"path":"root\\u0000fs"') + b"}"
    bundle = make_bundle(tmp_path, raw)
    res = runtime_create(node, bundle)
    assert res.returncode == 1
    lines = res.stderr.decode().splitlines()
    assert lines == [f"nvshim: {bundle}/config.json: root.path 'root\\x00fs' contains a NUL byte"]
    assert (bundle / "config.json").read_bytes() == raw


def test_nul_byte_in_a_mount_destination_does_not_crash_the_create(node: dict, tmp_path: Path) -> None:
    """A mount destination with a NUL byte cannot be resolved in the rootfs: the in-root work
    goes to the hook (runc then refuses the mount itself, "mount field contains null byte")
    instead of the create dying with "internal error: ValueError"."""
    raw = GPU_SPEC + b',"mounts":[{"destination":"/a\\u0000b","type":"tmpfs","source":"tmpfs"}]}'
    bundle = make_bundle(tmp_path, raw)
    res = runtime_create(node, bundle)
    assert res.returncode == 0, res.stderr
    assert res.stderr == b""
    hooks = json.loads((bundle / "config.json").read_bytes())["hooks"]["createContainer"]
    assert any("nvshim.hook" in arg for hook in hooks for arg in hook["args"])


# --- defect hunt (hostile images and bundles): a key twice in config.json ----------------------


@pytest.mark.parametrize("second", [
    b'"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"],"args":["sh"],"cwd":"/"}',
    b'"annotations":{"a":"1"},"annotations":{"b":"2"}',
    b'"linux":{"x":{"k":1,"k":2}}',
])
def test_duplicate_key_in_config_json_is_refused(node: dict, tmp_path: Path, second: bytes) -> None:
    """A key twice in one object, at any depth, fails the create in one line naming it and
    leaves config.json as it was: runc (Go) decodes the second copy into the first, so the
    spec below runs as uid 1000 under runc, while a rewrite from Python's last-wins dict
    dropped ``process.user`` and ran the GPU container as root."""
    raw = (b'{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=0"],"args":["sh"],'
           b'"cwd":"/","user":{"uid":1000,"gid":1000}},"root":{"path":"rootfs"},' + second + b"}")
    bundle = make_bundle(tmp_path, raw)
    res = runtime_create(node, bundle)
    assert res.returncode == 1, res.stderr
    lines = res.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"nvshim: {bundle}/config.json: duplicate key"), lines
    key = {b'"p': "process", b'"a': "annotations", b'"l': "k"}[second[:2]]
    assert f'duplicate key "{key}"' in lines[0]
    assert json.loads((bundle / "log.json").read_text().splitlines()[-1])["msg"] == lines[0]
    assert (bundle / "config.json").read_bytes() == raw


@pytest.mark.parametrize("field", [b'"hooks":[]', b'"linux":[]', b'"hooks":{"createContainer":{}}'])
def test_a_wrong_type_met_while_editing_names_the_bundle(node: dict, tmp_path: Path, field: bytes) -> None:
    """A field of the wrong type that only the edit meets (hooks, linux) fails in one line
    naming this bundle's config.json, like the fields the request reads, not a bare
    "config.json:" that could be any container's; config.json keeps its bytes."""
    raw = GPU_SPEC + b"," + field + b"}"
    bundle = make_bundle(tmp_path, raw)
    res = runtime_create(node, bundle)
    assert res.returncode == 1
    lines = res.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"nvshim: {bundle}/config.json: "), lines
    assert "must be a" in lines[0]
    assert (bundle / "config.json").read_bytes() == raw


# --- a rootfs that is the host's /: runc makes the mount targets in the host's folders ------


def _host_root_spec(root_path: str, env: list) -> bytes:
    return json.dumps({"ociVersion": "1.0.2", "process": {"env": env, "args": ["true"], "cwd": "/"},
                       "root": {"path": root_path}}, indent="\t").encode()


def _up_to_host_root(bundle: Path) -> str:
    """A relative root.path that leads from ``bundle`` up to the host's /."""
    return "/".join([".."] * len(bundle.resolve().parts))


@needs_root
@pytest.mark.parametrize("env", [["NVIDIA_VISIBLE_DEVICES=0"], ["NVIDIA_VISIBLE_DEVICES=none"],
                                 ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all"],
                                 ["NVIDIA_IMEX_CHANNELS=0"]])
@pytest.mark.parametrize("how", ["slash", "symlink", "relative"])
def test_a_rootfs_that_is_the_host_root_gets_no_driver_files(node: dict, tmp_path: Path,
                                                              env: list, how: str) -> None:
    """A create that would inject anything into a rootfs that is the host's / ("/", a symlink to
    it, a relative path up to it) fails in one line naming the rootfs and the bundle: runc would
    make each mount target as an empty file in the host's /usr/bin, library folder and
    /lib/firmware before failing. config.json keeps its bytes and runc never runs."""
    bundle = tmp_path / "b"
    bundle.mkdir()
    (tmp_path / "root-link").symlink_to("/")
    root_path = {"slash": "/", "symlink": str(tmp_path / "root-link"),
                 "relative": _up_to_host_root(bundle)}[how]
    raw = _host_root_spec(root_path, ["PATH=/bin", *env])
    (bundle / "config.json").write_bytes(raw)
    recorded = Path(node["base"], "recorded")
    recorded.unlink(missing_ok=True)
    res = runtime_create(node, bundle)
    assert res.returncode == 1, res.stderr
    lines = res.stderr.decode().splitlines()
    shown = os.path.normpath(os.path.join(bundle, root_path))
    assert lines == [f"nvshim: the container's rootfs {shown} is the host's /: nvshim injects no "
                     f"driver files into the host (bundle {bundle})"]
    assert json.loads((bundle / "log.json").read_text().splitlines()[-1])["msg"] == lines[0]
    assert (bundle / "config.json").read_bytes() == raw
    assert not recorded.exists()


@needs_root
@pytest.mark.parametrize("env", [[], ["NVIDIA_VISIBLE_DEVICES="], ["NVIDIA_VISIBLE_DEVICES=void"]])
def test_a_host_root_container_asking_for_nothing_passes_through(node: dict, tmp_path: Path,
                                                                 env: list) -> None:
    """root.path "/" without a GPU request is runc's business: nvshim adds nothing (void only
    says so in the env), fails nothing, and runs the low-level runtime."""
    bundle = tmp_path / "b"
    bundle.mkdir()
    raw = _host_root_spec("/", ["PATH=/bin", *env])
    (bundle / "config.json").write_bytes(raw)
    recorded = Path(node["base"], "recorded")
    recorded.unlink(missing_ok=True)
    res = runtime_create(node, bundle)
    assert res.returncode == 0 and res.stderr == b"", res.stderr
    assert recorded.read_text().splitlines()[-1] == "cid-12"
    after = json.loads((bundle / "config.json").read_bytes())
    assert "mounts" not in after and "linux" not in after and "hooks" not in after
    if "void" not in str(env):
        assert (bundle / "config.json").read_bytes() == raw


@needs_root
def test_a_bind_mount_of_the_host_root_is_the_host_root(node: dict, tmp_path: Path) -> None:
    """A rootfs that is / bind-mounted elsewhere (same device and inode, another path) is refused
    like "/" itself."""
    bundle = tmp_path / "b"
    (bundle / "rootfs").mkdir(parents=True)
    raw = _host_root_spec("rootfs", ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"])
    (bundle / "config.json").write_bytes(raw)
    argv = [sys.executable, "-I", "-m", "nvshim.runtime.main", "--log", str(bundle / "log.json"),
            "--log-format", "json", "create", "--bundle", str(bundle), "cid-12"]
    script = 'mount --bind / "$1" || exit 99; shift; exec "$@"'
    res = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
                          str(bundle / "rootfs"), *argv], capture_output=True, timeout=60,
                         cwd=str(REPO), env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                             "NVSHIM_CONFIG": str(node["config"])})
    if res.returncode == 99:
        pytest.skip(f"cannot bind-mount / here: {res.stderr.decode().strip()}")
    assert res.returncode == 1, res.stderr
    assert res.stderr.decode().splitlines() == [
        f"nvshim: the container's rootfs {bundle}/rootfs is the host's /: nvshim injects no "
        f"driver files into the host (bundle {bundle})"]
    assert (bundle / "config.json").read_bytes() == raw
