"""write_atomic: mode kept, no partial files, no leftovers."""

from __future__ import annotations

import os

import pytest

from nvshim.errors import HostError
from nvshim.files import write_atomic


def test_replaces_and_keeps_mode(tmp_path):
    """The new bytes replace the old ones and the file mode is kept."""
    p = tmp_path / "config.json"
    p.write_bytes(b"old")
    os.chmod(p, 0o600)
    ino = os.stat(p).st_ino
    write_atomic(str(p), b"new")
    assert p.read_bytes() == b"new"
    assert os.stat(p).st_mode & 0o777 == 0o600
    assert os.stat(p).st_ino != ino  # replaced by rename, not rewritten in place
    assert sorted(os.listdir(tmp_path)) == ["config.json"]


def test_new_file_gets_default_mode(tmp_path):
    """A file that didn't exist gets the default mode."""
    p = tmp_path / "x"
    write_atomic(str(p), b"1", default_mode=0o644)
    assert os.stat(p).st_mode & 0o777 == 0o644


def test_unwritable_dir_is_host_error(tmp_path):
    """A write that cannot happen is one HostError and leaves nothing behind."""
    with pytest.raises(HostError, match="cannot write"):
        write_atomic(str(tmp_path / "missing-dir" / "f"), b"x")
    assert os.listdir(tmp_path) == []


def test_readers_never_see_partial_content(tmp_path):
    """While replacing, the target holds either the old or the new bytes (rename semantics)."""
    p = tmp_path / "f"
    p.write_bytes(b"A" * 100000)
    fd = os.open(p, os.O_RDONLY)
    write_atomic(str(p), b"B" * 10)
    assert os.read(fd, 200000) == b"A" * 100000  # the old inode is intact
    os.close(fd)
    assert p.read_bytes() == b"B" * 10


def test_read_upto_reads_a_file_in_one_read_and_follows_growth(tmp_path) -> None:
    """read_upto gives the whole file in one read when it is the size fstat said, follows
    it when it grew since, stops at the limit, and allocates about the file's size, not
    the limit's."""
    import tracemalloc

    from nvshim.files import read_upto

    path = tmp_path / "f"
    path.write_bytes(b"x" * 5000)
    fd = os.open(path, os.O_RDONLY)
    try:
        reads = []
        real = os.read

        def counting(f: int, n: int) -> bytes:
            reads.append(n)
            return real(f, n)

        os.read = counting  # type: ignore[assignment]
        try:
            tracemalloc.start()
            assert read_upto(fd, 5000, 16 << 20) == b"x" * 5000
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            os.read = real  # type: ignore[assignment]
        assert reads == [5001] and peak < 64 << 10, (reads, peak)
        os.lseek(fd, 0, os.SEEK_SET)
        assert read_upto(fd, 100, 16 << 20) == b"x" * 5000  # grew since its fstat
        os.lseek(fd, 0, os.SEEK_SET)
        assert read_upto(fd, 5000, 4097) == b"x" * 4097
    finally:
        os.close(fd)


def test_a_cdi_spec_is_read_without_a_buffer_of_the_bound(tmp_path) -> None:
    """A small CDI spec file is read allocating about its size (not the 1 MiB reads, or
    the 16 MiB bound); one over the bound is still refused in one line."""
    import tracemalloc

    from nvshim.cdi.load import MAX_SPEC_BYTES, read_document
    from nvshim.errors import CdiSpecError

    spec = tmp_path / "s.json"
    spec.write_text('{"cdiVersion": "0.6.0", "kind": "x.com/gpu", "devices": []}')
    tracemalloc.start()
    try:
        assert read_document(str(spec))["kind"] == "x.com/gpu"
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 << 10, peak
    spec.write_bytes(b" " * MAX_SPEC_BYTES + b"{}")
    with pytest.raises(CdiSpecError, match="larger than"):
        read_document(str(spec))
