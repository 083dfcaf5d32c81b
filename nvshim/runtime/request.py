"""What a container is allowed to get: the request, decided from its claim.

Pure: takes the :class:`~nvshim.runtime.claim.Claim` (what config.json claims, parsed once
by :mod:`nvshim.runtime.claim`) and the :class:`~nvshim.config.Config`, touches no
filesystem.

- :func:`resolve_request` picks the source of the request (device-plugin mounts, CDI
  annotations, ``docker run --gpus``, ``NVIDIA_VISIBLE_DEVICES``, a legacy CUDA image, the
  GPUs the engine injected) under the configured policy, including require-allocation and
  its ``management-pods``, and records every decision as a note;
- :func:`parse_capabilities` reads NVIDIA_DRIVER_CAPABILITIES, only for a grant;
- :func:`nvshim.host.devices.select_gpus` then maps the request's tokens onto the node's
  GPUs (pure too: the GPU records come from discovery). The token grammar lives there,
  imported only when a container names a device.

Why one module: the request is one decision over one claim: the sources it may come from are
tried in an order the policy fixes (require-allocation first), and each leaves a note the
next reads; split by source, that order would be read across files.
"""

from __future__ import annotations

from nvshim._record import dataclass
from nvshim.config import ALL_CAPABILITIES, DEFAULT_CAPABILITIES, describe_config
from nvshim.errors import RequestError
from nvshim.runtime.claim import (
    DEVICE_LIST_DIR,
    DRIVER_CAPABILITIES,
    VISIBLE_DEVICES,
    annotation_ids_of,
)

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import List, Mapping, Optional, Sequence, Tuple

    from nvshim.config import Config
    from nvshim.runtime.claim import Claim
    from nvshim.runtime.engine import EngineGrant

__all__ = ["Request", "parse_capabilities", "resolve_request"]


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
        from nvshim.host.devices import is_qualified

        return tuple(d for d in self.devices if is_qualified(d))

    @property
    def gpu_tokens(self) -> Tuple[str, ...]:
        from nvshim.host.devices import is_qualified

        return tuple(d for d in self.devices if not is_qualified(d))

    @property
    def injects(self) -> bool:
        return self.driver_files or bool(self.devices)


def parse_capabilities(
    value: Optional[str], supported: Sequence[str], legacy: bool
) -> Tuple[str, ...]:
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


def _names_all(token: str) -> bool:
    """``all``, or a CDI name of a device called ``all`` (``nvidia.com/gpu=all``)."""
    from nvshim.host.devices import is_qualified

    return token == "all" or (is_qualified(token) and token.partition("=")[2] == "all")


def _all_uuids(tokens: Sequence[str]) -> bool:
    from nvshim.host.devices import all_uuids

    return all_uuids(tokens)


def resolve_request(
    claim: Claim,
    config: Config,
    pod_annotations: Optional[Mapping[str, str]] = None,
    kubelet_tokens: Sequence[str] = (),
    kubelet_ids: Sequence[str] = (),
) -> Request:
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

    The stages below each take the claim, the config and the notes said so far, and return
    the :class:`Request` or ``None`` (not decided yet).
    """
    view = claim.view
    if view.sandbox:
        return Request(source="sandbox", notes=("CRI sandbox container: passed through",))
    notes = list(claim.mount_notes)
    # docker run --gpus: the engine's request (Docker appends its NVIDIA_VISIBLE_DEVICES
    # last, so it is the value read), taken from the CLI's user, never from the image
    if view.docker_gpus and not _env_set(claim):
        notes.append("docker run --gpus named no device (count 0): no GPU")
    if not config.require_allocation:
        return _without_allocation(claim, config, notes)
    # require-allocation: only a device plugin's allocation grants GPUs -- and whatever a
    # management pod (the device plugin itself) asks for.
    return (
        _management_pod(claim, config, notes)
        or _allocated(claim, config, notes, pod_annotations, kubelet_tokens, kubelet_ids)
        or _not_allocated(claim, config, notes)
    )


# -- what every stage reads of the claim (cheap properties, no state) ----------------------


def _env_set(claim: Claim) -> bool:
    """NVIDIA_VISIBLE_DEVICES names something (not unset, not empty or void)."""
    return claim.env_tokens is not None and claim.env_tokens != ()


def _env_raw(claim: Claim) -> List[str]:
    return [claim.view.get(VISIBLE_DEVICES) or ""]


def _engine(claim: Claim) -> Optional[EngineGrant]:
    """The GPUs the engine injected (CDI, DRA), when it injected any: the container's grant."""
    engine = claim.view.engine
    return engine if engine is not None and engine.holds_gpus else None


