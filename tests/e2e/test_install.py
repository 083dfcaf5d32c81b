"""install.sh: idempotent, writes what it says, and --uninstall removes exactly that."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.helpers.common import require_root
from tests.helpers.payload import payload_dir

REPO = Path(__file__).resolve().parents[2]


def snapshot(root: Path) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = (
                p.read_bytes() if p.is_file() and not p.is_symlink() else None
            )
    return out


def run_install(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        NVSHIM_PREFIX=str(tmp / "opt"),
        NVSHIM_BINDIR=str(tmp / "bin"),
        NVSHIM_ETCDIR=str(tmp / "etc" / "nvshim"),
        NVSHIM_SKIP_APT="1",
        # a test install never points at the real /etc/containerd
        NVSHIM_CONTAINERD_CONFIG=str(tmp / "etc" / "containerd" / "config.toml"),
    )
    # the cached self-contained payload (plain install.sh, which builds one first, is
    # test_moved_install_never_reads_etc_nvshim_nor_touches_real_containerd's)
    source = [] if "--uninstall" in args else ["--from", str(payload_dir())]
    return subprocess.run(
        ["sh", str(REPO / "install.sh"), *source, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_install_is_idempotent_and_uninstall_is_exact(tmp_path):
    """A second install changes nothing; uninstall leaves the tree as it was, keeping an
    edited config and files it did not create."""
    require_root()
    (tmp_path / "bin").mkdir()
    (tmp_path / "etc").mkdir()  # exists on any host; install.sh adds etc/nvshim
    (tmp_path / "bin" / "someone-elses-tool").write_text("keep me\n")
    before = snapshot(tmp_path)

    first = run_install(tmp_path)
    assert first.returncode == 0, first.stderr
    runtime = tmp_path / "bin" / "nvshim-runtime"
    cli = tmp_path / "bin" / "nvshim"
    assert runtime.read_text().startswith("#!/bin/sh") and os.access(runtime, os.X_OK)
    # the self-contained runtime: the command execs the prefix's own loader and interpreter
    assert cli.read_text().startswith("#!/bin/sh\n")
    assert (
        f"exec {tmp_path}/opt/lib/ld-linux-x86-64.so.2 --library-path {tmp_path}/opt/lib "
        in cli.read_text()
    )
    cfg = tmp_path / "etc" / "nvshim" / "config.yaml"
    assert cfg.read_text() == (REPO / "config" / "config.yaml").read_text()
    assert (tmp_path / "etc" / "nvshim" / "config.compiled.json").exists()
    assert (tmp_path / "etc" / "nvshim" / "config.runtimes").read_text() == "runc\ncrun\n"
    version = subprocess.run([str(cli), "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and "0.1.0" in version.stdout

    # the node plan cache and the CDI index mirror the machine (other tests change
    # /var/run/cdi meanwhile): the same files, but their bytes may differ
    caches = ("config.plan.json", "config.cdi-index.json")

    def state() -> dict:
        return {
            k: (None if k.endswith(caches) else v)
            for k, v in snapshot(tmp_path).items()
            if "/venv/" not in f"/{k}"
        }

    installed = state()
    second = run_install(tmp_path)
    assert second.returncode == 0, second.stderr
    again = state()
    assert again == installed  # idempotent: same files, same bytes

    gone = run_install(tmp_path, "--uninstall")
    assert gone.returncode == 0, gone.stderr
    assert snapshot(tmp_path) == before

    # an edited config survives uninstall, and the script says so
    assert run_install(tmp_path).returncode == 0
    cfg.write_text(cfg.read_text() + "\nrequire-allocation: true\n")
    gone = run_install(tmp_path, "--uninstall")
    assert gone.returncode == 0 and f"kept {cfg}" in gone.stderr
    assert cfg.exists() and not runtime.exists() and not (tmp_path / "opt").exists()


def test_install_registers_docker_and_crio_and_uninstall_restores_bytes(tmp_path):
    """--docker writes runtimes.nvshim into daemon.json and the --gpus hook, --crio the CRI-O
    drop-in; --uninstall puts daemon.json back byte for byte and removes the hook and the
    drop-in."""
    require_root()
    import json

    (tmp_path / "bin").mkdir()
    etc = tmp_path / "etc"
    (etc / "docker").mkdir(parents=True)
    daemon_json = etc / "docker" / "daemon.json"
    original = '{\n  "log-level": "warn"\n}\n'
    daemon_json.write_text(original)
    crio_conf = etc / "crio" / "crio.conf"
    crio_conf.parent.mkdir()
    crio_conf.write_text('[crio.runtime]\nconmon_cgroup = "pod"\n')
    before = snapshot(tmp_path)
    env = dict(
        os.environ,
        NVSHIM_PREFIX=str(tmp_path / "opt"),
        NVSHIM_BINDIR=str(tmp_path / "bin"),
        NVSHIM_ETCDIR=str(etc / "nvshim"),
        NVSHIM_SKIP_APT="1",
        NVSHIM_DOCKER_CONFIG=str(daemon_json),
        NVSHIM_CRIO_CONFIG=str(crio_conf),
    )

    def install(*args: str) -> subprocess.CompletedProcess:
        source = [] if "--uninstall" in args else ["--from", str(payload_dir())]
        return subprocess.run(
            ["sh", str(REPO / "install.sh"), *source, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    done = install("--docker", "--crio")
    assert done.returncode == 0, done.stderr
    runtime = str(tmp_path / "bin" / "nvshim-runtime")
    assert json.loads(daemon_json.read_text()) == {
        "log-level": "warn",
        "runtimes": {"nvshim": {"path": runtime}},
    }
    # docker run --gpus: nvshim's nvidia-container-runtime-hook beside nvshim-runtime, in the
    # manifest (uninstall's snapshot check below sees it go)
    hook = tmp_path / "bin" / "nvidia-container-runtime-hook"
    assert os.access(hook, os.X_OK) and "docker run --gpus" in hook.read_text()
    assert f"file {hook} " in (tmp_path / "opt" / "install-manifest").read_text()
    drop_in = etc / "crio" / "crio.conf.d" / "99-nvshim.toml"
    assert f'runtime_path = "{runtime}"' in drop_in.read_text()
    assert "restart it yourself" in done.stderr
    again = install("--docker", "--crio")
    assert again.returncode == 0 and "nothing written" in again.stderr
    gone = install("--uninstall")
    assert gone.returncode == 0, gone.stderr
    assert daemon_json.read_text() == original
    assert snapshot(tmp_path) == before


MOVED_INSTALL = r"""
set -e
# Poison what a moved install must never read or touch (private mount namespace only).
if [ -d /etc/nvshim ]; then
    mount -t tmpfs tmpfs /etc/nvshim
    printf 'runtimes: [/nonexistent/POISON]\nrequire-allocation: [broken\n' > /etc/nvshim/config.yaml
