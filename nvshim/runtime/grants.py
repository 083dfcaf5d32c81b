"""The node's grant journal: one JSON line per GPU grant, and what is still held.

The runtime appends a record at ``create`` (:func:`append_grant`), before it execs runc;
nothing is written on passthrough commands, so whether a grant is still live is decided
when the journal is read (:func:`nvshim.node.holders.live_grants`): the container's state
directory under the runtime's ``--root`` and ``<runtime> state``.

Crash safety: a record is one ``write()`` of one whole line to an ``O_APPEND`` file.
Appends hold a ``flock`` on the journal's directory, and one on the journal (what older
nvshims lock), only for that write (never across the exec of runc). A killed writer
(kill -9, OOM) cannot tear the line: once ``write()`` returns it is in the page cache. A
line cut short by a power loss is skipped by the reader, and the next append first ends it
with a newline so a later record is never glued onto it.

Bounded: when the file passes ``grants-journal-max-bytes`` the appender rewrites it (temp
file, fsync, rename) with only the records of containers that still exist or are younger
than two minutes, when that drops at least a quarter of it; a journal that cannot shrink
(a burst of creates, all young) is appended to as it is and compacted once they age.
Compaction never fails a create: the lock is the directory's, which a rename never
replaces, so no writer waits on a stale file, and a compaction that cannot write (disk
full) leaves the file as it was and the record is appended to it.

The append is not fsynced (an fsync on every GPU create: its cost in BENCHMARKS.md,
figures). The journal answers one question, which GPUs live containers hold, and liveness
is decided when it is read; a record that only a power loss can lose is the record of a
container that the same power loss killed (its process, and its state under ``/run``), so
it could never be reported live. Compaction, which replaces records that are not new,
stays durable.
"""

from __future__ import annotations

import os
import stat

from nvshim import _jsonc
from nvshim._record import dataclass
from nvshim.errors import HostError, one_line

# Appending a grant is on every GPU create: typing, json, subprocess and time are imported
# only by the code that reads, compacts or queries (their cost: BENCHMARKS.md, figures).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

__all__ = [
    "Grant",
    "append_grant",
    "read_grants",
    "container_exists",
    "default_root",
    "RECORD_VERSION",
    "NAME_MAX",
    "VALUE_MAX",
    "journaled",
]

RECORD_VERSION = 1
#: Records younger than this survive compaction even when their container has no state
#: directory yet (the runtime journals before runc creates it).
_YOUNG_S = 120.0
_DEFAULT_ROOTS = {"runc": "/run/runc", "crun": "/run/crun"}

#: The longest name a record keeps (a pod, namespace, container, UID, GPU, claim): a
#: Kubernetes object name's own limit, so the kubelet's names are never cut.
NAME_MAX = 253
#: The longest other container-controlled text a record keeps (a denial's reason).
VALUE_MAX = 1024


def journaled(text: str, limit: int = NAME_MAX) -> str:
    """What a record keeps of a value the container controls (its pod's names, what it
    asked, a reason quoting its env): escaped and cut by :func:`nvshim.errors.one_line`,
    so that no container can forge a line of the journal's readers or fill the journal
    with one value."""
    return one_line(text, limit)


def default_root(runtime: str) -> str:
    """Where runc/crun keep state when no ``--root`` is given."""
    return _DEFAULT_ROOTS.get(os.path.basename(runtime), "/run/runc")


