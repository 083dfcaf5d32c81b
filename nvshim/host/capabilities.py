"""What each capability gets: the driver's libraries, programs, data files, control and
DRM nodes, as tables, and the records discovery fills in.

The tables (:data:`LIBRARIES`, :data:`LIBRARY_SETS`, :data:`DATA_FILES`, :data:`BINARIES`,
:data:`CONTROL_NODES` …) say what a ``NVIDIA_DRIVER_CAPABILITIES`` value asks for;
:class:`Library` and :class:`DriverFile` are what was found for it, and
:func:`missing_files` names what a capability asked for and did not find. Where the files
are looked for is :mod:`nvshim.host.driverfiles`'s; the GPUs and their nodes,
:mod:`nvshim.host.gpus`'.

Only tables, records and pure functions: a create answered by the node plan cache
(:mod:`nvshim.runtime.plancache`) reads these and never loads the finders.
"""

from __future__ import annotations

from nvshim._record import dataclass

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Dict, Iterable, List, Optional, Tuple

__all__ = [
    "BIN_DIRS",
    "BINARIES",
    "CONTROL_NODES",
    "DATA_FILES",
    "DRM_CAPABILITIES",
    "ESSENTIAL",
    "FILE_SETS",
    "LIB_DIRS",
    "LIBRARIES",
    "LIBRARY_SETS",
    "OWN_VERSION_LIBRARIES",
    "DriverFile",
    "Library",
    "drm_capabilities",
    "missing_files",
    "system_libdir",
    "wants_drm",
    "with_implied",
]

#: Driver libraries per capability (library base names; the file is ``<base>.so.<version>``).
LIBRARIES: Dict[str, Tuple[str, ...]] = {
    "utility": ("libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq"),
    "compute": (
        "libcuda",
        "libcudadebugger",
        "libnvidia-opencl",
        "libnvidia-gpucomp",
        "libnvidia-ptxjitcompiler",
        "libnvidia-fatbinaryloader",
        "libnvidia-allocator",
        "libnvidia-compiler",
        "libnvidia-pkcs11",
        "libnvidia-pkcs11-openssl3",
        "libnvidia-nvvm",
        "libnvidia-tileiras",
    ),
    "video": ("libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid"),
    "graphics": (
        "libnvidia-eglcore",
        "libnvidia-glcore",
        "libnvidia-tls",
        "libnvidia-glsi",
        "libnvidia-fbc",
        "libnvidia-ifr",
        "libnvidia-rtcore",
        "libnvoptix",
        "libGLX_nvidia",
        "libEGL_nvidia",
        "libGLESv2_nvidia",
        "libGLESv1_CM_nvidia",
        "libnvidia-glvkspirv",
        "libnvidia-cbl",
        "libnvidia-vulkan-producer",
        "libnvidia-allocator",  # also compute's: GBM's nvidia-drm_gbm.so is a link to it
        "libnvidia-egl-gbm",
        "libnvidia-egl-wayland",
    ),
    "ngx": ("libnvidia-ngx",),
    "display": (),
    "compat32": (),
}

#: Libraries the driver ships with a version of their own (EGL platform libraries): the
#: file is whatever ``<SONAME>`` resolves to, not ``<base>.so.<driver version>``.
OWN_VERSION_LIBRARIES: Dict[str, str] = {
    "libnvidia-egl-gbm": "libnvidia-egl-gbm.so.1",
    "libnvidia-egl-wayland": "libnvidia-egl-wayland.so.1",
}

