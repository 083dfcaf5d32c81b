"""The session guard against driver files left on the host (``tests/helpers/hostguard.py``,
wired in ``tests/conftest.py``), on a temp dir standing for the host's ``/``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.hostguard import guard_message, new_files, nvidia_looking, snapshot

REPO = Path(__file__).resolve().parents[2]


def make_host(host: Path) -> None:
    """A host with a few ordinary files in its driver folders, /lib a link to usr/lib."""
    for folder in (
        "usr/bin",
        "usr/sbin",
        "usr/lib/x86_64-linux-gnu",
        "usr/lib/firmware",
        "usr/share/vulkan/icd.d",
        "etc/alternatives",
    ):
        (host / folder).mkdir(parents=True)
    (host / "lib").symlink_to("usr/lib")
    (host / "usr/bin/ls").write_text("")
    (host / "usr/lib/x86_64-linux-gnu/libc.so.6").write_text("")
    (host / "usr/lib/firmware/skl.bin").write_text("")


@pytest.mark.parametrize(
    "path, looks",
    [
        ("/usr/bin/nvidia-smi", True),
        ("/usr/bin/nvidia-cuda-mps-control", True),
        ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", True),
        ("/usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.0", True),
        ("/usr/lib/x86_64-linux-gnu/libnvcuvid.so.1", True),
        ("/usr/lib/x86_64-linux-gnu/libnvoptix.so.1", True),
        ("/usr/share/glvnd/egl_vendor.d/10_nvidia.json", True),
        ("/usr/share/vulkan/icd.d/nvidia_icd.json", True),
        ("/usr/share/nvidia/nvoptix.bin", True),
        ("/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin", True),
        ("/etc/OpenCL/vendors/nvidia.icd", True),
        ("/usr/bin/ls", False),
        ("/usr/lib/x86_64-linux-gnu/libc.so.6", False),
        ("/usr/lib/firmware/skl_hda.bin", False),
    ],
)
def test_nvidia_looking_names(path: str, looks: bool) -> None:
    """Driver files count (nvidia in the path, libcuda*, libnvcuvid*, libnvoptix*, gsp*.bin);
    other packages' files do not."""
    assert nvidia_looking(path) is looks


def test_new_driver_files_are_found_and_others_ignored(tmp_path: Path) -> None:
    """Files, symlinks and empty mount targets that appear in the watched folders (flat ones at
    the top, firmware and ICD folders to the bottom) are new; a file there before, a non-driver
    file, an empty folder and a file outside the watched folders are not."""
    host = tmp_path / "host"
    make_host(host)
    (host / "usr/bin/nvidia-debugdump").write_text("")  # there before the run: not new
    before = snapshot(str(host))
    assert before == {"/usr/bin/nvidia-debugdump"}
    (host / "usr/bin/nvidia-smi").write_text("")  # runc's empty mount target
    (host / "usr/lib/x86_64-linux-gnu/libcuda.so.1").symlink_to("libcuda.so.550.54.15")
    (host / "lib/firmware/nvidia/550.54.15").mkdir(parents=True)
    (host / "lib/firmware/nvidia/550.54.15/gsp_ga10x.bin").write_text("")
    (host / "usr/share/vulkan/icd.d/nvidia_icd.json").write_text("")
    (host / "usr/bin/htop").write_text("")  # another package, installed meanwhile
    (host / "usr/lib/x86_64-linux-gnu/nvidia").mkdir()  # a folder alone is no file
    (host / "usr/local/bin").mkdir(parents=True)
    (host / "usr/local/bin/nvidia-smi").write_text("")  # not a driver folder
    assert new_files(before, snapshot(str(host))) == [
        "/usr/bin/nvidia-smi",
        "/usr/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/share/vulkan/icd.d/nvidia_icd.json",
    ]


def test_missing_folders_are_no_error(tmp_path: Path) -> None:
    """A host without some of the folders (no /usr/share/vulkan, no /etc/OpenCL) snapshots fine."""
    assert snapshot(str(tmp_path)) == set()


def test_the_message_names_up_to_five_paths() -> None:
    """The failing line names the count and the first five paths, then how many more."""
    new = [f"/usr/bin/nvidia-{i}" for i in range(7)]
    message = guard_message(new)
    assert message.startswith("FAILED: the tests left 7 file(s) on the host ")
    assert message.endswith(", ".join(new[:5]) + " and 2 more")
    assert "\n" not in message


@pytest.mark.parametrize("leaves, rc", [(True, 1), (False, 0)])
def test_a_session_that_leaves_a_driver_file_fails(tmp_path: Path, leaves: bool, rc: int) -> None:
    """tests/conftest.py fails a session whose passing test left a driver file on the "host"
    (exit 1, the paths on stderr), and lets a clean session pass."""
    host = tmp_path / "host"
    make_host(host)
    inner = tmp_path / "test_inner.py"
    body = "(host / 'usr/bin/nvidia-smi').write_text('')" if leaves else "pass"
    inner.write_text(
        f"import pathlib\nhost = pathlib.Path({str(host)!r})\n\n\n"
        f"def test_leaves() -> None:\n    {body}\n"
    )
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.conftest",
            "--rootdir",
            str(tmp_path),
            "-c",
            os.devnull,
            str(inner),
        ],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NVSHIM_TEST_HOST_ROOT": str(host)},
    )
    assert res.returncode == rc, res.stdout + res.stderr
    assert "1 passed" in res.stdout
    found = "file(s) on the host (NVIDIA-looking ones" in res.stderr
    assert found is leaves, res.stderr
    if leaves:
        assert "/usr/bin/nvidia-smi" in res.stderr


def test_podman_state_under_var_lib_containers_is_found_new_or_rewritten(tmp_path: Path) -> None:
    """A file podman or skopeo writes under /var/lib/containers (the blob info cache, which
    ignores --root) is left on the host when it appears or is rewritten during the run,
    whatever its name; one untouched since the snapshot is not."""
    host = tmp_path / "host"
    cache = host / "var/lib/containers/cache"
    cache.mkdir(parents=True)
    (cache / "old.boltdb").write_text("")
    (cache / "blob-info-cache-v1.boltdb").write_text("")
    os.utime(cache / "blob-info-cache-v1.boltdb", ns=(1, 1))
    before = snapshot(str(host))
    (cache / "blob-info-cache-v1.boltdb").write_text("x")
    (host / "var/lib/containers/storage").mkdir()
    new = new_files(before, snapshot(str(host)))
    assert [n.split(" ")[0] for n in new] == [
        "/var/lib/containers/cache/blob-info-cache-v1.boltdb",
        "/var/lib/containers/storage",
    ]
