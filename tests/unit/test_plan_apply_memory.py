"""The plan applier builds a big plan's raft entries one at a time (``Evaluated.entries``)
instead of one entry for the whole plan that ``split_entry`` then copies: the entries must be
exactly what splitting the whole entry gives, and what the applier proposes.

A protobuf message of an alloc lives in an arena outside the Python heap (~2.7 KiB each);
two copies of a 20,000-alloc plan at once were ~115 MiB of the leader's RSS, kept by the C
allocator after they were freed (tests/bench/alloc_memory.py measures it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from drover.scheduler.structs import (
    ALLOC_CLIENT_RUNNING,
    AllocatedResources,
    Allocation,
    Deployment,
    DeploymentStatusUpdate,
    Plan,
    PlanResult,
    RejectionTrackerConfig,
)
from drover.server import plan_apply
from drover.server.fsm import ApplyResult
from drover.server.plan_apply import (
    Evaluated,
    PendingPlan,
    PlanApplier,
    PlanQueue,
    RejectionTracker,
    evaluate_plan,
    split_entry,
)
from drover.v1 import raft_pb2
from tests.fixtures import mock
from tests.harness import Harness

JOB = mock.job(id="web")
CHUNK = 3
STOPS = 4


def _alloc(alloc_id: str, node_id: str, **kw: object) -> Allocation:
    """An alloc of 100 MHz / 100 MB, no ports (so only CPU decides what fits)."""
    kw.setdefault("resources", AllocatedResources(cpu_mhz=100, memory_mb=100))
    return mock.alloc(JOB, mock.node(id=node_id), 0, id=alloc_id, eval_id="eval-plan", **kw)


@pytest.fixture
def harness(monkeypatch: pytest.MonkeyPatch) -> Harness:
    """Nodes ``a`` and ``b`` with room, ``full`` without; entries of CHUNK allocs at most."""
    monkeypatch.setattr(plan_apply, "MAX_ALLOCS_PER_ENTRY", CHUNK)
    h = Harness()
    for node_id in ("a", "b", "full"):
        h.add_node(mock.node(id=node_id))
    for i in range(STOPS):
        h.add_alloc(_alloc(f"old-{i}", "a", client_status=ALLOC_CLIENT_RUNNING))
    hog = AllocatedResources(cpu_mhz=3900, memory_mb=100)
    h.add_alloc(_alloc("hog", "full", client_status=ALLOC_CLIENT_RUNNING, resources=hog))
    return h


def _plan(places: int) -> Plan:
    """``places`` placements on ``a`` and ``b``, one on ``full`` (rejected), STOPS stops on
    ``a``, a deployment and a deployment update."""
    allocs = [_alloc(f"p{i:02d}", "a" if i % 2 else "b") for i in range(places)]
    return Plan(
        eval_id="eval-plan",
        job_id="web",
        node_allocation={
            "a": tuple(a for a in allocs if a.node_id == "a"),
            "b": tuple(a for a in allocs if a.node_id == "b"),
            "full": (_alloc("p-full", "full"),),
        },
        node_update={"a": tuple(mock.stop(f"old-{i}") for i in range(STOPS))},
        deployment=Deployment(id="d1", job_id="web"),
        deployment_updates=(DeploymentStatusUpdate(deployment_id="d0", status="cancelled"),),
    )


def _evaluate(h: Harness, places: int) -> Evaluated:
    # Threshold 0: the full node is marked ineligible by the plan (in its last entry).
    tracker = RejectionTracker(RejectionTrackerConfig(threshold=0, window_ns=10**12))
    return evaluate_plan(_plan(places), h.snapshot(), tracker, mock.NOW)


@pytest.mark.parametrize("places", [0, 2, 3, 8, 11])
def test_entries__are_the_whole_entry_split(harness: Harness, places: int) -> None:
    evaluated = _evaluate(harness, places)
    whole = evaluated.entry
    assert whole is not None
    assert evaluated.result.rejected_nodes == ("full",)
    assert [n.node_id for n in whole.nodes_ineligible] == ["full"]
    assert whole.deployment.id == "d1" and len(whole.deployment_updates) == 1
    assert len(whole.allocs_upserted) == places and len(whole.allocs_stopped) == STOPS

    entries = list(evaluated.entries())

    assert entries == split_entry(whole)
    assert len(entries) == -(-(places + STOPS) // CHUNK)


def test_entries__nothing_to_commit__none(harness: Harness) -> None:
    tracker = RejectionTracker(RejectionTrackerConfig(enabled=False))
    evaluated = evaluate_plan(Plan(eval_id="e", job_id="web"), harness.snapshot(), tracker, mock.NOW)

    assert evaluated.head is None and evaluated.entry is None
    assert list(evaluated.entries()) == []


def _payload(data: bytes) -> raft_pb2.ApplyPlanResultsEntry:
    entry = raft_pb2.LogEntry.FromString(data)
    assert entry.type == raft_pb2.ENTRY_TYPE_APPLY_PLAN_RESULTS
    return raft_pb2.ApplyPlanResultsEntry.FromString(entry.payload)


def _applier(
    harness: Harness, propose_async: Callable[[bytes, Callable[[ApplyResult | None, str], None]], None]
) -> PlanApplier:
    """An applier over the harness's store that proposes through ``propose_async``, every
    token outstanding, always leader, no rejection tracking."""
    applier = PlanApplier(
        PlanQueue(), harness.store, propose_async, lambda _e, _t: True, lambda: mock.NOW, lambda: True
    )
    applier._tracker = RejectionTracker(RejectionTrackerConfig(threshold=0, window_ns=10**12))
    return applier


def test_applier__proposes_the_split_entries_in_order(harness: Harness) -> None:
    whole = _evaluate(harness, 8).entry
    assert whole is not None
    proposed: list[bytes] = []
    callbacks: list[Callable[[ApplyResult | None, str], None]] = []

    def propose_async(data: bytes, on_done: Callable[[ApplyResult | None, str], None]) -> None:
        proposed.append(data)
        callbacks.append(on_done)

    store = harness.store
    applier = _applier(harness, propose_async)
    future: Future[PlanResult] = Future()
    applier._apply(PendingPlan(_plan(8), future))

    assert [_payload(d) for d in proposed] == split_entry(whole)
    assert len(proposed) == 4
    assert applier._inflight is not None, "the plan's expected state, until it commits"
    for i, on_done in enumerate(callbacks):
        on_done(ApplyResult(index=store.index + 1 + i), "")
    assert future.result(timeout=0).alloc_index == store.index + len(callbacks)
    assert applier._inflight is None, "the expected state is dropped once the plan committed"


def test_applier__trims_the_heap_on_its_own_thread_after_a_multi_entry_plan(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trim takes a few ms: in the commit callback it would hold raft's tick thread,
    which applies every entry, so the callback only asks and the applier's loop trims."""
    trimmed_on: list[str] = []
    trimmed = threading.Event()

    def trim() -> None:
        trimmed_on.append(threading.current_thread().name)
        trimmed.set()

    monkeypatch.setattr(plan_apply, "release_free_heap", trim)
    callbacks: list[Callable[[ApplyResult | None, str], None]] = []
    store = harness.store
    applier = _applier(harness, lambda _data, on_done: callbacks.append(on_done))
    future: Future[PlanResult] = Future()
    applier._apply(PendingPlan(_plan(8), future))
    assert len(callbacks) > 1
    for i, on_done in enumerate(callbacks):
        on_done(ApplyResult(index=store.index + 1 + i), "")
    assert future.result(timeout=0).alloc_index == store.index + len(callbacks)
    assert trimmed_on == [], "the commit callback (raft's tick thread here) must not trim"
    applier.start()
    try:
        assert trimmed.wait(timeout=10), "the applier thread trims after the plan committed"
    finally:
        applier.stop()
    assert trimmed_on == ["plan-applier"]
