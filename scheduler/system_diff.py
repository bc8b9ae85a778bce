"""System and sysbatch reconciliation: which alloc of a job goes in which bucket, node by node.

Theory of operation
-------------------
A system job runs ``count`` allocs of each group (1 for system, N for sysbatch) on every ready
node of its datacenters that passes the group's constraints. The identity of an alloc is its
*name* (``job.group[i]``) on its *node*, never its ID. ``diff_system_allocs`` takes every
input as a value (the job, the nodes, the job's allocs, the time) and returns named buckets
(``SystemDiff``); ``scheduler/system.py`` turns the buckets into a plan. Nothing here reads a
clock, mints an ID or touches the state store.

The steps, in order:

1. ``split_terminal``: live allocs go through the ladder; terminal ones are only remembered,
   the newest per (node, name), as the ``previous_allocation`` of a replacement and, for
   sysbatch, as "this name already ran here".
2. ``CLASSIFICATION_RULES`` (first match wins) puts every live alloc in one bucket.
3. Duplicates: at most one live alloc per (node, name) may stay desired-running, so at most
   ``count`` per (job, group, node) (docs/design.md#invariant-1). The survivor is chosen by
   ``KEEP_RULES``; the others are stopped ("alloc duplicated on node"). Nomad never did this
   (docs/field-reports.md#field-report-1, PR #16097 closed unmerged): its duplicates were both
   updated and both re-placed,
   and the plan applier rejected the node forever over their shared static port.
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

from scheduler.structs import (
    ALLOC_CLIENT_PENDING,
    ALLOC_CLIENT_RUNNING,
    ALLOC_CLIENT_UNKNOWN,
    JOB_TYPE_SYSBATCH,
    NODE_ELIGIBLE,
    NODE_STATUS_DISCONNECTED,
    NODE_STATUS_DOWN,
    NODE_STATUS_READY,
    Allocation,
    Job,
    NetworkResource,
    Node,
    Resources,
    Task,
    TaskGroup,
    alloc_name,
)

# ---------------------------------------------------------------------------------------
# Vocabulary (scheduler/README.md explains each bucket)

PLACE: Final = "place"
UPDATE_DESTRUCTIVE: Final = "update_destructive"
UPDATE_INPLACE: Final = "update_inplace"
MIGRATE: Final = "migrate"
STOP: Final = "stop"
IGNORE: Final = "ignore"
LOST: Final = "lost"
DISCONNECTING: Final = "disconnecting"
RECONNECTING: Final = "reconnecting"
BUCKETS: Final = (
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
# Not a bucket of the ladder: destructive updates held back by max_parallel for the next batch.
DEFERRED: Final = "deferred"

# Buckets whose alloc stays desired-running after the plan: the duplicate check runs over them.
KEEPING_BUCKETS: Final = (IGNORE, UPDATE_INPLACE, UPDATE_DESTRUCTIVE, RECONNECTING, DISCONNECTING)

# Descriptions written into the plan (desired_description), one per reason.
DESC_NOT_NEEDED: Final = "alloc not needed due to job update"
DESC_JOB_STOPPED: Final = "alloc not needed as job is stopped"
DESC_NODE_NOT_ELIGIBLE: Final = "alloc not needed as node is no longer eligible for the job"
DESC_DUPLICATE: Final = "alloc duplicated on node"
DESC_MIGRATE: Final = "alloc not needed as node is tainted"
DESC_LOST: Final = "alloc is lost since its node is down"
DESC_EXPIRED: Final = "alloc is lost since its node stayed disconnected past lost_after"
DESC_UNKNOWN: Final = "alloc is unknown since its node is disconnected"
DESC_UPDATING: Final = "alloc is being updated due to job update"

# Where an alloc's node stands, for one group of the job (``node_situation``).
AT_READY: Final = "ready"  # ready, eligible, not draining, in the job's DCs, passes the group's constraints
AT_ELSEWHERE: Final = "elsewhere"  # ready and eligible but not for this group (DCs, constraints), or unknown
AT_NOT_READY: Final = "not-ready"  # ineligible without a drain, or initializing
AT_DRAINING: Final = "draining"
AT_DISCONNECTED: Final = "disconnected"
AT_DOWN: Final = "down"
AT_MISSING: Final = "missing"  # deregistered: tainted_nodes maps it to None


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
# Destructive vs in-place


def _task_resources(task: Task) -> Resources:
    return task.resources or Resources()


def _network(group: TaskGroup) -> NetworkResource:
    return group.network or NetworkResource()


# Group fields whose change restarts the allocs (Nomad's tasksUpdated, our own list).
DESTRUCTIVE_GROUP_FIELDS: Final[tuple[tuple[str, Callable[[TaskGroup], object], str], ...]] = (
    # Ports are assigned when the alloc is placed; the alloc holds them until it stops.
    ("network", _network, "ports are bound at placement; new ports need a new alloc"),
    ("ephemeral_disk_mb", lambda g: g.ephemeral_disk_mb, "the disk is sized when the alloc is created"),
    # The count-identity of the group's work: which tasks make up one alloc.
    (
        "task names",
        lambda g: tuple(sorted(t.name for t in g.tasks)),
        "an added or removed task is a new alloc",
    ),
)

# Task fields whose change restarts the task. Everything else (job/group meta, priority,
# update, reschedule, restart, constraints, kill_timeout) is applied in place.
DESTRUCTIVE_TASK_FIELDS: Final[tuple[tuple[str, Callable[[Task], object], str], ...]] = (
    ("driver", lambda t: t.driver, "another driver runs another process"),
    ("config_json", lambda t: t.config_json, "the driver reads its config only at start"),
    ("env", lambda t: dict(t.env), "a process's environment is fixed at exec"),
    ("resources", _task_resources, "cpu/memory limits are set when the task starts"),
    ("meta", lambda t: dict(t.meta), "task meta reaches the task as NOMAD_META_* env"),
)


def tasks_updated(old_job: Job | None, new_job: Job | None, group_name: str) -> bool:
    """True when moving ``group_name``'s allocs from ``old_job`` to ``new_job`` needs a restart.

    A missing version or group is destructive: without the old spec there is nothing to
    prove the running process equal to the new one.
    """
    if old_job is None or new_job is None:
        return True
    old, new = old_job.lookup_group(group_name), new_job.lookup_group(group_name)
    if old is None or new is None:
        return True
    for _name, get_group, _why in DESTRUCTIVE_GROUP_FIELDS:
        if get_group(old) != get_group(new):
            return True
    new_tasks = {t.name: t for t in new.tasks}
    for task in old.tasks:
        other = new_tasks.get(task.name)
        if other is None:
            return True
        for _name, get_task, _why in DESTRUCTIVE_TASK_FIELDS:
            if get_task(task) != get_task(other):
                return True
    return False


# ---------------------------------------------------------------------------------------
# The classification ladder


@dataclass(frozen=True, slots=True)
class AllocFacts:
    """What the ladder knows about one live alloc, computed once before the rules run."""

    alloc: Allocation
    where: str  # one of the AT_* situations of its node for its group
    job_stopped: bool  # job stopped or purged
    required: bool  # its name is one of the job's slots (group exists, index < count)
    stale: bool  # runs an older job version
    destructive: bool  # stale, and the change from its version needs a restart
    expired: bool  # unknown on a disconnected node for longer than the group's lost_after
    drain_releases: bool  # on a draining node whose drain has reached system allocs
    node_up: bool  # the node's status is ready (it heartbeats), eligible or not


@dataclass(frozen=True, slots=True)
class Rule:
    bucket: str
    applies: Callable[[AllocFacts], bool]
    reason: str  # the plan's description for stop-like buckets
    why: str


CLASSIFICATION_RULES: Final[tuple[Rule, ...]] = (
    Rule(
        LOST,
        lambda f: f.where in (AT_DOWN, AT_MISSING),
        DESC_LOST,
        "A down or deregistered node's allocs are gone with it. Checked first, even for a "
        "stopped job, so the stop carries client status lost in one step (no second plan).",
    ),
    Rule(
        STOP,
        lambda f: f.job_stopped,
        DESC_JOB_STOPPED,
        "The job was stopped or purged: nothing of it may run anywhere.",
    ),
    Rule(
        STOP,
        lambda f: not f.required,
        DESC_NOT_NEEDED,
        "Its group was removed or its index is beyond count: no slot for this name.",
    ),
    Rule(
        LOST,
        lambda f: f.expired,
        DESC_EXPIRED,
        "disconnect.lost_after elapsed while the node stayed away: stop waiting for it.",
    ),
    Rule(
        DISCONNECTING,
        lambda f: f.where == AT_DISCONNECTED and f.alloc.client_status == ALLOC_CLIENT_RUNNING,
        DESC_UNKNOWN,
        "The node missed heartbeats but may come back: mark the alloc unknown, keep it "
        "(docs/field-reports.md#field-report-3).",
    ),
    Rule(
        IGNORE,
        lambda f: f.where == AT_DISCONNECTED,
        "",
        "Already unknown (or never started) on a disconnected node: wait for reconnect or down.",
    ),
    Rule(
        MIGRATE,
        lambda f: f.drain_releases,
        DESC_MIGRATE,
        "System allocs leave a draining node last, once its service/batch work is gone.",
    ),
    Rule(
        IGNORE,
        lambda f: f.where == AT_DRAINING,
        "",
        "The drain is still moving other work, or ignores system jobs: keep serving the node.",
    ),
    Rule(
        STOP,
        lambda f: f.where == AT_ELSEWHERE,
        DESC_NODE_NOT_ELIGIBLE,
        "The node left the job's datacenters or no longer passes the group's constraints.",
    ),
    Rule(
        UPDATE_DESTRUCTIVE,
        lambda f: f.where == AT_READY and f.stale and f.destructive,
        DESC_UPDATING,
        "Older version and the tasks changed: stop it and place the new version (rate-limited).",
    ),
    Rule(
        UPDATE_INPLACE,
        lambda f: f.where == AT_READY and f.stale,
        "",
        "Older version, nothing the process sees changed: same alloc ID, new job version.",
    ),
    Rule(
        RECONNECTING,
        lambda f: f.alloc.client_status == ALLOC_CLIENT_UNKNOWN and f.node_up,
        "",
        "The node heartbeats again: keep the alloc, never restart it; its client reports "
        "the real status (the FSM records it in state_history).",
    ),
    Rule(
        IGNORE,
        lambda f: True,
        "",
        "Current and where it should be; ineligible nodes keep what they run.",
    ),
)


def classify(facts: AllocFacts) -> Rule:
    """The first rule of ``CLASSIFICATION_RULES`` that applies."""
    for rule in CLASSIFICATION_RULES:
        if rule.applies(facts):
            return rule
    raise AssertionError("the last classification rule matches everything")  # pragma: no cover


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
    tainted: Mapping[str, Node | None],
    infeasible: Mapping[str, frozenset[str]],
) -> tuple[str, Node | None]:
    """Where ``node_id`` stands for ``group`` (an ``AT_*`` value) and the node, if known."""
    if node_id in ready:
        node = ready[node_id]
        return (AT_ELSEWHERE if node_id in infeasible.get(group, frozenset()) else AT_READY), node
    if node_id not in tainted:
        # Not told about it: neither ready for the job nor tainted (Nomad's "not eligible").
        return AT_ELSEWHERE, None
    other = tainted[node_id]
    if other is None:
        return AT_MISSING, None
    if other.status == NODE_STATUS_DOWN:
        return AT_DOWN, other
    if other.status == NODE_STATUS_DISCONNECTED:
        return AT_DISCONNECTED, other
    if other.drain_strategy is not None:
        return AT_DRAINING, other
    if other.status == NODE_STATUS_READY and other.scheduling_eligibility == NODE_ELIGIBLE:
        return AT_ELSEWHERE, other
    return AT_NOT_READY, other


def last_unknown_ns(alloc: Allocation) -> int:
    """When the trailing run of "unknown" client statuses in the alloc's history began (0: none)."""
    since = 0
    for change in reversed(alloc.state_history):
        if change.field != "client_status" or not change.value:
            continue
        if change.value != ALLOC_CLIENT_UNKNOWN:
            break
        since = change.time_ns
    return since


