"""How a deployment gates one group's rollout: how many destructive updates may go now,
whether canaries are wanted, and which canaries are left over from a deployment that ended.

Nomad's rules (its ``computeUnderProvisionedBy`` and ``requiresCanaries``), with the words
of ``docs/deployments.md``:

* A group *rolls* when its update block is not empty (``max_parallel > 0``) and the job is
  a service job; anything else updates everything at once.
* A paused or failed deployment, and a group whose canaries wait for promotion, admit no
  destructive update.
* Otherwise the budget is ``max_parallel`` minus the deployment's allocs whose health is
  not known yet: live ones, and failed ones not replaced (a client reports the failure and
  its verdict separately, and an eval between the two must not free the slot); an
  unhealthy alloc in the deployment stops the rollout (budget 0) until it is replaced
  (then its replacement counts as not known yet): a version that fails at start never
  runs wider than ``max_parallel`` while the watcher fails it. So the next batch waits
  for health, not just placement: the health verdict's eval (written with the verdict)
  runs the next batch.
* Canaries: a group with ``canary = N`` and destructive work to do, not yet promoted, gets
  N new-version allocs beside the old ones before anything old is replaced.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from drover.scheduler.structs import (
    ALLOC_CLIENT_FAILED,
    DEPLOYMENT_STATUS_FAILED,
    DEPLOYMENT_STATUS_PAUSED,
    JOB_TYPE_SERVICE,
    Allocation,
    Deployment,
    DeploymentState,
    Job,
    TaskGroup,
    UpdateStrategy,
)

__all__ = ["RolloutGate", "is_canary", "rollout_gate", "update_strategy"]


def update_strategy(job: Job, group: TaskGroup) -> UpdateStrategy | None:
    """The group's update block (the job's, merged in by canonicalisation, as fallback)."""
    return group.update or job.update


def is_canary(alloc: Allocation) -> bool:
    """A canary not promoted yet (promotion clears the flag)."""
    return alloc.deployment_status is not None and alloc.deployment_status.canary


@dataclass(frozen=True, slots=True)
class RolloutGate:
    """What one group's deployment allows in this pass.

    ``rolls``: the group is deployed batch by batch (else all at once, no deployment).
    ``place_ready``: new slots may be filled and failed allocs of the deployment replaced
    (not while paused or failed). ``promoted``/``canary``: whether the group's canaries
    were promoted, and how many its update block asks for (the reconciler wants them only
    with destructive work to do and before promotion). ``budget_when_rolling``:
    destructive updates allowed now once canaries are done (None: no limit).
    """

    rolls: bool
    place_ready: bool
    promoted: bool
    canary: int
    budget_when_rolling: int | None

    def budget(self, canarying: bool) -> int | None:
        return 0 if canarying else self.budget_when_rolling


def _state(deployment: Deployment | None, group: str) -> DeploymentState | None:
    return deployment.task_groups.get(group) if deployment is not None else None


def rollout_gate(
    job: Job, group: TaskGroup, deployment: Deployment | None, allocs: Iterable[Allocation]
) -> RolloutGate:
    """The gate for ``group`` under ``deployment`` (the job version's current deployment:
    active or failed; None when none exists yet or it succeeded)."""
    strategy = update_strategy(job, group)
    rolls = job.type == JOB_TYPE_SERVICE and strategy is not None and not strategy.is_empty()
    status = deployment.status if deployment is not None else ""
    place_ready = status not in (DEPLOYMENT_STATUS_PAUSED, DEPLOYMENT_STATUS_FAILED)
    state = _state(deployment, group.name)
    promoted = state is not None and state.promoted
    if not rolls or strategy is None:
        return RolloutGate(
            rolls=False, place_ready=place_ready, promoted=promoted, canary=0, budget_when_rolling=None
        )
    if not place_ready:
        budget = 0
    elif deployment is None:
        budget = strategy.max_parallel
    else:
        budget = _deployment_budget(strategy.max_parallel, deployment.id, allocs)
    return RolloutGate(
        rolls=True,
        place_ready=place_ready,
        promoted=promoted,
        canary=strategy.canary,
        budget_when_rolling=budget,
    )


def _deployment_budget(max_parallel: int, deployment_id: str, allocs: Iterable[Allocation]) -> int:
    """``max_parallel`` minus the deployment's allocs with no health verdict yet (live, or
    failed and not replaced); 0 while one of its allocs is unhealthy and not replaced (a
    live one, or a dead one with no replacement yet). One pass: a dead unhealthy alloc is
    judged once every replacement (``previous_allocation``) has been seen."""
    replaced: set[str] = set()
    dead_unhealthy: list[str] = []
    pending = 0
    for a in allocs:
        if a.previous_allocation:
            replaced.add(a.previous_allocation)
        if a.deployment_id != deployment_id:
            continue
        status = a.deployment_status
        verdict = status.health if status is not None else ""
        if not a.terminal():
            if not verdict:
                pending += 1
            elif status is not None and status.is_unhealthy():
                return 0
        elif a.client_status == ALLOC_CLIENT_FAILED and not verdict and not a.next_allocation:
            # Failed before its client's verdict came: the verdict is on its way in a
            # report of its own (client_agent/health.py), so the alloc keeps its slot.
            pending += 1
        elif status is not None and status.is_unhealthy() and not a.next_allocation:
            dead_unhealthy.append(a.id)
    if any(alloc_id not in replaced for alloc_id in dead_unhealthy):
        return 0
    return max(0, max_parallel - pending)
