"""Placing allocs on nodes: the plan under construction, feasibility, ranking and ports.

Used by both the generic (service/batch) and the system (system/sysbatch) schedulers:

    builder = PlanBuilder(state, ev, job)
    builder.stop(alloc, "alloc not needed due to job update")
    builder.update_status(other, description=..., client_status="unknown")   # stays running
    choice = select_node(builder, job, group, candidates, ctx, rng)          # generic
    choice = place_on_node(builder, job, group, node)                        # system
    if choice is not None:
        builder.place(new_alloc(...) with node_id=choice.node.id, resources=choice.resources)
    plan = builder.build()

``PlanBuilder`` keeps the proposed view of every node (live allocs minus the plan's stops,
plus the plan's placements) so that binpacking, ``distinct_hosts``, spread and dynamic ports
all see the plan's own earlier decisions: two placements in one plan never collide.
Fit is decided by ``scheduler.fit.allocs_fit``, the same function the plan applier uses.

Theory of operation
-------------------
*Per-node views.* The first time a node is looked at, its view is built from
``state.allocs_by_node`` (live allocs, minus the plan's stops, with the plan's placements
replacing by ID). From then on ``stop`` and ``place`` update the view in place: the sums of
cpu/memory/disk, the live count, a port -> holders map (with the number of ports held twice)
and per-job / per-group alloc counts. ``fits`` answers from those sums in O(ports) and is
exactly ``allocs_fit(node, proposed_on(node) + [new])`` (a hypothesis test holds it to that).

*Per (job, group) preparation.* Constraints, affinities, spread and distinct_property
counters are compiled the first time a group is placed and reused for every later alloc of
the group. Counters of allocs per property value (spread, distinct_property) are kept
incrementally for the whole job.

*Candidate rotation.* Like Nomad's stack, candidates are shuffled once (with the caller's
``rng``) per (group, candidate list) and then visited as a ring: each ``select_node`` call
continues where the previous one stopped and scores at most ``limit`` nodes that fit. So a
placement costs O(limit), not O(nodes), and consecutive replicas land on different nodes.
The fit check and the view-only part of a node's score are cached against the view's
version: between two visits a node has changed only if it won in between.

*Dropped nodes.* A node that does not fit (or breaks distinct_hosts / distinct_property)
cannot start fitting while the plan only grows, so it leaves the ring. It comes back when
its own view loses an alloc (a stop, an in-place replacement); every node comes back when
a distinct_property count drops. Pass the same candidate list object to every call of a
pass: a different list starts a new ring.

*Status-only entries.* ``update_status`` records a node_update entry that keeps the
alloc's desired status (a disconnecting alloc marked unknown, a failed one stamped with its
follow-up eval). An upsert of the existing alloc cannot do this: the FSM keeps the
client-owned fields of an upserted alloc (server/fsm.py apply_plan_results), and the plan
applier may reject an upsert where node_update entries always pass (on a down node, for
one), taking the node's other entries with it. The alloc stays as live as it was, so no
view, counter or ring changes.

Public additions to the original API: ``PlanBuilder.fits`` (the cached fit check),
``PlanBuilder.update_status``, ``PlanBuilder.stats`` (``PlacementStats``),
``PlanBuilder.eval``/``.job``, ``place_on_node(..., replacing=, rng=, penalty_node_ids=)``
and ``score_node``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduler import rank
from scheduler.feasible import (
    Feasibility,
    Getter,
    compile_feasibility,
    compile_target,
    distinct_hosts_scope,
    distinct_properties,
    feasible_nodes,
)
from scheduler.fit import allocs_fit, node_capacity
from scheduler.interfaces import SchedulerContext, State
from scheduler.ports import assign_ports, group_ports, pick_port_values, reuse_ports
from scheduler.structs import (
    ALLOC_CLIENT_PENDING,
    ALLOC_DESIRED_RUN,
    ALLOC_DESIRED_STOP,
    AllocatedPort,
    AllocatedResources,
    Allocation,
    AllocStop,
    Evaluation,
    Job,
    Node,
    NodeResources,
    Plan,
    RescheduleEvent,
    TaskGroup,
)

if TYPE_CHECKING:  # the caller's seeded Random; scheduler/ never imports random at run time
    import random

__all__ = [
    "AllocStop",
    "NodeChoice",
    "PlacementStats",
    "PlanBuilder",
    "assign_ports",
    "feasible_nodes",
    "new_alloc",
    "place_on_node",
    "score_node",
    "select_node",
]


@dataclass(frozen=True, slots=True)
class NodeChoice:
    node: Node
    # Resources for the new alloc: the group's cpu/memory/disk and its ports with every
    # dynamic port assigned (static ports as requested).
    resources: AllocatedResources
    score: float = 0.0


@dataclass(slots=True)
class PlacementStats:
    """Counters over a builder's life, for metrics, `job plan` output and tests."""

    selections: int = 0  # select_node / place_on_node calls
    nodes_evaluated: int = 0  # candidates looked at
    nodes_filtered: int = 0  # rejected by constraints, distinct_hosts or distinct_property
    nodes_exhausted: int = 0  # rejected for cpu, memory, disk, max allocs or ports
    nodes_scored: int = 0  # fitting candidates ranked


