"""Service and batch reconciliation: one task group's allocs sorted into named buckets.

Theory of operation
-------------------
``reconcile_group`` takes every input as a value (the job, one group, that group's allocs
including terminal ones, the tainted nodes, the time, older job versions) and returns a
``GroupResult``: what to place, what to stop, what to update, and why. It never reads a
clock, mints an ID or looks at the state store; ``scheduler/generic.py`` turns the result
into a plan. The identity of a unit of work is its *slot*: the name index ``i`` of
``job.group[i]``. A replacement (reschedule, lost, migrate, destructive update, disconnect)
takes over the slot of the alloc it replaces and points back to it with
``previous_allocation``; that link is how later passes know a slot was already handed over.
The words (buckets, node situations, rules, descriptions, ``tasks_updated``) are
``drover.scheduler.reconciler.vocabulary``'s; the reschedule policy is ``reconciler.reschedule``.

The steps, in order (each is one function below):

1. ``_classify``: ``CLASSIFICATION_RULES`` (first match wins) puts every alloc in a
   category: lost, gone (history: stopped earlier, or already replaced), done (a finished
   batch alloc), superseded (a failed replacement of an alloc that is back: stopped),
   failed, disconnecting, unknown, migrate, reconnecting or untainted.
   ``_stop_lost_and_superseded`` stops the first and the fourth.
2. ``_stop_everything``: a stopped job stops every live alloc and places nothing.
3. ``_settle_reconnects``: an alloc that is back on a healthy node while a replacement of
   it also runs keeps exactly one of the two (``RECONNECT_PICKERS``; ties keep the
   original, docs/field-reports.md#field-report-3).
4. ``_slot_holders``: every alloc that still speaks for a slot becomes a *holder*. Some
   holders stay (untainted, done, a failed alloc that may not or not yet be rescheduled),
   some must move (lost, migrating, failed-and-rescheduled-now, disconnected-and-replaced).
   ``_give_up_excess_slots``: with more holders than ``count``, ``REMOVAL_ORDER`` picks who
   goes: movers first (dropping one saves a placement), then failed, then live allocs by
   highest index, finished batch work last.
5. ``_move_holders``: movers become placements into their own slot; ``_fill_free_slots``
   fills free slots lowest index first.
6. ``_update_holders``: a holder on an older job version is updated in place (same alloc,
   new version) or destructively (stop + place), per ``tasks_updated``. A service group
   with an update block rolls under its deployment (``reconciler.rollout``): canaries
   first when it asks for them (set aside from the slot holders until promotion, then each
   takes over the slot of the old alloc of its name), then at most ``max_parallel``
   destructive updates whose health is not known yet; the rest are held back
   (``held_back``) until a health verdict's eval looks again.

Drover departs from Nomad where Nomad fell short (scheduler/README.md has the list): an
``unknown`` alloc whose replacement could not be placed is retried on later evals instead of
waiting for its node (Nomad #16644), and a completed batch alloc is never re-run, even after
a job update.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from drover.scheduler.reconciler.migrate import drain_forced, drain_room, group_check_count
from drover.scheduler.reconciler.reschedule import (
    RESCHEDULE_WINDOW_NS,
    RescheduleDecision,
    next_reschedule,
    replacement_events,
)
from drover.scheduler.reconciler.rollout import RolloutGate, is_canary, rollout_gate
from drover.scheduler.reconciler.vocabulary import (
    AT_DISCONNECTED,
    AT_DRAINING,
    AT_ELSEWHERE,
    AT_READY,
    AT_UNPLACEABLE,
    DESC_EXPIRED,
    DESC_JOB_STOPPED,
    DESC_LOST,
    DESC_MIGRATING,
    DESC_NEVER_STARTED,
    DESC_NOT_NEEDED,
    DESC_RECONNECT_LOSER,
    DESC_RESCHEDULED,
    DESC_UPDATING,
    DISCONNECTING,
    GONE_SITUATIONS,
    IGNORE,
    LOST,
    MIGRATE,
    PLACE,
    RECONNECTING,
    RESCHEDULE_LATER,
    RESCHEDULE_NOW,
    STOP,
    UPDATE_DESTRUCTIVE,
    UPDATE_INPLACE,
    AllocFacts,
    Rule,
    classify,
    disconnect_expired,
    tainted_situation,
    tasks_updated,
)
from drover.scheduler.structs import (
    ALLOC_CLIENT_COMPLETE,
    ALLOC_CLIENT_LOST,
    ALLOC_CLIENT_PENDING,
    ALLOC_CLIENT_RUNNING,
    ALLOC_CLIENT_UNKNOWN,
    ALLOC_DESIRED_RUN,
    DEPLOYMENT_STATUS_FAILED,
    JOB_TYPE_BATCH,
    RECONCILE_BEST_SCORE,
    RECONCILE_KEEP_ORIGINAL,
    RECONCILE_KEEP_REPLACEMENT,
    RECONCILE_LONGEST_RUNNING,
    Allocation,
    Deployment,
    DisconnectStrategy,
    Job,
    Node,
    RescheduleEvent,
    TaskGroup,
    alloc_name,
)

__all__ = [
    "CLASSIFICATION_RULES",
    "GROUP_BUCKETS",
    "RECONNECT_PICKERS",
    "REMOVAL_ORDER",
    "DelayedReschedule",
    "GroupAllocFacts",
    "GroupResult",
    "Placement",
    "ScoreFn",
    "Stop",
    "reconcile_group",
]

# The buckets of a GroupResult, named as in the vocabulary (scheduler/README.md).
GROUP_BUCKETS: Final = (
    PLACE,
    STOP,
    UPDATE_INPLACE,
    UPDATE_DESTRUCTIVE,
    MIGRATE,
    LOST,
    IGNORE,
    RESCHEDULE_NOW,
    RESCHEDULE_LATER,
    DISCONNECTING,
    RECONNECTING,
)

# Categories of CLASSIFICATION_RULES besides the buckets LOST, DISCONNECTING, MIGRATE and
# RECONNECTING: steps of this reconciler, not buckets.
GONE: Final = "gone"  # history: not counted, not acted on
DONE: Final = "done"  # a finished batch alloc: its slot is done
FAILED: Final = "failed"  # the reschedule policy decides
SUPERSEDED: Final = "superseded"  # a failed replacement of an alloc that is back: stopped
UNKNOWN: Final = "unknown"  # already unknown on a disconnected node
UNTAINTED: Final = "untainted"  # live on a node that is not tainted

# Why a placement is made (Placement.reason).
PLACE_NEW: Final = "new"  # a slot nobody holds
PLACE_LOST: Final = "lost"  # its alloc's node is down or gone
PLACE_MIGRATE: Final = "migrate"  # its alloc leaves a draining node
PLACE_RESCHEDULE: Final = "reschedule"  # its alloc failed and the policy allows another try
PLACE_DESTRUCTIVE: Final = "destructive"  # the new job version needs a restart
PLACE_DISCONNECT: Final = "disconnect"  # its alloc's node stopped heartbeating (disconnect.replace)
PLACE_CANARY: Final = "canary"  # a new-version alloc beside the old ones, until promotion

_LIVE_CLIENT: Final = frozenset({ALLOC_CLIENT_PENDING, ALLOC_CLIENT_RUNNING, ALLOC_CLIENT_UNKNOWN})


# ---------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop ``alloc``: desired status stop, with ``client_status`` when the server knows it
    better than the client can tell (``lost`` for a down node)."""

    alloc: Allocation
    description: str
    client_status: str = ""


