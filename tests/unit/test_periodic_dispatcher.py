"""The periodic dispatcher (server/periodic.py) and the FSM rules behind it, in process.

A ``Cluster`` here is one real StateStore + FSM fed by a proposer that applies each entry at
the next raft index, like a committed log; "servers" are dispatchers sharing it, so a leader
change is: disable one dispatcher, enable another (it rebuilds from state). Time is a
``FakeClock`` the test moves; nothing sleeps. docs/design.md#invariant-2 (summaries equal a recount, none
negative) is checked after every entry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import pytest

from drover.scheduler.periodic import derive_dispatched_child, periodic_child_id
from drover.scheduler.structs import (
    ALLOC_CLIENT_COMPLETE,
    ALLOC_CLIENT_RUNNING,
    EVAL_STATUS_COMPLETE,
    JOB_STATUS_DEAD,
    JOB_STATUS_PENDING,
    JOB_STATUS_RUNNING,
    TRIGGER_PERIODIC_JOB,
    Evaluation,
    Job,
    JobChildrenSummary,
    ParameterizedConfig,
    PeriodicConfig,
    TaskGroupSummary,
)
from drover.server.codec import to_proto
from drover.server.endpoints import Endpoints
from drover.server.errors import ConflictError, NotFoundError, ValidationError
from drover.server.fsm import FSM, ApplyResult, encode_entry
from drover.server.periodic import (
    LAUNCHED,
    SKIPPED_OVERLAP,
    LaunchOutcome,
    PeriodicDispatcher,
    force_launch_ns,
    launch_entry,
)
from drover.server.snapshot import state_digest
from drover.server.state_store import Snapshot, StateStore, Txn
from drover.v1 import raft_pb2
from tests.fixtures import mock

ET = raft_pb2.EntryType
S = mock.SECOND
MIN = mock.MINUTE
# 2023-11-14 22:13:20 UTC; the cron below fires on every whole minute.
T0 = mock.NOW
EVERY_MINUTE = PeriodicConfig(spec="* * * * *", time_zone="UTC")


def minute(n: int) -> int:
    """The n-th whole minute after T0 (T0 itself is 20 s past a minute)."""
    return T0 - T0 % MIN + n * MIN


@dataclass
class FakeClock:
    now: int = T0

    def now_ns(self) -> int:
        return self.now


@dataclass
class Cluster:
    store: StateStore = field(default_factory=StateStore)
    clock: FakeClock = field(default_factory=FakeClock)
    index: int = 0
    ids: mock.Counter = field(default_factory=lambda: mock.Counter("eval"))

    def __post_init__(self) -> None:
        self.fsm = FSM(self.store)

    def propose(self, data: bytes, timeout: float = 0.0) -> ApplyResult:
        self.index += 1
        result = self.fsm.apply(data, self.index)
        problems = mock.summary_problems(self.snap.tables)
        assert not problems, f"summaries differ from a recount at index {self.index}:\n" + "\n".join(problems)
        return result

    def apply(self, data: bytes) -> ApplyResult:
        result = self.propose(data)
        assert not result.error, result.error
        return result

    @property
    def snap(self) -> Snapshot:
        return self.store.snapshot()

    def server(self, *, enabled: bool = True) -> PeriodicDispatcher:
        dispatcher = PeriodicDispatcher(self.store, self.propose, self.clock, self.ids)
        if enabled:
            dispatcher.set_enabled(True, run_loop=False)
        return dispatcher

    def register(self, job: Job, *, at: int = T0) -> Job:
        self.apply(mock.register_job_entry(replace(job, submit_time_ns=at)))
        stored = self.snap.job(job.namespace, job.id)
        assert stored is not None
        return stored

    def children(self, parent: Job) -> list[Job]:
        return sorted(self.snap.children(parent.namespace, parent.id), key=lambda j: j.id)

    def counts(self, parent: Job) -> JobChildrenSummary:
        summary = self.snap.job_summary(parent.namespace, parent.id)
        assert summary is not None and summary.children is not None
        return summary.children

    def launched_at(self, parent: Job) -> int | None:
        launch = self.snap.periodic_launch(parent.namespace, parent.id)
        return None if launch is None else launch.launch_ns

    def finish(self, child: Job, node_id: str = "node-x") -> None:
        """Run the child's one alloc to completion and complete its eval."""
        [ev] = self.snap.evals_by_job(child.namespace, child.id)
        alloc = mock.alloc(child, mock.node(id=node_id), eval_id=ev.id, id=f"alloc-{child.id}")
        self.apply(mock.plan_entry([alloc], eval_id=ev.id))
        self.apply(mock.client_update_entry(alloc.id, ALLOC_CLIENT_RUNNING))
        done = replace(ev, status=EVAL_STATUS_COMPLETE)
        self.apply(mock.client_update_entry(alloc.id, ALLOC_CLIENT_COMPLETE, evals=[done]))