# cpu, memory, disk capacity (after the node's reservation), max_allocs, reserved ports.
_Caps = tuple[int, int, int, int, tuple[int, ...]]


class _NodeView:
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


def _fits(view: _NodeView, caps: _Caps, cpu: int, mem: int, disk: int, ports: Sequence[int]) -> bool:
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


class _PropertyCounter:
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


class _Rotation:
    """The shuffled candidate ring of one (group, candidate list); see the module docstring.

    ``dead`` nodes are still in ``order`` but skipped; once they are more than half of it
    they move to ``removed``. A node whose view lost an alloc (``PlanBuilder._freed``) comes
    back: out of ``dead``, or from ``removed`` to the end of the ring. A change of a
    distinct_property count (``PlanBuilder._epoch``) can free any node: the whole ring
    comes back.
    """

    __slots__ = (
        "base",
        "candidates",
        "dead",
        "epoch",
        "freed_seen",
        "identity",
        "index",
        "limit",
        "order",
        "pos",
        "removed",
    )

    def __init__(self, candidates: Sequence[Node], base: list[Node], epoch: int, freed_seen: int) -> None:
        self.candidates = candidates
        self.identity = tuple(map(id, candidates))
        self.base = base
        self.order = base
        self.pos = 0
        self.dead: set[str] = set()
        self.removed: dict[str, Node] = {}
        self.epoch = epoch
        self.freed_seen = freed_seen
        self.index: dict[str, int] | None = None
        self.limit: tuple[int, int] = (-1, 0)  # (configured, limit), see select_node

    def refresh(self, epoch: int, freed: list[str]) -> list[Node]:
        if epoch != self.epoch:
            self.epoch = epoch
            self.freed_seen = len(freed)
            if self.dead or self.order is not self.base:
                current = self.order[self.pos] if self.order else None
                if self.index is None:
                    self.index = {n.id: i for i, n in enumerate(self.base)}
                self.order = self.base
                self.pos = self.index[current.id] if current is not None else 0
                self.dead.clear()
                self.removed.clear()
            return self.order
        if self.freed_seen < len(freed):
            for node_id in freed[self.freed_seen :]:
                if node_id in self.dead:
                    self.dead.discard(node_id)
                    continue
                node = self.removed.pop(node_id, None)
                if node is not None:  # (removed is only non-empty after a compaction copied order)
                    self.order.append(node)
            self.freed_seen = len(freed)
        if self.dead and 2 * len(self.dead) > len(self.order):
            kept: list[Node] = []
            pos = 0
            for i, node in enumerate(self.order):
                if i == self.pos:
                    pos = len(kept)
                if node.id in self.dead:
                    self.removed[node.id] = node
                else:
                    kept.append(node)
            self.order = kept
            self.pos = pos if pos < len(kept) else 0
            self.dead.clear()
        return self.order


_MAX_ROTATIONS = 4


