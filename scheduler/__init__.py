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
  ``generic`` (``reconcile_group``, in named steps), ``rollout`` (how a deployment gates
  a group's rollout), ``reschedule`` (failed allocs), ``system`` (``diff_system_allocs``).
- ``deployments``: which deployment governs a job version, when a new one is made, when
  one has succeeded (docs/deployments.md).
- ``placement/``: the plan under construction (``plan``), each node as the plan leaves it
  (``views``), choosing nodes (``ranking``), and what that is made of: ``feasible``
  (readiness, datacenters, constraints), ``scores`` (the formulas), ``ports``.
- ``fit``: whether allocs fit on a node; the plan applier asks the same function.
- ``validate``: a job's checks and defaults before it is stored.
- ``periodic``: cron schedules, the launch due after a gap, and the children of periodic
  and parameterized jobs.
- ``_records``: generated constructors for the structs' hot write path (private).

The names in ``__all__`` load on first use: ``import drover.scheduler.structs``, which every
drover process and CLI call makes, stays as cheap as the model itself.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drover.scheduler.fit import allocs_fit
    from drover.scheduler.generic import compute_generic
    from drover.scheduler.interfaces import Scheduler, SchedulerContext, SchedulerResult, State, seed_from
    from drover.scheduler.periodic import next_periodic_launch
    from drover.scheduler.placement import PlanBuilder, feasible_nodes, place_on_node, select_node
    from drover.scheduler.reconciler import (
        GroupResult,
        SystemDiff,
        diff_system_allocs,
        next_reschedule,
        reconcile_group,
    )
    from drover.scheduler.structs import follow_up_eval, job_eval
    from drover.scheduler.system import compute_sysbatch, compute_system
    from drover.scheduler.validate import ValidationError, canonicalize_job, validate_job

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
    "GroupResult": "drover.scheduler.reconciler",
    "PlanBuilder": "drover.scheduler.placement",
    "Scheduler": "drover.scheduler.interfaces",
    "SchedulerContext": "drover.scheduler.interfaces",
    "SchedulerResult": "drover.scheduler.interfaces",
    "State": "drover.scheduler.interfaces",
    "SystemDiff": "drover.scheduler.reconciler",
    "ValidationError": "drover.scheduler.validate",
    "allocs_fit": "drover.scheduler.fit",
    "canonicalize_job": "drover.scheduler.validate",
    "compute_generic": "drover.scheduler.generic",
    "compute_sysbatch": "drover.scheduler.system",
    "compute_system": "drover.scheduler.system",
    "diff_system_allocs": "drover.scheduler.reconciler",
    "feasible_nodes": "drover.scheduler.placement",
    "follow_up_eval": "drover.scheduler.structs",
    "job_eval": "drover.scheduler.structs",
    "next_periodic_launch": "drover.scheduler.periodic",
    "next_reschedule": "drover.scheduler.reconciler",
    "place_on_node": "drover.scheduler.placement",
    "reconcile_group": "drover.scheduler.reconciler",
    "seed_from": "drover.scheduler.interfaces",
    "select_node": "drover.scheduler.placement",
    "validate_job": "drover.scheduler.validate",
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
