"""What the deployment watcher decides about one active deployment: state in, decision out.

Pure: the deployment, its job (current version and tracked history), the job's allocs and
``now`` come in; a ``WatchDecision`` comes out. No clock, no store, no raft. The watcher
(server/deployments/watcher.py) and the operator RPCs (server/deployments/actions.py) turn
decisions into raft entries; this module only says what must happen, so the rules can be
read, and tested, as a table (tests/unit/test_deployment_decide.py).

The rules are Nomad's deployment watcher's (``handleAllocUpdate``, ``shouldFail``,
``doneGroups``, ``autoPromoteDeployment``, ``handleRollbackValidity``):

* an unhealthy alloc fails the deployment at once when its group has no progress deadline,
  or when its reschedule policy allows no further attempt (Nomad #17341: waiting for the
  deadline would only waste it); otherwise its replacement gets the chance;
* a passed progress deadline fails it when the group has not made it (fewer healthy allocs
  than its unpromoted canaries, or than its total), never while paused (Nomad #27804);
* it is promoted automatically once every canary group asks for it and has exactly its
  desired canaries healthy;
* a failure with auto-revert goes back to the newest stable version, unless that version's
  spec is the current one's (no revert loops).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from drover.scheduler.reconciler.reschedule import next_reschedule
from drover.scheduler.structs import (
    DEPLOYMENT_DESC_PROGRESS_DEADLINE,
    DEPLOYMENT_DESC_UNHEALTHY,
    DEPLOYMENT_STATUS_PAUSED,
    DEPLOYMENT_STATUS_RUNNING,
    Allocation,
    Deployment,
    DeploymentState,
    Job,
)
from drover.server.deployments.state import healthy_canaries
from drover.server.fsm import _spec_equal

__all__ = [
    "Failure",
    "WatchDecision",
    "decide",
    "failure",
    "group_done",
]


@dataclass(frozen=True, slots=True)
class Failure:
    """How a deployment fails: its full status description (rollback suffix included) and,
    for an auto-revert, the stable spec to register as a new version (``stable`` cleared:
    the copy has not been proven yet) and the version number it came from."""

    description: str
    revert_job: Job | None = None
    reverted_version: int | None = None


@dataclass(frozen=True, slots=True)
class WatchDecision:
    """``fail``: the deployment must fail, with this base description ("Failed due to ...").
    ``promote``: promote every group now. ``next_check_ns``: the earliest time the watcher
    must look again even if nothing changes (a progress deadline); 0 for none."""

    fail: str = ""
    promote: bool = False
    next_check_ns: int = 0


def decide(
    deployment: Deployment,
    job: Job | None,
    versions: Sequence[Job],
    allocs: Iterable[Allocation],
    now_ns: int,
) -> WatchDecision:
    """The watcher's decision on ``deployment`` at ``now_ns``. ``allocs``: the job's allocs
    (those of other deployments are ignored); ``versions``: the tracked history."""
    if not deployment.active():
        return WatchDecision()
    mine = [a for a in allocs if a.deployment_id == deployment.id]
    if _fails_on_health(deployment, _job_at(deployment.job_version, job, versions), mine):
        return WatchDecision(fail=DEPLOYMENT_DESC_UNHEALTHY)
    if deployment.status == DEPLOYMENT_STATUS_PAUSED:
        return WatchDecision()
    if _fails_on_deadline(deployment, mine, now_ns):
        return WatchDecision(fail=DEPLOYMENT_DESC_PROGRESS_DEADLINE)
    return WatchDecision(
        promote=deployment.status == DEPLOYMENT_STATUS_RUNNING and _auto_promotable(deployment, mine),
        next_check_ns=_next_deadline(deployment, mine, now_ns),
    )


def failure(deployment: Deployment, job: Job | None, versions: Sequence[Job], description: str) -> Failure:
    """The failure of ``deployment`` with ``description``, reverting when any of its groups
    has auto_revert (Nomad's operator fail does the same; one job version rolls all groups)."""
    if job is None or not any(s.auto_revert for s in deployment.task_groups.values()):
        return Failure(description)
    stable = next((v for v in versions if v.stable), None)
    if stable is None:
        return Failure(f"{description} - no stable job version to auto revert to")
    if _spec_equal(stable, job):
        return Failure(
            f"{description} - not rolling back to stable job version {stable.version}"
            " as current job has same specification"
        )
    return Failure(
        f"{description} - rolling back to job version {stable.version}",
        revert_job=replace(stable, stable=False),
        reverted_version=stable.version,
    )


def group_done(state: DeploymentState, healthy_live: int) -> bool:
    """Nothing left to wait for in the group (Nomad's doneGroups): promoted or without
    canaries, and at least its total healthy among its live allocs."""
    return (state.promoted or state.desired_canaries == 0) and healthy_live >= state.desired_total


def _job_at(version: int, job: Job | None, versions: Sequence[Job]) -> Job | None:
    """The spec the deployment rolls out (its reschedule policies), else the current one."""
    return next((v for v in versions if v.version == version), job)


def _fails_on_health(deployment: Deployment, spec: Job | None, allocs: Sequence[Allocation]) -> bool:
    for alloc in allocs:
        status = alloc.deployment_status
        state = deployment.task_groups.get(alloc.task_group)
        if status is None or not status.is_unhealthy() or state is None:
            continue
        if state.progress_deadline_ns == 0:
            return True
        if alloc.next_allocation:
            continue  # replaced already: its replacement carries the attempt count on
        group = spec.lookup_group(alloc.task_group) if spec is not None else None
        if not next_reschedule(alloc, group.reschedule if group is not None else None).eligible:
            return True
    return False


def _healthy_live(allocs: Sequence[Allocation], group: str) -> int:
    return sum(
        1
        for a in allocs
        if a.task_group == group
        and not a.terminal()
        and a.deployment_status is not None
        and a.deployment_status.is_healthy()
    )


def _made_it(state: DeploymentState) -> bool:
    """Enough healthy allocs to survive a passed deadline (Nomad's shouldFail): a group
    waiting for promotion needs its canaries healthy, any other its total."""
    if state.desired_canaries > 0 and not state.promoted:
        return state.healthy_allocs >= state.desired_canaries
    return state.healthy_allocs >= state.desired_total


def _fails_on_deadline(deployment: Deployment, allocs: Sequence[Allocation], now_ns: int) -> bool:
    for name, state in deployment.task_groups.items():
        passed = (
            state.progress_deadline_ns
            and state.require_progress_by_ns
            and now_ns >= state.require_progress_by_ns
        )
        if passed and not group_done(state, _healthy_live(allocs, name)) and not _made_it(state):
            return True
    return False


def _next_deadline(deployment: Deployment, allocs: Sequence[Allocation], now_ns: int) -> int:
    """The earliest deadline still ahead of a group not done. A deadline already passed
    that the group survived (canaries waiting for an operator) is not looked at again:
    promotion sets a new one."""
    due = [
        state.require_progress_by_ns
        for name, state in deployment.task_groups.items()
        if state.progress_deadline_ns
        and state.require_progress_by_ns > now_ns
        and not group_done(state, _healthy_live(allocs, name))
    ]
    return min(due, default=0)


def _auto_promotable(deployment: Deployment, allocs: Sequence[Allocation]) -> bool:
    """Every canary group not yet promoted has auto_promote and exactly its desired
    canaries healthy (a replaced unhealthy canary no longer blocks it: Nomad #14001)."""
    if not deployment.requires_promotion():
        return False
    by_id = {a.id: a for a in allocs}
    for state in deployment.task_groups.values():
        if state.desired_canaries == 0 or state.promoted:
            continue
        if not state.auto_promote:
            return False
        if len(healthy_canaries(state, by_id.get)) != state.desired_canaries:
            return False
    return True
