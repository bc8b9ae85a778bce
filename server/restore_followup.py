"""After ``operator snapshot restore``: the clients' real alloc states win.

A restore puts back what the state believed at the snapshot's time, so it can hold an alloc
as running that no client runs any more (stopped and purged after the snapshot, or failed
since). Two things make it converge, and this module decides the leader's half:

- each client resends every alloc's status when the state it watches went backwards
  (client_agent/allocdiff.py ``rewound``): it registers again (the node's ``modify_index``
  passes the restore's index) and resends, which moves each alloc's ``modify_index`` past it;
- ``followup(tables, mark, now_ns)``, once ``RESTORE_GRACE_NS`` has passed: every alloc
  the restored state holds as running on a node that has registered since the restore and
  not reported it is *unconfirmed*, and is marked lost; every job that had an alloc desired
  running in the restored state gets one evaluation, so the scheduler replaces what the
  clients reported stopped and what was just marked lost. A node that never reports again
  is judged by its heartbeat (the leader re-arms every live node's timer at a restore).

The restore mark is each server's memory of the restore entry it applied (``FSM.restored``,
not part of the replicated state): a server restarted after the entry was compacted away
forgets it, and so does nothing more for that restore.

Pure: the caller passes the state, the mark and the time; the leader's thread proposes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from drover.scheduler.structs import (
    ALLOC_CLIENT_LOST,
    ALLOC_CLIENT_PENDING,
    ALLOC_CLIENT_RUNNING,
    ALLOC_DESIRED_RUN,
    NODE_STATUS_DOWN,
    TRIGGER_NODE_UPDATE,
    Allocation,
    job_eval,
)
from drover.server.clock import IdSource
from drover.server.codec import to_proto
from drover.server.state_store import JobKey, Tables
from drover.v1 import raft_pb2

__all__ = [
    "RESTORE_GRACE_NS",
    "Followup",
    "RestoreMark",
    "RestoreWatch",
    "followup",
    "followup_entry",
    "unconfirmed_allocs",
]

# Long enough for every connected client to see the restored state (its blocking watch
# wakes at once: every table index moves) and resend (one sync interval, ~200 ms), with
# room for a loaded machine; short enough that a phantom is replaced within seconds.
RESTORE_GRACE_NS: Final = 10_000_000_000

_BELIEVED_RUNNING: Final = frozenset({ALLOC_CLIENT_PENDING, ALLOC_CLIENT_RUNNING})


@dataclass(frozen=True, slots=True)
class RestoreMark:
    """A restore this server applied: its raft index, and when (this server's clock) it
    first saw it."""

    index: int
    seen_at_ns: int

    def age_ns(self, now_ns: int) -> int:
        return max(0, now_ns - self.seen_at_ns)


@dataclass(frozen=True, slots=True)
class Followup:
    lost: tuple[Allocation, ...] = ()
    evaluate: tuple[JobKey, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.lost or self.evaluate)


def unconfirmed_allocs(tables: Tables, mark: RestoreMark) -> list[Allocation]:
    """Allocs the restored state holds as running, untouched since the restore, on a node
    whose client has registered since the restore (a client registers again when it sees the
    state go backwards, and then resends everything it runs: this was not among it)."""
    found = []
    for alloc in tables.allocs.values():
        if (
            alloc.desired_status != ALLOC_DESIRED_RUN
            or alloc.client_status not in _BELIEVED_RUNNING
            or alloc.modify_index >= mark.index
        ):
            continue
        node = tables.nodes.get(alloc.node_id)
        if node is None or node.status == NODE_STATUS_DOWN:
            continue  # the heartbeat path (node down: allocs lost) judges it
        if node.modify_index > mark.index:
            found.append(alloc)
    return sorted(found, key=lambda a: a.id)


def followup(tables: Tables, mark: RestoreMark, now_ns: int) -> Followup | None:
    """What the leader writes for ``mark``, or None while the grace period runs."""
    if mark.age_ns(now_ns) < RESTORE_GRACE_NS:
        return None
    lost = tuple(unconfirmed_allocs(tables, mark))
    jobs: set[JobKey] = set()
    for alloc in tables.allocs.values():
        # Desired running when the state was restored (created before it, not stopped
        # since by the servers): the scheduler looks at each such job once more.
        if alloc.desired_status == ALLOC_DESIRED_RUN and alloc.create_index < mark.index:
            key = (alloc.namespace, alloc.job_id)
            if key in tables.jobs:
                jobs.add(key)
    return Followup(lost=lost, evaluate=tuple(sorted(jobs)))


class RestoreWatch:
    """This server's view of the newest restore: the FSM's restored index, and the time it
    was first looked at (the leader looks twice a second; a follower's live checker when
    it is first asked, so its grace period may start late, never early)."""

    def __init__(self, restored_index: Callable[[], int], now_ns: Callable[[], int]) -> None:
        self._restored_index = restored_index
        self._now_ns = now_ns
        self._lock = threading.Lock()
        self._mark: RestoreMark | None = None

    def mark(self) -> RestoreMark | None:
        index = self._restored_index()
        if index <= 0:
            return None
        with self._lock:
            if self._mark is None or self._mark.index != index:
                self._mark = RestoreMark(index=index, seen_at_ns=self._now_ns())
            return self._mark


def followup_entry(
    tables: Tables, plan: Followup, ids: IdSource, now_ns: int
) -> raft_pb2.AllocClientUpdateEntry:
    """One raft entry for ``plan``: the unconfirmed allocs marked lost (as the FSM marks a
    down node's) and one ``node-update`` evaluation per job, so both land together."""
    entry = raft_pb2.AllocClientUpdateEntry(updated_at_ns=now_ns)
    for alloc in plan.lost:
        entry.allocs.add(
            id=alloc.id,
            client_status=ALLOC_CLIENT_LOST,
            client_description="the restored state held it running; its node, registered since, does not run it",
        )
    for key in plan.evaluate:
        job = tables.jobs.get(key)
        if job is not None and not job.stop and not job.is_template():
            to_proto(job_eval(ids.new(), job, TRIGGER_NODE_UPDATE, now_ns), entry.evals.add())
    return entry
