"""When a node's drain is complete, so the leader can end it (Nomad's NodeDrainer).

A drain ends when nothing it is meant to move is still live on the node: every alloc there
is terminal (told to stop, or finished on its own), except system and sysbatch allocs when
the drain ignores system jobs (they stay, by the operator's choice). The leader's drainer
thread (server/leader.py) then writes one entry that clears the drain strategy, leaves the
node ineligible (as Nomad does: the operator re-enables it) and records a "Node drain
complete" event. ``drover node drain`` follows the same rule to know when to stop
following, and then also waits for the stopped allocs' processes to exit.

The schedulers move a draining node's allocs (the generic reconciler's migrate bucket, the
system scheduler's drain rows). A service group with a ``migrate`` block moves at most
``max_parallel`` at a time, the next once the replacements settled, as Nomad's drainer lets
them (scheduler/reconciler/migrate.py); when the drain's deadline passes the rest go at
once (the scheduler asks for an eval at that moment). Any other group moves all at once.
"""

from __future__ import annotations

from collections.abc import Iterable

from drover.scheduler.structs import JOB_TYPE_SYSBATCH, JOB_TYPE_SYSTEM, Allocation, Node

__all__ = ["drain_complete", "drain_remaining"]

_SYSTEM_TYPES = frozenset({JOB_TYPE_SYSTEM, JOB_TYPE_SYSBATCH})


def drain_remaining(
    node: Node, allocs: Iterable[Allocation], job_types: dict[tuple[str, str], str]
) -> list[Allocation]:
    """The allocs on ``node`` its drain still has to move (``job_types`` by (namespace, job id);
    a job no longer known counts as not a system job, so its allocs are waited for)."""
    strategy = node.drain_strategy
    ignore_system = strategy is not None and strategy.ignore_system_jobs
    remaining = []
    for alloc in allocs:
        if alloc.node_id != node.id or alloc.terminal():
            continue
        if ignore_system and job_types.get((alloc.namespace, alloc.job_id)) in _SYSTEM_TYPES:
            continue
        remaining.append(alloc)
    return remaining


def drain_complete(node: Node, allocs: Iterable[Allocation], job_types: dict[tuple[str, str], str]) -> bool:
    """``node`` is draining and its drain has nothing left to move."""
    return node.drain_strategy is not None and not drain_remaining(node, allocs, job_types)
