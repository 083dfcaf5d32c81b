"""Unit tests for nvshim.node.engines.containerd and ``nvshim runtime configure`` (no containerd daemon)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import tomlkit
from click.testing import CliRunner

from nvshim.cli.cmd_runtime import runtime
from nvshim.errors import ConfigError, NvshimError, UsageError
from nvshim.node.engines import containerd, containerd_read, containerd_revert
from nvshim.node.engines.files import RevertResult
from tests.helpers.containerd_samples import DEBIAN_CONFIG

REPO = Path(__file__).resolve().parents[4]
BINARY = "/usr/local/bin/nvshim-runtime"
CRI2 = 'plugins."io.containerd.grpc.v1.cri"'


COMMENTED_V2 = """\
# containerd config, managed by hand
version = 2
root = "/srv/containerd"   # big disk

[plugins."io.containerd.grpc.v1.cri"]
  # mirrored pause image
  sandbox_image = "mirror.local/pause:3.6"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      container_annotations = ["io.kubernetes.cri.*"]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true  # systemd owns cgroups
        Root = "/run/runc-k8s"
"""

V1_CONFIG = """\
# version 1: no version key
[plugins.cri]
  sandbox_image = "mirror.local/pause:3.6"
  [plugins.cri.containerd]
    [plugins.cri.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.cri.containerd.runtimes.runc.options]
        SystemdCgroup = true
"""

V3_CONFIG = """\
version = 3

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
    SystemdCgroup = true
"""


def _default_config() -> str:
    binary = shutil.which("containerd")
    if binary is None:
        pytest.skip("containerd is not installed: cannot generate `containerd config default`")
    return subprocess.run(
        [binary, "config", "default"], check=True, capture_output=True, text=True
    ).stdout


def _data(text: Optional[str]) -> Dict[str, Any]:
    assert text is not None
    return tomlkit.parse(text).unwrap()


def _dig(data: Dict[str, Any], *keys: str) -> Any:
    for key in keys:
        data = data[key]
    return data


def _plan(main: Optional[str], **kwargs: Any) -> containerd.ConfigureResult:
    kwargs.setdefault("config_path", "/etc/containerd/config.toml")
    return containerd.plan_configure(main, **kwargs)


def _by_path(result: Any) -> Dict[str, Optional[str]]:
    return {change.path: change.after for change in result.files}


def _tree(root: Path) -> Dict[str, bytes]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"<dir>")
        for p in sorted(root.rglob("*"))
    }


# ------------------------------------------------------------------- version and table


@pytest.mark.parametrize(
    ("text", "version", "cri"),
    [
        (None, 2, "io.containerd.grpc.v1.cri"),
        ("", 2, "io.containerd.grpc.v1.cri"),
        ("# only a comment\n", 2, "io.containerd.grpc.v1.cri"),
        (V1_CONFIG, 1, "cri"),
        (DEBIAN_CONFIG, 2, "io.containerd.grpc.v1.cri"),
        (V3_CONFIG, 3, "io.containerd.cri.v1.runtime"),
    ],
)
def test_version_picks_cri_table(text: Optional[str], version: int, cri: str) -> None:
    """No file or an empty one is version 2, no ``version`` key is 1, and each picks its CRI table."""
    result = _plan(text, drop_in="")
    assert (result.version, result.cri_plugin) == (version, cri)
    main = _data(result.files[-1].after)
    options = _dig(main, "plugins", cri, "containerd", "runtimes", "nvshim", "options")
    assert options["BinaryName"] == BINARY


@pytest.mark.parametrize("text", [None, ""])
def test_missing_or_empty_config_gets_version_import_and_drop_in(text: Optional[str]) -> None:
    """A missing or empty main file gets ``version = 2`` and the import; the drop-in has a runc.v2 handler."""
    result = _plan(text)
    files = _by_path(result)
    assert list(files) == [containerd.DEFAULT_DROP_IN, "/etc/containerd/config.toml"]
    assert _data(files["/etc/containerd/config.toml"]) == {
        "version": 2,
        "imports": [containerd.DEFAULT_DROP_IN],
    }
    drop = _data(files[containerd.DEFAULT_DROP_IN])
    assert drop["version"] == 2
    assert _dig(drop, "plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes") == {
        "nvshim": {
            "runtime_type": "io.containerd.runc.v2",
            "container_annotations": ["cdi.k8s.io/*"],
            "options": {"BinaryName": BINARY},
        }
    }


def test_the_default_drop_in_sits_beside_the_config() -> None:
    """A config outside /etc/containerd gets its drop-in in conf.d beside it (install.sh's
    rule), imported by that path; it went to /etc/containerd/conf.d whatever the config."""
    files = _by_path(_plan(None, config_path="/srv/k3s/etc/config.toml"))
    assert list(files) == ["/srv/k3s/etc/conf.d/99-nvshim.toml", "/srv/k3s/etc/config.toml"]
    assert _data(files["/srv/k3s/etc/config.toml"])["imports"] == [
        "/srv/k3s/etc/conf.d/99-nvshim.toml"
    ]


def test_default_config_clones_runc_and_copies_whole_cri_table() -> None:
    """With `containerd config default`, the drop-in copies the CRI table and clones every runc option."""
    original = _default_config()
    result = _plan(original)
    files = _by_path(result)
    drop = _data(files[containerd.DEFAULT_DROP_IN])
    source_cri = _dig(_data(original), "plugins", "io.containerd.grpc.v1.cri")
    cri = _dig(drop, "plugins", "io.containerd.grpc.v1.cri")
    runtimes = cri["containerd"].pop("runtimes")
    source_runtimes = source_cri["containerd"].pop("runtimes")
    assert cri == source_cri
    assert runtimes["runc"] == source_runtimes["runc"]
    runc = source_runtimes["runc"]
    handler = runtimes["nvshim"]
    assert set(handler["options"]) == set(runc["options"])
    assert handler["options"]["BinaryName"] == BINARY
    assert handler["options"]["SystemdCgroup"] == runc["options"]["SystemdCgroup"]
    assert {k: v for k, v in handler.items() if "annotations" not in k and k != "options"} == {
        k: v for k, v in runc.items() if "annotations" not in k and k != "options"
    }
    main_after = files["/etc/containerd/config.toml"]
    assert main_after is not None
    changed = [
        (a, b)
        for a, b in zip(original.splitlines(), main_after.splitlines(), strict=False)
        if a != b
    ]
    assert changed == [("imports = []", f'imports = ["{containerd.DEFAULT_DROP_IN}"]')]


def test_clone_keeps_systemd_cgroup_root_and_merges_annotations() -> None:
    """The handler keeps runc's SystemdCgroup and Root and adds the CDI annotation to runc's own list."""
    handler = _dig(
        _data(_plan(COMMENTED_V2).files[0].after),
        "plugins",
        "io.containerd.grpc.v1.cri",
        "containerd",
        "runtimes",
        "nvshim",
    )
    assert handler["options"] == {
        "SystemdCgroup": True,
        "Root": "/run/runc-k8s",
        "BinaryName": BINARY,
    }
    assert handler["container_annotations"] == ["io.kubernetes.cri.*", "cdi.k8s.io/*"]
    assert "pod_annotations" not in handler


def test_pod_annotations_pass_cdi_only_when_asked() -> None:
    """The pod's cdi.k8s.io/* annotations (user-writable) reach the runtime only with pod_cdi_annotations."""

    def handler(**kw: Any) -> Dict[str, Any]:
        return _dig(
            _data(_plan(COMMENTED_V2, **kw).files[0].after),
            "plugins",
            "io.containerd.grpc.v1.cri",
            "containerd",
            "runtimes",
            "nvshim",
        )

    assert "pod_annotations" not in handler()
    assert handler(pod_cdi_annotations=True)["pod_annotations"] == ["cdi.k8s.io/*"]


