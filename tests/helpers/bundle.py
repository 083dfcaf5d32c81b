"""Root filesystems and OCI bundles for e2e tests, built from host files only (no images).

Root filesystems
----------------
``make_rootfs(dest)`` — busybox-static rootfs (~2 MB): ``/bin/busybox`` plus one symlink per
applet in ``/bin``, ``/etc/passwd``, ``/etc/group`` and the empty dirs ``proc sys dev etc tmp
usr/lib/x86_64-linux-gnu usr/bin``.

``make_glibc_rootfs(dest)`` — the same plus glibc's loader layout (non-merged /usr):
``/lib64/ld-linux-x86-64.so.2``, ``/lib/x86_64-linux-gnu/libc.so.6`` (copies of the host's),
Debian's ``/etc/ld.so.conf`` + ``/etc/ld.so.conf.d/x86_64-linux-gnu.conf`` (``/usr/local/lib/
x86_64-linux-gnu``, ``/lib/x86_64-linux-gnu``, ``/usr/lib/x86_64-linux-gnu``), the host's static
``/sbin/ldconfig`` (so ``ldconfig -p`` works inside the container), a small dynamically linked
probe program ``/usr/bin/dynprobe`` (a copy of the host's ``/usr/bin/true``) and an
``/etc/ld.so.cache`` generated with the host's ``ldconfig -r <rootfs>``.

Proving, inside a container, how a library resolves
---------------------------------------------------
Recipe (verified with glibc 2.36)::

    LD_DEBUG=libs /lib64/ld-linux-x86-64.so.2 --preload libcuda.so.1 --list /usr/bin/dynprobe 2>&1

``--list`` prints ``libcuda.so.1 => /usr/lib/x86_64-linux-gnu/libcuda.so.1 (0x...)`` (the file
the container's loader would map), and ``LD_DEBUG=libs`` traces *how* it was found: a
``search cache=/etc/ld.so.cache`` line directly followed by ``trying file=<path>`` means the
container's ``ld.so.cache`` had the SONAME; a ``search path=... (system search path)`` line
means the cache did not and the loader fell back to its built-in directories (which include
``/usr/lib/x86_64-linux-gnu``, so "the file exists there" alone proves nothing about the cache).
The cache is keyed by the library's ELF ``DT_SONAME``, not its file name: a copy of libz named
``libfoo.so.1`` is cached as ``libz.so.1``. The preloaded object must be a loadable ELF shared
object of the right class (a text file fails with ``cannot be preloaded ... ignored``).
``ld_probe_command(soname)`` / ``ld_probe_args(soname)`` build that command, ``parse_ld_probe(output, soname)`` reads it.
``ldconfig -p`` inside the container lists the cache entries.

Bundles
-------
``make_bundle(dir, rootfs, args, ...)`` writes ``<dir>/config.json`` (tab-indented, key order as
``runc spec`` 1.1.5 writes it) and puts a copy of ``rootfs`` at ``<dir>/rootfs`` (nothing is
copied when ``rootfs`` already is that directory); ``root.path`` is the relative ``"rootfs"``.
Differences from ``runc spec``: ``process.terminal`` is false, ``env`` is PATH plus what you
pass (no TERM), hostname ``nvshim-e2e``, and a ``/tmp`` tmpfs is mounted (root is read-only by
default, tests still need somewhere to write).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = [
    "BUSYBOX",
    "DEFAULT_PATH",
    "LOADER",
    "PROBE_BINARY",
    "LdProbe",
    "bind_mount",
    "char_device",
    "copy_rootfs",
    "default_spec",
    "device_rule",
    "ld_probe_args",
    "ld_probe_command",
    "make_bundle",
    "make_glibc_rootfs",
    "make_rootfs",
    "parse_ld_probe",
    "read_config",
    "update_ld_cache",
    "write_config",
]

BUSYBOX = "/bin/busybox"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LOADER = "/lib64/ld-linux-x86-64.so.2"
"""The loader's path inside a glibc rootfs (the ELF interpreter of x86-64 programs)."""
PROBE_BINARY = "/usr/bin/dynprobe"
"""A dynamically linked program (host ``/usr/bin/true``) inside a glibc rootfs."""

