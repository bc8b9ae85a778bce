"""Feasibility by driver, and placement metrics (Nomad's AllocMetric), from the compiled
checks up through every scheduler: the counts an operator reads in ``job plan``,
``eval status`` and ``alloc status -verbose``, and the stored score ``best_score`` uses."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from drover.scheduler.generic import _reconnect_score, compute_generic
from drover.scheduler.interfaces import SchedulerContext
from drover.scheduler.placement import PlanBuilder, feasible_nodes, score_node, select_node
from drover.scheduler.placement.feasible import (
    REASON_MISSING_DRIVERS,
    FeasibleNodes,
    compile_drivers,
    compile_feasibility,
)
from drover.scheduler.placement.metrics import MAX_SCORE_META, placed_score
from drover.scheduler.structs import (
    AllocMetric,
    Constraint,
    Job,
    Node,
    NodeResources,
    NodeScoreMeta,
    TaskGroup,
)
from drover.scheduler.system import compute_system
from tests.fixtures import mock
from tests.harness import Harness


def with_driver(job: Job, driver: str) -> Job:
    group = job.groups[0]
    task = replace(group.tasks[0], driver=driver)
    return replace(job, groups=(replace(group, tasks=(task,)),))


def with_group(job: Job, **changes: Any) -> Job:
    return replace(job, groups=(replace(job.groups[0], **changes),))


def cluster(n: int, **node_changes: Any) -> tuple[Harness, list[Node]]:
    h = Harness()
    nodes = [h.add_node(mock.node(id=f"n{i}", **node_changes)) for i in range(n)]
    return h, nodes


def placed(result: Any) -> list[Any]:
    plan = result.plan
    return [] if plan is None else [a for allocs in plan.node_allocation.values() for a in allocs]


# ---------------------------------------------------------------------------------------
# Drivers


@pytest.mark.parametrize(
    ("value", "has"),
    [("1", True), ("true", True), ("T", True), ("0", False), ("false", False), ("", False), (None, False)],
    ids=["1", "true", "T", "0", "false", "empty", "absent"],
)
def test_drivers__attribute_read_as_go_parse_bool(value: str | None, has: bool) -> None:
    attributes = (
        {"kernel.name": "linux"} if value is None else {"kernel.name": "linux", "driver.docker": value}
    )
    assert compile_drivers(["docker"])(mock.node(attributes=attributes)) is has


def test_drivers__every_task_driver_needed() -> None:
    job = mock.job()
    group = job.groups[0]
    tasks = (group.tasks[0], replace(group.tasks[0], name="side", driver="raw_exec"))
    job = with_group(job, tasks=tasks)
    check = compile_feasibility(job, job.groups[0])
    assert check.reason(mock.node()) == REASON_MISSING_DRIVERS
    both = mock.node(attributes={**mock.node().attributes, "driver.raw_exec": "1"})
    assert check.reason(both) == ""


def test_feasibility__job_constraints_checked_before_drivers() -> None:
    # Nomad's order: job constraints, then drivers, then group and task constraints.
    job = with_driver(mock.job(), "docker")
    task = replace(job.groups[0].tasks[0], constraints=(Constraint("${node.class}", "=", "gpu"),))
    job = with_group(job, tasks=(task,))
    check = compile_feasibility(job, job.groups[0])
    assert (
        check.reason(mock.node(attributes={"kernel.name": "windows"}))
        == "constraint ${attr.kernel.name} = linux"
    )
    assert check.reason(mock.node()) == REASON_MISSING_DRIVERS
    with_docker = mock.node(attributes={**mock.node().attributes, "driver.docker": "1"})
    assert check.reason(with_docker) == "constraint ${node.class} = gpu"


def test_feasible_nodes__report_counts_the_filtered_by_reason_and_class() -> None:
    h = Harness()
    h.add_node(mock.node(id="a", node_class="small"))
    h.add_node(mock.node(id="b", node_class="small", attributes={"kernel.name": "linux"}))  # no driver
    h.add_node(mock.node(id="c", node_class="big", attributes={"kernel.name": "windows"}))
    h.add_node(mock.node(id="d", datacenter="dc2"))  # not in the job's datacenters: not in the pool
    h.add_node(mock.node(id="e", status="down"))  # not ready: not in the pool
    job = mock.job()
    nodes = feasible_nodes(h.snapshot(), job, job.groups[0])
    assert isinstance(nodes, FeasibleNodes) and [n.id for n in nodes] == ["a"]
    report = nodes.report
    assert (report.nodes_in_pool, report.nodes_filtered) == (3, 2)
    assert report.nodes_available == {"dc1": 3}
    assert report.constraint_filtered == {
        "missing drivers": 1,
        "constraint ${attr.kernel.name} = linux": 1,
    }
    assert report.class_filtered == {"small": 1, "big": 1}


# ---------------------------------------------------------------------------------------
# A driver no node has, in every scheduler


def test_generic__driver_no_node_has__nothing_placed_and_the_reason_reported() -> None:
    h, _ = cluster(3)
    job = h.add_job(with_driver(mock.job(), "docker"))
    result = h.run(compute_generic, mock.eval_for(job))
    assert placed(result) == []
    ev = result.eval_update
    assert ev.queued_allocations == {"web": 10}
    assert ev.failed_tg_allocs == {"web": "no node is feasible"}  # today's string, kept
    metric = ev.failed_tg_metrics["web"]
    assert (metric.nodes_evaluated, metric.nodes_filtered, metric.nodes_exhausted) == (3, 3, 0)
    assert metric.nodes_in_pool == 3
    assert metric.constraint_filtered == {"missing drivers": 3}
    assert metric.coalesced_failures == 9
    (blocked,) = result.created_evals
    assert blocked.failed_tg_metrics == {"web": metric}


@pytest.mark.parametrize("job_factory", [mock.system_job, mock.sysbatch_job], ids=["system", "sysbatch"])
def test_system__driver_no_node_has__no_node_gets_an_alloc(job_factory: Any) -> None:
    h, _ = cluster(2)
    h.add_node(mock.node(id="docker-node", attributes={**mock.node().attributes, "driver.docker": "1"}))
    job = h.add_job(with_driver(job_factory(), "docker"))
    result = h.run(compute_system, mock.eval_for(job))
    assert [a.node_id for a in placed(result)] == ["docker-node"]


@pytest.mark.parametrize("job_factory", [mock.job, mock.batch_job], ids=["service", "batch"])
def test_generic__only_nodes_with_the_driver_are_used(job_factory: Any) -> None:
    h, _ = cluster(3)
    h.add_node(mock.node(id="raw", attributes={**mock.node().attributes, "driver.raw_exec": "1"}))
    job = h.add_job(with_group(with_driver(job_factory(), "raw_exec"), count=3))
    result = h.run(compute_generic, mock.eval_for(job))
    assert {a.node_id for a in placed(result)} == {"raw"}
    metric = placed(result)[0].metrics
    assert metric is not None and metric.constraint_filtered == {"missing drivers": 3}


# ---------------------------------------------------------------------------------------
# Metrics of placed allocs


def test_placed_alloc__keeps_its_metrics_with_the_top_scores() -> None:
    h, _ = cluster(20)
    job = h.add_job(mock.job())
    result = h.run(compute_generic, mock.eval_for(job))
    allocs = placed(result)
    assert len(allocs) == 10
    for alloc in allocs:
        metric = alloc.metrics
        assert metric is not None
        assert metric.nodes_in_pool == 20 and metric.nodes_filtered == 0 and metric.nodes_exhausted == 0
        # log2(20) -> 5 nodes ranked per placement
        assert metric.nodes_evaluated == 5
        metas = metric.score_meta_data
        assert 1 <= len(metas) <= MAX_SCORE_META
        assert [m.norm_score for m in metas] == sorted((m.norm_score for m in metas), reverse=True)
        own = [m for m in metas if m.node_id == alloc.node_id]
        assert len(own) == 1 and own[0].norm_score == metas[0].norm_score
        assert "binpack" in own[0].scores
        assert metric.allocation_time_ns == 0  # no clock in the scheduler


def test_placed_alloc__components_average_to_the_final_score() -> None:
    h, _ = cluster(2)
    job = h.add_job(with_group(mock.job(), count=4))
    for alloc in placed(h.run(compute_generic, mock.eval_for(job))):
        assert alloc.metrics is not None
        for meta in alloc.metrics.score_meta_data:
            parts = list(meta.scores.values())
            assert meta.norm_score == pytest.approx(sum(parts) / len(parts))
    # With 4 allocs on 2 nodes, later placements collide: job anti-affinity shows.
    later = placed(h.results[-1])
    assert any("job-anti-affinity" in m.scores for a in later for m in a.metrics.score_meta_data)  # type: ignore[union-attr]


def test_select_node__reschedule_penalty_shown_for_the_previous_node() -> None:
    h, _ = cluster(2)
    job = h.add_job(with_group(mock.job(), count=1))
    snap = h.snapshot()
    builder = PlanBuilder(snap, mock.eval_for(job), job)
    ctx = SchedulerContext(now_ns=0, new_id=lambda: "x", candidate_limit=2)
    candidates = feasible_nodes(snap, job, job.groups[0])
    choice = select_node(
        builder, job, job.groups[0], candidates, ctx, random.Random(1), penalty_node_ids=frozenset({"n0"})
    )
    assert choice is not None and choice.node.id == "n1" and choice.metrics is not None
    by_node = {m.node_id: m for m in choice.metrics.score_meta_data}
    assert by_node["n0"].scores["node-reschedule-penalty"] == -1.0
    assert "node-reschedule-penalty" not in by_node["n1"].scores


def test_exhausted__by_dimension_and_counted_in_the_failure() -> None:
    h, _ = cluster(3, resources=NodeResources(cpu_mhz=4000, memory_mb=300))
    job = h.add_job(mock.batch_job())  # 10 x 256 MB: one per node
    result = h.run(compute_generic, mock.eval_for(job))
    assert len(placed(result)) == 3
    metric = result.eval_update.failed_tg_metrics["web"]
    assert (metric.nodes_evaluated, metric.nodes_filtered, metric.nodes_exhausted) == (3, 0, 3)
    assert metric.dimension_exhausted == {"memory": 3}
    assert metric.coalesced_failures == 6
    # The later placements saw the nodes the earlier ones filled.
    assert any(a.metrics is not None and a.metrics.nodes_exhausted > 0 for a in placed(result))


def test_exhausted__cpu_named_before_memory() -> None:
    h, _ = cluster(1, resources=NodeResources(cpu_mhz=100, memory_mb=100))
    job = h.add_job(with_group(mock.batch_job(), count=1))
    metric = h.run(compute_generic, mock.eval_for(job)).eval_update.failed_tg_metrics["web"]
    assert metric.dimension_exhausted == {"cpu": 1}


def test_exhausted__static_port_collision_is_ports() -> None:
    h, _ = cluster(2)
    job = h.add_job(with_group(mock.system_job(type="service"), count=3))  # static port 8080
    metric = h.run(compute_generic, mock.eval_for(job)).eval_update.failed_tg_metrics["web"]
    assert metric.dimension_exhausted == {"ports": 2}


def test_filtered__distinct_hosts_named() -> None:
    h, _ = cluster(2)
    job = h.add_job(
        with_group(mock.batch_job(), count=3, constraints=(Constraint(operator="distinct_hosts"),))
    )
    result = h.run(compute_generic, mock.eval_for(job))
    assert len(placed(result)) == 2
    metric = result.eval_update.failed_tg_metrics["web"]
    assert metric.constraint_filtered == {"distinct_hosts": 2}
    assert (metric.nodes_filtered, metric.nodes_exhausted) == (2, 0)


def test_ring__a_node_that_frees_room_leaves_the_exhausted_count() -> None:
    h, nodes = cluster(2, resources=NodeResources(cpu_mhz=4000, memory_mb=300))
    job = h.add_job(with_group(mock.batch_job(), count=1))
    running = [h.add_alloc(mock.alloc(job, node, id=f"a{i}")) for i, node in enumerate(nodes)]
    snap = h.snapshot()
    group = job.groups[0]
    builder = PlanBuilder(snap, mock.eval_for(job), job)
    ctx = SchedulerContext(now_ns=0, new_id=lambda: "x")
    candidates = feasible_nodes(snap, job, group)
    rng = random.Random(3)
    assert select_node(builder, job, group, candidates, ctx, rng) is None
    full = builder.stats.last_metric
    assert full is not None and full.dimension_exhausted == {"memory": 2} and full.nodes_evaluated == 2
    builder.stop(running[0], "freed")
    again = select_node(builder, job, group, candidates, ctx, rng)
    assert again is not None and again.node.id == nodes[0].id
    assert again.metrics is not None and again.metrics.dimension_exhausted == {"memory": 1}
    assert again.metrics.nodes_evaluated == 2


def test_system__failures_coalesce_into_one_metric() -> None:
    h, _ = cluster(3, resources=NodeResources(cpu_mhz=4000, memory_mb=100))
    job = h.add_job(mock.system_job())
    result = h.run(compute_system, mock.eval_for(job))
    assert placed(result) == []
    metric = result.eval_update.failed_tg_metrics["web"]
    assert (metric.nodes_evaluated, metric.nodes_in_pool, metric.nodes_exhausted) == (3, 3, 3)
    assert metric.dimension_exhausted == {"memory": 3}
    assert metric.coalesced_failures == 2
    assert result.eval_update.failed_tg_allocs["web"].startswith("no room on 3 node(s)")  # kept
    (blocked,) = result.created_evals
    assert blocked.failed_tg_metrics == {"web": metric}


def test_system__placed_alloc_has_its_node_score() -> None:
    h, _ = cluster(2)
    job = h.add_job(mock.system_job())
    for alloc in placed(h.run(compute_system, mock.eval_for(job))):
        metric = alloc.metrics
        assert metric is not None and metric.nodes_evaluated == 1
        (meta,) = metric.score_meta_data
        assert meta.node_id == alloc.node_id and "binpack" in meta.scores


# ---------------------------------------------------------------------------------------
# best_score reads the stored score


def test_placed_score__own_node_final_score_or_none() -> None:
    meta = NodeScoreMeta(node_id="n1", scores={"binpack": 0.4}, norm_score=0.4)
    other = NodeScoreMeta(node_id="n2", scores={"binpack": 0.9}, norm_score=0.9)
    alloc = replace(mock.alloc(mock.job(), mock.node(id="n1")), node_id="n1")
    assert placed_score(alloc) is None
    assert placed_score(replace(alloc, metrics=AllocMetric(score_meta_data=(other, meta)))) == 0.4
    assert placed_score(replace(alloc, metrics=AllocMetric(score_meta_data=(other,)))) is None


def test_reconnect_score__stored_score_first_today_rank_for_allocs_without_metrics() -> None:
    h, nodes = cluster(2)
    job = h.add_job(mock.job())
    group = job.groups[0]
    snap = h.snapshot()
    builder = PlanBuilder(snap, mock.eval_for(job), job)
    score = _reconnect_score(builder, snap, job, group)
    stored = AllocMetric(score_meta_data=(NodeScoreMeta(node_id="n0", norm_score=0.777),))
    with_metrics = replace(mock.alloc(job, nodes[0]), metrics=stored)
    assert score(with_metrics) == 0.777
    old = mock.alloc(job, nodes[1])
    assert score(old) == score_node(builder, job, group, nodes[1])


def test_group_without_tasks__no_driver_check() -> None:
    job = Job(id="j", groups=(TaskGroup(name="g", tasks=()),))
    check = compile_feasibility(job, job.groups[0])
    assert check.reason(mock.node(attributes={})) == ""
