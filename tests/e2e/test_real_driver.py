"""A real NVIDIA driver's files, end to end: nvshim-runtime → runc on Debian's packages.

The driver roots hold the user space a node runs (Debian's non-free packages, see
:mod:`tests.helpers.realdriver`) under a simulated kernel side: real ``nvidia-smi`` exits 9
("couldn't communicate with the NVIDIA driver") once it has loaded ``libnvidia-ml`` — 12
means it did not find the library — and real ``libcuda`` answers ``cuDriverGetVersion``
and returns CUDA_ERROR_NO_DEVICE (100) from ``cuInit``. Each test runs for both layouts:
``flat`` (NVIDIA's .run installer) and ``debian`` (nvidia/current + update-alternatives).

Assertions are what the process inside sees: exit codes of the real programs, what the C
probe (tests/probe/cudaprobe.c) loaded and got, files that exist and hash like the driver
root's, links that resolve. The download is cached between runs; set
NVSHIM_TESTS_NO_REAL_DRIVER=1 to skip these tests on a machine without Debian's archive.

Fixtures: ``compute_packages`` / ``graphics_packages`` (session, the .deb files),
``probe`` (session, the compiled probe), ``probe_rootfs`` / ``cuda_image_rootfs`` (session,
read-only by convention: ``make_bundle`` copies them), ``compute_root`` / ``graphics_root``
(module, one per layout).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import pytest

from nvshim.node.compile import compile_node
from tests.helpers.bundle import copy_rootfs, make_bundle
from tests.helpers.common import RunResult, require_root, unique_id
from tests.helpers.node import write_nvshim_config
from tests.helpers.realdriver import (
    COMPUTE_PACKAGES,
    CUDA_IMAGE_CUDA_LIBDIR,
    GRAPHICS_PACKAGES,
    LAYOUTS,
    OPT_OUT_ENV,
    DownloadError,
    DriverPackages,
    DriverRoot,
    ProbeResult,
    add_driver_dependencies,
    build_probe,
    cuda_driver_version,
    cuda_version_text,
    driver_packages,
    driver_programs,
    make_cuda_image_rootfs,
    make_driver_root,
    parse_probe,
    resolve_in_root,
)
from tests.helpers.runc import Runc

pytestmark = pytest.mark.e2e

PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LIBDIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu")
DEBIAN_LIBDIR = "/usr/lib/x86_64-linux-gnu/nvidia/current"
SMI_NOT_REACHED = 9  # nvidia-smi loaded NVML, NVML found no kernel driver to talk to
CUDA_ERROR_NO_DEVICE = 100
# CUDA images set it; nothing is there, the loader must find the driver through the cache
CUDA_IMAGE_ENV = ("LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",)
SHOW = (
    'show() { if [ -e "$1" ]; then echo "EXISTS $1 $(readlink -f "$1") '
    '$(sha256sum < "$1" | cut -d" " -f1)"; else echo "MISSING $1"; fi; }; '
)


# --------------------------------------------------------------------------- fixtures


def _packages(names: Sequence[str]) -> DriverPackages:
    require_root()
    if os.environ.get(OPT_OUT_ENV) == "1":
        pytest.skip(f"{OPT_OUT_ENV}=1: the real-driver tests are switched off")
    try:
        return driver_packages(names)
    except DownloadError as exc:
        pytest.fail(
            f"real NVIDIA driver packages: {exc} (set {OPT_OUT_ENV}=1 to skip)", pytrace=False
        )


@pytest.fixture(scope="session")
def compute_packages() -> DriverPackages:
    """Debian's compute driver packages (downloaded once, cached between runs)."""
    return _packages(COMPUTE_PACKAGES)


@pytest.fixture(scope="session")
def graphics_packages() -> DriverPackages:
    """The compute packages plus GLX/EGL/Vulkan/OpenCL/VDPAU/NVENC/Xorg ones."""
    return _packages(GRAPHICS_PACKAGES)


@pytest.fixture(scope="session")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/probe/cudaprobe.c compiled with the host's gcc."""
    return build_probe(tmp_path_factory.mktemp("probe"))


@pytest.fixture(scope="session")
def driver_needs(
    compute_packages: DriverPackages, tmp_path_factory: pytest.TempPathFactory
) -> List[Path]:
    """The real nvidia-smi and libcuda, unpacked: what the rootfs's C libraries must serve."""
    return driver_programs(compute_packages, tmp_path_factory.mktemp("driver-programs") / "x")