@pytest.mark.parametrize(
    ("text", "kw", "passed"),
    [
        ("version = 2\n", {}, ["cdi.k8s.io/*"]),
        (f"version = 2\n[{CRI2}]\nenable_cdi = false\n", {}, ["cdi.k8s.io/*"]),
        ("version = 2\n", {"enable_cdi": True}, []),
        (f"version = 2\n[{CRI2}]\nenable_cdi = true\n", {"pod_cdi_annotations": True}, []),
        ("version = 3\n", {}, []),
        (
            'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\nenable_cdi = false\n',
            {},
            ["cdi.k8s.io/*"],
        ),
    ],
    ids=["v2-unset", "v2-off", "v2-enable-cdi", "v2-on-pod", "v3-default-on", "v3-off"],
)
def test_cdi_annotations_pass_only_where_containerd_does_not_inject(
    text: str, kw: Dict[str, Any], passed: List[str]
) -> None:
    """cdi.k8s.io/* reaches nvshim only where containerd's own CDI is off: else both inject."""
    version = 3 if text.startswith("version = 3") else 2
    cri = CRI_PLUGINS_BY_VERSION[version]
    result = _plan(text, **kw)
    handler = _dig(_data(result.files[0].after), "plugins", cri, "containerd", "runtimes", "nvshim")
    assert handler.get("container_annotations", []) == passed
    assert handler.get("pod_annotations", []) == (passed if kw.get("pod_cdi_annotations") else [])
    assert any("--pod-cdi-annotations: nothing passed" in w for w in result.warnings) == bool(
        kw.get("pod_cdi_annotations")
    )


CRI_PLUGINS_BY_VERSION = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}


def test_clone_falls_back_to_default_runtime_entry() -> None:
    """Without a runc handler, the handler named by default_runtime_name is cloned."""
    text = (
        "version = 2\n"
        f"[{CRI2}.containerd]\n"
        'default_runtime_name = "crun"\n'
        f"[{CRI2}.containerd.runtimes.crun]\n"
        'runtime_type = "io.containerd.runc.v2"\n'
        f"[{CRI2}.containerd.runtimes.crun.options]\n"
        'BinaryName = "/usr/bin/crun"\n'
        "SystemdCgroup = true\n"
    )
    handler = _dig(
        _data(_plan(text).files[0].after),
        "plugins",
        "io.containerd.grpc.v1.cri",
        "containerd",
        "runtimes",
        "nvshim",
    )
    assert handler["options"] == {"BinaryName": BINARY, "SystemdCgroup": True}


def test_legacy_linux_shim_gets_runtime_option_too() -> None:
    """A cloned io.containerd.runtime.v1.linux handler also gets ``options.Runtime``, that shim's key."""
    text = (
        '[plugins.cri.containerd.runtimes.runc]\nruntime_type = "io.containerd.runtime.v1.linux"\n'
    )
    handler = _dig(
        _data(_plan(text).files[0].after), "plugins", "cri", "containerd", "runtimes", "nvshim"
    )
    assert handler["options"] == {"BinaryName": BINARY, "Runtime": BINARY}


