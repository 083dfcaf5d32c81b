"""Unit tests of the doctor's NRI check: whether containerd's NRI is on, by config and version."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvshim.node.doctor.nri import DEFAULT_NRI_SOCKET, check_nri, nri_enabled

ON = '[plugins."io.containerd.nri.v1.nri"]\n  disable = false\n  socket_path = "/x/nri.sock"\n'
OFF = '[plugins."io.containerd.nri.v1.nri"]\n  disable = true\n'


@pytest.mark.parametrize(
    "text,version,want",
    [
        ("", (1, 7), (False, DEFAULT_NRI_SOCKET)),
        ("", (2, 1), (True, DEFAULT_NRI_SOCKET)),
        (ON, (1, 7), (True, "/x/nri.sock")),
        (OFF, (2, 0), (False, DEFAULT_NRI_SOCKET)),
        (ON, (1, 6), (None, "/x/nri.sock")),
    ],
)
def test_nri_enabled(tmp_path: Path, text: str, version: tuple, want: tuple) -> None:
    """containerd 1.7 has NRI off unless disable = false; 2.x on unless disable = true; 1.6 has none."""
    config = tmp_path / "config.toml"
    config.write_text("version = 2\n" + text)
    assert nri_enabled(str(config), version)[:2] == want


def test_nri_turned_on_in_an_imported_drop_in_is_on(tmp_path: Path) -> None:
    """containerd 1.7 with NRI turned on in a file the main config imports (nvshim's own drop-in: runtime configure --enable-nri) has NRI on, and the reason names that file; a later import turning it off again wins."""
    drop_in = tmp_path / "conf.d" / "99-nvshim.toml"
    drop_in.parent.mkdir()
    drop_in.write_text("version = 2\n" + ON)
    config = tmp_path / "config.toml"
    config.write_text(f'version = 2\nimports = ["{drop_in}"]\n')
    on, socket, why = nri_enabled(str(config), (1, 7))
    assert (on, socket) == (True, "/x/nri.sock") and str(drop_in) in why
    later = tmp_path / "conf.d" / "zz-off.toml"
    later.write_text("version = 2\n" + OFF)
    config.write_text(f'version = 2\nimports = ["{drop_in}", "{later}"]\n')
    assert nri_enabled(str(config), (1, 7))[0] is False


def test_check_nri_without_engine_skips(tmp_path: Path) -> None:
    """No containerd and no CRI-O: the check is skipped, not failed."""
    found = check_nri(
        str(tmp_path / "c.toml"),
        str(tmp_path / "no-containerd"),
        str(tmp_path / "agent.sock"),
        str(tmp_path / "crio.conf"),
    )
    assert found.status == "skip"


def test_nri_plugins_names_the_processes_connected_to_the_socket(tmp_path: Path) -> None:
    """The process holding the client end of a connection to a unix socket is found by its pid (sock_diag, then /proc); a socket nobody is connected to has none."""
    import os
    import socket

    from nvshim.node.doctor.nripeers import NriPeer, is_nvidia_plugin, nri_plugins

    path = str(tmp_path / "nri.sock")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        server.listen()
        assert nri_plugins(path) == []
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(path)
            accepted, _ = server.accept()
            with accepted:
                found = nri_plugins(path)
                if found is None:
                    pytest.skip("no sock_diag in this kernel")
                assert [p.pid for p in found] == [os.getpid()]
    assert is_nvidia_plugin(NriPeer(7, ("/usr/bin/nvidia-ctk-installer", "--enable-nri-plugin")))
    assert not is_nvidia_plugin(NriPeer(7, ("/usr/bin/python3", "-m", "nvshim", "agent")))
