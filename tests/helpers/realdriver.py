"""A real NVIDIA driver's user space under a temporary driver root, for tests without a GPU.

The files are Debian's (the non-free component of the machine's own Debian archive): the
same ELF libraries and programs a node runs, only the kernel module is simulated. Nothing
here touches the system's apt configuration, /usr, /etc or /lib.

Download and cache
------------------
:func:`driver_packages` returns :class:`DriverPackages` — one ``<package>.deb`` per name in
``<cache>/<driver version>/``. The cache is ``$NVSHIM_TESTS_DRIVER_CACHE``, else
``${XDG_CACHE_HOME:-~/.cache}/nvshim-tests/debian-nvidia``. When a version directory already
holds every asked-for package, apt is not run at all. Otherwise, under an flock on
``<cache>/.lock`` (two pytest processes download once), apt-get runs with a private
configuration: its own sources list (the URIs and suites of the machine's ``debian`` and
``debian-security`` sources, components ``main contrib non-free non-free-firmware``), its own
lists and archive directories under ``<cache>/.apt``; each ``.deb`` is renamed into place
atomically. The driver version is read from libcuda1's ``Version`` field
(``535.309.01-0+deb12u1`` → ``535.309.01``), never assumed. Failures raise
:class:`DownloadError` with one line naming the command and its last words.

Package sets: :data:`COMPUTE_PACKAGES` (~12 MB: libcuda, NVML, nvidia-smi, MPS …) and
:data:`GRAPHICS_PACKAGES` (those plus GLX/EGL/Vulkan/OpenCL/VDPAU/NVENC/Xorg pieces, ~20 MB).
The biggest packages (OptiX, RT core, GL/EGL core, GSP firmware) are left out: unit tests
cover those files with placed copies. The i386 set (``<package>:i386``, compat32) is in
:mod:`tests.helpers.realdriver32`; asking for one turns i386 on for that apt run only.

Driver roots
------------
:func:`make_driver_root` unpacks the packages (``dpkg-deb -x``) under a simulated node's
kernel side (``nvshim.sim.build.create_node(driver_files=False)``: ``/dev/nvidia*`` and
``/proc/driver/nvidia/*`` for ``kernel_version``) in one of two layouts:

* ``"debian"`` — as the packages install: libraries in
  ``/usr/lib/x86_64-linux-gnu/nvidia/current/``, ``nvidia-smi`` in
  ``/usr/lib/nvidia/current/``, and the update-alternatives links their postinst scripts
  would make (absolute, through ``<root>/etc/alternatives/``), derived from the
  ``add_slave``/``add_multiarch_slave`` lines of the downloaded ``nvidia-alternative`` (and
  ``glx-alternative-nvidia``) maintainer scripts, x86_64 and i386 triplets — e.g.
  ``/usr/lib/x86_64-linux-gnu/libcuda.so.1 → /etc/alternatives/nvidia--libcuda.so.1-x86_64-
  linux-gnu → /usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1``, and the same for
  the i386 triplet where the i386 packages are there.
* ``"flat"`` — where NVIDIA's ``.run`` installer puts the same files: every library in
  ``/usr/lib/x86_64-linux-gnu/`` (i386: ``/usr/lib/i386-linux-gnu/``) with relative SONAME links, programs in ``/usr/bin``, VDPAU in
  ``vdpau/``, ``gbm/nvidia-drm_gbm.so → ../libnvidia-allocator.so.1``, Xorg modules in
  ``/usr/lib/xorg/modules/{drivers,extensions}``, Vulkan JSONs in ``/etc/vulkan``.

Both get Debian's ``/etc/ld.so.conf`` (x86_64 and i386 multiarch folders) and an
``/etc/ld.so.cache`` from ``ldconfig -r``, checked to map ``libcuda.so.1`` to
``/usr/lib/x86_64-linux-gnu/libcuda.so.1`` (and its i386 entry to
``/usr/lib/i386-linux-gnu/libcuda.so.1`` when the i386 packages are there).

Containers
----------
:func:`build_probe` compiles ``tests/probe/cudaprobe.c`` (see its header for the output)
and :func:`parse_probe` reads what it printed. :func:`add_driver_dependencies` gives a glibc
rootfs the C libraries the probe and ``nvidia-smi`` need; :func:`make_cuda_image_rootfs`
builds a rootfs shaped like an ``nvidia/cuda`` image (merged /usr, its own libraries in
``/usr/lib/x86_64-linux-gnu`` and ``/usr/local/cuda/targets/x86_64-linux/lib``, its own
``ld.so.cache``). :func:`cuda_driver_version` asks a root's libcuda (through ctypes, in a
child process) which CUDA version it implements.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from tests.helpers.bundle import LOADER, _host_dependencies, update_ld_cache
from tests.helpers.common import cache_dir, locked

__all__ = [
    "CACHE_ENV",
    "COMPUTE_PACKAGES",
    "CONTAINER_PACKAGES",
    "CUDA_IMAGE_CUDA_LIBDIR",
    "GRAPHICS_PACKAGES",
    "LAYOUTS",
    "OPT_OUT_ENV",
    "PROBE_SOURCE",
    "Alternative",
    "DownloadError",
    "DriverPackages",
    "DriverRoot",
    "ProbeResult",
    "add_driver_dependencies",
    "alternatives_links",
    "build_probe",
    "cuda_driver_version",
    "cuda_driver_version_of_debs",
    "cuda_version_text",
    "debian_sources_list",
    "driver_packages",
    "driver_programs",
    "ldcache_entry",
    "make_cuda_image_rootfs",
    "make_driver_root",
    "parse_probe",
    "resolve_in_root",
    "upstream_version",
]

CACHE_ENV = "NVSHIM_TESTS_DRIVER_CACHE"
"""Where the .deb files are kept between runs (default: ~/.cache/nvshim-tests/debian-nvidia)."""
OPT_OUT_ENV = "NVSHIM_TESTS_NO_REAL_DRIVER"
"""=1: skip the real-driver tests instead of failing when the download fails."""

COMPUTE_PACKAGES: Tuple[str, ...] = (
    "libcuda1",
    "libnvidia-ml1",
    "nvidia-smi",
    "libnvidia-cfg1",
    "libnvidia-ptxjitcompiler1",
    "nvidia-alternative",
    "nvidia-cuda-mps",
)
GRAPHICS_PACKAGES: Tuple[str, ...] = COMPUTE_PACKAGES + (
    "glx-alternative-nvidia",  # contrib, 6 KB: the /usr/lib/xorg/modules links
    "libglx-nvidia0",
    "libegl-nvidia0",
    "nvidia-egl-common",
    "nvidia-vulkan-common",
    "nvidia-opencl-common",
    "nvidia-opencl-icd",
    "libnvidia-egl-gbm1",
    "libnvidia-egl-wayland1",
    "libnvidia-allocator1",
    "xserver-xorg-video-nvidia",
    "nvidia-vdpau-driver",
    "libnvidia-encode1",
    "libnvcuvid1",
    "libnvidia-fbc1",  # 0.2 MB each: their unversioned .so links and optical flow's link
    "libnvidia-opticalflow1",
    "libnvidia-ngx1",  # 2.4 MB
)
LAYOUTS = ("flat", "debian")
CONTAINER_PACKAGES: Tuple[str, ...] = ("libc6:i386",)
"""Packages a test container needs, never laid into a driver root (the i386 loader and C
library a 32-bit probe runs on; see :mod:`tests.helpers.realdriver32`)."""

_VERSION_PACKAGE = "libcuda1"  # its upstream version is the driver's
_ALTERNATIVES_PACKAGES = ("nvidia-alternative", "glx-alternative-nvidia")  # in this order
_COMPONENTS = "main contrib non-free non-free-firmware"
_TRIPLET = "x86_64-linux-gnu"
_TRIPLET32 = "i386-linux-gnu"
_LIBDIR = f"/usr/lib/{_TRIPLET}"
_DEBIAN_LIBDIR = f"{_LIBDIR}/nvidia/current"
_LIBDIR32 = f"/usr/lib/{_TRIPLET32}"
_DEBIAN_LIBDIR32 = f"{_LIBDIR32}/nvidia/current"
_MULTIARCH_DIRS32 = ("/usr/local/lib/i386-linux-gnu", "/lib/i386-linux-gnu", _LIBDIR32)
_MULTIARCH_DIRS = ("/usr/local/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", _LIBDIR)

PROBE_SOURCE = Path(__file__).resolve().parent.parent / "probe" / "cudaprobe.c"

CUDA_IMAGE_CUDA_LIBDIR = "/usr/local/cuda/targets/x86_64-linux/lib"
"""Where the CUDA image keeps a library only its ld.so.cache points to (000_cuda.conf)."""


class DownloadError(Exception):
    """The driver packages could not be fetched; the message is one line."""


# --------------------------------------------------------------------------- download


@dataclass(frozen=True)
class DriverPackages:
    """Downloaded packages of one driver version."""

    version: str
    """The driver's upstream version (``535.309.01``), from libcuda1's Version field."""
    debs: Dict[str, Path]
    """Package name → its ``.deb`` in the cache."""


def _cache_base() -> Path:
    return cache_dir("debian-nvidia", CACHE_ENV)


def upstream_version(debian_version: str) -> str:
    """``1:535.309.01-0+deb12u1`` → ``535.309.01`` (no epoch, no Debian revision)."""
    version = debian_version.split(":", 1)[-1]
    return version.rsplit("-", 1)[0] if "-" in version else version


def _deb_field(deb: Path, name: str) -> str:
    return _run(["dpkg-deb", "-f", str(deb), name], f"dpkg-deb -f {deb.name} {name}").strip()


def _version_key(text: str) -> Tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def _deb_name(name: str) -> str:
    """The cache's file for package ``name`` (``libcuda1:i386`` → ``libcuda1_i386.deb``)."""
    return name.replace(":", "_") + ".deb"


