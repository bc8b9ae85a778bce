"""The plan applier: per-node re-checks against real state, partial and all-at-once commits,
the rejection tracker, fault injection, the plan queue, and the applier thread end to end.

State is a real ``StateStore`` built through ``tests.harness.Harness`` (``Txn``, the code
the FSM uses); committed entries are applied with the real ``drover.server.fsm.FSM``. The end to
end part runs ``PlanApplier`` in-process, no raft: a fake ``propose_async`` applies the entry
bytes through the FSM on the same store, either at once or from a thread that waits on a
gate (raft latency), which is what exercises the pipelined overlay view.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from drover.scheduler.fit import allocs_fit
from drover.scheduler.structs import (
    ALLOC_CLIENT_COMPLETE,
    ALLOC_CLIENT_RUNNING,
    ALLOC_DESIRED_STOP,
    NODE_INELIGIBLE,
    NODE_STATUS_DISCONNECTED,
    NODE_STATUS_DOWN,
    NODE_STATUS_INIT,
    AllocatedPort,
    AllocatedResources,
    Allocation,
    AllocStop,
    DrainStrategy,
    Evaluation,
    Node,
    NodeResources,
    Plan,
    PlanResult,
    RejectionTrackerConfig,
    SchedulerConfig,
)
from drover.server import plan_apply
from drover.server.broker import EvalBroker
from drover.server.fsm import FSM, ApplyResult, encode_entry
from drover.server.plan_apply import (
    Evaluated,
    PendingPlan,
    PlanApplier,
    PlanQueue,
    PlanRejectedError,
    RejectionTracker,
    evaluate_plan,
)
from drover.server.state_store import Snapshot
from drover.v1 import raft_pb2
from tests.chaos import disagreement
from tests.fixtures import mock
from tests.harness import Harness

NOW = mock.NOW
SECOND = mock.SECOND
JOB = mock.job(id="web")
# mock.node(): 4000 MHz / 8192 MB / 100000 MB with 100 / 256 / 4096 reserved, port 22 reserved.
CPU_CAP = 3900
MEM_CAP = 7936
DISK_CAP = 95904
OFF = RejectionTrackerConfig(enabled=False)


def res(cpu: int = 100, mem: int = 100, disk: int = 0, ports: tuple[int, ...] = ()) -> AllocatedResources:
    return AllocatedResources(
        cpu_mhz=cpu,
        memory_mb=mem,
        disk_mb=disk,
        ports=tuple(AllocatedPort(label=f"p{p}", value=p) for p in ports),
    )


def alloc(alloc_id: str, node_id: str, *, slot: int = 0, **kw: Any) -> Allocation:
    """An alloc of ``JOB`` on ``node_id``: 100 MHz / 100 MB unless ``resources`` says otherwise."""
    kw.setdefault("resources", res())
    return mock.alloc(JOB, mock.node(id=node_id), slot, id=alloc_id, eval_id="eval-plan", **kw)


def plan(
    place: Mapping[str, tuple[Allocation, ...]] | None = None,
    stop: Mapping[str, tuple[str, ...]] | None = None,
    **kw: Any,
) -> Plan:
    return Plan(
        eval_id=kw.pop("eval_id", "eval-plan"),
        job_id="web",
        node_allocation=place or {},
        node_update={n: tuple(mock.stop(a) for a in ids) for n, ids in (stop or {}).items()},
        **kw,
    )


@dataclass
class LogRecorder:
    """Stands in for the module's structlog logger, so reasons can be asserted on."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def _record(self, event: str, **kw: Any) -> None:
        self.events.append((event, kw))

    info = warning = error = exception = debug = _record

    def reasons(self) -> dict[str, str]:
        return {kw["node_id"]: kw["reason"] for event, kw in self.events if event == "plan.node_rejected"}


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> LogRecorder:
    recorder = LogRecorder()
    monkeypatch.setattr(plan_apply, "log", recorder)
    return recorder


@pytest.fixture
def h() -> Harness:
    """Two ready, eligible nodes ``good`` and ``bad`` (tests make ``bad`` bad)."""
    harness = Harness()
    harness.add_node(mock.node(id="good"))
    harness.add_node(mock.node(id="bad"))
    return harness


def evaluate(h: Harness, p: Plan, tracker: RejectionTracker | None = None, **kw: Any) -> Evaluated:
    return evaluate_plan(p, h.snapshot(), tracker or RejectionTracker(OFF), kw.pop("now", NOW), **kw)


def upserted(e: Evaluated) -> list[str]:
    assert e.entry is not None
    return sorted(a.id for a in e.entry.allocs_upserted)


def stopped(e: Evaluated) -> list[str]:
    assert e.entry is not None
    return sorted(s.alloc_id for s in e.entry.allocs_stopped)


def apply_entry(h: Harness, entry: raft_pb2.ApplyPlanResultsEntry) -> ApplyResult:
    index = h.store.index + 1
    result = FSM(h.store).apply(encode_entry(raft_pb2.ENTRY_TYPE_APPLY_PLAN_RESULTS, entry), index)
    assert not result.error, result.error
    return result


# ---------------------------------------------------------------------------------------
# Node state


def bad_node(**overrides: Any) -> Callable[[Harness], None]:
    def setup(h: Harness) -> None:
        h.add_node(mock.node(id="bad", **overrides))

    return setup


_DRAINING = {
    "drain_strategy": mock.drain_node().drain_strategy,
    "scheduling_eligibility": NODE_INELIGIBLE,
}

