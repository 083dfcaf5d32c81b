"""Who does the in-root work of a GPU create, and the plan both sides follow.

A container that gets driver libraries also needs things made inside its rootfs: the
SONAME links (``libcuda.so.1 -> libcuda.so.<version>``, ``libcuda.so``), the container's
ld.so.cache (:mod:`nvshim.runtime.rootcache`) and, for graphics, the EGL application
profile (:mod:`nvshim.runtime.appprofile`). Two processes can make them, with the same
code and the same guarantees (every path resolved inside the rootfs by
:mod:`nvshim.host.inroot`; nothing the image controls is executed or followed out):

``runtime``
    nvshim-runtime itself, before it execs runc (and the agent, with the same plan). At
    ``create`` the bundle's ``root.path`` is already the container's mounted rootfs (runc,
    crun, containerd and podman all mount it before calling the runtime), so no second
    process is needed. The libraries are not mounted yet: what the cache needs from them
    (ELF class/machine and SONAME) is read from the host files, which are the files that
    runc will bind-mount. The image's own libraries in those folders come from the image's
    own ld.so.cache; none of them is opened.
``hook``
    the ``createContainer`` hook (:mod:`nvshim.hook`), run by runc after the mounts. Kept
    as the fallback when the host cannot write the rootfs: a read-only mount (a read-only
    bind, squashfs), ``EROFS``/``EACCES``/``EPERM`` at the attempt, a rootfs that is a
    symlink, or a mount in config.json that covers a path we would write (the container
    would not see what was written underneath it); and for an image ld.so.cache larger
    than the runtime reads (the hook merges it in the container's cgroup).
``nobody`` (:data:`NOBODY`)
    a rootfs that is the host's ``/`` (by any path or symlink): its files are the host's,
    and neither process writes them.

What the hook's arguments ask for is the plan (:func:`work_from_hooks`, a
:class:`RootWork`): the runtime does exactly that, so the two sides stay equal, links and
loader files alike. The cache differs in one place
(:func:`nvshim.runtime.rootcache.update_ldcache`): the hook, which has no plan, scans the
injected folders as ldconfig would and lists every library of the image's there; the
runtime lists the image's libraries as the image's own cache does. For an image whose
cache is up to date the two resolve every name that cache lists alike, and only the hook
lists the names ldconfig leaves out (a library's full file name, its ``.so`` link); one
whose cache is stale for its own libraries there gets them listed by the hook only. Links under
``/dev`` are never in-root work: ``/dev`` is runc's tmpfs, made after the runtime has run,
so the hook keeps making them whoever does the rest
(:func:`nvshim.runtime.hookargs.dev_links_only`).

:func:`decide` makes the choice from ``stat`` calls only (``nvshim inspect`` shows it);
:func:`prepare` does the work and raises :class:`Fallback` when the rootfs turns out not
to be writable. ``ENOSPC``/``EDQUOT`` are errors, not a fallback: the hook would write the
same files to the same filesystem.

The files are not fsynced: every create (re)writes them, so after a power loss the next
create of the container rewrites them too; the rename keeps each write atomic.

Start-up matters (this runs on every GPU create): ``os``, ``stat``, ``errno`` and
nvshim's in-root and ld.so.cache modules only.

Why one module: the choice of who works and the plan both sides follow are one contract: the
runtime does exactly what the hook's arguments ask, and the reasons to leave the work to the
hook are read from the same plan; the cache itself is rootcache.py's and the paths'
resolution host/inroot.py's.
"""

from __future__ import annotations

import errno
import os
import stat