def _expired(alloc: Allocation, group: TaskGroup | None, where: str, now_ns: int) -> bool:
    if where != AT_DISCONNECTED or alloc.client_status != ALLOC_CLIENT_UNKNOWN or group is None:
        return False
    lost_after = group.disconnect.lost_after_ns if group.disconnect is not None else 0
    since = last_unknown_ns(alloc)
    return lost_after > 0 and since > 0 and since + lost_after <= now_ns


def max_parallel(job: Job, group: TaskGroup) -> int:
    """The group's rolling limit: its own update block, else the job's; 0 = unlimited."""
    strategy = group.update or job.update
    return strategy.max_parallel if strategy is not None and strategy.max_parallel > 0 else 0


def stagger_ns(job: Job, group: TaskGroup) -> int:
    strategy = group.update or job.update
    return strategy.stagger_ns if strategy is not None else 0


# ---------------------------------------------------------------------------------------
# The diff


def diff_system_allocs(
    job: Job | None,
    nodes_ready: Iterable[Node],
    tainted_nodes: Mapping[str, Node | None],
    live_and_terminal_allocs: Iterable[Allocation],
    now_ns: int,
    *,
    infeasible: Mapping[str, frozenset[str]] | None = None,
    drain_pending: frozenset[str] = frozenset(),
    job_versions: Mapping[int, Job] | None = None,
) -> SystemDiff:
    """Reconcile one system/sysbatch job against its nodes.

    ``job``: the job at its current version; None (purged) or stopped stops everything.
    ``nodes_ready``: ready, eligible, non-draining nodes in the job's datacenters.
    ``tainted_nodes``: the other nodes holding allocs of the job, live or terminal (down,
    disconnected, draining, ineligible, initializing, or ready in another datacenter); a
    deregistered node maps to None. A node in neither is treated as not eligible for the
    job: its allocs stop.
    ``live_and_terminal_allocs``: every alloc of the job.
    ``infeasible``: group name -> IDs of ``nodes_ready`` failing that group's constraints.
    ``drain_pending``: draining nodes that still hold live service/batch allocs.
    ``job_versions``: older versions of the job by number, to tell in-place from destructive
    updates; a version missing here makes its allocs' update destructive.
    """
    view = _View(
        job=job,
        ready={n.id: n for n in nodes_ready},
        tainted=tainted_nodes,
        infeasible=infeasible or {},
        drain_pending=drain_pending,
        job_versions=job_versions or {},
        now_ns=now_ns,
        slots=materialize_slots(job),
    )
    split = split_terminal(live_and_terminal_allocs)
    out: dict[str, list[AllocTuple]] = {f.name: [] for f in fields(SystemDiff)}
    for alloc in split.live:
        rule = classify(view.facts(alloc))
        out[rule.bucket].append(view.tuple_of(alloc, rule.reason))
    out[LOST].extend(_lost_while_stopping(view, split.stopping))
    charged = _stop_duplicates(out)
    kept = {(t.node_id, t.name) for bucket in KEEPING_BUCKETS for t in out[bucket]}
    if job is not None and not job.stop:
        for bucket, t in _open_slots(view, job, kept, split.terminal):
            out[bucket].append(t)
        out[UPDATE_DESTRUCTIVE], out[DEFERRED] = limit_destructive(job, out[UPDATE_DESTRUCTIVE], charged)
    return SystemDiff(**{name: _sorted(items) for name, items in out.items()})