class _Prepared:
    """Everything about one (job, group) that placing its allocs needs, compiled once."""

    __slots__ = (
        "affinity",
        "affinity_cache",
        "cache",
        "cpu",
        "desired",
        "disk",
        "distinct",
        "distinct_hosts",
        "dynamic",
        "feasibility",
        "group",
        "group_key",
        "job",
        "job_key",
        "mem",
        "plain",
        "port_cache",
        "port_specs",
        "rotations",
        "spreads",
        "static",
        "static_values",
        "wide",
    )

    def __init__(self, builder: PlanBuilder, job: Job, group: TaskGroup) -> None:
        self.job = job
        self.group = group
        self.feasibility: Feasibility = compile_feasibility(job, group)
        total = group.total_resources()
        self.cpu, self.mem, self.disk = total.cpu_mhz, total.memory_mb, total.disk_mb
        self.static, self.dynamic = group_ports(group)
        self.static_values = tuple(p.value for p in self.static)
        self.port_specs = (*self.static, *self.dynamic)
        self.port_cache: dict[tuple[int, int], AllocatedPort] = {}
        self.plain: AllocatedResources | None = None
        if not self.static and not self.dynamic:
            self.plain = AllocatedResources(cpu_mhz=self.cpu, memory_mb=self.mem, disk_mb=self.disk)
        ns = job.namespace
        self.job_key = (ns, job.id)
        self.group_key = (ns, job.id, group.name)
        self.desired = max(group.count, 1)
        scope = distinct_hosts_scope(job, group)
        self.distinct_hosts = 1 if scope == "job" else 2 if scope == "group" else 0
        self.distinct = tuple(
            (builder._counter(ns, job.id, group.name if p.group_scoped else None, p.target), p.limit)
            for p in distinct_properties(job, group)
        )
        for counter, _ in self.distinct:
            counter.distinct = True
        self.affinity = rank.compile_affinities(job.affinities + group.affinities)
        self.affinity_cache: dict[str, float] = {}
        spreads = [s for s in job.spreads + group.spreads if s.weight > 0]
        weights = sum(s.weight for s in spreads)
        self.spreads = tuple(
            (builder._counter(ns, job.id, group.name, s.attribute), s.weight / weights) for s in spreads
        )
        self.wide = self.affinity is not None or bool(self.spreads)
        self.rotations: list[_Rotation] = []
        # node ID -> (view, its version, score sum, component count, mean): see _scan.
        self.cache: dict[str, tuple[_NodeView, int, float, int, float]] = {}

    def rotation(
        self, candidates: Sequence[Node], rng: random.Random, epoch: int, freed_seen: int
    ) -> _Rotation:
        for rot in self.rotations:
            if rot.candidates is candidates:
                return rot
        identity = tuple(map(id, candidates))
        for rot in self.rotations:
            if rot.identity == identity:  # the same nodes in the same order, another list
                rot.candidates = candidates
                return rot
        base = list(candidates)
        rng.shuffle(base)
        rot = _Rotation(candidates, base, epoch, freed_seen)
        self.rotations.insert(0, rot)
        del self.rotations[_MAX_ROTATIONS:]
        return rot

    def hosts_ok(self, view: _NodeView) -> bool:
        if self.distinct_hosts == 1:
            return not view.jobs.get(self.job_key)
        if self.distinct_hosts == 2:
            return not view.groups.get(self.group_key)
        return True

    def props_ok(self, node: Node) -> bool:
        for counter, limit in self.distinct:
            value = counter.value_of(node)
            if value is None or counter.counts.get(value, 0) >= limit:
                return False
        return True

    def distinct_ok(self, view: _NodeView, node: Node) -> bool:
        return self.hosts_ok(view) and self.props_ok(node)

    def resources_on(
        self, node: Node, used: _NodeView | set[int], rng: random.Random | None
    ) -> AllocatedResources | None:
        if self.plain is not None:
            return self.plain
        held = used.ports if isinstance(used, _NodeView) else used
        values = pick_port_values(node, self.static, self.dynamic, held, rng)
        if values is None:
            return None
        # AllocatedPort values are immutable: share one per (label, port) across the plan.
        made = self.port_cache
        ports = []
        for i, value in enumerate(values):
            port = made.get((i, value))
            if port is None:
                spec = self.port_specs[i]
                port = made[(i, value)] = AllocatedPort(label=spec.label, value=value, to=spec.to)
            ports.append(port)
        return AllocatedResources(cpu_mhz=self.cpu, memory_mb=self.mem, disk_mb=self.disk, ports=tuple(ports))

    def affinity_of(self, node: Node) -> float:
        assert self.affinity is not None
        score = self.affinity_cache.get(node.id)
        if score is None:
            score = self.affinity_cache[node.id] = self.affinity(node)
        return score

    def spread_of(self, node: Node) -> float:
        total = 0.0
        for counter, weight in self.spreads:
            bounds = counter.bounds()
            if bounds is None:
                continue
            value = counter.value_of(node)
            if value is None:
                total -= weight
                continue
            count = counter.counts.get(value, 0)
            total += weight * rank.spread_boost_between(count, min(bounds[0], count), max(bounds[1], count))
        return total


