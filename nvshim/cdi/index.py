"""The compiled index of the CDI spec directories: resolve a CDI name without reading,
let alone YAML-parsing, every spec on every create.

Without it a create that asks for ``nvidia.com/gpu=0`` loads every file of every spec
directory, and imports PyYAML (costly: BENCHMARKS.md) as soon as one of them is a
``.yaml`` — which the
README's own example writes. The index (``<config stem>.cdi-index.json``, next to the
compiled config) records, per spec file in CDI scan order: its ``stat`` signature, its
kind or the problems that made it unloadable, and for a YAML file its decoded document
in JSON form. A create then

- checks the index with ``stat`` calls (each spec directory and each file: adding,
  removing, renaming or editing a spec changes one of them);
- loads only the specs whose kind is one of the requested names' kinds: a JSON spec from
  its file, a YAML spec from the index (never importing yaml);
- builds the registry with CDI's priority and conflict rules
  (:func:`nvshim.cdi.registry.build_registry`), with the other files' recorded problems in place,
  so errors read exactly as with a full load.

A resident process (the agent) keeps the parsed index and the specs parsed from its YAML
documents (:class:`IndexMemo`, installed with the plan cache's memo): reused only while
``stat`` says the index file is the one parsed and it is still trusted; every check above
(format, key, each directory's and spec file's signature) still runs per create on it,
so the copy is dropped exactly when a fresh read would be; a JSON spec is read per create
as always.

A stale index is rebuilt incrementally (only changed files are parsed again, so yaml is
imported only when a YAML spec changed) and written atomically for the next create; a
missing, corrupt or unwritable index is never trusted and never fails a create, nor is
one that others could have written (it carries hooks and mounts: the config's ownership
and mode rule applies). It is also written by ``nvshim config compile``.

Spec files are held to the same rule (:mod:`nvshim.cdi.load`): a spec others could have
written is recorded with its problem and the device names it declares, never with its
content. A create cannot be fooled by a spec changed after the index was written: a JSON
spec is read again at create and judged on the descriptor it is read from; a YAML spec's
recorded document stands only while the file's and its directory's ``stat`` signatures
(inode, owner, group, mode, size, mtime, ctime: a chown or chmod changes them) still match,
and an entry is reused in a rebuild only when both do, so every verdict is made again
once either changed.

:func:`stale_specs` says which of the specs a create injects from no longer describe the
node (another driver's files, by :mod:`nvshim.cdi.stale`'s rule; device nodes the node
lacks or numbers differently): string checks, one ``stat`` per mount that is no library
(two ``readlink`` for a folder) and per injected device node, on the specs used only.
:func:`missing_mounts` finds the files a create would bind-mount from a spec that the
node no longer has (one ``stat`` per injected bind mount): runc would fail on them.

Why one module: the index is one format with one writer and its readers: built and saved at
compile, checked by stat and loaded on every create that names a CDI device, kept warm in
the agent (IndexMemo); its staleness answers (stale_specs, missing_mounts) read the same
records. Apart, the reader would drift from the writer, and a create would load two modules
to resolve one name.
"""

from __future__ import annotations

import os

from nvshim import _jsonc
from nvshim.cdi.load import UntrustedProblem, load_spec_file, parse_spec, read_document
from nvshim.cdi.names import parse_qualified_name
from nvshim.cdi.registry import build_registry, spec_files
from nvshim.cdi.stale import stale_reasons
from nvshim.errors import CdiError, CdiProblem, CdiSpecError, NvshimError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

    from nvshim.cdi.model import Registry, Spec

__all__ = [
    "FORMAT",
    "IndexMemo",
    "build",
    "indexed_document",
    "load",
    "missing_mounts",
    "regenerate_fix",
    "registry_for",
    "spec_reader",
    "refresh",
    "stale_specs",
    "use_memo",
]

FORMAT = 2  # 2: trust verdicts; signatures carry owner and group


