"""test_create.py's scenarios that run the C client, again with the client built under
AddressSanitizer and UndefinedBehaviorSanitizer: a memory error, a leak or undefined
behaviour in client.c fails the scenario that caused it, with the sanitizer's report
(:func:`tests.helpers.sanitized.client_scenarios`)."""

from __future__ import annotations

from tests.helpers.sanitized import client_scenarios
from tests.unit.agent import test_create

globals().update(client_scenarios(test_create))
