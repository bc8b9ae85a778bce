"""drover.scheduler.placement.ports: static ports exactly, dynamic ports free in the node's range, no collisions."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from drover.scheduler import structs
from drover.scheduler.fit import allocs_fit
from drover.scheduler.interfaces import SchedulerContext
from drover.scheduler.placement import PlanBuilder, place_on_node, select_node
from drover.scheduler.placement.ports import assign_ports, reuse_ports
from tests.fixtures import mock
from tests.harness import Harness


def node_with_ports(lo: int = 20000, hi: int = 32000, reserved: tuple[int, ...] = (22,)) -> structs.Node:
    return mock.node(
        resources=structs.NodeResources(
            cpu_mhz=100_000,
            memory_mb=1_000_000,
            disk_mb=10_000_000,
            reserved_ports=reserved,
            min_dynamic_port=lo,
            max_dynamic_port=hi,
        )
    )


def group_with(static: tuple[int, ...] = (), dynamic: int = 0) -> structs.TaskGroup:
    group = mock.job().groups[0]
    network = structs.NetworkResource(
        reserved_ports=tuple(structs.Port(label=f"s{i}", value=v, to=v) for i, v in enumerate(static)),
        dynamic_ports=tuple(structs.Port(label=f"d{i}", to=8080) for i in range(dynamic)),
    )
    return replace(group, network=network)


def values(res: structs.AllocatedResources | None) -> list[int]:
    assert res is not None
    return [p.value for p in res.ports]


def test_assign_ports__static_port_as_asked_with_group_resources() -> None:
    group = group_with(static=(8080,))
    res = assign_ports(node_with_ports(), group, set())
    total = group.total_resources()
    assert res == structs.AllocatedResources(
        cpu_mhz=total.cpu_mhz,
        memory_mb=total.memory_mb,
        disk_mb=total.disk_mb,
        ports=(structs.AllocatedPort(label="s0", value=8080, to=8080),),
    )


STATIC_CONFLICT_CASES = [
    ("held by a proposed alloc", (8080,), {8080}, (22,)),
    ("reserved by the node", (22,), set(), (22,)),
    ("asked twice by the group", (8080, 8080), set(), ()),
]


@pytest.mark.parametrize(
    ("static", "used", "reserved"),
    [c[1:] for c in STATIC_CONFLICT_CASES],
    ids=[c[0] for c in STATIC_CONFLICT_CASES],
)
def test_assign_ports__static_port_taken__no_fit(
    static: tuple[int, ...], used: set[int], reserved: tuple[int, ...]
) -> None:
    assert assign_ports(node_with_ports(reserved=reserved), group_with(static=static), used) is None


def test_assign_ports__dynamic_lowest_free_without_rng() -> None:
    node = node_with_ports(lo=100, hi=110, reserved=(100, 102))
    res = assign_ports(node, group_with(dynamic=3), {101, 104})
    assert values(res) == [103, 105, 106]


def test_assign_ports__dynamic_port_keeps_its_to_mapping() -> None:
    res = assign_ports(node_with_ports(), group_with(dynamic=1), set())
    assert res is not None
    assert res.ports[0].label == "d0"
    assert res.ports[0].to == 8080


def test_assign_ports__dynamic_skips_static_of_same_alloc() -> None:
    node = node_with_ports(lo=100, hi=101, reserved=())
    assert values(assign_ports(node, group_with(static=(100,), dynamic=1), set())) == [100, 101]


def test_assign_ports__dynamic_range_exhausted__no_fit() -> None:
    node = node_with_ports(lo=100, hi=102, reserved=(101,))
    assert assign_ports(node, group_with(dynamic=2), {100}) is None
    assert assign_ports(node, group_with(dynamic=2), set()) is not None


def test_assign_ports__random_draws_stay_in_range_and_free() -> None:
    node = node_with_ports(lo=1000, hi=1010, reserved=(1005,))
    used = {1000, 1001, 1002}
    for seed in range(50):
        got = values(assign_ports(node, group_with(dynamic=4), used, random.Random(seed)))
        assert len(set(got)) == 4
        assert all(1000 <= p <= 1010 and p not in used and p != 1005 for p in got)


def test_assign_ports__same_rng_seed_same_ports() -> None:
    node, group = node_with_ports(), group_with(dynamic=3)
    first = assign_ports(node, group, {20001}, random.Random(42))
    again = assign_ports(node, group, {20001}, random.Random(42))
    assert first == again
    assert first != assign_ports(node, group, {20001}, random.Random(43))


def test_reuse_ports__same_labels_keep_previous_values() -> None:
    group = group_with(static=(8080,), dynamic=1)
    previous = structs.AllocatedResources(
        ports=(
            structs.AllocatedPort("s0", 8080, 8080),
            structs.AllocatedPort("d0", 23456, 8080, host_ip="10.0.0.1"),
        )
    )
    assert reuse_ports(group, previous) == (
        structs.AllocatedPort("s0", 8080, 8080),
        structs.AllocatedPort("d0", 23456, 8080, host_ip="10.0.0.1"),
    )


REUSE_MISMATCH_CASES = [
    ("static value changed", (structs.AllocatedPort("s0", 9090), structs.AllocatedPort("d0", 23456))),
    ("label missing", (structs.AllocatedPort("s0", 8080),)),
    (
        "extra label",
        (structs.AllocatedPort("s0", 8080), structs.AllocatedPort("d0", 1), structs.AllocatedPort("d1", 2)),
    ),
]


@pytest.mark.parametrize(
    "ports", [c[1] for c in REUSE_MISMATCH_CASES], ids=[c[0] for c in REUSE_MISMATCH_CASES]
)
def test_reuse_ports__group_asks_differently__none(ports: tuple[structs.AllocatedPort, ...]) -> None:
    assert reuse_ports(group_with(static=(8080,), dynamic=1), structs.AllocatedResources(ports=ports)) is None


# ---------------------------------------------------------------------------------------
# Through the plan builder: the plan's own placements hold ports too


def small_job(group: structs.TaskGroup) -> structs.Job:
    task = replace(group.tasks[0], resources=structs.Resources(cpu_mhz=1, memory_mb=1))
    return mock.job(groups=(replace(group, tasks=(task,), ephemeral_disk_mb=0, count=200),))


def test_ports__200_placements_on_one_node_never_collide() -> None:
    h = Harness()
    node = h.add_node(node_with_ports(lo=20000, hi=20450, reserved=(20001, 20002)))
    job = h.add_job(small_job(group_with(static=(), dynamic=2)))
    group = job.groups[0]
    # An existing alloc already holds two ports in the range.
    h.add_alloc(
        mock.alloc(
            job,
            node,
            0,
            resources=structs.AllocatedResources(
                ports=(structs.AllocatedPort("a", 20003), structs.AllocatedPort("b", 20004))
            ),
        )
    )
    builder = PlanBuilder(h.snapshot(), mock.eval_for(job), job)
    ctx = SchedulerContext(now_ns=0, new_id=lambda: "x", seed=1)
    rng = random.Random(1)
    for i in range(1, 201):
        choice = select_node(builder, job, group, [node], ctx, rng)
        assert choice is not None, f"placement {i}"
        builder.place(mock.alloc(job, node, i, resources=choice.resources))
    held = [p.value for a in builder.proposed_on(node.id) for p in a.resources.ports]  # type: ignore[union-attr]
    assert len(held) == 402
    assert len(set(held)) == 402
    assert not {20001, 20002} & set(held)
    assert allocs_fit(node, builder.proposed_on(node.id)).fits


def test_ports__static_port_taken_on_node__place_on_node_no_fit() -> None:
    h = Harness()
    node = h.add_node(node_with_ports())
    job = h.add_job(mock.system_job())  # static 8080
    h.add_alloc(mock.alloc(job, node, 0))  # already holds 8080
    other = mock.system_job()
    builder = PlanBuilder(h.snapshot(), mock.eval_for(other), other)
    assert place_on_node(builder, other, other.groups[0], node) is None
    assert builder.stats.nodes_exhausted == 1


def test_ports__reserved_node_port_respected_by_select_node() -> None:
    h = Harness()
    blocked = h.add_node(node_with_ports(reserved=(8080,)))
    free = h.add_node(node_with_ports(reserved=(22,)))
    job = h.add_job(mock.system_job(type="service"))  # static 8080
    builder = PlanBuilder(h.snapshot(), mock.eval_for(job), job)
    ctx = SchedulerContext(now_ns=0, new_id=lambda: "x")
    choice = select_node(builder, job, job.groups[0], [blocked, free], ctx, random.Random(3))
    assert choice is not None
    assert choice.node.id == free.id
    assert [p.value for p in choice.resources.ports] == [8080]
