"""The finite state machine: one raft log entry in, the next state out.

Rules (docs/design.md, "FSM determinism"): ``apply`` depends only on the entry and the state
before it. No clock, no randomness, no I/O here: IDs, timestamps and evaluations were
decided by the leader and travel inside the entry. tests/unit/test_purity.py greps this
module for the calls that would break that.

Each entry type has one ``apply_<type>(txn, payload, index)`` function. ``FSM.apply``
never raises: a failing entry is logged and leaves the state untouched (the transaction is
dropped) on every server alike, so one bad entry cannot wedge raft's apply loop.

A batch entry (``ENTRY_TYPE_BATCH``, made by server/write_batch.py) carries several
requests. Each is applied in order in a transaction of its own on the state the one before
it left, exactly as if it were an entry of its own at the batch's index: one refused
request leaves the others applied. The batch reaches the store as one commit at its index,
so a blocking query never sees half a batch at an index it would then never wake past.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Final

import structlog
from google.protobuf.message import DecodeError, Message

from drover.scheduler._records import replacer
from drover.scheduler.structs import (
    ALLOC_CLIENT_UNKNOWN,
    JOB_BOOKKEEPING_FIELDS,
    JOB_STATUS_DEAD,
    JOB_STATUS_PENDING,
    MAX_NODE_EVENTS,
    NODE_ELIGIBLE,
    NODE_INELIGIBLE,
    NODE_STATUS_DISCONNECTED,
    NODE_STATUS_DOWN,
    NODE_STATUS_READY,
    Allocation,
    AllocCheckStatus,
    AllocStateChange,
    Deployment,
    DeploymentStatusUpdate,
    DesiredTransition,
    DrainStrategy,
    Evaluation,
    Job,
    Node,
    NodeEvent,
    PeriodicLaunch,
    SchedulerConfig,
    ServerMember,
    TaskState,
)
from drover.server import deployments
from drover.server.acl.records import TOKEN_MANAGEMENT, TOKEN_TYPES, ACLPolicy, ACLTokenRecord
from drover.server.codec import from_proto
from drover.server.deployments.apply import (
    apply_deployment_alloc_health,
    apply_deployment_promote,
    apply_deployment_status_update,
)
from drover.server.snapshot import from_snapshot
from drover.server.state_store import TABLES, Changes, StateStore, Tables, Txn
from drover.v1 import raft_pb2

if TYPE_CHECKING:
    from drover.server.events import EventBuffer

log = structlog.get_logger("drover.fsm")

ET = raft_pb2.EntryType
# Looked up once: an EntryType attribute goes through the enum wrapper's __getattr__.
_SNAPSHOT_RESTORE: Final = ET.ENTRY_TYPE_SNAPSHOT_RESTORE
_BATCH: Final = ET.ENTRY_TYPE_BATCH


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What a proposer learns about its entry: the index, and a refusal if apply refused."""

    index: int
    error: str = ""
    # The refusal was "no such object" rather than a conflict with the current state.
    not_found: bool = False
    # Set by entries whose outcome the caller needs (e.g. the job version registered).
    value: Any = None


@dataclass(frozen=True, slots=True)
class BatchApplied:
    """The ``value`` of a batch entry's result: one result per request, in entry order."""

    results: tuple[ApplyResult, ...]


class EntryRejected(Exception):
    """Apply refused the entry deterministically (e.g. a failed check-and-set)."""


class EntryTargetMissing(EntryRejected):
    """The entry names an object that no longer exists."""


# ---------------------------------------------------------------------------------------
# Helpers shared by the apply functions


def _require_id(value: str, what: str) -> None:
    """The leader never proposes an object without an ID; refuse one rather than key it by ''."""
    if not value:
        raise EntryRejected(f"{what} without an ID")


def _put_evals(txn: Txn, evals: Any) -> None:
    for msg in evals:
        _require_id(msg.id, "eval")
        txn.put_eval(from_proto(msg, Evaluation))


def _add_event(node: Node, event_msg: Any, index: int) -> Node:
    if not event_msg.message:
        return node
    event = replace(from_proto(event_msg, NodeEvent), create_index=index)
    return replace(node, events=(*node.events, event)[-MAX_NODE_EVENTS:])


def _put_changed_node(txn: Txn, node: Node, event_msg: Any, evals: Any, index: int) -> None:
    """How every node entry ends: the node at this index with the entry's event, and the
    evaluations the leader created with the change, in the same transaction."""
    txn.put_node(_add_event(replace(node, modify_index=index), event_msg, index))
    _put_evals(txn, evals)


# Every other field of a Job, as one tuple (what dataclass equality compares, minus those).
_job_spec = attrgetter(*(f.name for f in fields(Job) if f.name not in JOB_BOOKKEEPING_FIELDS))


def _spec_equal(a: Job, b: Job) -> bool:
    """Whether two registrations describe the same job (bookkeeping fields ignored)."""
    return a.__class__ is b.__class__ and _job_spec(a) == _job_spec(b)


