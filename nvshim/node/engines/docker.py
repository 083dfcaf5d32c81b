"""Register nvshim as a Docker runtime in ``daemon.json``, and take it out again.

``nvshim runtime configure --runtime docker`` lands here. Docker has no drop-ins: the one
file ``/etc/docker/daemon.json`` gets ``runtimes.<name>.path`` (and, with
``--set-as-default``, ``default-runtime``; with ``--enable-cdi``, ``features.cdi``). The
file is a JSON object whose other keys, and their order, are kept; it is written back with
the indentation it had (4 spaces for a new file, as ``nvidia-ctk`` writes it).

``docker run --gpus`` needs a program named ``nvidia-container-runtime-hook`` on dockerd's
PATH when dockerd starts (else: ``could not select device driver "" with capabilities:
[[gpu]]``); dockerd then adds it to the spec as a prestart hook and appends
``NVIDIA_VISIBLE_DEVICES``/``NVIDIA_DRIVER_CAPABILITIES`` to the env. ``configure`` writes
nvshim's stand-in of that name beside ``--binary`` (:func:`gpus_hook_script`) unless one is
already on dockerd's PATH (NVIDIA's: kept, never replaced; a warning says so).
nvshim-runtime removes the hook from every ``--gpus`` container it runs and grants what
the env names (:mod:`nvshim.runtime.request`, source ``docker-gpus``); the stand-in runs
only for a container that did not go through nvshim (``--runtime runc --gpus all``) and
fails it with one line instead of letting it start without GPUs. It is one more file of the
backup: ``--revert`` removes it while it is still nvshim's.

Byte-exact revert, the backup and the default-runtime guard are shared with the other
engines through :mod:`nvshim.node.engines.files`. dockerd re-reads ``runtimes`` and
``default-runtime`` on ``SIGHUP``, but only keys present in the file: after a revert that
removed them (and for ``features``) dockerd must be restarted.

:func:`plan_configure` and :func:`plan_revert` are pure; :func:`configure` and
:func:`revert` read and write; :func:`read_runtimes` is for ``nvshim doctor``.

Why one module: Docker has one file, and everything nvshim does to it is here: the runtime
entry, the default runtime, CDI, and the --gpus hook stand-in that is one more entry of the
same backup. Configure and revert are two halves of one contract over daemon.json (what
configure writes, the revert takes out), which read best side by side.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from nvshim._record import dataclass
from nvshim.errors import ConfigError, UsageError
from nvshim.node.engines.files import (
    ConfigureOutcome,
    FileChange,
    RevertResult,
    apply_restore,
    backup_path,
    carry_out,
    check_binary,
    default_runtime_guard,
    load_backup,
    plan_restore,
    plan_revert_one,
    read_text,
)
from nvshim.node.install.prefix import DEFAULT_RUNTIME_PATH

__all__ = [
    "DEFAULT_BINARY",
    "DEFAULT_CONFIG",
    "DEFAULT_NAME",
    "DOCKERD_PATH",
    "GPUS_HOOK",
    "DockerRuntimes",
    "configure",
    "gpus_hook_script",
    "is_gpus_hook",
    "plan_configure",
    "plan_revert",
    "read_runtimes",
    "revert",
]

DEFAULT_CONFIG = "/etc/docker/daemon.json"
DEFAULT_NAME = "nvshim"
DEFAULT_BINARY = DEFAULT_RUNTIME_PATH
DOCKER_DEFAULT_RUNTIME = "runc"
_BACKUP_FORMAT = "nvshim-docker-backup/1"
# Docker takes any runtime name; one that also works as a RuntimeClass handler and a path
# component keeps `docker run --runtime NAME` unambiguous.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")

#: The program dockerd must find on its PATH to offer ``docker run --gpus``.
GPUS_HOOK = "nvidia-container-runtime-hook"
#: The PATH systemd gives dockerd (its default for services): where it looks for GPUS_HOOK.
DOCKERD_PATH: Tuple[str, ...] = (
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
)
#: The stand-in's second line (install.sh greps it to record the file in its manifest).
_HOOK_MARK = "# nvshim's stand-in, written by: nvshim runtime configure --runtime docker"


def gpus_hook_script(name: str) -> str:
    """nvshim's ``nvidia-container-runtime-hook``: fails the container it runs for, in one
    line naming the runtime ``name`` that ``--gpus`` needs."""
    line = (
        f"nvshim: docker run --gpus needs --runtime {name} (or {name} as Docker's "
        f"default runtime): this container's runtime is not {name}, so it would start "
        "without GPUs"
    )
    return (
        "#!/bin/sh\n"
        f"{_HOOK_MARK}\n"
        "# dockerd offers docker run --gpus only when a program of this name is on its PATH\n"
        "# when it starts, and adds it to each --gpus container as a prestart hook.\n"
        f"# nvshim-runtime removes that hook and gives the container its GPUs itself; this\n"
        "# runs only for a container started by another runtime, and fails it rather than\n"
        "# let it start without GPUs. nvshim runtime configure --revert removes this file.\n"
        f"echo '{line.replace(chr(39), chr(39) + chr(92) + chr(39) + chr(39))}' >&2\n"
        "exit 1\n"
    )


def is_gpus_hook(text: Optional[str]) -> bool:
    """Whether ``text`` is a stand-in hook nvshim wrote (any runtime name, any version)."""
    return text is not None and text.startswith("#!/bin/sh\n" + _HOOK_MARK + "\n")


def _hook_text(path: str) -> Tuple[bool, Optional[str]]:
    """(something is at ``path``, its text when it is nvshim's stand-in). NVIDIA's hook is a
    binary: read as bytes, never decoded whole."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 16)
    except FileNotFoundError:
        return os.path.lexists(path), None
    except OSError:
        return True, None
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return True, None
    return True, text if is_gpus_hook(text) else None


def _find_foreign_hook(hook_path: str, search: Sequence[str]) -> Optional[str]:
    """The first ``nvidia-container-runtime-hook`` that is not nvshim's, at ``hook_path`` or
    in a directory of ``search`` (dockerd's PATH); None when there is none."""
    for path in [hook_path] + [os.path.join(d, GPUS_HOOK) for d in search]:
        exists, ours = _hook_text(path)
        if exists and ours is None:
            return path
    return None


@dataclass(frozen=True)
class DockerRuntimes:
    """What ``daemon.json`` declares: runtime name → path, and the default runtime."""

    config_path: str
    runtimes: Mapping[str, Optional[str]]
    default_runtime: str


def _load(text: Optional[str], path: str) -> Dict[str, Any]:
    """The daemon.json object; ``{}`` for a missing or blank file.

    Python's json takes NaN, Infinity and 1e400 (as inf), which dockerd refuses and which
    would be written back as the non-JSON ``Infinity``; they are refused here.
    """
    if text is None or not text.strip():
        return {}

    def not_json(name: str) -> Any:
        raise ConfigError(f"{path}: invalid JSON: {name} is not a JSON value")

    def finite(literal: str) -> float:
        value = float(literal)
        if value in (float("inf"), float("-inf")):
            raise ConfigError(f"{path}: invalid JSON: number {literal} is out of range")
        return value

    try:
        data = json.loads(text, parse_constant=not_json, parse_float=finite)
    except ValueError as exc:
        raise ConfigError(f"{path}: invalid JSON: {exc}") from exc
    except RecursionError as exc:  # the C decoder recurses per [ and {
        raise ConfigError(f"{path}: invalid JSON: nested too deeply") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a JSON object (Docker's daemon.json is one)")
    return data


def _indent(text: Optional[str]) -> Any:
    """The indentation ``text`` uses for its first nested line (4 spaces when unknown)."""
    if text and text.strip() not in ("", "{}"):
        match = re.search(r"\n([ \t]+)\S", text)
        if match:
            unit = match.group(1)
            return unit if "\t" in unit else len(unit)
        if "\n" not in text.strip():
            return None  # a one-line file stays one line
    return 4


def _dumps(data: Mapping[str, Any], before: Optional[str]) -> str:
    indent = _indent(before)
    text = json.dumps(data, indent=indent, ensure_ascii=False)
    return text + "\n"


def _table(data: Mapping[str, Any], key: str, path: str) -> Optional[Dict[str, Any]]:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: {key} is not an object")
    return value


def _check_arguments(name: str, binary: str) -> None:
    if not _NAME.match(name):
        raise UsageError(
            f'runtime name "{name}" is not a plain name (letters, digits, "_", ".", "-", '
            "at most 63)"
        )
    if name == DOCKER_DEFAULT_RUNTIME:
        raise UsageError(
            f'runtime name "{name}" is reserved by Docker: dockerd refuses to '
            "start with a daemon.json that defines it"
        )
    check_binary(binary)


def plan_configure(
    text: Optional[str],
    *,
    config_path: str = DEFAULT_CONFIG,
    name: str = DEFAULT_NAME,
    binary: str = DEFAULT_BINARY,
    set_as_default: bool = False,
    force: bool = False,
    enable_cdi: bool = False,
    require_allocation: bool = False,
    hook_path: Optional[str] = None,
    hook_now: Optional[str] = None,
    foreign_hook: Optional[str] = None,
    search: Sequence[str] = DOCKERD_PATH,
) -> ConfigureOutcome:
    """The new daemon.json text for ``text`` (``None``: no file), and nvshim's
    ``--gpus`` hook at ``hook_path`` (``hook_now``: nvshim's hook there now, if any) unless
    ``foreign_hook`` names one that is not nvshim's on dockerd's PATH (``search``); pure."""
    _check_arguments(name, binary)
    warnings = default_runtime_guard(name, set_as_default, force, require_allocation)
    data = _load(text, config_path)
    before = json.loads(json.dumps(data))
    runtimes = _table(data, "runtimes", config_path)
    if runtimes is None:
        runtimes = data["runtimes"] = {}
    entry = runtimes.get(name)
    if entry is not None and not isinstance(entry, dict):
        raise ConfigError(f"{config_path}: runtimes.{name} is not an object")
    entry = dict(entry or {})
    entry["path"] = binary
    runtimes[name] = entry
    if set_as_default:
        data["default-runtime"] = name
    elif data.get("default-runtime") == name:
        del data["default-runtime"]
        warnings.append(
            f'removed "default-runtime": "{name}" from {config_path} '
            "(pass --set-as-default to keep it)"
        )
    if enable_cdi:
        features = _table(data, "features", config_path)
        if features is None:
            features = data["features"] = {}
        features["cdi"] = True
    after = text if data == before and text is not None else _dumps(data, text)
    files = [FileChange(config_path, text, after)]
    if foreign_hook is not None:
        warnings.append(
            f"kept {foreign_hook} (not nvshim's): it lets dockerd offer docker run "
            f"--gpus; nvshim-runtime removes its hook from the containers it runs "
            "and gives them their GPUs itself"
        )
    elif hook_path is not None:
        files.append(FileChange(hook_path, hook_now, gpus_hook_script(name), 0o755))
        where = os.path.dirname(hook_path)
        if where not in search:
            warnings.append(
                f"dockerd looks for {GPUS_HOOK} on its PATH ({':'.join(search)} "
                f"under systemd): docker run --gpus works only if it has {where}"
            )
    return ConfigureOutcome(
        engine="docker",
        handler_file=config_path,
        files=tuple(files),
        written=(),
        warnings=tuple(warnings),
        handlers=tuple(
            sorted(
                {name}
                | {
                    str(n)
                    for n, e in runtimes.items()
                    if isinstance(e, dict)
                    and isinstance(e.get("path"), str)
                    and os.path.basename(e["path"]).startswith("nvshim")
                }
            )
        ),
    )


def configure(
    config_path: str = DEFAULT_CONFIG,
    *,
    name: str = DEFAULT_NAME,
    binary: str = DEFAULT_BINARY,
    set_as_default: bool = False,
    force: bool = False,
    enable_cdi: bool = False,
    require_allocation: bool = False,
    dry_run: bool = False,
    search: Sequence[str] = DOCKERD_PATH,
) -> ConfigureOutcome:
    """Add the runtime to daemon.json and nvshim's ``--gpus`` hook beside ``binary`` (unless
    one not nvshim's is there or on dockerd's PATH, ``search``); the first write saves the
    original bytes."""
    config_path = os.path.abspath(config_path)
    hook_path = os.path.join(os.path.dirname(binary), GPUS_HOOK) if os.path.isabs(binary) else None
    plan = plan_configure(
        read_text(config_path, "Docker daemon.json"),
        config_path=config_path,
        name=name,
        binary=binary,
        set_as_default=set_as_default,
        force=force,
        enable_cdi=enable_cdi,
        require_allocation=require_allocation,
        hook_path=hook_path,
        hook_now=_hook_text(hook_path)[1] if hook_path is not None else None,
        foreign_hook=_find_foreign_hook(hook_path, search) if hook_path is not None else None,
        search=search,
    )
    return carry_out(plan, config_path, _BACKUP_FORMAT, dry_run, name)


def _strip(
    data: Dict[str, Any],
    name: str,
    original: Optional[Dict[str, Any]],
    path: str,
    warnings: List[str],
    shared: bool = True,
) -> None:
    """Take nvshim's entries out of ``data``; with ``original``, put back what it had.
    ``shared=False``: only runtime ``name`` and a default naming it (``features`` stays for
    the other runtimes)."""
    runtimes = _table(data, "runtimes", path)
    orig_runtimes = _table(original, "runtimes", path) if original is not None else None
    if runtimes is not None and name in runtimes:
        if orig_runtimes is not None and name in orig_runtimes:
            runtimes[name] = orig_runtimes[name]
        else:
            del runtimes[name]
        if not runtimes and (original is None or "runtimes" not in original):
            del data["runtimes"]
    if data.get("default-runtime") == name:
        previous = original.get("default-runtime") if original is not None else None
        if previous is not None:
            data["default-runtime"] = previous
        else:
            del data["default-runtime"]
    features = _table(data, "features", path) if shared else None
    if features is not None and "cdi" in features:
        orig_features = _table(original, "features", path) if original is not None else None
        if original is None:
            warnings.append(
                f"left features.cdi in {path}: without a backup nvshim cannot tell who set it"
            )
        elif orig_features is None or "cdi" not in orig_features:
            del features["cdi"]
            if not features and "features" not in original:
                del data["features"]


def plan_revert(
    current: Mapping[str, Optional[str]],
    backup: Optional[Mapping[str, Any]],
    *,
    config_path: str = DEFAULT_CONFIG,
    name: str = DEFAULT_NAME,
) -> RevertResult:
    """What revert leaves in daemon.json; pure (see
    :func:`nvshim.node.engines.files.plan_restore`)."""

    def strip(path: str, now: str, original: Optional[str], warnings: List[str]) -> str:
        data = _load(now, path)
        snapshot = json.loads(json.dumps(data))
        _strip(data, name, _load(original, path) if original is not None else None, path, warnings)
        return now if data == snapshot else _dumps(data, now)

    def others(path: str, now: Optional[str], original: Optional[str]) -> List[str]:
        if path != config_path or now is None:
            return []
        added = set(_table(_load(now, path), "runtimes", path) or {})
        added -= set(_table(_load(original, path), "runtimes", path) or {})
        return sorted(str(n) for n in added - {name})

    def strip_one(
        path: str, now: str, original: Optional[str], warnings: List[str]
    ) -> Optional[str]:
        if path != config_path:  # a --gpus hook: only the one naming this runtime goes
            return original if now == gpus_hook_script(name) else now
        data = _load(now, path)
        snapshot = json.loads(json.dumps(data))
        _strip(
            data,
            name,
            _load(original, path) if original is not None else None,
            path,
            warnings,
            shared=False,
        )
        return now if data == snapshot else _dumps(data, now)

    if backup is not None:
        one = plan_revert_one(current, backup, name=name, others=others, strip_one=strip_one)
        if one is not None:
            return one
        return plan_restore(current, backup, main_path=config_path, strip=strip)
    warnings = [
        f'no backup {backup_path(config_path)}: removing only runtime "{name}", '
        f"a default-runtime naming it and nvshim's {GPUS_HOOK} beside it"
    ]
    now = current.get(config_path)
    files: Tuple[FileChange, ...] = ()
    if now is not None:
        after = strip(config_path, now, None, warnings)
        if after != now:
            files = (FileChange(config_path, now, after),)
    files += tuple(
        FileChange(path, text, None)
        for path, text in current.items()
        if path != config_path and is_gpus_hook(text)
    )
    return RevertResult(
        files=files,
        restored=(),
        edited=tuple(change.path for change in files),
        removed=(),
        used_backup=False,
        warnings=tuple(warnings),
    )


def revert(
    config_path: str = DEFAULT_CONFIG, *, name: str = DEFAULT_NAME, dry_run: bool = False
) -> RevertResult:
    """Undo :func:`configure`: the original bytes from the backup, else strip nvshim's keys."""
    config_path = os.path.abspath(config_path)
    backup_file = backup_path(config_path)
    backup = load_backup(backup_file, _BACKUP_FORMAT)
    paths = [config_path] + (list(backup["files"]) if backup is not None else [])
    current: Dict[str, Optional[str]] = {}
    for path in dict.fromkeys(paths):
        # the hook's text only while it is nvshim's: one put there since (NVIDIA's) stays
        current[path] = (
            _hook_text(path)[1]
            if os.path.basename(path) == GPUS_HOOK
            else read_text(path, "Docker daemon.json")
        )
    if backup is None:
        entry = (
            _table(_load(current[config_path], config_path), "runtimes", config_path) or {}
        ).get(name)
        binary = entry.get("path") if isinstance(entry, dict) else None
        if isinstance(binary, str) and os.path.isabs(binary):
            hook = os.path.join(os.path.dirname(binary), GPUS_HOOK)
            current[hook] = _hook_text(hook)[1]
    plan = plan_revert(current, backup, config_path=config_path, name=name)
    if not dry_run:
        apply_restore(plan, backup, backup_file)
    return plan


def read_runtimes(config_path: str = DEFAULT_CONFIG) -> DockerRuntimes:
    """The runtimes daemon.json declares (name → path) and Docker's default runtime."""
    data = _load(read_text(config_path, "Docker daemon.json"), config_path)
    runtimes: Dict[str, Optional[str]] = {}
    for runtime_name, entry in (_table(data, "runtimes", config_path) or {}).items():
        path = entry.get("path") if isinstance(entry, dict) else None
        runtimes[str(runtime_name)] = path if isinstance(path, str) and path else None
    default = data.get("default-runtime")
    return DockerRuntimes(
        config_path=config_path,
        runtimes=runtimes,
        default_runtime=default if isinstance(default, str) and default else DOCKER_DEFAULT_RUNTIME,
    )
