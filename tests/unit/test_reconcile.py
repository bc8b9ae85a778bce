"""drover.scheduler.reconciler.generic: one group's allocs into named buckets, with no state store and no clock.

Most tests are one row of ``CASES``: a situation (built from mock objects, changing only the
field it is about) and the bucket counts it must produce (``Expect``, Nomad's
``resultExpectation``). Tests that need to look inside a bucket (which indexes, which times)
follow the table, then the delay functions, then Hypothesis properties over random groups:
never more than count live allocs, a stopped job places nothing, and the fixed point (applying
a result and reconciling again changes nothing unless a rolling update was held back).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drover.scheduler import structs
from drover.scheduler.reconciler.generic import GroupResult, reconcile_group
from drover.scheduler.reconciler.reschedule import next_delay, next_reschedule
from drover.scheduler.reconciler.vocabulary import DESC_LOST, DESC_RECONNECT_LOSER, DESC_RESCHEDULED
from drover.scheduler.structs import (
    HEALTH_HEALTHY,
    HEALTH_UNHEALTHY,
    Allocation,
    AllocDeploymentStatus,
    AllocStateChange,
    Deployment,
    DeploymentState,
    DisconnectStrategy,
    DrainStrategy,
    Job,
    Node,
    RescheduleEvent,
    ReschedulePolicy,
    TaskState,
    UpdateStrategy,
    alloc_name,
)
from tests.fixtures import mock
from tests.fixtures.buckets import Expect
from tests.fixtures.mock import HOUR, MINUTE, NOW, SECOND

# ---------------------------------------------------------------------------------------
# Helpers


@dataclass
class Scenario:
    job: Job
    allocs: list[Allocation]
    tainted: dict[str, Node | None] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)

    def run(self, now_ns: int = NOW) -> GroupResult:
        return reconcile_group(self.job, self.job.groups[0], self.allocs, self.tainted, now_ns, **self.kwargs)


def with_group(job: Job, **changes: Any) -> Job:
    """``job`` with its one group changed."""
    return replace(job, groups=(replace(job.groups[0], **changes),))


def running(job: Job, node: Node, indexes: Sequence[int], **overrides: Any) -> list[Allocation]:
    overrides.setdefault("client_status", structs.ALLOC_CLIENT_RUNNING)
    return [mock.alloc(job, node, i, **overrides) for i in indexes]


def by_id(scores: Mapping[str, float]) -> Callable[[Allocation], float | None]:
    """A reconnect score function from scores by alloc ID."""
    return lambda alloc: scores.get(alloc.id)


def down(node: Node) -> Node:
    return replace(node, status=structs.NODE_STATUS_DOWN)


def disconnected(node: Node) -> Node:
    return replace(node, status=structs.NODE_STATUS_DISCONNECTED)


def draining(node: Node) -> Node:
    return replace(node, drain_strategy=DrainStrategy(deadline_ns=HOUR, started_at_ns=NOW))


def bumped(job: Job, **group_changes: Any) -> tuple[Job, dict[int, Job]]:
    """The next version of ``job`` (group changed as given) and the versions map."""
    new = with_group(replace(job, version=job.version + 1), **group_changes)
    return new, {job.version: job}


def destructive_change(job: Job, **update: Any) -> tuple[Job, dict[int, Job]]:
    task = replace(job.groups[0].tasks[0], config_json='{"run_for": "20s"}')
    return bumped(job, tasks=(task,), **update)


def failed(alloc: Allocation, at_ns: int, **overrides: Any) -> Allocation:
    state = TaskState(state="dead", failed=True, started_at_ns=at_ns - MINUTE, finished_at_ns=at_ns)
    return replace(
        alloc,
        client_status=structs.ALLOC_CLIENT_FAILED,
        task_states={"web": state},
        modify_time_ns=at_ns,
        **overrides,
    )


# ---------------------------------------------------------------------------------------
# The table


def s_initial() -> Scenario:
    return Scenario(mock.job(), [])


def s_no_change() -> Scenario:
    job, node = mock.job(), mock.node()
    return Scenario(job, running(job, node, range(10)))


def s_scale_up() -> Scenario:
    job, node = mock.job(), mock.node()
    return Scenario(job, running(job, node, range(5)))


def s_scale_down() -> Scenario:
    job, node = mock.job(), mock.node()
    return Scenario(with_group(job, count=3), running(job, node, range(10)))


def s_inplace() -> Scenario:
    job, node = mock.job(), mock.node()
    allocs = running(job, node, range(10))
    new, versions = bumped(job, meta={"elb_check_type": "tcp"})
    return Scenario(new, allocs, kwargs={"job_versions": versions})


def s_destructive_unlimited() -> Scenario:
    job, node = mock.job(), mock.node()
    allocs = running(job, node, range(10))
    new, versions = destructive_change(job, update=UpdateStrategy(max_parallel=0))
    return Scenario(new, allocs, kwargs={"job_versions": versions})


def s_rolling() -> Scenario:
    job, node = mock.job(), mock.node()
    allocs = running(job, node, range(10))
    new, versions = destructive_change(job, update=UpdateStrategy(max_parallel=2, stagger_ns=30 * SECOND))
    return Scenario(new, allocs, kwargs={"job_versions": versions})


def s_rolling_paused() -> Scenario:
    scenario = s_rolling()
    scenario.kwargs["deployment_paused"] = True
    return scenario


def s_version_missing() -> Scenario:
    job, node = mock.job(), mock.node()
    allocs = running(job, node, range(10))
    new, _ = bumped(job, meta={"x": "y"}, update=None)
    return Scenario(new, allocs)  # no job_versions: cannot prove in-place is safe


def s_infeasible_node() -> Scenario:
    job, node = mock.job(), mock.node()
    allocs = running(job, node, range(10))
    new, versions = bumped(job, meta={"x": "y"}, update=None)
    return Scenario(
        new, allocs, kwargs={"job_versions": versions, "infeasible_node_ids": frozenset({node.id})}
    )


def s_service_failed_now() -> Scenario:
    job, node = mock.job(), mock.node()
    allocs = running(job, node, range(10))
    allocs[3] = failed(allocs[3], NOW - MINUTE)
    return Scenario(job, allocs)


def s_service_failed_later() -> Scenario:
    job, node = mock.job(), mock.node()
    allocs = running(job, node, range(10))
    allocs[3] = failed(allocs[3], NOW - SECOND)
    return Scenario(job, allocs)


def s_service_failed_followup_scheduled() -> Scenario:
    scenario = s_service_failed_later()
    scenario.allocs[3] = replace(scenario.allocs[3], followup_eval_id="eval-later")
    return scenario


def s_service_failed_followup_fires() -> Scenario:
    # The follow-up eval runs a moment before the computed time: still now, by eval ID.
    scenario = s_service_failed_followup_scheduled()
    scenario.kwargs["eval_id"] = "eval-later"
    return scenario


def s_service_failed_no_policy() -> Scenario:
    job, node = mock.job(), mock.node()
    job = with_group(job, reschedule=None)
    allocs = running(job, node, range(10))
    allocs[3] = failed(allocs[3], NOW - HOUR)
    return Scenario(job, allocs)


def s_service_failed_already_replaced() -> Scenario:
    job, node = mock.job(), mock.node()
    allocs = running(job, node, range(10))
    allocs[3] = failed(allocs[3], NOW - HOUR)
    allocs.append(
        mock.alloc(job, node, 3, previous_allocation=allocs[3].id, client_status=structs.ALLOC_CLIENT_RUNNING)
    )
    return Scenario(job, allocs)


def s_service_completed() -> Scenario:
    job, node = mock.job(), mock.node()
    allocs = running(job, node, range(10))
    allocs[4] = replace(allocs[4], client_status=structs.ALLOC_CLIENT_COMPLETE)
    return Scenario(job, allocs)


def s_batch_completed() -> Scenario:
    job, node = mock.batch_job(), mock.node()
    return Scenario(job, running(job, node, range(10), client_status=structs.ALLOC_CLIENT_COMPLETE))


def s_batch_half_completed() -> Scenario:
    job, node = mock.batch_job(), mock.node()
    allocs = running(job, node, range(5), client_status=structs.ALLOC_CLIENT_COMPLETE) + running(
        job, node, range(5, 10)
    )
    return Scenario(job, allocs)


def s_batch_completed_then_job_updated() -> Scenario:
    job, node = mock.batch_job(), mock.node()
    allocs = running(job, node, range(10), client_status=structs.ALLOC_CLIENT_COMPLETE)
    new, versions = destructive_change(job)
    return Scenario(new, allocs, kwargs={"job_versions": versions})


def s_batch_failed_first_time() -> Scenario:
    job, node = mock.batch_job(), mock.node()
    allocs = running(job, node, range(10))
    allocs[0] = failed(allocs[0], NOW - 10 * SECOND)
    return Scenario(job, allocs)


def s_batch_failed_attempts_exhausted() -> Scenario:
    job, node = mock.batch_job(), mock.node()
    allocs = running(job, node, range(10))
    event = RescheduleEvent(reschedule_time_ns=NOW - HOUR, prev_alloc_id="alloc-x", delay_ns=5 * SECOND)
    allocs[0] = failed(allocs[0], NOW - 10 * SECOND, reschedule_events=(event,))
    return Scenario(job, allocs)


def s_batch_failed_attempt_outside_interval() -> Scenario:
    job, node = mock.batch_job(), mock.node()
    allocs = running(job, node, range(10))
    event = RescheduleEvent(reschedule_time_ns=NOW - 25 * HOUR, prev_alloc_id="alloc-x", delay_ns=5 * SECOND)
    allocs[0] = failed(allocs[0], NOW - 10 * SECOND, reschedule_events=(event,))
    return Scenario(job, allocs)


def s_lost_node() -> Scenario:
    job, good, bad = mock.job(), mock.node(), mock.node()
    allocs = running(job, good, range(7)) + running(job, bad, range(7, 10))
    return Scenario(job, allocs, {bad.id: down(bad)})


def s_lost_node_deregistered() -> Scenario:
    job, good, gone = mock.job(), mock.node(), mock.node()
    allocs = running(job, good, range(8)) + running(job, gone, range(8, 10))
    return Scenario(job, allocs, {gone.id: None})


def s_lost_node_scale_down() -> Scenario:
    job, good, bad = mock.job(), mock.node(), mock.node()
    allocs = running(job, good, range(7)) + running(job, bad, range(7, 10))
    return Scenario(with_group(job, count=5), allocs, {bad.id: down(bad)})


def s_lost_node_stopping_alloc() -> Scenario:
    # Told to stop, the node died before the client confirmed: mark it lost, replace nothing.
    job, good, bad = mock.job(), mock.node(), mock.node()
    allocs = running(job, good, range(10))
    allocs.append(
        mock.alloc(
            job,
            bad,
            10,
            desired_status=structs.ALLOC_DESIRED_STOP,
            client_status=structs.ALLOC_CLIENT_RUNNING,
        )
    )
    return Scenario(job, allocs, {bad.id: down(bad)})


def s_draining_node() -> Scenario:
    job, good, drained = mock.job(), mock.node(), mock.node()
    allocs = running(job, good, range(8)) + running(job, drained, range(8, 10))
    return Scenario(job, allocs, {drained.id: draining(drained)})


def s_alloc_stop_requested() -> Scenario:
    job, node = mock.job(), mock.node()
    allocs = running(job, node, range(10))
    allocs[3] = replace(allocs[3], desired_transition=structs.DesiredTransition(migrate=True))
    return Scenario(job, allocs)


def s_alloc_stop_requested_already_stopped() -> Scenario:
    job, node = mock.job(), mock.node()
    allocs = running(job, node, range(10))
    allocs[3] = replace(
        allocs[3],
        desired_transition=structs.DesiredTransition(migrate=True),
        desired_status=structs.ALLOC_DESIRED_STOP,
    )
    return Scenario(job, allocs)


def s_disconnected_node() -> Scenario:
    job, good, away = mock.job(), mock.node(), mock.node()
    allocs = running(job, good, range(8)) + running(job, away, range(8, 10))
    return Scenario(job, allocs, {away.id: disconnected(away)})


def s_disconnected_node_no_replace() -> Scenario:
    scenario = s_disconnected_node()
    scenario.job = with_group(scenario.job, disconnect=DisconnectStrategy(replace=False))
    return scenario


def s_disconnected_node_pending() -> Scenario:
    job, good, away = mock.job(), mock.node(), mock.node()
    allocs = [*running(job, good, range(9)), mock.alloc(job, away, 9)]
    return Scenario(job, allocs, {away.id: disconnected(away)})


def s_disconnected_unknown_replaced() -> Scenario:
    job, good, away = mock.job(), mock.node(), mock.node()
    allocs = running(job, good, range(9))
    original = mock.alloc(job, away, 9, client_status=structs.ALLOC_CLIENT_UNKNOWN)
    allocs += [
        original,
        mock.alloc(job, good, 9, client_status=structs.ALLOC_CLIENT_RUNNING, previous_allocation=original.id),
    ]
    return Scenario(job, allocs, {away.id: disconnected(away)})


def s_disconnected_unknown_replacement_never_placed() -> Scenario:
    # Nomad #16644: the replacement was blocked; drover retries it on the next eval.
    job, good, away = mock.job(), mock.node(), mock.node()
    allocs = [
        *running(job, good, range(9)),
        mock.alloc(job, away, 9, client_status=structs.ALLOC_CLIENT_UNKNOWN),
    ]
    return Scenario(job, allocs, {away.id: disconnected(away)})


def s_disconnected_unknown_expired() -> Scenario:
    job, good, away = mock.job(), mock.node(), mock.node()
    job = with_group(job, disconnect=DisconnectStrategy(lost_after_ns=5 * MINUTE))
    history = (
        AllocStateChange(field="client_status", value=structs.ALLOC_CLIENT_UNKNOWN, time_ns=NOW - HOUR),
    )
    unknown = mock.alloc(job, away, 9, client_status=structs.ALLOC_CLIENT_UNKNOWN, state_history=history)
    return Scenario(job, [*running(job, good, range(9)), unknown], {away.id: disconnected(away)})


def s_reconnect_no_replacement() -> Scenario:
    job, node = mock.job(), mock.node()
    allocs = [
        *running(job, node, range(9)),
        mock.alloc(job, node, 9, client_status=structs.ALLOC_CLIENT_UNKNOWN),
    ]
    return Scenario(job, allocs)


def s_reconnect_tie_keeps_original() -> Scenario:
    job, back, other = mock.job(), mock.node(), mock.node()
    original = mock.alloc(job, back, 9, client_status=structs.ALLOC_CLIENT_UNKNOWN)
    replacement = mock.alloc(
        job, other, 9, client_status=structs.ALLOC_CLIENT_RUNNING, previous_allocation=original.id
    )
    return Scenario(job, [*running(job, other, range(9)), original, replacement])


def s_failed_replacement_original_back() -> Scenario:
    # The original came back from a disconnect and runs; its replacement failed meanwhile.
    job, back, other = mock.job(), mock.node(), mock.node()
    original = mock.alloc(job, back, 9, client_status=structs.ALLOC_CLIENT_RUNNING)
    replacement = failed(mock.alloc(job, other, 9, previous_allocation=original.id), NOW)
    return Scenario(job, [*running(job, other, range(9)), original, replacement])


def s_reconnect_better_replacement() -> Scenario:
    scenario = s_reconnect_tie_keeps_original()
    original, replacement = scenario.allocs[-2], scenario.allocs[-1]
    scenario.kwargs["score"] = by_id({original.id: 0.4, replacement.id: 0.9})
    return scenario


def s_reconnect_newer_replacement() -> Scenario:
    job, back, other = mock.job(), mock.node(), mock.node()
    new, versions = bumped(job, meta={"x": "y"})
    original = mock.alloc(job, back, 9, client_status=structs.ALLOC_CLIENT_UNKNOWN)
    replacement = mock.alloc(
        new, other, 9, client_status=structs.ALLOC_CLIENT_RUNNING, previous_allocation=original.id
    )
    return Scenario(
        new, [*running(new, other, range(9)), original, replacement], kwargs={"job_versions": versions}
    )


def s_reconnect_client_already_running() -> Scenario:
    # The client reported "running" before the scheduler saw the reconnect: the lineage tells.
    scenario = s_reconnect_tie_keeps_original()
    scenario.allocs[-2] = replace(scenario.allocs[-2], client_status=structs.ALLOC_CLIENT_RUNNING)
    return scenario


def s_job_stopped() -> Scenario:
    job, good, bad = mock.job(), mock.node(), mock.node()
    allocs = running(job, good, range(8)) + running(job, bad, range(8, 10))
    return Scenario(replace(job, stop=True), allocs, {bad.id: down(bad)})


def s_group_removed() -> Scenario:
    job, node = mock.job(), mock.node()
    return Scenario(with_group(job, count=0), running(job, node, range(10)))


def s_periodic_parent() -> Scenario:
    return Scenario(mock.periodic_job(), [])


def s_history_only() -> Scenario:
    job, node = mock.job(), mock.node()
    allocs = running(
        job,
        node,
        range(10),
        desired_status=structs.ALLOC_DESIRED_STOP,
        client_status=structs.ALLOC_CLIENT_COMPLETE,
    )
    return Scenario(job, allocs)


CASES: list[tuple[str, Callable[[], Scenario], Expect]] = [
    ("initial_placement", s_initial, Expect(place=10)),
    ("no_change__ignores_all", s_no_change, Expect(ignore=10)),
    ("count_increase__places_missing", s_scale_up, Expect(place=5, ignore=5)),
    ("count_decrease__stops_extras", s_scale_down, Expect(stop=7, ignore=3)),
    ("meta_change__inplace", s_inplace, Expect(update_inplace=10)),
    (
        "task_change__destructive_unlimited",
        s_destructive_unlimited,
        Expect(update_destructive=10, stop=10, place=10),
    ),
    (
        "task_change__rolling_max_parallel_2",
        s_rolling,
        Expect(update_destructive=2, stop=2, place=2, ignore=8),
    ),
    ("task_change__deployment_paused", s_rolling_paused, Expect(ignore=10)),
    ("old_version_missing__destructive", s_version_missing, Expect(update_destructive=10, stop=10, place=10)),
    (
        "node_no_longer_feasible__destructive",
        s_infeasible_node,
        Expect(update_destructive=10, stop=10, place=10),
    ),
    (
        "service_failed__delay_elapsed__reschedule_now",
        s_service_failed_now,
        Expect(place=1, reschedule_now=1, ignore=9),
    ),
    (
        "service_failed__delay_pending__reschedule_later",
        s_service_failed_later,
        Expect(reschedule_later=1, ignore=9),
    ),
    ("service_failed__followup_exists__waits", s_service_failed_followup_scheduled, Expect(ignore=10)),
    (
        "service_failed__its_followup_fires__now",
        s_service_failed_followup_fires,
        Expect(place=1, reschedule_now=1, ignore=9),
    ),
    ("service_failed__no_policy__holds_slot", s_service_failed_no_policy, Expect(ignore=10)),
    ("service_failed__already_replaced", s_service_failed_already_replaced, Expect(ignore=10)),
    ("service_completed__slot_refilled", s_service_completed, Expect(place=1, ignore=9)),
    ("batch_completed__not_rerun", s_batch_completed, Expect(ignore=10)),
    ("batch_half_completed__nothing_to_do", s_batch_half_completed, Expect(ignore=10)),
    ("batch_completed__job_updated__not_rerun", s_batch_completed_then_job_updated, Expect(ignore=10)),
    (
        "batch_failed__first_failure__rescheduled",
        s_batch_failed_first_time,
        Expect(place=1, reschedule_now=1, ignore=9),
    ),
    ("batch_failed__attempts_exhausted__holds_slot", s_batch_failed_attempts_exhausted, Expect(ignore=10)),
    (
        "batch_failed__old_attempt_outside_interval",
        s_batch_failed_attempt_outside_interval,
        Expect(place=1, reschedule_now=1, ignore=9),
    ),
    ("lost_node__stopped_lost_and_replaced", s_lost_node, Expect(lost=3, stop=3, place=3, ignore=7)),
    ("deregistered_node__lost", s_lost_node_deregistered, Expect(lost=2, stop=2, place=2, ignore=8)),
    ("lost_node__scale_down", s_lost_node_scale_down, Expect(lost=3, stop=5, ignore=5)),
    ("lost_node__stopping_alloc_marked_lost", s_lost_node_stopping_alloc, Expect(lost=1, stop=1, ignore=10)),
    ("draining_node__migrate", s_draining_node, Expect(migrate=2, stop=2, place=2, ignore=8)),
    ("alloc_stop__migrated", s_alloc_stop_requested, Expect(migrate=1, stop=1, place=1, ignore=9)),
    (
        "alloc_stop__already_stopped__placed_once",
        s_alloc_stop_requested_already_stopped,
        Expect(place=1, ignore=9),
    ),
    (
        "disconnected_node__unknown_and_replaced",
        s_disconnected_node,
        Expect(disconnecting=2, place=2, ignore=8),
    ),
    (
        "disconnected_node__replace_false__kept",
        s_disconnected_node_no_replace,
        Expect(disconnecting=2, ignore=8),
    ),
    (
        "disconnected_node__pending__lost",
        s_disconnected_node_pending,
        Expect(lost=1, stop=1, place=1, ignore=9),
    ),
    ("disconnected_node__unknown_already_replaced", s_disconnected_unknown_replaced, Expect(ignore=11)),
    (
        "disconnected_node__unknown_replacement_retried",
        s_disconnected_unknown_replacement_never_placed,
        Expect(place=1, ignore=9),
    ),
    (
        "disconnected_node__lost_after_expired",
        s_disconnected_unknown_expired,
        Expect(lost=1, stop=1, place=1, ignore=9),
    ),
    ("reconnect__no_replacement__kept", s_reconnect_no_replacement, Expect(reconnecting=1, ignore=9)),
    (
        "reconnect__scores_tie__original_kept",
        s_reconnect_tie_keeps_original,
        Expect(reconnecting=1, stop=1, ignore=9),
    ),
    (
        "reconnect__failed_replacement__stopped_not_rescheduled",
        s_failed_replacement_original_back,
        Expect(stop=1, ignore=10),
    ),
    (
        "reconnect__better_replacement__original_stopped",
        s_reconnect_better_replacement,
        Expect(stop=1, ignore=10),
    ),
    (
        "reconnect__newer_replacement__original_stopped",
        s_reconnect_newer_replacement,
        Expect(stop=1, ignore=10),
    ),
    (
        "reconnect__client_already_running__one_kept",
        s_reconnect_client_already_running,
        Expect(reconnecting=1, stop=1, ignore=9),
    ),
    ("job_stopped__stops_all", s_job_stopped, Expect(stop=10, lost=2)),
    ("group_removed__stops_all", s_group_removed, Expect(stop=10)),
    ("periodic_parent__places_nothing", s_periodic_parent, Expect()),
    ("history_only__refilled", s_history_only, Expect(place=10)),
]


@pytest.mark.parametrize(("setup", "expect"), [(s, e) for _, s, e in CASES], ids=[c[0] for c in CASES])
def test_reconcile__situations(setup: Callable[[], Scenario], expect: Expect) -> None:
    expect.check(setup().run())


# ---------------------------------------------------------------------------------------
# Inside the buckets


def test_reconcile__initial_placement__names_every_index() -> None:
    scenario = s_initial()
    job, result = scenario.job, scenario.run()
    assert [p.index for p in result.place] == list(range(10))
    assert result.place[3].name == alloc_name(job.id, "web", 3)
    assert all(p.previous is None and p.reason == "new" for p in result.place)


def test_reconcile__count_decrease__stops_highest_indexes() -> None:
    result = s_scale_down().run()
    assert sorted(s.alloc.index for s in result.stop) == [3, 4, 5, 6, 7, 8, 9]
    assert {s.description for s in result.stop} == {"alloc not needed due to job update"}


def test_reconcile__count_increase__reuses_free_indexes_lowest_first() -> None:
    job, node = mock.job(), mock.node()
    allocs = running(job, node, (0, 2, 4))
    job = with_group(job, count=5)
    result = reconcile_group(job, job.groups[0], allocs, {}, NOW)
    assert [p.index for p in result.place] == [1, 3]


def test_reconcile__destructive__replacement_takes_the_slot() -> None:
    scenario = s_destructive_unlimited()
    result = scenario.run()
    by_prev = {p.previous.id: p for p in result.place if p.previous is not None}
    for old in result.update_destructive:
        assert by_prev[old.id].index == old.index and by_prev[old.id].reason == "destructive"


def test_reconcile__rolling__exactly_max_parallel_and_no_timer() -> None:
    """The next batch waits for health, not for a stagger timer: no follow-up time."""
    scenario = s_rolling()
    result = scenario.run()
    assert len(result.update_destructive) == 2
    # The rest are held back with no time to look again (the reconciler has no timer; the
    # scheduler writes no rolling eval: test_generic__rolling_update__max_parallel_2_over_count_10).
    assert result.held_back
    assert result.work_left
    # Failed and pending allocs are updated first (they serve nothing), then by index.
    assert [a.index for a in result.update_destructive] == [0, 1]


def _in_deployment(
    allocs: Sequence[Allocation], deployment: Deployment, health: str = ""
) -> list[Allocation]:
    """The new-version allocs as committed into ``deployment``, with ``health`` reported."""
    return [
        replace(
            a,
            deployment_id=deployment.id,
            deployment_status=AllocDeploymentStatus(health=health) if health else None,
        )
        if a.id.startswith("new-")
        else a
        for a in allocs
    ]


def test_reconcile__rolling__replacements_wait_for_health() -> None:
    """Any eval while the batch is placed but not judged (a node update, a failure) must
    not speed the rollout up; health opens room; an unhealthy alloc stops it."""
    scenario = s_rolling()
    first = scenario.run()
    committed = apply_result(scenario.job, scenario.allocs, first, NOW, healthy_node="node-new")
    deployment = Deployment(id="d-1", job_id=scenario.job.id, job_version=scenario.job.version)
    group = scenario.job.groups[0]
    later = NOW + 10 * MINUTE
    waiting = reconcile_group(
        scenario.job,
        group,
        _in_deployment(committed, deployment),
        {},
        later,
        deployment=deployment,
        **scenario.kwargs,
    )
    Expect(ignore=10).check(waiting)
    assert waiting.held_back and waiting.work_left
    healthy = reconcile_group(
        scenario.job,
        group,
        _in_deployment(committed, deployment, HEALTH_HEALTHY),
        {},
        NOW,
        deployment=deployment,
        **scenario.kwargs,
    )
    Expect(update_destructive=2, stop=2, place=2, ignore=8).check(healthy)
    unhealthy = reconcile_group(
        scenario.job,
        group,
        _in_deployment(committed, deployment, HEALTH_UNHEALTHY),
        {},
        NOW,
        deployment=deployment,
        **scenario.kwargs,
    )
    Expect(ignore=10).check(unhealthy)


def test_reconcile__rolling__batch_jobs_ignore_max_parallel() -> None:
    job, node = mock.batch_job(), mock.node()
    allocs = running(job, node, range(10))
    new, versions = destructive_change(job, update=UpdateStrategy(max_parallel=2))
    result = reconcile_group(new, new.groups[0], allocs, {}, NOW, job_versions=versions)
    Expect(update_destructive=10, stop=10, place=10).check(result)
    assert not result.held_back


def test_reconcile__service_failed__replacement_carries_history() -> None:
    scenario = s_service_failed_now()
    failed_alloc = scenario.allocs[3]
    (placement,) = scenario.run().place
    assert placement.previous == failed_alloc
    assert placement.index == 3 and placement.reason == "reschedule"
    assert placement.penalty_node_ids == frozenset({failed_alloc.node_id})
    (event,) = placement.reschedule_events
    assert event == RescheduleEvent(
        reschedule_time_ns=NOW,
        prev_alloc_id=failed_alloc.id,
        prev_node_id=failed_alloc.node_id,
        delay_ns=30 * SECOND,
    )
    # Stopped only once the replacement is placed (see Placement.stop_previous).
    assert placement.stop_previous is not None
    assert placement.stop_previous.alloc == failed_alloc
    assert placement.stop_previous.description == DESC_RESCHEDULED


def test_reconcile__service_failed__tasks_changed_resets_the_tracker() -> None:
    """Earlier failures of other tasks say nothing about the new ones: the replacement of a
    failed alloc from a version whose tasks changed starts its count over."""
    job, node = mock.job(), mock.node()
    new, versions = destructive_change(job)
    earlier = RescheduleEvent(reschedule_time_ns=NOW - 10 * MINUTE, prev_alloc_id="a-0", delay_ns=30 * SECOND)
    old_failed = failed(mock.alloc(job, node, index=3), NOW - MINUTE, reschedule_events=(earlier,))
    same = [*running(job, node, (0, 1, 2)), old_failed]
    updated = [*running(new, node, (0, 1, 2)), old_failed]
    same_tasks = reconcile_group(job, replace(job.groups[0], count=4), same, {}, NOW)
    changed = reconcile_group(new, replace(new.groups[0], count=4), updated, {}, NOW, job_versions=versions)
    (kept,) = same_tasks.place
    (reset,) = changed.place
    assert [e.prev_alloc_id for e in kept.reschedule_events] == ["a-0", old_failed.id]
    assert [e.prev_alloc_id for e in reset.reschedule_events] == [old_failed.id]


def test_reconcile__service_failed__later_at_fail_time_plus_delay() -> None:
    (delayed,) = s_service_failed_later().run().reschedule_later
    assert delayed.at_ns == NOW - SECOND + 30 * SECOND


def test_reconcile__lost_node__stops_carry_client_status_lost() -> None:
    result = s_lost_node().run()
    assert {(s.client_status, s.description) for s in result.stop} == {(structs.ALLOC_CLIENT_LOST, DESC_LOST)}
    assert sorted(p.index for p in result.place) == [7, 8, 9]
    assert {p.previous.id for p in result.place if p.previous} == {a.id for a in result.lost}


def test_reconcile__lost_node__scale_down_drops_lost_first() -> None:
    result = s_lost_node_scale_down().run()
    stopped = {s.alloc.index: s for s in result.stop}
    assert sorted(stopped) == [5, 6, 7, 8, 9]
    assert all(stopped[i].client_status == structs.ALLOC_CLIENT_LOST for i in (7, 8, 9))


def test_reconcile__scale_down__finished_old_alloc_beside_a_removed_new_one__fixed_point() -> None:
    """A batch job scaled down to 1 beside an update: slot 1 holds a finished old-version
    alloc and a live new-version one, which the scale-down stops. The finished one keeps its place in
    the order (a slot's newer holder puts an older one first only when removing the older
    one stops it): ranking it first for a holder that goes in the same pass made the next
    pass, without that holder, stop the alloc this one kept (found by the scheduler's
    fixed-point property)."""
    v0, node = mock.batch_job(), mock.node()
    v1, versions = bumped(v0, count=1, meta={"v": "2"})
    slot0 = mock.alloc(v0, node, 0, client_status=structs.ALLOC_CLIENT_RUNNING)
    slot1_new = mock.alloc(v1, node, 1, client_status=structs.ALLOC_CLIENT_RUNNING)
    slot1_done = mock.alloc(v0, node, 1, client_status=structs.ALLOC_CLIENT_COMPLETE)
    allocs = [slot0, slot1_new, slot1_done]
    group = v1.groups[0]
    first = reconcile_group(v1, group, allocs, {}, NOW, eval_id="e1", job_versions=versions)
    assert {s.alloc.id for s in first.stop} <= {slot0.id, slot1_new.id}
    after = apply_result(v1, allocs, first, NOW)
    second = reconcile_group(v1, group, after, {}, NOW, eval_id="e2", job_versions=versions)
    assert second.is_no_op(), second.counts()


def test_reconcile__reconnect__tie_stops_the_replacement() -> None:
    scenario = s_reconnect_tie_keeps_original()
    result = scenario.run()
    (stop,) = result.stop
    assert stop.alloc == scenario.allocs[-1] and stop.description == DESC_RECONNECT_LOSER
    assert result.reconnecting == (scenario.allocs[-2],)


@pytest.mark.parametrize(
    ("strategy", "scores", "original_kept"),
    [
        ("best_score", (0.5, 0.5), True),
        ("best_score", (0.5, 0.9), True),  # a pending replacement never beats a running original
        ("keep_original", (0.1, 0.9), True),
        ("keep_replacement", (0.9, 0.1), False),
    ],
    ids=["best_score_tie", "best_score_pending_replacement", "keep_original", "keep_replacement"],
)
def test_reconcile__reconnect__strategies(
    strategy: str, scores: tuple[float, float], original_kept: bool
) -> None:
    job, back, other = mock.job(), mock.node(), mock.node()
    job = with_group(job, count=1, disconnect=DisconnectStrategy(reconcile=strategy))
    original = mock.alloc(job, back, 0, client_status=structs.ALLOC_CLIENT_RUNNING)
    replacement = mock.alloc(
        job, other, 0, client_status=structs.ALLOC_CLIENT_PENDING, previous_allocation=original.id
    )
    result = reconcile_group(
        job,
        job.groups[0],
        [original, replacement],
        {},
        NOW,
        score=by_id({original.id: scores[0], replacement.id: scores[1]}),
    )
    (stop,) = result.stop
    assert stop.alloc == (replacement if original_kept else original)


def test_reconcile__disconnected_node__replacement_points_back() -> None:
    scenario = s_disconnected_node()
    result = scenario.run()
    assert {p.previous.id for p in result.place if p.previous} == {a.id for a in result.disconnecting}
    assert all(p.reason == "disconnect" for p in result.place)


def test_reconcile__job_stopped__lost_allocs_stopped_as_lost() -> None:
    result = s_job_stopped().run()
    statuses = sorted(s.client_status for s in result.stop)
    assert statuses == [""] * 8 + [structs.ALLOC_CLIENT_LOST] * 2


def test_reconcile__other_groups_allocs_are_skipped() -> None:
    job, node = mock.job(), mock.node()
    stranger = replace(mock.alloc(job, node, 0), task_group="db")
    Expect(place=10).check(reconcile_group(job, job.groups[0], [stranger], {}, NOW))


# ---------------------------------------------------------------------------------------
# Delay functions


def _events(*delays_s: int, at_ns: int = NOW - HOUR) -> tuple[RescheduleEvent, ...]:
    return tuple(RescheduleEvent(reschedule_time_ns=at_ns, delay_ns=d * SECOND) for d in delays_s)


@pytest.mark.parametrize(
    ("function", "history", "expected_s"),
    [
        ("constant", (), 5),
        ("constant", (5, 5, 5), 5),
        ("exponential", (), 5),
        ("exponential", (5,), 10),
        ("exponential", (5, 10, 20), 40),
        ("exponential", (40,), 60),  # capped at max_delay
        ("fibonacci", (), 5),
        ("fibonacci", (5,), 5),
        ("fibonacci", (5, 5), 10),
        ("fibonacci", (5, 10), 15),
        ("fibonacci", (30, 45), 60),  # capped
        ("fibonacci", (60, 5), 5),  # the series restarted after a reset
        ("no-such-function", (5, 10), 5),
    ],
)
def test_reconcile__next_delay(function: str, history: tuple[int, ...], expected_s: int) -> None:
    policy = ReschedulePolicy(delay_ns=5 * SECOND, delay_function=function, max_delay_ns=60 * SECOND)
    fail_ns = NOW - HOUR + 30 * SECOND  # soon after the last reschedule: no reset
    assert next_delay(policy, _events(*history), fail_ns) == expected_s * SECOND


def test_reconcile__next_delay__resets_after_a_long_healthy_run() -> None:
    policy = ReschedulePolicy(delay_ns=5 * SECOND, delay_function="exponential", max_delay_ns=60 * SECOND)
    assert next_delay(policy, _events(40, at_ns=NOW - HOUR), NOW) == 5 * SECOND


@pytest.mark.parametrize(
    ("policy", "history", "eligible"),
    [
        (None, (), False),
        (ReschedulePolicy(attempts=0, unlimited=False), (), False),
        (ReschedulePolicy(unlimited=True), (5, 5, 5, 5, 5, 5), True),
        (ReschedulePolicy(attempts=2, interval_ns=HOUR, unlimited=False, delay_ns=SECOND), (1,), True),
        (ReschedulePolicy(attempts=2, interval_ns=HOUR, unlimited=False, delay_ns=SECOND), (1, 1), False),
        # The next delay must fit in the interval.
        (ReschedulePolicy(attempts=5, interval_ns=MINUTE, unlimited=False, delay_ns=2 * MINUTE), (1,), False),
    ],
    ids=[
        "no_policy",
        "zero_attempts",
        "unlimited",
        "attempt_left",
        "attempts_used",
        "delay_exceeds_interval",
    ],
)
def test_reconcile__reschedule_eligibility(
    policy: ReschedulePolicy | None, history: tuple[int, ...], eligible: bool
) -> None:
    job, node = mock.job(), mock.node()
    alloc = failed(mock.alloc(job, node), NOW, reschedule_events=_events(*history, at_ns=NOW - MINUTE // 2))
    assert next_reschedule(alloc, policy).eligible is eligible


# ---------------------------------------------------------------------------------------
# Properties


_NODES: Mapping[str, Node | None] = {
    "n-down": down(mock.node(id="n-down")),
    "n-drain": draining(mock.node(id="n-drain")),
    "n-away": disconnected(mock.node(id="n-away")),
    "n-gone": None,
}
_NODE_IDS = ("n-ready", "n-ready-2", *_NODES)
_STATUSES = (
    structs.ALLOC_CLIENT_PENDING,
    structs.ALLOC_CLIENT_RUNNING,
    structs.ALLOC_CLIENT_COMPLETE,
    structs.ALLOC_CLIENT_FAILED,
    structs.ALLOC_CLIENT_UNKNOWN,
)


def drawn_alloc_fields(draw: st.DrawFn, i: int, earlier: Sequence[Allocation]) -> dict[str, Any]:
    """The history of a random alloc ``a{i}``, for ``mock.alloc``: any client status, now and
    then desired to stop, maybe the replacement of an earlier one, last changed just now, ten
    seconds or two hours ago. The generic scheduler's properties draw their allocs alike."""
    return {
        "id": f"a{i}",
        "eval_id": "e0",
        "client_status": draw(st.sampled_from(_STATUSES)),
        "desired_status": structs.ALLOC_DESIRED_STOP
        if draw(st.integers(0, 4)) == 0
        else structs.ALLOC_DESIRED_RUN,
        "previous_allocation": draw(st.sampled_from(["", *(a.id for a in earlier)])),
        "modify_time_ns": NOW - draw(st.sampled_from((0, 10 * SECOND, 2 * HOUR))),
        "create_time_ns": NOW - HOUR,
    }


