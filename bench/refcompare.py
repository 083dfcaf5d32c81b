"""Per capability, the paths a GPU container gets from nvshim beside NVIDIA's toolkit.

Run from the repository root with the venv's interpreter (Debian's driver packages come
from the real-driver tests' cache, ``~/.cache/nvshim-tests/debian-nvidia``, downloaded once
with a private apt configuration when missing)::

    /opt/nvshim/venv/bin/python bench/refcompare.py [--out refcompare.json]
        [--before eeebd37 | --before-tree DIR] [--go-links escape|root]
        [--extra-package NAME ...]

It lays out Debian 12's non-free driver packages (``tests/helpers/realdriver.py``'s graphics
set and ``tests/helpers/realdriver32.py``'s i386 set: the GL/EGL cores, RT core, OptiX and
GSP firmware packages are not in them) in both layouts, ``flat`` (NVIDIA's installer) and
``debian`` (``nvidia/current`` and the update-alternatives links), in a temporary folder,
and prints per ``NVIDIA_DRIVER_CAPABILITIES`` value and layout: the container paths
compared (the union), the same, the reference's only and nvshim's only, for nvshim before
issue 29's work (``--before``, a revision exported with ``git archive``) and for this
checkout; then each row's differing paths with the reason where one is known. ``compat32``
is asked as ``compat32,compute,utility,graphics,video`` and counts only 32-bit paths.

nvshim's side, for each tree in a child ``python -I`` with the tree first on ``sys.path``:
``Host(root).libraries(C)`` and ``Host(root).driver_files(C)`` container paths (programs,
data files, firmware, IPC sockets) and the links ``hook_links`` makes (its createContainer
hook's). The reference's side is modelled here from NVIDIA's sources (the lists below, each
under a comment naming the file it was read from):

- what a capability selects: libnvidia-container's per-capability library and program
  lists and the options each capability sets (``video`` brings compute's libraries,
  ``display`` graphics'), as its legacy path filters them;
- where 64-bit files are found and mounted: the toolkit's Go lookups (its jit-CDI driver
  discoverer: every ``*.so.<version>`` in the driver's library folders and their
  ``vdpau/``; programs on the default PATH), mounted at the path found; with graphics or
  display, the legacy graphics modifier's libraries, Xorg modules, JSON manifests, configs
  and links;
- links: ldconfig's SONAME link beside every library (both of the toolkit's paths run
  ldconfig over the library folders), ``libcuda.so``, ``libGLX_indirect.so.0`` and
  ``libnvidia-opticalflow.so``, the unversioned ``.so`` link where the driver's folder has
  one (create-symlinks), GBM's ``nvidia-drm_gbm.so``, ``libnvidia-vulkan-producer.so`` and
  ``libglxserver_nvidia.so`` (the graphics modifier's create-symlinks);
- firmware (``/lib/firmware/nvidia/<version>/gsp*.bin``, every capability) and IPC sockets
  as libnvidia-container gives them (persistenced and fabricmanager with utility, the MPS
  folder with compute's libraries);
- compat32: libnvidia-container's 32-bit path (the jit-CDI path has none): the root's i386
  ld.so.cache entries, links followed inside the root, the file name ending in the driver
  version, mounted into the image's ``/usr/lib/i386-linux-gnu``, with ldconfig's SONAME
  links and the three links above.

What is a modelling choice and not a fact of the source is printed under "guesses" and
written into the JSON; ``--go-links`` picks how the Go lookups meet an absolute link in the
driver root (Debian's alternatives): ``escape`` (default) as in a driver root that is not
``/``, ``root`` as on a node whose driver root is ``/``. Device nodes, DRM nodes and their
by-path links, procfs and the EGL application profile are left out (the roots' /dev is
simulated). A measurement: it asserts nothing.
"""

from __future__ import annotations

import argparse
import glob
import json
import mmap
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

BEFORE_REV = "eeebd37"
"""The last commit before issue 29's work (``CHANGELOG: config show names the file …``)."""

ROWS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("utility", ("utility",)),
    ("compute", ("compute",)),
    ("video", ("video",)),
    ("graphics", ("graphics",)),
    ("display", ("display",)),
    ("ngx", ("ngx",)),
    ("compat32", ("compat32", "compute", "utility", "graphics", "video")),
)
I386_DIRS = ("/usr/lib/i386-linux-gnu/", "/lib/i386-linux-gnu/", "/usr/lib32/", "/lib32/")

Entries = Dict[str, Tuple[str, str]]
"""Container path → (kind, detail): kind library/binary/data/firmware/ipc/link; detail the
file in the root (links: the link's target)."""

# --------------------------------------------------------------------------- reference data