@dataclass(frozen=True, slots=True)
class _View:
    """The diff's inputs, with the per-alloc questions the ladder asks of them."""

    job: Job | None
    ready: Mapping[str, Node]
    tainted: Mapping[str, Node | None]
    infeasible: Mapping[str, frozenset[str]]
    drain_pending: frozenset[str]
    job_versions: Mapping[int, Job]
    now_ns: int
    slots: Mapping[str, Slot]  # every alloc name the job wants on each node

    def situation(self, alloc: Allocation) -> tuple[str, Node | None]:
        return node_situation(alloc.node_id, alloc.task_group, self.ready, self.tainted, self.infeasible)

    def facts(self, alloc: Allocation) -> AllocFacts:
        job = self.job
        where, node = self.situation(alloc)
        slot = self.slots.get(alloc.name)
        stale = job is not None and alloc.job_version != job.version
        drain = node.drain_strategy if node is not None else None
        return AllocFacts(
            alloc=alloc,
            where=where,
            job_stopped=job is None or job.stop,
            required=slot is not None and slot.group.name == alloc.task_group,
            stale=stale,
            destructive=stale and self.changed_destructively(alloc.job_version, alloc.task_group),
            expired=_expired(alloc, job.lookup_group(alloc.task_group) if job else None, where, self.now_ns),
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
        view.tuple_of(alloc, DESC_LOST)
        for alloc in stopping
        if view.situation(alloc)[0] in (AT_DOWN, AT_MISSING)
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


def limit_destructive(
    job: Job, candidates: Iterable[AllocTuple], charged: Mapping[str, set[str]]
) -> tuple[list[AllocTuple], list[AllocTuple]]:
    """Split destructive updates into (now, deferred) under each group's max_parallel.

    The unit is a node: all of a node's destructive updates for a group go together and
    cost one. Nodes already charged (a duplicate stop took their only running alloc) are
    paid for first, never held back, and their updates ride along for free. Nodes are
    admitted in ID order so a retry of the same eval admits the same ones.
    """
    by_group: dict[str, dict[str, list[AllocTuple]]] = defaultdict(lambda: defaultdict(list))
    for t in candidates:
        by_group[t.group][t.node_id].append(t)
    now: list[AllocTuple] = []
    later: list[AllocTuple] = []
    for group_name, by_node in by_group.items():
        group = job.lookup_group(group_name)
        limit = max_parallel(job, group) if group is not None else 0
        paid = set(charged.get(group_name, ()))
        for node_id in sorted(by_node):
            if limit == 0 or node_id in paid or len(paid) < limit:
                paid.add(node_id)
                now.extend(by_node[node_id])
            else:
                later.extend(by_node[node_id])
    return now, later


def _sorted(items: Iterable[AllocTuple]) -> tuple[AllocTuple, ...]:
    return tuple(sorted(items, key=lambda t: (t.node_id, t.name, t.alloc.id if t.alloc is not None else "")))


__all__ = [
    "BUCKETS",
    "CLASSIFICATION_RULES",
    "DEFERRED",
    "KEEP_RULES",
    "AllocFacts",
    "AllocTuple",
    "KeepRule",
    "Rule",
    "Slot",
    "SystemDiff",
    "TerminalSplit",
    "classify",
    "diff_system_allocs",
    "last_unknown_ns",
    "limit_destructive",
    "materialize_slots",
    "max_parallel",
    "node_situation",
    "rank_duplicates",
    "split_terminal",
    "stagger_ns",
    "tasks_updated",
]
