"""Placement metrics as operators read them (Nomad's ``formatAllocMetrics``): why a group
would not place, for ``job plan`` and ``eval status``, and how an alloc's node was chosen,
for ``alloc status -verbose``.

Nothing here talks to a server: everything takes an ``AllocMetric`` message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from drover.cli._format import short_id
from drover.v1 import structs_pb2

__all__ = ["SCORE_COLUMNS", "failed_group_lines", "metric_lines", "score_table"]

# The score components always shown, in Nomad's order; others (affinity, spread) follow
# when a node has them. A component a node lacks did not apply to it: shown as 0.
SCORE_COLUMNS: Final = ("binpack", "job-anti-affinity", "node-reschedule-penalty")
_OPTIONAL_COLUMNS: Final = ("node-affinity", "allocation-spread")
# The scheduler's filter reasons for constraints start with this; Nomad's lines name the
# constraint alone (Constraint "${attr.kernel.name} = linux").
_CONSTRAINT_PREFIX: Final = "constraint "


def _nodes(n: int) -> str:
    return f"{n} node{'' if n == 1 else 's'}"


def _by_count(counts: Mapping[str, int]) -> list[tuple[str, int]]:
    """Most first, then by name, so the biggest reason leads and the order is stable."""
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def metric_lines(metric: structs_pb2.AllocMetric, prefix: str = "  ") -> list[str]:
    """The counts and reasons of one metric, one ``* ...`` line each."""
    lines = [
        f"{prefix}* {_nodes(metric.nodes_evaluated)} evaluated of {metric.nodes_in_pool} in the pool,"
        f" {metric.nodes_filtered} filtered, {metric.nodes_exhausted} exhausted"
    ]
    if metric.nodes_evaluated == 0:
        lines.append(f"{prefix}* No nodes were eligible for evaluation")
    for dc, available in sorted(metric.nodes_available.items()):
        if available == 0:
            lines.append(f'{prefix}* No nodes are available in datacenter "{dc}"')
    for reason, count in _by_count(metric.constraint_filtered):
        shown = reason.removeprefix(_CONSTRAINT_PREFIX)
        lines.append(f'{prefix}* Constraint "{shown}": {_nodes(count)} excluded by filter')
    for node_class, count in _by_count(metric.class_filtered):
        if node_class:
            lines.append(f'{prefix}* Class "{node_class}": {_nodes(count)} excluded by filter')
    if metric.nodes_exhausted > 0:
        lines.append(f"{prefix}* Resources exhausted on {_nodes(metric.nodes_exhausted)}")
    for node_class, count in _by_count(metric.class_exhausted):
        if node_class:
            lines.append(f'{prefix}* Class "{node_class}" exhausted on {_nodes(count)}')
    for dimension, count in _by_count(metric.dimension_exhausted):
        lines.append(f'{prefix}* Dimension "{dimension}" exhausted on {_nodes(count)}')
    return lines


def failed_group_lines(failed: Mapping[str, structs_pb2.AllocMetric], order: Sequence[str] = ()) -> list[str]:
    """Nomad's placement-failure block: per group, how many allocs failed and why."""
    names = [g for g in order if g in failed] + sorted(g for g in failed if g not in order)
    lines: list[str] = []
    for name in names:
        metric = failed[name]
        count = metric.coalesced_failures + 1
        lines.append(f'Task Group "{name}" (failed to place {count} allocation{"" if count == 1 else "s"}):')
        lines += metric_lines(metric)
    return lines


def _fmt_score(value: float) -> str:
    return f"{value:.3g}"


def score_table(metric: structs_pb2.AllocMetric, full_ids: bool) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the top nodes' scores: node, each component, final score."""
    metas = list(metric.score_meta_data)
    present = {key for meta in metas for key in meta.scores}
    columns = [*SCORE_COLUMNS, *(c for c in _OPTIONAL_COLUMNS if c in present)]
    columns += sorted(present - set(columns))
    rows = [
        [
            short_id(meta.node_id, full_ids),
            *(_fmt_score(meta.scores.get(c, 0.0)) for c in columns),
            _fmt_score(meta.norm_score),
        ]
        for meta in metas
    ]
    return ["Node", *columns, "final score"], rows
