"""The scheduler's side of deployments: which deployment governs a job version, when a
new one is made, and when one has succeeded. Pure: values in, values out.

The scheduler owns a deployment's *wants* (which groups, how many allocs and canaries it
waits for) and two of its endings: ``successful`` (nothing left to do and enough healthy
allocs) and ``cancelled`` (a newer version, or the job stopped). The state store owns the
counters; the leader's watcher (``drover.server.deployments``) owns ``failed``, auto-revert
and auto-promotion; operators own pause, resume, fail and promote. docs/deployments.md has
the whole picture.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from drover.scheduler.reconciler.generic import GroupResult
from drover.scheduler.reconciler.rollout import update_strategy
from drover.scheduler.reconciler.system import SystemDiff, SystemRollout
from drover.scheduler.structs import (
    DEPLOYMENT_DESC_AUTO_PROMOTION,
    DEPLOYMENT_DESC_NEEDS_PROMOTION,
    DEPLOYMENT_DESC_NEWER_JOB,
    DEPLOYMENT_DESC_RUNNING,
    DEPLOYMENT_DESC_STOPPED_JOB,
    DEPLOYMENT_DESC_SUCCESSFUL,
    DEPLOYMENT_STATUS_CANCELLED,
    DEPLOYMENT_STATUS_RUNNING,
    DEPLOYMENT_STATUS_SUCCESSFUL,
    JOB_TYPE_SERVICE,
    JOB_TYPE_SYSTEM,
    Allocation,
    Deployment,
    DeploymentState,
    DeploymentStatusUpdate,
    Job,
    TaskGroup,
)

__all__ = [
    "current_deployment",
    "deployment_complete",
    "rolling_groups",
    "running_description",
    "success",
    "system_complete",
    "system_rollout",
    "wanted_deployment",
    "wanted_system_deployment",
]


def current_deployment(
    job: Job, latest: Deployment | None
) -> tuple[Deployment | None, tuple[DeploymentStatusUpdate, ...]]:
    """(the deployment that governs ``job``'s current version, the cancellation of an
    outdated one). A successful or cancelled deployment governs nothing any more; a failed
    one still does (it keeps the failed version from rolling on)."""
    if latest is None:
        return None, ()
    outdated = job.stop or latest.job_version != job.version or latest.job_create_index != job.create_index
    if outdated:
        if not latest.active():
            return None, ()
        reason = DEPLOYMENT_DESC_STOPPED_JOB if job.stop else DEPLOYMENT_DESC_NEWER_JOB
        return None, (DeploymentStatusUpdate(latest.id, DEPLOYMENT_STATUS_CANCELLED, reason),)
    if latest.status in (DEPLOYMENT_STATUS_SUCCESSFUL, DEPLOYMENT_STATUS_CANCELLED):
        return None, ()
    return latest, ()


def rolling_groups(job: Job, groups: Iterable[TaskGroup]) -> list[TaskGroup]:
    """The groups a deployment covers: a service or system job's groups with a non-empty
    update block and something to run (sysbatch and batch work has no health to wait for)."""
    if job.type not in (JOB_TYPE_SERVICE, JOB_TYPE_SYSTEM) or job.stop or job.is_template():
        return []
    out = []
    for group in groups:
        strategy = update_strategy(job, group)
        if strategy is not None and not strategy.is_empty() and group.count > 0:
            out.append(group)
    return out


def running_description(states: Mapping[str, DeploymentState]) -> str:
    """Nomad's running description: whether canaries wait for an operator or for themselves."""
    canary_groups = [s for s in states.values() if s.desired_canaries > 0 and not s.promoted]
    if not canary_groups:
        return DEPLOYMENT_DESC_RUNNING
    if all(s.auto_promote for s in canary_groups):
        return DEPLOYMENT_DESC_AUTO_PROMOTION
    return DEPLOYMENT_DESC_NEEDS_PROMOTION


def _group_state(
    job: Job, group: TaskGroup, *, desired_total: int, desired_canaries: int = 0
) -> DeploymentState:
    """A rolling group's state in a new deployment: its update block's settings, its wants."""
    strategy = update_strategy(job, group)
    assert strategy is not None  # rolling_groups only
    return DeploymentState(
        auto_revert=strategy.auto_revert,
        auto_promote=strategy.auto_promote,
        progress_deadline_ns=strategy.progress_deadline_ns,
        desired_canaries=desired_canaries,
        desired_total=desired_total,
    )


def _new_deployment(job: Job, states: Mapping[str, DeploymentState], new_id: str, now_ns: int) -> Deployment:
    """A running deployment of ``job``'s current version over ``states``' groups."""
    return Deployment(
        id=new_id,
        namespace=job.namespace,
        job_id=job.id,
        job_version=job.version,
        job_modify_index=job.job_modify_index,
        job_create_index=job.create_index,
        task_groups=states,
        status=DEPLOYMENT_STATUS_RUNNING,
        status_description=running_description(states),
        eval_priority=job.priority,
        create_time_ns=now_ns,
        modify_time_ns=now_ns,
    )


