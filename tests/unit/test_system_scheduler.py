"""The system/sysbatch scheduler end to end: Harness state in, SchedulerResult out.

Situations are cluster histories: build a state with the Harness (the real state store),
run ``compute_system``, commit the plan the way a healthy applier would, and look at the
next pass. Bucket counts come from the result's annotations (what ``drover job plan``
shows) through the same ``Expect`` as the diff tests. The properties at the end hold the
scheduler to docs/design.md#invariant-1 and to the fixed point that keeps it out of the
"plan for node rejected" loop (docs/field-reports.md#field-report-1).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from drover.scheduler import structs
from drover.scheduler.fit import allocs_fit, proposed_allocs
from drover.scheduler.interfaces import SchedulerResult
from drover.scheduler.reconciler.vocabulary import DESC_DUPLICATE, DESC_LOST, DESC_UNKNOWN
from drover.scheduler.structs import (
    AllocatedPort,
    AllocatedResources,
    Allocation,
    DeploymentStatusUpdate,
    Job,
    NetworkResource,
    Node,
    Plan,
    Port,
    UpdateStrategy,
)
from drover.scheduler.system import compute_sysbatch, compute_system
from drover.server import deployments as server_deployments
from tests.fixtures import mock
from tests.fixtures.buckets import Expect
from tests.fixtures.mock import NOW, SECOND
from tests.harness import Harness
from tests.unit.test_system_diff import bump, running, with_group

# ---------------------------------------------------------------------------------------
# Builders and readers


def expect(result: SchedulerResult, want: Expect, group: str = "web") -> None:
    counts = result.annotations[group]
    assert dict(counts) == want.system(), {k: v for k, v in counts.items() if v}


def cluster(n: int, **node_overrides: object) -> tuple[Harness, list[Node]]:
    h = Harness()
    return h, [h.add_node(mock.node(**node_overrides)) for _ in range(n)]


def run(h: Harness, job: Job, **eval_overrides: object) -> SchedulerResult:
    return h.run(compute_system, mock.eval_for(job, **eval_overrides))


def placed(result: SchedulerResult) -> list[Allocation]:
    plan = result.plan
    return [] if plan is None else [a for allocs in plan.node_allocation.values() for a in allocs]


def stops(result: SchedulerResult) -> dict[str, tuple[str, str, str]]:
    """alloc ID -> (desired status, description, client status) of every node_update entry."""
    plan = result.plan
    if plan is None:
        return {}
    return {
        s.alloc_id: (s.desired_status, s.desired_description, s.client_status)
        for entries in plan.node_update.values()
        for s in entries
    }


def live_by_slot(h: Harness, job: Job) -> Counter[tuple[str, str]]:
    """(group, node) -> live desired-running allocs of the job: docs/design.md#invariant-1's measure."""
    return Counter(
        (a.task_group, a.node_id)
        for a in h.snapshot().allocs_by_job(job.namespace, job.id)
        if a.desired_status == structs.ALLOC_DESIRED_RUN and not a.client_terminal()
    )


def assert_plan_fits(h: Harness, plan: Plan | None) -> None:
    """What the plan applier checks (the same ``allocs_fit``): every node with placements fits."""
    if plan is None:
        return
    snap = h.snapshot()
    for node_id, allocs in plan.node_allocation.items():
        node = snap.node(node_id)
        assert node is not None
        stopped = [
            s.alloc_id
            for s in plan.node_update.get(node_id, ())
            if s.desired_status != structs.ALLOC_DESIRED_RUN
        ]
        proposed = proposed_allocs(snap.allocs_by_node(node_id), stopped, allocs)
        fit = allocs_fit(node, proposed)
        assert fit.fits, (node_id, fit.reason)


def with_port(job: Job, port: int) -> Job:
    return with_group(
        job, network=NetworkResource(reserved_ports=(Port(label="metrics", value=port, to=port),))
    )