class PlanBuilder:
    """Accumulates stops and placements for one eval and answers "what is on node N now"."""

    def __init__(self, state: State, ev: Evaluation, job: Job | None) -> None:
        self._state = state
        self._ev = ev
        self._job = job
        self._stops: dict[str, dict[str, AllocStop]] = {}
        self._status_updates: dict[str, dict[str, AllocStop]] = {}
        self._status_updated: set[str] = set()
        self._stopped: set[str] = set()
        self._stopped_frozen: frozenset[str] | None = frozenset()
        self._placed: dict[str, dict[str, Allocation]] = {}
        self._placed_node: dict[str, str] = {}
        self._placed_order: dict[str, Allocation] = {}
        self._views: dict[str, _NodeView] = {}
        self._nodes: dict[str, Node | None] = {}
        self._caps: dict[str, tuple[Node, _Caps]] = {}
        self._counters: dict[tuple[str, str], dict[tuple[str | None, str], _PropertyCounter]] = {}
        self._prepared: dict[tuple[str, str, int, str], _Prepared] = {}
        self._last_prepared: _Prepared | None = None
        self._spread_algorithm: bool | None = None
        # Where room may have appeared, for the rings of select_node (see _Rotation): nodes
        # whose view lost an alloc, in order, and a counter of distinct_property changes.
        self._freed: list[str] = []
        self._epoch = 0
        self.stats = PlacementStats()

    @property
    def state(self) -> State:
        return self._state

    @property
    def eval(self) -> Evaluation:
        return self._ev

    @property
    def job(self) -> Job | None:
        return self._job

    # -- changes -------------------------------------------------------------------------

    def stop(
        self, alloc: Allocation, description: str, *, client_status: str = "", followup_eval_id: str = ""
    ) -> None:
        """Stop ``alloc`` (desired_status stop); ``client_status`` e.g. "lost" for a down node."""
        if alloc.id in self._placed_node:
            raise ValueError(f"alloc {alloc.id} is placed by this plan and cannot also be stopped")
        if alloc.id in self._status_updated:
            raise ValueError(f"alloc {alloc.id} is status-updated by this plan and cannot also be stopped")
        self._stops.setdefault(alloc.node_id, {})[alloc.id] = AllocStop(
            alloc_id=alloc.id,
            desired_status=ALLOC_DESIRED_STOP,
            desired_description=description,
            client_status=client_status,
            followup_eval_id=followup_eval_id,
        )
        self._stopped.add(alloc.id)
        self._stopped_frozen = None
        # Room appears only where the alloc was counted. A node without a view was never
        # visited, so no ring has dropped it.
        view = self._views.get(alloc.node_id)
        if view is not None and view.remove(alloc.id) is not None:
            self._freed.append(alloc.node_id)
        counters = self._counters.get((alloc.namespace, alloc.job_id))
        if counters:
            for counter in counters.values():
                if counter.remove(alloc.id) and counter.distinct:
                    self._epoch += 1

    def place(self, alloc: Allocation) -> None:
        """Add a new or updated (same ID: in-place update) alloc; it must carry node_id and resources."""
        if not alloc.node_id:
            raise ValueError(f"alloc {alloc.id} has no node_id")
        if alloc.resources is None:
            raise ValueError(f"alloc {alloc.id} has no resources")
        if alloc.id in self._stopped:
            raise ValueError(f"alloc {alloc.id} is stopped by this plan and cannot also be placed")
        if alloc.id in self._status_updated:
            raise ValueError(f"alloc {alloc.id} is status-updated by this plan and cannot also be placed")
        node_id = alloc.node_id
        previous_node = self._placed_node.get(alloc.id)
        if previous_node is not None and previous_node != node_id:
            del self._placed[previous_node][alloc.id]
            view = self._views.get(previous_node)
            if view is not None and view.remove(alloc.id) is not None:
                self._freed.append(previous_node)
        self._placed.setdefault(node_id, {})[alloc.id] = alloc
        self._placed_node[alloc.id] = node_id
        self._placed_order[alloc.id] = alloc
        view = self._views.get(node_id)
        if view is not None:
            if alloc.id in view.allocs:  # an in-place update may need less than before
                view.remove(alloc.id)
                self._freed.append(node_id)
            view.add(alloc)
        counters = self._counters.get((alloc.namespace, alloc.job_id))
        if counters:
            node = self._node(node_id)
            for counter in counters.values():
                if counter.add(alloc, node) and counter.distinct:
                    self._epoch += 1

    def update_status(
        self,
        alloc: Allocation,
        *,
        description: str | None = None,
        client_status: str = "",
        followup_eval_id: str = "",
    ) -> None:
        """Record a status-only entry for ``alloc``, which keeps its desired status (see the
        module docstring). ``description`` None keeps the alloc's desired_description (the FSM
        writes the entry's, so "keep" must be spelled out); an empty ``client_status`` or
        ``followup_eval_id`` leaves that field as it is.

        One entry per alloc per plan. The FSM applies node_update entries in plan order, so
        a status-only entry after a stop would make the alloc desired-running again, and it
        applies upserts after them, so an in-place update would overwrite the entry's
        description and follow-up eval. Reconcile and the system diff put each alloc in one
        bucket, so an overlap is a programming error: ValueError in either order, as stop
        and place already do with each other.
        """
        if alloc.id in self._stopped:
            raise ValueError(f"alloc {alloc.id} is stopped by this plan and cannot also be status-updated")
        if alloc.id in self._placed_node:
            raise ValueError(f"alloc {alloc.id} is placed by this plan and cannot also be status-updated")
        if alloc.id in self._status_updated:
            raise ValueError(f"alloc {alloc.id} is already status-updated by this plan")
        self._status_updates.setdefault(alloc.node_id, {})[alloc.id] = AllocStop(
            alloc_id=alloc.id,
            desired_status=alloc.desired_status,
            desired_description=alloc.desired_description if description is None else description,
            client_status=client_status,
            followup_eval_id=followup_eval_id,
        )
        self._status_updated.add(alloc.id)

    # -- queries -------------------------------------------------------------------------

    def proposed_on(self, node_id: str) -> list[Allocation]:
        """Live allocs on the node as the plan stands: existing - stopped + placed."""
        return list(self._view(node_id).allocs.values())

    def stopped_ids(self) -> frozenset[str]:
        if self._stopped_frozen is None:
            self._stopped_frozen = frozenset(self._stopped)
        return self._stopped_frozen

    def placements(self) -> list[Allocation]:
        return list(self._placed_order.values())

    def fits(self, node: Node, resources: AllocatedResources, *, replacing: str = "") -> bool:
        """Whether one more live alloc holding ``resources`` fits on ``node`` as the plan stands.

        Always equal to ``allocs_fit(node, proposed_on(node.id) + [that alloc]).fits``;
        ``replacing`` names a proposed alloc the new one replaces (an in-place update).
        """
        view = self._view(node.id)
        if replacing and replacing in view.allocs:
            others = [a for a in view.allocs.values() if a.id != replacing]
            new = Allocation(id=replacing, node_id=node.id, resources=resources)
            return allocs_fit(node, [*others, new]).fits
        ports = tuple(p.value for p in resources.ports)
        return _fits(
            view, self._caps_of(node), resources.cpu_mhz, resources.memory_mb, resources.disk_mb, ports
        )

    def build(self, *, all_at_once: bool = False) -> Plan | None:
        """The plan, or None when it changes nothing. A node's stops come before its
        status-only entries, each in the order they were recorded."""
        node_allocation = {
            n: tuple(self._placed[n].values()) for n in sorted(self._placed) if self._placed[n]
        }
        node_update: dict[str, tuple[AllocStop, ...]] = {}
        for n in sorted(self._stops.keys() | self._status_updates.keys()):
            entries = (*self._stops.get(n, {}).values(), *self._status_updates.get(n, {}).values())
            if entries:
                node_update[n] = entries
        if not node_allocation and not node_update:
            return None
        ev = self._ev
        return Plan(
            eval_id=ev.id,
            priority=ev.priority,
            job_id=ev.job_id or (self._job.id if self._job is not None else ""),
            namespace=ev.namespace,
            all_at_once=all_at_once,
            node_allocation=node_allocation,
            node_update=node_update,
            snapshot_index=self._state.index,
        )

    # -- internals (used by select_node / place_on_node) -------------------------------------

    def _view(self, node_id: str) -> _NodeView:
        view = self._views.get(node_id)
        if view is None:
            view = _NodeView()
            placed = self._placed.get(node_id, {})
            stopped = self._stopped
            for a in self._state.allocs_by_node(node_id):
                if a.id not in stopped and a.id not in placed:
                    view.add(a)
            for a in placed.values():
                view.add(a)
            self._views[node_id] = view
        return view

    def _node(self, node_id: str) -> Node | None:
        try:
            return self._nodes[node_id]
        except KeyError:
            node = self._nodes[node_id] = self._state.node(node_id)
            return node

    def _caps_of(self, node: Node) -> _Caps:
        entry = self._caps.get(node.id)
        if entry is None or entry[0] is not node:
            cpu, mem, disk = node_capacity(node)
            res = node.resources or NodeResources()
            entry = (node, (cpu, mem, disk, res.max_allocs, res.reserved_ports))
            self._caps[node.id] = entry
        return entry[1]

    def _counter(self, namespace: str, job_id: str, group: str | None, target: str) -> _PropertyCounter:
        counters = self._counters.setdefault((namespace, job_id), {})
        counter = counters.get((group, target))
        if counter is None:
            counter = counters[(group, target)] = _PropertyCounter(target, group)
            for a in self._state.allocs_by_job(namespace, job_id):
                if a.id not in self._stopped and a.id not in self._placed_node:
                    counter.add(a, self._node(a.node_id))
            for a in self._placed_order.values():
                if a.namespace == namespace and a.job_id == job_id:
                    counter.add(a, self._node(a.node_id))
        return counter

    def _prepare(self, job: Job, group: TaskGroup) -> _Prepared:
        last = self._last_prepared
        if last is not None and last.group is group and last.job is job:
            return last
        key = (job.namespace, job.id, job.version, group.name)
        prep = self._prepared.get(key)
        if prep is None or not (
            (prep.group is group and prep.job is job) or (prep.group == group and prep.job == job)
        ):
            prep = self._prepared[key] = _Prepared(self, job, group)
        self._last_prepared = prep
        return prep

    def _spread(self) -> bool:
        if self._spread_algorithm is None:
            self._spread_algorithm = self._state.scheduler_config().scheduler_algorithm == "spread"
        return self._spread_algorithm

    def _base_score(self, prep: _Prepared, node: Node, view: _NodeView, caps: _Caps) -> tuple[float, int]:
        """(sum, count) of the components that depend only on the node's view: binpack,
        job anti-affinity and affinities. Cacheable against ``view.version``."""
        score = rank.binpack_score(
            view.cpu + prep.cpu, caps[0], view.mem + prep.mem, caps[1], spread=self._spread()
        )
        parts = 1
        collisions = view.groups.get(prep.group_key, 0)
        if collisions:
            score += rank.anti_affinity_penalty(collisions, prep.desired)
            parts += 1
        if prep.affinity is not None:
            affinity = prep.affinity_of(node)
            if affinity:
                score += affinity
                parts += 1
        return score, parts

    def _score(self, prep: _Prepared, node: Node, view: _NodeView, caps: _Caps, penalized: bool) -> float:
        score, parts = self._base_score(prep, node, view, caps)
        if penalized:
            score += rank.RESCHEDULE_PENALTY
            parts += 1
        if prep.spreads:
            spread = prep.spread_of(node)
            if spread:
                score += spread
                parts += 1
        return score / parts


