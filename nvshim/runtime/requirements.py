"""NVIDIA_REQUIRE_* requirements on this node: the facts they need, and the verdict.

The grammar (what an image may write, and how versions compare) is
:mod:`nvshim.runtime.constraints`; this module judges the parsed requirements of a
container against the node. :func:`check_requirements` is the entry point create calls,
with the request view it already parsed.

Facts: the driver version always comes from :meth:`Host.driver_version`; the CUDA version,
compute capability and brand are asked through :class:`nvshim.host.nvml.NvmlFacts` (NVML
on a real node, else the configured ``nvml-facts`` file); the CUDA version, when neither
answers, from libcuda itself (:meth:`Host.cuda_version`, kept in the plan cache).
Nothing is read, and pynvml is not imported, unless a requirement exists and needs that
fact.

``arch`` and ``brand`` describe GPUs: the expression is evaluated once per selected GPU and
must hold for each (a node of mixed GPUs can meet it through different alternatives). A
constraint whose fact is unknown is reported, never passed, unless another alternative
holds. ``NVIDIA_DISABLE_REQUIRE`` (a Go boolean true) or the config key
``disable-require`` turns all checks off, with a note.
"""

from __future__ import annotations

from nvshim._record import dataclass, field
from nvshim.errors import HostError, RequestError
from nvshim.runtime.constraints import (
    DISABLE_REQUIRE,
    GPU_KEYS,
    KEYS,
    Constraint,
    Requirement,
    collect_requirements,
    go_bool,
    parse_version,
    requirement_vars,
)

# typing stays off the create path: every CUDA image (CUDA_VERSION) reaches this module
TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Dict, List, Mapping, Optional, Sequence, Tuple

    from nvshim.host.discovery import Gpu, Host
    from nvshim.host.nvml import NvmlFacts
    from nvshim.runtime.claim import ImageView

__all__ = [
    "Fact",
    "Facts",
    "check_requirements",
    "evaluate_requirement",
    "gather_facts",
]


# -- facts ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    """A value of the node or of a GPU, or None with the reason it is unknown."""

    value: Optional[str]
    unknown: str = ""


@dataclass(frozen=True)
class Facts:
    """What requirements are judged against: node facts and, per selected GPU, GPU facts."""

    node: Mapping[str, Fact] = field(default_factory=dict)
    gpus: Tuple[Tuple[str, Mapping[str, Fact]], ...] = ()
    """``("GPU 0", {"arch": Fact("8.0"), "brand": Fact("tesla")})`` per selected GPU."""


class _Gatherer:
    """Turns :class:`~nvshim.host.nvml.NvmlFacts` answers into :class:`Fact` records."""

    def __init__(self, host: Host, facts: NvmlFacts) -> None:
        self.host = host
        self.facts = facts

    @staticmethod
    def _fact(what: str, value: Optional[str], reasons: List[str]) -> Fact:
        if value is not None:
            return Fact(value)
        return Fact(None, f"{what} is unknown ({'; '.join(reasons)})")

    def driver(self) -> Fact:
        try:
            version = self.host.driver_version()
        except HostError as exc:
            return Fact(None, f"the driver version of this node is unknown ({exc})")
        if parse_version(version) is None:
            return Fact(None, f'the driver version of this node is unknown ("{version}")')
        return Fact(version)

    def cuda(self) -> Fact:
        reasons: List[str] = []
        value = self.facts.cuda_version(reasons)
        if value is None:
            # libcuda's cuDriverGetVersion answers without a GPU or a loaded module
            # (the plan cache keeps the answer: no library load on an ordinary create)
            value = self.host.cuda_version()
            if value is None:
                reasons.append(f"libcuda under {self.host.driver_root} did not say")
        return self._fact("the CUDA version of this node", value, reasons)

    def arch(self, gpu: Gpu) -> Fact:
        reasons: List[str] = []
        value = self.facts.compute_capability(gpu.uuid, gpu.minor, reasons)
        what = f"the compute capability of GPU {gpu.index} ({gpu.uuid})"
        return self._fact(what, value, reasons)

    def brand(self, gpu: Gpu) -> Fact:
        reasons: List[str] = []
        value = self.facts.brand(gpu.uuid, gpu.minor, reasons)
        return self._fact(f"the brand of GPU {gpu.index} ({gpu.uuid})", value, reasons)


def _unique_gpus(gpus: Sequence[Gpu]) -> Tuple[Gpu, ...]:
    seen: Dict[str, Gpu] = {}
    for gpu in gpus:
        seen.setdefault(gpu.uuid, gpu)
    return tuple(sorted(seen.values(), key=lambda g: g.index))


def gather_facts(host: Host, gpus: Sequence[Gpu], keys: Sequence[str]) -> Facts:
    """Read the facts for ``keys`` (and nothing else) of the node and of each GPU in ``gpus``."""
    from nvshim.host.nvml import NvmlFacts

    with NvmlFacts(host.driver_root, host.nvml_facts) as facts:
        gatherer = _Gatherer(host, facts)
        node: Dict[str, Fact] = {}
        if "driver" in keys:
            node["driver"] = gatherer.driver()
        if "cuda" in keys:
            node["cuda"] = gatherer.cuda()
        per_gpu: List[Tuple[str, Mapping[str, Fact]]] = []
        if any(k in GPU_KEYS for k in keys):
            for gpu in _unique_gpus(gpus):
                gpu_facts: Dict[str, Fact] = {}
                if "arch" in keys:
                    gpu_facts["arch"] = gatherer.arch(gpu)
                if "brand" in keys:
                    gpu_facts["brand"] = gatherer.brand(gpu)
                per_gpu.append((f"GPU {gpu.index}", gpu_facts))
    return Facts(node, tuple(per_gpu))


