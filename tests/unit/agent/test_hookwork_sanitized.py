"""test_hookwork.py's scenarios that run the C client, again with the client built under
AddressSanitizer and UndefinedBehaviorSanitizer: a memory error, a leak or undefined
behaviour in client.c fails the scenario that caused it, with the sanitizer's report."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers.sanitized import client_scenarios, take_reports
from tests.unit.agent import test_hookwork

globals().update(client_scenarios(test_hookwork))


@pytest.fixture(scope="module")
def client(sanitized_client: Path) -> Path:
    """The sanitized build in place of the release one."""
    return sanitized_client


@pytest.fixture(autouse=True)
def no_sanitizer_report(sanitized_client: Path) -> Iterator[None]:
    """After each scenario: no report from the sanitized client."""
    take_reports(sanitized_client)
    yield
    assert take_reports(sanitized_client) == []