_HOST_LDCONFIG = "/sbin/ldconfig"
_HOST_PROBE = "/usr/bin/true"
_MULTIARCH_DIRS = (
    "/usr/local/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
)
_ROOTFS_DIRS = ("bin", "proc", "sys", "dev", "etc", "tmp", "usr/lib/x86_64-linux-gnu", "usr/bin")

EnvArg = Union[Mapping[str, str], Sequence[str], None]


# --------------------------------------------------------------------------- rootfs


def make_rootfs(dest: Union[str, Path]) -> Path:
    """Create a busybox-static rootfs at ``dest`` (must not exist yet) and return its path."""
    root = Path(dest)
    root.mkdir(parents=True)
    for d in _ROOTFS_DIRS:
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    listing = subprocess.run(
        [BUSYBOX, "--list"], check=True, capture_output=True, text=True
    ).stdout.split()
    for applet in listing:
        link = root / "bin" / applet
        if not os.path.lexists(link):
            link.symlink_to("busybox")
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    return root


def _host_dependencies(program: str) -> List[str]:
    """Absolute paths (as the host loader names them) of ``program``'s shared objects."""
    out = subprocess.run(["ldd", program], check=True, capture_output=True, text=True).stdout
    paths: List[str] = []
    for line in out.splitlines():
        m = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
        if m:
            paths.append(m.group(1))
    return paths


def make_glibc_rootfs(dest: Union[str, Path]) -> Path:
    """Create a busybox rootfs with glibc's loader, libc, ldconfig and an ld.so.cache at ``dest``."""
    root = make_rootfs(dest)
    for d in ("lib64", "lib/x86_64-linux-gnu", "sbin", "etc/ld.so.conf.d"):
        (root / d).mkdir(parents=True, exist_ok=True)
    deps = _host_dependencies(_HOST_PROBE)
    if LOADER not in deps:
        deps.append(LOADER)
    for dep in deps:
        # Keep the path the loader uses (/lib64/..., /lib/x86_64-linux-gnu/...), copy the real file.
        target = root / dep.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(dep), target)
    shutil.copy2(_HOST_LDCONFIG, root / "sbin" / "ldconfig")
    shutil.copy2(_HOST_PROBE, root / PROBE_BINARY.lstrip("/"))
    (root / "etc" / "ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc" / "ld.so.conf.d" / "x86_64-linux-gnu.conf").write_text(
        "# Multiarch support\n" + "".join(d + "\n" for d in _MULTIARCH_DIRS)
    )
    update_ld_cache(root)
    return root


def update_ld_cache(rootfs: Union[str, Path]) -> None:
    """Regenerate ``<rootfs>/etc/ld.so.cache`` with the host's ``ldconfig -r`` (chroots; root only)."""
    subprocess.run([_HOST_LDCONFIG, "-r", str(rootfs)], check=True, capture_output=True)


def copy_rootfs(src: Union[str, Path], dest: Union[str, Path]) -> Path:
    """Copy a rootfs tree (symlinks kept as symlinks) to ``dest`` (must not exist); return ``dest``."""
    shutil.copytree(src, dest, symlinks=True)
    return Path(dest)


# --------------------------------------------------------------------------- ld.so probe


@dataclass(frozen=True)
class LdProbe:
    """How the container's loader resolved one SONAME (see the module docstring)."""

    soname: str
    path: Optional[str]
    """The file the loader mapped (``--list`` output), None when it could not be loaded."""
    via_cache: bool
    """True when the last search step before success was ``search cache=/etc/ld.so.cache``."""
    searches: Tuple[str, ...]
    """The ``search ...`` trace lines for this SONAME, in order."""
    output: str


def ld_probe_command(soname: str, program: str = PROBE_BINARY) -> str:
    """Shell command (for ``sh -c``) printing the loader's trace and result for ``soname``."""
    return (
        f"LD_DEBUG=libs {LOADER} --preload {shlex.quote(soname)} --list {shlex.quote(program)} 2>&1"
    )


