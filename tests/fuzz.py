"""Budgets for the fuzzers (tests/unit/test_fuzz_*.py): quick in ``make test``, 20x in
``make chaos``.

Each fuzzer runs as two tests: ``[quick]`` (collected by ``make test``: together at least
10,000 inputs in well under a minute) and ``[chaos]`` (marked ``chaos``, so only
``make chaos`` runs it: at least 200,000 inputs together). A fuzzer counts the inputs it
was really given and fails when it saw fewer than its budget, so a strategy that quietly
runs dry can not pass.
"""

from __future__ import annotations

from typing import Final

import pytest
from hypothesis import HealthCheck, settings

CHAOS_FACTOR: Final = 20
# Every quick budget handed out, by the fuzzer modules as they are imported.
QUICK_BUDGETS: list[int] = []


def budgets(quick: int) -> list[object]:
    """``pytest.mark.parametrize("budget", budgets(n))``: n inputs, or 20n under ``chaos``."""
    QUICK_BUDGETS.append(quick)
    return [
        pytest.param(quick, id="quick"),
        pytest.param(quick * CHAOS_FACTOR, id="chaos", marks=pytest.mark.chaos),
    ]


def fuzz_settings(budget: int) -> settings:
    """No deadline (a loaded 2-core machine is slow, not wrong), no example database (the
    run must not depend on what an earlier run found), every example really generated."""
    return settings(
        max_examples=budget,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
    )