def _exclusive(claim: Claim, config: Config) -> bool:
    """Image env never widens the engine's grant (engine-grants: exclusive)."""
    return _engine(claim) is not None and config.engine_grants == "exclusive"


# -- the outcomes -------------------------------------------------------------------------


def _grant(
    claim: Claim,
    config: Config,
    notes: List[str],
    source: str,
    devices: Tuple[str, ...],
    raw: Sequence[str] = (),
) -> Request:
    from nvshim.host.devices import names_replicas

    view = claim.view
    # parsed only for a grant: a container granted nothing behaves as with runc, whatever
    # its image says about capabilities (or a node supports)
    caps = parse_capabilities(
        view.get(DRIVER_CAPABILITIES), config.supported_driver_capabilities, view.legacy_image
    )
    shared = names_replicas(raw)
    if devices == ("none",):
        return Request(source, (), True, False, tuple(notes), caps, shared)
    return Request(source, devices, True, False, tuple(notes), caps, shared)


def _held(claim: Claim, config: Config, notes: List[str], why: str = "") -> Request:
    """The engine's grant: no device for nvshim to add, and the driver files of the
    capabilities the image asks for (the engine's spec may carry only device nodes)."""
    view, engine = claim.view, _engine(claim)
    image_gpus = claim.image_asks and claim.env_tokens != ("none",)
    if why and image_gpus and engine is not None:  # (why: only said of an engine grant)
        shown = view.get(VISIBLE_DEVICES)
        image_what = (
            f"{VISIBLE_DEVICES}={shown}" if shown is not None else "legacy CUDA image (all GPUs)"
        )
        notes.append(
            f"{image_what} adds no GPU: the engine injected {engine.summary} "
            f"into config.json, which is the container's grant; {why}"
        )
    if claim.image_asks or view.get(DRIVER_CAPABILITIES):
        return _grant(claim, config, notes, "engine", ())
    return Request("engine", notes=tuple(notes), capabilities=())


def _nothing(claim: Claim, config: Config, notes: List[str]) -> Request:
    if _engine(claim) is not None:
        return _held(claim, config, notes)
    return Request("none", notes=tuple(notes), capabilities=())


# -- the stages ---------------------------------------------------------------------------


def _without_allocation(claim: Claim, config: Config, notes: List[str]) -> Request:
    """require-allocation off: the first source that names devices, in precedence order."""
    view, env_tokens, env_set = claim.view, claim.env_tokens, _env_set(claim)
    if claim.mount_ids:
        if env_set:
            notes.append(f"{VISIBLE_DEVICES} ignored: device-plugin volume mounts take precedence")
        return _grant(claim, config, notes, "volume-mounts", claim.mount_ids, claim.mount_raw)
    if claim.annotation_ids:
        if env_set:
            notes.append(f"{VISIBLE_DEVICES} ignored: CDI annotations take precedence")
        return _grant(claim, config, notes, "cdi-annotations", claim.annotation_ids)
    if view.docker_gpus and env_tokens:
        return _grant(claim, config, notes, "docker-gpus", env_tokens, _env_raw(claim))
    if _exclusive(claim, config):
        return _held(
            claim,
            config,
            notes,
            "image env never widens an engine grant (engine-grants: exclusive)",
        )
    if env_tokens is None and view.legacy_image:
        notes.append("legacy CUDA image (CUDA_VERSION set, no NVIDIA_REQUIRE_CUDA): all GPUs")
        return _grant(claim, config, notes, "legacy-image", ("all",))
    if not env_set:
        return _nothing(claim, config, notes)
    assert env_tokens is not None
    if not view.privileged and not config.accept_envvar_when_unprivileged:
        notes.append(
            f"{VISIBLE_DEVICES} ignored: container is unprivileged and "
            "accept-envvar-when-unprivileged is off"
        )
        return _nothing(claim, config, notes)
    return _grant(claim, config, notes, "env", env_tokens, _env_raw(claim))


def _management_pod(claim: Claim, config: Config, notes: List[str]) -> Optional[Request]:
    """A management pod (the device plugin itself) gets what its env asks for."""
    if not (_env_set(claim) and _engine(claim) is None and config.management_pods):
        return None
    view = claim.view
    entry = view.management_pod(config.management_pods)
    if entry is None:
        return None
    assert claim.env_tokens is not None
    notes.append(
        f"{VISIBLE_DEVICES} granted without an allocation: "
        f"{view.identity} matches management-pods entry "
        f'"{entry}"'
    )
    return _grant(claim, config, notes, "management-pod", claim.env_tokens, _env_raw(claim))