@dataclass(frozen=True)
class Grant:
    """One journal record: which container got which GPUs, from what."""

    time: float
    container_id: str
    root: str
    runtime: str
    bundle: str
    source: str
    gpus: Tuple[str, ...]
    """GPU and MIG UUIDs granted."""
    shared: bool = False
    """The allocation named time-slicing replicas (``UUID::N``): sharing is intended."""
    verified: str = "none"
    """``kubelet`` (checked against its record), ``none``, ``unreachable`` (trusted),
    ``unidentified`` (not a CRI container: judged by allocation-sources) or ``privileged``
    (a privileged container, which holds every device: not asked)."""
    namespace: str = ""
    pod: str = ""
    pod_uid: str = ""
    container: str = ""
    claims: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    """(``namespace/claim``, the UUIDs it brings) of each DRA claim the kubelet listed for
    the container that injects a granted GPU: one GPU held through one shared claim by
    several containers is no conflict. Written only when there are some."""

    def to_line(self) -> bytes:
        """The record's JSON line. What the container controls (the pod's names, the GPU
        and claim names it led to) is :func:`journaled`; the engine's values (id, root,
        runtime, bundle: liveness is read from them) are written as given."""
        doc = {
            "v": RECORD_VERSION,
            "t": round(self.time, 3),
            "id": self.container_id,
            "root": self.root,
            "runtime": self.runtime,
            "bundle": self.bundle,
            "source": self.source,
            "gpus": [journaled(g) for g in self.gpus],
            "shared": self.shared,
            "verified": self.verified,
            "namespace": journaled(self.namespace),
            "pod": journaled(self.pod),
            "pod_uid": journaled(self.pod_uid),
            "container": journaled(self.container),
        }
        if self.claims:
            doc["claims"] = {
                journaled(claim): [journaled(u) for u in uuids] for claim, uuids in self.claims
            }
        ordered = dict(sorted(doc.items()))  # json.dumps(sort_keys=True) of a flat record
        return (_jsonc.dumps(ordered, separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Optional["Grant"]:
        """A record from a parsed line; None when it is not one of ours."""
        try:
            if doc.get("v") != RECORD_VERSION:
                return None
            gpus = doc["gpus"]
            if not isinstance(gpus, list) or not all(isinstance(g, str) for g in gpus):
                return None
            strings = {k: doc.get(k, "") for k in ("namespace", "pod", "pod_uid", "container")}
            if not all(isinstance(v, str) for v in strings.values()):
                return None
            claims = doc.get("claims") or {}
            if not isinstance(claims, dict) or not all(
                isinstance(v, list) and all(isinstance(u, str) for u in v) for v in claims.values()
            ):
                return None
            grant = cls(
                time=float(doc["t"]),
                container_id=str(doc["id"]),
                root=str(doc["root"]),
                runtime=str(doc["runtime"]),
                bundle=str(doc.get("bundle", "")),
                source=str(doc["source"]),
                gpus=tuple(gpus),
                shared=bool(doc.get("shared")),
                verified=str(doc.get("verified", "none")),
                **strings,
                claims=tuple((str(c), tuple(u)) for c, u in claims.items()),
            )
        except (KeyError, TypeError, ValueError):
            return None
        return grant


# --- writing ------------------------------------------------------------------------------


def _not_a_file(path: str, fd: int) -> Optional[str]:
    """Why the open ``fd`` cannot be the journal (None when it is a regular file).

    A FIFO or a device at the configured path would swallow the records (or, for the
    reader, block until a writer comes), so both sides refuse anything else."""
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        return None
    kind = (
        "a directory"
        if stat.S_ISDIR(mode)
        else "a FIFO"
        if stat.S_ISFIFO(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "not a regular file"
    )
    return f"{path} is {kind}"


def _open_journal(path: str, what: str = "grant") -> int:
    directory = os.path.dirname(path) or "."
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        # read-write: the torn-line check preads the last byte through the same fd.
        # O_NONBLOCK: opening a FIFO never waits (a regular file ignores the flag).
        fd = os.open(
            path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK, 0o644
        )
    except OSError as exc:
        raise HostError(
            f"cannot record the {what} in {path}: {exc.strerror} "
            "(config grants-journal; null turns the record off)"
        ) from exc
    why = _not_a_file(path, fd)
    if why is not None:
        os.close(fd)
        raise HostError(
            f"cannot record the {what}: {why} "
            "(config grants-journal must name a regular file; null turns it off)"
        )
    return fd


def _lock_directory(path: str, what: str = "grant") -> int:
    """A flock'ed fd of the journal's directory: the lock every append and compaction of
    this version holds. The directory stays while compaction renames a new journal over
    the old one, so a waiting writer never finds it has waited on a replaced file."""
    import fcntl

    directory = os.path.dirname(path) or "."
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise HostError(
            f"cannot record the {what} in {path}: {exc.strerror} "
            "(config grants-journal; null turns the record off)"
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by close(), before runc is exec'd
    except OSError:
        os.close(fd)
        raise
    return fd


def _lock_current(path: str, what: str = "grant") -> int:
    """A flock'ed fd of the journal that is still the file at ``path`` (not a compacted one).

    Under the directory lock only a writer of an older nvshim (which locks the file alone)
    can replace it between the open and the lock, so the loop ends at once in practice."""
    import fcntl

    for _ in range(100):
        fd = _open_journal(path, what)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released by close(), before runc is exec'd
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass  # renamed over between open and stat: take the new file
        except OSError:
            os.close(fd)
            raise
        os.close(fd)
    raise HostError(f"cannot record the {what} in {path}: the file keeps being replaced")


def append_line(
    path: str, line: bytes, max_bytes: int, compact: Callable[[str], bool], what: str = "grant"
) -> Optional[str]:
    """Append one whole line to the journal at ``path`` under its locks; first, when the
    file is past ``max_bytes``, ``compact(path)`` (True: it replaced the file).

    A compaction that fails (disk full, a read-only directory) never fails the append:
    its error comes back as a warning and the line is appended to the file as it is.
    Every fd is closed exactly once, whatever fails."""
    warning: Optional[str] = None
    try:
        lock = _lock_directory(path, what)
        try:
            fd = _lock_current(path, what)
            try:
                size = os.fstat(fd).st_size
                if size > max_bytes:
                    try:
                        replaced = compact(path)
                    except (HostError, OSError, ValueError) as exc:
                        replaced = False
                        why = exc.strerror if isinstance(exc, OSError) else str(exc)
                        warning = f"cannot compact {path} (record appended): {why}"
                    if replaced:
                        new_fd = _lock_current(path, what)  # fd stays ours until this succeeds
                        os.close(fd)
                        fd = new_fd
                        size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    line = b"\n" + line  # end a line a crash cut short; the reader skips it
                written = os.write(fd, line)
                if written != len(line):
                    raise HostError(f"cannot record the {what} in {path}: short write")
            finally:
                os.close(fd)
        finally:
            os.close(lock)
    except OSError as exc:
        raise HostError(f"cannot record the {what} in {path}: {exc.strerror}") from exc
    return warning


def append_grant(path: str, grant: Grant, max_bytes: int) -> Optional[str]:
    """Append one record (one write, no fsync: see the module docstring); compact the
    journal first when it is too big. Returns a warning when the compaction failed (the
    record is appended all the same), else None."""
    return append_line(path, grant.to_line(), max_bytes, _compact)


#: A compaction rewrites the journal only when it drops at least this share of its bytes:
#: one that cannot shrink (every record live or young) leaves the file in place, so the
#: appends of a burst are not each a rewrite, an fsync and a new inode.
_MIN_SHRINK = 4


def _compact(path: str) -> bool:
    """Rewrite the journal (locks held) with the records of existing containers or new
    ones; False (nothing written) when that would not shrink it by a quarter."""
    import time

    from nvshim.files import write_atomic

    data = read_journal_bytes(path) or b""
    now = time.time()
    latest: Dict[Tuple[str, str], Grant] = {}
    for g in _records(data):
        key = (g.root, g.container_id)
        latest.pop(key, None)
        if now - g.time < _YOUNG_S or container_exists(g):
            latest[key] = g
    kept = b"".join(g.to_line() for g in latest.values())
    if len(data) - len(kept) < len(data) // _MIN_SHRINK:
        return False
    write_atomic(path, kept)
    return True


# --- reading ------------------------------------------------------------------------------


def read_journal_bytes(path: str) -> Optional[bytes]:
    """The journal file's bytes; None when there is no file at ``path``.

    HostError when it cannot be read or is not a regular file: a FIFO would block the
    reader until a writer came, so the open is non-blocking and the type is checked first.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise HostError(f"cannot read the grant journal {path}: {exc.strerror}") from exc
    try:
        why = _not_a_file(path, fd)
        if why is not None:
            raise HostError(f"cannot read the grant journal: {why}")
        with open(fd, "rb", closefd=False) as fh:
            return fh.read()
    except OSError as exc:
        raise HostError(f"cannot read the grant journal {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)


def parse_record(raw: bytes) -> Optional[Grant]:
    """One journal line as a grant; None for a line that is not a record (torn, foreign)."""
    try:
        doc = _jsonc.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested past the limit
        return None
    return Grant.from_doc(doc) if isinstance(doc, dict) else None


def _records(data: bytes) -> List[Grant]:
    # the last part has no newline: a record cut short by a crash (or empty); skip it
    records = (parse_record(raw) for raw in data.split(b"\n")[:-1] if raw.strip())
    return [g for g in records if g is not None]


def read_grants(path: str) -> List[Grant]:
    """Every whole, well-formed record in order; torn or foreign lines are skipped."""
    data = read_journal_bytes(path)
    return [] if data is None else _records(data)


def container_exists(grant: Grant) -> bool:
    """Whether the grant's container still has its state directory under the runtime's root."""
    return os.path.isdir(os.path.join(grant.root, grant.container_id))
