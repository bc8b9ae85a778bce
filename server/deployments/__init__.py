"""Deployments on the servers: the record's transitions and the leader's watcher.

Map:

* ``state``: every change of a deployment record inside the FSM (the scheduler's upsert,
  status changes, counters from placements and client health, job stability).
* ``watcher``: the leader-only service that fails, reverts and promotes deployments.
* ``actions``: the entries operators' RPCs and the watcher write (fail with auto-revert,
  pause, resume, promote, manual health).

The scheduler's side (creating deployments, rolling by health, canaries, success) is pure
and lives in ``drover.scheduler.deployments``.
"""

from drover.server.deployments.state import (
    DeploymentRefused,
    count_alloc,
    mark_stable,
    set_alloc_health,
    set_status,
    upsert_from_plan,
)

__all__ = [
    "DeploymentRefused",
    "count_alloc",
    "mark_stable",
    "set_alloc_health",
    "set_status",
    "upsert_from_plan",
]
