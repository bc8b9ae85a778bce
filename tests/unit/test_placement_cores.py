"""``resources { cores = N }`` reserves CPU: N times the node's MHz per core (its total
over ``cpu.numcores``, Nomad's SharesPerCore), so placement, scoring and the plan
applier's fit check all count it (scheduler/fit.py, scheduler/placement/ranking.py)."""

from __future__ import annotations

import random
from dataclasses import replace

from drover.scheduler.fit import allocs_fit, cpu_per_core_mhz
from drover.scheduler.placement import place_on_node, select_node
from drover.scheduler.structs import AllocatedResources, Job, Node, NodeResources, Resources
from tests.fixtures import mock
from tests.unit.test_placement import CTX, world


def cores_node(node_id: str, *, cores: int = 4, cpu_mhz: int = 4000) -> Node:
    """A node of ``cores`` cores sharing ``cpu_mhz`` (no reservation, room for memory)."""
    node = mock.node(id=node_id, resources=NodeResources(cpu_mhz=cpu_mhz, memory_mb=8192, disk_mb=100_000))
    return replace(node, attributes={**node.attributes, "cpu.numcores": str(cores)})


def cores_job(cores: int, count: int = 1) -> Job:
    job = mock.job()
    group = job.groups[0]
    task = replace(group.tasks[0], resources=Resources(cpu_mhz=0, memory_mb=64, cores=cores))
    return replace(
        job, groups=(replace(group, count=count, tasks=(task,), network=None, ephemeral_disk_mb=0),)
    )


def test_cpu_per_core__total_over_numcores__zero_when_unknown() -> None:
    assert cpu_per_core_mhz(cores_node("n1", cores=4, cpu_mhz=4000)) == 1000
    assert cpu_per_core_mhz(mock.node(id="n2")) == 0  # no cpu.numcores


def test_total_resources__cores_count_at_the_given_mhz_per_core() -> None:
    group = cores_job(2).groups[0]
    assert group.total_resources().cpu_mhz == 0
    assert group.total_resources(1000).cpu_mhz == 2000
    assert group.total_resources(1000).cores == 2


def test_select_node__cores_reserve_cpu__the_alloc_asks_cores_times_mhz_per_core() -> None:
    node = cores_node("n1", cores=4, cpu_mhz=4000)
    _, builder, job = world([node], cores_job(2))

    choice = select_node(builder, job, job.groups[0], [node], CTX, random.Random(1))

    assert choice is not None
    assert choice.resources.cpu_mhz == 2000


def test_select_node__cores_taken__the_node_is_exhausted_on_cpu() -> None:
    node = cores_node("n1", cores=4, cpu_mhz=4000)
    other = mock.job(id="busy")
    # 2.5 of the node's 4 GHz in use: 2 more cores (2 GHz) no longer fit; 1 core does.
    busy = mock.alloc(other, node, 0, client_status="running", resources=AllocatedResources(cpu_mhz=2500))
    _, builder, two = world([node], cores_job(2), [busy])

    assert select_node(builder, two, two.groups[0], [node], CTX, random.Random(1)) is None
    assert builder.stats.last_metric is not None
    assert dict(builder.stats.last_metric.dimension_exhausted) == {"cpu": 1}
    _, builder, one = world([node], cores_job(1), [busy])
    assert select_node(builder, one, one.groups[0], [node], CTX, random.Random(1)) is not None


def test_place_on_node__cores_reserve_cpu_and_the_applier_agrees() -> None:
    node = cores_node("n1", cores=2, cpu_mhz=3000)
    _, builder, job = world([node], cores_job(2))

    choice = place_on_node(builder, job, job.groups[0], node)

    assert choice is not None and choice.resources.cpu_mhz == 3000
    placed = mock.alloc(job, node, 0, resources=choice.resources)
    assert allocs_fit(node, [placed]).fits
    extra = mock.alloc(mock.job(id="more"), node, 0, resources=AllocatedResources(cpu_mhz=1))
    assert allocs_fit(node, [placed, extra]).reason == "cpu"
