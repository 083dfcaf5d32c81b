"""What a container asks for, and what it is allowed to get.

Pure: takes the config.json dict and the :class:`~nvshim.config.Config`, touches no
filesystem. Three steps:

1. :func:`image_view` reads env (last entry wins), mounts, annotations and privilege
   from the spec;
2. :func:`read_claim` parses, once, everything the container claims (device tokens of
   NVIDIA_VISIBLE_DEVICES, device-plugin mount ids, CDI annotation ids, IMEX channels,
   the feature env): the :class:`Claim` every consumer reads (require-allocation, the
   request, the extras), with cheap properties for "does it claim anything?";
3. :func:`resolve_request` picks the source of the request (device-plugin mounts, CDI
   annotations, ``NVIDIA_VISIBLE_DEVICES``, a legacy CUDA image) under the configured
   policy, including require-allocation, and records every decision;
4. :func:`nvshim.runtime.tokens.select_gpus` maps the request's tokens onto the node's
   GPUs (pure too: the GPU records come from discovery). The token grammar lives there,
   imported only when a container names a device.

Longer than most modules because the view, the claim and the request are one reading of
one spec, and every create imports it: split, each create would pay one more import.
"""

from __future__ import annotations

import posixpath

from nvshim._record import dataclass
from nvshim.config import ALL_CAPABILITIES, DEFAULT_CAPABILITIES, describe_config
from nvshim.errors import SPEC_FILE, RequestError, SpecError
from nvshim.runtime.identity import (  # the one reader of a CRI container's identity
    CONTAINER_NAME,
    SANDBOX_ANNOTATION,
    SANDBOX_NAME,
    SANDBOX_NAMESPACE,
    SANDBOX_UID,
    Identity,
    identity_of,
    is_sandbox,
    management_pod,
)

TYPE_CHECKING = False  # typing costs ~4 ms to import on the create path
if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

    from nvshim.config import Config
    from nvshim.runtime.engine import EngineGrant

