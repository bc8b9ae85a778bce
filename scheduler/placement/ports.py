"""Port assignment for one alloc on one node.

A group asks for static ports (``network.reserved_ports``: the exact value) and dynamic
ports (``network.dynamic_ports``: any free value in the node's
``[min_dynamic_port, max_dynamic_port]``). Ports are exclusive on a node: a port is free when
the node does not reserve it and no live alloc in the node's *proposed* view holds it. The
caller passes that view's ports as ``used``; because ``PlanBuilder.proposed_on`` includes the
plan's earlier placements, two placements of one plan never get the same port (the bug
behind Nomad's "plan for node rejected" loop, #16401).

Dynamic ports are drawn at random from the range (a few tries, as Nomad does, so that
replicas do not all land on the lowest ports and collide with a stale view elsewhere), then
found by a linear scan; without an rng the lowest free port is taken. Either way the result
depends only on the inputs and the rng's state.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING, Final

from drover.scheduler.fit import cpu_per_core_mhz
from drover.scheduler.structs import AllocatedPort, AllocatedResources, Node, NodeResources, Port, TaskGroup

if TYPE_CHECKING:  # the caller's seeded Random; scheduler/ never imports random at run time
    import random

__all__ = [
    "MAX_RANDOM_PORT_ATTEMPTS",
    "assign_ports",
    "group_ports",
    "node_reserved_ports",
    "pick_port_values",
    "pick_ports",
    "reuse_ports",
]

# Random draws before falling back to a scan (Nomad's maxRandPortAttempts).
MAX_RANDOM_PORT_ATTEMPTS: Final = 20

_NO_PORTS: Final[tuple[Port, ...]] = ()


def node_reserved_ports(node: Node) -> tuple[int, ...]:
    return (node.resources or NodeResources()).reserved_ports


def group_ports(group: TaskGroup) -> tuple[tuple[Port, ...], tuple[Port, ...]]:
    """(static, dynamic) ports the group asks for."""
    net = group.network
    if net is None:
        return _NO_PORTS, _NO_PORTS
    return net.reserved_ports, net.dynamic_ports


def _pick_one(
    lo: int,
    hi: int,
    used: Container[int],
    reserved: Container[int],
    taken: set[int],
    rng: random.Random | None,
) -> int | None:
    if hi < lo:
        return None
    if rng is not None:
        span = hi - lo + 1
        draw = rng.random
        for _ in range(MAX_RANDOM_PORT_ATTEMPTS):
            port = lo + int(draw() * span)
            if port not in used and port not in reserved and port not in taken:
                return port
    for port in range(lo, hi + 1):
        if port not in used and port not in reserved and port not in taken:
            return port
    return None


def pick_port_values(
    node: Node,
    static: tuple[Port, ...],
    dynamic: tuple[Port, ...],
    used: Container[int],
    rng: random.Random | None = None,
) -> tuple[int, ...] | None:
    """The port numbers for ``static + dynamic``, in that order, or None when one is taken."""
    res = node.resources or NodeResources()
    reserved = res.reserved_ports
    taken: set[int] = set()
    out: list[int] = []
    for port in static:
        value = port.value
        if value in used or value in reserved or value in taken:
            return None
        taken.add(value)
        out.append(value)
    for _ in dynamic:
        picked = _pick_one(res.min_dynamic_port, res.max_dynamic_port, used, reserved, taken, rng)
        if picked is None:
            return None
        taken.add(picked)
        out.append(picked)
    return tuple(out)


def pick_ports(
    node: Node,
    static: tuple[Port, ...],
    dynamic: tuple[Port, ...],
    used: Container[int],
    rng: random.Random | None = None,
) -> tuple[AllocatedPort, ...] | None:
    """The alloc's ports (static first, in the group's order), or None when one is taken."""
    picked = pick_port_values(node, static, dynamic, used, rng)
    if picked is None:
        return None
    return tuple(
        AllocatedPort(label=spec.label, value=value, to=spec.to)
        for spec, value in zip((*static, *dynamic), picked, strict=True)
    )


def assign_ports(
    node: Node, group: TaskGroup, used: Container[int], rng: random.Random | None = None
) -> AllocatedResources | None:
    """Static ports as asked, dynamic ports from the node's [min_dynamic_port, max_dynamic_port]
    that are not in ``used`` nor reserved by the node. None when a static port is taken or the
    range is exhausted. Deterministic for a given rng (lowest free port when rng is None).

    ``used`` is any container of port numbers (a set, or the keys of a port -> holders map).
    """
    static, dynamic = group_ports(group)
    ports = pick_ports(node, static, dynamic, used, rng)
    if ports is None:
        return None
    total = group.total_resources(cpu_per_core_mhz(node))
    return AllocatedResources(
        cpu_mhz=total.cpu_mhz, memory_mb=total.memory_mb, disk_mb=total.disk_mb, ports=ports
    )


def reuse_ports(group: TaskGroup, previous: AllocatedResources | None) -> tuple[AllocatedPort, ...] | None:
    """An in-place update keeps its ports (Nomad restores the existing networks) when the
    group still asks for the same labels and the same static values; else None."""
    if previous is None:
        return None
    static, dynamic = group_ports(group)
    by_label = {p.label: p for p in previous.ports}
    if len(by_label) != len(previous.ports) or len(by_label) != len(static) + len(dynamic):
        return None
    out: list[AllocatedPort] = []
    for port in static:
        old = by_label.get(port.label)
        if old is None or old.value != port.value:
            return None
        out.append(AllocatedPort(label=port.label, value=port.value, to=port.to, host_ip=old.host_ip))
    for port in dynamic:
        old = by_label.get(port.label)
        if old is None:
            return None
        out.append(AllocatedPort(label=port.label, value=old.value, to=port.to, host_ip=old.host_ip))
    return tuple(out)
