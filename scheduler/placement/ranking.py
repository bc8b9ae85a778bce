"""Ranking: which node gets the next alloc of a group, as the plan stands.

*Per (job, group) preparation.* Constraints, affinities, spread and distinct_property
counters are compiled the first time a group is placed (``PreparedGroup``) and reused for
every later alloc of the group. The property counters live in the plan's node views.

*Candidate ring.* Like Nomad's stack, candidates are shuffled once (with the caller's
``rng``) per (group, candidate list) and then visited as a ring (``CandidateRing``): each
``select_node`` call continues where the previous one stopped and scores at most ``limit``
nodes that fit. So a placement costs O(limit), not O(nodes), and consecutive replicas land
on different nodes. The fit check and the view-only part of a node's score are cached
against the view's version: between two visits a node has changed only if it won in between.

*Dropped nodes.* A node that does not fit (or breaks distinct_hosts / distinct_property)
cannot start fitting while the plan only grows, so it leaves the ring. It comes back when
its own view loses an alloc (a stop, an in-place replacement); every node comes back when
a distinct_property count drops. Pass the same candidate list object to every call of a
pass: a different list starts a new ring.

*Metrics.* Every selection leaves its ``AllocMetric`` (``drover.scheduler.placement.metrics``):
the feasibility report of the candidate list, the ring's dropped nodes by reason (each
node is dropped with one), the nodes ranked, and the top five's scores by component. The
chosen alloc carries it (``NodeChoice.metrics``); a failed selection's is
``builder.stats.last_metric``.

*Scores.* The formulas are in ``drover.scheduler.placement.scores``: binpack (or spread, per the scheduler
config), job anti-affinity, affinities, spread blocks and the reschedule penalty, averaged
over the components that apply, as Nomad's ``ScoreNormalizationIterator`` does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING

from drover.scheduler._records import replacer
from drover.scheduler.fit import allocs_fit, cpu_per_core_mhz
from drover.scheduler.placement import scores
from drover.scheduler.placement.feasible import (
    DISTINCT_HOSTS_GROUP,
    DISTINCT_HOSTS_JOB,
    REASON_DISTINCT_HOSTS,
    REASON_DISTINCT_PROPERTY,
    Feasibility,
    FilterReport,
    compile_feasibility,
    distinct_hosts_scope,
    distinct_properties,
)
from drover.scheduler.placement.metrics import MAX_SCORE_META, placement_metric, report_of
from drover.scheduler.placement.ports import group_ports, pick_port_values, reuse_ports
from drover.scheduler.placement.views import (
    DIMENSION_DYNAMIC_PORTS,
    DIMENSION_PORTS,
    NodeCaps,
    NodeView,
    NodeViews,
    PropertyCounter,
    exhausted_dimension,
    view_fits,
)
from drover.scheduler.structs import (
    SCHEDULER_ALGORITHM_SPREAD,
    AllocatedPort,
    AllocatedResources,
    Allocation,
    AllocMetric,
    Job,
    Node,
    NodeScoreMeta,
    TaskGroup,
)

if TYPE_CHECKING:  # the caller's seeded Random; scheduler/ never imports random at run time
    import random

    from drover.scheduler.interfaces import SchedulerContext, State
    from drover.scheduler.placement.plan import PlanBuilder

__all__ = [
    "CandidateRing",
    "NodeChoice",
    "PlacementStats",
    "PreparedGroup",
    "PreparedGroups",
    "place_on_node",
    "score_node",
    "select_node",
]


@dataclass(frozen=True, slots=True)
class NodeChoice:
    node: Node
    # Resources for the new alloc: the group's cpu/memory/disk and its ports with every
    # dynamic port assigned (static ports as requested).
    resources: AllocatedResources
    score: float = 0.0
    # How the choice was made (Nomad's AllocMetric): the new alloc keeps it.
    metrics: AllocMetric | None = None


@dataclass(slots=True)
class PlacementStats:
    """Counters over a builder's life, for `job plan` output and tests."""

    selections: int = 0  # select_node / place_on_node calls
    nodes_evaluated: int = 0  # candidates looked at
    nodes_filtered: int = 0  # rejected by constraints, distinct_hosts or distinct_property
    nodes_exhausted: int = 0  # rejected for cpu, memory, disk, max allocs or ports
    nodes_scored: int = 0  # fitting candidates ranked
    # The metrics of the latest selection, placed or not: a failed one's is what the eval
    # reports as the group's failed_tg_metrics.
    last_metric: AllocMetric | None = None