def test_v1_is_edited_in_place_and_refuses_a_drop_in() -> None:
    """A version 1 file is edited in place under plugins.cri; an explicit drop-in is a usage error."""
    result = _plan(V1_CONFIG)
    assert [c.path for c in result.files] == ["/etc/containerd/config.toml"]
    after = result.files[0].after
    assert after is not None and "version" not in _data(after)
    assert "# version 1: no version key" in after
    assert _dig(_data(after), "plugins", "cri", "sandbox_image") == "mirror.local/pause:3.6"
    with pytest.raises(UsageError, match='version 1 .*--drop-in ""'):
        _plan(V1_CONFIG, drop_in="/etc/containerd/conf.d/x.toml")


def test_v3_uses_runtime_plugin_and_drop_in_version_3() -> None:
    """A version 3 file gets its handler under io.containerd.cri.v1.runtime in a version 3 drop-in."""
    drop = _data(_plan(V3_CONFIG).files[0].after)
    assert drop["version"] == 3
    options = _dig(
        drop,
        "plugins",
        "io.containerd.cri.v1.runtime",
        "containerd",
        "runtimes",
        "nvshim",
        "options",
    )
    assert options == {"SystemdCgroup": True, "BinaryName": BINARY}


@pytest.mark.parametrize("drop_in", [None, ""])
def test_comments_survive_in_main_file(drop_in: Optional[str]) -> None:
    """Every comment and original line of the main file is still there after configure."""
    main = _plan(COMMENTED_V2, drop_in=drop_in, enable_cdi=True).files[-1].after
    assert main is not None
    lines = main.splitlines()
    for line in COMMENTED_V2.splitlines():
        assert line in lines


@pytest.mark.parametrize("text", [None, "", DEBIAN_CONFIG, COMMENTED_V2])
def test_in_place_keeps_the_runtime(text: Optional[str]) -> None:
    """``drop_in=""`` writes the handler into the main file and adds no import (the reference loses it)."""
    result = _plan(text, drop_in="")
    assert len(result.files) == 1
    main = _data(result.files[0].after)
    assert "imports" not in main
    runtimes = _dig(main, "plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes")
    assert runtimes["nvshim"]["options"]["BinaryName"] == BINARY


def test_in_place_twice_changes_nothing_the_second_time() -> None:
    """Configuring an already configured file yields the same text."""
    once = _plan(COMMENTED_V2, drop_in="", enable_cdi=True).files[0].after
    twice = _plan(once, drop_in="", enable_cdi=True).files[0]
    assert not twice.changed


def test_existing_import_glob_is_not_duplicated() -> None:
    """An imports entry that already covers the drop-in (a glob or the path) is not added again."""
    text = 'version = 2\nimports = ["conf.d/*.toml", "/other.toml"]\n'
    main = _plan(text).files[1]
    assert not main.changed
    text2 = 'version = 2\nimports = ["/other.toml"]\n'
    assert _data(_plan(text2).files[1].after)["imports"] == [
        "/other.toml",
        containerd.DEFAULT_DROP_IN,
    ]


# ------------------------------------------------------------------- default runtime, CDI


def test_set_as_default_refused_without_require_allocation() -> None:
    """--set-as-default is refused with the all-GPUs pitfall explained when require-allocation is off."""
    with pytest.raises(UsageError) as info:
        _plan(None, set_as_default=True)
    message = str(info.value)
    assert "NVIDIA_VISIBLE_DEVICES=all" in message and "require-allocation" in message
    assert "--force" in message and "\n" not in message


def test_set_as_default_forced_warns() -> None:
    """With force, the default is set and a warning names the pitfall."""
    result = _plan(None, set_as_default=True, force=True)
    drop = _data(result.files[0].after)
    assert (
        _dig(drop, "plugins", "io.containerd.grpc.v1.cri", "containerd")["default_runtime_name"]
        == "nvshim"
    )
    assert len(result.warnings) == 1 and "every GPU" in result.warnings[0]


def test_set_as_default_allowed_with_require_allocation() -> None:
    """With require-allocation on, the default is set without a warning."""
    result = _plan(V1_CONFIG, set_as_default=True, require_allocation=True, name="gpu")
    assert result.warnings == ()
    assert (
        _dig(_data(result.files[0].after), "plugins", "cri", "containerd")["default_runtime_name"]
        == "gpu"
    )


def test_without_set_as_default_our_default_is_removed() -> None:
    """Configuring without --set-as-default takes back a default that names the handler."""
    configured = _plan(V1_CONFIG, set_as_default=True, require_allocation=True).files[0].after
    result = _plan(configured)
    assert "default_runtime_name" not in _dig(
        _data(result.files[0].after), "plugins", "cri", "containerd"
    )
    assert any("default_runtime_name" in w for w in result.warnings)


@pytest.mark.parametrize(
    ("text", "cri"),
    [(None, ("plugins", "io.containerd.grpc.v1.cri")), (V1_CONFIG, ("plugins", "cri"))],
)
def test_enable_cdi_sets_switch_and_spec_dirs(text: Optional[str], cri: Any) -> None:
    """--enable-cdi sets <cri>.enable_cdi and the default cdi_spec_dirs."""
    table = _dig(_data(_plan(text, enable_cdi=True).files[0].after), *cri)
    assert table["enable_cdi"] is True
    assert table["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]


def test_enable_cdi_keeps_existing_spec_dirs() -> None:
    """Existing cdi_spec_dirs are left as they are."""
    text = f'version = 2\n[{CRI2}]\ncdi_spec_dirs = ["/opt/cdi"]\n'
    table = _dig(
        _data(_plan(text, enable_cdi=True).files[0].after), "plugins", "io.containerd.grpc.v1.cri"
    )
    assert table["cdi_spec_dirs"] == ["/opt/cdi"]


# ------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "main",
    [
        "version = 2\nplugins = {}\n",
        'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\ncontainerd = {}\n',
    ],
)
def test_inline_tables_on_the_way_get_the_handler_inline(main: str) -> None:
    """A CRI table or containerd table written inline (`plugins = {}`) takes the handler as
    inline tables (tomlkit cannot put a [table] inside one), and the file still parses."""
    result = _plan(main, drop_in="", enable_cdi=True)
    after = tomlkit.parse(result.files[0].after or "").unwrap()
    cri = after["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["containerd"]["runtimes"]["nvshim"]["options"]["BinaryName"] == (
        containerd.DEFAULT_BINARY
    )
    assert cri["enable_cdi"] is True


