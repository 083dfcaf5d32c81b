"""What a container asks for: config.json read once, the claim parsed once.

Pure: takes the config.json dict and the :class:`~nvshim.config.Config`, touches no
filesystem. Two steps, the first two of a create's road:

1. :func:`image_view` reads env (last entry wins), mounts, annotations, privilege (the
   bounding set, the device cgroup), the character devices the engine listed and the hook
   ``docker run --gpus`` adds (:data:`DOCKER_HOOK`) from the spec;
2. :func:`read_claim` parses, once, everything the container claims (device tokens of
   NVIDIA_VISIBLE_DEVICES, device-plugin mount ids, CDI annotation ids, IMEX channels,
   the feature env): the :class:`Claim` every consumer reads (require-allocation, the
   request, the extras), with cheap properties for "does it claim anything?".

What the container is then allowed to get is decided in :mod:`nvshim.runtime.request`.
Which Kubernetes container it is (and whether it is a management pod) is
:mod:`nvshim.runtime.identity`'s to read, imported only for a spec some CRI engine or
the kubelet wrote (:data:`KUBERNETES_PREFIX`): a Docker, podman or plain runc create
never loads it. The token grammar (:mod:`nvshim.host.devices`) is imported only when
a value has tokens to parse.

Why one module: a claim is parsed in one place (one answer per question): the image view and
the :class:`Claim` are the two halves of that one parse, read on every create, and the
device-list mount grammar they share (:func:`device_list_id`) is also the NRI guard's. Two
modules would cost every create an import and give the grammar two homes.
"""

from __future__ import annotations

import posixpath

from nvshim._record import dataclass
from nvshim.errors import SPEC_FILE, SpecError

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

    from nvshim.config import Config
    from nvshim.runtime.engine import EngineGrant
    from nvshim.runtime.identity import Identity

__all__ = [
    "ImageView",
    "Claim",
    "image_view",
    "read_claim",
    "annotation_ids_of",
    "device_mount_ids",
    "device_list_id",
    "FEATURE_ENV",
    "IMEX_ENV",
    "VISIBLE_DEVICES",
    "DRIVER_CAPABILITIES",
    "DEVICE_LIST_DIR",
    "DOCKER_HOOK",
    "KUBERNETES_PREFIX",
]

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
DRIVER_CAPABILITIES = "NVIDIA_DRIVER_CAPABILITIES"
DEVICE_LIST_DIR = "/var/run/nvidia-container-devices"

CAP_SYS_ADMIN = "CAP_SYS_ADMIN"
#: The prestart hook ``docker run --gpus`` adds (Docker's ``nvidia`` device driver): its
#: path's basename, with ``args[1] == "prestart"``.
DOCKER_HOOK = "nvidia-container-runtime-hook"

#: The devices next to the GPUs (:mod:`nvshim.runtime.extras`): feature name → the variable
#: that enables it with ``enabled``, and the IMEX channels' variable. Here, not there: a
#: create reads them to know whether that module is needed at all.
FEATURE_ENV: Dict[str, str] = {
    "nvswitch": "NVIDIA_NVSWITCH",
    "gds": "NVIDIA_GDS",
    "mofed": "NVIDIA_MOFED",
    "gdrcopy": "NVIDIA_GDRCOPY",
}
IMEX_ENV = "NVIDIA_IMEX_CHANNELS"

#: Every key a CRI engine (containerd, CRI-O) or the kubelet writes into a spec starts with
#: this (:mod:`nvshim.runtime.identity` reads them): a spec with no such annotation is no
#: CRI container (no sandbox, no identity), and that module is not imported for it.
KUBERNETES_PREFIX = "io.kubernetes."


