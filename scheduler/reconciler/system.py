"""System and sysbatch reconciliation: which alloc of a job goes in which bucket, node by node.

Theory of operation
-------------------
A system job runs ``count`` allocs of each group (1 for system, N for sysbatch) on every ready
node of its datacenters that passes the group's constraints. The identity of an alloc is its
*name* (``job.group[i]``) on its *node*, never its ID. ``diff_system_allocs`` takes every
input as a value (the job, the nodes, the job's allocs, the time) and returns named buckets
(``SystemDiff``); ``scheduler/system.py`` turns the buckets into a plan. Nothing here reads a
clock, mints an ID or touches the state store. The words (buckets, node situations, rules,
descriptions, ``tasks_updated``) are ``drover.scheduler.reconciler.vocabulary``'s.

The steps, in order:

1. ``split_terminal``: live allocs go through the ladder; terminal ones are only remembered,
   the newest per (node, name), as the ``previous_allocation`` of a replacement and, for
   sysbatch, as "this name already ran here".
2. ``CLASSIFICATION_RULES`` (first match wins) puts every live alloc in one bucket.
3. Duplicates: at most one live alloc per (node, name) may stay desired-running, so at most
   ``count`` per (job, group, node) (docs/design.md#invariant-1). The survivor is chosen by
   ``KEEP_RULES``; the others are stopped ("alloc duplicated on node"). Nomad never did this
   (docs/field-reports.md#field-report-1, PR #16097 closed unmerged): its duplicates were
   both updated and both re-placed, and the plan applier rejected the node forever over
   their shared static port.
4. Placements: a required name with no kept alloc on a ready node is placed. A stopped
   duplicate is never re-placed, because its name still has the survivor.
5. Rolling updates: destructive updates are admitted node by node within ``max_parallel``
   (group ``update`` over job ``update``; 0 = unlimited). The budget counts *nodes left
   without a running instance by this eval*: a destructive update charges its node once,
   in-place updates are free, and stopping a duplicate is free beside a kept running alloc
   (it is charged, but never held back, when it stops the node's only running alloc). Nomad
   decided destructive vs in-place *after* the limit and counted a duplicate's stop as an
   update, so one node could eat the whole budget (docs/field-reports.md#field-report-1). Held
   back updates go to ``deferred``; the scheduler schedules a follow-up eval for them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Final

from drover.scheduler.reconciler.vocabulary import (
    AT_DISCONNECTED,
    AT_DRAINING,
    AT_ELSEWHERE,
    AT_MISSING,
    AT_READY,
    AT_UNPLACEABLE,
    DEFERRED,
    DESC_DUPLICATE,
    DESC_EXPIRED,
    DESC_JOB_STOPPED,
    DESC_LOST,
    DESC_MIGRATING,
    DESC_NODE_NOT_ELIGIBLE,
    DESC_NODE_TAINTED,
    DESC_NOT_NEEDED,
    DESC_UNKNOWN,
    DESC_UPDATING,
    DISCONNECTING,
    GONE_SITUATIONS,
    IGNORE,
    LOST,
    MIGRATE,
    PLACE,
    RECONNECTING,
    STOP,
    UPDATE_DESTRUCTIVE,
    UPDATE_INPLACE,
    AllocFacts,
    Rule,
    classify,
    disconnect_expired,
    max_parallel,
    tainted_situation,
    tasks_updated,
)
from drover.scheduler.structs import (
    ALLOC_CLIENT_PENDING,
    ALLOC_CLIENT_RUNNING,
    ALLOC_CLIENT_UNKNOWN,
    JOB_TYPE_SYSBATCH,
    NODE_ELIGIBLE,
    NODE_STATUS_READY,
    Allocation,
    Job,
    Node,
    TaskGroup,
    alloc_name,
)

# The buckets this reconciler fills from its ladder (scheduler/README.md explains each);
# ``DEFERRED`` is filled after it, by the rolling limit.
SYSTEM_BUCKETS: Final = (
    PLACE,
    UPDATE_DESTRUCTIVE,
    UPDATE_INPLACE,
    MIGRATE,
    STOP,
    IGNORE,
    LOST,
    DISCONNECTING,
    RECONNECTING,
)

# Buckets whose alloc stays desired-running after the plan: the duplicate check runs over them.
KEEPING_BUCKETS: Final = (IGNORE, UPDATE_INPLACE, UPDATE_DESTRUCTIVE, RECONNECTING, DISCONNECTING)


# ---------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True, slots=True)
class AllocTuple:
    """One decision: the slot ``name`` (group ``group``, index ``index``) on ``node_id``.

    ``alloc`` is the live alloc the decision is about; for ``place`` (and the re-run of a
    finished sysbatch alloc) it is the newest terminal alloc of the slot on that node, which
    becomes the new alloc's ``previous_allocation``, or None for a first placement.
    ``reason`` is the description the plan writes for stop-like buckets.
    """

    name: str
    group: str
    index: int
    node_id: str
    alloc: Allocation | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class SystemDiff:
    """The buckets of one reconciliation, each sorted by (node, name, alloc ID)."""

    place: tuple[AllocTuple, ...] = ()
    update_destructive: tuple[AllocTuple, ...] = ()
    update_inplace: tuple[AllocTuple, ...] = ()
    migrate: tuple[AllocTuple, ...] = ()
    stop: tuple[AllocTuple, ...] = ()
    ignore: tuple[AllocTuple, ...] = ()
    lost: tuple[AllocTuple, ...] = ()
    disconnecting: tuple[AllocTuple, ...] = ()
    reconnecting: tuple[AllocTuple, ...] = ()
    # Destructive updates over the max_parallel budget: not acted on in this eval.
    deferred: tuple[AllocTuple, ...] = ()

    def bucket(self, name: str) -> tuple[AllocTuple, ...]:
        value: tuple[AllocTuple, ...] = getattr(self, name)
        return value

    def counts(self) -> dict[str, int]:
        return {f.name: len(self.bucket(f.name)) for f in fields(self)}

    def counts_by_group(self, groups: Iterable[str] = ()) -> dict[str, dict[str, int]]:
        """Bucket counts per group (every bucket named, zeros included), for annotations."""
        names = {g: None for g in groups}
        for f in fields(self):
            for t in self.bucket(f.name):
                names.setdefault(t.group, None)
        out: dict[str, dict[str, int]] = {g: {f.name: 0 for f in fields(self)} for g in names}
        for f in fields(self):
            for t in self.bucket(f.name):
                out[t.group][f.name] += 1
        return out

    def log_fields(self) -> dict[str, int]:
        return {k: v for k, v in self.counts().items() if v}

    def merge(self, other: SystemDiff) -> SystemDiff:
        return SystemDiff(
            **{f.name: _sorted((*self.bucket(f.name), *other.bucket(f.name))) for f in fields(self)}
        )


@dataclass(frozen=True, slots=True)
class TerminalSplit:
    live: tuple[Allocation, ...]
    # (node_id, name) -> the terminal alloc with the highest (create_index, id).
    terminal: Mapping[tuple[str, str], Allocation]
    # Told to stop (desired stop/evict) while the client still reports pending/running/unknown.
    stopping: tuple[Allocation, ...] = ()


@dataclass(frozen=True, slots=True)
class Slot:
    group: TaskGroup
    index: int


# ---------------------------------------------------------------------------------------
# The classification ladder


@dataclass(frozen=True, slots=True)
class SystemAllocFacts(AllocFacts):
    """What the system ladder knows about one live alloc, besides where its node stands."""

    job_stopped: bool  # job stopped or purged
    required: bool  # its name is one of the job's slots (group exists, index < count)
    stale: bool  # runs an older job version
    destructive: bool  # stale, and the change from its version needs a restart
    drain_releases: bool  # on a draining node whose drain has reached system allocs
    node_up: bool  # the node's status is ready (it heartbeats), eligible or not


CLASSIFICATION_RULES: Final[tuple[Rule[SystemAllocFacts], ...]] = (
    Rule(
        LOST,
        lambda f: f.where in GONE_SITUATIONS,
        "A down or deregistered node's allocs are gone with it. Checked first, even for a "
        "stopped job, so the stop carries client status lost in one step (no second plan).",
        reason=DESC_LOST,
    ),
    Rule(
        STOP,
        lambda f: f.job_stopped,
        "The job was stopped or purged: nothing of it may run anywhere.",
        reason=DESC_JOB_STOPPED,
    ),
    Rule(
        STOP,
        lambda f: not f.required,
        "Its group was removed or its index is beyond count: no slot for this name.",
        reason=DESC_NOT_NEEDED,
    ),
    Rule(
        LOST,
        lambda f: f.expired,
        "disconnect.lost_after elapsed while the node stayed away: stop waiting for it.",
        reason=DESC_EXPIRED,
    ),
    Rule(
        DISCONNECTING,
        lambda f: f.where == AT_DISCONNECTED and f.alloc.client_status == ALLOC_CLIENT_RUNNING,
        "The node missed heartbeats but may come back: mark the alloc unknown, keep it "
        "(docs/field-reports.md#field-report-3).",
        reason=DESC_UNKNOWN,
    ),
    Rule(
        IGNORE,
        lambda f: f.where == AT_DISCONNECTED,
        "Already unknown (or never started) on a disconnected node: wait for reconnect or down.",
    ),
    Rule(
        MIGRATE,
        lambda f: f.drain_releases,
        "System allocs leave a draining node last, once its service/batch work is gone.",
        reason=DESC_NODE_TAINTED,
    ),
    Rule(
        IGNORE,
        lambda f: f.where == AT_DRAINING,
        "The drain is still moving other work, or ignores system jobs: keep serving the node.",
    ),
    Rule(
        STOP,
        lambda f: f.where == AT_ELSEWHERE,
        "The node left the job's datacenters or no longer passes the group's constraints.",
        reason=DESC_NODE_NOT_ELIGIBLE,
    ),
    Rule(
        UPDATE_DESTRUCTIVE,
        lambda f: f.where == AT_READY and f.alloc.should_migrate(),
        "The operator stopped it (`drover alloc stop`): a system alloc belongs to its node, "
        "so it is stopped and placed again there (rate-limited as any destructive update).",
        reason=DESC_MIGRATING,
    ),
    Rule(
        UPDATE_DESTRUCTIVE,
        lambda f: f.where == AT_READY and f.stale and f.destructive,
        "Older version and the tasks changed: stop it and place the new version (rate-limited).",
        reason=DESC_UPDATING,
    ),
    Rule(
        UPDATE_INPLACE,
        lambda f: f.where == AT_READY and f.stale,
        "Older version, nothing the process sees changed: same alloc ID, new job version.",
    ),
    Rule(
        RECONNECTING,
        lambda f: f.alloc.client_status == ALLOC_CLIENT_UNKNOWN and f.node_up,
        "The node heartbeats again: keep the alloc, never restart it; its client reports "
        "the real status (the FSM records it in state_history).",
    ),
    Rule(
        IGNORE,
        lambda f: True,
        "Current and where it should be; ineligible nodes keep what they run.",
    ),
)


# ---------------------------------------------------------------------------------------
# Which duplicate survives


@dataclass(frozen=True, slots=True)
class KeepRule:
    name: str
    key: Callable[[Allocation], int | str]  # the higher value is kept
    why: str


_STATUS_RANK: Final[Mapping[str, int]] = {
    ALLOC_CLIENT_RUNNING: 2,
    ALLOC_CLIENT_UNKNOWN: 1,
    ALLOC_CLIENT_PENDING: 0,
}

KEEP_RULES: Final[tuple[KeepRule, ...]] = (
    KeepRule(
        "newest job version",
        lambda a: a.job_version,
        "It already runs what the operator asked for: keeping it saves an update.",
    ),
    KeepRule(
        "running over pending",
        lambda a: _STATUS_RANK.get(a.client_status, 0),
        "A running alloc serves now; a pending one may never start. Unknown sits between.",
    ),
    KeepRule(
        "newest placement",
        lambda a: a.create_index,
        "The scheduler's latest decision for the slot.",
    ),
    KeepRule(
        "highest ID",
        lambda a: a.id,
        "A total order: every server and every retry keeps the same alloc.",
    ),
)


def rank_duplicates(allocs: Iterable[Allocation]) -> list[Allocation]:
    """Best first by ``KEEP_RULES``: the first rule on which two allocs differ decides."""
    ranked = list(allocs)
    # Stable sorts from the least to the most significant rule compose lexicographically.
    for rule in reversed(KEEP_RULES):
        ranked.sort(key=rule.key, reverse=True)
    return ranked


# ---------------------------------------------------------------------------------------
# Inputs


def materialize_slots(job: Job | None) -> dict[str, Slot]:
    """Every alloc name the job wants on each node: ``count`` per group (none when stopped)."""
    if job is None or job.stop:
        return {}
    return {
        alloc_name(job.id, group.name, i): Slot(group, i) for group in job.groups for i in range(group.count)
    }


def split_terminal(allocs: Iterable[Allocation]) -> TerminalSplit:
    live: list[Allocation] = []
    stopping: list[Allocation] = []
    terminal: dict[tuple[str, str], Allocation] = {}
    for alloc in allocs:
        if not alloc.terminal():
            live.append(alloc)
            continue
        if not alloc.client_terminal():
            stopping.append(alloc)
        key = (alloc.node_id, alloc.name)
        have = terminal.get(key)
        if have is None or (alloc.create_index, alloc.id) > (have.create_index, have.id):
            terminal[key] = alloc
    return TerminalSplit(tuple(live), terminal, tuple(stopping))


def node_situation(
    node_id: str,
    group: str,
    ready: Mapping[str, Node],
    not_ready: Mapping[str, Node | None],
    infeasible: Mapping[str, frozenset[str]],
) -> tuple[str, Node | None]:
    """Where ``node_id`` stands for ``group`` (an ``AT_*`` value) and the node, if known."""
    if node_id in ready:
        node = ready[node_id]
        return (AT_ELSEWHERE if node_id in infeasible.get(group, frozenset()) else AT_READY), node
    if node_id not in not_ready:
        # Not told about it: neither ready for the job nor known not to be (Nomad's "not
        # eligible").
        return AT_ELSEWHERE, None
    other = not_ready[node_id]
    if other is None:
        return AT_MISSING, None
    situation = tainted_situation(other)
    if situation is not None:
        return situation, other
    if other.status == NODE_STATUS_READY and other.scheduling_eligibility == NODE_ELIGIBLE:
        return AT_ELSEWHERE, other
    return AT_UNPLACEABLE, other


# ---------------------------------------------------------------------------------------
# The diff


def diff_system_allocs(
    job: Job | None,
    nodes_ready: Iterable[Node],
    nodes_not_ready: Mapping[str, Node | None],
    live_and_terminal_allocs: Iterable[Allocation],
    now_ns: int,
    *,
    infeasible: Mapping[str, frozenset[str]] | None = None,
    drain_pending: frozenset[str] = frozenset(),
    job_versions: Mapping[int, Job] | None = None,
    rollout: Mapping[str, SystemRollout] | None = None,
) -> SystemDiff:
    """Reconcile one system/sysbatch job against its nodes.

    ``job``: the job at its current version; None (purged) or stopped stops everything.
    ``nodes_ready``: ready, eligible, non-draining nodes in the job's datacenters.
    ``nodes_not_ready``: the other nodes holding allocs of the job, live or terminal: tainted
    (down, disconnected, draining; a deregistered node maps to None), unplaceable
    (ineligible, initializing) or ready in another datacenter. A node in neither is treated
    as not eligible for the job: its allocs stop.
    ``live_and_terminal_allocs``: every alloc of the job.
    ``infeasible``: group name -> IDs of ``nodes_ready`` failing that group's constraints.
    ``drain_pending``: draining nodes that still hold live service/batch allocs.
    ``job_versions``: older versions of the job by number, to tell in-place from destructive
    updates; a version missing here makes its allocs' update destructive.
    ``rollout``: per group under a deployment, what its health says (``SystemRollout``).
    """
    view = _View(
        job=job,
        ready={n.id: n for n in nodes_ready},
        not_ready=nodes_not_ready,
        infeasible=infeasible or {},
        drain_pending=drain_pending,
        job_versions=job_versions or {},
        now_ns=now_ns,
        slots=materialize_slots(job),
    )
    split = split_terminal(live_and_terminal_allocs)
    out: dict[str, list[AllocTuple]] = {f.name: [] for f in fields(SystemDiff)}
    for alloc in split.live:
        rule = classify(CLASSIFICATION_RULES, view.facts(alloc))
        out[rule.category].append(view.tuple_of(alloc, rule.reason))
    out[LOST].extend(_lost_while_stopping(view, split.stopping))
    charged = _stop_duplicates(out)
    kept = {(t.node_id, t.name) for bucket in KEEPING_BUCKETS for t in out[bucket]}
    if job is not None and not job.stop:
        for bucket, t in _open_slots(view, job, kept, split.terminal):
            out[bucket].append(t)
        out[UPDATE_DESTRUCTIVE], out[DEFERRED] = limit_destructive(
            job, out[UPDATE_DESTRUCTIVE], charged, rollout or {}
        )
    return SystemDiff(**{name: _sorted(items) for name, items in out.items()})


@dataclass(frozen=True, slots=True)
class _View:
    """The diff's inputs, with the per-alloc questions the ladder asks of them."""

    job: Job | None
    ready: Mapping[str, Node]
    not_ready: Mapping[str, Node | None]
    infeasible: Mapping[str, frozenset[str]]
    drain_pending: frozenset[str]
    job_versions: Mapping[int, Job]
    now_ns: int
    slots: Mapping[str, Slot]  # every alloc name the job wants on each node

    def situation(self, alloc: Allocation) -> tuple[str, Node | None]:
        return node_situation(alloc.node_id, alloc.task_group, self.ready, self.not_ready, self.infeasible)

    def facts(self, alloc: Allocation) -> SystemAllocFacts:
        job = self.job
        where, node = self.situation(alloc)
        slot = self.slots.get(alloc.name)
        stale = job is not None and alloc.job_version != job.version
        drain = node.drain_strategy if node is not None else None
        return SystemAllocFacts(
            alloc=alloc,
            where=where,
            job_stopped=job is None or job.stop,
            required=slot is not None and slot.group.name == alloc.task_group,
            stale=stale,
            destructive=stale and self.changed_destructively(alloc.job_version, alloc.task_group),
            expired=disconnect_expired(
                alloc, job.lookup_group(alloc.task_group) if job else None, where, self.now_ns
            ),
            drain_releases=(
                where == AT_DRAINING
                and drain is not None
                and not drain.ignore_system_jobs
                and alloc.node_id not in self.drain_pending
            ),
            node_up=node is not None and node.status == NODE_STATUS_READY,
        )

    def changed_destructively(self, version: int, group: str) -> bool:
        return tasks_updated(self.job_versions.get(version), self.job, group)

    def tuple_of(self, alloc: Allocation, reason: str) -> AllocTuple:
        return AllocTuple(alloc.name, alloc.task_group, alloc.index, alloc.node_id, alloc, reason)