def test_invalid_toml_names_file_and_position() -> None:
    """Invalid TOML is a one-line ConfigError naming the file and tomlkit's line and column."""
    with pytest.raises(
        ConfigError, match=r"^/etc/containerd/config.toml: invalid TOML: .*line 2 col"
    ):
        _plan("version = 2\nimports = [\n")


@pytest.mark.parametrize("drop_in", ["", "/etc/containerd/conf.d/99-nvshim.toml"])
def test_a_crlf_config_keeps_crlf_on_the_lines_added(drop_in: str) -> None:
    """A config whose lines end in CRLF gets the same edit as its LF twin, in CRLF: the
    lines tomlkit added ended in a bare LF, leaving a file of mixed line endings."""
    crlf = COMMENTED_V2.replace("\n", "\r\n")
    path = "/etc/containerd/config.toml"
    got = _by_path(_plan(crlf, drop_in=drop_in, enable_cdi=True))[path]
    twin = _by_path(_plan(COMMENTED_V2, drop_in=drop_in, enable_cdi=True))[path]
    assert got is not None and twin is not None and got != crlf
    assert got == twin.replace("\n", "\r\n")


@pytest.mark.parametrize(
    "main, name",
    [
        (None, "runc"),
        (COMMENTED_V2, "runc"),
        (
            'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
            'default_runtime_name = "runc"\n',
            "runc",
        ),
    ],
)
@pytest.mark.parametrize("drop_in", [None, ""])
def test_name_of_the_default_runtime_is_refused(
    main: Optional[str], name: str, drop_in: Optional[str]
) -> None:
    """nvshim's handler written as the handler containerd runs by default (runc unless
    default_runtime_name says otherwise) sent every pod through nvshim-runtime without
    --set-as-default and its require-allocation guard; now refused unless --set-as-default
    (under the guard)."""
    with pytest.raises(
        UsageError,
        match=f'runtime name "{name}" is containerd\'s default '
        "runtime: nvshim-runtime under that name would run",
    ):
        _plan(main, name=name, drop_in=drop_in)
    with pytest.raises(UsageError, match="require-allocation"):
        _plan(main, name=name, drop_in=drop_in, set_as_default=True)
    assert _plan(main, name=name, drop_in=drop_in, set_as_default=True, require_allocation=True)
    # runc is no default once default_runtime_name names another handler (nvshim's own
    # default_runtime_name is removed without --set-as-default, so naming it is fine too)
    crun = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
    assert _plan(crun + 'default_runtime_name = "crun"\n', name="runc", drop_in=drop_in)
    assert _plan(crun + 'default_runtime_name = "crun"\n', name="crun", drop_in=drop_in)


def test_an_earlier_set_as_default_can_be_configured_again() -> None:
    """The default handler that already runs nvshim-runtime is nvshim's own: configure
    without --set-as-default still takes the default away (with the warning), not refuses."""
    first = _by_path(_plan(COMMENTED_V2, drop_in="", set_as_default=True, force=True))
    again = _plan(first["/etc/containerd/config.toml"], drop_in="")
    assert any("removed default_runtime_name" in w for w in again.warnings)