def _cached(base: Path, names: Sequence[str]) -> Optional[DriverPackages]:
    """The newest version directory under ``base`` holding every package in ``names``."""
    if not base.is_dir():
        return None
    versions = sorted(
        (d for d in base.iterdir() if d.is_dir() and not d.name.startswith(".")),
        key=lambda d: _version_key(d.name),
        reverse=True,
    )
    for vdir in versions:
        debs = {n: vdir / _deb_name(n) for n in names}
        if all(p.is_file() for p in debs.values()):
            return DriverPackages(vdir.name, debs)
    return None


def driver_packages(
    names: Sequence[str] = COMPUTE_PACKAGES, cache: Optional[Path] = None
) -> DriverPackages:
    """The ``.deb`` files of ``names`` (one driver version), from the cache or downloaded."""
    base = cache or _cache_base()
    found = _cached(base, names)
    if found is not None:
        return found
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DownloadError(
            f"cannot create the driver package cache {base}: {exc.strerror}"
        ) from exc
    with locked(base / ".lock"):
        found = _cached(base, names)  # another process may have fetched it meanwhile
        if found is not None:
            return found
        return _download(base, names)


def _download(base: Path, names: Sequence[str]) -> DriverPackages:
    apt_dir = base / ".apt"
    for sub in ("lists/partial", "archives/partial", "cache"):
        (apt_dir / sub).mkdir(parents=True, exist_ok=True)
    sources = apt_dir / "sources.list"
    i386 = any(n.endswith(":i386") for n in names)
    sources.write_text(debian_sources_list(i386=i386))
    options = _apt_options(apt_dir, i386)
    _run(["apt-get", *options, "update"], f"apt-get update (private sources list {sources})")
    staging = Path(tempfile.mkdtemp(prefix=".download-", dir=base))
    try:
        _run(
            ["apt-get", *options, "download", *names],
            f"apt-get download {' '.join(names)}",
            cwd=staging,
        )
        by_name: Dict[str, Path] = {}
        for deb in staging.glob("*.deb"):
            arch = _deb_field(deb, "Architecture")
            suffix = ":i386" if arch == "i386" else ""
            by_name[_deb_field(deb, "Package") + suffix] = deb
        missing = [n for n in names if n not in by_name]
        if missing:
            raise DownloadError(f"apt-get download gave no .deb for {', '.join(missing)}")
        version = upstream_version(_deb_field(by_name[_VERSION_PACKAGE], "Version"))
        vdir = base / version
        vdir.mkdir(exist_ok=True)
        for name in names:
            os.replace(by_name[name], vdir / _deb_name(name))  # atomic: never seen half
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return DriverPackages(version, {n: vdir / _deb_name(n) for n in names})