def outcomes(result: list[LaunchOutcome]) -> list[tuple[str, int]]:
    return [(o.outcome, o.launch_ns) for o in result]


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


def cron_job(job_id: str = "report", **periodic: object) -> Job:
    return mock.periodic_job(id=job_id, periodic=replace(EVERY_MINUTE, **periodic))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# Launching on schedule


def test_dispatcher__launches_each_slot_once_with_child_eval_and_record_in_one_entry(
    cluster: Cluster,
) -> None:
    parent = cluster.register(cron_job())
    leader = cluster.server()

    assert leader.tick(minute(1) - 1) == []
    index_before = cluster.index
    assert outcomes(leader.tick(minute(1))) == [(LAUNCHED, minute(1))]
    assert cluster.index == index_before + 1, "child, eval and launch record are one entry"
    assert leader.tick(minute(1) + 30 * S) == []

    [child] = cluster.children(parent)
    assert child.id == periodic_child_id(parent.id, minute(1))
    assert (child.status, child.version, child.periodic) == (JOB_STATUS_PENDING, 0, None)
    [ev] = cluster.snap.evals_by_job(child.namespace, child.id)
    assert ev.triggered_by == TRIGGER_PERIODIC_JOB
    assert cluster.launched_at(parent) == minute(1)
    assert cluster.counts(parent) == JobChildrenSummary(pending=1)


def test_dispatcher__slow_tick__one_launch_for_the_latest_slot(cluster: Cluster) -> None:
    parent = cluster.register(cron_job())
    leader = cluster.server()

    assert outcomes(leader.tick(minute(3) + 5 * S)) == [(LAUNCHED, minute(3))]
    assert [c.id for c in cluster.children(parent)] == [periodic_child_id(parent.id, minute(3))]


def test_dispatcher__disabled__launches_nothing(cluster: Cluster) -> None:
    parent = cluster.register(cron_job())
    follower = cluster.server(enabled=False)

    assert follower.tick(minute(5)) == []
    assert cluster.children(parent) == []


def test_dispatcher__registered_after_a_slot__does_not_launch_it(cluster: Cluster) -> None:
    cluster.register(cron_job(), at=minute(2) + 10 * S)
    leader = cluster.server()

    assert leader.tick(minute(2) + 30 * S) == []
    assert leader.next_launches() == {("default", "report"): minute(3)}