class CandidateRing:
    """The shuffled candidate ring of one (group, candidate list); see the module docstring.

    ``dead`` nodes are still in ``order`` but skipped; once they are more than half of it
    they move to ``removed``. A node whose view lost an alloc (``NodeViews.freed``) comes
    back: out of ``dead``, or from ``removed`` to the end of the ring. A change of a
    distinct_property count (``NodeViews.epoch``) can free any node: the whole ring comes
    back.

    Each dropped node keeps why it was dropped (a filter reason or an exhausted
    dimension), and ``filtered`` / ``exhausted`` count the dropped nodes by reason, so a
    placement's metrics include the nodes the ring no longer looks at without a pass over
    them. ``reasons_version`` moves whenever those counts do.
    """

    __slots__ = (
        "base",
        "candidates",
        "dead",
        "epoch",
        "exhausted",
        "filtered",
        "freed_seen",
        "identity",
        "index",
        "limit",
        "metric_template",
        "order",
        "pos",
        "reasons_version",
        "removed",
        "removed_reason",
    )

    def __init__(self, candidates: Sequence[Node], base: list[Node], epoch: int, freed_seen: int) -> None:
        self.candidates = candidates
        self.identity = tuple(map(id, candidates))
        self.base = base
        self.order = base
        self.pos = 0
        self.dead: dict[str, str] = {}  # node ID -> why it was dropped
        self.removed: dict[str, Node] = {}
        self.removed_reason: dict[str, str] = {}
        self.filtered: dict[str, int] = {}  # filter reason -> dropped nodes
        self.exhausted: dict[str, int] = {}  # exhausted dimension -> dropped nodes
        self.reasons_version = 0
        # (reasons_version, report, the metric's fields but the ranking), see _metric.
        self.metric_template: tuple[int, FilterReport, AllocMetric] | None = None
        self.epoch = epoch
        self.freed_seen = freed_seen
        self.index: dict[str, int] | None = None
        self.limit: tuple[int, int] = (-1, 0)  # (configured, limit), see select_node

    def drop(self, node_id: str, reason: str, *, exhausted: bool) -> None:
        """Skip ``node_id`` until its view frees room; ``reason`` says why, for metrics."""
        self.dead[node_id] = reason
        counts = self.exhausted if exhausted else self.filtered
        counts[reason] = counts.get(reason, 0) + 1
        self.reasons_version += 1

    def _forget_reason(self, reason: str) -> None:
        counts = self.filtered if reason in self.filtered else self.exhausted
        left = counts.get(reason, 0) - 1
        if left > 0:
            counts[reason] = left
        else:
            counts.pop(reason, None)
        self.reasons_version += 1

    def refresh(self, epoch: int, freed: list[str]) -> list[Node]:
        if epoch != self.epoch:
            self.epoch = epoch
            self.freed_seen = len(freed)
            if self.dead or self.order is not self.base:
                current = self.order[self.pos] if self.order else None
                if self.index is None:
                    self.index = {n.id: i for i, n in enumerate(self.base)}
                self.order = self.base
                self.pos = self.index[current.id] if current is not None else 0
                self.dead.clear()
                self.removed.clear()
                self.removed_reason.clear()
                self.filtered.clear()
                self.exhausted.clear()
                self.reasons_version += 1
            return self.order
        if self.freed_seen < len(freed):
            for node_id in freed[self.freed_seen :]:
                reason = self.dead.pop(node_id, None)
                if reason is not None:
                    self._forget_reason(reason)
                    continue
                node = self.removed.pop(node_id, None)
                if node is not None:  # (removed is only non-empty after a compaction copied order)
                    self._forget_reason(self.removed_reason.pop(node_id))
                    self.order.append(node)
            self.freed_seen = len(freed)
        if self.dead and 2 * len(self.dead) > len(self.order):
            kept: list[Node] = []
            pos = 0
            dead = self.dead
            for i, node in enumerate(self.order):
                if i == self.pos:
                    pos = len(kept)
                reason = dead.get(node.id)
                if reason is not None:
                    self.removed[node.id] = node
                    self.removed_reason[node.id] = reason
                else:
                    kept.append(node)
            self.order = kept
            self.pos = pos if pos < len(kept) else 0
            self.dead.clear()
        return self.order


# Rings kept per group: a pass uses one candidate list, a retry or another pass another.
_MAX_RINGS = 4

# PreparedGroup.distinct_hosts: which allocs a node may not already hold.
_DISTINCT_NONE, _DISTINCT_JOB, _DISTINCT_GROUP = 0, 1, 2


