"""The FSM's appliers of the three deployment entries: status update, promotion, manual health.

Each is an ``apply_<entry>(txn, entry, index)`` as server/fsm.py's table wants, and follows
its rules: the entry carries every time and ID (``updated_at_ns``, the eval), nothing here
reads a clock (tests/unit/test_deployment_fsm.py greps for it), and a refusal raises the
FSM's ``EntryRejected`` so every server refuses the same entry alike.

A failure with auto-revert registers the stable spec in the same entry as the failure,
through ``apply_job_register`` itself: a leader killed between the two could otherwise
leave a failed deployment that was never reverted.

server/fsm.py imports this module for its table, so the FSM's names are imported where
they are used, not at the top (the import would be circular).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from drover.scheduler.structs import (
    DEPLOYMENT_DESC_RUNNING,
    DEPLOYMENT_STATUS_RUNNING,
    HEALTH_HEALTHY,
    HEALTH_UNHEALTHY,
    Deployment,
    DeploymentStatusUpdate,
    Evaluation,
)
from drover.server.codec import from_proto
from drover.server.deployments.state import (
    TERMINAL_NO_PROMOTE,
    TERMINAL_NO_SET_HEALTH,
    DeploymentRefused,
    healthy_canaries,
    set_alloc_health,
    set_status,
)
from drover.server.state_store import Txn
from drover.v1 import raft_pb2, structs_pb2

__all__ = [
    "apply_deployment_alloc_health",
    "apply_deployment_promote",
    "apply_deployment_status_update",
]


def _refused(message: str) -> Exception:
    from drover.server.fsm import EntryRejected

    return EntryRejected(message)


def _missing(message: str) -> Exception:
    from drover.server.fsm import EntryTargetMissing

    return EntryTargetMissing(message)


def _deployment(txn: Txn, deployment_id: str) -> Deployment:
    deployment = txn.deployment(deployment_id)
    if deployment is None:
        raise _missing(f"deployment {deployment_id!r} not found")
    return deployment


def _set_status(txn: Txn, msg: structs_pb2.DeploymentStatusUpdate, index: int, now_ns: int) -> None:
    try:
        set_status(txn, from_proto(msg, DeploymentStatusUpdate), index, now_ns)
    except DeploymentRefused as exc:
        raise _refused(str(exc)) from exc


def _revert_and_eval(txn: Txn, entry: Any, index: int) -> Any:
    """The entry's auto-revert job, registered as a new version exactly as a job register
    is (with its eval), or else its eval alone. Returns the register's outcome, if any."""
    if entry.HasField("job"):
        from drover.server.fsm import apply_job_register

        register = raft_pb2.JobRegisterEntry(job=entry.job)
        if entry.HasField("eval"):
            register.eval.CopyFrom(entry.eval)
        return apply_job_register(txn, register, index)
    if entry.HasField("eval"):
        txn.put_eval(from_proto(entry.eval, Evaluation))
    return None


def apply_deployment_status_update(txn: Txn, entry: raft_pb2.DeploymentStatusUpdateEntry, index: int) -> Any:
    """Pause, resume or fail a deployment; a failure may carry its auto-revert job."""
    _deployment(txn, entry.update.deployment_id)
    _set_status(txn, entry.update, index, entry.updated_at_ns)
    return _revert_and_eval(txn, entry, index)


def apply_deployment_promote(txn: Txn, entry: raft_pb2.DeploymentPromoteEntry, index: int) -> Any:
    """Promote the canaries of ``entry.groups`` (every group when empty), as Nomad's
    UpdateDeploymentPromotion: each group must have as many healthy, live, placed canaries
    as it wants, or nothing is promoted."""
    deployment = _deployment(txn, entry.deployment_id)
    if not deployment.active():
        raise _refused(TERMINAL_NO_PROMOTE)
    unknown = [g for g in entry.groups if g not in deployment.task_groups]
    if unknown:
        raise _refused(f"deployment {deployment.id} has no task group {unknown[0]!r}")
    names = set(entry.groups) or set(deployment.task_groups)
    promotable = []
    short = []
    for name in sorted(names):
        state = deployment.task_groups[name]
        canaries = healthy_canaries(state, txn.alloc)
        promotable.extend(canaries)
        healthy = len(canaries)
        if state.desired_canaries and healthy < state.desired_canaries:
            short.append(f'Task group "{name}" has {healthy}/{state.desired_canaries} healthy allocations')
    if short:
        raise _refused("; ".join(short))
    now_ns = entry.updated_at_ns
    groups = {
        name: replace(
            state,
            promoted=True,
            require_progress_by_ns=now_ns + state.progress_deadline_ns
            if state.progress_deadline_ns and state.require_progress_by_ns
            else state.require_progress_by_ns,
        )
        if name in names
        else state
        for name, state in deployment.task_groups.items()
    }
    promoted = replace(deployment, task_groups=groups, modify_index=index, modify_time_ns=now_ns)
    if not promoted.requires_promotion() and promoted.status == DEPLOYMENT_STATUS_RUNNING:
        promoted = replace(promoted, status_description=DEPLOYMENT_DESC_RUNNING)
    txn.put_deployment(promoted)
    for alloc in promotable:
        assert alloc.deployment_status is not None
        txn.put_alloc(
            replace(
                alloc,
                deployment_status=replace(alloc.deployment_status, canary=False, modify_index=index),
                modify_index=index,
                alloc_modify_index=index,
            )
        )
    if entry.HasField("eval"):
        txn.put_eval(from_proto(entry.eval, Evaluation))
    return None


def apply_deployment_alloc_health(txn: Txn, entry: raft_pb2.DeploymentAllocHealthEntry, index: int) -> Any:
    """Health set by hand. Every alloc must be the deployment's and the deployment active;
    an entry with ``update`` (some alloc unhealthy) also fails the deployment, with its
    auto-revert job if any, after the counters moved."""
    deployment = _deployment(txn, entry.deployment_id)
    if not deployment.active():
        raise _refused(TERMINAL_NO_SET_HEALTH)
    overlap = set(entry.healthy_alloc_ids) & set(entry.unhealthy_alloc_ids)
    if overlap:
        raise _refused(f"alloc {sorted(overlap)[0]!r} is both healthy and unhealthy")
    wanted = [(i, HEALTH_HEALTHY) for i in entry.healthy_alloc_ids]
    wanted += [(i, HEALTH_UNHEALTHY) for i in entry.unhealthy_alloc_ids]
    for alloc_id, health in wanted:
        alloc = txn.alloc(alloc_id)
        if alloc is None:
            raise _missing(f"alloc {alloc_id!r} not found")
        if alloc.deployment_id != deployment.id:
            raise _refused(f"alloc {alloc_id!r} is not part of deployment {deployment.id!r}")
        updated = set_alloc_health(txn, alloc, health, entry.updated_at_ns, index)
        if updated is not alloc:
            txn.put_alloc(replace(updated, modify_index=index))
    if entry.HasField("update"):
        _set_status(txn, entry.update, index, entry.updated_at_ns)
    return _revert_and_eval(txn, entry, index)