@st.composite
def groups(draw: st.DrawFn) -> tuple[Job, list[Allocation], dict[int, Job]]:
    """A job at version 1 (version 0 differs in place or destructively) and up to 10 allocs
    of its group, in any state, on ready, down, draining, disconnected or missing nodes,
    some replacing earlier ones."""
    base = mock.batch_job(id="j") if draw(st.booleans()) else mock.job(id="j")
    count = draw(st.integers(0, 6))
    destructive = draw(st.booleans())
    v0 = with_group(base, count=count)
    task = replace(v0.groups[0].tasks[0], config_json='{"v": 1}') if destructive else v0.groups[0].tasks[0]
    v1 = with_group(
        replace(v0, version=1, stop=draw(st.booleans()) and draw(st.booleans())),
        count=count,
        tasks=(task,),
        meta={"v": "1"},
        update=UpdateStrategy(max_parallel=draw(st.integers(0, 3))),
        disconnect=DisconnectStrategy(replace=draw(st.booleans())),
    )
    allocs: list[Allocation] = []
    for i in range(draw(st.integers(0, 10))):
        version = draw(st.integers(0, 1))
        alloc = mock.alloc(
            v1 if version else v0,
            mock.node(id=draw(st.sampled_from(_NODE_IDS))),
            draw(st.integers(0, 7)),
            **drawn_alloc_fields(draw, i, allocs),
            create_index=i + 1,
            followup_eval_id=draw(st.sampled_from(("", "e-old"))),
            reschedule_events=_events(*draw(st.lists(st.sampled_from((5, 30)), max_size=2))),
        )
        allocs.append(alloc)
    return v1, allocs, {0: v0}