def _sig(path: str) -> Optional[List[int]]:
    """The stat signature of ``path``; None when it cannot be stat'ed (missing, a symlink
    loop, no permission): the scan then records why, exactly as a full load would."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [
        st.st_ino,
        st.st_dev,
        st.st_mode,
        st.st_uid,
        st.st_gid,
        st.st_size,
        st.st_mtime_ns,
        st.st_ctime_ns,
    ]


def _key(spec_dirs: Sequence[str]) -> Dict[str, Any]:
    from nvshim import __version__

    return {"nvshim-version": __version__, "spec-dirs": list(spec_dirs)}


def _problems(items: Sequence[CdiProblem]) -> List[List[str]]:
    return [[p.path, p.json_path, p.message] for p in items]


def _entry(path: str, sig: Optional[List[int]]) -> Dict[str, Any]:
    """What the index records about one spec file (parses it: yaml for a .yaml file)."""
    entry: Dict[str, Any] = {"path": path, "sig": sig, "kind": None, "problems": [], "doc": None}
    try:
        raw = read_document(path, check_trust=True)
        spec = parse_spec(raw, path)
    except CdiSpecError as exc:
        entry["problems"] = _problems(exc.problems)
        untrusted = [p for p in exc.problems if isinstance(p, UntrustedProblem)]
        if untrusted:
            entry["untrusted"] = list(untrusted[0].devices)
        return entry
    entry["kind"] = spec.kind
    if path.endswith(".yaml"):
        try:
            text = _jsonc.dumps(raw, separators=(",", ":"))
            exact = _jsonc.loads(text) == raw
        except (TypeError, ValueError, RecursionError):
            exact = False  # a YAML-only value (a date, bytes): read the file when needed
        entry["doc"] = raw if exact else None
    return entry


def build(spec_dirs: Sequence[str], old: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The index of ``spec_dirs``; entries of ``old`` whose file and directory are
    unchanged are reused (a trust verdict depends on both)."""
    reuse: Dict[Tuple[str, str, str], Dict[str, Any]] = {}
    try:
        old_dirs = (old or {}).get("dirs", [])
        for entry in (old or {}).get("entries", ()):
            dir_sig = old_dirs[entry["rank"]]["sig"]
            reuse[(entry["path"], _jsonc.dumps(entry["sig"]), _jsonc.dumps(dir_sig))] = entry
    except (KeyError, IndexError, TypeError):
        reuse = {}  # a malformed old index: parse everything again
    dirs = []
    entries = []
    for rank, directory in enumerate(spec_dirs):
        problems: List[CdiProblem] = []
        dir_sig = _sig(directory)
        files = spec_files(directory, problems)
        dirs.append({"dir": directory, "sig": dir_sig, "problems": _problems(problems)})
        for path in files:
            sig = _sig(path)
            entry = reuse.get((path, _jsonc.dumps(sig), _jsonc.dumps(dir_sig))) or _entry(path, sig)
            entries.append(dict(entry, rank=rank))
    return {"format": FORMAT, "key": _key(spec_dirs), "dirs": dirs, "entries": entries}