@dataclass(frozen=True)
class ImageView:
    """What config.json says about devices. Built by :func:`image_view`."""

    env: Mapping[str, str]
    mounts: Tuple[Mapping[str, Any], ...]  # Any: the spec's mount objects, JSON as written
    annotations: Mapping[str, str]
    privileged: bool
    """``CAP_SYS_ADMIN`` in the bounding set: the reference's test of a privileged container."""
    all_devices_allowed: bool = False
    """The device cgroup lets the container open every device (:func:`_allows_all_devices`)."""
    char_devices: Tuple[Tuple[int, int, str], ...] = ()
    """(major, minor, path) of each character device in ``linux.devices``: what the engine
    may have injected (:mod:`nvshim.runtime.engine` matches them against the node)."""
    engine: Optional[EngineGrant] = None
    """The GPUs, MIG devices and IMEX channels the engine already injected
    (:class:`nvshim.runtime.engine.EngineGrant`), set by create once ``char_devices`` are
    matched against the node; None when the spec holds none."""
    docker_hooks: Tuple[Dict[str, Any], ...] = ()
    """The ``prestart`` hooks ``docker run --gpus`` added (:func:`_docker_hooks`): Docker's
    request for the GPUs its ``NVIDIA_VISIBLE_DEVICES`` names (``docker-gpus``)."""

    @property
    def docker_gpus(self) -> bool:
        """The spec is a ``docker run --gpus`` container's."""
        return bool(self.docker_hooks)

    @property
    def privileged_with_devices(self) -> bool:
        """A privileged container as engines make one (``--privileged``, k8s ``privileged:
        true``): CAP_SYS_ADMIN *and* every device allowed, so GPUs give it nothing it could
        not open already. A pod that only adds SYS_ADMIN has the first, not the second."""
        return self.privileged and self.all_devices_allowed

    def get(self, name: str) -> Optional[str]:
        return self.env.get(name)

    @property
    def legacy_image(self) -> bool:
        """A CUDA image from before NVIDIA_VISIBLE_DEVICES existed: it means "all"."""
        return bool(self.env.get("CUDA_VERSION")) and not self.env.get("NVIDIA_REQUIRE_CUDA")

    @property
    def cri(self) -> bool:
        """Some CRI engine or the kubelet wrote annotations into the spec
        (:data:`KUBERNETES_PREFIX`): only then can it be a sandbox, have an identity or
        match ``management-pods``, and only then is :mod:`nvshim.runtime.identity` loaded."""
        return any(k.startswith(KUBERNETES_PREFIX) for k in self.annotations)

    @property
    def sandbox(self) -> bool:
        """A CRI pod sandbox (pause) container (containerd's or CRI-O's): never a GPU
        container."""
        if not self.cri:
            return False
        from nvshim.runtime.identity import is_sandbox

        return is_sandbox(self.annotations)

    @property
    def identity(self) -> Optional[Identity]:
        """Which Kubernetes container this is (:func:`nvshim.runtime.identity.identity_of`);
        None for a container no CRI engine made, or one whose identity cannot be used."""
        if not self.cri:
            return None
        from nvshim.runtime.identity import identity_of

        return identity_of(self.annotations)

    def management_pod(self, patterns: Sequence[str]) -> Optional[str]:
        """The ``management-pods`` entry this container matches
        (:func:`nvshim.runtime.identity.management_pod`); None when none does."""
        if not patterns or not self.cri:
            return None
        from nvshim.runtime.identity import management_pod

        return management_pod(self.annotations, patterns)