def holding(port: int) -> AllocatedResources:
    return AllocatedResources(
        cpu_mhz=500, memory_mb=256, disk_mb=150, ports=(AllocatedPort(label="metrics", value=port),)
    )


# ---------------------------------------------------------------------------------------
# Placement and the fixed point


def test_system__new_job__one_alloc_per_node() -> None:
    h, nodes = cluster(3)
    job = h.add_job(mock.system_job())
    result = run(h, job)

    expect(result, Expect(place=3))
    allocs = placed(result)
    assert sorted(a.node_id for a in allocs) == sorted(n.id for n in nodes)
    assert {a.name for a in allocs} == {f"{job.id}.web[0]"}
    assert all(
        a.job_version == job.version and a.client_status == structs.ALLOC_CLIENT_PENDING for a in allocs
    )
    assert all([p.value for p in a.resources.ports] == [8080] for a in allocs if a.resources)
    assert result.eval_update.status == structs.EVAL_STATUS_COMPLETE
    assert result.eval_update.queued_allocations == {"web": 0}
    assert result.created_evals == ()

    h.commit(result)
    again = run(h, job)
    assert again.plan is None
    expect(again, Expect(ignore=3))


def test_system__node_joins__only_it_gets_an_alloc() -> None:
    h, _ = cluster(2)
    job = h.add_job(mock.system_job())
    h.commit(run(h, job))
    new = h.add_node(mock.node())
    result = run(h, job, triggered_by="node-update", node_id=new.id)
    expect(result, Expect(place=1, ignore=2))
    assert [a.node_id for a in placed(result)] == [new.id]


def test_system__constraint_filtered_node__no_alloc_no_block() -> None:
    h, _ = cluster(2)
    h.add_node(mock.node(attributes={"kernel.name": "windows", "driver.mock": "1"}))
    job = h.add_job(mock.system_job())
    result = run(h, job)
    expect(result, Expect(place=2))
    assert result.created_evals == ()


def test_system__failed_alloc_is_replaced_with_previous_allocation() -> None:
    h, nodes = cluster(1)
    job = h.add_job(mock.system_job())
    failed = h.add_alloc(mock.alloc(job, nodes[0], client_status=structs.ALLOC_CLIENT_FAILED))
    result = run(h, job)
    expect(result, Expect(place=1))
    assert [a.previous_allocation for a in placed(result)] == [failed.id]


def test_system__wrong_job_type__eval_fails() -> None:
    h, _ = cluster(1)
    job = h.add_job(mock.job())
    result = run(h, job)
    assert result.plan is None
    assert result.eval_update.status == structs.EVAL_STATUS_FAILED


# ---------------------------------------------------------------------------------------
# Stopping


def test_system__job_stopped__stops_everything() -> None:
    h, nodes = cluster(3)
    job = h.add_job(mock.system_job())
    for n in nodes:
        h.add_alloc(running(job, n))
    stopped = h.add_job(replace(job, stop=True, version=job.version + 1))
    result = run(h, stopped, triggered_by="job-deregister")
    expect(result, Expect(stop=3))
    assert placed(result) == []
    h.commit(result)
    assert run(h, stopped).plan is None


def test_system__job_purged__stops_everything() -> None:
    h, nodes = cluster(2)
    job = h.add_job(mock.system_job())
    for n in nodes:
        h.add_alloc(running(job, n))
    h._write(lambda txn: txn.delete_job((job.namespace, job.id)))
    result = run(h, job, triggered_by="job-deregister")
    expect(result, Expect(stop=2))  # the group is named after its allocs: the job is gone
    assert result.eval_update.queued_allocations == {}
    h.commit(result)
    assert run(h, job).plan is None


# ---------------------------------------------------------------------------------------
# Updates and max_parallel


