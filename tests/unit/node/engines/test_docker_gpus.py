"""``docker run --gpus``: Docker's request recognised by its prestart hook, granted as source
``docker-gpus``, the hook taken out of config.json; nvshim's stand-in hook written, kept
away from NVIDIA's, and removed by revert.

The specs are shaped as dockerd 20.10 writes them (checked with the real daemon in
tests/e2e/test_docker_gpus_e2e.py): the image's env, then ``NVIDIA_VISIBLE_DEVICES`` (and
``NVIDIA_DRIVER_CAPABILITIES``) appended, a prestart hook
``[nvidia-container-runtime-hook, prestart]`` carrying dockerd's environment, and Docker's
own ``libnetwork-setkey`` prestart hook.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest

from nvshim.config import Config
from nvshim.errors import RequestError
from nvshim.node.engines import docker
from nvshim.runtime.claim import image_view, read_claim
from nvshim.runtime.create import plan_create
from nvshim.runtime.request import resolve_request
from tests.helpers.bundle import copy_rootfs, default_spec, make_rootfs

HOOK = {
    "path": "/usr/local/bin/nvidia-container-runtime-hook",
    "args": ["nvidia-container-runtime-hook", "prestart"],
    "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
}
SETKEY = {
    "path": "/proc/1234/exe",
    "args": ["libnetwork-setkey", "-exec-root=/run/docker", "abc", "def"],
}
IMAGE_ENV = ["PATH=/bin", "HOSTNAME=c0ffee", "NVIDIA_VISIBLE_DEVICES=all", "ZZZ=1"]
U2 = "GPU-11111111-2222-3333-4444-555555555552"


def docker_spec(
    appended: Sequence[str],
    image_env: Sequence[str] = IMAGE_ENV,
    hook: Optional[Dict[str, Any]] = HOOK,
    **extra: Any,
) -> Dict[str, Any]:
    """A spec as dockerd writes it for ``--gpus``: ``appended`` after the image's env."""
    hooks = [SETKEY] if hook is None else [hook, SETKEY]
    return {"process": {"env": [*image_env, *appended]}, "hooks": {"prestart": hooks}, **extra}


def resolve(spec: Dict[str, Any], config: Config) -> Any:
    return resolve_request(read_claim(image_view(spec), config), config)


REQ = Config(require_allocation=True)
NO_DOCKER = Config(
    require_allocation=True, allocation_sources=("volume-mounts", "cdi-annotations", "envvar-uuids")
)

TABLE: List[Tuple[str, Dict[str, Any], Config, str, Tuple[str, ...], Tuple[str, ...]]] = [
    # (case, spec, config, source, devices, capabilities)
    (
        "--gpus all",
        docker_spec(["NVIDIA_VISIBLE_DEVICES=all"]),
        Config(),
        "docker-gpus",
        ("all",),
        ("compute", "utility"),
    ),
    (
        "--gpus 2",
        docker_spec(["NVIDIA_VISIBLE_DEVICES=0,1"]),
        Config(),
        "docker-gpus",
        ("0", "1"),
        ("compute", "utility"),
    ),
    (
        "--gpus device=1",
        docker_spec(["NVIDIA_VISIBLE_DEVICES=1"]),
        Config(),
        "docker-gpus",
        ("1",),
        ("compute", "utility"),
    ),
    (
        '--gpus "device=0,2"',
        docker_spec(["NVIDIA_VISIBLE_DEVICES=0,2"]),
        Config(),
        "docker-gpus",
        ("0", "2"),
        ("compute", "utility"),
    ),
    (
        "--gpus all,capabilities=utility",
        docker_spec(["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=utility"]),
        Config(),
        "docker-gpus",
        ("all",),
        ("utility",),
    ),
    (
        "docker's value wins over the image's and -e's",
        docker_spec(["NVIDIA_VISIBLE_DEVICES=0"], ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=3"]),
        Config(),
        "docker-gpus",
        ("0",),
        ("compute", "utility"),
    ),
    (
        "unprivileged env refused, docker's request is not env",
        docker_spec(["NVIDIA_VISIBLE_DEVICES=1"]),
        Config(accept_envvar_when_unprivileged=False),
        "docker-gpus",
        ("1",),
        ("compute", "utility"),
    ),
    (
        "require-allocation: --gpus all is an allocation",
        docker_spec(["NVIDIA_VISIBLE_DEVICES=all"]),
        REQ,
        "docker-gpus",
        ("all",),
        ("compute", "utility"),
    ),
    (
        "require-allocation: --gpus device=<uuid>",
        docker_spec([f"NVIDIA_VISIBLE_DEVICES={U2}"]),
        REQ,
        "docker-gpus",
        (U2,),
        ("compute", "utility"),
    ),
    (
        "require-allocation: no --gpus, image all stripped",
        docker_spec([], hook=None),
        REQ,
        "none",
        (),
        (),
    ),
    (
        "require-allocation: a pod's hooks.d hook is no docker request",
        docker_spec([], annotations={"io.kubernetes.pod.name": "p"}),
        REQ,
        "none",
        (),
        (),
    ),
    (
        "require-allocation: a podman hooks.d hook is no docker request",
        docker_spec([], annotations={"io.container.manager": "libpod"}),
        REQ,
        "none",
        (),
        (),
    ),
    (
        "require-allocation: a hook that is not prestart's is no docker request",
        docker_spec([], hook={**HOOK, "args": ["nvidia-container-runtime-hook", "poststart"]}),
        REQ,
        "none",
        (),
        (),
    ),
    (
        "--gpus 0: docker names no device, the image env is plain env",
        docker_spec([], ["PATH=/bin"]),
        REQ,
        "none",
        (),
        (),
    ),
]


@pytest.mark.parametrize(
    "case,spec,config,source,devices,caps", TABLE, ids=[row[0] for row in TABLE]
)
def test_docker_gpus_request(
    case: str,
    spec: Dict[str, Any],
    config: Config,
    source: str,
    devices: Tuple[str, ...],
    caps: Tuple[str, ...],
) -> None:
    """Each form of --gpus, as dockerd writes it, grants what it names under either policy;
    a hook that is not Docker's --gpus one grants nothing under require-allocation."""
    request = resolve(spec, config)
    assert (request.source, request.devices, request.capabilities) == (source, devices, caps)
    assert request.set_void == (
        source == "none" and "NVIDIA_VISIBLE_DEVICES=all" in spec["process"]["env"]
    )


def test_docker_gpus_left_out_of_allocation_sources_fails_in_one_line() -> None:
    """Under require-allocation without docker-gpus, --gpus is refused aloud (never a silent
    strip), the line naming the setting to add and the config."""
    with pytest.raises(RequestError) as info:
        resolve(docker_spec(["NVIDIA_VISIBLE_DEVICES=all"]), NO_DOCKER)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        "docker run --gpus asks for GPUs (NVIDIA_VISIBLE_DEVICES=all) "
        "but require-allocation is on and docker-gpus is not in "
        "allocation-sources (tried volume-mounts, cdi-annotations, "
        "envvar-uuids): add it there in "
    )


