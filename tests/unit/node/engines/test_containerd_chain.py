"""containerd's load order (imports, globs) and what nvshim's drop-in carries from it."""

from __future__ import annotations

import tomllib
from pathlib import Path

from nvshim.node.doctor.findings import DoctorOptions
from nvshim.node.doctor.handlers import check_lost_handlers, reconfigure_command
from nvshim.node.engines import containerd
from nvshim.node.engines.containerd_chain import go_glob, load_chain
from nvshim.node.engines.containerd_read import read_handlers
from nvshim.node.engines.files import parse_toml
from tests.helpers.containerd_samples import (
    NVIDIA_HANDLERS,
    RUNC_CONFIG,
    nvidia_ctk_drop_in,
    nvidia_ctk_main,
)

V3 = "io.containerd.cri.v1.runtime"


def _chain(config: Path, drop_in: str = "") -> list:
    doc = parse_toml(config.read_text(), str(config))
    return [
        (Path(f.path).name, f.depth) for f in load_chain(str(config), doc, drop_in=drop_in).files
    ]


def test_go_glob_matches_dot_files_sorted_bytewise(tmp_path: Path) -> None:
    """A ``*`` glob matches dot files (Go's filepath.Glob) and sorts matches byte-wise."""
    for name in ("b.toml", ".h.toml", "B.toml", "a.txt"):
        (tmp_path / name).write_text("")
    assert [Path(p).name for p in go_glob(f"{tmp_path}/*.toml")] == [".h.toml", "B.toml", "b.toml"]


def test_load_order_is_breadth_first_and_places_the_drop_in(tmp_path: Path) -> None:
    """Imports load breadth first, each once; a new drop-in goes where a covering glob sorts
    it, else after the main file's own imports and before theirs."""
    (tmp_path / "d").mkdir()
    (tmp_path / "a.toml").write_text('imports = ["nested.toml"]\n')
    (tmp_path / "nested.toml").write_text("")
    (tmp_path / "d" / "50-x.toml").write_text("")
    (tmp_path / "d" / "zz.toml").write_text('imports = ["../a.toml"]\n')
    config = tmp_path / "config.toml"
    config.write_text('version = 2\nimports = ["a.toml", "d/*.toml"]\n')
    assert _chain(config) == [
        ("config.toml", 0),
        ("a.toml", 1),
        ("50-x.toml", 1),
        ("zz.toml", 1),
        ("nested.toml", 2),
    ]
    assert _chain(config, str(tmp_path / "d" / "99-nvshim.toml"))[3] == ("99-nvshim.toml", 1)
    assert _chain(config, str(tmp_path / "other.toml"))[4:] == [
        ("other.toml", 1),
        ("nested.toml", 2),
    ]


def test_brackets_without_a_star_are_a_literal_path(tmp_path: Path) -> None:
    """containerd globs only entries with ``*``: ``x[ab].toml`` names that very file."""
    config = tmp_path / "config.toml"
    config.write_text('version = 2\nimports = ["x[ab].toml"]\n')
    (tmp_path / "xa.toml").write_text("")
    chain = load_chain(str(config), parse_toml(config.read_text(), str(config)))
    assert chain.problems == (f"import {tmp_path / 'x[ab].toml'} does not exist",)


def _nvidia_node(tmp_path: Path, version: int = 2, **kw: object) -> Path:
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    config = tmp_path / "config.toml"
    base = (
        RUNC_CONFIG
        if version == 2
        else RUNC_CONFIG.replace("io.containerd.grpc.v1.cri", V3).replace(
            "version = 2", "version = 3"
        )
    )
    config.write_text(nvidia_ctk_main(str(conf_d), base, version))
    (conf_d / "99-nvidia.toml").write_text(nvidia_ctk_drop_in(version=version, runc=True, **kw))
    return config