# ---------------------------------------------------------------------------------------
# Apply functions, one per entry type


def _check_launch(txn: Txn, job: Job, launch: PeriodicLaunch) -> None:
    """A periodic launch is applied at most once per slot, and only for a live periodic parent.

    The launch record only moves forward: an entry whose slot is at or before the recorded
    one is refused, so two leaders (pysyncobj may briefly have two) or a retried proposal
    can never launch the same slot twice.
    """
    parent = txn.job((launch.namespace, launch.job_id))
    if parent is None or parent.stop:
        raise EntryRejected(f"periodic launch: parent job {launch.job_id!r} is stopped or gone")
    if not parent.is_periodic_active():
        raise EntryRejected(f"periodic launch: job {launch.job_id!r} is not an active periodic job")
    if job.parent_id != launch.job_id or job.namespace != launch.namespace:
        raise EntryRejected(f"periodic launch: child {job.id!r} does not belong to {launch.job_id!r}")
    recorded = txn.periodic_launch((launch.namespace, launch.job_id))
    if recorded is not None and launch.launch_ns <= recorded.launch_ns:
        raise EntryRejected(
            f"periodic launch of {launch.job_id!r} at {launch.launch_ns} refused:"
            f" already launched up to {recorded.launch_ns}"
        )
    if txn.job((job.namespace, job.id)) is not None:
        raise EntryRejected(f"periodic launch: child job {job.id!r} already exists")


def _check_dispatch(txn: Txn, job: Job) -> None:
    """A new dispatched child needs its parameterized parent, still running."""
    parent = txn.job((job.namespace, job.parent_id))
    if parent is None or parent.stop:
        raise EntryRejected(f"dispatch: parent job {job.parent_id!r} is stopped or gone")
    if not parent.is_parameterized():
        raise EntryRejected(f"dispatch: job {job.parent_id!r} is not a parameterized job")


def apply_job_register(txn: Txn, entry: raft_pb2.JobRegisterEntry, index: int) -> Any:
    _require_id(entry.job.id, "job")
    job = from_proto(entry.job, Job)
    key = (job.namespace, job.id)
    old = txn.job(key)
    launch: PeriodicLaunch | None = None
    if entry.HasField("launch"):
        launch = from_proto(entry.launch, PeriodicLaunch)
        _check_launch(txn, job, launch)
    elif old is None and job.dispatched and job.parent_id:
        _check_dispatch(txn, job)
        # An index lookup (state_store ``dispatch_tokens``), not a scan of every child.
        twin = txn.dispatched_child(job.namespace, job.parent_id, job.dispatch_idempotency_token)
        if twin is not None:
            # Two dispatches with one token raced past the endpoint's check: the first
            # child answers for both, nothing is written.
            return {
                "existing_job_id": twin.id,
                "version": twin.version,
                "job_modify_index": twin.job_modify_index,
            }
    if old is None:
        job = _new_job(
            job,
            version=0,
            status=JOB_STATUS_PENDING,
            create_index=index,
            modify_index=index,
            job_modify_index=index,
        )
        changed = True
    else:
        changed = not _spec_equal(old, job) or old.stop != job.stop
        job = _updated_job(
            job,
            # The status is the store's, never the submitter's (docs/field-reports.md#field-report-2).
            status=old.status,
            version=old.version + 1 if changed else old.version,
            stable=old.stable and not changed,
            create_index=old.create_index,
            modify_index=index,
            job_modify_index=index if changed else old.job_modify_index,
            submit_time_ns=job.submit_time_ns if changed else old.submit_time_ns,
        )
    txn.put_job(job)
    if changed:
        txn.put_job_version(job)
    txn.ensure_summary(job)
    if launch is not None:
        recorded = txn.periodic_launch((launch.namespace, launch.job_id))
        create_index = recorded.create_index if recorded is not None else index
        txn.put_periodic_launch(replace(launch, create_index=create_index, modify_index=index))
    if entry.HasField("eval"):
        ev = from_proto(entry.eval, Evaluation)
        txn.put_eval(_eval_for_job(ev, job_modify_index=job.job_modify_index))
    return {"version": job.version, "job_modify_index": job.job_modify_index}


# Specialised ``dataclasses.replace`` for the register path (same values, less overhead).
_new_job = replacer(Job, "version", "status", "create_index", "modify_index", "job_modify_index")
_updated_job = replacer(
    Job,
    "status",
    "version",
    "stable",
    "create_index",
    "modify_index",
    "job_modify_index",
    "submit_time_ns",
)
_eval_for_job = replacer(Evaluation, "job_modify_index")


def apply_job_deregister(txn: Txn, entry: raft_pb2.JobDeregisterEntry, index: int) -> Any:
    key = (entry.namespace, entry.job_id)
    job = txn.job(key)
    if job is None:
        raise EntryTargetMissing(f"job {entry.job_id!r} not found")
    if entry.purge:
        txn.delete_job(key)
    elif not job.stop:
        stopped = replace(job, stop=True, version=job.version + 1, modify_index=index, job_modify_index=index)
        txn.put_job(stopped)
        txn.put_job_version(stopped)
    if entry.HasField("eval"):
        ev = from_proto(entry.eval, Evaluation)
        txn.put_eval(replace(ev, job_modify_index=index))
    return None


