"""The scheduler's seams: what it reads (``State``) and what it returns (``SchedulerResult``).

A scheduler is a pure function ``compute(eval, state, ctx) -> SchedulerResult``: it reads a
frozen snapshot, decides, and returns a plan plus eval updates. The worker (server/worker.py)
owns every side effect: submitting the plan, re-planning on a partial commit, writing evals.
Time, IDs and the shuffle seed come in through ``SchedulerContext``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from drover.scheduler.structs import (
    EVAL_STATUS_BLOCKED,
    EVAL_STATUS_COMPLETE,
    TRIGGER_QUEUED_ALLOCS,
    Allocation,
    AllocMetric,
    Deployment,
    Evaluation,
    Job,
    Node,
    Plan,
    SchedulerConfig,
    follow_up_eval,
)

if TYPE_CHECKING:
    import random

__all__ = [
    "Scheduler",
    "SchedulerContext",
    "SchedulerResult",
    "State",
    "blocked_follow_up",
    "completed_pass",
    "seed_from",
]


class State(Protocol):
    """A read-only snapshot (drover.server.state_store.Snapshot satisfies it; so do test harnesses)."""

    @property
    def index(self) -> int: ...

    def node(self, node_id: str) -> Node | None: ...

    def nodes(self) -> Iterable[Node]: ...

    def job(self, namespace: str, job_id: str) -> Job | None: ...

    def job_version(self, namespace: str, job_id: str, version: int) -> Job | None: ...

    def allocs_by_job(self, namespace: str, job_id: str) -> list[Allocation]: ...

    def allocs_by_node(self, node_id: str) -> list[Allocation]: ...

    def scheduler_config(self) -> SchedulerConfig: ...

    def latest_deployment(self, namespace: str, job_id: str) -> Deployment | None: ...


@dataclass(frozen=True, slots=True)
class SchedulerContext:
    """Everything non-deterministic a scheduler may use, decided by the caller."""

    now_ns: int
    # New IDs (allocs, follow-up evals). Tests pass a counter, servers pass uuid4.
    new_id: Callable[[], str]
    # Seeds node shuffles, so a placement can be replayed from the eval ID and index.
    seed: int = 0
    # Bounded candidate list for ranking (Nomad's limit iterator: log2(nodes), at least 2).
    candidate_limit: int = 0
    # The shuffle source, seeded by the caller (servers: random.Random(seed_from(eval, index)))
    # so a placement can be replayed; the scheduler never creates randomness itself.
    rng: random.Random | None = None


def seed_from(eval_id: str, snapshot_index: int) -> int:
    digest = hashlib.blake2b(f"{eval_id}:{snapshot_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass(frozen=True, slots=True)
class SchedulerResult:
    """What one scheduling pass decided.

    ``plan`` is None when nothing changes. ``eval_update`` is the processed eval with its
    final status (complete, blocked-with-a-blocked-eval, failed) and queued counts; the worker
    writes it after the plan commits. ``created_evals`` are follow-ups (a blocked eval for
    what could not be placed, a delayed eval for the next stagger batch or a reschedule).
    """

    plan: Plan | None
    eval_update: Evaluation
    created_evals: tuple[Evaluation, ...] = ()
    queued: Mapping[str, int] = field(default_factory=dict)
    # Named bucket counts per group, for logs, `drover job plan` and tests.
    annotations: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


def blocked_follow_up(
    ev: Evaluation,
    state: State,
    ctx: SchedulerContext,
    job: Job,
    *,
    queued: Mapping[str, int],
    failed_tg: Mapping[str, str],
    failed_metrics: Mapping[str, AllocMetric],
) -> Evaluation:
    """The blocked eval a pass leaves for what it could not place, whatever the job type:
    the blocked tracker (server/blocked.py) releases it when capacity changes after the
    snapshot it was decided on, and ``drover eval status`` explains it from its counts, so
    every scheduler must fill the same fields."""
    return replace(
        follow_up_eval(
            ev, ctx.new_id(), TRIGGER_QUEUED_ALLOCS, ctx.now_ns, job=job, status=EVAL_STATUS_BLOCKED
        ),
        snapshot_index=state.index,
        queued_allocations=dict(queued),
        failed_tg_allocs=dict(failed_tg),
        failed_tg_metrics=dict(failed_metrics),
    )


def completed_pass(
    ev: Evaluation,
    state: State,
    ctx: SchedulerContext,
    plan: Plan | None,
    *,
    created: Sequence[Evaluation],
    queued: Mapping[str, int],
    failed_tg: Mapping[str, str],
    failed_metrics: Mapping[str, AllocMetric],
    blocked_eval: str,
    next_eval: str,
    governing: Deployment | None,
    annotations: Mapping[str, Mapping[str, int]],
) -> SchedulerResult:
    """The result of a pass that ran to its end, whatever the job type: the eval complete as
    of this snapshot, naming the blocked eval and the follow-up it created, and the
    deployment its allocs join (the eval's own when the pass made or found none)."""
    eval_update = replace(
        ev,
        status=EVAL_STATUS_COMPLETE,
        status_description="",
        blocked_eval=blocked_eval,
        next_eval=next_eval,
        queued_allocations=queued,
        failed_tg_allocs=failed_tg,
        failed_tg_metrics=failed_metrics,
        snapshot_index=state.index,
        modify_time_ns=ctx.now_ns,
        deployment_id=governing.id if governing is not None else ev.deployment_id,
    )
    return SchedulerResult(
        plan=plan,
        eval_update=eval_update,
        created_evals=tuple(created),
        queued=queued,
        annotations=annotations,
    )


class Scheduler(Protocol):
    def __call__(self, ev: Evaluation, state: State, ctx: SchedulerContext) -> SchedulerResult: ...
