"""nvshim config: defaults, validation messages, compiled cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nvshim.config import Config, compiled_path, load_config
from nvshim.errors import ConfigError
from nvshim.node.compile import compile_config
from tests.helpers.commands import nvshim_cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write(tmp_path, text):
    p = tmp_path / "config.yaml"
    p.write_text(text)
    return str(p)


def test_missing_file_means_defaults(tmp_path):
    """No config file: built-in defaults."""
    assert load_config(str(tmp_path / "nope.yaml")) == Config()


def test_shipped_config_equals_defaults():
    """The shipped config/config.yaml documents exactly the defaults."""
    cfg = load_config(os.path.join(REPO, "config", "config.yaml"))
    assert cfg.to_mapping() == Config().to_mapping()


def test_schema_copies_identical():
    """The package's schema copy is the one in config/."""
    with (
        open(os.path.join(REPO, "config", "nvshim.schema.json")) as a,
        open(os.path.join(REPO, "nvshim", "data", "config-schema.json")) as b,
    ):
        assert json.load(a) == json.load(b)


@pytest.mark.parametrize(
    "text,message",
    [
        (
            "bogus: 1\n",
            'unknown key "bogus" \\(allowed: accept-all-from-mounts, accept-envvar-when-unprivileged',
        ),
        (
            "require-allocation: yes-please\n",
            '"require-allocation" is "yes-please", must be a boolean',
        ),
        ("runtimes: runc\n", '"runtimes" is "runc", must be a list of strings without spaces'),
        (
            "runtimes: []\n",
            '"runtimes" is \\[\\], must be a list of strings without spaces \\(at least one\\)',
        ),
        ("runtimes: [run c]\n", '"runtimes\\[0\\]" is "run c", must be a string without spaces$'),
        (
            "kubelet-timeout: 0\n",
            '"kubelet-timeout" is 0, must be a number, above 0 and at most 30$',
        ),
        (
            "grants-journal-max-bytes: 5\n",
            '"grants-journal-max-bytes" is 5, must be an integer, at least 65536$',
        ),
        ("dev-root: 5\n", '"dev-root" is 5, must be an absolute path or null$'),
        ("default-kind: gpu\n", '"default-kind" is "gpu", must be a string matching'),
        # a YAML date is no JSON value: quoting it in the message raised a TypeError
        (
            "driver-root: 2024-01-01\n",
            '"driver-root" is 2024-01-01 \\(a date\\), must be an absolute path$',
        ),
        # an alias inside its own anchor is an endless value: it raised a RecursionError
        ("runtimes: &a [runc, *a]\n", "more than 100000 values once YAML aliases are expanded"),
        (
            "on-missing-allocation: drop\n",
            '"on-missing-allocation" is "drop", must be one of "strip", "fail"',
        ),
        (
            "allocation-sources: [volume-mounts, magic]\n",
            '"allocation-sources\\[1\\]" is "magic", must be one of "volume-mounts"',
        ),
        # a mode removed (issue 46: slower than agent, which falls back to the same hook)
        ("nri-inroot: hook\n", '"nri-inroot" is "hook", must be one of "agent", "start"$'),
        (
            "driver-root: relative/path\n",
            '"driver-root" is "relative/path", must be an absolute path',
        ),
        (
            "supported-driver-capabilities: [compute, compute]\n",
            "must be a list without duplicates",
        ),
        ("- a\n- b\n", "top level must be a mapping"),
        ("runtimes: [runc\n", "line 2"),
        # these escaped as a ValueError / RecursionError traceback
        ("kubelet-timeout: 2024-13-45\n", "invalid YAML: month must be in 1..12"),
        ("kubelet-timeout: " + "9" * 5000 + "\n", "invalid YAML: Exceeds the limit"),
        ("runtimes: " + "[" * 5000 + "]" * 5000 + "\n", "invalid YAML: nested too deeply"),
    ],
)
def test_bad_config_is_one_line(tmp_path, text, message):
    """A bad key or type is one line naming the key, the file and what is allowed."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path)
    assert "\n" not in str(info.value) and path in str(info.value)


def test_alias_bomb_is_one_line_not_a_hang(tmp_path):
    """401 bytes of YAML aliases stand for 9**9 values: `config show`/`compile` (and a
    create without a compiled copy) spent forever validating them and rendering the error.
    Now one ConfigError, quickly. In a subprocess, so a regression fails on the timeout."""
    import subprocess
    import sys

    parts = ["&a0 [l,l,l,l,l,l,l,l,l]"]
    parts += ["&a%d [%s]" % (i, ",".join(["*a%d" % (i - 1)] * 9)) for i in range(1, 9)]
    path = write(tmp_path, "supported-driver-capabilities: [" + ", ".join(parts) + "]\n")
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); from nvshim.config import load_config\n"
        "from nvshim.errors import ConfigError\n"
        "try:\n    load_config(sys.argv[2])\nexcept ConfigError as exc:\n    print(exc)"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", probe, REPO, path], capture_output=True, text=True, timeout=30
    )
    assert out.stdout == (
        f"config {path}: more than 100000 values once YAML aliases are expanded\n"
    ), out.stderr


def test_aliases_within_reason_still_work(tmp_path):
    """Aliases are not refused as such: a value used twice reads as it did."""
    path = write(tmp_path, "runtimes: &r [crun, runc]\n")
    assert load_config(path).runtimes == ("crun", "runc")


def test_duplicate_yaml_key_is_refused(tmp_path: Path) -> None:
    """Issue 12 item 8: a key given twice (`require-allocation: true` then `false`) is an error
    naming the key and both lines."""
    path = tmp_path / "config.yaml"
    path.write_text("require-allocation: true\ndebug-log: /tmp/x\nrequire-allocation: false\n")
    with pytest.raises(
        ConfigError, match=r'line 3: duplicate key "require-allocation" \(first on line 1\)'
    ):
        load_config(str(path))
    res = nvshim_cli("config", "show", "--config", str(path))
    assert res.returncode == 1 and res.stderr.count("\n") == 1 and "duplicate key" in res.stderr


def test_compiled_cache_is_used_and_invalidated(tmp_path):
    """The compiled copy is read while it matches the YAML and ignored once the YAML changes."""
    path = write(tmp_path, "require-allocation: true\n")
    out = compile_config(path)
    assert out == compiled_path(path) and os.stat(out).st_mode & 0o777 == 0o644
    assert load_config(path).require_allocation is True
    # Tamper with the compiled copy: it is used as long as the YAML hash matches...
    doc = json.load(open(out))
    doc["config"]["runtimes"] = ["from-cache"]
    open(out, "w").write(json.dumps(doc))
    assert load_config(path).runtimes == ("from-cache",)
    # ...and ignored once the YAML changes.
    write(tmp_path, "require-allocation: false\n")
    cfg = load_config(path)
    assert cfg.require_allocation is False and cfg.runtimes == ("runc", "crun")


def test_a_compiled_copy_from_another_nvshim_is_stale_not_a_crash(tmp_path):
    """A compiled copy whose config holds a key this nvshim does not know (written by a newer
    one with the same version string, mid-upgrade) is ignored: the YAML is read instead, no
    TypeError traceback."""
    path = write(tmp_path, "require-allocation: true\n")
    out = compile_config(path)
    doc = json.load(open(out))
    doc["config"]["a-key-from-a-newer-nvshim"] = True
    open(out, "w").write(json.dumps(doc))
    cfg = load_config(path)
    assert cfg.require_allocation is True and cfg.source == path


def test_compiling_twice_leaves_one_source_link_and_no_temp_files(tmp_path: Path) -> None:
    """Issue 12 item 1: compile twice: the lists, the compiled copy, the CDI index and one hard link
    to the YAML, nothing else."""
    from nvshim.config import compiled_lists_fresh, source_link_path
    from nvshim.node.compile import compile_node

    config = tmp_path / "config.yaml"
    config.write_text("runtimes: [runc]\n")
    compile_node(str(config))
    compile_node(str(config))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.annotation-prefixes",
        "config.cdi-index.json",
        "config.compiled.json",
        "config.runtimes",
        "config.source-link",
        "config.yaml",
    ]
    assert os.path.samefile(config, source_link_path(str(config)))
    assert compiled_lists_fresh(str(config))
    config.write_text("runtimes: [crun]\n")
    assert not compiled_lists_fresh(str(config))


def test_env_override(tmp_path, monkeypatch):
    """NVSHIM_CONFIG points the loader at another file."""
    path = write(tmp_path, "default-kind: acme.com/gpu\n")
    monkeypatch.setenv("NVSHIM_CONFIG", path)
    assert load_config().default_kind == "acme.com/gpu"


def test_a_fifo_config_is_refused_without_waiting(tmp_path):
    """NVSHIM_CONFIG naming a FIFO hung every create (and `nvshim config show`) waiting for
    a writer; it is one line now, at once."""
    import subprocess
    import sys

    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"config\.yaml: not a regular file"):
        load_config(str(fifo))
    res = subprocess.run(
        [sys.executable, "-m", "nvshim.cli.main", "config", "show", "--config", str(fifo)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert res.returncode == 1 and res.stderr.count("\n") == 1
    assert "not a regular file" in res.stderr


def test_a_fifo_cache_is_not_used_and_does_not_block(tmp_path):
    """A FIFO where the node plan cache or the CDI index lives is 'not a regular file':
    the create rebuilds instead of waiting."""
    from nvshim.files import read_trusted_cache

    fifo = tmp_path / "config.plan.json"
    os.mkfifo(fifo)
    assert read_trusted_cache(str(fifo), "node plan cache") == (
        None,
        "node plan cache is not a regular file",
    )


def test_every_problem_is_reported_in_one_pass(tmp_path):
    """A config with several mistakes names them all, in the file's order, in one line:
    the count first, then each problem (a terminal and containerd's log show one line)."""
    path = write(
        tmp_path,
        "require-allocation: maybe\n"
        "bogus: 1\n"
        "on-missing-allocation: drop\n"
        "allocation-sources: [volume-mounts, magic, kubelet, nope]\n"
        "debug-log: /tmp/x\n"
        "debug-log: /tmp/y\n",
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message
    prefix = f"config {path}: 6 problems: "
    assert message.startswith(prefix), message
    assert message[len(prefix) :].split("; ") == [
        'line 6: duplicate key "debug-log" (first on line 5)',
        '"require-allocation" is "maybe", must be a boolean',
        'unknown key "bogus" (allowed: ' + ", ".join(sorted(Config().to_mapping())) + ")",
        '"on-missing-allocation" is "drop", must be one of "strip", "fail"',
        '"allocation-sources[1]" is "magic", must be one of "volume-mounts", "cdi-annotations", '
        '"envvar-uuids", "privileged", "kubelet", "docker-gpus"',
        '"allocation-sources[3]" is "nope", must be one of "volume-mounts", "cdi-annotations", '
        '"envvar-uuids", "privileged", "kubelet", "docker-gpus"',
    ]


@pytest.mark.parametrize(
    "text,problem",
    [
        (
            "require-alocation: true\n",
            'unknown key "require-alocation" (did you mean "require-allocation"?)',
        ),
        (
            "require_allocation: true\n",
            'unknown key "require_allocation" (did you mean "require-allocation"?)',
        ),
        ("Driver-Root: /\n", 'unknown key "Driver-Root" (did you mean "driver-root"?)'),
        (
            "on-missing-allocation: strp\n",
            '"on-missing-allocation" is "strp", must be one of "strip", "fail" '
            '(did you mean "strip"?)',
        ),
        (
            "on-missing-allocation: STRIP\n",
            '"on-missing-allocation" is "STRIP", must be one of "strip", "fail" '
            '(did you mean "strip"?)',
        ),
        (
            "allocation-sources: [volume-mount]\n",
            '"allocation-sources[0]" is "volume-mount", must be one of "volume-mounts", '
            '"cdi-annotations", "envvar-uuids", "privileged", "kubelet", "docker-gpus" (did you mean "volume-mounts"?)',
        ),
        (
            "supported-driver-capabilities: [compte]\n",
            '"supported-driver-capabilities[0]" is "compte", must be one of "compute", "compat32", '
            '"graphics", "utility", "video", "display", "ngx", "all" (did you mean "compute"?)',
        ),
    ],
)
def test_a_near_miss_says_what_was_meant(tmp_path, text, problem):
    """A misspelled key or value is named with the key or value it is close to."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"config {path}: {problem}"


def test_the_allowed_keys_are_listed_once(tmp_path):
    """Several unknown keys that resemble no key: the allowed keys are listed after the first
    only, so the other problems still fit the message."""
    path = write(tmp_path, "bogus: 1\nzzz: 2\nrequire-alocation: true\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.count("(allowed: ") == 1
    assert message.endswith(
        '; unknown key "zzz"; unknown key "require-alocation" (did you mean "require-allocation"?)'
    ), message


def test_a_config_with_several_problems_is_one_line_in_runcs_log(tmp_path):
    """The runtime reports a config with several problems as one runc-style JSON record in
    --log (and one plain line on stderr), naming each problem."""
    import subprocess
    import sys

    from tests.helpers.bundle import make_bundle, make_rootfs

    cfg = write(
        tmp_path, "runtimes: [/bin/true]\nrequire-alocation: true\non-missing-allocation: strp\n"
    )
    bundle = make_bundle(
        tmp_path / "b",
        make_rootfs(tmp_path / "rootfs"),
        ["true"],
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
    )
    before = (bundle / "config.json").read_bytes()
    log = tmp_path / "log.json"
    res = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            "import sys; sys.path.insert(0, sys.argv.pop(1)); "
            "from nvshim.runtime.main import main; main()",
            REPO,
            "--log",
            str(log),
            "--log-format",
            "json",
            "create",
            "--bundle",
            str(bundle),
            "c0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "NVSHIM_CONFIG": cfg},
    )
    assert res.returncode == 1
    problems = (
        f'config {cfg}: 2 problems: unknown key "require-alocation" (did you mean '
        f'"require-allocation"?); "on-missing-allocation" is "strp", must be one of '
        f'"strip", "fail" (did you mean "strip"?)'
    )
    assert res.stderr == f"nvshim: {problems}\n"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 1 and records[0]["level"] == "error"
    assert problems in records[0]["msg"]
    assert (bundle / "config.json").read_bytes() == before
