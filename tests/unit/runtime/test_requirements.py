"""NVIDIA_REQUIRE_* constraints: grammar, version order, facts and verdicts.

Nodes are directory trees: a driver root with ``proc/driver/nvidia/version`` and an
``nvml-facts`` file (what NVML would say) that the :class:`nvshim.host.discovery.Host` is
given, as a config's ``nvml-facts`` key gives it.
GPU records are built directly (discovery of GPUs is tested elsewhere); one test builds a
full simulated node with :func:`nvshim.sim.build.create_node` when running as root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvshim.errors import HostError, RequestError
from nvshim.host.discovery import Gpu, Host
from nvshim.host.nvml import BRANDS
from nvshim.runtime.claim import ImageView, image_view
from nvshim.runtime.constraints import (
    OPERATORS,
    compare_versions,
    go_bool,
    parse_requirement,
    parse_version,
)
from nvshim.runtime.requirements import (
    Fact,
    Facts,
    check_requirements,
    evaluate_requirement,
)

REPO_ROOT = Path(__file__).resolve().parents[3]

# -- helpers ---------------------------------------------------------------------------


def make_gpus(count: int) -> Tuple[Gpu, ...]:
    return tuple(
        Gpu(
            index=i,
            minor=i,
            uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000",
            pci_bus_id=f"0000:{0x18 + i:02x}:00.0",
            model="NVIDIA Test GPU",
        )
        for i in range(count)
    )


def make_node(
    root: Path,
    *,
    driver: Optional[str] = "550.54.15",
    cuda: Any = "12.4",
    gpus: Sequence[Tuple[str, str]] = (("9.0", "nvidia"),),
    metadata: bool = True,
) -> Tuple[Host, Tuple[Gpu, ...]]:
    """A driver root whose GPUs have the given (compute capability, brand)."""
    records = make_gpus(len(gpus))
    if driver is not None:
        proc = root / "proc/driver/nvidia"
        proc.mkdir(parents=True)
        (proc / "version").write_text(
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver}  Tue Mar  5 2024\n"
        )
    if metadata:
        meta: Dict[str, Any] = {
            "format": 1,
            "gpus": [
                {
                    "minor": g.minor,
                    "uuid": g.uuid,
                    "brand": brand,
                    "compute_capability": cc,
                    "mig": [],
                }
                for g, (cc, brand) in zip(records, gpus, strict=True)
            ],
        }
        if cuda is not None:
            meta["cuda_version"] = cuda
        root.mkdir(parents=True, exist_ok=True)
        (root / "nvml-facts.json").write_text(json.dumps(meta))
    return Host(str(root), nvml_facts=str(root / "nvml-facts.json")), records


def spec_with(*env: str) -> Dict[str, Any]:
    return {"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin", *env]}}


def check(host: Host, gpus: Sequence[Gpu], *env: str, disable_require: bool = False) -> List[str]:
    notes: List[str] = []
    check_requirements(image_view(spec_with(*env)), host, gpus, notes, disable_require)
    return notes


@pytest.fixture
def node(tmp_path: Path) -> Tuple[Host, Tuple[Gpu, ...]]:
    """Driver 550.54.15, CUDA 12.4, one GPU of compute capability 9.0, brand nvidia."""
    return make_node(tmp_path / "node")


# -- grammar ---------------------------------------------------------------------------

VALID = [
    ("cuda=12.4", [[("cuda", "=", "12.4")]]),
    ("cuda!=12.4", [[("cuda", "!=", "12.4")]]),
    ("cuda<12.4", [[("cuda", "<", "12.4")]]),
    ("cuda<=12.4", [[("cuda", "<=", "12.4")]]),
    ("cuda>12.4", [[("cuda", ">", "12.4")]]),
    ("cuda>=12.4", [[("cuda", ">=", "12.4")]]),
    ("driver>=550.54.15", [[("driver", ">=", "550.54.15")]]),
    ("arch=8.0", [[("arch", "=", "8.0")]]),
    ("brand=tesla", [[("brand", "=", "tesla")]]),
    ("brand!=geforce", [[("brand", "!=", "geforce")]]),
    ("CUDA>=12", [[("cuda", ">=", "12")]]),
    ("Driver<551,DRIVER>=550", [[("driver", "<", "551"), ("driver", ">=", "550")]]),
    ("brand=Tesla", [[("brand", "=", "tesla")]]),
    ("cuda>=12.0 brand=tesla", [[("cuda", ">=", "12.0")], [("brand", "=", "tesla")]]),
    (
        "cuda>=12.4 brand=tesla,driver>=470,driver<471",
        [
            [("cuda", ">=", "12.4")],
            [("brand", "=", "tesla"), ("driver", ">=", "470"), ("driver", "<", "471")],
        ],
    ),
    ("  cuda>=12.0 \t  arch>=8.0  ", [[("cuda", ">=", "12.0")], [("arch", ">=", "8.0")]]),
    ("cuda>=012.04", [[("cuda", ">=", "012.04")]]),
]


@pytest.mark.parametrize("expression,expected", VALID)
def test_parse_valid(expression: str, expected: List[List[Tuple[str, str, str]]]) -> None:
    """Valid expressions parse into OR-ed alternatives of AND-ed (key, op, value) constraints."""
    req = parse_requirement("NVIDIA_REQUIRE_X", expression)
    got = [[(c.key, c.op, c.value) for c in alt] for alt in req.alternatives]
    assert got == expected


def test_operators_are_matched_longest_first() -> None:
    """Two-character operators come before their one-character prefixes."""
    for i, op in enumerate(OPERATORS):
        for later in OPERATORS[i + 1 :]:
            assert not later.startswith(op) or len(later) <= len(op)
    req = parse_requirement("NVIDIA_REQUIRE_X", "cuda<=12 cuda>=12 cuda!=12")
    assert [alt[0].op for alt in req.alternatives] == ["<=", ">=", "!="]


INVALID = [
    ("cuda~12", "cuda~12", "expected an operator"),
    ("foo>=1", "foo>=1", 'unknown key "foo"'),
    ("cudaa>=12", "cudaa>=12", 'unknown key "cudaa"'),
    (">=12", ">=12", "expected <key><operator><value>"),
    ("12.0", "12.0", "expected <key><operator><value>"),
    ("cuda", "cuda", "expected an operator"),
    ("cuda>=", "cuda>=", 'missing value after "cuda>="'),
    ("cuda>=12.x", "cuda>=12.x", '"12.x" is not a version'),
    ("cuda>=12.", "cuda>=12.", '"12." is not a version'),
    ("cuda>=.12", "cuda>=.12", '".12" is not a version'),
    ("cuda>=v12", "cuda>=v12", '"v12" is not a version'),
    ("cuda>=-1", "cuda>=-1", '"-1" is not a version'),
    ("cuda==12", "cuda==12", '"=12" is not a version'),
    ("cuda=>12", "cuda=>12", '">12" is not a version'),
    ("driver>=550.54.15a", "driver>=550.54.15a", "is not a version"),
    ("arch>=sm_80", "arch>=sm_80", '"sm_80" is not a version'),
    ("brand<tesla", "brand<tesla", 'compares with = or != only, not "<"'),
    ("brand>=tesla", "brand>=tesla", 'compares with = or != only, not ">="'),
    ("brand=te$la", "brand=te$la", "is not a brand name"),
    ("cuda>=12,", "cuda>=12,", "empty constraint"),
    (",cuda>=12", ",cuda>=12", "empty constraint"),
    ("cuda>=12,,driver>=1", "cuda>=12,,driver>=1", "empty constraint"),
    ("cuda>=12.0, driver>=500", "cuda>=12.0,", "empty constraint"),
    ("cuda>=12.0 brand=tesla,foo=1", "foo=1", 'unknown key "foo"'),
]


@pytest.mark.parametrize("expression,named,why", INVALID)
def test_parse_invalid(expression: str, named: str, why: str) -> None:
    """A malformed constraint is a RequestError naming the constraint, the variable and why."""
    with pytest.raises(RequestError) as info:
        parse_requirement("NVIDIA_REQUIRE_CUDA", expression)
    message = str(info.value)
    assert message.startswith(f'invalid requirement "{named}" in NVIDIA_REQUIRE_CUDA: ')
    assert why in message


# -- versions --------------------------------------------------------------------------

ORDER = [
    ("12.10", "12.9", 1),
    ("12.9", "12.10", -1),
    ("12", "12.0", 0),
    ("12.0.0", "12", 0),
    ("550.54.15", "550.54", 1),
    ("550.54", "550.54.15", -1),
    ("550.54.15", "550.54.14", 1),
    ("550.100", "550.54", 1),
    ("12.04", "12.4", 0),
    ("012", "12", 0),
    ("9.2", "10.0", -1),
    ("1.0.0.0", "1", 0),
    ("0", "0.0.1", -1),
]


@pytest.mark.parametrize("a,b,expected", ORDER)
def test_compare_versions(a: str, b: str, expected: int) -> None:
    """Versions order numerically per component; missing components count as 0."""
    pa, pb = parse_version(a), parse_version(b)
    assert pa is not None and pb is not None
    assert compare_versions(pa, pb) == expected


@pytest.mark.parametrize(
    "text", ["", ".", "12.", ".12", "12..4", "12.x", "v12", " 12", "12 ", "1e3"]
)
def test_parse_version_rejects_junk(text: str) -> None:
    """Anything but digits separated by single dots is not a version."""
    assert parse_version(text) is None


versions = st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=5)


@given(versions, versions)
def test_compare_versions_is_antisymmetric(a: List[int], b: List[int]) -> None:
    """compare(a, b) is the negation of compare(b, a), and 0 exactly when equal up to zeros."""
    assert compare_versions(a, b) == -compare_versions(b, a)
    assert (compare_versions(a, b) == 0) == (a + [0] * (5 - len(a)) == b + [0] * (5 - len(b)))


@given(versions, st.integers(min_value=0, max_value=3))
def test_trailing_zeros_do_not_matter(a: List[int], zeros: int) -> None:
    """Appending .0 components never changes a version's place in the order."""
    assert compare_versions(a, a + [0] * zeros) == 0
    text = ".".join(str(n) for n in a)
    assert parse_version(text) == tuple(a)


