"""The deployment watcher's rules (server/deployments/decide.py), as tables of situations.

Every case is a complete deployment with its job, history and allocs at a fixed ``NOW``;
the assertions are on the decision alone (fail and why, promote, when to look again).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from drover.scheduler.deployments import running_description
from drover.scheduler.structs import (
    ALLOC_CLIENT_FAILED,
    ALLOC_CLIENT_RUNNING,
    ALLOC_DESIRED_STOP,
    DEPLOYMENT_DESC_AUTO_PROMOTION,
    DEPLOYMENT_DESC_MARKED_FAILED,
    DEPLOYMENT_DESC_NEEDS_PROMOTION,
    DEPLOYMENT_DESC_PROGRESS_DEADLINE,
    DEPLOYMENT_DESC_RUNNING,
    DEPLOYMENT_DESC_UNHEALTHY,
    DEPLOYMENT_STATUS_FAILED,
    DEPLOYMENT_STATUS_PAUSED,
    DEPLOYMENT_STATUS_RUNNING,
    HEALTH_HEALTHY,
    HEALTH_UNHEALTHY,
    Allocation,
    AllocDeploymentStatus,
    Deployment,
    DeploymentState,
    Job,
    RescheduleEvent,
    ReschedulePolicy,
)
from drover.server.deployments.decide import WatchDecision, decide, failure
from tests.fixtures import mock

NOW = mock.NOW
MIN = mock.MINUTE
LIMITED = ReschedulePolicy(attempts=1, interval_ns=mock.HOUR, delay_ns=5 * mock.SECOND, unlimited=False)


def _job(
    version: int = 1, *, reschedule: ReschedulePolicy | None = None, count: int = 3, **over: object
) -> Job:
    job = mock.job(id="web", version=version, **over)
    group = job.groups[0]
    group = replace(group, count=count, reschedule=reschedule or group.reschedule)
    return replace(job, groups=(group,))


def _deployment(**group: object) -> Deployment:
    state = replace(
        DeploymentState(
            progress_deadline_ns=10 * MIN,
            require_progress_by_ns=NOW + 5 * MIN,
            desired_total=3,
            placed_allocs=1,
        ),
        **group,
    )
    return Deployment(
        id="d1", job_id="web", job_version=1, task_groups={"web": state}, status=DEPLOYMENT_STATUS_RUNNING
    )


def _alloc(
    alloc_id: str, health: str = "", *, canary: bool = False, deployment_id: str = "d1", **over: object
) -> Allocation:
    base = mock.alloc(
        _job(),
        mock.node(id="n1"),
        id=alloc_id,
        deployment_id=deployment_id,
        client_status=ALLOC_CLIENT_RUNNING,
        deployment_status=AllocDeploymentStatus(health=health, timestamp_ns=NOW, canary=canary),
    )
    return replace(base, **over)


def _failed_again(alloc_id: str) -> Allocation:
    """Unhealthy, failed, and already rescheduled once inside the limited policy's hour."""
    event = RescheduleEvent(reschedule_time_ns=NOW - MIN, prev_alloc_id="a0", delay_ns=5 * mock.SECOND)
    return _alloc(alloc_id, HEALTH_UNHEALTHY, client_status=ALLOC_CLIENT_FAILED, reschedule_events=(event,))


