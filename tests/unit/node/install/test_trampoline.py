"""The sh trampoline (``nvshim/node/install/trampoline.py``) against the Python argv parser.

The trampoline decides "create/run → Python, anything else → runc" in POSIX sh; the runtime
decides the same thing with :func:`nvshim.runtime.argv.parse_argv`. These tests run the rendered
script on hand-written and generated argv vectors (``NVSHIM_TRAMPOLINE_DECIDE=1`` makes it
print its decision) and require the same answer, then check that its passthrough branch
hands argv, env and cwd over untouched and falls back to Python when the YAML config is
newer than the runtime list compiled from it.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvshim.config import source_link_path
from nvshim.node.compile import compile_node
from nvshim.node.install.trampoline import prefixes_path, render, runtimes_path
from nvshim.runtime.argv import parse_argv
from tests.helpers.commands import make_trampoline_world, nvshim_cli

REPO = Path(__file__).resolve().parents[4]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (ownership, setpriv)")

# ----------------------------------------------------------------------------- helpers


def _shells() -> List[List[str]]:
    """The sh implementations a node's /bin/sh may be: dash (Debian), bash, busybox ash."""
    found = [["/bin/sh"]]
    if shutil.which("bash"):
        found.append([shutil.which("bash") or "bash", "--posix"])
    if shutil.which("busybox"):
        found.append([shutil.which("busybox") or "busybox", "sh"])
    return found


SHELLS = _shells()


