"""NVIDIA_REQUIRE_* constraints: the grammar, versions and Go booleans.

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

Pure: parsing reads only the env given. :mod:`nvshim.runtime.requirements` gathers the
node's facts and judges these requirements against them.
"""

from __future__ import annotations

import re

from nvshim._record import dataclass
from nvshim.errors import HostError, RequestError

# typing stays off the create path: every CUDA image (CUDA_VERSION) reaches this module
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Mapping, Optional, Sequence, Tuple

__all__ = [
    "DISABLE_REQUIRE",
    "GPU_KEYS",
    "KEYS",
    "OPERATORS",
    "Constraint",
    "Requirement",
    "collect_requirements",
    "compare_versions",
    "go_bool",
    "legacy_requirement",
    "parse_requirement",
    "parse_version",
    "requirement_vars",
]

REQUIRE_PREFIX = "NVIDIA_REQUIRE_"
JETPACK_PREFIX = "NVIDIA_REQUIRE_JETPACK"
DISABLE_REQUIRE = "NVIDIA_DISABLE_REQUIRE"

#: The constraint keys; ``cuda``/``driver`` describe the node, ``arch``/``brand`` a GPU.
KEYS = ("cuda", "driver", "arch", "brand")
#: The keys that describe a GPU (judged per selected GPU).
GPU_KEYS = ("arch", "brand")

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
        if parsed is None:  # facts are validated when gathered: a host fact gone wrong
            raise HostError(f'the {self.key} of this node, "{actual}", is not a version')
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


def requirement_vars(env: Mapping[str, str]) -> List[Tuple[str, str]]:
    """The NVIDIA_REQUIRE_* variables with a non-blank value, by name."""
    return sorted(
        (name, value)
        for name, value in env.items()
        if name.startswith(REQUIRE_PREFIX) and not name.startswith(JETPACK_PREFIX) and value.strip()
    )


def collect_requirements(env: Mapping[str, str], legacy_image: bool) -> Tuple[Requirement, ...]:
    """Every requirement of a container: its NVIDIA_REQUIRE_* variables, by name, then the
    one a legacy CUDA image implies. Blank values require nothing. Pure."""
    found = [parse_requirement(name, value) for name, value in requirement_vars(env)]
    if legacy_image:
        found.append(legacy_requirement(env.get("CUDA_VERSION", "")))
    return tuple(found)
