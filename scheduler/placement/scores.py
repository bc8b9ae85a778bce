"""Ranking: how good a node is for one more alloc of a group, as a number in about [-1, 1].

Each scorer yields a component; the node's score is the mean of the components that apply
(Nomad's ``ScoreNormalizationIterator``):

* **binpack** (always): Nomad's fitness ``20 - (10^free_cpu + 10^free_mem)`` over the free
  fractions *after* the placement, clamped to [0, 18] and divided by 18. Higher = fuller node,
  so allocs pack tightly. The scheduler config's ``spread`` algorithm uses
  ``(10^free_cpu + 10^free_mem) - 2`` instead, so emptier nodes win.
* **job anti-affinity** (when the node already holds allocs of the same job and group):
  ``-(collisions + 1) / count``, so replicas spread out.
* **reschedule penalty** (when the node is the previous node of a rescheduled alloc): -1.
* **affinities** (when the weighted sum is non-zero): sum of the weights of the matching
  affinities / sum of |weights|, in [-1, 1].
* **spread** (when the group spreads and something is placed): per spread block, +1 for
  the attribute value holding the fewest of the group's allocs (a value holding none
  included), -1 for the most (linear in between; all equal counts as "the most"), -1 when
  the node lacks the attribute; blocks weighted by weight / sum(weights).

Ranking looks at a bounded number of candidates (Nomad's limit iterator): ``log2(nodes)``
but at least 2, or at least ``WIDE_LIMIT`` when affinities or spreads make the choice
depend on more than packing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

from drover.scheduler.placement.feasible import compile_predicate
from drover.scheduler.structs import Affinity, Node, Spread

__all__ = [
    "BINPACK_MAX_FIT",
    "MAX_SKIP",
    "RESCHEDULE_PENALTY",
    "SCORE_BINPACK",
    "SCORE_JOB_ANTI_AFFINITY",
    "SCORE_NODE_AFFINITY",
    "SCORE_RESCHEDULE_PENALTY",
    "SCORE_SPREAD",
    "SPREAD_IMPLICIT_TARGET",
    "WIDE_LIMIT",
    "anti_affinity_penalty",
    "binpack_score",
    "candidate_limit",
    "compile_affinities",
    "mean_score",
    "spread_boost",
    "spread_boost_between",
    "spread_desired",
    "spread_target_boost",
]

BINPACK_MAX_FIT: Final = 18.0
# Candidates scored when affinities or spreads apply (Nomad widens its limit the same way:
# a preference can only steer placements among the nodes it gets to see).
WIDE_LIMIT: Final = 100
# Nodes with a negative score (penalised) are passed over, at most this many per selection,
# in the hope of finding an unpenalised one (Nomad's LimitIterator maxSkip).
MAX_SKIP: Final = 3
RESCHEDULE_PENALTY: Final = -1.0

# The components' names in placement metrics (Nomad's, so operators read the same table).
SCORE_BINPACK: Final = "binpack"
SCORE_JOB_ANTI_AFFINITY: Final = "job-anti-affinity"
SCORE_NODE_AFFINITY: Final = "node-affinity"
SCORE_SPREAD: Final = "allocation-spread"
SCORE_RESCHEDULE_PENALTY: Final = "node-reschedule-penalty"


def binpack_score(used_cpu: int, cap_cpu: int, used_mem: int, cap_mem: int, *, spread: bool = False) -> float:
    """Fitness in [0, 1] of a node using ``used_*`` (the new alloc included) of ``cap_*``."""
    free_cpu = 1.0 - used_cpu / cap_cpu if cap_cpu > 0 else 0.0
    free_mem = 1.0 - used_mem / cap_mem if cap_mem > 0 else 0.0
    total = math.pow(10.0, free_cpu) + math.pow(10.0, free_mem)
    fit = total - 2.0 if spread else 20.0 - total
    if fit <= 0.0:
        return 0.0
    if fit >= BINPACK_MAX_FIT:
        return 1.0
    return fit / BINPACK_MAX_FIT


def anti_affinity_penalty(collisions: int, desired_count: int) -> float:
    """Nomad's job anti-affinity: 0 without collisions, else ``-(collisions + 1) / count``."""
    if collisions <= 0:
        return 0.0
    return -(collisions + 1) / max(desired_count, 1)


