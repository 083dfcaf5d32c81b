"""Host device nodes: create the NVIDIA ones, and the ``/dev/char`` links systemd needs.

``nvshim system create-device-nodes`` and ``nvshim system create-dev-char-symlinks`` land
here. Both read only the host's kernel interfaces, under a ``driver_root`` (``/`` on a real
host, a simulated node's root in tests) and write only under ``<dev_root>/dev``:

* ``<driver_root>/proc/devices`` — the character-device majors by driver name
  (``nvidia-frontend`` or ``nvidia``, ``nvidia-uvm``, ``nvidia-caps``,
  ``nvidia-caps-imex-channels``, ...);
* ``<driver_root>/proc/driver/nvidia/gpus/*/information`` — each GPU's ``Device Minor``;
* ``<driver_root>/proc/driver/nvidia/capabilities/**`` — ``DeviceFileMinor`` /
  ``DeviceFileMode`` of each capability (MIG ``config``/``monitor``, GI/CI ``access``);
* ``<driver_root>/proc/driver/nvidia/params`` — ``DeviceFileMode``/``UID``/``GID`` for the
  GPU and control nodes (0666 root:root when absent).

Why the links: with the systemd cgroup driver, runc turns a container's device rules into
the unit's ``DeviceAllow=`` list, naming each device by its ``/dev/char/<major>:<minor>``
path. On ``systemctl daemon-reload`` systemd re-applies that list, and a device without such
a link is silently dropped: the container loses access to its GPU (NVML "Unknown Error",
NVIDIA/nvidia-container-toolkit#48). udev makes the links for devices it sees; the NVIDIA
nodes are made by the driver's own helper, so nobody links them.

Everything is idempotent: a node or link that is already right is left alone; one that is
there but different is reported (``conflict``) and never replaced.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from typing import Dict, Iterator, List, Optional, Tuple

from nvshim._record import dataclass
from nvshim.errors import HostError

__all__ = [
    "DeviceNode",
    "Outcome",
    "create_dev_char_symlinks",
    "create_device_nodes",
    "plan_device_nodes",
    "read_proc_devices",
]

_FRONTEND_NAMES = ("nvidia-frontend", "nvidia")
_CONTROL_MINOR = 255
_MODESET_MINOR = 254
# Names under /dev that are NVIDIA's (and the devices nvshim serves next to GPUs).
_LINKED = re.compile(
    r"^(nvidia[0-9]+|nvidiactl|nvidia-modeset|nvidia-uvm|nvidia-uvm-tools|nvidia-nvswitch.*"
    r"|nvidia-nvlink|nvidia-fs[0-9]*|gdrdrv|nvidia-caps/nvidia-cap[0-9]+"
    r"|nvidia-caps-imex-channels/channel[0-9]+)$"
)


@dataclass(frozen=True)
class DeviceNode:
    """A character device node to have under ``<dev_root>``; ``path`` is ``/dev/...``."""

    path: str
    major: int
    minor: int
    mode: int
    uid: int = 0
    gid: int = 0


@dataclass(frozen=True)
class Outcome:
    """What happened to one path: ``created``, ``exists``, ``conflict`` (left alone) or, in a
    dry run, ``would-create``; ``detail`` says what was found or made."""

    path: str
    action: str
    detail: str

    def to_dict(self) -> Dict[str, str]:
        return {"path": self.path, "action": self.action, "detail": self.detail}


#: Linux's dev_t: 12 bits of major, 20 of minor; ids are 32-bit with -1 reserved.
_MAX_MAJOR = (1 << 12) - 1
_MAX_MINOR = (1 << 20) - 1
_MAX_ID = (1 << 32) - 2


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise HostError(f"cannot read {path}: {exc.strerror}") from exc


def read_proc_devices(text: str) -> Dict[str, int]:
    """The ``Character devices:`` section of ``/proc/devices``: name → major (first wins)."""
    majors: Dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        if line.strip().endswith("devices:"):
            in_char = line.strip() == "Character devices:"
            continue
        parts = line.split()
        if in_char and len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


def _params(driver_root: str) -> Tuple[int, int, int]:
    """(mode, uid, gid) for GPU and control nodes from the driver's params; 0666 root:root."""
    text = _read(os.path.join(driver_root, "proc/driver/nvidia/params")) or ""
    values = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if value.strip().isdigit():
            values[key.strip()] = int(value.strip())
    for key in ("DeviceFileUID", "DeviceFileGID"):
        if values.get(key, 0) > _MAX_ID:
            raise HostError(
                f"{driver_root.rstrip('/')}/proc/driver/nvidia/params: {key} "
                f"{values[key]} is not a user or group id"
            )
    return (
        values.get("DeviceFileMode", 0o666) & 0o777,
        values.get("DeviceFileUID", 0),
        values.get("DeviceFileGID", 0),
    )


