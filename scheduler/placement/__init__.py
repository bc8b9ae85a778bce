"""Placing allocs on nodes, for both the generic and the system scheduler (Nomad's
``scheduler/feasible``):

    builder = PlanBuilder(state, ev, job)
    builder.stop(alloc, "alloc not needed due to job update")
    builder.update_status(other, description=..., client_status="unknown")   # stays running
    choice = select_node(builder, job, group, candidates, ctx, rng)          # generic
    choice = place_on_node(builder, job, group, node)                        # system
    if choice is not None:
        builder.place(new_alloc(ev, job, group, choice, ctx, name=..., index=...))
    plan = builder.build()

Layout (one concept per module):

- ``plan``: ``PlanBuilder``, the plan under construction (stops, status-only entries,
  placements), and ``new_alloc``, the one way both schedulers mint an alloc.
- ``views``: each node as the plan leaves it (``NodeViews``), as running sums, so
  binpacking, ``distinct_hosts``, spread and dynamic ports all see the plan's own earlier
  decisions: two placements in one plan never collide.
- ``ranking``: the compiled group (``PreparedGroup``), the shuffled candidate ring and the
  scores: ``select_node`` (the best of a bounded sample), ``place_on_node`` (one given
  node, system jobs) and ``score_node``.
- ``feasible``: which nodes may run a group at all: readiness, datacenters, drivers,
  constraints; and why the others were filtered.
- ``metrics``: each placement's ``AllocMetric`` (Nomad's): nodes evaluated, filtered and
  exhausted by reason, the top nodes' scores by component.
- ``scores``: the score formulas (binpack, spread, affinities, anti-affinity, penalties).
- ``ports``: static ports as asked, dynamic ports free in the node's range.

Fit is decided by ``drover.scheduler.fit.allocs_fit``, the same function the plan applier uses.
"""

from drover.scheduler.placement.feasible import feasible_nodes
from drover.scheduler.placement.metrics import placed_score
from drover.scheduler.placement.plan import PlanBuilder, new_alloc, updated_in_place, with_deployment
from drover.scheduler.placement.ports import assign_ports
from drover.scheduler.placement.ranking import (
    NodeChoice,
    PlacementStats,
    place_on_node,
    score_node,
    select_node,
)

__all__ = [
    "NodeChoice",
    "PlacementStats",
    "PlanBuilder",
    "assign_ports",
    "feasible_nodes",
    "new_alloc",
    "place_on_node",
    "placed_score",
    "score_node",
    "select_node",
    "updated_in_place",
    "with_deployment",
]
