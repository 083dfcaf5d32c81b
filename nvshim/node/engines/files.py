"""Engine config files: read (and parse TOML), write with a byte-exact backup, restore.

``nvshim runtime configure`` edits containerd's, Docker's and CRI-O's config files; the
engine modules (:mod:`nvshim.node.engines.containerd`, :mod:`nvshim.node.engines.docker`,
:mod:`nvshim.node.engines.crio`) compute the new texts, and this module is the one place that
writes them and undoes the writes.

Before the first write the original bytes of every file that changes (or its absence), its
mode and the directories created for it are saved in ``<config><BACKUP_SUFFIX>`` (JSON).
:func:`plan_restore` then decides per file: still as nvshim wrote it → the original bytes
back (or the file removed when it did not exist); a secondary file (drop-in) changed since
→ restored or removed anyway, with a warning; the main file changed since → the engine's
``strip`` callback removes only nvshim's entries. :func:`apply_restore` does it.

Why one module: it is the one place that writes an engine's config files and undoes the
writes: the backup's format, the write that fills it and the restore that reads it are one
contract, and a reader and a writer kept apart drift apart. The checks at its end (the
default-runtime guard, handler names, the binary) are the ones every engine makes before
that write.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from nvshim._record import dataclass
from nvshim.errors import ConfigError, HostError, NvshimError, UsageError

if TYPE_CHECKING:
    from tomlkit.toml_document import TOMLDocument

__all__ = [
    "BACKUP_SUFFIX",
    "BOM",
    "FileChange",
    "ConfigureOutcome",
    "RevertResult",
    "backup_path",
    "configured_handlers",
    "read_text",
    "parse_toml",
    "read_toml",
    "sha256",
    "write_text",
    "remove_file",
    "load_backup",
    "write_changes",
    "carry_out",
    "plan_restore",
    "plan_revert_one",
    "apply_restore",
    "set_as_default_pitfall",
    "default_runtime_guard",
    "check_handler_name",
    "check_default_takeover",
    "check_binary",
]

BACKUP_SUFFIX = ".nvshim-orig.json"
#: A UTF-8 byte order mark as text: editors on Windows start files with it.
BOM = "\ufeff"
# Kubernetes requires a RuntimeClass handler to be a DNS label.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")

#: ``strip(path, now, original) -> new text``: nvshim's entries taken out of a main file
#: edited by hand since nvshim wrote it; ``original`` is the text before configure (or None).
StripFn = Callable[[str, str, Optional[str], List[str]], str]


@dataclass(frozen=True)
class FileChange:
    """One file's text before and after; ``None`` means the file does not exist."""

    path: str
    before: Optional[str]
    after: Optional[str]
    mode: int = 0o644
    """The mode of a file created (an existing file keeps its own)."""

    @property
    def changed(self) -> bool:
        """Whether writing ``after`` would change the file."""
        return self.before != self.after


@dataclass(frozen=True)
class ConfigureOutcome:
    """What an engine's ``configure`` did (or, with ``dry_run``, would do): the one result
    type of every engine (:mod:`nvshim.node.engines.api`)."""

    engine: str
    handler_file: str
    files: Tuple[FileChange, ...]
    written: Tuple[str, ...]
    warnings: Tuple[str, ...] = ()
    handlers: Tuple[str, ...] = ()
    """The nvshim runtimes ``handler_file`` holds afterwards, this one included, sorted."""
    version: Optional[int] = None
    """containerd: the config version (1, 2, 3); other engines: None."""
    cri_plugin: Optional[str] = None
    """containerd: the CRI plugin table written; other engines: None."""


@dataclass(frozen=True)
class RevertResult:
    """What a revert did: files restored byte for byte, edited, or removed."""

    files: Tuple[FileChange, ...]
    restored: Tuple[str, ...]
    edited: Tuple[str, ...]
    removed: Tuple[str, ...]
    used_backup: bool
    warnings: Tuple[str, ...] = ()
    kept_backup: bool = False
    """Only one runtime was taken out (others configure added stay): the backup stays, for
    their revert, with the new texts' hashes."""
    reverted: str = ""
    """With ``kept_backup``: the runtime taken out."""