def _gpu_minors(driver_root: str) -> List[int]:
    gpus = os.path.join(driver_root, "proc/driver/nvidia/gpus")
    try:
        entries = sorted(os.listdir(gpus))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise HostError(f"cannot list {gpus}: {exc.strerror}") from exc
    minors = []
    for entry in entries:
        path = os.path.join(gpus, entry, "information")
        match = re.search(r"^Device Minor:\s*([0-9]+)\s*$", _read(path) or "", re.MULTILINE)
        if match is None:
            raise HostError(f'{path} has no "Device Minor:" line')
        minors.append(int(match.group(1)))
    return sorted(minors)


def _capabilities(driver_root: str) -> Iterator[Tuple[int, int, str]]:
    """(minor, mode, file) of every capability file under proc/driver/nvidia/capabilities."""
    top = os.path.join(driver_root, "proc/driver/nvidia/capabilities")
    for directory, _dirs, files in sorted(os.walk(top)):
        for name in sorted(files):
            path = os.path.join(directory, name)
            text = _read(path) or ""
            minor = re.search(r"^DeviceFileMinor:\s*([0-9]+)", text, re.MULTILINE)
            mode = re.search(r"^DeviceFileMode:\s*([0-9]+)", text, re.MULTILINE)
            if minor and mode:
                yield int(minor.group(1)), int(mode.group(1)) & 0o777, path


def plan_device_nodes(driver_root: str = "/") -> Tuple[List[DeviceNode], List[str]]:
    """The NVIDIA device nodes this host's driver serves, and notes on what was skipped.

    Control nodes (``nvidiactl``, ``nvidia-modeset``), one ``nvidia<minor>`` per GPU, the
    UVM nodes when ``nvidia-uvm`` is loaded, and ``nvidia-caps/nvidia-cap<minor>`` for every
    capability the driver lists. Fails (HostError) when no NVIDIA driver is in /proc/devices.
    """
    proc_devices = os.path.join(driver_root, "proc/devices")
    text = _read(proc_devices)
    if text is None:
        raise HostError(f"{proc_devices} does not exist: is this the host's root?")
    majors = read_proc_devices(text)
    frontend = next((majors[n] for n in _FRONTEND_NAMES if n in majors), None)
    if frontend is None:
        raise HostError(
            f"no NVIDIA driver in {proc_devices} (no nvidia-frontend or nvidia "
            "character device): load the nvidia kernel module first"
        )
    mode, uid, gid = _params(driver_root)
    nodes = [
        DeviceNode("/dev/nvidiactl", frontend, _CONTROL_MINOR, mode, uid, gid),
        DeviceNode("/dev/nvidia-modeset", frontend, _MODESET_MINOR, mode, uid, gid),
    ]
    nodes += [
        DeviceNode(f"/dev/nvidia{m}", frontend, m, mode, uid, gid) for m in _gpu_minors(driver_root)
    ]
    notes: List[str] = []
    if "nvidia-uvm" in majors:
        nodes += [
            DeviceNode("/dev/nvidia-uvm", majors["nvidia-uvm"], 0, 0o666),
            DeviceNode("/dev/nvidia-uvm-tools", majors["nvidia-uvm"], 1, 0o666),
        ]
    else:
        notes.append(
            f"no nvidia-uvm in {proc_devices}: the nvidia-uvm module is not loaded, "
            "so /dev/nvidia-uvm and /dev/nvidia-uvm-tools are not created"
        )
    caps = list(_capabilities(driver_root))
    if caps and "nvidia-caps" not in majors:
        notes.append(
            f"capabilities are listed but {proc_devices} has no nvidia-caps: "
            "their nodes are not created"
        )
    elif caps:
        nodes += [
            DeviceNode(
                f"/dev/nvidia-caps/nvidia-cap{minor}", majors["nvidia-caps"], minor, cap_mode
            )
            for minor, cap_mode, _path in caps
        ]
    for node in nodes:
        # a damaged or foreign procfs copy, not the kernel: refuse before mknod overflows
        if node.major > _MAX_MAJOR or node.minor > _MAX_MINOR:
            raise HostError(
                f"{node.path} would be {node.major}:{node.minor}, which is not a "
                f"Linux device number (majors up to {_MAX_MAJOR}, minors up to "
                f"{_MAX_MINOR}): check {proc_devices} and "
                f"{os.path.join(driver_root, 'proc/driver/nvidia')}"
            )
    return nodes, notes


