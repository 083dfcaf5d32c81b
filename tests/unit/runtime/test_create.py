"""The create road seen from the bundle: what ``nvshim-runtime create`` does to config.json,
and when it refuses.

A rewrite keeps what nvshim does not edit as runc would read it (number literals, lone
surrogates, a UTF-8 BOM); input runc would not run as written (deep nesting, a key twice, a
NUL byte in a path, a wrong type, a config.json that is not a regular file, a rootfs that
is the host's /) fails in one line naming the bundle and leaves config.json byte-identical.
Also what a create cleans up and what it trusts: temp files of killed creates, a plan cache
others can write, the container id in every debug-log record.

Each test's docstring names the issue that asked for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.commands import make_trampoline_world, nvshim_cli

REPO = Path(__file__).resolve().parents[3]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod, ownership)")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A simulated 2-GPU node, a compiled config naming it and a recorder as the low-level runtime."""
    if os.geteuid() != 0:
        pytest.skip("the simulated GPU node needs root (mknod)")
    from nvshim.node.compile import compile_node
    from nvshim.sim.build import create_node

    base = tmp_path_factory.mktemp("create")
    sim = create_node(str(base / "node"), gpus=2)
    recorder = base / "recorder"
    recorder.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {base}/recorded\n")
    recorder.chmod(0o755)
    cfg = base / "etc" / "config.yaml"
    cfg.parent.mkdir()
    cfg.write_text(
        f"runtimes: [{recorder}]\ndriver-root: {sim.root}\ngrants-journal: {base}/grants.jsonl\n"
    )  # never the node's journal
    compile_node(str(cfg))
    return {"base": base, "config": cfg, "recorder": recorder}


@pytest.fixture
def tramp_world(tmp_path: Path) -> dict:
    """The trampoline rendered for this interpreter, a compiled config and a recorder runtime."""
    return make_trampoline_world(tmp_path)


def runtime_create(
    node: dict, bundle: Path, *extra: str, argv: list | None = None, timeout: int = 60
) -> subprocess.CompletedProcess:
    """``python -I -m nvshim.runtime.main --log L create --bundle B id`` as containerd runs it."""
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "NVSHIM_CONFIG": str(node["config"]),
        **dict(e.split("=", 1) for e in extra),
    }
    args = (
        argv
        if argv is not None
        else [
            "--log",
            str(bundle / "log.json"),
            "--log-format",
            "json",
            "create",
            "--bundle",
            str(bundle),
            "cid-12",
        ]
    )
    return subprocess.run(
        [sys.executable, "-I", "-m", "nvshim.runtime.main", *args],
        capture_output=True,
        env=env,
        timeout=timeout,
        cwd=str(REPO),
    )


def make_bundle(tmp_path: Path, raw: bytes, name: str = "b") -> Path:
    bundle = tmp_path / name
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_bytes(raw)
    return bundle


GPU_SPEC = b'{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=0"],"cwd":"/"},"root":{"path":"rootfs"}'


# --- a rewrite keeps what nvshim does not edit, as runc would read it -------------------------


def test_number_literals_of_unknown_fields_survive_a_rewrite(node: dict, tmp_path: Path) -> None:
    """Issue 12 item 2: numbers nvshim does not edit are written back as written: 1e999, 1E2, -0,
    long decimals, huge ints."""
    big = "9" * 5000
    literals = f"[1e999,1E2,-0,0.1000000000000000055511151231257827,{big},-{big},1.5,7,-0.0,2e-5]"
    raw = GPU_SPEC + f',"x-unknown":{{"n":{literals},"deep":{{"f":1.0E+2}}}}}}'.encode()
    bundle = make_bundle(tmp_path, raw)
    for fmt in ("text", "json"):  # inspect's diff encodes them too
        shown = nvshim_cli(
            "inspect", "--bundle", str(bundle), "--config", str(node["config"]), "--format", fmt
        )
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    res = runtime_create(node, bundle)
    assert res.returncode == 0, res.stderr
    after = (bundle / "config.json").read_bytes()
    assert after != raw and b"/dev/nvidia0" in after
    assert f'"x-unknown":{{"n":{literals},"deep":{{"f":1.0E+2}}}}'.encode() in after
    assert b"Infinity" not in after
    # and the same in the indented layout containerd writes
    bundle2 = make_bundle(
        tmp_path,
        b'{\n  "n": 1E2,\n  "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]},'
        b' "root": {"path": "rootfs"}\n}\n',
        "b2",
    )
    assert runtime_create(node, bundle2).returncode == 0
    assert b'"n": 1E2,' in (bundle2 / "config.json").read_bytes()


