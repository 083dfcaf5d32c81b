"""nvshim's self-contained runtime on the node families, installed as the DaemonSet does.

Each node root (:mod:`tests.helpers.noderoot`: Debian 12 with no python3 at all, Debian 11 with
an older glibc than the build machine's, Debian 13 with a newer one and its own python3.13)
gets the payload that ``install.sh --payload`` builds here (cached per source state by
:mod:`tests.helpers.payload`), installed INSIDE the root with
``sh DIR/install.sh --from DIR``; then GPU containers start through the installed
``/usr/local/bin/nvshim-runtime`` with the root's own runc, on a simulated 2-GPU node placed in
the root (``driver-root: /srv/gpu-node``). Every assertion is about what the container's
process sees, what the node's files are, or the one line a broken node gets.

Last, a node whose ``/usr`` is read-only (COS, Bottlerocket, Flatcar, Talos: the Debian 12 root
with ``/usr`` bound read-only in the private mount namespace of each call) is set up with the
commands README.md and deploy/README.md give, word for word: the payload install refused in
one line naming ``NVSHIM_BINDIR``, then ``NVSHIM_BINDIR=/opt/bin``, doctor, a GPU container
and ``sh /opt/nvshim/install.sh --uninstall``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from tests.helpers.bundle import make_bundle, make_rootfs
from tests.helpers.common import RunResult, require_binary, require_root, unique_id
from tests.helpers.noderoot import (
    ROOTS,
    NodeRoot,
    NodeRootError,
    copy_root,
    node_root,
    on_node,
    python_files,
)

pytestmark = pytest.mark.e2e

OPT_OUT_ENV = "NVSHIM_TESTS_NO_NODEROOTS"
"""=1: skip the node-root tests instead of failing when a root cannot be built."""

PAYLOAD = "/var/tmp/nvshim-payload"  # where the node gets the payload (the DaemonSet's copy)
SIM = "/srv/gpu-node"  # the simulated GPU node's driver root, inside the node root
LIB = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
PROBE = (
    "cd /dev && ls -d nvidia* 2>/dev/null | tr '\\n' ' '; echo; "
    f"grep -c NVSHIM-SIM {LIB} && echo LIB-READABLE; "
    "readlink /usr/lib/x86_64-linux-gnu/libcuda.so.1"
)
# which C library and loader a process of the payload's interpreter mapped
MAPS = (
    "import sys; print('\\n'.join(sorted({l.split()[-1] for l in open('/proc/self/maps') "
    "if '/libc.so' in l or '/ld-linux' in l})))"
)


def _root(name: str) -> NodeRoot:
    require_root()
    if shutil.which("mmdebstrap") is None and os.environ.get("CI", "").lower() not in (
        "",
        "0",
        "false",
        "no",
    ):
        pytest.fail(
            "mmdebstrap is not installed (CI is set: the node roots must run; "
            "install.sh --dev installs it)",
            pytrace=False,
        )
    require_binary("mmdebstrap")
    try:
        return node_root(name)
    except NodeRootError as exc:
        if os.environ.get(OPT_OUT_ENV) == "1":
            pytest.skip(f"{exc} (${OPT_OUT_ENV}=1)")
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def payload() -> Path:
    """The self-contained runtime built from this checkout (``install.sh --payload DIR``,
    cached per source state by :mod:`tests.helpers.payload`)."""
    require_root()
    from tests.helpers.payload import payload_dir

    return payload_dir()


def _prepare(root: NodeRoot, tree: Path, payload: Path) -> None:
    """A copy of ``root`` at ``tree`` with the payload where the node gets it, a simulated
    2-GPU node at SIM and an nvshim config naming it (as an operator writes before installing)."""
    from nvshim.sim.build import create_node

    copy_root(root, tree)
    subprocess.run(["cp", "-R", str(payload), str(tree / PAYLOAD.lstrip("/"))], check=True)
    create_node(str(tree / SIM.lstrip("/")), gpus=2, shuffle_minors=True)
    etc = tree / "etc/nvshim"
    etc.mkdir(parents=True)
    (etc / "config.yaml").write_text(f"driver-root: {SIM}\n")


def _install(tree: Path, *shell: str) -> RunResult:
    """``sh DIR/install.sh --from DIR`` on the node (``shell``: another shell's argv)."""
    return on_node(tree, [*(shell or ("sh",)), f"{PAYLOAD}/install.sh", "--from", PAYLOAD])


@dataclass
class Node:
    """A node root with nvshim installed in it."""

    root: NodeRoot
    tree: Path
    installed: RunResult
    tmp: Path

    def bundle(self, env: List[str], args: List[str]) -> str:
        """A busybox bundle in the node under /var/lib/nvshim-test; its path on the node."""
        name = unique_id("b")
        dest = self.tree / "var/lib/nvshim-test" / name
        rootfs = self.tmp / "rootfs"
        if not rootfs.exists():
            make_rootfs(rootfs)
        make_bundle(dest, rootfs, args, env=env)
        return f"/var/lib/nvshim-test/{name}"

    def run(self, bundle: str) -> RunResult:
        """``nvshim-runtime run`` on the node, as an engine calls it (no NVSHIM_ env)."""
        return on_node(
            self.tree,
            [
                "/usr/local/bin/nvshim-runtime",
                "--root",
                "/run/runc",
                "run",
                "--bundle",
                bundle,
                unique_id(),
            ],
        )


@pytest.fixture(scope="module", params=list(ROOTS))
def node(request: Any, payload: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """Each node root, with the payload installed inside it by its own install.sh (the copy
    is removed afterwards: 70–170 MB each)."""
    root = _root(request.param)
    tmp = tmp_path_factory.mktemp(root.name)
    tree = tmp / "node"
    _prepare(root, tree, payload)
    yield Node(root, tree, _install(tree), tmp)
    shutil.rmtree(tree, ignore_errors=True)


def _node_pythons(tree: Path) -> List[str]:
    """The python files of the node itself: not nvshim's prefix, its payload or the sim's."""
    return [p for p in python_files(tree) if not p.startswith(("/opt/nvshim/", PAYLOAD, SIM))]


def _seen(output: str) -> set:
    return set(output.splitlines()[0].split()) if output else set()


def _sim(node: Node) -> Dict[str, Any]:
    from nvshim.sim.build import load_node

    loaded = load_node(str(node.tree / SIM.lstrip("/")))
    return {"minors": [g.minor for g in loaded.gpus]}


# ----------------------------------------------------------------------------- the roots


@pytest.mark.parametrize("name", list(ROOTS))
def test_each_root_is_the_node_it_stands_for(name: str, tmp_path: Path) -> None:
    """Debian 11's glibc is older than this machine's, Debian 13's newer; the roots without
    a python3 have none at all; each root's own runc runs a container on the node."""
    root = _root(name)
    host = tuple(int(x) for x in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split("."))
    glibc = tuple(int(x) for x in root.manifest["glibc"].split("."))
    expected = {
        "debian11": glibc < host,
        "debian12-nopython": glibc == host,
        "debian13": glibc > host,
    }
    assert expected[name], (name, glibc, host)
    assert (python_files(root.path) != []) == ROOTS[name].python
    bundle = make_bundle(
        tmp_path / "b",
        make_rootfs(tmp_path / "rootfs"),
        ["sh", "-c", "echo hello from $(hostname)"],
    )
    res = on_node(
        root.path,
        ["runc", "--root", "/run/runc", "run", "--bundle", "/mnt", unique_id()],
        binds={"/mnt": bundle},
        read_only=True,
    )
    assert (res.rc, res.stdout) == (0, "hello from nvshim-e2e\n"), res.describe()


# ----------------------------------------------------------------------------- installed


def test_installs_inside_the_root_with_the_payloads_own_script(node: Node) -> None:
    """``sh DIR/install.sh --from DIR`` succeeds on the node, with nothing but its sh and
    coreutils; what it installs names only its prefix, and the node gained no python."""
    assert node.installed.rc == 0, node.installed.describe()
    assert node.installed.stderr.splitlines()[-1].startswith("install.sh: installed nvshim")
    for command in ("nvshim", "nvshim-runtime"):
        text = (node.tree / "usr/local/bin" / command).read_text()
        assert "/opt/nvshim/" in text and "/usr/bin/python" not in text
    assert _node_pythons(node.tree) == python_files(node.root.path)  # Debian 13's, or none
    version = on_node(node.tree, ["/usr/local/bin/nvshim-runtime", "--version"])
    runc = node.root.manifest["runc"].split("-")[0]
    assert version.rc == 0 and f"runc version {runc}" in version.stdout, version.describe()


def test_gpu_container_sees_exactly_its_gpu(node: Node) -> None:
    """NVIDIA_VISIBLE_DEVICES=1 through the installed nvshim-runtime and the root's runc: the
    process sees GPU 1's node (not GPU 0's), the control nodes, and the driver library
    mounted with its SONAME link made."""
    minors = _sim(node)["minors"]
    bundle = node.bundle(["NVIDIA_VISIBLE_DEVICES=1"], ["sh", "-c", PROBE])
    res = node.run(bundle)
    assert res.rc == 0, res.describe()
    assert _seen(res.stdout) == {
        f"nvidia{minors[1]}",
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
    }, res.describe()
    assert f"nvidia{minors[0]}" not in res.stdout
    assert "LIB-READABLE" in res.stdout and "libcuda.so.550.54.15" in res.stdout
    assert res.stderr == ""


def test_no_gpu_create_passes_through_unchanged(node: Node) -> None:
    """A container that asks for no GPU runs through nvshim-runtime with config.json
    byte-identical and no NVIDIA device inside."""
    bundle = node.bundle([], ["sh", "-c", PROBE])
    spec = node.tree / bundle.lstrip("/") / "config.json"
    before = spec.read_bytes()
    res = node.run(bundle)
    assert _seen(res.stdout) == set(), res.describe()
    assert spec.read_bytes() == before


def test_runtime_brings_its_own_c_library(node: Node) -> None:
    """nvshim's interpreter on the node maps the payload's loader and glibc, never the node's
    (older on Debian 11, newer on Debian 13); the node's own python maps the node's."""
    res = on_node(node.tree, ["/opt/nvshim/bin/python3", "-I", "-S", "-c", MAPS])
    assert res.rc == 0, res.describe()
    mapped = res.stdout.split()
    assert mapped and all(p.startswith("/opt/nvshim/lib/") for p in mapped), mapped
    if ROOTS[node.root.name].python:
        own = on_node(node.tree, ["python3", "-I", "-S", "-c", MAPS])
        assert own.rc == 0 and not any(p.startswith("/opt/nvshim/") for p in own.stdout.split())


def test_the_nodes_python_is_never_run_and_removing_it_changes_nothing(node: Node) -> None:
    """A node python3 that records being run is never run by a GPU create, the CLI or the
    hook; the CDI spec generated on the node names only nvshim's interpreter in its hooks;
    after every python3 file is removed from the node, the same container sees the same and
    the same spec is generated."""
    minors = _sim(node)["minors"]
    bundle = node.bundle(["NVIDIA_VISIBLE_DEVICES=1"], ["sh", "-c", PROBE])
    marker = node.tree / "var/tmp/node-python-ran"
    for python in ("usr/bin/python3", "usr/bin/python3.13"):
        path = node.tree / python
        if os.path.lexists(path):
            path.unlink()
            path.write_text(
                f'#!/bin/sh\necho "$0 $*" >> /{marker.relative_to(node.tree)}\nexit 1\n'
            )
            path.chmod(0o755)
    generate = ["/usr/local/bin/nvshim", "cdi", "generate", "--format", "json"]
    before = node.run(bundle)
    spec = on_node(node.tree, generate)
    assert spec.rc == 0, spec.describe()
    assert not marker.exists(), marker.read_text()
    hooks = [
        h for d in json.loads(spec.stdout)["devices"] for h in d["containerEdits"].get("hooks", [])
    ] + json.loads(spec.stdout)["containerEdits"]["hooks"]
    assert hooks and {h["path"] for h in hooks} == {"/opt/nvshim/bin/python3"}
    assert not any("site-packages" in a or "python3." in a for h in hooks for a in h["args"])
    for found in _node_pythons(node.tree):
        path = node.tree / found.lstrip("/")
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            path.unlink()
    assert _node_pythons(node.tree) == []
    after = node.run(bundle)
    assert before.rc == after.rc == 0, before.describe() + after.describe()
    assert f"nvidia{minors[1]}" in _seen(after.stdout)
    assert after.stdout == before.stdout
    assert on_node(node.tree, generate).stdout == spec.stdout


# ----------------------------------------------------------------------------- broken nodes


@pytest.fixture
def broken(payload: Path, tmp_path: Path) -> Iterator[Path]:
    """A fresh Debian 12 node root (no python3) with the payload and a simulated node, to
    break (removed afterwards)."""
    tree = tmp_path / "node"
    _prepare(_root("debian12-nopython"), tree, payload)
    yield tree
    shutil.rmtree(tree, ignore_errors=True)


def _one_line_about_bin_sh(res: RunResult) -> None:
    """install.sh's one line: the node's /bin/sh (missing, or its C library) is the problem."""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("install.sh: "), res.describe()
    assert "/bin/sh" in lines[0] and "C library" in lines[0] and "node" in lines[0]


def _nothing_installed(tree: Path) -> None:
    assert not (tree / "opt/nvshim").exists()
    assert list((tree / "usr/local/bin").iterdir()) == []
    assert sorted(p.name for p in (tree / "etc/nvshim").iterdir()) == ["config.yaml"]


def test_install_on_a_root_without_bin_sh_says_so(broken: Path) -> None:
    """On a root whose /bin/sh is missing (install.sh run by bash), install.sh says in one line
    that this node has no usable /bin/sh, exits 1 and installs nothing."""
    (broken / "usr/bin/sh").unlink()
    res = _install(broken, "bash")
    assert res.rc == 1, res.describe()
    _one_line_about_bin_sh(res)
    _nothing_installed(broken)


def test_install_on_a_root_whose_c_library_is_broken_says_so(broken: Path) -> None:
    """On a root whose libc.so.6 is unusable (install.sh run by a static busybox sh), install.sh
    says in one line that this node has no usable /bin/sh, exits 1 and installs nothing."""
    shutil.copy2(require_binary("busybox"), broken / "var/tmp/busybox")
    (broken / "usr/lib/x86_64-linux-gnu/libc.so.6").write_bytes(b"")
    res = _install(broken, "/var/tmp/busybox", "sh")
    assert res.rc == 1, res.describe()
    _one_line_about_bin_sh(res)
    _nothing_installed(broken)


def test_create_on_a_root_whose_c_library_broke_names_it_in_one_line(broken: Path) -> None:
    """After the node's glibc breaks (its /bin/sh a static busybox), nvshim still runs on its
    own C library (the CLI answers, a GPU create plans and edits); the create's one stderr
    line is the loader's, naming the root's runc and the broken libc.so.6."""
    assert _install(broken).rc == 0
    bundle_dir = broken / "var/lib/nvshim-test/b"
    make_bundle(
        bundle_dir,
        make_rootfs(broken.parent / "rootfs"),
        ["true"],
        env=["NVIDIA_VISIBLE_DEVICES=1"],
    )
    (broken / "usr/bin/sh").unlink()
    shutil.copy2(require_binary("busybox"), broken / "usr/bin/sh")
    (broken / "usr/lib/x86_64-linux-gnu/libc.so.6").write_bytes(b"")
    version = on_node(broken, ["/usr/local/bin/nvshim", "--version"])
    assert version.rc == 0 and version.stdout.startswith("nvshim, version"), version.describe()
    before = (bundle_dir / "config.json").read_bytes()
    res = on_node(
        broken,
        [
            "/usr/local/bin/nvshim-runtime",
            "--root",
            "/run/runc",
            "create",
            "--bundle",
            "/var/lib/nvshim-test/b",
            unique_id(),
        ],
    )
    assert res.rc == 127, res.describe()
    assert res.stderr.splitlines() == [
        "/usr/sbin/runc: error while loading shared libraries: "
        "/lib/x86_64-linux-gnu/libc.so.6: file too short"
    ]
    assert (bundle_dir / "config.json").read_bytes() != before  # nvshim planned and edited


# ----------------------------------------------------------------------------- read-only /usr

README_PAYLOAD = "/tmp/nvshim-payload"  # README.md's payload folder, on the node


def _tree_state(tree: Path) -> Dict[str, Any]:
    """Every entry under ``tree`` (as on the node): type, mode and owner, and a file's bytes
    (a hash) or a link's target; a folder's own times are left out."""
    state: Dict[str, Any] = {}
    for dirpath, dirs, files in os.walk(tree):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            key = "/" + os.path.relpath(path, tree)
            if os.path.islink(path):
                state[key] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                state[key] = ("dir", st.st_mode, st.st_uid, st.st_gid)
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as fh:
                    digest = hashlib.file_digest(fh, "sha256").hexdigest()
                state[key] = ("file", st.st_mode, st.st_uid, st.st_gid, digest)
            else:  # the simulated node's device nodes and fifos: never opened
                state[key] = ("special", st.st_mode, st.st_uid, st.st_gid, st.st_rdev)
    return state


def test_read_only_usr_node_word_for_word(payload: Path, tmp_path: Path) -> None:
    """On a Debian 12 node root (no python3) whose /usr is mounted read-only, README.md's
    payload install fails in one line naming NVSHIM_BINDIR and writes nothing; with
    NVSHIM_BINDIR=/opt/bin it installs, doctor finds the trampoline there, containerd's and
    Docker's configs name it, a GPU container sees exactly its GPU, and uninstall leaves the
    root as it was but for the grant journal the docs say stays."""
    from nvshim.sim.build import load_node

    tree = tmp_path / "node"
    _prepare(_root("debian12-nopython"), tree, payload)
    os.replace(tree / PAYLOAD.lstrip("/"), tree / README_PAYLOAD.lstrip("/"))
    (tree / "etc/containerd").mkdir()
    (tree / "etc/containerd/config.toml").write_text("")  # containerd's defaults
    bundle = make_bundle(
        tmp_path / "b",
        make_rootfs(tmp_path / "rootfs"),
        ["sh", "-c", PROBE],
        env=["NVIDIA_VISIBLE_DEVICES=1"],
    )

    def node(*argv: str) -> RunResult:
        return on_node(tree, argv, binds={"/mnt": bundle}, read_only_dirs=["/usr"])

    probe = node("sh", "-c", "readlink /proc/self/ns/mnt; touch /usr/local/bin/probe")
    assert probe.stdout.split() != [os.readlink("/proc/self/ns/mnt")], probe.describe()
    assert probe.rc == 1 and "Read-only file system" in probe.stderr, probe.describe()
    before = _tree_state(tree)

    install = [
        "sh",
        f"{README_PAYLOAD}/install.sh",
        "--from",
        README_PAYLOAD,
        "--containerd",
        "--docker",
    ]
    refused = node(*install)
    assert refused.rc == 1, refused.describe()
    assert refused.stderr.splitlines() == [
        "install.sh: cannot write /usr/local/bin (read-only file system?): nothing installed; "
        "on a node with a read-only /usr, set NVSHIM_BINDIR to a writable folder (e.g. "
        "/opt/bin; see install.sh --help)"
    ], refused.describe()
    assert _tree_state(tree) == before

    installed = node("env", "NVSHIM_BINDIR=/opt/bin", *install)
    assert installed.rc == 0, installed.describe()
    assert installed.stderr.splitlines()[-1] == (
        "install.sh: installed nvshim 0.1.0 (/opt/bin/nvshim, /opt/bin/nvshim-runtime)"
    )
    doctor = node("/opt/bin/nvshim", "doctor", "--format", "json")
    found = {f["check"]: (f["status"], f["message"]) for f in json.loads(doctor.stdout)}
    assert found["trampoline"][0] == "ok" and "/opt/bin/nvshim-runtime" in found["trampoline"][1]
    assert found["containerd-runtime-binary"] == (
        "ok",
        'handler "nvshim" runs /opt/bin/nvshim-runtime',
    )
    drop_in = (tree / "etc/containerd/conf.d/99-nvshim.toml").read_text()
    assert 'BinaryName = "/opt/bin/nvshim-runtime"' in drop_in
    daemon = json.loads((tree / "etc/docker/daemon.json").read_text())
    assert daemon["runtimes"]["nvshim"]["path"] == "/opt/bin/nvshim-runtime"
    assert sorted(p.name for p in (tree / "opt/bin").iterdir()) == [
        "nvidia-container-runtime-hook",
        "nvshim",
        "nvshim-runtime",
    ]

    minors = [g.minor for g in load_node(str(tree / SIM.lstrip("/"))).gpus]
    res = node(
        "/opt/bin/nvshim-runtime", "--root", "/run/runc", "run", "--bundle", "/mnt", unique_id()
    )
    assert res.rc == 0, res.describe()
    assert _seen(res.stdout) == {
        f"nvidia{minors[1]}",
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
    }, res.describe()
    assert "LIB-READABLE" in res.stdout

    removed = node("sh", "/opt/nvshim/install.sh", "--uninstall")
    assert removed.rc == 0, removed.describe()
    after = _tree_state(tree)
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    assert changed == {"/var/lib/nvshim", "/var/lib/nvshim/grants.jsonl"}, sorted(changed)