@dataclass(frozen=True)
class Claim:
    """Everything config.json claims, parsed once by :func:`read_claim`.

    Require-allocation (whether to ask the kubelet, the pod's annotations), the request
    and the extras read these fields and properties; none parses the spec again. A CRI
    sandbox claims nothing (every field empty).
    """

    view: ImageView
    env_tokens: Optional[Tuple[str, ...]] = None
    """NVIDIA_VISIBLE_DEVICES as device tokens; None when it is unset."""
    mount_raw: Tuple[str, ...] = ()
    """The raw ids of the device plugin's ``/dev/null`` mounts (:func:`device_mount_ids`)."""
    mount_ids: Tuple[str, ...] = ()
    """Their device tokens (GPU ids, CDI names; IMEX channels left out)."""
    mount_notes: Tuple[str, ...] = ()
    """What reading the mounts decided (an IMEX mount is no GPU, a bad CDI mount name)."""
    annotation_keys: Tuple[str, ...] = ()
    """The annotations under ``annotation-prefixes``, sorted."""
    annotation_ids: Tuple[str, ...] = ()
    """Their device tokens."""
    imex_mount_ids: Tuple[str, ...] = ()
    """The channels of the device plugin's ``imex/<N>`` mounts, as written."""
    imex_env: Optional[str] = None
    """NVIDIA_IMEX_CHANNELS; None when unset."""
    feature_env: Tuple[str, ...] = ()
    """The :data:`FEATURE_ENV` variables the spec sets (to anything)."""

    @property
    def image_asks(self) -> bool:
        """The image env asks for GPUs: NVIDIA_VISIBLE_DEVICES names one, or a legacy
        CUDA image leaves it unset."""
        if self.env_tokens is None:
            return self.view.legacy_image and not self.view.sandbox
        return bool(self.env_tokens)

    @property
    def claims_gpus(self) -> bool:
        """Whether the container names any GPU (env, legacy image, mounts, annotations), or
        holds one the engine injected: decides if the kubelet must be asked (a container
        that claims nothing gets nothing)."""
        if self.view.sandbox:
            return False
        return (
            self.view.engine is not None
            or self.image_asks
            or bool(self.mount_ids)
            or bool(self.annotation_ids)
        )

    @property
    def claims_imex(self) -> bool:
        """Whether the container names an IMEX channel (device-plugin mount or env)."""
        return bool(self.imex_mount_ids) or bool(self.imex_env and self.imex_env.strip())

    @property
    def asks_for_extras(self) -> bool:
        """Whether the spec names any IMEX channel or feature at all: only then is
        :mod:`nvshim.runtime.extras` loaded."""
        return self.imex_env is not None or bool(self.feature_env or self.imex_mount_ids)


def read_claim(view: ImageView, config: Config) -> Claim:
    """Parse what ``view`` claims under ``config``'s annotation prefixes (see :class:`Claim`).

    The token grammar is imported only when a value has tokens to parse: a create whose
    spec names no device never loads it.
    """
    if view.sandbox:
        return Claim(view)
    visible = view.get(VISIBLE_DEVICES)
    mount_raw = tuple(device_mount_ids(view))
    mount_ids, mount_notes = _mount_ids(mount_raw)
    keys = tuple(
        k
        for k in sorted(view.annotations)
        if any(k.startswith(p) for p in config.annotation_prefixes)
    )
    env = view.env
    return Claim(
        view,
        env_tokens=None if visible is None else _parse_tokens(visible),
        mount_raw=mount_raw,
        mount_ids=mount_ids,
        mount_notes=mount_notes,
        annotation_keys=keys,
        annotation_ids=annotation_ids_of(view, keys),
        imex_mount_ids=tuple(i[len("imex/") :] for i in mount_raw if i.startswith("imex/")),
        imex_env=env.get(IMEX_ENV),
        feature_env=tuple(v for v in FEATURE_ENV.values() if v in env),
    )