def wanted_deployment(
    job: Job,
    groups: Iterable[TaskGroup],
    results: Mapping[str, GroupResult],
    allocs: Iterable[Allocation],
    current: Deployment | None,
    *,
    new_id: str,
    now_ns: int,
) -> Deployment | None:
    """The deployment this pass must write, or None: a new one when a rolling group's spec
    changes (destructive or in-place updates, canaries) or its version has no allocs yet
    (a first run), as Nomad's createDeployment; or the current one when a group's wants
    grew (a group added, a count changed, canaries asked for). Re-evaluating an unchanged
    job makes none."""
    rolling = rolling_groups(job, groups)
    if not rolling:
        return None
    if current is None:
        has_version = {a.task_group for a in allocs if a.job_version == job.version}
        if not any(
            results[g.name].update_destructive
            or results[g.name].update_inplace
            or results[g.name].desired_canaries
            or g.name not in has_version
            for g in rolling
        ):
            return None
        states = {
            g.name: _group_state(
                job, g, desired_total=g.count, desired_canaries=results[g.name].desired_canaries
            )
            for g in rolling
        }
        return _new_deployment(job, states, new_id, now_ns)
    if not current.active():
        return None
    groups_now = dict(current.task_groups)
    changed = False
    for g in rolling:
        have = groups_now.get(g.name)
        want = _group_state(job, g, desired_total=g.count, desired_canaries=results[g.name].desired_canaries)
        if have is None:
            groups_now[g.name] = want
            changed = True
        elif have.desired_total != want.desired_total or (
            not have.promoted and want.desired_canaries > have.desired_canaries
        ):
            groups_now[g.name] = replace(
                have,
                desired_total=want.desired_total,
                desired_canaries=max(have.desired_canaries, want.desired_canaries),
            )
            changed = True
    if not changed:
        return None
    return replace(current, task_groups=groups_now, modify_time_ns=now_ns)


def deployment_complete(deployment: Deployment, results: Mapping[str, GroupResult]) -> bool:
    """Every group of ``deployment`` has nothing left to do, has as many healthy allocs as
    it wants and, with canaries, was promoted (Nomad's isDeploymentComplete)."""
    if deployment.status != DEPLOYMENT_STATUS_RUNNING:
        return False
    for name, state in deployment.task_groups.items():
        result = results.get(name)
        if result is not None and result.work_left:
            return False
        if state.desired_canaries > 0 and not state.promoted:
            return False
        if state.healthy_allocs < max(state.desired_total, state.desired_canaries):
            return False
    return True


def success(deployment: Deployment) -> DeploymentStatusUpdate:
    return DeploymentStatusUpdate(deployment.id, DEPLOYMENT_STATUS_SUCCESSFUL, DEPLOYMENT_DESC_SUCCESSFUL)


# ---------------------------------------------------------------------------------------
# System jobs: one deployment per version over every node the job runs on (Nomad 1.11's
# system deployments, without canaries: a system group's canary is refused by validation).


def system_rollout(
    job: Job, deployment: Deployment | None, allocs: Iterable[Allocation]
) -> dict[str, SystemRollout]:
    """Per deployed group, the nodes whose new alloc still waits for its health verdict,
    and whether the rollout is blocked (paused, failed, or a live alloc unhealthy)."""
    if deployment is None:
        return {}
    blocked_all = not deployment.active() or deployment.status != DEPLOYMENT_STATUS_RUNNING
    waiting: dict[str, set[str]] = {}
    unhealthy: set[str] = set()
    for alloc in allocs:
        if alloc.deployment_id != deployment.id or alloc.terminal():
            continue
        health = alloc.deployment_status.health if alloc.deployment_status is not None else ""
        if not health:
            waiting.setdefault(alloc.task_group, set()).add(alloc.node_id)
        elif alloc.deployment_status is not None and alloc.deployment_status.is_unhealthy():
            unhealthy.add(alloc.task_group)
    return {
        name: SystemRollout(
            waiting=frozenset(waiting.get(name, ())), blocked=blocked_all or name in unhealthy
        )
        for name in deployment.task_groups
    }


def wanted_system_deployment(
    job: Job,
    diff: SystemDiff,
    allocs: Iterable[Allocation],
    current: Deployment | None,
    desired_totals: Mapping[str, int],
    *,
    new_id: str,
    now_ns: int,
) -> Deployment | None:
    """A new deployment when a system job's version changes its allocs (destructive or
    in-place updates) or has none yet; its desired total per group is the number of allocs
    the job wants on the nodes it may run on."""
    rolling = [g for g in rolling_groups(job, job.groups) if desired_totals.get(g.name, 0) > 0]
    if not rolling or current is not None:
        return None
    has_version = {a.task_group for a in allocs if a.job_version == job.version}
    changing = {t.group for t in (*diff.update_destructive, *diff.update_inplace, *diff.deferred)}
    if not any(g.name in changing or g.name not in has_version for g in rolling):
        return None
    states = {g.name: _group_state(job, g, desired_total=desired_totals[g.name]) for g in rolling}
    return _new_deployment(job, states, new_id, now_ns)


def system_complete(deployment: Deployment, diff: SystemDiff) -> bool:
    """Nothing left to roll and every group healthy on every node it wants."""
    if deployment.status != DEPLOYMENT_STATUS_RUNNING:
        return False
    if diff.update_destructive or diff.update_inplace or diff.deferred or diff.place:
        return False
    return all(s.healthy_allocs >= s.desired_total for s in deployment.task_groups.values())