def test_lone_surrogate_in_an_untouched_field_round_trips(node: dict, tmp_path: Path) -> None:
    """Issue 12 item 4: a lone surrogate escape ("\\ud800") in a field nvshim does not touch is
    written back as that escape."""
    raw = GPU_SPEC + b',"annotations":{"x":"a\\ud800b","y":"\\udfff"}}'
    bundle = make_bundle(tmp_path, raw)
    res = runtime_create(node, bundle)
    assert res.returncode == 0, res.stderr
    after = (bundle / "config.json").read_bytes()
    assert b'"x":"a\\ud800b","y":"\\udfff"' in after
    assert json.loads(after)["annotations"] == {
        "x": "a\ud800b",
        "y": "\udfff",
        "nvshim.io/rewritten": "env",
    }


def test_utf8_bom_is_kept_on_rewrite(node: dict, tmp_path: Path) -> None:
    """Issue 12 item 5: a config.json starting with a UTF-8 BOM keeps it when rewritten (runc judges
    the file as it was)."""
    raw = b"\xef\xbb\xbf" + GPU_SPEC + b"}"
    bundle = make_bundle(tmp_path, raw)
    res = runtime_create(node, bundle)
    assert res.returncode == 0, res.stderr
    after = (bundle / "config.json").read_bytes()
    assert after.startswith(b"\xef\xbb\xbf{") and b"/dev/nvidia0" in after


# --- hostile config.json: one line naming the bundle (or a sound create), never a crash -------


@pytest.mark.parametrize(
    "raw,message",
    [
        (
            b'{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]},"x":'
            + b"[" * 5000
            + b"]" * 5000
            + b"}",
            "nested deeper than 200 levels",
        ),
        (
            b'{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]},"x":'
            + b"[" * 300
            + b"]" * 300
            + b"}",
            "nested deeper than 200 levels",
        ),
        (
            b'{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]},"x":'
            + b'{"a":' * 900
            + b"1"
            + b"}" * 900
            + b"}",
            "nested deeper than 200 levels",
        ),
    ],
)
def test_deep_nesting_is_one_clear_line(
    node: dict, tmp_path: Path, raw: bytes, message: str
) -> None:
    """Issue 12 item 4: JSON nested thousands of levels deep fails with one line naming the problem,
    not a RecursionError."""
    bundle = make_bundle(tmp_path, raw)
    res = runtime_create(node, bundle)
    assert res.returncode == 1
    lines = res.stderr.decode().splitlines()
    assert len(lines) == 1 and message in lines[0] and "internal error" not in lines[0], lines
    assert (bundle / "config.json").read_bytes() == raw