def compile_affinities(affinities: Sequence[Affinity]) -> Callable[[Node], float] | None:
    """A node -> [-1, 1] function (weights of the matching affinities / sum of |weights|),
    or None when there is nothing to score."""
    total = sum(abs(a.weight) for a in affinities)
    if not affinities or total == 0:
        return None
    checks = tuple(
        (compile_predicate(a.attribute, a.operator, a.value), a.weight / total) for a in affinities
    )

    def score(node: Node) -> float:
        return sum(weight for pred, weight in checks if pred(node))

    return score


def spread_boost_between(count: int, lowest: int, highest: int) -> float:
    """+1 for a value holding the fewest allocs, -1 for the most, linear in between.

    ``lowest``/``highest`` include ``count``. When they are equal every value seen holds the
    same number of allocs and this one is among them: -1 (Nomad's "even distribution"
    penalty), since a value not seen yet (0 allocs, +1) is a better place to grow.
    """
    if highest <= lowest:
        return -1.0
    return 1.0 - 2.0 * (count - lowest) / (highest - lowest)


# A spread target's value for "every value not named" (Nomad's implicit target).
SPREAD_IMPLICIT_TARGET: Final = "*"


def spread_desired(spread: Spread, count: int) -> dict[str, float] | None:
    """How many of the group's ``count`` allocs each value of a spread with targets should
    hold (None: no targets, spread evenly). Percentages summing under 100 leave the rest to
    the values not named, as Nomad's ``*`` target."""
    if not spread.targets:
        return None
    desired = {t.value: t.percent / 100 * count for t in spread.targets}
    named = sum(t.percent for t in spread.targets)
    if named < 100 and SPREAD_IMPLICIT_TARGET not in desired:
        desired[SPREAD_IMPLICIT_TARGET] = (100 - named) / 100 * count
    return desired


def spread_target_boost(desired: Mapping[str, float], value: str | None, counts: Mapping[str, int]) -> float:
    """Nomad's spread.go: ``(desired - used) / desired`` for the node's value, from +1 (none
    of its share placed) down to -1 (at or past twice its share); -1 for a value with no
    share or a node without the attribute."""
    if value is None:
        return -1.0
    want = desired.get(value, desired.get(SPREAD_IMPLICIT_TARGET))
    if not want:
        return -1.0
    if value not in desired:
        # The values outside the targets share the implicit target's count.
        used = sum(c for v, c in counts.items() if v not in desired)
    else:
        used = counts.get(value, 0)
    return max(-1.0, (want - used) / want)


def spread_boost(counts: Mapping[str, int], value: str | None) -> float:
    """The boost of a node whose attribute is ``value`` given the group's allocs per value.

    0 when nothing is placed yet (no preference), -1 when the node lacks the attribute.
    A value not in ``counts`` holds 0 allocs.
    """
    live = [c for c in counts.values() if c > 0]
    if not live:
        return 0.0
    if value is None:
        return -1.0
    count = counts.get(value, 0)
    return spread_boost_between(count, min(min(live), count), max(max(live), count))


def mean_score(components: Iterable[float]) -> float:
    values = list(components)
    return sum(values) / len(values) if values else 0.0


def candidate_limit(n_candidates: int, configured: int = 0, *, wide: bool = False) -> int:
    """How many fitting nodes to score: ``configured`` or max(2, ceil(log2(n))); at least
    ``WIDE_LIMIT`` when affinities or spreads apply."""
    limit = configured
    if limit <= 0:
        limit = 2
        if n_candidates > 1:
            limit = max(limit, math.ceil(math.log2(n_candidates)))
    if wide:
        limit = max(limit, WIDE_LIMIT)
    return limit