def apply_result(
    job: Job, allocs: Sequence[Allocation], result: GroupResult, now_ns: int, healthy_node: str = "n-ready"
) -> list[Allocation]:
    """What the state holds after the result's plan committed in full (every placement fit)."""
    ids = itertools.count(1)
    by_id = {a.id: a for a in allocs}
    stops = list(result.stop)
    for p in result.place:
        if p.stop_previous is not None:
            stops.append(p.stop_previous)
    for s in stops:
        a = by_id[s.alloc.id]
        by_id[a.id] = replace(
            a, desired_status=structs.ALLOC_DESIRED_STOP, client_status=s.client_status or a.client_status
        )
    for a in result.update_inplace:
        by_id[a.id] = replace(by_id[a.id], job_version=job.version)
    for a in result.disconnecting:
        by_id[a.id] = replace(by_id[a.id], client_status=structs.ALLOC_CLIENT_UNKNOWN)
    for d in result.reschedule_later:
        by_id[d.alloc.id] = replace(by_id[d.alloc.id], followup_eval_id="e-followup")
    out = list(by_id.values())
    for p in result.place:
        out.append(
            replace(
                mock.alloc(job, mock.node(id=healthy_node), p.index),
                id=f"new-{now_ns}-{next(ids)}",
                name=p.name,
                previous_allocation=p.previous.id if p.previous else "",
                reschedule_events=p.reschedule_events,
                create_time_ns=now_ns,
                create_index=1000 + len(out),
            )
        )
    return out