def test_version_3_drop_in_keeps_nvidia_handlers(tmp_path: Path) -> None:
    """For containerd 2.x's version 3 the drop-in merges the io.containerd.cri.v1.runtime
    tables, NVIDIA's handlers and runc included."""
    config = _nvidia_node(tmp_path, version=3)
    result = containerd.configure(str(config), binary="/x/nvshim-runtime")
    written = tomllib.loads(Path(result.handler_file).read_text())
    runtimes = written["plugins"][V3]["containerd"]["runtimes"]
    assert set(runtimes) == {"runc", "nvshim", *NVIDIA_HANDLERS}
    assert read_handlers(str(config)).declared.keys() <= read_handlers(str(config)).handlers.keys()


def test_a_table_loaded_after_the_drop_in_is_warned_about(tmp_path: Path) -> None:
    """A file containerd loads after nvshim's drop-in with its own CRI table hides the
    handler: configure says so, naming it (and in place, the main file's imports do)."""
    config = _nvidia_node(tmp_path)
    (tmp_path / "conf.d" / "zz-late.toml").write_text(nvidia_ctk_drop_in())
    warned = containerd.configure(str(config), dry_run=True).warnings
    assert any("zz-late.toml, loaded after" in w and '"nvshim"' in w for w in warned)
    in_place = containerd.configure(str(config), drop_in="", dry_run=True).warnings
    assert any("99-nvidia.toml, loaded after" in w for w in in_place)


def test_doctor_fails_naming_a_handler_a_later_table_hides(tmp_path: Path) -> None:
    """A handler declared in one file but hidden by a later CRI table fails
    containerd-handlers, naming it and the hiding file; none hidden is ok."""
    config = _nvidia_node(tmp_path)
    options = DoctorOptions(containerd_config=str(config), containerd_binary="/nonexistent")
    assert check_lost_handlers(read_handlers(str(config)), options).status == "ok"
    (tmp_path / "conf.d" / "zz-late.toml").write_text(RUNC_CONFIG)
    finding = check_lost_handlers(read_handlers(str(config)), options)
    assert finding.status == "fail"
    assert '"nvidia-legacy" (declared in' in finding.message
    assert "zz-late.toml, loaded after" in finding.message


def test_reconfigure_command_keeps_the_operators_flags(tmp_path: Path) -> None:
    """The fix re-runs configure with the name, binary, default and CDI flags the drop-in was
    written with, and --config/--drop-in only when not the defaults."""
    config = _nvidia_node(tmp_path)
    drop_in = tmp_path / "conf.d" / "50-gpu.toml"
    containerd.configure(
        str(config),
        drop_in=str(drop_in),
        name="gpu",
        binary="/o/nvshim-runtime",
        set_as_default=True,
        force=True,
        pod_cdi_annotations=True,
    )
    command = reconfigure_command(str(config), str(drop_in), 2, DoctorOptions())
    assert command == (
        f"nvshim runtime configure --runtime containerd --config {config} "
        f"--drop-in {drop_in} --name gpu --binary /o/nvshim-runtime "
        "--set-as-default --pod-cdi-annotations"
    )
    # with containerd's own CDI on, the handler is passed no cdi.k8s.io/ annotations at all
    containerd.configure(
        str(config),
        drop_in=str(drop_in),
        name="gpu",
        binary="/o/nvshim-runtime",
        set_as_default=True,
        force=True,
        enable_cdi=True,
    )
    command = reconfigure_command(str(config), str(drop_in), 2, DoctorOptions())
    assert command.endswith("--binary /o/nvshim-runtime --set-as-default --enable-cdi"), command


def test_bare_version_2_main_file_is_no_drift(tmp_path: Path) -> None:
    """configure on a main file holding only ``version = 2``: its drop-in is no stale copy."""
    from nvshim.node.engines.containerd_read import drop_in_drift

    config = tmp_path / "config.toml"
    config.write_text("version = 2\n")
    containerd.configure(str(config), binary="/o/nvshim-runtime")
    assert drop_in_drift(str(config)) == []