def _apt_options(apt_dir: Path, i386: bool = False) -> List[str]:
    """apt-get options that keep every file apt writes under ``apt_dir``; with ``i386``,
    i386 is an extra architecture of this apt run only (no ``dpkg --add-architecture``)."""
    settings = {
        "Dir::Etc::SourceList": apt_dir / "sources.list",
        "Dir::Etc::SourceParts": apt_dir / "no-such-dir",
        "Dir::Etc::Preferences": apt_dir / "no-such-file",
        "Dir::Etc::PreferencesParts": apt_dir / "no-such-dir",
        "Dir::State::Lists": apt_dir / "lists",
        "Dir::Cache": apt_dir / "cache",
        "Dir::Cache::Archives": apt_dir / "archives",
        "APT::Sandbox::User": "root" if os.geteuid() == 0 else "",
        "Acquire::Languages": "none",
        "Debug::NoLocking": "true",
    }
    options = ["-q"]
    for key, value in settings.items():
        if value != "":
            options += ["-o", f"{key}={value}"]
    if i386:
        options += ["-o", "APT::Architectures::=amd64", "-o", "APT::Architectures::=i386"]
    return options


def debian_sources_list(etc: Path = Path("/etc/apt"), i386: bool = False) -> str:
    """A one-line-style sources list: the machine's Debian archives with every component.

    Reads deb822 ``sources.list.d/*.sources`` and one-line ``sources.list`` /
    ``sources.list.d/*.list``; keeps ``deb`` entries whose URI ends in ``/debian`` or
    ``/debian-security`` (their suites and Signed-By), and lists ``main contrib non-free
    non-free-firmware`` for each.

    With ``i386`` those lines say ``arch=amd64`` and each entry gets an ``arch=i386`` line
    of its own with ``contrib non-free`` only — plus ``main`` for the release suite (the
    one without a ``-``: libc6:i386): a mirror's ``bookworm-security main`` i386 index
    failed with a size mismatch, and apt then drops the whole suite, driver included.
    """
    entries: List[Tuple[str, str, str]] = []  # (uri, suite, signed-by)
    for path in sorted((etc / "sources.list.d").glob("*.sources")):
        entries += _deb822_entries(path.read_text(errors="replace"))
    one_line = [etc / "sources.list"] + sorted((etc / "sources.list.d").glob("*.list"))
    for path in one_line:
        if path.is_file():
            entries += _one_line_entries(path.read_text(errors="replace"))
    lines: List[str] = []
    for uri, suite, signed_by in entries:
        if uri.rstrip("/").rsplit("/", 1)[-1] not in ("debian", "debian-security"):
            continue
        keyring = [f"signed-by={signed_by}"] if signed_by else []
        wanted = [(keyring + ["arch=amd64"] if i386 else keyring, _COMPONENTS)]
        if i386:
            wanted.append(
                (
                    keyring + ["arch=i386"],
                    "contrib non-free" if "-" in suite else "main contrib non-free",
                )
            )
        for opts, components in wanted:
            shown = f"[{' '.join(opts)}] " if opts else ""
            line = f"deb {shown}{uri} {suite} {components}\n"
            if line not in lines:
                lines.append(line)
    if not lines:
        raise DownloadError(
            f"no Debian archive (…/debian, …/debian-security) in {etc}/sources.list"
            " or sources.list.d: cannot locate the driver packages"
        )
    return "".join(lines)


