"""Build the self-contained runtime (``install.sh --payload DIR``): a node-root-shaped tree.

``DIR<prefix>/`` holds the interpreter that runs this module, its C library and every
library its ELFs need, a trimmed standard library, nvshim and its dependencies (the
layout is :mod:`nvshim.node.install.prefix`'s); ``DIR<bindir>/`` the ``nvshim`` and
``nvshim-runtime`` commands for that prefix; ``DIR/install.sh`` and
``DIR/config/config.yaml`` what ``install.sh --from DIR`` needs on a node; and
``DIR/.nvshim-payload`` the prefix and bindir the tree was built for.

Runs on the build machine, with the interpreter to bundle (install.sh's ``NVSHIM_PYTHON``,
default ``/usr/bin/python3``) and only the standard library: nvshim's dependencies are
installed by that interpreter's pip into the tree, from the build machine's index.
Everything is written under DIR (pip's temporary files included).

Why one module: the payload is one build, in order (the interpreter and its C library, the
trimmed standard library, nvshim and its dependencies, the commands, the file list), and
each step reads what the one before put in the tree; the layout itself is prefix.py's and
the commands' text trampoline.py's.
"""

from __future__ import annotations

import argparse
import compileall
import os
import py_compile
import re
import shutil
import subprocess
import sys
from typing import Dict, Iterator, List, Optional, Sequence

from nvshim._preload import FILE_NAME as PRELOAD_FILE
from nvshim._preload import dumps as preload_dumps
from nvshim.errors import HostError
from nvshim.node.install.prefix import (
    FILE_LIST,
    INTERPRETER,
    LAUNCHER,
    LIBDIR,
    PACKAGES,
    loader_name,
    render_cli,
    render_runtime,
)
from nvshim.runtime.devparams import PARAMS_HOOK_MODULE
from nvshim.runtime.hookargs import HOOK_MODULE

__all__ = ["build", "main", "STDLIB_DROPPED", "DYNLOAD_DROPPED", "PayloadError"]


class PayloadError(HostError):
    """The payload cannot be built on this machine; one line naming what and where."""


#: standard-library packages and modules no nvshim code path imports (tests, GUIs,
#: installers, databases): they only cost space
STDLIB_DROPPED = frozenset(
    {
        "test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "turtle.py",
        "ensurepip",
        "lib2to3",
        "pydoc_data",
        "distutils",
        "venv",
        "sqlite3",
        "dbm",
        "curses",
        "unittest",
        "site-packages",
        "dist-packages",
        "__phello__",
        "__pycache__",
        "EXTERNALLY-MANAGED",
    }
)

#: extension modules dropped: tests, GUIs and terminals, and ssl/hashlib (they drag in
#: libssl and libcrypto, 5 MB; hashlib's builtin algorithms remain)
DYNLOAD_DROPPED = re.compile(
    r"^(_test\w*|_ctypes_test|_xxtestfuzz|_xxsubinterpreters|xxlimited\w*|_tkinter|_curses\w*"
    r"|readline|_dbm|_gdbm|nis|ossaudiodev|audioop|_sqlite3|_ssl|_hashlib|_crypt)\."
)

#: the C library's family: loaded on demand (dlopen by a node library such as
#: libnvidia-ml, or by glibc itself for unwinding), so bundled even when no ELF here
#: needs them, all from the build machine's glibc (never a mix with the node's)
GLIBC_FAMILY = (
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "libutil.so.1",
    "libresolv.so.2",
    "libanl.so.1",
    "libgcc_s.so.1",
)

#: what the smoke test imports with the bundled interpreter: every dependency's top module,
#: and the agent's NRI messages (protobuf, whose compiled upb extension the smoke test
#: asserts is the one in use)
SMOKE_IMPORTS = (
    "nvshim.runtime.main",
    "nvshim.cli.main",
    HOOK_MODULE,
    PARAMS_HOOK_MODULE,
    "click",
    "structlog",
    "pynvml",
    "jsonschema",
    "yaml",
    "tomlkit",
    "grpc",
    "ctypes",
    "json",
    "nvshim.agent.nri.api",
)


#: pip's lines that only say an error happened elsewhere (its last line is one of them)
_PIP_WRAPPERS = (
    "error: subprocess-exited-with-error",
    "error: metadata-generation-failed",
    "note: This error originates from a subprocess",
)


