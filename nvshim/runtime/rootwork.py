"""The in-root work of a GPU create: SONAME links and the container's ld.so.cache.

A container that gets driver libraries also needs, inside its rootfs, the SONAME links
(``libcuda.so.1 -> libcuda.so.<version>``, ``libcuda.so``) and an ``/etc/ld.so.cache``
that lists them, plus ``/etc/ld.so.conf.d/00-nvshim.conf`` naming the library folders so
that a later ``ldconfig`` in the container keeps them. Two processes can do it, with the
same code (this module) and the same guarantees (every path resolved inside the rootfs by
:mod:`nvshim.host.inroot`; nothing the image controls is executed or followed out):

``runtime``
    nvshim-runtime itself, before it execs runc. At ``create`` the bundle's ``root.path``
    is already the container's mounted rootfs (runc, crun, containerd and podman all mount
    it before calling the runtime), so no second process is needed. The libraries are not
    mounted yet: what the cache needs from them (ELF class/machine and SONAME) is read from
    the host files, which are the files that runc will bind-mount.
``hook``
    the ``createContainer`` hook (:mod:`nvshim.hook`), run by runc after the mounts. Kept
    as the fallback when the host cannot write the rootfs: a read-only mount (a read-only
    bind, squashfs), ``EROFS``/``EACCES``/``EPERM`` at the attempt, a rootfs that is a
    symlink, or a mount in config.json that covers a path we would write (the container
    would not see what was written underneath it).
``nobody`` (:data:`NOBODY`)
    a rootfs that is the host's ``/`` (by any path or symlink): its files are the host's,
    and neither process writes them.

:func:`decide` makes the choice from ``stat`` calls only (``nvshim inspect`` shows it);
:func:`prepare` does the work and raises :class:`Fallback` when the rootfs turns out not
to be writable. ``ENOSPC``/``EDQUOT`` are errors, not a fallback: the hook would write the
same files to the same filesystem.

The files are not fsynced: every create (re)writes them, so after a power loss the next
create of the container rewrites them too; the rename keeps each write atomic.

Start-up matters (this runs on every GPU create): ``os``, ``stat``, ``errno`` and
nvshim's in-root and ld.so.cache modules only.

One module over the ~400-line guide, on purpose: the plan (:func:`work_from_hooks`,
:func:`decide`) and the work (:func:`prepare`, :func:`apply_links`,
:func:`update_ldcache`) are one job that both processes above run, in full, on every
GPU create; split, the runtime would load one more module per create and the rules that
keep the two sides equal (what is planned is exactly what is written) would sit apart.
"""

from __future__ import annotations

import errno
import os
import stat

from nvshim.errors import SPEC_FILE, HostError, NvshimError, SpecError
from nvshim.host import inroot as _inroot
from nvshim.host.ldcache import (
    HWCAP_EXTENSION,
    CacheEntry,
    build_ldcache,
    cache_flags,
    parse_ldcache,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

    #: name in a folder → (cache flags, SONAME or None); a SONAME only for regular files
    Planned = Dict[str, Tuple[int, Optional[str]]]

__all__ = [
    "LDCACHE",
    "LDCACHE_MAX_BYTES",
    "LDCONF",
    "LDCONF_DROPIN",
    "NOBODY",
    "Fallback",
    "RootWork",
    "apply_links",
    "decide",
    "elf_info",
    "host_error",
    "is_host_root",
    "prepare",
    "rootfs_path",
    "update_ldcache",
    "work_from_hooks",
]

#: :func:`decide`'s answer for a rootfs that is the host's ``/``: no in-root work at all.
NOBODY = "nobody"

LDCACHE = "/etc/ld.so.cache"
LDCONF = "/etc/ld.so.conf"
LDCONF_DROPIN = "/etc/ld.so.conf.d/00-nvshim.conf"
_LDCONF_DEFAULT = b"include /etc/ld.so.conf.d/*.conf\n"
#: The largest image ld.so.cache read. Real caches are tens to a few hundred KiB; each entry
#: costs ~10 µs and ~1 KB to parse, merge and sort, so inroot's general 64 MiB bound let an
#: image hold every GPU create of it for ~40 s and ~1.8 GB (2 million tiny entries).
LDCACHE_MAX_BYTES = 4 << 20

#: The most image libraries one folder's scan opens. Real library folders hold a few
#: thousand; each costs an open, an ELF header and a SONAME read (~50 us) and a cache entry,
#: so an image with a million lib*.so files held every GPU create of it for about a minute.
#: Past the bound the image's own files are left to its own ld.so.cache (merged as always).
MAX_FOLDER_LIBS = 16384

#: errno values that mean "the host cannot write this rootfs": let the hook do it.
_NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)
#: errno values that mean "the rootfs is full": the hook cannot do better, fail clearly.
_FULL = (errno.ENOSPC, errno.EDQUOT)


