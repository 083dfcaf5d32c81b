"""NVIDIA_REQUIRE_* constraints (being written; see issue 5)."""

from __future__ import annotations

from typing import Any, List

__all__ = ["check_requirements"]


def check_requirements(spec: Any, host: Any, request: Any, notes: List[str]) -> None:
    """Raise RequestError when the container's NVIDIA_REQUIRE_* constraints are unmet."""
    return None