NODE_STATES: list[tuple[str, Callable[[Harness], None], str]] = [
    ("missing", lambda h: None, "node does not exist"),
    ("down", bad_node(status=NODE_STATUS_DOWN), "node is down"),
    ("initializing", bad_node(status=NODE_STATUS_INIT), "node is initializing"),
    ("disconnected", bad_node(status=NODE_STATUS_DISCONNECTED), "node is disconnected"),
    ("ineligible", bad_node(scheduling_eligibility=NODE_INELIGIBLE), "not eligible"),
    ("draining", bad_node(**_DRAINING), "not eligible"),
    ("drain-strategy-only", bad_node(drain_strategy=DrainStrategy()), "not eligible"),
]


@pytest.fixture
def bare() -> Harness:
    """Only the ``good`` node; the state cases add ``bad`` as they need."""
    harness = Harness()
    harness.add_node(mock.node(id="good"))
    return harness


@pytest.mark.parametrize(("setup", "reason"), [c[1:] for c in NODE_STATES], ids=[c[0] for c in NODE_STATES])
def test_node_state__placement_rejected__other_node_commits(
    bare: Harness, logs: LogRecorder, setup: Callable[[Harness], None], reason: str
) -> None:
    setup(bare)
    p = plan(place={"bad": (alloc("a-bad", "bad"),), "good": (alloc("a-good", "good"),)})

    e = evaluate(bare, p)

    assert e.result.rejected_nodes == ("bad",)
    assert set(e.result.node_allocation) == {"good"}
    assert upserted(e) == ["a-good"]
    assert reason in logs.reasons()["bad"]


@pytest.mark.parametrize("setup", [c[1] for c in NODE_STATES], ids=[c[0] for c in NODE_STATES])
def test_node_state__stops_always_fit(bare: Harness, setup: Callable[[Harness], None]) -> None:
    setup(bare)
    p = plan(stop={"bad": ("old-1", "old-2")})

    e = evaluate(bare, p)

    assert e.result.rejected_nodes == ()
    assert e.result.node_update == {"bad": p.node_update["bad"]}
    assert stopped(e) == ["old-1", "old-2"]


def test_node_state__rejected_node__its_stops_are_dropped_too(h: Harness) -> None:
    """As in Nomad's evaluatePlan: a rejected node contributes nothing, stops included."""
    h.add_node(mock.node(id="bad", status=NODE_STATUS_DOWN))
    h.add_alloc(alloc("old", "bad"))
    p = plan(place={"bad": (alloc("new", "bad"),), "good": (alloc("g", "good"),)}, stop={"bad": ("old",)})

    e = evaluate(h, p)

    assert e.result.rejected_nodes == ("bad",)
    assert "bad" not in e.result.node_update
    assert stopped(e) == []
    assert upserted(e) == ["g"]


# ---------------------------------------------------------------------------------------
# Fit: each dimension rejects that node only


@dataclass(frozen=True)
class FitCase:
    name: str
    existing: tuple[Allocation, ...] = ()
    placed: tuple[Allocation, ...] = ()
    node: Node | None = None
    reason: str = ""


FIT_CASES = [
    FitCase(
        "cpu",
        existing=(alloc("x", "bad", resources=res(cpu=3000)),),
        placed=(alloc("p", "bad", resources=res(cpu=CPU_CAP - 3000 + 1)),),
        reason="cpu",
    ),
    FitCase(
        "memory",
        existing=(alloc("x", "bad", resources=res(mem=7000)),),
        placed=(alloc("p", "bad", resources=res(mem=MEM_CAP - 7000 + 1)),),
        reason="memory",
    ),
    FitCase("disk", placed=(alloc("p", "bad", resources=res(disk=DISK_CAP + 1)),), reason="disk"),
    FitCase(
        "max-allocs",
        node=mock.node(id="bad", resources=replace(mock.node().resources or NodeResources(), max_allocs=2)),
        existing=(alloc("x1", "bad"), alloc("x2", "bad", slot=1)),
        placed=(alloc("p", "bad", slot=2),),
        reason="max allocs",
    ),
    FitCase("node-reserved-port", placed=(alloc("p", "bad", resources=res(ports=(22,))),), reason="port 22"),
    FitCase(
        "static-port-held-by-live-alloc",
        existing=(alloc("x", "bad", resources=res(ports=(8080,)), client_status=ALLOC_CLIENT_RUNNING),),
        placed=(alloc("p", "bad", resources=res(ports=(8080,))),),
        reason="port 8080",
    ),
    FitCase(
        "two-placements-share-a-port",
        placed=(
            alloc("p1", "bad", resources=res(ports=(9090,))),
            alloc("p2", "bad", slot=1, resources=res(ports=(9090, 9091))),
        ),
        reason="port 9090",
    ),
]


def _setup_fit(h: Harness, case: FitCase) -> None:
    if case.node is not None:
        h.add_node(case.node)
    for a in case.existing:
        h.add_alloc(a)


@pytest.mark.parametrize("case", FIT_CASES, ids=[c.name for c in FIT_CASES])
def test_fit__rejects_that_node_only__partial_commit(h: Harness, logs: LogRecorder, case: FitCase) -> None:
    _setup_fit(h, case)
    good = (alloc("g1", "good"), alloc("g2", "good", slot=1))
    p = plan(place={"bad": case.placed, "good": good}, stop={"good": ("old-g",)})

    e = evaluate(h, p)

    assert e.result.rejected_nodes == ("bad",)
    assert dict(e.result.node_allocation) == {"good": good}
    assert set(e.result.node_update) == {"good"}
    assert upserted(e) == ["g1", "g2"]
    assert stopped(e) == ["old-g"]
    assert logs.reasons()["bad"] == f"does not fit: {case.reason}"


