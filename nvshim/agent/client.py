"""The fast-path client, ``nvshim-agent-client``: nvshim's only compiled piece.

``client.c`` (beside this module, about 140 lines, documented in ``docs/agent.md``) is built
static with the build machine's C compiler when the payload is built (and by
``install.sh`` where a compiler is present): the trampoline runs it for a GPU create
and it starts in a fraction of a Python start (BENCHMARKS.md, figures: `agent.client`
against `python.start`). Where it is missing
(no compiler, a machine it is not built for yet) the trampoline runs the in-process
create, as without an agent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import List, Optional, Sequence

from nvshim.errors import HostError

__all__ = ["SOURCE", "CLIENT_NAME", "build_client", "client_path", "compiler_of", "main"]

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "client.c")
CLIENT_NAME = "nvshim-agent-client"
#: The shipped build: static, small, stripped.
_RELEASE = ("-static", "-Os", "-s")
#: Every build's: warnings are errors.
_WARNINGS = ("-Wall", "-Wextra", "-Werror", "-std=gnu11")


def client_path(python: str) -> str:
    """Where the client of the installation whose interpreter is ``python`` lies:
    ``<python's prefix>/libexec/nvshim-agent-client`` (a venv's, the payload's prefix)."""
    return os.path.join(os.path.dirname(os.path.dirname(python)), "libexec", CLIENT_NAME)


def compiler_of(cc: Optional[str] = None) -> Optional[str]:
    """The C compiler a build uses: ``cc``, else ``$CC``, else gcc or cc on PATH (None:
    none)."""
    return cc or os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def build_client(dest: str, cc: Optional[str] = None, flags: Sequence[str] = _RELEASE) -> str:
    """Compile the client to ``dest`` (static by default); HostError in one line when it
    cannot be.

    ``flags`` replace the release build's (the tests' sanitizer build); the warnings stay
    errors either way."""
    compiler = compiler_of(cc)
    if not compiler:
        raise HostError(f"no C compiler (gcc, cc, $CC) to build {dest}")
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    tmp = f"{dest}.tmp{os.getpid()}"
    argv: List[str] = [compiler, *flags, *_WARNINGS, "-o", tmp, SOURCE]
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        lines = (res.stderr or res.stdout).strip().splitlines()
        why = lines[-1] if lines else f"exit status {res.returncode}"
        raise HostError(f"cannot build {dest} with {compiler}: {why}")
    os.chmod(tmp, 0o755)
    os.replace(tmp, dest)
    return dest


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m nvshim.agent.client DEST``: build the client (install.sh uses it)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m nvshim.agent.client DEST\n")
        return 2
    try:
        build_client(args[0])
    except HostError as exc:
        sys.stderr.write(f"nvshim: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