def ld_probe_args(soname: str, program: str = PROBE_BINARY) -> List[str]:
    """Container argv running :func:`ld_probe_command` (read it with :func:`parse_ld_probe`)."""
    return ["/bin/sh", "-c", ld_probe_command(soname, program)]


_TRACE = re.compile(r"^\s*\d+:\s?(.*)$")


def parse_ld_probe(output: str, soname: str) -> LdProbe:
    """Read the output of :func:`ld_probe_args` for ``soname``."""
    path: Optional[str] = None
    searches: List[str] = []
    in_block = False
    for line in output.splitlines():
        m = _TRACE.match(line)
        if m:
            text = m.group(1).strip()
            if text.startswith("find library="):
                in_block = text.startswith(f"find library={soname} ")
            elif in_block and text.startswith("search "):
                searches.append(text)
            elif not text:
                in_block = False
            continue
        listed = re.match(rf"^\s*{re.escape(soname)} => (\S+) \(0x", line)
        if listed:
            path = listed.group(1)
    via_cache = path is not None and bool(searches) and searches[-1].startswith("search cache=")
    return LdProbe(soname, path, via_cache, tuple(searches), output)


# --------------------------------------------------------------------------- config.json


def default_spec() -> Dict[str, Any]:
    """A ``runc spec`` 1.1.5 equivalent (same keys, same order) as a fresh dict."""
    caps = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
    return {
        "ociVersion": "1.0.2-dev",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": ["sh"],
            "env": [DEFAULT_PATH],
            "cwd": "/",
            "capabilities": {
                "bounding": list(caps),
                "effective": list(caps),
                "permitted": list(caps),
                "ambient": list(caps),
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": "nvshim-e2e",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {
                "destination": "/dev",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
            },
            {
                "destination": "/dev/pts",
                "type": "devpts",
                "source": "devpts",
                "options": [
                    "nosuid",
                    "noexec",
                    "newinstance",
                    "ptmxmode=0666",
                    "mode=0620",
                    "gid=5",
                ],
            },
            {
                "destination": "/dev/shm",
                "type": "tmpfs",
                "source": "shm",
                "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
            },
            {
                "destination": "/dev/mqueue",
                "type": "mqueue",
                "source": "mqueue",
                "options": ["nosuid", "noexec", "nodev"],
            },
            {
                "destination": "/sys",
                "type": "sysfs",
                "source": "sysfs",
                "options": ["nosuid", "noexec", "nodev", "ro"],
            },
            {
                "destination": "/sys/fs/cgroup",
                "type": "cgroup",
                "source": "cgroup",
                "options": ["nosuid", "noexec", "nodev", "relatime", "ro"],
            },
            {
                "destination": "/tmp",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "nodev", "mode=1777", "size=65536k"],
            },
        ],
        "linux": {
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "namespaces": [
                {"type": "pid"},
                {"type": "network"},
                {"type": "ipc"},
                {"type": "uts"},
                {"type": "mount"},
            ],
            "maskedPaths": [
                "/proc/acpi",
                "/proc/asound",
                "/proc/kcore",
                "/proc/keys",
                "/proc/latency_stats",
                "/proc/timer_list",
                "/proc/timer_stats",
                "/proc/sched_debug",
                "/sys/firmware",
                "/proc/scsi",
            ],
            "readonlyPaths": [
                "/proc/bus",
                "/proc/fs",
                "/proc/irq",
                "/proc/sys",
                "/proc/sysrq-trigger",
            ],
        },
    }


def bind_mount(
    source: Union[str, Path], destination: str, *, readonly: bool = True
) -> Dict[str, Any]:
    """An OCI bind-mount entry (``rbind``, ``ro`` unless ``readonly=False``, nosuid, nodev)."""
    options = ["rbind", "ro" if readonly else "rw", "nosuid", "nodev"]
    return {"destination": destination, "type": "bind", "source": str(source), "options": options}


