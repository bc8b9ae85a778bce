"""drover.scheduler.placement.scores: the score components, and how they steer select_node."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from drover.scheduler.interfaces import SchedulerContext
from drover.scheduler.placement import NodeChoice, PlanBuilder, score_node, select_node
from drover.scheduler.placement import scores as rank
from drover.scheduler.structs import (
    Affinity,
    AllocatedResources,
    Job,
    Node,
    NodeResources,
    Resources,
    SchedulerConfig,
    Spread,
)
from drover.server.state_store import Txn
from tests.fixtures import mock
from tests.harness import Harness

CTX = SchedulerContext(now_ns=0, new_id=lambda: "x")

# ---------------------------------------------------------------------------------------
# Components


def test_binpack__fuller_node_scores_higher() -> None:
    empty = rank.binpack_score(500, 4000, 256, 8192)
    half = rank.binpack_score(2000, 4000, 4096, 8192)
    full = rank.binpack_score(4000, 4000, 8192, 8192)
    assert 0.0 <= empty < half < full == 1.0


def test_binpack__spread_algorithm_inverts_the_order() -> None:
    empty = rank.binpack_score(500, 4000, 256, 8192, spread=True)
    half = rank.binpack_score(2000, 4000, 4096, 8192, spread=True)
    full = rank.binpack_score(4000, 4000, 8192, 8192, spread=True)
    assert 1.0 >= empty > half > full == 0.0


def test_binpack__zero_capacity_counts_as_full() -> None:
    assert rank.binpack_score(0, 0, 0, 0) == 1.0


ANTI_AFFINITY_CASES = [(0, 3, 0.0), (1, 3, -2 / 3), (2, 3, -1.0), (1, 1, -2.0), (1, 0, -2.0)]


@pytest.mark.parametrize(
    ("collisions", "count", "expected"),
    ANTI_AFFINITY_CASES,
    ids=[f"{c} collisions of count {n}" for c, n, _ in ANTI_AFFINITY_CASES],
)
def test_anti_affinity_penalty(collisions: int, count: int, expected: float) -> None:
    assert rank.anti_affinity_penalty(collisions, count) == pytest.approx(expected)


def test_affinities__weighted_sum_over_absolute_weights() -> None:
    score = rank.compile_affinities(
        (
            Affinity("${meta.rack}", "=", "r1", weight=50),
            Affinity("${node.class}", "=", "gpu", weight=-25),
            Affinity("${attr.arch}", "=", "x86", weight=25),
        )
    )
    assert score is not None
    assert score(mock.node(meta={"rack": "r1"}, node_class="cpu")) == pytest.approx(0.75)
    assert score(mock.node(meta={"rack": "r2"}, node_class="gpu")) == pytest.approx(0.0)  # -25 + 25
    assert score(mock.node(meta={"rack": "r2"}, node_class="gpu", attributes={})) == pytest.approx(-0.25)
    assert rank.compile_affinities(()) is None


SPREAD_CASES = [
    ("nothing placed yet", {}, "r1", 0.0),
    ("attribute missing", {"r1": 1}, None, -1.0),
    ("unused value", {"r1": 2, "r2": 1}, "r3", 1.0),
    ("least used value", {"r1": 2, "r2": 1}, "r2", 1.0),
    ("most used value", {"r1": 3, "r2": 1}, "r1", -1.0),
    ("in between", {"r1": 3, "r2": 2, "r3": 1}, "r2", 0.0),
    ("all seen values equal", {"r1": 2, "r2": 2}, "r1", -1.0),
    ("all seen values equal, unseen value", {"r1": 2, "r2": 2}, "r3", 1.0),
]


@pytest.mark.parametrize(
    ("counts", "value", "expected"), [c[1:] for c in SPREAD_CASES], ids=[c[0] for c in SPREAD_CASES]
)
def test_spread_boost(counts: dict[str, int], value: str | None, expected: float) -> None:
    assert rank.spread_boost(counts, value) == pytest.approx(expected)


LIMIT_CASES = [
    (0, 0, False, 2),
    (1, 0, False, 2),
    (3, 0, False, 2),
    (5, 0, False, 3),
    (1000, 0, False, 10),
    (1024, 0, False, 10),
    (1025, 0, False, 11),
    (1000, 4, False, 4),  # configured wins over the default
    (1000, 0, True, 100),  # affinities or spreads widen it
    (1000, 500, True, 500),
]


@pytest.mark.parametrize(
    ("n", "configured", "wide", "expected"),
    LIMIT_CASES,
    ids=[f"{n} nodes limit {c}{' wide' if w else ''}" for n, c, w, _ in LIMIT_CASES],
)
def test_candidate_limit(n: int, configured: int, wide: bool, expected: int) -> None:
    assert rank.candidate_limit(n, configured, wide=wide) == expected


def test_mean_score__only_applicable_components() -> None:
    assert rank.mean_score([0.5, -1.0]) == pytest.approx(-0.25)
    assert rank.mean_score([]) == 0.0


# ---------------------------------------------------------------------------------------
# Steering select_node


def small_job(count: int = 3, **changes: object) -> Job:
    """A service job of ``count`` allocs of 500 MHz / 256 MB with no ports."""
    job = mock.job(**changes)
    return replace(job, groups=(replace(job.groups[0], count=count, network=None),))


def filler(node: Node, cpu: int, mem: int) -> AllocatedResources:
    return AllocatedResources(cpu_mhz=cpu, memory_mb=mem)


def setup(nodes: list[Node], job: Job, *, algorithm: str = "binpack") -> tuple[Harness, Job]:
    h = Harness()
    for n in nodes:
        h.add_node(n)
    if algorithm != "binpack":
        h._write(lambda txn: _set_config(txn, algorithm))
    return h, h.add_job(job)


def _set_config(txn: Txn, algorithm: str) -> None:
    txn.set_scheduler_config(SchedulerConfig(scheduler_algorithm=algorithm))


def place_all(
    h: Harness, job: Job, nodes: list[Node], *, seed: int = 1, count: int | None = None
) -> list[NodeChoice]:
    group = job.groups[0]
    builder = PlanBuilder(h.snapshot(), mock.eval_for(job), job)
    rng = random.Random(seed)
    choices = []
    for i in range(group.count if count is None else count):
        choice = select_node(builder, job, group, nodes, CTX, rng)
        assert choice is not None
        builder.place(mock.alloc(job, choice.node, i, resources=choice.resources))
        choices.append(choice)
    return choices


def with_load(h: Harness, node: Node, cpu: int, mem: int) -> None:
    other = small_job(1)
    h.add_alloc(mock.alloc(other, node, 0, resources=filler(node, cpu, mem)))


def test_select__binpack_prefers_the_fuller_node() -> None:
    nodes = [mock.node(id="a-empty"), mock.node(id="b-busy"), mock.node(id="c-empty")]
    h, job = setup(nodes, small_job(1))
    with_load(h, nodes[1], 2000, 4000)
    [choice] = place_all(h, job, nodes)
    assert choice.node.id == "b-busy"


def test_select__spread_algorithm_prefers_the_emptier_node() -> None:
    nodes = [mock.node(id="a-busy"), mock.node(id="b-empty"), mock.node(id="c-busy")]
    h, job = setup(nodes, small_job(1), algorithm="spread")
    with_load(h, nodes[0], 2000, 4000)
    with_load(h, nodes[2], 1000, 1000)
    [choice] = place_all(h, job, nodes)
    assert choice.node.id == "b-empty"


def test_select__anti_affinity_spreads_count_3_over_3_equal_nodes() -> None:
    nodes = [mock.node(id=f"n{i}") for i in range(3)]
    h, job = setup(nodes, small_job(3))
    for seed in range(20):
        choices = place_all(h, job, nodes, seed=seed)
        assert sorted(c.node.id for c in choices) == ["n0", "n1", "n2"], seed


def test_select__affinity_steers_placements_to_matching_nodes() -> None:
    nodes = [mock.node(id=f"n{i:02d}", meta={"rack": "r1" if i < 3 else "r2"}) for i in range(12)]
    job = small_job(3, affinities=(Affinity("${meta.rack}", "=", "r1", weight=100),))
    h, job = setup(nodes, job)
    choices = place_all(h, job, nodes)
    assert {c.node.meta["rack"] for c in choices} == {"r1"}
    assert len({c.node.id for c in choices}) == 3  # and anti-affinity still spreads them


def test_select__negative_affinity_avoids_matching_nodes() -> None:
    nodes = [mock.node(id=f"n{i:02d}", node_class="spot" if i % 2 else "on-demand") for i in range(10)]
    job = small_job(4, affinities=(Affinity("${node.class}", "=", "spot", weight=-100),))
    h, job = setup(nodes, job)
    assert {c.node.node_class for c in place_all(h, job, nodes)} == {"on-demand"}


def test_select__spread_block_balances_allocs_over_attribute_values() -> None:
    # 8 nodes in rack r1, 2 in r2: without spread most allocs would land in r1.
    nodes = [mock.node(id=f"n{i:02d}", meta={"rack": "r1" if i < 8 else "r2"}) for i in range(10)]
    job = small_job(6, spreads=(Spread("${meta.rack}", weight=100),))
    h, job = setup(nodes, job)
    racks = Counter(c.node.meta["rack"] for c in place_all(h, job, nodes))
    assert racks == {"r1": 3, "r2": 3}


def test_select__previous_node_penalised_for_reschedule() -> None:
    nodes = [mock.node(id="a-prev"), mock.node(id="b-other")]
    h, job = setup(nodes, small_job(1))
    with_load(h, nodes[0], 2000, 4000)  # binpack alone would pick a-prev
    builder = PlanBuilder(h.snapshot(), mock.eval_for(job), job)
    choice = select_node(
        builder, job, job.groups[0], nodes, CTX, random.Random(1), penalty_node_ids=frozenset({"a-prev"})
    )
    assert choice is not None
    assert choice.node.id == "b-other"


def test_select__penalised_node_still_used_when_nothing_else_fits() -> None:
    nodes = [mock.node(id="a-prev"), mock.node(id="b-full")]
    h, job = setup(nodes, small_job(1))
    with_load(h, nodes[1], 3900, 100)
    builder = PlanBuilder(h.snapshot(), mock.eval_for(job), job)
    choice = select_node(
        builder, job, job.groups[0], nodes, CTX, random.Random(1), penalty_node_ids=frozenset({"a-prev"})
    )
    assert choice is not None
    assert choice.node.id == "a-prev"
    assert choice.score < 0


def test_score_node__matches_the_chosen_score() -> None:
    nodes = [mock.node(id="n1", resources=NodeResources(cpu_mhz=2000, memory_mb=2048))]
    h, job = setup(nodes, small_job(1))
    builder = PlanBuilder(h.snapshot(), mock.eval_for(job), job)
    expected = score_node(builder, job, job.groups[0], nodes[0])
    choice = select_node(builder, job, job.groups[0], nodes, CTX, random.Random(1))
    assert choice is not None
    assert choice.score == pytest.approx(expected)
    assert expected == pytest.approx(rank.binpack_score(500, 2000, 256, 2048))


def test_select__node_resources_reserved_are_not_capacity() -> None:
    reserved = NodeResources(
        cpu_mhz=1000, memory_mb=1000, reserved=Resources(cpu_mhz=600, memory_mb=0, disk_mb=0)
    )
    nodes = [mock.node(id="n1", resources=reserved)]
    h, job = setup(nodes, small_job(1))
    builder = PlanBuilder(h.snapshot(), mock.eval_for(job), job)
    assert select_node(builder, job, job.groups[0], nodes, CTX, random.Random(1)) is None