def test_huge_integer_is_kept_not_python_wording(node: dict, tmp_path: Path) -> None:
    """Issue 12 item 4: a 5,000-digit integer where nvshim reads a number fails (or passes) without
    Python's int-limit wording."""
    raw = (
        b'{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"],"user":{"uid":'
        + b"1" * 5000
        + b',"gid":0}},"root":{"path":"rootfs"}}'
    )
    bundle = make_bundle(tmp_path, raw)
    res = runtime_create(node, bundle)
    assert b"int_max_str_digits" not in res.stderr and b"Exceeds the limit" not in res.stderr
    if res.returncode == 0:
        assert b'"uid":' + b"1" * 5000 + b"," in (bundle / "config.json").read_bytes()
    else:
        assert len(res.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    "second",
    [
        b'"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"],"args":["sh"],"cwd":"/"}',
        b'"annotations":{"a":"1"},"annotations":{"b":"2"}',
        b'"linux":{"x":{"k":1,"k":2}}',
    ],
)
def test_duplicate_key_in_config_json_is_refused(node: dict, tmp_path: Path, second: bytes) -> None:
    """Issue 11 defect hunt (hostile images and bundles): a key twice in one object, at any depth,
    fails the create in one line naming it and leaves config.json as it was: runc (Go) decodes the
    second copy into the first, so the spec below runs as uid 1000 under runc, while a rewrite from
    Python's last-wins dict dropped ``process.user`` and ran the GPU container as root."""
    raw = (
        b'{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=0"],"args":["sh"],'
        b'"cwd":"/","user":{"uid":1000,"gid":1000}},"root":{"path":"rootfs"},' + second + b"}"
    )
    bundle = make_bundle(tmp_path, raw)
    res = runtime_create(node, bundle)
    assert res.returncode == 1, res.stderr
    lines = res.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"nvshim: {bundle}/config.json: duplicate key"
    ), lines
    key = {b'"p': "process", b'"a': "annotations", b'"l': "k"}[second[:2]]
    assert f'duplicate key "{key}"' in lines[0]
    assert json.loads((bundle / "log.json").read_text().splitlines()[-1])["msg"] == lines[0]
    assert (bundle / "config.json").read_bytes() == raw


@pytest.mark.parametrize("field", [b'"hooks":[]', b'"linux":[]', b'"hooks":{"createContainer":{}}'])
def test_a_wrong_type_met_while_editing_names_the_bundle(
    node: dict, tmp_path: Path, field: bytes
) -> None:
    """Issue 11 defect hunt (hostile images and bundles): a field of the wrong type that only the
    edit meets (hooks, linux) fails in one line naming this bundle's config.json, like the fields
    the request reads, not a bare "config.json:" that could be any container's; config.json keeps
    its bytes."""
    raw = GPU_SPEC + b"," + field + b"}"
    bundle = make_bundle(tmp_path, raw)
    res = runtime_create(node, bundle)
    assert res.returncode == 1
    lines = res.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"nvshim: {bundle}/config.json: "), lines
    assert "must be a" in lines[0]
    assert (bundle / "config.json").read_bytes() == raw


def test_nul_byte_in_root_path_is_one_clear_line(node: dict, tmp_path: Path) -> None:
    """Issue 11 defect hunt (hostile images and bundles): a root.path with a NUL byte (runc cannot
    use it either) fails the create with one line naming root.path, not an "internal error:
    ValueError", and config.json keeps its bytes."""
    raw = GPU_SPEC.replace(b'"path":"rootfs"', b'"path":"root\\u0000fs"') + b"}"
    bundle = make_bundle(tmp_path, raw)
    res = runtime_create(node, bundle)
    assert res.returncode == 1
    lines = res.stderr.decode().splitlines()
    assert lines == [f"nvshim: {bundle}/config.json: root.path 'root\\x00fs' contains a NUL byte"]
    assert (bundle / "config.json").read_bytes() == raw


def test_nul_byte_in_a_mount_destination_does_not_crash_the_create(
    node: dict, tmp_path: Path
) -> None:
    """Issue 11 defect hunt (hostile images and bundles): a mount destination with a NUL byte cannot
    be resolved in the rootfs: the in-root work goes to the hook (runc then refuses the mount
    itself, "mount field contains null byte") instead of the create dying with "internal error:
    ValueError"."""
    raw = GPU_SPEC + b',"mounts":[{"destination":"/a\\u0000b","type":"tmpfs","source":"tmpfs"}]}'
    bundle = make_bundle(tmp_path, raw)
    res = runtime_create(node, bundle)
    assert res.returncode == 0, res.stderr
    assert res.stderr == b""
    hooks = json.loads((bundle / "config.json").read_bytes())["hooks"]["createContainer"]
    assert any("nvshim.hook" in arg for hook in hooks for arg in hook["args"])


# --- config.json that is not a regular file ---------------------------------------------------


