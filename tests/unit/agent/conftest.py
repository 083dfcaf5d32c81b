"""Fixtures of the agent's tests.

* ``sanitized_client`` (session) -> Path: the C client built once under AddressSanitizer
  and UndefinedBehaviorSanitizer (:mod:`tests.helpers.sanitized`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import sanitized


@pytest.fixture(scope="session")
def sanitized_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sanitized.sanitized_client(tmp_path_factory.mktemp("sanitized-client"))
