"""Tables for runc argv parsing: command, bundle and log location."""

from __future__ import annotations

import pytest

from nvshim._argv import parse_argv

CASES = [
    # argv, command, bundle, log, log_format
    (["create", "id"], "create", None, None, None),
    (["create", "--bundle", "/b", "id"], "create", "/b", None, None),
    (["create", "-b", "/b", "id"], "create", "/b", None, None),
    (["create", "-bundle", "/b", "id"], "create", "/b", None, None),
    (["create", "--bundle=/b", "id"], "create", "/b", None, None),
    (["create", "-b=/b", "id"], "create", "/b", None, None),
    (["create", "-b", "/one", "--bundle", "/two", "id"], "create", "/two", None, None),
    (["create", "id", "--bundle", "/late"], "create", "/late", None, None),
    (["create", "--bundle", "create", "id"], "create", "create", None, None),
    (["create", "--pid-file", "--bundle", "id"], "create", None, None, None),
    (["create", "--console-socket", "/s", "--bundle", "/b", "id"], "create", "/b", None, None),
    (["create", "--", "--bundle", "/b"], "create", None, None, None),
    (["--root", "/r", "--log", "/l.json", "--log-format", "json", "create", "--bundle", "/b", "--pid-file", "/p", "id"],
     "create", "/b", "/l.json", "json"),
    (["--root=/r", "--log=/l", "--log-format=text", "create", "-b", "/b", "x"], "create", "/b", "/l", "text"),
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


def test_trailing_bundle_flag_is_an_error():
    """A bundle flag with no value is reported, not guessed."""
    inv = parse_argv(["create", "x", "--bundle"])
    assert inv.error == "flag needs an argument: --bundle"
