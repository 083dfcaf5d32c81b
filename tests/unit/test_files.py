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