@dataclass(frozen=True, slots=True)
class Placement:
    """A new alloc for slot ``index`` (named ``name``).

    ``previous`` is the alloc it replaces (None for a fresh slot); ``reschedule_events`` is
    the complete tracker the new alloc carries. ``stop_previous`` must be applied *only when
    this placement succeeds*: a failed alloc that could not be replaced stays desired-run, so
    the next eval (the blocked one) retries it with its reschedule history intact instead of
    filling the slot afresh with a clean attempt count.
    """

    name: str
    index: int
    reason: str
    previous: Allocation | None = None
    reschedule_events: tuple[RescheduleEvent, ...] = ()
    stop_previous: Stop | None = None
    # Nodes to rank lower: a rescheduled alloc's previous node.
    penalty_node_ids: frozenset[str] = frozenset()
    canary: bool = False


@dataclass(frozen=True, slots=True)
class DelayedReschedule:
    """A failed alloc to reschedule at ``at_ns``, by a follow-up eval the scheduler creates
    (and records on the alloc as ``followup_eval_id``, so no later pass makes another)."""

    alloc: Allocation
    at_ns: int


@dataclass(frozen=True, slots=True)
class GroupResult:
    """The buckets of one group's reconciliation.

    ``place`` and ``stop`` are the complete action lists: they include the halves of
    migrations, lost replacements, reschedules and destructive updates (a reschedule's stop
    rides on its placement, see ``Placement.stop_previous``). The other buckets say why, and
    hold the allocs concerned: ``update_inplace`` (same alloc ID, new job version),
    ``update_destructive`` (old allocs replaced by a new version), ``migrate``, ``lost``,
    ``reschedule_now``, ``reschedule_later``, ``disconnecting`` (to be marked unknown),
    ``reconnecting`` (back from a disconnect, kept), ``ignore`` (live or slot-holding allocs
    left as they are, including destructive updates held back by ``max_parallel``).
    """

    group: str
    place: tuple[Placement, ...] = ()
    stop: tuple[Stop, ...] = ()
    update_inplace: tuple[Allocation, ...] = ()
    update_destructive: tuple[Allocation, ...] = ()
    migrate: tuple[Allocation, ...] = ()
    lost: tuple[Allocation, ...] = ()
    ignore: tuple[Allocation, ...] = ()
    reschedule_now: tuple[Allocation, ...] = ()
    reschedule_later: tuple[DelayedReschedule, ...] = ()
    disconnecting: tuple[Allocation, ...] = ()
    reconnecting: tuple[Allocation, ...] = ()
    # The deployment's view: canaries the group wants now, and whether any rollout work is
    # left (placements, updates held back or not, moves, reschedules, canaries to place).
    desired_canaries: int = 0
    work_left: bool = False
    # Destructive updates held back by the rollout (they go when health opens room).
    held_back: bool = False
    # Allocs held on draining nodes by migrate.max_parallel: when to look again (0: no
    # need), the earliest moment a live alloc settles or a held one's drain deadline passes.
    # The client's report that a replacement runs brings an eval sooner.
    migrate_wake_at_ns: int = 0

    def counts(self) -> dict[str, int]:
        """Every bucket's size, zeros included (annotations, `drover job plan`, logs)."""
        return {name: len(getattr(self, name)) for name in GROUP_BUCKETS}

    def is_no_op(self) -> bool:
        return not (
            self.place
            or self.stop
            or self.update_inplace
            or self.update_destructive
            or self.reschedule_later
            or self.disconnecting
        )


# ---------------------------------------------------------------------------------------
# The classification ladder


@dataclass(frozen=True, slots=True)
class GroupAllocFacts(AllocFacts):
    """What the generic ladder knows about one alloc, besides where its node stands."""

    batch: bool
    replaced: bool  # some alloc names it as previous_allocation (or next_allocation is set)
    live_successor: bool  # a replacement down its chain is live (on any node)
    superseded: bool  # an alloc up its chain is live on a healthy node

    @property
    def client_live(self) -> bool:
        return self.alloc.client_status in _LIVE_CLIENT

    @property
    def status(self) -> str:
        return self.alloc.client_status