@pytest.fixture(scope="module")
def decider(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trampoline rendered for an interpreter that does not exist (decisions only)."""
    path = tmp_path_factory.mktemp("tramp") / "nvshim-runtime"
    path.write_text(render("/nonexistent/python"))
    path.chmod(0o755)
    return path


def decide(script: Path, argv: Sequence[str], shell: Sequence[str] = ("/bin/sh",)) -> str:
    """What the trampoline decides for ``argv``: ``pass``, or ``modify`` plus ``<err>:<bundle>``."""
    env = {"PATH": "/usr/bin:/bin", "NVSHIM_TRAMPOLINE_DECIDE": "bundle"}
    res = subprocess.run([*shell, str(script), *argv], capture_output=True, env=env, timeout=10)
    assert res.returncode == 0, res.stderr
    assert res.stderr == b"", res.stderr
    return res.stdout.decode()


def expected(argv: Sequence[str]) -> str:
    """The same, from parse_argv: the decision, whether the bundle flag lacks a value, the bundle."""
    inv = parse_argv(list(argv))
    if not inv.modifies:
        return "pass\n"
    return f"modify\n{1 if inv.error else 0}:{inv.bundle or ''}\n"


# ----------------------------------------------------------------------------- decisions

EDGE_CASES: List[List[str]] = [
    [],
    ["create"],
    ["run"],
    ["state", "create"],
    ["delete", "run"],
    ["create", "--bundle", "/b", "id"],
    ["--bundle", "create"],
    ["-b=create"],
    ["-b", "create"],
    ["--root", "/r", "create", "id"],
    ["--root=/r", "create", "id"],
    ["--root", "create"],
    ["--root", "create", "run"],
    ["--root"],
    ["state", "--root"],
    ["--log", "x", "--log-format", "json", "create", "-b", "/b", "id"],
    ["--log=x", "create"],
    ["--log=", "create"],
    ["--log", "", "create"],
    ["--log", "--", "create"],
    ["---log", "x", "create"],
    ["---log", "create"],
    ["----root=/r", "run"],
    ["--criu", "/c", "run"],
    ["--rootless", "true", "create"],
    ["--rootless=true", "create"],
    ["--rootless", "create"],
    ["--systemd-cgroup", "create"],
    ["--debug", "run"],
    ["-debug", "create"],
    ["--", "create"],
    ["--", "--", "create"],
    ["--", "state"],
    ["--"],
    ["--", ""],
    ["-", "create"],
    ["-"],
    ["", "create"],
    [""],
    ["", ""],
    ["-v", "create"],
    ["--version", "create"],
    ["--version=1", "create"],
    ["-h", "create"],
    ["--help", "run"],
    ["--help=x", "run"],
    ["--debug", "-v"],
    ["create", "-v"],
    ["create", "--help"],
    ["--log", "-v", "create"],
    ["--log", "-h", "run"],
    ["--log", "--help", "state"],
    ["-vv", "create"],
    ["--verbose", "create"],
    ["-hx", "create"],
    ["--=x", "create"],
    ["--=", "run"],
    ["=", "create"],
    ["-=", "create"],
    ["create=1"],
    ["Create"],
    ["CREATE"],
    [" create"],
    ["create "],
    ["cre ate"],
    ["create\n"],
    ["\ncreate"],
    ["run\t"],
    ["créate"],
    ["ｃｒｅａｔｅ"],
    ["--log", "журнал с пробелом", "create", "ид"],
    ["--root", "/a b", "create", "id with spaces"],
    ["--root", "line\nbreak", "run", "x"],
    ["kill", "create", "KILL"],
    ["exec", "create", "sh"],
    ["create", "create"],
    ["run", "run"],
    ["state", "--", "create"],
    ["--log-format", "create"],
    ["--log-format", "json"],
    ["--log-format=json", "run"],
    ["--log-format=text", "state", "run"],
    ["-log-format", "text", "run"],
    ["-root", "/r", "-log", "/l", "create"],
    [
        "--root",
        "/r",
        "--log",
        "/l",
        "--log-format",
        "json",
        "--systemd-cgroup",
        "create",
        "--bundle",
        "/b",
        "--pid-file",
        "/p",
        "--console-socket",
        "/s",
        "id",
    ],
    ["--root", "/r", "delete", "--force", "create"],
    ["*", "create"],
    ["?", "run"],
    ["[c]reate"],
    ["$HOME", "create"],
    ["`id`", "create"],
    ["$(id)", "run"],
    ["'", "create"],
    ['"', "create"],
    ["\\", "create"],
    ["-\\", "create"],
    ["--root", "\\", "create"],
    ["--root=-v", "create"],
    ["--root", "-v", "create"],
    ["--log=--help", "run"],
    ["--log", "=x", "create"],
    ["-root=", "create"],
    ["--bundle=x", "create"],
    ["--bundle", "x", "create"],
    ["create", "--bundle", "/b1", "-b", "/b2", "id"],
    ["create", "-b=", "id"],
    ["create", "---bundle=/x=y", "id"],
    ["create", "id", "--bundle"],
    ["create", "--pid-file", "--bundle", "id"],
    ["create", "--console-socket=/s", "--bundle", "/b", "id"],
    ["create", "--", "--bundle", "/b"],
    ["run", "-d", "-b", "/r b", "id"],
    ["create", "--preserve-fds", "3", "-bundle", "/c", "x"],
    ["create", "-", "--bundle", "/after-dash"],
    # crun's grammar (issue 12 item 6): global values, prefixes, short clusters, --config
    ["--cgroup-manager", "systemd", "create", "--bundle", "/b", "id"],
    ["--cgroup-manager=systemd", "run", "-b", "/b", "id"],
    ["--cgroup-manager", "create", "run"],
    ["--cgroup-m", "x", "create"],
    ["--c", "x", "create"],
    ["--r", "/r", "create"],
    ["--lo", "x", "create"],
    ["--log-f", "json", "create", "-b", "/b"],
    ["--d", "create"],
    ["--ver", "create"],
    ["--usage", "create"],
    ["--u", "run"],
    ["--program-name", "x", "create"],
    ["--HANG", "create"],
    ["-V", "create"],
    ["-vx", "create"],
    ["-?", "create"],
    ["-?x", "run"],
    ["--?", "create"],
    ["create", "--bund", "/b", "id"],
    ["create", "--bund=/b", "id"],
    ["create", "--b", "/b", "id"],
    ["create", "--c", "/c", "id"],
    ["create", "--co", "/c", "-b", "/b"],
    ["create", "--cons", "/s", "-b", "/b"],
    ["create", "--conf", "c.json", "-b", "/b"],
    ["create", "--config=c.json"],
    ["create", "--config"],
    ["create", "-f", "c.json", "-b", "/b"],
    ["create", "-fc.json"],
    ["create", "-f"],
    ["create", "-b/b", "id"],
    ["create", "-bundle", "/b", "id"],
    ["create", "-bundle=/b", "id"],
    ["create", "-b=/b", "id"],
    ["create", "-b=", "id"],
    ["run", "-db", "/b", "id"],
    ["run", "-db/b", "id"],
    ["run", "-dd", "-b", "/b"],
    ["run", "-d=1", "-b", "/b"],
    ["run", "-dfx"],
    ["run", "-bf", "/x"],
    ["run", "-d?", "-b", "/b"],
    ["create", "-?", "-b", "/b"],
    ["create", "-detach", "-b", "/b"],
    ["create", "-pid-file", "/p", "-b", "/b"],
    ["create", "-pid-file=/p", "-b", "/b"],
    ["create", "--pid", "/p", "-b", "/b"],
    ["create", "--p", "/p", "-b", "/b"],
    ["create", "--no-p", "-b", "/b"],
    ["create", "--no-", "-b", "/b"],
    ["create", "--no-subreaper", "-b", "/b"],
    ["create", "---bund", "/b"],
    ["create", "--", "-b", "/b"],
    ["create", "-x", "-b", "/b"],
    ["create", "--=x", "-b", "/b"],
    ["create", "--=", "-b", "/b"],
    # create/run's own help: the runtime prints it and creates nothing (runc's =false is no help)
    ["create", "--help", "-b", "/b", "id"],
    ["create", "-b", "/b", "id", "-h"],
    ["run", "-help", "-b", "/b"],
    ["create", "--he", "-b", "/b"],
    ["create", "--h", "-b", "/b"],
    ["create", "--usage", "-b", "/b"],
    ["create", "--us=x", "-b", "/b"],
    ["create", "--help=false", "-b", "/b", "id"],
    ["create", "-h=0", "-b", "/b", "id"],
    ["create", "---help=False", "-b", "/b", "id"],
    ["create", "--help=true", "-b", "/b", "id"],
    ["create", "--help=false=x", "-b", "/b", "id"],
    ["create", "--usage=false", "-b", "/b", "id"],
    ["create", "-?=false", "-b", "/b", "id"],
    ["create", "-b", "/b", "--", "--help"],
]


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: " ".join(s))
def test_edge_cases_decide_like_parse_argv(decider: Path, shell: List[str]) -> None:
    """Every hand-written edge case gets the decision and bundle parse_argv finds, in dash, bash and busybox sh."""
    wrong = []
    for argv in EDGE_CASES:
        got = decide(decider, argv, shell)
        if got != expected(argv):
            wrong.append((argv, got, expected(argv)))
    assert wrong == []


def test_edge_cases_cover_both_decisions() -> None:
    """The hand-written cases include both create/run vectors and passthrough vectors."""
    decisions = {expected(a).split("\n")[0] for a in EDGE_CASES}
    assert decisions == {"modify", "pass"}
    bundles = {expected(a) for a in EDGE_CASES if expected(a).startswith("modify")}
    assert len(bundles) >= 5  # several distinct bundle/error outcomes are exercised
    assert len(EDGE_CASES) >= 100


TOKENS = [
    "create",
    "run",
    "state",
    "delete",
    "start",
    "kill",
    "exec",
    "list",
    "spec",
    "Create",
    "--",
    "-",
    "",
    " ",
    "---",
    "=",
    "--=",
    "-=x",
    "--root",
    "-root",
    "---root",
    "--root=/r",
    "--root=",
    "/r",
    "--log",
    "--log=x",
    "-log",
    "--log-format",
    "--log-format=json",
    "json",
    "--criu",
    "--rootless",
    "--rootless=auto",
    "--systemd-cgroup",
    "--debug",
    "-v",
    "--version",
    "-h",
    "--help",
    "--help=1",
    "-vh",
    "--verbose",
    "--bundle",
    "-b",
    "-b=create",
    "--bundle=create",
    "--pid-file",
    "id",
    "a b",
    "line\nbreak",
    "tab\t",
    "ünï",
    "✓",
    "$x",
    "*",
    "\\",
    "'",
    '"',
    "--cgroup-manager",
    "--cgroup-m=x",
    "--c",
    "--r",
    "--lo",
    "--log-f",
    "--ver",
    "--usage",
    "-V",
    "-?",
    "-vx",
    "--bund",
    "--bund=/b",
    "--co",
    "--conf",
    "--config",
    "-f",
    "-fc",
    "-b/b",
    "-bundle",
    "-b=",
    "-db",
    "-dd",
    "-d?",
    "--no-p",
    "--p",
    "--pid",
    "--HANG",
    "--help=false",
    "-h=0",
    "--he",
    "-help",
    "--help=F",
]


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    argv=st.lists(
        st.one_of(
            st.sampled_from(TOKENS),
            st.text(alphabet=st.sampled_from("-=abcdfrt eulvV?\n/"), max_size=8),
        ),
        max_size=8,
    )
)
def test_generated_argv_decide_like_parse_argv(decider: Path, argv: List[str]) -> None:
    """Generated argv vectors from a tricky-token alphabet get the same decision and bundle from sh and Python."""
    assert decide(decider, argv) == expected(argv)


# ----------------------------------------------------------------------------- handover

RECORDER = """#!/bin/sh
# records how it was started: argv (NUL-separated), env (env -0), cwd
rec={rec}
printf '%s\\0' "$0" "$@" > "$rec.argv"
{env} -0 > "$rec.env"
pwd -P > "$rec.cwd"
"""


def make_recorder(path: Path, record: Path) -> Path:
    """An executable at ``path`` that writes how it was called to ``record.*``."""
    path.write_text(RECORDER.format(rec=str(record), env=shutil.which("env") or "/usr/bin/env"))
    path.chmod(0o755)
    return path


def recorded_argv(record: Path) -> List[str]:
    data = (record.parent / (record.name + ".argv")).read_bytes()
    return data.decode().split("\0")[:-1]


def recorded_env(record: Path) -> Dict[str, str]:
    data = (record.parent / (record.name + ".env")).read_bytes().decode()
    return dict(e.split("=", 1) for e in data.split("\0") if e)


def mark_compiled(config: Path) -> None:
    """What compile does besides writing the lists: they get the YAML's mtime, and a hard
    link to the YAML records its inode."""
    mtime = config.stat().st_mtime_ns
    for listing in (runtimes_path(str(config)), prefixes_path(str(config))):
        os.utime(listing, ns=(mtime, mtime))
    link = Path(source_link_path(str(config)))
    link.unlink(missing_ok=True)
    os.link(config, link)


@pytest.fixture
def world(tmp_path: Path) -> Dict[str, Path]:
    """A trampoline whose python is a recorder, a compiled-looking config and a fake runtime."""
    fake_py = make_recorder(tmp_path / "fakepython", tmp_path / "py")
    tramp = tmp_path / "nvshim-runtime"
    tramp.write_text(render(str(fake_py)))
    tramp.chmod(0o755)
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    config = conf_dir / "config.yaml"
    config.write_text("runtimes: [fake]\n")
    runtime = make_recorder(tmp_path / "fake-runc", tmp_path / "rt")
    runtimes = Path(runtimes_path(str(config)))
    runtimes.write_text(f"{runtime}\n")
    Path(prefixes_path(str(config))).write_text("cdi.k8s.io/\n")
    mark_compiled(config)
    (cwd_dir := tmp_path / "bundle dir").mkdir()
    # a bundle whose config.json asks for a GPU, so create/run reach Python
    (cwd_dir / "config.json").write_text('{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}}')
    cwd = cwd_dir
    return {
        "tramp": tramp,
        "config": config,
        "runtimes": runtimes,
        "runtime": runtime,
        "py": tmp_path / "py",
        "rt": tmp_path / "rt",
        "cwd": cwd,
        "tmp": tmp_path,
    }


HARD_ARGS = [
    "--root",
    "/run/x y",
    "--log",
    "",
    "state",
    "id with space",
    "line\nbreak",
    "",
    " ",
    "tab\there",
    "ünïcødé",
    "*",
    "$HOME",
    "\\n",
    "-",
    "--",
    "'\"",
    "last",
]


def python_args(world: Dict[str, Path]) -> List[str]:
    """The argv the trampoline gave Python, after ``-I -S -X <caller's LC_CTYPE> -c <boot code>``."""
    argv = recorded_argv(world["py"])
    assert argv[1:4] == ["-I", "-S", "-X"] and argv[4].startswith("nvshim-lc-ctype")
    assert argv[5] == "-c" and "from nvshim.runtime.main import main" in argv[6]
    return argv[7:]


def run_tramp(
    world: Dict[str, Path], argv: Sequence[str], extra_env: Dict[str, str]
) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "NVSHIM_CONFIG": str(world["config"]), **extra_env}
    return subprocess.run(
        [str(world["tramp"]), *argv], capture_output=True, env=env, cwd=world["cwd"], timeout=10
    )


