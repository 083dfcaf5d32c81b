"""NVIDIA_REQUIRE_* constraints: the grammar, the node's facts, and the verdict.

An image says what it needs from the node in ``NVIDIA_REQUIRE_<anything>`` variables
(``NVIDIA_REQUIRE_JETPACK*`` excepted: those describe Jetson boards). Every variable must
hold. One variable's value is an expression::

    expression  := alternative ( whitespace+ alternative )*     any one must hold (OR)
    alternative := constraint ( "," constraint )*                all must hold (AND)
    constraint  := key op value
    key         := cuda | driver | arch | brand                  (any letter case)
    op          := "=" | "!=" | "<" | "<=" | ">" | ">="          (longest match first)

``cuda`` is the newest CUDA version the driver supports, ``driver`` the driver version,
``arch`` the compute capability (``8.0``) and ``brand`` the product brand (``tesla``,
``geforce``, ``nvidia`` …, compared case-insensitively, with ``=`` and ``!=`` only) of a
GPU. Versions compare numerically component by component, missing components count as 0:
``12.10 > 12.9``, ``12 == 12.0``, ``550.54.15 > 550.54``, ``12.04 == 12.4``.

Where this is stricter than the reference (libnvidia-container), on purpose:

* an empty constraint (``cuda>=12.0,`` or ``a,,b``) is an error, not skipped — it is
  almost always ``a, b`` written with a space, which silently turns AND into OR;
* a value that is not a version (``12.x``), an unknown key, a missing operator or ``<`` on
  a brand is an error naming the constraint and the variable;
* a constraint whose fact is unknown (no NVML and no ``nvml-facts`` file, or ``arch``
  with no GPU selected) is reported, never passed — unless another alternative holds.

``arch`` and ``brand`` describe GPUs: the expression is evaluated once per selected GPU and
must hold for each (a node of mixed GPUs can meet it through different alternatives).

A legacy CUDA image (``CUDA_VERSION`` set, ``NVIDIA_REQUIRE_CUDA`` empty) requires
``cuda>=<major>.<minor>`` of its ``CUDA_VERSION``. ``NVIDIA_DISABLE_REQUIRE`` set to a Go
boolean true (``1 t T TRUE true True``) or the config key ``disable-require`` turns all
checks off; any other value (``yes``, ``on`` …) is not a Go boolean, so — as in the
reference, whose ``strconv.ParseBool`` fails on it — the checks stay on (with a note).

Facts: the driver version always comes from :meth:`Host.driver_version`; the CUDA version,
compute capability and brand are facts only NVML knows, asked through
:class:`nvshim.host.nvml.NvmlFacts` (NVML on a real node, else the configured
``nvml-facts`` file). Nothing is read, and pynvml is not imported, unless a requirement
exists and needs that fact.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

from nvshim._record import dataclass, field
from nvshim.errors import HostError, RequestError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from nvshim.host.discovery import Gpu, Host
    from nvshim.host.nvml import NvmlFacts
    from nvshim.runtime.request import ImageView

__all__ = [
    "KEYS",
    "OPERATORS",
    "Constraint",
    "Requirement",
    "Fact",
    "Facts",
    "check_requirements",
    "collect_requirements",
    "parse_requirement",
    "parse_version",
    "compare_versions",
    "legacy_requirement",
    "go_bool",
    "gather_facts",
    "evaluate_requirement",
]

REQUIRE_PREFIX = "NVIDIA_REQUIRE_"
JETPACK_PREFIX = "NVIDIA_REQUIRE_JETPACK"
DISABLE_REQUIRE = "NVIDIA_DISABLE_REQUIRE"

#: The constraint keys; ``cuda``/``driver`` describe the node, ``arch``/``brand`` a GPU.
KEYS = ("cuda", "driver", "arch", "brand")
_GPU_KEYS = ("arch", "brand")
_VERSION_KEYS = ("cuda", "driver", "arch")

#: Operators, longest first so that ``<=`` is never read as ``<`` followed by ``=1``.
OPERATORS = ("<=", ">=", "!=", "<", ">", "=")

_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})

_VERSION = re.compile(r"^[0-9]+(?:\.[0-9]+)*$")
_KEY = re.compile(r"^[A-Za-z]*")
_BRAND = re.compile(r"^[A-Za-z0-9_-]+$")
_CUDA_VERSION = re.compile(r"^([0-9]+)(?:\.([0-9]+)(?:\.([0-9]+))?)?$")

_EXPECTED_VERSION = "expected numbers separated by dots, e.g. 12.4"


# -- versions -------------------------------------------------------------------------


def parse_version(text: str) -> Optional[Tuple[int, ...]]:
    """``"12.4"`` → ``(12, 4)``; None when ``text`` is not dot-separated digits."""
    if not _VERSION.match(text):
        return None
    return tuple(int(part) for part in text.split("."))


def compare_versions(a: Sequence[int], b: Sequence[int]) -> int:
    """-1, 0 or 1 as ``a`` is older, equal or newer; missing components count as 0."""
    width = max(len(a), len(b))
    left = tuple(a) + (0,) * (width - len(a))
    right = tuple(b) + (0,) * (width - len(b))
    return (left > right) - (left < right)


def go_bool(value: str) -> Optional[bool]:
    """Go's ``strconv.ParseBool``: True/False for its spellings, None for anything else."""
    if value in _GO_TRUE:
        return True
    if value in _GO_FALSE:
        return False
    return None