def test_dispatcher__re_registered_before_its_next_slot__next_slot_kept_without_recomputing(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    import drover.server.periodic as periodic_module

    calls: list[int] = []
    real = periodic_module.next_periodic_launch

    def counting(config: PeriodicConfig, after_ns: int) -> int | None:
        calls.append(after_ns)
        return real(config, after_ns)

    monkeypatch.setattr(periodic_module, "next_periodic_launch", counting)
    job = cron_job()
    cluster.register(job, at=T0)
    leader = cluster.server()
    assert leader.tick(T0) == []
    assert leader.next_launches() == {("default", "report"): minute(1)}
    computed = len(calls)

    cluster.register(replace(job, meta={"write": "2"}), at=minute(0) + 50 * S)
    assert leader.tick(minute(0) + 55 * S) == []
    assert leader.next_launches() == {("default", "report"): minute(1)}
    assert len(calls) == computed, "a baseline before the next slot must not call croniter"

    # A baseline at or past the next slot moves it (here a submit time past the tick's clock).
    cluster.register(replace(job, meta={"write": "3"}), at=minute(1) + 5 * S)
    assert leader.tick(minute(0) + 58 * S) == []
    assert leader.next_launches() == {("default", "report"): minute(2)}


def test_dispatcher__stopped_or_disabled_parent__untracked(cluster: Cluster) -> None:
    cluster.register(cron_job("a"))
    cluster.register(cron_job("b", enabled=False))
    leader = cluster.server()
    leader.tick(T0)
    assert set(leader.next_launches()) == {("default", "a")}

    cluster.apply(mock.deregister_entry("a"))

    assert leader.tick(minute(2)) == []
    assert leader.next_launches() == {}


# ---------------------------------------------------------------------------------------
# Leader changes


def test_leader_change__new_leader_never_relaunches_a_slot(cluster: Cluster) -> None:
    parent = cluster.register(cron_job())
    first = cluster.server()
    assert outcomes(first.tick(minute(1))) == [(LAUNCHED, minute(1))]

    # Leadership moves within the same minute: the new leader rebuilds from state.
    first.set_enabled(False)
    second = cluster.server()
    assert second.tick(minute(1) + 10 * S) == []
    assert outcomes(second.tick(minute(2))) == [(LAUNCHED, minute(2))]

    # And back again, while the old leader's view is stale: still one child per slot.
    second.set_enabled(False)
    first.set_enabled(True, run_loop=False)
    assert first.tick(minute(2) + 1) == []
    assert [c.id for c in cluster.children(parent)] == [
        periodic_child_id(parent.id, minute(1)),
        periodic_child_id(parent.id, minute(2)),
    ]


def test_two_leaders_at_once__the_fsm_lets_one_launch_per_slot(cluster: Cluster) -> None:
    """pysyncobj may briefly report two leaders. Both decide on the same state and propose
    the slot, each with its own eval and clock reading; the log keeps the first."""
    parent = cluster.register(cron_job())
    from_a = launch_entry(parent, minute(1), minute(1) + 1, "eval-a")
    from_b = launch_entry(parent, minute(1), minute(1) + 7, "eval-b")

    first = cluster.propose(encode_entry(ET.ENTRY_TYPE_JOB_REGISTER, from_a))
    second = cluster.propose(encode_entry(ET.ENTRY_TYPE_JOB_REGISTER, from_b))

    assert not first.error
    assert "already launched" in second.error
    assert [c.id for c in cluster.children(parent)] == [periodic_child_id(parent.id, minute(1))]
    assert cluster.snap.eval("eval-b") is None
    # A dispatcher rebuilt from this state sees the slot taken.
    assert cluster.server().tick(minute(1)) == []


def test_leader_down_across_two_slots__exactly_one_catch_up_launch(cluster: Cluster) -> None:
    parent = cluster.register(cron_job())
    old = cluster.server()
    assert outcomes(old.tick(minute(1))) == [(LAUNCHED, minute(1))]
    old.set_enabled(False)  # the leader dies; no one leads through minutes 2 and 3

    new = cluster.server()
    launched = new.tick(minute(3) + 40 * S)

    assert outcomes(launched) == [(LAUNCHED, minute(3))]
    assert new.tick(minute(3) + 50 * S) == []
    assert outcomes(new.tick(minute(4))) == [(LAUNCHED, minute(4))]
    assert [c.id for c in cluster.children(parent)] == [
        periodic_child_id(parent.id, m) for m in (minute(1), minute(3), minute(4))
    ]


def test_leader_change__parent_status_running__children_still_start_pending(cluster: Cluster) -> None:
    """docs/field-reports.md#field-report-2: the new leader's parent copy says "running"; children
    must not inherit it."""
    parent = cluster.register(cron_job())
    assert parent.status == JOB_STATUS_RUNNING
    old = cluster.server()
    old.tick(minute(1))
    [first] = cluster.children(parent)
    cluster.finish(first)
    old.set_enabled(False)

    new = cluster.server()
    new.tick(minute(2))
    new.tick(minute(3))

    statuses = [c.status for c in cluster.children(parent)]
    assert statuses == [JOB_STATUS_DEAD, JOB_STATUS_PENDING, JOB_STATUS_PENDING]
    assert cluster.counts(parent) == JobChildrenSummary(pending=2, running=0, dead=1)


# ---------------------------------------------------------------------------------------
# prohibit_overlap


def test_prohibit_overlap__child_still_running__scheduled_slot_skipped(cluster: Cluster) -> None:
    parent = cluster.register(cron_job(prohibit_overlap=True))
    leader = cluster.server()
    assert outcomes(leader.tick(minute(1))) == [(LAUNCHED, minute(1))]

    assert outcomes(leader.tick(minute(2))) == [(SKIPPED_OVERLAP, minute(2))]
    assert cluster.launched_at(parent) == minute(1), "a skipped slot is not recorded"

    [child] = cluster.children(parent)
    cluster.finish(child)
    assert outcomes(leader.tick(minute(3))) == [(LAUNCHED, minute(3))]


def test_prohibit_overlap__new_leader_with_a_child_running__no_catch_up(cluster: Cluster) -> None:
    parent = cluster.register(cron_job(prohibit_overlap=True))
    old = cluster.server()
    old.tick(minute(1))
    old.set_enabled(False)

    new = cluster.server()
    assert outcomes(new.tick(minute(3) + 10 * S)) == [(SKIPPED_OVERLAP, minute(3))]
    assert len(cluster.children(parent)) == 1

    # The child ends; the next leader finds minute 3 missed and launches once for it.
    cluster.finish(cluster.children(parent)[0])
    new.set_enabled(False)
    newer = cluster.server()
    assert outcomes(newer.tick(minute(3) + 20 * S)) == [(LAUNCHED, minute(3))]


# ---------------------------------------------------------------------------------------
# The FSM's side of a launch


def _launch(cluster: Cluster, parent: Job, slot: int) -> ApplyResult:
    entry = launch_entry(parent, slot, cluster.clock.now, cluster.ids.new())
    return cluster.propose(encode_entry(ET.ENTRY_TYPE_JOB_REGISTER, entry))


@pytest.mark.parametrize("offset", [0, -MIN], ids=["same-slot", "earlier-slot"])
def test_fsm__launch_at_or_before_the_recorded_one__refused_and_nothing_written(
    cluster: Cluster, offset: int
) -> None:
    parent = cluster.register(cron_job())
    assert not _launch(cluster, parent, minute(5)).error
    before = state_digest(cluster.snap.tables)

    result = _launch(cluster, parent, minute(5) + offset)

    assert "already launched" in result.error
    assert state_digest(cluster.snap.tables) == before
    assert cluster.launched_at(parent) == minute(5)


def test_fsm__launch_for_a_stopped_parent__refused(cluster: Cluster) -> None:
    parent = cluster.register(cron_job())
    cluster.apply(mock.deregister_entry(parent.id))

    assert "stopped or gone" in _launch(cluster, parent, minute(1)).error
    assert cluster.children(parent) == []


def test_fsm__launch_entry_with_a_stale_running_status__stored_pending(cluster: Cluster) -> None:
    parent = cluster.register(cron_job())
    entry = launch_entry(replace(parent, status=JOB_STATUS_RUNNING), minute(1), T0, "eval-x")
    entry.job.status = JOB_STATUS_RUNNING  # as a buggy leader might send it
    cluster.apply(encode_entry(ET.ENTRY_TYPE_JOB_REGISTER, entry))

    [child] = cluster.children(parent)
    assert child.status == JOB_STATUS_PENDING
    assert cluster.counts(parent) == JobChildrenSummary(pending=1)


def test_force_launch__after_the_recorded_launch_on_a_whole_second(cluster: Cluster) -> None:
    parent = cluster.register(cron_job())
    assert force_launch_ns(cluster.snap, parent, minute(1) + 400_000_000) == minute(1)
    assert not _launch(cluster, parent, minute(1)).error

    slot = force_launch_ns(cluster.snap, parent, minute(1) + 400_000_000)

    assert slot == minute(1) + S
    assert not _launch(cluster, parent, slot).error
    assert len(cluster.children(parent)) == 2


# ---------------------------------------------------------------------------------------
# Reconcile summaries


def test_reconcile_summaries__exact_state__nothing_to_correct(cluster: Cluster) -> None:
    parent = cluster.register(cron_job())
    cluster.server().tick(minute(1))
    [child] = cluster.children(parent)
    cluster.finish(child)

    result = cluster.apply(
        encode_entry(ET.ENTRY_TYPE_RECONCILE_SUMMARIES, raft_pb2.ReconcileSummariesEntry())
    )

    assert result.value == []


def test_reconcile_summaries__corrupted_counters__recomputed_and_reported(cluster: Cluster) -> None:
    parent = cluster.register(cron_job())
    cluster.server().tick(minute(1))
    [child] = cluster.children(parent)
    cluster.finish(child)
    # Damage the stored summaries the way Nomad's got damaged (bypassing the FSM).
    tables = cluster.snap.tables
    txn = Txn(tables, tables.index)
    p_summary = txn.summary((parent.namespace, parent.id))
    c_summary = txn.summary((child.namespace, child.id))
    assert p_summary is not None and c_summary is not None
    txn.put_summary(replace(p_summary, children=JobChildrenSummary(pending=1, running=-18, dead=29)))
    rows = dict(c_summary.summary)
    rows["web"] = replace(rows["web"], running=3, queued=2)
    txn.put_summary(replace(c_summary, summary=rows))
    cluster.store.commit(txn.commit())

    cluster.index += 1
    result = cluster.fsm.apply(
        encode_entry(ET.ENTRY_TYPE_RECONCILE_SUMMARIES, raft_pb2.ReconcileSummariesEntry()), cluster.index
    )

    assert not result.error
    corrections = {c.job_id: c.changes for c in result.value}
    assert corrections == {
        "report": ("children.pending: 1 -> 0", "children.running: -18 -> 0", "children.dead: 29 -> 1"),
        child.id: ("web.running: 3 -> 0",),
    }
    assert mock.summary_problems(cluster.snap.tables) == []
    summary = cluster.snap.job_summary(child.namespace, child.id)
    assert summary is not None and summary.summary["web"] == TaskGroupSummary(queued=2, complete=1)


# ---------------------------------------------------------------------------------------
# The endpoints: register, force, dispatch


@pytest.fixture
def endpoints(cluster: Cluster) -> Endpoints:
    return Endpoints(cluster, cluster.store, cluster.clock, mock.Counter("id"))


def test_register__disabled_periodic_job__paused_template_no_eval(
    cluster: Cluster, endpoints: Endpoints
) -> None:
    """Nomad: a periodic job with enabled = false is paused; it does not run as plain batch."""
    _result, eval_id = endpoints.register_job(cron_job(enabled=False))

    assert eval_id == ""
    assert cluster.snap.evals_by_job("default", "report") == []
    assert cluster.server().tick(minute(5)) == []


def test_register__periodic_to_non_periodic__refused(endpoints: Endpoints) -> None:
    endpoints.register_job(cron_job())

    with pytest.raises(ValidationError, match=r"job\.periodic: can not change job 'report' from periodic"):
        endpoints.register_job(replace(cron_job(), periodic=None))


def test_force__twice_in_one_second__two_children_forced_past_the_record(
    cluster: Cluster, endpoints: Endpoints
) -> None:
    endpoints.register_job(cron_job(prohibit_overlap=True))
    cluster.clock.now = minute(1) + 300_000_000

    first = endpoints.force_periodic("default", "report")
    second = endpoints.force_periodic("default", "report")  # ignores prohibit_overlap, as Nomad

    assert (first[1], second[1]) == (
        periodic_child_id("report", minute(1)),
        periodic_child_id("report", minute(1) + S),
    )
    assert cluster.snap.eval(second[2]) is not None
    # The dispatcher does not launch the slot a force already took.
    assert cluster.server().tick(minute(1) + 500_000_000) == []


def test_force__stopped_or_unknown_job__refused(cluster: Cluster, endpoints: Endpoints) -> None:
    endpoints.register_job(cron_job())
    endpoints.deregister_job("default", "report", purge=False)

    with pytest.raises(ConflictError, match="stopped"):
        endpoints.force_periodic("default", "report")
    with pytest.raises(NotFoundError):
        endpoints.force_periodic("default", "nope")


def test_dispatch__child_with_meta_payload_and_eval_in_one_entry(
    cluster: Cluster, endpoints: Endpoints
) -> None:
    parent = mock.batch_job(
        id="encode",
        meta={"team": "media"},
        parameterized=ParameterizedConfig(
            payload="required", meta_required=("file",), meta_optional=("codec",)
        ),
    )
    endpoints.register_job(parent)
    cluster.clock.now = minute(2)
    index = cluster.index

    result, child_id, eval_id = endpoints.dispatch_job("default", "encode", {"file": "a.mp4"}, b"frames")

    assert result.index == cluster.index == index + 1
    # The 8-character suffix comes from the ID source (hex from a UUID on a server).
    assert re.fullmatch(rf"encode/dispatch-{minute(2) // S}-id\d+", child_id)
    child = cluster.snap.job("default", child_id)
    assert child is not None
    assert (child.dispatched, child.payload, dict(child.meta)) == (
        True,
        b"frames",
        {"team": "media", "file": "a.mp4"},
    )
    assert child.status == JOB_STATUS_PENDING
    [ev] = cluster.snap.evals_by_job("default", child_id)
    assert ev.id == eval_id
    stored = cluster.snap.job("default", "encode")
    assert stored is not None
    assert cluster.counts(stored) == JobChildrenSummary(pending=1)


def _parameterized_parent(endpoints: Endpoints) -> None:
    endpoints.register_job(mock.batch_job(id="encode", parameterized=ParameterizedConfig(payload="optional")))


def test_dispatch__same_idempotency_token__the_first_child_answers_and_nothing_is_written(
    cluster: Cluster, endpoints: Endpoints
) -> None:
    _parameterized_parent(endpoints)
    first, child_id, eval_id = endpoints.dispatch_job("default", "encode", {}, b"", "nightly-7")
    index = cluster.index
    cluster.clock.now += 3 * S

    again, again_child, again_eval = endpoints.dispatch_job("default", "encode", {}, b"", "nightly-7")

    assert (again_child, again_eval) == (child_id, eval_id)
    assert cluster.index == index and again.index == first.index
    assert [c.id for c in cluster.children(cluster.snap.job("default", "encode"))] == [child_id]
    # Another token (or none) dispatches a new child.
    _r, other_child, _e = endpoints.dispatch_job("default", "encode", {}, b"", "nightly-8")
    _r, plain_child, _e = endpoints.dispatch_job("default", "encode", {}, b"")
    assert len({child_id, other_child, plain_child}) == 3


def test_fsm__two_dispatches_with_one_token_raced__one_child(cluster: Cluster, endpoints: Endpoints) -> None:
    """Both passed the endpoint's check before either committed: the FSM keeps the first."""
    _parameterized_parent(endpoints)
    parent = cluster.snap.job("default", "encode")
    assert parent is not None
    entries = []
    for n in (1, 2):
        child = derive_dispatched_child(parent, f"encode/dispatch-{n}", T0, {}, b"", "tok")
        entry = raft_pb2.JobRegisterEntry()
        to_proto(child, entry.job)
        to_proto(Evaluation(id=f"eval-{n}", job_id=child.id, type="batch"), entry.eval)
        entries.append(encode_entry(ET.ENTRY_TYPE_JOB_REGISTER, entry))
    cluster.apply(entries[0])
    jobs_before = cluster.snap.table_index("jobs", "evals", "job_summaries")

    result = cluster.apply(entries[1])

    assert result.value["existing_job_id"] == "encode/dispatch-1"
    assert cluster.snap.job("default", "encode/dispatch-2") is None
    assert cluster.snap.evals_by_job("default", "encode/dispatch-2") == []
    assert cluster.counts(parent) == JobChildrenSummary(pending=1)
    assert cluster.snap.table_index("jobs", "evals", "job_summaries") == jobs_before


def test_dispatch__oversized_idempotency_token__invalid_and_nothing_written(
    cluster: Cluster, endpoints: Endpoints
) -> None:
    _parameterized_parent(endpoints)
    index = cluster.index
    with pytest.raises(ValidationError, match="idempotency_token"):
        endpoints.dispatch_job("default", "encode", {}, b"", "x" * 257)
    assert cluster.index == index


def test_fsm__dispatch_for_a_stopped_parent__refused(cluster: Cluster, endpoints: Endpoints) -> None:
    parent = mock.batch_job(id="encode", parameterized=ParameterizedConfig())
    endpoints.register_job(parent)
    stored = cluster.snap.job("default", "encode")
    assert stored is not None
    child = derive_dispatched_child(stored, "encode/dispatch-1-00000000", T0, {}, b"")
    endpoints.deregister_job("default", "encode", purge=False)

    result = cluster.propose(mock.register_job_entry(child, mock.eval_for(child)))

    assert "stopped or gone" in result.error
    assert cluster.snap.job("default", child.id) is None
