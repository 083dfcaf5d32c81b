"""What the simulated node's kernel module shows: device nodes under ``dev/`` and its procfs
files (``proc/devices``, ``proc/driver/nvidia/{version,params,gpus/*/information}``, and
with MIG ``proc/driver/nvidia-caps/mig-minors`` and the capability ``access`` files), in
the formats the real driver writes.
"""

from __future__ import annotations

import os

from nvshim.sim.model import (
    CAPS_MAJOR,
    CI_SLOTS,
    DRM_MAJOR,
    GDRDRV_MAJOR,
    GI_SLOTS,
    IMEX_MAJOR,
    INFINIBAND_MAJOR,
    MISC_MAJOR,
    NVIDIA_FS_MAJOR,
    NVIDIA_MAJOR,
    NVSWITCH_MAJOR,
    UVM_MAJOR,
    SimGpu,
    SimNode,
    mig_cap_minor,
    mknod,
    write_text,
)

__all__ = ["write_devices", "write_drm", "write_procfs"]


def write_devices(node: SimNode) -> None:
    """The character devices under ``<dev_root>/dev``, with the kernel's majors and modes."""
    dev = os.path.join(node.dev_root, "dev")
    for gpu in node.gpus:
        mknod(os.path.join(dev, f"nvidia{gpu.minor}"), NVIDIA_MAJOR, gpu.minor, 0o666)
    mknod(os.path.join(dev, "nvidiactl"), NVIDIA_MAJOR, 255, 0o666)
    mknod(os.path.join(dev, "nvidia-modeset"), NVIDIA_MAJOR, 254, 0o666)
    mknod(os.path.join(dev, "nvidia-uvm"), UVM_MAJOR, 0, 0o666)
    mknod(os.path.join(dev, "nvidia-uvm-tools"), UVM_MAJOR, 1, 0o666)
    migs = [m for gpu in node.gpus for m in gpu.mig]
    if migs:
        caps = os.path.join(dev, "nvidia-caps")
        mknod(os.path.join(caps, "nvidia-cap1"), CAPS_MAJOR, 1, 0o400)
        mknod(os.path.join(caps, "nvidia-cap2"), CAPS_MAJOR, 2, 0o400)
        for m in migs:
            for minor in (m.gi_cap_minor, m.ci_cap_minor):
                mknod(os.path.join(caps, f"nvidia-cap{minor}"), CAPS_MAJOR, minor, 0o444)
    for channel in range(node.imex_channels):
        mknod(
            os.path.join(dev, "nvidia-caps-imex-channels", f"channel{channel}"),
            IMEX_MAJOR,
            channel,
            0o666,
        )
    if node.nvswitches:
        mknod(os.path.join(dev, "nvidia-nvswitchctl"), NVSWITCH_MAJOR, 255, 0o666)
    for switch in range(node.nvswitches):
        mknod(os.path.join(dev, f"nvidia-nvswitch{switch}"), NVSWITCH_MAJOR, switch, 0o666)
    for fs in range(4 if node.gds else 0):
        mknod(os.path.join(dev, f"nvidia-fs{fs}"), NVIDIA_FS_MAJOR, fs, 0o666)
    if node.mofed:
        ib = os.path.join(dev, "infiniband")
        mknod(os.path.join(ib, "uverbs0"), INFINIBAND_MAJOR, 192, 0o666)
        mknod(os.path.join(ib, "umad0"), INFINIBAND_MAJOR, 0, 0o600)
        mknod(os.path.join(ib, "issm0"), INFINIBAND_MAJOR, 64, 0o600)
        mknod(os.path.join(ib, "rdma_cm"), MISC_MAJOR, 58, 0o666)
    if node.gdrcopy:
        mknod(os.path.join(dev, "gdrdrv"), GDRDRV_MAJOR, 0, 0o666)


def write_drm(node: SimNode) -> None:
    """What nvidia-drm shows for each GPU (none when ``node.drm`` is False): the card and
    render nodes ``<dev_root>/dev/dri/card<i>`` (226:<i>) and ``renderD<128+i>`` (226:128+i),
    udev's ``dev/dri/by-path/pci-<bus id>-{card,render}`` links to them, and sysfs's
    ``<dev_root>/sys/bus/pci/devices/<bus id>/drm/{card<i>,renderD<128+i>}`` folders (each
    with its ``dev`` file), where discovery finds which nodes belong to which GPU."""
    if not node.drm:
        return
    dri = os.path.join(node.dev_root, "dev", "dri")
    for gpu in node.gpus:
        card, render = f"card{gpu.index}", f"renderD{128 + gpu.index}"
        mknod(os.path.join(dri, card), DRM_MAJOR, gpu.index, 0o660)
        mknod(os.path.join(dri, render), DRM_MAJOR, 128 + gpu.index, 0o666)
        by_path = os.path.join(dri, "by-path")
        os.makedirs(by_path, exist_ok=True)
        os.symlink(f"../{card}", os.path.join(by_path, f"pci-{gpu.pci_bus_id}-card"))
        os.symlink(f"../{render}", os.path.join(by_path, f"pci-{gpu.pci_bus_id}-render"))
        sysfs = os.path.join(node.dev_root, "sys", "bus", "pci", "devices", gpu.pci_bus_id, "drm")
        write_text(os.path.join(sysfs, card, "dev"), f"{DRM_MAJOR}:{gpu.index}\n")
        write_text(os.path.join(sysfs, render, "dev"), f"{DRM_MAJOR}:{128 + gpu.index}\n")


