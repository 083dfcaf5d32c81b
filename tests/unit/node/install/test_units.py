"""The systemd units and udev rule install.sh writes (``nvshim.node.install.units``): the
bytes install.sh wrote before they moved here, systemd's escaping of ``%``, ``$``, quotes
and spaces, the values refused, and the command line install.sh runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nvshim.agent import AGENT_SOCKET
from nvshim.errors import ConfigError
from nvshim.node.install.units import (
    exec_path,
    exec_word,
    main,
    path_value,
    render_agent_service,
    render_refresh_path,
    render_refresh_rule,
    render_refresh_service,
)

REPO = Path(__file__).resolve().parents[4]
WATCHED = [
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/proc/driver/nvidia/version",
    "/lib/modules/6.1/modules.dep",
    "/usr/lib64/libcuda.so.1",
    "/etc/nvshim/config.yaml",
]

# What install.sh's echo lines wrote for the default settings (captured from it before the
# units moved to Python; install.sh now writes exactly these bytes).
PATH_UNIT = """\
# Written by nvshim's install.sh: start nvshim-cdi-refresh.service when the NVIDIA driver changes.
[Unit]
Description=Watch the NVIDIA driver for nvshim's CDI refresh

[Path]
PathChanged=/lib/modules/%v/modules.dep
PathChanged=/lib/modules/%v/modules.dep.bin
PathChanged=/usr/lib/x86_64-linux-gnu/libcuda.so.1
PathChanged=/usr/lib64/libcuda.so.1
PathChanged=/etc/nvshim/config.yaml
PathChanged=/usr/local/bin/nvshim
Unit=nvshim-cdi-refresh.service

[Install]
WantedBy=multi-user.target
"""
REFRESH_SERVICE = """\
# Written by nvshim's install.sh: regenerate nvshim's CDI specs, node plan and CDI index.
[Unit]
Description=Refresh nvshim's CDI specs, node plan and CDI index for the NVIDIA driver
ConditionPathExists=|/sys/module/nvidia
ConditionPathExists=|/sys/module/nvidia_current
StartLimitIntervalSec=600
StartLimitBurst=10

[Service]
Type=oneshot
ExecStart=/usr/local/bin/nvshim cdi refresh --config /etc/nvshim/config.yaml
Restart=on-failure
RestartSec=15

[Install]
WantedBy=multi-user.target
"""
RULE = """\
# Written by nvshim's install.sh: refresh nvshim's CDI specs when the NVIDIA module is loaded.
ACTION=="add", SUBSYSTEM=="module", KERNEL=="nvidia|nvidia_current", \
RUN+="/usr/bin/systemctl --no-block start nvshim-cdi-refresh.service"
"""
AGENT_SERVICE = """\
# Written by nvshim's install.sh: nvshim's node agent (GPU creates without a Python start).
[Unit]
Description=nvshim node agent
After=local-fs.target

[Service]
Type=simple
ExecStart=/usr/local/bin/nvshim agent --config /etc/nvshim/config.yaml \
--socket /run/nvshim/agent.sock --nri-socket none
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
"""


def test_default_settings_render_the_bytes_install_sh_wrote() -> None:
    """For /usr/local/bin and /etc/nvshim the four files are byte for byte what install.sh's
    echo lines wrote (procfs and /lib/modules paths left out of PathChanged)."""
    assert render_refresh_path("/usr/local/bin", WATCHED) == PATH_UNIT
    assert render_refresh_service("/usr/local/bin", "/etc/nvshim") == REFRESH_SERVICE
    assert render_refresh_rule("/usr/bin/systemctl") == RULE
    assert render_agent_service("/usr/local/bin", "/etc/nvshim") == AGENT_SERVICE


def test_percent_is_doubled_as_install_sh_did() -> None:
    """A ``%`` in a folder or a watched path becomes ``%%`` (a specifier otherwise), as
    install.sh's sed did; the NRI socket is passed as given."""
    path = render_refresh_path("/b%in", ["/opt/dr%iver/libcuda.so.1", "/my dir/libcuda.so.1"])
    assert (
        "PathChanged=/opt/dr%%iver/libcuda.so.1\nPathChanged=/my dir/libcuda.so.1\n"
        "PathChanged=/b%%in/nvshim\n"
    ) in path
    assert (
        "ExecStart=/b%%in/nvshim cdi refresh --config /e%%tc/config.yaml\n"
        in render_refresh_service("/b%in", "/e%tc")
    )
    agent = render_agent_service("/b%in", "/e", "/run/containerd/nri/nri.sock")
    assert (
        f"ExecStart=/b%%in/nvshim agent --config /e/config.yaml --socket {AGENT_SOCKET} "
        "--nri-socket /run/containerd/nri/nri.sock\n"
    ) in agent