def _live_on_reachable_nodes(allocs: Sequence[Allocation]) -> int:
    return sum(1 for a in allocs if not a.terminal() and a.node_id != "n-away")


_PROPERTY_SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_PROPERTY_SETTINGS
@given(groups())
def test_reconcile__property__never_more_than_count_live(
    case: tuple[Job, list[Allocation], dict[int, Job]],
) -> None:
    job, allocs, versions = case
    result = reconcile_group(job, job.groups[0], allocs, _NODES, NOW, eval_id="e1", job_versions=versions)
    after = apply_result(job, allocs, result, NOW)
    limit = 0 if job.stop else job.groups[0].count
    assert _live_on_reachable_nodes(after) <= limit


@_PROPERTY_SETTINGS
@given(groups())
def test_reconcile__property__stopped_job_places_nothing(
    case: tuple[Job, list[Allocation], dict[int, Job]],
) -> None:
    job, allocs, versions = case
    job = replace(job, stop=True)
    result = reconcile_group(job, job.groups[0], allocs, _NODES, NOW, eval_id="e1", job_versions=versions)
    assert result.place == () and result.update_inplace == () and result.update_destructive == ()
    assert _live_on_reachable_nodes(apply_result(job, allocs, result, NOW)) == 0


@_PROPERTY_SETTINGS
@given(groups())
def test_reconcile__property__fixed_point(case: tuple[Job, list[Allocation], dict[int, Job]]) -> None:
    job, allocs, versions = case
    first = reconcile_group(job, job.groups[0], allocs, _NODES, NOW, eval_id="e1", job_versions=versions)
    after = apply_result(job, allocs, first, NOW)
    second = reconcile_group(job, job.groups[0], after, _NODES, NOW, eval_id="e2", job_versions=versions)
    if first.held_back:
        return  # held back on purpose: health lets the rest go
    # A delayed reschedule is no excuse: its follow-up is stamped, so nothing is left to do.
    assert second.is_no_op(), second.counts()


