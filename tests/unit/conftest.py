"""Fixtures more than one unit test module needs."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from drover.client.drivers.raw_exec import reap_registered_children
from tests.unit.test_client_fake_server import alive


@pytest.fixture
def pids() -> Iterator[list[int]]:
    """PIDs (process group leaders) of the tasks a test started or saw: whatever happened,
    each whole group is SIGKILLed afterwards and the driver's children reaped, so no test
    leaves a process behind for the next one to trip over."""
    seen: list[int] = []
    yield seen
    for pid in seen:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        reap_registered_children()
        if not any(alive(pid) for pid in seen):
            break
        time.sleep(0.02)
