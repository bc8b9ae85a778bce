"""The plan under construction: ``PlanBuilder`` collects one eval's stops, status-only
entries and placements, and keeps the node views current so every later choice sees them.

*Status-only entries.* ``update_status`` records a node_update entry that keeps the
alloc's desired status (a disconnecting alloc marked unknown, a failed one stamped with its
follow-up eval). An upsert of the existing alloc cannot do this: the FSM keeps the
client-owned fields of an upserted alloc (server/fsm.py apply_plan_results), and the plan
applier may reject an upsert where node_update entries always pass (on a down node, for
one), taking the node's other entries with it. The alloc stays as live as it was, so no
view, counter or ring changes.

*One entry per alloc.* An alloc is stopped, placed or status-updated by a plan, never two
of these: the FSM applies node_update entries in plan order and upserts after them, so a
second entry would undo or overwrite the first. Reconcile and the system diff put each
alloc in one bucket, so an overlap is a programming error and raises ``ValueError``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Final

from drover.scheduler.fit import allocs_fit
from drover.scheduler.placement.ranking import NodeChoice, PlacementStats, PreparedGroups
from drover.scheduler.placement.views import NodeViews, view_fits
from drover.scheduler.structs import (
    ALLOC_CLIENT_PENDING,
    ALLOC_DESIRED_RUN,
    ALLOC_DESIRED_STOP,
    AllocatedResources,
    Allocation,
    AllocDeploymentStatus,
    AllocStop,
    Deployment,
    DeploymentStatusUpdate,
    Evaluation,
    Job,
    Node,
    Plan,
    RescheduleEvent,
    TaskGroup,
)

if TYPE_CHECKING:
    from drover.scheduler.interfaces import SchedulerContext, State

__all__ = ["PlanBuilder", "new_alloc", "updated_in_place", "with_deployment"]

# The kinds of entry a plan holds for an alloc, as its error messages name them.
_STOPPED: Final = "stopped"
_PLACED: Final = "placed"
_STATUS_UPDATED: Final = "status-updated"


class PlanBuilder:
    """Accumulates stops and placements for one eval and answers "what is on node N now".

    ``views`` (the proposed view of every node), ``groups`` (each placed group, compiled
    once) and ``stats`` are for ``drover.scheduler.placement.ranking``; callers change the plan
    only through ``stop``, ``place`` and ``update_status``.
    """

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
        self.views = NodeViews(state, self._stopped, self._placed, self._placed_order)
        self.groups = PreparedGroups(state, self.views)
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
        self._refuse_second_entry(alloc.id, _STOPPED)
        self._stops.setdefault(alloc.node_id, {})[alloc.id] = AllocStop(
            alloc_id=alloc.id,
            desired_status=ALLOC_DESIRED_STOP,
            desired_description=description,
            client_status=client_status,
            followup_eval_id=followup_eval_id,
        )
        self._stopped.add(alloc.id)
        self._stopped_frozen = None
        self.views.alloc_stopped(alloc)

    def place(self, alloc: Allocation) -> None:
        """Add a new or updated (same ID: in-place update) alloc; it must carry node_id and resources."""
        if not alloc.node_id:
            raise ValueError(f"alloc {alloc.id} has no node_id")
        if alloc.resources is None:
            raise ValueError(f"alloc {alloc.id} has no resources")
        self._refuse_second_entry(alloc.id, _PLACED)
        node_id = alloc.node_id
        previous_node = self._placed_node.get(alloc.id)
        if previous_node is not None and previous_node != node_id:
            del self._placed[previous_node][alloc.id]
        self._placed.setdefault(node_id, {})[alloc.id] = alloc
        self._placed_node[alloc.id] = node_id
        self._placed_order[alloc.id] = alloc
        self.views.alloc_placed(alloc, previous_node)

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
        ``followup_eval_id`` leaves that field as it is. One entry per alloc per plan:
        ValueError in either order, as stop and place already do with each other.
        """
        self._refuse_second_entry(alloc.id, _STATUS_UPDATED)
        self._status_updates.setdefault(alloc.node_id, {})[alloc.id] = AllocStop(
            alloc_id=alloc.id,
            desired_status=alloc.desired_status,
            desired_description=alloc.desired_description if description is None else description,
            client_status=client_status,
            followup_eval_id=followup_eval_id,
        )
        self._status_updated.add(alloc.id)

    def _refuse_second_entry(self, alloc_id: str, entry: str) -> None:
        """One entry per alloc (module docstring): ValueError when the plan already has
        another kind of entry for it, or a status-only one. A second stop or placement of
        the same alloc replaces the first."""
        for kind, taken in (
            (_STOPPED, self._stopped),
            (_PLACED, self._placed_node.keys()),
            (_STATUS_UPDATED, self._status_updated),
        ):
            if alloc_id not in taken:
                continue
            if kind != entry:
                raise ValueError(f"alloc {alloc_id} is {kind} by this plan and cannot also be {entry}")
            if kind == _STATUS_UPDATED:
                raise ValueError(f"alloc {alloc_id} is already status-updated by this plan")

    # -- queries -------------------------------------------------------------------------

    def proposed_on(self, node_id: str) -> list[Allocation]:
        """Live allocs on the node as the plan stands: existing - stopped + placed."""
        return list(self.views.view(node_id).allocs.values())

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
        view = self.views.view(node.id)
        if replacing and replacing in view.allocs:
            others = [a for a in view.allocs.values() if a.id != replacing]
            new = Allocation(id=replacing, node_id=node.id, resources=resources)
            return allocs_fit(node, [*others, new]).fits
        ports = tuple(p.value for p in resources.ports)
        return view_fits(
            view, self.views.caps(node), resources.cpu_mhz, resources.memory_mb, resources.disk_mb, ports
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
    deployment_id: str = "",
    canary: bool = False,
) -> Allocation:
    """A new alloc of ``group`` on the chosen node: the one way both schedulers mint one.
    ``deployment_id``: the deployment it joins; ``canary``: it runs beside the old allocs
    until promotion (docs/deployments.md)."""
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
        metrics=choice.metrics,
        deployment_id=deployment_id,
        deployment_status=_CANARY if canary else None,
    )


# Every canary starts the same (frozen, so one value serves them all).
_CANARY: Final = AllocDeploymentStatus(canary=True)


def updated_in_place(
    alloc: Allocation, job: Job, ev: Evaluation, now_ns: int, *, deployment_id: str = ""
) -> Allocation:
    """``alloc`` moved to ``job``'s version without a restart: the one way both schedulers
    update in place. ``deployment_id``: the deployment it joins; an alloc new to it is
    judged afresh by its client (its old health verdict was about the old deployment)."""
    moved = replace(alloc, job_version=job.version, eval_id=ev.id, modify_time_ns=now_ns)
    if deployment_id and alloc.deployment_id != deployment_id:
        moved = replace(moved, deployment_id=deployment_id, deployment_status=None)
    return moved


def with_deployment(
    plan: Plan | None,
    ev: Evaluation,
    snapshot_index: int,
    deployment: Deployment | None,
    updates: tuple[DeploymentStatusUpdate, ...],
) -> Plan | None:
    """``plan`` carrying the deployment this pass writes and the status changes of others.
    Either is a change on its own: with nothing placed or stopped, the plan holds just them."""
    if deployment is None and not updates:
        return plan
    base = plan or Plan(
        eval_id=ev.id,
        priority=ev.priority,
        job_id=ev.job_id,
        namespace=ev.namespace,
        snapshot_index=snapshot_index,
    )
    return replace(base, deployment=deployment, deployment_updates=updates)