def processes_mentioning(text: str) -> list:
    """Command lines of running processes that contain ``text`` (an orphaned grep would)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = (
                Path(f"/proc/{pid}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
            )
        except OSError:
            continue
        if text in cmdline:
            found.append(cmdline)
    return found


@pytest.mark.parametrize(
    "kind", ["missing", "dangling-symlink", "directory", "fifo", "dev-zero", "char-device"]
)
def test_config_json_not_a_regular_file_is_one_line_fast_no_orphan(
    tramp_world: dict, kind: str
) -> None:
    """Issue 12 item 3: a missing, dangling, directory, FIFO or device config.json, through the
    trampoline (which hands it to Python), gives one stderr line and one --log line, exit 1,
    quickly, runs no runtime and leaves no process behind."""
    bundle = tramp_world["tmp"] / f"bundle-{kind}"
    bundle.mkdir()
    spec = bundle / "config.json"
    if kind == "directory":
        spec.mkdir()
    elif kind == "dangling-symlink":
        spec.symlink_to(tramp_world["tmp"] / "nowhere")
    elif kind == "fifo":
        os.mkfifo(spec)
    elif kind == "dev-zero":
        spec.symlink_to("/dev/zero")
    elif kind == "char-device":
        if os.geteuid() != 0:
            pytest.skip("mknod needs root")
        os.mknod(spec, 0o666 | 0o020000, os.makedev(1, 5))  # a second /dev/zero
    log = tramp_world["tmp"] / f"log-{kind}.json"
    res = subprocess.run(
        [
            str(tramp_world["tramp"]),
            "--log",
            str(log),
            "--log-format",
            "json",
            "create",
            "--bundle",
            str(bundle),
            "id",
        ],
        env=tramp_world["env"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert res.returncode == 1
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"nvshim: cannot read {spec}"), res.stderr
    assert len(log.read_text().splitlines()) == 1
    assert not (tramp_world["tmp"] / "rec").exists()
    assert processes_mentioning(str(bundle)) == []


# --- a rootfs that is the host's /: runc makes the mount targets in the host's folders --------


def _host_root_spec(root_path: str, env: list) -> bytes:
    return json.dumps(
        {
            "ociVersion": "1.0.2",
            "process": {"env": env, "args": ["true"], "cwd": "/"},
            "root": {"path": root_path},
        },
        indent="\t",
    ).encode()


def _up_to_host_root(bundle: Path) -> str:
    """A relative root.path that leads from ``bundle`` up to the host's /."""
    return "/".join([".."] * len(bundle.resolve().parts))


@needs_root
@pytest.mark.parametrize(
    "env",
    [
        ["NVIDIA_VISIBLE_DEVICES=0"],
        ["NVIDIA_VISIBLE_DEVICES=none"],
        ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all"],
        ["NVIDIA_IMEX_CHANNELS=0"],
    ],
)
@pytest.mark.parametrize("how", ["slash", "symlink", "relative"])
def test_a_rootfs_that_is_the_host_root_gets_no_driver_files(
    node: dict, tmp_path: Path, env: list, how: str
) -> None:
    """Issue 20 item 8: a create that would inject anything into a rootfs that is the host's / ("/",
    a symlink to it, a relative path up to it) fails in one line naming the rootfs and the bundle:
    runc would make each mount target as an empty file in the host's /usr/bin, library folder and
    /lib/firmware before failing. config.json keeps its bytes and runc never runs."""
    bundle = tmp_path / "b"
    bundle.mkdir()
    (tmp_path / "root-link").symlink_to("/")
    root_path = {
        "slash": "/",
        "symlink": str(tmp_path / "root-link"),
        "relative": _up_to_host_root(bundle),
    }[how]
    raw = _host_root_spec(root_path, ["PATH=/bin", *env])
    (bundle / "config.json").write_bytes(raw)
    recorded = Path(node["base"], "recorded")
    recorded.unlink(missing_ok=True)
    res = runtime_create(node, bundle)
    assert res.returncode == 1, res.stderr
    lines = res.stderr.decode().splitlines()
    shown = os.path.normpath(os.path.join(bundle, root_path))
    assert lines == [
        f"nvshim: the container's rootfs {shown} is the host's /: nvshim injects no "
        f"driver files into the host (bundle {bundle})"
    ]
    assert json.loads((bundle / "log.json").read_text().splitlines()[-1])["msg"] == lines[0]
    assert (bundle / "config.json").read_bytes() == raw
    assert not recorded.exists()