def test_system__inplace_update__same_alloc_new_version() -> None:
    h, nodes = cluster(2)
    v0 = h.add_job(mock.system_job())
    olds = [h.add_alloc(running(v0, n)) for n in nodes]
    v1 = h.add_job(bump(v0, destructive=False))
    result = run(h, v1)
    expect(result, Expect(update_inplace=2))
    assert stops(result) == {}
    assert sorted(a.id for a in placed(result)) == sorted(a.id for a in olds)
    assert all(a.job_version == v1.version for a in placed(result))
    h.commit(result)
    assert run(h, v1).plan is None


def test_system__destructive_update__stop_and_replace_on_same_node() -> None:
    h, nodes = cluster(2)
    v0 = h.add_job(mock.system_job())
    olds = {h.add_alloc(running(v0, n)).id: n.id for n in nodes}
    v1 = h.add_job(bump(v0, destructive=True))
    result = run(h, v1)
    expect(result, Expect(update_destructive=2))
    assert set(stops(result)) == set(olds)
    new = placed(result)
    assert {a.previous_allocation: a.node_id for a in new} == olds
    assert all(a.id not in olds and a.job_version == v1.version for a in new)
    assert_plan_fits(h, result.plan)
    h.commit(result)
    assert run(h, v1).plan is None


def test_system__field_report_1__max_parallel_1__destructive_plus_newer_inplace_on_one_node() -> None:
    """The seed's case, end to end. max_parallel 1. Node A: an alloc needing a destructive
    update and a newer one needing only an in-place update. Node B: a destructive update.
    One pass: A keeps the newer alloc (in-place updated), stops the older duplicate for
    free, and exactly ONE destructive update happens, B's. Nothing is deferred."""
    h = Harness()
    a, b = h.add_node(mock.node(id="node-a")), h.add_node(mock.node(id="node-b"))
    v0 = h.add_job(replace(mock.system_job(), update=UpdateStrategy(max_parallel=1, stagger_ns=30 * SECOND)))
    v1 = h.add_job(bump(v0, destructive=True))
    a_old = h.add_alloc(running(v0, a, id="a-old", create_index=10))
    a_new = h.add_alloc(running(v1, a, id="a-new", create_index=20))
    b_old = h.add_alloc(running(v0, b, id="b-old", create_index=11))
    v2 = h.add_job(bump(v1, destructive=False))

    result = run(h, v2)

    expect(result, Expect(update_inplace=1, stop=1, update_destructive=1))
    assert stops(result) == {
        a_old.id: (structs.ALLOC_DESIRED_STOP, DESC_DUPLICATE, ""),
        b_old.id: (structs.ALLOC_DESIRED_STOP, "alloc is being updated due to job update", ""),
    }
    by_id = {x.id: x for x in placed(result)}
    assert by_id.pop(a_new.id).job_version == v2.version  # in place, same ID
    [replacement] = by_id.values()  # the one destructive update
    assert (replacement.node_id, replacement.previous_allocation) == (b.id, b_old.id)
    assert result.created_evals == ()
    assert_plan_fits(h, result.plan)

    h.commit(result)
    assert live_by_slot(h, v2) == {("web", a.id): 1, ("web", b.id): 1}
    assert run(h, v2).plan is None