def test_a_table_written_with_dotted_keys_gets_the_handler_where_containerd_looks() -> None:
    """Under `[plugins]`, a CRI table written with dotted keys made tomlkit write the new
    handler's header without "plugins.": the handler landed at the top level, containerd
    never saw it, and configure said it had written it. The text is now checked to mean
    what was edited; where tomlkit cannot keep the layout the file is written afresh, with
    a warning saying so."""
    import tomllib

    main = 'version = 2\n[plugins]\n"io.containerd.grpc.v1.cri".containerd.snapshotter = "native"\n'
    result = _plan(main, drop_in="")
    data = tomllib.loads(_by_path(result)["/etc/containerd/config.toml"] or "")
    assert set(data) == {"version", "plugins"}
    containerd_table = data["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert containerd_table["snapshotter"] == "native"
    assert containerd_table["runtimes"]["nvshim"]["options"]["BinaryName"] == BINARY
    assert any("rewritten without its comments and layout" in w for w in result.warnings)
    # dotted keys at the top level are laid out right by tomlkit: kept, no warning
    kept = _plan(main.replace('[plugins]\n"', 'plugins."'), drop_in="")
    assert kept.warnings == ()
    assert 'plugins."io.containerd.grpc.v1.cri".containerd.snapshotter = "native"' in (
        _by_path(kept)["/etc/containerd/config.toml"] or ""
    )


def test_invalid_toml_message_keeps_an_acronym() -> None:
    """tomlkit's message is lower-cased to fit ours, but not its acronym: nesting past 100
    levels read "invalid TOML: tOML value nested more than 100 levels deep"."""
    with pytest.raises(ConfigError) as info:
        _plan("version = 2\na = " + "[" * 200 + "]" * 200 + "\n")
    assert str(info.value).startswith(
        "/etc/containerd/config.toml: invalid TOML: TOML value nested more than 100 levels deep"
    )


@pytest.mark.parametrize("value", ["4", '"2"', "true", "[2]", "{}", "2.0"])
def test_unsupported_version(value: str) -> None:
    """A version other than 1, 2 or 3 is one ConfigError line naming it."""
    with pytest.raises(ConfigError, match="unsupported containerd config version .*1, 2 and 3"):
        _plan(f"version = {value}\n")


def test_relative_binary_and_bad_name_are_usage_errors() -> None:
    """A relative runtime binary or a name that is not a DNS label is refused, naming the value."""
    with pytest.raises(UsageError, match='runtime binary "nvshim-runtime" is not an absolute path'):
        _plan(None, binary="nvshim-runtime")
    with pytest.raises(UsageError, match='runtime name "Nv_Shim"'):
        _plan(None, name="Nv_Shim")


def test_non_table_cri_is_a_config_error() -> None:
    """A CRI key that is not a table is reported with its dotted name."""
    with pytest.raises(ConfigError, match='plugins."io.containerd.grpc.v1.cri" is not a table'):
        _plan('version = 2\nplugins = {"io.containerd.grpc.v1.cri" = 1}\n')


# ------------------------------------------------------------------- files: write and revert


@pytest.fixture()
def etc(tmp_path: Path) -> Path:
    """A fake /etc/containerd."""
    root = tmp_path / "etc" / "containerd"
    root.mkdir(parents=True)
    return root


def _configure(etc: Path, **kwargs: Any) -> containerd.ConfigureResult:
    kwargs.setdefault("drop_in", str(etc / "conf.d" / "99-nvshim.toml"))
    return containerd.configure(str(etc / "config.toml"), **kwargs)


def _revert(etc: Path, **kwargs: Any) -> RevertResult:
    kwargs.setdefault("drop_in", str(etc / "conf.d" / "99-nvshim.toml"))
    return containerd_revert.revert(str(etc / "config.toml"), **kwargs)


@pytest.mark.parametrize(
    "damage, named",
    [
        (lambda b, c: b["files"].__setitem__(c, "text"), 'files["{c}"] is not an object'),
        (
            lambda b, c: b["files"][c].__setitem__("original", 5),
            'files["{c}"].original is not a string',
        ),
        (
            lambda b, c: b["files"][c].__setitem__("mode", "0644"),
            'files["{c}"].mode is not an integer',
        ),
        (lambda b, c: b.__setitem__("created_dirs", "/etc"), "created_dirs is not a list of paths"),
    ],
)
def test_a_damaged_backup_is_one_config_error_and_nothing_changes(
    etc: Path, damage: Any, named: str
) -> None:
    """A backup edited into the wrong shape stops revert with one ConfigError naming the
    field (not an AttributeError halfway through), and no file is touched."""
    import json

    config = etc / "config.toml"
    config.write_text(DEBIAN_CONFIG)
    _configure(etc)
    backup = Path(containerd.backup_path(str(config)))
    data = json.loads(backup.read_text())
    damage(data, str(config))
    backup.write_text(json.dumps(data))
    before = _tree(etc.parent)
    with pytest.raises(ConfigError) as err:
        _revert(etc)
    assert str(err.value) == f"{backup}: invalid backup: " + named.format(c=config)
    assert _tree(etc.parent) == before


@pytest.mark.parametrize("original", [None, "", DEBIAN_CONFIG, COMMENTED_V2, V1_CONFIG, V3_CONFIG])
def test_revert_restores_original_bytes(etc: Path, original: Optional[str]) -> None:
    """Configure then revert leaves the directory byte-identical, with modes, and no backup or drop-in."""
    config = etc / "config.toml"
    if original is not None:
        config.write_text(original)
        config.chmod(0o600)
    before = _tree(etc.parent)
    drop_in = "" if original == V1_CONFIG else None
    kwargs: Dict[str, Any] = {"enable_cdi": True} if drop_in is None else {"drop_in": ""}
    result = _configure(etc, **kwargs)
    assert result.written
    if original is not None:
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert Path(containerd.backup_path(str(config))).exists()
    reverted = _revert(etc, **({} if drop_in is None else {"drop_in": ""}))
    assert reverted.used_backup and reverted.warnings == ()
    assert _tree(etc.parent) == before
    if original is not None:
        assert stat.S_IMODE(config.stat().st_mode) == 0o600


@pytest.mark.parametrize("linked", ["config.toml", "conf.d/99-nvshim.toml"])
def test_a_symlinked_config_is_edited_through_the_link_and_reverted(etc: Path, linked: str) -> None:
    """A main file or drop-in that is a symlink to a file kept elsewhere stays that symlink:
    configure edits the file it points to and revert restores that file's bytes. Before,
    both replaced the link with a regular file, cutting it for good."""
    (etc / "config.toml").write_text(COMMENTED_V2)
    (etc / "conf.d").mkdir()
    (etc / "conf.d" / "99-nvshim.toml").write_text("# an old drop-in\n")
    kept = etc.parent / "managed"
    kept.mkdir()
    link = etc / linked
    target = kept / link.name
    os.replace(link, target)
    os.symlink(os.path.relpath(target, link.parent), link)
    original = target.read_bytes()
    _configure(etc)
    assert os.path.islink(link) and os.readlink(link) == os.path.relpath(target, link.parent)
    assert target.read_bytes() != original
    assert b"nvshim" in target.read_bytes()
    _revert(etc)
    assert os.path.islink(link) and target.read_bytes() == original


def test_revert_never_deletes_what_a_drop_in_symlink_points_to(etc: Path) -> None:
    """A drop-in nvshim created, replaced since by a symlink to another file, is removed on
    revert as the link; the file it points to stays (writing through links must not turn
    into deleting through them)."""
    (etc / "config.toml").write_text(COMMENTED_V2)
    _configure(etc)
    drop_in = etc / "conf.d" / "99-nvshim.toml"
    victim = etc.parent / "precious.toml"
    victim.write_text("# not nvshim's\n")
    drop_in.unlink()
    os.symlink(victim, drop_in)
    _revert(etc)
    assert not os.path.lexists(drop_in)
    assert victim.read_text() == "# not nvshim's\n"


@pytest.mark.parametrize("in_place", [False, True])
def test_a_config_with_a_byte_order_mark_is_edited_and_keeps_it(etc: Path, in_place: bool) -> None:
    """containerd starts with a config.toml that begins with a UTF-8 BOM (Windows editors
    write one); configure refused it ("invalid TOML: empty key at line 1"). Now the file
    gets the same edit as without the BOM, keeps the BOM, and revert restores its bytes."""
    config = etc / "config.toml"
    config.write_bytes(b"\xef\xbb\xbf" + COMMENTED_V2.encode())
    kwargs = {"drop_in": "" if in_place else str(etc / "conf.d" / "99-nvshim.toml")}
    without = containerd.plan_configure(COMMENTED_V2, config_path=str(config), **kwargs)
    _configure(etc, **kwargs)
    main_after = [c.after for c in without.files if c.path == str(config)][0]
    assert config.read_bytes() == b"\xef\xbb\xbf" + main_after.encode()
    assert _configure(etc, **kwargs).written == ()
    _revert(etc, **kwargs)
    assert config.read_bytes() == b"\xef\xbb\xbf" + COMMENTED_V2.encode()


def test_a_failed_write_puts_back_what_was_written(etc: Path) -> None:
    """The drop-in is written before the main file that imports it; when the main file
    cannot be written (immutable here), configure left the drop-in, its new directory and
    the backup behind. Now everything is put back and the error is the one line."""
    config = etc / "config.toml"
    config.write_text(COMMENTED_V2)
    before = _tree(etc.parent)
    if subprocess.run(["chattr", "+i", str(config)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported here")
    try:
        with pytest.raises(NvshimError) as info:
            _configure(etc)
    finally:
        subprocess.run(["chattr", "-i", str(config)], check=True)
    assert str(info.value) == f"cannot write {config}: Operation not permitted"
    assert _tree(etc.parent) == before


def test_new_files_are_0644_and_parents_created(etc: Path) -> None:
    """A new main file and drop-in are 0644 and the drop-in's directory is created."""
    _configure(etc)
    assert stat.S_IMODE((etc / "config.toml").stat().st_mode) == 0o644
    assert stat.S_IMODE((etc / "conf.d" / "99-nvshim.toml").stat().st_mode) == 0o644


def test_dry_run_writes_nothing(etc: Path) -> None:
    """--dry-run returns the files but leaves the directory untouched."""
    (etc / "config.toml").write_text(COMMENTED_V2)
    before = _tree(etc.parent)
    result = _configure(etc, dry_run=True, enable_cdi=True)
    assert result.written == () and all(c.changed for c in result.files)
    assert _tree(etc.parent) == before
    _configure(etc)
    configured = _tree(etc.parent)
    revert_plan = _revert(etc, dry_run=True)
    assert revert_plan.restored and _tree(etc.parent) == configured


def test_second_configure_writes_nothing(etc: Path) -> None:
    """A second identical configure writes no file."""
    (etc / "config.toml").write_text(DEBIAN_CONFIG)
    _configure(etc)
    assert _configure(etc).written == ()


def test_revert_keeps_edits_made_after_configure(etc: Path) -> None:
    """A main file edited after configure loses only nvshim's import, and the drop-in goes."""
    config = etc / "config.toml"
    config.write_text(COMMENTED_V2)
    _configure(etc)
    edited = config.read_text().replace("mirror.local/pause:3.6", "mirror.local/pause:3.9")
    config.write_text(edited)
    result = _revert(etc)
    assert result.edited == (str(config),)
    assert any("changed since nvshim wrote it" in w for w in result.warnings)
    assert config.read_text() == COMMENTED_V2.replace("pause:3.6", "pause:3.9")
    assert not (etc / "conf.d").exists()


def test_structural_revert_without_backup(etc: Path) -> None:
    """Without the backup, revert removes the handler, our default, our import and the drop-in, and says so."""
    config = etc / "config.toml"
    config.write_text(COMMENTED_V2)
    _configure(etc, drop_in="", set_as_default=True, require_allocation=True)
    os.unlink(containerd.backup_path(str(config)))
    result = _revert(etc, drop_in="")
    assert not result.used_backup
    assert any("no backup" in w for w in result.warnings)
    assert _data(config.read_text()) == _data(COMMENTED_V2)
    assert [line for line in config.read_text().splitlines() if line] == [
        line for line in COMMENTED_V2.splitlines() if line
    ]

    config.write_text(DEBIAN_CONFIG)
    _configure(etc)
    os.unlink(containerd.backup_path(str(config)))
    result = _revert(etc)
    assert result.removed == (str(etc / "conf.d" / "99-nvshim.toml"),)
    assert _data(config.read_text()) == _data(DEBIAN_CONFIG)
    assert "imports" not in config.read_text()


def test_structural_revert_keeps_import_array_layout(etc: Path) -> None:
    """Without a backup, only our entry leaves a multi-line imports array; its comments stay."""
    config = etc / "config.toml"
    other = etc / "other.toml"
    original = f'version = 2\nimports = [\n  "{other}",  # site settings\n]\n'
    config.write_text(original)
    _configure(etc)
    assert str(etc / "conf.d" / "99-nvshim.toml") in config.read_text()
    os.unlink(containerd.backup_path(str(config)))
    _revert(etc)
    assert config.read_text() == original


def test_structural_revert_leaves_a_foreign_drop_in(etc: Path) -> None:
    """Without a backup, a drop-in that has no handler of ours is left in place with a warning."""
    drop_in = etc / "conf.d" / "99-nvshim.toml"
    drop_in.parent.mkdir()
    drop_in.write_text("version = 2\n")
    result = _revert(etc)
    assert drop_in.read_text() == "version = 2\n"
    assert any("has no runtime" in w for w in result.warnings)


def test_revert_restores_a_drop_in_that_existed(etc: Path) -> None:
    """A file that was at the drop-in path before configure comes back byte for byte."""
    drop_in = etc / "conf.d" / "99-nvshim.toml"
    drop_in.parent.mkdir()
    drop_in.write_text("# someone else's\nversion = 2\n")
    _configure(etc)
    assert "nvshim" in drop_in.read_text()
    _revert(etc)
    assert drop_in.read_text() == "# someone else's\nversion = 2\n"


def test_read_handlers_after_configure(etc: Path) -> None:
    """read_handlers follows the import and reports BinaryName and the default runtime."""
    config = etc / "config.toml"
    assert containerd_read.read_handlers(str(config)).handlers == {}
    assert containerd_read.read_handlers(str(config)).default_runtime_name == "runc"
    config.write_text(COMMENTED_V2)
    _configure(etc, set_as_default=True, force=True, binary="/opt/nvshim/bin/nvshim-runtime")
    view = containerd_read.read_handlers(str(config))
    assert view.handlers == {"runc": None, "nvshim": "/opt/nvshim/bin/nvshim-runtime"}
    assert view.default_runtime_name == "nvshim"
    assert view.files == (str(config), str(etc / "conf.d" / "99-nvshim.toml"))


_READ_PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
from nvshim.errors import NvshimError
from nvshim.node.engines import containerd, containerd_read
try:
    if sys.argv[2] == "read":
        containerd_read.read_handlers(sys.argv[3])
    else:
        containerd.configure(sys.argv[3], drop_in="")
except NvshimError as exc:
    print(exc)
"""


@pytest.mark.parametrize("how", ["read", "configure"])
@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_a_fifo_or_device_config_is_an_error_not_a_hang(etc: Path, how: str, special: str) -> None:
    """An imported file (doctor reads imports) or the main file that is a FIFO or a symlink
    to /dev/zero is one HostError naming it: reading it hung forever (or never ended). In a
    subprocess, so that a regression fails on the timeout instead of hanging the suite."""
    config = etc / "config.toml"
    bad = etc / "conf.d" / "a.toml" if how == "read" else config
    bad.parent.mkdir(exist_ok=True)
    if how == "read":
        config.write_text(f'version = 2\nimports = ["{etc}/conf.d/*.toml"]\n')
    if special == "fifo":
        os.mkfifo(bad)
    else:
        os.symlink(special, bad)
    out = subprocess.run(
        [sys.executable, "-I", "-c", _READ_PROBE, str(REPO), how, str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (out.returncode, out.stderr) == (0, "")
    assert out.stdout == f"{bad} is not a regular file, so not a config file\n"


def test_read_handlers_reports_missing_import(etc: Path) -> None:
    """A missing non-glob import is reported as a problem, not an exception."""
    config = etc / "config.toml"
    config.write_text('version = 2\nimports = ["missing.toml"]\n')
    assert containerd_read.read_handlers(str(config)).problems == (
        f"import {etc / 'missing.toml'} does not exist",
    )


def test_example_drop_in_matches_generated() -> None:
    """config/containerd-dropin.example.toml is exactly what configure writes for a new node."""
    example = (REPO / "config" / "containerd-dropin.example.toml").read_text()
    assert example == _plan(None).files[0].after


# ------------------------------------------------------------------- command line


def _invoke(args: List[str]) -> Any:
    """Run the group as the ``nvshim`` entry point will: NvshimError comes back as the exception."""
    return CliRunner().invoke(runtime, args, standalone_mode=False)


def test_help_documents_every_flag() -> None:
    """``configure --help`` lists every flag and explains the --set-as-default pitfall."""
    result = CliRunner().invoke(runtime, ["configure", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for flag in (
        "--runtime",
        "--config",
        "--drop-in",
        "--name",
        "--binary",
        "--set-as-default",
        "--force",
        "--enable-cdi",
        "--pod-cdi-annotations",
        "--dry-run",
        "--revert",
    ):
        assert flag in result.output
    assert "NVIDIA_VISIBLE_DEVICES=all" in result.output
    assert "require-allocation" in result.output


def test_cli_dry_run_prints_labelled_files(etc: Path) -> None:
    """--dry-run prints each file after a ``# --- <path> ---`` line and writes nothing."""
    config = etc / "config.toml"
    drop_in = etc / "conf.d" / "99-nvshim.toml"
    result = _invoke(["configure", "--config", str(config), "--drop-in", str(drop_in), "--dry-run"])
    assert result.exception is None
    assert result.output.startswith(f"# --- {drop_in} ---\n")
    assert f"# --- {config} ---\nversion = 2\n" in result.output
    assert not config.exists() and not drop_in.exists()


def test_cli_writes_and_summarises(etc: Path) -> None:
    """A real run writes the files and reports them on stderr with the restart hint."""
    config = etc / "config.toml"
    drop_in = etc / "conf.d" / "99-nvshim.toml"
    runner = CliRunner()
    result = runner.invoke(
        runtime,
        ["configure", "--config", str(config), "--drop-in", str(drop_in)],
        standalone_mode=False,
    )
    assert result.exception is None
    assert result.stdout == ""
    assert result.stderr == (
        f'wrote {drop_in}, {config}; restart containerd to use runtime "nvshim"\n'
    )
    result = runner.invoke(
        runtime, ["configure", "--config", str(config), "--drop-in", str(drop_in), "--revert"]
    )
    assert result.exit_code == 0 and not config.exists()


def test_cli_set_as_default_refused_by_config(etc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no runtime installed at --binary, the command reads require-allocation from the
    config $NVSHIM_CONFIG names: off refuses, on allows."""
    nvshim_config = etc.parent / "nvshim.yaml"
    monkeypatch.setenv("NVSHIM_CONFIG", str(nvshim_config))
    args = [
        "configure",
        "--config",
        str(etc / "config.toml"),
        "--drop-in",
        "",
        "--set-as-default",
        "--binary",
        str(etc.parent / "not-installed" / "nvshim-runtime"),
    ]
    result = _invoke(args)  # named but missing: an error naming it
    assert isinstance(result.exception, NvshimError)
    assert str(nvshim_config) in str(result.exception)
    nvshim_config.write_text("require-allocation: false\n")
    result = _invoke(args)
    assert isinstance(result.exception, UsageError)
    assert f"off in {nvshim_config}, the config " in str(result.exception)
    assert not (etc / "config.toml").exists()
    pytest.importorskip("nvshim.config")
    nvshim_config.write_text("require-allocation: true\n")
    result = _invoke(args)
    assert result.exception is None, result.exception
    assert "default_runtime_name" in (etc / "config.toml").read_text()


def test_cli_revert_rejects_configure_flags(etc: Path) -> None:
    """--revert with a configure-only flag is a usage error naming it."""
    result = _invoke(
        ["configure", "--config", str(etc / "config.toml"), "--revert", "--enable-cdi"]
    )
    assert isinstance(result.exception, UsageError)
    assert "--enable-cdi" in str(result.exception)


def test_cli_error_is_nvshim_error(etc: Path) -> None:
    """Invalid TOML reaches the entry point as an NvshimError (printed as one ``nvshim:`` line)."""
    (etc / "config.toml").write_text("version = [\n")
    result = _invoke(["configure", "--config", str(etc / "config.toml")])
    assert isinstance(result.exception, NvshimError)
    assert str(etc / "config.toml") in str(result.exception)


# --- a drop-in's copy of the CRI table drifts from the main file -----------------------------

MAIN_TOML = """version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.6"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = true
"""


@pytest.mark.parametrize(
    "extra", [{}, {"enable_cdi": True}, {"set_as_default": True, "require_allocation": True}]
)
def test_doctor_finds_a_stale_drop_in_and_configure_resyncs_it(tmp_path: Path, extra: dict) -> None:
    """Issue 12 item 11: after `runtime configure` with a drop-in, an edit of the main file's CRI
    table (sandbox_image) is shadowed by the drop-in's copy: doctor fails naming the key and the
    fix, and running configure again copies the table anew (doctor quiet again)."""
    from nvshim.node.doctor import checks as doctor
    from nvshim.node.doctor import engines as doctor_engines
    from nvshim.node.doctor.findings import DoctorOptions
    from nvshim.node.engines.containerd import configure
    from nvshim.node.engines.containerd_read import drop_in_drift

    main_file = tmp_path / "config.toml"
    main_file.write_text(MAIN_TOML)
    drop_in = tmp_path / "conf.d" / "99-nvshim.toml"
    binary = tmp_path / "nvshim-runtime"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    args = dict(drop_in=str(drop_in), binary=str(binary), **extra)
    configure(str(main_file), **args)
    assert drop_in_drift(str(main_file)) == []  # nvshim's own additions are not drift
    assert doctor_engines.check_drop_in_drift(str(main_file)) is None

    main_file.write_text(
        main_file.read_text().replace("pause:3.6", "pause:3.9")
    )  # an operator edit
    drift = drop_in_drift(str(main_file))
    assert drift == [(str(drop_in), ['plugins."io.containerd.grpc.v1.cri".sandbox_image'])]
    finding = doctor_engines.check_drop_in_drift(str(main_file))
    assert finding is not None and finding.status == "fail"
    assert "sandbox_image" in finding.detail
    # the drop-in sits where configure puts it for this config (beside it): no --drop-in;
    # the flags it was written with are kept
    flags = {"enable_cdi": " --enable-cdi", "set_as_default": " --set-as-default"}
    kept = "".join(flags[k] for k in extra if k in flags)
    assert finding.fix == "re-run runtime configure (--verbose)"
    assert finding.detail.endswith(
        f"Fix: nvshim runtime configure --runtime containerd --config {main_file} "
        f"--binary {binary}{kept} (copies the tables again)"
    )
    options = DoctorOptions(
        config_path=str(tmp_path / "none.yaml"), containerd_config=str(main_file)
    )
    assert any(
        f.check == "containerd-drop-in" and f.status == "fail" for f in doctor.run_checks(options)
    )

    configure(str(main_file), **args)  # the fix doctor names
    assert drop_in_drift(str(main_file)) == []
    assert 'sandbox_image = "registry.k8s.io/pause:3.9"' in drop_in.read_text()