@needs_root
@pytest.mark.parametrize("env", [[], ["NVIDIA_VISIBLE_DEVICES="], ["NVIDIA_VISIBLE_DEVICES=void"]])
def test_a_host_root_container_asking_for_nothing_passes_through(
    node: dict, tmp_path: Path, env: list
) -> None:
    """Issue 20 item 8: root.path "/" without a GPU request is runc's business: nvshim adds nothing
    (void only says so in the env), fails nothing, and runs the low-level runtime."""
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
    """Issue 20 item 8: a rootfs that is / bind-mounted elsewhere (same device and inode, another
    path) is refused like "/" itself."""
    bundle = tmp_path / "b"
    (bundle / "rootfs").mkdir(parents=True)
    raw = _host_root_spec("rootfs", ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0"])
    (bundle / "config.json").write_bytes(raw)
    argv = [
        sys.executable,
        "-I",
        "-m",
        "nvshim.runtime.main",
        "--log",
        str(bundle / "log.json"),
        "--log-format",
        "json",
        "create",
        "--bundle",
        str(bundle),
        "cid-12",
    ]
    script = 'mount --bind / "$1" || exit 99; shift; exec "$@"'
    res = subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            str(bundle / "rootfs"),
            *argv,
        ],
        capture_output=True,
        timeout=60,
        cwd=str(REPO),
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVSHIM_CONFIG": str(node["config"])},
    )
    if res.returncode == 99:
        pytest.skip(f"cannot bind-mount / here: {res.stderr.decode().strip()}")
    assert res.returncode == 1, res.stderr
    assert res.stderr.decode().splitlines() == [
        f"nvshim: the container's rootfs {bundle}/rootfs is the host's /: nvshim injects no "
        f"driver files into the host (bundle {bundle})"
    ]
    assert (bundle / "config.json").read_bytes() == raw


# --- what a create cleans up, trusts and logs -------------------------------------------------


def test_next_create_removes_temp_files_of_dead_pids_only(node: dict, tmp_path: Path) -> None:
    """Issue 12 item 7: a `.config.json.nvshim-<pid>` left by a SIGKILLed create is removed by the
    next create of the bundle; one of a live process (a create in progress) is kept."""
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


@needs_root
def test_world_writable_plan_cache_is_ignored_and_rewritten(node: dict, tmp_path: Path) -> None:
    """Issue 12 item 9: the node plan cache names host files that get bind-mounted: one that others
    can write (and did: a firmware entry now points at /etc/hostname) is not used; the create
    discovers live, and the cache is rewritten with mode 0644."""
    from nvshim.config import plan_path
    from nvshim.node.compile import compile_node

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
    assert any(
        str(m.get("source", "")).endswith(".bin") for m in mounts
    )  # firmware from live discovery
    assert plan.stat().st_mode & 0o777 == 0o644 and "/etc/hostname" not in plan.read_text()


def test_debug_log_records_carry_the_container_id(node: dict, tmp_path: Path) -> None:
    """Issue 12 item 16: every debug-log record of a create names the container id."""
    debug = tmp_path / "debug.log"
    cfg = tmp_path / "etc" / "config.yaml"
    cfg.parent.mkdir()
    cfg.write_text(node["config"].read_text() + f"debug-log: {debug}\n")
    bundle = make_bundle(tmp_path, GPU_SPEC + b"}")
    res = runtime_create(
        dict(node, config=cfg),
        bundle,
        argv=["--root", "/r", "create", "--bundle", str(bundle), "--pid-file", "/p", "ctr-12-16"],
    )
    assert res.returncode == 0, res.stderr
    records = [json.loads(line) for line in debug.read_text().splitlines()]
    assert {r["event"] for r in records} >= {"request", "create"}
    assert all(r.get("id") == "ctr-12-16" for r in records), records