def _lost_while_stopping(view: _View, stopping: Iterable[Allocation]) -> list[AllocTuple]:
    """Told to stop, but the node died before its client confirmed: the alloc is lost
    (Nomad's updateNonTerminalAllocsToLost), so summaries count it right and a later eval
    has nothing left to write (the fixed point)."""
    return [
        view.tuple_of(alloc, DESC_LOST) for alloc in stopping if view.situation(alloc)[0] in GONE_SITUATIONS
    ]


def _stop_duplicates(out: dict[str, list[AllocTuple]]) -> dict[str, set[str]]:
    """Keep one alloc per (node, name) among those that stay running; stop the others.

    Returns, per group, the nodes whose only running alloc was stopped as a duplicate (the
    survivor is not running yet): those nodes are charged to the rolling budget.
    """
    charged: dict[str, set[str]] = defaultdict(set)
    by_slot: dict[tuple[str, str], list[tuple[str, AllocTuple, Allocation]]] = defaultdict(list)
    for bucket in KEEPING_BUCKETS:
        for t in out[bucket]:
            if t.alloc is not None:
                by_slot[(t.node_id, t.name)].append((bucket, t, t.alloc))
    for (node_id, _name), entries in sorted(by_slot.items()):
        if len(entries) < 2:
            continue
        keep = rank_duplicates(alloc for _, _, alloc in entries)[0]
        for bucket, t, alloc in entries:
            if alloc.id == keep.id:
                continue
            out[bucket].remove(t)
            out[STOP].append(replace(t, reason=DESC_DUPLICATE))
            if alloc.client_status == ALLOC_CLIENT_RUNNING and keep.client_status != ALLOC_CLIENT_RUNNING:
                charged[t.group].add(node_id)
    return charged