def test_agent_unit_serves_the_agents_one_socket() -> None:
    """nvshim-agent.service names the socket nvshim.agent.AGENT_SOCKET names; an empty NRI
    socket setting means none."""
    (line,) = [
        x for x in render_agent_service("/b", "/e", "").splitlines() if x.startswith("ExecStart=")
    ]
    assert line.endswith(f" --socket {AGENT_SOCKET} --nri-socket none")


@pytest.mark.parametrize(
    "word, written",
    [
        ("/usr/local/bin/nvshim", "/usr/local/bin/nvshim"),
        ("--nri-socket", "--nri-socket"),
        ("/a%b", "/a%%b"),
        ("/my dir/nvshim", '"/my dir/nvshim"'),
        ("/a$HOME", '"/a$$HOME"'),
        ('/a"b', '"/a\\"b"'),
        ("/a\\b", '"/a\\\\b"'),
        ("/a'b", '"/a\'b"'),
        ("/a;b", '"/a;b"'),
        (";", '";"'),
        ("/a\tb\nc", '"/a\\tb\\nc"'),
        ("/a\x01b", '"/a\\x01b"'),
        ("/%$ x", '"/%%$$ x"'),
        ("", '""'),
    ],
)
def test_exec_word_quotes_by_systemds_rules(word: str, written: str) -> None:
    """An ExecStart= word is written as it is when plain, else double-quoted with ``\\``,
    ``"`` and control characters escaped; ``%`` and ``$`` doubled either way."""
    assert exec_word(word) == written


def test_folders_with_spaces_are_one_execstart_word() -> None:
    """A bindir or etcdir with a space stays one word of ExecStart (the echo lines split
    it into two)."""
    service = render_refresh_service("/opt/my bin", "/etc/my nvshim")
    assert (
        'ExecStart="/opt/my bin/nvshim" cdi refresh --config "/etc/my nvshim/config.yaml"\n'
        in service
    )
    agent = render_agent_service("/opt/my bin", "/etc/nvshim", "/run/my nri.sock")
    assert agent.count('"') == 4 and '--nri-socket "/run/my nri.sock"\n' in agent


@pytest.mark.parametrize(
    "path, written",
    [
        ("/usr/local/bin/nvshim", "/usr/local/bin/nvshim"),
        ("/a%b/nvshim", "/a%%b/nvshim"),
        ("/a$b/nvshim", "/a$b/nvshim"),
        ("/my bin/nvshim", '"/my bin/nvshim"'),
        ("/my $b%in;/nvshim", '"/my $b%%in;/nvshim"'),
    ],
)
def test_exec_path_quotes_the_command_by_systemds_rules(path: str, written: str) -> None:
    """ExecStart='s command is double-quoted when it holds a space (or another character a
    word splits on), ``%`` doubled, ``$`` as it is (systemd expands no variable there)."""
    assert exec_path(path) == written


@pytest.mark.parametrize("path", ['/a"b/nvshim', "/a'b/nvshim", "/a\\b/nvshim", "/a\tb/nvshim"])
def test_exec_path_refuses_what_systemd_refuses(path: str) -> None:
    """A quote, a backslash or a control character in the command is refused with one line
    naming it: systemd would not start such a command however it is escaped."""
    with pytest.raises(ConfigError, match=r"cannot be written in a systemd unit") as caught:
        render_agent_service(path.rsplit("/", 1)[0], "/etc/nvshim")
    assert repr(path) in str(caught.value)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