# ---------------------------------------------------------------------------------------
# The reschedule tracker a replacement carries


@pytest.mark.parametrize(
    ("policy", "past_ages_s", "kept"),
    [
        # Limited, with an interval: attempts older than the interval fall out.
        (ReschedulePolicy(attempts=5, interval_ns=HOUR, delay_ns=SECOND, unlimited=False), (10, 7200), 1),
        (ReschedulePolicy(attempts=5, interval_ns=HOUR, delay_ns=SECOND, unlimited=False), (10, 20), 2),
        # Limited, no interval: a lifetime count, everything kept.
        (ReschedulePolicy(attempts=5, interval_ns=0, delay_ns=SECOND, unlimited=False), (10, 7200), 2),
        # Unlimited: only the most recent few (the delay functions need the last two).
        (ReschedulePolicy(unlimited=True, delay_ns=SECOND), (1, 2, 3, 4, 5, 6, 7), 4),
    ],
    ids=["interval-drops-old", "interval-keeps-recent", "no-interval-keeps-all", "unlimited-keeps-recent"],
)
def test_reconcile__tracker__what_a_replacement_carries(
    policy: ReschedulePolicy, past_ages_s: tuple[int, ...], kept: int
) -> None:
    job = replace(mock.job(), groups=(replace(mock.job().groups[0], count=1, reschedule=policy),))
    past = tuple(
        RescheduleEvent(reschedule_time_ns=NOW - age * SECOND, prev_alloc_id=f"p{age}", delay_ns=SECOND)
        for age in sorted(past_ages_s, reverse=True)
    )
    alloc = failed(mock.alloc(job, mock.node()), NOW - MINUTE, reschedule_events=past)
    (placement,) = reconcile_group(job, job.groups[0], [alloc], {}, NOW).place
    events = placement.reschedule_events
    # The kept past events, oldest first, then this attempt.
    assert [e.prev_alloc_id for e in events[:-1]] == [e.prev_alloc_id for e in past[len(past) - kept :]]
    assert events[-1].prev_alloc_id == alloc.id and events[-1].reschedule_time_ns == NOW


