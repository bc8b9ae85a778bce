"""The reconcilers: a job's allocs against what the job asks for, sorted into named buckets
(Nomad's ``scheduler/reconciler``). Pure functions of values: no clock, no IDs, no state
store; the schedulers (``scheduler.generic``, ``scheduler.system``) read the snapshot,
call them, and turn the buckets into a plan.

Layout:

- ``vocabulary``: the words both use: buckets, where a node stands (and what *tainted*
  means), the ``Rule`` of a classification ladder, the plan's descriptions, and the update
  and disconnect questions (``tasks_updated``, ``max_parallel``, ``stagger_ns``,
  ``disconnect_expired``).
- ``system``: ``diff_system_allocs``, a system or sysbatch job against every node:
  ``SystemDiff``.
"""

from scheduler.reconciler.system import SystemDiff, diff_system_allocs
from scheduler.reconciler.vocabulary import max_parallel, stagger_ns, tasks_updated

__all__ = [
    "SystemDiff",
    "diff_system_allocs",
    "max_parallel",
    "stagger_ns",
    "tasks_updated",
]
