"""The benchmarks' reading of a server's latency histogram (tests/bench/_stats.py): what it
observed between two scrapes, as quantiles interpolated inside a bucket the way
Prometheus's ``histogram_quantile`` does. Pure arithmetic on bucket counts."""

from __future__ import annotations

import math

import pytest

from tests.bench._machine import machine_info, python_speed_mops
from tests.bench._stats import histogram_latency_ms

INF = math.inf


def test_histogram_latency__only_what_came_between_the_scrapes__counts() -> None:
    before = {0.001: 100.0, 0.01: 100.0, 0.1: 100.0, INF: 100.0}  # 100 fast calls, earlier
    after = {0.001: 100.0, 0.01: 200.0, 0.1: 200.0, INF: 200.0}  # then 100 in (1 ms, 10 ms]
    got = histogram_latency_ms(before, after)
    assert got["count"] == 100.0
    assert got["p50"] == pytest.approx(5.5)  # half-way through the (1, 10] ms bucket
    assert got["p99"] == pytest.approx(9.91)


def test_histogram_latency__a_tail_bucket__moves_p99_not_p50() -> None:
    after = {0.001: 0.0, 0.01: 98.0, 0.1: 98.0, 1.0: 100.0, INF: 100.0}
    got = histogram_latency_ms({}, after)
    assert got["p50"] < 10.0
    assert 100.0 < got["p99"] <= 1000.0


def test_histogram_latency__beyond_the_last_finite_bound__says_that_bound() -> None:
    got = histogram_latency_ms({}, {0.1: 0.0, INF: 10.0})
    assert got["p50"] == pytest.approx(100.0)


def test_histogram_latency__nothing_observed__is_zero_with_a_zero_count() -> None:
    same = {0.01: 5.0, INF: 5.0}
    nothing = {"count": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    assert histogram_latency_ms(same, same) == nothing
    assert histogram_latency_ms({}, {}) == nothing  # the agent did not answer


def test_machine_info__carries_the_python_speed_it_measured() -> None:
    info = machine_info()
    assert info["python_loop_mops"] > 0
    assert {"cpu_count", "python", "grpcio", "pysyncobj", "loadavg"} <= info.keys()


def test_python_speed__a_rate_whatever_the_round_size() -> None:
    # Iterations per second do not depend on the round's size (within a wide band): the
    # figure is a rate, not a duration.
    small, large = python_speed_mops(3, 100_000), python_speed_mops(3, 1_000_000)
    assert 0.1 < large / small < 10