def char_device(path: str, major: int, minor: int, mode: int = 0o666) -> Dict[str, Any]:
    """A ``linux.devices`` entry for a character device node created by the runtime."""
    return {
        "path": path,
        "type": "c",
        "major": major,
        "minor": minor,
        "fileMode": mode,
        "uid": 0,
        "gid": 0,
    }


def device_rule(
    major: Optional[int], minor: Optional[int] = None, access: str = "rwm", allow: bool = True
) -> Dict[str, Any]:
    """A ``linux.resources.devices`` cgroup rule for char devices (None = any number)."""
    rule: Dict[str, Any] = {"allow": allow, "type": "c"}
    if major is not None:
        rule["major"] = major
    if minor is not None:
        rule["minor"] = minor
    rule["access"] = access
    return rule


def _env_list(env: EnvArg) -> List[str]:
    if env is None:
        items: List[str] = []
    elif isinstance(env, Mapping):
        items = [f"{k}={v}" for k, v in env.items()]
    else:
        items = list(env)
    if not any(e.startswith("PATH=") for e in items):
        items.insert(0, DEFAULT_PATH)
    return items


def write_config(bundle: Union[str, Path], spec: Mapping[str, Any]) -> Path:
    """Write ``spec`` to ``<bundle>/config.json`` tab-indented (as runc does); return the path."""
    path = Path(bundle) / "config.json"
    path.write_text(json.dumps(spec, indent="\t"))
    return path


def read_config(bundle: Union[str, Path]) -> Dict[str, Any]:
    """Parse ``<bundle>/config.json``."""
    data: Dict[str, Any] = json.loads((Path(bundle) / "config.json").read_text())
    return data


def make_bundle(
    dir: Union[str, Path],
    rootfs: Union[str, Path],
    args: Sequence[str],
    env: EnvArg = None,
    mounts: Optional[Iterable[Mapping[str, Any]]] = None,
    annotations: Optional[Mapping[str, str]] = None,
    capabilities_add: Optional[Iterable[str]] = None,
    hooks: Optional[Mapping[str, Sequence[Mapping[str, Any]]]] = None,
    readonly_root: bool = True,
    *,
    devices: Optional[Iterable[Mapping[str, Any]]] = None,
    device_rules: Optional[Iterable[Mapping[str, Any]]] = None,
) -> Path:
    """Create an OCI bundle at ``dir`` running ``args``; return ``dir``.

    ``env``: mapping or ``["K=V", ...]``; the default PATH is prepended unless a PATH is given.
    ``mounts`` are appended after the default mounts (see :func:`bind_mount`); ``hooks`` is the
    OCI ``hooks`` object (``{"prestart": [{"path": ..., "args": [...]}], ...}``);
    ``capabilities_add`` extends the bounding, effective and permitted sets; ``devices`` extends
    ``linux.devices`` (see :func:`char_device`) and ``device_rules`` is appended to
    ``linux.resources.devices`` after the default deny-all (see :func:`device_rule`).
    """
    bundle = Path(dir)
    bundle.mkdir(parents=True, exist_ok=True)
    target = bundle / "rootfs"
    if Path(rootfs).resolve() != target.resolve():
        copy_rootfs(rootfs, target)
    spec = default_spec()
    proc = spec["process"]
    proc["args"] = list(args)
    proc["env"] = _env_list(env)
    for cap in capabilities_add or ():
        for kind in ("bounding", "effective", "permitted"):
            if cap not in proc["capabilities"][kind]:
                proc["capabilities"][kind].append(cap)
    spec["root"]["readonly"] = readonly_root
    spec["mounts"].extend(dict(m) for m in mounts or ())
    if hooks:
        spec["hooks"] = {k: [dict(h) for h in v] for k, v in hooks.items()}
    if annotations:
        spec["annotations"] = dict(annotations)
    if devices:
        spec["linux"]["devices"] = [dict(d) for d in devices]
    spec["linux"]["resources"]["devices"].extend(dict(r) for r in device_rules or ())
    write_config(bundle, spec)
    return bundle