def test_system__stagger__follow_up_eval_for_the_rest() -> None:
    h, nodes = cluster(5)
    v0 = h.add_job(replace(mock.system_job(), update=UpdateStrategy(max_parallel=2, stagger_ns=45 * SECOND)))
    for n in nodes:
        h.add_alloc(running(v0, n))
    v1 = h.add_job(bump(v0, destructive=True))

    batches: list[int] = []
    ev = mock.eval_for(v1)
    for _ in range(5):
        result = h.run(compute_system, ev)
        if result.plan is None:
            break
        batches.append(len(placed(result)))
        assert_plan_fits(h, result.plan)
        h.commit(result)
        if not result.created_evals:
            break
        [follow] = result.created_evals
        assert follow.triggered_by == structs.TRIGGER_ROLLING_UPDATE
        assert follow.status == structs.EVAL_STATUS_PENDING
        assert follow.wait_until_ns == NOW + 45 * SECOND
        assert follow.previous_eval == ev.id
        assert result.eval_update.next_eval == follow.id
        assert result.eval_update.status == structs.EVAL_STATUS_COMPLETE
        # The stagger alone is not enough: the batch's health is not known yet.
        early = h.run(compute_system, follow)
        assert early.plan is None or not early.plan.node_allocation
        for a in placed(result):
            h.set_health(a.id, structs.HEALTH_HEALTHY)
        ev = follow
    assert batches == [2, 2, 1]
    for a in h.snapshot().allocs_by_job(v1.namespace, v1.id):
        if not a.terminal() and a.deployment_status is None:
            h.set_health(a.id, structs.HEALTH_HEALTHY)
    finished = run(h, v1)
    assert finished.plan is not None and not finished.plan.node_allocation
    assert [u.status for u in finished.plan.deployment_updates] == [structs.DEPLOYMENT_STATUS_SUCCESSFUL]
    h.commit(finished)
    assert run(h, v1).plan is None
    assert all(
        a.job_version == v1.version
        for a in h.snapshot().allocs_by_job(v1.namespace, v1.id)
        if not a.terminal()
    )


@pytest.mark.parametrize("status", [structs.DEPLOYMENT_STATUS_PAUSED, structs.DEPLOYMENT_STATUS_FAILED])
def test_system__stagger__no_timer_while_the_deployment_blocks(status: str) -> None:
    """A paused or failed deployment rolls nothing: a stagger eval would only find the same
    nodes held back and write another, one per stagger for as long as it stays so. What
    unblocks it (a resume, a new version) writes its own eval."""
    h, nodes = cluster(3)
    v0 = h.add_job(replace(mock.system_job(), update=UpdateStrategy(max_parallel=1, stagger_ns=45 * SECOND)))
    for n in nodes:
        h.add_alloc(running(v0, n))
    v1 = h.add_job(bump(v0, destructive=True))
    first = run(h, v1)
    assert [e.triggered_by for e in first.created_evals] == [structs.TRIGGER_ROLLING_UPDATE]
    h.commit(first)
    deployment = h.snapshot().latest_deployment(v1.namespace, v1.id)
    assert deployment is not None
    update = DeploymentStatusUpdate(deployment.id, status, "by the operator")
    h._write(lambda txn: server_deployments.set_status(txn, update, txn.index, h.now_ns))
    [follow] = first.created_evals
    blocked = h.run(compute_system, follow)
    assert blocked.plan is None or not blocked.plan.node_allocation
    assert blocked.created_evals == ()
    assert blocked.eval_update.next_eval == follow.next_eval


# ---------------------------------------------------------------------------------------
# Duplicates and exclusive ports (docs/field-reports.md#field-report-1)


def test_system__duplicates_on_static_port__one_survives_nothing_replaced() -> None:
    h, [node] = cluster(1)
    job = h.add_job(with_port(mock.system_job(), 9100))
    first = h.add_alloc(running(job, node, resources=holding(9100), create_index=1))
    second = h.add_alloc(running(job, node, resources=holding(9100), create_index=2))
    result = run(h, job)
    expect(result, Expect(stop=1, ignore=1))
    assert stops(result) == {first.id: (structs.ALLOC_DESIRED_STOP, DESC_DUPLICATE, "")}
    assert placed(result) == []
    h.commit(result)
    assert live_by_slot(h, job) == {("web", node.id): 1}
    assert h.snapshot().alloc(second.id).desired_status == structs.ALLOC_DESIRED_RUN  # type: ignore[union-attr]
    assert run(h, job).plan is None