fi
if [ -d /etc/containerd ]; then
    mount -t tmpfs tmpfs /etc/containerd
    echo sentinel > /etc/containerd/config.toml
fi
sh "$REPO/install.sh" --containerd
echo "--- show"; "$T/bin/nvshim" config show | head -n1
echo "--- version"; "$T/bin/nvshim-runtime" --version
echo "--- drop-in"; ls "$T/containerd/conf.d"
sh "$REPO/install.sh" --uninstall
echo "--- real containerd dir"; find /etc/containerd -type f 2>/dev/null | sort
echo "--- real containerd config"; cat /etc/containerd/config.toml 2>/dev/null || echo sentinel
"""


def test_moved_install_never_reads_etc_nvshim_nor_touches_real_containerd(tmp_path):
    """Issue 12 item 13: with NVSHIM_PREFIX/BINDIR/ETCDIR/CONTAINERD_CONFIG moved, install,
    the installed commands and uninstall use only the moved paths: a poisoned /etc/nvshim is
    never read, the real /etc/containerd is untouched and containerd is not restarted."""
    require_root()
    from tests.helpers.containerd_samples import DEBIAN_CONFIG

    (tmp_path / "bin").mkdir()
    (tmp_path / "etc").mkdir()
    ctrd = tmp_path / "containerd" / "config.toml"
    ctrd.parent.mkdir()
    ctrd.write_text(DEBIAN_CONFIG)
    env = dict(
        os.environ,
        NVSHIM_PREFIX=str(tmp_path / "opt"),
        NVSHIM_BINDIR=str(tmp_path / "bin"),
        NVSHIM_ETCDIR=str(tmp_path / "etc" / "nvshim"),
        NVSHIM_SKIP_APT="1",
        NVSHIM_CONTAINERD_CONFIG=str(ctrd),
        REPO=str(REPO),
        T=str(tmp_path),
    )
    env.pop("NVSHIM_CONFIG", None)
    res = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", MOVED_INSTALL],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert f"# effective config from {tmp_path}/etc/nvshim/config.yaml" in out
    version = out.split("--- version\n", 1)[1]
    assert version.startswith("nvshim-runtime version ") and "runc version" in version
    assert out.rstrip().endswith("--- real containerd config\nsentinel")
    assert "--- drop-in\n99-nvshim.toml\n" in out  # next to the moved config
    real = out.split("--- real containerd dir\n", 1)[1].split("--- real containerd config", 1)[0]
    assert real.split() in ([], ["/etc/containerd/config.toml"])  # nothing added there
    assert "POISON" not in out + res.stderr and "broken" not in out + res.stderr
    assert "restarted" not in res.stderr
    assert f"did not restart containerd: {ctrd} is not its system config" in res.stderr
    assert ctrd.read_text() == DEBIAN_CONFIG  # uninstall restored the moved config's bytes
    tramp = tmp_path / "bin" / "nvshim-runtime"
    assert not tramp.exists()


def _env(tmp: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVSHIM_")}
    env.update(
        NVSHIM_PREFIX=str(tmp / "opt"),
        NVSHIM_BINDIR=str(tmp / "bin"),
        NVSHIM_ETCDIR=str(tmp / "etc" / "nvshim"),
        NVSHIM_SKIP_APT="1",
        NVSHIM_CONTAINERD_CONFIG=str(tmp / "etc" / "containerd" / "config.toml"),
        NVSHIM_DOCKER_CONFIG=str(tmp / "etc" / "docker" / "daemon.json"),
        NVSHIM_RESTART_MODE="none",
    )
    env.update(extra)
    return env


def _sh(
    env: dict, *argv: str, script: str = str(REPO / "install.sh"), umask: str = ""
) -> subprocess.CompletedProcess:
    pre = f"umask {umask}; " if umask else ""
    return subprocess.run(
        ["sh", "-c", pre + 'exec sh "$@"', "sh", script, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _loose(path: Path) -> bool:
    st = path.lstat()
    return not path.is_symlink() and bool(st.st_mode & 0o022)


def test_umask_000_installs_nothing_writable_by_others_and_an_open_manifest_is_refused(tmp_path):
    """install.sh pins its umask: under umask 000 every file and folder it installs is
    writable by root only (the manifest 0644); a manifest, or the payload's file list,
    others could write is refused by --uninstall with one line, and nothing is removed."""
    require_root()
    (tmp_path / "bin").mkdir()
    (tmp_path / "etc").mkdir()
    done = _sh(_env(tmp_path), "--from", str(payload_dir()), umask="000")
    assert done.returncode == 0, done.stderr
    manifest = tmp_path / "opt" / "install-manifest"
    assert manifest.stat().st_mode & 0o777 == 0o644
    ours = [tmp_path / "opt", tmp_path / "etc" / "nvshim", tmp_path / "bin"]
    loose = [str(p) for top in ours for p in [top, *top.rglob("*")] if _loose(p)]
    assert loose == [], loose[:10]

    manifest.chmod(0o666)
    before = snapshot(tmp_path)
    gone = _sh(_env(tmp_path), "--uninstall")
    assert gone.returncode == 1
    assert gone.stderr.count("\n") == 1, gone.stderr
    assert f"{manifest} is not trusted" in gone.stderr and "mode 666" in gone.stderr
    assert snapshot(tmp_path) == before
    manifest.chmod(0o644)
    listing = tmp_path / "opt" / "payload-files"
    listing.chmod(0o646)
    gone = _sh(_env(tmp_path), "--uninstall")
    assert gone.returncode == 1 and f"{listing} is not trusted" in gone.stderr, gone.stderr
    assert snapshot(tmp_path) == before
    listing.chmod(0o644)
    assert _sh(_env(tmp_path), "--uninstall").returncode == 0


def test_purge_removes_only_the_journals_recorded_at_install(tmp_path):
    """--uninstall --purge removes the grant and denial journals nvshim's config named at
    install time (the denial path as nvshim derives it, in a folder whose name has a dot),
    never a file a config names later, and never follows a link put at a recorded path."""
    require_root()
    from nvshim.runtime.denials import denials_path

    (tmp_path / "bin").mkdir()
    etc = tmp_path / "etc" / "nvshim"
    etc.mkdir(parents=True)
    journal = tmp_path / "var" / "lib" / "nv.shim" / "grants"
    config = etc / "config.yaml"
    config.write_text(f"grants-journal: {journal}\n")
    done = _sh(_env(tmp_path), "--from", str(payload_dir()))
    assert done.returncode == 0, done.stderr
    denied = Path(denials_path(str(journal)))
    assert denied.name == "grants.denied.jsonl"
    assert f"journal {denied}" in (tmp_path / "opt" / "install-manifest").read_text()
    journal.parent.mkdir(parents=True)  # what the runtime does at the first grant / denial
    journal.write_text("{}\n")
    linked = tmp_path / "linked-target"
    linked.write_text("precious\n")
    denied.symlink_to(linked)
    # someone points the config at another file: purge must not take it
    victim = tmp_path / "victim.jsonl"
    victim.write_text("precious\n")
    (tmp_path / "victim.denied.jsonl").write_text("precious\n")
    config.write_text(f"grants-journal: {victim}\n")
    gone = _sh(_env(tmp_path), "--uninstall", "--purge")
    assert gone.returncode == 0, gone.stderr
    assert not journal.exists() and denied.is_symlink()  # a link is not nvshim's journal
    assert linked.read_text() == "precious\n"
    denied.unlink()
    assert sorted(p.name for p in journal.parent.iterdir()) == []
    assert victim.read_text() == "precious\n"
    assert (tmp_path / "victim.denied.jsonl").read_text() == "precious\n"


CONFIG_OFF = "require-allocation: false\n"
CONFIG_COMMENTS = "# require-allocation: true\n# (everything commented out)\n\n"


def test_set_as_default_refuses_require_allocation_off_everywhere(tmp_path):
    """install.sh --set-as-default refuses a config with require-allocation off or holding
    only comments (one line, the engine config untouched); after a good one, every later
    run and nvshim config compile refuse an edit that turns it off, the compiled copy
    stays, doctor fails in one line naming the file, and uninstall removes the mark."""
    require_root()
    (tmp_path / "bin").mkdir()
    etc = tmp_path / "etc" / "nvshim"
    etc.mkdir(parents=True)
    ctrd = tmp_path / "etc" / "containerd" / "config.toml"
    ctrd.parent.mkdir()
    ctrd.write_text("")
    config = etc / "config.yaml"
    env = _env(tmp_path)
    journal = f"grants-journal: {tmp_path}/journal/grants.jsonl\n"
    for text, why in (
        (CONFIG_OFF, "has require-allocation off"),
        (CONFIG_COMMENTS, "holds no settings"),
    ):
        config.write_text(text)
        done = _sh(env, "--from", str(payload_dir()), "--containerd", "--set-as-default")
        assert done.returncode == 1
        lines = [line for line in done.stderr.splitlines() if "kept the previous" in line]
        assert len(lines) == 1 and why in lines[0] and str(config) in lines[0], done.stderr
        assert ctrd.read_text() == "" and not (ctrd.parent / "conf.d").exists()
    config.write_text("require-allocation: true\n" + journal)
    done = _sh(env, "--from", str(payload_dir()), "--containerd", "--set-as-default")
    assert done.returncode == 0, done.stderr
    mark = etc / "config.default-runtime"
    assert mark.exists()
    compiled = (etc / "config.compiled.json").read_bytes()

    config.write_text(CONFIG_OFF + journal)
    again = _sh(env, "--from", str(payload_dir()))
    assert again.returncode == 1 and "kept the previous config" in again.stderr, again.stderr
    cli = str(tmp_path / "bin" / "nvshim")
    comp = subprocess.run([cli, "config", "compile"], env=env, capture_output=True, text=True)
    assert comp.returncode == 1 and "require-allocation off: refused" in comp.stderr
    assert (etc / "config.compiled.json").read_bytes() == compiled
    doc = subprocess.run(
        [cli, "doctor", "--format", "json", "--containerd-config", str(ctrd)],
        env=env,
        capture_output=True,
        text=True,
    )
    import json

    found = [f for f in json.loads(doc.stdout) if f["check"] == "default-runtime-config"]
    assert found and found[0]["status"] == "fail", doc.stdout
    assert str(config) in found[0]["message"] and "\n" not in found[0]["message"]
    assert found[0]["fix"] == f"require-allocation: true in {config}"
    assert f"set require-allocation: true in {config}" in found[0]["detail"]

    config.write_text("require-allocation: true\n" + journal)
    gone = _sh(env, "--uninstall")
    assert gone.returncode == 0, gone.stderr
    assert not mark.exists() and ctrd.read_text() == ""


def test_installed_copy_and_a_moved_bin_dir(tmp_path):
    """sh PREFIX/install.sh --docker works from the installed copy (--dev says it needs a
    checkout); a missing NVSHIM_BINDIR is created, doctor finds the trampoline there, and
    uninstall removes the folders it made; an unwritable bin dir names NVSHIM_BINDIR."""
    require_root()
    import json

    bindir = tmp_path / "node" / "opt" / "bin"
    (tmp_path / "etc" / "docker").mkdir(parents=True)
    daemon_json = tmp_path / "etc" / "docker" / "daemon.json"
    daemon_json.write_text("{}\n")
    env = _env(tmp_path, NVSHIM_BINDIR=str(bindir))
    done = _sh(env, "--from", str(payload_dir()))
    assert done.returncode == 0, done.stderr
    copy = str(tmp_path / "opt" / "install.sh")
    docker = _sh(env, "--docker", script=copy)
    assert docker.returncode == 0, docker.stderr
    assert json.loads(daemon_json.read_text())["runtimes"]["nvshim"] == {
        "path": f"{bindir}/nvshim-runtime"
    }
    dev = _sh(env, "--dev", script=copy)
    assert dev.returncode == 1 and dev.stderr.count("\n") == 1 and "checkout" in dev.stderr

    doc = subprocess.run(
        [str(bindir / "nvshim"), "doctor", "--format", "json"],
        env={k: v for k, v in env.items() if k != "NVSHIM_BINDIR"},
        capture_output=True,
        text=True,
    )
    tramp = [f for f in json.loads(doc.stdout) if f["check"] == "trampoline"][0]
    assert tramp["status"] == "ok" and f"{bindir}/nvshim-runtime" in tramp["message"], tramp

    gone = _sh(env, "--uninstall", script=copy)
    assert gone.returncode == 0, gone.stderr
    assert daemon_json.read_text() == "{}\n"
    assert not (tmp_path / "node").exists()

    (tmp_path / "ro").write_text("a file where a folder should be\n")
    bad = _sh(
        _env(tmp_path, NVSHIM_BINDIR=str(tmp_path / "ro" / "bin")), "--from", str(payload_dir())
    )
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1, bad.stderr
    assert "cannot write" in bad.stderr and "NVSHIM_BINDIR" in bad.stderr
