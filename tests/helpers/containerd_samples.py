"""containerd config files shared by the unit and e2e tests of ``nvshim runtime configure``."""

DEBIAN_CONFIG = """\
version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
"""


#: Where the GPU Operator's toolkit container puts NVIDIA's runtimes on the host.
OPERATOR_TOOLKIT = "/usr/local/nvidia/toolkit"
#: NVIDIA's handler names and the binary each runs (the GPU Operator adds the last two).
NVIDIA_HANDLERS = {
    "nvidia": "nvidia-container-runtime",
    "nvidia-cdi": "nvidia-container-runtime.cdi",
    "nvidia-legacy": "nvidia-container-runtime.legacy",
}


def nvidia_ctk_main(conf_d: str, base: str = DEBIAN_CONFIG, version: int = 2) -> str:
    """The main file as ``nvidia-ctk runtime configure`` leaves it: ``imports`` of its
    drop-in directory's ``*.toml`` first, ``version``, then the original tables."""
    body = "\n".join(line for line in base.splitlines() if not line.startswith("version"))
    return f'imports = ["{conf_d}/*.toml"]\nversion = {version}\n{body}\n'


RUNC_CONFIG = """\
version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "mirror.local/pause:3.6"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
"""


def nvidia_ctk_drop_in(
    toolkit: str = OPERATOR_TOOLKIT,
    *,
    set_as_default: bool = False,
    enable_cdi: bool = False,
    version: int = 2,
    runc: bool = False,
    handlers: tuple = tuple(NVIDIA_HANDLERS),
) -> str:
    """``conf.d/99-nvidia.toml`` as nvidia-ctk (and the GPU Operator's installer) writes it:
    a copy of the main file's CRI table -- DEBIAN_CONFIG's cni section, with ``runc`` also
    RUNC_CONFIG's sandbox image and runc handler -- plus NVIDIA's handlers, cloned from runc
    (SystemdCgroup kept) or from nothing."""
    cri = (
        'plugins."io.containerd.grpc.v1.cri"'
        if version == 2
        else 'plugins."io.containerd.cri.v1.runtime"'
    )
    lines = [f"version = {version}", "", "[plugins]", "", f"  [{cri}]"]
    if enable_cdi:
        lines += ["    enable_cdi = true"]
    if runc:
        lines += ['    sandbox_image = "mirror.local/pause:3.6"']
    if version == 2:
        lines += [
            "",
            f"    [{cri}.cni]",
            '      bin_dir = "/usr/lib/cni"',
            '      conf_dir = "/etc/cni/net.d"',
        ]
    lines += ["", f"    [{cri}.containerd]"]
    if set_as_default:
        lines += ['      default_runtime_name = "nvidia"']
    lines += ["", f"      [{cri}.containerd.runtimes]"]
    if runc:
        lines += [
            "",
            f"        [{cri}.containerd.runtimes.runc]",
            '          runtime_type = "io.containerd.runc.v2"',
            "",
            f"          [{cri}.containerd.runtimes.runc.options]",
            "            SystemdCgroup = true",
        ]
    for name in handlers:
        table = f"{cri}.containerd.runtimes.{quote(name)}"
        lines += [
            "",
            f"        [{table}]",
            "          privileged_without_host_devices = false",
            '          runtime_engine = ""',
            '          runtime_root = ""',
            '          runtime_type = "io.containerd.runc.v2"',
            "",
            f"          [{table}.options]",
            f'            BinaryName = "{toolkit}/{NVIDIA_HANDLERS[name]}"',
        ]
        if runc:
            lines += ["            SystemdCgroup = true"]
    return "\n".join(lines) + "\n"


def quote(key: str) -> str:
    """A TOML key, quoted when it is not bare."""
    return key if key.replace("-", "").replace("_", "").isalnum() else f'"{key}"'