def apply_node_register(txn: Txn, entry: raft_pb2.NodeRegisterEntry, index: int) -> Any:
    _require_id(entry.node.id, "node")
    node = from_proto(entry.node, Node)
    old = txn.node(node.id)
    if old is not None:
        # Drain and eligibility belong to operators, not to a re-registering client.
        node = replace(
            node,
            create_index=old.create_index,
            drain_strategy=old.drain_strategy,
            scheduling_eligibility=old.scheduling_eligibility,
            events=old.events,
        )
    else:
        node = replace(node, create_index=index, events=())
    event = raft_pb2.NodeUpdateStatusEntry()
    event.event.message = "Node registered" if old is None else "Node re-registered"
    event.event.subsystem = "Cluster"
    event.event.timestamp_ns = node.status_updated_at_ns
    _put_changed_node(txn, node, event.event, entry.evals, index)
    return None


def apply_node_deregister(txn: Txn, entry: raft_pb2.NodeDeregisterEntry, index: int) -> Any:
    for node_id in entry.node_ids:
        txn.delete_node(node_id)
    _put_evals(txn, entry.evals)
    return None


def _require_node(txn: Txn, node_id: str) -> Node:
    node = txn.node(node_id)
    if node is None:
        raise EntryTargetMissing(f"node {node_id!r} not found")
    return node


def apply_node_update_status(txn: Txn, entry: raft_pb2.NodeUpdateStatusEntry, index: int) -> Any:
    node = _require_node(txn, entry.node_id)
    if node.status != entry.status:
        unresponsive = (NODE_STATUS_DOWN, NODE_STATUS_DISCONNECTED)
        missed = node.last_missed_heartbeat_index
        if entry.status in unresponsive and node.status not in unresponsive:
            missed = index
        elif entry.status == NODE_STATUS_READY:
            missed = 0
        node = replace(
            node,
            status=entry.status,
            status_updated_at_ns=entry.updated_at_ns,
            last_missed_heartbeat_index=missed,
        )
    _put_changed_node(txn, node, entry.event, entry.evals, index)
    return None


def apply_node_update_drain(txn: Txn, entry: raft_pb2.NodeUpdateDrainEntry, index: int) -> Any:
    node = _require_node(txn, entry.node_id)
    if entry.completes_drain_started_at_ns and (
        node.drain_strategy is None
        or node.drain_strategy.started_at_ns != entry.completes_drain_started_at_ns
    ):
        raise EntryRejected("the drain this entry completes is no longer the node's")
    if entry.HasField("drain_strategy"):
        strategy = from_proto(entry.drain_strategy, DrainStrategy)
        node = replace(node, drain_strategy=strategy, scheduling_eligibility=NODE_INELIGIBLE)
    else:
        node = replace(node, drain_strategy=None)
        if entry.mark_eligible:
            node = replace(node, scheduling_eligibility=NODE_ELIGIBLE)
    _put_changed_node(txn, node, entry.event, entry.evals, index)
    return None


def apply_node_update_eligibility(txn: Txn, entry: raft_pb2.NodeUpdateEligibilityEntry, index: int) -> Any:
    node = _require_node(txn, entry.node_id)
    if node.drain_strategy is not None and entry.eligibility == NODE_ELIGIBLE:
        raise EntryRejected("can not set node eligible while it is draining")
    node = replace(node, scheduling_eligibility=entry.eligibility)
    _put_changed_node(txn, node, entry.event, entry.evals, index)
    return None


def apply_alloc_client_update(txn: Txn, entry: raft_pb2.AllocClientUpdateEntry, index: int) -> Any:
    if entry.node_id:
        reporter = txn.node(entry.node_id)
        if reporter is not None:
            txn.put_node(replace(reporter, last_alloc_update_index=index))
    for msg in entry.allocs:
        existing = txn.alloc(msg.id)
        if existing is None:
            continue  # garbage-collected meanwhile: nothing to update
        history = existing.state_history
        if msg.client_status and msg.client_status != existing.client_status:
            change = AllocStateChange(
                field="client_status", value=msg.client_status, time_ns=entry.updated_at_ns
            )
            history = (*history, change)[-10:]
        task_states = {name: from_proto(ts, TaskState) for name, ts in msg.task_states.items()}
        # A client's report carries all its alloc's checks (none: none yet); other updates none.
        checks = (
            tuple(from_proto(c, AllocCheckStatus) for c in msg.check_statuses)
            if entry.node_id
            else existing.check_statuses
        )
        updated = replace(
            existing,
            client_status=msg.client_status or existing.client_status,
            client_description=msg.client_description,
            task_states=task_states or existing.task_states,
            check_statuses=checks,
            state_history=history,
            modify_index=index,
            modify_time_ns=entry.updated_at_ns,
        )
        if _reports_health_of_current_deployment(msg, existing):
            health = msg.deployment_status
            updated = deployments.set_alloc_health(txn, updated, health.health, health.timestamp_ns, index)
        txn.put_alloc(updated)
    _put_evals(txn, entry.evals)
    return None