CLASSIFICATION_RULES: Final[tuple[Rule[GroupAllocFacts], ...]] = (
    Rule(
        LOST,
        lambda f: f.where in GONE_SITUATIONS and f.client_live,
        "The node is down or deregistered: what ran there is gone with it. Checked before "
        "'told to stop' so an alloc stopped earlier but never confirmed is marked lost too, "
        "and summaries stop counting it as running (Nomad's updateNonTerminalAllocsToLost).",
    ),
    Rule(
        GONE,
        lambda f: f.alloc.desired_status != ALLOC_DESIRED_RUN,
        "Told to stop or evict earlier: its fate is decided; a replacement is its own alloc.",
    ),
    Rule(
        GONE,
        lambda f: f.alloc.client_terminal() and f.replaced,
        "Finished and already replaced: the successor speaks for the slot now.",
    ),
    Rule(
        DONE,
        lambda f: f.batch and f.status == ALLOC_CLIENT_COMPLETE,
        "A batch alloc that completed: its slot's work is done and is never run again.",
    ),
    Rule(
        GONE,
        lambda f: f.status == ALLOC_CLIENT_COMPLETE,
        "A service alloc that exited on its own: not counted, so its slot is filled again.",
    ),
    Rule(
        SUPERSEDED,
        lambda f: f.alloc.client_terminal() and f.superseded,
        "Failed, but the alloc it replaced is back on a healthy node and holds the slot: "
        "rescheduling it would run the slot twice (Nomad #24165). It is stopped, as Nomad "
        "does, so the decision outlives that alloc: once it is replaced (a destructive "
        "update) or loses its reconnect, nothing up the chain is live and the failed alloc "
        "would hold a slot again, and be rescheduled, on the next pass.",
    ),
    Rule(
        FAILED,
        lambda f: f.alloc.client_terminal(),
        "Failed (or lost while desired running): the group's reschedule policy decides.",
    ),
    Rule(
        LOST,
        lambda f: f.expired,
        "Unknown for longer than disconnect.lost_after: stop waiting for its node.",
    ),
    Rule(
        LOST,
        lambda f: f.where == AT_DISCONNECTED and f.status == ALLOC_CLIENT_PENDING,
        "Never started on a node that stopped answering: nothing worth waiting for.",
    ),
    Rule(
        DISCONNECTING,
        lambda f: f.where == AT_DISCONNECTED and f.status == ALLOC_CLIENT_RUNNING,
        "Running as far as we know on a node that missed heartbeats: mark it unknown and keep "
        "it, it may come back (docs/field-reports.md#field-report-3); replace it if "
        "disconnect.replace allows.",
    ),
    Rule(
        UNKNOWN,
        lambda f: f.where == AT_DISCONNECTED,
        "Already unknown on a disconnected node: wait for reconnect, expiry or down. Before "
        "'migrate', so draining a disconnected node does not migrate what nobody can stop "
        "(Nomad #12469).",
    ),
    Rule(
        MIGRATE,
        lambda f: f.where == AT_DRAINING,
        "The operator drains its node: stop it and place it elsewhere.",
    ),
    Rule(
        MIGRATE,
        lambda f: f.alloc.should_migrate(),
        "The operator stopped it (`drover alloc stop`, its desired transition): stop it and "
        "place a replacement, on any node, as Nomad does.",
    ),
    Rule(
        RECONNECTING,
        lambda f: f.status == ALLOC_CLIENT_UNKNOWN,
        "Unknown, but its node is healthy again: keep it, never restart it.",
    ),
    Rule(
        RECONNECTING,
        lambda f: f.live_successor,
        "Back and running while the replacement made during its disconnect runs too: "
        "exactly one of the two may stay.",
    ),
    Rule(
        UNTAINTED,
        lambda f: True,
        "Live on a healthy node.",
    ),
)


# ---------------------------------------------------------------------------------------
# Reconnects: original R (back on a healthy node) against a replacement P of it


# The rank of an alloc's node for its group (higher is better), None when unknown.
ScoreFn = Callable[[Allocation], float | None]


def _no_score(alloc: Allocation) -> float | None:
    return None


def _score_wins(original: Allocation, replacement: Allocation, score: ScoreFn) -> bool:
    mine, theirs = score(original), score(replacement)
    if theirs is None or (mine is not None and theirs <= mine):
        return False  # ties (and unknown scores) keep the original: nothing to restart
    # A pending replacement does not beat an original that runs.
    return replacement.client_status == ALLOC_CLIENT_RUNNING or original.client_status != ALLOC_CLIENT_RUNNING


def _started_ns(alloc: Allocation) -> int:
    starts = [ts.started_at_ns for ts in alloc.task_states.values() if ts.started_at_ns]
    return min(starts) if starts else 0


def _longest_running_wins(original: Allocation, replacement: Allocation, score: ScoreFn) -> bool:
    mine, theirs = _started_ns(original), _started_ns(replacement)
    if not mine and not theirs:
        return _score_wins(original, replacement, score)
    if not mine or not theirs:
        return bool(theirs)
    return theirs < mine


# Does the replacement win? Keyed by disconnect.reconcile; a newer job version always wins.
RECONNECT_PICKERS: Final[Mapping[str, Callable[[Allocation, Allocation, ScoreFn], bool]]] = {
    RECONCILE_BEST_SCORE: _score_wins,
    RECONCILE_KEEP_ORIGINAL: lambda original, replacement, score: False,
    RECONCILE_KEEP_REPLACEMENT: lambda original, replacement, score: True,
    RECONCILE_LONGEST_RUNNING: _longest_running_wins,
}