# NVIDIA/libnvidia-container src/nvc_info.c (@00b4b47e): utility_libs, compute_libs,
# video_libs, graphics_libs + graphics_libs_glvnd (the compat list is looked up only with
# no-glvnd), ngx_libs; a library matches when its file name starts with one of these.
LNC_LIBRARIES: Dict[str, Tuple[str, ...]] = {
    "utility_libs": ("libnvidia-ml.so", "libnvidia-cfg.so", "libnvidia-nscq.so"),
    "compute_libs": (
        "libcuda.so",
        "libcudadebugger.so",
        "libnvidia-opencl.so",
        "libnvidia-gpucomp.so",
        "libnvidia-ptxjitcompiler.so",
        "libnvidia-fatbinaryloader.so",
        "libnvidia-allocator.so",
        "libnvidia-compiler.so",
        "libnvidia-pkcs11.so",
        "libnvidia-pkcs11-openssl3.so",
        "libnvidia-nvvm.so",
        "libnvidia-tileiras.so",
    ),
    "ngx_libs": ("libnvidia-ngx.so",),
    "video_libs": (
        "libvdpau_nvidia.so",
        "libnvidia-encode.so",
        "libnvidia-opticalflow.so",
        "libnvcuvid.so",
    ),
    "graphics_libs": (
        "libnvidia-eglcore.so",
        "libnvidia-glcore.so",
        "libnvidia-tls.so",
        "libnvidia-glsi.so",
        "libnvidia-fbc.so",
        "libnvidia-ifr.so",
        "libnvidia-rtcore.so",
        "libnvoptix.so",
        "libGLX_nvidia.so",
        "libEGL_nvidia.so",
        "libGLESv2_nvidia.so",
        "libGLESv1_CM_nvidia.so",
        "libnvidia-glvkspirv.so",
        "libnvidia-cbl.so",
    ),
}
# src/nvc_info.c: utility_bins, compute_bins
LNC_BINARIES: Dict[str, Tuple[str, ...]] = {
    "utility_bins": ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager"),
    "compute_bins": ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
}
# src/options.h (@5529c95f) container_opts: the flags each capability sets
LNC_FLAGS: Dict[str, Tuple[str, ...]] = {
    "utility": ("utility_bins", "utility_libs"),
    "compute": ("compute_bins", "compute_libs"),
    "video": ("video_libs", "compute_libs"),
    "graphics": ("graphics_libs",),
    "display": ("display", "graphics_libs"),
    "ngx": ("ngx_libs",),
    "compat32": ("compat32",),
}
# src/nvc_mount.c (@077f498c) symlink_libraries: (file name prefix, link made beside the
# mounted library, its target; None = the library's own file name)
LNC_LINKS: Tuple[Tuple[str, str, Optional[str]], ...] = (
    ("libcuda.so", "libcuda.so", "libcuda.so.1"),
    ("libGLX_nvidia.so", "libGLX_indirect.so.0", None),
    ("libnvidia-opticalflow.so", "libnvidia-opticalflow.so", "libnvidia-opticalflow.so.1"),
)
# src/nvc_info.c lookup_ipcs + src/nvc_mount.c nvc_driver_mount: (path looked up in the
# root, the flag that mounts it); /var/run is /run in the image
LNC_IPC: Tuple[Tuple[str, str], ...] = (
    ("/var/run/nvidia-persistenced/socket", "utility_libs"),
    ("/var/run/nvidia-fabricmanager/socket", "utility_libs"),
    ("/tmp/nvidia-mps", "compute_libs"),
)
# src/nvc_info.c lookup_firmwares (NV_FIRMWARE_PATH, gsp*.bin), mounted for every capability
LNC_FIRMWARE_DIR = "/lib/firmware/nvidia/{version}"
# src/nvc_container.c: the 32-bit library folder of an image with /etc/debian_version
LNC_LIBS32_DIR = "/usr/lib/i386-linux-gnu"

