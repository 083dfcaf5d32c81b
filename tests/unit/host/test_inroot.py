"""nvshim.host.inroot: file operations that stay inside a container rootfs, whatever its symlinks."""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
import tempfile
import threading
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvshim.host import inroot as _inroot


def snapshot(base: Path, skip: Path) -> dict[str, tuple[int, str]]:
    """Every entry under *base* except the *skip* subtree: (mode, content or link text)."""
    out: dict[str, tuple[int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        if Path(dirpath) == skip or skip in Path(dirpath).parents:
            continue
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            if path == skip:
                continue
            st_ = path.lstat()
            if stat.S_ISLNK(st_.st_mode):
                data = os.readlink(path)
            elif stat.S_ISREG(st_.st_mode):
                data = path.read_bytes().decode("latin-1")
            else:
                data = ""
            out[str(path.relative_to(base))] = (st_.st_mode, data)
    return out


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture()
def world(tmp_path: Path) -> tuple[Path, Path]:
    """A rootfs at tmp/root and a 'host' directory tmp/host with a file and a subdir."""
    root = tmp_path / "root"
    host = tmp_path / "host"
    (root / "etc").mkdir(parents=True)
    (host / "sub").mkdir(parents=True)
    (host / "secret").write_bytes(b"host data")
    return root, host


def test_symlink_atomic_creates_then_is_a_noop(world: tuple[Path, Path]) -> None:
    """A missing link is created with its parents (0755); the same call again changes nothing."""
    root, _ = world
    old = os.umask(0o077)
    try:
        with _inroot.open_root(str(root)) as rfd:
            assert _inroot.symlink_atomic(rfd, "libcuda.so.550", "/usr/lib/x/libcuda.so.1")
            ino = (root / "usr/lib/x/libcuda.so.1").lstat().st_ino
            assert not _inroot.symlink_atomic(rfd, "libcuda.so.550", "/usr/lib/x/libcuda.so.1")
    finally:
        os.umask(old)
    assert os.readlink(root / "usr/lib/x/libcuda.so.1") == "libcuda.so.550"
    assert (root / "usr/lib/x/libcuda.so.1").lstat().st_ino == ino
    assert stat.S_IMODE((root / "usr/lib/x").stat().st_mode) == 0o755
    assert stat.S_IMODE((root / "usr").stat().st_mode) == 0o755


def test_symlink_atomic_replaces_wrong_link_and_regular_file(world: tuple[Path, Path]) -> None:
    """An existing link to elsewhere, or a regular file, is replaced by the wanted link."""
    root, _ = world
    (root / "a").symlink_to("other")
    (root / "b").write_bytes(b"stub")
    with _inroot.open_root(str(root)) as rfd:
        assert _inroot.symlink_atomic(rfd, "t1", "/a")
        assert _inroot.symlink_atomic(rfd, "/abs/t2", "/b")
    assert os.readlink(root / "a") == "t1"
    assert os.readlink(root / "b") == "/abs/t2"
    assert sorted(p.name for p in root.iterdir()) == ["a", "b", "etc"]  # no temp left over


def test_symlinks_atomic_walks_each_folder_once(
    world: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of links resolves each parent folder once (through an image symlink, inside
    the root), makes absent links in place, replaces wrong ones, and leaves no fd or temp."""
    root, host = world
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/x86_64-linux-gnu").symlink_to(host)  # resolved in the root, not on the host
    inside = root / str(host).lstrip("/")
    inside.mkdir(parents=True)
    (inside / "libb.so.1").symlink_to("wrong")
    walks: list[str] = []
    real_walk = _inroot._walk
    monkeypatch.setattr(
        _inroot,
        "_walk",
        lambda root_fd, path, **kw: (walks.append(path), real_walk(root_fd, path, **kw))[1],
    )
    before = snapshot(host.parent, root)
    fds = open_fds()
    links = [
        ("liba.so.550", "/usr/lib/x86_64-linux-gnu/liba.so.1"),
        ("libb.so.550", "/usr/lib/x86_64-linux-gnu/libb.so.1"),
        ("liba.so.1", "/usr/lib/x86_64-linux-gnu/liba.so"),
        ("libc.so.550", "/opt/lib/libc.so.1"),
    ]
    with _inroot.open_root(str(root)) as rfd:
        assert _inroot.symlinks_atomic(rfd, links) == 4
        assert _inroot.symlinks_atomic(rfd, links) == 0
    assert open_fds() == fds
    assert walks == ["usr/lib/x86_64-linux-gnu", "opt/lib"] * 2
    assert snapshot(host.parent, root) == before
    assert {p.name: os.readlink(p) for p in inside.iterdir()} == {
        "liba.so.1": "liba.so.550",
        "libb.so.1": "libb.so.550",
        "liba.so": "liba.so.1",
    }
    assert os.readlink(root / "opt/lib/libc.so.1") == "libc.so.550"


def test_symlinks_atomic_names_the_link_that_failed(world: tuple[Path, Path]) -> None:
    """A directory where a link should go fails with that link's container path; the links
    before it are made and no fd is left open."""
    root, _ = world
    (root / "lib/libx.so.1").mkdir(parents=True)
    fds = open_fds()
    with _inroot.open_root(str(root)) as rfd:
        with pytest.raises(OSError) as info:
            _inroot.symlinks_atomic(
                rfd, [("libw.so.2", "/lib/libw.so.1"), ("libx.so.2", "/lib/libx.so.1")]
            )
    assert info.value.filename == "/lib/libx.so.1"
    assert os.readlink(root / "lib/libw.so.1") == "libw.so.2"
    assert open_fds() == fds


def test_absolute_symlink_dir_resolves_inside_root(world: tuple[Path, Path]) -> None:
    """A directory symlink with an absolute host target is followed inside the root, not on the host."""
    root, host = world
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/x86_64-linux-gnu").symlink_to(host)
    before = snapshot(host.parent, root)
    with _inroot.open_root(str(root)) as rfd:
        _inroot.symlink_atomic(rfd, "libcuda.so.550", "/usr/lib/x86_64-linux-gnu/libcuda.so.1")
        _inroot.write_file_atomic(rfd, "/usr/lib/x86_64-linux-gnu/secret", b"x")
    assert snapshot(host.parent, root) == before
    inside = root / str(host).lstrip("/")
    assert os.readlink(inside / "libcuda.so.1") == "libcuda.so.550"
    assert (inside / "secret").read_bytes() == b"x"


def test_relative_escapes_are_clamped_at_root(world: tuple[Path, Path]) -> None:
    """'..' in paths and in relative symlink targets never climbs above the root."""
    root, host = world
    (root / "up").symlink_to("../../../../../..")
    (root / "etc/hostdir").symlink_to("../../host")
    before = snapshot(host.parent, root)
    with _inroot.open_root(str(root)) as rfd:
        _inroot.write_file_atomic(rfd, "/../../host/secret", b"1")
        _inroot.write_file_atomic(rfd, "up/host/secret", b"2")
        _inroot.write_file_atomic(rfd, "/etc/hostdir/secret", b"3")
        _inroot.symlink_atomic(rfd, "t", "/up/up/../etc/../../host/l")
    assert snapshot(host.parent, root) == before
    assert (root / "host/secret").read_bytes() == b"3"
    assert os.readlink(root / "host/l") == "t"


def test_final_symlink_to_host_file_is_replaced_not_followed(world: tuple[Path, Path]) -> None:
    """Writing over a final component that links to a host file replaces the link in the root."""
    root, host = world
    (root / "etc/ld.so.cache").symlink_to(host / "secret")
    (root / "etc/libx.so.1").symlink_to(host / "secret")
    with _inroot.open_root(str(root)) as rfd:
        _inroot.write_file_atomic(rfd, "/etc/ld.so.cache", b"cache")
        _inroot.symlink_atomic(rfd, "libx.so.1.0", "/etc/libx.so.1")
    assert (host / "secret").read_bytes() == b"host data"
    assert (root / "etc/ld.so.cache").read_bytes() == b"cache"
    assert not (root / "etc/ld.so.cache").is_symlink()
    assert os.readlink(root / "etc/libx.so.1") == "libx.so.1.0"


def test_symlink_loop_is_a_clear_eloop(world: tuple[Path, Path]) -> None:
    """A symlink loop fails with ELOOP naming the container path, after at most 40 links."""
    root, _ = world
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("/a")
    with _inroot.open_root(str(root)) as rfd:
        with pytest.raises(OSError) as info:
            _inroot.write_file_atomic(rfd, "/a/file", b"x")
        with pytest.raises(OSError) as info2:
            _inroot.read_file(rfd, "/a")
    assert info.value.errno == errno.ELOOP
    assert info.value.filename == "/a/file"
    assert "symbolic links" in str(info.value)
    assert info2.value.errno == errno.ELOOP


def test_forty_links_are_followed_but_not_forty_one(world: tuple[Path, Path]) -> None:
    """The symlink limit is the kernel's: a chain of 40 resolves, 41 is ELOOP."""
    root, _ = world
    (root / "l0").mkdir()
    for i in range(1, 42):
        (root / f"l{i}").symlink_to(f"l{i - 1}")
    with _inroot.open_root(str(root)) as rfd:
        os.close(_inroot.resolve_dir(rfd, "/l40"))
        with pytest.raises(OSError) as info:
            _inroot.resolve_dir(rfd, "/l41")
    assert info.value.errno == errno.ELOOP


def test_resolve_dir_missing_and_not_a_directory(world: tuple[Path, Path]) -> None:
    """Without create, a missing component is FileNotFoundError; a file component is ENOTDIR."""
    root, _ = world
    (root / "etc/file").write_bytes(b"")
    with _inroot.open_root(str(root)) as rfd:
        with pytest.raises(FileNotFoundError):
            _inroot.resolve_dir(rfd, "/nope/deeper")
        with pytest.raises(NotADirectoryError):
            _inroot.resolve_dir(rfd, "/etc/file/x", create=True)
    assert not (root / "nope").exists()


def test_dangling_symlink_dir_is_created_inside_root(world: tuple[Path, Path]) -> None:
    """With create, a dangling directory symlink gets its target made inside the root."""
    root, host = world
    (root / "lib").symlink_to(str(host / "missing"))
    with _inroot.open_root(str(root)) as rfd:
        _inroot.write_file_atomic(rfd, "/lib/f", b"x")
    assert not (host / "missing").exists()
    assert (root / str(host).lstrip("/") / "missing/f").read_bytes() == b"x"


def test_write_file_atomic_mode_ignores_umask(world: tuple[Path, Path]) -> None:
    """The written file has exactly the requested mode, even under a restrictive umask."""
    root, _ = world
    old = os.umask(0o077)
    try:
        with _inroot.open_root(str(root)) as rfd:
            _inroot.write_file_atomic(rfd, "/etc/ld.so.conf.d/00-x.conf", b"/a\n", 0o644)
    finally:
        os.umask(old)
    path = root / "etc/ld.so.conf.d/00-x.conf"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755
    assert path.read_bytes() == b"/a\n"


def test_write_file_atomic_error_names_the_file_not_the_temporary(world: tuple[Path, Path]) -> None:
    """When the temporary file cannot be created (here its longer name is over NAME_MAX; a
    read-only bind or a full disk fail the same call), the OSError names the container path
    being written, as every other error of the module does, not ``.<name>.nvshim-…``.
    The name is 250 bytes: within NAME_MAX itself, past it with the shortest temporary
    suffix (``.`` and ``.nvshim-<pid>-<n>``, 12 bytes or more, whatever the pid)."""
    root, _ = world
    target = "/etc/" + "x" * 250
    with _inroot.open_root(str(root)) as rfd:
        with pytest.raises(OSError) as info:
            _inroot.write_file_atomic(rfd, target, b"data")
    assert info.value.errno == errno.ENAMETOOLONG
    assert info.value.filename == target
    assert os.listdir(root / "etc") == []


def test_nul_byte_in_a_path_is_an_oserror(world: tuple[Path, Path]) -> None:
    """A path with a NUL byte (a config.json mount destination can hold one) is refused with
    OSError(EINVAL) naming it, like every other bad path here, not os's ValueError."""
    root, _ = world
    with _inroot.open_root(str(root)) as rfd:
        for call in (
            lambda: _inroot.real_path(rfd, "/etc/a\0b"),
            lambda: _inroot.resolve_dir(rfd, "/a\0b", create=True),
            lambda: _inroot.read_file(rfd, "/etc/a\0b"),
            lambda: _inroot.write_file_atomic(rfd, "/etc/a\0b", b"x"),
            lambda: _inroot.symlink_atomic(rfd, "t", "/etc/a\0b"),
        ):
            with pytest.raises(OSError) as info:
                call()
            assert info.value.errno == errno.EINVAL
            assert info.value.filename in ("/etc/a\\0b", "/a\\0b")
    assert os.listdir(root / "etc") == [] and sorted(os.listdir(root)) == ["etc"]


def test_read_file_resolves_final_symlink_in_root(world: tuple[Path, Path]) -> None:
    """read_file follows an absolute final symlink inside the root, never to the host file."""
    root, host = world
    (root / "etc/cache").symlink_to(host / "secret")
    inside = root / str(host).lstrip("/")
    inside.mkdir(parents=True)
    (inside / "secret").write_bytes(b"in root")
    (root / "etc/gone").symlink_to("/nowhere")
    with _inroot.open_root(str(root)) as rfd:
        assert _inroot.read_file(rfd, "/etc/cache") == b"in root"
        assert _inroot.read_file(rfd, "/etc/gone") is None
        assert _inroot.read_file(rfd, "/etc/missing") is None


def test_read_file_refuses_fifo_without_blocking(world: tuple[Path, Path]) -> None:
    """A FIFO planted where a file is expected is refused at once instead of hanging the hook."""
    root, _ = world
    os.mkfifo(root / "etc/ld.so.cache")
    result: list[BaseException] = []

    def attempt() -> None:
        with _inroot.open_root(str(root)) as rfd:
            try:
                _inroot.read_file(rfd, "/etc/ld.so.cache")
            except OSError as exc:
                result.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout=30)
    if worker.is_alive():  # unblock the thread before failing
        os.close(os.open(root / "etc/ld.so.cache", os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("read_file blocked on a FIFO")
    assert len(result) == 1 and result[0].errno == errno.EINVAL


def opened_names(directory: Path, action: Callable[[], object]) -> list[str]:
    """Names in *directory* that ``action()`` opened (inotify IN_OPEN: any open but O_PATH)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0 and libc.inotify_add_watch(fd, os.fsencode(directory), 0x20) >= 0
    try:
        action()
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return []
    finally:
        os.close(fd)
    names, at = [], 0
    while at < len(data):
        length = struct.unpack_from("iIII", data, at)[3]
        names.append(data[at + 16 : at + 16 + length].rstrip(b"\0").decode())
        at += 16 + length
    return names


@pytest.mark.parametrize("kind", ["fifo", "chardev", "chardev-behind-symlink"])
def test_special_files_are_refused_without_being_opened(
    world: tuple[Path, Path], kind: str
) -> None:
    """A FIFO or a device node where a file is read is refused before any open: opening a
    device runs its driver (an image's watchdog node would arm the host's watchdog), and
    the runtime reads image files as host root outside any device cgroup."""
    if kind != "fifo" and os.geteuid() != 0:
        pytest.skip("mknod of a character device needs root")
    root, _ = world
    node = root / "etc" / "node"
    if kind == "fifo":
        os.mkfifo(node)
    else:
        os.mknod(node, 0o644 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    target = "/etc/node"
    if kind == "chardev-behind-symlink":
        (root / "etc" / "link").symlink_to("/etc/node")
        target = "/etc/link"
    with _inroot.open_root(str(root)) as rfd:

        def read() -> None:
            with pytest.raises(OSError) as info:
                _inroot.read_file(rfd, target)
            assert info.value.errno == errno.EINVAL and info.value.filename == target

        assert opened_names(root / "etc", read) == []
        assert opened_names(
            root / "etc", lambda: os.close(os.open(node, os.O_RDONLY | os.O_NONBLOCK))
        ) == ["node"]


def test_read_file_size_limit(world: tuple[Path, Path]) -> None:
    """A file over max_size is refused with EFBIG rather than read into memory."""
    root, _ = world
    (root / "etc/big").write_bytes(b"x" * 100)
    with _inroot.open_root(str(root)) as rfd:
        assert _inroot.read_file(rfd, "/etc/big", max_size=100) == b"x" * 100
        with pytest.raises(OSError) as info:
            _inroot.read_file(rfd, "/etc/big", max_size=99)
    assert info.value.errno == errno.EFBIG


def test_lstat_and_list_dir_stay_in_root(world: tuple[Path, Path]) -> None:
    """lstat does not follow the final link; list_dir lists the in-root target of a dir link."""
    root, host = world
    (root / "lib").symlink_to(str(host))
    (root / "etc/l").symlink_to(host / "secret")
    with _inroot.open_root(str(root)) as rfd:
        assert stat.S_ISLNK(_inroot.lstat(rfd, "/etc/l").st_mode)
        assert _inroot.list_dir(rfd, "/lib") is None  # the in-root target does not exist
        assert _inroot.list_dir(rfd, "/etc") == ["l"]


def test_path_without_a_file_name_is_rejected(world: tuple[Path, Path]) -> None:
    """A write to '/', '.' or a path ending in '..' is EINVAL, not a write to a directory."""
    root, _ = world
    with _inroot.open_root(str(root)) as rfd:
        for bad in ("/", "/etc/..", "."):
            with pytest.raises(OSError) as info:
                _inroot.write_file_atomic(rfd, bad, b"x")
            assert info.value.errno == errno.EINVAL


def test_no_fd_leaks_on_success_or_error(world: tuple[Path, Path]) -> None:
    """Every fd opened while walking is closed, on success and on each error path."""
    root, _ = world
    (root / "loop").symlink_to("loop")
    (root / "etc/file").write_bytes(b"")
    before = open_fds()
    with _inroot.open_root(str(root)) as rfd:
        _inroot.write_file_atomic(rfd, "/a/b/c", b"x")
        _inroot.symlink_atomic(rfd, "t", "/a/b/l")
        _inroot.read_file(rfd, "/a/b/c")
        for call in (
            lambda: _inroot.write_file_atomic(rfd, "/loop/x", b""),
            lambda: _inroot.symlink_atomic(rfd, "t", "/etc/file/x"),
            lambda: _inroot.read_file(rfd, "/etc"),
            lambda: _inroot.write_file_atomic(rfd, "/a", b""),  # a is a directory
        ):
            with pytest.raises(OSError):
                call()
    assert open_fds() == before


# --- property: random symlink trees never let a write land outside the root -------------

_DIRS = ["d1", "d1/d2", "d3"]
_LINK_TARGETS = [
    "{host}", "{host}/sub", "{host}/secret", "{base}", "/", "..", "../..", "../../..",
    "../host", "../../host/sub", "/d1", "/d1/d2", "d2", "s0", "s1", "/s2", "/nonexistent/x",
    "../s3", "/d3/../..",
]  # fmt: skip
_COMPONENTS = ["d1", "d2", "d3", "s0", "s1", "s2", "s3", "..", ".", "host", "new", "secret"]
_FINALS = ["f", "new", "s0", "s1", "secret", "sub"]


@st.composite
def trees_and_ops(draw: st.DrawFn) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    links = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["", "d1/", "d1/d2/", "d3/"]).flatmap(
                    lambda d: st.sampled_from([f"{d}s0", f"{d}s1", f"{d}s2", f"{d}s3"])
                ),
                st.sampled_from(_LINK_TARGETS),
            ),
            max_size=8,
            unique_by=lambda t: t[0],
        )
    )
    ops = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["write", "symlink", "mkdir", "read"]),
                st.builds(
                    lambda parts, final, absolute: (
                        ("/" if absolute else "") + "/".join([*parts, final])
                    ),
                    st.lists(st.sampled_from(_COMPONENTS), max_size=5),
                    st.sampled_from(_FINALS),
                    st.booleans(),
                ),
            ),
            min_size=1,
            max_size=6,
        )
    )
    return links, ops


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees_and_ops())
def test_random_symlink_trees_never_escape(
    case: tuple[list[tuple[str, str]], list[tuple[str, str]]],
) -> None:
    """Whatever symlinks the image holds, writes, links and mkdirs change nothing outside the root."""
    links, ops = case
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        root, host = base / "root", base / "host"
        for d in _DIRS:
            (root / d).mkdir(parents=True)
        (host / "sub").mkdir(parents=True)
        (host / "secret").write_bytes(b"host data")
        for where, target in links:  # parents are real directories: setup cannot escape
            os.symlink(target.format(host=host, base=base), root / where)
        before = snapshot(base, root)
        fds = open_fds()
        with _inroot.open_root(str(root)) as rfd:
            for op, path in ops:
                try:
                    if op == "write":
                        _inroot.write_file_atomic(rfd, path, b"written")
                    elif op == "symlink":
                        _inroot.symlink_atomic(rfd, "/target", path)
                    elif op == "mkdir":
                        os.close(_inroot.resolve_dir(rfd, path, create=True))
                    else:
                        _inroot.read_file(rfd, path)
                except OSError:
                    pass
        assert snapshot(base, root) == before
        assert open_fds() == fds


def test_in_dir_helpers_resolve_links_in_the_root_and_refuse_special_files(
    world: tuple[Path, Path],
) -> None:
    """child_dir, read_file_in and write_file_in (the ld.so.cache work through one /etc
    fd) give what the path-walking calls give: a symlinked child directory or file is
    resolved inside the root, never on the host, and a dangling one made there; a FIFO is refused unopened; a write
    renames over whatever was there without following it; the temporary name of a dead
    process with the same pid and number is stepped over."""
    root, host = world
    inside = root / str(host).lstrip("/")
    (inside / "sub").mkdir(parents=True)
    (inside / "secret").write_bytes(b"in root")
    (root / "etc/conf.d").symlink_to(host / "sub")
    (root / "etc/cache").symlink_to(host / "secret")
    (root / "etc/out").symlink_to(host / "secret")
    os.mkfifo(root / "etc/fifo")
    with _inroot.open_root(str(root)) as rfd:
        etc = _inroot.resolve_dir(rfd, "/etc")
        try:
            sub = _inroot.child_dir(rfd, etc, "/etc", "conf.d")
            try:
                assert os.path.samefile(f"/proc/self/fd/{sub}", inside / "sub")
            finally:
                os.close(sub)
            made = _inroot.child_dir(rfd, etc, "/etc", "new.d", create=True)
            os.close(made)
            (root / "etc/dangling.d").symlink_to(host / "made")
            made = _inroot.child_dir(rfd, etc, "/etc", "dangling.d", create=True)
            os.close(made)
            assert _inroot.read_file_in(rfd, etc, "/etc", "cache") == b"in root"
            assert _inroot.read_file_in(rfd, etc, "/etc", "missing") is None
            assert opened_names(root / "etc", lambda: _raises_einval(rfd, etc)) == []
            taken = f".out.nvshim-{_inroot._PID[0]}-"
            number = int(_inroot._temp_name("x").rsplit("-", 1)[1]) + 1
            (root / "etc" / f"{taken}{number}").write_bytes(b"left over")
            _inroot.write_file_in(etc, "out", b"written", 0o644, "/etc/out", durable=False)
        finally:
            os.close(etc)
    assert (root / "new.d").exists() is False and (root / "etc/new.d").is_dir()
    assert not (host / "made").exists() and (inside / "made").is_dir()
    assert (root / "etc/out").read_bytes() == b"written" and not (root / "etc/out").is_symlink()
    assert (host / "secret").read_bytes() == b"host data"


def _raises_einval(rfd: _inroot.RootFd, etc: int) -> None:
    with pytest.raises(OSError) as info:
        _inroot.read_file_in(rfd, etc, "/etc", "fifo")
    assert info.value.errno == errno.EINVAL
