"""The container's ld.so.cache: the image's entries merged with the injected libraries',
and an image's CUDA forward-compatibility folder put first when it is newer than the
host driver (:func:`compat_folder`).

A container that gets driver libraries needs them in its ``/etc/ld.so.cache`` (the
loader reads the cache, not the folders) and ``/etc/ld.so.conf.d/00-nvshim.conf`` naming
their folders, so that a later ``ldconfig`` in the container keeps them. This module
writes both inside the rootfs, through :mod:`nvshim.host.inroot` (nothing the image
controls is executed or followed out of the root), for the runtime before runc and for
the hook (:mod:`nvshim.runtime.rootwork` decides which).

The cache is the image's own, entry for entry (glibc-hwcaps entries and empty names
dropped), plus entries for the injected folders: a library's name, and its SONAME when
that differs. nvshim-runtime and the agent (:func:`update_ldcache` with a plan) add only
what the plan puts there (:data:`Planned`: what runc will mount, flags and SONAME read
from the host files by :func:`elf_info`, and nvshim's links to them), once per driver,
and take the image's own libraries from the image's own cache: none of the image's files
there is read. The createContainer hook (no plan) scans each folder in the root as
ldconfig would; the two differ only where the image's cache does not list a library of
its own in those folders (see :func:`update_ldcache`).

Start-up matters (this runs on every GPU create): ``os`` and nvshim's in-root and
ld.so.cache modules only.

CUDA forward compatibility: an image's newer ``libcuda`` goes before the host driver's.

A CUDA image built for a newer CUDA than the host driver supports can ship the CUDA
forward-compatibility package: ``/usr/local/cuda/compat/libcuda.so.<version>`` (with its
``libcuda.so.1`` link and friends), made to run on an older kernel driver. When the image
has exactly one ``libcuda.so.<major>.<minor>[.<patch>]`` there and its major version is
higher than the host driver's, that directory is put first in the container's loader
configuration (``/etc/ld.so.conf.d/00-nvshim.conf`` and the ld.so.cache), so
``libcuda.so.1`` resolves to the compat library; otherwise the host driver's libcuda stays
first (an older or equal compat library would only shadow the real driver). The reference
reads an ELF note of the compat library first and falls back to this major comparison;
nvshim uses the comparison alone.

Everything is read inside the container rootfs through :mod:`nvshim.host.inroot`: the image
controls this directory, so its symlinks cannot lead the check (or the cache) outside.

Why one module: the merged cache, the ld.so.conf.d file that keeps it across a later
``ldconfig`` and CUDA forward compatibility's folder put first decide one list of entries,
read the image's cache and folders through the same confined access, and run on every
GPU create, where one more module costs one more import.
"""

from __future__ import annotations

import errno
import os

