"""The generic scheduler: service and batch jobs.

``compute_generic(ev, state, ctx) -> SchedulerResult`` is a pure function of the eval, a
read-only snapshot and the context (time, ID source, shuffle seed). It returns the plan and
the evals to write; the worker submits, retries and writes them. The flow::

    job, allocs, tainted nodes, older versions  (read from the snapshot once)
        │
        ├─ per group: reconcile_group(...) ─► GroupResult buckets
        │
        ├─ phase 1: every stop and in-place update (so placements see the room the
        │           stops free); unknown marks and follow-up stamps as status-only
        │           node_update entries
        ├─ phase 2: placements: feasible_nodes + select_node, seeded from ctx.seed;
        │           a reschedule's failed alloc is stopped only if its replacement placed
        └─ phase 3: evals: one blocked eval per job for what did not fit and batched
                    reschedule follow-ups (held-back destructive updates need none: the
                    health verdict that opens room writes the eval that places them)

Contract: on the state after its plan commits, running ``compute_generic`` again (a new
eval, same time) yields no plan unless something was blocked or delayed (a created eval
says so). ``tests/unit/test_generic_scheduler.py`` checks this as a Hypothesis property.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Final

from drover.scheduler import deployments
from drover.scheduler.interfaces import (
    SchedulerContext,
    SchedulerResult,
    State,
    blocked_follow_up,
    completed_pass,
)
from drover.scheduler.placement import (
    PlanBuilder,
    feasible_nodes,
    new_alloc,
    placed_score,
    score_node,
    select_node,
    updated_in_place,
    with_deployment,
)
from drover.scheduler.reconciler.generic import (
    DelayedReschedule,
    GroupResult,
    ScoreFn,
    reconcile_group,
)
from drover.scheduler.reconciler.vocabulary import DESC_UNKNOWN, tainted_situation
from drover.scheduler.structs import (
    ALLOC_CLIENT_UNKNOWN,
    EVAL_STATUS_FAILED,
    JOB_TYPE_BATCH,
    JOB_TYPE_SERVICE,
    TRIGGER_NODE_DRAIN,
    TRIGGER_RETRY_FAILED_ALLOC,
    Allocation,
    AllocMetric,
    Evaluation,
    Job,
    Node,
    TaskGroup,
    follow_up_eval,
)

__all__ = [
    "GENERIC_JOB_TYPES",
    "RESCHEDULE_BATCH_WINDOW_NS",
    "batch_followups",
    "compute_generic",
    "tainted_nodes",
]

GENERIC_JOB_TYPES: Final = (JOB_TYPE_SERVICE, JOB_TYPE_BATCH)

# Failed allocs due within this window of the first one share one follow-up eval
# (Nomad's batchedFailedAllocWindowSize): a burst of failures makes one eval, not fifty.
RESCHEDULE_BATCH_WINDOW_NS: Final = 5_000_000_000

FAILED_NO_NODES: Final = "no node is feasible"
FAILED_EXHAUSTED: Final = "resources exhausted on every feasible node"


def tainted_nodes(state: State, allocs: Iterable[Allocation]) -> dict[str, Node | None]:
    """The tainted nodes of ``allocs`` (down, disconnected or draining; a deregistered node
    maps to None), as Nomad's taintedNodes. Terminal allocs count: their node decides too."""
    out: dict[str, Node | None] = {}
    seen: set[str] = set()
    for alloc in allocs:
        if alloc.node_id in seen:
            continue
        seen.add(alloc.node_id)
        node = state.node(alloc.node_id)
        if tainted_situation(node) is not None:
            out[alloc.node_id] = node
    return out


def batch_followups(
    delayed: Sequence[DelayedReschedule], window_ns: int = RESCHEDULE_BATCH_WINDOW_NS
) -> list[tuple[int, tuple[Allocation, ...]]]:
    """Group delayed reschedules into (wait_until, allocs) batches, earliest first: each batch
    starts at its earliest time and takes everything due less than ``window_ns`` later."""
    batches: list[tuple[int, list[Allocation]]] = []
    for item in sorted(delayed, key=lambda d: (d.at_ns, d.alloc.id)):
        if batches and item.at_ns - batches[-1][0] < window_ns:
            batches[-1][1].append(item.alloc)
        else:
            batches.append((item.at_ns, [item.alloc]))
    return [(at, tuple(allocs)) for at, allocs in batches]


def _target_job(ev: Evaluation, job: Job | None) -> Job:
    """The job to reconcile against: a purged job is a stopped stub (stop everything)."""
    if job is None:
        return Job(id=ev.job_id, name=ev.job_id, namespace=ev.namespace, type=ev.type, stop=True)
    return job


def _groups(job: Job, allocs: Iterable[Allocation]) -> list[TaskGroup]:
    """The job's groups, then groups only allocs remember (removed from the job: count 0)."""
    known = {g.name for g in job.groups}
    orphans = sorted({a.task_group for a in allocs} - known)
    return [*job.groups, *(TaskGroup(name=name, count=0) for name in orphans)]