# --- the road as values: a frozen plan, and commit returning what it did ---------------------


def _planned(node: dict, tmp_path: Path):
    """plan_create for a one-GPU container whose rootfs the runtime can write (links and
    ld.so.cache done before runc)."""
    from nvshim.config import load_config
    from nvshim.runtime.create import plan_create
    from tests.helpers.bundle import make_rootfs

    bundle = tmp_path / "b"
    bundle.mkdir()
    make_rootfs(bundle / "rootfs")
    (bundle / "config.json").write_text(
        json.dumps(
            {
                "ociVersion": "1.0.2",
                "root": {"path": "rootfs"},
                "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"], "args": ["sh"], "cwd": "/"},
            }
        )
    )
    config = load_config(str(node["config"]))
    return bundle, plan_create(str(bundle), config)


def test_the_plan_is_one_frozen_value_built_from_the_stages_records(
    node: dict, tmp_path: Path
) -> None:
    """plan_create returns a frozen Plan whose claim, request, grant and rootfs decision are
    frozen records too; notes and warnings are tuples (two channels), nothing to append to."""
    from nvshim._record import FrozenInstanceError

    _, plan = _planned(node, tmp_path)
    assert [g.index for g in plan.gpus] == [0] and plan.grant.gpus == plan.gpus
    assert plan.rootfs.by == "runtime" and plan.rootfs.work is not None
    assert isinstance(plan.notes, tuple) and isinstance(plan.warnings, tuple)
    for record, name in (
        (plan, "new_spec"),
        (plan.grant, "edits"),
        (plan.rootfs, "by"),
        (plan.claim, "env_tokens"),
        (plan.request, "devices"),
    ):
        with pytest.raises(FrozenInstanceError):
            setattr(record, name, None)


def test_commit_returns_the_hook_fallback_and_leaves_the_plan_as_it_was(
    node: dict, tmp_path: Path
) -> None:
    """A rootfs that cannot be opened by the time commit runs: commit returns the new
    decision (the createContainer hook does the work) and the config.json it wrote with the
    hook, while the plan still says what was planned."""
    import shutil

    from nvshim.runtime.create import commit
    from nvshim.runtime.hookargs import is_nvshim_hook

    bundle, plan = _planned(node, tmp_path)
    planned_hooks = plan.new_spec.get("hooks", {}).get("createContainer", [])
    shutil.rmtree(bundle / "rootfs")
    done = commit(plan)
    assert done.written and done.rootfs.by == "hook"
    assert done.rootfs.why.startswith(f"cannot open the rootfs {bundle}/rootfs")
    assert (
        plan.rootfs.by == "runtime"
        and plan.new_spec.get("hooks", {}).get("createContainer", []) == planned_hooks
    )
    written = json.loads((bundle / "config.json").read_text())
    assert written == done.new_spec
    assert any(is_nvshim_hook(h) for h in plan.grant.edits.hooks)
    assert any(
        "nvshim.hook" in " ".join(h.get("args", [])) for h in written["hooks"]["createContainer"]
    )


# --- config.json is read up to a bound ------------------------------------------------------


