"""What a container needs, in CDI's ``containerEdits`` shape, and the one function that
applies it to an OCI spec (:func:`apply_edits`).

One immutable :class:`Edits` value describes everything nvshim adds to an OCI spec:
environment, device nodes, mounts and hooks. Values merge with ``+`` (lists are
concatenated, as CDI does); ``Edits()`` is the no-op. Runtime injection and
``nvshim cdi generate`` build the same values, so there is one description of what a
GPU needs, and it is CDI's.

:func:`apply_edits` applies :class:`Edits` to an OCI spec — the one function that edits
config.json. Pure: returns a new dict and never mutates its input; unknown fields survive.
Follows CDI's rules (env overwritten by name, device nodes de-duplicated by container path,
a cgroup allow rule per node, mounts replacing the same destination then stable-sorted by
depth, hooks appended) with one deliberate difference: identical cgroup rules, hooks and
gids are not added twice, so applying the same edits twice gives the same spec as once.

Pure module: no filesystem access, no logging.

Why one module: the edit model and its one applier are one thing. The records' fields are
exactly what :func:`apply_edits` applies, and each record's rules (de-duplication, the
cgroup rule a device node brings) read best next to the function that applies them.
"""

from __future__ import annotations

import posixpath
from _collections_abc import Mapping  # loaded by os at start-up; collections.abc is not

from nvshim._record import dataclass, field
from nvshim.errors import SPEC_FILE, SpecError

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    # Any: config.json's JSON values, kept as they are
    from typing import Any, Dict, List, Optional, Tuple

__all__ = [
    "DeviceNode",
    "Mount",
    "Hook",
    "Edits",
    "HOOK_NAMES",
    "HOOK_ENV",
    "RO_BIND",
    "IPC_BIND",
    "apply_edits",
    "set_env",
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
    :func:`apply_edits`, which follows CDI's rules.
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


# applying edits to an OCI spec


def _copy(value: Any) -> Any:
    """A deep copy of decoded JSON (dicts, lists, scalars); ``copy.deepcopy`` costs an
    import on the create path and is slower on such trees (BENCHMARKS.md, figures)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _obj(parent: Dict[str, Any], key: str, where: str) -> Dict[str, Any]:
    value = parent.get(key)
    if value is None:
        value = {}
        parent[key] = value
    if not isinstance(value, dict):
        raise SpecError(f"{where} must be an object", SPEC_FILE)
    return value


def _list(parent: Dict[str, Any], key: str, where: str) -> List[Any]:
    value = parent.get(key)
    if value is None:
        value = []
        parent[key] = value
    if not isinstance(value, list):
        raise SpecError(f"{where} must be a list", SPEC_FILE)
    return value


def set_env(env: List[Any], entry: str) -> None:
    """Set ``NAME=VALUE`` in an OCI env list: every entry of NAME becomes this one.

    CDI overwrites the first entry in place; we also drop later duplicates so the value
    the container sees is unambiguous (runc keeps the last entry of a name).
    """
    name = entry.split("=", 1)[0]
    replaced = False
    out = []
    for item in env:
        if isinstance(item, str) and item.split("=", 1)[0] == name:
            if not replaced:
                out.append(entry)
                replaced = True
            continue
        out.append(item)
    if not replaced:
        out.append(entry)
    env[:] = out


def _oci_device(node: DeviceNode, process: Dict[str, Any]) -> Dict[str, Any]:
    if node.type is None or (node.type != "p" and node.major is None):
        raise SpecError(
            f"device node {node.path} has no type/major: discovery must fill them before apply"
        )
    dev: Dict[str, Any] = {"path": node.path, "type": node.type}
    if node.type != "p":
        dev["major"] = node.major
        dev["minor"] = node.minor or 0
    if node.file_mode is not None:
        dev["fileMode"] = node.file_mode
    found = process.get("user")
    user: Dict[str, Any] = found if isinstance(found, dict) else {}
    uid = node.uid if node.uid is not None else (user.get("uid") or None)
    gid = node.gid if node.gid is not None else (user.get("gid") or None)
    if uid is not None:
        dev["uid"] = uid
    if gid is not None:
        dev["gid"] = gid
    return dev


def _depth(mount: Any) -> int:
    dest = mount.get("destination", "") if isinstance(mount, dict) else ""
    if not isinstance(dest, str):
        return 0
    return posixpath.normpath(dest).count("/")


# Long on purpose: the one function that applies edits to a spec (no second applier to
# drift); each kind of edit is a short block, in the spec's order.
def apply_edits(spec: Dict[str, Any], edits: Edits) -> Dict[str, Any]:
    """Return a copy of ``spec`` with ``edits`` applied (``spec`` is left untouched)."""
    if not isinstance(spec, dict):
        raise SpecError("top level must be a JSON object", SPEC_FILE)
    out: Dict[str, Any] = _copy(spec)
    if not edits:
        return out

    touches_process = edits.env or edits.device_nodes or edits.additional_gids
    process = _obj(out, "process", "process") if touches_process else {}
    if edits.env:
        env = _list(process, "env", "process.env")
        for entry in edits.env:
            set_env(env, entry)

    if edits.device_nodes:
        linux = _obj(out, "linux", "linux")
        devices = _list(linux, "devices", "linux.devices")
        resources = _obj(linux, "resources", "linux.resources")
        rules = _list(resources, "devices", "linux.resources.devices")
        for node in edits.device_nodes:
            dev = _oci_device(node, process)
            devices[:] = [
                d for d in devices if not (isinstance(d, dict) and d.get("path") == node.path)
            ]
            devices.append(dev)
            if node.type in ("b", "c"):
                rule = {
                    "allow": True,
                    "type": node.type,
                    "major": node.major,
                    "minor": node.minor or 0,
                    "access": node.permissions or "rwm",
                }
                if rule not in rules:
                    rules.append(rule)

    if edits.mounts:
        mounts = _list(out, "mounts", "mounts")
        for m in edits.mounts:
            for i, existing in enumerate(mounts):
                if isinstance(existing, dict) and existing.get("destination") == m.container_path:
                    del mounts[i]
                    break
            mount: Dict[str, Any] = {"destination": m.container_path, "source": m.host_path}
            if m.type:
                mount["type"] = m.type
            if m.options:
                mount["options"] = list(m.options)
            mounts.append(mount)
        mounts.sort(key=_depth)  # stable: parents first, ties keep their order

    if edits.hooks:
        hooks = _obj(out, "hooks", "hooks")
        for hook in edits.hooks:
            if hook.hook_name not in HOOK_NAMES:
                raise SpecError(f'unknown hook name "{hook.hook_name}"')
            lst = _list(hooks, hook.hook_name, f"hooks.{hook.hook_name}")
            oci = hook.to_oci()
            if oci not in lst:
                lst.append(oci)

    if edits.additional_gids:
        user = _obj(process, "user", "process.user")
        gids = _list(user, "additionalGids", "process.user.additionalGids")
        for gid in edits.additional_gids:
            if gid and gid not in gids:
                gids.append(gid)
    return out
