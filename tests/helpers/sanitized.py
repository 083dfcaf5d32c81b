"""The C client built once with AddressSanitizer and UndefinedBehaviorSanitizer, and the
client scenarios of a test module collected again against that build.

The build is ``build_client``'s (:mod:`nvshim.agent.client`) with the sanitizer flags in
place of the release ones and one more source file that sets the sanitizers' defaults: the
trampoline runs the client with its own environment, so ``ASAN_OPTIONS`` would not reach
it. Leak detection is on (LeakSanitizer works in this container; a planted leak that went
unreported would fail ``tests/unit/agent/test_client_sanitized.py``); undefined behaviour is
fatal (``-fno-sanitize-recover=all``); every report goes to a file under the build's
``reports`` folder instead of the client's stderr, so a report cannot hide in a scenario
that ignores the client's output (:func:`take_reports`).
"""

from __future__ import annotations

import inspect
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, Iterator, List

SANITIZE = (
    "-g",
    "-O1",
    "-fsanitize=address,undefined",
    "-fno-omit-frame-pointer",
    "-fno-sanitize-recover=all",
)

_DEFAULTS = """\
#define _GNU_SOURCE
#include <dlfcn.h>
const char *__asan_default_options(void);
const char *__ubsan_default_options(void);
const char *__asan_default_options(void) {{ return "log_path={reports}/asan:detect_leaks=1"; }}
const char *__ubsan_default_options(void) {{ return "print_stacktrace=1:halt_on_error=1"; }}
/* gcc links UBSan's runtime apart from ASan's, and it does not read log_path then: give
   that runtime its report path itself (clang's one runtime reads ASan's log_path) */
__attribute__((constructor)) static void ubsan_report_path(void) {{
    void *ubsan = dlopen("libubsan.so.1", RTLD_NOW | RTLD_NOLOAD);
    void (*set)(const char *) = ubsan ? (void (*)(const char *))dlsym(
        ubsan, "__sanitizer_set_report_path") : 0;
    if (set) set("{reports}/ubsan");
}}
"""


def sanitized_client(where: Path) -> Path:
    """The client built under the sanitizers into ``where`` (its reports into
    ``where/reports``); the test is skipped where the compiler cannot link a sanitized
    program (no compiler, or no libasan/libubsan)."""
    import pytest

    from nvshim.agent.client import build_client, compiler_of

    cc = compiler_of()  # the one the build below uses
    if cc is None:
        pytest.skip("no C compiler (gcc, cc, $CC) to build the sanitized client")
    probe = where / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    res = subprocess.run(
        [cc, *SANITIZE, "-o", str(where / "probe"), str(probe)], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip(
            f"{cc} cannot link -fsanitize=address,undefined (Debian: libasan8, "
            f"libubsan1): {(res.stderr.strip().splitlines() or ['?'])[-1]}"
        )
    reports = where / "reports"
    reports.mkdir()
    defaults = where / "defaults.c"
    defaults.write_text(_DEFAULTS.format(reports=reports))
    # a failure here is the client's (it linked a sanitized program above): not skipped
    return Path(
        build_client(str(where / "nvshim-agent-client"), cc, flags=[*SANITIZE, str(defaults)])
    )


def take_reports(client: Path) -> List[str]:
    """The sanitizer reports the client at ``client`` wrote since the last call (each
    ``file: text``), removed so that the next call sees only new ones."""
    out = []
    for path in sorted((client.parent / "reports").iterdir()):
        out.append(f"{path.name}: {path.read_text(errors='replace')}")
        path.unlink()
    return out


def _runs_the_client(test: Any) -> bool:
    """Whether a test asks for the client, itself or through its ``world``."""
    try:
        params = inspect.signature(test).parameters
    except (TypeError, ValueError):
        return False
    return "client" in params or "world" in params


def client_scenarios(module: ModuleType) -> Dict[str, Any]:
    """What a module needs to collect ``module``'s client scenarios again: its names (its
    fixtures, helpers and ``pytestmark``) with only the tests that run the client, its
    ``client`` fixture replaced by the sanitized build, and a check after each scenario
    that the sanitizers reported nothing."""
    import pytest

    @pytest.fixture(scope="module")
    def client(sanitized_client: Path) -> Path:
        """The sanitized build in place of the release one."""
        return sanitized_client

    @pytest.fixture(autouse=True)
    def no_sanitizer_report(sanitized_client: Path) -> Iterator[None]:
        """After each scenario: no report from the sanitized client."""
        take_reports(sanitized_client)
        yield
        assert take_reports(sanitized_client) == []

    names = {
        name: obj
        for name, obj in vars(module).items()
        if not name.startswith("__")
        and name != "client"
        and (not name.startswith("test_") or _runs_the_client(obj))
    }
    return {**names, "client": client, "no_sanitizer_report": no_sanitizer_report}
