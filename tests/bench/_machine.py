"""What a benchmark's JSON says about the machine it ran on, so runs on different days can
be compared: the versions that matter, the load average, and how fast one core runs plain
Python just before the run.

The machine is shared (a VM whose host runs others), and on one day the same pysyncobj
baseline ran 2.5x slower than the day before (bench-results/foundation-20261204T010618Z.json
against foundation-20261203T185113Z.json) with nothing else of ours running. A figure
quoted against an older run means little without that speed beside it.
"""

from __future__ import annotations

import os
import platform
import time
from typing import Any, Final

import grpc
from pysyncobj.version import VERSION as PYSYNCOBJ_VERSION

__all__ = ["machine_info", "python_speed_mops"]

# Loop iterations per timed round; about 20-60 ms of one core.
_ROUND_ITERATIONS: Final = 1_000_000
_ROUNDS: Final = 5


def python_speed_mops(rounds: int = _ROUNDS, iterations: int = _ROUND_ITERATIONS) -> float:
    """Millions of iterations of a plain Python loop per second, the best of ``rounds``
    (the best is the least disturbed by other processes)."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        total = 0
        for i in range(iterations):
            total += i
        best = min(best, time.perf_counter() - started)
    return round(iterations / best / 1e6, 2)


def machine_info() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "grpcio": grpc.__version__,
        "pysyncobj": PYSYNCOBJ_VERSION,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python_loop_mops": python_speed_mops(),
    }