def first_error(output: str, status: int) -> str:
    """The line of a failed command's output that says what went wrong: the first
    ``ERROR:``/``error:`` line that is not one of pip's wrappers (pip ends with "This error
    originates from a subprocess", naming nothing), else the last line."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    for line in lines:
        if line.lower().startswith("error") and not line.startswith(_PIP_WRAPPERS):
            return line
    return lines[-1] if lines else f"exit status {status}"


def _run(argv: Sequence[str], what: str, env: Optional[Dict[str, str]] = None) -> str:
    res = subprocess.run(list(argv), capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise PayloadError(
            f"{what} failed: {first_error(res.stderr or res.stdout, res.returncode)}"
        )
    return res.stdout


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _walk_files(top: str) -> Iterator[str]:
    for dirpath, _, filenames in os.walk(top):
        for name in filenames:
            yield os.path.join(dirpath, name)


def needed_libraries(elf: str) -> Dict[str, str]:
    """soname -> resolved file of every library ``elf`` needs (ldd: the whole closure)."""
    out: Dict[str, str] = {}
    for line in _run(["ldd", elf], f"ldd {elf}").splitlines():
        line = line.strip()
        if "=>" in line:
            name, _, rest = line.partition("=>")
            target = rest.strip().split(" (", 1)[0].strip()
            if target == "not found" or not target:
                raise PayloadError(f"{elf} needs {name.strip()}, which this machine lacks")
            out[name.strip()] = os.path.realpath(target)
        elif line.startswith("/"):  # the loader itself
            path = line.split(" (", 1)[0]
            out[os.path.basename(path)] = os.path.realpath(path)
    return out


def _copy_tree(src: str, dest: str, skip: Sequence[str] = ()) -> None:
    def ignore(directory: str, names: List[str]) -> List[str]:
        top = os.path.samefile(directory, src)
        return [
            n
            for n in names
            if n == "__pycache__" or (top and n in skip) or n.endswith((".pyc", ".pyo"))
        ]

    # copyfile, not copy2: modules are not commands (Debian ships some stdlib files +x with a
    # #!/usr/bin/env python3 line; here they are plain 0644 files)
    shutil.copytree(
        src, dest, ignore=ignore, symlinks=False, dirs_exist_ok=True, copy_function=shutil.copyfile
    )


def _install_packages(src: str, site: str, tmp: str) -> None:
    """nvshim and its dependencies into ``site``, built from a copy of the sources in
    ``tmp`` (pip builds in the tree it is given: build/ and *.egg-info stay out of ``src``)."""
    copy = os.path.join(tmp, "src")
    os.makedirs(copy)
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(os.path.join(src, name), os.path.join(copy, name))
    shutil.copytree(
        os.path.join(src, "nvshim"),
        os.path.join(copy, "nvshim"),
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    env = dict(
        os.environ,
        TMPDIR=tmp,
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_CACHE_DIR="1",
        PIP_NO_WARN_SCRIPT_LOCATION="1",
    )
    env.pop("PYTHONPATH", None)
    _run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--target", site, copy],
        f"pip install {src} --target {site}",
        env,
    )
    shutil.rmtree(os.path.join(site, "bin"), ignore_errors=True)  # console scripts: ours differ
    for path in _walk_files(site):
        if path.endswith(".py"):
            os.chmod(path, 0o644)  # a module, not a command


def _bundle_libraries(root: str) -> None:
    lib = os.path.join(root, LIBDIR)
    elves = [os.path.join(root, INTERPRETER)]
    elves += [p for p in _walk_files(os.path.join(root, PACKAGES)) if p.endswith(".so")]
    elves += [p for p in _walk_files(lib) if p.endswith(".so")]
    needed: Dict[str, str] = {}
    for elf in elves:
        for name, path in needed_libraries(elf).items():
            if not path.startswith(root + os.sep):  # a wheel's own vendored .libs stay put
                needed[name] = path
    libc = needed.get("libc.so.6")
    if libc is None:
        raise PayloadError(f"{elves[0]} is not linked against glibc (libc.so.6)")
    family_dir = os.path.dirname(libc)
    for name in GLIBC_FAMILY:
        candidate = os.path.join(family_dir, name)
        if name not in needed and os.path.exists(candidate):
            needed[name] = os.path.realpath(candidate)
    loader = loader_name()
    if loader not in needed:
        raise PayloadError(f"{elves[0]} does not name the loader {loader}")
    for name, path in sorted(needed.items()):
        shutil.copyfile(path, os.path.join(lib, name))
        os.chmod(os.path.join(lib, name), 0o755)


def _launcher(root: str) -> None:
    """bin/python3: a sh launcher that finds the prefix from its own path (the prefix is
    relocatable); the trampoline and the nvshim command exec the loader directly."""
    lib = f"$p/{LIBDIR}"
    text = (
        "#!/bin/sh\n"
        "# nvshim's Python: its own interpreter and C library, never the node's.\n"
        'case $0 in */*) p=${0%/*}/.. ;; *) p=$(command -v -- "$0"); p=${p%/*}/.. ;; esac\n'
        f'exec "{lib}/{loader_name()}" --library-path "{lib}" --argv0 "$0" '
        f'"$p/{INTERPRETER}" "$@"\n'
    )
    path = os.path.join(root, LAUNCHER)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


def _compile(root: str, prefix: str) -> None:
    """Bytecode for every module, naming the installed path (tracebacks show it, and two
    builds of the same sources give the same bytes); hash-based and unchecked, so an import
    never stats the source: the prefix is never changed in place."""
    mode = py_compile.PycInvalidationMode.UNCHECKED_HASH
    for top in _walk_dirs(root, ("lib/python", PACKAGES)):
        ddir = prefix + top[len(root) :]
        if not compileall.compile_dir(top, quiet=2, ddir=ddir, invalidation_mode=mode, workers=1):
            raise PayloadError(f"compiling {top} failed")


def _walk_dirs(root: str, starts: Sequence[str]) -> List[str]:
    out = []
    for start in starts:
        parent, _, head = os.path.join(root, start).rpartition("/")
        out += [
            os.path.join(parent, n)
            for n in sorted(os.listdir(parent))
            if n.startswith(head) and os.path.isdir(os.path.join(parent, n))
        ]
    return out


#: nvshim's subpackages a create never imports: not in the preload file
PRELOAD_SKIPPED = ("cli", "node", "sim", "data")
#: the pure-Python standard-library modules a GPU create imports (the others it uses are
#: frozen or built in): served from the preload file too
PRELOAD_STDLIB = ("__future__", "struct")


def _preload(root: str, prefix: str, stdlib: str) -> None:
    """site/nvshim-preload.bin: the code of nvshim's runtime modules (:mod:`nvshim._preload`)
    and of :data:`PRELOAD_STDLIB`, compiled for their installed paths."""
    site = os.path.join(root, PACKAGES)
    modules = {}
    for name in PRELOAD_STDLIB:
        path = os.path.join(stdlib, name + ".py")
        origin = prefix + path[len(root) :]
        with open(path, "rb") as f:
            code = compile(f.read(), origin, "exec", dont_inherit=True)
        modules[name] = (False, os.path.relpath(path, site), code)
    for path in sorted(_walk_files(os.path.join(site, "nvshim"))):
        rel = os.path.relpath(path, site)
        parts = rel[: -len(".py")].split(os.sep) if rel.endswith(".py") else []
        if len(parts) < 2 or parts[1] in PRELOAD_SKIPPED or parts[1] == "_preload":
            continue  # nvshim itself and _preload are imported before the file is read
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        origin = f"{prefix}/{PACKAGES}/{rel}"
        with open(path, "rb") as f:
            code = compile(f.read(), origin, "exec", dont_inherit=True)
        modules[name] = (is_package, rel, code)
    with open(os.path.join(site, PRELOAD_FILE), "wb") as f:
        f.write(preload_dumps(modules))


def _smoke(root: str, dest: str) -> None:
    code = (
        "import sys; sys.path[0:0] = [sys.argv[1]]; import importlib; "
        "import nvshim._preload as p; assert p.install(sys.argv[1] + '/' + p.FILE_NAME); "
        f"[importlib.import_module(m) for m in {list(SMOKE_IMPORTS)!r}]; "
        "assert sys.prefix == sys.argv[2], sys.prefix; "
        "import nvshim.runtime.hookargs as h; assert h.__file__.startswith(sys.argv[1]), h; "
        "from google.protobuf.internal import api_implementation as pb; "
        "assert pb.Type() == 'upb', 'protobuf without its compiled extension: ' + pb.Type(); "
        "print(sys.version)"
    )
    _run(
        [os.path.join(root, LAUNCHER), "-I", "-S", "-c", code, os.path.join(root, PACKAGES), root],
        f"the bundled interpreter in {dest}",
    )


def _write(path: str, text: str, mode: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def _agent_client(root: str) -> None:
    """``libexec/nvshim-agent-client`` (:mod:`nvshim.agent.client`), static, on x86-64 (the
    machine it is measured and tested on; arm64 is the next target). Without a C compiler
    the payload is built without it, said on stderr: its trampoline then starts Python for
    every GPU create, as without an agent."""
    import platform

    from nvshim.agent.client import CLIENT_NAME, build_client

    if platform.machine() != "x86_64":
        sys.stderr.write(
            f"install.sh: payload: no {CLIENT_NAME} for {platform.machine()} "
            "(x86-64 only): GPU creates start Python\n"
        )
        return
    try:
        build_client(os.path.join(root, "libexec", CLIENT_NAME))
    except HostError as exc:
        if "no C compiler" not in str(exc):
            raise PayloadError(str(exc)) from exc
        sys.stderr.write(
            f"install.sh: payload: {exc}: built without it, GPU creates start Python\n"
        )


def build(dest: str, src: str, prefix: str, bindir: str, etcdir: str) -> str:
    """Build the payload for ``prefix``/``bindir``/``etcdir`` into ``dest``; returns the
    prefix's directory inside it."""
    for value, what in (
        (prefix, "NVSHIM_PREFIX"),
        (bindir, "NVSHIM_BINDIR"),
        (etcdir, "NVSHIM_ETCDIR"),
    ):
        if not value.startswith("/") or value.rstrip("/") == "":
            raise PayloadError(f"{what} must be an absolute directory: {value!r}")
    dest = os.path.abspath(dest)
    root = dest + prefix.rstrip("/")
    if os.path.exists(root) and os.listdir(root):
        raise PayloadError(f"{root} is not empty: build the payload into a new directory")
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    stdlib = os.path.join(root, LIBDIR, version)
    for sub in (os.path.dirname(LAUNCHER), os.path.dirname(INTERPRETER), LIBDIR, PACKAGES):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    tmp = os.path.join(dest, ".build-tmp")
    os.makedirs(tmp, exist_ok=True)
    try:
        _install_packages(src, os.path.join(root, PACKAGES), tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.copyfile(os.path.realpath(sys.executable), os.path.join(root, INTERPRETER))
    os.chmod(os.path.join(root, INTERPRETER), 0o755)
    # the base interpreter's, also when this runs in a venv
    _copy_tree(os.path.dirname(os.__file__), stdlib, skip=sorted(STDLIB_DROPPED | {"lib-dynload"}))
    dynload = next((p for p in sys.path if os.path.basename(p) == "lib-dynload"), "")
    if not os.path.isdir(dynload):
        raise PayloadError(f"{sys.executable} has no lib-dynload directory on sys.path")
    os.makedirs(os.path.join(stdlib, "lib-dynload"), exist_ok=True)
    for name in sorted(os.listdir(dynload)):
        if name.endswith(".so") and not DYNLOAD_DROPPED.match(name):
            shutil.copyfile(os.path.join(dynload, name), os.path.join(stdlib, "lib-dynload", name))
    for config_dir in os.listdir(stdlib):  # libpython.a and the Makefile: build-only
        if config_dir.startswith("config-"):
            shutil.rmtree(os.path.join(stdlib, config_dir))
    _bundle_libraries(root)
    _launcher(root)
    _compile(root, prefix.rstrip("/"))
    _preload(root, prefix.rstrip("/"), stdlib)
    _smoke(root, dest)

    config = f"{etcdir.rstrip('/')}/config.yaml"
    bindir_path = dest + bindir.rstrip("/")
    _write(
        os.path.join(bindir_path, "nvshim-runtime"),
        render_runtime(prefix.rstrip("/"), config),
        0o755,
    )
    _write(
        os.path.join(bindir_path, "nvshim"),
        render_cli(prefix.rstrip("/"), config, bindir=bindir),
        0o755,
    )
    with open(os.path.join(src, "install.sh")) as f:
        installer = f.read()
    _write(os.path.join(dest, "install.sh"), installer, 0o755)
    _write(os.path.join(root, "install.sh"), installer, 0o755)
    with open(os.path.join(src, "config", "config.yaml")) as f:
        _write(os.path.join(dest, "config", "config.yaml"), f.read(), 0o644)
    _agent_client(root)
    files = sorted(os.path.relpath(p, root) for p in _walk_files(root))
    _write(os.path.join(root, FILE_LIST), "".join(f + "\n" for f in files + [FILE_LIST]), 0o644)
    from nvshim import __version__

    _write(
        os.path.join(dest, ".nvshim-payload"),
        f"prefix={prefix.rstrip('/')}\nbindir={bindir.rstrip('/')}\nversion={__version__}\n"
        f"python={sys.version.split()[0]}\n",
        0o644,
    )
    return root


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="install.sh --payload")
    parser.add_argument("--dest", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--bindir", required=True)
    parser.add_argument("--etcdir", required=True)
    ns = parser.parse_args(argv)
    try:
        build(ns.dest, ns.src, ns.prefix, ns.bindir, ns.etcdir)
    except (PayloadError, OSError, ValueError) as exc:
        sys.stderr.write(f"install.sh: payload: {exc}\n")
        sys.exit(1)
