"""Tables for runc argv parsing: command, bundle and log location."""

from __future__ import annotations

import pytest

from nvshim.runtime.argv import parse_argv

CASES = [
    # argv, command, bundle, log, log_format
    (["create", "id"], "create", None, None, None),
    (["create", "--bundle", "/b", "id"], "create", "/b", None, None),
    (["create", "-b", "/b", "id"], "create", "/b", None, None),
    (["create", "--bundle=/b", "id"], "create", "/b", None, None),
    (["create", "-b", "/one", "--bundle", "/two", "id"], "create", "/two", None, None),
    (["create", "id", "--bundle", "/late"], "create", "/late", None, None),
    (["create", "--bundle", "create", "id"], "create", "create", None, None),
    (["create", "--pid-file", "--bundle", "id"], "create", None, None, None),
    (["create", "--console-socket", "/s", "--bundle", "/b", "id"], "create", "/b", None, None),
    (["create", "--", "--bundle", "/b"], "create", None, None, None),
    (
        [
            "--root",
            "/r",
            "--log",
            "/l.json",
            "--log-format",
            "json",
            "create",
            "--bundle",
            "/b",
            "--pid-file",
            "/p",
            "id",
        ],
        "create",
        "/b",
        "/l.json",
        "json",
    ),
    (
        ["--root=/r", "--log=/l", "--log-format=text", "create", "-b", "/b", "x"],
        "create",
        "/b",
        "/l",
        "text",
    ),
    (["--debug", "--systemd-cgroup", "create", "x"], "create", None, None, None),
    (["--root", "create", "state", "x"], "state", None, None, None),
    (["--log", "create", "start", "x"], "start", None, "create", None),
    (["run", "--bundle", "/b", "-d", "x"], "run", "/b", None, None),
    (["start", "create"], "start", None, None, None),
    (["state", "x"], "state", None, None, None),
    (["delete", "--force", "x"], "delete", None, None, None),
    (["kill", "x", "9"], "kill", None, None, None),
    (["exec", "--process", "/p", "--detach", "x"], "exec", None, None, None),
    (["features"], "features", None, None, None),
    (["--version"], None, None, None, None),
    (["-v", "create", "x"], None, None, None, None),
    (["--help"], None, None, None, None),
    ([], None, None, None, None),
    (["--", "create", "x"], "create", None, None, None),
    (["--criu", "/c", "create", "x"], "create", None, None, None),
    (["--rootless", "true", "create", "x"], "create", None, None, None),
    # crun's grammar (argp): global options with values, prefixes, clustered short options
    (["--cgroup-manager", "systemd", "create", "-b", "/b", "x"], "create", "/b", None, None),
    (["--cgroup-manager=systemd", "run", "--bundle", "/b", "x"], "run", "/b", None, None),
    (["--cgroup-m", "cgroupfs", "create", "x"], "create", None, None, None),
    (["--cgroup-manager", "create", "state", "x"], "state", None, None, None),
    (
        ["--roo", "/r", "--log-f", "json", "create", "--bund", "/b", "x"],
        "create",
        "/b",
        None,
        "json",
    ),
    (["--root=/r", "create", "--bund=/b", "x"], "create", "/b", None, None),
    (["create", "-b/b", "x"], "create", "/b", None, None),
    (["run", "-db", "/b", "x"], "run", "/b", None, None),
    (["run", "-db/b", "x"], "run", "/b", None, None),
    (["create", "--pid", "/p", "-b", "/b", "x"], "create", "/b", None, None),
    (["create", "--no-p", "--no-n", "--b", "/b", "x"], "create", "/b", None, None),
    (["-V", "create", "x"], None, None, None, None),
    (["--ver", "create", "x"], None, None, None, None),
    (["--usage", "create", "x"], None, None, None, None),
    (["-?", "create", "x"], None, None, None, None),
]


