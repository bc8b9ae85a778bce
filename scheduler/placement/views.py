"""Node views: each node as the plan under construction leaves it, kept as running sums.

The first time a node is looked at, its view is built from ``state.allocs_by_node`` (live
allocs, minus the plan's stops, with the plan's placements replacing by ID). From then on
``PlanBuilder`` reports every stop and placement (``alloc_stopped`` / ``alloc_placed``) and
the view changes in place: the sums of cpu/memory/disk, the live count, a port -> holders
map (with the number of ports held twice) and per-job / per-group alloc counts.
``view_fits`` answers from those sums in O(ports) and is exactly
``allocs_fit(node, proposed_on(node) + [new])`` (a hypothesis test holds it to that).

Counters of a job's live allocs per value of a node property (spread, distinct_property)
are kept the same way, for the whole job, from the first time a group asks for one.

Where room may have appeared is recorded for the candidate rings of
``drover.scheduler.placement.ranking``: ``freed`` lists, in order, the nodes whose view lost an
alloc, and ``epoch`` counts changes of a distinct_property count (which can free any node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import TYPE_CHECKING, Final

from drover.scheduler.fit import node_capacity
from drover.scheduler.placement.feasible import Getter, compile_target
from drover.scheduler.structs import Allocation, Node, NodeResources

if TYPE_CHECKING:
    from drover.scheduler.interfaces import State

__all__ = [
    "DIMENSION_CPU",
    "DIMENSION_DISK",
    "DIMENSION_DYNAMIC_PORTS",
    "DIMENSION_MAX_ALLOCS",
    "DIMENSION_MEMORY",
    "DIMENSION_PORTS",
    "NodeCaps",
    "NodeView",
    "NodeViews",
    "PropertyCounter",
    "exhausted_dimension",
    "view_fits",
]

# cpu, memory, disk capacity (after the node's reservation), max_allocs, reserved ports.
NodeCaps = tuple[int, int, int, int, tuple[int, ...]]


class NodeView:
    """One node's live allocs as the plan stands, with running sums (see module docstring)."""

    __slots__ = ("allocs", "count", "cpu", "disk", "dup_ports", "groups", "jobs", "mem", "ports", "version")

    def __init__(self) -> None:
        self.allocs: dict[str, Allocation] = {}
        # Bumped on every change: ranking caches per-node results against it.
        self.version = 0
        self.cpu = self.mem = self.disk = self.count = 0
        self.ports: dict[int, int] = {}  # port -> number of live allocs holding it
        self.dup_ports = 0  # ports held by two or more allocs (a collision already)
        self.jobs: dict[tuple[str, str], int] = {}
        self.groups: dict[tuple[str, str, str], int] = {}

    def add(self, a: Allocation) -> None:
        if a.terminal():
            return
        self.allocs[a.id] = a
        self.version += 1
        self.count += 1
        jkey = (a.namespace, a.job_id)
        self.jobs[jkey] = self.jobs.get(jkey, 0) + 1
        gkey = (a.namespace, a.job_id, a.task_group)
        self.groups[gkey] = self.groups.get(gkey, 0) + 1
        r = a.resources
        if r is None:
            return
        self.cpu += r.cpu_mhz
        self.mem += r.memory_mb
        self.disk += r.disk_mb
        ports = self.ports
        for p in r.ports:
            held = ports.get(p.value, 0)
            if held == 1:
                self.dup_ports += 1
            ports[p.value] = held + 1

    def remove(self, alloc_id: str) -> Allocation | None:
        a = self.allocs.pop(alloc_id, None)
        if a is None:
            return None
        self.version += 1
        self.count -= 1
        jkey = (a.namespace, a.job_id)
        self.jobs[jkey] -= 1
        gkey = (a.namespace, a.job_id, a.task_group)
        self.groups[gkey] -= 1
        r = a.resources
        if r is not None:
            self.cpu -= r.cpu_mhz
            self.mem -= r.memory_mb
            self.disk -= r.disk_mb
            ports = self.ports
            for p in r.ports:
                held = ports[p.value]
                if held == 2:
                    self.dup_ports -= 1
                if held == 1:
                    del ports[p.value]
                else:
                    ports[p.value] = held - 1
        return a

    def without(self, alloc_id: str) -> NodeView:
        """A fresh view of the same allocs but ``alloc_id`` (for an in-place replacement)."""
        others = NodeView()
        for a in self.allocs.values():
            if a.id != alloc_id:
                others.add(a)
        return others


