"""A group's ``migrate`` block honoured while its nodes drain: at most ``max_parallel`` allocs
leave at a time, the next only once the replacements settled (scheduler/reconciler/migrate.py,
Nomad's drainer ``handleTaskGroup``), everything once the drain's deadline passed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from drover.scheduler import structs
from drover.scheduler.reconciler.generic import GroupResult, reconcile_group
from drover.scheduler.reconciler.migrate import (
    DrainRoom,
    checks_passing_since_ns,
    drain_room,
    group_check_count,
    settles_at_ns,
)
from drover.scheduler.structs import (
    HEALTH_UNHEALTHY,
    Allocation,
    AllocCheckStatus,
    AllocDeploymentStatus,
    DrainStrategy,
    Job,
    MigrateStrategy,
    Node,
    TaskState,
)
from drover.scheduler.validate import canonicalize_job, validate_job
from drover.server.jobspec import parse_jobspec
from drover.v1 import structs_pb2
from tests.fixtures import mock
from tests.fixtures.buckets import Expect
from tests.fixtures.mock import HOUR, NOW, SECOND
from tests.unit.test_node_identity import Leader, node, report

MIN_HEALTHY = 5 * SECOND
DEADLINE = 60 * SECOND
STRATEGY = MigrateStrategy(
    max_parallel=1, health_check="task_states", min_healthy_time_ns=MIN_HEALTHY, healthy_deadline_ns=DEADLINE
)


def job_with(strategy: MigrateStrategy | None, count: int, **changes: Any) -> Job:
    job = mock.job(**changes)
    return replace(job, groups=(replace(job.groups[0], count=count, migrate=strategy),))


def draining(node: Node, force_at_ns: int = 0) -> Node:
    return replace(
        node,
        drain_strategy=DrainStrategy(deadline_ns=HOUR, started_at_ns=NOW, force_deadline_at_ns=force_at_ns),
    )


def running_since(job: Job, node: Node, index: int, started_ns: int) -> Allocation:
    """An alloc whose one task has run since ``started_ns`` (created a second before)."""
    return mock.alloc(
        job,
        node,
        index,
        client_status=structs.ALLOC_CLIENT_RUNNING,
        create_time_ns=started_ns - SECOND,
        task_states={"web": TaskState(state="running", started_at_ns=started_ns)},
    )


def reconcile(
    job: Job, allocs: list[Allocation], tainted: dict[str, Node | None], now: int = NOW
) -> GroupResult:
    return reconcile_group(job, job.groups[0], allocs, tainted, now)


def test_drain__max_parallel_1__one_leaves_the_others_hold_their_slots() -> None:
    job, node = job_with(STRATEGY, 3), mock.node()
    allocs = [running_since(job, node, i, NOW - HOUR) for i in range(3)]

    result = reconcile(job, allocs, {node.id: draining(node)})

    Expect(migrate=1, stop=1, place=1, ignore=2).check(result)
    assert [a.index for a in result.migrate] == [0]
    # Nothing is unsettled and the drain has no deadline: the replacement's running report
    # brings the next eval, not a timer.
    assert result.migrate_wake_at_ns == 0


def test_drain__max_parallel_2__two_leave_at_once() -> None:
    job, node = job_with(replace(STRATEGY, max_parallel=2), 4), mock.node()
    allocs = [running_since(job, node, i, NOW - HOUR) for i in range(4)]

    result = reconcile(job, allocs, {node.id: draining(node)})

    Expect(migrate=2, stop=2, place=2, ignore=2).check(result)


def test_drain__replacement_still_pending__nothing_more_leaves__look_again_at_its_deadline() -> None:
    job, drained, good = job_with(STRATEGY, 3), mock.node(), mock.node()
    left = replace(running_since(job, drained, 0, NOW - HOUR), desired_status=structs.ALLOC_DESIRED_STOP)
    replacement = mock.alloc(job, good, 0, previous_allocation=left.id, create_time_ns=NOW - SECOND)
    allocs = [left, replacement, *(running_since(job, drained, i, NOW - HOUR) for i in (1, 2))]

    result = reconcile(job, allocs, {drained.id: draining(drained)})

    Expect(ignore=3).check(result)
    assert result.migrate_wake_at_ns == NOW - SECOND + DEADLINE


def test_drain__replacement_running_shorter_than_min_healthy_time__waits_then_the_next_leaves() -> None:
    job, drained, good = job_with(STRATEGY, 3), mock.node(), mock.node()
    left = replace(running_since(job, drained, 0, NOW - HOUR), desired_status=structs.ALLOC_DESIRED_STOP)
    replacement = replace(running_since(job, good, 0, NOW - 2 * SECOND), previous_allocation=left.id)
    allocs = [left, replacement, *(running_since(job, drained, i, NOW - HOUR) for i in (1, 2))]
    tainted: dict[str, Node | None] = {drained.id: draining(drained)}

    waiting = reconcile(job, allocs, tainted)
    Expect(ignore=3).check(waiting)
    assert waiting.migrate_wake_at_ns == NOW - 2 * SECOND + MIN_HEALTHY

    settled = reconcile(job, allocs, tainted, now=waiting.migrate_wake_at_ns)
    Expect(migrate=1, stop=1, place=1, ignore=2).check(settled)
    assert [a.index for a in settled.migrate] == [1]


def test_drain__a_verdict_counts_as_settled_even_unhealthy_as_nomads_has_health() -> None:
    job, drained, good = job_with(STRATEGY, 2), mock.node(), mock.node()
    replacement = replace(
        mock.alloc(job, good, 0, create_time_ns=NOW - SECOND),
        deployment_status=AllocDeploymentStatus(health=HEALTH_UNHEALTHY, timestamp_ns=NOW),
    )
    result = reconcile(
        job, [replacement, running_since(job, drained, 1, NOW - HOUR)], {drained.id: draining(drained)}
    )

    Expect(migrate=1, stop=1, place=1, ignore=1).check(result)


def test_drain__deadline_passed__everything_left_goes_at_once() -> None:
    job, node = job_with(STRATEGY, 3), mock.node()
    allocs = [running_since(job, node, i, NOW - HOUR) for i in range(3)]

    forced = reconcile(job, allocs, {node.id: draining(node, force_at_ns=NOW)})
    held = reconcile(job, allocs, {node.id: draining(node, force_at_ns=NOW + HOUR)})

    Expect(migrate=3, stop=3, place=3).check(forced)
    Expect(migrate=1, stop=1, place=1, ignore=2).check(held)
    assert held.migrate_wake_at_ns == NOW + HOUR


@pytest.mark.parametrize(
    ("job", "why"),
    [
        (job_with(None, 3), "no migrate block: all at once, as before"),
        (
            job_with(STRATEGY, 3, type=structs.JOB_TYPE_BATCH),
            "batch: Nomad marks no batch alloc for migration",
        ),
    ],
    ids=["no-migrate-block", "batch"],
)
def test_drain__not_limited(job: Job, why: str) -> None:
    node = mock.node()
    allocs = [running_since(job, node, i, NOW - HOUR) for i in range(3)]

    result = reconcile(job, allocs, {node.id: draining(node)})

    assert len(result.migrate) == 3, why


def test_alloc_stop__not_limited_by_max_parallel() -> None:
    job, node = job_with(STRATEGY, 3), mock.node()
    allocs = [
        replace(
            running_since(job, node, i, NOW - HOUR),
            desired_transition=structs.DesiredTransition(migrate=True),
        )
        for i in range(3)
    ]

    Expect(migrate=3, stop=3, place=3).check(reconcile(job, allocs, {}))


def test_settles_at__pending_without_creation_time__unknown() -> None:
    job, node = mock.job(), mock.node()
    assert settles_at_ns(mock.alloc(job, node, 0, create_time_ns=0), STRATEGY) is None


def test_drain_room__settled_beyond_count_minus_max_parallel() -> None:
    job, node = mock.job(), mock.node()
    settled = [running_since(job, node, i, NOW - HOUR) for i in range(4)]
    young = running_since(job, node, 4, NOW - SECOND)

    room = drain_room([*settled, young], 5, replace(STRATEGY, max_parallel=2), NOW)

    assert (room.room, room.next_change_ns) == (4 - (5 - 2), NOW - SECOND + MIN_HEALTHY)


# ---------------------------------------------------------------------------------------
# Validation: what a drain can not honour is refused, naming the key


def _group_with_service(check: str) -> str:
    return (
        'job "web" {\n  group "g" {\n    migrate {\n      max_parallel = 1\n    }\n'
        '    network {\n      port "http" {}\n    }\n'
        f'    service {{\n      name = "web"\n      port = "http"\n      {check}\n    }}\n'
        '    task "t" {\n      driver = "mock"\n    }\n  }\n}\n'
    )


def test_validate__migrate_checks_with_service_checks__accepted_and_honoured() -> None:
    """Check statuses ride with the alloc, so a drain can wait on them (below)."""
    checked = parse_jobspec(
        _group_with_service('check {\n type = "tcp"\n interval = "10s"\n timeout = "2s"\n }')
    )
    unchecked = parse_jobspec(_group_with_service(""))

    validate_job(canonicalize_job(checked))
    validate_job(canonicalize_job(unchecked))  # no checks: "checks" means the task states
    assert group_check_count(checked.groups[0]) == 1
    assert group_check_count(unchecked.groups[0]) == 0


CHECKS = replace(STRATEGY, health_check="checks")


def _with_checks(alloc: Allocation, *statuses: tuple[str, int]) -> Allocation:
    return replace(
        alloc,
        check_statuses=tuple(
            AllocCheckStatus(service="web", check=f"check[{i}]", status=status, timestamp_ns=since)
            for i, (status, since) in enumerate(statuses)
        ),
    )


def test_settles__checks_mode__waits_for_every_check_passing_for_min_healthy_time() -> None:
    job, node = job_with(CHECKS, 1), mock.node()
    alloc = running_since(job, node, 0, NOW - 10 * SECOND)
    deadline = alloc.create_time_ns + DEADLINE
    assert deadline > NOW

    # Tasks long running, but no check has a status yet: only the deadline settles it.
    assert settles_at_ns(alloc, CHECKS, checks=2) == deadline
    one = _with_checks(alloc, ("passing", NOW - SECOND))
    assert settles_at_ns(one, CHECKS, checks=2) == deadline  # the second check has none
    failing = _with_checks(alloc, ("passing", NOW - SECOND), ("critical", NOW - SECOND))
    assert settles_at_ns(failing, CHECKS, checks=2) == deadline
    # Both passing, the later since NOW - 1s: settled min_healthy_time after that.
    both = _with_checks(alloc, ("passing", NOW - 3 * SECOND), ("passing", NOW - SECOND))
    assert settles_at_ns(both, CHECKS, checks=2) == NOW - SECOND + MIN_HEALTHY
    assert checks_passing_since_ns(both, 2) == NOW - SECOND
    # "task_states", or a group without checks, looks at the tasks alone.
    assert settles_at_ns(failing, STRATEGY, checks=2) == NOW - 10 * SECOND + MIN_HEALTHY
    assert settles_at_ns(alloc, CHECKS, checks=0) == NOW - 10 * SECOND + MIN_HEALTHY


def test_drain__checks_mode__next_leaves_only_once_the_replacements_checks_pass() -> None:
    job, old, new = job_with(CHECKS, 2), mock.node(), mock.node()
    leaving = [running_since(job, old, i, NOW - HOUR) for i in range(2)]
    # The first batch moved: alloc 0's replacement runs on the new node, its check failing.
    # The first batch moved: alloc 0's replacement has run on the new node for 10 s (past
    # min_healthy_time), its check failing.
    replacement = _with_checks(running_since(job, new, 0, NOW - 10 * SECOND), ("critical", NOW - 10 * SECOND))
    waiting = drain_room([leaving[1], replacement], 2, CHECKS, NOW, checks=1)
    assert waiting.room <= 0
    assert waiting.next_change_ns == replacement.create_time_ns + DEADLINE  # unhealthy by then

    # Passing for 6 s (> min_healthy_time): settled, so the second may leave.
    passing = _with_checks(replacement, ("passing", NOW - 6 * SECOND))
    assert drain_room([leaving[1], passing], 2, CHECKS, NOW, checks=1).room == 1
    # Passing for 1 s only: not yet, and the room says when to look again.
    recent = _with_checks(replacement, ("passing", NOW - SECOND))
    assert drain_room([leaving[1], recent], 2, CHECKS, NOW, checks=1) == DrainRoom(
        0, NOW - SECOND + MIN_HEALTHY
    )


# ---------------------------------------------------------------------------------------
# The leader: a replacement that starts running brings the next look


def test_update_allocs__replacement_runs_while_its_group_waits_on_a_draining_node__node_drain_eval() -> None:
    lead = Leader()
    for name in ("n1", "n2"):
        lead.endpoints.register_node(node(name, f"secret-{name}"))
    job = job_with(STRATEGY, 2, id="web")
    lead.raft.propose(mock.register_job_entry(job))
    plain = job_with(None, 1, id="plain")
    lead.raft.propose(mock.register_job_entry(plain))
    n1, n2 = (lead.raft.store.snapshot().node(name) for name in ("n1", "n2"))
    assert n1 is not None and n2 is not None
    placed = [
        mock.alloc(job, n1, 1, id="held"),
        mock.alloc(job, n2, 0, id="new"),
        mock.alloc(plain, n2, 0, id="p"),
    ]
    assert not lead.raft.propose(mock.plan_entry(placed)).error
    assert not lead.raft.propose(mock.drain_entry("n1", DrainStrategy(deadline_ns=HOUR))).error

    def drain_evals(job_id: str) -> list[structs.Evaluation]:
        evals = lead.raft.store.snapshot().evals_by_job("default", job_id)
        return [e for e in evals if e.triggered_by == structs.TRIGGER_NODE_DRAIN]

    before = len(drain_evals("web"))
    lead.endpoints.update_allocs([report("new"), report("p")], node_id="n2", secret_id="secret-n2")

    assert len(drain_evals("web")) == before + 1
    # A job without a migrate block moved all at once: nothing waits, no eval.
    assert drain_evals("plain") == []
    # Running already: no second eval for the same start.
    lead.endpoints.update_allocs([report("new")], node_id="n2", secret_id="secret-n2")
    assert len(drain_evals("web")) == before + 1


def test_update_allocs__replacements_checks_all_pass_while_its_group_waits_on_a_draining_node__node_drain_eval() -> (
    None
):
    """With ``health_check = "checks"`` the replacement settles when its checks pass, long
    after it started running: that report brings the next look too."""
    lead = Leader()
    for name in ("n1", "n2"):
        lead.endpoints.register_node(node(name, f"secret-{name}"))
    job = job_with(CHECKS, 2, id="web")
    lead.raft.propose(mock.register_job_entry(job))
    n1, n2 = (lead.raft.store.snapshot().node(name) for name in ("n1", "n2"))
    assert n1 is not None and n2 is not None
    placed = [mock.alloc(job, n1, 1, id="held"), mock.alloc(job, n2, 0, id="new")]
    assert not lead.raft.propose(mock.plan_entry(placed)).error
    assert not lead.raft.propose(mock.drain_entry("n1", DrainStrategy(deadline_ns=HOUR))).error

    def drain_evals() -> int:
        evals = lead.raft.store.snapshot().evals_by_job("default", "web")
        return sum(e.triggered_by == structs.TRIGGER_NODE_DRAIN for e in evals)

    def with_check(status: str) -> structs_pb2.Allocation:
        update = report("new")
        update.check_statuses.add(service="web", check="check[0]", status=status, timestamp_ns=NOW)
        return update

    lead.endpoints.update_allocs([with_check("critical")], node_id="n2", secret_id="secret-n2")
    started = drain_evals()  # its start brought one look, as with "task_states"
    lead.endpoints.update_allocs([with_check("passing")], node_id="n2", secret_id="secret-n2")
    assert drain_evals() == started + 1
    # Still passing: nothing new to look at.
    lead.endpoints.update_allocs([with_check("passing")], node_id="n2", secret_id="secret-n2")
    assert drain_evals() == started + 1