_Scored = tuple[float, Node, _NodeView]


def _scan(
    builder: PlanBuilder, prep: _Prepared, rot: _Rotation, limit: int, penalty_node_ids: frozenset[str]
) -> _Scored | None:
    """One pass of the limit iterator over the ring: the best of up to ``limit`` fitting nodes.

    Hot path (called once per placement): the fit check and the view-only part of the score
    are cached per node against the view's version. Between two visits of a node the ring
    has moved on, and the node changed only if it won in between, so most visits hit.
    """
    order = rot.refresh(builder._epoch, builder._freed)
    n = len(order)
    if n == 0:
        return None
    views = builder._views
    cache = prep.cache
    dead = rot.dead
    cpu, mem, disk, static = prep.cpu, prep.mem, prep.disk, prep.static_values
    hosts, props, spreads = prep.distinct_hosts, prep.distinct, prep.spreads
    # Without per-call components the cached final score is the score.
    per_call = bool(props or spreads or penalty_node_ids)
    max_skip = rank.MAX_SKIP
    best_node: Node | None = None
    best_view: _NodeView | None = None
    best_score = -math.inf
    best_id = ""
    fallback: _Scored | None = None  # the best of the skipped (negatively scored) nodes
    skipped = counted = filtered = exhausted = 0
    pos = rot.pos
    seen = 0
    while seen < n and counted < limit:
        node = order[pos]
        pos += 1
        if pos == n:
            pos = 0
        seen += 1
        node_id = node.id
        if node_id in dead:
            continue
        entry = cache.get(node_id)
        if entry is not None and entry[1] == entry[0].version:
            view = entry[0]
            score = entry[4]
            if per_call:
                score, parts = entry[2], entry[3]
        else:
            view = views.get(node_id) or builder._view(node_id)
            if hosts and not prep.hosts_ok(view):
                dead.add(node_id)
                filtered += 1
                continue
            caps = builder._caps_of(node)
            if not _fits(view, caps, cpu, mem, disk, static):
                dead.add(node_id)
                exhausted += 1
                continue
            score, parts = builder._base_score(prep, node, view, caps)
            cache[node_id] = (view, view.version, score, parts, score / parts)
            if not per_call:
                score /= parts
        if per_call:
            if props and not prep.props_ok(node):
                dead.add(node_id)
                filtered += 1
                continue
            if penalty_node_ids and node_id in penalty_node_ids:
                score += rank.RESCHEDULE_PENALTY
                parts += 1
            if spreads:
                spread = prep.spread_of(node)
                if spread:
                    score += spread
                    parts += 1
            score /= parts
        if score < 0.0 and skipped < max_skip:
            skipped += 1
            if fallback is None or score > fallback[0] or (score == fallback[0] and node_id < fallback[1].id):
                fallback = (score, node, view)
            continue
        counted += 1
        if score > best_score or (score == best_score and node_id < best_id):
            best_node, best_view, best_score, best_id = node, view, score, node_id
    rot.pos = pos
    stats = builder.stats
    stats.nodes_evaluated += counted + skipped + filtered + exhausted
    stats.nodes_filtered += filtered
    stats.nodes_exhausted += exhausted
    stats.nodes_scored += counted + skipped
    # Skipped nodes only count when the ring ran out before ``limit`` good ones were found.
    if (
        fallback is not None
        and counted < limit
        and (
            best_node is None
            or fallback[0] > best_score
            or (fallback[0] == best_score and fallback[1].id < best_id)
        )
    ):
        return fallback
    if best_node is None or best_view is None:
        return None
    return best_score, best_node, best_view


