"""pytest configuration for tests/bench: anything collected here is a ``bench`` test.

The benchmarks themselves run through ``python -m tests.bench.run`` and are not test
modules (no ``test_*`` file names), so a plain ``pytest`` run collects nothing here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.bench)
