"""The system and sysbatch scheduler: ``compute_system(ev, state, ctx) -> SchedulerResult``.

Reads the job at its current version and everything about its nodes from the snapshot,
asks ``drover.scheduler.reconciler.system.diff_system_allocs`` for the buckets, and turns them into a
plan with ``PlanBuilder``. One pass, no retries: the worker owns submission and refresh.

Bucket -> plan (scheduler/README.md has the flow diagram):

* stop, migrate          -> stop (desired stop) with the bucket's description
* lost                   -> stop with client status "lost"
* update_destructive     -> stop the old alloc (unless already finished: a sysbatch re-run)
                            and place a new one on the same node, previous_allocation set
* update_inplace         -> same alloc ID re-upserted with the new job_version
* place                  -> a new alloc on that node (previous_allocation = the newest
                            finished alloc of the slot there, if any)
* disconnecting          -> a status-only node_update entry: desired status stays *run*,
                            client status "unknown" (``PlanBuilder.update_status``)
* reconnecting, ignore   -> nothing
* deferred               -> nothing now; one follow-up eval (rolling-update) at now + stagger,
                            none while the deployment blocks (its unblocking writes one)

A placement that does not fit is counted in ``queued_allocations`` and yields one blocked
eval for the job. The result is a fixed point: committed as planned, a second pass over the
new state plans nothing (tests/unit/test_system_scheduler.py checks it as a property).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
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
    place_on_node,
    updated_in_place,
    with_deployment,
)
from drover.scheduler.placement.metrics import coalesce
from drover.scheduler.reconciler.system import AllocTuple, SystemDiff, diff_system_allocs
from drover.scheduler.reconciler.vocabulary import DESC_UNKNOWN, stagger_ns
from drover.scheduler.structs import (
    ALLOC_CLIENT_LOST,
    ALLOC_CLIENT_UNKNOWN,
    EVAL_STATUS_FAILED,
    JOB_TYPE_SYSBATCH,
    JOB_TYPE_SYSTEM,
    TRIGGER_ROLLING_UPDATE,
    Allocation,
    AllocMetric,
    Deployment,
    Evaluation,
    Job,
    Node,
    Plan,
    follow_up_eval,
)

SYSTEM_JOB_TYPES: Final = (JOB_TYPE_SYSTEM, JOB_TYPE_SYSBATCH)

# How many node IDs a failed-placement message names before it says "and N more".
_FAILED_NODES_SHOWN: Final = 5


@dataclass(frozen=True, slots=True)
class SystemInputs:
    """What the diff needs, read from the snapshot in one place."""

    nodes_ready: Mapping[str, Node]
    # Every other node of the job's allocs: tainted, unplaceable or outside the job's
    # datacenters (None: deregistered).
    nodes_not_ready: Mapping[str, Node | None]
    allocs: tuple[Allocation, ...]
    infeasible: Mapping[str, frozenset[str]]
    drain_pending: frozenset[str]
    job_versions: Mapping[int, Job]


@dataclass(frozen=True, slots=True)
class PlanOutcome:
    plan: Plan | None
    # group -> IDs of the nodes where a placement did not fit
    failed: Mapping[str, tuple[str, ...]]
    # group -> those failures' metrics, coalesced into one (the eval's failed_tg_metrics)
    failed_metrics: Mapping[str, AllocMetric] = field(default_factory=dict)


def read_inputs(state: State, namespace: str, job_id: str, job: Job | None) -> SystemInputs:
    allocs = tuple(state.allocs_by_job(namespace, job_id))
    ready: dict[str, Node] = {}
    feasible: dict[str, set[str]] = {}
    if job is not None and not job.stop:
        for group in job.groups:
            nodes = feasible_nodes(state, job, group)
            feasible[group.name] = {n.id for n in nodes}
            ready.update((n.id, n) for n in nodes)
    infeasible = {name: frozenset(set(ready) - ids) for name, ids in feasible.items()}
    not_ready = {a.node_id: state.node(a.node_id) for a in allocs if a.node_id not in ready}
    live_here = {a.node_id for a in allocs if not a.terminal()}
    drain_pending = frozenset(
        node_id
        for node_id, node in not_ready.items()
        if node is not None and node.drain_strategy is not None and node_id in live_here
        if _holds_other_work(state, node_id)
    )
    versions: dict[int, Job] = {}
    if job is not None:
        for version in {a.job_version for a in allocs} - {job.version}:
            old = state.job_version(namespace, job_id, version)
            if old is not None:
                versions[version] = old
    return SystemInputs(ready, not_ready, allocs, infeasible, drain_pending, versions)


def _holds_other_work(state: State, node_id: str) -> bool:
    """Whether the node still runs service/batch allocs (the drainer moves those first).

    An alloc whose job is gone counts as other work: its own eval will stop it, and until
    then the node's system allocs keep serving it.
    """
    for alloc in state.allocs_by_node(node_id):
        if alloc.terminal():
            continue
        job = state.job(alloc.namespace, alloc.job_id)
        if job is None or job.type not in SYSTEM_JOB_TYPES:
            return True
    return False


def compute_system(ev: Evaluation, state: State, ctx: SchedulerContext) -> SchedulerResult:
    """One scheduling pass for a system or sysbatch job (the type comes from the job)."""
    job = state.job(ev.namespace, ev.job_id)
    if job is not None and job.type not in SYSTEM_JOB_TYPES:
        failed = replace(
            ev,
            status=EVAL_STATUS_FAILED,
            status_description=f"system scheduler cannot handle job type {job.type!r}",
            snapshot_index=state.index,
            modify_time_ns=ctx.now_ns,
        )
        return SchedulerResult(plan=None, eval_update=failed)

    inputs = read_inputs(state, ev.namespace, ev.job_id, job)
    target = job if job is not None else Job(id=ev.job_id, namespace=ev.namespace, type=ev.type, stop=True)
    deployment, deployment_updates = deployments.current_deployment(
        target, state.latest_deployment(ev.namespace, ev.job_id)
    )
    rollout = deployments.system_rollout(target, deployment, inputs.allocs)
    diff = diff_system_allocs(
        job,
        inputs.nodes_ready.values(),
        inputs.nodes_not_ready,
        inputs.allocs,
        ctx.now_ns,
        infeasible=inputs.infeasible,
        drain_pending=inputs.drain_pending,
        job_versions=inputs.job_versions,
        rollout=rollout,
    )
    wanted = _new_deployment(target, diff, inputs, deployment, ctx)
    governing = wanted or (deployment if deployment is not None and deployment.active() else None)
    outcome = build_plan(state, ev, job, diff, inputs.nodes_ready, ctx, deployment=governing)
    if wanted is not None and (outcome.plan is None or not outcome.plan.node_allocation):
        # Nothing placed: the eval that places the first alloc (the blocked one) makes it.
        wanted = governing = None
    if deployment is not None and deployments.system_complete(deployment, diff):
        deployment_updates = (*deployment_updates, deployments.success(deployment))
    plan = with_deployment(outcome.plan, ev, state.index, wanted, deployment_updates)

    groups = [g.name for g in job.groups] if job is not None else []
    queued = {name: len(outcome.failed.get(name, ())) for name in groups}
    failed_tg = {name: _failed_message(nodes) for name, nodes in outcome.failed.items() if nodes}
    created: list[Evaluation] = []
    blocked_id = next_id = ""
    if failed_tg and job is not None:
        blocked = blocked_follow_up(
            ev, state, ctx, job, queued=queued, failed_tg=failed_tg, failed_metrics=outcome.failed_metrics
        )
        created.append(blocked)
        blocked_id = blocked.id
    # Held back by the stagger or for health: look again after the stagger. Held back by a
    # blocked rollout (paused, failed, or an unhealthy alloc the watcher fails it for):
    # nothing changes until a resume, a failure or a new version, each of which writes its
    # own eval (a timer would only write the next timer).
    timed = {t.group for t in diff.deferred if t.group not in rollout or not rollout[t.group].blocked}
    if timed and job is not None:
        wait = min(stagger_ns(job, g) for g in job.groups if g.name in timed)
        rolling = follow_up_eval(
            ev, ctx.new_id(), TRIGGER_ROLLING_UPDATE, ctx.now_ns, job=job, wait_until_ns=ctx.now_ns + wait
        )
        created.append(rolling)
        next_id = rolling.id

    return completed_pass(
        ev,
        state,
        ctx,
        plan,
        created=created,
        queued=queued,
        failed_tg=failed_tg,
        failed_metrics=dict(outcome.failed_metrics),
        blocked_eval=blocked_id,
        next_eval=next_id or ev.next_eval,
        governing=governing,
        annotations=diff.counts_by_group(groups),
    )


# One function for both types: the job says which rules apply (sysbatch: count per node,
# finished allocs are not re-run).
compute_sysbatch = compute_system


def _new_deployment(
    job: Job, diff: SystemDiff, inputs: SystemInputs, current: Deployment | None, ctx: SchedulerContext
) -> Deployment | None:
    """The deployment a system job's changed version starts with, if this pass places or
    updates anything (decided before placing, so each alloc is minted into it)."""
    if job.type != JOB_TYPE_SYSTEM or not (diff.place or diff.update_destructive or diff.update_inplace):
        return None
    totals = {
        g.name: (len(inputs.nodes_ready) - len(inputs.infeasible.get(g.name, frozenset()))) * g.count
        for g in job.groups
    }
    return deployments.wanted_system_deployment(
        job, diff, inputs.allocs, current, totals, new_id=ctx.new_id(), now_ns=ctx.now_ns
    )


def build_plan(
    state: State,
    ev: Evaluation,
    job: Job | None,
    diff: SystemDiff,
    nodes_ready: Mapping[str, Node],
    ctx: SchedulerContext,
    *,
    deployment: Deployment | None = None,
) -> PlanOutcome:
    """The diff as a plan. Stops go in first, so placements see what they free. The allocs
    of ``deployment``'s groups it places or updates in place join it."""
    joins = {name: deployment.id for name in deployment.task_groups} if deployment is not None else {}
    builder = PlanBuilder(state, ev, job)
    for t in (*diff.stop, *diff.migrate):
        builder.stop(_existing(t), t.reason)
    for t in diff.lost:
        builder.stop(_existing(t), t.reason, client_status=ALLOC_CLIENT_LOST)
    for t in diff.update_destructive:
        if t.alloc is not None and not t.alloc.terminal():
            builder.stop(t.alloc, t.reason)
    for t in diff.disconnecting:
        # Unknown, still desired to run: its node may come back (docs/field-reports.md#field-report-3).
        builder.update_status(_existing(t), description=DESC_UNKNOWN, client_status=ALLOC_CLIENT_UNKNOWN)

    failed: dict[str, list[str]] = defaultdict(list)
    failed_metrics: dict[str, AllocMetric] = {}
    if job is not None:
        for t in diff.update_inplace:
            alloc = _existing(t)
            builder.place(
                updated_in_place(alloc, job, ev, ctx.now_ns, deployment_id=joins.get(alloc.task_group, ""))
            )
        for t in sorted((*diff.place, *diff.update_destructive), key=lambda t: (t.node_id, t.name)):
            group = job.lookup_group(t.group)
            node = nodes_ready.get(t.node_id)
            if group is None or node is None:  # pragma: no cover - the diff only places there
                continue
            choice = place_on_node(builder, job, group, node)
            if choice is None:
                failed[group.name].append(node.id)
                if builder.stats.last_metric is not None:
                    failed_metrics[group.name] = coalesce(
                        failed_metrics.get(group.name), builder.stats.last_metric
                    )
                continue
            builder.place(
                new_alloc(
                    ev,
                    job,
                    group,
                    choice,
                    ctx,
                    name=t.name,
                    index=t.index,
                    previous_id=t.alloc.id if t.alloc is not None else "",
                    deployment_id=joins.get(group.name, ""),
                )
            )
    return PlanOutcome(
        builder.build(), {name: tuple(nodes) for name, nodes in failed.items()}, failed_metrics
    )


def _existing(t: AllocTuple) -> Allocation:
    if t.alloc is None:  # pragma: no cover - only place tuples lack an alloc
        raise AssertionError(f"bucket entry {t.name} on {t.node_id} has no alloc")
    return t.alloc


def _failed_message(node_ids: Iterable[str]) -> str:
    ids = sorted(node_ids)
    shown = ", ".join(ids[:_FAILED_NODES_SHOWN])
    more = f" and {len(ids) - _FAILED_NODES_SHOWN} more" if len(ids) > _FAILED_NODES_SHOWN else ""
    return f"no room on {len(ids)} node(s): {shown}{more}"


__all__ = [
    "SYSTEM_JOB_TYPES",
    "PlanOutcome",
    "SystemInputs",
    "build_plan",
    "compute_sysbatch",
    "compute_system",
    "read_inputs",
]