constraints = st.one_of(
    st.tuples(
        st.sampled_from(["cuda", "driver", "arch", "CUDA", "Driver"]),
        st.sampled_from(OPERATORS),
        versions.map(lambda v: ".".join(str(n) for n in v)),
    ),
    st.tuples(
        st.sampled_from(["brand", "BRAND"]),
        st.sampled_from(["=", "!="]),
        st.sampled_from(sorted(BRANDS.values())),
    ),
)


@given(st.lists(st.lists(constraints, min_size=1, max_size=4), min_size=1, max_size=4))
def test_parse_round_trip(alternatives: List[List[Tuple[str, str, str]]]) -> None:
    """Any well-formed expression parses back into exactly the constraints it was built from."""
    text = " ".join(",".join(f"{k}{o}{v}" for k, o, v in alt) for alt in alternatives)
    req = parse_requirement("NVIDIA_REQUIRE_X", text)
    got = [[(c.key, c.op, c.value) for c in alt] for alt in req.alternatives]
    assert got == [[(k.lower(), o, v.lower()) for k, o, v in alt] for alt in alternatives]


HOLDS = [
    ("cuda=12.4", True),
    ("cuda=12.4.0", True),
    ("cuda!=12.4", False),
    ("cuda<12.4", False),
    ("cuda<=12.4", True),
    ("cuda>12.4", False),
    ("cuda>=12.4", True),
    ("cuda>12.3", True),
    ("cuda<12.10", True),
    ("cuda>=12.10", False),
    ("cuda>=12", True),
    ("cuda<13", True),
]


