"""CDI names: the grammar of ``<vendor>/<class>=<device>`` and of its parts.

:func:`parse_qualified_name` splits and validates a requested name (the runtime calls it
for every CDI name a container asks for); :func:`kind_error` and
:func:`device_name_error` are the rules the spec checker applies to a spec's ``kind`` and
device names. Standard library only: it is on the create path of a CDI request.
"""

from __future__ import annotations

from nvshim import _jsonc
from nvshim.errors import CdiError

TYPE_CHECKING = False  # typing stays off the create path (cost: BENCHMARKS.md, figures)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Optional, Tuple

__all__ = [
    "parse_qualified_name",
    "is_qualified_name",
    "qualified_name",
    "kind_error",
    "device_name_error",
]

_LETTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_ALNUM = _LETTERS | frozenset("0123456789")
_KIND_CHARS = _ALNUM | frozenset("_.-")
_DEVICE_CHARS = _KIND_CHARS | frozenset(":")


def _name_error(
    value: str, what: str, chars: frozenset[str], first: frozenset[str], first_rule: str
) -> Optional[str]:
    """Why ``value`` is not a valid ``what`` name (the CDI name grammar), or None if it is."""
    if not value:
        return f"empty {what} name"
    for char in value:
        if char not in chars:
            return f'{what} name "{value}" has invalid character {_show_char(char)}'
    if value[0] not in first:
        return f'{what} name "{value}" must start with {first_rule}'
    if value[-1] not in _ALNUM:
        return f'{what} name "{value}" must end with a letter or digit'
    return None


def _kind_part_error(value: str, what: str) -> Optional[str]:
    """Vendor and class: letters, digits, ``_.-``; a letter first."""
    return _name_error(value, what, _KIND_CHARS, _LETTERS, "a letter")


def device_name_error(value: str) -> Optional[str]:
    """Unqualified device names: also ``:`` (MIG ``0:1``); a letter or digit first."""
    return _name_error(value, "device", _DEVICE_CHARS, _ALNUM, "a letter or digit")


def _show_char(char: str) -> str:
    return _jsonc.dumps(char)


def kind_error(kind: str) -> Optional[str]:
    """Why ``kind`` is not ``<vendor>/<class>``, or None if it is."""
    if "/" not in kind:
        return f'kind "{kind}" must be <vendor>/<class>, like nvidia.com/gpu'
    vendor, class_ = kind.split("/", 1)
    reason = _kind_part_error(vendor, "vendor") or _kind_part_error(class_, "class")
    return f'invalid kind "{kind}": {reason}' if reason else None


def parse_qualified_name(name: str) -> Tuple[str, str, str]:
    """Split ``<vendor>/<class>=<device>`` into its three parts, validating each.

    Raises :class:`CdiError` naming the value and the reason.
    """
    if not isinstance(name, str):
        raise CdiError(f"invalid CDI device name {name!r}: not a string")
    reason = _qualified_name_error(name)
    if reason:
        raise CdiError(f'invalid CDI device name "{name}": {reason}')
    qualifier, device = name.split("=", 1)
    vendor, class_ = qualifier.split("/", 1)
    return vendor, class_, device


def _qualified_name_error(name: str) -> Optional[str]:
    if not name:
        return "empty name"
    if name.startswith("/"):
        return "a device path, not <vendor>/<class>=<device>"
    if "=" not in name:
        return 'missing "=": expected <vendor>/<class>=<device>'
    qualifier, device = name.split("=", 1)
    if "/" not in qualifier:
        return 'missing "/": expected <vendor>/<class>=<device>'
    vendor, class_ = qualifier.split("/", 1)
    return (
        _kind_part_error(vendor, "vendor")
        or _kind_part_error(class_, "class")
        or device_name_error(device)
    )


def is_qualified_name(s: str) -> bool:
    """True if ``s`` is a valid fully-qualified CDI device name."""
    return isinstance(s, str) and _qualified_name_error(s) is None


def qualified_name(kind: str, device: str) -> str:
    """``<kind>=<device>``, e.g. ``nvidia.com/gpu=0``."""
    return f"{kind}={device}"