# --- the create road on a simulated node ----------------------------------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A 3-GPU node whose minors are shuffled."""
    if os.geteuid() != 0:
        pytest.skip("the simulated node needs root (mknod)")
    from nvshim.sim.build import create_node

    return create_node(str(tmp_path_factory.mktemp("sim") / "node"), gpus=3, shuffle_minors=True)


@pytest.fixture(scope="module")
def base_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_rootfs(tmp_path_factory.mktemp("rootfs") / "rootfs")


def bundle_of(
    tmp_path: Path, appended: Sequence[str], rootfs: Path, image_env: Sequence[str] = ()
) -> Path:
    spec = default_spec()
    spec["process"]["env"] += [*image_env, *appended]
    spec["hooks"] = {"prestart": [HOOK, SETKEY]}
    bundle = tmp_path / "b"
    bundle.mkdir()
    copy_rootfs(rootfs, bundle / "rootfs")
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


def test_the_hook_goes_and_the_gpu_asked_for_comes(
    tmp_path: Path, node: Any, base_rootfs: Path
) -> None:
    """--gpus device=1: config.json loses Docker's nvidia hook (Docker's own setkey hook
    stays) and gains GPU 1's node; the journal's source is docker-gpus."""
    bundle = bundle_of(tmp_path, ["NVIDIA_VISIBLE_DEVICES=1"], base_rootfs)
    plan = plan_create(str(bundle), Config(driver_root=node.root, require_allocation=True))
    assert plan.grant_source == "docker-gpus"
    assert [g.index for g in plan.gpus] == [1]
    assert plan.new_spec is not None
    assert plan.new_spec["hooks"]["prestart"] == [SETKEY]
    minors = [d["minor"] for d in plan.new_spec["linux"]["devices"] if d["major"] == 195]
    assert node.gpus[1].minor in minors and node.gpus[0].minor not in minors
    assert any(
        "prestart hook /usr/local/bin/nvidia-container-runtime-hook removed" in n
        for n in plan.notes
    )


def test_the_hook_goes_even_when_no_gpu_is_granted(
    tmp_path: Path, node: Any, base_rootfs: Path
) -> None:
    """--gpus 0 (Docker appends no device list) on an image naming none: no GPU, and the
    hook still goes, so neither NVIDIA's hook nor nvshim's stand-in runs."""
    bundle = bundle_of(tmp_path, [], base_rootfs)
    plan = plan_create(str(bundle), Config(driver_root=node.root))
    assert plan.request.source == "none" and not plan.gpus
    assert plan.new_spec is not None and plan.new_spec["hooks"]["prestart"] == [SETKEY]
    assert plan.new_spec["process"] == json.loads((bundle / "config.json").read_text())["process"]