def _deb822_entries(text: str) -> List[Tuple[str, str, str]]:
    out: List[Tuple[str, str, str]] = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: Dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        signed_by = fields.get("signed-by", "")
        if signed_by and not signed_by.startswith("/"):
            signed_by = ""  # an inline key block: apt's default keyrings have Debian's
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                out.append((uri, suite, signed_by))
    return out


def _one_line_entries(text: str) -> List[Tuple[str, str, str]]:
    out: List[Tuple[str, str, str]] = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^deb\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)", line)
        if not m:
            continue
        opts = dict(o.split("=", 1) for o in (m.group(1) or "").split() if "=" in o)
        out.append((m.group(2), m.group(3), opts.get("signed-by", "")))
    return out


def _run(argv: Sequence[str], what: str, cwd: Optional[Path] = None) -> str:
    """Run ``argv``; on failure raise :class:`DownloadError` naming ``what`` in one line."""
    try:
        proc = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DownloadError(f"{what}: {exc}") from exc
    if proc.returncode != 0:
        said = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in said if ln.startswith(("E:", "dpkg-deb"))] or said
        raise DownloadError(
            f"{what} failed (exit {proc.returncode}): {errors[-1] if errors else 'no output'}"
        )
    return proc.stdout


# --------------------------------------------------------------------------- driver roots


@dataclass(frozen=True)
class DriverRoot:
    """A driver root with real user-space files and a simulated kernel side."""

    root: Path
    layout: str
    """``flat`` (NVIDIA's installer) or ``debian`` (Debian's packages)."""
    version: str
    """The files' driver version."""
    kernel_version: str
    """The simulated kernel module's version (/proc/driver/nvidia/version)."""
    gpus: Tuple[str, ...]
    """The simulated GPUs' UUIDs, index order."""

    @property
    def libdir(self) -> Path:
        """The directory holding the real ``lib*.so.<version>`` files."""
        return self.root / (_DEBIAN_LIBDIR if self.layout == "debian" else _LIBDIR).lstrip("/")

    def library(self, base: str) -> Path:
        """The real file ``<base>.so.<version>`` (e.g. ``libcuda``)."""
        return self.libdir / f"{base}.so.{self.version}"

    @property
    def libdir32(self) -> Path:
        """The directory holding the real i386 ``lib*.so.<version>`` files (when the root
        was made with the i386 packages)."""
        rel = _DEBIAN_LIBDIR32 if self.layout == "debian" else _LIBDIR32
        return self.root / rel.lstrip("/")

    def library32(self, base: str) -> Path:
        """The real i386 file ``<base>.so.<version>``."""
        return self.libdir32 / f"{base}.so.{self.version}"

    @property
    def nvidia_smi(self) -> Path:
        """The real nvidia-smi program of this root."""
        rel = (
            "usr/lib/nvidia/current/nvidia-smi" if self.layout == "debian" else "usr/bin/nvidia-smi"
        )
        return self.root / rel