def test_passthrough_execs_listed_runtime_with_same_argv_env_cwd(world: Dict[str, Path]) -> None:
    """A non-create command is exec'd to the runtime in the .runtimes list with argv, env and cwd untouched."""
    env = {"ODD": "a b\nc", "EMPTY": "", "UNI": "✓"}
    res = run_tramp(world, HARD_ARGS, env)
    assert res.returncode == 0, res.stderr
    assert recorded_argv(world["rt"]) == [str(world["runtime"]), *HARD_ARGS]
    got = recorded_env(world["rt"])
    # sh (dash, bash, ash) exports PWD for its children; everything else must be ours exactly
    assert got.pop("PWD", str(world["cwd"])) == str(world["cwd"])
    assert got == {"PATH": "/usr/bin:/bin", "NVSHIM_CONFIG": str(world["config"]), **env}
    assert (world["tmp"] / "rt.cwd").read_text().strip() == str(world["cwd"])
    assert not (world["tmp"] / "py.argv").exists()


def test_create_goes_to_python_with_same_argv(world: Dict[str, Path]) -> None:
    """create is handed to ``<python> -I -S -X … -c <boot>`` with the argv unchanged, never to the runtime."""
    argv = ["--root", "/r x", "create", "--bundle", "/b\nc", "", "id"]
    res = run_tramp(world, argv, {})
    assert res.returncode == 0, res.stderr
    assert python_args(world) == [*argv]
    assert not (world["tmp"] / "rt.argv").exists()