def _replacement_wins(
    strategy: DisconnectStrategy, original: Allocation, replacement: Allocation, score: ScoreFn
) -> bool:
    if replacement.job_version != original.job_version:
        return replacement.job_version > original.job_version
    picker = RECONNECT_PICKERS.get(strategy.reconcile, _score_wins)
    return picker(original, replacement, score)


# ---------------------------------------------------------------------------------------
# Slots


_MOVE_LOST: Final = "move-lost"
_MOVE_MIGRATE: Final = "move-migrate"
_MIGRATE_HELD: Final = "migrate-held"  # to leave a draining node once migrate.max_parallel allows
_MOVE_RESCHEDULE: Final = "move-reschedule"
_MOVE_DISCONNECT: Final = "move-disconnect"
_FAILED_HELD: Final = "failed-held"
_STAY: Final = "stay"
_STAY_UNKNOWN: Final = "stay-unknown"
_DONE: Final = "done"

# With more holders than count, who gives up its slot first (then highest index first).
REMOVAL_ORDER: Final[tuple[tuple[str, str], ...]] = (
    (_MOVE_LOST, "Dropping a mover saves a placement; it leaves its node anyway."),
    (_MOVE_MIGRATE, "Same: it is being stopped anyway; only its replacement is saved."),
    (_MIGRATE_HELD, "Same: it is to leave its draining node; waiting for room to, it saves a move."),
    (_MOVE_DISCONNECT, "Its node is away; stopping it costs nothing that runs for us."),
    (_MOVE_RESCHEDULE, "A failed alloc that would be replaced: skip the replacement."),
    (_FAILED_HELD, "Failed and not (yet) replaced: it serves nothing."),
    (_STAY, "Live and healthy: the highest indexes go, as the operator expects on scale-down."),
    (_STAY_UNKNOWN, "Unknown: may still be running; stopping it is a last resort."),
    (_DONE, "Finished batch work is progress: giving it up would re-run it on scale-up."),
)
_REMOVAL_RANK: Final[Mapping[str, int]] = {kind: i for i, (kind, _) in enumerate(REMOVAL_ORDER)}
# Holders that giving up their slot stops; the others (lost: stopped already; failed or
# finished: nothing runs) are left as they are.
_STOPPED_ON_REMOVAL: Final = frozenset({_MOVE_MIGRATE, _MIGRATE_HELD, _MOVE_DISCONNECT, _STAY, _STAY_UNKNOWN})


@dataclass(slots=True)
class _Holder:
    alloc: Allocation
    kind: str
    decision: RescheduleDecision | None = None


@dataclass(slots=True)
class _Buckets:
    """The buckets under construction."""

    place: list[Placement] = field(default_factory=list)
    stop: list[Stop] = field(default_factory=list)
    update_inplace: list[Allocation] = field(default_factory=list)
    update_destructive: list[Allocation] = field(default_factory=list)
    migrate: list[Allocation] = field(default_factory=list)
    lost: list[Allocation] = field(default_factory=list)
    ignore: list[Allocation] = field(default_factory=list)
    reschedule_now: list[Allocation] = field(default_factory=list)
    reschedule_later: list[DelayedReschedule] = field(default_factory=list)
    disconnecting: list[Allocation] = field(default_factory=list)
    reconnecting: list[Allocation] = field(default_factory=list)
    migrate_wake_at_ns: int = 0

    def result(self, group: str, *, desired_canaries: int = 0, deferred: bool = False) -> GroupResult:
        work_left = deferred or bool(
            self.place
            or self.update_inplace
            or self.update_destructive
            or self.migrate
            or self.reschedule_now
            or self.reschedule_later
        )
        return GroupResult(
            group=group,
            place=tuple(self.place),
            stop=tuple(self.stop),
            update_inplace=tuple(self.update_inplace),
            update_destructive=tuple(self.update_destructive),
            migrate=tuple(self.migrate),
            lost=tuple(self.lost),
            ignore=tuple(self.ignore),
            reschedule_now=tuple(self.reschedule_now),
            reschedule_later=tuple(self.reschedule_later),
            disconnecting=tuple(self.disconnecting),
            reconnecting=tuple(self.reconnecting),
            desired_canaries=desired_canaries,
            work_left=work_left,
            held_back=deferred,
            migrate_wake_at_ns=self.migrate_wake_at_ns,
        )


def _job_stopped(job: Job) -> bool:
    # Periodic and parameterized parents are templates: their children run, they never do.
    return job.stop or job.is_template()


def _sort_key(alloc: Allocation) -> tuple[int, str]:
    return (alloc.index, alloc.id)


class _Lineage:
    """Who replaced whom, from ``previous_allocation`` (the FSM also sets ``next_allocation``,
    but a test harness or an older store may not)."""

    def __init__(self, allocs: Iterable[Allocation]) -> None:
        self._by_id = {a.id: a for a in allocs}
        self._next: dict[str, list[Allocation]] = defaultdict(list)
        for a in self._by_id.values():
            if a.previous_allocation:
                self._next[a.previous_allocation].append(a)

    def get(self, alloc_id: str) -> Allocation | None:
        return self._by_id.get(alloc_id)

    def replaced(self, alloc: Allocation) -> bool:
        return bool(alloc.next_allocation) or bool(self._next.get(alloc.id))

    def has_healthy_live_ancestor(self, alloc: Allocation, tainted: Mapping[str, Node | None]) -> bool:
        seen = {alloc.id}
        prev = self._by_id.get(alloc.previous_allocation)
        while prev is not None and prev.id not in seen:
            if not prev.terminal() and prev.node_id not in tainted:
                return True
            seen.add(prev.id)
            prev = self._by_id.get(prev.previous_allocation)
        return False

    def live_successors(self, alloc: Allocation) -> list[Allocation]:
        """Replacements down the chain from ``alloc`` that are live (on any node)."""
        out: list[Allocation] = []
        seen = {alloc.id}
        todo = list(self._next.get(alloc.id, ()))
        if alloc.next_allocation and alloc.next_allocation in self._by_id:
            todo.append(self._by_id[alloc.next_allocation])
        while todo:
            nxt = todo.pop()
            if nxt.id in seen:
                continue
            seen.add(nxt.id)
            if not nxt.terminal():
                out.append(nxt)
            todo.extend(self._next.get(nxt.id, ()))
        return sorted(out, key=lambda a: (a.create_index, a.id))


