"""The generic (service/batch) scheduler end to end: Harness state in, SchedulerResult out.

Situations are cluster histories: build a state with the Harness (the real state store),
run ``compute_generic``, commit the plan the way the leader does (the plan applier's
``evaluate_plan`` on the current snapshot, which must accept every node, then the FSM's
``apply_plan_results``), change the world (time, node status, client reports) and look at
the next pass. Bucket counts come from the result's annotations (what ``drover job plan``
shows) through ``Expect``. The properties at the end: the fixed point, never more than
count live allocs per group, a stopped job places nothing, and the applier never rejects a
node of a plan (the "plan for node rejected" loop of docs/field-reports.md#field-report-1).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drover.scheduler import structs
from drover.scheduler.generic import batch_followups, compute_generic
from drover.scheduler.interfaces import SchedulerResult
from drover.scheduler.reconciler.generic import DelayedReschedule
from drover.scheduler.reconciler.vocabulary import DESC_RECONNECT_LOSER, DESC_RESCHEDULED
from drover.scheduler.structs import (
    Affinity,
    AllocatedPort,
    AllocatedResources,
    Allocation,
    Constraint,
    DisconnectStrategy,
    DrainStrategy,
    Evaluation,
    Job,
    NetworkResource,
    Node,
    NodeResources,
    Port,
    RejectionTrackerConfig,
    Resources,
    TaskState,
    UpdateStrategy,
)
from drover.server.fsm import FSM, encode_entry
from drover.server.plan_apply import RejectionTracker, evaluate_plan
from drover.v1 import raft_pb2
from tests.fixtures import mock
from tests.fixtures.buckets import Expect
from tests.fixtures.mock import HOUR, NOW, SECOND
from tests.harness import Harness
from tests.unit.test_reconcile import destructive_change, drawn_alloc_fields, with_group

# ---------------------------------------------------------------------------------------
# Builders and readers


def expect(result: SchedulerResult, want: Expect, group: str = "web") -> None:
    assert dict(result.annotations[group]) == want.generic()


def commit(h: Harness, result: SchedulerResult) -> None:
    """Commit ``result``'s plan as the leader does: the applier checks every node against
    the current snapshot (none may be rejected), then the FSM applies the entry."""
    if result.plan is None:
        return
    tracker = RejectionTracker(RejectionTrackerConfig(enabled=False))
    evaluated = evaluate_plan(result.plan, h.snapshot(), tracker, h.now_ns)
    assert evaluated.result.rejected_nodes == (), f"applier rejected {evaluated.result.rejected_nodes}"
    if evaluated.entry is not None:
        data = encode_entry(raft_pb2.ENTRY_TYPE_APPLY_PLAN_RESULTS, evaluated.entry)
        applied = FSM(h.store).apply(data, h.next_index())
        assert not applied.error, applied.error


def run_and_commit(h: Harness, ev: Evaluation) -> SchedulerResult:
    result = h.run(compute_generic, ev)
    commit(h, result)
    return result


def placed(result: SchedulerResult) -> list[Allocation]:
    assert result.plan is not None
    return [a for allocs in result.plan.node_allocation.values() for a in allocs]


def stopped(result: SchedulerResult) -> dict[str, Any]:
    assert result.plan is not None
    return {s.alloc_id: s for stops in result.plan.node_update.values() for s in stops}


def live(h: Harness, job: Job, group: str = "web") -> list[Allocation]:
    return [
        a
        for a in h.snapshot().allocs_by_job(job.namespace, job.id)
        if a.task_group == group and not a.terminal()
    ]


def cluster(n: int = 3, **node_overrides: Any) -> tuple[Harness, list[Node]]:
    h = Harness()
    return h, [h.add_node(mock.node(**node_overrides)) for _ in range(n)]


def place_all(h: Harness, job: Job) -> Job:
    """Register ``job``, schedule it, commit, and report every alloc running."""
    job = h.add_job(job)
    run_and_commit(h, mock.eval_for(job))
    for a in live(h, job):
        h.update_alloc(a.id, client_status=structs.ALLOC_CLIENT_RUNNING)
    return job


def register(h: Harness, job: Job) -> Job:
    """A new version of a registered job (the store keeps older versions)."""
    return h.add_job(job)


class NodeChanged(NamedTuple):
    h: Harness
    job: Job
    node: Node  # as it was before the change
    on_node: set[str]  # the job's allocs on it
    result: SchedulerResult


def change_node(job: Job, index: int, **changes: Any) -> NodeChanged:
    """``job`` placed and running over three nodes, then node ``index`` changed as given and
    the node-update eval run and committed."""
    h, nodes = cluster(3)
    job = place_all(h, job)
    node = nodes[index]
    on_node = {a.id for a in live(h, job) if a.node_id == node.id}
    h.add_node(replace(node, **changes))
    result = run_and_commit(h, mock.eval_for(job, triggered_by=structs.TRIGGER_NODE_UPDATE))
    return NodeChanged(h, job, node, on_node, result)


# ---------------------------------------------------------------------------------------
# Situations


def test_generic__initial_placement() -> None:
    h, _ = cluster(3)
    job = h.add_job(mock.job())
    result = run_and_commit(h, mock.eval_for(job))
    expect(result, Expect(place=10))
    allocs = placed(result)
    assert sorted(a.index for a in allocs) == list(range(10))
    assert len({a.name for a in allocs}) == 10
    assert all(
        a.desired_status == structs.ALLOC_DESIRED_RUN and a.client_status == structs.ALLOC_CLIENT_PENDING
        for a in allocs
    )
    assert result.eval_update.status == structs.EVAL_STATUS_COMPLETE
    assert result.eval_update.queued_allocations == {"web": 0}
    assert result.created_evals == ()


def test_generic__initial_placement__fixed_point() -> None:
    h, _ = cluster(3)
    job = place_all(h, mock.job())
    again = h.run(compute_generic, mock.eval_for(job, triggered_by=structs.TRIGGER_NODE_UPDATE))
    assert again.plan is None
    expect(again, Expect(ignore=10))


def test_generic__same_seed__same_plan() -> None:
    """A placement can be replayed from the eval: same state, same seed, same nodes."""
    h, _ = cluster(5)
    job = h.add_job(mock.job())
    ev = mock.eval_for(job)
    first = h.run(compute_generic, ev, seed=42)
    second = h.run(compute_generic, ev, seed=42)
    assert [(a.name, a.node_id) for a in placed(first)] == [(a.name, a.node_id) for a in placed(second)]


def test_generic__count_increase__places_missing_indexes() -> None:
    h, _ = cluster(3)
    job = place_all(h, with_group(mock.job(), count=4))
    before = [a.id for a in live(h, job)]
    job = register(h, with_group(replace(job, version=1), count=7))
    result = run_and_commit(h, mock.eval_for(job))
    expect(result, Expect(place=3, update_inplace=4))  # a new version: the others move in place
    assert sorted(a.index for a in _new_allocs(result, before)) == [4, 5, 6]


def test_generic__count_decrease__stops_highest_indexes() -> None:
    h, _ = cluster(3)
    job = place_all(h, mock.job())
    job = register(h, with_group(replace(job, version=1), count=6))
    result = run_and_commit(h, mock.eval_for(job))
    expect(result, Expect(stop=4, update_inplace=6))  # count is not destructive: the rest move in place
    assert sorted(a.index for a in live(h, job)) == list(range(6))


def test_generic__inplace_update__same_alloc_new_version() -> None:
    h, _ = cluster(3)
    job = place_all(h, mock.job())
    before = {a.id: a for a in live(h, job)}
    job = register(h, with_group(replace(job, version=1, priority=70), meta={"elb_check_type": "tcp"}))
    result = run_and_commit(h, mock.eval_for(job))
    expect(result, Expect(update_inplace=10))
    after = {a.id: a for a in live(h, job)}
    assert set(after) == set(before)
    assert {a.job_version for a in after.values()} == {1}
    # Ports and the client's view are kept.
    assert all(after[i].resources == before[i].resources for i in before)
    assert {a.client_status for a in after.values()} == {structs.ALLOC_CLIENT_RUNNING}


def test_generic__destructive_update__stop_and_replace() -> None:
    h, _ = cluster(3)
    job = place_all(h, mock.job())
    old_ids = {a.id for a in live(h, job)}
    new, _ = destructive_change(job, update=None)
    job = register(h, new)
    result = run_and_commit(h, mock.eval_for(job))
    expect(result, Expect(update_destructive=10, stop=10, place=10))
    assert {a.previous_allocation for a in placed(result)} == old_ids
    assert {a.job_version for a in live(h, job)} == {1}
    assert {s.desired_description for s in stopped(result).values()} == {
        "alloc is being updated due to job update"
    }


def test_generic__rolling_update__max_parallel_2_over_count_10() -> None:
    """A deployment rolls two at a time, and the next batch waits for health: placement
    alone (or any other eval meanwhile) opens no room. When all ten are healthy the
    scheduler marks the deployment successful and the version stable."""
    h, _ = cluster(3)
    update = UpdateStrategy(max_parallel=2, stagger_ns=30 * SECOND)
    job = place_all(h, with_group(mock.job(), update=update))
    new, _ = destructive_change(job, update=update)
    job = register(h, new)
    ev = mock.eval_for(job)
    for _batch in range(5):
        result = run_and_commit(h, ev)
        expect(result, Expect(update_destructive=2, stop=2, place=2, ignore=8))
        assert [e for e in result.created_evals if e.triggered_by == structs.TRIGGER_ROLLING_UPDATE] == []
        deployment = h.snapshot().latest_deployment(job.namespace, job.id)
        assert deployment is not None and deployment.job_version == job.version
        assert result.eval_update.deployment_id == deployment.id
        fresh = [a for a in placed(result)]
        assert {a.deployment_id for a in fresh} == {deployment.id}
        # Placed but not yet healthy: another eval (a node update) changes nothing.
        for a in live(h, job):
            h.update_alloc(a.id, client_status=structs.ALLOC_CLIENT_RUNNING)
        during = h.run(compute_generic, mock.eval_for(job, triggered_by=structs.TRIGGER_NODE_UPDATE))
        assert during.plan is None
        assert during.created_evals == ()  # no timer either: the health verdict looks again
        for a in fresh:
            h.set_health(a.id, structs.HEALTH_HEALTHY)
        ev = mock.eval_for(job, triggered_by=structs.TRIGGER_DEPLOYMENT_WATCHER)
    assert {a.job_version for a in live(h, job)} == {1}
    assert len(live(h, job)) == 10
    done = run_and_commit(h, ev)
    assert done.plan is not None and not done.plan.node_allocation and not done.plan.node_update
    deployment = h.snapshot().latest_deployment(job.namespace, job.id)
    assert deployment is not None and deployment.status == structs.DEPLOYMENT_STATUS_SUCCESSFUL
    assert deployment.task_groups[job.groups[0].name].healthy_allocs == 10
    assert h.run(compute_generic, mock.eval_for(job)).plan is None


def test_generic__failed_service_alloc__rescheduled_after_delay() -> None:
    h, _nodes = cluster(3)
    job = place_all(h, mock.job())
    victim = live(h, job)[0]
    h.update_alloc(
        victim.id,
        client_status=structs.ALLOC_CLIENT_FAILED,
        task_states={"web": TaskState(state="dead", failed=True, finished_at_ns=h.now_ns)},
        modify_time_ns=h.now_ns,
    )
    ev = mock.eval_for(job, triggered_by=structs.TRIGGER_RETRY_FAILED_ALLOC)
    first = run_and_commit(h, ev)
    expect(first, Expect(reschedule_later=1, ignore=9))
    (followup,) = first.created_evals
    assert followup.triggered_by == structs.TRIGGER_RETRY_FAILED_ALLOC
    assert followup.wait_until_ns == h.now_ns + 30 * SECOND
    assert h.snapshot().alloc(victim.id).followup_eval_id == followup.id  # type: ignore[union-attr]
    # Until the follow-up fires nothing changes, and no second follow-up is made.
    again = h.run(compute_generic, mock.eval_for(job, triggered_by=structs.TRIGGER_NODE_UPDATE))
    assert again.plan is None and again.created_evals == ()
    h.now_ns = followup.wait_until_ns
    result = run_and_commit(h, followup)
    expect(result, Expect(place=1, reschedule_now=1, ignore=9))
    (replacement,) = placed(result)
    assert replacement.previous_allocation == victim.id
    assert replacement.name == victim.name
    assert replacement.node_id != victim.node_id  # the previous node is penalised
    (event,) = replacement.reschedule_events
    assert (event.prev_alloc_id, event.prev_node_id, event.delay_ns) == (
        victim.id,
        victim.node_id,
        30 * SECOND,
    )
    assert stopped(result)[victim.id].desired_description == DESC_RESCHEDULED
    assert h.snapshot().alloc(victim.id).next_allocation == replacement.id  # type: ignore[union-attr]


def test_generic__failed_service_alloc__exponential_delay_grows() -> None:
    h, _ = cluster(3)
    job = place_all(h, with_group(mock.job(), count=1))
    delays = []
    for _ in range(4):
        (alloc,) = live(h, job)
        h.update_alloc(alloc.id, client_status=structs.ALLOC_CLIENT_FAILED, modify_time_ns=h.now_ns)
        first = run_and_commit(h, mock.eval_for(job, triggered_by=structs.TRIGGER_RETRY_FAILED_ALLOC))
        (followup,) = first.created_evals
        delays.append((followup.wait_until_ns - h.now_ns) // SECOND)
        h.now_ns = followup.wait_until_ns
        run_and_commit(h, followup)
        h.update_alloc(live(h, job)[0].id, client_status=structs.ALLOC_CLIENT_RUNNING)
    assert delays == [30, 60, 120, 240]


def test_generic__batch_completed__not_rerun() -> None:
    h, _ = cluster(2)
    job = place_all(h, mock.batch_job())
    for a in live(h, job):
        h.update_alloc(a.id, client_status=structs.ALLOC_CLIENT_COMPLETE)
    result = h.run(compute_generic, mock.eval_for(job, triggered_by=structs.TRIGGER_NODE_UPDATE))
    assert result.plan is None and result.created_evals == ()
    expect(result, Expect(ignore=10))


def test_generic__batch_failed__rescheduled_until_attempts_exhausted() -> None:
    h, _ = cluster(2)
    job = place_all(h, with_group(mock.batch_job(), count=1))
    (first_alloc,) = live(h, job)
    h.update_alloc(
        first_alloc.id, client_status=structs.ALLOC_CLIENT_FAILED, modify_time_ns=h.now_ns - 10 * SECOND
    )
    result = run_and_commit(h, mock.eval_for(job, triggered_by=structs.TRIGGER_RETRY_FAILED_ALLOC))
    expect(result, Expect(place=1, reschedule_now=1))
    (second_alloc,) = live(h, job)
    assert second_alloc.previous_allocation == first_alloc.id
    # The one attempt in 24h is used: the replacement's failure is final.
    h.update_alloc(
        second_alloc.id, client_status=structs.ALLOC_CLIENT_FAILED, modify_time_ns=h.now_ns - 10 * SECOND
    )
    result = h.run(compute_generic, mock.eval_for(job, triggered_by=structs.TRIGGER_RETRY_FAILED_ALLOC))
    assert result.plan is None and result.created_evals == ()
    expect(result, Expect(ignore=1))


def test_generic__lost_node__stopped_lost_and_replaced_elsewhere() -> None:
    h, job, dead, on_dead, result = change_node(mock.job(), 0, status=structs.NODE_STATUS_DOWN)
    expect(result, Expect(lost=len(on_dead), stop=len(on_dead), place=len(on_dead), ignore=10 - len(on_dead)))
    assert {s.client_status for s in stopped(result).values()} == {structs.ALLOC_CLIENT_LOST}
    assert all(a.node_id != dead.id for a in placed(result))
    assert {a.previous_allocation for a in placed(result)} == on_dead
    assert h.run(compute_generic, mock.eval_for(job)).plan is None


def test_generic__draining_node__migrates() -> None:
    h, job, drained, on_drained, result = change_node(
        mock.job(),
        1,
        drain_strategy=DrainStrategy(deadline_ns=HOUR),
        scheduling_eligibility=structs.NODE_INELIGIBLE,
    )
    n = len(on_drained)
    expect(result, Expect(migrate=n, stop=n, place=n, ignore=10 - n))
    assert all(a.node_id != drained.id for a in placed(result))
    assert {s.desired_description for s in stopped(result).values()} == {"alloc is being migrated"}
    assert h.run(compute_generic, mock.eval_for(job)).plan is None


def test_generic__disconnected_node__unknown_and_replaced() -> None:
    h, job, _away, on_away, result = change_node(mock.job(), 2, status=structs.NODE_STATUS_DISCONNECTED)
    n = len(on_away)
    expect(result, Expect(disconnecting=n, place=n, ignore=10 - n))
    marks = stopped(result)
    assert set(marks) == on_away
    assert {(m.desired_status, m.client_status) for m in marks.values()} == {
        (structs.ALLOC_DESIRED_RUN, structs.ALLOC_CLIENT_UNKNOWN)
    }
    snap = h.snapshot()
    assert {snap.alloc(i).client_status for i in on_away} == {structs.ALLOC_CLIENT_UNKNOWN}  # type: ignore[union-attr]
    # Kept, still desired to run, and replaced once.
    again = h.run(compute_generic, mock.eval_for(job, triggered_by=structs.TRIGGER_NODE_UPDATE))
    assert again.plan is None
    assert len(live(h, job)) == 10 + n


def _reconnect_race(
    h: Harness, job: Job, replacement_status: str | None = structs.ALLOC_CLIENT_RUNNING
) -> tuple[Job, Allocation, Allocation]:
    """``job`` placed (count 1): disconnect the node, commit the replacement (its client
    reports ``replacement_status``; None leaves it as placed), bring the node back:
    (job, original, replacement) before the reconnecting pass."""
    (original,) = live(h, job)
    node = h.snapshot().node(original.node_id)
    assert node is not None
    h.add_node(replace(node, status=structs.NODE_STATUS_DISCONNECTED))
    run_and_commit(h, mock.eval_for(job, triggered_by=structs.TRIGGER_NODE_UPDATE))
    (replacement,) = [a for a in live(h, job) if a.id != original.id]
    if replacement_status is not None:
        h.update_alloc(replacement.id, client_status=replacement_status)
    h.add_node(node)  # back, ready
    return job, original, replacement


def test_generic__disconnected_node__reconnect_keeps_original_stops_replacement() -> None:
    h, _nodes = cluster(3)
    job = place_all(
        h, with_group(mock.job(), count=1, disconnect=DisconnectStrategy(reconcile="keep_original"))
    )
    job, original, replacement = _reconnect_race(h, job, replacement_status=None)
    result = run_and_commit(h, mock.eval_for(job, triggered_by=structs.TRIGGER_NODE_UPDATE))
    expect(result, Expect(reconnecting=1, stop=1))
    assert set(stopped(result)) == {replacement.id}
    assert [a.id for a in live(h, job)] == [original.id]


def test_generic__failed_replacement_of_reconnected_original__original_updated__fixed_point() -> None:
    """Slot 0's original came back from a disconnect while its replacement failed; slot 1
    failed too and waits for its reschedule. The failed replacement is stopped (Nomad
    #24165) in the same pass that replaces the original destructively: left desired-running,
    it counted for the slot again once the original was stopped, and the next pass stamped a
    follow-up eval on it (a fixed-point break the property found)."""
    h, (node,) = cluster(1)
    v0 = h.add_job(with_group(mock.job(), count=2, update=None))
    new, _ = destructive_change(v0, update=None)
    job = register(h, new)
    original = h.add_alloc(mock.alloc(v0, node, 0, id="original", client_status=structs.ALLOC_CLIENT_RUNNING))
    h.add_alloc(
        mock.alloc(
            job,
            node,
            0,
            id="failed-replacement",
            client_status=structs.ALLOC_CLIENT_FAILED,
            previous_allocation=original.id,
        )
    )
    h.add_alloc(mock.alloc(job, node, 1, id="waiting", client_status=structs.ALLOC_CLIENT_FAILED))
    first = run_and_commit(h, mock.eval_for(job))
    expect(first, Expect(update_destructive=1, stop=2, place=1, reschedule_later=1))
    assert stopped(first)["failed-replacement"].desired_description == DESC_RECONNECT_LOSER
    assert h.snapshot().alloc("failed-replacement").desired_status == structs.ALLOC_DESIRED_STOP  # type: ignore[union-attr]
    second = h.run(compute_generic, mock.eval_for(job, triggered_by=structs.TRIGGER_NODE_UPDATE))
    assert second.plan is None, second.annotations
    assert second.created_evals == ()


def test_generic__reconnect__best_score_tie__original_kept() -> None:
    h, _ = cluster(2)
    job = place_all(h, with_group(mock.job(), count=1))
    job, original, replacement = _reconnect_race(h, job)
    result = run_and_commit(h, mock.eval_for(job, triggered_by=structs.TRIGGER_NODE_UPDATE))
    assert set(stopped(result)) == {replacement.id}
    assert [a.id for a in live(h, job)] == [original.id]


def test_generic__reconnect__best_score__better_ranked_replacement_kept() -> None:
    h, nodes = cluster(2)
    affinity = Affinity(attribute="${meta.rack}", operator="=", value="r9", weight=100)
    job = place_all(h, replace(with_group(mock.job(), count=1), affinities=(affinity,)))
    (original,) = live(h, job)
    other = next(n for n in nodes if n.id != original.node_id)
    h.add_node(replace(other, meta={"rack": "r9"}))  # the replacement's node becomes preferred
    job, original, replacement = _reconnect_race(h, job)
    assert replacement.node_id == other.id
    result = run_and_commit(h, mock.eval_for(job, triggered_by=structs.TRIGGER_NODE_UPDATE))
    expect(result, Expect(stop=1, ignore=1))
    assert set(stopped(result)) == {original.id}
    assert [a.id for a in live(h, job)] == [replacement.id]


def test_generic__disconnected_node__replace_false__kept_without_replacement() -> None:
    job = with_group(mock.job(), disconnect=DisconnectStrategy(replace=False))
    _h, _job, _away, on_away, result = change_node(job, 0, status=structs.NODE_STATUS_DISCONNECTED)
    n = len(on_away)
    expect(result, Expect(disconnecting=n, ignore=10 - n))
    assert placed_or_empty(result) == []


def placed_or_empty(result: SchedulerResult) -> list[Allocation]:
    return placed(result) if result.plan is not None else []


def _one_port_job(count: int) -> Job:
    job = mock.job()
    return with_group(job, count=count, network=NetworkResource(dynamic_ports=(Port(label="http"),)))


def _tight_node(**overrides: Any) -> Node:
    # Five dynamic ports, room for many more allocs: ports are the only limit.
    return mock.node(
        resources=NodeResources(
            cpu_mhz=100_000,
            memory_mb=100_000,
            disk_mb=100_000,
            reserved_ports=(22,),
            min_dynamic_port=20000,
            max_dynamic_port=20004,
        ),
        **overrides,
    )


def test_generic__ports__count_5_on_one_node__no_collisions() -> None:
    h = Harness()
    h.add_node(_tight_node())
    job = h.add_job(_one_port_job(5))
    result = run_and_commit(h, mock.eval_for(job))  # commit() fails on an applier rejection
    expect(result, Expect(place=5))
    ports = [p.value for a in placed(result) for p in a.resources.ports]  # type: ignore[union-attr]
    assert sorted(ports) == [20000, 20001, 20002, 20003, 20004]


def test_generic__ports_exhausted__one_blocked_eval() -> None:
    h = Harness()
    h.add_node(_tight_node())
    job = h.add_job(_one_port_job(7))
    ev = mock.eval_for(job)
    result = run_and_commit(h, ev)
    expect(result, Expect(place=7))
    assert len(placed(result)) == 5
    (blocked,) = result.created_evals
    assert blocked.status == structs.EVAL_STATUS_BLOCKED
    assert blocked.triggered_by == structs.TRIGGER_QUEUED_ALLOCS
    assert blocked.previous_eval == ev.id
    assert blocked.queued_allocations == {"web": 2}
    assert result.eval_update.status == structs.EVAL_STATUS_COMPLETE
    assert result.eval_update.blocked_eval == blocked.id
    assert result.eval_update.queued_allocations == {"web": 2}
    assert result.queued == {"web": 2}
    assert result.eval_update.failed_tg_allocs["web"]


def test_generic__nothing_fits_in_two_groups__still_one_blocked_eval() -> None:
    h, _ = cluster(1, resources=NodeResources(cpu_mhz=200, memory_mb=200))
    job = mock.job()
    job = replace(job, groups=(job.groups[0], replace(job.groups[0], name="api", count=2)))
    job = h.add_job(job)
    result = h.run(compute_generic, mock.eval_for(job))
    assert result.plan is None
    (blocked,) = result.created_evals
    assert blocked.queued_allocations == {"web": 10, "api": 2}
    assert result.eval_update.failed_tg_allocs.keys() == {"web", "api"}


def test_generic__job_stopped__stops_all_places_nothing() -> None:
    h, _ = cluster(3)
    job = place_all(h, mock.job())
    job = register(h, replace(job, version=1, stop=True))
    result = run_and_commit(h, mock.eval_for(job))
    expect(result, Expect(stop=10))
    assert placed_or_empty(result) == []
    assert live(h, job) == []
    assert h.run(compute_generic, mock.eval_for(job)).plan is None


def test_generic__job_purged__stops_all() -> None:
    h, _ = cluster(3)
    job = place_all(h, mock.job())
    FSM(h.store).apply(mock.deregister_entry(job.id, purge=True), h.next_index())
    assert h.snapshot().job(job.namespace, job.id) is None
    result = run_and_commit(h, mock.eval_for(job))
    assert len(stopped(result)) == 10
    assert live(h, job) == []


def test_generic__group_removed__its_allocs_stopped() -> None:
    h, _ = cluster(3)
    job = mock.job()
    job = place_all(h, replace(job, groups=(job.groups[0], replace(job.groups[0], name="api", count=2))))
    job = register(h, replace(job, version=1, groups=(job.groups[0],)))
    result = run_and_commit(h, mock.eval_for(job))
    expect(result, Expect(stop=2), group="api")
    expect(result, Expect(update_inplace=10), group="web")


def test_generic__system_job__eval_failed() -> None:
    h, _ = cluster(1)
    job = h.add_job(mock.system_job())
    result = h.run(compute_generic, mock.eval_for(job))
    assert result.plan is None
    assert result.eval_update.status == structs.EVAL_STATUS_FAILED


def test_generic__constraint_change__allocs_on_now_infeasible_nodes_move() -> None:
    h = Harness()
    h.add_node(mock.node(meta={"rack": "r1"}))
    h.add_node(mock.node(meta={"rack": "r2"}))
    job = place_all(h, with_group(mock.job(), count=4, update=None))
    constraint = Constraint(attribute="${meta.rack}", operator="=", value="r2")
    job = register(h, replace(job, version=1, constraints=(*job.constraints, constraint)))
    result = run_and_commit(h, mock.eval_for(job))
    r2 = {n.id for n in h.snapshot().nodes() if n.meta.get("rack") == "r2"}
    assert all(a.node_id in r2 for a in live(h, job))
    assert len(live(h, job)) == 4
    assert result.annotations["web"]["update_destructive"] + result.annotations["web"]["update_inplace"] == 4


def test_generic__ineligible_node__outdated_allocs_wait() -> None:
    """The applier rejects any upsert on an ineligible node: no in-place update there."""
    h, nodes = cluster(2)
    job = place_all(h, mock.job())
    h.add_node(replace(nodes[0], scheduling_eligibility=structs.NODE_INELIGIBLE))
    job = register(h, with_group(replace(job, version=1), meta={"elb_check_type": "tcp"}))
    result = run_and_commit(h, mock.eval_for(job))  # commit() asserts nothing was rejected
    on_ineligible = sum(1 for a in live(h, job) if a.node_id == nodes[0].id)
    expect(result, Expect(update_inplace=10 - on_ineligible, ignore=on_ineligible))


def test_generic__reschedule_followups__batched_in_5s_windows() -> None:
    job, node = mock.job(), mock.node()
    allocs = [mock.alloc(job, node, i) for i in range(4)]
    delayed = [
        DelayedReschedule(allocs[0], NOW),
        DelayedReschedule(allocs[1], NOW + 4 * SECOND),
        DelayedReschedule(allocs[2], NOW + 5 * SECOND),
        DelayedReschedule(allocs[3], NOW + 30 * SECOND),
    ]
    batches = batch_followups(delayed)
    assert [(at, [a.index for a in batch]) for at, batch in batches] == [
        (NOW, [0, 1]),
        (NOW + 5 * SECOND, [2]),
        (NOW + 30 * SECOND, [3]),
    ]


# ---------------------------------------------------------------------------------------
# Properties


_PORTS = itertools.count(21000)


def _sized_node(node_id: str, cpu_mhz: int) -> Node:
    return mock.node(
        id=node_id,
        resources=NodeResources(
            cpu_mhz=cpu_mhz, reserved=Resources(cpu_mhz=100, memory_mb=256, disk_mb=4096)
        ),
    )


@st.composite
def histories(draw: st.DrawFn) -> tuple[Harness, Job]:
    """A cluster (ready, down, draining, disconnected and ineligible nodes) with a job at
    version 1 (version 0 differs in place or destructively) and up to 10 allocs of it in
    any state, some replacing earlier ones. Every alloc holds its own ports."""
    h = Harness()
    nodes = {
        # Sometimes small (two allocs each): placements block, and the rest must still hold.
        "n-a": _sized_node("n-a", draw(st.sampled_from((4000, 1200)))),
        "n-b": _sized_node("n-b", draw(st.sampled_from((4000, 1200)))),
        "n-down": mock.node(id="n-down", status=structs.NODE_STATUS_DOWN),
        "n-drain": mock.node(
            id="n-drain",
            drain_strategy=DrainStrategy(deadline_ns=HOUR),
            scheduling_eligibility=structs.NODE_INELIGIBLE,
        ),
        "n-away": mock.node(id="n-away", status=structs.NODE_STATUS_DISCONNECTED),
        "n-inel": mock.node(id="n-inel", scheduling_eligibility=structs.NODE_INELIGIBLE),
    }
    for node in nodes.values():
        h.add_node(node)
    base = mock.batch_job(id="j") if draw(st.booleans()) else mock.job(id="j")
    count = draw(st.integers(0, 6))
    v0 = with_group(base, count=count, update=UpdateStrategy(max_parallel=draw(st.integers(0, 3))))
    task = v0.groups[0].tasks[0]
    if draw(st.booleans()):
        task = replace(task, config_json='{"v": 1}')
    v1 = with_group(
        replace(v0, version=1, stop=draw(st.booleans()) and draw(st.booleans())),
        tasks=(task,),
        meta={"v": "1"},
        disconnect=DisconnectStrategy(replace=draw(st.booleans())),
    )
    h.add_job(v0)
    h.add_job(v1)
    allocs: list[Allocation] = []
    for i in range(draw(st.integers(0, 10))):
        version = draw(st.integers(0, 1))
        job = v1 if version else v0
        node = nodes[draw(st.sampled_from(sorted(nodes)))]
        total = job.groups[0].total_resources()
        ports = tuple(
            AllocatedPort(label=p.label, value=next(_PORTS))
            for p in (job.groups[0].network or NetworkResource()).dynamic_ports
        )
        alloc = mock.alloc(
            job,
            node,
            draw(st.integers(0, 7)),
            **drawn_alloc_fields(draw, i, allocs),
            resources=AllocatedResources(
                cpu_mhz=total.cpu_mhz, memory_mb=total.memory_mb, disk_mb=total.disk_mb, ports=ports
            ),
        )
        allocs.append(h.add_alloc(alloc))
    return h, v1


def _live_by_group(h: Harness, job: Job) -> Counter[str]:
    away = {n.id for n in h.snapshot().nodes() if n.status == structs.NODE_STATUS_DISCONNECTED}
    return Counter(a.task_group for a in live(h, job) if a.node_id not in away)


def _new_allocs(result: SchedulerResult, before: Iterable[str]) -> list[Allocation]:
    known = set(before)
    return [a for a in placed_or_empty(result) if a.id not in known]


_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(histories())
def test_generic__property__fixed_point_and_never_more_than_count(case: tuple[Harness, Job]) -> None:
    h, job = case
    first = h.run(compute_generic, mock.eval_for(job, id="e1"))
    commit(h, first)  # fails if the applier rejects any node
    counts = _live_by_group(h, job)
    for group in job.groups:
        assert counts[group.name] <= (0 if job.stop else group.count)
    second = h.run(compute_generic, mock.eval_for(job, id="e2", triggered_by=structs.TRIGGER_NODE_UPDATE))
    delayed = first.eval_update.blocked_eval or first.eval_update.next_eval
    if not delayed:
        assert second.plan is None, second.annotations
        assert all(e.triggered_by == structs.TRIGGER_RETRY_FAILED_ALLOC for e in first.created_evals)
        assert second.created_evals == ()


@_SETTINGS
@given(histories())
def test_generic__property__stopped_job_places_nothing(case: tuple[Harness, Job]) -> None:
    h, job = case
    job = h.add_job(replace(job, version=2, stop=True))
    before = [a.id for a in h.snapshot().allocs_by_job(job.namespace, job.id)]
    result = h.run(compute_generic, mock.eval_for(job))
    assert _new_allocs(result, before) == []
    commit(h, result)
    assert sum(_live_by_group(h, job).values()) == 0


@pytest.mark.parametrize("seed", range(5))
def test_generic__many_nodes__every_placement_accepted(seed: int) -> None:
    h, _ = cluster(20)
    job = h.add_job(with_group(mock.job(), count=100))
    result = h.run(compute_generic, mock.eval_for(job), seed=seed)
    commit(h, result)  # the applier re-checks every node
    assert len(placed(result)) == 100
    assert result.created_evals == ()
