"""The README's test command passes on a fresh machine however it is started.

Two ways it went red (issue 21): a test ran ``git``, which ``install.sh --dev`` does not
install; another inherited the runner's ignored SIGHUP, as under ``nohup``. ``.ci/run``
runs the suite that way (stdin from /dev/null, SIGHUP ignored) so CI sees what such a
user sees, and no test may call ``git``.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# a subprocess argv that starts with git: ["git", ...] / ("git", ...)
_GIT_ARGV = re.compile(r"""[\[(]\s*["']git["']\s*,""")


def test_no_test_runs_git() -> None:
    """git is not something the test command installs; a clean clone need not be a git
    checkout either (a tarball, a CI workspace)."""
    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path.name == "test_ci.py":  # this file spells the pattern out
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _GIT_ARGV.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert offenders == []


def test_the_pattern_sees_a_git_call() -> None:
    assert _GIT_ARGV.search('subprocess.run(["git", "-C", str(REPO), "ls-files"])')
    assert not _GIT_ARGV.search('"a git checkout"')


def test_ci_runs_the_suite_with_stdin_closed_and_sighup_ignored() -> None:
    """As ``nohup cmd </dev/null`` would: stdin not a terminal, SIGHUP ignored and
    inherited by every process the tests start."""
    script = (REPO / ".ci" / "run").read_text()
    lines = script.splitlines()
    test_lines = [i for i, line in enumerate(lines) if "-m pytest" in line]
    assert len(test_lines) == 2  # the whole suite, and the unit tests on each claimed CPython
    for i in test_lines:
        assert "</dev/null" in lines[i].replace(" ", "")
    trap = next(i for i, line in enumerate(lines) if line.strip() == "trap '' HUP")
    assert trap < min(test_lines)


def _claimed_minors() -> list[int]:
    """The 3.x minors pyproject's requires-python admits, from its ``>=3.A,<3.B`` bounds."""
    import tomllib

    spec = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    match = re.fullmatch(r">=3\.(\d+),<3\.(\d+)", spec.replace(" ", ""))
    assert match, f"requires-python {spec!r} is not of the form >=3.A,<3.B"
    return list(range(int(match.group(1)), int(match.group(2))))


def test_requires_python_is_what_ci_tests() -> None:
    """requires-python claims exactly the CPythons from the oldest to the newest that .ci/run
    runs the unit tests on; the classifiers list each of them; ruff and mypy check for the
    oldest."""
    import tomllib

    minors = _claimed_minors()
    script = (REPO / ".ci" / "run").read_text()
    claimed = re.search(r'^CLAIMED_PYTHONS="([^"]*)"$', script, re.M)
    assert claimed, ".ci/run has no CLAIMED_PYTHONS line"
    assert claimed.group(1).split() == [f"3.{minors[0]}", f"3.{minors[-1]}"]
    # every claimed version: the one the whole suite ran on (the installed venv's) is skipped
    loop = re.search(r"^for version in \$CLAIMED_PYTHONS; do\n(.*?)^done$", script, re.M | re.S)
    assert loop and loop.group(1).split() == [
        "[",
        '"$version"',
        "=",
        '"$main_version"',
        "]",
        "||",
        "unit_tests_on",
        '"$version"',
    ], loop
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    classifiers = [
        c
        for c in pyproject["project"]["classifiers"]
        if c.startswith("Programming Language :: Python :: 3.")
    ]
    assert classifiers == [f"Programming Language :: Python :: 3.{m}" for m in minors]
    assert pyproject["tool"]["ruff"]["target-version"] == f"py3{minors[0]}"
    assert pyproject["tool"]["mypy"]["python_version"] == f"3.{minors[0]}"


def test_a_failing_check_fails_ci_before_the_other_pythons() -> None:
    """ruff, mypy or the suite failing ends .ci/run with that status: the README's && line is
    no longer the script's last, and set -e does not stop an && list."""
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    suite = next(line for line in lines if "-m ruff check" in line)
    assert suite.rstrip().endswith("|| exit $?")


def test_the_test_command_checks_the_format() -> None:
    """The README's command and .ci/run check ruff's format after its lint, with the ruff
    that pyproject pins to one minor version (a new style is a deliberate reformat)."""
    import tomllib

    check = "python -m ruff check . && /opt/nvshim/venv/bin/python -m ruff format --check . && "
    for path in (REPO / "README.md", REPO / ".ci" / "run"):
        assert check in path.read_text(), path
    test = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    ruff = [d for d in test["test"] if d.startswith("ruff")]
    assert re.fullmatch(r"ruff>=0\.(\d+),<0\.(\d+)", ruff[0]), ruff
    low, high = map(int, re.fullmatch(r"ruff>=0\.(\d+),<0\.(\d+)", ruff[0]).groups())
    assert high == low + 1, ruff