def make_driver_root(
    dest: Path,
    packages: DriverPackages,
    layout: str,
    *,
    kernel_version: Optional[str] = None,
    gpus: int = 1,
) -> DriverRoot:
    """Build a driver root at ``dest`` (new): simulated kernel side for ``kernel_version``
    (default: the files' version) with ``gpus`` GPUs, the packages' files in ``layout``."""
    from nvshim.sim.build import create_node

    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: one of {', '.join(LAYOUTS)}")
    dest = Path(dest)
    kernel = kernel_version or packages.version
    cuda = cuda_version_text(cuda_driver_version_of_debs(packages))
    node = create_node(
        str(dest), gpus=gpus, driver_version=kernel, cuda_version=cuda, driver_files=False
    )
    debs = [deb for name, deb in packages.debs.items() if name not in CONTAINER_PACKAGES]
    if layout == "debian":
        for deb in debs:
            _extract(deb, dest)
        _debian_alternatives(dest, packages)
    else:
        staging = Path(tempfile.mkdtemp(prefix=dest.name + ".debs-", dir=dest.parent))
        try:
            for deb in debs:
                _extract(deb, staging)
            _lay_out_flat(staging, dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    _write_ld_so_conf(dest)
    update_ld_cache(dest)
    cached = ldcache_entry(dest, "libcuda.so.1")
    if cached != f"{_LIBDIR}/libcuda.so.1":
        raise AssertionError(
            f"{dest}/etc/ld.so.cache maps libcuda.so.1 to {cached}, not {_LIBDIR}/libcuda.so.1"
        )
    if "libcuda1:i386" in packages.debs:
        cached = ldcache_entry(dest, "libcuda.so.1", i386=True)
        if cached != f"{_LIBDIR32}/libcuda.so.1":
            raise AssertionError(
                f"{dest}/etc/ld.so.cache maps the i386 libcuda.so.1 to "
                f"{cached}, not {_LIBDIR32}/libcuda.so.1"
            )
    return DriverRoot(dest, layout, packages.version, kernel, tuple(g.uuid for g in node.gpus))


def _extract(deb: Path, dest: Path) -> None:
    subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True, capture_output=True)