def new_alloc(
    ev: Evaluation,
    job: Job,
    group: TaskGroup,
    choice: NodeChoice,
    ctx: SchedulerContext,
    *,
    name: str,
    index: int,
    previous_id: str = "",
    reschedule_events: tuple[RescheduleEvent, ...] = (),
) -> Allocation:
    """A new alloc of ``group`` on the chosen node: the one way both schedulers mint one."""
    return Allocation(
        id=ctx.new_id(),
        namespace=job.namespace,
        eval_id=ev.id,
        name=name,
        node_id=choice.node.id,
        node_name=choice.node.name,
        job_id=job.id,
        job_version=job.version,
        task_group=group.name,
        resources=choice.resources,
        desired_status=ALLOC_DESIRED_RUN,
        client_status=ALLOC_CLIENT_PENDING,
        previous_allocation=previous_id,
        reschedule_events=reschedule_events,
        create_time_ns=ctx.now_ns,
        modify_time_ns=ctx.now_ns,
        index=index,
    )


def select_node(
    builder: PlanBuilder,
    job: Job,
    group: TaskGroup,
    candidates: Sequence[Node],
    ctx: SchedulerContext,
    rng: random.Random,
    *,
    penalty_node_ids: frozenset[str] = frozenset(),
) -> NodeChoice | None:
    """Pick the best node among ``candidates`` (already feasible) for one alloc of ``group``.

    Shuffles candidates with ``rng``; visits at most ``ctx.candidate_limit`` nodes that fit
    (0 = default: max(2, ceil(log2(len(candidates))))), skipping nodes where the alloc does not
    fit (allocs_fit over builder.proposed_on(node) + the new alloc) or distinct_hosts would be
    violated; scores binpack (or spread when the scheduler config says "spread"), weighted
    affinities, spread blocks, job anti-affinity (penalise nodes already holding allocs of the
    same job/group in the proposed view) and a penalty for ``penalty_node_ids`` (a rescheduled
    alloc's previous node). Returns None when nothing fits.

    The shuffle happens once per (group, candidate list) in a builder; later calls continue
    around the same ring (Nomad's behaviour), so pass the same list object each time. When
    affinities or spreads apply the limit is at least ``rank.WIDE_LIMIT``. Up to
    ``rank.MAX_SKIP`` negatively scored nodes are passed over while others remain. The caller
    places the returned choice before the next call, so the next placement sees it.
    """
    stats = builder.stats
    stats.selections += 1
    if not candidates:
        return None
    prep = builder._prepare(job, group)
    rot = prep.rotation(candidates, rng, builder._epoch, len(builder._freed))
    configured, limit = rot.limit
    if configured != ctx.candidate_limit:
        limit = rank.candidate_limit(len(candidates), ctx.candidate_limit, wide=prep.wide)
        rot.limit = (ctx.candidate_limit, limit)
    while True:
        picked = _scan(builder, prep, rot, limit, penalty_node_ids)
        if picked is None:
            return None
        score, node, view = picked
        resources = prep.resources_on(node, view, rng)
        if resources is not None:
            return NodeChoice(node=node, resources=resources, score=score)
        rot.dead.add(node.id)  # its dynamic port range is exhausted: try the ring again
        stats.nodes_exhausted += 1