def test_yaml_newer_than_runtimes_falls_back_to_python(world: Dict[str, Path]) -> None:
    """When the YAML was edited after compiling, passthrough goes through Python, which reads the YAML."""
    newer = world["runtimes"].stat().st_mtime + 100
    os.utime(world["config"], (newer, newer))
    res = run_tramp(world, HARD_ARGS, {})
    assert res.returncode == 0, res.stderr
    assert python_args(world) == [*HARD_ARGS]
    assert not (world["tmp"] / "rt.argv").exists()


@pytest.mark.parametrize("how", ["older-mtime-copy", "same-mtime-new-inode", "rewritten-in-place"])
def test_yaml_replaced_by_an_older_file_falls_back_to_python(
    world: Dict[str, Path], how: str
) -> None:
    """Issue 12 item 1: a YAML replaced by `cp -p`/`rsync -t`/`tar x` (an *older* mtime), or by
    another file with the very same mtime, or rewritten in place, is stale: Python decides, not the old list."""
    config = world["config"]
    st = config.stat()
    if how == "older-mtime-copy":
        config.write_text("runtimes: [other]\n")
        os.utime(config, ns=(st.st_atime_ns - 10**11, st.st_mtime_ns - 10**11))
    elif how == "same-mtime-new-inode":
        fresh = config.with_name("incoming.yaml")
        fresh.write_text("runtimes: [other]\n")
        os.utime(fresh, ns=(st.st_atime_ns, st.st_mtime_ns))
        fresh.rename(config)
    else:
        with open(config, "r+") as fh:
            fh.write("runtimes: [othe]\n")
    res = run_tramp(world, ["state", "x"], {})
    assert res.returncode == 0, res.stderr
    assert python_args(world) == ["state", "x"]
    assert not (world["tmp"] / "rt.argv").exists()


