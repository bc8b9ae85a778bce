"""How many of a group's allocs may leave draining nodes now (Nomad's drainer, per group).

Nomad's drainer (nomad/drainer/watch_jobs.go ``handleTaskGroup``) marks at most
``migrate.max_parallel`` allocs of a group for migration at a time: it counts the group's
live allocs whose health is known, and lets ``settled - (count - max_parallel)`` more go.
A replacement counts once its health is known, so the next batch leaves only when the
last one has settled (or the drain's deadline passes: then everything goes).

drover decides the same thing inside the reconciler, from values: a live alloc is
*settled* when its client gave a deployment verdict (healthy or unhealthy, as Nomad's
``HasHealth``), or when every task has been running for ``min_healthy_time``
and, with ``health_check = "checks"``, every service check of the group has been passing
for ``min_healthy_time`` too (the check statuses its client reports with the alloc, each
stamped with when it became what it is: ``checks_passing_since_ns``), or when
``healthy_deadline`` has passed since it was created (Nomad's tracker then gives
"unhealthy", which also lets the drain go on). ``settles_at_ns`` says when that happens, so the scheduler can look again then.
A group without a ``migrate`` block, and a batch group (Nomad marks no batch alloc for
migration), move all at once, as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from drover.scheduler.structs import (
    ALLOC_CLIENT_RUNNING,
    HEALTH_CHECK_CHECKS,
    HEALTH_HEALTHY,
    HEALTH_UNHEALTHY,
    Allocation,
    MigrateStrategy,
    Node,
    TaskGroup,
    all_checks_passing,
)

__all__ = [
    "DrainRoom",
    "checks_passing_since_ns",
    "drain_forced",
    "drain_room",
    "group_check_count",
    "settles_at_ns",
]

_TASK_RUNNING = "running"
_TASK_DEAD = "dead"


def group_check_count(group: TaskGroup) -> int:
    """How many service checks each alloc of ``group`` reports: its own services' and its
    tasks'."""
    return sum(
        len(svc.checks) for svc in (*group.services, *(svc for t in group.tasks for svc in t.services))
    )


def checks_passing_since_ns(alloc: Allocation, expected: int) -> int | None:
    """When the last of the alloc's ``expected`` checks began passing (0 with none
    expected); None while one has no status yet or does not pass."""
    statuses = alloc.check_statuses
    if not all_checks_passing(statuses, expected):
        return None
    return max((s.timestamp_ns for s in statuses), default=0)


def settles_at_ns(alloc: Allocation, strategy: MigrateStrategy, checks: int = 0) -> int | None:
    """When the live ``alloc`` counts as settled for a drain (0: already, by its client's
    verdict); None when nothing known yet says when (it is not running and has no
    creation time). ``checks``: how many service checks the alloc reports
    (``group_check_count``), which ``health_check = "checks"`` waits on."""
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
        healthy_since = max(ts.started_at_ns for ts in running)
        passing_since: int | None = 0
        if strategy.health_check == HEALTH_CHECK_CHECKS and checks:
            passing_since = checks_passing_since_ns(alloc, checks)
        if passing_since is not None:
            times.append(max(healthy_since, passing_since) + strategy.min_healthy_time_ns)
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


def drain_room(
    live: Iterable[Allocation], count: int, strategy: MigrateStrategy, now_ns: int, checks: int = 0
) -> DrainRoom:
    """Nomad's ``numToDrain`` before the drainable cap: settled live allocs beyond
    ``count - max_parallel``. ``live``: the group's allocs that are running or about to
    (desired to run, not finished), wherever they are, leavers not yet stopped included;
    ``checks``: as for ``settles_at_ns``."""
    settled = 0
    next_change = 0
    for alloc in live:
        at = settles_at_ns(alloc, strategy, checks)
        if at is not None and at <= now_ns:
            settled += 1
        elif at is not None and (next_change == 0 or at < next_change):
            next_change = at
    return DrainRoom(settled - (count - strategy.max_parallel), next_change)