def place_on_node(
    builder: PlanBuilder,
    job: Job,
    group: TaskGroup,
    node: Node,
    *,
    replacing: Allocation | None = None,
    rng: random.Random | None = None,
    penalty_node_ids: frozenset[str] = frozenset(),
) -> NodeChoice | None:
    """Fit one alloc of ``group`` on this specific node (system jobs): constraints and fit
    checked against builder.proposed_on(node); ports assigned. None when it does not fit.

    Readiness and datacenters are the caller's business (``feasible_nodes`` checks them).
    ``replacing`` is a proposed alloc the new one replaces in place (same ID): it is left
    out of the fit and distinct checks and its ports are kept when the group still asks for
    the same ones. Dynamic ports are the lowest free ones unless ``rng`` is given.
    """
    stats = builder.stats
    stats.selections += 1
    stats.nodes_evaluated += 1
    prep = builder._prepare(job, group)
    if not prep.feasibility.constraints_ok(node):
        stats.nodes_filtered += 1
        return None
    view = builder._view(node.id)
    penalized = node.id in penalty_node_ids
    if replacing is not None and replacing.id in view.allocs:
        return _place_replacing(builder, prep, node, view, replacing, rng, penalized)
    if not prep.distinct_ok(view, node):
        stats.nodes_filtered += 1
        return None
    caps = builder._caps_of(node)
    if not _fits(view, caps, prep.cpu, prep.mem, prep.disk, prep.static_values):
        stats.nodes_exhausted += 1
        return None
    resources = prep.resources_on(node, view, rng)
    if resources is None:
        stats.nodes_exhausted += 1
        return None
    stats.nodes_scored += 1
    return NodeChoice(node=node, resources=resources, score=builder._score(prep, node, view, caps, penalized))