def _reports_health_of_current_deployment(msg: Any, existing: Allocation) -> bool:
    """A client's verdict counts only for the deployment it judged: an alloc moved into a
    newer deployment by an in-place update is judged afresh (the client names the
    deployment in ``deployment_id``)."""
    return (
        msg.HasField("deployment_status")
        and bool(msg.deployment_status.health)
        and bool(existing.deployment_id)
        and msg.deployment_id == existing.deployment_id
    )


def apply_eval_update(txn: Txn, entry: raft_pb2.EvalUpdateEntry, index: int) -> Any:
    _put_evals(txn, entry.evals)
    return None


def apply_eval_delete(txn: Txn, entry: raft_pb2.EvalDeleteEntry, index: int) -> Any:
    for eval_id in entry.eval_ids:
        txn.delete_eval(eval_id)
    for alloc_id in entry.alloc_ids:
        txn.delete_alloc(alloc_id)
    return None


def _updated_by_plan(
    alloc: Allocation,
    existing: Allocation,
    *,
    client_status: str,
    client_description: str,
    state_history: tuple[AllocStateChange, ...],
) -> Allocation:
    """A plan's new version of ``existing``: the plan does not own the task states the
    client reported or when the alloc was created, and the caller says which status wins."""
    return replace(
        alloc,
        client_status=client_status,
        client_description=client_description,
        task_states=existing.task_states,
        state_history=state_history,
        create_index=existing.create_index,
        create_time_ns=existing.create_time_ns,
    )


def apply_plan_results(txn: Txn, entry: raft_pb2.ApplyPlanResultsEntry, index: int) -> Any:
    # One int for every alloc of the entry: each read of the field makes a new one.
    updated_at = entry.updated_at_ns
    # The deployment first: the allocs below name it and are counted in it.
    if entry.HasField("deployment"):
        _require_id(entry.deployment.id, "deployment")
        deployments.upsert_from_plan(txn, from_proto(entry.deployment, Deployment), index, updated_at)
    for update in entry.deployment_updates:
        try:
            deployments.set_status(txn, from_proto(update, DeploymentStatusUpdate), index, updated_at)
        except deployments.DeploymentRefused as exc:
            # An operator ended it first (failed, paused): the operator's word stands.
            log.info("fsm.deployment_update_skipped", deployment_id=update.deployment_id, reason=str(exc))
    for stop in entry.allocs_stopped:
        existing = txn.alloc(stop.alloc_id)
        if existing is None:
            continue
        history = existing.state_history
        client_status = existing.client_status
        if stop.client_status and stop.client_status != client_status:
            client_status = stop.client_status
            change = AllocStateChange(field="client_status", value=client_status, time_ns=updated_at)
            history = (*history, change)[-10:]
        txn.put_alloc(
            replace(
                existing,
                desired_status=stop.desired_status,
                desired_description=stop.desired_description,
                client_status=client_status,
                state_history=history,
                followup_eval_id=stop.followup_eval_id or existing.followup_eval_id,
                modify_index=index,
                alloc_modify_index=index,
                modify_time_ns=updated_at,
            )
        )
    for msg in entry.allocs_upserted:
        _require_id(msg.id, "alloc")
        alloc = from_proto(msg, Allocation)
        existing = txn.alloc(alloc.id)
        if existing is not None and alloc.client_status == ALLOC_CLIENT_UNKNOWN != existing.client_status:
            # The one client status the server decides: its node stopped heartbeating.
            change = AllocStateChange(field="client_status", value=ALLOC_CLIENT_UNKNOWN, time_ns=updated_at)
            alloc = _updated_by_plan(
                alloc,
                existing,
                client_status=ALLOC_CLIENT_UNKNOWN,
                client_description=alloc.client_description
                or "alloc is unknown since its node is disconnected",
                state_history=(*existing.state_history, change)[-10:],
            )
        elif existing is not None:
            # An in-place update: the client owns its status fields.
            alloc = _updated_by_plan(
                alloc,
                existing,
                client_status=existing.client_status,
                client_description=existing.client_description,
                state_history=existing.state_history,
            )
        else:
            alloc = replace(alloc, create_index=index, create_time_ns=updated_at)
        if alloc.deployment_id and existing is not None and existing.deployment_id == alloc.deployment_id:
            # The client owns the health verdict; the plan may only keep it.
            alloc = replace(alloc, deployment_status=existing.deployment_status)
        deployments.count_alloc(txn, existing, alloc, updated_at)
        txn.put_alloc(replace(alloc, modify_index=index, alloc_modify_index=index, modify_time_ns=updated_at))
        if existing is None and alloc.previous_allocation:
            previous = txn.alloc(alloc.previous_allocation)
            if previous is not None:
                txn.put_alloc(replace(previous, next_allocation=alloc.id, modify_index=index))
    for ineligible in entry.nodes_ineligible:
        node = txn.node(ineligible.node_id)
        if node is not None:
            node = replace(node, scheduling_eligibility=NODE_INELIGIBLE, modify_index=index)
            txn.put_node(_add_event(node, ineligible.event, index))
    _put_evals(txn, entry.evals)
    return None


