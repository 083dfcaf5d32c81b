"""NRI's messages for nvshim, generated: ``nvshim/agent/nri/api_pb2.py``.

Their source is NRI's ``pkg/api/api.proto`` at the tag ``tests/go/nri-proto/go.mod`` pins
(the NRI that containerd v2.4.2 vendors), taken from Go's module cache by
``tests/go/nri-proto/build.sh`` (:func:`tests.helpers.gobuild.go_programs`, cached like the
other Go groups): NRI's source is never kept here. protoc is grpcio-tools' (the version
pyproject's test extra pins, :data:`GRPCIO_TOOLS`), whose gencode asks for a protobuf
runtime at least as new as its own (pyproject's floor). The file is compiled as
``nvshim/agent/nri/api.proto`` so the generated module names itself
``nvshim.agent.nri.api_pb2``. No ``.pyi``: protoc's stub does not parse (NRI's ``Field``
enum has a value named ``None``), so mypy reads the module as untyped (pyproject).

Regenerate after a change of the pin or of grpcio-tools, from the repository root::

    python -m tests.helpers.nriproto

:func:`generate` is also what the drift test (``tests/unit/agent/nri/test_api_pb2.py``) runs,
into a temporary directory, to compare with the checked-in file byte for byte.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.helpers.gobuild import GO_MODULES, go_programs

__all__ = ["GRPCIO_TOOLS", "GROUP", "MODULE", "generate", "pinned_nri", "main"]

#: the grpcio-tools (protoc) the checked-in files were generated with
GRPCIO_TOOLS = "1.85.4"
#: the Go group that fetches api.proto
GROUP = "nri-proto"
#: the generated module, without its suffix, as a path from the repository root
MODULE = "nvshim/agent/nri/api_pb2"
REPO = Path(__file__).resolve().parents[2]


def pinned_nri(group: str = GROUP) -> str:
    """The github.com/containerd/nri version ``tests/go/<group>/go.mod`` requires."""
    text = (GO_MODULES / group / "go.mod").read_text()
    found = re.search(
        r"^\s*(?:require\s+)?github\.com/containerd/nri (v[0-9][^\s]*)", text, re.MULTILINE
    )
    if found is None:
        raise AssertionError(f"tests/go/{group}/go.mod requires no github.com/containerd/nri")
    return found.group(1)


def _header() -> str:
    return (
        f"# nvshim: NRI {pinned_nri()}'s pkg/api/api.proto, protoc of grpcio-tools "
        f"{GRPCIO_TOOLS}.\n# Regenerate with `python -m tests.helpers.nriproto`"
        f" (tests/helpers/nriproto.py); never edit by hand.\n"
    )


def generate() -> bytes:
    """The generated module, as the checked-in file must read."""
    from grpc_tools.grpc_version import VERSION as tools_version

    if tools_version != GRPCIO_TOOLS:
        raise AssertionError(
            f"grpcio-tools {tools_version} is installed; the NRI messages "
            f"are generated with {GRPCIO_TOOLS} (pip install -e '.[test]')"
        )
    proto_dir = go_programs(GROUP)
    package = str(Path(MODULE).parent)
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{package}={proto_dir}",
                f"--python_out={tmp}",
                f"{package}/api.proto",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if res.returncode != 0:
            raise AssertionError(f"protoc failed on {proto_dir}/api.proto: {res.stderr.strip()}")
        return _header().encode() + (Path(tmp) / (MODULE + ".py")).read_bytes()


def main() -> None:
    """Write the generated module into the checkout."""
    data = generate()
    path = REPO / (MODULE + ".py")
    path.write_bytes(data)
    print(f"wrote {path.relative_to(REPO)} ({len(data)} bytes)")


if __name__ == "__main__":
    main()
