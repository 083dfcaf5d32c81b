"""test_client_scan.py's scenarios again with the client built under AddressSanitizer and
UndefinedBehaviorSanitizer: the scan reads a file the image's engine wrote, so a memory
error, a leak or undefined behaviour in it fails the scenario that caused it
(:func:`tests.helpers.sanitized.client_scenarios`)."""

from __future__ import annotations

from tests.helpers.sanitized import client_scenarios
from tests.unit.agent import test_client_scan

globals().update(client_scenarios(test_client_scan))