def apply_scheduler_config(txn: Txn, entry: raft_pb2.SchedulerConfigEntry, index: int) -> Any:
    old = txn.scheduler_config()
    if entry.use_cas and entry.cas_index != old.modify_index:
        # Decided here, not by the leader before proposing: two writers that read the same
        # index both pass a leader-side check, only one of them passes this one.
        raise EntryRejected(
            f"scheduler config not updated: check index {entry.cas_index} does not match"
            f" the current modify index {old.modify_index}"
        )
    config = from_proto(entry.config, SchedulerConfig)
    txn.set_scheduler_config(replace(config, create_index=old.create_index or index, modify_index=index))
    return None


def apply_alloc_desired_transition(txn: Txn, entry: raft_pb2.AllocDesiredTransitionEntry, index: int) -> Any:
    """Nomad's UpdateAllocsDesiredTransitions: each named alloc's transition, and the evals
    that make the scheduler act on it, at once (an alloc gone meanwhile is skipped)."""
    for alloc_id in sorted(entry.allocs):
        existing = txn.alloc(alloc_id)
        if existing is None:
            continue
        transition = from_proto(entry.allocs[alloc_id], DesiredTransition)
        txn.put_alloc(replace(existing, desired_transition=transition, modify_index=index))
    _put_evals(txn, entry.evals)
    return None


def apply_periodic_launch(txn: Txn, entry: raft_pb2.PeriodicLaunchEntry, index: int) -> Any:
    launch = from_proto(entry.launch, PeriodicLaunch)
    recorded = txn.base.periodic_launches.get((launch.namespace, launch.job_id))
    if recorded is not None and launch.launch_ns <= recorded.launch_ns:
        # The launch record only moves forward, as for launches written with their child.
        raise EntryRejected(f"launch at {launch.launch_ns} is not after the recorded {recorded.launch_ns}")
    txn.put_periodic_launch(replace(launch, modify_index=index, create_index=launch.create_index or index))
    return None


@dataclass(frozen=True, slots=True)
class SummaryCorrection:
    namespace: str
    job_id: str
    changes: tuple[str, ...]


def apply_reconcile_summaries(txn: Txn, entry: raft_pb2.ReconcileSummariesEntry, index: int) -> Any:
    """Recompute every job summary (and job status) from the state; returns the corrections."""
    return [
        SummaryCorrection(namespace=ns, job_id=job_id, changes=changes)
        for (ns, job_id), changes in txn.reconcile_summaries()
    ]


def apply_gc(txn: Txn, entry: raft_pb2.GCEntry, index: int) -> Any:
    """Delete what the leader's GC selected (server/gc/select.py), each object only if it is
    still as selected (same modify index, still terminal): the entry decides nothing by time,
    so every server deletes the same objects. A job goes with everything that names it.

    Job summaries count what exists (Nomad's rule): a collected child leaves its parent's
    children counts, a collected alloc its job's group counts, as a recount would.
    Returns what was deleted, by kind."""
    deleted = {"evals": 0, "allocs": 0, "jobs": 0, "nodes": 0, "deployments": 0}
    for ref in entry.jobs:
        key = (ref.namespace, ref.id)
        job = txn.job(key)
        if job is None or job.modify_index != ref.modify_index or job.status != JOB_STATUS_DEAD:
            continue
        allocs = txn.allocs_of_job(key)
        if any(not a.terminal() for a in allocs):
            continue
        for alloc in sorted(allocs, key=attrgetter("id")):
            txn.delete_alloc(alloc.id)
        evals = txn.evals_of_job(key)
        for ev in sorted(evals, key=attrgetter("id")):
            txn.delete_eval(ev.id)
        job_deployments = txn.deployments_of_job(key)
        for deployment in sorted(job_deployments, key=attrgetter("id")):
            txn.delete_deployment(deployment.id)
        txn.delete_job(key)
        deleted["jobs"] += 1
        deleted["allocs"] += len(allocs)
        deleted["evals"] += len(evals)
        deleted["deployments"] += len(job_deployments)
    for ref in entry.allocs:
        stale_alloc = txn.alloc(ref.id)
        if (
            stale_alloc is not None
            and stale_alloc.modify_index == ref.modify_index
            and stale_alloc.terminal()
        ):
            txn.delete_alloc(ref.id)
            deleted["allocs"] += 1
    for ref in entry.evals:
        stale_eval = txn.eval(ref.id)
        if stale_eval is not None and stale_eval.modify_index == ref.modify_index and stale_eval.terminal():
            txn.delete_eval(ref.id)
            deleted["evals"] += 1
    for ref in entry.deployments:
        ended = txn.deployment(ref.id)
        if ended is not None and ended.modify_index == ref.modify_index and not ended.active():
            txn.delete_deployment(ref.id)
            deleted["deployments"] += 1
    for ref in entry.nodes:
        node = txn.node(ref.id)
        if node is not None and node.modify_index == ref.modify_index and node.status == NODE_STATUS_DOWN:
            txn.delete_node(ref.id)
            deleted["nodes"] += 1
    return deleted