def _describe(st: os.stat_result) -> str:
    if stat.S_ISCHR(st.st_mode):
        return (
            f"char {os.major(st.st_rdev)}:{os.minor(st.st_rdev)} "
            f"mode {stat.S_IMODE(st.st_mode):04o}"
        )
    return "not a character device"


def _host_path(dev_root: str, path: str) -> str:
    return os.path.join(dev_root, path.lstrip("/"))


def create_device_nodes(
    nodes: List[DeviceNode], dev_root: str = "/", dry_run: bool = False
) -> List[Outcome]:
    """mknod each node under ``dev_root`` unless it is there; report each path."""
    outcomes = []
    for node in nodes:
        target = _host_path(dev_root, node.path)
        want = f"char {node.major}:{node.minor} mode {node.mode:04o}"
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise HostError(f"cannot stat {target}: {exc.strerror}") from exc
        if st is not None:
            same = stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(node.major, node.minor)
            outcomes.append(
                Outcome(
                    target,
                    "exists" if same else "conflict",
                    _describe(st) if same else f"{_describe(st)}, wanted {want}: left alone",
                )
            )
            continue
        if dry_run:
            outcomes.append(Outcome(target, "would-create", want))
            continue
        try:
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            os.mknod(target, stat.S_IFCHR | node.mode, os.makedev(node.major, node.minor))
            os.chmod(target, node.mode)  # mknod's mode is masked by the umask
            if node.uid or node.gid:
                os.chown(target, node.uid, node.gid)
        except OSError as exc:
            raise HostError(f"cannot create device node {target}: {exc.strerror}") from exc
        outcomes.append(Outcome(target, "created", want))
    return outcomes


def _nvidia_nodes(dev_root: str) -> Iterator[Tuple[str, os.stat_result]]:
    """(name relative to /dev, stat) of the NVIDIA character devices under <dev_root>/dev."""
    dev = os.path.join(dev_root, "dev")
    for sub in ("", "nvidia-caps", "nvidia-caps-imex-channels"):
        directory = os.path.join(dev, sub)
        try:
            entries = sorted(os.listdir(directory))
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise HostError(f"cannot list {directory}: {exc.strerror}") from exc
        for entry in entries:
            name = f"{sub}/{entry}" if sub else entry
            if not _LINKED.match(name):
                continue
            st = os.lstat(os.path.join(directory, entry))
            if stat.S_ISCHR(st.st_mode):
                yield name, st


def create_dev_char_symlinks(dev_root: str = "/", dry_run: bool = False) -> List[Outcome]:
    """``<dev_root>/dev/char/<major>:<minor> -> ../<name>`` for every NVIDIA device node."""
    if not os.path.isdir(os.path.join(dev_root, "dev")):
        raise HostError(f"{os.path.join(dev_root, 'dev')} is not a directory: wrong --dev-root?")
    char = os.path.join(dev_root, "dev", "char")
    outcomes = []
    for name, st in _nvidia_nodes(dev_root):
        link = os.path.join(char, f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")
        target = f"../{name}"
        try:
            existing: Optional[str] = os.readlink(link)
        except FileNotFoundError:
            existing = None
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise HostError(f"cannot read {link}: {exc.strerror}") from exc
            existing = ""  # there, but not a symlink
        if existing is not None:
            resolved = os.path.normpath(os.path.join(char, existing)) if existing else ""
            if resolved == os.path.normpath(os.path.join(char, target)):
                outcomes.append(Outcome(link, "exists", f"-> {existing}"))
            else:
                what = f"-> {existing}" if existing else "not a symlink"
                outcomes.append(
                    Outcome(link, "conflict", f"{what}, wanted -> {target}: left alone")
                )
            continue
        if dry_run:
            outcomes.append(Outcome(link, "would-create", f"-> {target}"))
            continue
        try:
            os.makedirs(char, mode=0o755, exist_ok=True)
            os.symlink(target, link)
        except OSError as exc:
            raise HostError(f"cannot create {link}: {exc.strerror}") from exc
        outcomes.append(Outcome(link, "created", f"-> {target}"))
    return outcomes