@pytest.mark.parametrize("text,expected", HOLDS)
def test_operator_semantics(text: str, expected: bool) -> None:
    """Each operator compares the fact (cuda 12.4) with the constraint's version."""
    (constraint,) = parse_requirement("NVIDIA_REQUIRE_X", text).alternatives[0]
    assert constraint.holds("12.4") is expected


# -- Go booleans -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value,expected",
    [(v, True) for v in ("1", "t", "T", "TRUE", "true", "True")]
    + [(v, False) for v in ("0", "f", "F", "FALSE", "false", "False")]
    + [(v, None) for v in ("", "yes", "on", "tRUE", " true", "2")],
)
def test_go_bool(value: str, expected: Optional[bool]) -> None:
    """Only Go's strconv.ParseBool spellings are booleans."""
    assert go_bool(value) is expected


# -- verdicts on a node ----------------------------------------------------------------


def test_met_requirement_notes_the_fact(node: Tuple[Host, Tuple[Gpu, ...]]) -> None:
    """A met requirement leaves one note naming the variable and the node's value."""
    host, gpus = node
    notes = check(host, gpus, "NVIDIA_REQUIRE_CUDA=cuda>=12.0")
    assert notes == ['requirement NVIDIA_REQUIRE_CUDA="cuda>=12.0" met: cuda 12.4']


def test_unmet_requirement_names_var_expression_and_value(
    node: Tuple[Host, Tuple[Gpu, ...]],
) -> None:
    """An unmet requirement is a RequestError naming the variable, expression and actual value."""
    host, gpus = node
    with pytest.raises(RequestError) as info:
        check(host, gpus, "NVIDIA_REQUIRE_CUDA=cuda>=13.0")
    assert str(info.value) == (
        'unsatisfied requirement NVIDIA_REQUIRE_CUDA="cuda>=13.0": this node has cuda 12.4'
    )


def test_driver_version_comes_from_the_host(node: Tuple[Host, Tuple[Gpu, ...]]) -> None:
    """driver constraints compare the driver version the host reports, all three parts."""
    host, gpus = node
    notes = check(host, gpus, "NVIDIA_REQUIRE_DRIVER=driver>550.54,driver<550.54.16")
    assert notes == [
        'requirement NVIDIA_REQUIRE_DRIVER="driver>550.54,driver<550.54.16" met: driver 550.54.15'
    ]
    with pytest.raises(RequestError, match=r"this node has driver 550\.54\.15$"):
        check(host, gpus, "NVIDIA_REQUIRE_DRIVER=driver>=550.54.16")