def test_compile_marks_the_lists_fresh_for_the_trampoline(world: Dict[str, Path]) -> None:
    """Issue 12 item 1: after `nvshim config compile` the trampoline trusts the lists (no Python for passthrough)."""
    world["config"].write_text(f"runtimes: [{world['runtime']}]\n")
    compile_node(str(world["config"]))
    res = run_tramp(world, ["state", "x"], {})
    assert res.returncode == 0, res.stderr
    assert recorded_argv(world["rt"]) == [str(world["runtime"]), "state", "x"]
    assert not (world["tmp"] / "py.argv").exists()


def test_missing_runtimes_file_falls_back_to_python(world: Dict[str, Path]) -> None:
    """A YAML config without its compiled runtime list sends passthrough through Python."""
    world["runtimes"].unlink()
    res = run_tramp(world, ["state", "x"], {})
    assert res.returncode == 0, res.stderr
    assert python_args(world) == ["state", "x"]


def test_unusable_runtimes_fall_back_to_python(world: Dict[str, Path]) -> None:
    """Relative paths, missing files and non-executables in the list are skipped; Python reports the failure."""
    plain = world["tmp"] / "not-executable"
    plain.write_text("#!/bin/sh\n")
    world["runtimes"].write_text(f"bin/runc\n{world['tmp']}/missing\n{plain}\n")
    mark_compiled(world["config"])
    res = run_tramp(world, ["delete", "x"], {})
    assert res.returncode == 0, res.stderr
    assert python_args(world) == ["delete", "x"]


