"""Which Kubernetes container a CRI container is, read from what its engine wrote.

Pure: takes config.json's annotations, touches no filesystem. The one reader of a
container's identity: ``verify-with: kubelet`` asks the kubelet about this identity,
``management-pods`` matches it, the grant journal records it.

Two engines write it, each with its own keys:

- **containerd**'s CRI plugin writes ``io.kubernetes.cri.*`` (``container-type``,
  ``sandbox-name``, ``sandbox-namespace``, ``sandbox-uid``, ``container-name``) on every
  container it creates, after any pass-through pod annotation, so its values win.
- **CRI-O** writes its own ``io.kubernetes.cri-o.*`` keys (``ContainerType``, ``SandboxID``,
  ``Labels``: the kubelet's container labels as JSON, …; ``pkg/annotations/internal.go``,
  keys it never lets user input overwrite) and the kubelet's labels themselves as
  annotations: ``io.kubernetes.pod.name``, ``io.kubernetes.pod.namespace``,
  ``io.kubernetes.pod.uid``, ``io.kubernetes.container.name``
  (``internal/factory/container``'s ``SpecAddAnnotations``). It also copies the pod
  sandbox's annotations into every container's spec *first* — a pod author's annotations,
  ``io.kubernetes.cri.sandbox-name`` included: a CRI-O spec is never read with
  containerd's keys.

Which engine wrote a spec is told by its own marker keys: any ``io.kubernetes.cri.*`` key
is containerd's, ``io.kubernetes.cri-o.ContainerType`` CRI-O's. A spec with both carries
one engine's keys that a pod wrote (CRI-O's pod annotations, containerd's pass-through
annotations): its identity is not usable. Under CRI-O the identity comes from CRI-O's
``Labels`` JSON and must agree with the label annotations where those are present.
"""

from __future__ import annotations

from nvshim._record import dataclass

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Dict, Mapping, Optional, Sequence, Tuple

__all__ = [
    "Identity",
    "cri_engine",
    "read_identity",
    "identity_of",
    "is_sandbox",
    "management_pod",
    "CONTAINERD_PREFIX",
    "SANDBOX_ANNOTATION",
    "SANDBOX_NAME",
    "SANDBOX_NAMESPACE",
    "SANDBOX_UID",
    "CONTAINER_NAME",
    "CRIO_CONTAINER_TYPE",
    "CRIO_SANDBOX_ID",
    "CRIO_LABELS",
    "CRIO_ANNOTATIONS",
    "POD_NAME_LABEL",
    "POD_NAMESPACE_LABEL",
    "POD_UID_LABEL",
    "CONTAINER_NAME_LABEL",
]

#: containerd's CRI plugin: every key it writes starts with this.
CONTAINERD_PREFIX = "io.kubernetes.cri."
SANDBOX_ANNOTATION = "io.kubernetes.cri.container-type"
SANDBOX_NAME = "io.kubernetes.cri.sandbox-name"
SANDBOX_NAMESPACE = "io.kubernetes.cri.sandbox-namespace"
SANDBOX_UID = "io.kubernetes.cri.sandbox-uid"
CONTAINER_NAME = "io.kubernetes.cri.container-name"

#: CRI-O: ``sandbox`` or ``container`` on everything it creates.
CRIO_CONTAINER_TYPE = "io.kubernetes.cri-o.ContainerType"
#: CRI-O: the sandbox's id, on everything it creates.
CRIO_SANDBOX_ID = "io.kubernetes.cri-o.SandboxID"
#: CRI-O: the kubelet's container labels, as a JSON object.
CRIO_LABELS = "io.kubernetes.cri-o.Labels"
#: CRI-O: the kubelet's container annotations (the device plugin's among them), as JSON.
CRIO_ANNOTATIONS = "io.kubernetes.cri-o.Annotations"
#: The kubelet's container labels (CRI-O writes them as annotations too).
POD_NAME_LABEL = "io.kubernetes.pod.name"
POD_NAMESPACE_LABEL = "io.kubernetes.pod.namespace"
POD_UID_LABEL = "io.kubernetes.pod.uid"
CONTAINER_NAME_LABEL = "io.kubernetes.container.name"

_CRIO_KEYS = (POD_NAMESPACE_LABEL, POD_NAME_LABEL, POD_UID_LABEL, CONTAINER_NAME_LABEL)
#: The kubelet's labels on every pod sandbox (a sandbox has no container name).
_CRIO_SANDBOX_LABELS = (POD_NAMESPACE_LABEL, POD_NAME_LABEL, POD_UID_LABEL)
#: What containerd's CRI plugin writes on every pod sandbox besides the marker.
_CONTAINERD_SANDBOX_KEYS = (
    CONTAINERD_PREFIX + "sandbox-id",
    SANDBOX_NAME,
    SANDBOX_NAMESPACE,
    SANDBOX_UID,
)


@dataclass(frozen=True)
class Identity:
    """Which Kubernetes container a CRI container is."""

    namespace: str
    pod: str
    pod_uid: str
    container: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}"


