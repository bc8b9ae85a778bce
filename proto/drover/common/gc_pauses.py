"""How long this process stops for the cyclic garbage collector: ``drover_gc_pause_seconds``.

A collection holds the GIL, so every thread of the agent stops for as long as it runs, and
one that reaches the oldest generation walks every tracked object: about 1 µs each on the
machine the benchmarks run on, 2.65 s for 2.57 M objects (tests/bench/state_load.py). A
leader holds about 7 tracked objects per alloc of each state it keeps, so at scale these
pauses are long enough to show in heartbeat and read latency; this histogram shows them.

prometheus-client's own GC collector counts collections, not their length. The pause is
measured by a ``gc.callbacks`` hook, which runs inside the collection, on whichever thread
started it: it takes no lock (a metric's lock could be held by that very thread, which
allocated inside it) and only adds to plain lists, read at scrape time.
"""

from __future__ import annotations

import bisect
import gc
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

__all__ = ["GC_PAUSE_BUCKETS", "GC_PAUSE_METRIC", "GcPauseCollector", "gc_pause_collector"]

GC_PAUSE_METRIC: Final = "drover_gc_pause_seconds"
GC_PAUSE_BUCKETS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_GENERATIONS: Final = 3


class GcPauseCollector(Collector):
    """Per generation: a histogram of collection pauses, kept as bucket counts and a sum."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        # Per generation, one count per bucket; the last one is +Inf.
        self._counts = [[0] * (len(GC_PAUSE_BUCKETS) + 1) for _ in range(_GENERATIONS)]
        self._sums = [0.0] * _GENERATIONS
        self._started = 0.0

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """The ``gc.callbacks`` hook."""
        if phase == "start":
            self._started = self._clock()
            return
        generation = info.get("generation", 0)
        if not 0 <= generation < _GENERATIONS:
            return
        pause = self._clock() - self._started
        # The first bucket whose bound is >= the pause (Prometheus buckets are "le").
        self._counts[generation][bisect.bisect_left(GC_PAUSE_BUCKETS, pause)] += 1
        self._sums[generation] += pause

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(
            GC_PAUSE_METRIC,
            "Time this process stopped for one cyclic garbage collection, by the oldest generation collected",
            labels=["generation"],
        )
        for generation in range(_GENERATIONS):
            counts = list(self._counts[generation])  # one copy: a collection may run meanwhile
            total = self._sums[generation]
            cumulative = 0
            buckets: list[tuple[str, float]] = []
            for bound, count in zip((*(str(b) for b in GC_PAUSE_BUCKETS), "+Inf"), counts, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            family.add_metric([str(generation)], buckets, total)
        yield family


# One per process, hooked when this module is first imported (the import lock makes that
# happen once): every agent in a process stops for the same collections, so one hook and one
# histogram serve them all.
_PROCESS_COLLECTOR: Final = GcPauseCollector()
gc.callbacks.append(_PROCESS_COLLECTOR.on_gc)


def gc_pause_collector() -> GcPauseCollector:
    """This process's collector, whose hook is already installed."""
    return _PROCESS_COLLECTOR