@pytest.mark.parametrize("case", FIT_CASES, ids=[c.name for c in FIT_CASES])
def test_fit__all_at_once__commits_nothing(h: Harness, case: FitCase) -> None:
    _setup_fit(h, case)
    p = plan(
        place={"bad": case.placed, "good": (alloc("g", "good"),)}, stop={"good": ("old-g",)}, all_at_once=True
    )

    e = evaluate(h, p)

    assert e.result.rejected_nodes == ("bad",)
    assert e.result.node_allocation == {}
    assert e.result.node_update == {}
    assert e.entry is None


def test_fit__all_at_once__everything_fits__commits_all(h: Harness) -> None:
    p = plan(place={"bad": (alloc("b", "bad"),), "good": (alloc("g", "good"),)}, all_at_once=True)

    e = evaluate(h, p)

    assert e.result.rejected_nodes == ()
    assert upserted(e) == ["b", "g"]


@pytest.mark.parametrize(
    "placed",
    [
        (alloc("p", "bad", resources=res(cpu=CPU_CAP)),),
        (alloc("p", "bad", resources=res(mem=MEM_CAP)),),
        (alloc("p", "bad", resources=res(disk=DISK_CAP)),),
        (
            alloc("p1", "bad", resources=res(ports=(8080,))),
            alloc("p2", "bad", slot=1, resources=res(ports=(8081,))),
        ),
    ],
    ids=["cpu-exactly-full", "memory-exactly-full", "disk-exactly-full", "distinct-ports"],
)
def test_fit__at_capacity__fits(h: Harness, placed: tuple[Allocation, ...]) -> None:
    e = evaluate(h, plan(place={"bad": placed}))

    assert e.result.rejected_nodes == ()
    assert upserted(e) == sorted(a.id for a in placed)


@pytest.mark.parametrize(
    "holder",
    [
        alloc("x", "bad", resources=res(cpu=CPU_CAP, ports=(8080,)), client_status=ALLOC_CLIENT_COMPLETE),
        alloc("x", "bad", resources=res(cpu=CPU_CAP, ports=(8080,)), desired_status=ALLOC_DESIRED_STOP),
    ],
    ids=["client-complete", "desired-stop"],
)
def test_fit__terminal_allocs_hold_nothing(h: Harness, holder: Allocation) -> None:
    h.add_alloc(holder)

    e = evaluate(h, plan(place={"bad": (alloc("p", "bad", resources=res(cpu=CPU_CAP, ports=(8080,))),)}))

    assert e.result.rejected_nodes == ()


def test_fit__allocs_on_other_nodes_do_not_count(h: Harness) -> None:
    h.add_alloc(alloc("x", "good", resources=res(cpu=CPU_CAP, ports=(8080,))))

    e = evaluate(h, plan(place={"bad": (alloc("p", "bad", resources=res(cpu=CPU_CAP, ports=(8080,))),)}))

    assert e.result.rejected_nodes == ()


# ---------------------------------------------------------------------------------------
# Stops in the same plan free resources and ports


@pytest.mark.parametrize(
    ("held", "wanted"),
    [
        (res(cpu=CPU_CAP), res(cpu=CPU_CAP)),
        (res(mem=MEM_CAP), res(mem=MEM_CAP)),
        (res(ports=(8080,)), res(ports=(8080,))),
    ],
    ids=["cpu", "memory", "port"],
)
def test_stop_in_same_plan__frees_for_placement(
    h: Harness, held: AllocatedResources, wanted: AllocatedResources
) -> None:
    h.add_alloc(alloc("old", "bad", resources=held, client_status=ALLOC_CLIENT_RUNNING))
    place = {"bad": (alloc("new", "bad", slot=1, resources=wanted),)}

    without_stop = evaluate(h, plan(place=place))
    with_stop = evaluate(h, plan(place=place, stop={"bad": ("old",)}))

    assert without_stop.result.rejected_nodes == ("bad",)
    assert with_stop.result.rejected_nodes == ()
    assert upserted(with_stop) == ["new"]
    assert stopped(with_stop) == ["old"]


def test_inplace_update__same_id_replaces__not_counted_twice(h: Harness) -> None:
    h.add_alloc(alloc("x", "bad", resources=res(cpu=3000, ports=(8080,)), client_status=ALLOC_CLIENT_RUNNING))

    updated = alloc("x", "bad", resources=res(cpu=3500, ports=(8080,)))
    e = evaluate(h, plan(place={"bad": (updated,)}))

    assert e.result.rejected_nodes == ()
    assert upserted(e) == ["x"]


# ---------------------------------------------------------------------------------------
# The entry


def test_entry__matches_accepted_part_and_applies_through_fsm(h: Harness) -> None:
    h.add_alloc(alloc("old-g", "good", client_status=ALLOC_CLIENT_RUNNING))
    h.add_alloc(alloc("old-b", "bad", resources=res(cpu=CPU_CAP), client_status=ALLOC_CLIENT_RUNNING))
    p = plan(
        place={
            "good": (alloc("g1", "good", slot=1), alloc("g2", "good", slot=2)),
            "bad": (alloc("b1", "bad"),),
        },
        stop={"good": ("old-g",)},
        eval_id="eval-42",
    )

    e = evaluate(h, p, now=NOW + 7)

    assert e.entry is not None
    assert e.entry.eval_id == "eval-42"
    assert e.entry.updated_at_ns == NOW + 7
    assert upserted(e) == ["g1", "g2"]
    assert [(s.alloc_id, s.desired_status) for s in e.entry.allocs_stopped] == [("old-g", ALLOC_DESIRED_STOP)]
    assert list(e.entry.nodes_ineligible) == []

    applied = apply_entry(h, e.entry)
    snap = h.snapshot()
    g1 = snap.alloc("g1")
    old = snap.alloc("old-g")
    assert g1 is not None and g1.node_id == "good" and g1.create_index == applied.index
    assert old is not None and old.desired_status == ALLOC_DESIRED_STOP
    assert snap.alloc("b1") is None


