"""The driver's files: which libraries, programs, data files, firmware and IPC sockets
each capability gets, and where they are found in the driver root.

The tables (:data:`LIBRARIES`, :data:`DATA_FILES`, :data:`BINARIES` …) say what a
capability needs; :class:`DriverFileFinder` looks for them through the driver root's
ld.so.cache and the standard folders, following Debian's alternatives links inside the
root. :func:`missing_files` names what a capability asked for and did not find.
"""

from __future__ import annotations

import os
import stat

from nvshim._record import dataclass
from nvshim.host.roots import Roots

TYPE_CHECKING = False  # typing costs ~4 ms to import on the create path
if TYPE_CHECKING:
    from typing import Dict, Iterable, List, Optional, Tuple

__all__ = [
    "BIN_DIRS",
    "BINARIES",
    "DATA_FILES",
    "ESSENTIAL",
    "FILE_SETS",
    "LIB_DIRS",
    "LIBRARIES",
    "LIBRARY_SETS",
    "OWN_VERSION_LIBRARIES",
    "DriverFile",
    "DriverFileFinder",
    "Library",
    "missing_files",
    "system_libdir",
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
    ("graphics", "", ("/etc/glvnd/egl_vendor.d/10_nvidia.json",
                      "/usr/share/glvnd/egl_vendor.d/10_nvidia.json")),
    # Vulkan's JSONs go to /etc/vulkan wherever the host has them, as the reference puts
    # them: the loader reads /etc before /usr/share, and an image's own
    # /usr/share/vulkan/icd.d/nvidia_icd.json is left visible (docs/real-gpu.md)
    ("graphics", "/etc/vulkan/icd.d/nvidia_icd.json",
     ("/etc/vulkan/icd.d/nvidia_icd.json", "/usr/share/vulkan/icd.d/nvidia_icd.json")),
    ("graphics", "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
     ("/etc/vulkan/implicit_layer.d/nvidia_layers.json",
      "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json")),
    ("graphics", "", ("/etc/egl/egl_external_platform.d/10_nvidia_wayland.json",
                      "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json")),
    ("graphics", "", ("/etc/egl/egl_external_platform.d/15_nvidia_gbm.json",
                      "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json")),
    ("graphics", "", ("/usr/share/nvidia/nvoptix.bin",
                      "/usr/lib/x86_64-linux-gnu/nvidia/current/nvoptix.bin")),
    ("compute", "", ("/etc/OpenCL/vendors/nvidia.icd",)),
    # the Xorg modules come with graphics (display implies it), as the reference's graphics
    # modifier mounts them: a GLX-capable X server in the container (Xvfb, Xorg) needs them
    ("graphics", "/usr/lib/xorg/modules/drivers/nvidia_drv.so",
     ("/usr/lib/xorg/modules/drivers/nvidia_drv.so",
      "/usr/lib64/xorg/modules/drivers/nvidia_drv.so",
      "/usr/lib/x86_64-linux-gnu/nvidia/xorg/nvidia_drv.so",
      "/usr/lib/nvidia/nvidia_drv.so",  # Debian's alternatives link
      "/usr/lib/nvidia/current/nvidia_drv.so")),
    ("graphics", "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{version}",
     ("/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{version}",
      "/usr/lib64/xorg/modules/extensions/libglxserver_nvidia.so.{version}",
      "/usr/lib/x86_64-linux-gnu/nvidia/xorg/libglxserver_nvidia.so.{version}",
      "/usr/lib/nvidia/current/libglxserver_nvidia.so.{version}")),
    ("display", "", ("/etc/X11/xorg.conf.d/10-nvidia.conf",
                     "/usr/share/X11/xorg.conf.d/10-nvidia.conf")),
    ("display", "", ("/etc/X11/xorg.conf.d/nvidia-drm-outputclass.conf",
                     "/usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf")),
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


def _is_elf(path: str) -> bool:
    """Whether ``path`` starts like an ELF file (a program, not a script)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


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


class DriverFileFinder(Roots):
    """Finds the driver's files of a capability under the driver root."""

    _ldcache: Optional[Dict[str, str]]
    _ldcache32: Optional[Dict[str, str]] = None

    if TYPE_CHECKING:
        def driver_version(self) -> str:
            """:meth:`nvshim.host.discovery.Host.driver_version`."""

    def ldcache(self) -> Dict[str, str]:
        """SONAME/file name → path (as the driver root sees it), x86-64 entries only."""
        if self._ldcache is None:
            from nvshim.host.ldcache import read_ldcache

            entries: Dict[str, str] = {}
            for entry in read_ldcache(self.host_path("/etc/ld.so.cache")):
                # 0x0300 = x86-64 libc6 library; keep the first (preferred) entry of a key.
                if entry.flags & 0xFF00 == 0x0300 or entry.flags == 0x0303:
                    entries.setdefault(entry.key, entry.value)
            self._ldcache = entries
        return self._ldcache

    def _library_paths(self, base: str, filename: str) -> List[str]:
        """Where ``filename`` may be, in order: beside (and behind) the ld.so.cache's
        entries for ``base``, then :data:`LIB_DIRS`."""
        candidates: List[str] = []
        for key, value in self.ldcache().items():
            if key == filename or key.startswith(base + ".so"):
                candidates.append(os.path.join(os.path.dirname(value), filename))
                resolved = self.resolve(value)  # Debian: libcuda.so.1 -> …/nvidia/current/
                if resolved is not None:
                    candidates.append(os.path.join(os.path.dirname(resolved), filename))
        candidates.extend(os.path.join(d, filename) for d in LIB_DIRS)
        candidates.extend(os.path.join(d, "vdpau", filename) for d in LIB_DIRS[:2])
        return list(dict.fromkeys(candidates))

    def _library_at(self, base: str, resolved: str, capability: str) -> Library:
        """The :class:`Library` whose file is ``resolved`` (an in-root path, links followed)."""
        from nvshim.host.elf import read_soname

        host = self.host_path(resolved)
        directory, filename = resolved.rsplit("/", 1)
        container = resolved
        if base == "libvdpau_nvidia":  # libvdpau looks in <libdir>/vdpau/ only
            container = f"{system_libdir(directory)}/vdpau/{filename}"
        soname = read_soname(host)
        return Library(base, host, container, soname, capability,
                       _dev_link(host.rsplit("/", 1)[0], soname or filename))

    def find_library(self, base: str, capability: str) -> Optional[Library]:
        """Locate ``<base>.so.<driver version>`` (or, for the libraries the driver ships
        with their own version, the file behind their SONAME) inside the driver root.

        The file mounted is the one every link resolves to in the root; its container
        path is where it lies there (VDPAU's is moved into ``<libdir>/vdpau/``).
        """
        name = OWN_VERSION_LIBRARIES.get(base) or f"{base}.so.{self.driver_version()}"
        for candidate in self._library_paths(base, name):
            resolved = self._regular_file(candidate)
            if resolved is not None:
                return self._library_at(base, resolved, capability)
        return None

    def find_library32(self, base: str) -> Optional[Library]:
        """The 32-bit (i386) copy of ``base`` in the root, a ``compat32`` :class:`Library`,
        or None (the rules: :mod:`nvshim.host.compat32`)."""
        from nvshim.host import compat32

        if self._ldcache32 is None:
            self._ldcache32 = compat32.ldcache32(self.host_path("/etc/ld.so.cache"))
        name = OWN_VERSION_LIBRARIES.get(base) or f"{base}.so.{self.driver_version()}"
        for candidate in compat32.candidates32(self.resolve, self._ldcache32, base, name):
            resolved = self._regular_file(candidate)
            if resolved is not None and compat32.is_i386_elf(self.host_path(resolved)):
                return self._library_at(base, resolved, compat32.CAPABILITY)
        return None

    def libraries32(self, capabilities: Iterable[str]) -> Tuple[Library, ...]:
        """The 32-bit libraries ``capabilities`` ask for that the root has (none without
        ``compat32``; the node plan cache answers :meth:`find_library32`)."""
        from nvshim.host.compat32 import bases32

        found = (self.find_library32(b) for b in bases32(capabilities, LIBRARIES, LIBRARY_SETS))
        return tuple(lib for lib in found if lib is not None)

    def libraries(self, capabilities: Iterable[str]) -> Tuple[Library, ...]:
        """The 64-bit libraries of ``capabilities``, then (with ``compat32``) the 32-bit
        copies (:mod:`nvshim.host.compat32`)."""
        capabilities = tuple(capabilities)
        wanted: Dict[str, str] = {}
        for cap in sorted(capabilities):
            for libset in LIBRARY_SETS.get(cap, ()):
                for base in LIBRARIES[libset]:
                    wanted.setdefault(base, libset)
        found = []
        for base, cap in wanted.items():
            lib = self.find_library(base, cap)
            if lib is not None:
                found.append(lib)
        if "compat32" in capabilities:
            found += self.libraries32(capabilities)
        return tuple(found)

    def binaries(self, capabilities: Iterable[str]) -> Tuple[DriverFile, ...]:
        """The driver's programs of ``capabilities``, mounted where they were found in
        :data:`BIN_DIRS` (the file behind Debian's alternatives links, in the root)."""
        out = []
        for cap in sorted(capabilities):
            for name in BINARIES.get(cap, ()):
                found = [(directory, resolved) for directory in BIN_DIRS
                         if (resolved := self._regular_file(f"{directory}/{name}")) is not None]
                if not found:
                    continue
                # a wrapper script that execs the program by a host path would fail in the
                # container: the program itself (ELF), at the first place the name was found
                program = next((r for _, r in found if _is_elf(self.host_path(r))), found[0][1])
                at = found[0][0] if found[0][0] != "/usr/local/nvidia/bin" else "/usr/bin"
                out.append(DriverFile(self.host_path(program), f"{at}/{name}", cap, "binary"))
        return tuple(out)

    def data_files(self, capabilities: Iterable[str]) -> Tuple[DriverFile, ...]:
        """The driver's configuration and data files of ``capabilities`` (:data:`DATA_FILES`):
        ICD and vendor JSONs, the OpenCL ICD, ``nvoptix.bin``, the Xorg modules."""
        caps = set(capabilities)
        version: Optional[str] = None
        out = []
        for cap, container_path, candidates in DATA_FILES:
            if cap not in caps:
                continue
            if "{version}" in container_path:
                version = version or self.driver_version()
                container_path = container_path.format(version=version)
                candidates = tuple(c.format(version=version) for c in candidates)
            for candidate in candidates:
                resolved = self._regular_file(candidate)
                if resolved is not None:
                    target = container_path or candidate
                    out.append(DriverFile(self.host_path(resolved), target, cap, "data"))
                    break
        return tuple(out)

    def firmware(self) -> Tuple[DriverFile, ...]:
        """The GSP firmware of the driver version (:meth:`driver_version`)."""
        version = self.driver_version()
        directory = f"/lib/firmware/nvidia/{version}"
        resolved_dir = self.resolve(directory)
        if resolved_dir is None:
            return ()
        try:
            names = sorted(os.listdir(self.host_path(resolved_dir)))
        except OSError:
            return ()
        out = []
        for name in names:
            if name.startswith("gsp") and name.endswith(".bin"):
                resolved = self._regular_file(f"{resolved_dir}/{name}")
                if resolved is not None:
                    out.append(DriverFile(self.host_path(resolved), f"{directory}/{name}",
                                          None, "firmware"))
        return tuple(out)

    def files(self, capabilities: Iterable[str]) -> Tuple[DriverFile, ...]:
        """Every driver file but the libraries and IPC sockets: programs, data, firmware."""
        caps = tuple(capabilities)
        return self.binaries(caps) + self.data_files(caps) + self.firmware()

    def driver_files(self, capabilities: Iterable[str]) -> Tuple[DriverFile, ...]:
        """What a container of ``capabilities`` gets besides libraries and device nodes
        (``display``'s includes ``graphics``'s: :data:`FILE_SETS`)."""
        caps = tuple(capabilities)
        return self.files(with_implied(caps)) + self.ipc(caps)

    def missing(self, capabilities: Iterable[str]) -> Tuple[str, ...]:
        """:func:`missing_files` of what this node has for ``capabilities``."""
        caps = tuple(capabilities)
        return missing_files(caps, self.libraries(caps), self.files(with_implied(caps)))

    def ipc(self, capabilities: Iterable[str]) -> Tuple[DriverFile, ...]:
        caps = set(capabilities)
        out = []
        wanted: List[Tuple[str, str]] = []
        if "utility" in caps or "compute" in caps:
            wanted.append(("nvidia-persistenced/socket", "utility"))
        if "utility" in caps:
            wanted.append(("nvidia-fabricmanager/socket", "utility"))
        for rel, cap in wanted:
            for run in ("/run", "/var/run"):
                path = f"{run}/{rel}"
                resolved = self.resolve(path)
                try:
                    st = os.stat(self.host_path(resolved or path))
                except OSError:
                    continue
                if resolved is not None and stat.S_ISSOCK(st.st_mode):
                    out.append(DriverFile(self.host_path(resolved), path, cap, "ipc"))
                    break
        if "compute" in caps:
            path = "/tmp/nvidia-mps"
            resolved = self.resolve(path)
            if resolved is not None and os.path.isdir(self.host_path(resolved)):
                out.append(DriverFile(self.host_path(resolved), path, "compute", "ipc"))
        return tuple(out)


def _dev_link(host_directory: str, name: str) -> Optional[str]:
    """``libx.so`` when ``name`` (``libx.so.1``) has that unversioned link in the folder (as
    the reference: only where the driver's folder has one, a link and not a file)."""
    cut = name.find(".so.")
    if cut < 0:
        return None
    link = name[: cut + 3]
    return link if os.path.islink(f"{host_directory}/{link}") else None


def missing_files(capabilities: Iterable[str], libraries: Iterable[Library],
                  files: Iterable[DriverFile]) -> Tuple[str, ...]:
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
        wanted = dict.fromkeys(name for cap in caps for name in ESSENTIAL.get(cap, ())
                               if name.startswith("lib"))
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