def _write_ld_so_conf(root: Path) -> None:
    """Debian's /etc/ld.so.conf: the multiarch directories (not nvidia/current), i386's
    too (libc6:i386's file, on every node with the 32-bit driver)."""
    confd = root / "etc" / "ld.so.conf.d"
    confd.mkdir(parents=True, exist_ok=True)
    (root / "etc" / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (confd / "libc.conf").write_text("/usr/local/lib\n")
    (confd / "x86_64-linux-gnu.conf").write_text(
        "# Multiarch support\n" + "".join(d + "\n" for d in _MULTIARCH_DIRS)
    )
    (confd / "i386-linux-gnu.conf").write_text(
        "# Multiarch support\n" + "".join(d + "\n" for d in _MULTIARCH_DIRS32)
    )


def ldcache_entry(root: Path, soname: str, i386: bool = False) -> Optional[str]:
    """The path ``<root>/etc/ld.so.cache`` gives for ``soname`` (x86-64; with ``i386``, the
    i386 entry: ``(libc6)``), or None (read with the host's ``ldconfig -C <cache> -p``)."""
    out = subprocess.run(
        ["/sbin/ldconfig", "-C", str(root / "etc" / "ld.so.cache"), "-p"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for line in out.splitlines():
        m = re.match(rf"^\s*{re.escape(soname)} \(([^)]*)\) => (\S+)$", line)
        if m and ((m.group(1) == "libc6") if i386 else ("x86-64" in m.group(1))):
            return m.group(2)
    return None


def resolve_in_root(root: Path, path: str) -> Optional[str]:
    """``path`` with every symlink followed as if ``root`` were ``/`` (absolute targets stay
    inside): nvshim's own walk (:func:`nvshim.host.discovery.resolve_in`, unit-tested on its
    own), so the fixture's alternatives and the tests' expectations agree with a chroot."""
    from nvshim.host.discovery import resolve_in

    return resolve_in(str(root), path)


_SLAVE_CALL = re.compile(r"\$\((add_slave|add_multiarch_slave)\s+([^)$]*)\)")
_PREFIX = re.compile(r'^\s*prefix="([^"]*)"', re.M)
_MASTER = re.compile(r"update-alternatives --install (\S+) (\S+) (\S+) ")
_IF_FILE = re.compile(r"if \[ -f (\S+) \]; then(.*?)\n\s*fi\b", re.S)


@dataclass(frozen=True)
class Alternative:
    """One link a postinst hands update-alternatives."""

    link: str
    name: str
    """The alternative's name (``/etc/alternatives/<name>``)."""
    source: str
    requires: Optional[str] = None
    """A file the script checks (``if [ -f ... ]``) before offering this link."""


def alternatives_links(postinst: str) -> List[Alternative]:
    """The links a postinst would hand update-alternatives, in order: the ``--install``
    master, then every ``add_slave`` / ``add_multiarch_slave`` call with literal arguments
    (a multiarch one for the x86_64 and the i386 triplet: the script loops over every
    triplet, and the i386 packages install beside the x86_64 ones)."""
    prefix_match = _PREFIX.search(postinst)
    prefix = prefix_match.group(1) if prefix_match else ""
    guards = [(m.start(2), m.end(2), m.group(1)) for m in _IF_FILE.finditer(postinst)]
    out: List[Alternative] = []
    master = _MASTER.search(postinst)
    if master and "$" not in master.group(0):
        out.append(Alternative(master.group(1), master.group(2), master.group(3)))
    for call in _SLAVE_CALL.finditer(postinst):
        kind, args = call.group(1), shlex.split(call.group(2))
        requires = next((g for start, end, g in guards if start <= call.start() < end), None)
        if kind == "add_slave" and len(args) == 3:
            link, name, source = args
            out.append(Alternative(link, prefix + name, source, requires))
        elif kind == "add_multiarch_slave" and len(args) >= 5:
            target_dir, target_sub, file, source_dir, source_sub = args[:5]
            source_file = args[6] if len(args) > 6 and args[6] else file
            for triplet in (_TRIPLET, _TRIPLET32):
                out.append(
                    Alternative(
                        f"{target_dir}/{triplet}/{target_sub}{file}",
                        f"{prefix}{file}-{triplet}",
                        f"{source_dir}/{triplet}/{source_sub}{source_file}",
                        requires,
                    )
                )
    return out


def _debian_alternatives(root: Path, packages: DriverPackages) -> None:
    """Make the links the alternatives packages' postinst scripts would make, for the
    sources that exist in ``root`` (creating the link's directory, as a desktop has it)."""
    for name in _ALTERNATIVES_PACKAGES:
        deb = packages.debs.get(name)
        if deb is None:
            continue
        with tempfile.TemporaryDirectory(dir=root.parent) as control:
            subprocess.run(["dpkg-deb", "-e", str(deb), control], check=True, capture_output=True)
            postinst = (Path(control) / "postinst").read_text()
        for alt in alternatives_links(postinst):
            if alt.link == alt.source or resolve_in_root(root, alt.source) is None:
                continue
            if alt.requires is not None and resolve_in_root(root, alt.requires) is None:
                continue
            link = root / alt.link.lstrip("/")
            if os.path.lexists(link):
                continue  # the first alternative for a link wins, as a package's own file does
            alt_link = root / "etc" / "alternatives" / alt.name
            alt_link.parent.mkdir(parents=True, exist_ok=True)
            if not os.path.lexists(alt_link):
                alt_link.symlink_to(alt.source)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(f"/etc/alternatives/{alt.name}")


def _flat_destination(path: str) -> Optional[str]:
    """Where NVIDIA's installer puts the file Debian ships at ``path`` (None: not at all)."""
    name = path.rsplit("/", 1)[-1]
    for libdir, flat in (
        (_DEBIAN_LIBDIR, _LIBDIR),
        (_LIBDIR, _LIBDIR),
        (_DEBIAN_LIBDIR32, _LIBDIR32),
        (_LIBDIR32, _LIBDIR32),
    ):
        rest = path[len(libdir) + 1 :] if path.startswith(libdir + "/") else ""
        if rest and "/" not in rest:
            if name.startswith("libvdpau_nvidia."):
                return f"{flat}/vdpau/{name}"
            if name == "nvidia-drm_gbm.so":
                return None  # made by _lay_out_flat as the installer makes it
            return f"{flat}/{name}"
    if path == "/usr/lib/nvidia/current/nvidia-smi" or path.startswith(("/usr/bin/", "/usr/sbin/")):
        return f"/usr/bin/{name}"
    if path == "/usr/lib/nvidia/current/nvidia_drv.so":
        return "/usr/lib/xorg/modules/drivers/nvidia_drv.so"
    if name.startswith("libglxserver_nvidia.so"):
        return f"/usr/lib/xorg/modules/extensions/{name}"
    if path.startswith("/usr/share/vulkan/"):
        return "/etc/vulkan/" + path[len("/usr/share/vulkan/") :]
    if path.startswith(("/usr/share/glvnd/", "/usr/share/egl/", "/etc/OpenCL/")):
        return path
    if path == "/etc/nvidia/current/nvidia-drm-outputclass.conf":
        return "/usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf"
    return None  # documentation, init scripts, Debian's bug/lintian files


def _lay_out_flat(staging: Path, root: Path) -> None:
    """Copy the unpacked packages' files from ``staging`` into ``root`` as the .run installer
    lays them out (relative links kept; they point at names in the same directory)."""
    for dirpath, _dirs, files in os.walk(staging):
        for fname in files + [d for d in _dirs if os.path.islink(os.path.join(dirpath, d))]:
            src = Path(dirpath) / fname
            rel = "/" + str(src.relative_to(staging))
            dest_rel = _flat_destination(rel)
            if dest_rel is None:
                continue
            dest = root / dest_rel.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                target = os.readlink(src)
                if "/" in target:
                    continue  # only same-directory links (SONAME / .so links) carry over
                dest.symlink_to(target)
            else:
                shutil.copy2(src, dest)
    allocator = root / _LIBDIR.lstrip("/") / "libnvidia-allocator.so.1"
    if os.path.lexists(allocator):
        gbm = root / _LIBDIR.lstrip("/") / "gbm"
        gbm.mkdir(parents=True, exist_ok=True)
        (gbm / "nvidia-drm_gbm.so").symlink_to("../libnvidia-allocator.so.1")
    for glxserver in (root / "usr/lib/xorg/modules/extensions").glob("libglxserver_nvidia.so.*"):
        link = glxserver.with_name("libglxserver_nvidia.so")
        if not os.path.lexists(link):
            link.symlink_to(glxserver.name)


# --------------------------------------------------------------------------- CUDA version


@lru_cache(maxsize=None)
def cuda_driver_version(libcuda: str) -> int:
    """cuDriverGetVersion() of the libcuda file at ``libcuda`` (e.g. 12020), asked in a
    child process so the test process never maps the driver."""
    code = (
        "import ctypes, sys\n"
        "lib = ctypes.CDLL(sys.argv[1])\n"
        "v = ctypes.c_int(0)\n"
        "rc = lib.cuDriverGetVersion(ctypes.byref(v))\n"
        "print(rc, v.value)\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code, libcuda], check=True, capture_output=True, text=True
    ).stdout.split()
    if out[0] != "0":
        raise AssertionError(f"cuDriverGetVersion of {libcuda} returned {out[0]}")
    return int(out[1])


def cuda_driver_version_of_debs(packages: DriverPackages) -> int:
    """cuDriverGetVersion() of the libcuda in ``packages`` (unpacked beside the .deb)."""
    return _cuda_version_of_deb(str(packages.debs[_VERSION_PACKAGE]), packages.version)


@lru_cache(maxsize=None)
def _cuda_version_of_deb(deb: str, version: str) -> int:
    with tempfile.TemporaryDirectory(prefix=".libcuda-", dir=Path(deb).parent) as tmp:
        _extract(Path(deb), Path(tmp))
        lib = Path(tmp) / _DEBIAN_LIBDIR.lstrip("/") / f"libcuda.so.{version}"
        return cuda_driver_version(str(lib))


def cuda_version_text(version: int) -> str:
    """12020 → ``12.2`` (CUDA's major*1000 + minor*10)."""
    return f"{version // 1000}.{version % 1000 // 10}"


# --------------------------------------------------------------------------- probe


def build_probe(dest_dir: Path) -> Path:
    """Compile the C probe with the host's gcc into ``dest_dir``; return the binary."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise AssertionError(
            "gcc is not installed: the CUDA probe is built at test time "
            "(./install.sh --dev installs gcc and libc6-dev)"
        )
    out = Path(dest_dir) / "cudaprobe"
    proc = subprocess.run(
        [gcc, "-O2", "-Wall", "-o", str(out), str(PROBE_SOURCE), "-ldl"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise AssertionError(f"building {PROBE_SOURCE} failed:\n{proc.stderr}")
    return out


@dataclass(frozen=True)
class ProbeResult:
    """What the probe printed."""

    libcuda: Optional[str]
    """The file the loader mapped for libcuda.so.1, None when dlopen failed."""
    error: Optional[str]
    """dlerror() of the failed libcuda dlopen."""
    values: Dict[str, int]
    """``cuDriverGetVersion``, ``version``, ``cuInit`` (and with --alloc ``devices``,
    ``cuMemAlloc``, ``cuMemFree``) as printed."""
    libraries: Dict[str, Optional[str]]
    """Image SONAME → the file it loaded from, None when it failed."""


def parse_probe(output: str) -> ProbeResult:
    """Read the probe's output (see tests/probe/cudaprobe.c)."""
    libcuda: Optional[str] = None
    error: Optional[str] = None
    values: Dict[str, int] = {}
    libraries: Dict[str, Optional[str]] = {}
    for line in output.splitlines():
        if line.startswith("dlopen libcuda.so.1 failed: "):
            error = line.split(": ", 1)[1]
        elif line.startswith("libcuda="):
            for token in line.split():
                key, _, value = token.partition("=")
                if key == "libcuda":
                    libcuda = value
                elif value.lstrip("-").isdigit():
                    values[key] = int(value)
        else:
            m = re.match(r"^dlopen (\S+) (ok (\S+)|failed: .*)$", line)
            if m:
                libraries[m.group(1)] = m.group(3)
    return ProbeResult(libcuda, error, values, libraries)


# --------------------------------------------------------------------------- rootfs


def _copy_library(host_path: str, dest_dir: Path) -> Path:
    """Copy ``host_path``'s real file into ``dest_dir`` under its own name, plus a link
    named like ``host_path`` when that is another name (libz.so.1 → libz.so.1.2.13)."""
    real = Path(os.path.realpath(host_path))
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / real.name
    if not target.exists():
        shutil.copy2(real, target)
    link = dest_dir / Path(host_path).name
    if link.name != real.name and not os.path.lexists(link):
        link.symlink_to(real.name)
    return link


def driver_programs(packages: DriverPackages, dest: Path) -> List[Path]:
    """nvidia-smi and libcuda.so.<version> of ``packages``, unpacked under ``dest`` (new): what
    a rootfs must be able to run, for :func:`add_driver_dependencies`."""
    for name in ("nvidia-smi", _VERSION_PACKAGE):
        _extract(packages.debs[name], dest)
    return [
        dest / "usr/lib/nvidia/current/nvidia-smi",
        dest / _DEBIAN_LIBDIR.lstrip("/") / f"libcuda.so.{packages.version}",
    ]


def add_driver_dependencies(rootfs: Path, programs: Iterable[Path]) -> None:
    """Copy into a glibc rootfs (:func:`tests.helpers.bundle.make_glibc_rootfs`) the host's
    shared objects ``programs`` need (as ``ldd`` names them: libm, libdl, librt …), then
    regenerate its ld.so.cache."""
    for program in programs:
        for dep in _host_dependencies(str(program)):
            target = rootfs / dep.lstrip("/")
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(os.path.realpath(dep), target)
    update_ld_cache(rootfs)


def make_cuda_image_rootfs(
    dest: Path,
    programs: Iterable[Path],
    needs: Iterable[Path] = (),
    image_libraries: Sequence[str] = ("libz.so.1",),
    cuda_libraries: Sequence[str] = ("libstdc++.so.6",),
) -> Path:
    """A rootfs shaped like an ``nvidia/cuda`` image at ``dest`` (new).

    Merged /usr (``lib``, ``lib64``, ``sbin`` are links into ``usr``), busybox, the loader at
    ``/usr/lib64/ld-linux-x86-64.so.2``; its libraries in ``/usr/lib/x86_64-linux-gnu``: the C
    libraries ``programs`` and ``needs`` need, each SONAME in ``image_libraries`` (copied from the host),
    and what those need; each SONAME in ``cuda_libraries`` in :data:`CUDA_IMAGE_CUDA_LIBDIR`
    only, which ``/etc/ld.so.conf.d/000_cuda.conf`` names (so the cache alone finds it);
    ``nvidia.conf`` naming /usr/local/nvidia/lib{,64} as the images do; ``/sbin/ldconfig``;
    ``programs`` in ``/usr/bin``; an ``/etc/ld.so.cache`` built for it.
    """
    from tests.helpers.bundle import make_rootfs

    root = make_rootfs(dest)
    for name in ("lib", "lib64", "sbin"):
        (root / "usr" / name).mkdir(parents=True, exist_ok=True)
        (root / name).symlink_to(f"usr/{name}")
    libdir = root / _LIBDIR.lstrip("/")
    cudadir = root / CUDA_IMAGE_CUDA_LIBDIR.lstrip("/")
    shutil.copy2(os.path.realpath(LOADER), libdir / Path(LOADER).name)
    (root / "usr/lib64" / Path(LOADER).name).symlink_to(f"../lib/{_TRIPLET}/{Path(LOADER).name}")
    shutil.copy2("/sbin/ldconfig", root / "usr/sbin/ldconfig")
    needed: List[str] = []
    for program in programs:
        shutil.copy2(program, root / "usr/bin" / Path(program).name)
        needed += _host_dependencies(str(program))
    for other in needs:
        needed += _host_dependencies(str(other))
    for soname in image_libraries:
        host = _host_library(soname)
        needed += [host] + _host_dependencies(host)
    for soname in cuda_libraries:
        host = _host_library(soname)
        _copy_library(host, cudadir)
        needed += _host_dependencies(host)
    for dep in needed:
        if Path(dep).name != Path(LOADER).name and not (cudadir / Path(dep).name).exists():
            _copy_library(dep, libdir)
    _write_ld_so_conf(root)
    confd = root / "etc" / "ld.so.conf.d"
    (confd / "000_cuda.conf").write_text(CUDA_IMAGE_CUDA_LIBDIR + "\n")
    (confd / "nvidia.conf").write_text("/usr/local/nvidia/lib\n/usr/local/nvidia/lib64\n")
    update_ld_cache(root)
    for soname in (*image_libraries, *cuda_libraries):
        if ldcache_entry(root, soname) is None:
            raise AssertionError(f"{root}/etc/ld.so.cache has no {soname}")
    return root


def _host_library(soname: str) -> str:
    """The host's path of ``soname`` (from its ld.so.cache)."""
    path = ldcache_entry(Path("/"), soname)
    if path is None:
        raise AssertionError(f"the host has no {soname} to copy into the test image")
    return path