from nvshim.errors import SPEC_FILE, HostError, NvshimError, SpecError, host_error, os_reason
from nvshim.host import inroot as _inroot
from nvshim.runtime.rootcache import (
    LDCACHE,
    LDCONF,
    LDCONF_DROPIN,
    LargeImageCache,
    elf_info,
    lib_name,
    update_ldcache,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

    from nvshim.runtime.rootcache import Planned

__all__ = [
    "NOBODY",
    "Fallback",
    "RootWork",
    "apply_dev_links",
    "apply_links",
    "decide",
    "is_host_root",
    "prepare",
    "prepare_in",
    "rootfs_path",
    "work_from_hooks",
    "write_egl_profile",
]

#: :func:`decide`'s answer for a rootfs that is the host's ``/``: no in-root work at all.
NOBODY = "nobody"

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
    what the cache needs to know about files that runc will mount there (``planned``);
    ``gpu_minors``: the GPUs the EGL application profile names (None: no profile asked)."""

    __slots__ = ("links", "folders", "planned", "host_driver_version", "gpu_minors")

    def __init__(
        self,
        links: Sequence[Tuple[str, str]],
        folders: Sequence[str],
        planned: Mapping[str, Planned],
        host_driver_version: Optional[str] = None,
        gpu_minors: Optional[Sequence[int]] = None,
    ) -> None:
        self.links = tuple(links)
        self.folders = tuple(folders)
        self.planned = planned
        self.host_driver_version = host_driver_version
        self.gpu_minors = None if gpu_minors is None else tuple(gpu_minors)

    def __repr__(self) -> str:
        return (
            f"RootWork(links={self.links!r}, folders={self.folders!r}, "
            f"gpu_minors={self.gpu_minors!r})"
        )


# --------------------------------------------------------------------------- the plan


def work_from_hooks(
    hooks: Iterable[Any],
    mounts: Iterable[Any],
    info: Any = elf_info,
    devices: Iterable[Any] = (),
    spec: Optional[Mapping[str, Any]] = None,
) -> Optional[RootWork]:
    """The in-root work nvshim's hook in ``hooks`` would do, or None when there is none.

    ``mounts`` (edits :class:`~nvshim.edits.Mount`) say which files runc will mount into
    the hook's folders; ``info(host_path)`` gives (flags, SONAME) of each (default: read
    the host file; the node plan cache supplies them without reading). ``devices`` (the
    edits' device nodes) and ``spec``'s ``linux.devices`` are what config.json will list:
    the GPUs of the EGL profile, if one is asked for. The hook's ``/dev`` links are not
    in-root work (the hook always makes them).
    """
    from nvshim.runtime.hookargs import (
        is_nvshim_hook,
        parse_graphics_args,
        parse_hook_args,
        parse_host_driver_version,
    )

    links: List[Tuple[str, str]] = []
    folders: List[str] = []
    found = False
    egl = False
    version: Optional[str] = None
    for hook in hooks:
        if is_nvshim_hook(hook):
            found = True
            version = version or parse_host_driver_version(hook.args)
            more_links, more_folders = parse_hook_args(hook.args)
            links += [pair for pair in more_links if pair not in links]
            folders += [f for f in more_folders if f not in folders]
            egl = egl or parse_graphics_args(hook.args)[1]
    if not found:
        return None
    minors: Optional[Tuple[int, ...]] = None
    if egl:
        from nvshim.runtime.appprofile import gpu_minors, spec_devices

        minors = gpu_minors([*devices, *spec_devices(spec or {})])
    planned: Dict[str, Planned] = {}
    wanted = set(folders)
    for mount in mounts:
        directory, _, name = mount.container_path.rpartition("/")
        directory = directory or "/"
        if directory not in wanted or not lib_name(name):
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
            if lib_name(name) and target in files:
                planned.setdefault(directory, {})[name] = (files[target][0], None)
    return RootWork(links, folders, planned, version, minors)


def _links_in(links: Sequence[Tuple[str, str]], directory: str) -> List[Tuple[str, str]]:
    """(link name, target) of the links made in ``directory``."""
    prefix = directory.rstrip("/") + "/"
    return [
        (link[len(prefix) :], target)
        for target, link in links
        if link.startswith(prefix) and "/" not in link[len(prefix) :]
    ]


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
        return "hook", f"cannot stat the rootfs {rootfs}: {os_reason(exc)}"
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
        return "hook", f"cannot statvfs the rootfs {rootfs}: {os_reason(exc)}"
    try:
        fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return "hook", f"cannot open the rootfs {rootfs}: {os_reason(exc)}"
    try:
        covered = _covered(fd, spec, work)
    except OSError as exc:
        return "hook", f"cannot resolve {exc.filename} in the rootfs {rootfs}: {os_reason(exc)}"
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
    if work.gpu_minors:
        from nvshim.runtime.appprofile import PROFILE

        targets.append(PROFILE)
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
        raise Fallback(f"cannot open the rootfs {rootfs}: {os_reason(exc)}") from exc
    with root:
        return prepare_in(root, work)


def prepare_in(root: _inroot.RootFd, work: RootWork) -> List[str]:
    """:func:`prepare` in an open rootfs (``root.path`` names it in messages): the agent's
    hook reaches the rootfs through the caller's descriptor, not by a path of its own."""
    rootfs = root.path
    try:
        apply_links(root, rootfs, work.links)
        if work.gpu_minors:
            write_egl_profile(root, rootfs, work.gpu_minors)
        if not work.folders:
            return []
        return update_ldcache(root, work.folders, work.planned, work.host_driver_version)
    except LargeImageCache as exc:
        raise Fallback(str(exc)) from exc
    except HostError as exc:
        cause = exc.__cause__
        if isinstance(cause, OSError) and cause.errno in _NOT_WRITABLE:
            raise Fallback(str(exc)) from exc
        if isinstance(cause, OSError) and cause.errno in _FULL:
            raise HostError(f"the container rootfs is full: {exc}") from exc
        raise


# --------------------------------------------------------------------------- the work


def apply_links(root: _inroot.RootFd, rootfs: str, links: Sequence[Tuple[str, str]]) -> None:
    """Make each (target, link) symlink in the root (no-op when it is already right)."""
    try:
        _inroot.symlinks_atomic(root, links)
    except OSError as exc:
        link = str(exc.filename)
        target = next((t for t, name in links if name == link), "?")
        raise host_error(f"cannot link {link} -> {target} in {rootfs}", exc) from exc


def write_egl_profile(root: _inroot.RootFd, rootfs: str, minors: Sequence[int]) -> None:
    """The EGL application profile naming the GPUs of ``minors``
    (:mod:`nvshim.runtime.appprofile`); HostError on failure."""
    from nvshim.runtime.appprofile import PROFILE, write_profile

    try:
        write_profile(root, minors)
    except OSError as exc:
        raise host_error(f"cannot write {PROFILE} in {rootfs}", exc) from exc


def apply_dev_links(root: _inroot.RootFd, rootfs: str, links: Sequence[Tuple[str, str]]) -> int:
    """Make each (target, link) under ``/dev`` whose target, resolved beside the link in
    the root, is a character device (the hook's ``--dev-link``: a GPU's by-path links, made
    only for the nodes the container has); return how many are there now."""
    import posixpath

    made = []
    for target, link in links:
        node = posixpath.normpath(posixpath.join(posixpath.dirname(link), target))
        if not node.startswith("/dev/"):
            continue
        try:
            if not stat.S_ISCHR(_inroot.lstat(root, node).st_mode):
                continue
        except OSError:
            continue  # not granted: no node, no link
        made.append((target, link))
    apply_links(root, rootfs, made)
    return len(made)