@pytest.mark.parametrize("name", ["my b%i$n", "a$b", "x;y"])
def test_systemd_finds_the_quoted_command(tmp_path: Path, name: str) -> None:
    """systemd itself reads ExecStart's command back to the exact folder: verify passes for
    a bindir with a space, ``%``, ``$`` or ``;``, and fails once that command is gone."""
    bindir = tmp_path / name
    bindir.mkdir()
    command = bindir / "nvshim"
    command.write_text("#!/bin/sh\n")
    command.chmod(0o755)
    unit = tmp_path / "nvshim-cdi-refresh.service"
    unit.write_text(render_refresh_service(str(bindir), "/etc/my $nvshim"))

    def verify() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["systemd-analyze", "verify", "--man=no", str(unit)],
            capture_output=True,
            text=True,
            timeout=60,
        )

    checked = verify()
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr
    command.unlink()
    checked = verify()
    assert checked.returncode != 0, checked.stderr


def test_path_value_keeps_spaces_and_doubles_percent() -> None:
    """A PathChanged= value is the rest of the line: spaces as they are, ``%`` doubled."""
    assert path_value("/my dir/a%b") == "/my dir/a%%b"


@pytest.mark.parametrize("path", ["/a\nPathChanged=/etc/shadow", "/a\rb", "/a\\"])
def test_paths_a_unit_cannot_carry_are_refused(path: str) -> None:
    """A watched path with a line break, or a trailing backslash that would continue the
    line, is refused with one line naming it (ExecStart= C-escapes a line break instead)."""
    with pytest.raises(ConfigError, match=r"cannot be written in a systemd unit") as caught:
        render_refresh_path("/usr/local/bin", ["/ok", path])
    assert repr(path) in str(caught.value)
    assert "\n" not in exec_word(path) and "\r" not in exec_word(path)


@pytest.mark.parametrize(
    "systemctl", ["bin/systemctl", "/my bin/systemctl", "/a$b", "/a%b", '/a"b']
)
def test_udev_rule_refuses_a_systemctl_it_cannot_name(systemctl: str) -> None:
    """udev splits RUN on spaces and expands ``$`` and ``%``: a systemctl path other than a
    plain absolute one is refused, naming it."""
    with pytest.raises(ConfigError, match=r"cannot be named in a udev rule") as caught:
        render_refresh_rule(systemctl)
    assert repr(systemctl) in str(caught.value)


def test_main_prints_one_file_per_kind(capsys: pytest.CaptureFixture[str]) -> None:
    """install.sh's calls print the same text as the functions: the watched paths come as
    one argument, one a line; --nri-socket defaults to none."""
    main(["nvshim-cdi-refresh.path", "--bindir", "/usr/local/bin", "--watched", "\n".join(WATCHED)])
    assert capsys.readouterr().out == PATH_UNIT
    main(["nvshim-cdi-refresh.service", "--bindir", "/usr/local/bin", "--etcdir", "/etc/nvshim"])
    assert capsys.readouterr().out == REFRESH_SERVICE
    main(["99-nvshim-cdi-refresh.rules", "--systemctl", "/usr/bin/systemctl"])
    assert capsys.readouterr().out == RULE
    main(["nvshim-agent.service", "--bindir", "/usr/local/bin", "--etcdir", "/etc/nvshim"])
    assert capsys.readouterr().out == AGENT_SERVICE


def test_main_refuses_in_one_line_and_prints_nothing() -> None:
    """A value a unit cannot carry: exit 1, one line on stderr naming the file and the
    value, nothing on stdout (install.sh writes no empty unit)."""
    res = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            "import sys; sys.path[0:0] = [sys.argv.pop(1)]\n"
            "from nvshim.node.install.units import main; main()",
            str(REPO),
            "nvshim-cdi-refresh.path",
            "--bindir",
            "/b",
            "--watched",
            "/ok\n/a\\",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.count("\n") == 1
    assert res.stderr.startswith("install.sh: nvshim-cdi-refresh.path: path '/a\\\\' cannot be"), (
        res.stderr
    )