def _job_versions(state: State, job: Job, allocs: Iterable[Allocation]) -> dict[int, Job]:
    out: dict[int, Job] = {}
    for version in sorted({a.job_version for a in allocs if a.job_version != job.version}):
        old = state.job_version(job.namespace, job.id, version)
        if old is not None:
            out[version] = old
    return out


def _untainted_outsiders(
    state: State, allocs: Iterable[Allocation], candidates: Sequence[Node], tainted: Mapping[str, Node | None]
) -> tuple[frozenset[str], frozenset[str]]:
    """Nodes of live allocs that are healthy but not candidates for the group, split in
    (infeasible, unplaceable): ready and eligible but rejected by the job's current version
    (datacenters or constraints changed), or not taking placements now (ineligible,
    initializing). Allocs on the first are updated destructively; on the second they keep
    what they run and are not updated in place (the plan applier would reject the node)."""
    ok = {n.id for n in candidates}
    infeasible: set[str] = set()
    unplaceable: set[str] = set()
    for alloc in allocs:
        node_id = alloc.node_id
        if (
            alloc.terminal()
            or node_id in tainted
            or node_id in ok
            or node_id in infeasible
            or node_id in unplaceable
        ):
            continue
        node = state.node(node_id)
        if node is not None and node.ready_for_placement():
            infeasible.add(node_id)
        else:
            unplaceable.add(node_id)
    return frozenset(infeasible), frozenset(unplaceable)


def _reconnect_score(builder: PlanBuilder, state: State, job: Job, group: TaskGroup) -> ScoreFn:
    """How each alloc's node ranked for the group: the reconnect picker keeps the
    better-ranked of an original and its replacement (docs/field-reports.md#field-report-3),
    as Nomad's ``best_score`` does. That is the score the alloc was placed with (its
    metrics' final score for its own node), so an original is judged by why it was put
    there, not by what ran beside it since. An alloc placed before allocs kept metrics
    has no stored score: for it this falls back to how ``select_node`` would rank its node
    today, as the state stands before this plan changes anything (each node holding its
    own copy)."""

    def score(alloc: Allocation) -> float | None:
        stored = placed_score(alloc)
        if stored is not None:
            return stored
        node = state.node(alloc.node_id)
        return score_node(builder, job, group, node) if node is not None else None

    return score


