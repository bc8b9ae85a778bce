"""drover's scheduler: a pure function from an evaluation and a frozen snapshot to a plan.

    result = compute_generic(ev, state, ctx)   # or compute_system / compute_sysbatch
    # result.plan, result.eval_update, result.created_evals, result.annotations

Nothing here does I/O: no gRPC, raft, threads, clock, randomness, IDs or OS access
(tests/unit/test_purity.py walks every module). Time, new IDs and the shuffle seed come in
through ``SchedulerContext``; the server's worker submits the plan and writes the evals.
scheduler/README.md has the vocabulary and the flow of each scheduler.

Layout (Nomad's ``scheduler/``, with its ``reconciler/`` and ``feasible/``):

- ``structs``: the domain model (frozen dataclasses), its string vocabulary, and the
  shapes of a new eval (``job_eval``) and of a follow-up eval (``follow_up_eval``).
- ``interfaces``: the seams: ``State`` (what a scheduler reads), ``SchedulerContext``
  (what the caller decides), ``SchedulerResult`` (what it returns), ``seed_from``.
- ``generic`` / ``system``: the schedulers, service and batch / system and sysbatch: read
  the snapshot, reconcile, place, and build the plan and the follow-up evals.
- ``reconciler/``: the decisions, as buckets: ``vocabulary`` (the words both use),
  ``generic`` (``reconcile_group``, in named steps), ``reschedule`` (failed allocs),
  ``system`` (``diff_system_allocs``).
- ``placement/``: the plan under construction (``plan``), each node as the plan leaves it
  (``views``), choosing nodes (``ranking``), and what that is made of: ``feasible``
  (readiness, datacenters, constraints), ``scores`` (the formulas), ``ports``.
- ``fit``: whether allocs fit on a node; the plan applier asks the same function.
- ``validate``: a job's checks and defaults before it is stored.
- ``periodic``: cron schedules, the launch due after a gap, and the children of periodic
  and parameterized jobs.
- ``_records``: generated constructors for the structs' hot write path (private).

The names in ``__all__`` load on first use: ``import scheduler.structs``, which every
drover process and CLI call makes, stays as cheap as the model itself.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scheduler.fit import allocs_fit
    from scheduler.generic import compute_generic
    from scheduler.interfaces import Scheduler, SchedulerContext, SchedulerResult, State, seed_from
    from scheduler.periodic import next_periodic_launch
    from scheduler.placement import PlanBuilder, feasible_nodes, place_on_node, select_node
    from scheduler.reconciler import (
        GroupResult,
        SystemDiff,
        diff_system_allocs,
        next_reschedule,
        reconcile_group,
    )
    from scheduler.structs import follow_up_eval, job_eval
    from scheduler.system import compute_sysbatch, compute_system
    from scheduler.validate import ValidationError, canonicalize_job, validate_job

__all__ = [
    "GroupResult",
    "PlanBuilder",
    "Scheduler",
    "SchedulerContext",
    "SchedulerResult",
    "State",
    "SystemDiff",
    "ValidationError",
    "allocs_fit",
    "canonicalize_job",
    "compute_generic",
    "compute_sysbatch",
    "compute_system",
    "diff_system_allocs",
    "feasible_nodes",
    "follow_up_eval",
    "job_eval",
    "next_periodic_launch",
    "next_reschedule",
    "place_on_node",
    "reconcile_group",
    "seed_from",
    "select_node",
    "validate_job",
]

# Where each name of __all__ lives.
_HOMES: dict[str, str] = {
    "GroupResult": "scheduler.reconciler",
    "PlanBuilder": "scheduler.placement",
    "Scheduler": "scheduler.interfaces",
    "SchedulerContext": "scheduler.interfaces",
    "SchedulerResult": "scheduler.interfaces",
    "State": "scheduler.interfaces",
    "SystemDiff": "scheduler.reconciler",
    "ValidationError": "scheduler.validate",
    "allocs_fit": "scheduler.fit",
    "canonicalize_job": "scheduler.validate",
    "compute_generic": "scheduler.generic",
    "compute_sysbatch": "scheduler.system",
    "compute_system": "scheduler.system",
    "diff_system_allocs": "scheduler.reconciler",
    "feasible_nodes": "scheduler.placement",
    "follow_up_eval": "scheduler.structs",
    "job_eval": "scheduler.structs",
    "next_periodic_launch": "scheduler.periodic",
    "next_reschedule": "scheduler.reconciler",
    "place_on_node": "scheduler.placement",
    "reconcile_group": "scheduler.reconciler",
    "seed_from": "scheduler.interfaces",
    "select_node": "scheduler.placement",
    "validate_job": "scheduler.validate",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