# NVIDIA/nvidia-container-toolkit (@d34b3046) pkg/lookup/library.go NewLibraryLocator: the
# search folders (x86-64 and aarch64 alike; its ld.so.cache fallback is not modelled: these
# folders find every file the roots have)
GO_LIBRARY_DIRS = (
    "/",
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu/nvidia/current",
    "/lib/aarch64-linux-gnu/nvidia/current",
)
# pkg/lookup/path.go defaultPATH (the executable locator's folders when PATH adds none)
GO_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
# internal/lookup/root/root.go Configs: /etc, then XDG_DATA_DIRS' default
GO_CONFIG_DIRS = ("/etc", "/usr/local/share", "/usr/share")
# internal/discover/graphics.go newGraphicsLibrariesDiscoverer (libnvidia-allocator is only
# looked up for GBM's link: its Mounts() leaves it out)
GO_GRAPHICS_LIBRARIES = (
    "libnvidia-egl-gbm.so.*.*",
    "libnvidia-egl-wayland.so.*.*",
    "libnvidia-egl-wayland2.so.*.*",
    "libnvidia-egl-xcb.so.*.*",
    "libnvidia-egl-xlib.so.*.*",
    "libnvidia-allocator.so.{version}",
    "libnvidia-vulkan-producer.so.{version}",
)
# graphics.go NewGraphicsMountsDiscoverer
GO_GRAPHICS_BINARIES = ("nvidia-xconfig",)
# graphics.go newGraphicsConfigsDiscoverer: mounted under /usr/share, and under /etc
GO_SHARE_CONFIGS = (
    "glvnd/egl_vendor.d/10_nvidia.json",
    "egl/egl_external_platform.d/15_nvidia_gbm.json",
    "egl/egl_external_platform.d/10_nvidia_wayland.json",
    "egl/egl_external_platform.d/09_nvidia_wayland2.json",
    "egl/egl_external_platform.d/20_nvidia_xcb.json",
    "egl/egl_external_platform.d/20_nvidia_xlib.json",
    "nvidia/nvoptix.bin",
    "X11/xorg.conf.d/10-nvidia.conf",
    "X11/xorg.conf.d/nvidia-drm-outputclass.conf",
)
GO_ETC_CONFIGS = ("OpenCL/vendors/nvidia.icd",)
# graphics.go newVulkanConfigsDiscover: mounted under /etc (amd64's extra ICD name included)
GO_VULKAN_CONFIGS = (
    "vulkan/icd.d/nvidia_icd.json",
    "vulkan/icd.d/nvidia_layers.json",
    "vulkan/implicit_layer.d/nvidia_layers.json",
    "vulkan/icd.d/nvidia_icd.x86_64.json",
)
# graphics.go: the X.Org modules, looked up once each (count 1), mounted at their path
GO_XORG_MODULES = ("nvidia_drv.so", "libglxserver_nvidia.so.{version}")


def go_xorg_dirs(libdirs: Sequence[str]) -> List[str]:
    """graphics.go buildXOrgSearchPaths: below each driver library folder, then the
    standard X.Org module folders."""
    subs = (
        "xorg/modules/drivers",
        "xorg/modules/extensions",
        "xorg/modules/updates/drivers",
        "xorg/modules/updates/extensions",
    )
    out: List[str] = []
    for libdir in libdirs:
        out += [f"{libdir}/nvidia/xorg"] + [f"{libdir}/{s}" for s in subs]
    for base in ("/usr/lib/xorg", "/usr/lib64/xorg"):
        out += [f"{base}/{s[len('xorg/') :]}" for s in subs]
    for base in ("/usr/X11R6/lib", "/usr/X11R6/lib64"):
        out += [f"{base}/{s[len('xorg/') :]}" for s in subs]
    return out


GUESSES = (
    "64-bit placement: at the path the file was found (the toolkit's jit-CDI, its default "
    "mode); libnvidia-container's own legacy path mounts each 64-bit library and program at "
    "<image folder>/<name> (flat: the same paths; debian: /usr/lib/x86_64-linux-gnu/<name>, "
    "/usr/bin/<name>)",
    "selection: libnvidia-container's per-capability lists applied to what the jit-CDI lookup "
    "finds (jit-CDI itself injects every *.so.<version> whatever the capabilities)",
    "--go-links escape: the Go lookups stat root+path on the host, so an absolute link inside "
    "a driver root that is not / (these roots; the GPU Operator's /run/nvidia/driver) points "
    "outside it and the file is missed (Debian's /etc/alternatives links: nvidia-smi, "
    "nvidia_drv.so, nvidia-drm-outputclass.conf); on a node whose driver root is / they "
    "resolve (--go-links root)",
    "the image is Debian-family (/etc/debian_version): libnvidia-container's 32-bit folder is "
    "/usr/lib/i386-linux-gnu, /var/run is a link to /run",
    "PATH adds no folder to the executable locator's default list; the Go code also searches "
    "the host's own PATH folders outside the driver root, left out here",
    "ldconfig makes a SONAME link beside every library (neither path passes -N)",
)

# --------------------------------------------------------------------------- file helpers


