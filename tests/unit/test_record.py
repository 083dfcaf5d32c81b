"""nvshim._record against dataclasses: the same classes built by both, the same probes.

Every probe runs on a class set built with ``dataclasses`` and on the same set built with
``nvshim._record``; the outcome (a value, or the name of the exception raised) must be the
same. The differences ``_record``'s docstring lists are pinned below as differences, so a
change that closes one (or opens a new one) shows up here and in that list together.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any, Callable, ClassVar, Dict, List, Tuple

import pytest

from nvshim import _record


def build(lib: Any) -> SimpleNamespace:
    """The probes' classes, decorated by ``lib`` (``dataclasses`` or ``nvshim._record``).

    Each class is decorated after its ``__qualname__`` is set to its ``__name__``: both
    libraries then name it the same way in ``repr`` (see test_repr_names_the_class_by_name).
    """

    def deco(cls: Any, **kwargs: Any) -> Any:
        cls.__qualname__ = cls.__name__
        return lib.dataclass(cls, **kwargs) if kwargs else lib.dataclass(cls)

    class Point:
        x: int
        y: int = 0

    class Frozen:
        x: int
        tags: List[str] = lib.field(default_factory=list)
        note: str = lib.field(default="", compare=False, repr=False)

    class Kind:
        name: str
        limit: ClassVar[int] = 3

    class Base:
        a: int
        b: str = "b"

    class Post:
        x: int
        doubled: int = 0

        def __post_init__(self) -> None:
            object.__setattr__(self, "doubled", self.x * 2)

    class Shown:
        x: int

        def __repr__(self) -> str:
            return "shown"

    class Hashed:
        x: int

        def __hash__(self) -> int:
            return 7

    point = deco(Point)
    frozen = deco(Frozen, frozen=True)
    base = deco(Base, frozen=True)

    class Child(base):  # type: ignore[misc,valid-type]
        c: int = 1
        b: str = "override"

    return SimpleNamespace(
        Point=point,
        Frozen=frozen,
        Kind=deco(Kind, frozen=True),
        Base=base,
        Child=deco(Child, frozen=True),
        Post=deco(Post, frozen=True),
        Shown=deco(Shown),
        Hashed=deco(Hashed),
        lib=lib,
    )


DC = build(dataclasses)
REC = build(_record)


def outcome(probe: Callable[[SimpleNamespace], Any], ns: SimpleNamespace) -> Tuple[str, Any]:
    try:
        return "ok", probe(ns)
    except Exception as exc:  # noqa: BLE001 - the exception's kind is the outcome
        return "raises", type(exc).__name__


def _frozen_set(ns: SimpleNamespace) -> None:
    ns.Frozen(1).x = 2


def _frozen_del(ns: SimpleNamespace) -> None:
    del ns.Frozen(1).x


def _factory_fresh(ns: SimpleNamespace) -> bool:
    a, b = ns.Frozen(1), ns.Frozen(1)
    return a.tags is not b.tags and a.tags == []


def _post_sees_replace(ns: SimpleNamespace) -> Any:
    return ns.lib.replace(ns.Post(2), x=5).doubled


def _mutable_assign(ns: SimpleNamespace) -> Any:
    p = ns.Point(1)
    p.x = 9
    return p


PROBES: Dict[str, Callable[[SimpleNamespace], Any]] = {
    "positional": lambda ns: (ns.Point(1, 2).x, ns.Point(1, 2).y),
    "keyword": lambda ns: (ns.Point(y=2, x=1).x, ns.Point(y=2, x=1).y),
    "default": lambda ns: ns.Point(1).y,
    "mixed": lambda ns: ns.Point(1, y=3).y,
    "missing argument": lambda ns: ns.Point(),
    "too many arguments": lambda ns: ns.Point(1, 2, 3),
    "unexpected keyword": lambda ns: ns.Point(1, z=2),
    "argument given twice": lambda ns: ns.Point(1, x=2),
    "eq same values": lambda ns: ns.Point(1, 2) == ns.Point(1, 2),
    "eq other values": lambda ns: ns.Point(1, 2) == ns.Point(1, 3),
    "eq other class": lambda ns: ns.Point(1, 0) == ns.Shown(1),
    "eq other type": lambda ns: ns.Point(1) == (1, 0),
    "ne": lambda ns: ns.Point(1) != ns.Point(2),
    "eq ignores compare=False": lambda ns: ns.Frozen(1, [], "a") == ns.Frozen(1, [], "b"),
    "eq uses a factory field": lambda ns: ns.Frozen(1, ["a"]) == ns.Frozen(1, []),
    "mutable is unhashable": lambda ns: hash(ns.Point(1)),
    "mutable hash attribute": lambda ns: ns.Point.__hash__ is None,
    "explicit hash kept": lambda ns: hash(ns.Hashed(1)),
    "frozen equal hash equal": lambda ns: (
        hash(ns.Frozen(1, ["a"][:0], "x")) == hash(ns.Frozen(1, [], "y"))
    ),
    "frozen set key": lambda ns: len({ns.Base(1), ns.Base(1), ns.Base(2)}),
    "frozen assignment": _frozen_set,
    "frozen deletion": _frozen_del,
    "frozen error is an AttributeError": lambda ns: issubclass(
        ns.lib.FrozenInstanceError, AttributeError
    ),
    "mutable assignment": lambda ns: _mutable_assign(ns).x,
    "repr": lambda ns: repr(ns.Point(1, 2)),
    "repr leaves out repr=False": lambda ns: repr(ns.Frozen(1, ["t"], "hidden")),
    "user repr kept": lambda ns: repr(ns.Shown(1)),
    "default_factory fresh per instance": _factory_fresh,
    "default stays a class attribute": lambda ns: ns.Point.y,
    "factory field not a class attribute": lambda ns: hasattr(ns.Frozen, "tags"),
    "field default is a class attribute": lambda ns: ns.Frozen.note,
    "ClassVar is no field": lambda ns: [f.name for f in ns.lib.fields(ns.Kind)],
    "ClassVar value kept": lambda ns: ns.Kind("k").limit,
    "fields names in order": lambda ns: [f.name for f in ns.lib.fields(ns.Frozen)],
    "fields of an instance": lambda ns: [f.name for f in ns.lib.fields(ns.Point(1))],
    "field attributes": lambda ns: [(f.compare, f.repr) for f in ns.lib.fields(ns.Frozen)],
    "field default": lambda ns: ns.lib.fields(ns.Point)[1].default,
    "field default missing": lambda ns: ns.lib.fields(ns.Point)[0].default is ns.lib.MISSING,
    "inherited field order, override in place": lambda ns: [
        f.name for f in ns.lib.fields(ns.Child)
    ],
    "inherited override default": lambda ns: ns.Child(1).b,
    "inherited repr": lambda ns: repr(ns.Child(1)),
    "inherited eq across classes": lambda ns: ns.Child(1) == ns.Base(1),
    "post_init runs": lambda ns: ns.Post(3).doubled,
    "replace": lambda ns: repr(ns.lib.replace(ns.Point(1, 2), y=5)),
    "replace runs post_init": _post_sees_replace,
    "replace keeps the original": lambda ns: (ns.lib.replace(ns.Base(1), a=2), ns.Base(1))[1].a,
    "replace unknown field": lambda ns: ns.lib.replace(ns.Point(1), z=1),
    "match_args": lambda ns: ns.Child.__match_args__,
    "match statement": lambda ns: _match(ns.Point(4, 5)),
}


def _match(value: Any) -> Any:
    """``case Point(x, y)``: positional sub-patterns go through ``__match_args__``."""
    cls = type(value)
    match value:
        case cls(x, y):  # type: ignore[misc]
            return (x, y)
    return None


@pytest.mark.parametrize("name", sorted(PROBES))
def test_record_behaves_as_dataclasses(name: str) -> None:
    """Each probe gives the same value, or raises the same kind of exception, on a class
    made by nvshim._record as on the same class made by dataclasses."""
    probe = PROBES[name]
    assert outcome(probe, REC) == outcome(probe, DC)


def test_probes_cover_every_name_record_exports() -> None:
    """The probes touch every public name of _record (a new feature gets a probe)."""
    used = {"dataclass", "field", "fields", "replace", "Field", "FrozenInstanceError", "MISSING"}
    assert set(_record.__all__) == used


def test_is_dataclass_and_asdict_do_not_know_records() -> None:
    """Documented difference: dataclasses' own helpers (is_dataclass, asdict, astuple) do
    not see a record; nvshim uses _record.fields and replace instead."""
    assert dataclasses.is_dataclass(DC.Point(1))
    assert not dataclasses.is_dataclass(REC.Point(1))
    with pytest.raises(TypeError):
        dataclasses.asdict(REC.Point(1))


def test_repr_names_the_class_by_name() -> None:
    """Documented difference: a record's repr uses the class's __name__, dataclasses' its
    __qualname__ (they differ for a class nested in another or in a function)."""

    def make(lib: Any) -> Any:
        class Inner:
            x: int

        return lib.dataclass(Inner)

    assert repr(make(_record)(1)) == "Inner(x=1)"
    assert repr(make(dataclasses)(1)).endswith("<locals>.Inner(x=1)")


def test_class_checks_dataclasses_makes_are_not_made() -> None:
    """Documented difference: dataclasses refuses a mutable default (list, dict, set) and a
    field without a default after one with; _record accepts both."""
    for lib in (dataclasses, _record):

        class Loose:
            items: List[int] = []  # noqa: RUF012 - the probe

        class Order:
            a: int = 0
            b: int

        if lib is dataclasses:
            with pytest.raises(ValueError):
                lib.dataclass(Loose)
            with pytest.raises(TypeError):
                lib.dataclass(Order)
        else:
            assert lib.dataclass(Loose)().items == []
            assert lib.dataclass(Order)(b=1).a == 0


def test_methods_the_class_defines_are_replaced() -> None:
    """Documented difference: a record's own __init__ or __eq__ is replaced (dataclasses
    keeps it); __repr__ and, on a mutable record, __hash__ are kept by both."""
    for lib in (dataclasses, _record):

        class Own:
            x: int

            def __eq__(self, other: object) -> bool:
                return True

            __hash__ = None  # type: ignore[assignment]

        made = lib.dataclass(Own)
        assert (made(1) == made(2)) is (lib is dataclasses)