class PreparedGroup:
    """Everything about one (job, group) that placing its allocs needs, compiled once."""

    __slots__ = (
        "affinity",
        "affinity_cache",
        "cache",
        "cores",
        "cpu",
        "desired",
        "disk",
        "distinct",
        "distinct_hosts",
        "dynamic",
        "feasibility",
        "group",
        "group_key",
        "job",
        "job_key",
        "mem",
        "meta_cache",
        "plain",
        "port_cache",
        "port_specs",
        "rings",
        "spread_algorithm",
        "spreads",
        "static",
        "static_values",
        "wide",
    )

    def __init__(self, views: NodeViews, job: Job, group: TaskGroup, *, spread_algorithm: bool) -> None:
        self.job = job
        self.group = group
        self.spread_algorithm = spread_algorithm
        self.feasibility: Feasibility = compile_feasibility(job, group)
        total = group.total_resources()
        # cpu: without the tasks' reserved cores, whose MHz depend on the node (cpu_on).
        self.cpu, self.mem, self.disk = total.cpu_mhz, total.memory_mb, total.disk_mb
        self.cores = total.cores
        self.static, self.dynamic = group_ports(group)
        self.static_values = tuple(p.value for p in self.static)
        self.port_specs = (*self.static, *self.dynamic)
        self.port_cache: dict[tuple[int, int], AllocatedPort] = {}
        self.plain: AllocatedResources | None = None
        if not self.static and not self.dynamic and not self.cores:
            self.plain = AllocatedResources(cpu_mhz=self.cpu, memory_mb=self.mem, disk_mb=self.disk)
        ns = job.namespace
        self.job_key = (ns, job.id)
        self.group_key = (ns, job.id, group.name)
        self.desired = max(group.count, 1)
        scope = distinct_hosts_scope(job, group)
        self.distinct_hosts = (
            _DISTINCT_JOB
            if scope == DISTINCT_HOSTS_JOB
            else _DISTINCT_GROUP
            if scope == DISTINCT_HOSTS_GROUP
            else _DISTINCT_NONE
        )
        self.distinct: tuple[tuple[PropertyCounter, int], ...] = tuple(
            (views.counter(ns, job.id, group.name if p.group_scoped else None, p.target), p.limit)
            for p in distinct_properties(job, group)
        )
        for counter, _ in self.distinct:
            counter.distinct = True
        self.affinity = scores.compile_affinities(job.affinities + group.affinities)
        self.affinity_cache: dict[str, float] = {}
        spreads = [s for s in job.spreads + group.spreads if s.weight > 0]
        weights = sum(s.weight for s in spreads)
        self.spreads = tuple(
            (
                views.counter(ns, job.id, group.name, s.attribute),
                s.weight / weights,
                scores.spread_desired(s, group.count),
            )
            for s in spreads
        )
        self.wide = self.affinity is not None or bool(self.spreads)
        self.rings: list[CandidateRing] = []
        # node ID -> (view, its version, score sum, component count, mean): see _scan.
        self.cache: dict[str, tuple[NodeView, int, float, int, float]] = {}
        # node ID -> (view version, its NodeScoreMeta), for groups without per-call parts:
        # a node's breakdown only changes when its view does.
        self.meta_cache: dict[str, tuple[int, NodeScoreMeta]] = {}

    def ring(
        self, candidates: Sequence[Node], rng: random.Random, epoch: int, freed_seen: int
    ) -> CandidateRing:
        for ring in self.rings:
            if ring.candidates is candidates:
                return ring
        identity = tuple(map(id, candidates))
        for ring in self.rings:
            if ring.identity == identity:  # the same nodes in the same order, another list
                ring.candidates = candidates
                return ring
        base = list(candidates)
        rng.shuffle(base)
        ring = CandidateRing(candidates, base, epoch, freed_seen)
        self.rings.insert(0, ring)
        del self.rings[_MAX_RINGS:]
        return ring

    def hosts_ok(self, view: NodeView) -> bool:
        if self.distinct_hosts == _DISTINCT_JOB:
            return not view.jobs.get(self.job_key)
        if self.distinct_hosts == _DISTINCT_GROUP:
            return not view.groups.get(self.group_key)
        return True

    def props_ok(self, node: Node) -> bool:
        for counter, limit in self.distinct:
            value = counter.value_of(node)
            if value is None or counter.counts.get(value, 0) >= limit:
                return False
        return True

    def distinct_ok(self, view: NodeView, node: Node) -> bool:
        return self.hosts_ok(view) and self.props_ok(node)

    def cpu_on(self, node: Node) -> int:
        """The CPU one alloc takes on ``node``: the tasks' MHz plus their reserved cores at
        the node's MHz per core (``fit.cpu_per_core_mhz``)."""
        return self.cpu + self.cores * cpu_per_core_mhz(node) if self.cores else self.cpu

    def resources_on(
        self, node: Node, used: NodeView | set[int], rng: random.Random | None
    ) -> AllocatedResources | None:
        if self.plain is not None:
            return self.plain
        held = used.ports if isinstance(used, NodeView) else used
        values = pick_port_values(node, self.static, self.dynamic, held, rng)
        if values is None:
            return None
        # AllocatedPort values are immutable: share one per (label, port) across the plan.
        made = self.port_cache
        ports = []
        for i, value in enumerate(values):
            port = made.get((i, value))
            if port is None:
                spec = self.port_specs[i]
                port = made[(i, value)] = AllocatedPort(label=spec.label, value=value, to=spec.to)
            ports.append(port)
        return AllocatedResources(
            cpu_mhz=self.cpu_on(node), memory_mb=self.mem, disk_mb=self.disk, ports=tuple(ports)
        )

    def affinity_of(self, node: Node) -> float:
        assert self.affinity is not None
        score = self.affinity_cache.get(node.id)
        if score is None:
            score = self.affinity_cache[node.id] = self.affinity(node)
        return score

    def spread_of(self, node: Node) -> float:
        total = 0.0
        for counter, weight, desired in self.spreads:
            if desired is not None:
                total += weight * scores.spread_target_boost(desired, counter.value_of(node), counter.counts)
                continue
            bounds = counter.bounds()
            if bounds is None:
                continue
            value = counter.value_of(node)
            if value is None:
                total -= weight
                continue
            count = counter.counts.get(value, 0)
            total += weight * scores.spread_boost_between(count, min(bounds[0], count), max(bounds[1], count))
        return total

    def base_score(self, node: Node, view: NodeView, caps: NodeCaps) -> tuple[float, int]:
        """(sum, count) of the components that depend only on the node's view: binpack,
        job anti-affinity and affinities. Cacheable against ``view.version``."""
        score = scores.binpack_score(
            view.cpu + self.cpu_on(node), caps[0], view.mem + self.mem, caps[1], spread=self.spread_algorithm
        )
        parts = 1
        collisions = view.groups.get(self.group_key, 0)
        if collisions:
            score += scores.anti_affinity_penalty(collisions, self.desired)
            parts += 1
        if self.affinity is not None:
            affinity = self.affinity_of(node)
            if affinity:
                score += affinity
                parts += 1
        return score, parts

    def score_meta(
        self, node: Node, view: NodeView, caps: NodeCaps, penalized: bool, final: float
    ) -> NodeScoreMeta:
        """The node's score by component (Nomad's names), with ``final`` as ranked.

        binpack always; the others only where they apply (a component that is 0 is not
        averaged in, and readers show it as 0). Every alloc keeps up to five of these, in
        the state and in raft entries on every server, so what carries no information is
        left out: a metric costs a few dozen bytes per node, not a hundred.
        """
        components = {
            scores.SCORE_BINPACK: scores.binpack_score(
                view.cpu + self.cpu_on(node),
                caps[0],
                view.mem + self.mem,
                caps[1],
                spread=self.spread_algorithm,
            )
        }
        collisions = view.groups.get(self.group_key, 0)
        if collisions:
            components[scores.SCORE_JOB_ANTI_AFFINITY] = scores.anti_affinity_penalty(
                collisions, self.desired
            )
        if penalized:
            components[scores.SCORE_RESCHEDULE_PENALTY] = scores.RESCHEDULE_PENALTY
        if self.affinity is not None:
            affinity = self.affinity_of(node)
            if affinity:
                components[scores.SCORE_NODE_AFFINITY] = affinity
        if self.spreads:
            spread = self.spread_of(node)
            if spread:
                components[scores.SCORE_SPREAD] = spread
        return _new_score_meta(_SCORE_META, node.id, components, final)

    def cached_score_meta(self, node: Node, view: NodeView, caps: NodeCaps, final: float) -> NodeScoreMeta:
        """``score_meta`` for a group whose score depends on the view alone (no penalty,
        spread or distinct_property): one breakdown per node and view version."""
        node_id = node.id
        version = view.version
        hit = self.meta_cache.get(node_id)
        if hit is not None and hit[0] == version:
            return hit[1]
        entry = self.cache.get(node_id)
        if entry is not None and entry[1] == version and entry[3] == 1:
            # Only binpack applied (the common case), and the scan has it: no recomputing.
            meta = _new_score_meta(_SCORE_META, node_id, {scores.SCORE_BINPACK: entry[2]}, final)
        else:
            meta = self.score_meta(node, view, caps, False, final)
        self.meta_cache[node_id] = (version, meta)
        return meta

    def score(self, node: Node, view: NodeView, caps: NodeCaps, penalized: bool) -> float:
        score, parts = self.base_score(node, view, caps)
        if penalized:
            score += scores.RESCHEDULE_PENALTY
            parts += 1
        if self.spreads:
            spread = self.spread_of(node)
            if spread:
                score += spread
                parts += 1
        return score / parts