def test_the_trampoline_hands_a_spec_with_only_dockers_hook_to_python(tmp_path: Path) -> None:
    """A spec whose only trace of --gpus is Docker's hook (no NVIDIA_ env: --gpus 0 on a
    plain image) reaches nvshim, which takes the hook out before the runtime runs."""
    from tests.helpers.commands import make_trampoline_world

    world = make_trampoline_world(
        tmp_path,
        record=f'cp "$3/config.json" {tmp_path / "seen.json"}',
        config_extra="grants-journal: null\n",
    )
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(docker_spec([], ["PATH=/bin"]), indent="\t"))
    done = subprocess.run(
        [str(world["tramp"]), "create", "--bundle", str(bundle), "x"],
        env=world["env"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["hooks"]["prestart"] == [SETKEY]


# --- nvshim's stand-in hook -------------------------------------------------------------------


def test_configure_writes_the_stand_in_beside_the_binary(tmp_path: Path) -> None:
    """configure writes an executable nvidia-container-runtime-hook beside --binary; run as
    Docker's prestart hook it fails in one line naming the runtime --gpus needs."""
    binary = tmp_path / "bin" / "nvshim-runtime"
    result = docker.configure(
        str(tmp_path / "daemon.json"),
        name="gpushim",
        binary=str(binary),
        search=[str(binary.parent)],
    )
    hook = binary.parent / docker.GPUS_HOOK
    assert str(hook) in result.written and result.warnings == ()
    assert stat.S_IMODE(hook.stat().st_mode) == 0o755
    ran = subprocess.run(
        [str(hook), "prestart"], input='{"id": "x"}', capture_output=True, text=True, timeout=30
    )
    assert ran.returncode == 1 and ran.stdout == ""
    assert ran.stderr == (
        "nvshim: docker run --gpus needs --runtime gpushim (or gpushim as "
        "Docker's default runtime): this container's runtime is not "
        "gpushim, so it would start without GPUs\n"
    )


def test_configure_warns_when_dockerd_would_not_find_the_stand_in(tmp_path: Path) -> None:
    """A --binary outside dockerd's PATH: the hook is written and a warning says --gpus
    works only if dockerd's PATH has that folder."""
    binary = tmp_path / "nvshim-runtime"
    plan = docker.configure(
        str(tmp_path / "daemon.json"), binary=str(binary), dry_run=True, search=["/usr/bin"]
    )
    assert [c.path for c in plan.files][1:] == [str(tmp_path / docker.GPUS_HOOK)]
    assert plan.warnings == (
        f"dockerd looks for {docker.GPUS_HOOK} on its PATH (/usr/bin "
        f"under systemd): docker run --gpus works only if it has "
        f"{tmp_path}",
    )


@pytest.mark.parametrize("where", ["same folder", "dockerd's PATH"])
def test_nvidias_hook_is_never_replaced(tmp_path: Path, where: str) -> None:
    """NVIDIA's hook (any file not nvshim's), beside --binary or anywhere on dockerd's PATH:
    configure writes no stand-in (one earlier on the PATH would shadow it) and says so."""
    binary = tmp_path / "bin" / "nvshim-runtime"
    other = tmp_path / "usr-bin"
    folder = binary.parent if where == "same folder" else other
    folder.mkdir(parents=True, exist_ok=True)
    binary.parent.mkdir(exist_ok=True)
    nvidia = folder / docker.GPUS_HOOK
    nvidia.write_bytes(b"\x7fELF\x02\x01\x01\x00 NVIDIA's hook \xff\xfe")
    nvidia.chmod(0o755)
    result = docker.configure(
        str(tmp_path / "daemon.json"), binary=str(binary), search=[str(binary.parent), str(other)]
    )
    assert result.written == (str(tmp_path / "daemon.json"),)
    assert nvidia.read_bytes().startswith(b"\x7fELF")
    assert not (binary.parent / docker.GPUS_HOOK).exists() or where == "same folder"
    assert len(result.warnings) == 1 and result.warnings[0].startswith(
        f"kept {nvidia} (not nvshim's): it lets dockerd offer docker run --gpus"
    )
    docker.revert(str(tmp_path / "daemon.json"))
    assert nvidia.read_bytes().startswith(b"\x7fELF")


def test_revert_removes_the_stand_in_but_not_what_replaced_it(tmp_path: Path) -> None:
    """--revert removes nvshim's hook (with or without a backup); a hook put in its place
    since (NVIDIA's binary) stays, and revert does not fail on it."""
    binary = tmp_path / "bin" / "nvshim-runtime"
    config = tmp_path / "daemon.json"
    hook = binary.parent / docker.GPUS_HOOK
    search = [str(binary.parent)]
    docker.configure(str(config), binary=str(binary), search=search)
    assert docker.is_gpus_hook(hook.read_text())
    result = docker.revert(str(config))
    assert result.used_backup and not hook.exists() and not config.exists()

    docker.configure(str(config), binary=str(binary), search=search)
    Path(str(config) + ".nvshim-orig.json").unlink()  # no backup: found beside runtimes.path
    result = docker.revert(str(config))
    assert not result.used_backup and str(hook) in [c.path for c in result.files]
    assert not hook.exists()

    docker.configure(str(config), binary=str(binary), search=search)
    hook.write_bytes(b"\x7fELF NVIDIA's, installed since\xff")
    docker.revert(str(config))
    assert hook.read_bytes() == b"\x7fELF NVIDIA's, installed since\xff"