def test_every_variable_must_hold(node: Tuple[Host, Tuple[Gpu, ...]]) -> None:
    """Requirements in different variables are AND-ed: one unmet variable fails the container."""
    host, gpus = node
    with pytest.raises(RequestError, match=r'NVIDIA_REQUIRE_B="driver>=560"'):
        check(host, gpus, "NVIDIA_REQUIRE_A=cuda>=12.0", "NVIDIA_REQUIRE_B=driver>=560")


def test_alternatives_are_or_ed(node: Tuple[Host, Tuple[Gpu, ...]]) -> None:
    """A CUDA-image style expression holds through a later alternative when the first fails."""
    host, gpus = node
    expr = "cuda>=12.6 brand=tesla,driver>=470,driver<471 brand=nvidia,driver>=550,driver<551"
    notes = check(host, gpus, f"NVIDIA_REQUIRE_CUDA={expr}")
    assert notes == [
        f'requirement NVIDIA_REQUIRE_CUDA="{expr}" met: cuda 12.4, driver 550.54.15; '
        "GPU 0 brand nvidia"
    ]


def test_constraints_in_an_alternative_are_and_ed(node: Tuple[Host, Tuple[Gpu, ...]]) -> None:
    """One false constraint makes its whole alternative false."""
    host, gpus = node
    with pytest.raises(RequestError, match="unsatisfied requirement"):
        check(host, gpus, "NVIDIA_REQUIRE_CUDA=cuda>=12.0,driver>=560")


def test_last_env_entry_wins(node: Tuple[Host, Tuple[Gpu, ...]]) -> None:
    """When a variable appears twice in process.env, its last value is the requirement."""
    host, gpus = node
    with pytest.raises(RequestError, match='"cuda>=13.0"'):
        check(host, gpus, "NVIDIA_REQUIRE_CUDA=cuda>=12.0", "NVIDIA_REQUIRE_CUDA=cuda>=13.0")
    assert check(host, gpus, "NVIDIA_REQUIRE_CUDA=cuda>=13.0", "NVIDIA_REQUIRE_CUDA=cuda>=12.0")


def test_malformed_requirement_is_an_error_before_facts(tmp_path: Path) -> None:
    """Syntax is checked first: a malformed value is reported even on a node without facts."""
    host = Host(str(tmp_path / "nothing-here"))
    with pytest.raises(RequestError, match=r'^invalid requirement "cuda~12" in NVIDIA_REQUIRE_'):
        check(host, (), "NVIDIA_REQUIRE_CUDA=cuda~12")


def test_blank_requirement_requires_nothing(tmp_path: Path) -> None:
    """An empty or all-blank NVIDIA_REQUIRE_* value is no requirement (and reads nothing)."""
    host = Host(str(tmp_path / "nothing-here"))
    assert check(host, (), "NVIDIA_REQUIRE_CUDA=", "NVIDIA_REQUIRE_X=   ") == []


@pytest.mark.parametrize(
    "env",
    [
        "NVIDIA_REQUIRE_JETPACK=csv-mode!!",
        "NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS=/usr/local/cuda",
        "NVIDIA_REQUIRE_JETPACKX=cuda>=99",
    ],
)
def test_jetpack_variables_are_ignored(tmp_path: Path, env: str) -> None:
    """NVIDIA_REQUIRE_JETPACK* are not requirements: never parsed, never checked."""
    host = Host(str(tmp_path / "nothing-here"))
    assert check(host, (), env) == []


def test_no_requirement_reads_nothing(tmp_path: Path) -> None:
    """A container without requirements needs no facts: a node with no driver is fine."""
    host = Host(str(tmp_path / "nothing-here"))
    assert check(host, make_gpus(1), "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_REQUIRE=x") == []


# -- legacy CUDA images ----------------------------------------------------------------


def test_checks_read_the_request_view_create_parsed(
    node: Tuple[Host, Tuple[Gpu, ...]],
) -> None:
    """check_requirements takes create's ImageView, not config.json: its env is the input."""
    host, gpus = node
    view = ImageView(
        env={"NVIDIA_REQUIRE_CUDA": "cuda>=12.0"}, mounts=(), annotations={}, privileged=False
    )
    notes: List[str] = []
    check_requirements(view, host, gpus, notes)
    assert notes == ['requirement NVIDIA_REQUIRE_CUDA="cuda>=12.0" met: cuda 12.4']
    with pytest.raises(RequestError, match="unsatisfied requirement"):
        check_requirements(
            ImageView(
                env={"NVIDIA_REQUIRE_CUDA": "cuda>=13"}, mounts=(), annotations={}, privileged=False
            ),
            host,
            gpus,
            [],
        )