def test_system__duplicates_on_static_port_during_destructive_update__one_replacement_that_fits() -> None:
    h, [node] = cluster(1)
    v0 = h.add_job(with_port(mock.system_job(), 9100))
    dups = [h.add_alloc(running(v0, node, resources=holding(9100))) for _ in range(2)]
    v1 = h.add_job(bump(v0, destructive=True))
    result = run(h, v1)
    expect(result, Expect(stop=1, update_destructive=1))
    assert set(stops(result)) == {a.id for a in dups}
    [new] = placed(result)
    assert [p.value for p in new.resources.ports] == [9100]  # type: ignore[union-attr]
    assert_plan_fits(h, result.plan)
    h.commit(result)
    assert live_by_slot(h, v1) == {("web", node.id): 1}
    assert run(h, v1).plan is None


def test_system__port_held_by_another_job__blocked_not_placed_twice() -> None:
    h, nodes = cluster(3)
    squatter_job = h.add_job(mock.job(id="squatter"))
    h.add_alloc(
        mock.alloc(
            squatter_job, nodes[0], resources=holding(9100), client_status=structs.ALLOC_CLIENT_RUNNING
        )
    )
    job = h.add_job(with_port(mock.system_job(), 9100))
    ev = mock.eval_for(job)
    result = h.run(compute_system, ev)

    expect(result, Expect(place=3))
    assert sorted(a.node_id for a in placed(result)) == sorted(n.id for n in nodes[1:])
    assert_plan_fits(h, result.plan)
    assert result.queued == {"web": 1}
    [blocked] = result.created_evals
    assert (blocked.status, blocked.triggered_by, blocked.previous_eval) == (
        structs.EVAL_STATUS_BLOCKED,
        structs.TRIGGER_QUEUED_ALLOCS,
        ev.id,
    )
    assert result.eval_update.status == structs.EVAL_STATUS_COMPLETE
    assert result.eval_update.blocked_eval == blocked.id
    assert result.eval_update.queued_allocations == {"web": 1}
    assert nodes[0].id in result.eval_update.failed_tg_allocs["web"]

    h.commit(result)
    again = run(h, job)
    assert again.plan is None  # no loop: nothing to submit while the port stays taken
    assert [e.status for e in again.created_evals] == [structs.EVAL_STATUS_BLOCKED]


# ---------------------------------------------------------------------------------------
# Node states


def test_system__node_down__allocs_lost_not_replaced() -> None:
    h, nodes = cluster(2)
    job = h.add_job(mock.system_job())
    allocs = [h.add_alloc(running(job, n)) for n in nodes]
    h.add_node(replace(nodes[1], status=structs.NODE_STATUS_DOWN))
    result = run(h, job, triggered_by="node-update", node_id=nodes[1].id)
    expect(result, Expect(lost=1, ignore=1))
    assert stops(result) == {allocs[1].id: (structs.ALLOC_DESIRED_STOP, DESC_LOST, structs.ALLOC_CLIENT_LOST)}
    assert placed(result) == []
    h.commit(result)
    assert run(h, job).plan is None


def test_system__node_back_after_down__replacement_follows_lost_alloc() -> None:
    h, [node] = cluster(1)
    job = h.add_job(mock.system_job())
    alloc = h.add_alloc(running(job, node))
    h.add_node(replace(node, status=structs.NODE_STATUS_DOWN))
    h.commit(run(h, job))
    h.add_node(replace(node, status=structs.NODE_STATUS_READY))
    result = run(h, job)
    expect(result, Expect(place=1))
    assert [a.previous_allocation for a in placed(result)] == [alloc.id]


def test_system__drain__system_allocs_leave_last() -> None:
    h, [node] = cluster(1)
    job = h.add_job(mock.system_job())
    ours = h.add_alloc(running(job, node))
    service = h.add_job(mock.job(id="svc"))
    theirs = h.add_alloc(mock.alloc(service, node, client_status=structs.ALLOC_CLIENT_RUNNING))
    h.add_node(mock.drain_node(id=node.id))

    result = run(h, job, triggered_by="node-drain")
    expect(result, Expect(ignore=1))  # the drainer moves the service alloc first
    assert result.plan is None

    h.update_alloc(
        theirs.id, desired_status=structs.ALLOC_DESIRED_STOP, client_status=structs.ALLOC_CLIENT_COMPLETE
    )
    result = run(h, job, triggered_by="node-drain")
    expect(result, Expect(migrate=1))
    assert set(stops(result)) == {ours.id}
    assert placed(result) == []
    h.commit(result)
    assert run(h, job).plan is None


