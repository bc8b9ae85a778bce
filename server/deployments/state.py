"""How a deployment's record changes in the FSM: every writer goes through these.

The state store, not the scheduler, moves a deployment's counters (placed, healthy,
unhealthy) and its progress deadline, from the allocs the FSM commits and the health the
clients report: the scheduler only says what it wants (a deployment and its desired numbers),
so a scheduler working from an old snapshot can never roll a counter back. These functions
take the transaction and the entry's own values (index, the leader's timestamp) and nothing
else, as every FSM function must (docs/design.md, "FSM determinism").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Final

from drover.scheduler.structs import (
    DEPLOYMENT_STATUS_PAUSED,
    DEPLOYMENT_STATUS_RUNNING,
    DEPLOYMENT_STATUS_SUCCESSFUL,
    DEPLOYMENT_STATUSES,
    HEALTH_HEALTHY,
    HEALTH_UNHEALTHY,
    HEALTH_UNSET,
    Allocation,
    AllocDeploymentStatus,
    Deployment,
    DeploymentState,
    DeploymentStatusUpdate,
)
from drover.server.state_store import Txn

__all__ = [
    "TERMINAL_NO_FAIL",
    "TERMINAL_NO_PAUSE",
    "TERMINAL_NO_PROMOTE",
    "TERMINAL_NO_RESUME",
    "TERMINAL_NO_SET_HEALTH",
    "DeploymentRefused",
    "count_alloc",
    "healthy_canaries",
    "mark_stable",
    "set_alloc_health",
    "set_status",
    "upsert_from_plan",
]

# Nomad's refusals for a deployment that is over (structs.ErrDeploymentTerminalNo*): the
# leader's checks (server/deployments/actions.py) and the FSM's (apply.py) say them alike.
TERMINAL_NO_FAIL: Final = "Cannot fail terminal deployment"
TERMINAL_NO_PAUSE: Final = "Cannot pause terminal deployment"
TERMINAL_NO_RESUME: Final = "Cannot resume terminal deployment"
TERMINAL_NO_PROMOTE: Final = "Cannot promote terminal deployment"
TERMINAL_NO_SET_HEALTH: Final = "Cannot set health of allocations for a terminal deployment"


class DeploymentRefused(Exception):
    """A change the deployment's state does not allow (the FSM turns it into a rejected
    entry, the endpoint into FAILED_PRECONDITION)."""


def upsert_from_plan(txn: Txn, wanted: Deployment, index: int, now_ns: int) -> Deployment:
    """Store the scheduler's deployment. A deployment already stored keeps what the store
    owns (counters, placed canaries, progress deadline, promotion, status once it is
    terminal or paused): the scheduler read an older snapshot (Nomad's MergeClientValues)."""
    old = txn.deployment(wanted.id)
    if old is None:
        stored = replace(
            wanted, create_index=index, modify_index=index, create_time_ns=now_ns, modify_time_ns=now_ns
        )
        txn.put_deployment(stored)
        return stored
    groups: dict[str, DeploymentState] = {}
    for name, want in wanted.task_groups.items():
        have = old.task_groups.get(name)
        if have is None:
            groups[name] = want
            continue
        groups[name] = replace(
            want,
            promoted=have.promoted or want.promoted,
            placed_canaries=have.placed_canaries,
            placed_allocs=have.placed_allocs,
            healthy_allocs=have.healthy_allocs,
            unhealthy_allocs=have.unhealthy_allocs,
            require_progress_by_ns=have.require_progress_by_ns,
        )
    for name, have in old.task_groups.items():
        groups.setdefault(name, have)
    status, description = old.status, old.status_description
    if old.status == DEPLOYMENT_STATUS_RUNNING:
        status, description = wanted.status, wanted.status_description
    stored = replace(
        old,
        task_groups=groups,
        status=status,
        status_description=description,
        modify_index=index,
        modify_time_ns=now_ns,
    )
    txn.put_deployment(stored)
    return stored


def set_status(txn: Txn, update: DeploymentStatusUpdate, index: int, now_ns: int) -> Deployment:
    """Move a deployment to ``update.status``. A terminal deployment never changes again
    (a late pause or a second failure must not revive it); pause and resume restart the
    progress deadlines of the groups still rolling (Nomad #27804: a paused deployment never
    fails on its deadline, and resuming must not fail it at once). A deployment that
    succeeds marks its job version stable."""
    old = txn.deployment(update.deployment_id)
    if old is None:
        raise DeploymentRefused(f"deployment {update.deployment_id!r} not found")
    if update.status not in DEPLOYMENT_STATUSES:
        raise DeploymentRefused(f"unknown deployment status {update.status!r}")
    if not old.active():
        raise DeploymentRefused(f"deployment {old.id} is {old.status}: it can no longer change")
    groups = dict(old.task_groups)
    if update.status in (DEPLOYMENT_STATUS_PAUSED, DEPLOYMENT_STATUS_RUNNING) and update.status != old.status:
        groups = {
            name: replace(s, require_progress_by_ns=now_ns + s.progress_deadline_ns)
            if s.progress_deadline_ns and s.require_progress_by_ns
            else s
            for name, s in groups.items()
        }
    stored = replace(
        old,
        status=update.status,
        status_description=update.status_description,
        task_groups=groups,
        modify_index=index,
        modify_time_ns=now_ns,
    )
    txn.put_deployment(stored)
    if update.status == DEPLOYMENT_STATUS_SUCCESSFUL:
        mark_stable(txn, stored, index)
    return stored


def mark_stable(txn: Txn, deployment: Deployment, index: int) -> None:
    """The job version a successful deployment rolled out is stable: auto-revert goes
    back to it. Only the current job record and its history entry change."""
    key = (deployment.namespace, deployment.job_id)
    job = txn.job(key)
    if job is not None and job.version == deployment.job_version and not job.stable:
        txn.put_job(replace(job, stable=True, modify_index=index))
    txn.mark_version_stable(key, deployment.job_version)


def count_alloc(txn: Txn, old: Allocation | None, new: Allocation, now_ns: int) -> None:
    """A committed alloc that joins a deployment (new, or moved into it by an in-place
    update) counts as placed; a canary is recorded as one. The first placement of a group
    starts its progress deadline."""
    if not new.deployment_id or (old is not None and old.deployment_id == new.deployment_id):
        return
    deployment = txn.deployment(new.deployment_id)
    if deployment is None or not deployment.active():
        return
    state = deployment.task_groups.get(new.task_group)
    if state is None:
        return
    canary = new.deployment_status is not None and new.deployment_status.canary
    state = replace(
        state,
        placed_allocs=state.placed_allocs + 1,
        placed_canaries=(*state.placed_canaries, new.id) if canary else state.placed_canaries,
        require_progress_by_ns=state.require_progress_by_ns
        or (now_ns + state.progress_deadline_ns if state.progress_deadline_ns else 0),
    )
    txn.put_deployment(
        replace(
            deployment, task_groups={**deployment.task_groups, new.task_group: state}, modify_index=txn.index
        )
    )


def set_alloc_health(txn: Txn, alloc: Allocation, health: str, timestamp_ns: int, index: int) -> Allocation:
    """Record ``alloc``'s health in its deployment and move the counters as Nomad does:
    unset to healthy or unhealthy counts once; healthy to unhealthy moves one across;
    unhealthy to healthy changes nothing (a flapping alloc must not make a failing
    deployment look good). Healthy pushes the group's progress deadline forward. Returns
    the alloc with its new deployment status (the caller stores it)."""
    before = alloc.deployment_status or AllocDeploymentStatus()
    if health == before.health or health == HEALTH_UNSET:
        return alloc
    updated = replace(
        alloc,
        deployment_status=replace(before, health=health, timestamp_ns=timestamp_ns, modify_index=index),
    )
    deployment = txn.deployment(alloc.deployment_id) if alloc.deployment_id else None
    if deployment is None or not deployment.active():
        return updated
    state = deployment.task_groups.get(alloc.task_group)
    if state is None:
        return updated
    healthy, unhealthy = state.healthy_allocs, state.unhealthy_allocs
    progress_by = state.require_progress_by_ns
    if before.health == HEALTH_UNSET and health == HEALTH_HEALTHY:
        healthy += 1
        if state.progress_deadline_ns:
            progress_by = max(progress_by, timestamp_ns + state.progress_deadline_ns)
    elif before.health == HEALTH_UNSET and health == HEALTH_UNHEALTHY:
        unhealthy += 1
    elif before.health == HEALTH_HEALTHY and health == HEALTH_UNHEALTHY:
        healthy, unhealthy = max(0, healthy - 1), unhealthy + 1
    else:  # unhealthy -> healthy
        return updated
    state = replace(
        state, healthy_allocs=healthy, unhealthy_allocs=unhealthy, require_progress_by_ns=progress_by
    )
    txn.put_deployment(
        replace(
            deployment,
            task_groups={**deployment.task_groups, alloc.task_group: state},
            modify_index=index,
        )
    )
    return updated


def healthy_canaries(state: DeploymentState, alloc: Callable[[str], Allocation | None]) -> list[Allocation]:
    """The group's placed canaries that count towards its promotion: still there, live and
    healthy. The watcher's auto-promotion and the FSM's promote check count the same ones,
    so the watcher never proposes a promotion the FSM refuses."""
    out = []
    for alloc_id in state.placed_canaries:
        canary = alloc(alloc_id)
        status = canary.deployment_status if canary is not None else None
        if canary is not None and status is not None and not canary.terminal() and status.is_healthy():
            out.append(canary)
    return out