def apply_server_member(txn: Txn, entry: raft_pb2.ServerMemberEntry, index: int) -> Any:
    txn.put_server(replace(from_proto(entry.member, ServerMember), modify_index=index))
    return None


def _acl_token(txn: Txn, msg: raft_pb2.ACLTokenRecord, index: int) -> ACLTokenRecord:
    """A token record at this index, checked as the leader should have made it."""
    _require_id(msg.accessor_id, "ACL token")
    if not msg.secret_hash:
        raise EntryRejected(f"ACL token {msg.accessor_id!r} without a secret hash")
    if msg.type not in TOKEN_TYPES:
        raise EntryRejected(f"ACL token {msg.accessor_id!r}: unknown type {msg.type!r}")
    holder = txn.acl_token_by_hash(msg.secret_hash)
    if holder is not None and holder.accessor_id != msg.accessor_id:
        raise EntryRejected(f"ACL token {msg.accessor_id!r}: its secret is another token's")
    token = from_proto(msg, ACLTokenRecord)
    old = txn.acl_token(token.accessor_id)
    return replace(
        token,
        create_index=old.create_index if old is not None else index,
        create_time_ns=old.create_time_ns if old is not None else token.create_time_ns,
        modify_index=index,
    )


def apply_acl_bootstrap(txn: Txn, entry: raft_pb2.ACLBootstrapEntry, index: int) -> Any:
    """The first management token, once: two bootstraps racing past the leader's check both
    reach the log, and the second is refused here, on every server alike."""
    done = txn.acl_bootstrap_index()
    if done:
        raise EntryRejected(f"ACL bootstrap already done (reset index: {done})")
    if entry.token.type != TOKEN_MANAGEMENT:
        raise EntryRejected("ACL bootstrap: the token must be a management token")
    txn.put_acl_token(_acl_token(txn, entry.token, index))
    txn.set_acl_bootstrap_index(index)
    return None


def apply_acl_policy_upsert(txn: Txn, entry: raft_pb2.ACLPolicyUpsertEntry, index: int) -> Any:
    for msg in entry.policies:
        _require_id(msg.name, "ACL policy")
        old = txn.acl_policy(msg.name)
        policy = from_proto(msg, ACLPolicy)
        txn.put_acl_policy(
            replace(policy, create_index=old.create_index if old is not None else index, modify_index=index)
        )
    return None


def apply_acl_policy_delete(txn: Txn, entry: raft_pb2.ACLPolicyDeleteEntry, index: int) -> Any:
    for name in entry.names:
        if txn.acl_policy(name) is None:
            raise EntryTargetMissing(f"ACL policy {name!r} not found")
        txn.delete_acl_policy(name)
    return None


def apply_acl_token_upsert(txn: Txn, entry: raft_pb2.ACLTokenUpsertEntry, index: int) -> Any:
    for msg in entry.tokens:
        txn.put_acl_token(_acl_token(txn, msg, index))
    return None


def apply_acl_token_delete(txn: Txn, entry: raft_pb2.ACLTokenDeleteEntry, index: int) -> Any:
    for accessor_id in entry.accessor_ids:
        if txn.acl_token(accessor_id) is None:
            raise EntryTargetMissing(f"ACL token {accessor_id!r} not found")
        txn.delete_acl_token(accessor_id)
    return None


Applier = Callable[[Txn, Any, int], Any]