def cri_engine(annotations: Mapping[str, str]) -> str:
    """``containerd`` or ``cri-o``: whose CRI annotations the spec carries; ``both`` when
    it has both engines' (a pod wrote one set), ``""`` when neither (not a CRI container:
    Docker, podman, runc by hand)."""
    containerd = any(k.startswith(CONTAINERD_PREFIX) for k in annotations)
    crio = CRIO_CONTAINER_TYPE in annotations
    if containerd and crio:
        return "both"
    return "containerd" if containerd else "cri-o" if crio else ""


def is_sandbox(annotations: Mapping[str, str]) -> bool:
    """A CRI pod sandbox (pause) container, by its engine's own marker *and* the rest of
    the identity that engine writes on every sandbox: never a GPU container. The marker
    alone is one annotation (``docker``/``podman --annotation``), so it counts only with
    containerd's sandbox id, name, namespace and UID, or CRI-O's sandbox id and the
    kubelet's pod labels (name, namespace, UID) in its ``Labels`` JSON. A spec with both
    engines' keys is no sandbox (it is judged, not skipped)."""
    engine = cri_engine(annotations)
    if engine == "containerd":
        return annotations.get(SANDBOX_ANNOTATION) == "sandbox" and all(
            annotations.get(k) for k in _CONTAINERD_SANDBOX_KEYS
        )
    if engine == "cri-o":
        if (
            annotations.get(CRIO_CONTAINER_TYPE) != "sandbox"
            or not annotations.get(CRIO_SANDBOX_ID)
            or CRIO_LABELS not in annotations
        ):
            return False
        labels, why = _crio_labels(annotations)
        return not why and all(labels.get(k) for k in _CRIO_SANDBOX_LABELS)
    return False


def read_identity(annotations: Mapping[str, str]) -> Tuple[Optional[Identity], str]:
    """(the identity, "") of a CRI container; (None, "") for a container no CRI engine
    made; (None, why) for one a CRI engine made whose identity cannot be used (a name
    missing or empty, both engines' keys, CRI-O's labels contradicted)."""
    engine = cri_engine(annotations)
    if not engine:
        return None, ""
    if engine == "both":
        return None, (
            "its spec carries both containerd's io.kubernetes.cri.* and CRI-O's "
            "io.kubernetes.cri-o.* annotations (one set was written by the pod)"
        )
    if engine == "containerd":
        return _named(
            "containerd",
            annotations.get(SANDBOX_NAMESPACE),
            annotations.get(SANDBOX_NAME),
            annotations.get(SANDBOX_UID),
            annotations.get(CONTAINER_NAME),
            (SANDBOX_NAMESPACE, SANDBOX_NAME, CONTAINER_NAME),
        )
    labels, why = _crio_labels(annotations)
    if why:
        return None, why
    return _named(
        "CRI-O",
        labels.get(POD_NAMESPACE_LABEL),
        labels.get(POD_NAME_LABEL),
        labels.get(POD_UID_LABEL),
        labels.get(CONTAINER_NAME_LABEL),
        (POD_NAMESPACE_LABEL, POD_NAME_LABEL, CONTAINER_NAME_LABEL),
    )


def identity_of(annotations: Mapping[str, str]) -> Optional[Identity]:
    """The container's identity; None when it has none that can be used."""
    return read_identity(annotations)[0]


def _named(
    engine: str,
    namespace: Optional[str],
    pod: Optional[str],
    uid: Optional[str],
    container: Optional[str],
    keys: Sequence[str],
) -> Tuple[Optional[Identity], str]:
    missing = [k for k, v in zip(keys, (namespace, pod, container), strict=True) if not v]
    if missing:
        return None, (
            f"{engine} made it but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} missing or empty"
        )
    assert namespace and pod and container
    return Identity(namespace, pod, uid or "", container), ""


def _crio_labels(annotations: Mapping[str, str]) -> Tuple[Dict[str, str], str]:
    """The kubelet's labels as CRI-O recorded them (its ``Labels`` JSON), checked against
    the label annotations; the annotations alone when CRI-O wrote no JSON."""
    plain = {k: annotations[k] for k in _CRIO_KEYS if k in annotations}
    raw = annotations.get(CRIO_LABELS)
    if raw is None:
        return plain, ""
    from nvshim._jsonc import loads

    try:
        doc = loads(raw)
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        return {}, f"CRI-O's {CRIO_LABELS} annotation is not a JSON object"
    labels = {k: doc[k] for k in _CRIO_KEYS if isinstance(doc.get(k), str)}
    for key, value in plain.items():
        if labels.get(key) != value:
            return {}, (
                f"annotation {key}={value!r} contradicts CRI-O's {CRIO_LABELS} "
                f"({labels.get(key)!r})"
            )
    return labels, ""


def management_pod(annotations: Mapping[str, str], patterns: Sequence[str]) -> Optional[str]:
    """The ``management-pods`` entry (``<namespace>/<pod>[/<container>]``, pod and container
    globs) that the CRI container with these annotations matches; None when none does or it
    has no usable identity (:func:`read_identity`). The namespace is compared literally."""
    if not patterns:
        return None
    identity = identity_of(annotations)
    if identity is None:
        return None
    from fnmatch import fnmatchcase

    for pattern in patterns:
        namespace, _, rest = pattern.partition("/")
        pod, _, container = rest.partition("/")
        if (
            namespace == identity.namespace
            and fnmatchcase(identity.pod, pod)
            and (not container or fnmatchcase(identity.container, container))
        ):
            return pattern
    return None