def test_later_runtime_in_list_is_used_when_first_is_missing(world: Dict[str, Path]) -> None:
    """The first usable entry wins: a missing absolute path is skipped for the next one."""
    world["runtimes"].write_text(f"{world['tmp']}/missing\n{world['runtime']}\n")
    mark_compiled(world["config"])
    res = run_tramp(world, ["kill", "x", "KILL"], {})
    assert res.returncode == 0, res.stderr
    assert recorded_argv(world["rt"]) == [str(world["runtime"]), "kill", "x", "KILL"]


@pytest.mark.parametrize("name", ["fake runc", "fake*"])
def test_runtime_path_with_space_or_glob_is_not_split(world: Dict[str, Path], name: str) -> None:
    """A configured runtime whose path has a space or glob character runs itself or goes to Python, never another binary."""
    runtime = make_recorder(world["tmp"] / name, world["tmp"] / "odd")
    decoy_dir = world["tmp"] / "decoy"
    decoy_dir.mkdir()
    make_recorder(decoy_dir / "runc", world["tmp"] / "decoy")
    make_recorder(world["tmp"] / "fake#decoy", world["tmp"] / "decoy")  # sorts before "*"
    world["runtimes"].write_text(f"{runtime}\n")
    mark_compiled(world["config"])
    env = {"PATH": f"{decoy_dir}:/usr/bin:/bin", "NVSHIM_CONFIG": str(world["config"])}
    res = subprocess.run(
        [str(world["tramp"]), "state", "x"],
        capture_output=True,
        env=env,
        cwd=world["cwd"],
        timeout=10,
    )
    assert res.returncode == 0, res.stderr
    assert not (world["tmp"] / "decoy.argv").exists()


