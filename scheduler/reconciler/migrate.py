"""How many of a group's allocs may leave draining nodes now (Nomad's drainer, per group).

Nomad's drainer (nomad/drainer/watch_jobs.go ``handleTaskGroup``) marks at most
``migrate.max_parallel`` allocs of a group for migration at a time: it counts the group's
live allocs whose health is known, and lets ``settled - (count - max_parallel)`` more go.
A replacement counts once its health is known, so the next batch leaves only when the
last one has settled (or the drain's deadline passes: then everything goes).

drover decides the same thing inside the reconciler, from values: a live alloc is
*settled* when its client gave a deployment verdict (healthy or unhealthy, as Nomad's
``HasHealth``), or when every task has been running for ``min_healthy_time``
(``health_check = "task_states"``; "checks" is taken the same way only for a group with no
service checks, validation refuses it otherwise), or when ``healthy_deadline`` has passed
since it was created (Nomad's tracker then gives "unhealthy", which also lets the drain go
on). ``settles_at_ns`` says when that happens, so the scheduler can look again then.
A group without a ``migrate`` block, and a batch group (Nomad marks no batch alloc for
migration), move all at once, as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from drover.scheduler.structs import (
    ALLOC_CLIENT_RUNNING,
    HEALTH_HEALTHY,
    HEALTH_UNHEALTHY,
    Allocation,
    MigrateStrategy,
    Node,
)

__all__ = ["DrainRoom", "drain_forced", "drain_room", "settles_at_ns"]

_TASK_RUNNING = "running"
_TASK_DEAD = "dead"


def settles_at_ns(alloc: Allocation, strategy: MigrateStrategy) -> int | None:
    """When the live ``alloc`` counts as settled for a drain (0: already, by its client's
    verdict); None when nothing known yet says when (it is not running and has no
    creation time)."""
    status = alloc.deployment_status
    if status is not None and status.health in (HEALTH_HEALTHY, HEALTH_UNHEALTHY):
        return 0
    times: list[int] = []
    if alloc.create_time_ns:
        times.append(alloc.create_time_ns + strategy.healthy_deadline_ns)
    states = alloc.task_states.values()
    running = [ts for ts in states if ts.state == _TASK_RUNNING and ts.started_at_ns]
    # A task that finished without failing (a prestart hook) does not hold health back.
    if (
        alloc.client_status == ALLOC_CLIENT_RUNNING
        and running
        and all(ts in running or (ts.state == _TASK_DEAD and not ts.failed) for ts in states)
    ):
        times.append(max(ts.started_at_ns for ts in running) + strategy.min_healthy_time_ns)
    return min(times) if times else None


def drain_forced(node: Node | None, now_ns: int) -> bool:
    """The node's drain deadline has passed: what is left there goes at once."""
    strategy = node.drain_strategy if node is not None else None
    return strategy is not None and 0 < strategy.force_deadline_at_ns <= now_ns


@dataclass(frozen=True, slots=True)
class DrainRoom:
    """``room``: how many more allocs of the group may start leaving draining nodes now
    (<= 0: none). ``next_change_ns``: the earliest moment a live alloc that has not yet
    settled will (0: none is known), when the room may grow."""

    room: int
    next_change_ns: int


def drain_room(live: Iterable[Allocation], count: int, strategy: MigrateStrategy, now_ns: int) -> DrainRoom:
    """Nomad's ``numToDrain`` before the drainable cap: settled live allocs beyond
    ``count - max_parallel``. ``live``: the group's allocs that are running or about to
    (desired to run, not finished), wherever they are, leavers not yet stopped included."""
    settled = 0
    next_change = 0
    for alloc in live:
        at = settles_at_ns(alloc, strategy)
        if at is not None and at <= now_ns:
            settled += 1
        elif at is not None and (next_change == 0 or at < next_change):
            next_change = at
    return DrainRoom(settled - (count - strategy.max_parallel), next_change)