def configured_handlers(config_path: str) -> Tuple[str, ...]:
    """The runtimes ``nvshim runtime configure`` recorded in ``config_path``'s backup (any
    engine's format); () without a backup or when it does not read."""
    try:
        text = read_text(backup_path(config_path), "backup file")
        data = json.loads(text) if text is not None else None
    except (NvshimError, ValueError, RecursionError):
        return ()
    handlers = data.get("handlers") if isinstance(data, dict) else None
    return tuple(h for h in handlers if isinstance(h, str)) if isinstance(handlers, list) else ()


def backup_path(config_path: str) -> str:
    """Where ``configure`` keeps the original bytes of the files it changes."""
    return config_path + BACKUP_SUFFIX


def read_text(path: str, what: str = "config file") -> Optional[str]:
    """The UTF-8 text of ``path``; ``None`` when it does not exist.

    Only a regular file is read (through symlinks): a FIFO would block the read forever
    and a device such as ``/dev/zero`` never ends, so both are a HostError instead.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise HostError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        kind = os.fstat(fd).st_mode
        if stat.S_ISDIR(kind):
            raise HostError(f"{path} is a directory, not a {what}")
        if not stat.S_ISREG(kind):
            raise HostError(f"{path} is not a regular file, so not a {what}")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read()
    except OSError as exc:
        raise HostError(f"cannot read {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from exc


def parse_toml(text: str, path: str) -> TOMLDocument:
    """``text`` as a tomlkit document; a ConfigError naming ``path`` when it is not TOML.

    A leading UTF-8 byte order mark is skipped, as containerd skips it (it starts with
    such a file); :func:`nvshim.node.engines.containerd_toml.dump_toml` puts it back.
    """
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        return tomlkit.parse(text[1:] if text.startswith(BOM) else text)
    except TOMLKitError as exc:
        message = str(exc).replace(". at line", " at line")
        if message[1:2].islower():  # "Unexpected …" → "unexpected …"; "TOML …" stays
            message = message[:1].lower() + message[1:]
        raise ConfigError(f"{path}: invalid TOML: {message}") from exc


def read_toml(text: str, path: str) -> Dict[str, Any]:
    """``text`` as plain Python (dicts, lists), for reading only: nothing is written back.

    The stdlib's ``tomllib`` parses it (its import and parse cost a fraction of tomlkit's,
    which keeps comments and layout for the files configure edits); a text ``tomllib``
    refuses goes to :func:`parse_toml`, so a broken file fails with the same ConfigError,
    and one only tomlkit accepts reads as before. A leading byte order mark is skipped.
    """
    if not text.strip():
        return {}
    import tomllib

    try:
        return tomllib.loads(text[1:] if text.startswith(BOM) else text)
    except tomllib.TOMLDecodeError:
        doc: Dict[str, Any] = parse_toml(text, path).unwrap()
        return doc


def sha256(text: Optional[str]) -> Optional[str]:
    """Hex SHA-256 of ``text`` as UTF-8; ``None`` for ``None``."""
    import hashlib

    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def _mode(path: str) -> Optional[int]:
    try:
        return os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise HostError(f"cannot stat {path}: {exc.strerror}") from exc


def _make_parents(path: str) -> List[str]:
    """Create the missing parent directories of ``path`` (0755); return them, outermost first."""
    missing: List[str] = []
    directory = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(directory):
        missing.append(directory)
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    missing.reverse()
    for directory in missing:
        try:
            os.mkdir(directory, 0o755)
        except FileExistsError:
            pass  # created meanwhile; what matters is that it exists
        except OSError as exc:
            raise HostError(f"cannot create directory {directory}: {exc.strerror}") from exc
    return missing


def write_text(path: str, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` atomically (mode kept, ``mode`` when new).

    A symlink is written through: an engine config that links to a file kept elsewhere
    (configuration management, a shared copy) is edited where it points and stays a link,
    so a revert restores the same file. Replacing the link itself would cut it.
    """
    from nvshim.files import write_atomic

    write_atomic(os.path.realpath(path), text.encode("utf-8"), default_mode=mode)