# -- evaluation -----------------------------------------------------------------------

_NO_GPU = Fact(None, "no GPU selected (arch and brand describe the container's GPUs)")


def _judge(
    requirement: Requirement, facts: Mapping[str, Fact]
) -> Tuple[Optional[bool], Optional[Tuple[Constraint, Fact]]]:
    """Three-valued: True, False, or None with the first constraint that could not be judged."""
    unknown: Optional[Tuple[Constraint, Fact]] = None
    for alternative in requirement.alternatives:
        verdict: Optional[bool] = True
        first: Optional[Tuple[Constraint, Fact]] = None
        for constraint in alternative:
            fact = facts.get(constraint.key, _NO_GPU)
            if fact.value is None:
                verdict = None
                first = first or (constraint, fact)
            elif not constraint.holds(fact.value):
                verdict = False
                break
        if verdict is True:
            return True, None
        if verdict is None and unknown is None:
            unknown = first
    if unknown is not None:
        return None, unknown
    return False, None


def _describe(keys: Sequence[str], facts: Mapping[str, Fact]) -> str:
    return ", ".join(
        f"{k} {facts[k].value if facts[k].value is not None else 'unknown'}"
        for k in keys
        if k in facts
    )


def evaluate_requirement(requirement: Requirement, facts: Facts) -> str:
    """Judge one requirement; the note when it holds, RequestError when not (or unknown).

    With ``arch``/``brand`` in it, it must hold for every selected GPU; with no GPU
    selected those constraints cannot be judged.
    """
    keys = requirement.keys
    node_keys = [k for k in keys if k not in GPU_KEYS]
    gpu_keys = [k for k in keys if k in GPU_KEYS]
    contexts: List[Tuple[Optional[str], Mapping[str, Fact]]]
    if gpu_keys and facts.gpus:
        contexts = [(label, {**facts.node, **gpu}) for label, gpu in facts.gpus]
    else:
        contexts = [(None, dict(facts.node))]

    failed: List[Tuple[Optional[str], Mapping[str, Fact]]] = []
    unknown: Optional[Tuple[Constraint, Fact]] = None
    for label, merged in contexts:
        verdict, why = _judge(requirement, merged)
        if verdict is False:
            failed.append((label, merged))
        elif verdict is None and unknown is None:
            unknown = why

    node_text = _describe(node_keys, facts.node)
    if failed:
        parts = [f"this node has {node_text}"] if node_text else []
        for label, merged in failed:
            if label is not None:
                parts.append(f"{label} has {_describe(gpu_keys, merged)}")
        if gpu_keys and not facts.gpus:
            parts.append("no GPU selected")
        raise RequestError(f"unsatisfied requirement {requirement.label}: {'; '.join(parts)}")
    if unknown is not None:
        constraint, fact = unknown
        raise RequestError(
            f'cannot check requirement "{constraint.text}" {requirement.where}: {fact.unknown}'
        )
    parts = [node_text] if node_text else []
    if gpu_keys:
        parts.extend(f"{label} {_describe(gpu_keys, gpu)}" for label, gpu in facts.gpus)
    return f"requirement {requirement.label} met: {'; '.join(parts)}"


# -- the entry point ------------------------------------------------------------------


def check_requirements(
    view: ImageView,
    host: Host,
    gpus: Sequence[Gpu],
    notes: List[str],
    disable_require: bool = False,
) -> None:
    """Raise RequestError when the container's requirements are unmet on this node.

    ``view`` is the request view create already parsed from config.json
    (:func:`nvshim.runtime.claim.image_view`); its env is the only input read here.
    ``gpus`` are the selected GPUs (a MIG device's parent counts). Appends one note per
    decision to ``notes``. A container without requirements reads nothing.
    """
    names = [name for name, _ in requirement_vars(view.env)]
    legacy = view.legacy_image
    if not names and not legacy:
        return
    listed = ", ".join(names + (["legacy CUDA image"] if legacy else []))
    disable_env = view.env.get(DISABLE_REQUIRE)
    disabled = go_bool(disable_env) if disable_env is not None else None
    if disabled:
        notes.append(f"{DISABLE_REQUIRE}={disable_env}: requirements not checked ({listed})")
        return
    if disable_require:
        notes.append(f"config disable-require: requirements not checked ({listed})")
        return
    if disable_env and disabled is None:
        notes.append(
            f'{DISABLE_REQUIRE}="{disable_env}" is not a boolean '
            "(1, t, true, 0, f, false as Go spells them): requirements checked"
        )

    requirements = collect_requirements(view.env, legacy)
    keys = tuple(k for k in KEYS if any(k in r.keys for r in requirements))
    facts = gather_facts(host, gpus, keys)
    for requirement in requirements:
        notes.append(evaluate_requirement(requirement, facts))