def test_entry__no_op_plan__none(h: Harness) -> None:
    e = evaluate(h, plan())

    assert e.entry is None
    assert e.result == PlanResult()


def test_entry__everything_rejected__none(h: Harness) -> None:
    h.add_node(mock.node(id="bad", status=NODE_STATUS_DOWN))

    e = evaluate(h, plan(place={"bad": (alloc("b", "bad"),)}))

    assert e.entry is None
    assert e.result.rejected_nodes == ("bad",)


# ---------------------------------------------------------------------------------------
# Fault injection


def test_fault_injection__rejects_placements_on_listed_nodes_only(h: Harness, logs: LogRecorder) -> None:
    h.add_node(mock.node(id="other"))
    p = plan(
        place={"bad": (alloc("b", "bad"),), "good": (alloc("g", "good"),)},
        stop={"other": ("o",)},
    )

    # Injected from the test side: the applier sees the nodes shrunk (tests/chaos/disagreement.py).
    e = evaluate_plan(
        p, disagreement.shrink_in_view(h.snapshot(), ["bad", "other"]), RejectionTracker(OFF), NOW
    )

    assert e.result.rejected_nodes == ("bad",)
    assert upserted(e) == ["g"]
    assert stopped(e) == ["o"], "stops on a fault node still fit"
    assert "does not fit" in logs.reasons()["bad"]


# ---------------------------------------------------------------------------------------
# Rejection tracker


def test_tracker__fires_when_rejections_exceed_threshold() -> None:
    tracker = RejectionTracker(RejectionTrackerConfig(threshold=3, window_ns=60 * SECOND))

    fired = [tracker.record("n1", NOW + i) for i in range(4)]

    assert fired == [False, False, False, True]


def test_tracker__forgets_node_after_firing() -> None:
    tracker = RejectionTracker(RejectionTrackerConfig(threshold=1, window_ns=60 * SECOND))
    tracker.record("n1", NOW)
    assert tracker.record("n1", NOW + 1)

    assert not tracker.record("n1", NOW + 2)
    assert tracker.record("n1", NOW + 3)


def test_tracker__sliding_window() -> None:
    window = 10 * SECOND
    tracker = RejectionTracker(RejectionTrackerConfig(threshold=2, window_ns=window))

    assert not tracker.record("n1", NOW)
    assert not tracker.record("n1", NOW + 5 * SECOND)
    # The first rejection is exactly one window old: it no longer counts.
    assert not tracker.record("n1", NOW + window)
    # Three inside (NOW+5s, NOW+10s, NOW+11s) are more than 2.
    assert tracker.record("n1", NOW + window + SECOND)