def remove_file(path: str) -> bool:
    """Unlink ``path`` itself, a symlink included (never the file it points to: a link
    put where nvshim's drop-in or backup was must not make a revert delete its target);
    ``False`` when it was already gone."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise HostError(f"cannot remove {path}: {exc.strerror}") from exc
    return True


#: What a backup's per-file entry may hold (each may be null): key, type, its name.
_ENTRY_FIELDS = (
    ("original", str, "a string"),
    ("mode", int, "an integer"),
    ("written_sha256", str, "a string"),
)


def load_backup(path: str, fmt: str) -> Optional[Dict[str, Any]]:
    """The backup at ``path`` (format tag ``fmt``), or ``None`` when there is none.

    Its shape is checked here, so a damaged backup is one ConfigError naming the field,
    never a crash halfway through a revert.
    """
    text = read_text(path, "backup file")
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{path}: invalid backup: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{path}: invalid backup: nested too deeply") from exc
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise ConfigError(f'{path}: not an nvshim backup (format is not "{fmt}")')
    files = data.get("files")
    if not isinstance(files, dict):
        raise ConfigError(f"{path}: invalid backup: files is not an object")
    for name, entry in files.items():
        where = f"{path}: invalid backup: files[{json.dumps(name)}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} is not an object")
        for key, kind, what in _ENTRY_FIELDS:
            if entry.get(key) is not None and (
                not isinstance(entry[key], kind) or isinstance(entry[key], bool)
            ):
                raise ConfigError(f"{where}.{key} is not {what}")
    handlers = data.setdefault("handlers", [])
    if not isinstance(handlers, list) or not all(isinstance(h, str) for h in handlers):
        raise ConfigError(f"{path}: invalid backup: handlers is not a list of names")
    dirs = data.setdefault("created_dirs", [])
    if not isinstance(dirs, list) or not all(isinstance(d, str) for d in dirs):
        raise ConfigError(f"{path}: invalid backup: created_dirs is not a list of paths")
    return data


def write_changes(
    backup_file: str, fmt: str, changes: Sequence[FileChange], handler: str = ""
) -> Tuple[str, ...]:
    """Write ``changes`` in order, first recording their originals in ``backup_file``.

    A file already in the backup keeps its first original, so configure run twice still
    reverts to the bytes from before the first run. Returns the paths written. When a
    write fails, what was already written is put back (the files, the backup, the
    directories made) before the error is raised: a drop-in must not stay behind when the
    main file that imports it could not be written.
    """
    changes = [change for change in changes if change.changed]
    if not changes:
        return ()
    backup_before = read_text(backup_file, "backup file")
    backup = load_backup(backup_file, fmt) or {"format": fmt, "files": {}, "created_dirs": []}
    for change in changes:
        entry = backup["files"].setdefault(
            change.path, {"original": change.before, "mode": _mode(change.path)}
        )
        entry["written_sha256"] = sha256(change.after)
    if handler:  # doctor checks that the engine still loads every runtime named here
        backup["handlers"] = sorted(set(backup.get("handlers", [])) | {handler})
    created: List[str] = []
    for change in changes + [FileChange(backup_file, None, "")]:
        created += _make_parents(change.path)
    known = backup["created_dirs"]
    backup["created_dirs"] = known + [d for d in created if d not in known]
    done: List[FileChange] = []
    try:
        write_text(backup_file, json.dumps(backup, indent=2, sort_keys=True) + "\n", 0o600)
        done.append(FileChange(backup_file, backup_before, ""))
        for change in changes:
            if change.after is None:
                remove_file(change.path)
            else:
                write_text(change.path, change.after, change.mode)
            done.append(change)
    except HostError as exc:
        left = _undo(done, created)
        if left:
            raise HostError(f"{exc}; could not put back {', '.join(left)}") from exc
        raise
    return tuple(change.path for change in changes)


def _undo(done: Sequence[FileChange], created: Sequence[str]) -> List[str]:
    """Give every file of ``done`` its ``before`` back, newest first, then remove the
    directories in ``created``; the paths that could not be put back."""
    left: List[str] = []
    for change in reversed(done):
        try:
            if change.before is None:
                remove_file(change.path)
            else:
                write_text(change.path, change.before)
        except HostError:
            left.append(change.path)  # reported with the error that started the undo
    for directory in reversed(created):
        try:
            os.rmdir(directory)
        except OSError:
            continue  # not empty (a file we could not remove), or gone: left as it is
    return left


def carry_out(
    plan: ConfigureOutcome, config_path: str, fmt: str, dry_run: bool, name: str = ""
) -> ConfigureOutcome:
    """``plan`` as planned (``dry_run``), or written after backing up the originals next to
    ``config_path`` (and recording the runtime ``name`` there, for doctor): the one tail of
    every engine's ``configure``."""
    if dry_run:
        return plan
    from nvshim._record import replace

    written = write_changes(backup_path(config_path), fmt, plan.files, name)
    result: ConfigureOutcome = replace(plan, written=written)
    return result