def test_no_config_uses_runc_then_crun_from_path(world: Dict[str, Path]) -> None:
    """Without a config file the trampoline execs runc from PATH, else crun, as the defaults say."""
    bindir = world["tmp"] / "bin"
    bindir.mkdir()
    runc = make_recorder(bindir / "runc", world["tmp"] / "runc")
    crun = make_recorder(bindir / "crun", world["tmp"] / "crun")
    world["config"].unlink()
    env = {"PATH": str(bindir), "NVSHIM_CONFIG": str(world["config"])}

    def call(*argv: str) -> None:
        res = subprocess.run(
            [str(world["tramp"]), *argv], capture_output=True, env=env, cwd=world["cwd"], timeout=10
        )
        assert res.returncode == 0, res.stderr

    call("start", "x")
    assert recorded_argv(world["tmp"] / "runc") == [str(runc), "start", "x"]
    runc.unlink()
    call("state", "y")
    assert recorded_argv(world["tmp"] / "crun") == [str(crun), "state", "y"]
    crun.unlink()
    call("state", "z")  # neither: Python gets to say so
    assert python_args(world) == ["state", "z"]


def test_render_refuses_unsafe_interpreter_paths() -> None:
    """render() refuses relative paths and paths with characters sh would interpret."""
    for bad in ("python3", "/a b/python", "/x/$(id)", "/x/`id`", "/x'y", '/x"y', "/x\\y"):
        with pytest.raises(ValueError):
            render(bad)
    assert "py=/opt/venv/bin/python3\n" in render("/opt/venv/bin/python3")


def test_rendered_script_is_posix_sh(decider: Path) -> None:
    """The rendered script starts with #!/bin/sh and parses under dash's -n syntax check."""
    text = decider.read_text()
    assert text.startswith("#!/bin/sh\n")
    res = subprocess.run(["/bin/sh", "-n", str(decider)], capture_output=True)
    assert res.returncode == 0, res.stderr
    assert decider.stat().st_mode & stat.S_IXUSR


FD_RECORDER = """#!/bin/sh
# records which of the caller's fds it got (readlink of fd N, or '-' when closed) and stdin
for n in 3 4 12; do
    printf '%s=%s\\n' "$n" "$(readlink /proc/$$/fd/$n || echo -)"
done > {rec}
cat >> {rec}
"""


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: os.path.basename(s[0]))
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "no-config"])
def test_passthrough_keeps_the_callers_fds(
    world: Dict[str, Path], shell: List[str], compiled: bool
) -> None:
    """fds 3, 4 and 12 the caller passes (runc --preserve-fds, LISTEN_FDS, containerd's fds 3
    and 4) reach the runtime as they came, and stdin too (runc update --resources -). The
    runtime list was once read on fd 3, which replaced the caller's fd 3 and closed it."""
    rec = world["tmp"] / "fds"
    bindir = world["tmp"] / "bin"
    bindir.mkdir()
    runtime = bindir / "runc"
    runtime.write_text(FD_RECORDER.format(rec=rec))
    runtime.chmod(0o755)
    if compiled:
        world["runtimes"].write_text(f"{runtime}\n")
        mark_compiled(world["config"])
    else:
        world["config"].unlink()
    files = {n: world["tmp"] / f"fd{n}" for n in (3, 4, 12)}
    for n, path in files.items():
        path.write_text(str(n))

    # bash opens them on their own numbers (dash takes one-digit fds only), then execs us
    opener = 'exec 3<"$1" 4<"$2" 12<"$3"; shift 3; exec "$@"'
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "NVSHIM_CONFIG": str(world["config"])}
    res = subprocess.run(
        [
            "bash",
            "-c",
            opener,
            "bash",
            *(str(files[n]) for n in files),
            *shell,
            str(world["tramp"]),
            "exec",
            "--preserve-fds",
            "2",
            "x",
        ],
        input=b"stdin-data",
        capture_output=True,
        env=env,
        cwd=world["cwd"],
        timeout=10,
    )
    assert res.returncode == 0, res.stderr
    assert rec.read_text() == "".join(f"{n}={files[n]}\n" for n in files) + "stdin-data"
    assert not (world["tmp"] / "py.argv").exists()


