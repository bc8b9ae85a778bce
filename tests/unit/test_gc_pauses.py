"""``drover_gc_pause_seconds`` (drover/common/gc_pauses.py): each collection's pause lands
in its generation's bucket, and every agent registry exports the process's one hook."""

from __future__ import annotations

import gc

from prometheus_client import generate_latest

from drover.common.gc_pauses import GcPauseCollector, gc_pause_collector
from drover.common.prometheus import agent_registry


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _samples(collector: GcPauseCollector) -> dict[tuple[str, str, str], float]:
    (family,) = list(collector.collect())
    return {(s.name, s.labels.get("generation", ""), s.labels.get("le", "")): s.value for s in family.samples}


def test_a_pause_is_counted_in_its_generation_and_bucket() -> None:
    clock = _Clock()
    collector = GcPauseCollector(clock)
    collector.on_gc("start", {"generation": 2})
    clock.now = 0.03
    collector.on_gc("stop", {"generation": 2, "collected": 0, "uncollectable": 0})
    samples = _samples(collector)
    assert samples[("drover_gc_pause_seconds_bucket", "2", "0.025")] == 0
    assert samples[("drover_gc_pause_seconds_bucket", "2", "0.05")] == 1
    assert samples[("drover_gc_pause_seconds_bucket", "2", "+Inf")] == 1
    assert samples[("drover_gc_pause_seconds_count", "2", "")] == 1
    assert abs(samples[("drover_gc_pause_seconds_sum", "2", "")] - 0.03) < 1e-9
    assert samples[("drover_gc_pause_seconds_count", "0", "")] == 0


def test_a_pause_longer_than_every_bound_is_counted_in_inf_only() -> None:
    clock = _Clock()
    collector = GcPauseCollector(clock)
    collector.on_gc("start", {"generation": 0})
    clock.now = 60.0
    collector.on_gc("stop", {"generation": 0})
    samples = _samples(collector)
    assert samples[("drover_gc_pause_seconds_bucket", "0", "5.0")] == 0
    assert samples[("drover_gc_pause_seconds_bucket", "0", "+Inf")] == 1


def test_the_process_hook_is_installed_once_and_sees_a_real_collection() -> None:
    collector = gc_pause_collector()
    assert gc_pause_collector() is collector
    assert gc.callbacks.count(collector.on_gc) == 1
    before = _samples(collector)[("drover_gc_pause_seconds_count", "2", "")]
    gc.collect()
    assert _samples(collector)[("drover_gc_pause_seconds_count", "2", "")] >= before + 1


def test_every_agent_registry_exports_it() -> None:
    text = generate_latest(agent_registry()).decode()
    assert 'drover_gc_pause_seconds_bucket{generation="2",le="+Inf"}' in text