@dataclass(slots=True)
class _GroupPass:
    """One reconciliation of one group: its inputs, and what the steps have decided so far."""

    job: Job
    group: TaskGroup
    allocs: list[Allocation]  # the group's, by index
    tainted: Mapping[str, Node | None]
    now_ns: int
    eval_id: str
    versions: Mapping[int, Job]
    infeasible: frozenset[str]
    unplaceable: frozenset[str]
    score: ScoreFn
    paused: bool
    lineage: _Lineage
    disconnect: DisconnectStrategy
    gate: RolloutGate
    deployment: Deployment | None
    canaries: list[Allocation]  # live canaries of the current deployment, set aside
    buckets: _Buckets = field(default_factory=_Buckets)
    lost_ids: set[str] = field(default_factory=set)  # stopped as lost by step 1
    stopped_ids: set[str] = field(default_factory=set)  # stopped by the later steps

    def where(self, alloc: Allocation) -> str:
        """Where the alloc's node stands for the group (``vocabulary.AT_*``)."""
        node_id = alloc.node_id
        if node_id in self.tainted:
            situation = tainted_situation(self.tainted[node_id])
            if situation is not None:
                return situation
        if node_id in self.infeasible:
            return AT_ELSEWHERE
        if node_id in self.unplaceable:
            return AT_UNPLACEABLE
        return AT_READY

    def facts(self, alloc: Allocation) -> GroupAllocFacts:
        where = self.where(alloc)
        return GroupAllocFacts(
            alloc=alloc,
            where=where,
            expired=disconnect_expired(alloc, self.group, where, self.now_ns),
            batch=self.job.type == JOB_TYPE_BATCH,
            replaced=self.lineage.replaced(alloc),
            live_successor=(
                bool(self.lineage.live_successors(alloc)) if alloc.node_id not in self.tainted else False
            ),
            superseded=self.lineage.has_healthy_live_ancestor(alloc, self.tainted),
        )

    def stop(self, alloc: Allocation, description: str) -> None:
        """Stop ``alloc`` for ``description``; one already stopped as lost stays so."""
        self.stopped_ids.add(alloc.id)
        if alloc.id not in self.lost_ids:
            self.buckets.stop.append(Stop(alloc, description))


# ---------------------------------------------------------------------------------------
# The reconciler


def reconcile_group(
    job: Job,
    group: TaskGroup,
    allocs: Iterable[Allocation],
    tainted_nodes: Mapping[str, Node | None],
    now_ns: int,
    *,
    deployment: Deployment | None = None,
    deployment_paused: bool = False,
    eval_id: str = "",
    job_versions: Mapping[int, Job] | None = None,
    infeasible_node_ids: frozenset[str] = frozenset(),
    unplaceable_node_ids: frozenset[str] = frozenset(),
    score: ScoreFn | None = None,
) -> GroupResult:
    """Reconcile one service or batch task group.

    ``job``: the job at its current version (stopped: stop everything). ``group``: one of its
    groups; a group removed from the job is reconciled as ``TaskGroup(name, count=0)``.
    ``allocs``: the group's allocs, terminal ones included (others are skipped).
    ``tainted_nodes``: the tainted nodes holding allocs (down, disconnected or draining); a
    deregistered node maps to None. Any other node is healthy.
    ``deployment``: the job version's current deployment (active or failed; None when
    there is none yet or it succeeded): it gates the rollout (``reconciler.rollout``).
    ``deployment_paused``: place only replacements (lost, reschedule, migrate, disconnect);
    no new slots, no destructive updates (what a paused or failed deployment also does).
    ``eval_id``: the eval being processed; a failed alloc whose follow-up eval this is
    reschedules now, even a little early.
    ``job_versions``: older versions by number, to tell in-place from destructive updates;
    an alloc whose version is missing is updated destructively.
    ``infeasible_node_ids``: healthy nodes the job's current version may no longer run on
    (datacenters or constraints changed); an update there is destructive.
    ``unplaceable_node_ids``: healthy nodes that take no placements now (ineligible,
    initializing): the plan applier rejects any upsert there, so their allocs wait for an
    in-place update (a destructive one moves them, which only needs a stop there).
    ``score``: the rank of an alloc's node for the group, for the reconnect picker (called
    only for reconnecting allocs and their replacements; None or missing: a tie).
    """
    mine = sorted((a for a in allocs if a.task_group == group.name), key=_sort_key)
    gate = rollout_gate(job, group, deployment, mine)
    mine, canaries, unneeded_canaries = _set_canaries_aside(mine, deployment)
    p = _GroupPass(
        job=job,
        group=group,
        allocs=mine,
        tainted=tainted_nodes,
        now_ns=now_ns,
        eval_id=eval_id,
        versions=job_versions or {},
        infeasible=infeasible_node_ids,
        unplaceable=unplaceable_node_ids,
        score=score or _no_score,
        paused=deployment_paused or not gate.place_ready,
        lineage=_Lineage(mine),
        disconnect=group.disconnect or DisconnectStrategy(),
        gate=gate,
        deployment=deployment,
        canaries=canaries,
    )
    for alloc in unneeded_canaries:
        p.stop(alloc, DESC_NOT_NEEDED)
    p.buckets.ignore.extend(a for a in canaries)
    by_category = _classify(p)
    _stop_lost_and_superseded(p, by_category)
    if _job_stopped(job):
        _stop_everything(p, by_category)
        return p.buckets.result(group.name)
    kept_reconnecting = _settle_reconnects(p, by_category)
    holders = _give_up_excess_slots(p, _slot_holders(p, by_category, kept_reconnecting))
    reported = _report_disconnects(p, by_category)
    update_candidates = _move_holders(p, holders, reported)
    if not p.paused:
        _fill_free_slots(p, holders)
    desired_canaries, deferred = _update_holders(p, update_candidates, reported)
    p.buckets.place.sort(
        key=lambda pl: (pl.index, pl.reason, pl.previous.id if pl.previous is not None else "")
    )
    return p.buckets.result(group.name, desired_canaries=desired_canaries, deferred=deferred)


