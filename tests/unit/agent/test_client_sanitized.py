"""The C client's sanitized build (:mod:`tests.helpers.sanitized`): each kind of bug
the sanitizers look for, planted in a copy of client.c, leaves a report where the client
scenarios look for one, whatever environment the client is run with."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from nvshim.agent import client as client_module
from tests.helpers.sanitized import sanitized_client, take_reports

PLANTED = {
    "overflow": (
        "{ char *volatile p = malloc(4); p[argc + 2] = 1; free(p); }",
        "ERROR: AddressSanitizer: heap-buffer-overflow",
    ),
    "leak": (
        "{ char *volatile p = malloc(7); p[0] = 0; p = 0; }",
        "ERROR: LeakSanitizer: detected memory leaks",
    ),
    "undefined": (
        "{ volatile int x = 2147483647; x = x + argc; }",
        "runtime error: signed integer overflow",
    ),
}


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sanitized build of a client.c whose main first runs the bug its first argument
    names."""
    where = tmp_path_factory.mktemp("planted")
    source = Path(client_module.SOURCE).read_text()
    head = "int main(int argc, char **argv) {\n"
    assert head in source and "#include <string.h>\n" in source
    bugs = "".join(
        f'    if (argc > 1 && !strcmp(argv[1], "{name}")) {code}\n'
        for name, (code, _) in PLANTED.items()
    )
    copy = where / "client.c"
    copy.write_text(
        source.replace(
            "#include <string.h>\n", "#include <stdlib.h>\n#include <string.h>\n"
        ).replace(head, head + bugs, 1)
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(client_module, "SOURCE", str(copy))
        return sanitized_client(where)


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_each_kind_of_bug_leaves_a_report(planted: Path, bug: str) -> None:
    """An overflow, a leak and undefined behaviour each fail the client (exit 1) and leave
    one report file naming the bug, with an empty environment and nothing on stderr."""
    res = subprocess.run([str(planted), bug], capture_output=True, text=True, env={})
    reports = take_reports(planted)
    assert (res.returncode, res.stderr) == (1, ""), res.stderr
    assert len(reports) == 1 and PLANTED[bug][1] in reports[0], reports


def test_the_clean_client_leaves_no_report(planted: Path) -> None:
    """Without a planted bug the sanitized client's usage error leaves no report."""
    res = subprocess.run([str(planted)], capture_output=True, text=True, env={})
    assert res.returncode == 2 and take_reports(planted) == []