class PreparedGroups:
    """The ``PreparedGroup`` of every (job, group) one plan places."""

    __slots__ = ("_last", "_prepared", "_spread_algorithm", "_state", "_views")

    def __init__(self, state: State, views: NodeViews) -> None:
        self._state = state
        self._views = views
        self._prepared: dict[tuple[str, str, int, str], PreparedGroup] = {}
        self._last: PreparedGroup | None = None
        self._spread_algorithm: bool | None = None

    def get(self, job: Job, group: TaskGroup) -> PreparedGroup:
        last = self._last
        if last is not None and last.group is group and last.job is job:
            return last
        key = (job.namespace, job.id, job.version, group.name)
        prep = self._prepared.get(key)
        if prep is None or not (
            (prep.group is group and prep.job is job) or (prep.group == group and prep.job == job)
        ):
            if self._spread_algorithm is None:
                algorithm = self._state.scheduler_config().scheduler_algorithm
                self._spread_algorithm = algorithm == SCHEDULER_ALGORITHM_SPREAD
            prep = PreparedGroup(self._views, job, group, spread_algorithm=self._spread_algorithm)
            self._prepared[key] = prep
        self._last = prep
        return prep


_Scored = tuple[float, Node, NodeView]


def _scan(
    builder: PlanBuilder,
    prep: PreparedGroup,
    ring: CandidateRing,
    limit: int,
    penalty_node_ids: frozenset[str],
    scored: list[_Scored],
) -> _Scored | None:
    """One pass of the limit iterator over the ring: the best of up to ``limit`` fitting nodes.

    Hot path (called once per placement): the fit check and the view-only part of the score
    are cached per node against the view's version. Between two visits of a node the ring
    has moved on, and the node changed only if it won in between, so most visits hit.
    Every node ranked (skipped ones too) is appended to ``scored``, for the metrics; a node
    dropped from the ring is dropped with its reason.
    """
    views = builder.views
    order = ring.refresh(views.epoch, views.freed)
    n = len(order)
    if n == 0:
        return None
    view_of = views.view
    cache = prep.cache
    dead = ring.dead
    cpu, mem, disk, static = prep.cpu, prep.mem, prep.disk, prep.static_values
    cores = prep.cores
    hosts, props, spreads = prep.distinct_hosts, prep.distinct, prep.spreads
    # Without per-call components the cached final score is the score.
    per_call = bool(props or spreads or penalty_node_ids)
    max_skip = scores.MAX_SKIP
    best_node: Node | None = None
    best_view: NodeView | None = None
    best_score = -math.inf
    best_id = ""
    fallback: _Scored | None = None  # the best of the skipped (negatively scored) nodes
    skipped = counted = filtered = exhausted = 0
    pos = ring.pos
    seen = 0
    while seen < n and counted < limit:
        node = order[pos]
        pos += 1
        if pos == n:
            pos = 0
        seen += 1
        node_id = node.id
        if node_id in dead:
            continue
        entry = cache.get(node_id)
        if entry is not None and entry[1] == entry[0].version:
            view = entry[0]
            score = entry[4]
            if per_call:
                score, parts = entry[2], entry[3]
        else:
            view = view_of(node_id)
            if hosts and not prep.hosts_ok(view):
                ring.drop(node_id, REASON_DISTINCT_HOSTS, exhausted=False)
                filtered += 1
                continue
            caps = views.caps(node)
            node_cpu = prep.cpu_on(node) if cores else cpu
            if not view_fits(view, caps, node_cpu, mem, disk, static):
                ring.drop(
                    node_id, exhausted_dimension(view, caps, node_cpu, mem, disk, static), exhausted=True
                )
                exhausted += 1
                continue
            score, parts = prep.base_score(node, view, caps)
            cache[node_id] = (view, view.version, score, parts, score / parts)
            if not per_call:
                score /= parts
        if per_call:
            if props and not prep.props_ok(node):
                ring.drop(node_id, REASON_DISTINCT_PROPERTY, exhausted=False)
                filtered += 1
                continue
            if penalty_node_ids and node_id in penalty_node_ids:
                score += scores.RESCHEDULE_PENALTY
                parts += 1
            if spreads:
                spread = prep.spread_of(node)
                if spread:
                    score += spread
                    parts += 1
            score /= parts
        scored.append((score, node, view))
        if score < 0.0 and skipped < max_skip:
            skipped += 1
            if fallback is None or score > fallback[0] or (score == fallback[0] and node_id < fallback[1].id):
                fallback = (score, node, view)
            continue
        counted += 1
        if score > best_score or (score == best_score and node_id < best_id):
            best_node, best_view, best_score, best_id = node, view, score, node_id
    ring.pos = pos
    stats = builder.stats
    stats.nodes_evaluated += counted + skipped + filtered + exhausted
    stats.nodes_filtered += filtered
    stats.nodes_exhausted += exhausted
    stats.nodes_scored += counted + skipped
    # Skipped nodes only count when the ring ran out before ``limit`` good ones were found.
    if (
        fallback is not None
        and counted < limit
        and (
            best_node is None
            or fallback[0] > best_score
            or (fallback[0] == best_score and fallback[1].id < best_id)
        )
    ):
        return fallback
    if best_node is None or best_view is None:
        return None
    return best_score, best_node, best_view


