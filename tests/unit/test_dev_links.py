"""The hook's ``/dev`` links (a GPU's /dev/dri/by-path/pci-<bus>-{card,render}): made only
for the DRM nodes the container has, inside the rootfs, kept as the hook's work when the
runtime does the rest, and carried in the hook's argv through every rewrite."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Dict

import pytest

from nvshim.errors import UsageError
from nvshim.runtime.hookargs import (
    build_hook_args,
    dev_links_only,
    hook_command,
    parse_graphics_args,
    parse_hook_args,
    parse_hook_cli,
    parse_host_driver_version,
    split_hook_argv,
    with_links,
)
from tests.helpers.hookworld import LIBDIR, LINKS, make_bundle, run_hook, runc_state

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod)")
BUS0, BUS1 = "0000:01:00.0", "0000:02:00.0"
DEV_LINKS = [
    ("../card0", f"/dev/dri/by-path/pci-{BUS0}-card"),
    ("../renderD128", f"/dev/dri/by-path/pci-{BUS0}-render"),
    ("../card1", f"/dev/dri/by-path/pci-{BUS1}-card"),
    ("../renderD129", f"/dev/dri/by-path/pci-{BUS1}-render"),
]


def test_dev_links_and_the_profile_flag_parse_back_everywhere() -> None:
    """build_hook_args with --dev-link and --egl-profile: the runtime's readers and the
    hook's own parser read back every value, and the flag does not shift the others."""
    argv = [*hook_command(), *build_hook_args(LINKS, [LIBDIR], "550.54.15", DEV_LINKS, True)]
    assert parse_hook_args(argv) == (LINKS, [LIBDIR])
    assert parse_host_driver_version(argv) == "550.54.15"
    assert parse_graphics_args(argv) == (DEV_LINKS, True)
    ns = parse_hook_cli(split_hook_argv(argv)[1])
    assert (ns.link, ns.folder, ns.dev_link, ns.egl_profile) == (LINKS, [LIBDIR], DEV_LINKS, True)
    flag_first = [*hook_command(), "--egl-profile", "--folder", LIBDIR]
    assert parse_hook_args(flag_first) == ([], [LIBDIR])


def test_a_dev_link_outside_dev_is_refused() -> None:
    """--dev-link is for /dev only: the builder and the hook's parser both refuse another
    path (the hook checks char devices there, nowhere else)."""
    with pytest.raises(UsageError, match="must be under /dev"):
        build_hook_args([], [], dev_links=[("../card0", "/etc/card")])
    with pytest.raises(UsageError, match="must be under /dev"):
        parse_hook_cli(["--dev-link", "../card0::/etc/card"])
    with pytest.raises(UsageError, match="expected TARGET::LINK"):
        parse_hook_cli(["--dev-link", "../card0"])


def test_rewrites_keep_the_dev_links_and_the_runtime_keeps_only_them() -> None:
    """with_links keeps --dev-link and --egl-profile (graphics=False drops them);
    dev_links_only is the hook left when the runtime did the rest: the same command, the
    /dev links and nothing else (None without any)."""
    argv = [*hook_command(), *build_hook_args(LINKS, [LIBDIR], "550.54.15", DEV_LINKS, True)]
    out = with_links(argv, LINKS[:1])
    assert parse_graphics_args(out) == (DEV_LINKS, True)
    assert parse_graphics_args(with_links(argv, LINKS, graphics=False)) == ([], False)
    only = dev_links_only(argv)
    assert only is not None and only[: len(hook_command())] == list(hook_command())
    assert parse_hook_args(only) == ([], []) and parse_host_driver_version(only) is None
    assert parse_graphics_args(only) == (DEV_LINKS, False)
    assert dev_links_only([*hook_command(), *build_hook_args(LINKS, [LIBDIR])]) is None


def _dri(rootfs: Path, *nodes: str, dri: str = "dev/dri") -> Path:
    """``rootfs/dri`` holding DRM char nodes ``nodes`` (card<n> 226:n, renderD<m> 226:m)."""
    dri_dir = rootfs / dri
    dri_dir.mkdir(parents=True, exist_ok=True)
    for name in nodes:
        minor = int(name[4:]) if name.startswith("card") else int(name[7:])
        os.mknod(dri_dir / name, 0o666 | stat.S_IFCHR, os.makedev(226, minor))
    return dri_dir