from nvshim.errors import NvshimError, host_error
from nvshim.host import inroot as _inroot
from nvshim.host.ldcache import (
    HWCAP_EXTENSION,
    MEMO_BYTES,
    CacheEntry,
    build_ldcache,
    cache_flags,
    parse_ldcache,
    remember,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

    #: name in a folder → (cache flags, SONAME or None); a SONAME only for regular files
    Planned = Dict[str, Tuple[int, Optional[str]]]
    #: (cache flags, SONAME or None) of a regular file; None: not a library
    _Read = Optional[Tuple[int, Optional[str]]]
    #: a folder's planned entries and the ``.so`` names to look for (:func:`_planned_entries`)
    _Plan = Tuple[Tuple[CacheEntry, ...], Tuple[str, ...]]

__all__ = [
    "COMPAT_DIR",
    "LDCACHE",
    "LDCACHE_MAX_BYTES",
    "LDCACHE_HOOK_MAX_BYTES",
    "LargeImageCache",
    "LDCONF",
    "LDCONF_DROPIN",
    "MAX_FOLDER_LIBS",
    "compat_folder",
    "driver_major",
    "elf_info",
    "lib_name",
    "update_ldcache",
]

LDCACHE = "/etc/ld.so.cache"
LDCONF = "/etc/ld.so.conf"
LDCONF_DROPIN = "/etc/ld.so.conf.d/00-nvshim.conf"
LDCONF_DROPIN_DIR, _, _DROPIN = LDCONF_DROPIN.rpartition("/")
_ETC, _, _CONF_D = LDCONF_DROPIN_DIR.rpartition("/")
_LDCONF_NAME = LDCONF.rpartition("/")[2]
_LDCACHE_NAME = LDCACHE.rpartition("/")[2]
_LDCONF_DEFAULT = b"include /etc/ld.so.conf.d/*.conf\n"
#: The largest image ld.so.cache the runtime reads (host root, in the engine's cgroup).
#: Caches are tens to a few hundred KiB, a few MiB for images with tens of thousands of
#: libraries; each entry costs ~10 µs and ~1 KB to parse, merge and sort, so inroot's
#: general 64 MiB bound let an image hold every GPU create of it for ~40 s and ~1.8 GB
#: (2 million tiny entries). A larger cache is the createContainer hook's
#: (:class:`LargeImageCache`).
LDCACHE_MAX_BYTES = 4 << 20
#: The largest image ld.so.cache the hook reads: it runs in the container's cgroup, so an
#: image with a large cache pays for it in its own memory and start-up, not the engine's.
LDCACHE_HOOK_MAX_BYTES = 64 << 20


class LargeImageCache(NvshimError):
    """The image's ld.so.cache is larger than the runtime reads: the createContainer hook
    merges it (a signal :func:`nvshim.runtime.rootwork.prepare` turns into its fallback)."""


#: The most image libraries one folder's scan opens on the runtime path, where the one
#: image folder still scanned is a newer CUDA compat folder (the hook, in the container's
#: cgroup, scans without a bound). Each costs an open, an ELF header and a SONAME read
#: (~50 us) and a cache entry, so an image with a million lib*.so files held every GPU
#: create of it for about a minute. Past the bound the folder's files are left to the
#: image's own ld.so.cache (merged as always).
MAX_FOLDER_LIBS = 16384


def elf_info(path: str) -> Tuple[Optional[int], Optional[str]]:
    """(cache flags, DT_SONAME) of the host file ``path``; (None, None) if not a library."""
    from nvshim.host.elf import read_soname_fd

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None, None
    try:
        flags = _elf_flags(os.pread(fd, 20, 0))
        if flags is None:
            return None, None
        try:
            return flags, read_soname_fd(fd, path)
        except NvshimError:
            return flags, None
    except OSError:
        return None, None
    finally:
        os.close(fd)


def lib_name(name: str) -> bool:
    """Names ldconfig considers: ``lib*`` or ``ld-*`` with ``.so`` in them."""
    return name.startswith(("lib", "ld-")) and ".so" in name


def _elf_flags(header: bytes) -> Optional[int]:
    """Cache flags for an ELF file header, or None if not an ELF library we can label."""
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    machine = int.from_bytes(header[18:20], "little" if header[5] == 1 else "big")
    return cache_flags(header[4], machine)


def _soname(fd: int, head: bytes = b"") -> Optional[str]:
    """The DT_SONAME of the open (in-root) ELF file *fd*, or None (also when unreadable);
    *head*: what was already read from its offset 0."""
    from nvshim.host.elf import read_soname_fd  # only needed for regular files, not links

    try:
        return read_soname_fd(fd, head=head)
    except NvshimError:
        return None


#: ``_entry(CacheEntry, (key, value, flags, 0))``: an entry made without a Python-level
#: ``__new__`` call (a scan makes one or two per library of the folder).
_entry = tuple.__new__


def _folder_entries(
    root: _inroot.RootFd,
    folder: str,
    warnings: Optional[List[str]] = None,
    limit: Optional[int] = None,
) -> List[CacheEntry]:
    """Cache entries for the libraries in container directory *folder*, as ldconfig
    would list them: the hook's scan of each folder, and the runtime's of a newer compat
    folder (a folder the plan fills is :func:`_planned_entries`', read from nothing).

    Every ``lib*.so*`` name that is (or links, in the root, to) an ELF library gets an
    entry for itself; a regular file whose SONAME differs from its name also gets one for
    the SONAME (pointing at the SONAME link if the folder has it, else at the file). A
    folder holding more than *limit* of them is not read at all (a line in *warnings*
    says so).

    An image's library folder holds hundreds of libraries, so the folder is resolved in
    the root once and read below that fd: one ``getdents`` for the names and their types,
    each regular file opened directly in the folder (never through a symlink) and read
    once, and a link whose target is a name in the same folder (``libz.so.1 ->
    libz.so.1.2.13``, nearly all of them) answered from that file. A link through a path
    (Debian's ``libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13``) has that path's folder
    resolved in the root once per scan: when it is this very folder (same device and
    inode) the link is answered from the folder as well; only a link leading elsewhere is
    resolved from the root, as before.
    """
    dfd = _inroot.open_dir(root, folder)
    if dfd is None:
        return []
    try:
        return _scan_folder(root, folder, dfd, _inroot.dir_kinds(dfd), warnings, limit)
    finally:
        os.close(dfd)


def _scan_folder(
    root: _inroot.RootFd,
    folder: str,
    dfd: int,
    kinds: Mapping[str, str],
    warnings: Optional[List[str]],
    limit: Optional[int],
) -> List[CacheEntry]:
    """One pass over a folder's entries, as ldconfig makes it (:func:`_folder_entries`),
    unless the folder holds more than *limit* libraries (read by :func:`_folder_reader`)."""
    base = folder.rstrip("/") or ""
    if limit is not None and len(kinds) > limit:  # fewer names cannot be more libraries
        libs = sum(1 for name in kinds if lib_name(name))
        if libs > limit:
            if warnings is not None:
                warnings.append(
                    f"{folder} holds {libs} of the image's libraries, more than the "
                    f"{limit} read: only the image's own ld.so.cache lists them"
                )
            return []
    regular, link_flags = _folder_reader(root, dfd, base, kinds)
    out: List[CacheEntry] = []
    for name in sorted(kinds):
        if not lib_name(name):
            continue
        path = f"{base}/{name}"
        kind = kinds[name]
        if kind == "link":
            link = link_flags(name, path)
            if link is not None:
                out.append(_entry(CacheEntry, (name, path, link, 0)))
            continue
        got = regular(name) if kind == "file" else None
        if got is None:
            continue
        flags, soname = got
        out.append(_entry(CacheEntry, (name, path, flags, 0)))
        if soname and soname != name and "/" not in soname:
            value = f"{base}/{soname}" if soname in kinds else path
            out.append(_entry(CacheEntry, (soname, value, flags, 0)))
    return out


def _folder_reader(
    root: _inroot.RootFd, dfd: int, base: str, kinds: Mapping[str, str]
) -> Tuple[Callable[[str], _Read], Callable[[str, str], Optional[int]]]:
    """``regular(name)`` and ``link_flags(name, path)`` for one scan of the folder open
    below *dfd* (the container path *base*): each file and link of the folder is read at
    most once per scan, a folder a link names resolved once. Closures, not methods: they
    run once or twice per name of folders of hundreds of names."""
    read: Dict[str, _Read] = {}
    texts: Dict[str, Optional[str]] = {}  # link name → its text (None: unreadable)
    folders: Dict[str, bool] = {}  # a folder path a link names → whether it is this one
    here: List[Tuple[int, int]] = []  # this folder's (device, inode), once

    def regular(name: str) -> _Read:
        """(flags, SONAME) of the regular file *name* of the folder; None: not a library."""
        if name not in read:
            read[name] = None
            try:
                fd = _inroot.open_in_dir(dfd, name, f"{base}/{name}", listed=True)
            except OSError:
                return None
            try:
                head = os.pread(fd, 4096, 0)  # the ELF header and, nearly always, the
                flags = _elf_flags(head[:20])  # program headers: two reads fewer
                if flags is not None:
                    read[name] = (flags, _soname(fd, head))
            finally:
                os.close(fd)
        return read[name]

    def readlink(name: str) -> Optional[str]:
        """The text of the link *name* of the folder, read once (chains share links:
        ``libz.so -> libz.so.1 -> libz.so.1.3``)."""
        if name not in texts:
            try:
                texts[name] = os.readlink(name, dir_fd=dfd)
            except OSError:
                texts[name] = None
        return texts[name]

    def is_here(parent: str) -> bool:
        """Whether the container path *parent* resolves (in the root) to this folder."""
        known = folders.get(parent)
        if known is None:
            try:
                fd = _inroot.resolve_dir(root, parent)
            except OSError:
                fd = -1
            known = False
            if fd >= 0:
                try:
                    st = os.fstat(fd)
                finally:
                    os.close(fd)
                if not here:
                    own = os.fstat(dfd)
                    here.append((own.st_dev, own.st_ino))
                known = (st.st_dev, st.st_ino) == here[0]
            folders[parent] = known
        return known

    def link_flags(name: str, path: str) -> Optional[int]:
        """The flags of the library the link *name* leads to, None if it leads to none."""
        target = name
        for _ in range(_inroot.MAX_SYMLINKS):
            text = readlink(target)
            if text is None:
                return None
            target = text
            if "/" in target:
                parts = [
                    c
                    for c in (target if target[0] == "/" else f"{base}/{target}").split("/")
                    if c and c != "."
                ]
                if not parts or parts[-1] == "..":
                    return None  # names no file (open_file refuses it alike)
                if not is_here("/" + "/".join(parts[:-1])):
                    break  # elsewhere in the root: resolved from the root below
                target = parts[-1]
            kind = kinds.get(target)
            if kind == "file":
                got = regular(target)
                return None if got is None else got[0]
            if kind != "link":
                return None  # dangling, ".", "..", a directory, a FIFO: not a library
        else:
            return None  # a loop
        try:
            fd = _inroot.open_file(root, path)
        except OSError:
            return None
        try:
            return _elf_flags(os.pread(fd, 20, 0))
        finally:
            os.close(fd)

    return regular, link_flags


#: The planned entries of one folder, per driver: (folder, the plan's items) → (entries,
#: the ``.so`` names to look for in the image). Every create with the same driver plans the
#: same names: the resident agent computes them once. A pure function of its key (tuples
#: of strings and ints) shared by threads without a lock, as :data:`_MERGED`.
_PLANNED: Dict[Tuple[str, Tuple[Tuple[str, Tuple[int, Optional[str]]], ...]], _Plan] = {}


def _planned_entries(folder: str, planned: Planned) -> _Plan:
    """(entries, dev names) of the planned names of *folder*, remembered per driver.

    Each planned name gets an entry with the plan's flags, and a planned file whose SONAME
    differs from its name one for the SONAME (pointing at the SONAME link when the plan
    makes it, else at the file). The dev names are the ``.so`` names of the planned
    libraries that the plan does not make (``libnvidia-cfg.so`` for
    ``libnvidia-cfg.so.1``): an image may hold such a link to a planned name
    (:func:`_dev_links`)."""
    key = (folder, tuple(planned.items()))
    found = _PLANNED.get(key)
    if found is not None:
        return found
    base = folder.rstrip("/") or ""
    out: List[CacheEntry] = []
    dev: Dict[str, None] = {}
    for name in sorted(planned):
        if not lib_name(name):
            continue
        flags, soname = planned[name]
        path = f"{base}/{name}"
        out.append(_entry(CacheEntry, (name, path, flags, 0)))
        if soname and soname != name and "/" not in soname:
            value = f"{base}/{soname}" if soname in planned else path
            out.append(_entry(CacheEntry, (soname, value, flags, 0)))
        stem = name[: name.find(".so") + 3]
        if stem != name and stem not in planned and lib_name(stem):
            dev[stem] = None
    found = (tuple(out), tuple(dev))
    remember(_PLANNED, key, found)
    return found


def _dev_links(
    root: _inroot.RootFd, folder: str, planned: Planned, names: Sequence[str]
) -> List[CacheEntry]:
    """Entries for the image's links among *names* in *folder* that name a planned name
    of that folder: ``libcuda.so -> libcuda.so.1`` shipped by the image, dangling until
    nvshim makes ``libcuda.so.1``. One ``readlinkat`` per name in the folder resolved in
    the root (nothing is opened or followed); a link's text is answered from the plan
    when it is a bare name or a path whose folder is this one (by its path, or resolved
    in the root to the same directory); anything else gets no entry (the image's own
    targets are its cache's business)."""
    if not names:
        return []
    dfd = _inroot.open_dir(root, folder)
    if dfd is None:
        return []
    base = folder.rstrip("/") or ""
    out: List[CacheEntry] = []
    try:
        for name in names:
            try:
                text = os.readlink(name, dir_fd=dfd)
            except OSError:
                continue  # none there (nearly every image), or not a link
            parent, _, target = text.rpartition("/")
            if target not in planned:
                continue
            if "/" in text and not _same_folder(root, dfd, base, parent):
                continue
            out.append(_entry(CacheEntry, (name, f"{base}/{name}", planned[target][0], 0)))
    finally:
        os.close(dfd)
    return out


def _same_folder(root: _inroot.RootFd, dfd: int, base: str, parent: str) -> bool:
    """Whether the link text's folder *parent* (relative to *base* unless absolute) is
    the folder open at *dfd*: by its path, else resolved in the root."""
    parts = [c for c in (parent if parent.startswith("/") else f"{base}/{parent}").split("/")]
    path = "/" + "/".join(c for c in parts if c and c != ".")
    if path == (base or "/"):
        return True
    try:
        fd = _inroot.resolve_dir(root, path)
    except OSError:
        return False
    try:
        there, here = os.fstat(fd), os.fstat(dfd)
    finally:
        os.close(fd)
    return (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino)


def _merge(existing: Sequence[CacheEntry], added: Sequence[CacheEntry]) -> List[CacheEntry]:
    """*added* plus the *existing* entries they do not replace (same name and flags).

    glibc-hwcaps entries (hwcap bit 62) are dropped: their subdirectory table is not
    rewritten, and ld.so falls back to the baseline entry of the same library. So are
    entries with an empty name or path (an image's cache can hold them; no lookup ever
    matches one, and :func:`build_ldcache` cannot write them).
    """
    # entries are (key, value, flags, hwcap) tuples: index, not attribute, per entry
    replaced = {(e[0], e[2]) for e in added}
    seen = set()
    out: List[CacheEntry] = []
    for entry in list(added) + [
        e
        for e in existing
        if not e[3] & HWCAP_EXTENSION and e[0] and e[1] and (e[0], e[2]) not in replaced
    ]:
        if entry not in seen:  # the whole tuple: same name, path, flags and hwcap
            seen.add(entry)
            out.append(entry)
    return out


#: The last merged caches written: (the image's cache bytes, the folders' entries) → (the
#: bytes to write, the warnings of the image's cache). Every create of an image with the
#: same driver merges the same two lists: the resident agent parses, merges, sorts and
#: encodes them once, and on a hit does none of it (the key is the file's bytes, not its
#: ~500 parsed entries). Keys hold bytes and CacheEntry tuples, values bytes and strings:
#: a pure function shared by threads without a lock (see
#: :func:`nvshim.host.ldcache.remember`).
_MERGED: Dict[Tuple[Optional[bytes], Tuple[CacheEntry, ...]], Tuple[bytes, Tuple[str, ...]]] = {}


def _merged_cache(
    old: Optional[bytes], added: Sequence[CacheEntry]
) -> Tuple[bytes, Tuple[str, ...]]:
    """(the cache to write, warnings): the image's cache *old* (None: none) parsed and
    merged with *added* (:func:`_merge`) in *old*'s layout, remembered."""
    key = (old, tuple(added))
    found = _MERGED.get(key)
    if found is not None:
        return found
    existing: Sequence[CacheEntry] = ()
    warnings: Tuple[str, ...] = ()
    if old:
        try:
            existing = parse_ldcache(old)
        except NvshimError as exc:
            warnings = (f"ignoring the image's {LDCACHE}: {exc}",)
    layout = "compat" if old and old.startswith(b"ld.so-1.7.0") else "new"
    found = (build_ldcache(_merge(existing, added), layout), warnings)
    if len(found[0]) <= MEMO_BYTES and (old is None or len(old) <= MEMO_BYTES):
        remember(_MERGED, key, found)
    return found


# CUDA forward compatibility: the image's compat folder first

COMPAT_DIR = "/usr/local/cuda/compat"
# compiled only for an image that has the compat dir (re's import cost: BENCHMARKS.md, figures)
_COMPAT_LIBCUDA = r"^libcuda\.so\.([0-9]+)\.[0-9]+(?:\.[0-9]+)?$"


def driver_major(version: str) -> Optional[int]:
    """``550`` for ``550.54.15``; None when ``version`` does not start with a number."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def compat_folder(root: _inroot.RootFd, host_driver_version: str) -> Optional[str]:
    """:data:`COMPAT_DIR` when the image's compat libcuda is newer than the host driver."""
    host = driver_major(host_driver_version)
    if host is None:
        return None
    try:
        names = _inroot.list_dir(root, COMPAT_DIR)
    except OSError:
        return None  # not a directory, a symlink loop, unreadable: no compat package
    if not names:
        return None
    import re

    majors = [int(m.group(1)) for m in (re.match(_COMPAT_LIBCUDA, n) for n in names) if m]
    if len(majors) != 1 or majors[0] <= host:
        return None
    return COMPAT_DIR


def update_ldcache(
    root: _inroot.RootFd,
    folders: Sequence[str],
    planned: Optional[Mapping[str, Planned]] = None,
    host_driver_version: Optional[str] = None,
) -> List[str]:
    """Make *folders* known to the container's dynamic loader; return warning lines.

    Writes the ld.so.conf drop-in (and ``/etc/ld.so.conf`` if missing), then the cache:
    the image's entries plus the entries of *folders*. Files are rewritten only when
    their content changes. OSError becomes :class:`HostError` (cause kept). With
    *host_driver_version*, an image's newer CUDA compat directory goes first
    (:func:`compat_folder`).

    With *planned* (nvshim-runtime before runc, and the agent: host root, in the engine's
    cgroup) the image's own libraries come from the image's own ld.so.cache: the entries
    of a folder are those of its planned names only (:func:`_planned_entries`, once per
    driver), plus an image ``.so`` link naming one of them (:func:`_dev_links`); none of
    the image's files there is opened or read. The image's libraries then resolve exactly
    as in the same container without a GPU (nvshim adds the driver's entries, replacing
    only an image entry of the same name and flags, and changes no other); nothing the
    image controls is read beyond its cache file, the loader files nvshim rewrites and
    the link texts :func:`_dev_links` reads (and a CUDA compat folder, listed by
    :func:`compat_folder` and, when its libcuda is newer, scanned as below, at most
    :data:`MAX_FOLDER_LIBS` libraries); and the cost no longer grows with the image's
    folders. An image cache over :data:`LDCACHE_MAX_BYTES` raises
    :class:`LargeImageCache`.

    Without *planned* (the createContainer hook, after runc's mounts, in the container's
    cgroup, where the image pays for its own folders and cache) every folder is scanned
    as ldconfig would (:func:`_folder_entries`: each ``lib*.so*`` name that is or leads
    to an ELF library), and a cache of up to :data:`LDCACHE_HOOK_MAX_BYTES` is read. The
    two sides write the same cache except for the image's own names in the injected
    folders that its cache does not list: libraries installed after its ``ldconfig`` ran,
    names ldconfig never lists (a library's full file name, its ``.so`` link), and an
    image link there leading to a driver library other than a ``.so`` link to a planned
    name (:func:`_dev_links`). The hook lists them; the runtime leaves them to glibc's
    default directories, as in the same container without a GPU.
    """
    compat = None
    if host_driver_version:
        compat = compat_folder(root, host_driver_version)
        if compat is not None and compat not in folders:
            folders = (compat, *folders)
    try:
        return _update_ldcache(root, folders, planned, compat)
    except OSError as exc:
        raise host_error(f"cannot update the ld.so.cache in {root.path}", exc) from exc


def _update_ldcache(
    root: _inroot.RootFd,
    folders: Sequence[str],
    planned: Optional[Mapping[str, Planned]],
    compat: Optional[str],
) -> List[str]:
    warnings: List[str] = []
    dropin = "".join(f"{folder}\n" for folder in folders).encode()
    dropin = b"# driver libraries injected by nvshim\n" + dropin
    # /etc resolved in the root once; each file below read and written through its fd
    etc = _inroot.resolve_dir(root, _ETC, create=True)
    try:
        conf_d = _inroot.child_dir(root, etc, _ETC, _CONF_D, create=True)
        try:
            if _inroot.read_file_in(root, conf_d, LDCONF_DROPIN_DIR, _DROPIN) != dropin:
                _inroot.write_file_in(conf_d, _DROPIN, dropin, 0o644, LDCONF_DROPIN, False)
        finally:
            os.close(conf_d)
        if _ldconf_missing(root, etc):
            _inroot.write_file_in(etc, _LDCONF_NAME, _LDCONF_DEFAULT, 0o644, LDCONF, False)
        old = _read_image_cache(root, etc, planned is not None)
        added: List[CacheEntry] = []
        for folder in folders:
            if planned is None:  # the hook: the folder as ldconfig would scan it
                added += _folder_entries(root, folder, warnings)
            elif folder == compat and folder not in planned:  # the image's compat folder
                added += _folder_entries(root, folder, warnings, MAX_FOLDER_LIBS)
            else:
                names = planned.get(folder) or {}
                entries, dev = _planned_entries(folder, names)
                added += entries
                added += _dev_links(root, folder, names, dev)
        data, more = _merged_cache(old, added)
        warnings += more
        if data != old:
            _inroot.write_file_in(etc, _LDCACHE_NAME, data, 0o644, LDCACHE, False)
    finally:
        os.close(etc)
    return warnings


def _ldconf_missing(root: _inroot.RootFd, etc: int) -> bool:
    """Whether the image has no ``/etc/ld.so.conf`` (*etc*: its /etc resolved in the
    root): one ``lstat``, where reading the file only to learn that it is there took six
    calls; a symlink (or anything but a file) is read as before, resolved in the root."""
    regular = _inroot.is_file_in(etc, _LDCONF_NAME, LDCONF)
    if regular is None:
        return True
    return not regular and _inroot.read_file(root, LDCONF) is None


def _read_image_cache(root: _inroot.RootFd, etc: int, runtime: bool) -> Optional[bytes]:
    """The image's ld.so.cache (None: none), read below the root's resolved /etc *etc*:
    up to :data:`LDCACHE_MAX_BYTES` for the runtime (past it :class:`LargeImageCache`),
    :data:`LDCACHE_HOOK_MAX_BYTES` for the hook."""
    bound = LDCACHE_MAX_BYTES if runtime else LDCACHE_HOOK_MAX_BYTES
    try:
        return _inroot.read_file_in(root, etc, _ETC, _LDCACHE_NAME, bound)
    except OSError as exc:
        if exc.errno == errno.EFBIG and runtime:
            raise LargeImageCache(
                f"the image's {LDCACHE} is larger than the {bound} bytes nvshim-runtime reads "
                "(merged by the createContainer hook, in the container's cgroup)"
            ) from exc
        raise