def select_node(
    builder: PlanBuilder,
    job: Job,
    group: TaskGroup,
    candidates: Sequence[Node],
    ctx: SchedulerContext,
    rng: random.Random,
    *,
    penalty_node_ids: frozenset[str] = frozenset(),
) -> NodeChoice | None:
    """Pick the best node among ``candidates`` (already feasible) for one alloc of ``group``.

    Shuffles candidates with ``rng``; visits at most ``ctx.candidate_limit`` nodes that fit
    (0 = default: max(2, ceil(log2(len(candidates))))), skipping nodes where the alloc does not
    fit (allocs_fit over builder.proposed_on(node) + the new alloc) or distinct_hosts would be
    violated; scores binpack (or spread when the scheduler config says "spread"), weighted
    affinities, spread blocks, job anti-affinity (penalise nodes already holding allocs of the
    same job/group in the proposed view) and a penalty for ``penalty_node_ids`` (a rescheduled
    alloc's previous node). Returns None when nothing fits.

    The shuffle happens once per (group, candidate list) in a builder; later calls continue
    around the same ring (Nomad's behaviour), so pass the same list object each time. When
    affinities or spreads apply the limit is at least ``scores.WIDE_LIMIT``. Up to
    ``scores.MAX_SKIP`` negatively scored nodes are passed over while others remain. The caller
    places the returned choice before the next call, so the next placement sees it.
    """
    stats = builder.stats
    stats.selections += 1
    report = report_of(candidates)
    if not candidates:
        stats.last_metric = placement_metric(report, ranked=0)
        return None
    prep = builder.groups.get(job, group)
    views = builder.views
    ring = prep.ring(candidates, rng, views.epoch, len(views.freed))
    configured, limit = ring.limit
    if configured != ctx.candidate_limit:
        limit = scores.candidate_limit(len(candidates), ctx.candidate_limit, wide=prep.wide)
        ring.limit = (ctx.candidate_limit, limit)
    scored: list[_Scored] = []
    ranked = 0
    while True:
        picked = _scan(builder, prep, ring, limit, penalty_node_ids, scored)
        ranked += len(scored)
        if picked is None:
            stats.last_metric = _metric(views, prep, ring, report, ranked, (), None, penalty_node_ids)
            return None
        score, node, view = picked
        resources = prep.resources_on(node, view, rng)
        if resources is not None:
            metric = _metric(views, prep, ring, report, ranked, scored, node, penalty_node_ids)
            stats.last_metric = metric
            return NodeChoice(node=node, resources=resources, score=score, metrics=metric)
        # Its dynamic port range is exhausted: try the ring again.
        ring.drop(node.id, DIMENSION_DYNAMIC_PORTS, exhausted=True)
        stats.nodes_exhausted += 1
        ranked -= 1
        scored.clear()