APPLIERS: Final[dict[int, tuple[type[Message], Applier]]] = {
    ET.ENTRY_TYPE_JOB_REGISTER: (raft_pb2.JobRegisterEntry, apply_job_register),
    ET.ENTRY_TYPE_JOB_DEREGISTER: (raft_pb2.JobDeregisterEntry, apply_job_deregister),
    ET.ENTRY_TYPE_NODE_REGISTER: (raft_pb2.NodeRegisterEntry, apply_node_register),
    ET.ENTRY_TYPE_NODE_DEREGISTER: (raft_pb2.NodeDeregisterEntry, apply_node_deregister),
    ET.ENTRY_TYPE_NODE_UPDATE_STATUS: (raft_pb2.NodeUpdateStatusEntry, apply_node_update_status),
    ET.ENTRY_TYPE_NODE_UPDATE_DRAIN: (raft_pb2.NodeUpdateDrainEntry, apply_node_update_drain),
    ET.ENTRY_TYPE_NODE_UPDATE_ELIGIBILITY: (
        raft_pb2.NodeUpdateEligibilityEntry,
        apply_node_update_eligibility,
    ),
    ET.ENTRY_TYPE_ALLOC_CLIENT_UPDATE: (raft_pb2.AllocClientUpdateEntry, apply_alloc_client_update),
    ET.ENTRY_TYPE_EVAL_UPDATE: (raft_pb2.EvalUpdateEntry, apply_eval_update),
    ET.ENTRY_TYPE_EVAL_DELETE: (raft_pb2.EvalDeleteEntry, apply_eval_delete),
    ET.ENTRY_TYPE_APPLY_PLAN_RESULTS: (raft_pb2.ApplyPlanResultsEntry, apply_plan_results),
    ET.ENTRY_TYPE_SCHEDULER_CONFIG: (raft_pb2.SchedulerConfigEntry, apply_scheduler_config),
    ET.ENTRY_TYPE_ALLOC_DESIRED_TRANSITION: (
        raft_pb2.AllocDesiredTransitionEntry,
        apply_alloc_desired_transition,
    ),
    ET.ENTRY_TYPE_PERIODIC_LAUNCH: (raft_pb2.PeriodicLaunchEntry, apply_periodic_launch),
    ET.ENTRY_TYPE_SERVER_MEMBER: (raft_pb2.ServerMemberEntry, apply_server_member),
    ET.ENTRY_TYPE_RECONCILE_SUMMARIES: (raft_pb2.ReconcileSummariesEntry, apply_reconcile_summaries),
    ET.ENTRY_TYPE_GC: (raft_pb2.GCEntry, apply_gc),
    ET.ENTRY_TYPE_ACL_BOOTSTRAP: (raft_pb2.ACLBootstrapEntry, apply_acl_bootstrap),
    ET.ENTRY_TYPE_ACL_POLICY_UPSERT: (raft_pb2.ACLPolicyUpsertEntry, apply_acl_policy_upsert),
    ET.ENTRY_TYPE_ACL_POLICY_DELETE: (raft_pb2.ACLPolicyDeleteEntry, apply_acl_policy_delete),
    ET.ENTRY_TYPE_ACL_TOKEN_UPSERT: (raft_pb2.ACLTokenUpsertEntry, apply_acl_token_upsert),
    ET.ENTRY_TYPE_ACL_TOKEN_DELETE: (raft_pb2.ACLTokenDeleteEntry, apply_acl_token_delete),
    # server/deployments/apply.py
    ET.ENTRY_TYPE_DEPLOYMENT_STATUS_UPDATE: (
        raft_pb2.DeploymentStatusUpdateEntry,
        apply_deployment_status_update,
    ),
    ET.ENTRY_TYPE_DEPLOYMENT_PROMOTE: (raft_pb2.DeploymentPromoteEntry, apply_deployment_promote),
    ET.ENTRY_TYPE_DEPLOYMENT_ALLOC_HEALTH: (
        raft_pb2.DeploymentAllocHealthEntry,
        apply_deployment_alloc_health,
    ),
}


def encode_entry(entry_type: int, payload: Message) -> bytes:
    return raft_pb2.LogEntry(type=entry_type, payload=payload.SerializeToString()).SerializeToString()  # type: ignore[arg-type]


def encode_batch(requests: Sequence[bytes]) -> bytes:
    """One entry carrying ``requests`` (each an encoded LogEntry, neither a batch nor a
    snapshot restore), applied in this order."""
    return encode_entry(_BATCH, raft_pb2.BatchEntry(entries=requests))


def batchable(data: bytes) -> bool:
    """Whether an encoded entry may share a batch: not a snapshot restore (it replaces the
    state the requests around it were decided on) and not a batch."""
    try:
        entry_type = raft_pb2.LogEntry.FromString(data).type
    except DecodeError:
        return True  # refused inside the batch as it would be alone, touching nothing
    return entry_type not in (_BATCH, _SNAPSHOT_RESTORE)


def requests_of(data: bytes) -> list[bytes]:
    """The requests an encoded entry carries: a batch's, in order, or the entry itself.

    For tools that look at what was written (replay checks, ``operator raft logs``); an
    undecodable batch carries none."""
    entry = raft_pb2.LogEntry.FromString(data)
    if entry.type != _BATCH:
        return [data]
    try:
        return list(raft_pb2.BatchEntry.FromString(entry.payload).entries)
    except DecodeError:
        return []


def results_of(result: ApplyResult) -> tuple[ApplyResult, ...]:
    """Each request's result, in the order of ``requests_of`` (a lone entry: its own)."""
    if isinstance(result.value, BatchApplied):
        return result.value.results
    return (result,)