def view_fits(view: NodeView, caps: NodeCaps, cpu: int, mem: int, disk: int, ports: Sequence[int]) -> bool:
    """``allocs_fit(node, view + [an alloc asking cpu/mem/disk/ports])`` from the sums."""
    cap_cpu, cap_mem, cap_disk, max_allocs, reserved = caps
    if view.dup_ports:
        return False
    held = view.ports
    if held:
        for port in reserved:
            if port in held:
                return False
    if view.cpu + cpu > cap_cpu or view.mem + mem > cap_mem or view.disk + disk > cap_disk:
        return False
    if max_allocs and view.count >= max_allocs:
        return False
    if ports:
        seen: set[int] = set()
        for port in ports:
            if port in held or port in reserved or port in seen:
                return False
            seen.add(port)
    return True


# Exhausted dimensions, as placement metrics name them (Nomad's dimension strings).
DIMENSION_CPU: Final = "cpu"
DIMENSION_MEMORY: Final = "memory"
DIMENSION_DISK: Final = "disk"
DIMENSION_MAX_ALLOCS: Final = "max allocs"
DIMENSION_PORTS: Final = "ports"  # a static port already held, or reserved on the node
DIMENSION_DYNAMIC_PORTS: Final = "dynamic ports"  # no free port left in the node's dynamic range


def exhausted_dimension(
    view: NodeView, caps: NodeCaps, cpu: int, mem: int, disk: int, ports: Sequence[int]
) -> str:
    """Which dimension makes ``view_fits`` false (checked in the order operators read them:
    cpu, memory, disk, then ports and max allocs); "" when it fits. Called only for a node
    that just failed the fit, so it may take its time."""
    cap_cpu, cap_mem, cap_disk, max_allocs, reserved = caps
    if view.cpu + cpu > cap_cpu:
        return DIMENSION_CPU
    if view.mem + mem > cap_mem:
        return DIMENSION_MEMORY
    if view.disk + disk > cap_disk:
        return DIMENSION_DISK
    held = view.ports
    if view.dup_ports or any(p in held for p in reserved):
        return DIMENSION_PORTS
    if len(set(ports)) != len(ports) or any(p in held or p in reserved for p in ports):
        return DIMENSION_PORTS
    if max_allocs and view.count >= max_allocs:
        return DIMENSION_MAX_ALLOCS
    return ""


class PropertyCounter:
    """Live allocs of one job (or one of its groups) per value of a node property."""

    __slots__ = (
        "_bounds",
        "_bounds_version",
        "_values",
        "counts",
        "distinct",
        "getter",
        "group",
        "members",
        "version",
    )

    def __init__(self, target: str, group: str | None) -> None:
        # Used by a distinct_property constraint: a drop in a count may make any node fit.
        self.distinct = False
        self.getter: Getter = compile_target(target)
        self.group = group
        self.counts: dict[str, int] = {}
        self.members: dict[str, str | None] = {}  # alloc ID -> the value it was counted under
        self.version = 0
        self._values: dict[str, str | None] = {}
        self._bounds: tuple[int, int] | None = None
        self._bounds_version = -1

    def value_of(self, node: Node) -> str | None:
        try:
            return self._values[node.id]
        except KeyError:
            value = self._values[node.id] = self.getter(node)
            return value

    def add(self, a: Allocation, node: Node | None) -> bool:
        """Count ``a`` (replacing an alloc of the same ID); True when one was replaced."""
        replaced = self.remove(a.id)
        if a.terminal() or (self.group is not None and a.task_group != self.group):
            return replaced
        value = self.value_of(node) if node is not None else None
        self.members[a.id] = value
        if value is not None:
            self.counts[value] = self.counts.get(value, 0) + 1
            self.version += 1
        return replaced

    def remove(self, alloc_id: str) -> bool:
        if alloc_id not in self.members:
            return False
        value = self.members.pop(alloc_id)
        if value is not None:
            left = self.counts[value] - 1
            if left:
                self.counts[value] = left
            else:
                del self.counts[value]
            self.version += 1
        return True

    def count(self, value: str, *, excluding: str = "") -> int:
        n = self.counts.get(value, 0)
        if excluding in self.members and self.members[excluding] == value:
            n -= 1
        return n

    def bounds(self) -> tuple[int, int] | None:
        """(fewest, most) allocs over the values holding any; None when nothing is placed."""
        if self._bounds_version != self.version:
            values = self.counts.values()
            self._bounds = (min(values), max(values)) if values else None
            self._bounds_version = self.version
        return self._bounds