#: Driver data files per capability: (capability, container path — "" for where it was
#: found —, paths to look for in the driver root, in order; ``{version}`` is the driver's).
DATA_FILES: Tuple[Tuple[str, str, Tuple[str, ...]], ...] = (
    (
        "graphics",
        "",
        ("/etc/glvnd/egl_vendor.d/10_nvidia.json", "/usr/share/glvnd/egl_vendor.d/10_nvidia.json"),
    ),
    # Vulkan's JSONs go to /etc/vulkan wherever the host has them, as the reference puts
    # them: the loader reads /etc before /usr/share, and an image's own
    # /usr/share/vulkan/icd.d/nvidia_icd.json is left visible (docs/real-gpu.md)
    (
        "graphics",
        "/etc/vulkan/icd.d/nvidia_icd.json",
        ("/etc/vulkan/icd.d/nvidia_icd.json", "/usr/share/vulkan/icd.d/nvidia_icd.json"),
    ),
    (
        "graphics",
        "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
        (
            "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
            "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
        ),
    ),
    (
        "graphics",
        "",
        (
            "/etc/egl/egl_external_platform.d/10_nvidia_wayland.json",
            "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
        ),
    ),
    (
        "graphics",
        "",
        (
            "/etc/egl/egl_external_platform.d/15_nvidia_gbm.json",
            "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
        ),
    ),
    (
        "graphics",
        "",
        ("/usr/share/nvidia/nvoptix.bin", "/usr/lib/x86_64-linux-gnu/nvidia/current/nvoptix.bin"),
    ),
    ("compute", "", ("/etc/OpenCL/vendors/nvidia.icd",)),
    # the Xorg modules come with graphics (display implies it), as the reference's graphics
    # modifier mounts them: a GLX-capable X server in the container (Xvfb, Xorg) needs them
    (
        "graphics",
        "/usr/lib/xorg/modules/drivers/nvidia_drv.so",
        (
            "/usr/lib/xorg/modules/drivers/nvidia_drv.so",
            "/usr/lib64/xorg/modules/drivers/nvidia_drv.so",
            "/usr/lib/x86_64-linux-gnu/nvidia/xorg/nvidia_drv.so",
            "/usr/lib/nvidia/nvidia_drv.so",  # Debian's alternatives link
            "/usr/lib/nvidia/current/nvidia_drv.so",
        ),
    ),
    (
        "graphics",
        "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{version}",
        (
            "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{version}",
            "/usr/lib64/xorg/modules/extensions/libglxserver_nvidia.so.{version}",
            "/usr/lib/x86_64-linux-gnu/nvidia/xorg/libglxserver_nvidia.so.{version}",
            "/usr/lib/nvidia/current/libglxserver_nvidia.so.{version}",
        ),
    ),
    (
        "display",
        "",
        ("/etc/X11/xorg.conf.d/10-nvidia.conf", "/usr/share/X11/xorg.conf.d/10-nvidia.conf"),
    ),
    (
        "display",
        "",
        (
            "/etc/X11/xorg.conf.d/nvidia-drm-outputclass.conf",
            "/usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf",
        ),
    ),
)

#: What a capability cannot work without (library base names and file names): reported
#: by ``doctor`` and ``inspect`` when a container asking for it would not get it.
ESSENTIAL: Dict[str, Tuple[str, ...]] = {
    "compute": ("libcuda",),
    "utility": ("libnvidia-ml", "nvidia-smi"),
    "video": ("libnvcuvid", "libnvidia-encode"),
    "graphics": ("libGLX_nvidia", "libEGL_nvidia", "libnvidia-glcore", "libnvidia-eglcore"),
    "display": ("nvidia_drv.so",),
    "ngx": ("libnvidia-ngx",),
}

#: Which library sets a capability pulls in (video also needs the compute libraries;
#: display needs graphics).
LIBRARY_SETS: Dict[str, Tuple[str, ...]] = {
    "utility": ("utility",),
    "compute": ("compute",),
    "video": ("video", "compute"),
    "graphics": ("graphics",),
    "display": ("display", "graphics"),
    "ngx": ("ngx",),
    "compat32": (),
}

#: Capabilities whose driver files (data files, programs) another one brings: display
#: is an X server's, which needs graphics' too.
FILE_SETS: Dict[str, Tuple[str, ...]] = {"display": ("graphics",)}


def with_implied(capabilities: Iterable[str]) -> Tuple[str, ...]:
    """``capabilities`` and those whose files they bring (:data:`FILE_SETS`), sorted."""
    caps = set(capabilities)
    for cap in tuple(caps):
        caps.update(FILE_SETS.get(cap, ()))
    return tuple(sorted(caps))