def _apply_request(entry: raft_pb2.LogEntry, base: Tables, index: int) -> tuple[ApplyResult, Txn | None]:
    """One request on ``base``: its result, and its transaction if it is to be committed."""
    handler = APPLIERS.get(entry.type)
    if handler is None:
        if entry.type >= ET.ENTRY_TYPE_IGNORABLE_FLOAT:
            log.warning("fsm.ignored_unknown_entry", index=index, type=entry.type, hint="upgrade drover")
            return ApplyResult(index=index, error="ignored unknown entry type"), None
        # Every server has the same code, so every server stops here alike: loud, not silent.
        log.critical("fsm.unknown_entry_type", index=index, type=entry.type)
        return ApplyResult(index=index, error=f"unknown entry type {entry.type}"), None
    msg_cls, fn = handler
    txn = Txn(base, index)
    try:
        payload = msg_cls.FromString(entry.payload)
        value = fn(txn, payload, index)
    except EntryRejected as exc:
        return ApplyResult(index=index, error=str(exc), not_found=isinstance(exc, EntryTargetMissing)), None
    except Exception as exc:  # a bug: keep raft alive, keep servers identical
        log.exception("fsm.apply_failed", index=index, type=raft_pb2.EntryType.Name(entry.type))
        return ApplyResult(index=index, error=f"apply failed: {exc}"), None
    return ApplyResult(index=index, value=value), txn


def _merge_changes(into: Changes, more: Changes) -> None:
    into.evals |= more.evals
    into.capacity = into.capacity or more.capacity
    into.rescan = into.rescan or more.rescan


class FSM:
    """Applies raft entries to a ``StateStore``; called only from raft's apply thread.

    ``events``, when given, hears of every committed entry (what its transaction wrote) and
    of every wholesale state replacement, after the store has the new state: the event
    stream (server/events/) is derived there, off the state, so apply stays deterministic.
    """

    def __init__(self, store: StateStore, events: EventBuffer | None = None) -> None:
        self.store = store
        self.events = events
        # The index of the last ``operator snapshot restore`` applied here (0: none). Memory
        # of this process, not state: the leader's restore follow-up and the live checker
        # read it (server/restore_followup.py).
        self.restored_index = 0

    def apply(self, data: bytes, index: int) -> ApplyResult:
        base = self.store.snapshot().tables
        try:
            entry = raft_pb2.LogEntry.FromString(data)
        except DecodeError:
            log.error("fsm.undecodable_entry", index=index, size=len(data))
            return ApplyResult(index=index, error="undecodable log entry")
        if entry.type == _SNAPSHOT_RESTORE:
            return self._restore(entry.payload, index)
        if entry.type == _BATCH:
            return self._apply_batch(entry.payload, index, base)
        result, txn = _apply_request(entry, base, index)
        if txn is None:
            return result
        tables = txn.commit()
        self.store.commit(tables, txn.changes)
        if self.events is not None:
            self.events.entry_applied(entry.type, index, base, tables, txn.written)
        return result

    def _apply_batch(self, payload: bytes, index: int, base: Tables) -> ApplyResult:
        try:
            requests = raft_pb2.BatchEntry.FromString(payload).entries
        except DecodeError:
            log.error("fsm.undecodable_batch", index=index, size=len(payload))
            return ApplyResult(index=index, error="undecodable batch entry")
        tables = base
        changes = Changes()
        applied: list[tuple[int, Tables, Tables, dict[str, dict[Any, None]]]] = []
        results: list[ApplyResult] = []
        for data in requests:
            try:
                entry = raft_pb2.LogEntry.FromString(data)
            except DecodeError:
                results.append(ApplyResult(index=index, error="undecodable log entry"))
                continue
            if entry.type in (_BATCH, _SNAPSHOT_RESTORE):
                # A restore replaces the whole state, a batch in a batch has no order of its
                # own: the leader proposes neither inside a batch, and none applies there.
                results.append(ApplyResult(index=index, error=f"{ET.Name(entry.type)} inside a batch"))
                continue
            result, txn = _apply_request(entry, tables, index)
            results.append(result)
            if txn is not None:
                after = txn.commit()
                applied.append((entry.type, tables, after, txn.written))
                _merge_changes(changes, txn.changes)
                tables = after
        if applied:
            self.store.commit(tables, changes)
            if self.events is not None:
                self.events.batch_applied(index, applied)
        return ApplyResult(index=index, value=BatchApplied(tuple(results)))

    def _restore(self, payload: bytes, index: int) -> ApplyResult:
        try:
            snap = raft_pb2.SnapshotRestoreEntry.FromString(payload).snapshot
            tables = from_snapshot(snap)
        except Exception as exc:
            log.exception("fsm.restore_failed", index=index)
            return ApplyResult(index=index, error=f"restore failed: {exc}")
        # Every table moves to this index, so every blocking query wakes and re-reads.
        touched = {name: index for name in (*tables.table_index.keys(), *TABLES)}
        self.store.commit(
            replace(tables, index=index, table_index=tables.table_index.update(touched)), Changes(rescan=True)
        )
        if self.events is not None:
            self.events.state_replaced(index)
        self.restored_index = index
        log.warning("fsm.snapshot_restored", index=index, snapshot_index=snap.index)
        return ApplyResult(index=index)

    def restore_tables(self, tables: Tables) -> None:
        """Replace the state wholesale (raft snapshot install on start or catch-up)."""
        self.store.commit(tables)
        if self.events is not None:
            self.events.state_replaced(tables.index)