def test_legacy_image_requires_its_cuda_major_minor(node: Tuple[Host, Tuple[Gpu, ...]]) -> None:
    """CUDA_VERSION without NVIDIA_REQUIRE_CUDA requires cuda>=<major.minor> of it."""
    host, gpus = node
    with pytest.raises(RequestError) as info:
        check(host, gpus, "CUDA_VERSION=12.6.1")
    assert str(info.value) == (
        'unsatisfied requirement cuda>=12.6 (legacy CUDA image, CUDA_VERSION="12.6.1"): '
        "this node has cuda 12.4"
    )
    assert check(host, gpus, "CUDA_VERSION=12.4.99") == [
        'requirement cuda>=12.4 (legacy CUDA image, CUDA_VERSION="12.4.99") met: cuda 12.4'
    ]
    assert check(host, gpus, "CUDA_VERSION=12")[0].startswith("requirement cuda>=12.0 ")


def test_nvidia_require_cuda_replaces_the_legacy_requirement(
    node: Tuple[Host, Tuple[Gpu, ...]],
) -> None:
    """With NVIDIA_REQUIRE_CUDA set, CUDA_VERSION adds nothing (the image is not legacy)."""
    host, gpus = node
    notes = check(host, gpus, "CUDA_VERSION=12.6.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.0")
    assert notes == ['requirement NVIDIA_REQUIRE_CUDA="cuda>=12.0" met: cuda 12.4']


def test_legacy_image_adds_to_other_requirements(node: Tuple[Host, Tuple[Gpu, ...]]) -> None:
    """A legacy image's implied requirement is checked besides other NVIDIA_REQUIRE_* vars."""
    host, gpus = node
    notes = check(host, gpus, "CUDA_VERSION=11.8.0", "NVIDIA_REQUIRE_DRIVER=driver>=500")
    assert notes == [
        'requirement NVIDIA_REQUIRE_DRIVER="driver>=500" met: driver 550.54.15',
        'requirement cuda>=11.8 (legacy CUDA image, CUDA_VERSION="11.8.0") met: cuda 12.4',
    ]


@pytest.mark.parametrize("value", ["abc", "12.x", "12.4.1.7", "v12.4"])
def test_legacy_image_with_junk_cuda_version(
    node: Tuple[Host, Tuple[Gpu, ...]], value: str
) -> None:
    """A legacy image whose CUDA_VERSION is not a version is an error naming it."""
    host, gpus = node
    with pytest.raises(RequestError, match=f'^invalid CUDA_VERSION "{value}" of a legacy'):
        check(host, gpus, f"CUDA_VERSION={value}")


# -- disabling -------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["1", "t", "T", "TRUE", "true", "True"])
def test_disable_require_env_true(node: Tuple[Host, Tuple[Gpu, ...]], value: str) -> None:
    """NVIDIA_DISABLE_REQUIRE set to any Go true spelling skips all checks, even malformed ones."""
    host, gpus = node
    notes = check(
        host,
        gpus,
        f"NVIDIA_DISABLE_REQUIRE={value}",
        "NVIDIA_REQUIRE_CUDA=cuda>=99",
        "NVIDIA_REQUIRE_X=cuda~12",
    )
    assert notes == [
        f"NVIDIA_DISABLE_REQUIRE={value}: requirements not checked "
        "(NVIDIA_REQUIRE_CUDA, NVIDIA_REQUIRE_X)"
    ]


@pytest.mark.parametrize("value", ["0", "f", "F", "FALSE", "false", "False", ""])
def test_disable_require_env_false(node: Tuple[Host, Tuple[Gpu, ...]], value: str) -> None:
    """Go false spellings (and an empty value) leave the checks on."""
    host, gpus = node
    with pytest.raises(RequestError, match="unsatisfied requirement"):
        check(host, gpus, f"NVIDIA_DISABLE_REQUIRE={value}", "NVIDIA_REQUIRE_CUDA=cuda>=99")


@pytest.mark.parametrize("value", ["yes", "on", "tRuE", " 1"])
def test_disable_require_env_not_a_bool(node: Tuple[Host, Tuple[Gpu, ...]], value: str) -> None:
    """A value Go cannot parse as a bool counts as false (checks stay on), with a note."""
    host, gpus = node
    notes = check(host, gpus, f"NVIDIA_DISABLE_REQUIRE={value}", "NVIDIA_REQUIRE_CUDA=cuda>=12")
    assert notes[0].startswith(f'NVIDIA_DISABLE_REQUIRE="{value}" is not a boolean')
    assert notes[1] == 'requirement NVIDIA_REQUIRE_CUDA="cuda>=12" met: cuda 12.4'
    with pytest.raises(RequestError, match="unsatisfied requirement"):
        check(host, gpus, f"NVIDIA_DISABLE_REQUIRE={value}", "NVIDIA_REQUIRE_CUDA=cuda>=99")