DECISIONS = [
    (
        "unhealthy__no_progress_deadline__fails_at_once",
        _deployment(progress_deadline_ns=0, require_progress_by_ns=0),
        _job(),
        [_alloc("a1", HEALTH_UNHEALTHY)],
        NOW,
        WatchDecision(fail=DEPLOYMENT_DESC_UNHEALTHY),
    ),
    (
        "unhealthy__reschedule_attempts_left__waits_for_its_replacement",
        _deployment(),
        _job(),
        [_alloc("a1", HEALTH_UNHEALTHY, client_status=ALLOC_CLIENT_FAILED)],
        NOW,
        WatchDecision(next_check_ns=NOW + 5 * MIN),
    ),
    (
        "unhealthy__no_attempts_left__fails_without_waiting_for_the_deadline",
        _deployment(),
        _job(reschedule=LIMITED),
        [_failed_again("a1")],
        NOW,
        WatchDecision(fail=DEPLOYMENT_DESC_UNHEALTHY),
    ),
    (
        "unhealthy__already_replaced__its_replacement_decides",
        _deployment(),
        _job(reschedule=LIMITED),
        [replace(_failed_again("a1"), next_allocation="a2"), _alloc("a2")],
        NOW,
        WatchDecision(next_check_ns=NOW + 5 * MIN),
    ),
    (
        "unhealthy__of_another_deployment__ignored",
        _deployment(progress_deadline_ns=0, require_progress_by_ns=0),
        _job(),
        [_alloc("a1", HEALTH_UNHEALTHY, deployment_id="d0")],
        NOW,
        WatchDecision(),
    ),
    (
        "deadline_passed__group_short__fails",
        _deployment(healthy_allocs=1),
        _job(),
        [_alloc("a1", HEALTH_HEALTHY)],
        NOW + 5 * MIN,
        WatchDecision(fail=DEPLOYMENT_DESC_PROGRESS_DEADLINE),
    ),
    (
        "deadline_passed__paused__never_fails",
        replace(_deployment(healthy_allocs=1), status=DEPLOYMENT_STATUS_PAUSED),
        _job(),
        [_alloc("a1", HEALTH_HEALTHY)],
        NOW + 5 * MIN,
        WatchDecision(),
    ),
    (
        "deadline_ahead__waits_until_it",
        _deployment(healthy_allocs=1),
        _job(),
        [_alloc("a1", HEALTH_HEALTHY)],
        NOW + 4 * MIN,
        WatchDecision(next_check_ns=NOW + 5 * MIN),
    ),
    (
        "deadline_passed__group_done__nothing_to_do",
        _deployment(healthy_allocs=3),
        _job(),
        [_alloc(f"a{i}", HEALTH_HEALTHY) for i in range(3)],
        NOW + 6 * MIN,
        WatchDecision(),
    ),
    (
        "deadline_passed__canaries_healthy_awaiting_promotion__survives",
        _deployment(desired_canaries=1, placed_canaries=("c1",), healthy_allocs=1),
        _job(),
        [_alloc("c1", HEALTH_HEALTHY, canary=True)],
        NOW + 6 * MIN,
        WatchDecision(),
    ),
    (
        "canaries_healthy__auto_promote__promotes",
        _deployment(desired_canaries=1, placed_canaries=("c1",), healthy_allocs=1, auto_promote=True),
        _job(),
        [_alloc("c1", HEALTH_HEALTHY, canary=True)],
        NOW,
        WatchDecision(promote=True, next_check_ns=NOW + 5 * MIN),
    ),
    (
        "canaries_healthy__no_auto_promote__waits_for_an_operator",
        _deployment(desired_canaries=1, placed_canaries=("c1",), healthy_allocs=1),
        _job(),
        [_alloc("c1", HEALTH_HEALTHY, canary=True)],
        NOW,
        WatchDecision(next_check_ns=NOW + 5 * MIN),
    ),
    (
        "canaries_not_all_healthy__auto_promote__waits",
        _deployment(desired_canaries=2, placed_canaries=("c1", "c2"), healthy_allocs=1, auto_promote=True),
        _job(),
        [_alloc("c1", HEALTH_HEALTHY, canary=True), _alloc("c2", canary=True)],
        NOW,
        WatchDecision(next_check_ns=NOW + 5 * MIN),
    ),
    (
        "healthy_canary_stopped__auto_promote__waits",
        _deployment(desired_canaries=1, placed_canaries=("c1",), healthy_allocs=1, auto_promote=True),
        _job(),
        [_alloc("c1", HEALTH_HEALTHY, canary=True, desired_status=ALLOC_DESIRED_STOP)],
        NOW,
        WatchDecision(next_check_ns=NOW + 5 * MIN),
    ),
    (
        "terminal_deployment__nothing",
        replace(_deployment(progress_deadline_ns=0), status=DEPLOYMENT_STATUS_FAILED),
        _job(),
        [_alloc("a1", HEALTH_UNHEALTHY)],
        NOW,
        WatchDecision(),
    ),
]


@pytest.mark.parametrize(
    ("deployment", "job", "allocs", "now", "expected"),
    [c[1:] for c in DECISIONS],
    ids=[c[0] for c in DECISIONS],
)
def test_decide(
    deployment: Deployment, job: Job, allocs: list[Allocation], now: int, expected: WatchDecision
) -> None:
    assert decide(deployment, job, (job,), allocs, now) == expected


# ---------------------------------------------------------------------------------------
# The auto-revert target


def _history(current: Job, *older: Job) -> tuple[Job, ...]:
    return (current, *older)


REVERTING = _deployment(auto_revert=True)


def test_failure__auto_revert__picks_the_latest_stable_version_that_differs() -> None:
    v0 = replace(_job(0, count=1), stable=True)
    v1 = replace(_job(1, count=2), stable=True)
    v2 = _job(2, count=3)

    result = failure(REVERTING, v2, _history(v2, v1, v0), DEPLOYMENT_DESC_UNHEALTHY)

    assert result.description == "Failed due to unhealthy allocations - rolling back to job version 1"
    assert result.reverted_version == 1
    assert result.revert_job is not None
    assert result.revert_job.groups[0].count == 2
    assert not result.revert_job.stable, "the copy is a new, unproven version"


def test_failure__stable_version_with_the_same_spec__not_rolling_back() -> None:
    v1 = replace(_job(1), stable=True)
    v2 = replace(_job(1), version=2)  # the same spec registered again

    result = failure(REVERTING, v2, _history(v2, v1), DEPLOYMENT_DESC_PROGRESS_DEADLINE)

    assert result.description == (
        "Failed due to progress deadline - not rolling back to stable job version 1"
        " as current job has same specification"
    )
    assert result.revert_job is None and result.reverted_version is None


def test_failure__no_stable_version__says_so() -> None:
    v0, v1 = _job(0, count=1), _job(1)

    result = failure(REVERTING, v1, _history(v1, v0), DEPLOYMENT_DESC_MARKED_FAILED)

    assert result.description == "Deployment marked as failed - no stable job version to auto revert to"
    assert result.revert_job is None


def test_failure__without_auto_revert__plain_description() -> None:
    v0 = replace(_job(0, count=1), stable=True)
    v1 = _job(1)

    result = failure(_deployment(), v1, _history(v1, v0), DEPLOYMENT_DESC_UNHEALTHY)

    assert result.description == DEPLOYMENT_DESC_UNHEALTHY and result.revert_job is None


@pytest.mark.parametrize(
    ("group", "expected"),
    [
        ({}, DEPLOYMENT_DESC_RUNNING),
        ({"desired_canaries": 1}, DEPLOYMENT_DESC_NEEDS_PROMOTION),
        ({"desired_canaries": 1, "auto_promote": True}, DEPLOYMENT_DESC_AUTO_PROMOTION),
        ({"desired_canaries": 1, "promoted": True}, DEPLOYMENT_DESC_RUNNING),
    ],
    ids=["no-canaries", "manual-promotion", "auto-promotion", "promoted"],
)
def test_running_description__says_who_promotes(group: dict[str, object], expected: str) -> None:
    assert running_description(_deployment(**group).task_groups) == expected