class Fallback(NvshimError):
    """The runtime cannot do the in-root work; the createContainer hook must (``reason``).

    A signal :func:`nvshim.runtime.create.commit` always catches, not a failure; an
    NvshimError all the same, so that nothing but the error tree leaves this package."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RootWork:
    """What has to be made inside one rootfs: links (target, container path), folders, and
    what the cache needs to know about files that runc will mount there (``planned``)."""

    __slots__ = ("links", "folders", "planned", "host_driver_version")

    def __init__(self, links: Sequence[Tuple[str, str]], folders: Sequence[str],
                 planned: Mapping[str, Planned],
                 host_driver_version: Optional[str] = None) -> None:
        self.links = tuple(links)
        self.folders = tuple(folders)
        self.planned = planned
        self.host_driver_version = host_driver_version

    def __repr__(self) -> str:
        return f"RootWork(links={self.links!r}, folders={self.folders!r})"


# --------------------------------------------------------------------------- the plan


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


def work_from_hooks(hooks: Iterable[Any], mounts: Iterable[Any],
                    info: Any = elf_info) -> Optional[RootWork]:
    """The in-root work nvshim's hook in ``hooks`` would do, or None when there is none.

    ``mounts`` (edits :class:`~nvshim.edits.Mount`) say which files runc will mount into
    the hook's folders; ``info(host_path)`` gives (flags, SONAME) of each (default: read
    the host file; the node plan cache supplies them without reading).
    """
    from nvshim.runtime.hookargs import (
        is_nvshim_hook,
        parse_hook_args,
        parse_host_driver_version,
    )

    links: List[Tuple[str, str]] = []
    folders: List[str] = []
    found = False
    version: Optional[str] = None
    for hook in hooks:
        if is_nvshim_hook(hook):
            found = True
            version = version or parse_host_driver_version(hook.args)
            more_links, more_folders = parse_hook_args(hook.args)
            links += [pair for pair in more_links if pair not in links]
            folders += [f for f in more_folders if f not in folders]
    if not found:
        return None
    planned: Dict[str, Planned] = {}
    wanted = set(folders)
    for mount in mounts:
        directory, _, name = mount.container_path.rpartition("/")
        directory = directory or "/"
        if directory not in wanted or not _lib_name(name):
            continue
        flags, soname = info(mount.host_path)
        if flags is not None:
            planned.setdefault(directory, {})[name] = (flags, soname)
    for directory in folders:
        files = planned.get(directory, {})
        targets = dict(_links_in(links, directory))
        for name, target in targets.items():
            hops = 0
            while target in targets and target not in files and hops < len(targets):
                target, hops = targets[target], hops + 1
            if _lib_name(name) and target in files:
                planned.setdefault(directory, {})[name] = (files[target][0], None)
    return RootWork(links, folders, planned, version)


def _links_in(links: Sequence[Tuple[str, str]], directory: str) -> List[Tuple[str, str]]:
    """(link name, target) of the links made in ``directory``."""
    prefix = directory.rstrip("/") + "/"
    return [(link[len(prefix):], target) for target, link in links
            if link.startswith(prefix) and "/" not in link[len(prefix):]]


def rootfs_path(spec: Mapping[str, Any], bundle: str) -> Optional[str]:
    """``root.path`` of config.json joined to the bundle (runc's rule), None if unset.

    A path with a NUL byte names no directory (runc fails on it): SpecError.
    """
    root = spec.get("root")
    path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(path, str) or not path:
        return None
    if "\0" in path:
        raise SpecError(f"root.path {path!r} contains a NUL byte", SPEC_FILE)
    return os.path.normpath(os.path.join(bundle, path))


def _covers(destination: str, path: str) -> bool:
    return path == destination or path.startswith(destination.rstrip("/") + "/")


_host_root_id: Optional[Tuple[int, int]] = None


def is_host_root(path: str) -> bool:
    """Whether ``path`` (symlinks followed) is the host's ``/``, by any name.

    ``/`` itself (after lexical normalisation, as runc cleans ``root.path``) needs no
    ``stat``; another path costs one, compared by device and inode with the host's ``/``
    (stat'ed once per process).
    """
    global _host_root_id
    if os.path.normpath(path) == "/":
        return True
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    if _host_root_id is None:
        host_root = os.stat("/")
        _host_root_id = (host_root.st_dev, host_root.st_ino)
    return (st.st_dev, st.st_ino) == _host_root_id


def decide(spec: Mapping[str, Any], bundle: str, work: RootWork) -> Tuple[str, str]:
    """("runtime", rootfs) when the runtime can do ``work`` before runc, else ("hook", why),
    or (:data:`NOBODY`, why) for a rootfs that is the host's ``/``.

    runc runs createContainer hooks before the ``pivot_root`` that fails on such a root
    (``--no-pivot`` even starts the container there), so a hook would rewrite the host's
    own ld.so.cache and library folder: nobody writes anything, the host's files serve.

    Only ``stat`` calls: nothing is written. A write can still fail later (EROFS on an
    overlay's read-only lower layer, EACCES): :func:`prepare` raises :class:`Fallback`.
    """
    rootfs = rootfs_path(spec, bundle)
    if rootfs is None:
        return "hook", "config.json has no root.path"
    try:
        st = os.lstat(rootfs)
    except OSError as exc:
        return "hook", f"cannot stat the rootfs {rootfs}: {_reason(exc)}"
    if is_host_root(rootfs):
        return NOBODY, f"the rootfs {rootfs} is the host's /: nothing is written in it"
    if stat.S_ISLNK(st.st_mode):
        return "hook", f"the rootfs {rootfs} is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return "hook", f"the rootfs {rootfs} is not a directory"
    try:
        if os.statvfs(rootfs).f_flag & os.ST_RDONLY:
            return "hook", f"the rootfs {rootfs} is on a read-only mount"
    except OSError as exc:
        return "hook", f"cannot statvfs the rootfs {rootfs}: {_reason(exc)}"
    try:
        fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return "hook", f"cannot open the rootfs {rootfs}: {_reason(exc)}"
    try:
        covered = _covered(fd, spec, work)
    except OSError as exc:
        return "hook", f"cannot resolve {exc.filename} in the rootfs {rootfs}: {_reason(exc)}"
    finally:
        os.close(fd)
    if covered:
        return "hook", covered
    return "runtime", rootfs


def _covered(root: int, spec: Mapping[str, Any], work: RootWork) -> str:
    """Why a mount of config.json hides a path we would write ("" when none does).

    runc resolves mount destinations inside the rootfs as we do, so both sides are
    compared after resolving the image's symlinks (an image whose library directory is a
    symlink into ``/tmp`` gets the links in the ``/tmp`` tmpfs from the hook, not under it).
    """
    targets = [LDCACHE, LDCONF, LDCONF_DROPIN, *(link for _, link in work.links)]
    written = {}
    real_parents: Dict[str, str] = {}  # the links share a folder or two: resolve each once
    for target in targets:
        parent, _, name = target.rpartition("/")
        real = real_parents.get(parent)
        if real is None:
            real = real_parents[parent] = _inroot.real_path(root, parent).rstrip("/")
        written[f"{real}/{name}"] = target
    ours = {f"{folder}/{name}" for folder, names in work.planned.items() for name in names}
    for mount in spec.get("mounts") or ():
        dest = mount.get("destination") if isinstance(mount, dict) else None
        if not isinstance(dest, str) or dest in ours:
            continue
        real = _inroot.real_path(root, dest)
        for path, target in written.items():
            if _covers(real, path):
                return f"config.json mounts {dest} over {target}"
    return ""


def _reason(exc: OSError) -> str:
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]


def prepare(rootfs: str, work: RootWork) -> List[str]:
    """Make ``work``'s links and cache in ``rootfs`` (before runc); return warning lines.

    Raises :class:`Fallback` when the rootfs cannot be written (the hook must do it), and
    :class:`HostError` for a full rootfs or an image the hook would fail on too.
    """
    try:
        root = _inroot.RootFd(
            os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC), rootfs
        )
    except OSError as exc:
        raise Fallback(f"cannot open the rootfs {rootfs}: {_reason(exc)}") from exc
    with root:
        try:
            apply_links(root, rootfs, work.links)
            if not work.folders:
                return []
            return update_ldcache(root, work.folders, work.planned, work.host_driver_version)
        except HostError as exc:
            cause = exc.__cause__
            if isinstance(cause, OSError) and cause.errno in _NOT_WRITABLE:
                raise Fallback(str(exc)) from exc
            if isinstance(cause, OSError) and cause.errno in _FULL:
                raise HostError(f"the container rootfs is full: {exc}") from exc
            raise


# --------------------------------------------------------------------------- the work


def host_error(action: str, exc: OSError) -> HostError:
    """The one-line HostError for ``exc``: what was being done, the file, the reason."""
    reason = _reason(exc)
    if exc.filename and str(exc.filename) not in action:
        return HostError(f"{action}: {exc.filename}: {reason}")
    return HostError(f"{action}: {reason}")


def apply_links(root: _inroot.RootFd, rootfs: str, links: Sequence[Tuple[str, str]]) -> None:
    """Make each (target, link) symlink in the root (no-op when it is already right)."""
    try:
        _inroot.symlinks_atomic(root, links)
    except OSError as exc:
        link = str(exc.filename)
        target = next((t for t, name in links if name == link), "?")
        raise host_error(f"cannot link {link} -> {target} in {rootfs}", exc) from exc


def _lib_name(name: str) -> bool:
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


def _folder_entries(root: _inroot.RootFd, folder: str,
                    planned: Optional[Planned] = None,
                    warnings: Optional[List[str]] = None,
                    limit: Optional[int] = None) -> List[CacheEntry]:
    """Cache entries for the libraries in container directory *folder*.

    Every ``lib*.so*`` name that is (or links, in the root, to) an ELF library gets an
    entry for itself; a regular file whose SONAME differs from its name also gets one for
    the SONAME (pointing at the SONAME link if the folder has it, else at the file).
    Names in *planned* are files runc will mount there (or links to them): their flags and
    SONAME come from the plan, not from the rootfs. More than *limit* of the image's own
    are not opened at all (a line in *warnings* says so).

    An image's library folder holds hundreds of libraries, so the folder is resolved in
    the root once and read below that fd: one ``getdents`` for the names and their types,
    each regular file opened directly in the folder (never through a symlink) and read
    once, and a link whose target is a name in the same folder (``libz.so.1 ->
    libz.so.1.2.13``, nearly all of them) answered from that file. Only a link pointing
    elsewhere is resolved from the root, as before.
    """
    planned = planned or {}
    dfd = _inroot.open_dir(root, folder)
    if dfd is None and not planned:
        return []
    try:
        if dfd is None:  # only the planned names: nothing of the image's to read
            return _scan_folder(root, folder, -1, {}, planned, warnings, limit)
        return _scan_folder(root, folder, dfd, _inroot.dir_kinds(dfd), planned, warnings,
                            limit)
    finally:
        if dfd is not None:
            os.close(dfd)


def _scan_folder(root: _inroot.RootFd, folder: str, dfd: int,
                 kinds: Mapping[str, str], planned: Planned,
                 warnings: Optional[List[str]], limit: Optional[int]) -> List[CacheEntry]:
    names = list(kinds)
    present = set(names) | set(planned)
    base = folder.rstrip("/") or ""
    out: List[CacheEntry] = []
    image_libs = 0
    if limit is not None and len(names) > limit:  # fewer names cannot be more libraries
        image_libs = sum(1 for name in names if name not in planned and _lib_name(name))
    scan_image = limit is None or image_libs <= limit
    if not scan_image and warnings is not None:
        warnings.append(f"{folder} holds {image_libs} of the image's libraries, more than the "
                        f"{limit} read: only the image's own ld.so.cache lists them")
    read: Dict[str, Optional[Tuple[int, Optional[str]]]] = {}

    def regular(name: str) -> Optional[Tuple[int, Optional[str]]]:
        """(flags, SONAME) of the regular file *name* of the folder; None: not a library."""
        if name not in read:
            read[name] = None
            try:
                fd = _inroot.open_in_dir(dfd, name, f"{base}/{name}")
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

    def link_flags(name: str, path: str) -> Optional[int]:
        """The flags of the library the link *name* leads to, None if it leads to none."""
        target = name
        for _ in range(_inroot.MAX_SYMLINKS):
            try:
                target = os.readlink(target, dir_fd=dfd)
            except OSError:
                return None
            if "/" in target:
                break  # elsewhere in the root: resolved from the root below
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

    for name in sorted(present):
        if not _lib_name(name):
            continue
        path = f"{base}/{name}"
        known = planned.get(name)
        if known is not None:
            flags, soname = known
            out.append(CacheEntry(name, path, flags))
            if soname and soname != name and "/" not in soname:
                value = f"{base}/{soname}" if soname in present else path
                out.append(CacheEntry(soname, value, flags))
            continue
        if not scan_image:
            continue
        kind = kinds.get(name)
        if kind == "file":
            got = regular(name)
            if got is None:
                continue
            flags, soname = got
            out.append(CacheEntry(name, path, flags))
            if soname and soname != name and "/" not in soname:
                value = f"{base}/{soname}" if soname in present else path
                out.append(CacheEntry(soname, value, flags))
        elif kind == "link":
            link = link_flags(name, path)
            if link is not None:
                out.append(CacheEntry(name, path, link))
    return out


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


def update_ldcache(root: _inroot.RootFd, folders: Sequence[str],
                   planned: Optional[Mapping[str, Planned]] = None,
                   host_driver_version: Optional[str] = None) -> List[str]:
    """Make *folders* known to the container's dynamic loader; return warning lines.

    Writes the ld.so.conf drop-in (and ``/etc/ld.so.conf`` if missing), then the cache:
    the image's entries plus :func:`_folder_entries` of each folder. Files are rewritten
    only when their content changes. OSError becomes :class:`HostError` (cause kept).
    With *host_driver_version*, an image's newer CUDA compat directory goes first
    (:mod:`nvshim.host.cudacompat`).

    With *planned* (the runtime, which runs as host root in the engine's cgroup) a folder
    holding more than :data:`MAX_FOLDER_LIBS` of the image's libraries is not scanned; the
    hook (``planned`` None) runs in the container's cgroup, where the image pays for its
    own folders, and cannot tell the mounted driver files from the image's: it scans all.
    """
    if host_driver_version:
        from nvshim.host.cudacompat import compat_folder

        compat = compat_folder(root, host_driver_version)
        if compat is not None and compat not in folders:
            folders = (compat, *folders)
    try:
        return _update_ldcache(root, folders, planned or {},
                               MAX_FOLDER_LIBS if planned is not None else None)
    except OSError as exc:
        raise host_error(f"cannot update the ld.so.cache in {root.path}", exc) from exc


def _update_ldcache(root: _inroot.RootFd, folders: Sequence[str],
                    planned: Mapping[str, Planned], limit: Optional[int]) -> List[str]:
    warnings: List[str] = []
    dropin = "".join(f"{folder}\n" for folder in folders).encode()
    dropin = b"# driver libraries injected by nvshim\n" + dropin
    if _inroot.read_file(root, LDCONF_DROPIN) != dropin:
        _inroot.write_file_atomic(root, LDCONF_DROPIN, dropin, 0o644, durable=False)
    if _inroot.read_file(root, LDCONF) is None:
        _inroot.write_file_atomic(root, LDCONF, _LDCONF_DEFAULT, 0o644, durable=False)

    old = _inroot.read_file(root, LDCACHE, LDCACHE_MAX_BYTES)
    existing: Sequence[CacheEntry] = ()
    if old:
        try:
            existing = parse_ldcache(old)
        except NvshimError as exc:
            warnings.append(f"ignoring the image's {LDCACHE}: {exc}")
    added: List[CacheEntry] = []
    for folder in folders:
        added += _folder_entries(root, folder, planned.get(folder), warnings, limit)
    layout = "compat" if old and old.startswith(b"ld.so-1.7.0") else "new"
    data = build_ldcache(_merge(existing, added), layout)
    if data != old:
        _inroot.write_file_atomic(root, LDCACHE, data, 0o644, durable=False)
    return warnings
