"""Value classes without ``dataclasses``: the subset nvshim uses, at a fraction of the cost.

``dataclasses`` is a costly import (it pulls in ``inspect``) and costs again per class,
because it generates each ``__init__``/``__eq__``/``__repr__`` with ``exec`` (both in
BENCHMARKS.md, figures). nvshim's create path defines about twenty value classes and runs
once per container start, so every GPU container's create paid both. This module gives
the same behaviour for
what we use — ``@dataclass`` / ``@dataclass(frozen=True)``, ``field(default=…,
default_factory=…, compare=…, repr=…)``, ``fields()``, ``replace()``, ``__post_init__``
and ``__match_args__`` — with plain shared methods and no code generation.

tests/unit/test_record.py runs the same probes on classes made by both. What it does not
do, unlike ``dataclasses``:

- ``dataclasses.is_dataclass``, ``asdict`` and ``astuple`` do not know a record (use
  ``fields`` and ``replace`` from here);
- no ``order``, ``eq=False``, ``unsafe_hash``, ``init=False``/``kw_only`` fields,
  ``InitVar`` or ``slots``;
- a mutable default (``= []``) and a field without a default after one with are accepted,
  not refused;
- a class's own ``__init__`` and ``__eq__`` (and a frozen record's ``__hash__``) are
  replaced, where ``dataclasses`` keeps them; ``__repr__`` is kept by both;
- ``repr`` names the class by ``__name__``, not ``__qualname__``.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:
    from typing import Any, Optional, Tuple, TypeVar

    _T = TypeVar("_T")

__all__ = ["dataclass", "field", "fields", "replace", "Field", "FrozenInstanceError", "MISSING"]


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class FrozenInstanceError(AttributeError):
    """Assignment to a field of a frozen record."""


class Field:
    """One field of a record (same attribute names as ``dataclasses.Field``)."""

    __slots__ = ("name", "default", "default_factory", "compare", "repr")

    def __init__(
        self,
        default: Any = MISSING,
        default_factory: Any = MISSING,
        compare: bool = True,
        repr: bool = True,
    ) -> None:  # noqa: A002 - dataclasses' name
        self.name = ""
        self.default = default
        self.default_factory = default_factory
        self.compare = compare
        self.repr = repr


def field(
    *,
    default: Any = MISSING,
    default_factory: Any = MISSING,
    compare: bool = True,
    repr: bool = True,
) -> Any:  # noqa: A002 - dataclasses' name
    return Field(default, default_factory, compare, repr)


def fields(obj: Any) -> Tuple[Field, ...]:
    result: Tuple[Field, ...] = obj.__record_fields__
    return result


def replace(obj: _T, **changes: Any) -> _T:
    record: Any = obj
    values = {f.name: getattr(record, f.name) for f in record.__record_fields__}
    values.update(changes)
    new: _T = record.__class__(**values)
    return new


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    flds = self.__record_fields__
    if len(args) > len(flds):
        raise TypeError(f"{type(self).__name__}() takes {len(flds)} arguments, got {len(args)}")
    setter = object.__setattr__
    for i, f in enumerate(flds):
        if i < len(args):
            if f.name in kwargs:
                raise TypeError(f"{type(self).__name__}() got multiple values for {f.name!r}")
            value = args[i]
        elif f.name in kwargs:
            value = kwargs.pop(f.name)
        elif f.default is not MISSING:
            value = f.default
        elif f.default_factory is not MISSING:
            value = f.default_factory()
        else:
            raise TypeError(f"{type(self).__name__}() missing required argument {f.name!r}")
        setter(self, f.name, value)
    if kwargs:
        raise TypeError(f"{type(self).__name__}() got unexpected arguments {sorted(kwargs)}")
    post = getattr(self, "__post_init__", None)
    if post is not None:
        post()


def _key(self: Any) -> Tuple[Any, ...]:
    return tuple(getattr(self, f.name) for f in self.__record_fields__ if f.compare)


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is self.__class__:
        return _key(self) == _key(other)
    return NotImplemented


def _repr(self: Any) -> str:
    inner = ", ".join(
        f"{f.name}={getattr(self, f.name)!r}" for f in self.__record_fields__ if f.repr
    )
    return f"{type(self).__name__}({inner})"


def _hash(self: Any) -> int:
    return hash((self.__class__.__qualname__,) + _key(self))


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _make(cls: Any, frozen: bool) -> Any:
    flds: list[Field] = []
    for base in reversed(cls.__mro__[1:]):
        flds.extend(getattr(base, "__record_fields__", ()))
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if isinstance(annotation, str) and annotation.startswith(("ClassVar", "typing.ClassVar")):
            continue
        value = cls.__dict__.get(name, MISSING)
        f = value if isinstance(value, Field) else Field(default=value)
        f.name = name
        if isinstance(value, Field):
            if f.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        # an inherited field redefined keeps its place, as in dataclasses
        names = [old.name for old in flds]
        if name in names:
            flds[names.index(name)] = f
        else:
            flds.append(f)
    cls.__record_fields__ = tuple(flds)
    cls.__init__ = _init
    if "__match_args__" not in cls.__dict__:
        # setattr: mypy refuses an assignment to __match_args__ even on Any
        setattr(cls, "__match_args__", tuple(f.name for f in flds))  # noqa: B010
    cls.__eq__ = _eq
    if "__repr__" not in cls.__dict__:
        cls.__repr__ = _repr
    if frozen:
        cls.__setattr__ = _frozen_setattr
        cls.__delattr__ = _frozen_delattr
        cls.__hash__ = _hash
    elif "__hash__" not in cls.__dict__:
        cls.__hash__ = None
    return cls


if TYPE_CHECKING:
    # What mypy sees: the standard ``dataclass_transform`` contract, so records get typed
    # ``__init__`` signatures, frozen checks and field defaults like real dataclasses.
    from typing import Callable, TypeVar, dataclass_transform, overload

    _C = TypeVar("_C", bound=type)

    @overload
    @dataclass_transform(field_specifiers=(field,))
    def dataclass(cls: _C, *, frozen: bool = False) -> _C: ...

    @overload
    def dataclass(cls: None = None, *, frozen: bool = False) -> Callable[[_C], _C]: ...

    def dataclass(cls: Optional[_C] = None, *, frozen: bool = False) -> Any: ...

else:

    def dataclass(cls=None, *, frozen=False):
        """``@dataclass`` / ``@dataclass(frozen=True)`` for nvshim's value classes."""

        def wrap(c):
            return _make(c, frozen)

        return wrap if cls is None else wrap(cls)