def _set_canaries_aside(
    allocs: list[Allocation], deployment: Deployment | None
) -> tuple[list[Allocation], list[Allocation], list[Allocation]]:
    """Split off canaries that are not promoted: they run beside the slot holders and hold
    no slot until promotion clears their flag. Returns (the rest, live canaries of the
    current active deployment, live canaries of a deployment that ended or was replaced:
    to stop, as Nomad's cancelUnneededCanaries). A canary that failed holds nothing and is
    not rescheduled: its deployment's verdict decides what happens next."""
    rest: list[Allocation] = []
    current: list[Allocation] = []
    unneeded: list[Allocation] = []
    for alloc in allocs:
        if not is_canary(alloc) or alloc.desired_status != ALLOC_DESIRED_RUN:
            rest.append(alloc)
        elif alloc.client_terminal():
            continue
        elif deployment is not None and deployment.active() and alloc.deployment_id == deployment.id:
            current.append(alloc)
        else:
            unneeded.append(alloc)
    return rest, current, unneeded


def _classify(p: _GroupPass) -> dict[str, list[Allocation]]:
    """Step 1: every alloc of the group by its category (``CLASSIFICATION_RULES``)."""
    by_category: dict[str, list[Allocation]] = defaultdict(list)
    for alloc in p.allocs:
        by_category[classify(CLASSIFICATION_RULES, p.facts(alloc)).category].append(alloc)
    return by_category


def _stop_lost_and_superseded(p: _GroupPass, by_category: Mapping[str, list[Allocation]]) -> None:
    """Lost allocs stop as lost whatever else happens; superseded ones lose to the alloc
    that is back."""
    buckets = p.buckets
    for alloc in by_category[LOST]:
        if tainted_situation(p.tainted.get(alloc.node_id)) in GONE_SITUATIONS:
            desc = DESC_LOST
        elif alloc.client_status == ALLOC_CLIENT_UNKNOWN:
            desc = DESC_EXPIRED
        else:
            desc = DESC_NEVER_STARTED
        buckets.stop.append(Stop(alloc, desc, client_status=ALLOC_CLIENT_LOST))
        buckets.lost.append(alloc)
        p.lost_ids.add(alloc.id)
    for alloc in by_category[SUPERSEDED]:
        buckets.stop.append(Stop(alloc, DESC_RECONNECT_LOSER))


def _stop_everything(p: _GroupPass, by_category: Mapping[str, list[Allocation]]) -> None:
    """Step 2: a stopped job stops every live alloc and places nothing."""
    buckets = p.buckets
    for category in (UNTAINTED, MIGRATE, DISCONNECTING, UNKNOWN, RECONNECTING):
        for alloc in by_category[category]:
            buckets.stop.append(Stop(alloc, DESC_JOB_STOPPED))
    buckets.ignore.extend((*by_category[FAILED], *by_category[DONE]))


def _settle_reconnects(p: _GroupPass, by_category: Mapping[str, list[Allocation]]) -> list[Allocation]:
    """Step 3: each reconnecting original against every live replacement down its chain;
    exactly one survives. A replacement on a tainted node always loses (it is lost, away or
    leaving anyway). Returns the originals that are kept."""
    kept: list[Allocation] = []
    for original in by_category[RECONNECTING]:
        if original.id in p.stopped_ids:
            continue
        rivals = [r for r in p.lineage.live_successors(original) if r.id not in p.stopped_ids]
        winners = [
            r
            for r in rivals
            if r.node_id not in p.tainted and _replacement_wins(p.disconnect, original, r, p.score)
        ]
        best = max(
            winners, key=lambda r: (r.job_version, p.score(r) or 0.0, r.create_index, r.id), default=None
        )
        if best is None:
            kept.append(original)
        else:
            p.stop(original, DESC_NOT_NEEDED)
        for r in rivals:
            if best is None or r.id != best.id:
                p.stop(r, DESC_RECONNECT_LOSER)
    p.buckets.reconnecting.extend(kept)
    return kept


