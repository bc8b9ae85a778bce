"""The FSM, one entry type at a time: what each raft log entry does to the state.

Every test drives ``FSM.apply`` with the bytes a leader would propose (tests/fixtures/mock.py)
through ``Log``, which applies at increasing indexes and checks docs/design.md#invariant-2 (
every job summary counter equals a recount from allocs and children, none negative) after
every entry, whatever the test is about.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest

from drover.scheduler import validate
from drover.scheduler.structs import (
    ALLOC_CLIENT_COMPLETE,
    ALLOC_CLIENT_FAILED,
    ALLOC_CLIENT_LOST,
    ALLOC_CLIENT_PENDING,
    ALLOC_CLIENT_RUNNING,
    ALLOC_DESIRED_STOP,
    EVAL_STATUS_COMPLETE,
    JOB_STATUS_DEAD,
    JOB_STATUS_PENDING,
    JOB_STATUS_RUNNING,
    JOB_TYPE_BATCH,
    JOB_TYPE_SERVICE,
    MAX_NODE_EVENTS,
    NODE_ELIGIBLE,
    NODE_INELIGIBLE,
    NODE_STATUS_DOWN,
    NODE_STATUS_READY,
    Allocation,
    AllocStateChange,
    DrainStrategy,
    Job,
    JobChildrenSummary,
    NodeEvent,
    RejectionTrackerConfig,
    SchedulerConfig,
    TaskGroupSummary,
)
from drover.server.codec import to_proto
from drover.server.fsm import FSM, ApplyResult, encode_entry
from drover.server.snapshot import state_digest
from drover.server.state_store import TABLES, TRACKED_JOB_VERSIONS, Snapshot, StateStore, Tables
from drover.v1 import raft_pb2
from tests.fixtures import mock

ET = raft_pb2.EntryType


class Log:
    """A fresh FSM fed entries at increasing raft indexes; checks after each that every job
    summary equals a recount (docs/design.md#invariant-2)."""

    def __init__(self) -> None:
        self.store = StateStore()
        self.fsm = FSM(self.store)
        self.index = 0

    def apply(self, data: bytes, *, refused: bool = False) -> ApplyResult:
        """Apply ``data`` at the next index; it must succeed unless ``refused``."""
        self.index += 1
        result = self.fsm.apply(data, self.index)
        if refused:
            assert result.error, f"entry at {self.index} was expected to be refused"
        else:
            assert not result.error, f"entry at {self.index} refused: {result.error}"
        problems = mock.summary_problems(self.snap.tables)
        assert not problems, f"summaries differ from a recount at index {self.index}:\n" + "\n".join(problems)
        return result

    @property
    def snap(self) -> Snapshot:
        return self.store.snapshot()

    def job(self, job: Job) -> Job:
        stored = self.snap.job(job.namespace, job.id)
        assert stored is not None, f"job {job.id!r} missing"
        return stored

    def children(self, parent: Job) -> JobChildrenSummary:
        summary = self.snap.job_summary(parent.namespace, parent.id)
        assert summary is not None and summary.children is not None
        return summary.children

    def row(self, job: Job, group: str = "web") -> TaskGroupSummary:
        summary = self.snap.job_summary(job.namespace, job.id)
        assert summary is not None
        return summary.summary[group]


@pytest.fixture
def log() -> Log:
    return Log()


def registered(log: Log, job: Job, *, with_eval: bool = True) -> Job:
    log.apply(mock.register_job_entry(job, mock.eval_for(job) if with_eval else None))
    return log.job(job)


def placed(log: Log, job: Job | None = None) -> tuple[Job, Allocation]:
    """Register ``job`` (a service job by default) and commit one alloc of it on a fresh
    node: the state every alloc-lifecycle test starts from, so each test shows only the
    entry it is about."""
    job = job or mock.job()
    registered(log, job)
    alloc = mock.alloc(job, mock.node())
    log.apply(mock.plan_entry([alloc]))
    return job, alloc


# ---------------------------------------------------------------------------------------
# The fixtures themselves


@pytest.mark.parametrize(
    "factory",
    [mock.job, mock.batch_job, mock.system_job, mock.sysbatch_job, mock.periodic_job],
    ids=["service", "batch", "system", "sysbatch", "periodic"],
)
def test_mock__job_factories__are_valid_and_canonical(factory: object) -> None:
    job = factory()  # type: ignore[operator]
    validate.validate_job(job)
    assert validate.canonicalize_job(job) == job


def test_mock__node_factories__are_valid() -> None:
    validate.validate_node(mock.node())
    validate.validate_node(mock.drain_node())


def test_mock__ids__are_readable_and_unique() -> None:
    first, second = mock.node(), mock.node()
    assert first.id.startswith("node-") and second.id.startswith("node-")
    assert first.id != second.id


# ---------------------------------------------------------------------------------------
# Job register


def test_fsm__job_register__creates_job_version_summary_and_eval_in_one_index(log: Log) -> None:
    job = mock.job()
    ev = mock.eval_for(job)

    result = log.apply(mock.register_job_entry(job, ev))

    stored = log.job(job)
    assert (stored.version, stored.create_index, stored.modify_index, stored.job_modify_index) == (0, 1, 1, 1)
    assert stored.status == JOB_STATUS_PENDING  # its eval has not run yet
    assert log.snap.job_versions(job.namespace, job.id) == (stored,)
    summary = log.snap.job_summary(job.namespace, job.id)
    assert summary is not None
    assert summary.summary == {"web": TaskGroupSummary()}
    assert summary.children == JobChildrenSummary()
    assert (summary.create_index, summary.modify_index) == (1, 1)
    stored_eval = log.snap.eval(ev.id)
    assert stored_eval is not None
    assert (stored_eval.create_index, stored_eval.modify_index, stored_eval.job_modify_index) == (1, 1, 1)
    assert [e.id for e in log.snap.evals_by_job(job.namespace, job.id)] == [ev.id]
    for table in ("jobs", "job_versions", "job_summaries", "evals"):
        assert log.snap.table_index(table) == 1, table
    assert result.value == {"version": 0, "job_modify_index": 1}


def test_fsm__job_register__submitted_bookkeeping_is_the_stores(log: Log) -> None:
    job = mock.job(status=JOB_STATUS_RUNNING, version=7, create_index=99, modify_index=99, stable=True)

    stored = registered(log, job)

    assert (stored.version, stored.create_index, stored.modify_index) == (0, 1, 1)
    assert stored.status == JOB_STATUS_PENDING


def test_fsm__job_reregistered_unchanged__keeps_version(log: Log) -> None:
    job = mock.job()
    registered(log, job)

    result = log.apply(
        mock.register_job_entry(
            replace(job, submit_time_ns=mock.NOW + mock.HOUR, status=JOB_STATUS_DEAD), mock.eval_for(job)
        )
    )

    stored = log.job(job)
    assert (stored.version, stored.job_modify_index, stored.modify_index) == (0, 1, 2)
    assert stored.create_index == 1
    assert stored.submit_time_ns == mock.NOW  # the registration that made the version
    assert stored.status == JOB_STATUS_PENDING
    assert len(log.snap.job_versions(job.namespace, job.id)) == 1
    assert result.value == {"version": 0, "job_modify_index": 1}


def test_fsm__job_reregistered_changed__bumps_version(log: Log) -> None:
    job = mock.job()
    registered(log, job)
    group = replace(job.groups[0], count=5)

    result = log.apply(mock.register_job_entry(replace(job, groups=(group,)), mock.eval_for(job)))

    stored = log.job(job)
    assert (stored.version, stored.job_modify_index, stored.create_index) == (1, 2, 1)
    assert stored.groups[0].count == 5
    assert [v.version for v in log.snap.job_versions(job.namespace, job.id)] == [1, 0]
    assert log.snap.job_version(job.namespace, job.id, 0) is not None
    assert log.snap.job_version(job.namespace, job.id, 0).groups[0].count == 10  # type: ignore[union-attr]
    assert result.value == {"version": 1, "job_modify_index": 2}


def test_fsm__job_registered_eight_versions__keeps_six_newest(log: Log) -> None:
    job = mock.job()
    for count in range(1, 9):
        registered(log, replace(job, groups=(replace(job.groups[0], count=count),)))

    versions = log.snap.job_versions(job.namespace, job.id)

    assert TRACKED_JOB_VERSIONS == 6
    assert [v.version for v in versions] == [7, 6, 5, 4, 3, 2]
    assert [v.groups[0].count for v in versions] == [8, 7, 6, 5, 4, 3]
    assert log.snap.job_version(job.namespace, job.id, 1) is None


def test_fsm__job_reregistered_after_stop__clears_stop_and_bumps_version(log: Log) -> None:
    job = mock.job()
    registered(log, job)
    log.apply(mock.deregister_entry(job.id))

    stored = registered(log, job)

    assert not stored.stop
    assert stored.version == 2
    assert [v.stop for v in log.snap.job_versions(job.namespace, job.id)] == [False, True, False]


def test_fsm__job_register__group_added__gets_a_summary_row(log: Log) -> None:
    job = mock.job()
    registered(log, job)
    cache = replace(job.groups[0], name="cache", count=1)

    registered(log, replace(job, groups=(*job.groups, cache)))

    summary = log.snap.job_summary(job.namespace, job.id)
    assert summary is not None
    assert set(summary.summary) == {"web", "cache"}


@pytest.mark.parametrize(
    ("factory", "status"),
    [
        (mock.system_job, JOB_STATUS_RUNNING),
        (mock.periodic_job, JOB_STATUS_RUNNING),
        (mock.batch_job, JOB_STATUS_PENDING),
    ],
    ids=["system-runs-until-stopped", "periodic-parent-is-a-template", "batch-waits-for-its-eval"],
)
def test_fsm__job_registered__status_by_type(log: Log, factory: object, status: str) -> None:
    job = factory()  # type: ignore[operator]

    stored = registered(log, job, with_eval=not job.is_template())

    assert stored.status == status
    assert {j.id for j in log.snap.jobs_by_type(job.type)} == {job.id}


# ---------------------------------------------------------------------------------------
# Periodic children (docs/field-reports.md#field-report-2)


def launch_child(log: Log, parent: Job, launch_ns: int, status: str) -> Job:
    """What a periodic dispatcher commits for one launch; ``status`` as a (new) leader sent it."""
    child = mock.periodic_child(parent, launch_ns, status=status)
    log.apply(mock.periodic_launch_entry(parent.id, launch_ns))
    log.apply(mock.register_job_entry(child, mock.eval_for(child, id=f"eval-{child.id}")))
    return child


def run_child_to_completion(log: Log, child: Job, node_id: str) -> None:
    alloc = mock.alloc(child, mock.node(id=node_id), eval_id=f"eval-{child.id}")
    log.apply(mock.plan_entry([alloc], eval_id=alloc.eval_id))
    assert log.job(child).status == JOB_STATUS_RUNNING
    log.apply(mock.client_update_entry(alloc.id, ALLOC_CLIENT_RUNNING))
    done = mock.eval_for(child, id=f"eval-{child.id}", status=EVAL_STATUS_COMPLETE)
    log.apply(mock.client_update_entry(alloc.id, ALLOC_CLIENT_COMPLETE, evals=[done]))
    assert log.job(child).status == JOB_STATUS_DEAD


def test_fsm__periodic_child_submitted_running__stored_pending_and_counted_pending(log: Log) -> None:
    parent = registered(log, mock.periodic_job(), with_eval=False)

    # After a leader change the dispatcher derives children from a parent whose status is
    # "running": the child arrives claiming "running" (docs/field-reports.md#field-report-2).
    child = launch_child(log, parent, mock.NOW, status=JOB_STATUS_RUNNING)

    assert log.job(child).status == JOB_STATUS_PENDING
    assert log.children(parent) == JobChildrenSummary(pending=1, running=0, dead=0)
    launch = log.snap.periodic_launch(parent.namespace, parent.id)
    assert launch is not None and launch.launch_ns == mock.NOW


def test_fsm__periodic_children_run_and_complete__counts_move_to_dead_never_negative(log: Log) -> None:
    node = mock.node()
    log.apply(mock.register_node_entry(node))
    parent = registered(log, mock.periodic_job(), with_eval=False)
    first = launch_child(log, parent, mock.NOW, status="")

    run_child_to_completion(log, first, node.id)
    assert log.children(parent) == JobChildrenSummary(pending=0, running=0, dead=1)

    # New leader: every later launch arrives as "running" (the bug's trigger in Nomad).
    second = launch_child(log, parent, mock.NOW + 30 * mock.MINUTE, status=JOB_STATUS_RUNNING)
    assert log.children(parent) == JobChildrenSummary(pending=1, running=0, dead=1)
    # ... and a re-submission of a finished child with a stale status changes nothing.
    log.apply(mock.register_job_entry(replace(first, status=JOB_STATUS_RUNNING)))
    assert log.job(first).status == JOB_STATUS_DEAD
    assert log.children(parent) == JobChildrenSummary(pending=1, running=0, dead=1)

    run_child_to_completion(log, second, node.id)
    assert log.children(parent) == JobChildrenSummary(pending=0, running=0, dead=2)


def test_fsm__periodic_child_purged__leaves_the_parents_counts(log: Log) -> None:
    parent = registered(log, mock.periodic_job(), with_eval=False)
    child = launch_child(log, parent, mock.NOW, status="")

    log.apply(mock.deregister_entry(child.id, purge=True))

    assert log.children(parent) == JobChildrenSummary()


def test_fsm__periodic_parent_purged_and_reregistered__counts_its_live_children(log: Log) -> None:
    parent = registered(log, mock.periodic_job(), with_eval=False)
    launch_child(log, parent, mock.NOW, status="")
    log.apply(mock.deregister_entry(parent.id, purge=True))

    # `job stop -purge` then `job run` of the same periodic job: the child still exists.
    log.apply(mock.register_job_entry(parent))

    assert log.children(parent) == JobChildrenSummary(pending=1, running=0, dead=0)


def test_fsm__child_committed_after_its_parent_was_purged__counted_when_the_parent_returns(log: Log) -> None:
    parent = mock.periodic_job()
    registered(log, parent, with_eval=False)
    log.apply(mock.deregister_entry(parent.id, purge=True))
    # A launch decided before the purge commits after it: its parent has no summary.
    child = launch_child(log, parent, mock.NOW, status=JOB_STATUS_RUNNING)

    registered(log, parent, with_eval=False)

    assert log.job(child).status == JOB_STATUS_PENDING
    assert log.children(parent) == JobChildrenSummary(pending=1, running=0, dead=0)


# ---------------------------------------------------------------------------------------
# Job deregister


def test_fsm__job_deregistered_without_purge__sets_stop_and_bumps_version(log: Log) -> None:
    job = mock.job()
    registered(log, job)

    log.apply(mock.deregister_entry(job.id))

    stored = log.job(job)
    assert stored.stop
    assert (stored.version, stored.job_modify_index, stored.modify_index) == (1, 2, 2)
    assert stored.status == JOB_STATUS_PENDING  # the register eval is still pending
    assert [v.version for v in log.snap.job_versions(job.namespace, job.id)] == [1, 0]
    assert log.snap.job_summary(job.namespace, job.id) is not None


def test_fsm__job_deregistered_twice__second_changes_no_version(log: Log) -> None:
    job = mock.job()
    registered(log, job, with_eval=False)
    log.apply(mock.deregister_entry(job.id))

    log.apply(mock.deregister_entry(job.id))

    stored = log.job(job)
    assert stored.version == 1
    assert stored.status == JOB_STATUS_DEAD
    assert len(log.snap.job_versions(job.namespace, job.id)) == 2


def test_fsm__job_deregistered_with_eval__stores_eval_with_deregister_index(log: Log) -> None:
    job = mock.job()
    registered(log, job)
    ev = mock.eval_for(job, triggered_by="job-deregister")

    log.apply(mock.deregister_entry(job.id, eval=ev))

    stored = log.snap.eval(ev.id)
    assert stored is not None and stored.job_modify_index == 2


def test_fsm__job_purged__removes_job_versions_and_summary(log: Log) -> None:
    job = mock.batch_job()
    node = mock.node()
    registered(log, job)
    alloc = mock.alloc(job, node)
    log.apply(mock.plan_entry([alloc]))
    log.apply(mock.periodic_launch_entry(job.id))

    log.apply(mock.deregister_entry(job.id, purge=True))

    snap = log.snap
    assert snap.job(job.namespace, job.id) is None
    assert snap.job_versions(job.namespace, job.id) == ()
    assert snap.job_summary(job.namespace, job.id) is None
    assert snap.periodic_launch(job.namespace, job.id) is None
    assert list(snap.jobs_by_type(JOB_TYPE_BATCH)) == []
    # Allocs and evals are left for the garbage collector, as in Nomad.
    assert [a.id for a in snap.allocs_by_job(job.namespace, job.id)] == [alloc.id]


def test_fsm__purged_job_reregistered__summary_counts_leftover_allocs(log: Log) -> None:
    job = mock.job()
    node = mock.node()
    registered(log, job)
    allocs = [mock.alloc(job, node, i) for i in range(3)]
    log.apply(mock.plan_entry(allocs))
    log.apply(mock.client_update_entry(allocs[0].id, ALLOC_CLIENT_RUNNING))
    log.apply(mock.deregister_entry(job.id, purge=True))
    log.apply(mock.client_update_entry(allocs[1].id, ALLOC_CLIENT_FAILED))  # no summary to move

    registered(log, job)

    assert log.row(job) == TaskGroupSummary(running=1, failed=1, starting=1)


def test_fsm__deregister_unknown_job__refused_as_not_found(log: Log) -> None:
    before = state_digest(log.snap.tables)

    result = log.apply(mock.deregister_entry("no-such-job"), refused=True)

    assert result.not_found
    assert state_digest(log.snap.tables) == before


# ---------------------------------------------------------------------------------------
# Nodes


def test_fsm__node_registered__stored_with_registered_event(log: Log) -> None:
    node = mock.node()

    log.apply(mock.register_node_entry(node))

    stored = log.snap.node(node.id)
    assert stored is not None
    assert (stored.create_index, stored.modify_index) == (1, 1)
    assert [e.message for e in stored.events] == ["Node registered"]
    assert stored.events[0].create_index == 1
    assert stored.ready_for_placement()


def test_fsm__node_reregistered__keeps_drain_and_eligibility(log: Log) -> None:
    node = mock.node()
    log.apply(mock.register_node_entry(node))
    strategy = DrainStrategy(deadline_ns=mock.HOUR, started_at_ns=mock.NOW)
    log.apply(mock.drain_entry(node.id, strategy))

    # The client restarts and registers again, as a fresh eligible node.
    log.apply(mock.register_node_entry(replace(node, address="192.168.0.101:4647")))

    stored = log.snap.node(node.id)
    assert stored is not None
    assert stored.drain_strategy == strategy
    assert stored.scheduling_eligibility == NODE_INELIGIBLE
    assert stored.address == "192.168.0.101:4647"
    assert (stored.create_index, stored.modify_index) == (1, 3)
    assert [e.message for e in stored.events] == ["Node registered", "Node re-registered"]


def test_fsm__node_register__stores_its_evals(log: Log) -> None:
    job = mock.system_job()
    registered(log, job)
    node = mock.node()
    ev = mock.eval_for(job, triggered_by="node-update", node_id=node.id)

    log.apply(mock.register_node_entry(node, evals=[ev]))

    assert log.snap.eval(ev.id) is not None


def test_fsm__node_drained__becomes_ineligible(log: Log) -> None:
    node = mock.node()
    log.apply(mock.register_node_entry(node))

    log.apply(mock.drain_entry(node.id, DrainStrategy(), event=NodeEvent(message="Node drain strategy set")))

    stored = log.snap.node(node.id)
    assert stored is not None
    assert stored.drain and stored.scheduling_eligibility == NODE_INELIGIBLE
    assert not stored.ready_for_placement()
    assert stored.events[-1].message == "Node drain strategy set"


@pytest.mark.parametrize(
    ("mark_eligible", "eligibility"),
    [(False, NODE_INELIGIBLE), (True, NODE_ELIGIBLE)],
    ids=["stays-ineligible", "marked-eligible"],
)
def test_fsm__node_drain_disabled__eligibility_as_asked(
    log: Log, mark_eligible: bool, eligibility: str
) -> None:
    node = mock.node()
    log.apply(mock.register_node_entry(node))
    log.apply(mock.drain_entry(node.id, DrainStrategy()))

    log.apply(mock.drain_entry(node.id, None, mark_eligible=mark_eligible))

    stored = log.snap.node(node.id)
    assert stored is not None
    assert stored.drain_strategy is None
    assert stored.scheduling_eligibility == eligibility


@pytest.mark.parametrize(
    ("current", "completes", "refused"),
    [
        (DrainStrategy(started_at_ns=mock.NOW), mock.NOW, False),
        (DrainStrategy(started_at_ns=mock.NOW + 1), mock.NOW, True),  # a newer drain replaced it
        (None, mock.NOW, True),  # the operator disabled it meanwhile
    ],
    ids=["same-drain", "newer-drain", "disabled"],
)
def test_fsm__drain_completion__only_for_the_drain_it_completes(
    log: Log, current: DrainStrategy | None, completes: int, refused: bool
) -> None:
    node = mock.node()
    log.apply(mock.register_node_entry(node))
    if current is not None:
        log.apply(mock.drain_entry(node.id, current))
    before = state_digest(log.snap.tables)

    log.apply(mock.drain_entry(node.id, None, completes_drain_started_at_ns=completes), refused=refused)

    stored = log.snap.node(node.id)
    assert stored is not None
    if refused:
        assert state_digest(log.snap.tables) == before
    else:
        assert stored.drain_strategy is None and stored.scheduling_eligibility == NODE_INELIGIBLE


def test_fsm__node_marked_eligible_while_draining__refused_and_unchanged(log: Log) -> None:
    node = mock.node()
    log.apply(mock.register_node_entry(node))
    log.apply(mock.drain_entry(node.id, DrainStrategy()))
    before = state_digest(log.snap.tables)

    result = log.apply(mock.eligibility_entry(node.id, NODE_ELIGIBLE), refused=True)

    assert "draining" in result.error and not result.not_found
    assert state_digest(log.snap.tables) == before


def test_fsm__node_marked_ineligible__not_placeable_until_eligible_again(log: Log) -> None:
    node = mock.node()
    log.apply(mock.register_node_entry(node))

    log.apply(mock.eligibility_entry(node.id, NODE_INELIGIBLE))
    stored = log.snap.node(node.id)
    assert stored is not None and not stored.ready_for_placement()

    log.apply(mock.eligibility_entry(node.id, NODE_ELIGIBLE))
    stored = log.snap.node(node.id)
    assert stored is not None and stored.ready_for_placement()


def test_fsm__node_status_changed__records_time_and_event(log: Log) -> None:
    node = mock.node()
    log.apply(mock.register_node_entry(node))

    log.apply(
        mock.node_status_entry(
            node.id,
            NODE_STATUS_DOWN,
            updated_at_ns=mock.NOW + mock.MINUTE,
            event=NodeEvent(message="Node heartbeat missed", subsystem="Cluster"),
        )
    )

    stored = log.snap.node(node.id)
    assert stored is not None
    assert (stored.status, stored.status_updated_at_ns, stored.modify_index) == (
        NODE_STATUS_DOWN,
        mock.NOW + mock.MINUTE,
        2,
    )
    assert stored.events[-1].message == "Node heartbeat missed"


def test_fsm__node_events__keep_the_newest_ten(log: Log) -> None:
    node = mock.node()
    log.apply(mock.register_node_entry(node))
    for i in range(MAX_NODE_EVENTS + 3):
        status = NODE_STATUS_DOWN if i % 2 == 0 else NODE_STATUS_READY
        log.apply(mock.node_status_entry(node.id, status, event=NodeEvent(message=f"event {i}")))

    stored = log.snap.node(node.id)

    assert stored is not None
    assert [e.message for e in stored.events] == [f"event {i}" for i in range(3, MAX_NODE_EVENTS + 3)]


@pytest.mark.parametrize(
    "entry",
    [
        mock.node_status_entry("node-missing", NODE_STATUS_DOWN),
        mock.drain_entry("node-missing", DrainStrategy()),
        mock.eligibility_entry("node-missing", NODE_INELIGIBLE),
    ],
    ids=["status", "drain", "eligibility"],
)
def test_fsm__update_of_unknown_node__refused_as_not_found(log: Log, entry: bytes) -> None:
    result = log.apply(entry, refused=True)

    assert result.not_found
    assert log.snap.index == 0


def test_fsm__node_deregistered__removed(log: Log) -> None:
    keep, gone = mock.node(), mock.node()
    log.apply(mock.register_node_entry(keep))
    log.apply(mock.register_node_entry(gone))

    log.apply(mock.deregister_node_entry(gone.id))

    assert [n.id for n in log.snap.nodes()] == [keep.id]


# ---------------------------------------------------------------------------------------
# Plan results


def test_fsm__plan_results__upsert_allocs_with_create_index(log: Log) -> None:
    job = mock.job()
    node = mock.node()
    registered(log, job)
    allocs = [mock.alloc(job, node, i, create_index=77, create_time_ns=1) for i in range(3)]

    log.apply(mock.plan_entry(allocs, updated_at_ns=mock.NOW + 5))

    for alloc in allocs:
        stored = log.snap.alloc(alloc.id)
        assert stored is not None
        assert (stored.create_index, stored.modify_index, stored.alloc_modify_index) == (2, 2, 2)
        assert (stored.create_time_ns, stored.modify_time_ns) == (mock.NOW + 5, mock.NOW + 5)
    assert log.row(job) == TaskGroupSummary(starting=3)
    assert log.job(job).status == JOB_STATUS_RUNNING
    assert {a.id for a in log.snap.allocs_by_node(node.id)} == {a.id for a in allocs}
    assert {a.id for a in log.snap.allocs_by_eval(allocs[0].eval_id)} == {allocs[0].id}


def test_fsm__plan_inplace_update__keeps_client_fields(log: Log) -> None:
    job, alloc = placed(log)
    log.apply(
        mock.client_update_entry(
            alloc.id, ALLOC_CLIENT_RUNNING, task_states={"web": mock.running_task_state()}
        )
    )
    running = log.snap.alloc(alloc.id)
    assert running is not None

    # The scheduler's copy is stale (pending, no task states): only its own fields count.
    log.apply(mock.plan_entry([replace(alloc, job_version=1)]))

    stored = log.snap.alloc(alloc.id)
    assert stored is not None
    assert stored.job_version == 1
    assert stored.client_status == ALLOC_CLIENT_RUNNING
    assert stored.task_states == running.task_states
    assert stored.state_history == running.state_history
    assert (stored.create_index, stored.alloc_modify_index) == (2, 4)
    assert log.row(job) == TaskGroupSummary(running=1)


def test_fsm__plan_stops__set_desired_status_and_keep_client_status(log: Log) -> None:
    job, alloc = placed(log)
    log.apply(mock.client_update_entry(alloc.id, ALLOC_CLIENT_RUNNING))

    log.apply(mock.plan_entry(allocs_stopped=[mock.stop(alloc.id, followup_eval_id="eval-followup")]))

    stored = log.snap.alloc(alloc.id)
    assert stored is not None
    assert (stored.desired_status, stored.desired_description) == (
        ALLOC_DESIRED_STOP,
        "alloc not needed due to job update",
    )
    assert stored.client_status == ALLOC_CLIENT_RUNNING
    assert stored.followup_eval_id == "eval-followup"
    assert stored.terminal()
    assert log.job(job).status == JOB_STATUS_PENDING  # no live alloc, register eval pending


def test_fsm__plan_stop_marks_lost__records_state_history(log: Log) -> None:
    job, alloc = placed(log)

    log.apply(
        mock.plan_entry(
            allocs_stopped=[mock.stop(alloc.id, client_status=ALLOC_CLIENT_LOST)], updated_at_ns=mock.NOW + 9
        )
    )

    stored = log.snap.alloc(alloc.id)
    assert stored is not None
    assert stored.client_status == ALLOC_CLIENT_LOST
    assert stored.state_history == (AllocStateChange("client_status", ALLOC_CLIENT_LOST, mock.NOW + 9),)
    assert log.row(job) == TaskGroupSummary(lost=1)


def test_fsm__plan_replacement__links_previous_and_next_allocation(log: Log) -> None:
    job, old = placed(log)

    new = mock.alloc(job, mock.node(), previous_allocation=old.id)
    log.apply(mock.plan_entry([new], [old.id]))

    stored_old = log.snap.alloc(old.id)
    assert stored_old is not None
    assert stored_old.next_allocation == new.id
    assert stored_old.desired_status == ALLOC_DESIRED_STOP
    stored_new = log.snap.alloc(new.id)
    assert stored_new is not None and stored_new.previous_allocation == old.id


def test_fsm__plan_results__marks_rejected_nodes_ineligible_and_stores_evals(log: Log) -> None:
    job = mock.job()
    node = mock.node()
    registered(log, job)
    log.apply(mock.register_node_entry(node))
    done = mock.eval_for(job, status=EVAL_STATUS_COMPLETE)

    log.apply(mock.plan_entry(nodes_ineligible=[node.id, "node-gone"], evals=[done]))

    stored = log.snap.node(node.id)
    assert stored is not None
    assert stored.scheduling_eligibility == NODE_INELIGIBLE
    assert stored.events[-1].subsystem == "Scheduler"
    assert log.snap.eval(done.id) is not None


def test_fsm__plan_stop_of_unknown_alloc__skipped(log: Log) -> None:
    log.apply(mock.plan_entry(allocs_stopped=["alloc-gone"]))

    assert log.snap.alloc("alloc-gone") is None


# ---------------------------------------------------------------------------------------
# Alloc client updates


def test_fsm__alloc_client_update__records_state_history_and_only_client_fields(log: Log) -> None:
    job, alloc = placed(log)
    before = log.snap.alloc(alloc.id)
    assert before is not None
    # A client that sends a whole alloc, server fields included: only its own fields apply.
    entry = raft_pb2.AllocClientUpdateEntry(updated_at_ns=mock.NOW + 7)
    forged = replace(
        alloc,
        client_status=ALLOC_CLIENT_RUNNING,
        client_description="Tasks are running",
        task_states={"web": mock.running_task_state()},
        desired_status=ALLOC_DESIRED_STOP,
        node_id="node-elsewhere",
        job_version=42,
        create_index=1,
    )
    to_proto(forged, entry.allocs.add())

    log.apply(encode_entry(ET.ENTRY_TYPE_ALLOC_CLIENT_UPDATE, entry))

    stored = log.snap.alloc(alloc.id)
    assert stored is not None
    assert stored == replace(
        before,
        client_status=ALLOC_CLIENT_RUNNING,
        client_description="Tasks are running",
        task_states={"web": mock.running_task_state()},
        state_history=(AllocStateChange("client_status", ALLOC_CLIENT_RUNNING, mock.NOW + 7),),
        modify_index=3,
        modify_time_ns=mock.NOW + 7,
    )
    assert log.row(job) == TaskGroupSummary(running=1)


def test_fsm__alloc_client_update_same_status__adds_no_history(log: Log) -> None:
    _, alloc = placed(log)
    log.apply(mock.client_update_entry(alloc.id, ALLOC_CLIENT_RUNNING))

    log.apply(mock.client_update_entry(alloc.id, ALLOC_CLIENT_RUNNING, client_description="still running"))
    log.apply(mock.client_update_entry(alloc.id, ""))  # task-state-only report

    stored = log.snap.alloc(alloc.id)
    assert stored is not None
    assert stored.client_status == ALLOC_CLIENT_RUNNING
    assert [c.value for c in stored.state_history] == [ALLOC_CLIENT_RUNNING]


def test_fsm__alloc_client_updates__history_keeps_the_newest_ten(log: Log) -> None:
    _, alloc = placed(log)
    statuses = [ALLOC_CLIENT_RUNNING, ALLOC_CLIENT_PENDING] * 7

    for i, status in enumerate(statuses):
        log.apply(mock.client_update_entry(alloc.id, status, updated_at_ns=mock.NOW + i))

    stored = log.snap.alloc(alloc.id)
    assert stored is not None
    assert [c.time_ns for c in stored.state_history] == [mock.NOW + i for i in range(4, 14)]


def test_fsm__alloc_client_update_runs_to_complete__summary_follows(log: Log) -> None:
    job, alloc = placed(log, mock.batch_job())
    assert log.row(job) == TaskGroupSummary(starting=1)

    log.apply(mock.client_update_entry(alloc.id, ALLOC_CLIENT_RUNNING))
    assert log.row(job) == TaskGroupSummary(running=1)

    log.apply(mock.client_update_entry(alloc.id, ALLOC_CLIENT_COMPLETE))
    assert log.row(job) == TaskGroupSummary(complete=1)


def test_fsm__alloc_client_update_of_collected_alloc__skipped_but_evals_stored(log: Log) -> None:
    job = mock.job()
    registered(log, job)
    ev = mock.eval_for(job, triggered_by="alloc-failure")

    log.apply(mock.client_update_entry("alloc-collected", ALLOC_CLIENT_FAILED, evals=[ev]))

    assert log.snap.alloc("alloc-collected") is None
    assert log.snap.eval(ev.id) is not None


# ---------------------------------------------------------------------------------------
# Evaluations


def test_fsm__eval_updated__keeps_create_index(log: Log) -> None:
    job = mock.job()
    ev = mock.eval_for(job)
    registered(log, job, with_eval=False)
    log.apply(mock.eval_update_entry(ev))

    log.apply(mock.eval_update_entry(replace(ev, status=EVAL_STATUS_COMPLETE, create_index=99)))

    stored = log.snap.eval(ev.id)
    assert stored is not None
    assert (stored.status, stored.create_index, stored.modify_index) == (EVAL_STATUS_COMPLETE, 2, 3)
    assert log.job(job).status == JOB_STATUS_DEAD  # every eval terminal, nothing placed


def test_fsm__terminal_eval_with_queued_allocs__sets_summary_queued(log: Log) -> None:
    job = mock.job()
    registered(log, job, with_eval=False)

    log.apply(
        mock.eval_update_entry(
            mock.eval_for(job, status=EVAL_STATUS_COMPLETE, queued_allocations={"web": 4, "gone": 1})
        )
    )

    assert log.row(job) == TaskGroupSummary(queued=4)


def test_fsm__eval_delete__removes_evals_and_allocs_and_decrements_summaries(log: Log) -> None:
    job = mock.batch_job()
    node = mock.node()
    ev = mock.eval_for(job, status=EVAL_STATUS_COMPLETE)
    registered(log, job, with_eval=False)
    log.apply(mock.eval_update_entry(ev))
    allocs = [mock.alloc(job, node, i, eval_id=ev.id) for i in range(3)]
    log.apply(mock.plan_entry(allocs))
    log.apply(mock.client_update_entry(allocs[0].id, ALLOC_CLIENT_COMPLETE))
    log.apply(mock.client_update_entry(allocs[1].id, ALLOC_CLIENT_FAILED))

    log.apply(mock.eval_delete_entry([ev.id], [allocs[0].id, allocs[1].id, "alloc-never-was"]))

    snap = log.snap
    assert snap.eval(ev.id) is None
    assert snap.evals_by_job(job.namespace, job.id) == []
    assert [a.id for a in snap.allocs_by_job(job.namespace, job.id)] == [allocs[2].id]
    assert [a.id for a in snap.allocs_by_node(node.id)] == [allocs[2].id]
    assert [a.id for a in snap.allocs_by_eval(ev.id)] == [allocs[2].id]
    assert log.row(job) == TaskGroupSummary(starting=1)


# ---------------------------------------------------------------------------------------
# Entries the FSM does not apply


def _seed_state(log: Log) -> None:
    job = mock.job()
    registered(log, job)
    node = mock.node()
    log.apply(mock.register_node_entry(node))
    log.apply(mock.plan_entry([mock.alloc(job, node)]))


@pytest.mark.parametrize(
    "entry_type",
    [ET.ENTRY_TYPE_UNSPECIFIED, max(ET.values()[:-1]) + 1, 999],
    ids=["unspecified", "next-type", "999"],
)
def test_fsm__unknown_entry_type__leaves_state_unchanged_and_does_not_raise(
    log: Log, entry_type: int
) -> None:
    _seed_state(log)
    before = log.snap.tables

    result = log.apply(mock.raw_entry(entry_type, b"\x0a\x03abc"), refused=True)

    assert "unknown entry type" in result.error
    assert log.snap.tables is before


@pytest.mark.parametrize(
    "data",
    [b"\xff", b"\x0a\xff\xff\xff", b"\x08\x01\x12\x10short", b"\x80" * 12],
    ids=["bad-tag", "truncated-length", "payload-overruns", "varint-overflow"],
)
def test_fsm__undecodable_bytes__leave_state_unchanged_and_do_not_raise(log: Log, data: bytes) -> None:
    _seed_state(log)
    before = log.snap.tables

    result = log.apply(data, refused=True)

    assert result.error
    assert log.snap.tables is before


@pytest.mark.parametrize(
    "entry_type",
    sorted(set(ET.values()) - {ET.ENTRY_TYPE_UNSPECIFIED, ET.ENTRY_TYPE_IGNORABLE_FLOAT}),
    ids=lambda t: ET.Name(t),
)
def test_fsm__corrupt_payload_of_known_type__leaves_state_unchanged(log: Log, entry_type: int) -> None:
    _seed_state(log)
    before = log.snap.tables

    result = log.apply(mock.raw_entry(entry_type, b"\x0a\xff\xff\x01"), refused=True)

    assert result.error
    assert log.snap.tables is before


@pytest.mark.parametrize("entry_type", [1000, 1001, 4242], ids=["float", "float+1", "far-future"])
def test_fsm__ignorable_entry_type__skipped_and_later_entries_apply(log: Log, entry_type: int) -> None:
    _seed_state(log)
    before = log.snap.tables

    result = log.apply(mock.raw_entry(entry_type, b"anything at all"), refused=True)

    assert result.error == "ignored unknown entry type"
    assert log.snap.tables is before
    log.apply(mock.server_member_entry("s1"))
    assert [m.name for m in log.snap.servers()] == ["s1"]


def test_fsm__refused_entry_at_index__later_entry_applies_at_its_own_index(log: Log) -> None:
    log.apply(mock.raw_entry(999), refused=True)

    log.apply(mock.register_node_entry(mock.node()))

    assert log.snap.index == 2
    assert log.snap.table_index("nodes") == 2


@pytest.mark.parametrize(
    "entry",
    [
        mock.raw_entry(ET.ENTRY_TYPE_JOB_REGISTER, b""),
        mock.register_job_entry(replace(mock.job(), id="")),
        mock.raw_entry(ET.ENTRY_TYPE_NODE_REGISTER, b""),
        mock.plan_entry([replace(mock.alloc(mock.job(), mock.node()), id="")]),
        mock.eval_update_entry(replace(mock.eval_for(mock.job()), id="")),
    ],
    ids=[
        "register-without-job",
        "job-without-id",
        "register-without-node",
        "alloc-without-id",
        "eval-without-id",
    ],
)
def test_fsm__entry_with_an_object_without_id__refused_and_unchanged(log: Log, entry: bytes) -> None:
    log.apply(entry, refused=True)

    assert log.snap.index == 0


# ---------------------------------------------------------------------------------------
# Snapshot restore, config, periodic launches, servers


def test_fsm__snapshot_restore_entry__replaces_state(log: Log) -> None:
    source = Log()
    _seed_state(source)
    source.apply(mock.server_member_entry("s1"))
    _seed_state(log)  # different objects: all must go
    log.apply(mock.server_member_entry("s2"))
    log.index = 40

    log.apply(mock.snapshot_restore_entry(source.snap.tables))

    got, want = log.snap.tables, source.snap.tables
    # Every table, secondary index and counter is the source's; only the indexes moved.
    for f in dataclasses.fields(Tables):
        if f.name not in ("index", "table_index"):
            assert getattr(got, f.name) == getattr(want, f.name), f.name
    assert got.index == 41
    assert {name: got.table_index.get(name) for name in TABLES} == dict.fromkeys(TABLES, 41)


def test_fsm__snapshot_restore_of_garbage__refused_and_unchanged(log: Log) -> None:
    _seed_state(log)
    before = log.snap.tables

    result = log.apply(
        mock.raw_entry(ET.ENTRY_TYPE_SNAPSHOT_RESTORE, b"\x0a\x05\xff\xff\xff\xff\xff"), refused=True
    )

    assert "restore failed" in result.error
    assert log.snap.tables is before


def test_fsm__scheduler_config__keeps_create_index(log: Log) -> None:
    log.apply(mock.scheduler_config_entry(SchedulerConfig()))
    config = SchedulerConfig(
        scheduler_algorithm="spread",
        rejection_tracker=RejectionTrackerConfig(threshold=3),
        pause_eval_broker=True,
    )

    log.apply(mock.scheduler_config_entry(config))

    assert log.snap.scheduler_config() == replace(config, create_index=1, modify_index=2)
    assert log.snap.table_index("scheduler_config") == 2


def test_fsm__periodic_launch__recorded_per_job(log: Log) -> None:
    parent = registered(log, mock.periodic_job(), with_eval=False)
    log.apply(mock.periodic_launch_entry(parent.id, mock.NOW))

    log.apply(mock.periodic_launch_entry(parent.id, mock.NOW + mock.HOUR))

    launch = log.snap.periodic_launch(parent.namespace, parent.id)
    assert launch is not None
    assert (launch.launch_ns, launch.create_index, launch.modify_index) == (mock.NOW + mock.HOUR, 3, 3)


def test_fsm__periodic_launch__never_moves_back__older_slot_refused(log: Log) -> None:
    parent = registered(log, mock.periodic_job(), with_eval=False)
    log.apply(mock.periodic_launch_entry(parent.id, mock.NOW + mock.HOUR))

    log.apply(mock.periodic_launch_entry(parent.id, mock.NOW), refused=True)
    log.apply(mock.periodic_launch_entry(parent.id, mock.NOW + mock.HOUR), refused=True)

    launch = log.snap.periodic_launch(parent.namespace, parent.id)
    assert launch is not None and launch.launch_ns == mock.NOW + mock.HOUR


def test_fsm__server_member__announced_and_updated(log: Log) -> None:
    log.apply(mock.server_member_entry("s1", grpc_address="10.0.0.1:4646"))

    log.apply(mock.server_member_entry("s1", grpc_address="10.0.0.9:4646"))

    (member,) = log.snap.servers()
    assert (member.grpc_address, member.modify_index) == ("10.0.0.9:4646", 2)


def test_fsm__only_touched_tables__get_the_entrys_index(log: Log) -> None:
    job = mock.job(type=JOB_TYPE_SERVICE)
    registered(log, job)

    log.apply(mock.register_node_entry(mock.node()))

    snap = log.snap
    assert snap.table_index("nodes") == 2
    assert snap.table_index("jobs", "evals", "job_summaries", "job_versions") == 1
    assert snap.table_index("allocs") == 0
