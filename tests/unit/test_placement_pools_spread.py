"""Node pools filter the nodes a job may use; spread targets share a group's allocs by percent."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

from drover.scheduler.generic import compute_generic
from drover.scheduler.interfaces import SchedulerContext
from drover.scheduler.placement import PlanBuilder, select_node
from drover.scheduler.placement.feasible import REASON_CORES, REASON_NODE_POOL, compile_feasibility
from drover.scheduler.placement.scores import spread_desired, spread_target_boost
from drover.scheduler.structs import Job, Node, Resources, Spread, SpreadTarget
from drover.server.state_store import StateStore, Txn
from tests.fixtures import mock
from tests.harness import Harness

CTX = SchedulerContext(now_ns=0, new_id=lambda: "x")


def _job(count: int, **changes: object) -> Job:
    job = mock.job(**changes)
    group = job.groups[0]
    task = replace(group.tasks[0], resources=Resources(cpu_mhz=10, memory_mb=10))
    return replace(job, groups=(replace(group, count=count, tasks=(task,), ephemeral_disk_mb=0),))


def _place_all(nodes: list[Node], job: Job) -> list[Node]:
    h = Harness()
    for n in nodes:
        h.add_node(n)
    job = h.add_job(job)
    builder = PlanBuilder(h.snapshot(), mock.eval_for(job), job)
    group = job.groups[0]
    rng = random.Random(7)
    placed = []
    for i in range(group.count):
        choice = select_node(builder, job, group, nodes, CTX, rng)
        if choice is None:
            break
        builder.place(mock.alloc(job, choice.node, i, resources=choice.resources))
        placed.append(choice.node)
    return placed


def test_node_pool__only_the_jobs_pool_is_feasible() -> None:
    edge, plain = mock.node(id="edge", node_pool="edge"), mock.node(id="plain")
    feasibility = compile_feasibility(*_one_group(_job(1, node_pool="edge")))
    assert feasibility.feasible(edge)
    assert not feasibility.feasible(plain)
    assert feasibility.filter_reason(plain) == REASON_NODE_POOL


def test_node_pool__unset_is_default_and_all_is_any() -> None:
    edge, plain = mock.node(id="edge", node_pool="edge"), mock.node(id="plain")
    default = compile_feasibility(*_one_group(_job(1)))
    assert default.feasible(plain) and not default.feasible(edge)
    anywhere = compile_feasibility(*_one_group(_job(1, node_pool="all")))
    assert anywhere.feasible(plain) and anywhere.feasible(edge)


def test_node_pool__the_scheduler_places_only_in_the_pool() -> None:
    h = Harness()
    for i in range(3):
        h.add_node(mock.node(id=f"e{i}", node_pool="edge"))
    for i in range(5):
        h.add_node(mock.node(id=f"d{i}"))
    job = h.add_job(_job(9, node_pool="edge"))
    result = h.run(compute_generic, mock.eval_for(job))
    assert result.plan is not None
    placed = {node_id: len(allocs) for node_id, allocs in result.plan.node_allocation.items()}
    assert sum(placed.values()) == 9
    assert set(placed) <= {"e0", "e1", "e2"}


def test_cores__nodes_with_fewer_cores_are_filtered() -> None:
    job = _job(1)
    task = replace(job.groups[0].tasks[0], resources=Resources(cpu_mhz=0, memory_mb=10, cores=8))
    job = replace(job, groups=(replace(job.groups[0], tasks=(task,)),))
    attributes = mock.node().attributes
    small = mock.node(id="small", attributes={**attributes, "cpu.numcores": "4"})
    big = mock.node(id="big", attributes={**attributes, "cpu.numcores": "16"})
    feasibility = compile_feasibility(*_one_group(job))
    assert feasibility.feasible(big)
    assert feasibility.filter_reason(small) == REASON_CORES


def test_spread_targets__percentages_honoured_over_many_placements() -> None:
    nodes = [mock.node(id=f"a{i}", meta={"rack": "a"}) for i in range(4)]
    nodes += [mock.node(id=f"b{i}", meta={"rack": "b"}) for i in range(4)]
    spread = Spread("${meta.rack}", 100, (SpreadTarget("a", 70), SpreadTarget("b", 30)))
    placed = _place_all(nodes, _job(100, spreads=(spread,)))
    by_rack = Counter(n.meta["rack"] for n in placed)
    assert len(placed) == 100
    # Binpacking is scored beside the spread, so a share may be off by a placement or two.
    assert abs(by_rack["a"] - 70) <= 2
    assert abs(by_rack["b"] - 30) <= 2


def test_spread_targets__values_not_named_share_the_rest() -> None:
    nodes = [mock.node(id=f"{rack}{i}", meta={"rack": rack}) for rack in "abc" for i in range(2)]
    spread = Spread("${meta.rack}", 100, (SpreadTarget("a", 50),))
    by_rack = Counter(n.meta["rack"] for n in _place_all(nodes, _job(40, spreads=(spread,))))
    assert abs(by_rack["a"] - 20) <= 2
    assert by_rack["b"] + by_rack["c"] == 20


def test_spread_target_boost__from_plus_one_to_minus_one() -> None:
    desired = spread_desired(Spread("x", 50, (SpreadTarget("a", 50), SpreadTarget("b", 50))), 10)
    assert desired == {"a": 5.0, "b": 5.0}
    assert spread_target_boost(desired, "a", {}) == 1.0
    assert spread_target_boost(desired, "a", {"a": 5}) == 0.0
    assert spread_target_boost(desired, "a", {"a": 20}) == -1.0
    assert spread_target_boost(desired, "z", {}) == -1.0  # no share: every percent is named
    assert spread_target_boost(desired, None, {}) == -1.0


def _one_group(job: Job) -> tuple[Job, object]:
    return job, job.groups[0]


def test_node_pool__a_node_moving_pools_counts_as_new_capacity() -> None:
    store = StateStore()
    node = mock.node(id="n1")
    first = Txn(store.snapshot().tables, 1)
    first.put_node(node)
    store.commit(first.commit())
    same = Txn(store.snapshot().tables, 2)
    same.put_node(node)
    assert not same.changes.capacity
    moved = Txn(store.snapshot().tables, 2)
    moved.put_node(replace(node, node_pool="edge"))
    assert moved.changes.capacity
