"""The events of one applied raft entry, from what its transaction wrote: a pure function.

Every server applies the same entries to the same state, so ``derive_events`` gives every
server the same events, in the same order, at the same index: that is what lets a stream
resume on any server (proto/drover/v1/api.proto, service Events).

The rule, as Nomad's ``eventsFromChanges``: the entry's type names every event it makes
(``ENTRY_EVENT_TYPES``: a plan's allocs, evals and job status changes are all
``PlanResult``), and each object it wrote in the jobs, nodes, deployments, allocs and evals
tables is one event, carrying the object as it is after the entry. Deletions are events
only for jobs (a purge: ``JobDeregistered``) and nodes (``NodeDeregistration``), with the
object as it was; the evals, allocs and deployments that garbage collection deletes are
no events, as in Nomad, which reports only the jobs (``JobBatchDeregistered``) and nodes
(``NodeDeregistration``) it reaps. A write that changed nothing a reader sees (the same
object put back, a node's ``last_alloc_update_index`` bumped by its client's alloc report)
is no event.

Entries of ``EVENTLESS_ENTRIES`` make no events: they change no object of the five topics,
or (``ENTRY_TYPE_RECONCILE_SUMMARIES``, ``ENTRY_TYPE_EVAL_DELETE``) they are repairs and
garbage collection, reported by the command that runs them. A snapshot restore is not an
entry here: it resets the buffer (buffer.py). tests/unit/test_events.py proves every entry
type the FSM applies is in exactly one of the two tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Final

from drover.scheduler.structs import Allocation, Deployment, Evaluation, Job, Node
from drover.server.events._model import (
    TOPIC_ALLOCATION,
    TOPIC_DEPLOYMENT,
    TOPIC_EVALUATION,
    TOPIC_JOB,
    TOPIC_NODE,
    Event,
)
from drover.server.state_store import Tables
from drover.v1 import raft_pb2

__all__ = ["ENTRY_EVENT_TYPES", "EVENTLESS_ENTRIES", "derive_events", "event_type_of"]

# Keyed by the EntryType's name: an entry type another change adds is classified here by
# name, and the table still loads on a tree whose raft.proto does not have it yet.
_EVENT_TYPE_BY_ENTRY: Final = {
    "ENTRY_TYPE_JOB_REGISTER": "JobRegistered",
    "ENTRY_TYPE_JOB_DEREGISTER": "JobDeregistered",
    "ENTRY_TYPE_NODE_REGISTER": "NodeRegistration",
    "ENTRY_TYPE_NODE_DEREGISTER": "NodeDeregistration",
    "ENTRY_TYPE_NODE_UPDATE_STATUS": "NodeEvent",
    "ENTRY_TYPE_NODE_UPDATE_DRAIN": "NodeDrain",
    "ENTRY_TYPE_NODE_UPDATE_ELIGIBILITY": "NodeEligibility",
    "ENTRY_TYPE_ALLOC_CLIENT_UPDATE": "AllocationUpdated",
    "ENTRY_TYPE_ALLOC_DESIRED_TRANSITION": "AllocationUpdateDesiredStatus",
    "ENTRY_TYPE_EVAL_UPDATE": "EvaluationUpdated",
    "ENTRY_TYPE_APPLY_PLAN_RESULTS": "PlanResult",
    "ENTRY_TYPE_DEPLOYMENT_STATUS_UPDATE": "DeploymentStatusUpdate",
    "ENTRY_TYPE_DEPLOYMENT_PROMOTE": "DeploymentPromotion",
    "ENTRY_TYPE_DEPLOYMENT_ALLOC_HEALTH": "DeploymentAllocHealth",
    # Garbage collection: Nomad reaps jobs with a JobBatchDeregister entry and nodes with a
    # node deregistration; the evals, allocs and deployments it deletes are no events.
    "ENTRY_TYPE_GC": "JobBatchDeregistered",
}
# Entries whose events on one table carry another type than the entry's.
_TABLE_TYPES_BY_ENTRY: Final = {
    "ENTRY_TYPE_GC": {"nodes": "NodeDeregistration"},
}
_EVENTLESS_BY_NAME: Final = frozenset(
    {
        "ENTRY_TYPE_EVAL_DELETE",
        "ENTRY_TYPE_SCHEDULER_CONFIG",
        "ENTRY_TYPE_PERIODIC_LAUNCH",
        "ENTRY_TYPE_SERVER_MEMBER",
        "ENTRY_TYPE_SNAPSHOT_RESTORE",
        "ENTRY_TYPE_RECONCILE_SUMMARIES",
        "ENTRY_TYPE_ACL_BOOTSTRAP",
        "ENTRY_TYPE_ACL_POLICY_UPSERT",
        "ENTRY_TYPE_ACL_POLICY_DELETE",
        "ENTRY_TYPE_ACL_TOKEN_UPSERT",
        "ENTRY_TYPE_ACL_TOKEN_DELETE",
    }
)
_KNOWN: Final = frozenset(raft_pb2.EntryType.keys())

ENTRY_EVENT_TYPES: Final[Mapping[int, str]] = {
    raft_pb2.EntryType.Value(name): event_type
    for name, event_type in _EVENT_TYPE_BY_ENTRY.items()
    if name in _KNOWN
}
EVENTLESS_ENTRIES: Final = frozenset(
    raft_pb2.EntryType.Value(name) for name in _EVENTLESS_BY_NAME if name in _KNOWN
)
_TABLE_TYPES: Final[Mapping[int, Mapping[str, str]]] = {
    raft_pb2.EntryType.Value(name): types for name, types in _TABLE_TYPES_BY_ENTRY.items() if name in _KNOWN
}


def event_type_of(entry_type: int) -> str | None:
    """The event type an entry's events carry; None for an entry that makes none."""
    return ENTRY_EVENT_TYPES.get(entry_type)


