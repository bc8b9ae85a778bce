"""What the state store keeps per alloc (tests/bench/alloc_memory.py, on a small placement).

A guard against losing the decode-side sharing of server/codec.py: every alloc of a job
placed by one eval on a few nodes has the same namespace, job, eval, group, statuses and
resources, and the stored allocs must share them rather than hold a copy each.
"""

from __future__ import annotations

from typing import Any

import pytest

from drover.scheduler.structs import AllocatedResources, Allocation
from drover.server.codec import INTERNED_FIELDS
from tests.bench.alloc_memory import allocation_census, measure_in_process

ALLOCS = 400
NODES = 20


@pytest.fixture(scope="module")
def traced() -> dict[str, Any]:
    return measure_in_process("trace", allocs=ALLOCS, nodes=NODES, top=5)


def test_alloc_memory__whole_placement__is_placed_and_held_by_the_state_store(traced: dict[str, Any]) -> None:
    assert traced["placed"] == ALLOCS
    # Before the codec shared anything: ~1,350 bytes per alloc; with sharing ~730 (660 on
    # 2026-12-01). Since every alloc keeps its placement metrics (Nomad's AllocMetric: the
    # top five nodes' scores, shared where equal) ~530 more here, plus ~300 of the codec's
    # bounded caches that 400 allocs do not amortise: 1,560 (1,340 at 2,000 allocs).
    assert 300 < traced["by_holder_bytes_per_alloc"]["state_store"] < 2_000


def test_alloc_memory__placement_metrics__stay_small(traced: dict[str, Any]) -> None:
    """The metrics are the biggest part of a stored alloc: 3,070 bytes each before their
    node scores and counts were shared (server/codec.py SHARED_CLASSES, SHARED_MAPS)."""
    census = traced["state_store_allocs_census_bytes_per_alloc"]
    assert 0 < census["metrics"] < 800


# What the codec shares, read from the codec itself so a field it starts sharing is guarded
# too: every field it interns, and ``resources`` (an AllocatedResources, one of
# SHARED_CLASSES: every alloc of a group decodes to the same record).
SHARED_FIELDS = sorted(INTERNED_FIELDS[Allocation] | {"resources"})


@pytest.mark.parametrize("field", SHARED_FIELDS)
def test_alloc_memory__repeated_values__are_shared_by_the_stored_allocs(
    traced: dict[str, Any], field: str
) -> None:
    census = traced["state_store_allocs_census_bytes_per_alloc"]

    # One copy per node at most (node IDs and names), not one per alloc.
    assert census.get(field, 0.0) < 8.0, f"{field}: {census.get(field)} bytes per alloc"


def test_alloc_memory__census__counts_a_shared_object_once() -> None:
    shared = AllocatedResources(cpu_mhz=100, memory_mb=64, disk_mb=1)
    own = [AllocatedResources(cpu_mhz=100, memory_mb=64, disk_mb=1) for _ in range(2)]

    assert (
        allocation_census([Allocation(resources=shared), Allocation(resources=shared)])["resources"]
        == (allocation_census([Allocation(resources=own[0])])["resources"])
    )
    assert (
        allocation_census([Allocation(resources=r) for r in own])["resources"]
        == 2 * (allocation_census([Allocation(resources=own[0])])["resources"])
    )