def resolve(root: str, path: str, absolute: str = "root") -> Optional[str]:
    """``path`` (absolute) with every link followed as if ``root`` were ``/``; the result is
    a path in the root, None when something on the way is missing. ``absolute="escape"``: an
    absolute link target leaves the root (as Go's ``os.Stat(root + path)`` does): None."""
    parts = [p for p in path.split("/") if p]
    done: List[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        here = os.path.join(root, *done, part)
        if os.path.islink(here):
            hops += 1
            target = os.readlink(here)
            if hops > 40 or (target.startswith("/") and absolute == "escape"):
                return None
            if target.startswith("/"):
                done = []
            parts = [p for p in target.split("/") if p] + parts
            continue
        if not os.path.lexists(here):
            return None
        done.append(part)
    return "/" + "/".join(done)


def read_soname(path: str) -> Optional[str]:
    """DT_SONAME of the ELF file at ``path`` (little-endian, 32 or 64 bit), else None."""
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if m[:4] != b"\x7fELF" or m[5] != 1:
                return None
            wide = m[4] == 2
            shoff, shentsize, shnum = (
                (struct.unpack_from("<Q", m, 0x28)[0], *struct.unpack_from("<HH", m, 0x3A))
                if wide
                else (struct.unpack_from("<I", m, 0x20)[0], *struct.unpack_from("<HH", m, 0x2E))
            )
            sections = []
            for i in range(shnum):
                at = shoff + i * shentsize
                if wide:
                    _, kind, _, _, off, size, link = struct.unpack_from("<IIQQQQI", m, at)
                else:
                    _, kind, _, _, off, size, link = struct.unpack_from("<IIIIIII", m, at)
                sections.append((kind, off, size, link))
            for kind, off, size, link in sections:
                if kind != 6:  # SHT_DYNAMIC
                    continue
                strtab = sections[link][1]
                fmt, step = ("<qQ", 16) if wide else ("<iI", 8)
                for at in range(off, off + size, step):
                    tag, value = struct.unpack_from(fmt, m, at)
                    if tag == 0:
                        break
                    if tag == 14:  # DT_SONAME
                        end = m.find(b"\0", strtab + value)
                        return m[strtab + value : end].decode()
    except (OSError, ValueError, IndexError, struct.error):
        return None
    return None


def ldcache_i386(root: str) -> List[Tuple[str, str]]:
    """The i386 (``libc6``) entries of the root's ld.so.cache, in the cache's order (read
    with the host's ``ldconfig -p``)."""
    out = subprocess.run(
        ["/sbin/ldconfig", "-C", os.path.join(root, "etc/ld.so.cache"), "-p"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    entries = []
    for line in out.splitlines()[1:]:
        name, _, rest = line.strip().partition(" (")
        flags, _, path = rest.partition(") => ")
        if flags == "libc6" and path:
            entries.append((name, path))
    return entries


# --------------------------------------------------------------------------- the reference


class GoLookup:
    """The toolkit's Go file lookups in a driver root (``pkg/lookup``): globbing under
    root-prefixed folders, ``os.Stat``-checked, links evaluated as ``absolute`` says."""

    def __init__(self, root: str, absolute: str) -> None:
        self.root = root
        self.absolute = absolute

    def _file(self, path: str) -> Optional[str]:
        """assertFile: the file behind ``path`` exists and is not a folder."""
        found = resolve(self.root, path, self.absolute)
        if found is None or os.path.isdir(os.path.join(self.root, found.lstrip("/"))):
            return None
        return found

    def files(self, dirs: Iterable[str], pattern: str, count: int = 0) -> List[str]:
        """The file locator: matches of ``pattern`` in each folder, in order (unevaluated)."""
        out: List[str] = []
        for directory in dict.fromkeys(dirs):
            where = os.path.join(self.root, directory.lstrip("/"), pattern)
            for hit in sorted(glob.glob(where)):
                rel = "/" + os.path.relpath(hit, self.root)
                if self._file(rel) is not None:
                    out.append(rel)
                    if count and len(out) == count:
                        return out
        return out

    def libraries(self, dirs: Iterable[str], pattern: str) -> List[str]:
        """The symlink locator: the file locator's matches with links evaluated, unique."""
        found = (self._file(rel) for rel in self.files(dirs, pattern))
        return list(dict.fromkeys(f for f in found if f is not None))

    def executable(self, name: str) -> Optional[str]:
        """The executable locator (count 1) over :data:`GO_PATH`."""
        for directory in GO_PATH:
            rel = f"{directory}/{name}"
            found = self._file(rel)
            if found is not None and os.stat(os.path.join(self.root, found[1:])).st_mode & 0o111:
                return rel
        return None


def _library(root: str, out: Entries, path: str, found: str) -> None:
    """A library mounted at ``path`` (file ``found`` in the root), with the SONAME link
    ldconfig makes beside it."""
    out[path] = ("library", found)
    directory, name = path.rsplit("/", 1)
    soname = read_soname(os.path.join(root, found.lstrip("/")))
    if soname and soname != name:
        out.setdefault(f"{directory}/{soname}", ("link", name))


def _lnc_links(out: Entries, path: str) -> None:
    """libnvidia-container's (and create-symlinks') links beside the library at ``path``."""
    directory, name = path.rsplit("/", 1)
    for prefix, link, target in LNC_LINKS:
        if name.startswith(prefix + "."):
            out.setdefault(f"{directory}/{link}", ("link", target or name))


def _dot_so_link(root: str, out: Entries, path: str, found: str) -> None:
    """create-symlinks' unversioned ``.so`` link, where the host folder has one (a link)."""
    name = path.rsplit("/", 1)[1]
    target = read_soname(os.path.join(root, found.lstrip("/"))) or name
    link = target[: target.find(".so") + 3] if ".so" in target else target
    host_dir = os.path.join(root, found.lstrip("/").rsplit("/", 1)[0])
    if link != target and os.path.islink(os.path.join(host_dir, link)):
        out.setdefault(f"{path.rsplit('/', 1)[0]}/{link}", ("link", target))


def reference(
    root: str, capabilities: Sequence[str], absolute: str = "escape"
) -> Tuple[Entries, str]:
    """The reference's container paths for ``capabilities`` on ``root`` (see the module's
    docstring), and the driver version it read."""
    go = GoLookup(root, absolute)
    found = go.libraries(GO_LIBRARY_DIRS, "libcuda.so.*.*") or go.libraries(
        GO_LIBRARY_DIRS, "libnvidia-ml.so.*.*"
    )
    if not found:
        raise SystemExit(f"{root}: no libcuda.so.*.* or libnvidia-ml.so.*.*")
    version = found[0].rsplit(".so.", 1)[1]
    libdirs = list(
        dict.fromkeys(
            p.rsplit("/", 1)[0] for p in go.libraries(GO_LIBRARY_DIRS, f"lib*.so.{version}")
        )
    )
    flags = {flag for cap in capabilities for flag in LNC_FLAGS.get(cap, ())}
    names = tuple(n for flag, lst in LNC_LIBRARIES.items() if flag in flags for n in lst)
    out: Entries = {}

    # 64-bit libraries: jit-CDI's *.so.<version> in the library folders and vdpau/
    searched = libdirs + [f"{d}/vdpau" for d in libdirs]
    for lib in go.libraries(searched, f"*.so.{version}"):
        if lib.rsplit("/", 1)[1].startswith(names):
            _library(root, out, lib, lib)
            _lnc_links(out, lib)
            _dot_so_link(root, out, lib, lib)
    for flag, programs in LNC_BINARIES.items():
        for name in programs if flag in flags else ():
            at = go.executable(name)
            if at is not None:
                out[at] = ("binary", resolve(root, at) or at)

    if {"graphics", "display"} & set(capabilities):
        _graphics_modifier(go, out, version, libdirs)

    # firmware, IPC: libnvidia-container's (links followed inside the root)
    fw_dir = LNC_FIRMWARE_DIR.format(version=version)
    fw_found = resolve(root, fw_dir)
    if fw_found is not None and os.path.isdir(os.path.join(root, fw_found.lstrip("/"))):
        for name in sorted(os.listdir(os.path.join(root, fw_found.lstrip("/")))):
            if name.startswith("gsp") and name.endswith(".bin"):
                out[f"{fw_dir}/{name}"] = ("firmware", f"{fw_found}/{name}")
    for path, flag in LNC_IPC:
        ipc = resolve(root, path)
        if flag in flags and ipc is not None:
            container = "/run/" + path[len("/var/run/") :] if path.startswith("/var/") else path
            out[container] = ("ipc", ipc)

    if "compat32" in flags:
        _compat32(root, out, names, version)
    return out, version


def _graphics_modifier(go: GoLookup, out: Entries, version: str, libdirs: List[str]) -> None:
    """The toolkit's legacy graphics modifier (graphics or display)."""
    root = go.root
    allocator = f"libnvidia-allocator.so.{version}"
    for pattern in GO_GRAPHICS_LIBRARIES:
        for lib in go.libraries(GO_LIBRARY_DIRS, pattern.format(version=version)):
            directory, name = lib.rsplit("/", 1)
            if name == allocator:  # looked up for GBM's link only
                out.setdefault(
                    f"{directory}/gbm/nvidia-drm_gbm.so", ("link", "../libnvidia-allocator.so.1")
                )
                continue
            _library(root, out, lib, lib)
            if name.startswith("libnvidia-vulkan-producer.so."):
                out.setdefault(f"{directory}/libnvidia-vulkan-producer.so", ("link", name))
    for module in GO_XORG_MODULES:
        hits = go.files(go_xorg_dirs(libdirs), module.format(version=version), count=1)
        for at in hits:
            out[at] = ("data", resolve(root, at) or at)
            directory, name = at.rsplit("/", 1)
            if name.startswith("libglxserver_nvidia.so."):
                out.setdefault(f"{directory}/libglxserver_nvidia.so", ("link", name))
    for name in GO_GRAPHICS_BINARIES:
        program = go.executable(name)
        if program is not None:
            out[program] = ("binary", resolve(root, program) or program)
    for container_root, configs, extra in (
        ("/usr/share", GO_SHARE_CONFIGS, False),
        ("/etc", GO_ETC_CONFIGS, False),
        ("/etc", GO_VULKAN_CONFIGS, True),
    ):
        for rel in configs:
            hits = go.files(GO_CONFIG_DIRS, rel) or (go.files(("/",), rel) if extra else [])
            if hits:
                out.setdefault(f"{container_root}/{rel}", ("data", resolve(root, hits[0]) or ""))


def _compat32(root: str, out: Entries, names: Tuple[str, ...], version: str) -> None:
    """libnvidia-container's 32-bit libraries: ld.so.cache i386 entries, links followed
    inside the root, the last selected entry of a name kept, mounted into
    :data:`LNC_LIBS32_DIR`."""
    chosen: Dict[str, str] = {}
    for key, value in ldcache_i386(root):
        name = next((n for n in names if key.startswith(n)), None)
        if name is None:
            continue
        found = resolve(root, value)
        if found is not None and found.endswith(version):
            chosen[name] = found
    for found in chosen.values():
        path = f"{LNC_LIBS32_DIR}/{found.rsplit('/', 1)[1]}"
        _library(root, out, path, found)
        _lnc_links(out, path)


# --------------------------------------------------------------------------- nvshim

CHILD = r"""
import json, sys
tree, root, rows = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path[0:0] = [tree]
import nvshim
from nvshim.host.discovery import Host
from nvshim.runtime.hostedits import hook_links
assert nvshim.__file__.startswith(tree), nvshim.__file__
out = {}
for name, caps in rows:
    host = Host(root)
    libraries = host.libraries(caps)
    files = host.driver_files(caps)
    entries = {}
    for lib in libraries:
        entries[lib.container_path] = ["library", lib.host_path]
    for f in files:
        entries[f.container_path] = [f.kind, f.host_path]
    for target, link in hook_links(libraries, files):
        entries.setdefault(link, ["link", target])
    out[name] = entries
json.dump(out, sys.stdout)
"""


def nvshim_paths(tree: Path, root: str) -> Dict[str, Entries]:
    """Per row, the container paths nvshim's ``tree`` gives on ``root`` (a child process)."""
    rows = json.dumps([[name, list(caps)] for name, caps in ROWS])
    proc = subprocess.run(
        [sys.executable, "-I", "-c", CHILD, str(tree), root, rows],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
    )
    if proc.returncode != 0:
        raise SystemExit(f"nvshim at {tree} failed on {root}:\n{proc.stderr}")
    out: Dict[str, Entries] = {}
    for name, entries in json.loads(proc.stdout).items():
        out[name] = {
            path: (kind, detail[len(root) :] if detail.startswith(root + "/") else detail)
            for path, (kind, detail) in entries.items()
        }
    return out


# --------------------------------------------------------------------------- reasons

NOT_IN_TABLE = " (not in docs/real-gpu.md's table)"


def reason(row: str, layout: str, side: str, path: str) -> Optional[str]:
    """Why ``path`` is on one ``side`` only ("reference" or "nvshim"), where known."""
    name = path.rsplit("/", 1)[1]
    i386 = path.startswith(I386_DIRS)
    if path == "/etc/OpenCL/vendors/nvidia.icd":
        if side == "nvshim":
            return (
                "kept with compute: it names libnvidia-opencl, a compute library; the "
                "reference's legacy path gives no ICD with compute"
            )
        return (
            "nvshim gives it with compute only: with graphics alone it would name a "
            "library the container does not have"
        )
    if (
        name in ("nvidia-drm-outputclass.conf", "10-nvidia.conf")
        and side == "reference"
        and row == "graphics"
    ):
        return "nvshim gives it only with display: it configures an X server driving a display"
    if i386 and row == "compat32":
        if "libvdpau_nvidia" in name and side == "nvshim":
            return (
                "the reference's 32-bit lookup reads ld.so.cache, which has no entry for "
                "vdpau/ (not an ld.so.conf folder)" + NOT_IN_TABLE
            )
        if layout == "debian" and ("/nvidia/current/" in path) == (side == "nvshim"):
            return (
                "nvshim keeps the host's path for 32-bit too (the container's ld.so.cache "
                "finds it) and never writes into an image folder chosen by a file the "
                "image controls; the reference mounts into the image's /usr/lib/i386-linux-gnu"
            )
        if side == "nvshim" and name.endswith(".so"):
            return (
                "nvshim makes the unversioned .so link the driver's folder has, as "
                "create-symlinks does for 64-bit; libnvidia-container's 32-bit path makes "
                "only libcuda.so, libGLX_indirect.so.0 and libnvidia-opticalflow.so"
            )
    if path.startswith("/usr/share/vulkan/") and side == "nvshim":
        return (
            "before issue 29 nvshim mounted Vulkan's JSONs at the host's folder, hiding an "
            "image's own /usr/share/vulkan manifest; now /etc/vulkan, as the reference"
        )
    if "libvdpau_nvidia" in name:
        return (
            "libvdpau looks only in <libdir>/vdpau/, where nvshim mounts it; the reference "
            "mounts it where it found it (Debian: nvidia/current)" + NOT_IN_TABLE
        )
    if name == "nvidia-drm_gbm.so":
        return (
            "nvshim makes GBM's backend link in <libdir>/gbm/, where libgbm looks; the "
            "reference beside the allocator it found (Debian: nvidia/current/gbm/)" + NOT_IN_TABLE
        )
    if (
        name.startswith("libnvidia-allocator.so")
        and side == "nvshim"
        and row in ("graphics", "display")
    ):
        return (
            "nvshim gives libnvidia-allocator with graphics (GBM's nvidia-drm_gbm.so links "
            "to it); the reference's graphics modifier leaves it to compute, so graphics "
            "alone gets a dangling GBM link" + NOT_IN_TABLE
        )
    if layout == "debian" and side == "nvshim":
        if name.startswith("libglxserver_nvidia.so"):
            return (
                "Debian keeps it in /usr/lib/nvidia/current, outside the reference's X.Org "
                "search folders (and its .so link is an alternatives link); nvshim "
                "follows the alternatives inside the root" + NOT_IN_TABLE
            )
        if name in ("nvidia-smi", "nvidia_drv.so", "nvidia-drm-outputclass.conf"):
            return (
                "Debian's alternatives link (/etc/alternatives/…) is absolute: the "
                "reference's Go lookup follows it outside the driver root and misses the "
                "file [model: --go-links escape]; nvshim resolves it inside the root" + NOT_IN_TABLE
            )
    if path == "/run/nvidia-persistenced/socket" and side == "nvshim" and row == "compute":
        return (
            "nvshim gives the persistenced socket with compute too; libnvidia-container "
            "only with utility (its jit-CDI path: always)" + NOT_IN_TABLE
        )
    if path == "/tmp/nvidia-mps" and side == "reference" and row == "video":
        return (
            "libnvidia-container's video sets compute's library flag, which brings the MPS "
            "folder; nvshim gives it with compute only" + NOT_IN_TABLE
        )
    return None


# --------------------------------------------------------------------------- comparison


def only_32bit(entries: Entries) -> Entries:
    return {p: e for p, e in entries.items() if p.startswith(I386_DIRS)}


def compare(
    row: str, layout: str, ref: Entries, mine: Entries, closed: Iterable[str] = ()
) -> Dict[str, Any]:
    """Counts and the differing paths (with reasons) of one row on one side of issue 29."""
    refs, ours, closed = set(ref), set(mine), set(closed)
    diffs = []
    for side, paths in (("reference", sorted(refs - ours)), ("nvshim", sorted(ours - refs))):
        for path in paths:
            why = reason(row, layout, side, path)
            if why is None and path in closed:
                why = "closed by issue 29's work (the same in this checkout)"
            entry = ref.get(path) if side == "reference" else mine.get(path)
            diffs.append(
                {
                    "side": side,
                    "path": path,
                    "kind": entry[0] if entry else "",
                    "detail": entry[1] if entry else "",
                    "reason": why,
                }
            )
    return {
        "compared": len(refs | ours),
        "same": len(refs & ours),
        "reference_only": len(refs - ours),
        "nvshim_only": len(ours - refs),
        "differences": diffs,
    }


def build_roots(base: Path, extra: Sequence[str]) -> Tuple[Dict[str, str], List[str]]:
    """Both layouts of the cached (or downloaded) packages under ``base``."""
    from tests.helpers.realdriver import (
        GRAPHICS_PACKAGES,
        LAYOUTS,
        driver_packages,
        make_driver_root,
    )
    from tests.helpers.realdriver32 import I386_PACKAGES

    names = list(dict.fromkeys(GRAPHICS_PACKAGES + I386_PACKAGES + tuple(extra)))
    packages = driver_packages(names)
    roots = {
        layout: str(make_driver_root(base / layout, packages, layout).root) for layout in LAYOUTS
    }
    return roots, names


def export_tree(rev: str, dest: Path) -> Path:
    """``git archive <rev> nvshim`` of this repository, unpacked at ``dest``."""
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "nvshim"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def describe(tree: Path) -> str:
    """The tree's commit (short), saying so when its nvshim/ has uncommitted changes."""
    head = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    if head.returncode != 0:
        return str(tree)
    dirty = subprocess.run(
        ["git", "-C", str(tree), "status", "--porcelain", "--", "nvshim"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return head.stdout.strip() + (" with uncommitted changes to nvshim/" if dirty else "")


def _paths(n: int) -> str:
    return f"{n} path" if n == 1 else f"{n} paths"


def _print_diffs(diffs: List[Dict[str, Any]]) -> None:
    """Differing paths, grouped under their reason."""
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for d in diffs:
        groups.setdefault(d["reason"] or "no known reason", []).append(d)
    for why, items in groups.items():
        print(f"    {why}:")
        for d in items:
            label = "reference-only" if d["side"] == "reference" else "nvshim-only   "
            print(f"      {label} {d['path']} [{d['kind']}]")


def print_report(result: Dict[str, Any]) -> None:
    print(
        f"refcompare: Debian 12 non-free NVIDIA {result['driver_version']}, layouts "
        f"{', '.join(result['layouts'])}; before = {result['before']}, after = "
        f"{result['after']}; --go-links {result['go_links']}"
    )
    print()
    head = "compared same ref-only nvshim-only"
    print(f"{'capability':<10} {'layout':<6}  before: {head}  |  after: {head}")
    for row in result["rows"]:
        cells = []
        for when in ("before", "after"):
            c = row[when]
            cells.append(
                f"{c['compared']:>8} {c['same']:>4} {c['reference_only']:>8} {c['nvshim_only']:>11}"
            )
        print(
            f"{row['capability']:<10} {row['layout']:<6}  before: {cells[0]}  |  after: {cells[1]}"
        )
    for row in result["rows"]:
        print()
        print(f"{row['capability']} / {row['layout']} (asked: {','.join(row['asked'])})")
        after = row["after"]["differences"]
        seen = {(d["side"], d["path"]) for d in after}
        before = [d for d in row["before"]["differences"] if (d["side"], d["path"]) not in seen]
        print("  after: " + (f"{_paths(len(after))} differ" if after else "no difference"))
        _print_diffs(after)
        print("  before, besides those: " + (_paths(len(before)) if before else "none"))
        _print_diffs(before)
    print()
    print("reference model (facts read from the sources named in bench/refcompare.py); guesses:")
    for guess in result["guesses"]:
        print(f"  - {guess}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="also write the result as JSON here")
    parser.add_argument(
        "--before",
        default=BEFORE_REV,
        help=f"the revision before issue 29's work (default {BEFORE_REV})",
    )
    parser.add_argument(
        "--before-tree",
        type=Path,
        help="a checkout of the before revision to use instead of exporting it",
    )
    parser.add_argument(
        "--after-tree",
        type=Path,
        default=REPO,
        help="the nvshim tree to measure (default: this checkout)",
    )
    parser.add_argument(
        "--go-links",
        choices=("escape", "root"),
        default="escape",
        help="how the reference's Go lookups follow an absolute link in the "
        "root: escape (a driver root that is not /) or root (root /)",
    )
    parser.add_argument(
        "--extra-package",
        action="append",
        default=[],
        help="another Debian package of the driver to lay into the roots",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="nvshim-refcompare-") as tmp:
        work = Path(tmp)
        roots, packages = build_roots(work / "roots", args.extra_package)
        before_tree = args.before_tree or export_tree(args.before, work / "before")
        before_name = str(args.before_tree) if args.before_tree else args.before
        after_tree = args.after_tree.resolve()
        rows: List[Dict[str, Any]] = []
        version = ""
        for layout, root in roots.items():
            mine = {
                "before": nvshim_paths(before_tree, root),
                "after": nvshim_paths(after_tree, root),
            }
            for name, caps in ROWS:
                ref, version = reference(root, caps, args.go_links)
                sides = {when: mine[when][name] for when in mine}
                if name == "compat32":
                    ref = only_32bit(ref)
                    sides = {when: only_32bit(e) for when, e in sides.items()}
                after = compare(name, layout, ref, sides["after"])
                closed = set(ref) & set(sides["after"])
                rows.append(
                    {
                        "capability": name,
                        "layout": layout,
                        "asked": list(caps),
                        "reference": {p: list(e) for p, e in sorted(ref.items())},
                        "nvshim_before": {p: list(e) for p, e in sorted(sides["before"].items())},
                        "nvshim_after": {p: list(e) for p, e in sorted(sides["after"].items())},
                        "before": compare(name, layout, ref, sides["before"], closed),
                        "after": after,
                    }
                )
        order = {name: i for i, (name, _) in enumerate(ROWS)}
        rows.sort(key=lambda r: (order[r["capability"]], r["layout"] != "flat"))
        result = {
            "driver_version": version,
            "layouts": list(roots),
            "packages": packages,
            "before": before_name,
            "after": describe(after_tree),
            "go_links": args.go_links,
            "guesses": list(GUESSES),
            "rows": rows,
        }
    print_report(result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