@pytest.mark.parametrize("argv,command,bundle,log,log_format", CASES)
def test_parse_argv_table(argv, command, bundle, log, log_format):
    """Each argv form yields the command, bundle and --log settings runc itself would use."""
    inv = parse_argv(argv)
    assert (inv.command, inv.bundle, inv.log, inv.log_format) == (command, bundle, log, log_format)


def test_only_create_and_run_modify():
    """Only create and run are edited; every other command passes through."""
    assert parse_argv(["create", "x"]).modifies
    assert parse_argv(["run", "x"]).modifies
    for cmd in ("start", "state", "kill", "delete", "exec", "ps", "features", "update", "pause"):
        assert not parse_argv([cmd, "x"]).modifies


@pytest.mark.parametrize(
    "argv,message",
    [
        (["create", "-bundle", "/b", "x"], "means one thing to runc and another to crun"),
        (["create", "-b=/b", "x"], "means one thing to runc and another to crun"),
        (
            ["create", "--co", "/c", "-b", "/b", "x"],
            "ambiguous option --co (--config or --console-socket)",
        ),
        (["create", "--p", "/p", "x"], "ambiguous option --p"),
        (["create", "-f", "other.json", "-b", "/b", "x"], "cannot follow crun's --config"),
        (["create", "--config", "/c.json", "x"], "cannot follow crun's --config"),
        (["create", "--conf=c.json", "x"], "cannot follow crun's --config"),
        (["run", "-dfc.json", "x"], "cannot follow crun's --config"),
    ],
)
def test_argv_that_runc_and_crun_read_differently_fails_closed(argv, message):
    """Issue 12 item 6: an argv whose bundle/config crun and runc would find differently
    (or crun would refuse as ambiguous) is an error for create/run, never a guess."""
    inv = parse_argv(argv)
    assert inv.modifies and inv.error is not None and message in inv.error, inv.error


def test_trailing_bundle_flag_is_an_error():
    """A bundle flag with no value is reported, not guessed."""
    inv = parse_argv(["create", "x", "--bundle"])
    assert inv.error == "flag needs an argument: --bundle"


@pytest.mark.parametrize(
    "argv,container_id",
    [
        (["create", "id"], "id"),
        (["create", "--bundle", "/b", "id"], "id"),
        (["create", "--pid-file", "/p", "--console-socket", "/s", "-b", "/b", "x1"], "x1"),
        (["--root", "/r", "run", "-d", "--preserve-fds", "2", "r1"], "r1"),
        (["create", "--", "--odd-id"], "--odd-id"),
        (["create", "--bundle", "/b"], None),
        (["state", "x"], None),
    ],
)
def test_container_id_is_the_first_positional(argv, container_id):
    """The container id (for debug-log records) is create/run's first positional argument."""
    assert parse_argv(argv).container_id == container_id


def test_version_flag_is_recognised_only_before_a_command():
    """-v/--version before any command asks for versions; after it, it is the command's business."""
    assert parse_argv(["--version"]).version and parse_argv(["-v", "create"]).version
    assert not parse_argv(["--help"]).version
    assert not parse_argv(["state", "--version"]).version


@pytest.mark.parametrize(
    "argv,modifies",
    [
        (["create", "--help", "-b", "/b", "x"], False),
        (["create", "-b", "/b", "x", "-h"], False),  # runc reads flags after the id too
        (["run", "-help", "x"], False),
        (["create", "-?", "x"], False),  # crun
        (["run", "-d?", "x"], False),  # crun: -d then -?
        (["create", "--he", "x"], False),  # crun: a prefix of --help
        (["create", "--usage", "x"], False),  # crun
        (["create", "--help=true", "x"], False),
        (["create", "--help=false", "-b", "/b", "x"], True),  # runc: no help, the create runs
        (["create", "-h=0", "-b", "/b", "x"], True),
        (["create", "-b", "/b", "--", "--help"], True),  # after --, an id
    ],
)
def test_create_help_creates_nothing(argv, modifies):
    """create/run with its help flag prints help in runc and crun and creates nothing: no edit."""
    inv = parse_argv(argv)
    assert inv.modifies is modifies and inv.error is None
    assert inv.help is not modifies
