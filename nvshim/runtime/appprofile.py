"""The EGL application profile: headless EGL sees only the container's GPUs.

On a node with several GPUs, EGL's device enumeration (``EGL_EXT_device_enumeration``,
what headless rendering uses) lists every NVIDIA GPU the driver knows, not the ones the
container was given; a program taking the first may pick one it cannot open. The NVIDIA
driver reads application profiles from ``/etc/nvidia/nvidia-application-profiles-rc.d/``,
and its ``EGLVisibleDGPUDevices`` setting is a bit mask of the GPUs EGL may show: bit
``N`` for the GPU whose device node is ``/dev/nvidia<N>`` (its minor, not its index).

As the reference does (libnvidia-container's ``update_app_profile`` for ``graphics`` and
``display``; the toolkit's ``update-application-profile`` hook), the container gets
``10-container.conf`` in that folder, with the mask of its ``/dev/nvidia<N>`` nodes, in
the toolkit's exact bytes::

    {"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",0x2]}],
     "rules":[{"pattern":[],"profile":"_container_"}]}

(one line; the driver's profile parser takes hex numbers). A container with no GPU node
gets no file. Minors past 63 do not fit the mask and are left out, as the toolkit does.

Who writes it: the runtime before runc (:mod:`nvshim.runtime.rootwork`), with the GPUs
config.json gives the container (:func:`gpu_minors`); or the hook (``--egl-profile``),
with the ``/dev/nvidia<N>`` character devices it finds in the container's ``/dev``
(:func:`minors_in_dev`) — the same set, seen after runc made them. Either way the file is
written inside the rootfs through :mod:`nvshim.host.inroot` (an image's symlinks on the
way resolve inside the root), replacing an image's own ``10-container.conf`` as the
toolkit's hook does, and rewritten only when its content changes. Missing folders are
made ``0755``, the file ``0444``.

Loaded only for a create whose hook asks for the profile (graphics, display).
"""

from __future__ import annotations

import os
import stat

from nvshim.host import inroot as _inroot

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable, List, Mapping, Tuple

__all__ = [
    "PROFILE",
    "gpu_minors",
    "minors_in_dev",
    "profile_content",
    "spec_devices",
    "write_profile",
]

PROFILE = "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf"

#: The widest mask the setting holds (the toolkit drops minors past it).
_MASK_BITS = 64


def _gpu_minor(name: str) -> int:
    """N of a ``nvidia<N>`` node name, -1 for any other name (``nvidiactl``, ``nvidia-uvm``)."""
    number = name[6:] if name.startswith("nvidia") else ""
    return int(number) if number.isdigit() and number.isascii() else -1


def spec_devices(spec: Mapping[str, Any]) -> List[Any]:
    """config.json's ``linux.devices`` entries (those the engine or the image listed)."""
    linux = spec.get("linux")
    devices = linux.get("devices") if isinstance(linux, dict) else None
    return [d for d in devices if isinstance(d, dict)] if isinstance(devices, list) else []


def gpu_minors(devices: Iterable[Any]) -> Tuple[int, ...]:
    """Minors of the ``/dev/nvidia<N>`` character devices among ``devices``: config.json's
    ``linux.devices`` entries (dicts) or edits :class:`~nvshim.edits.DeviceNode` records;
    a record without a minor counts by its name's N."""
    out = []
    for device in devices:
        if isinstance(device, dict):
            path, kind, minor = device.get("path"), device.get("type"), device.get("minor")
        else:
            path, kind, minor = device.path, device.type or "c", device.minor
        if not isinstance(path, str) or not path.startswith("/dev/") or kind != "c":
            continue
        named = _gpu_minor(path[5:])
        if named < 0:
            continue
        out.append(minor if isinstance(minor, int) and not isinstance(minor, bool) else named)
    return tuple(sorted(set(out)))


def minors_in_dev(root: _inroot.Root) -> Tuple[int, ...]:
    """Minors of the ``nvidia<N>`` character devices in the container's ``/dev`` (the
    hook's view, after runc made the nodes); never follows a link."""
    names = _inroot.list_dir(root, "/dev") or ()
    out = []
    for name in names:
        if _gpu_minor(name) < 0:
            continue
        try:
            st = _inroot.lstat(root, f"/dev/{name}")
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            out.append(os.minor(st.st_rdev))
    return tuple(sorted(set(out)))


def profile_content(minors: Iterable[int]) -> bytes:
    """The profile making EGL show only the GPUs of ``minors`` (empty: no GPU fits)."""
    mask = 0
    for minor in minors:
        if 0 <= minor < _MASK_BITS:
            mask |= 1 << minor
    if not mask:
        return b""
    return (
        '{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",'
        f'{mask:#x}]}}],"rules":[{{"pattern":[],"profile":"_container_"}}]}}'
    ).encode()


def write_profile(root: _inroot.Root, minors: Iterable[int]) -> bool:
    """Write :data:`PROFILE` in the root for ``minors``; False when there is no GPU to name
    (nothing written). OSError as the in-root functions raise it."""
    content = profile_content(minors)
    if not content:
        return False
    if _inroot.read_file(root, PROFILE) != content:
        _inroot.write_file_atomic(root, PROFILE, content, 0o444, durable=False)
    return True