def _metric(
    views: NodeViews,
    prep: PreparedGroup,
    ring: CandidateRing,
    report: FilterReport,
    ranked: int,
    scored: Sequence[_Scored],
    chosen: Node | None,
    penalty_node_ids: frozenset[str],
) -> AllocMetric:
    """The metric of one ``select_node`` call (``drover.scheduler.placement.metrics``).

    Hot path: everything but the ranked count and the top nodes is the same from one call
    to the next until the ring drops or frees a node, so it is built once per
    ``reasons_version`` (``ring.metric_template``) and each call fills in the rest. The top
    nodes' breakdowns are taken for at most ``MAX_SCORE_META`` nodes, after the scan, from
    the views the scan ranked (nothing has changed them since), and cached per node and
    view version where the score depends on the view alone.
    """
    template = ring.metric_template
    if template is None or template[0] != ring.reasons_version or template[1] is not report:
        base = placement_metric(
            report, ranked=0, dropped_filtered=dict(ring.filtered), dropped_exhausted=dict(ring.exhausted)
        )
        template = ring.metric_template = (ring.reasons_version, report, base)
    base = template[2]
    metas: list[NodeScoreMeta] = []
    if scored:
        best = sorted(scored, key=_score_of, reverse=True)[:MAX_SCORE_META] if len(scored) > 1 else scored
        if chosen is not None and best[0][1] is not chosen and all(item[1] is not chosen for item in best):
            best = [*best[: MAX_SCORE_META - 1], *(item for item in scored if item[1] is chosen)]
        spreads = bool(prep.spreads)
        meta_cache = prep.meta_cache
        for score, node, view in best:
            penalized = node.id in penalty_node_ids
            if spreads or penalized:
                metas.append(prep.score_meta(node, view, views.caps(node), penalized, score))
                continue
            hit = meta_cache.get(node.id)
            if hit is not None and hit[0] == view.version:
                metas.append(hit[1])
            else:
                metas.append(prep.cached_score_meta(node, view, views.caps(node), score))
    evaluated = min(base.nodes_evaluated + ranked, max(report.nodes_in_pool, base.nodes_evaluated))
    return _with_ranking(base, evaluated, tuple(metas))


