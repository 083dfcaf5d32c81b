"""What a container needs, in CDI's ``containerEdits`` shape.

One immutable :class:`Edits` value describes everything nvshim adds to an OCI spec:
environment, device nodes, mounts and hooks. Values merge with ``+`` (lists are
concatenated, as CDI does); ``Edits()`` is the no-op. Runtime injection and
``nvshim cdi generate`` build the same values, so there is one description of what a
GPU needs, and it is CDI's.

Pure module: no filesystem access, no logging.
"""

from __future__ import annotations

from _collections_abc import Mapping  # loaded by os at start-up; collections.abc is not

from nvshim._record import dataclass, field

TYPE_CHECKING = False  # typing costs ~4 ms to import on the create path
if TYPE_CHECKING:
    from typing import Any, Optional, Tuple

__all__ = [
    "DeviceNode",
    "Mount",
    "Hook",
    "Edits",
    "HOOK_NAMES",
    "HOOK_ENV",
    "RO_BIND",
    "IPC_BIND",
]

#: OCI hook lists, in the order the runtime spec defines them.
HOOK_NAMES = (
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
)


def _opt_str(value: Any) -> Optional[str]:
    """An optional CDI string: None when absent or empty."""
    return value or None


@dataclass(frozen=True)
class DeviceNode:
    """A device node to create in the container (CDI ``deviceNodes`` entry).

    ``path`` is the container path; ``host_path`` the node on the host (defaults to
    ``path``). ``type``/``major``/``minor`` are filled from the host node by discovery so
    consumers need not stat.
    """

    path: str
    host_path: Optional[str] = None
    type: Optional[str] = None
    major: Optional[int] = None
    minor: Optional[int] = None
    file_mode: Optional[int] = None
    permissions: Optional[str] = None
    uid: Optional[int] = None
    gid: Optional[int] = None

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.host_path and self.host_path != self.path:
            out["hostPath"] = self.host_path
        for key, value in (
            ("type", self.type),
            ("major", self.major),
            ("minor", self.minor),
            ("fileMode", self.file_mode),
            ("permissions", self.permissions),
            ("uid", self.uid),
            ("gid", self.gid),
        ):
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_cdi(cls, d: Mapping[str, Any]) -> "DeviceNode":
        """A ``deviceNodes`` entry that :mod:`nvshim.cdi.check` accepted (not checked again)."""
        return cls(
            path=d["path"],
            host_path=_opt_str(d.get("hostPath")),
            type=_opt_str(d.get("type")),
            major=d.get("major"),
            minor=d.get("minor"),
            file_mode=d.get("fileMode"),
            permissions=_opt_str(d.get("permissions")),
            uid=d.get("uid"),
            gid=d.get("gid"),
        )

    @property
    def source(self) -> str:
        """The host node this entry refers to."""
        return self.host_path or self.path


@dataclass(frozen=True)
class Mount:
    """A mount to add (CDI ``mounts`` entry); bind mounts carry ``bind`` in options."""

    host_path: str
    container_path: str
    type: Optional[str] = None
    options: Tuple[str, ...] = ()

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hostPath": self.host_path, "containerPath": self.container_path}
        if self.type:
            out["type"] = self.type
        if self.options:
            out["options"] = list(self.options)
        return out

    @classmethod
    def from_cdi(cls, d: Mapping[str, Any]) -> "Mount":
        """A ``mounts`` entry that :mod:`nvshim.cdi.check` accepted (not checked again)."""
        return cls(
            host_path=d["hostPath"],
            container_path=d["containerPath"],
            type=_opt_str(d.get("type")),
            options=tuple(d.get("options") or ()),
        )


@dataclass(frozen=True)
class Hook:
    """An OCI hook to add (CDI ``hooks`` entry). ``args`` is a full argv (argv[0] included)."""

    hook_name: str
    path: str
    args: Tuple[str, ...] = ()
    env: Tuple[str, ...] = ()
    timeout: Optional[int] = None

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hookName": self.hook_name, "path": self.path}
        if self.args:
            out["args"] = list(self.args)
        if self.env:
            out["env"] = list(self.env)
        if self.timeout is not None:
            out["timeout"] = self.timeout
        return out

    def to_oci(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.args:
            out["args"] = list(self.args)
        if self.env:
            out["env"] = list(self.env)
        if self.timeout is not None:
            out["timeout"] = self.timeout
        return out

    @classmethod
    def from_cdi(cls, d: Mapping[str, Any]) -> "Hook":
        """A ``hooks`` entry that :mod:`nvshim.cdi.check` accepted (not checked again)."""
        return cls(
            hook_name=d["hookName"],
            path=d["path"],
            args=tuple(d.get("args") or ()),
            env=tuple(d.get("env") or ()),
            timeout=d.get("timeout"),
        )


@dataclass(frozen=True)
class Edits:
    """Everything to add to a container, in CDI ``containerEdits`` shape.

    ``a + b`` concatenates each list (``a``'s entries first). Deduplication is the job of
    :func:`nvshim.runtime.apply.apply_edits`, which follows CDI's rules.
    """

    env: Tuple[str, ...] = ()
    device_nodes: Tuple[DeviceNode, ...] = ()
    mounts: Tuple[Mount, ...] = ()
    hooks: Tuple[Hook, ...] = ()
    additional_gids: Tuple[int, ...] = field(default=())

    def __add__(self, other: "Edits") -> "Edits":
        if not isinstance(other, Edits):
            return NotImplemented
        return Edits(
            env=self.env + other.env,
            device_nodes=self.device_nodes + other.device_nodes,
            mounts=self.mounts + other.mounts,
            hooks=self.hooks + other.hooks,
            additional_gids=self.additional_gids + other.additional_gids,
        )

    def __bool__(self) -> bool:
        return bool(
            self.env or self.device_nodes or self.mounts or self.hooks or self.additional_gids
        )

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [n.to_cdi() for n in self.device_nodes]
        if self.mounts:
            out["mounts"] = [m.to_cdi() for m in self.mounts]
        if self.hooks:
            out["hooks"] = [h.to_cdi() for h in self.hooks]
        if self.additional_gids:
            out["additionalGids"] = list(self.additional_gids)
        return out

    @classmethod
    def from_cdi(cls, d: Optional[Mapping[str, Any]]) -> "Edits":
        """A ``containerEdits`` mapping that :mod:`nvshim.cdi.check` accepted, converted
        without a second check (the checker owns every rule; null lists are empty, a null
        gid is 0). ``intelRdt`` and ``netDevices`` are not modelled."""
        if d is None:
            return cls()
        return cls(
            env=tuple(d.get("env") or ()),
            device_nodes=tuple(DeviceNode.from_cdi(n) for n in d.get("deviceNodes") or ()),
            mounts=tuple(Mount.from_cdi(m) for m in d.get("mounts") or ()),
            hooks=tuple(Hook.from_cdi(h) for h in d.get("hooks") or ()),
            additional_gids=tuple(g or 0 for g in d.get("additionalGids") or ()),
        )


#: Options of read-only driver file mounts (libraries, binaries, firmware).
RO_BIND = ("ro", "nosuid", "nodev", "bind")
#: Options of IPC mounts (sockets, MPS pipe dir): writable, never executable; recursive and
#: private, since a directory (the MPS pipe dir) can carry submounts on the host.
IPC_BIND = ("nosuid", "nodev", "noexec", "rbind", "rprivate")

#: The env a hook runs with: explicit, so nothing of the image's env reaches it.
HOOK_ENV = ("PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C")