def test_system__ineligible_node__keeps_its_alloc_gets_no_new_one() -> None:
    h, nodes = cluster(2, scheduling_eligibility=structs.NODE_INELIGIBLE)
    job = h.add_job(mock.system_job())
    h.add_alloc(running(job, nodes[0]))
    result = run(h, job)
    expect(result, Expect(ignore=1))
    assert result.plan is None
    assert result.created_evals == ()


def test_system__disconnect_then_reconnect__same_alloc_never_restarted() -> None:
    h, [node] = cluster(1)
    job = h.add_job(mock.system_job())
    alloc = h.add_alloc(running(job, node))

    h.add_node(replace(node, status=structs.NODE_STATUS_DISCONNECTED))
    result = run(h, job, triggered_by="node-update")
    expect(result, Expect(disconnecting=1))
    assert stops(result) == {
        alloc.id: (structs.ALLOC_DESIRED_RUN, DESC_UNKNOWN, structs.ALLOC_CLIENT_UNKNOWN)
    }
    assert placed(result) == []
    h.commit(result)
    marked = h.snapshot().alloc(alloc.id)
    assert marked is not None
    assert (marked.desired_status, marked.client_status) == (
        structs.ALLOC_DESIRED_RUN,
        structs.ALLOC_CLIENT_UNKNOWN,
    )
    assert run(h, job).plan is None  # still away: wait

    h.add_node(replace(node, status=structs.NODE_STATUS_READY))
    result = run(h, job, triggered_by="reconnect")
    expect(result, Expect(reconnecting=1))
    assert result.plan is None  # kept: no stop, no new alloc
    h.update_alloc(alloc.id, client_status=structs.ALLOC_CLIENT_RUNNING)
    result = run(h, job)
    expect(result, Expect(ignore=1))
    assert result.plan is None
    assert [a.id for a in h.snapshot().allocs_by_job(job.namespace, job.id)] == [alloc.id]


# ---------------------------------------------------------------------------------------
# Sysbatch


def test_sysbatch__count_per_node_then_done() -> None:
    h, nodes = cluster(2)
    job = h.add_job(with_group(mock.sysbatch_job(), count=2))
    result = h.run(compute_sysbatch, mock.eval_for(job))
    expect(result, Expect(place=4))
    names = sorted((a.node_id, a.name) for a in placed(result))
    assert names == sorted((n.id, f"{job.id}.web[{i}]") for n in nodes for i in range(2))
    h.commit(result)

    for i, a in enumerate(h.snapshot().allocs_by_job(job.namespace, job.id)):
        h.update_alloc(
            a.id, client_status=structs.ALLOC_CLIENT_COMPLETE if i % 2 else structs.ALLOC_CLIENT_FAILED
        )
    result = h.run(compute_sysbatch, mock.eval_for(job))
    expect(result, Expect(ignore=4))
    assert result.plan is None


def test_sysbatch__destructive_change_reruns_finished_allocs() -> None:
    h, nodes = cluster(2)
    v0 = h.add_job(mock.sysbatch_job())
    done = {h.add_alloc(mock.alloc(v0, n, client_status=structs.ALLOC_CLIENT_COMPLETE)).id for n in nodes}
    v1 = h.add_job(bump(v0, destructive=False))
    result = h.run(compute_sysbatch, mock.eval_for(v1))
    expect(result, Expect(ignore=2))
    assert result.plan is None

    v2 = h.add_job(bump(v1, destructive=True))
    result = h.run(compute_sysbatch, mock.eval_for(v2))
    expect(result, Expect(update_destructive=2))
    assert stops(result) == {}  # finished allocs are not stopped again
    assert {a.previous_allocation for a in placed(result)} == done
    h.commit(result)
    assert h.run(compute_sysbatch, mock.eval_for(v2)).plan is None


