"""Placement metrics (Nomad's ``AllocMetric``): how one placement was decided, in counts an
operator can read.

A placement's metric has two halves, gathered where the work is already done:

* the feasibility pass (``feasible_nodes``) over every ready node in the job's
  datacenters: the pool, per datacenter, and the nodes filtered by reason ("missing
  drivers", "constraint ${attr.kernel.name} = linux") and by node class;
* the candidate ring of ``ranking``: the nodes it dropped as the plan stands, filtered
  ("distinct_hosts", "distinct_property") or exhausted (by dimension: "cpu", "memory",
  "disk", "ports", "dynamic ports", "max allocs"), the live nodes this selection ranked,
  and the best ``MAX_SCORE_META`` of those by score, each broken down by component.

``nodes_evaluated`` is every node that took part: filtered, dropped, or ranked now. A
failed selection has ranked every live node, so its metric covers the whole pool; it is
what an eval reports as ``failed_tg_metrics[group]``. No clock is read: the scheduler is
pure, so ``allocation_time_ns`` stays 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Final

from drover.scheduler.placement.feasible import FeasibleNodes, FilterReport
from drover.scheduler.structs import Allocation, AllocMetric, Node, NodeScoreMeta

__all__ = [
    "MAX_SCORE_META",
    "coalesce",
    "merge_counts",
    "placed_score",
    "placement_metric",
    "report_of",
]

# Nodes whose scores a metric keeps, best first (Nomad keeps the top 5 as well): enough to
# see why the winner won, cheap enough to keep on every alloc.
MAX_SCORE_META: Final = 5

_EMPTY: Final[Mapping[str, int]] = {}


def report_of(candidates: Sequence[Node]) -> FilterReport:
    """The feasibility pass's report behind ``candidates``; for a plain list (a caller that
    filtered the nodes itself) every candidate is the pool and nothing was filtered."""
    if isinstance(candidates, FeasibleNodes):
        return candidates.report
    return FilterReport(nodes_in_pool=len(candidates))


def merge_counts(a: Mapping[str, int], b: Mapping[str, int]) -> Mapping[str, int]:
    """``a + b`` by key; one of them as it is when the other is empty (records never change
    their maps, so sharing is safe and saves a dict per placement)."""
    if not b:
        return a
    if not a:
        return b
    out = dict(a)
    for key, count in b.items():
        out[key] = out.get(key, 0) + count
    return out


def placement_metric(
    report: FilterReport,
    *,
    ranked: int,
    dropped_filtered: Mapping[str, int] = _EMPTY,
    dropped_exhausted: Mapping[str, int] = _EMPTY,
    score_meta: Sequence[NodeScoreMeta] = (),
) -> AllocMetric:
    """One selection's metric from the feasibility report, the ring's dropped nodes (by
    reason) and the ``ranked`` live nodes this selection scored (module docstring)."""
    filtered_now = sum(dropped_filtered.values())
    exhausted_now = sum(dropped_exhausted.values())
    filtered = report.nodes_filtered + filtered_now
    evaluated = min(filtered + exhausted_now + ranked, max(report.nodes_in_pool, filtered + exhausted_now))
    return AllocMetric(
        nodes_evaluated=evaluated,
        nodes_filtered=filtered,
        nodes_in_pool=report.nodes_in_pool,
        nodes_available=report.nodes_available,
        class_filtered=report.class_filtered,
        constraint_filtered=merge_counts(report.constraint_filtered, dropped_filtered),
        nodes_exhausted=exhausted_now,
        dimension_exhausted=dropped_exhausted,
        score_meta_data=tuple(score_meta),
    )


def coalesce(first: AllocMetric | None, more: AllocMetric) -> AllocMetric:
    """Two failed placements of one group as one metric, for the system scheduler, which
    places node by node (each placement's pool is its one node): the counts added, the
    second counted in ``coalesced_failures``."""
    if first is None:
        return more
    return replace(
        first,
        nodes_evaluated=first.nodes_evaluated + more.nodes_evaluated,
        nodes_in_pool=first.nodes_in_pool + more.nodes_in_pool,
        nodes_available=merge_counts(first.nodes_available, more.nodes_available),
        nodes_filtered=first.nodes_filtered + more.nodes_filtered,
        constraint_filtered=merge_counts(first.constraint_filtered, more.constraint_filtered),
        class_filtered=merge_counts(first.class_filtered, more.class_filtered),
        nodes_exhausted=first.nodes_exhausted + more.nodes_exhausted,
        dimension_exhausted=merge_counts(first.dimension_exhausted, more.dimension_exhausted),
        class_exhausted=merge_counts(first.class_exhausted, more.class_exhausted),
        coalesced_failures=first.coalesced_failures + 1 + more.coalesced_failures,
    )


def placed_score(alloc: Allocation) -> float | None:
    """The final score ``alloc`` was placed with on its own node; None when it has no
    metrics (placed before allocs kept them, or an alloc made by hand) or its node is not
    among them."""
    metric = alloc.metrics
    if metric is None:
        return None
    for meta in metric.score_meta_data:
        if meta.node_id == alloc.node_id:
            return meta.norm_score
    return None