def _open_slots(
    view: _View, job: Job, kept: set[tuple[str, str]], terminal: Mapping[tuple[str, str], Allocation]
) -> Iterable[tuple[str, AllocTuple]]:
    """Every slot of every group on every ready node that no live alloc holds.

    System: place it (after the newest finished alloc of the slot, if any). Sysbatch: a
    finished alloc of the slot means it already ran there; it runs again only when the job
    changed destructively since (a destructive update, rate-limited like the others).
    """
    sysbatch = job.type == JOB_TYPE_SYSBATCH
    for node_id in sorted(view.ready):
        for group in job.groups:
            if node_id in view.infeasible.get(group.name, frozenset()):
                continue
            for i in range(group.count):
                name = alloc_name(job.id, group.name, i)
                if (node_id, name) in kept:
                    continue
                previous = terminal.get((node_id, name))
                t = AllocTuple(name, group.name, i, node_id, previous)
                if not sysbatch or previous is None:
                    yield PLACE, t
                elif previous.job_version != job.version and view.changed_destructively(
                    previous.job_version, group.name
                ):
                    yield UPDATE_DESTRUCTIVE, replace(t, reason=DESC_UPDATING)
                else:
                    yield IGNORE, t


@dataclass(frozen=True, slots=True)
class SystemRollout:
    """A system group's deployment, as the budget sees it: ``waiting`` nodes hold a new
    alloc of the deployment whose health is not known yet (each costs one unit of
    ``max_parallel`` until it is healthy: the next batch waits for health, as well as for
    the stagger); ``blocked``: the deployment is paused or failed, or one of its allocs is
    unhealthy, so nothing more is updated."""

    waiting: frozenset[str] = frozenset()
    blocked: bool = False