def plan_restore(
    current: Mapping[str, Optional[str]],
    backup: Mapping[str, Any],
    *,
    main_path: str,
    strip: StripFn,
) -> RevertResult:
    """What restoring from ``backup`` does to each file; pure.

    ``current`` maps every file in the backup to its text now. The main file comes first
    in the result, so it never refers to a drop-in that is already gone.
    """
    warnings: List[str] = []
    files: List[FileChange] = []
    restored: List[str] = []
    edited: List[str] = []
    removed: List[str] = []
    main_abs = os.path.abspath(main_path)
    entries: Mapping[str, Any] = backup["files"]
    for path in sorted(entries, key=lambda p: os.path.abspath(p) != main_abs):
        entry = entries[path]
        now = current.get(path)
        original = entry.get("original")
        if now == original:
            continue
        if sha256(now) == entry.get("written_sha256"):
            files.append(FileChange(path, now, original))
            (restored if original is not None else removed).append(path)
            continue
        if os.path.abspath(path) != main_abs:
            if now is not None and original is None:
                warnings.append(f"{path} changed since nvshim wrote it; removing it anyway")
                files.append(FileChange(path, now, None))
                removed.append(path)
            elif now is not None:
                warnings.append(f"{path} changed since nvshim wrote it; restoring its original")
                files.append(FileChange(path, now, original))
                restored.append(path)
            continue
        if now is None:
            warnings.append(f"{path} was removed since nvshim wrote it; leaving it absent")
            continue
        warnings.append(f"{path} changed since nvshim wrote it; removing only nvshim's entries")
        after = strip(path, now, original, warnings)
        if after != now:
            files.append(FileChange(path, now, after))
            edited.append(path)
    return RevertResult(
        files=tuple(files),
        restored=tuple(restored),
        edited=tuple(edited),
        removed=tuple(removed),
        used_backup=True,
        warnings=tuple(warnings),
    )


#: ``others(path, now, original) -> names``: the runtimes configure added to one file (in
#: ``now``, not in ``original``), less the one being reverted.
OthersFn = Callable[[str, Optional[str], Optional[str]], Sequence[str]]
#: ``strip_one(path, now, original, warnings) -> text``: ``now`` without the one runtime
#: (and a default naming it), everything shared with the other runtimes kept; None: remove.
StripOneFn = Callable[[str, str, Optional[str], List[str]], Optional[str]]


def plan_revert_one(
    current: Mapping[str, Optional[str]],
    backup: Mapping[str, Any],
    *,
    name: str,
    others: OthersFn,
    strip_one: StripOneFn,
) -> Optional[RevertResult]:
    """Reverting ``name`` while the backup's files still hold other runtimes configure
    added (``--name``): take out only ``name``'s entries and keep the backup for the others;
    None when no other runtime is left, so the whole backup is restored. Pure."""
    entries: Mapping[str, Any] = backup["files"]
    left = sorted(
        {
            other
            for path in entries
            for other in others(path, current.get(path), entries[path].get("original"))
        }
    )
    if not left:
        return None
    warnings: List[str] = []
    files: List[FileChange] = []
    for path in entries:
        now = current.get(path)
        if now is None:
            continue
        after = strip_one(path, now, entries[path].get("original"), warnings)
        if after != now:
            files.append(FileChange(path, now, after))
    return RevertResult(
        files=tuple(files),
        restored=(),
        edited=tuple(c.path for c in files if c.after is not None),
        removed=tuple(c.path for c in files if c.after is None),
        used_backup=True,
        warnings=tuple(warnings),
        kept_backup=True,
        reverted=name,
    )