def _job_event(index: int, kind: str, job: Job) -> Event:
    return Event(index, TOPIC_JOB, kind, job.id, job.namespace, job)


def _node_event(index: int, kind: str, node: Node) -> Event:
    return Event(index, TOPIC_NODE, kind, node.id, "", node)


def _alloc_event(index: int, kind: str, alloc: Allocation) -> Event:
    keys = tuple(k for k in (alloc.job_id, alloc.deployment_id) if k)
    return Event(index, TOPIC_ALLOCATION, kind, alloc.id, alloc.namespace, alloc, keys)


def _eval_event(index: int, kind: str, ev: Evaluation) -> Event:
    keys = tuple(k for k in (ev.job_id, ev.deployment_id) if k)
    return Event(index, TOPIC_EVALUATION, kind, ev.id, ev.namespace, ev, keys)


def _deployment_event(index: int, kind: str, deployment: Deployment) -> Event:
    keys = (deployment.job_id,) if deployment.job_id else ()
    return Event(index, TOPIC_DEPLOYMENT, kind, deployment.id, deployment.namespace, deployment, keys)


def _node_bookkeeping_only(before: Any, after: Any) -> bool:
    """A client's alloc report stamps its node (``last_alloc_update_index``); no one
    watching nodes wants an event per alloc report."""
    return bool(
        before.last_alloc_update_index != after.last_alloc_update_index
        and replace(before, last_alloc_update_index=after.last_alloc_update_index) == after
    )


# (table, event maker, whether a deletion is an event, a write that is no event), in the
# order an entry's events are listed.
_TABLES: Final[
    tuple[tuple[str, Callable[[int, str, Any], Event], bool, Callable[[Any, Any], bool] | None], ...]
] = (
    ("jobs", _job_event, True, None),
    ("nodes", _node_event, True, _node_bookkeeping_only),
    ("deployments", _deployment_event, False, None),
    ("allocs", _alloc_event, False, None),
    ("evals", _eval_event, False, None),
)


def derive_events(
    entry_type: int, index: int, before: Tables, after: Tables, written: Mapping[str, Mapping[Any, None]]
) -> tuple[Event, ...]:
    """The events of the entry at ``index``: ``written`` is its transaction's ``Txn.written``,
    ``before`` and ``after`` the state around it."""
    entry_kind = ENTRY_EVENT_TYPES.get(entry_type)
    if entry_kind is None or not written:
        return ()
    table_kinds = _TABLE_TYPES.get(entry_type, {})
    events: list[Event] = []
    for table, make, deletions, quiet in _TABLES:
        keys = written.get(table)
        if not keys:
            continue
        kind = table_kinds.get(table, entry_kind)
        old_rows = getattr(before, table)
        new_rows = getattr(after, table)
        for key in keys:
            new = new_rows.get(key)
            old = old_rows.get(key)
            if new is old:
                continue
            if new is None:
                if deletions:
                    events.append(make(index, kind, old))
                continue
            if old is not None and quiet is not None and quiet(old, new):
                continue
            events.append(make(index, kind, new))
    return tuple(events)