@pytest.fixture(scope="session")
def probe_rootfs(
    glibc_base_rootfs: Path,
    probe: Path,
    driver_needs: List[Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """busybox + the host's loader and C libraries (all nvidia-smi and libcuda need) + the
    probe at /usr/bin/cudaprobe, with its own ld.so.cache; copy before use."""
    root = copy_rootfs(glibc_base_rootfs, tmp_path_factory.mktemp("probe-rootfs") / "rootfs")
    shutil.copy2(probe, root / "usr/bin/cudaprobe")
    add_driver_dependencies(root, [probe, *driver_needs])
    return root


@pytest.fixture(scope="session")
def cuda_image_rootfs(
    probe: Path, driver_needs: List[Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A rootfs shaped like an nvidia/cuda image (merged /usr, its own libz and a libstdc++
    only its ld.so.cache finds); copy before use."""
    return make_cuda_image_rootfs(
        tmp_path_factory.mktemp("cuda-image") / "rootfs", [probe], driver_needs
    )


@pytest.fixture(scope="module", params=LAYOUTS)
def compute_root(
    request: pytest.FixtureRequest,
    compute_packages: DriverPackages,
    tmp_path_factory: pytest.TempPathFactory,
) -> DriverRoot:
    """A one-GPU driver root with the compute packages, in each layout."""
    return make_driver_root(
        tmp_path_factory.mktemp(f"compute-{request.param}") / "root",
        compute_packages,
        request.param,
    )


@pytest.fixture(scope="module", params=LAYOUTS)
def graphics_root(
    request: pytest.FixtureRequest,
    graphics_packages: DriverPackages,
    tmp_path_factory: pytest.TempPathFactory,
) -> DriverRoot:
    """A one-GPU driver root with the graphics packages too, in each layout."""
    return make_driver_root(
        tmp_path_factory.mktemp(f"graphics-{request.param}") / "root",
        graphics_packages,
        request.param,
    )


# --------------------------------------------------------------------------- helpers


def node_config(tmp_path: Path, root: DriverRoot, **settings: object) -> Path:
    """An nvshim config for ``root`` (no nvml-facts: a real node has none), compiled."""
    cfg = write_nvshim_config(
        tmp_path / f"cfg-{unique_id('c')}",
        {"driver-root": root.root, "runtimes": ["runc"], **settings},
    )
    compile_node(str(cfg))
    return cfg


def run_container(
    runc: Runc,
    runtime: str,
    tmp_path: Path,
    root: DriverRoot,
    rootfs: Path,
    script: str,
    env: Iterable[str],
    *,
    log: Optional[Path] = None,
    cfg: Optional[Path] = None,
) -> RunResult:
    """Run ``sh -c script`` in a copy of ``rootfs`` through nvshim-runtime on ``root``."""
    cfg = cfg or node_config(tmp_path, root)
    bundle = make_bundle(tmp_path / unique_id("b"), rootfs, ["sh", "-c", script], env=[PATH, *env])
    return runc.run_detached(
        bundle,
        unique_id(),
        runtime=runtime,
        log=log,
        env={"NVSHIM_CONFIG": str(cfg), "PATH": PATH[5:]},
    )


def gpu_env(caps: str) -> List[str]:
    return ["NVIDIA_VISIBLE_DEVICES=0", f"NVIDIA_DRIVER_CAPABILITIES={caps}"]


def smi_exit(output: str) -> int:
    m = re.search(r"^smi-exit=(\d+)$", output, re.M)
    assert m, f"no smi-exit line in:\n{output}"
    return int(m.group(1))


SMI = 'nvidia-smi > /tmp/smi.out 2>&1; echo "smi-exit=$?"; head -c 400 /tmp/smi.out; echo; '


def expected_cuda(root: DriverRoot) -> int:
    return cuda_driver_version(str(root.library("libcuda")))


def assert_probe_saw_driver(probe_out: ProbeResult, root: DriverRoot, output: str) -> None:
    assert probe_out.libcuda is not None, output
    assert probe_out.values.get("cuDriverGetVersion") == 0, output
    assert probe_out.values.get("version") == expected_cuda(root), output
    assert probe_out.values.get("cuInit") == CUDA_ERROR_NO_DEVICE, output


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shown(output: str) -> Dict[str, Optional[Tuple[str, str]]]:
    """``show`` lines → path: (resolved path, sha256) or None when missing."""
    out: Dict[str, Optional[Tuple[str, str]]] = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "EXISTS":
            out[parts[1]] = (parts[2], parts[3])
        elif len(parts) == 2 and parts[0] == "MISSING":
            out[parts[1]] = None
    return out


def show_script(paths: Iterable[str]) -> str:
    return SHOW + "".join(f"show {p}; " for p in paths)


def root_file(root: DriverRoot, path: str) -> Path:
    """The driver root's real file for ``path`` (links followed inside the root)."""
    resolved = resolve_in_root(root.root, path)
    assert resolved is not None, f"{root.root}{path} does not resolve inside the root"
    return root.root / resolved.lstrip("/")


def loader_paths(sonames: Sequence[str]) -> str:
    """Shell that shows the file the container's loader would map for each SONAME: its
    ld.so.cache entry (``ldconfig -p``), else the default directories."""
    parts = []
    for so in sonames:
        parts.append(
            f'p=$(ldconfig -p | sed -n "s|^[[:space:]]*{re.escape(so)} (libc6,x86-64) => ||p" '
            f'| head -n1); [ -n "$p" ] || for d in {" ".join(LIBDIRS)}; do '
            f'[ -e "$d/{so}" ] && p="$d/{so}" && break; done; '
            f'echo "SONAME {so} ${{p:-none}}"; [ -n "$p" ] && show "$p"; '
        )
    return "".join(parts)


def loader_result(output: str, soname: str) -> Optional[Tuple[str, str]]:
    """(resolved file, sha256) the container's loader would map for ``soname``, or None."""
    m = re.search(rf"^SONAME {re.escape(soname)} (\S+)$", output, re.M)
    assert m, output
    if m.group(1) == "none":
        return None
    return shown(output).get(m.group(1))


# --------------------------------------------------------------------------- compute


def test_real_nvidia_smi_and_libcuda_work(
    runc, nvshim_runtime_bin, tmp_path, compute_root, probe_rootfs
):
    """compute,utility: the injected real nvidia-smi loads NVML (exit 9, not 12) and the
    probe's dlopen("libcuda.so.1") gets the root's libcuda: its CUDA version, cuInit 100."""
    res = run_container(
        runc,
        nvshim_runtime_bin,
        tmp_path,
        compute_root,
        probe_rootfs,
        SMI + "cudaprobe",
        gpu_env("compute,utility"),
    ).check()
    assert smi_exit(res.stdout) == SMI_NOT_REACHED, res.describe()
    assert_probe_saw_driver(parse_probe(res.stdout), compute_root, res.describe())


def test_utility_only_has_nvidia_smi_but_no_libcuda(
    runc, nvshim_runtime_bin, tmp_path, compute_root, probe_rootfs
):
    """utility: nvidia-smi still reaches NVML (exit 9); libcuda.so.1 cannot be loaded."""
    res = run_container(
        runc,
        nvshim_runtime_bin,
        tmp_path,
        compute_root,
        probe_rootfs,
        SMI + 'cudaprobe; echo "probe-exit=$?"',
        gpu_env("utility"),
    ).check()
    assert smi_exit(res.stdout) == SMI_NOT_REACHED, res.describe()
    result = parse_probe(res.stdout)
    assert result.libcuda is None and result.error and "libcuda.so.1" in result.error, (
        res.describe()
    )
    assert "probe-exit=2" in res.stdout


def test_compute_only_has_libcuda_but_no_nvidia_smi(
    runc, nvshim_runtime_bin, tmp_path, compute_root, probe_rootfs
):
    """compute: the probe works; the container has no nvidia-smi (a utility program)."""
    script = (
        'command -v nvidia-smi || echo "no-nvidia-smi"; '
        '[ -e /usr/bin/nvidia-smi ] && echo "has /usr/bin/nvidia-smi"; cudaprobe'
    )
    res = run_container(
        runc, nvshim_runtime_bin, tmp_path, compute_root, probe_rootfs, script, gpu_env("compute")
    ).check()
    assert "no-nvidia-smi" in res.stdout and "has /usr/bin" not in res.stdout, res.describe()
    assert_probe_saw_driver(parse_probe(res.stdout), compute_root, res.describe())


def test_cuda_image_keeps_its_own_libraries(
    runc, nvshim_runtime_bin, tmp_path, compute_root, cuda_image_rootfs
):
    """In a CUDA-shaped image (merged /usr, its own ld.so.cache) libcuda loads and the image's
    own libraries still resolve after nvshim's edits — libstdc++ from the directory only its
    ld.so.conf.d names, so only a cache that kept the image's entries finds it."""
    res = run_container(
        runc,
        nvshim_runtime_bin,
        tmp_path,
        compute_root,
        cuda_image_rootfs,
        'cudaprobe libz.so.1 libstdc++.so.6; echo "probe-exit=$?"',
        [*gpu_env("compute,utility"), *CUDA_IMAGE_ENV],
    ).check()
    result = parse_probe(res.stdout)
    assert_probe_saw_driver(result, compute_root, res.describe())
    assert result.libraries.get("libz.so.1"), res.describe()
    assert result.libraries.get("libstdc++.so.6") == f"{CUDA_IMAGE_CUDA_LIBDIR}/libstdc++.so.6", (
        res.describe()
    )
    assert "probe-exit=0" in res.stdout


def test_cuda_version_comes_from_libcuda_without_nvml_facts(
    runc, nvshim_runtime_bin, tmp_path, compute_root, cuda_image_rootfs
):
    """A CUDA image's NVIDIA_REQUIRE_CUDA is checked against the CUDA version of the root's
    libcuda when the config has no nvml-facts: cuda>=12.0 is created; cuda>=99.0 fails in
    one line naming the node's CUDA version."""
    node_cuda = cuda_version_text(expected_cuda(compute_root))
    env = [*gpu_env("compute,utility"), *CUDA_IMAGE_ENV, "CUDA_VERSION=12.0"]
    ok = run_container(
        runc,
        nvshim_runtime_bin,
        tmp_path,
        compute_root,
        cuda_image_rootfs,
        "cudaprobe",
        [*env, "NVIDIA_REQUIRE_CUDA=cuda>=12.0"],
    )
    assert ok.rc == 0, ok.describe()
    assert parse_probe(ok.stdout).values.get("cuInit") == CUDA_ERROR_NO_DEVICE, ok.describe()

    cfg = node_config(tmp_path, compute_root)
    bundle = make_bundle(
        tmp_path / "too-new",
        cuda_image_rootfs,
        ["cudaprobe"],
        env=[PATH, *env, "NVIDIA_REQUIRE_CUDA=cuda>=99.0"],
    )
    log = tmp_path / "too-new.log"
    res = runc.create(
        bundle,
        unique_id(),
        runtime=nvshim_runtime_bin,
        log=log,
        env={"NVSHIM_CONFIG": str(cfg), "PATH": PATH[5:]},
    )
    assert res.rc == 1, res.describe()
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and node_cuda in lines[0] and "99.0" in lines[0], res.describe()
    assert len(res.log_errors) == 1 and node_cuda in res.log_errors[0], res.describe()


# --------------------------------------------------------------------------- skew


def skewed(version: str) -> str:
    """Another version of the same branch: 535.309.01 → 535.310.01."""
    parts = version.split(".")
    parts[1] = str(int(parts[1]) + 1)
    return ".".join(parts)


def test_version_skew_injects_the_files_and_warns_once(
    runc, nvshim_runtime_bin, nvshim_bin, tmp_path, compute_packages, probe_rootfs
):
    """Kernel module (procfs) at another version than the files: the create succeeds with
    the files' user space, --log gets one warning naming both versions, and `nvshim
    doctor` fails naming both."""
    for layout in LAYOUTS:
        kernel = skewed(compute_packages.version)
        root = make_driver_root(
            tmp_path / f"skew-{layout}", compute_packages, layout, kernel_version=kernel
        )
        cfg = node_config(tmp_path, root)
        log = tmp_path / f"skew-{layout}.log"
        res = run_container(
            runc,
            nvshim_runtime_bin,
            tmp_path,
            root,
            probe_rootfs,
            SMI + "cudaprobe",
            gpu_env("compute,utility"),
            log=log,
            cfg=cfg,
        )
        assert res.rc == 0, res.describe()
        assert smi_exit(res.stdout) == SMI_NOT_REACHED, res.describe()
        assert_probe_saw_driver(parse_probe(res.stdout), root, res.describe())
        both = [
            x
            for x in res.log_lines
            if kernel in str(x.get("msg")) and root.version in str(x.get("msg"))
        ]
        assert len(both) == 1 and both[0].get("level") == "warning", res.describe()

        doctor = subprocess.run(
            [nvshim_bin, "doctor", "--config", str(cfg)],
            capture_output=True,
            text=True,
            env={**os.environ, "NVSHIM_CONFIG": str(cfg)},
        )
        assert doctor.returncode != 0, doctor.stdout + doctor.stderr
        skew_lines = [
            ln for ln in doctor.stdout.splitlines() if kernel in ln and root.version in ln
        ]
        assert skew_lines and all("FAIL" in ln for ln in skew_lines), doctor.stdout


# --------------------------------------------------------------------------- containment


def test_debian_alternatives_never_reach_outside_the_driver_root(
    runc, nvshim_runtime_bin, tmp_path, compute_packages, probe_rootfs
):
    """Alternatives links are absolute: followed on the host instead of inside the driver
    root they would inject the host's files. With /etc/alternatives entries pointing at
    host-only files (/usr/bin/env for nvidia-smi, the host's libz for libnvidia-ml), the
    container gets either the root's own file or nothing, never the host's."""
    root = make_driver_root(tmp_path / "debian", compute_packages, "debian")
    host_smi = Path("/usr/bin/env")
    host_lib = Path(os.path.realpath("/lib/x86_64-linux-gnu/libz.so.1"))
    for trap in (host_smi, host_lib):
        assert trap.is_file() and resolve_in_root(root.root, str(trap)) is None
    alternatives = root.root / "etc/alternatives"
    for name, trap in (
        ("nvidia--nvidia-smi", host_smi),
        ("nvidia--libnvidia-ml.so.1-x86_64-linux-gnu", host_lib),
    ):
        (alternatives / name).unlink()
        (alternatives / name).symlink_to(trap)
    ml_paths = [f"{d}/libnvidia-ml.so.1" for d in (*LIBDIRS, DEBIAN_LIBDIR)]
    script = show_script(["/usr/bin/nvidia-smi", *ml_paths]) + "cudaprobe; cat /proc/self/mountinfo"
    res = run_container(
        runc, nvshim_runtime_bin, tmp_path, root, probe_rootfs, script, gpu_env("compute,utility")
    ).check()
    seen = shown(res.stdout)
    traps = {sha256(host_smi), sha256(host_lib)}
    for path, got in seen.items():
        assert got is None or got[1] not in traps, f"{path} is a host file\n{res.describe()}"
    smi = seen.get("/usr/bin/nvidia-smi")
    assert smi is None or smi[1] == sha256(root.nvidia_smi), res.describe()
    for path in ml_paths:
        ml = seen.get(path)
        assert ml is None or ml[1] == sha256(root.library("libnvidia-ml")), res.describe()
    # the links left alone still work: the root as a whole was used, not refused
    assert_probe_saw_driver(parse_probe(res.stdout), root, res.describe())
    mount_roots = [ln.split()[3] for ln in res.stdout.splitlines() if " - " in ln]
    for trap in (host_smi, host_lib):
        assert str(trap) not in mount_roots, res.describe()


# --------------------------------------------------------------------------- graphics

VULKAN_ICD = ("/etc/vulkan/icd.d/nvidia_icd.json", "/usr/share/vulkan/icd.d/nvidia_icd.json")
VULKAN_LAYER = (
    "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
    "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
)
GRAPHICS_DATA: Tuple[Tuple[str, ...], ...] = (
    # one of these paths, in the container and in either layout's root
    ("/usr/share/glvnd/egl_vendor.d/10_nvidia.json",),
    VULKAN_ICD,
    VULKAN_LAYER,
    ("/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",),
    ("/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",),
)
GRAPHICS_SONAMES = (
    "libGLX_nvidia.so.0",
    "libEGL_nvidia.so.0",
    "libnvidia-egl-gbm.so.1",
    "libnvidia-egl-wayland.so.1",
)


def _root_data_sha(root: DriverRoot, candidates: Sequence[str]) -> str:
    for p in candidates:
        if resolve_in_root(root.root, p) is not None:
            return sha256(root_file(root, p))
    raise AssertionError(f"none of {candidates} in {root.root}")


def _root_soname_sha(root: DriverRoot, soname: str) -> str:
    return sha256(root_file(root, f"/usr/lib/x86_64-linux-gnu/{soname}"))


def test_graphics_gets_glvnd_vulkan_and_egl_platform_files(
    runc, nvshim_runtime_bin, tmp_path, graphics_root, probe_rootfs
):
    """graphics: the EGL vendor JSON, the Vulkan ICD and implicit layer JSONs and the EGL
    external platform JSONs are the root's files; libGLX_nvidia, libEGL_nvidia,
    libnvidia-egl-gbm and libnvidia-egl-wayland are what the container's loader maps."""
    paths = [p for group in GRAPHICS_DATA for p in group]
    res = run_container(
        runc,
        nvshim_runtime_bin,
        tmp_path,
        graphics_root,
        probe_rootfs,
        show_script(paths) + loader_paths(GRAPHICS_SONAMES),
        gpu_env("graphics"),
    ).check()
    seen = shown(res.stdout)
    for group in GRAPHICS_DATA:
        present = [got for got in (seen.get(p) for p in group) if got]
        assert present, f"none of {group} in the container\n{res.describe()}"
        assert all(got[1] == _root_data_sha(graphics_root, group) for got in present), (
            f"{group}\n{res.describe()}"
        )
    for soname in GRAPHICS_SONAMES:
        got = loader_result(res.stdout, soname)
        assert got is not None, f"{soname} does not resolve\n{res.describe()}"
        assert got[1] == _root_soname_sha(graphics_root, soname), res.describe()


def test_graphics_and_compute_get_opencl_and_the_gbm_backend(
    runc, nvshim_runtime_bin, tmp_path, graphics_root, probe_rootfs
):
    """graphics,compute: /etc/OpenCL/vendors/nvidia.icd (the OpenCL ICD comes with compute)
    and <libdir>/gbm/nvidia-drm_gbm.so resolving to an existing libnvidia-allocator.so.<v>."""
    paths = ["/etc/OpenCL/vendors/nvidia.icd"] + [f"{d}/gbm/nvidia-drm_gbm.so" for d in LIBDIRS]
    res = run_container(
        runc,
        nvshim_runtime_bin,
        tmp_path,
        graphics_root,
        probe_rootfs,
        show_script(paths) + "cat /etc/OpenCL/vendors/nvidia.icd",
        gpu_env("graphics,compute"),
    ).check()
    seen = shown(res.stdout)
    icd = seen.get("/etc/OpenCL/vendors/nvidia.icd")
    assert icd and icd[1] == sha256(root_file(graphics_root, "/etc/OpenCL/vendors/nvidia.icd")), (
        res.describe()
    )
    gbm = [
        seen[f"{d}/gbm/nvidia-drm_gbm.so"]
        for d in LIBDIRS
        if seen.get(f"{d}/gbm/nvidia-drm_gbm.so")
    ]
    assert gbm, res.describe()
    allocator = graphics_root.library("libnvidia-allocator")
    for resolved, digest in gbm:
        assert Path(resolved).name == allocator.name, res.describe()
        assert digest == sha256(allocator), res.describe()


def test_display_gets_the_xorg_modules(
    runc, nvshim_runtime_bin, tmp_path, graphics_root, probe_rootfs
):
    """display: nvidia_drv.so and libglxserver_nvidia.so.<v> where Xorg loads modules."""
    glxserver = f"/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{graphics_root.version}"
    drv = "/usr/lib/xorg/modules/drivers/nvidia_drv.so"
    res = run_container(
        runc,
        nvshim_runtime_bin,
        tmp_path,
        graphics_root,
        probe_rootfs,
        show_script([drv, glxserver]),
        gpu_env("display"),
    ).check()
    seen = shown(res.stdout)
    assert seen.get(drv) and seen[drv][1] == sha256(root_file(graphics_root, drv)), res.describe()
    real_glxserver = root_file(
        graphics_root, "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so"
    )
    assert seen.get(glxserver) and seen[glxserver][1] == sha256(real_glxserver), res.describe()


def test_video_puts_vdpau_where_libvdpau_looks(
    runc, nvshim_runtime_bin, tmp_path, graphics_root, probe_rootfs
):
    """video: libvdpau_nvidia.so.<v> in <libdir>/vdpau/ (libvdpau's module directory), not
    beside the other libraries."""
    name = f"libvdpau_nvidia.so.{graphics_root.version}"
    vdpau = f"/usr/lib/x86_64-linux-gnu/vdpau/{name}"
    beside = [f"{d}/{name}" for d in LIBDIRS]
    res = run_container(
        runc,
        nvshim_runtime_bin,
        tmp_path,
        graphics_root,
        probe_rootfs,
        show_script([vdpau, *beside]),
        gpu_env("video"),
    ).check()
    seen = shown(res.stdout)
    real = root_file(graphics_root, "/usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.1")
    assert seen.get(vdpau) and seen[vdpau][1] == sha256(real), res.describe()
    assert all(seen.get(p) is None for p in beside), res.describe()