def _slot_holders(
    p: _GroupPass, by_category: Mapping[str, list[Allocation]], kept_reconnecting: list[Allocation]
) -> list[_Holder]:
    """Step 4: every alloc that still speaks for a slot, and whether it stays or moves."""
    lineage, stopped_ids = p.lineage, p.stopped_ids
    holders: list[_Holder] = []
    for alloc in by_category[LOST]:
        if (
            alloc.desired_status == ALLOC_DESIRED_RUN
            and not lineage.replaced(alloc)
            and alloc.id not in stopped_ids
        ):
            holders.append(_Holder(alloc, _MOVE_LOST))
    holders.extend(_migration_holders(p, by_category[MIGRATE]))
    failed_deployment = (
        p.deployment.id
        if p.deployment is not None and p.deployment.status == DEPLOYMENT_STATUS_FAILED
        else ""
    )
    for alloc in by_category[FAILED]:
        if failed_deployment and alloc.deployment_id == failed_deployment:
            # Its deployment failed: replacing it would only roll the failed version again.
            holders.append(_Holder(alloc, _FAILED_HELD))
            continue
        decision = next_reschedule(alloc, p.group.reschedule)
        due = decision.eligible and (
            (bool(p.eval_id) and alloc.followup_eval_id == p.eval_id)
            or decision.at_ns - p.now_ns <= RESCHEDULE_WINDOW_NS
        )
        holders.append(_Holder(alloc, _MOVE_RESCHEDULE if due else _FAILED_HELD, decision))
    disconnecting_ids = {a.id for a in by_category[DISCONNECTING]}
    for alloc in by_category[DISCONNECTING] + by_category[UNKNOWN]:
        if alloc.id in stopped_ids:
            continue
        if lineage.replaced(alloc):
            # Its replacement (or that one's successor) holds the slot; it waits for its node.
            if alloc.id not in disconnecting_ids:
                p.buckets.ignore.append(alloc)
            continue
        holders.append(_Holder(alloc, _MOVE_DISCONNECT if p.disconnect.replace else _STAY_UNKNOWN))
    for alloc in by_category[UNTAINTED] + kept_reconnecting:
        if alloc.id not in stopped_ids:
            holders.append(_Holder(alloc, _STAY))
    for alloc in by_category[DONE]:
        holders.append(_Holder(alloc, _DONE))
    return holders


def _migration_holders(p: _GroupPass, migrating: list[Allocation]) -> list[_Holder]:
    """Step 4, for the allocs that must move: those leaving a draining node go at most
    ``migrate.max_parallel`` at a time, as Nomad's drainer lets them (``reconciler.migrate``);
    the rest hold their slot where they are, and the result says when to look again. An
    alloc the operator stopped (``alloc stop``), one whose drain deadline passed, and every
    alloc of a group without a migrate block or of a batch job go now."""
    strategy = p.group.migrate
    room = None
    if strategy is not None and p.job.type != JOB_TYPE_BATCH:
        live = [a for a in p.allocs if not a.terminal() and a.id not in p.stopped_ids]
        room = drain_room(live, p.group.count, strategy, p.now_ns, group_check_count(p.group))
    left = room.room if room is not None else 0
    holders: list[_Holder] = []
    wake = 0
    for alloc in migrating:
        if alloc.id in p.stopped_ids:
            continue
        node = p.tainted.get(alloc.node_id)
        if (
            room is None
            or alloc.should_migrate()
            or p.where(alloc) != AT_DRAINING
            or drain_forced(node, p.now_ns)
        ):
            holders.append(_Holder(alloc, _MOVE_MIGRATE))
        elif left > 0:
            left -= 1
            holders.append(_Holder(alloc, _MOVE_MIGRATE))
        else:
            holders.append(_Holder(alloc, _MIGRATE_HELD))
            deadline = node.drain_strategy.force_deadline_at_ns if node and node.drain_strategy else 0
            for at in (room.next_change_ns, deadline):
                if at and (wake == 0 or at < wake):
                    wake = at
    p.buckets.migrate_wake_at_ns = wake
    return holders


def _give_up_excess_slots(p: _GroupPass, holders: list[_Holder]) -> list[_Holder]:
    """More holders than count: ``REMOVAL_ORDER``, then highest index, then the older
    version, then the newest, give up their slots. Returns the holders that keep one."""
    excess = len(holders) - max(p.group.count, 0)
    if excess <= 0:
        return holders
    newest: dict[int, int] = {}
    for h in holders:
        newest[h.alloc.index] = max(newest.get(h.alloc.index, -1), h.alloc.job_version)
    ranked = sorted(
        holders,
        key=lambda h: (
            # An old alloc whose slot a promoted canary of the new version now holds goes
            # first: the canary took its place. Only one that removal stops: a holder left
            # as it is (finished, failed) would hold the slot again on the next pass if
            # the newer one goes too, and that pass would choose differently.
            h.kind not in _STOPPED_ON_REMOVAL or h.alloc.job_version >= newest[h.alloc.index],
            _REMOVAL_RANK[h.kind],
            -h.alloc.index,
            h.alloc.job_version,
            -h.alloc.create_index,
            h.alloc.id,
        ),
    )
    removed = ranked[:excess]
    removed_ids = {h.alloc.id for h in removed}
    for h in removed:
        if h.kind in _STOPPED_ON_REMOVAL:
            p.buckets.stop.append(Stop(h.alloc, DESC_NOT_NEEDED))
            p.stopped_ids.add(h.alloc.id)
        elif h.kind != _MOVE_LOST:  # a lost one is already stopped as lost
            p.buckets.ignore.append(h.alloc)
    return [h for h in holders if h.alloc.id not in removed_ids]


def _report_disconnects(p: _GroupPass, by_category: Mapping[str, list[Allocation]]) -> set[str]:
    """Reconnecting and disconnecting allocs that kept their place in the buckets; returns
    their IDs, whose bucket already says what happens to them (so: not also "ignore")."""
    buckets = p.buckets
    buckets.reconnecting[:] = [a for a in buckets.reconnecting if a.id not in p.stopped_ids]
    buckets.disconnecting.extend(a for a in by_category[DISCONNECTING] if a.id not in p.stopped_ids)
    return {a.id for a in (*buckets.reconnecting, *buckets.disconnecting)}