def compute_generic(ev: Evaluation, state: State, ctx: SchedulerContext) -> SchedulerResult:
    """Schedule one eval of a service or batch job (see the module docstring)."""
    job = state.job(ev.namespace, ev.job_id)
    if job is not None and job.type not in GENERIC_JOB_TYPES:
        return SchedulerResult(
            plan=None,
            eval_update=replace(
                ev,
                status=EVAL_STATUS_FAILED,
                status_description=f"the generic scheduler cannot handle {job.type!r} jobs",
                modify_time_ns=ctx.now_ns,
            ),
        )
    allocs = state.allocs_by_job(ev.namespace, ev.job_id)
    target = _target_job(ev, job)
    runnable = not (target.stop or target.is_template())
    groups = _groups(target, allocs)
    tainted = tainted_nodes(state, allocs)
    versions = _job_versions(state, target, allocs)
    deployment, deployment_updates = deployments.current_deployment(
        target, state.latest_deployment(ev.namespace, ev.job_id)
    )

    # Reconcile every group.
    builder = PlanBuilder(state, ev, job)
    results: dict[str, GroupResult] = {}
    candidates: dict[str, list[Node]] = {}
    for group in groups:
        mine = [a for a in allocs if a.task_group == group.name]
        candidates[group.name] = feasible_nodes(state, target, group) if runnable and group.count > 0 else []
        infeasible, unplaceable = (
            _untainted_outsiders(state, mine, candidates[group.name], tainted)
            if runnable
            else (frozenset(), frozenset())
        )
        results[group.name] = reconcile_group(
            target,
            group,
            mine,
            tainted,
            ctx.now_ns,
            deployment=deployment,
            eval_id=ev.id,
            job_versions=versions,
            infeasible_node_ids=infeasible,
            unplaceable_node_ids=unplaceable,
            score=_reconnect_score(builder, state, target, group) if runnable else None,
        )

    created: list[Evaluation] = []
    wanted = deployments.wanted_deployment(
        target, groups, results, allocs, deployment, new_id=ctx.new_id(), now_ns=ctx.now_ns
    )
    governing = wanted or (deployment if deployment is not None and deployment.active() else None)
    # group -> the deployment its new and updated allocs join (rolling groups only)
    joins: dict[str, str] = (
        {g.name: governing.id for g in deployments.rolling_groups(target, groups)}
        if governing is not None
        else {}
    )

    # Phase 1: stops, in-place updates, unknown marks, follow-up stamps.
    followup_of: dict[str, str] = {}
    delayed = [d for r in results.values() for d in r.reschedule_later]
    for at_ns, batch in batch_followups(delayed):
        followup = follow_up_eval(
            ev, ctx.new_id(), TRIGGER_RETRY_FAILED_ALLOC, ctx.now_ns, job=target, wait_until_ns=at_ns
        )
        created.append(followup)
        followup_of.update((a.id, followup.id) for a in batch)
    # Allocs held on draining nodes by migrate.max_parallel: one look again, when the
    # earliest of the groups' next settle or drain deadline comes.
    wakes = [r.migrate_wake_at_ns for r in results.values() if r.migrate_wake_at_ns]
    if wakes:
        created.append(
            follow_up_eval(
                ev, ctx.new_id(), TRIGGER_NODE_DRAIN, ctx.now_ns, job=target, wait_until_ns=min(wakes)
            )
        )
    for result in results.values():
        for stop in result.stop:
            builder.stop(stop.alloc, stop.description, client_status=stop.client_status)
        for alloc in result.update_inplace:
            builder.place(
                updated_in_place(alloc, target, ev, ctx.now_ns, deployment_id=joins.get(alloc.task_group, ""))
            )
        # Disconnecting: unknown, still desired to run (it may come back,
        # docs/field-reports.md#field-report-3).
        for alloc in result.disconnecting:
            builder.update_status(alloc, description=DESC_UNKNOWN, client_status=ALLOC_CLIENT_UNKNOWN)
        # The follow-up eval recorded, so no later pass makes another for the same failure.
        for d in result.reschedule_later:
            builder.update_status(d.alloc, followup_eval_id=followup_of[d.alloc.id])

    # Phase 2: placements. Allocs of one group ask for the same thing: after the first
    # that fits nowhere, the rest of the group cannot fit either (the rng is not consumed).
    rng = ctx.rng
    if rng is None:
        raise ValueError("SchedulerContext.rng is required: a generator seeded from the eval (seed_from)")
    unplaced: dict[str, int] = {}
    failed_tg: dict[str, str] = {}
    failed_metrics: dict[str, AllocMetric] = {}
    for group in groups:
        exhausted = False
        for p in results[group.name].place:
            choice = None
            if not exhausted:
                choice = select_node(
                    builder,
                    target,
                    group,
                    candidates[group.name],
                    ctx,
                    rng,
                    penalty_node_ids=p.penalty_node_ids,
                )
            if choice is None:
                # The first failure's metric says why (failed_tg_metrics); the rest are
                # counted in it below, as Nomad's coalesced failures.
                metric = builder.stats.last_metric
                if not exhausted and metric is not None:
                    failed_metrics[group.name] = metric
                exhausted = True
                unplaced[group.name] = unplaced.get(group.name, 0) + 1
                failed_tg[group.name] = FAILED_EXHAUSTED if candidates[group.name] else FAILED_NO_NODES
                continue
            builder.place(
                new_alloc(
                    ev,
                    target,
                    group,
                    choice,
                    ctx,
                    name=p.name,
                    index=p.index,
                    previous_id=p.previous.id if p.previous is not None else "",
                    reschedule_events=p.reschedule_events,
                    deployment_id=joins.get(group.name, ""),
                    canary=p.canary,
                )
            )
            if p.stop_previous is not None:
                builder.stop(
                    p.stop_previous.alloc,
                    p.stop_previous.description,
                    client_status=p.stop_previous.client_status,
                )
        first_failure = failed_metrics.get(group.name)
        if first_failure is not None and unplaced[group.name] > 1:
            failed_metrics[group.name] = replace(first_failure, coalesced_failures=unplaced[group.name] - 1)

    # Phase 3: evals.
    queued = {g.name: unplaced.get(g.name, 0) for g in target.groups}
    blocked_id = ""
    if unplaced:
        blocked = blocked_follow_up(
            ev, state, ctx, target, queued=queued, failed_tg=failed_tg, failed_metrics=failed_metrics
        )
        blocked_id = blocked.id
        created.append(blocked)
    plan = builder.build()
    if wanted is not None and deployment is None and (plan is None or not plan.node_allocation):
        # Nothing placed: the eval that places the first alloc (the blocked one) makes it.
        wanted = None
        governing = None
    if deployment is not None and wanted is None and deployments.deployment_complete(deployment, results):
        deployment_updates = (*deployment_updates, deployments.success(deployment))
    plan = with_deployment(plan, ev, state.index, wanted, deployment_updates)

    return completed_pass(
        ev,
        state,
        ctx,
        plan,
        created=created,
        queued=queued,
        failed_tg=failed_tg,
        failed_metrics=failed_metrics,
        blocked_eval=blocked_id,
        next_eval="",
        governing=governing,
        annotations={name: r.counts() for name, r in results.items()},
    )
