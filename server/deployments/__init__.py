"""Deployments on the servers: the record's transitions and the leader's watcher.

Map:

* ``state``: every change of a deployment record inside the FSM (the scheduler's upsert,
  status changes, counters from placements and client health, job stability).
* ``apply``: the FSM's appliers of the deployment entries (status update with its
  auto-revert job, promotion, manual alloc health).
* ``decide``: the watcher's rules, pure: fail (unhealthy, progress deadline), auto-promote,
  the auto-revert target, when to look again.
* ``watcher``: the leader-only service that fails, reverts and promotes deployments.
* ``actions``: the entries operators' RPCs and the watcher write (fail with auto-revert,
  pause, resume, promote, manual health), and the job-version writes (revert, scale).

Only ``state`` and ``apply`` are re-exported here: server/fsm.py imports this package, and
``decide``, ``actions`` and ``watcher`` import the FSM, so they are imported by module.

The scheduler's side (creating deployments, rolling by health, canaries, success) is pure
and lives in ``drover.scheduler.deployments``.
"""

from drover.server.deployments.apply import (
    apply_deployment_alloc_health,
    apply_deployment_promote,
    apply_deployment_status_update,
)
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
    "apply_deployment_alloc_health",
    "apply_deployment_promote",
    "apply_deployment_status_update",
    "count_alloc",
    "mark_stable",
    "set_alloc_health",
    "set_status",
    "upsert_from_plan",
]