class NodeViews:
    """Every node's view, built on first use and kept current as the plan changes.

    ``stopped``, ``placed`` and ``placed_order`` are the plan's own containers (alloc IDs
    the plan stops; placements by node, then ID; placements by ID in plan order): the views
    read them to build a node's first view, and only ``PlanBuilder`` writes them.
    """

    __slots__ = (
        "_caps",
        "_counters",
        "_nodes",
        "_placed",
        "_placed_order",
        "_state",
        "_stopped",
        "_views",
        "epoch",
        "freed",
    )

    def __init__(
        self,
        state: State,
        stopped: Set[str],
        placed: Mapping[str, Mapping[str, Allocation]],
        placed_order: Mapping[str, Allocation],
    ) -> None:
        self._state = state
        self._stopped = stopped
        self._placed = placed
        self._placed_order = placed_order
        self._views: dict[str, NodeView] = {}
        self._nodes: dict[str, Node | None] = {}
        self._caps: dict[str, tuple[Node, NodeCaps]] = {}
        self._counters: dict[tuple[str, str], dict[tuple[str | None, str], PropertyCounter]] = {}
        # Where room may have appeared (see the module docstring).
        self.freed: list[str] = []
        self.epoch = 0

    def view(self, node_id: str) -> NodeView:
        view = self._views.get(node_id)
        if view is None:
            view = NodeView()
            placed = self._placed.get(node_id, {})
            stopped = self._stopped
            for a in self._state.allocs_by_node(node_id):
                if a.id not in stopped and a.id not in placed:
                    view.add(a)
            for a in placed.values():
                view.add(a)
            self._views[node_id] = view
        return view

    def node(self, node_id: str) -> Node | None:
        try:
            return self._nodes[node_id]
        except KeyError:
            node = self._nodes[node_id] = self._state.node(node_id)
            return node

    def caps(self, node: Node) -> NodeCaps:
        entry = self._caps.get(node.id)
        if entry is None or entry[0] is not node:
            cpu, mem, disk = node_capacity(node)
            res = node.resources or NodeResources()
            entry = (node, (cpu, mem, disk, res.max_allocs, res.reserved_ports))
            self._caps[node.id] = entry
        return entry[1]

    def counter(self, namespace: str, job_id: str, group: str | None, target: str) -> PropertyCounter:
        """Live allocs of the job (of ``group`` only, unless None) per value of ``target``."""
        counters = self._counters.setdefault((namespace, job_id), {})
        counter = counters.get((group, target))
        if counter is None:
            counter = counters[(group, target)] = PropertyCounter(target, group)
            for a in self._state.allocs_by_job(namespace, job_id):
                if a.id not in self._stopped and a.id not in self._placed_order:
                    counter.add(a, self.node(a.node_id))
            for a in self._placed_order.values():
                if a.namespace == namespace and a.job_id == job_id:
                    counter.add(a, self.node(a.node_id))
        return counter

    def alloc_stopped(self, alloc: Allocation) -> None:
        """The plan stops ``alloc``. Room appears only where it was counted: a node without
        a view was never visited, so no ring has dropped it."""
        view = self._views.get(alloc.node_id)
        if view is not None and view.remove(alloc.id) is not None:
            self.freed.append(alloc.node_id)
        counters = self._counters.get((alloc.namespace, alloc.job_id))
        if counters:
            for counter in counters.values():
                if counter.remove(alloc.id) and counter.distinct:
                    self.epoch += 1

    def alloc_placed(self, alloc: Allocation, previous_node: str | None) -> None:
        """The plan places ``alloc`` (``previous_node``: where the plan had placed it before)."""
        node_id = alloc.node_id
        if previous_node is not None and previous_node != node_id:
            view = self._views.get(previous_node)
            if view is not None and view.remove(alloc.id) is not None:
                self.freed.append(previous_node)
        view = self._views.get(node_id)
        if view is not None:
            if alloc.id in view.allocs:  # an in-place update may need less than before
                view.remove(alloc.id)
                self.freed.append(node_id)
            view.add(alloc)
        counters = self._counters.get((alloc.namespace, alloc.job_id))
        if counters:
            node = self.node(node_id)
            for counter in counters.values():
                if counter.add(alloc, node) and counter.distinct:
                    self.epoch += 1