def _claimed_allocations(
    claim: Claim, notes: List[str], pod_annotations: Optional[Mapping[str, str]], accept_all: bool
) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """(mount ids, annotation ids) without what is no allocation: the pod's own
    annotations, and "all" or "none" by mount or annotation, which any pod can fake."""
    view = claim.view
    mount_ids, annotation_ids = claim.mount_ids, claim.annotation_ids
    if annotation_ids and pod_annotations:
        from_pod = [
            k for k in claim.annotation_keys if pod_annotations.get(k) == view.annotations[k]
        ]
        if from_pod:
            notes.extend(
                f"annotation {k} ignored: it is the pod's, not the device plugin's, "
                "which any pod author can write"
                for k in from_pod
            )
            # the container's own annotations, parsed without the pod's (a rare path)
            annotation_ids = annotation_ids_of(
                view, [k for k in claim.annotation_keys if k not in from_pod]
            )
    if mount_ids and not accept_all:
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
        notes.append(
            f"volume mount {DEVICE_LIST_DIR}/none ignored: no device plugin "
            "allocates it, a hostPath mount can fake it"
        )
        mount_ids = ()
    if annotation_ids == ("none",):
        notes.append("CDI annotation naming none ignored: no device plugin allocates it")
        annotation_ids = ()
    return mount_ids, annotation_ids


def _allocated(
    claim: Claim,
    config: Config,
    notes: List[str],
    pod_annotations: Optional[Mapping[str, str]],
    kubelet_tokens: Sequence[str],
    kubelet_ids: Sequence[str],
) -> Optional[Request]:
    """The first of ``allocation-sources`` that names devices; the engine's grant when none
    does; None when neither (:func:`_not_allocated` says why)."""
    mount_ids, annotation_ids = _claimed_allocations(
        claim, notes, pod_annotations, config.accept_all_from_mounts
    )
    view, env_tokens = claim.view, claim.env_tokens
    exclusive = _exclusive(claim, config)
    for source in config.allocation_sources:
        if source == "kubelet" and kubelet_tokens:
            return _grant(claim, config, notes, source, tuple(kubelet_tokens), kubelet_ids)
        if source == "volume-mounts" and mount_ids:
            return _grant(claim, config, notes, source, mount_ids, claim.mount_raw)
        if source == "cdi-annotations" and annotation_ids:
            return _grant(claim, config, notes, source, annotation_ids)
        if source == "docker-gpus" and view.docker_gpus and env_tokens:
            return _grant(claim, config, notes, source, env_tokens, _env_raw(claim))
        if exclusive:
            continue  # the two below are image env: it never widens an engine grant
        if source == "envvar-uuids" and env_tokens and _all_uuids(env_tokens):
            return _grant(claim, config, notes, source, env_tokens, _env_raw(claim))
        if source == "privileged" and env_tokens and view.privileged_with_devices:
            return _grant(claim, config, notes, source, env_tokens, _env_raw(claim))
    if _engine(claim) is not None:
        # nvshim cannot take back what the engine injected, and need not: it is an allocation
        return _held(
            claim,
            config,
            notes,
            "image env never widens an engine grant (engine-grants: exclusive)"
            if exclusive
            else "require-allocation takes no GPU from image env",
        )
    return None


def _not_allocated(claim: Claim, config: Config, notes: List[str]) -> Request:
    """No allocation: ``docker run --gpus`` refused aloud, an image's request stripped (or,
    with ``on-missing-allocation: fail``, refused)."""
    view, env_tokens = claim.view, claim.env_tokens
    tried = ", ".join(config.allocation_sources)
    if view.docker_gpus and env_tokens:  # asked by the CLI's user: refused aloud, never stripped
        raise RequestError(
            f"docker run --gpus asks for GPUs ({VISIBLE_DEVICES}={view.get(VISIBLE_DEVICES)}) "
            f"but require-allocation is on and docker-gpus is not in allocation-sources "
            f"(tried {tried}): add it there in {describe_config(config)}"
        )
    image_asks = claim.image_asks
    if (
        _env_set(claim)
        and "privileged" in config.allocation_sources
        and view.privileged
        and not view.all_devices_allowed
    ):
        notes.append(
            "privileged source not taken: the container has CAP_SYS_ADMIN but its "
            "device cgroup does not allow every device (a pod can add SYS_ADMIN "
            "without being privileged)"
        )
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