# ---------------------------------------------------------------------------------------
# Properties: at most count live allocs per node (docs/design.md#invariant-1) and the fixed point,
# over random clusters

V_OLD, V_MID, V_CUR = 0, 1, 2  # V_OLD -> V_MID destructive, V_MID -> V_CUR in place

# Weighted by repetition: mostly healthy nodes and live allocs, so duplicates, mixed
# versions and rolling batches come up often; every other state still appears.
NODE_KINDS = ("ready",) * 5 + ("down", "draining", "ineligible", "disconnected", "other-dc")
CLIENT_STATUSES = (
    (structs.ALLOC_CLIENT_RUNNING,) * 4
    + (structs.ALLOC_CLIENT_PENDING,) * 2
    + (
        structs.ALLOC_CLIENT_COMPLETE,
        structs.ALLOC_CLIENT_FAILED,
        structs.ALLOC_CLIENT_LOST,
        structs.ALLOC_CLIENT_UNKNOWN,
    )
)


@dataclass(frozen=True)
class AllocSpec:
    version: int
    index: int
    client_status: str
    desired_run: bool


@dataclass(frozen=True)
class NodeSpec:
    kind: str
    allocs: tuple[AllocSpec, ...]
    other_work: bool  # a live service alloc (keeps a drain from reaching system allocs)
    squatter: bool  # a service alloc holding the system job's static port


@dataclass(frozen=True)
class ClusterSpec:
    job_type: str
    count: int
    max_parallel: int
    job_stopped: bool
    nodes: tuple[NodeSpec, ...]


@st.composite
def cluster_specs(draw: st.DrawFn) -> ClusterSpec:
    job_type = draw(st.sampled_from((structs.JOB_TYPE_SYSTEM, structs.JOB_TYPE_SYSBATCH)))
    count = 1 if job_type == structs.JOB_TYPE_SYSTEM else draw(st.integers(1, 2))
    alloc = st.builds(
        AllocSpec,
        version=st.sampled_from((V_OLD, V_MID, V_CUR, V_CUR)),
        # count itself is one past the last slot (a scaled-down group)
        index=st.sampled_from((*range(count), *range(count), count)),
        client_status=st.sampled_from(CLIENT_STATUSES),
        desired_run=st.sampled_from((True, True, True, False)),
    )
    node = st.builds(
        NodeSpec,
        kind=st.sampled_from(NODE_KINDS),
        allocs=st.lists(alloc, max_size=3).map(tuple),
        other_work=st.sampled_from((False, False, True)),
        squatter=st.sampled_from((False, False, False, True)),
    )
    return ClusterSpec(
        job_type=job_type,
        count=count,
        max_parallel=draw(st.sampled_from((0, 1, 1, 2))),
        job_stopped=draw(st.integers(0, 7)) == 0,
        nodes=tuple(draw(st.lists(node, min_size=1, max_size=5))),
    )


_NODE_BUILD: Mapping[str, Callable[[str], Node]] = {
    "ready": lambda i: mock.node(id=i),
    "down": lambda i: mock.node(id=i, status=structs.NODE_STATUS_DOWN),
    "draining": lambda i: mock.drain_node(id=i),
    "ineligible": lambda i: mock.node(id=i, scheduling_eligibility=structs.NODE_INELIGIBLE),
    "disconnected": lambda i: mock.node(id=i, status=structs.NODE_STATUS_DISCONNECTED),
    "other-dc": lambda i: mock.node(id=i, datacenter="east"),
}