def test_disable_require_config(node: Tuple[Host, Tuple[Gpu, ...]]) -> None:
    """The config key disable-require skips all checks, the legacy one included."""
    host, gpus = node
    notes = check(
        host, gpus, "NVIDIA_REQUIRE_CUDA=cuda>=99", "CUDA_VERSION=99.0", disable_require=True
    )
    assert notes == ["config disable-require: requirements not checked (NVIDIA_REQUIRE_CUDA)"]
    notes = check(host, gpus, "CUDA_VERSION=99.0", disable_require=True)
    assert notes == ["config disable-require: requirements not checked (legacy CUDA image)"]


# -- unknown facts ---------------------------------------------------------------------


def test_arch_without_gpu_cannot_be_checked(node: Tuple[Host, Tuple[Gpu, ...]]) -> None:
    """With no GPU selected (``none``), an arch constraint is reported, not passed."""
    host, _ = node
    with pytest.raises(RequestError) as info:
        check(host, (), "NVIDIA_REQUIRE_ARCH=arch>=8.0")
    assert str(info.value).startswith(
        'cannot check requirement "arch>=8.0" in NVIDIA_REQUIRE_ARCH: no GPU selected'
    )


def test_unknown_branch_is_fine_when_another_alternative_holds(
    node: Tuple[Host, Tuple[Gpu, ...]],
) -> None:
    """An alternative that cannot be judged does not matter when another one holds."""
    host, _ = node
    notes = check(host, (), "NVIDIA_REQUIRE_CUDA=arch>=8.0 cuda>=12.0")
    assert notes == ['requirement NVIDIA_REQUIRE_CUDA="arch>=8.0 cuda>=12.0" met: cuda 12.4']


def test_false_constraint_beats_unknown_one(node: Tuple[Host, Tuple[Gpu, ...]]) -> None:
    """An alternative with a false constraint is false even if another one cannot be judged."""
    host, _ = node
    with pytest.raises(RequestError) as info:
        check(host, (), "NVIDIA_REQUIRE_CUDA=brand=tesla,cuda>=13")
    assert str(info.value) == (
        'unsatisfied requirement NVIDIA_REQUIRE_CUDA="brand=tesla,cuda>=13": '
        "this node has cuda 12.4; no GPU selected"
    )


def test_cuda_unknown_without_metadata(tmp_path: Path) -> None:
    """Without NVML (driver root is not /) and without metadata, cuda constraints are errors."""
    host, gpus = make_node(tmp_path / "n", metadata=False)
    with pytest.raises(RequestError) as info:
        check(host, gpus, "NVIDIA_REQUIRE_CUDA=cuda>=12.0")
    message = str(info.value)
    assert message.startswith(
        'cannot check requirement "cuda>=12.0" in NVIDIA_REQUIRE_CUDA: '
        "the CUDA version of this node is unknown (no NVML"
    )
    assert f"no nvml-facts file at {tmp_path / 'n'}/nvml-facts.json" in message
    # driver constraints still work: the version comes from procfs
    assert check(host, gpus, "NVIDIA_REQUIRE_D=driver>=550")


def test_cuda_unknown_when_metadata_lacks_it(tmp_path: Path) -> None:
    """Metadata without cuda_version leaves the CUDA version unknown, said so in the error."""
    host, gpus = make_node(tmp_path / "n", cuda=None)
    with pytest.raises(RequestError, match="has no cuda_version"):
        check(host, gpus, "NVIDIA_REQUIRE_CUDA=cuda>=12.0")


def test_junk_cuda_version_in_metadata(tmp_path: Path) -> None:
    """A metadata cuda_version that is not a version makes the fact unknown, naming the value."""
    host, gpus = make_node(tmp_path / "n", cuda="twelve")
    with pytest.raises(RequestError, match='is "twelve", not a version'):
        check(host, gpus, "NVIDIA_REQUIRE_CUDA=cuda>=12.0")


def test_driver_unknown(tmp_path: Path) -> None:
    """A node with no driver version makes driver constraints errors naming the driver root."""
    host, gpus = make_node(tmp_path / "n", driver=None)
    with pytest.raises(RequestError) as info:
        check(host, gpus, "NVIDIA_REQUIRE_D=driver>=550")
    assert str(info.value).startswith(
        'cannot check requirement "driver>=550" in NVIDIA_REQUIRE_D: '
        "the driver version of this node is unknown (cannot find the NVIDIA driver version"
    )