def test_a_config_json_over_the_size_bound_is_one_line_and_byte_identical(
    node: dict, tmp_path: Path
) -> None:
    """A config.json one byte over MAX_SPEC_BYTES (16 MiB; a 200 MB one cost 1.5 GB and 12 s)
    fails the create in one line naming the file and the limit, without being read whole,
    config.json byte-identical and runc not run; one at the bound is created as always; the
    other reader of config.json (`nvshim inspect`) refuses it with the same line."""
    from nvshim.runtime.specjson import MAX_SPEC_BYTES

    head = GPU_SPEC + b',"annotations":{"pad":"'
    at_bound = head + b"x" * (MAX_SPEC_BYTES - len(head) - 3) + b'"}}'
    assert len(at_bound) == MAX_SPEC_BYTES
    bundle = make_bundle(tmp_path, at_bound, "at-bound")
    res = runtime_create(node, bundle)
    assert res.returncode == 0, res.stderr
    over = head + b"x" * (MAX_SPEC_BYTES - len(head) - 2) + b'"}}'
    bundle = make_bundle(tmp_path, over, "over")
    (node["base"] / "recorded").unlink(missing_ok=True)
    res = runtime_create(node, bundle)
    assert res.returncode == 1
    spec = bundle / "config.json"
    assert res.stderr.decode() == (
        f"nvshim: cannot read {spec}: larger than the "
        f"{MAX_SPEC_BYTES} bytes nvshim reads (16 MiB)\n"
    )
    assert spec.read_bytes() == over and not (node["base"] / "recorded").exists()
    out = nvshim_cli("inspect", "--bundle", str(bundle), "--config", str(node["config"]))
    assert out.returncode == 1 and out.stderr.endswith(
        f"larger than the {MAX_SPEC_BYTES} bytes nvshim reads (16 MiB)\n"
    )


def test_an_image_ld_so_cache_over_4_mib_is_merged_by_the_hook(node: dict, tmp_path: Path) -> None:
    """An image whose /etc/ld.so.cache lists ~60,000 libraries (over the runtime's 4 MiB)
    no longer fails the GPU create: the runtime leaves the cache to the createContainer
    hook (in the container's cgroup) and says why, and the hook's cache keeps every image
    entry beside the driver's."""
    import shutil

    from nvshim.host import inroot
    from nvshim.host.ldcache import FLAG_X8664_LIBC6, CacheEntry, build_ldcache, parse_ldcache
    from nvshim.runtime.create import commit
    from nvshim.runtime.rootcache import LDCACHE_MAX_BYTES, update_ldcache

    bundle, plan = _planned(node, tmp_path)
    entries = [
        CacheEntry(f"libimage{i}.so.1", f"/opt/image/lib/libimage{i}.so.1.0.{i}", FLAG_X8664_LIBC6)
        for i in range(60_000)
    ]
    image_cache = build_ldcache(entries)
    assert len(image_cache) > LDCACHE_MAX_BYTES
    cache = bundle / "rootfs" / "etc" / "ld.so.cache"
    cache.write_bytes(image_cache)
    done = commit(plan)
    assert done.written and done.rootfs.by == "hook"
    assert done.rootfs.why == (
        f"the image's /etc/ld.so.cache is larger than the "
        f"{LDCACHE_MAX_BYTES} bytes nvshim-runtime reads (merged by the "
        "createContainer hook, in the container's cgroup)"
    )
    assert cache.read_bytes() == image_cache
    assert plan.rootfs.work is not None
    for mount in plan.grant.edits.mounts:  # what runc mounts before the hook runs
        target = bundle / "rootfs" / mount.container_path.lstrip("/")
        if str(target.parent).endswith(tuple(plan.rootfs.work.folders)) and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(mount.host_path, target)
    with inroot.open_root(str(bundle / "rootfs")) as root:  # what the hook then does
        update_ldcache(root, plan.rootfs.work.folders)
    merged = {e.key for e in parse_ldcache(cache.read_bytes())}
    assert {"libimage0.so.1", "libimage59999.so.1", "libcuda.so.1"} <= merged


def test_a_granted_container_sees_void_and_its_grant_is_named_elsewhere(
    node: dict, tmp_path: Path
) -> None:
    """Issue 37.7's decision: a granted container's NVIDIA_VISIBLE_DEVICES is void (as in
    NVIDIA's CDI mode and generated specs), never the ids, so a committed image or a nested
    runtime cannot re-request them (docs/container-env.md)."""
    _, plan = _planned(node, tmp_path)
    env = plan.new_spec["process"]["env"]
    assert [e for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=")] == [
        "NVIDIA_VISIBLE_DEVICES=void"
    ]
    assert [g.index for g in plan.grant.gpus] == [0]