def _fresh(doc: Any, spec_dirs: Sequence[str]) -> str:
    """Why ``doc`` is not a valid, current index of ``spec_dirs`` ("" when it is)."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return "no usable CDI index"
    if doc.get("key") != _key(spec_dirs):
        return "the CDI index is for other spec dirs or another nvshim version"
    try:
        for d in doc["dirs"]:
            if _sig(d["dir"]) != d["sig"]:
                return f"the CDI index is stale: {d['dir']} changed"
        for entry in doc["entries"]:
            if _sig(entry["path"]) != entry["sig"]:
                return f"the CDI index is stale: {entry['path']} changed"
    except (TypeError, KeyError):
        return "the CDI index is malformed"
    return ""


class IndexMemo:
    """A resident process's parsed copy of the CDI index file, and the specs parsed from
    the YAML documents it records (the agent's; a create has none).

    ``entry`` is what :func:`~nvshim.files.read_trusted_held` holds (path, the file's
    :func:`~nvshim.files.stat_signature` when read, the document); ``specs`` maps the id
    of an index entry to its parsed :class:`Spec`: the specs live and die with the
    document they were parsed from (:func:`~nvshim.cdi.load.parse_spec` reads nothing but
    its argument, so the same entry always gives the same spec).
    """

    def __init__(self) -> None:
        self.entry: Optional[Tuple[str, List[int], Any]] = None
        self.specs: Dict[int, Spec] = {}


#: Set by :func:`use_memo` in a resident process; None on the runtime's path.
_MEMO: Optional[IndexMemo] = None


def use_memo(memo: Optional[IndexMemo]) -> None:
    """Keep the parsed index in ``memo`` from now on (None: read the file each time)."""
    global _MEMO
    _MEMO = memo


def _read(path: str) -> Tuple[Optional[Any], str]:
    """The index document at ``path``, through the memo when one is in use (the same
    verdicts as :func:`~nvshim.files.read_trusted_cache` on the file as it is now)."""
    from nvshim.files import read_trusted_cache, read_trusted_held

    memo = _MEMO
    if memo is None:
        return read_trusted_cache(path, "CDI index")
    doc, why, held = read_trusted_held(path, "CDI index", memo.entry)
    if held is not memo.entry:  # another document: the specs parsed from the old one go
        memo.entry, memo.specs = held, {}
    return doc, why


def _parser(doc: Any) -> Callable[[Dict[str, Any]], Spec]:
    """parse_spec for the recorded documents of index ``doc``'s entries: through the
    memo when ``doc`` is the memo's document (each entry parsed once), else each time."""
    memo = _MEMO
    entry = memo.entry if memo is not None else None
    if memo is None or entry is None or entry[2] is not doc:
        return lambda e: parse_spec(e["doc"], e["path"])
    specs = memo.specs

    def parse(e: Dict[str, Any]) -> Spec:
        found = specs.get(id(e))
        if found is None:
            found = specs[id(e)] = parse_spec(e["doc"], e["path"])
        return found

    return parse


def load(path: str, spec_dirs: Sequence[str]) -> Tuple[Optional[Dict[str, Any]], str]:
    """(the index document, "") when ``path`` holds a fresh index; else (the document if
    it could be read — for incremental rebuilds — or None, why it is not usable)."""
    doc, why = _read(path)
    if why:
        return None, why
    return doc, _fresh(doc, spec_dirs)


def _save(path: str, doc: Dict[str, Any]) -> str:
    from nvshim.files import write_atomic

    try:
        write_atomic(
            path, (_jsonc.dumps(doc, separators=(",", ":")) + "\n").encode(), default_mode=0o644
        )
        os.chmod(path, 0o644)  # never keep a looser mode found on an old copy
    except OSError as exc:
        return f"not written: cannot chmod {path}: {exc.strerror}"
    except NvshimError as exc:
        return f"not written: {exc}"
    return f"written to {path}"


def _loaded(
    doc: Dict[str, Any],
    kinds: Optional[Set[str]],
) -> Iterable[Tuple[int, Any, List[CdiProblem]]]:
    """(rank, spec or None, problems) in scan order, loading only specs of ``kinds`` (every
    spec: None)."""
    parse = _parser(doc)
    by_rank: Dict[int, List[Dict[str, Any]]] = {}
    for entry in doc["entries"]:
        by_rank.setdefault(entry["rank"], []).append(entry)
    for rank, d in enumerate(doc["dirs"]):
        if d["problems"]:
            yield rank, None, [CdiProblem(*p) for p in d["problems"]]
        for entry in by_rank.get(rank, ()):
            if entry.get("untrusted") is not None:
                path, _, message = entry["problems"][0]
                yield rank, None, [UntrustedProblem(path, message, entry["untrusted"])]
                continue
            if entry["problems"]:
                yield rank, None, [CdiProblem(*p) for p in entry["problems"]]
                continue
            if kinds is not None and entry["kind"] not in kinds:
                continue  # cannot hold a requested device: not loaded
            try:
                if entry["doc"] is not None:  # trusted when indexed, unchanged since
                    yield rank, parse(entry), []
                else:  # read now, and judged on what is read
                    yield rank, load_spec_file(entry["path"], check_trust=True), []
            except CdiSpecError as exc:
                yield rank, None, exc.problems


def _kinds(names: Sequence[str]) -> Set[str]:
    """The CDI kinds ``names`` ask for (a malformed name none: resolve_devices reports it)."""
    kinds = set()
    for name in names:
        try:
            vendor, class_, _ = parse_qualified_name(name)
        except CdiError:
            continue
        kinds.add(f"{vendor}/{class_}")
    return kinds


def registry_for(
    spec_dirs: Sequence[str], names: Optional[Sequence[str]], index_path: Optional[str], save: bool
) -> Tuple[Registry, str]:
    """The registry for resolving ``names`` (only their kinds' specs loaded; every spec for
    None, as ``nvshim cdi list`` shows them), and where it came from. ``index_path`` None: no
    index (a full scan, as ``load_registry``)."""
    kinds = None if names is None else _kinds(names)
    if index_path is None:
        doc, why = None, "no CDI index location"
    else:
        doc, why = load(index_path, spec_dirs)
    source = f"CDI index {index_path}"
    if why:
        doc = build(
            spec_dirs,
            doc
            if isinstance(doc, dict)
            and doc.get("format") == FORMAT
            and doc.get("key") == _key(spec_dirs)
            else None,
        )
        source = f"CDI spec scan ({why}"
        if save and index_path is not None and os.path.isdir(os.path.dirname(index_path) or "."):
            source += f"; index {_save(index_path, doc)}"
        source += ")"
    if doc is None:  # load() gives a document whenever it gives no reason not to use one
        raise CdiError(f"{index_path}: CDI index unreadable")
    return build_registry(spec_dirs, _loaded(doc, kinds)), source


def indexed_document(path: str, spec_dirs: Sequence[str], index_path: str) -> Optional[Any]:
    """The decoded document of spec file ``path`` as a fresh index records it (a YAML spec
    read without yaml), or None: no fresh index, the file not in it, or recorded with a
    problem or without its document (JSON specs, YAML-only values): then read the file."""
    doc, why = load(index_path, spec_dirs)
    if why or doc is None:
        return None
    for entry in doc["entries"]:
        if entry["path"] == path and not entry["problems"]:
            return entry["doc"]
    return None


def spec_reader(spec_dirs: Sequence[str], index_path: Optional[str]) -> Callable[[str], Spec]:
    """:func:`~nvshim.cdi.load.load_spec_file` for several readers of the same spec files
    (doctor's checks): each file loaded once, a YAML spec that a fresh index records with
    its document parsed from that document (without yaml, which costs more than the rest
    of doctor); every other file read as ``load_spec_file`` reads it, with its errors."""
    documents: Dict[str, Any] = {}
    if index_path is not None:
        doc, why = load(index_path, spec_dirs)
        if not why and doc is not None:
            documents = {
                e["path"]: e["doc"]
                for e in doc["entries"]
                if not e["problems"] and e["doc"] is not None
            }
    loaded: Dict[str, Any] = {}

    def read(path: str) -> Spec:
        if path not in loaded:
            try:
                loaded[path] = (
                    parse_spec(documents[path], path) if path in documents else load_spec_file(path)
                )
            except CdiSpecError as exc:
                loaded[path] = exc
        result = loaded[path]
        if isinstance(result, CdiSpecError):
            raise result
        spec: Spec = result
        return spec

    return read


def refresh(spec_dirs: Sequence[str], index_path: str) -> str:
    """Rebuild and write the index (``nvshim config compile``)."""
    return _save(index_path, build(spec_dirs))


def _spec_mismatch(edits: Sequence[Any], driver_version: Optional[str]) -> List[str]:
    """Why one spec's injected ``edits`` (its own and its devices') do not match the node
    (empty: they do): driver files of another version (:func:`nvshim.cdi.stale.stale_reasons`),
    device nodes missing or numbered otherwise."""
    import stat

    reasons: List[str] = []
    if driver_version is not None:
        reasons += [
            why
            for why, _ in stale_reasons(
                [m for e in edits for m in e.mounts],
                [h for e in edits for h in e.hooks],
                driver_version,
            )
        ]
    missing: List[str] = []
    for node in dict.fromkeys(n for e in edits for n in e.device_nodes):
        try:
            st = os.stat(node.source)
        except (FileNotFoundError, NotADirectoryError):
            missing.append(node.source)
            continue
        except OSError:
            continue  # cannot tell (no permission): runc will say
        if node.major is None or node.minor is None:
            continue
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
            continue
        actual = (os.major(st.st_rdev), os.minor(st.st_rdev))
        if actual != (node.major, node.minor):
            reasons.append(
                f"{node.source} is {actual[0]}:{actual[1]} on the node, "
                f"{node.major}:{node.minor} in the spec"
            )
    if missing:
        shown = ", ".join(missing[:3]) + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
        reasons.append(f"{shown} {'does' if len(missing) == 1 else 'do'} not exist")
    return reasons


def regenerate_fix(path: str, driver_root: str = "") -> str:
    """How to make the spec at ``path`` current again, when nothing keeps it: the one fix
    text of every check (the create's ``stale-cdi-spec`` line, doctor, ``cdi generate
    --check``; :func:`nvshim.runtime.cdiedits.refresh_fix` picks between it and ``run nvshim
    cdi refresh``). ``driver_root``: one the config does not name ("" when it does)."""
    root = f" --driver-root {driver_root}" if driver_root else ""
    return f"regenerate it with nvshim cdi generate{root} --output {path}"


def stale_specs(
    registry: Registry,
    names: Sequence[str],
    driver_version: Optional[str],
    fix: Callable[[str], str] = regenerate_fix,
) -> List[str]:
    """One line per spec file that ``names`` inject from and that no longer matches the
    node: a driver file of another version than ``driver_version`` (None: not compared;
    any NVIDIA library named for a driver version, a library folder mounted whole, GSP
    firmware, a hook's ``--host-driver-version``), or an injected device
    node that does not exist or has other numbers; ``fix(spec path)`` ends it. Names the
    registry lacks are skipped (resolving them reports them)."""
    used: Dict[str, List[Any]] = {}
    for name in dict.fromkeys(names):
        resolved = registry.devices.get(name)
        if resolved is None:
            continue
        used.setdefault(resolved.spec.path, [resolved.spec.edits]).append(resolved.device.edits)
    lines = []
    for path, edits in used.items():
        reasons = _spec_mismatch(edits, driver_version)
        if reasons:
            lines.append(
                f"CDI spec {path} does not match this node ({'; '.join(reasons)}): {fix(path)}"
            )
    return lines


def _binds(mount: Any) -> bool:
    """Whether a CDI mount is a bind mount of a host file (its source must exist)."""
    return mount.host_path.startswith("/") and (
        mount.type in (None, "", "bind", "rbind")
        or "bind" in mount.options
        or "rbind" in mount.options
    )


def missing_mounts(
    registry: Registry, names: Sequence[str], injected: Sequence[Any]
) -> Optional[Tuple[str, List[str]]]:
    """(spec file, its missing host paths) for the first spec that ``names`` inject from
    and that bind-mounts a file the node does not have; None when every source exists.

    Only the ``injected`` mounts count (what is left once the container's capabilities cut
    the spec's files): a missing file the container would not get fails nothing.
    """
    wanted = {m.host_path for m in injected if _binds(m)}
    if not wanted:
        return None
    checked: Set[str] = set()
    for name in dict.fromkeys(names):
        resolved = registry.devices.get(name)
        if resolved is None:
            continue
        missing: List[str] = []
        for mount in (*resolved.spec.edits.mounts, *resolved.device.edits.mounts):
            path = mount.host_path
            if path not in wanted or path in checked:
                continue
            checked.add(path)
            try:
                os.stat(path)
            except (FileNotFoundError, NotADirectoryError):
                missing.append(path)
            except OSError:
                continue  # cannot tell (no permission, a loop): runc will say
        if missing:
            return resolved.spec.path, missing
    return None