# AllocMetric with nodes_evaluated and score_meta_data replaced, as fast as constructing it.
_with_ranking = replacer(AllocMetric, "nodes_evaluated", "score_meta_data")
# A placement on one given node: its pool is that node. ``{datacenter: 1}`` is shared by
# every such metric of the datacenter (records never change their maps).
_ONE_NODE = AllocMetric(nodes_evaluated=1, nodes_in_pool=1)
_with_node_score = replacer(AllocMetric, "nodes_available", "score_meta_data")
_IN_ONE_NODE: dict[str, Mapping[str, int]] = {}
_IN_ONE_NODE_MAX = 256  # datacenters remembered; a cluster has a handful
# A NodeScoreMeta built through its slots (``replacer`` of an empty one): one per placement.
_new_score_meta = replacer(NodeScoreMeta, "node_id", "scores", "norm_score")
_SCORE_META = NodeScoreMeta()
_score_of = itemgetter(0)


def place_on_node(
    builder: PlanBuilder,
    job: Job,
    group: TaskGroup,
    node: Node,
    *,
    replacing: Allocation | None = None,
    rng: random.Random | None = None,
    penalty_node_ids: frozenset[str] = frozenset(),
) -> NodeChoice | None:
    """Fit one alloc of ``group`` on this specific node (system jobs): constraints and fit
    checked against builder.proposed_on(node); ports assigned. None when it does not fit.

    Readiness and datacenters are the caller's business (``feasible_nodes`` checks them).
    ``replacing`` is a proposed alloc the new one replaces in place (same ID): it is left
    out of the fit and distinct checks and its ports are kept when the group still asks for
    the same ones. Dynamic ports are the lowest free ones unless ``rng`` is given.
    """
    stats = builder.stats
    stats.selections += 1
    stats.nodes_evaluated += 1
    prep = builder.groups.get(job, group)
    reason = prep.feasibility.filter_reason(node)
    if reason:
        return _filtered_on_node(stats, node, reason)
    views = builder.views
    view = views.view(node.id)
    penalized = node.id in penalty_node_ids
    if replacing is not None and replacing.id in view.allocs:
        return _place_replacing(builder, prep, node, view, replacing, rng, penalized)
    if not prep.hosts_ok(view):
        return _filtered_on_node(stats, node, REASON_DISTINCT_HOSTS)
    if not prep.props_ok(node):
        return _filtered_on_node(stats, node, REASON_DISTINCT_PROPERTY)
    caps = views.caps(node)
    cpu = prep.cpu_on(node)
    if not view_fits(view, caps, cpu, prep.mem, prep.disk, prep.static_values):
        dimension = exhausted_dimension(view, caps, cpu, prep.mem, prep.disk, prep.static_values)
        return _exhausted_on_node(stats, node, dimension)
    resources = prep.resources_on(node, view, rng)
    if resources is None:
        return _exhausted_on_node(stats, node, DIMENSION_DYNAMIC_PORTS)
    return _placed_on_node(stats, prep, node, view, caps, penalized, resources)