def test_gpu_missing_from_metadata(tmp_path: Path) -> None:
    """A selected GPU the metadata does not list has unknown arch and brand."""
    host, _ = make_node(tmp_path / "n")
    stranger = Gpu(3, 3, "GPU-deadbeef-0000-0000-0000-000000000000", "0000:99:00.0", "X")
    with pytest.raises(RequestError, match="does not list GPU-deadbeef"):
        check(host, (stranger,), "NVIDIA_REQUIRE_ARCH=arch>=8.0")


def test_corrupt_metadata_is_a_host_error(tmp_path: Path) -> None:
    """An nvml-facts file that is not JSON is a HostError naming the file."""
    host, gpus = make_node(tmp_path / "n")
    (tmp_path / "n/nvml-facts.json").write_text("{not json")
    with pytest.raises(HostError, match="nvml-facts.json: not valid JSON"):
        check(host, gpus, "NVIDIA_REQUIRE_CUDA=cuda>=12.0")


# -- brand and arch --------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression,met",
    [
        ("brand=nvidia", True),
        ("brand=NVIDIA", True),
        ("BRAND=Nvidia", True),
        ("brand!=nvidia", False),
        ("brand=tesla", False),
        ("brand!=tesla", True),
    ],
)
def test_brand_operators(node: Tuple[Host, Tuple[Gpu, ...]], expression: str, met: bool) -> None:
    """Brands compare case-insensitively with = and !=."""
    host, gpus = node
    if met:
        assert check(host, gpus, f"NVIDIA_REQUIRE_B={expression}")
    else:
        with pytest.raises(RequestError, match=r"GPU 0 has brand nvidia$"):
            check(host, gpus, f"NVIDIA_REQUIRE_B={expression}")


def test_brand_from_metadata_is_case_insensitive(tmp_path: Path) -> None:
    """A brand written in mixed case in the metadata still matches a lower-case constraint."""
    host, gpus = make_node(tmp_path / "n", gpus=[("7.5", "Tesla")])
    assert check(host, gpus, "NVIDIA_REQUIRE_B=brand=tesla") == [
        'requirement NVIDIA_REQUIRE_B="brand=tesla" met: GPU 0 brand tesla'
    ]


@pytest.fixture
def mixed(tmp_path: Path) -> Tuple[Host, Tuple[Gpu, ...]]:
    """Two GPUs: GPU 0 compute capability 8.0 (tesla), GPU 1 9.0 (nvidia)."""
    return make_node(tmp_path / "mixed", gpus=[("8.0", "tesla"), ("9.0", "nvidia")])


def test_arch_must_hold_for_every_selected_gpu(mixed: Tuple[Host, Tuple[Gpu, ...]]) -> None:
    """arch is checked on each selected GPU; the error names only the GPUs that fail."""
    host, gpus = mixed
    assert check(host, gpus, "NVIDIA_REQUIRE_ARCH=arch>=8.0") == [
        'requirement NVIDIA_REQUIRE_ARCH="arch>=8.0" met: GPU 0 arch 8.0; GPU 1 arch 9.0'
    ]
    with pytest.raises(RequestError) as info:
        check(host, gpus, "NVIDIA_REQUIRE_ARCH=arch>=9.0")
    assert str(info.value) == (
        'unsatisfied requirement NVIDIA_REQUIRE_ARCH="arch>=9.0": GPU 0 has arch 8.0'
    )


def test_arch_only_counts_selected_gpus(mixed: Tuple[Host, Tuple[Gpu, ...]]) -> None:
    """A GPU that is not selected does not take part in the verdict."""
    host, gpus = mixed
    assert check(host, gpus[1:], "NVIDIA_REQUIRE_ARCH=arch>=9.0") == [
        'requirement NVIDIA_REQUIRE_ARCH="arch>=9.0" met: GPU 1 arch 9.0'
    ]


def test_each_gpu_may_meet_a_different_alternative(mixed: Tuple[Host, Tuple[Gpu, ...]]) -> None:
    """Per GPU evaluation: mixed GPUs pass when each meets some alternative."""
    host, gpus = mixed
    notes = check(host, gpus, "NVIDIA_REQUIRE_X=brand=tesla,arch=8.0 brand=nvidia,arch>=9.0")
    assert notes == [
        'requirement NVIDIA_REQUIRE_X="brand=tesla,arch=8.0 brand=nvidia,arch>=9.0" met: '
        "GPU 0 arch 8.0, brand tesla; GPU 1 arch 9.0, brand nvidia"
    ]