def limit_destructive(
    job: Job,
    candidates: Iterable[AllocTuple],
    charged: Mapping[str, set[str]],
    rollout: Mapping[str, SystemRollout] | None = None,
) -> tuple[list[AllocTuple], list[AllocTuple]]:
    """Split destructive updates into (now, deferred) under each group's max_parallel.

    The unit is a node: all of a node's destructive updates for a group go together and
    cost one. Nodes already charged (a duplicate stop took their only running alloc) are
    paid for first, never held back, and their updates ride along for free. Nodes whose new
    alloc waits for its health verdict (``SystemRollout.waiting``) use up budget too. Nodes
    are admitted in ID order so a retry of the same eval admits the same ones.
    """
    rollout = rollout or {}
    by_group: dict[str, dict[str, list[AllocTuple]]] = defaultdict(lambda: defaultdict(list))
    for t in candidates:
        by_group[t.group][t.node_id].append(t)
    now: list[AllocTuple] = []
    later: list[AllocTuple] = []
    for group_name, by_node in by_group.items():
        group = job.lookup_group(group_name)
        limit = max_parallel(job, group) if group is not None else 0
        paid = set(charged.get(group_name, ()))
        gate = rollout.get(group_name, SystemRollout())
        waiting = len(gate.waiting - paid)
        for node_id in sorted(by_node):
            if node_id in paid or (not gate.blocked and (limit == 0 or len(paid) + waiting < limit)):
                paid.add(node_id)
                now.extend(by_node[node_id])
            else:
                later.extend(by_node[node_id])
    return now, later


def _sorted(items: Iterable[AllocTuple]) -> tuple[AllocTuple, ...]:
    return tuple(sorted(items, key=lambda t: (t.node_id, t.name, t.alloc.id if t.alloc is not None else "")))


__all__ = [
    "CLASSIFICATION_RULES",
    "KEEPING_BUCKETS",
    "KEEP_RULES",
    "SYSTEM_BUCKETS",
    "AllocTuple",
    "KeepRule",
    "Slot",
    "SystemAllocFacts",
    "SystemDiff",
    "SystemRollout",
    "TerminalSplit",
    "diff_system_allocs",
    "limit_destructive",
    "materialize_slots",
    "node_situation",
    "rank_duplicates",
    "split_terminal",
]
