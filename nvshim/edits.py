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
from nvshim.errors import CdiError

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


def _opt_int(value: Any, where: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise CdiError(f"{where} must be an integer, got {value!r}")
    return value


def _str_tuple(value: Any, where: str) -> Tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CdiError(f"{where} must be a list of strings")
    return tuple(value)


def _opt_str(d: Mapping[str, Any], key: str, where: str) -> Optional[str]:
    """An optional string field: None when absent or empty; CdiError when not a string."""
    value = d.get(key)
    if value is not None and not isinstance(value, str):
        raise CdiError(f"{where}.{key} must be a string")
    return value or None


def _req_str(d: Mapping[str, Any], key: str, where: str) -> str:
    value = d.get(key)
    if not isinstance(value, str) or not value:
        raise CdiError(f"{where}.{key} must be a non-empty string")
    return value


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
    def from_cdi(cls, d: Mapping[str, Any], where: str = "deviceNodes") -> "DeviceNode":
        if not isinstance(d, Mapping):
            raise CdiError(f"{where} must be an object")
        return cls(
            path=_req_str(d, "path", where),
            host_path=_opt_str(d, "hostPath", where),
            type=_opt_str(d, "type", where),
            major=_opt_int(d.get("major"), f"{where}.major"),
            minor=_opt_int(d.get("minor"), f"{where}.minor"),
            file_mode=_opt_int(d.get("fileMode"), f"{where}.fileMode"),
            permissions=_opt_str(d, "permissions", where),
            uid=_opt_int(d.get("uid"), f"{where}.uid"),
            gid=_opt_int(d.get("gid"), f"{where}.gid"),
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
    def from_cdi(cls, d: Mapping[str, Any], where: str = "mounts") -> "Mount":
        if not isinstance(d, Mapping):
            raise CdiError(f"{where} must be an object")
        return cls(
            host_path=_req_str(d, "hostPath", where),
            container_path=_req_str(d, "containerPath", where),
            type=_opt_str(d, "type", where),
            options=_str_tuple(d.get("options"), f"{where}.options"),
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
    def from_cdi(cls, d: Mapping[str, Any], where: str = "hooks") -> "Hook":
        if not isinstance(d, Mapping):
            raise CdiError(f"{where} must be an object")
        name = _req_str(d, "hookName", where)
        if name not in HOOK_NAMES:
            raise CdiError(f'{where}.hookName "{name}" is not one of {", ".join(HOOK_NAMES)}')
        return cls(
            hook_name=name,
            path=_req_str(d, "path", where),
            args=_str_tuple(d.get("args"), f"{where}.args"),
            env=_str_tuple(d.get("env"), f"{where}.env"),
            timeout=_opt_int(d.get("timeout"), f"{where}.timeout"),
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
    def from_cdi(cls, d: Optional[Mapping[str, Any]], where: str = "containerEdits") -> "Edits":
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise CdiError(f"{where} must be an object")

        def items(key: str) -> list[Any]:
            value = d.get(key)
            if value is None:
                return []
            if not isinstance(value, list):
                raise CdiError(f"{where}.{key} must be a list")
            return value

        env = _str_tuple(d.get("env"), f"{where}.env")
        gids = tuple(
            _opt_int(g, f"{where}.additionalGids[{i}]") or 0
            for i, g in enumerate(items("additionalGids"))
        )
        return cls(
            env=env,
            device_nodes=tuple(
                DeviceNode.from_cdi(n, f"{where}.deviceNodes[{i}]")
                for i, n in enumerate(items("deviceNodes"))
            ),
            mounts=tuple(
                Mount.from_cdi(m, f"{where}.mounts[{i}]") for i, m in enumerate(items("mounts"))
            ),
            hooks=tuple(
                Hook.from_cdi(h, f"{where}.hooks[{i}]") for i, h in enumerate(items("hooks"))
            ),
            additional_gids=gids,
        )


#: Options of read-only driver file mounts (libraries, binaries, firmware).
RO_BIND = ("ro", "nosuid", "nodev", "bind")
#: Options of IPC mounts (sockets, MPS pipe dir): writable, never executable; recursive and
#: private, since a directory (the MPS pipe dir) can carry submounts on the host.
IPC_BIND = ("nosuid", "nodev", "noexec", "rbind", "rprivate")

#: The env a hook runs with: explicit, so nothing of the image's env reaches it.
HOOK_ENV = ("PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C")