# ---------------------------------------------------------------------------------------
# Deployments: canaries, promotion, failed and paused deployments


def _canary_scenario() -> tuple[Job, list[Allocation], dict[int, Job]]:
    job, node = mock.job(), mock.node()
    allocs = running(job, node, range(4))
    new, versions = destructive_change(job, update=UpdateStrategy(max_parallel=2, canary=1))
    new = replace(new, groups=(replace(new.groups[0], count=4),))
    return new, allocs, versions


def _canary(job: Job, index: int, deployment: Deployment, health: str = "") -> Allocation:
    return replace(
        mock.alloc(job, mock.node(id="n-canary"), index),
        id=f"canary-{index}",
        client_status=structs.ALLOC_CLIENT_RUNNING,
        deployment_id=deployment.id,
        deployment_status=AllocDeploymentStatus(health=health, canary=True),
    )


@pytest.mark.parametrize(
    ("name", "setup", "expected", "canaries_placed"),
    [
        # No deployment yet: one canary beside the four old allocs, nothing old replaced.
        ("canary__first_pass__places_one_canary", "none", Expect(place=1, ignore=4), 1),
        # The canary runs, not promoted: nothing more, whatever its health.
        ("canary__placed_unhealthy_unknown__waits", "placed", Expect(ignore=5), 0),
        ("canary__placed_healthy_not_promoted__waits", "healthy", Expect(ignore=5), 0),
        # Promoted: the canary holds slot 0 (the old alloc of its name stops), and the
        # rollout goes on at max_parallel.
        (
            "canary__promoted__old_slot_stopped_then_rolls",
            "promoted",
            Expect(stop=3, update_destructive=2, place=2, ignore=2),
            0,
        ),
        # A paused deployment places no canary.
        ("canary__paused__nothing", "paused", Expect(ignore=4), 0),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_reconcile__deployment_canaries(
    name: str, setup: str, expected: Expect, canaries_placed: int
) -> None:
    job, allocs, versions = _canary_scenario()
    deployment = Deployment(
        id="d-1",
        job_id=job.id,
        job_version=job.version,
        task_groups={job.groups[0].name: DeploymentState(desired_canaries=1, desired_total=4)},
    )
    current: Deployment | None = deployment
    if setup == "none":
        current = None
    elif setup in ("placed", "healthy"):
        allocs = [*allocs, _canary(job, 0, deployment, HEALTH_HEALTHY if setup == "healthy" else "")]
    elif setup == "promoted":
        promoted = replace(
            deployment,
            task_groups={
                job.groups[0].name: DeploymentState(desired_canaries=1, desired_total=4, promoted=True)
            },
        )
        current = promoted
        canary = replace(
            _canary(job, 0, promoted, HEALTH_HEALTHY),
            deployment_status=AllocDeploymentStatus(health=HEALTH_HEALTHY),
        )
        allocs = [*allocs, canary]
    elif setup == "paused":
        current = replace(deployment, status=structs.DEPLOYMENT_STATUS_PAUSED)
    result = reconcile_group(job, job.groups[0], allocs, {}, NOW, deployment=current, job_versions=versions)
    expected.check(result)
    assert sum(1 for p in result.place if p.canary) == canaries_placed
    if setup == "promoted":
        # The old alloc of the canary's slot goes without a replacement; slots 1 and 2 roll.
        assert allocs[0].id in {s.alloc.id for s in result.stop}
        assert sorted(p.index for p in result.place) == [1, 2]
        assert result.held_back  # slot 3 waits for health


def test_reconcile__deployment_canaries__ended_deployment__canary_stopped() -> None:
    """A canary of a deployment that was replaced (a newer version) or failed is stopped,
    as Nomad's cancelUnneededCanaries: it would otherwise run beside the slots forever."""
    job, allocs, versions = _canary_scenario()
    old = Deployment(
        id="d-old", job_id=job.id, job_version=job.version, status=structs.DEPLOYMENT_STATUS_FAILED
    )
    canary = _canary(job, 0, old)
    result = reconcile_group(
        job, job.groups[0], [*allocs, canary], {}, NOW, deployment=old, job_versions=versions
    )
    assert canary.id in {s.alloc.id for s in result.stop}
    assert not result.place and not result.update_destructive


def test_reconcile__failed_deployment__failed_allocs_not_rescheduled_no_new_slots() -> None:
    """A failed deployment's failed allocs are not replaced (that would roll the failed
    version again) and no new slot is filled; a lost alloc is still replaced."""
    job, node = mock.job(), mock.node()
    deployment = Deployment(
        id="d-1", job_id=job.id, job_version=job.version, status=structs.DEPLOYMENT_STATUS_FAILED
    )
    allocs = running(job, node, range(3), deployment_id=deployment.id)
    allocs[1] = failed(allocs[1], NOW - HOUR)
    gone = mock.node(id="n-gone")
    allocs[2] = replace(allocs[2], node_id=gone.id)
    bigger = replace(job, groups=(replace(job.groups[0], count=4),))
    result = reconcile_group(
        bigger, bigger.groups[0], allocs, {gone.id: down(gone)}, NOW, deployment=deployment
    )
    assert [p.reason for p in result.place] == ["lost"]
    assert not result.reschedule_now and not result.reschedule_later


@pytest.mark.parametrize("verdict", [None, AllocDeploymentStatus(health="")], ids=["no-status", "no-health"])
def test_reconcile__rolling__failed_alloc_before_its_verdict__still_holds_its_slot(
    verdict: AllocDeploymentStatus | None,
) -> None:
    """The client reports an alloc failed and, separately, its health tracker the unhealthy
    verdict: an eval run between the two must not take the failed alloc's slot for the next
    batch, or a version that fails at start runs wider than max_parallel."""
    scenario = s_rolling()
    first = scenario.run()
    committed = apply_result(scenario.job, scenario.allocs, first, NOW, healthy_node="node-new")
    deployment = Deployment(id="d-1", job_id=scenario.job.id, job_version=scenario.job.version)
    allocs = _in_deployment(committed, deployment, HEALTH_HEALTHY)
    new = [i for i, a in enumerate(allocs) if a.id.startswith("new-")]
    assert len(new) == 2  # max_parallel: the first batch
    allocs[new[0]] = replace(failed(allocs[new[0]], NOW), deployment_status=verdict)
    group = scenario.job.groups[0]

    held = reconcile_group(scenario.job, group, allocs, {}, NOW, deployment=deployment, **scenario.kwargs)

    assert len(held.update_destructive) == 1 and held.held_back


def test_reconcile__rolling__failed_unhealthy_alloc_blocks_until_replaced() -> None:
    """A new alloc that failed unhealthy stops the rollout even though it holds no
    resources any more; once it is replaced, its replacement's verdict is what counts."""
    scenario = s_rolling()
    first = scenario.run()
    committed = apply_result(scenario.job, scenario.allocs, first, NOW, healthy_node="node-new")
    deployment = Deployment(id="d-1", job_id=scenario.job.id, job_version=scenario.job.version)
    allocs = _in_deployment(committed, deployment, HEALTH_HEALTHY)
    bad = next(i for i, a in enumerate(allocs) if a.id.startswith("new-"))
    allocs[bad] = replace(
        failed(allocs[bad], NOW),
        deployment_status=AllocDeploymentStatus(health=HEALTH_UNHEALTHY),
        followup_eval_id="e-later",
    )
    group = scenario.job.groups[0]
    blocked = reconcile_group(scenario.job, group, allocs, {}, NOW, deployment=deployment, **scenario.kwargs)
    assert not blocked.update_destructive and blocked.held_back
    replacement = replace(allocs[bad], id="r-1", previous_allocation=allocs[bad].id, client_status="running")
    replacement = replace(
        replacement, deployment_status=AllocDeploymentStatus(health=HEALTH_HEALTHY), task_states={}
    )
    allocs[bad] = replace(allocs[bad], desired_status=structs.ALLOC_DESIRED_STOP)
    rolling = reconcile_group(
        scenario.job, group, [*allocs, replacement], {}, NOW, deployment=deployment, **scenario.kwargs
    )
    assert len(rolling.update_destructive) == 2