@needs_root
def test_hook_links_only_the_nodes_the_container_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Given every GPU's links (a CDI spec's one hook), the hook makes GPU 1's because the
    container has card1 and renderD129, and none of GPU 0's; running again changes nothing."""
    bundle, rootfs = make_bundle(tmp_path)
    dri = _dri(rootfs, "card1", "renderD129")
    args = build_hook_args([], [], dev_links=DEV_LINKS)
    assert run_hook(monkeypatch, capsys, args, runc_state(bundle), rootfs) == (0, "")
    made = {p.name: os.readlink(p) for p in (dri / "by-path").iterdir()}
    assert made == {f"pci-{BUS1}-card": "../card1", f"pci-{BUS1}-render": "../renderD129"}
    assert os.stat(dri / f"by-path/pci-{BUS1}-render").st_rdev == os.makedev(226, 129)
    assert run_hook(monkeypatch, capsys, args, runc_state(bundle), rootfs) == (0, "")
    assert {p.name for p in (dri / "by-path").iterdir()} == set(made)


@needs_root
def test_hook_follows_no_image_symlink_out_of_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An image whose /dev/dri is an absolute symlink to a host folder holding a card node,
    and whose card0 is a link to a host node: the hook resolves both inside the rootfs, so
    no link is made for card0 and nothing is written on the host."""
    bundle, rootfs = make_bundle(tmp_path)
    host = tmp_path / "host-dri"
    host.mkdir()
    os.mknod(host / "card0", 0o666 | stat.S_IFCHR, os.makedev(226, 0))
    (rootfs / "dev").mkdir()
    (rootfs / "dev/dri").symlink_to(str(host))
    inside = _dri(rootfs, "card1", dri=str(host).lstrip("/"))
    (inside / "card0").symlink_to(str(host / "card0"))
    args = build_hook_args([], [], dev_links=DEV_LINKS)
    assert run_hook(monkeypatch, capsys, args, runc_state(bundle), rootfs) == (0, "")
    assert sorted(os.listdir(host)) == ["card0"]
    assert {p.name for p in (inside / "by-path").iterdir()} == {f"pci-{BUS1}-card"}


def _toolkit_spec(missing: str) -> Dict[str, Any]:
    """config.json as the toolkit's CDI spec leaves it on a node without nvidia-cdi-hook."""
    hook = {"path": missing, "env": ["NVIDIA_CTK_DEBUG=false"]}
    return {
        "hooks": {
            "createContainer": [
                dict(
                    hook,
                    args=[
                        "nvidia-cdi-hook",
                        "create-symlinks",
                        "--link",
                        f"../card1::/dev/dri/by-path/pci-{BUS1}-card",
                        "--link",
                        "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
                    ],
                ),
                dict(hook, args=["nvidia-cdi-hook", "update-application-profile"]),
            ]
        }
    }


def test_a_missing_toolkit_hooks_profile_and_dev_links_become_nvshims(tmp_path: Path) -> None:
    """The toolkit's update-application-profile and its by-path create-symlinks, whose
    binary this node lacks, become nvshim's hook: --egl-profile and --dev-link for the /dev
    link, which is not planned as in-root work (/dev is runc's tmpfs)."""
    from nvshim.runtime.engine import engine_hooks, replacement_hook
    from nvshim.runtime.rootwork import work_from_hooks

    hooks = engine_hooks(_toolkit_spec(str(tmp_path / "absent" / "nvidia-cdi-hook")))
    assert len(hooks.replaced) == 2 and hooks.egl_profile
    assert any(
        "update-application-profile is not on this node: nvshim does it instead" in n
        for n in hooks.notes
    ), hooks.notes
    hook = replacement_hook(hooks, hook_command())
    assert hook is not None
    assert parse_graphics_args(hook.args) == (
        [("../card1", f"/dev/dri/by-path/pci-{BUS1}-card")],
        True,
    )
    work = work_from_hooks([hook], [])
    assert work is not None
    assert work.links == (("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so"),)