# The metric of a placement on one given node (place_on_node): its pool is that node.
# The failures return None, as place_on_node does, so its callers can return theirs.


def _filtered_on_node(stats: PlacementStats, node: Node, reason: str) -> NodeChoice | None:
    stats.nodes_filtered += 1
    stats.last_metric = AllocMetric(
        nodes_evaluated=1,
        nodes_in_pool=1,
        nodes_available={node.datacenter: 1},
        nodes_filtered=1,
        constraint_filtered={reason: 1},
        class_filtered={node.node_class: 1},
    )
    return None


def _exhausted_on_node(stats: PlacementStats, node: Node, dimension: str) -> NodeChoice | None:
    stats.nodes_exhausted += 1
    stats.last_metric = AllocMetric(
        nodes_evaluated=1,
        nodes_in_pool=1,
        nodes_available={node.datacenter: 1},
        nodes_exhausted=1,
        dimension_exhausted={dimension: 1},
        class_exhausted={node.node_class: 1},
    )
    return None


def _placed_on_node(
    stats: PlacementStats,
    prep: PreparedGroup,
    node: Node,
    view: NodeView,
    caps: NodeCaps,
    penalized: bool,
    resources: AllocatedResources,
) -> NodeChoice:
    stats.nodes_scored += 1
    score = prep.score(node, view, caps, penalized)
    available = _IN_ONE_NODE.get(node.datacenter)
    if available is None:
        available = {node.datacenter: 1}
        if len(_IN_ONE_NODE) < _IN_ONE_NODE_MAX:
            _IN_ONE_NODE[node.datacenter] = available
    meta = prep.score_meta(node, view, caps, penalized, score)
    metric = _with_node_score(_ONE_NODE, available, (meta,))
    stats.last_metric = metric
    return NodeChoice(node=node, resources=resources, score=score, metrics=metric)


def _place_replacing(
    builder: PlanBuilder,
    prep: PreparedGroup,
    node: Node,
    view: NodeView,
    replacing: Allocation,
    rng: random.Random | None,
    penalized: bool,
) -> NodeChoice | None:
    """The in-place path: rare, so it recomputes exactly from the proposed allocs."""
    stats = builder.stats
    others = view.without(replacing.id)
    if not prep.hosts_ok(others):
        return _filtered_on_node(stats, node, REASON_DISTINCT_HOSTS)
    for counter, limit in prep.distinct:
        value = counter.value_of(node)
        if value is None or counter.count(value, excluding=replacing.id) >= limit:
            return _filtered_on_node(stats, node, REASON_DISTINCT_PROPERTY)
    ports = reuse_ports(prep.group, replacing.resources)
    if ports is not None:
        resources = AllocatedResources(
            cpu_mhz=prep.cpu_on(node), memory_mb=prep.mem, disk_mb=prep.disk, ports=ports
        )
    else:
        maybe = prep.resources_on(node, others, rng)
        if maybe is None:
            return _exhausted_on_node(stats, node, DIMENSION_DYNAMIC_PORTS)
        resources = maybe
    new = Allocation(id=replacing.id, node_id=node.id, resources=resources)
    fit = allocs_fit(node, [*others.allocs.values(), new])
    if not fit.fits:
        return _exhausted_on_node(stats, node, _fit_dimension(fit.reason))
    return _placed_on_node(stats, prep, node, others, builder.views.caps(node), penalized, resources)


def _fit_dimension(reason: str) -> str:
    """``allocs_fit``'s reason ("port 8080", "memory") as a metric dimension ("ports")."""
    return DIMENSION_PORTS if reason.startswith("port") else reason


def score_node(
    builder: PlanBuilder,
    job: Job,
    group: TaskGroup,
    node: Node,
    *,
    penalty_node_ids: frozenset[str] = frozenset(),
) -> float:
    """The rank ``select_node`` would give ``node`` for one more alloc of ``group`` as the
    plan stands (fit not checked): e.g. to keep the better-ranked of two allocs."""
    prep = builder.groups.get(job, group)
    views = builder.views
    return prep.score(node, views.view(node.id), views.caps(node), node.id in penalty_node_ids)