def _move_holders(p: _GroupPass, holders: list[_Holder], reported: set[str]) -> list[_Holder]:
    """Step 5: movers take their own slot again elsewhere. Returns the holders that stay and
    may need an update (live or failed-and-held)."""
    buckets = p.buckets
    update_candidates: list[_Holder] = []
    for h in holders:
        a = h.alloc
        if h.kind == _MOVE_LOST:
            buckets.place.append(Placement(a.name, a.index, PLACE_LOST, previous=a))
        elif h.kind == _MOVE_MIGRATE:
            buckets.stop.append(Stop(a, DESC_MIGRATING))
            buckets.migrate.append(a)
            buckets.place.append(Placement(a.name, a.index, PLACE_MIGRATE, previous=a))
        elif h.kind == _MOVE_DISCONNECT:
            buckets.place.append(Placement(a.name, a.index, PLACE_DISCONNECT, previous=a))
        elif h.kind == _MOVE_RESCHEDULE:
            buckets.reschedule_now.append(a)
            buckets.place.append(_reschedule_placement(p, h))
        elif h.kind in (_STAY, _FAILED_HELD):
            update_candidates.append(h)
        elif a.id not in reported:
            buckets.ignore.append(a)
    return update_candidates


def _reschedule_placement(p: _GroupPass, h: _Holder) -> Placement:
    """The replacement of a failed alloc rescheduled now. Its attempt count starts over
    when the job's tasks changed since the failed alloc was placed: its failures say
    nothing about the new tasks (a version no longer known counts as changed)."""
    a, policy, decision = h.alloc, p.group.reschedule, h.decision
    assert decision is not None and policy is not None
    fresh = a.job_version != p.job.version and tasks_updated(
        p.versions.get(a.job_version), p.job, p.group.name
    )
    return Placement(
        a.name,
        a.index,
        PLACE_RESCHEDULE,
        previous=a,
        reschedule_events=replacement_events(a, policy, decision, p.now_ns, fresh=fresh),
        stop_previous=Stop(a, DESC_RESCHEDULED),
        penalty_node_ids=frozenset({a.node_id}),
    )


def _fill_free_slots(p: _GroupPass, holders: list[_Holder]) -> None:
    """Step 5, continued: slots no holder keeps get a new alloc, lowest index first."""
    count = p.group.count
    used = {h.alloc.index for h in holders}
    free = (i for i in range(len(used) + count) if i not in used)
    for _ in range(count - len(holders)):
        index = next(free)
        p.buckets.place.append(Placement(alloc_name(p.job.id, p.group.name, index), index, PLACE_NEW))


def _update_holders(p: _GroupPass, candidates: list[_Holder], reported: set[str]) -> tuple[int, bool]:
    """Step 6: holders on an older version, in place or destructively within the rollout's
    budget (``reconciler.rollout``), canaries first when the group asks for them. Returns
    (the canaries the group wants, whether destructive updates were held back)."""
    job, group, now_ns, buckets = p.job, p.group, p.now_ns, p.buckets
    destructive: list[_Holder] = []
    for h in candidates:
        a = h.alloc
        stale = a.job_version != job.version
        if stale and (
            a.node_id in p.infeasible or tasks_updated(p.versions.get(a.job_version), job, group.name)
        ):
            destructive.append(h)
        elif stale and h.kind == _STAY and a.node_id not in p.unplaceable:
            buckets.update_inplace.append(a)
        else:
            _hold(buckets, h, now_ns, reported)
    # The ones serving nothing first (failed, then pending), then by index.
    destructive.sort(
        key=lambda h: (
            h.kind != _FAILED_HELD,
            h.alloc.client_status != ALLOC_CLIENT_PENDING,
            h.alloc.index,
            h.alloc.id,
        )
    )
    gate = p.gate
    canarying = gate.rolls and gate.canary > 0 and not gate.promoted and bool(destructive)
    desired_canaries = gate.canary if canarying else 0
    if canarying and not p.paused:
        _place_canaries(p, destructive)
    budget = 0 if p.paused else gate.budget(canarying)
    if budget is None:
        budget = len(destructive)
    admitted, deferred = destructive[:budget], destructive[budget:]
    for h in admitted:
        a = h.alloc
        buckets.stop.append(Stop(a, DESC_UPDATING))
        buckets.update_destructive.append(a)
        buckets.place.append(Placement(a.name, a.index, PLACE_DESTRUCTIVE, previous=a))
    for h in deferred:
        _hold(buckets, h, now_ns, reported)
    # No timer: the next batch goes when a health verdict (or promotion, or resume) writes
    # the eval that looks again.
    return desired_canaries, bool(deferred)


def _place_canaries(p: _GroupPass, destructive: list[_Holder]) -> None:
    """Canaries the group still lacks, named after the lowest slots to be updated: after
    promotion each takes over the slot of the old alloc of the same name."""
    have = {a.index for a in p.canaries}
    missing = p.gate.canary - len(p.canaries)
    for h in sorted(destructive, key=lambda h: (h.alloc.index, h.alloc.id)):
        if missing <= 0:
            break
        a = h.alloc
        if a.index in have:
            continue
        have.add(a.index)
        missing -= 1
        p.buckets.place.append(Placement(a.name, a.index, PLACE_CANARY, canary=True))


def _hold(buckets: _Buckets, h: _Holder, now_ns: int, reported: set[str]) -> None:
    """A holder left as it is; a failed one may still need its follow-up eval."""
    decision = h.decision
    if (
        h.kind == _FAILED_HELD
        and decision is not None
        and decision.eligible
        and not h.alloc.followup_eval_id
        and decision.at_ns > now_ns
    ):
        buckets.reschedule_later.append(DelayedReschedule(h.alloc, decision.at_ns))
    elif h.alloc.id not in reported:
        buckets.ignore.append(h.alloc)