def apply_restore(
    plan: RevertResult, backup: Optional[Mapping[str, Any]], backup_file: str
) -> None:
    """Carry out ``plan``; with a backup, also remove the directories configure created and
    the backup itself."""
    for change in plan.files:
        if change.after is None:
            remove_file(change.path)
            continue
        mode = None
        if backup is not None and change.path in backup["files"]:
            mode = backup["files"][change.path].get("mode")
        write_text(change.path, change.after, mode if isinstance(mode, int) else 0o644)
    if backup is None:
        return
    if plan.kept_backup:  # the other runtimes' revert still needs it, with the new texts
        kept = json.loads(json.dumps(backup))
        for change in plan.files:
            if change.path in kept["files"]:
                kept["files"][change.path]["written_sha256"] = sha256(change.after)
        kept["handlers"] = [h for h in kept.get("handlers", []) if h != plan.reverted]
        write_text(backup_file, json.dumps(kept, indent=2, sort_keys=True) + "\n", 0o600)
        return
    remove_file(backup_file)
    for directory in reversed(backup.get("created_dirs", [])):
        try:
            os.rmdir(directory)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST):
                raise HostError(f"cannot remove directory {directory}: {exc.strerror}") from exc


def set_as_default_pitfall(name: str) -> str:
    """The one-line explanation of why nvshim as the default runtime needs require-allocation."""
    return (
        f'pods without a GPU request would run through "{name}" and a CUDA image\'s '
        "NVIDIA_VISIBLE_DEVICES=all would give them every GPU"
    )


def default_runtime_guard(
    name: str, set_as_default: bool, force: bool, require_allocation: bool, config: str = ""
) -> List[str]:
    """Refuse making ``name`` an engine's default runtime while require-allocation is off.

    The same rule for every engine: with ``force`` the refusal becomes a warning (returned).
    ``config`` names the config that was read (default: "nvshim's config").
    """
    if not set_as_default or require_allocation:
        return []
    if not force:
        where = f"in {config}" if config else "in nvshim's config"
        raise UsageError(
            f'refusing to make "{name}" the default runtime while require-allocation is '
            f"off {where}: {set_as_default_pitfall(name)}; set "
            f"require-allocation: true{' in ' + config.split(',')[0] if config else ''} "
            "or pass --force"
        )
    return [
        f'"{name}" is the default runtime while require-allocation is off: '
        + set_as_default_pitfall(name).replace("would", "will")
    ]


def check_default_takeover(
    name: str, defaults: Sequence[str], set_as_default: bool, engine: str
) -> None:
    """Refuse a runtime name that would take over the engine's default runtime handler.

    ``defaults``: the handler(s) the engine will run by default once nvshim's edit is made
    (``runc`` unless a config names another). nvshim's handler written under that name
    sends every container through nvshim-runtime: what ``--set-as-default`` does, but past
    its require-allocation guard.
    """
    if set_as_default or name not in defaults:
        return
    raise UsageError(
        f'runtime name "{name}" is {engine}\'s default runtime: nvshim-runtime under that '
        "name would run every container, past the require-allocation check of "
        "--set-as-default; choose another --name, or pass --set-as-default"
    )


def check_handler_name(name: str) -> None:
    """Refuse a CRI runtime handler name a Kubernetes RuntimeClass could not name."""
    if not _DNS_LABEL.match(name):
        raise UsageError(
            f'runtime name "{name}" is not a DNS label (lower-case letters, digits and "-", '
            "at most 63): Kubernetes RuntimeClass handlers must be"
        )


def check_binary(binary: str) -> None:
    """Refuse a runtime binary that is not an absolute path (engines do not search PATH)."""
    if not os.path.isabs(binary):
        raise UsageError(f'runtime binary "{binary}" is not an absolute path')