def test_gpu_listed_twice_is_checked_once(mixed: Tuple[Host, Tuple[Gpu, ...]]) -> None:
    """A GPU passed twice (a MIG device's parent and the GPU itself) appears once."""
    host, gpus = mixed
    notes = check(host, (gpus[1], gpus[1]), "NVIDIA_REQUIRE_ARCH=arch>=9.0")
    assert notes == ['requirement NVIDIA_REQUIRE_ARCH="arch>=9.0" met: GPU 1 arch 9.0']


def test_evaluate_requirement_on_plain_facts() -> None:
    """The verdict is a pure function of the facts given."""
    req = parse_requirement("NVIDIA_REQUIRE_CUDA", "cuda>=12.0,driver>=550")
    facts = Facts({"cuda": Fact("12.10"), "driver": Fact("550.54.15")})
    assert evaluate_requirement(req, facts).endswith("met: cuda 12.10, driver 550.54.15")
    with pytest.raises(RequestError, match=r"this node has cuda 11\.8, driver 550\.54\.15$"):
        evaluate_requirement(req, Facts({"cuda": Fact("11.8"), "driver": Fact("550.54.15")}))


# -- the real simulated node and laziness ------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="nvshim.sim.build.create_node needs root for mknod")
def test_simulated_node_metadata(tmp_path: Path) -> None:
    """Facts come from the metadata nvshim.sim.build writes, for GPUs found by discovery."""
    sim = pytest.importorskip("nvshim.sim.build")
    root = tmp_path / "node"
    sim.create_node(str(root), gpus=2, cuda_version="12.4", model="NVIDIA A100-SXM4-80GB")
    host = Host(str(root), nvml_facts=str(root / "nvml-facts.json"))
    gpus = host.gpus()
    notes = check(host, gpus, "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=nvidia,arch>=8.0,driver>=550")
    assert notes == [
        'requirement NVIDIA_REQUIRE_CUDA="cuda>=12.4 brand=nvidia,arch>=8.0,driver>=550" met: '
        "cuda 12.4, driver 550.54.15; GPU 0 arch 8.0, brand nvidia; GPU 1 arch 8.0, brand nvidia"
    ]
    with pytest.raises(RequestError, match="GPU 0 has arch 8.0; GPU 1 has arch 8.0$"):
        check(host, gpus, "NVIDIA_REQUIRE_ARCH=arch>=9.0")


_PROBE = """
import json, sys
from nvshim.host.discovery import Host
from nvshim.runtime.claim import ImageView, image_view
from nvshim.runtime.requirements import check_requirements
notes = []
env = json.loads(sys.argv[2])
spec = {"process": {"env": env}}
try:
    check_requirements(image_view(spec), Host(sys.argv[1]), (), notes)
    outcome = "ok"
except Exception as exc:
    outcome = type(exc).__name__ + ": " + str(exc)
print(json.dumps({"pynvml": "pynvml" in sys.modules, "outcome": outcome, "notes": notes}))
"""


def _probe(driver_root: str, env: List[str]) -> Dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, driver_root, json.dumps(env)],
        cwd=str(REPO_ROOT),
        capture_output=True,
        text=True,
        check=True,
    )
    result: Dict[str, Any] = json.loads(done.stdout)
    return result


def test_no_requirement_imports_no_pynvml() -> None:
    """Checking a container without requirements does not import pynvml, even on driver root /."""
    result = _probe("/", ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"])
    assert result == {"pynvml": False, "outcome": "ok", "notes": []}


def test_driver_requirement_imports_no_pynvml(tmp_path: Path) -> None:
    """A driver-only requirement needs no NVML: pynvml stays unimported."""
    make_node(tmp_path / "n")
    result = _probe(str(tmp_path / "n"), ["NVIDIA_REQUIRE_D=driver>=550"])
    assert result["pynvml"] is False
    assert result["outcome"] == "ok"


@pytest.mark.skipif(
    os.path.exists("/proc/driver/nvidia/version"), reason="this host has an NVIDIA driver"
)
def test_real_root_without_nvml_says_why() -> None:
    """On driver root / without a loadable NVML, a cuda constraint reports the NVML failure."""
    result = _probe("/", ["NVIDIA_REQUIRE_CUDA=cuda>=12.0"])
    assert result["outcome"].startswith(
        'RequestError: cannot check requirement "cuda>=12.0" in NVIDIA_REQUIRE_CUDA: '
        "the CUDA version of this node is unknown (no NVML: "
    )
    assert "no nvml-facts file configured" in result["outcome"]


def test_a_fact_that_is_not_a_version_is_a_host_error() -> None:
    """Facts are checked when gathered; one that still is not a version is the host's
    fault, reported as a HostError (never a bare ValueError)."""
    constraint = parse_requirement("NVIDIA_REQUIRE_CUDA", "cuda>=12.0").alternatives[0][0]
    with pytest.raises(HostError, match='^the cuda of this node, "twelve", is not a version$'):
        constraint.holds("twelve")