__all__ = [
    "ImageView",
    "Claim",
    "Request",
    "image_view",
    "read_claim",
    "parse_capabilities",
    "resolve_request",
    "FEATURE_ENV",
    "IMEX_ENV",
    "VISIBLE_DEVICES",
    "DEVICE_LIST_DIR",
    "device_mount_ids",
    "SANDBOX_ANNOTATION",
    "SANDBOX_NAME",
    "SANDBOX_NAMESPACE",
    "SANDBOX_UID",
    "CONTAINER_NAME",
    "Identity",
    "identity_of",
    "management_pod",
    "DOCKER_HOOK",
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
    def sandbox(self) -> bool:
        """A CRI pod sandbox (pause) container (containerd's or CRI-O's): never a GPU
        container."""
        return is_sandbox(self.annotations)


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
        return (self.view.engine is not None or self.image_asks or bool(self.mount_ids)
                or bool(self.annotation_ids))

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
    keys = tuple(k for k in sorted(view.annotations)
                 if any(k.startswith(p) for p in config.annotation_prefixes))
    env = view.env
    return Claim(
        view,
        env_tokens=None if visible is None else _parse_tokens(visible),
        mount_raw=mount_raw,
        mount_ids=mount_ids,
        mount_notes=mount_notes,
        annotation_keys=keys,
        annotation_ids=_annotation_ids(view, keys),
        imex_mount_ids=tuple(i[len("imex/"):] for i in mount_raw if i.startswith("imex/")),
        imex_env=env.get(IMEX_ENV),
        feature_env=tuple(v for v in FEATURE_ENV.values() if v in env),
    )


@dataclass(frozen=True)
class Request:
    """The outcome of request resolution.

    ``devices`` are normalised tokens: ``all``, indices, UUIDs, PCI bus ids, ``i:j`` or
    qualified CDI names. ``driver_files`` is True for any GPU container (also ``none``:
    driver files but no GPU). ``set_void`` asks the writer to replace the image's value of
    NVIDIA_VISIBLE_DEVICES with ``void`` (require-allocation stripped it).
    """

    source: str
    devices: Tuple[str, ...] = ()
    driver_files: bool = False
    set_void: bool = False
    notes: Tuple[str, ...] = ()
    capabilities: Tuple[str, ...] = DEFAULT_CAPABILITIES
    shared: bool = False
    """The allocation named time-slicing replicas (``<uuid>::N``): the GPU is meant to be shared."""

    @property
    def cdi_names(self) -> Tuple[str, ...]:
        from nvshim.runtime.tokens import is_qualified

        return tuple(d for d in self.devices if is_qualified(d))

    @property
    def gpu_tokens(self) -> Tuple[str, ...]:
        from nvshim.runtime.tokens import is_qualified

        return tuple(d for d in self.devices if not is_qualified(d))

    @property
    def injects(self) -> bool:
        return self.driver_files or bool(self.devices)


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
    found = tuple(h for h in prestart if isinstance(h, dict) and isinstance(h.get("path"), str)
                  and posixpath.basename(h["path"]) == DOCKER_HOOK
                  and isinstance(h.get("args"), list) and h["args"][1:2] == ["prestart"])
    if found and any(k.startswith("io.kubernetes.") or k == "io.container.manager"
                     for k in annotations):
        return ()
    return found


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
        every = (rule.get("type") in (None, "a") and rule.get("major") in (None, -1)
                 and rule.get("minor") in (None, -1))
        if rule.get("allow") is not True:
            verdict = False  # a deny, even of a few devices, may be the GPUs'
        elif every:
            access = rule.get("access")
            verdict = access is None or (isinstance(access, str) and "r" in access
                                         and "w" in access)
    return verdict


def parse_capabilities(value: Optional[str], supported: Sequence[str],
                       legacy: bool) -> Tuple[str, ...]:
    """NVIDIA_DRIVER_CAPABILITIES → sorted capability names.

    Unset: ``compute,utility`` (a legacy CUDA image: everything supported). Empty: the
    default too. ``all`` = every supported capability. An unknown or unsupported name is
    an error naming it.
    """
    known = ALL_CAPABILITIES
    supported_set = set(known) if "all" in supported else set(supported)
    if value is None and legacy:
        return tuple(sorted(supported_set))
    if value is None or not value.strip():
        return tuple(sorted(set(DEFAULT_CAPABILITIES) & supported_set))
    wanted = set()
    for raw in value.split(","):
        cap = raw.strip().lower()
        if not cap:
            continue
        if cap == "all":
            wanted |= supported_set
            continue
        if cap not in known:
            raise RequestError(
                f'unknown driver capability "{raw.strip()}" in {DRIVER_CAPABILITIES}: '
                f"known are {', '.join(known)}, all"
            )
        if cap not in supported_set:
            raise RequestError(
                f'driver capability "{cap}" is not supported on this node '
                f"(supported-driver-capabilities: {', '.join(sorted(supported_set))})"
            )
        wanted.add(cap)
    return tuple(sorted(wanted))


def _parse_tokens(value: str) -> Tuple[str, ...]:
    """:func:`nvshim.runtime.tokens.parse_visible_devices`, importing the grammar on first
    use: a create whose spec names no device never loads it."""
    from nvshim.runtime.tokens import parse_visible_devices

    return parse_visible_devices(value)


def _names_all(token: str) -> bool:
    """``all``, or a CDI name of a device called ``all`` (``nvidia.com/gpu=all``)."""
    from nvshim.runtime.tokens import is_qualified

    return token == "all" or (is_qualified(token) and token.partition("=")[2] == "all")


def _all_uuids(tokens: Sequence[str]) -> bool:
    from nvshim.runtime.tokens import all_uuids

    return all_uuids(tokens)


# --- allocation sources -------------------------------------------------------------------


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
            rest = ident[len("cdi/"):]
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


def _annotation_ids(view: ImageView, keys: Sequence[str]) -> Tuple[str, ...]:
    """The device tokens of the annotations ``keys``, in that order."""
    names: List[str] = []
    for key in keys:
        names.extend(v.strip() for v in view.annotations[key].split(",") if v.strip())
    if not names:
        return ()
    return _parse_tokens(",".join(names))


def resolve_request(claim: Claim, config: Config,
                    pod_annotations: Optional[Mapping[str, str]] = None,
                    kubelet_tokens: Sequence[str] = (),
                    kubelet_ids: Sequence[str] = ()) -> Request:
    """Decide what the container gets, and why (see the module docstring).

    ``kubelet_ids`` are the device ids the kubelet allocated to this container that name
    GPUs of this node, and ``kubelet_tokens`` their device tokens (both from
    :class:`nvshim.runtime.allocation.policy.KubeletIds`, parsed once; empty when the
    kubelet was not asked): the ``kubelet`` allocation source grants them. Whether a claim
    from another source is inside them is checked once the claim is mapped onto GPUs
    (``nvshim.runtime.allocation.policy.check_allocated``). ``pod_annotations`` are the
    annotations of the container's pod sandbox spec, when known: under require-allocation
    an annotation the container carries with the same key and value came from the pod
    (which any pod author can write), not from the device plugin, and is no allocation.
    """
    view = claim.view
    if view.sandbox:
        return Request(source="sandbox", notes=("CRI sandbox container: passed through",))

    env_tokens = claim.env_tokens
    env_set = env_tokens is not None and env_tokens != ()
    notes: List[str] = []

    def grant(source: str, devices: Tuple[str, ...], raw: Sequence[str] = ()) -> Request:
        from nvshim.runtime.tokens import names_replicas

        # parsed only for a grant: a container granted nothing behaves as with runc, whatever
        # its image says about capabilities (or a node supports)
        caps = parse_capabilities(view.get(DRIVER_CAPABILITIES),
                                  config.supported_driver_capabilities, view.legacy_image)
        shared = names_replicas(raw)
        if devices == ("none",):
            return Request(source, (), True, False, tuple(notes), caps, shared)
        return Request(source, devices, True, False, tuple(notes), caps, shared)

    # GPUs the engine injected (CDI, DRA) are the container's grant: image env never widens
    # them (engine-grants: exclusive), and they stand where no other source grants anything.
    engine = view.engine if view.engine is not None and view.engine.holds_gpus else None
    exclusive = engine is not None and config.engine_grants == "exclusive"
    image_gpus = claim.image_asks and env_tokens != ("none",)
    shown = view.get(VISIBLE_DEVICES)
    image_what = (f"{VISIBLE_DEVICES}={shown}" if shown is not None
                  else "legacy CUDA image (all GPUs)")

    def held(why: str = "") -> Request:
        """The engine's grant: no device for nvshim to add, and the driver files of the
        capabilities the image asks for (the engine's spec may carry only device nodes)."""
        if why and image_gpus and engine is not None:  # (why: only said of an engine grant)
            notes.append(f"{image_what} adds no GPU: the engine injected {engine.summary} "
                         f"into config.json, which is the container's grant; {why}")
        if claim.image_asks or view.get(DRIVER_CAPABILITIES):
            return grant("engine", ())
        return Request("engine", notes=tuple(notes), capabilities=())

    def nothing() -> Request:
        return held() if engine is not None else Request(
            "none", notes=tuple(notes), capabilities=())

    mount_ids = claim.mount_ids
    notes.extend(claim.mount_notes)
    mount_raw = claim.mount_raw
    annotation_ids = claim.annotation_ids
    env_raw = [view.get(VISIBLE_DEVICES) or ""]

    # docker run --gpus: the engine's request (Docker appends its NVIDIA_VISIBLE_DEVICES
    # last, so it is the value read), taken from the CLI's user, never from the image
    docker = view.docker_gpus
    if docker and not env_set:
        notes.append("docker run --gpus named no device (count 0): no GPU")

    if not config.require_allocation:
        if mount_ids:
            if env_set:
                notes.append(
                    f"{VISIBLE_DEVICES} ignored: device-plugin volume mounts take precedence")
            return grant("volume-mounts", mount_ids, mount_raw)
        if annotation_ids:
            if env_set:
                notes.append(f"{VISIBLE_DEVICES} ignored: CDI annotations take precedence")
            return grant("cdi-annotations", annotation_ids)
        if docker and env_tokens:
            return grant("docker-gpus", env_tokens, env_raw)
        if exclusive:
            return held("image env never widens an engine grant (engine-grants: exclusive)")
        if env_tokens is None and view.legacy_image:
            notes.append("legacy CUDA image (CUDA_VERSION set, no NVIDIA_REQUIRE_CUDA): all GPUs")
            return grant("legacy-image", ("all",))
        if not env_set:
            return nothing()
        assert env_tokens is not None
        if not view.privileged and not config.accept_envvar_when_unprivileged:
            notes.append(
                f"{VISIBLE_DEVICES} ignored: container is unprivileged and "
                "accept-envvar-when-unprivileged is off"
            )
            return nothing()
        return grant("env", env_tokens, env_raw)

    # require-allocation: only a device plugin's allocation grants GPUs -- and whatever a
    # management pod (the device plugin itself) asks for.
    if env_set and engine is None and config.management_pods:
        entry = management_pod(view.annotations, config.management_pods)
        if entry is not None:
            assert env_tokens is not None
            notes.append(f"{VISIBLE_DEVICES} granted without an allocation: "
                         f"{identity_of(view.annotations)} matches management-pods entry "
                         f'"{entry}"')
            return grant("management-pod", env_tokens, env_raw)
    if annotation_ids and pod_annotations:
        from_pod = [k for k in claim.annotation_keys
                    if pod_annotations.get(k) == view.annotations[k]]
        if from_pod:
            notes.extend(f"annotation {k} ignored: it is the pod's, not the device plugin's, "
                         "which any pod author can write" for k in from_pod)
            # the container's own annotations, parsed without the pod's (a rare path)
            annotation_ids = _annotation_ids(
                view, [k for k in claim.annotation_keys if k not in from_pod])
    if mount_ids and not config.accept_all_from_mounts:
        # "all", and the CDI spelling of it (cdi/nvidia.com/gpu/all): every GPU at once
        for token in [t for t in mount_ids if _names_all(t)]:
            what = "all" if token == "all" else f"<CDI device {token}>"
            notes.append(
                f"volume mount {DEVICE_LIST_DIR}/{what} ignored: a hostPath mount can fake "
                "it (accept-all-from-mounts is off)"
            )
        mount_ids = tuple(t for t in mount_ids if not _names_all(t))
    # "none" (driver files, control nodes and the NVIDIA_GDS/MOFED/... devices, no GPU) is
    # no device plugin's allocation either, and holds no GPU for verify-with to check.
    if mount_ids == ("none",):
        notes.append(f"volume mount {DEVICE_LIST_DIR}/none ignored: no device plugin "
                     "allocates it, a hostPath mount can fake it")
        mount_ids = ()
    if annotation_ids == ("none",):
        notes.append("CDI annotation naming none ignored: no device plugin allocates it")
        annotation_ids = ()
    for source in config.allocation_sources:
        if source == "kubelet" and kubelet_tokens:
            return grant(source, tuple(kubelet_tokens), kubelet_ids)
        if source == "volume-mounts" and mount_ids:
            return grant(source, mount_ids, mount_raw)
        if source == "cdi-annotations" and annotation_ids:
            return grant(source, annotation_ids)
        if source == "docker-gpus" and docker and env_tokens:
            return grant(source, env_tokens, env_raw)
        if exclusive:
            continue  # the two below are image env: it never widens an engine grant
        if source == "envvar-uuids" and env_tokens and _all_uuids(env_tokens):
            return grant(source, env_tokens, env_raw)
        if source == "privileged" and env_tokens and view.privileged_with_devices:
            return grant(source, env_tokens, env_raw)
    if engine is not None:
        # nvshim cannot take back what the engine injected, and need not: it is an allocation
        return held("image env never widens an engine grant (engine-grants: exclusive)"
                    if exclusive else "require-allocation takes no GPU from image env")
    tried = ", ".join(config.allocation_sources)
    if docker and env_tokens:  # asked by the CLI's user: refused aloud, never stripped
        raise RequestError(
            f"docker run --gpus asks for GPUs ({VISIBLE_DEVICES}={view.get(VISIBLE_DEVICES)}) "
            f"but require-allocation is on and docker-gpus is not in allocation-sources "
            f"(tried {tried}): add it there in {describe_config(config)}")
    image_asks = claim.image_asks
    if env_set and "privileged" in config.allocation_sources and view.privileged \
            and not view.all_devices_allowed:
        notes.append("privileged source not taken: the container has CAP_SYS_ADMIN but its "
                     "device cgroup does not allow every device (a pod can add SYS_ADMIN "
                     "without being privileged)")
    if image_asks:
        shown = view.get(VISIBLE_DEVICES)
        what = f"{VISIBLE_DEVICES}={shown}" if shown is not None else "legacy CUDA image (all GPUs)"
        notes.append(
            f"{what} ignored: require-allocation is on and no device-plugin allocation was found "
            f"(tried {tried})"
        )
    if config.on_missing_allocation == "fail" and image_asks and not view.privileged_with_devices:
        raise RequestError(
            f"require-allocation: the image asks for GPUs but no device-plugin allocation was "
            f"found (tried {tried}); request nvidia.com/gpu in the pod spec"
        )
    return Request("none", set_void=image_asks, notes=tuple(notes), capabilities=())


def device_mount_ids(view: ImageView) -> List[str]:
    """The raw ids of device-plugin ``/dev/null`` mounts under ``DEVICE_LIST_DIR`` (GPU ids,
    replica names before normalising, ``cdi/…`` and ``imex/<n>``); the one reader of them."""
    prefix = DEVICE_LIST_DIR + "/"
    out = []
    for mount in view.mounts:
        dest = mount.get("destination")
        if mount.get("source") == "/dev/null" and isinstance(dest, str):
            # where the engine mounts it: runc takes a relative destination from the
            # container's /, and "//x" is "/x" (posixpath.normpath keeps a leading "//")
            clean = posixpath.normpath("/" + dest.lstrip("/"))
            if clean.startswith(prefix):
                out.append(clean[len(prefix):])
    return out