# -- grammar --------------------------------------------------------------------------


@dataclass(frozen=True)
class Constraint:
    """One ``<key><op><value>``; ``value`` is lower-case for brands, ``version`` parsed."""

    text: str
    key: str
    op: str
    value: str
    version: Tuple[int, ...] = ()

    def holds(self, actual: str) -> bool:
        """Whether the fact ``actual`` (a version, or a brand name) satisfies this."""
        if self.key == "brand":
            same = actual.lower() == self.value
            return same if self.op == "=" else not same
        parsed = parse_version(actual)
        if parsed is None:  # facts are validated when gathered; this is a programming error
            raise ValueError(f"{self.key} fact {actual!r} is not a version")
        order = compare_versions(parsed, self.version)
        return {
            "=": order == 0,
            "!=": order != 0,
            "<": order < 0,
            "<=": order <= 0,
            ">": order > 0,
            ">=": order >= 0,
        }[self.op]


@dataclass(frozen=True)
class Requirement:
    """One variable's expression: alternatives (OR) of constraint tuples (AND)."""

    name: str
    expression: str
    alternatives: Tuple[Tuple[Constraint, ...], ...]
    legacy_cuda_version: Optional[str] = None
    """Set for the requirement a legacy CUDA image implies: its CUDA_VERSION."""

    @property
    def keys(self) -> Tuple[str, ...]:
        used = {c.key for alt in self.alternatives for c in alt}
        return tuple(k for k in KEYS if k in used)

    @property
    def label(self) -> str:
        """How messages name this requirement."""
        if self.legacy_cuda_version is not None:
            return (
                f'{self.expression} (legacy CUDA image, CUDA_VERSION="{self.legacy_cuda_version}")'
            )
        return f'{self.name}="{self.expression}"'

    @property
    def where(self) -> str:
        if self.legacy_cuda_version is not None:
            return f'of the legacy CUDA image (CUDA_VERSION="{self.legacy_cuda_version}")'
        return f"in {self.name}"


def _invalid(text: str, name: str, why: str) -> RequestError:
    return RequestError(f'invalid requirement "{text}" in {name}: {why}')


