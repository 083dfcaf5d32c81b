"""``nvshim config compile``: everything the create path reads pre-digested, in one step.

The compiled config (:func:`compile_config`: the JSON copy and the trampoline's line lists,
read by :mod:`nvshim.config`), the node plan cache
(:mod:`nvshim.runtime.plancache`) and the index of the CDI spec dirs (:mod:`nvshim.cdi.index`)
sit next to the YAML; creates check each with ``stat`` and rebuild a stale one.
"""

from __future__ import annotations

import errno
import json
import os
import stat

from nvshim import __version__
from nvshim.cdi import index as cdiindex
from nvshim.config import (
    Config,
    cdi_index_path,
    compiled_path,
    config_path,
    load_config,
    parse_config_text,
    prefixes_path,
    runtimes_path,
    source_link_path,
)
from nvshim.configcheck import describe_problems
from nvshim.errors import ConfigError
from nvshim.files import read_bytes, write_atomic
from nvshim.runtime.plancache import refresh

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional, Tuple

__all__ = ["compile_node", "compile_config", "compiled_fresh", "check_config"]


def compile_node(path: Optional[str] = None, default_runtime: bool = False) -> Tuple[str, str, str]:
    """Compile the config at ``path`` (default: the node's), then its plan cache and CDI index.

    Returns what each step reports: the compiled copy's path, the plan cache's status, the
    index's status. ``default_runtime``: see :func:`compile_config`.
    """
    out = compile_config(path, default_runtime)
    config = load_config(path)
    plan = refresh(config)
    index = cdiindex.refresh(config.cdi_spec_dirs, cdi_index_path(config.source or config_path()))
    return out, plan, index


def compiled_fresh(path: str) -> bool:
    """Whether ``path``'s compiled copy and the trampoline's lists were made from the YAML
    as it is now (by this nvshim): compiling again would write the same."""
    from nvshim.config import compiled_lists_fresh, compiled_matches

    data = read_bytes(path)
    raw = read_bytes(compiled_path(path)) if data is not None else None
    if data is None or raw is None:
        return False
    try:
        doc = json.loads(raw)
    except ValueError:
        return False
    return compiled_matches(doc, data) and compiled_lists_fresh(path)


def check_config(
    path: Optional[str] = None, default_runtime: bool = False
) -> Tuple[str, bytes, Config]:
    """Validate ``path`` as compile would, writing nothing: (path, its bytes, the config).

    A config a default runtime reads (``default_runtime``, or the mark beside it) must have
    require-allocation on and hold settings (:mod:`nvshim.node.configguard`).
    """
    from nvshim.node.configguard import guard_default, marked_default

    path = path or config_path()
    data = read_bytes(path)
    if data is None:
        raise ConfigError(f"config {path} does not exist; nothing to compile")
    config = parse_config_text(data, path)
    _check_roots(config, path)
    _check_runtimes(config, path)
    if marked_default(path):
        guard_default(path, data, config)
    elif default_runtime:
        guard_default(path, data, config, "--default-runtime")
    return path, data, config


def compile_config(path: Optional[str] = None, default_runtime: bool = False) -> str:
    """Validate ``path`` and write its compiled copy atomically; return the copy's path.

    ``default_runtime``: a default runtime reads ``path`` (install.sh --set-as-default):
    refused unless require-allocation is on, and the mark beside it written so every later
    compile applies the same guard. A refused config writes nothing.
    The node plan cache and the CDI index next to it are the runtime's:
    :func:`nvshim.node.compile.compile_node` writes all three.
    """
    path, data, config = check_config(path, default_runtime)
    if default_runtime:
        from nvshim.node.configguard import write_mark

        write_mark(path)
    doc = {
        "nvshim-version": __version__,
        "source": path,
        "source-text": data.decode("utf-8", errors="surrogateescape"),
        "config": config.to_mapping(),
    }
    out = compiled_path(path)
    text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    write_atomic(out, text.encode(), default_mode=0o644)
    os.chmod(out, 0o644)
    # The shell trampoline's view of the config (it cannot parse YAML or JSON): one entry
    # per line, read without word splitting or globbing.
    # They carry the YAML's mtime and sit next to a hard link to it: the trampoline
    # trusts them only while the YAML is that inode with that mtime
    # (see source_link_path).
    try:
        source = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"cannot stat config {path}: {exc.strerror}") from exc
    from nvshim.node.install.trampoline import ere_literal

    # the prefixes as grep -E literals: the trampoline's grep is -E, and the agent's
    # client (--scan) reads each line back as the literal it escapes
    prefixes = tuple(ere_literal(p) for p in config.annotation_prefixes)
    for target, values in ((runtimes_path(path), config.runtimes), (prefixes_path(path), prefixes)):
        write_atomic(target, "".join(f"{v}\n" for v in values).encode(), default_mode=0o644)
        os.chmod(target, 0o644)  # generated: never keep a looser mode found on an old copy
        os.utime(target, ns=(source.st_atime_ns, source.st_mtime_ns))
    _link_source(path)
    return out


def _check_roots(config: Config, path: str) -> None:
    """Refuse a ``driver-root`` or ``dev-root`` that is not a directory on this node.

    Checked here, once, and not at every create: a typo in either would otherwise show
    only at the first GPU container, as "this node has no GPUs".
    """
    problems = []
    for key, root in (("driver-root", config.driver_root), ("dev-root", config.dev_root)):
        if root is None:
            continue
        try:
            if stat.S_ISDIR(os.stat(root).st_mode):
                continue
            what = "is not a directory"
        except FileNotFoundError:
            what = "does not exist on this node"
        except OSError as exc:
            what = f"cannot be read: {exc.strerror}"
        problems.append(f'"{key}" is {json.dumps(root)}, which {what}')
    if problems:
        raise ConfigError(describe_problems(path, problems))


def _check_runtimes(config: Config, path: str) -> None:
    """Refuse a ``runtimes:`` entry, as found on this PATH, that others could have written
    (:func:`nvshim.files.executable_problem`): the sh trampoline execs the compiled list's
    runtimes after checking only who owns them (modes need a fork), so a list is never
    written for one Python would refuse."""
    from nvshim.files import executable_problem
    from nvshim.runtime.main import find_runtime

    for name in config.runtimes:
        found = find_runtime((name,), os.environ.get("PATH"))
        problem = executable_problem(found, "runtime") if found is not None else ""
        if problem:
            raise ConfigError(f"{problem} (runtimes: in {path})")


def _link_source(path: str) -> None:
    """(Re)create :func:`source_link_path` as a hard link to ``path``, atomically."""
    link = source_link_path(path)
    tmp = f"{link}.nvshim-{os.getpid()}"
    try:
        if os.path.samestat(os.stat(path), os.stat(link)):
            return  # already this inode (rename onto a hard link of itself does nothing)
    except FileNotFoundError:
        pass  # no link yet
    except OSError as exc:
        raise ConfigError(f"cannot stat {link}: {exc.strerror}") from exc
    try:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.link(path, tmp)
        os.replace(tmp, link)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass  # never created
        if exc.errno in (errno.EXDEV, errno.EPERM):
            # a YAML bind-mounted from elsewhere cannot be linked: without the link the
            # trampoline hands every call to Python (slower, never wrong; doctor says so)
            return
        raise ConfigError(f"cannot link {link} to {path}: {exc.strerror}") from exc