def test_tracker__spread_out_rejections_never_fire() -> None:
    window = 10 * SECOND
    tracker = RejectionTracker(RejectionTrackerConfig(threshold=2, window_ns=window))

    assert not any(tracker.record("n1", NOW + i * (window // 2)) for i in range(50))


def test_tracker__counts_per_node() -> None:
    tracker = RejectionTracker(RejectionTrackerConfig(threshold=1, window_ns=60 * SECOND))

    assert not tracker.record("n1", NOW)
    assert not tracker.record("n2", NOW)
    assert tracker.record("n2", NOW + 1)
    assert tracker.record("n1", NOW + 1)


def test_tracker__disabled__never_fires() -> None:
    tracker = RejectionTracker(RejectionTrackerConfig(enabled=False, threshold=0, window_ns=60 * SECOND))

    assert not any(tracker.record("n1", NOW + i) for i in range(100))


def test_tracker__default_config__fires_after_five() -> None:
    tracker = RejectionTracker(RejectionTrackerConfig())

    assert [tracker.record("n1", NOW + i) for i in range(6)] == [False] * 5 + [True]


def _full_bad_node(h: Harness) -> Plan:
    h.add_alloc(alloc("x", "bad", resources=res(cpu=CPU_CAP), client_status=ALLOC_CLIENT_RUNNING))
    return plan(place={"bad": (alloc("p", "bad", slot=1),), "good": (alloc("g", "good"),)})


def test_tracker_fires__entry_marks_node_ineligible_with_event(h: Harness) -> None:
    p = _full_bad_node(h)
    tracker = RejectionTracker(RejectionTrackerConfig(threshold=1, window_ns=300 * SECOND))

    first = evaluate(h, p, tracker)
    second = evaluate(h, p, tracker, now=NOW + SECOND)

    assert first.entry is not None and list(first.entry.nodes_ineligible) == []
    assert second.entry is not None
    assert second.result.rejected_nodes == ("bad",)
    assert upserted(second) == ["g"]
    [marked] = second.entry.nodes_ineligible
    assert marked.node_id == "bad"
    assert marked.event.message == "Node marked ineligible: plans rejected more than 1 times within 300s"
    assert marked.event.subsystem == "Scheduler"
    assert marked.event.details["last_reason"] == "does not fit: cpu"
    assert marked.event.timestamp_ns == NOW + SECOND

    applied = apply_entry(h, second.entry)
    node = h.snapshot().node("bad")
    assert node is not None
    assert node.scheduling_eligibility == NODE_INELIGIBLE
    assert node.modify_index == applied.index
    assert node.events[-1].message == marked.event.message
    assert node.events[-1].details["last_reason"] == "does not fit: cpu"
    good = h.snapshot().node("good")
    assert good is not None and good.scheduling_eligibility != NODE_INELIGIBLE


def test_tracker_fires__even_when_nothing_else_commits(h: Harness) -> None:
    h.add_alloc(alloc("x", "bad", resources=res(cpu=CPU_CAP), client_status=ALLOC_CLIENT_RUNNING))
    p = plan(place={"bad": (alloc("p", "bad", slot=1),)})
    tracker = RejectionTracker(RejectionTrackerConfig(threshold=0, window_ns=300 * SECOND))

    e = evaluate(h, p, tracker)

    assert e.entry is not None, "marking a node ineligible is work to commit"
    assert upserted(e) == []
    assert [n.node_id for n in e.entry.nodes_ineligible] == ["bad"]


def test_tracker_fires__all_at_once__only_the_ineligibility_commits(h: Harness) -> None:
    p = replace(_full_bad_node(h), all_at_once=True)
    tracker = RejectionTracker(RejectionTrackerConfig(threshold=0, window_ns=300 * SECOND))

    e = evaluate(h, p, tracker)

    assert e.entry is not None
    assert upserted(e) == []
    assert [n.node_id for n in e.entry.nodes_ineligible] == ["bad"]


def test_tracker_disabled__repeated_rejections_never_mark(h: Harness) -> None:
    p = _full_bad_node(h)
    tracker = RejectionTracker(OFF)

    for i in range(20):
        e = evaluate(h, p, tracker, now=NOW + i)
        assert e.entry is not None and list(e.entry.nodes_ineligible) == []


# ---------------------------------------------------------------------------------------
# Plan queue


def test_plan_queue__priority_then_fifo() -> None:
    q = PlanQueue()
    q.set_enabled(True)
    for eval_id, priority in [("lo", 10), ("mid-1", 50), ("hi", 90), ("mid-2", 50), ("mid-3", 50)]:
        q.enqueue(plan(eval_id=eval_id, priority=priority))

    order = []
    while (pending := q.dequeue(timeout=0)) is not None:
        order.append(pending.plan.eval_id)

    assert order == ["hi", "mid-1", "mid-2", "mid-3", "lo"]


def test_plan_queue__empty__dequeue_times_out() -> None:
    q = PlanQueue()
    q.set_enabled(True)

    assert q.dequeue(timeout=0.01) is None


def test_plan_queue__waiting_dequeue_wakes_on_enqueue() -> None:
    q = PlanQueue()
    q.set_enabled(True)
    got: list[PendingPlan | None] = []
    done = threading.Event()

    def applier() -> None:
        got.append(q.dequeue(timeout=10))
        done.set()

    thread = threading.Thread(target=applier, daemon=True)
    thread.start()
    q.enqueue(plan(eval_id="e1"))

    # The dequeue's own timeout (10 s) is longer than this wait and would return None:
    # finishing here with the plan means the enqueue woke it.
    assert done.wait(timeout=5)
    thread.join(timeout=5)
    assert got[0] is not None and got[0].plan.eval_id == "e1"


def test_plan_queue__disabled__enqueue_fails_future() -> None:
    q = PlanQueue()

    future = q.enqueue(plan())

    with pytest.raises(PlanRejectedError):
        future.result(timeout=1)
    assert q.dequeue(timeout=0) is None


def test_plan_queue__set_enabled_false__fails_waiting_futures() -> None:
    q = PlanQueue()
    q.set_enabled(True)
    futures = [q.enqueue(plan(eval_id=f"e{i}")) for i in range(3)]

    q.set_enabled(False)

    for future in futures:
        with pytest.raises(PlanRejectedError):
            future.result(timeout=1)
    assert q.dequeue(timeout=0) is None
    q.set_enabled(True)
    assert q.dequeue(timeout=0) is None, "flushed plans do not come back"


# ---------------------------------------------------------------------------------------
# PlanApplier end to end (in-process, no raft)


class FakeRaft:
    """``propose_async`` that applies the entry bytes through a real FSM on the same store.

    With a ``gate``, each apply runs on its own thread once the gate opens (raft latency);
    without one, it applies synchronously inside ``propose_async``.
    """

    def __init__(self, fsm: FSM, gate: threading.Event | None = None) -> None:
        self.fsm = fsm
        self.gate = gate
        # Raft errors: for every proposal, or for the n-th (1-based) only.
        self.fail_with = ""
        self.fail_nth: dict[int, str] = {}
        self.proposed = 0
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def propose_async(self, data: bytes, callback: Callable[[ApplyResult | None, str], None]) -> None:
        self.proposed += 1
        error = self.fail_nth.get(self.proposed, self.fail_with)
        if self.gate is None:
            self._apply(data, callback, error)
            return
        gate = self.gate

        def later() -> None:
            assert gate.wait(timeout=10), "gate never opened"
            self._apply(data, callback, error)

        thread = threading.Thread(target=later, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _apply(self, data: bytes, callback: Callable[[ApplyResult | None, str], None], error: str) -> None:
        if error:
            callback(None, error)
            return
        with self._lock:
            result = self.fsm.apply(data, self.fsm.store.index + 1)
        callback(result, "")


@dataclass
class Cluster:
    h: Harness
    broker: EvalBroker
    queue: PlanQueue
    raft: FakeRaft
    leader: bool = True
    appliers: list[PlanApplier] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)

    def start(self) -> PlanApplier:
        applier = PlanApplier(
            self.queue,
            self.h.store,
            self.raft.propose_async,
            self.broker.outstanding,
            lambda: NOW,
            lambda: self.leader,
        )
        applier.start()
        self.appliers.append(applier)
        return applier

    def deliver(self, eval_id: str, job_id: str) -> str:
        """Enqueue and dequeue an eval so that its token is outstanding."""
        self.broker.enqueue(Evaluation(id=eval_id, job_id=job_id), NOW)
        got = self.broker.dequeue(NOW, timeout=0)
        assert got is not None and got[0].id == eval_id
        self.tokens[eval_id] = got[1]
        return got[1]

    def submit(self, p: Plan) -> Future[PlanResult]:
        return self.queue.enqueue(p)

    def apply_entry(self, data: bytes) -> None:
        result = self.raft.fsm.apply(data, self.h.store.index + 1)
        assert not result.error, result.error


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    h = Harness()
    h.add_node(mock.node(id="n1"))
    h.add_node(mock.node(id="n2"))
    broker = EvalBroker()
    broker.set_enabled(True)
    queue = PlanQueue()
    queue.set_enabled(True)
    c = Cluster(h, broker, queue, FakeRaft(FSM(h.store)))
    yield c
    if c.raft.gate is not None:
        c.raft.gate.set()
    for applier in c.appliers:
        applier.stop()
    for thread in c.raft.threads:
        thread.join(timeout=10)


def big(alloc_id: str, node_id: str, slot: int = 0) -> Allocation:
    """Takes 3000 of the node's 3900 MHz: two never fit on one node."""
    return alloc(alloc_id, node_id, slot=slot, resources=res(cpu=3000))


def test_applier__fitting_plan__committed_through_fsm(cluster: Cluster) -> None:
    cluster.start()
    token = cluster.deliver("e1", "web1")
    p = plan(place={"n1": (big("a1", "n1"),)}, eval_id="e1", eval_token=token)

    result = cluster.submit(p).result(timeout=10)

    assert result.rejected_nodes == ()
    assert result.refresh_index == 0
    assert result.alloc_index == cluster.h.store.index
    stored = cluster.h.snapshot().alloc("a1")
    assert stored is not None and stored.create_index == result.alloc_index


def test_applier__committed_plan__expected_state_released_at_once(cluster: Cluster) -> None:
    """The applier's predicted state is a second copy of every alloc: it must not outlive
    the commit waiting for a next plan that may never come."""
    applier = cluster.start()
    token = cluster.deliver("e1", "web1")
    p = plan(place={"n1": (big("a1", "n1"),)}, eval_id="e1", eval_token=token)

    cluster.submit(p).result(timeout=10)

    assert applier._inflight is None


def test_applier__failed_commit__expected_state_kept_for_the_recheck(cluster: Cluster) -> None:
    applier = cluster.start()
    cluster.raft.fail_with = "leadership lost"
    token = cluster.deliver("e1", "web1")
    p = plan(place={"n1": (big("a1", "n1"),)}, eval_id="e1", eval_token=token)

    with pytest.raises(Exception, match="leadership lost"):
        cluster.submit(p).result(timeout=10)

    # The next plan must learn that what this one predicted never happened.
    assert applier._inflight is not None and applier._inflight[0].exception() is not None


def test_applier__late_commit_callback__never_clears_the_next_plan(cluster: Cluster) -> None:
    """Raft's thread clears plan N's predicted state after N commits; by then the applier
    thread may already hold plan N+1 in flight, which must survive that clear."""
    applier = cluster.start()
    empty = cluster.h.snapshot().tables
    plan_n: Future[int] = Future()
    plan_n_plus_1: Future[int] = Future()
    inflight_n, inflight_n_plus_1 = (plan_n, empty), (plan_n_plus_1, empty)
    applier._set_inflight(inflight_n_plus_1)

    applier._clear_inflight(inflight_n)

    assert applier._inflight is inflight_n_plus_1
    applier._clear_inflight(inflight_n_plus_1)
    assert applier._inflight is None


def test_applier__second_plan_on_full_node__rejected_with_refresh_index(cluster: Cluster) -> None:
    cluster.start()
    t1 = cluster.deliver("e1", "web1")
    t2 = cluster.deliver("e2", "web2")

    first = cluster.submit(plan(place={"n1": (big("a1", "n1"),)}, eval_id="e1", eval_token=t1)).result(10)
    second = cluster.submit(
        plan(place={"n1": (big("a2", "n1"),), "n2": (big("a3", "n2"),)}, eval_id="e2", eval_token=t2)
    ).result(10)

    assert first.rejected_nodes == ()
    assert second.rejected_nodes == ("n1",)
    assert set(second.node_allocation) == {"n2"}
    assert second.refresh_index >= first.alloc_index
    assert second.refresh_index == second.alloc_index, "the worker must see its own partial commit"
    snap = cluster.h.snapshot()
    assert snap.alloc("a1") is not None
    assert snap.alloc("a2") is None
    assert snap.alloc("a3") is not None


def test_applier__pipelined__second_plan_sees_first_before_raft_applies_it(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    cluster.raft.gate = gate
    seen: dict[str, tuple[int, int, bool]] = {}
    real = plan_apply.evaluate_plan

    def observing(p: Plan, snap: Snapshot, *args: Any, **kw: Any) -> Evaluated:
        # (view index, store index, does the view hold a1) when the applier evaluated p.
        seen[p.eval_id] = (snap.index, cluster.h.store.index, snap.alloc("a1") is not None)
        out = real(p, snap, *args, **kw)
        if p.eval_id == "e2":
            gate.set()  # raft "commits" plan 1 only after plan 2 was evaluated
        return out

    monkeypatch.setattr(plan_apply, "evaluate_plan", observing)
    t1 = cluster.deliver("e1", "web1")
    t2 = cluster.deliver("e2", "web2")
    start_index = cluster.h.store.index
    f1 = cluster.submit(plan(place={"n1": (big("a1", "n1"),)}, eval_id="e1", eval_token=t1))
    f2 = cluster.submit(plan(place={"n1": (big("a2", "n1"),)}, eval_id="e2", eval_token=t2))
    cluster.start()

    second = f2.result(timeout=10)
    first = f1.result(timeout=10)

    view_index, store_index, view_has_a1 = seen["e2"]
    assert store_index == start_index, "plan 1 was still in raft when plan 2 was evaluated"
    assert view_has_a1, "plan 2 was evaluated against the in-flight plan's effects"
    assert view_index == start_index + 1
    assert first.rejected_nodes == () and first.alloc_index == start_index + 1
    assert second.rejected_nodes == ("n1",)
    assert second.refresh_index >= first.alloc_index
    snap = cluster.h.snapshot()
    assert snap.alloc("a1") is not None
    assert snap.alloc("a2") is None, "the node was over-committed"


def test_applier__pipelined__non_conflicting_plans_both_commit(cluster: Cluster) -> None:
    cluster.raft.gate = threading.Event()
    t1 = cluster.deliver("e1", "web1")
    t2 = cluster.deliver("e2", "web2")
    f1 = cluster.submit(plan(place={"n1": (big("a1", "n1"),)}, eval_id="e1", eval_token=t1))
    f2 = cluster.submit(plan(place={"n2": (big("a2", "n2"),)}, eval_id="e2", eval_token=t2))
    cluster.start()
    cluster.raft.gate.set()

    first, second = f1.result(timeout=10), f2.result(timeout=10)

    assert first.rejected_nodes == second.rejected_nodes == ()
    assert second.alloc_index > first.alloc_index
    snap = cluster.h.snapshot()
    assert snap.alloc("a1") is not None and snap.alloc("a2") is not None


def test_applier__token_not_outstanding__plan_rejected(cluster: Cluster) -> None:
    cluster.start()
    token = cluster.deliver("e1", "web1")
    before = cluster.h.store.index

    with pytest.raises(PlanRejectedError):
        cluster.submit(plan(place={"n1": (big("a1", "n1"),)}, eval_id="e1", eval_token="forged")).result(10)
    with pytest.raises(PlanRejectedError):
        cluster.submit(
            plan(place={"n1": (big("a1", "n1"),)}, eval_id="never-dequeued", eval_token=token)
        ).result(10)
    cluster.broker.ack("e1", token)
    with pytest.raises(PlanRejectedError):
        cluster.submit(plan(place={"n1": (big("a1", "n1"),)}, eval_id="e1", eval_token=token)).result(10)

    assert cluster.h.store.index == before
    assert cluster.raft.proposed == 0


def test_applier__leadership_lost__plan_rejected_nothing_proposed(cluster: Cluster) -> None:
    cluster.start()
    cluster.leader = False
    token = cluster.deliver("e1", "web1")

    with pytest.raises(PlanRejectedError):
        cluster.submit(plan(place={"n1": (big("a1", "n1"),)}, eval_id="e1", eval_token=token)).result(10)
    assert cluster.raft.proposed == 0


def test_applier__raft_error__plan_rejected__next_plan_uses_real_state(cluster: Cluster) -> None:
    cluster.start()
    t1 = cluster.deliver("e1", "web1")
    t2 = cluster.deliver("e2", "web2")
    cluster.raft.fail_with = "not the leader"

    with pytest.raises(PlanRejectedError, match="not the leader"):
        cluster.submit(plan(place={"n1": (big("a1", "n1"),)}, eval_id="e1", eval_token=t1)).result(10)

    cluster.raft.fail_with = ""
    second = cluster.submit(plan(place={"n1": (big("a2", "n1"),)}, eval_id="e2", eval_token=t2)).result(10)
    assert second.rejected_nodes == (), "the failed plan's effects must not linger in the view"
    assert cluster.h.snapshot().alloc("a1") is None


def test_applier__tracker_config_from_state__node_marked_ineligible(cluster: Cluster) -> None:
    cluster.apply_entry(
        mock.scheduler_config_entry(
            SchedulerConfig(rejection_tracker=RejectionTrackerConfig(threshold=0, window_ns=300 * SECOND))
        )
    )
    cluster.apply_entry(mock.plan_entry([big("x", "n1")]))
    cluster.start()
    token = cluster.deliver("e1", "web1")

    result = cluster.submit(
        plan(
            place={"n1": (big("a1", "n1", slot=1),), "n2": (big("a2", "n2"),)}, eval_id="e1", eval_token=token
        )
    ).result(10)

    assert result.rejected_nodes == ("n1",)
    node = cluster.h.snapshot().node("n1")
    assert node is not None and node.scheduling_eligibility == NODE_INELIGIBLE
    assert "plans rejected more than 0 times" in node.events[-1].message
    assert cluster.h.snapshot().alloc("a2") is not None


def test_applier__test_build_with_shrunk_nodes__rejects_listed_node(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Injected from the test side, as the cluster tests do: the applier sees n1 shrunk.
    control = disagreement.DisagreementControl(tmp_path / "disagree.json", ["n1", "unused"])
    monkeypatch.setattr(plan_apply, "evaluate_plan", plan_apply.evaluate_plan)  # undone after the test
    watcher = disagreement.install(str(control.path))
    try:
        cluster.start()
        token = cluster.deliver("e1", "web1")

        result = cluster.submit(
            plan(
                place={"n1": (alloc("a1", "n1"),), "n2": (alloc("a2", "n2"),)}, eval_id="e1", eval_token=token
            )
        ).result(10)
    finally:
        watcher.close()

    assert result.rejected_nodes == ("n1",)
    assert cluster.h.snapshot().alloc("a1") is None
    assert cluster.h.snapshot().alloc("a2") is not None


def test_applier__stop_and_place_same_port__committed(cluster: Cluster) -> None:
    cluster.apply_entry(mock.plan_entry([alloc("old", "n1", resources=res(ports=(8080,)))]))
    cluster.start()
    token = cluster.deliver("e1", "web1")

    result = cluster.submit(
        plan(
            place={"n1": (alloc("new", "n1", slot=1, resources=res(ports=(8080,))),)},
            stop={"n1": ("old",)},
            eval_id="e1",
            eval_token=token,
        )
    ).result(10)

    assert result.rejected_nodes == ()
    snap = cluster.h.snapshot()
    old, new = snap.alloc("old"), snap.alloc("new")
    assert old is not None and old.desired_status == ALLOC_DESIRED_STOP
    assert new is not None


def test_applier__stops_only_plan_on_missing_node__committed(cluster: Cluster) -> None:
    cluster.apply_entry(mock.plan_entry([alloc("old", "gone")]))
    cluster.start()
    token = cluster.deliver("e1", "web1")

    result = cluster.submit(plan(stop={"gone": ("old",)}, eval_id="e1", eval_token=token)).result(10)

    assert result.rejected_nodes == ()
    assert result.node_update == {
        "gone": (AllocStop(alloc_id="old", desired_description=mock.stop("old").desired_description),)
    }
    old = cluster.h.snapshot().alloc("old")
    assert old is not None and old.desired_status == ALLOC_DESIRED_STOP


def test_applier__pipelined__inflight_plan_fails__next_plan_not_committed_on_its_effects(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster.apply_entry(
        mock.plan_entry(
            [alloc("old", "n1", resources=res(ports=(8080,)), client_status=ALLOC_CLIENT_RUNNING)]
        )
    )
    gate = threading.Event()
    cluster.raft.gate = gate
    cluster.raft.fail_nth = {1: "QUEUE_FULL"}  # plan 1 never reaches the log; still leader
    real = plan_apply.evaluate_plan

    def open_gate_after_plan_2(p: Plan, snap: Snapshot, *args: Any, **kw: Any) -> Evaluated:
        out = real(p, snap, *args, **kw)
        if p.eval_id == "e2":
            gate.set()
        return out

    monkeypatch.setattr(plan_apply, "evaluate_plan", open_gate_after_plan_2)
    t1 = cluster.deliver("e1", "web1")
    t2 = cluster.deliver("e2", "web2")
    f1 = cluster.submit(plan(stop={"n1": ("old",)}, eval_id="e1", eval_token=t1))
    f2 = cluster.submit(
        plan(
            place={"n1": (alloc("new", "n1", slot=1, resources=res(ports=(8080,))),)},
            eval_id="e2",
            eval_token=t2,
        )
    )
    cluster.start()

    with pytest.raises(PlanRejectedError):
        f1.result(timeout=10)
    try:
        f2.result(timeout=10)
    except PlanRejectedError:
        pass  # refusing plan 2 is a correct outcome too

    snap = cluster.h.snapshot()
    node = snap.node("n1")
    assert node is not None
    fit = allocs_fit(node, snap.allocs_by_node("n1"))
    assert fit.fits, f"committed state over-commits n1: {fit.reason}"


def test_split_entry__big_plan__stops_first_chunks_bounded_evals_last() -> None:
    from drover.server.plan_apply import MAX_ALLOCS_PER_ENTRY, split_entry
    from drover.v1 import raft_pb2 as rpb

    entry = rpb.ApplyPlanResultsEntry(eval_id="e1", updated_at_ns=5)
    for i in range(3):
        entry.allocs_stopped.add(alloc_id=f"s{i}")
    for i in range(2 * MAX_ALLOCS_PER_ENTRY):
        entry.allocs_upserted.add(id=f"a{i}")
    entry.evals.add(id="follow-up")
    entry.nodes_ineligible.add(node_id="n1")

    chunks = split_entry(entry)

    assert len(chunks) == 3
    assert all(len(c.allocs_stopped) + len(c.allocs_upserted) <= MAX_ALLOCS_PER_ENTRY for c in chunks)
    assert [s.alloc_id for s in chunks[0].allocs_stopped] == ["s0", "s1", "s2"]
    assert [a.id for c in chunks for a in c.allocs_upserted] == [
        f"a{i}" for i in range(2 * MAX_ALLOCS_PER_ENTRY)
    ]
    assert [len(c.evals) for c in chunks] == [0, 0, 1] and len(chunks[-1].nodes_ineligible) == 1
    assert split_entry(rpb.ApplyPlanResultsEntry(eval_id="small")) == [
        rpb.ApplyPlanResultsEntry(eval_id="small")
    ]