def _parse_constraint(text: str, name: str) -> Constraint:
    written_key = _KEY.match(text).group(0)  # type: ignore[union-attr]  # `*` always matches
    key = written_key.lower()
    if not key:
        raise _invalid(text, name, "expected <key><operator><value>, e.g. cuda>=12.0")
    if key not in KEYS:
        raise _invalid(
            text, name, f'unknown key "{written_key}" (expected cuda, driver, arch or brand)'
        )
    rest = text[len(key) :]
    op = next((o for o in OPERATORS if rest.startswith(o)), None)
    if op is None:
        raise _invalid(
            text, name, f'expected an operator (=, !=, <, <=, >, >=) after "{written_key}"'
        )
    value = rest[len(op) :]
    if not value:
        raise _invalid(text, name, f'missing value after "{written_key}{op}"')
    if key == "brand":
        if op not in ("=", "!="):
            raise _invalid(text, name, f'a brand compares with = or != only, not "{op}"')
        if not _BRAND.match(value):
            raise _invalid(text, name, f'"{value}" is not a brand name (letters and digits)')
        return Constraint(text, key, op, value.lower())
    version = parse_version(value)
    if version is None:
        raise _invalid(text, name, f'"{value}" is not a version ({_EXPECTED_VERSION})')
    return Constraint(text, key, op, value, version)


def parse_requirement(name: str, expression: str) -> Requirement:
    """Parse one variable's value; RequestError names the bad constraint and ``name``.

    Alternatives are separated by any run of whitespace; constraints by ``,``.
    """
    alternatives: List[Tuple[Constraint, ...]] = []
    for alternative in expression.split():
        constraints = []
        for piece in alternative.split(","):
            if not piece:
                raise _invalid(
                    alternative,
                    name,
                    'empty constraint (join constraints with "," and no space; '
                    "a space separates alternatives)",
                )
            constraints.append(_parse_constraint(piece, name))
        alternatives.append(tuple(constraints))
    return Requirement(name, " ".join(expression.split()), tuple(alternatives))


def legacy_requirement(cuda_version: str) -> Requirement:
    """``cuda>=<major>.<minor>`` for a legacy CUDA image with this ``CUDA_VERSION``."""
    match = _CUDA_VERSION.match(cuda_version.strip())
    if match is None:
        raise RequestError(
            f'invalid CUDA_VERSION "{cuda_version}" of a legacy CUDA image: '
            "expected <major>[.<minor>[.<patch>]]"
        )
    major, minor = int(match.group(1)), int(match.group(2) or 0)
    text = f"cuda>={major}.{minor}"
    constraint = Constraint(text, "cuda", ">=", f"{major}.{minor}", (major, minor))
    return Requirement("CUDA_VERSION", text, ((constraint,),), legacy_cuda_version=cuda_version)


def _requirement_vars(env: Mapping[str, str]) -> List[Tuple[str, str]]:
    """The NVIDIA_REQUIRE_* variables with a non-blank value, by name."""
    return sorted(
        (name, value)
        for name, value in env.items()
        if name.startswith(REQUIRE_PREFIX)
        and not name.startswith(JETPACK_PREFIX)
        and value.strip()
    )


def collect_requirements(env: Mapping[str, str], legacy_image: bool) -> Tuple[Requirement, ...]:
    """Every requirement of a container: its NVIDIA_REQUIRE_* variables, by name, then the
    one a legacy CUDA image implies. Blank values require nothing. Pure."""
    found = [parse_requirement(name, value) for name, value in _requirement_vars(env)]
    if legacy_image:
        found.append(legacy_requirement(env.get("CUDA_VERSION", "")))
    return tuple(found)


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
        if any(k in _GPU_KEYS for k in keys):
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
    node_keys = [k for k in keys if k not in _GPU_KEYS]
    gpu_keys = [k for k in keys if k in _GPU_KEYS]
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
    (:func:`nvshim.runtime.request.image_view`); its env is the only input read here.
    ``gpus`` are the selected GPUs (a MIG device's parent counts). Appends one note per
    decision to ``notes``. A container without requirements reads nothing.
    """
    names = [name for name, _ in _requirement_vars(view.env)]
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