def build_cluster(spec: ClusterSpec) -> tuple[Harness, Job]:
    h = Harness()
    base = (
        mock.system_job(id="sys") if spec.job_type == structs.JOB_TYPE_SYSTEM else mock.sysbatch_job(id="sys")
    )
    base = with_group(base, count=spec.count)
    base = replace(base, update=UpdateStrategy(max_parallel=spec.max_parallel, stagger_ns=10 * SECOND))
    v_old = h.add_job(base)
    v_mid = h.add_job(bump(v_old, destructive=True))
    current = bump(v_mid, destructive=False)
    job = h.add_job(replace(current, stop=spec.job_stopped))
    versions = {V_OLD: v_old, V_MID: v_mid, V_CUR: job}
    service = h.add_job(mock.job(id="svc"))
    create_index = itertools.count(1)
    for n, node_spec in enumerate(spec.nodes):
        node = h.add_node(_NODE_BUILD[node_spec.kind](f"n{n}"))
        for k, a in enumerate(node_spec.allocs):
            h.add_alloc(
                mock.alloc(
                    versions[a.version],
                    node,
                    a.index,
                    id=f"a{n}-{k}",
                    client_status=a.client_status,
                    desired_status=structs.ALLOC_DESIRED_RUN if a.desired_run else structs.ALLOC_DESIRED_STOP,
                    create_index=next(create_index),
                )
            )
        if node_spec.other_work:
            h.add_alloc(mock.alloc(service, node, id=f"svc{n}", client_status=structs.ALLOC_CLIENT_RUNNING))
        if node_spec.squatter and not node_spec.allocs:
            res = AllocatedResources(
                cpu_mhz=100, memory_mb=64, ports=(AllocatedPort(label="http", value=8080),)
            )
            h.add_alloc(
                mock.alloc(
                    service, node, id=f"sq{n}", resources=res, client_status=structs.ALLOC_CLIENT_RUNNING
                )
            )
    return h, job


def assert_invariant(h: Harness, job: Job, count: int) -> None:
    for slot, live in live_by_slot(h, job).items():
        assert live <= count, (slot, live)


PROPERTY_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(cluster_specs())
def test_property__after_commit_at_most_count_per_node_and_a_fixed_point(spec: ClusterSpec) -> None:
    h, job = build_cluster(spec)
    first = h.run(compute_system, mock.eval_for(job))
    for bucket, n in first.annotations.get("web", {}).items():
        if n:
            event(bucket)
    if any(desc == DESC_DUPLICATE for _, desc, _ in stops(first).values()):
        event("duplicate stopped")
    if first.created_evals:
        event(f"created {sorted(e.triggered_by for e in first.created_evals)}")
    assert_plan_fits(h, first.plan)
    h.commit(first)
    assert_invariant(h, job, spec.count)
    if job.stop:
        assert placed(first) == []

    second = h.run(compute_system, mock.eval_for(job))
    if not any(e.triggered_by == structs.TRIGGER_ROLLING_UPDATE for e in first.created_evals):
        assert second.plan is None, (first.annotations, second.annotations)


def _report_health(h: Harness, job: Job) -> None:
    """Every live alloc of ``job``'s deployment with no verdict yet turns healthy, as its
    client reports: a system rollout's next batch waits for that, not for a timer."""
    for a in h.snapshot().allocs_by_job(job.namespace, job.id):
        if a.deployment_id and not a.terminal() and a.deployment_status is None:
            h.set_health(a.id, structs.HEALTH_HEALTHY)


@PROPERTY_SETTINGS
@given(cluster_specs())
def test_property__rolling_updates_converge(spec: ClusterSpec) -> None:
    h, job = build_cluster(spec)
    for _ in range(len(spec.nodes) + 2):
        result = h.run(compute_system, mock.eval_for(job))
        assert_plan_fits(h, result.plan)
        h.commit(result)
        assert_invariant(h, job, spec.count)
        _report_health(h, job)
        if result.plan is None:
            break
    else:
        pytest.fail("no fixed point within one pass per node")
    assert not any(e.triggered_by == structs.TRIGGER_ROLLING_UPDATE for e in result.created_evals)