# ----------------------------------------------------------------------------- config trust


@pytest.fixture
def tramp_world(tmp_path: Path) -> Dict[str, Any]:
    """The trampoline rendered for this interpreter, a compiled config and a recorder runtime."""
    return make_trampoline_world(tmp_path)


@needs_root
@pytest.mark.parametrize(
    "target", ["yaml", "compiled", "runtimes", "prefixes", "directory", "owner"]
)
def test_config_writable_by_others_is_refused(tramp_world: dict, target: str) -> None:
    """Issue 12 item 9: a config.yaml, compiled copy or trampoline list that group/others can write
    (or a non-root user owns), or a directory others can replace it in, fails every Python command
    in one line."""
    from nvshim.config import compiled_path

    config = tramp_world["config"]
    path = {
        "yaml": config,
        "compiled": Path(compiled_path(str(config))),
        "runtimes": Path(runtimes_path(str(config))),
        "prefixes": Path(prefixes_path(str(config))),
        "directory": config.parent,
        "owner": config,
    }[target]
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
    assert res.returncode == 1 and res.stderr.splitlines() == [
        f"nvshim: {expected}" + res.stderr.split(expected, 1)[1].rstrip("\n")
    ]
    bundle = tramp_world["tmp"] / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text('{"process":{"env":["NVIDIA_VISIBLE_DEVICES=void"]}}')
    res = subprocess.run(
        [str(tramp_world["tramp"]), "create", "--bundle", str(bundle), "id"],
        env=tramp_world["env"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1 and expected in res.stderr
    assert not (tramp_world["tmp"] / "rec").exists()
    if target == "directory":
        path.chmod(0o1777)  # sticky, like /tmp: others cannot replace root's files
        assert nvshim_cli("config", "show", env=env).returncode == 0


@needs_root
def test_trampoline_never_execs_a_runtime_list_written_by_another_user(tramp_world: dict) -> None:
    """Issue 12 item 9: a .runtimes list made world-writable and then rewritten by another user
    (nobody) is not exec'd by the trampoline: the passthrough goes to Python, which refuses the
    list."""
    import tempfile

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
        wrote = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "sh",
                "-c",
                f"printf '%s\\n' {evil} > {listing}",
            ],
            capture_output=True,
            text=True,
        )
        assert wrote.returncode == 0, wrote.stderr
        assert listing.read_text() == f"{evil}\n"
        env = dict(tramp_world["env"], NVSHIM_CONFIG=str(config))
        res = subprocess.run(
            [str(tramp_world["tramp"]), "state", "x"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert not (etc / "pwned").exists()
        assert res.returncode == 1 and "writable by group or others" in res.stderr, res.stderr
        assert len(res.stderr.splitlines()) == 1
    finally:
        shutil.rmtree(etc)


# ----------------------------------------------------------------------------- --version


@pytest.mark.parametrize("flag", ["--version", "-v"])
def test_version_shows_nvshim_then_the_runtime(tramp_world: dict, flag: str) -> None:
    """Issue 12 item 16: `nvshim-runtime --version` prints nvshim's version, then execs the
    low-level runtime's --version."""
    from nvshim import __version__

    runtime = tramp_world["runtime"]
    runtime.write_text('#!/bin/sh\necho "runc version 9.9.9 ($*)"\n')
    compile_node(str(tramp_world["config"]))
    for script in (
        [str(tramp_world["tramp"])],
        [sys.executable, "-I", "-m", "nvshim.runtime.main"],
    ):
        res = subprocess.run(
            [*script, flag],
            env=tramp_world["env"],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=str(REPO),
        )
        assert res.returncode == 0, res.stderr
        assert (
            res.stdout == f"nvshim-runtime version {__version__}\n\nrunc version 9.9.9 ({flag})\n"
        )