#: Driver binaries per capability.
BINARIES: Dict[str, Tuple[str, ...]] = {
    "utility": ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"),
    "compute": ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
}

#: Standard library directories searched when the ld.so.cache has no entry.
LIB_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib",
    "/lib",
)

BIN_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin", "/usr/local/nvidia/bin")
"""Where the driver's programs are looked for, in order. ``/usr/local/nvidia/bin``: the
driver installers that keep the driver out of ``/usr`` (GKE/COS, this layout's GPU machines)
put the programs there and a wrapper script in ``/usr/bin`` that execs them by that path."""

#: Control device nodes and the capability that needs each (None = always).
CONTROL_NODES: Tuple[Tuple[str, Optional[str]], ...] = (
    ("/dev/nvidiactl", None),
    ("/dev/nvidia-uvm", "compute"),
    ("/dev/nvidia-uvm-tools", "compute"),
    ("/dev/nvidia-modeset", "display"),
)

#: The capabilities that get each granted GPU's DRM nodes (:mod:`nvshim.host.drm`), as the
#: reference's graphics modifier gives them.
DRM_CAPABILITIES = ("graphics", "display")


def drm_capabilities(capabilities: Iterable[str]) -> Tuple[str, ...]:
    """Those of ``capabilities`` that get the GPUs' DRM nodes, sorted."""
    return tuple(sorted({cap for cap in capabilities if cap in DRM_CAPABILITIES}))


def wants_drm(capabilities: Iterable[str]) -> bool:
    """Whether ``capabilities`` get the GPUs' DRM nodes (no DRM lookup otherwise)."""
    return any(cap in DRM_CAPABILITIES for cap in capabilities)


@dataclass(frozen=True)
class Library:
    """A driver library: the versioned file and the SONAME link the container needs."""

    base: str
    host_path: str
    container_path: str
    soname: Optional[str]
    capability: str
    dev_link: Optional[str] = None
    """The unversioned link (``libnvidia-ml.so``) the driver folder has beside the file,
    which the container gets too (linking with ``-lnvidia-ml``); None when it has none."""


@dataclass(frozen=True)
class DriverFile:
    """Another driver file to bind-mount (binary, firmware, IPC socket)."""

    host_path: str
    container_path: str
    capability: Optional[str]
    kind: str  # "binary" | "data" | "firmware" | "ipc"


def missing_files(
    capabilities: Iterable[str], libraries: Iterable[Library], files: Iterable[DriverFile]
) -> Tuple[str, ...]:
    """The essential files (:data:`ESSENTIAL`) of ``capabilities`` that ``libraries`` and
    ``files`` lack, as ``"libcuda (compute)"``: a container asking for those capabilities
    would get a driver it cannot use. With ``compat32`` the 32-bit copies of the other
    capabilities' essential libraries count too (``"libcuda (compat32)"``)."""
    libraries = tuple(libraries)
    caps = sorted(set(capabilities))
    have = {lib.base for lib in libraries if lib.capability != "compat32"}
    have |= {f.container_path.rsplit("/", 1)[1] for f in files}
    out: List[str] = []
    for cap in caps:
        out += [f"{name} ({cap})" for name in ESSENTIAL.get(cap, ()) if name not in have]
    if "compat32" in caps:
        have32 = {lib.base for lib in libraries if lib.capability == "compat32"}
        wanted = dict.fromkeys(
            name for cap in caps for name in ESSENTIAL.get(cap, ()) if name.startswith("lib")
        )
        out += [f"{name} (compat32)" for name in wanted if name not in have32]
    return tuple(out)


def system_libdir(directory: str) -> str:
    """The library folder a driver folder belongs to: Debian's ``…/nvidia/current`` (and a
    ``vdpau``/``gbm`` subfolder) map to the folder above them, where the loader's plugins
    (``vdpau/``, ``gbm/``) are looked for."""
    for suffix in ("/vdpau", "/gbm", "/nvidia/current"):
        if directory.endswith(suffix):
            directory = directory[: -len(suffix)]
    return directory or "/"
