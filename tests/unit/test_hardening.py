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


def make_bundle(tmp_path: Path, raw: bytes, name: str = "b") -> Path:
    bundle = tmp_path / name
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_bytes(raw)
    return bundle


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