def _place_replacing(
    builder: PlanBuilder,
    prep: _Prepared,
    node: Node,
    view: _NodeView,
    replacing: Allocation,
    rng: random.Random | None,
    penalized: bool,
) -> NodeChoice | None:
    """The in-place path: rare, so it recomputes exactly from the proposed allocs."""
    stats = builder.stats
    others = _NodeView()
    for a in view.allocs.values():
        if a.id != replacing.id:
            others.add(a)
    distinct_ok = prep.distinct_hosts == 0 or (
        not others.jobs.get(prep.job_key)
        if prep.distinct_hosts == 1
        else not others.groups.get(prep.group_key)
    )
    for counter, limit in prep.distinct:
        value = counter.value_of(node)
        if value is None or counter.count(value, excluding=replacing.id) >= limit:
            distinct_ok = False
    if not distinct_ok:
        stats.nodes_filtered += 1
        return None
    ports = reuse_ports(prep.group, replacing.resources)
    if ports is not None:
        resources = AllocatedResources(cpu_mhz=prep.cpu, memory_mb=prep.mem, disk_mb=prep.disk, ports=ports)
    else:
        maybe = prep.resources_on(node, others, rng)
        if maybe is None:
            stats.nodes_exhausted += 1
            return None
        resources = maybe
    new = Allocation(id=replacing.id, node_id=node.id, resources=resources)
    if not allocs_fit(node, [*others.allocs.values(), new]).fits:
        stats.nodes_exhausted += 1
        return None
    stats.nodes_scored += 1
    score = builder._score(prep, node, others, builder._caps_of(node), penalized)
    return NodeChoice(node=node, resources=resources, score=score)


def score_node(
    builder: PlanBuilder,
    job: Job,
    group: TaskGroup,
    node: Node,
    *,
    penalty_node_ids: frozenset[str] = frozenset(),
) -> float:
    """The rank ``select_node`` would give ``node`` for one more alloc of ``group`` as the
    plan stands (fit not checked): e.g. to keep the better-ranked of two allocs."""
    prep = builder._prepare(job, group)
    view = builder._view(node.id)
    return builder._score(prep, node, view, builder._caps_of(node), node.id in penalty_node_ids)