def _str_list(value: object, where: str) -> List[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{where} must be a list of strings", SPEC_FILE)
    return value


def image_view(spec: object) -> ImageView:
    """Read the request-relevant parts of an OCI spec; SpecError on wrong shapes."""
    if not isinstance(spec, dict):
        raise SpecError("top level must be a JSON object", SPEC_FILE)
    process = spec.get("process")
    if process is None:
        process = {}
    if not isinstance(process, dict):
        raise SpecError("process must be an object", SPEC_FILE)
    env: Dict[str, str] = {}
    for entry in _str_list(process.get("env"), "process.env"):
        name, _, value = entry.partition("=")
        env[name] = value  # the last entry of a name wins, as runc's exec does
    caps = process.get("capabilities")
    bounding: List[str] = []
    if caps is not None:
        if not isinstance(caps, dict):
            raise SpecError("process.capabilities must be an object", SPEC_FILE)
        bounding = _str_list(caps.get("bounding"), "process.capabilities.bounding")
    mounts = spec.get("mounts")
    if mounts is None:
        mounts = []
    if not isinstance(mounts, list) or not all(isinstance(m, dict) for m in mounts):
        raise SpecError("mounts must be a list of objects", SPEC_FILE)
    annotations = spec.get("annotations")
    if annotations is None:
        annotations = {}
    if not isinstance(annotations, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()
    ):
        raise SpecError("annotations must be an object of strings", SPEC_FILE)
    linux = spec.get("linux")
    _check_device_numbers(linux)
    return ImageView(
        env=env,
        mounts=tuple(mounts),
        annotations=annotations,
        privileged=CAP_SYS_ADMIN in bounding,
        all_devices_allowed=_allows_all_devices(linux),
        char_devices=_char_devices(linux),
        docker_hooks=_docker_hooks(spec.get("hooks"), annotations),
    )


def _docker_hooks(hooks: object, annotations: Mapping[str, str]) -> Tuple[Dict[str, Any], ...]:
    """The ``prestart`` hooks whose path is named :data:`DOCKER_HOOK` and whose ``args[1]`` is
    ``prestart``: what dockerd adds for ``--gpus``, besides ``NVIDIA_VISIBLE_DEVICES`` (and
    ``NVIDIA_DRIVER_CAPABILITIES``) appended to the env. Images and pods cannot add hooks;
    an OCI hooks.d entry (CRI-O, podman) can put the same hook into every container, so a
    spec with Kubernetes (``io.kubernetes.*``) or podman (``io.container.manager``)
    annotations is never Docker's request: Docker runs no pod with ``--gpus``."""
    prestart = hooks.get("prestart") if isinstance(hooks, dict) else None
    if not isinstance(prestart, list) or not prestart:
        return ()
    found = tuple(
        h
        for h in prestart
        if isinstance(h, dict)
        and isinstance(h.get("path"), str)
        and posixpath.basename(h["path"]) == DOCKER_HOOK
        and isinstance(h.get("args"), list)
        and h["args"][1:2] == ["prestart"]
    )
    if found and any(
        k.startswith(KUBERNETES_PREFIX) or k == "io.container.manager" for k in annotations
    ):
        return ()
    return found


#: runc reads a device's ``major``/``minor`` as int64 and keeps the low 32 bits
#: (``uint32(n)`` for mknod, ``int32(n)`` in the cgroup v2 filter): only 0..2^32-1 mean
#: what they say (and -1, the cgroup rules' wildcard).
_DEVICE_NUMBERS = 1 << 32


def _check_device_numbers(linux: object) -> None:
    """Refuse a ``major``/``minor`` of ``linux.devices`` or ``linux.resources.devices``
    that runc would not use as written: outside 0..2^32-1 it keeps the low 32 bits, so
    ``195 + 2**32`` is the GPU major 195 to runc and another number to every reader here
    (the engine's grant, verification, the journal). -1 is a cgroup rule's wildcard.
    Values of other types are runc's to refuse."""
    if not isinstance(linux, dict):
        return
    resources = linux.get("resources")
    for where, entries, wildcard in (
        ("linux.devices", linux.get("devices"), False),
        (
            "linux.resources.devices",
            resources.get("devices") if isinstance(resources, dict) else None,
            True,
        ),
    ):
        if not isinstance(entries, list):
            continue
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                continue
            for key in ("major", "minor"):
                value = entry.get(key)
                if (
                    type(value) is not int
                    or 0 <= value < _DEVICE_NUMBERS
                    or (wildcard and value == -1)
                ):
                    continue
                raise SpecError(
                    f"{where}[{i}].{key} is {value}: device numbers are 0-{_DEVICE_NUMBERS - 1}"
                    f"{' (or -1 in a cgroup rule)' if wildcard else ''}; runc would use "
                    f"{value % _DEVICE_NUMBERS} (its low 32 bits), so it is refused",
                    SPEC_FILE,
                )


def _char_devices(linux: object) -> Tuple[Tuple[int, int, str], ...]:
    """(major, minor, path) of the ``c``/``u`` entries of ``linux.devices``; entries of
    another shape are runc's to refuse, not a device nvshim could recognise."""
    devices = linux.get("devices") if isinstance(linux, dict) else None
    if not isinstance(devices, list) or not devices:
        return ()
    out = []
    for dev in devices:
        if not isinstance(dev, dict) or dev.get("type") not in ("c", "u"):
            continue
        major, minor, path = dev.get("major"), dev.get("minor"), dev.get("path")
        if type(major) is int and type(minor) is int and isinstance(path, str):
            out.append((major, minor, path))
    return tuple(out)


def _allows_all_devices(linux: object) -> bool:
    """Whether ``linux.resources.devices`` ends up allowing every device (rules apply in
    order, the last match wins): an allow rule for all types and numbers with read and
    write access, and no deny rule after it. Anything malformed counts as no."""
    resources = linux.get("resources") if isinstance(linux, dict) else None
    rules = resources.get("devices") if isinstance(resources, dict) else None
    if not isinstance(rules, list):
        return False
    verdict = False
    for rule in rules:
        if not isinstance(rule, dict):
            return False
        every = (
            rule.get("type") in (None, "a")
            and rule.get("major") in (None, -1)
            and rule.get("minor") in (None, -1)
        )
        if rule.get("allow") is not True:
            verdict = False  # a deny, even of a few devices, may be the GPUs'
        elif every:
            access = rule.get("access")
            verdict = access is None or (
                isinstance(access, str) and "r" in access and "w" in access
            )
    return verdict


def _parse_tokens(value: str) -> Tuple[str, ...]:
    """:func:`nvshim.host.devices.parse_visible_devices`, importing the grammar on first
    use: a create whose spec names no device never loads it."""
    from nvshim.host.devices import parse_visible_devices

    return parse_visible_devices(value)


def _mount_ids(raw: Sequence[str]) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """Device tokens from the device plugin's volume-mounts strategy (``raw``: the mounts'
    ids), and notes."""
    ids: Dict[str, None] = {}
    notes: List[str] = []
    for ident in raw:
        dest = f"{DEVICE_LIST_DIR}/{ident}"
        if ident.startswith("imex/"):
            notes.append(f"volume mount {dest}: IMEX channel, not a GPU")
            continue
        if ident.startswith("cdi/"):
            rest = ident[len("cdi/") :]
            if "=" in rest:
                name = rest  # cdi/<vendor>/<class>=<name>
            else:
                parts = rest.split("/")
                if len(parts) != 3:
                    notes.append(f"volume mount {dest}: not a CDI name, ignored")
                    continue
                name = f"{parts[0]}/{parts[1]}={parts[2]}"
            ids.setdefault(name, None)
            continue
        ids.setdefault(ident, None)
    if not ids:
        return (), tuple(notes)
    return _parse_tokens(",".join(ids)), tuple(notes)


def annotation_ids_of(view: ImageView, keys: Sequence[str]) -> Tuple[str, ...]:
    """The device tokens of the annotations ``keys``, in that order."""
    names: List[str] = []
    for key in keys:
        names.extend(v.strip() for v in view.annotations[key].split(",") if v.strip())
    if not names:
        return ()
    return _parse_tokens(",".join(names))


def device_list_id(mount: Mapping[str, Any]) -> Optional[str]:
    """The raw id of ``mount`` when it is a device-plugin ``/dev/null`` mount under
    :data:`DEVICE_LIST_DIR` (a GPU id, a replica name, ``cdi/…``, ``imex/<n>``); None for
    any other mount. The one reader of such mounts, the claim's and the guard's.

    Read as loosely as anything that may act on it: the source cleaned (``/dev//null`` is
    ``/dev/null``), the destination cleaned and taken from the container's ``/`` when
    relative (as runc mounts it), and its prefix matched as NVIDIA's runtime matches it,
    without a separator (``…-devicesall`` is ``all`` to that runtime)."""
    source, dest = mount.get("source"), mount.get("destination")
    if (
        not isinstance(source, str)
        or not isinstance(dest, str)
        or not source.startswith("/")
        or "null" not in source
    ):  # every create reads every mount: no normpath for most
        return None
    if posixpath.normpath("/" + source.lstrip("/")) != "/dev/null":
        return None
    # posixpath.normpath keeps a leading "//": strip it first
    clean = posixpath.normpath("/" + dest.lstrip("/"))
    if not clean.startswith(DEVICE_LIST_DIR):
        return None
    ident = clean[len(DEVICE_LIST_DIR) :].strip("/")
    return ident or None


def device_mount_ids(view: ImageView) -> List[str]:
    """The raw ids of device-plugin ``/dev/null`` mounts under ``DEVICE_LIST_DIR`` (GPU ids,
    replica names before normalising, ``cdi/…`` and ``imex/<n>``), in order, each
    destination once (:func:`device_list_id`)."""
    out: List[str] = []
    for mount in view.mounts:
        ident = device_list_id(mount)
        if ident is not None and ident not in out:
            out.append(ident)
    return out