def _information(gpu: SimGpu, driver_version: str) -> str:
    return (
        f"Model: \t\t {gpu.model}\n"
        f"IRQ:   \t\t {160 + gpu.index}\n"
        f"GPU UUID: \t {gpu.uuid}\n"
        "Video BIOS: \t 96.00.99.00.01\n"
        "Bus Type: \t PCIe\n"
        "DMA Size: \t 52 bits\n"
        "DMA Mask: \t 0xfffffffffffff\n"
        f"Bus Location: \t {gpu.pci_bus_id}\n"
        f"Device Minor: \t {gpu.minor}\n"
        f"GPU Firmware: \t {driver_version}\n"
        "GPU Excluded:\t No\n"
    )


def _mig_minors(minors: list[int]) -> str:
    lines = ["config 1", "monitor 2"]
    for minor in minors:
        for gi in range(GI_SLOTS):
            lines.append(f"gpu{minor}/gi{gi}/access {mig_cap_minor(minor, gi)}")
            for ci in range(CI_SLOTS):
                lines.append(f"gpu{minor}/gi{gi}/ci{ci}/access {mig_cap_minor(minor, gi, ci)}")
    return "\n".join(lines) + "\n"


def _cap_file(minor: int, mode: int) -> str:
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"


def _proc_devices(node: SimNode) -> str:
    """/proc/devices as the kernel prints it (``%3d %s``), with the drivers this node has."""
    char = [
        (1, "mem"),
        (4, "tty"),
        (5, "/dev/tty"),
        (MISC_MAJOR, "misc"),
        (NVIDIA_MAJOR, "nvidia-frontend"),
        (CAPS_MAJOR, "nvidia-caps"),
        (UVM_MAJOR, "nvidia-uvm"),
    ]
    if node.imex_channels:
        char.append((IMEX_MAJOR, "nvidia-caps-imex-channels"))
    if node.nvswitches:
        char.append((NVSWITCH_MAJOR, "nvidia-nvswitch"))
    if node.gds:
        char.append((NVIDIA_FS_MAJOR, "nvidia-fs"))
    if node.mofed:
        char.append((INFINIBAND_MAJOR, "infiniband_verbs"))
    if node.gdrcopy:
        char.append((GDRDRV_MAJOR, "gdrdrv"))
    if node.drm:
        char.append((DRM_MAJOR, "drm"))
    lines = ["Character devices:"] + [f"{major:3d} {name}" for major, name in sorted(char)]
    lines += ["", "Block devices:", "  7 loop", "254 virtblk"]
    return "\n".join(lines) + "\n"


def write_procfs(node: SimNode) -> None:
    """``proc/devices``, ``proc/driver/nvidia/...`` and, with MIG, the capability files."""
    write_text(os.path.join(node.root, "proc", "devices"), _proc_devices(node), 0o444)
    proc = os.path.join(node.root, "proc", "driver", "nvidia")
    write_text(
        os.path.join(proc, "version"),
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {node.driver_version}  "
        "Tue Mar  5 22:23:56 UTC 2024\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n",
        0o444,
    )
    write_text(
        os.path.join(proc, "params"),
        "ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\n"
        "DeviceFileUID: 0\nDeviceFileGID: 0\nDeviceFileMode: 438\n",
        0o444,
    )
    for gpu in node.gpus:
        write_text(
            os.path.join(proc, "gpus", gpu.pci_bus_id, "information"),
            _information(gpu, node.driver_version),
            0o444,
        )
    if not any(gpu.mig for gpu in node.gpus):
        return
    write_text(
        os.path.join(node.root, "proc", "driver", "nvidia-caps", "mig-minors"),
        _mig_minors(sorted(g.minor for g in node.gpus)),
        0o444,
    )
    caps = os.path.join(proc, "capabilities")
    write_text(os.path.join(caps, "mig", "config"), _cap_file(1, 256), 0o444)
    write_text(os.path.join(caps, "mig", "monitor"), _cap_file(2, 256), 0o444)
    for gpu in node.gpus:
        for m in gpu.mig:
            gi_dir = os.path.join(caps, f"gpu{gpu.minor}", "mig", f"gi{m.gi}")
            write_text(os.path.join(gi_dir, "access"), _cap_file(m.gi_cap_minor, 292), 0o444)
            write_text(
                os.path.join(gi_dir, f"ci{m.ci}", "access"), _cap_file(m.ci_cap_minor, 292), 0o444
            )
