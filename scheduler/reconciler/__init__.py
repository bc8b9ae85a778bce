"""The reconcilers: a job's allocs against what the job asks for, sorted into named buckets
(Nomad's ``scheduler/reconciler``). Pure functions of values: no clock, no IDs, no state
store; the schedulers (``drover.scheduler.generic``, ``drover.scheduler.system``) read the snapshot,
call them, and turn the buckets into a plan.

Layout:

- ``vocabulary``: the words both use: buckets, where a node stands (and what *tainted*
  means), the ``Rule`` of a classification ladder, the plan's descriptions, and the update
  and disconnect questions (``tasks_updated``, ``max_parallel``, ``stagger_ns``,
  ``disconnect_expired``).
- ``generic``: ``reconcile_group``, one task group of a service or batch job, in six named
  steps (classify, stop a stopped job, settle reconnects, slot holders, moves and new
  slots, updates): ``GroupResult``.
- ``rollout``: how a deployment gates a group's rollout (budget by health, canaries,
  paused and failed deployments).
- ``reschedule``: whether and when a failed alloc may be replaced (``next_reschedule``),
  and the attempt history its replacement carries.
- ``migrate``: how many of a group's allocs may leave draining nodes now
  (``migrate.max_parallel``, Nomad's drainer) and when a replacement settles.
- ``system``: ``diff_system_allocs``, a system or sysbatch job against every node:
  ``SystemDiff``.
"""

from drover.scheduler.reconciler.generic import (
    DelayedReschedule,
    GroupResult,
    Placement,
    Stop,
    reconcile_group,
)
from drover.scheduler.reconciler.reschedule import RescheduleDecision, next_delay, next_reschedule
from drover.scheduler.reconciler.system import AllocTuple, SystemDiff, diff_system_allocs
from drover.scheduler.reconciler.vocabulary import Rule, classify, max_parallel, stagger_ns, tasks_updated

__all__ = [
    "AllocTuple",
    "DelayedReschedule",
    "GroupResult",
    "Placement",
    "RescheduleDecision",
    "Rule",
    "Stop",
    "SystemDiff",
    "classify",
    "diff_system_allocs",
    "max_parallel",
    "next_delay",
    "next_reschedule",
    "reconcile_group",
    "stagger_ns",
    "tasks_updated",
]
