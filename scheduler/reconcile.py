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

The steps, in order:

1. ``CLASSIFICATION_RULES`` (first match wins) puts every alloc in a category: lost, gone
   (history: stopped earlier, or already replaced), done (a finished batch alloc),
   superseded (a failed replacement of an alloc that is back: stopped), failed,
   disconnecting, unknown, migrate, reconnecting or untainted.
2. A stopped job stops every live alloc and places nothing.
3. Reconnects: an alloc that is back on a healthy node while a replacement of it also runs
   keeps exactly one of the two (``RECONNECT_PICKERS``; ties keep the original,
   docs/field-reports.md#field-report-3).
4. Slots: every alloc that still speaks for a slot becomes a *holder*. Some holders stay
   (untainted, done, a failed alloc that may not or not yet be rescheduled), some must move
   (lost, migrating, failed-and-rescheduled-now, disconnected-and-replaced). With more holders
   than ``count``, ``REMOVAL_ORDER`` picks who goes: movers first (dropping one saves a
   placement), then failed, then live allocs by highest index, finished batch work last.
5. Movers become placements into their own slot; free slots are filled lowest index first.
6. Updates: a holder on an older job version is updated in place (same alloc, new version)
   or destructively (stop + place), per ``tasks_updated``. Destructive updates are rate
   limited by the group's ``update.max_parallel`` for service jobs: the budget is
   ``max_parallel`` minus the rollout's replacements placed less than ``stagger`` ago, so
   every eval (not only the rolling one) respects the stagger. Held-back updates set
   ``rolling_followup_ns``, the time the scheduler's follow-up eval should run.

Drover departs from Nomad where Nomad fell short (scheduler/README.md has the list): an
``unknown`` alloc whose replacement could not be placed is retried on later evals instead of
waiting for its node (Nomad #16644), and a completed batch alloc is never re-run, even after
a job update.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Final

# Shared with the system scheduler (one definition each; see scheduler/README.md).
from scheduler.reconciler.vocabulary import (
    DESC_EXPIRED,
    DESC_JOB_STOPPED,
    DESC_LOST,
    DESC_NOT_NEEDED,
    DESC_UNKNOWN,
    DESC_UPDATING,
    last_unknown_ns,
    max_parallel,
    stagger_ns,
    tasks_updated,
)
from scheduler.structs import (
    ALLOC_CLIENT_COMPLETE,
    ALLOC_CLIENT_LOST,
    ALLOC_CLIENT_PENDING,
    ALLOC_CLIENT_RUNNING,
    ALLOC_CLIENT_UNKNOWN,
    ALLOC_DESIRED_RUN,
    DELAY_CONSTANT,
    DELAY_EXPONENTIAL,
    DELAY_FIBONACCI,
    JOB_TYPE_BATCH,
    JOB_TYPE_SERVICE,
    NODE_STATUS_DISCONNECTED,
    NODE_STATUS_DOWN,
    RECONCILE_BEST_SCORE,
    RECONCILE_KEEP_ORIGINAL,
    RECONCILE_KEEP_REPLACEMENT,
    RECONCILE_LONGEST_RUNNING,
    Allocation,
    DisconnectStrategy,
    Job,
    Node,
    RescheduleEvent,
    ReschedulePolicy,
    TaskGroup,
    alloc_name,
)

__all__ = [
    "BUCKETS",
    "CLASSIFICATION_RULES",
    "DELAY_FUNCTIONS",
    "DESC_EXPIRED",
    "DESC_JOB_STOPPED",
    "DESC_LOST",
    "DESC_MIGRATING",
    "DESC_NEVER_STARTED",
    "DESC_NOT_NEEDED",
    "DESC_RECONNECT_LOSER",
    "DESC_RESCHEDULED",
    "DESC_UNKNOWN",
    "DESC_UPDATING",
    "RECONNECT_PICKERS",
    "REMOVAL_ORDER",
    "AllocFacts",
    "DelayedReschedule",
    "GroupResult",
    "Placement",
    "RescheduleDecision",
    "Rule",
    "ScoreFn",
    "Stop",
    "classify",
    "next_delay",
    "next_reschedule",
    "reconcile_group",
    "tasks_updated",
]

# ---------------------------------------------------------------------------------------
# Vocabulary (scheduler/README.md explains each bucket)

BUCKETS: Final = (
    "place",
    "stop",
    "inplace",
    "destructive",
    "migrate",
    "lost",
    "ignore",
    "reschedule_now",
    "reschedule_later",
    "disconnecting",
    "reconnecting",
)

# Categories of CLASSIFICATION_RULES. Four share a bucket's name; the others are internal.
LOST: Final = "lost"
GONE: Final = "gone"  # history: not counted, not acted on
DONE: Final = "done"  # a finished batch alloc: its slot is done
FAILED: Final = "failed"  # the reschedule policy decides
SUPERSEDED: Final = "superseded"  # a failed replacement of an alloc that is back: stopped
DISCONNECTING: Final = "disconnecting"
UNKNOWN: Final = "unknown"  # already unknown on a disconnected node
MIGRATE: Final = "migrate"
RECONNECTING: Final = "reconnecting"
UNTAINTED: Final = "untainted"

# Why a placement is made (Placement.reason).
PLACE_NEW: Final = "new"
PLACE_LOST: Final = "lost"
PLACE_MIGRATE: Final = "migrate"
PLACE_RESCHEDULE: Final = "reschedule"
PLACE_DESTRUCTIVE: Final = "destructive"
PLACE_DISCONNECT: Final = "disconnect"

# Descriptions written into the plan (desired_description), besides the shared DESC_*
# (not needed, job stopped, updating, lost, expired, unknown) from system_diff.
DESC_MIGRATING: Final = "alloc is being migrated"
DESC_NEVER_STARTED: Final = "alloc is lost since its node disconnected before it started"
DESC_RESCHEDULED: Final = "alloc was rescheduled because it failed"
DESC_RECONNECT_LOSER: Final = "alloc not needed due to disconnected client reconnect"

# A failed alloc due within this window is rescheduled now rather than by a follow-up eval
# (Nomad's rescheduleWindowSize): the follow-up would fire before the plan even commits.
RESCHEDULE_WINDOW_NS: Final = 1_000_000_000
# Past reschedule events kept on a replacement under an unlimited policy (only the last
# two matter for the delay functions; the rest is history for `alloc status`).
MAX_PAST_RESCHEDULE_EVENTS: Final = 5

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
    hold the allocs concerned: ``inplace`` (same alloc ID, new job version), ``destructive``
    (old allocs replaced by a new version), ``migrate``, ``lost``, ``reschedule_now``,
    ``reschedule_later``, ``disconnecting`` (to be marked unknown), ``reconnecting`` (back
    from a disconnect, kept), ``ignore`` (live or slot-holding allocs left as they are,
    including destructive updates held back by ``max_parallel``).
    """

    group: str
    place: tuple[Placement, ...] = ()
    stop: tuple[Stop, ...] = ()
    inplace: tuple[Allocation, ...] = ()
    destructive: tuple[Allocation, ...] = ()
    migrate: tuple[Allocation, ...] = ()
    lost: tuple[Allocation, ...] = ()
    ignore: tuple[Allocation, ...] = ()
    reschedule_now: tuple[Allocation, ...] = ()
    reschedule_later: tuple[DelayedReschedule, ...] = ()
    disconnecting: tuple[Allocation, ...] = ()
    reconnecting: tuple[Allocation, ...] = ()
    # When the next batch of a rolling update may go (a follow-up eval's wait_until); 0: none.
    rolling_followup_ns: int = 0

    def counts(self) -> dict[str, int]:
        return {name: len(getattr(self, name)) for name in BUCKETS}

    def log_fields(self) -> dict[str, int]:
        """Every bucket's size, zeros included (annotations, `drover job plan`, logs)."""
        out = self.counts()
        if self.rolling_followup_ns:
            out["rolling_followup_ns"] = self.rolling_followup_ns
        return out

    def is_no_op(self) -> bool:
        return not (
            self.place
            or self.stop
            or self.inplace
            or self.destructive
            or self.reschedule_later
            or self.disconnecting
            or self.rolling_followup_ns
        )

    def merge(self, other: GroupResult) -> GroupResult:
        """Both results' buckets together (for a caller that reconciles in parts)."""
        merged: dict[str, object] = {}
        for f in fields(self):
            if f.name == "group":
                continue
            if f.name == "rolling_followup_ns":
                times = [t for t in (self.rolling_followup_ns, other.rolling_followup_ns) if t]
                merged[f.name] = min(times) if times else 0
            else:
                merged[f.name] = (*getattr(self, f.name), *getattr(other, f.name))
        return GroupResult(self.group, **merged)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# Rescheduling (pure functions of the policy, the alloc's tracker and the time)


def _constant(policy: ReschedulePolicy, events: tuple[RescheduleEvent, ...]) -> int:
    return policy.delay_ns


def _exponential(policy: ReschedulePolicy, events: tuple[RescheduleEvent, ...]) -> int:
    # max(): a zero delay in the history (policy changed from 0) must not pin the series at 0.
    return max(events[-1].delay_ns * 2, policy.delay_ns)


def _fibonacci(policy: ReschedulePolicy, events: tuple[RescheduleEvent, ...]) -> int:
    if len(events) < 2:
        return policy.delay_ns
    last, before = events[-1].delay_ns, events[-2].delay_ns
    if before == policy.max_delay_ns and last == policy.delay_ns:
        return last  # the series was reset after a long healthy run: start it again
    return last + before


# How the next delay grows from the tracker (non-empty); unknown names behave as constant.
DELAY_FUNCTIONS: Final[Mapping[str, Callable[[ReschedulePolicy, tuple[RescheduleEvent, ...]], int]]] = {
    DELAY_CONSTANT: _constant,
    DELAY_EXPONENTIAL: _exponential,
    DELAY_FIBONACCI: _fibonacci,
}


def next_delay(policy: ReschedulePolicy, events: tuple[RescheduleEvent, ...], fail_ns: int) -> int:
    """The delay before the next reschedule, capped at ``max_delay_ns``.

    At the cap, the series resets to ``delay_ns`` when the alloc ran longer than the cap
    since its last reschedule: a long healthy run forgives earlier failures.
    """
    if not events:
        return policy.delay_ns
    delay = DELAY_FUNCTIONS.get(policy.delay_function, _constant)(policy, events)
    if policy.max_delay_ns > 0 and delay > policy.max_delay_ns:
        delay = policy.max_delay_ns
        if fail_ns - events[-1].reschedule_time_ns > delay:
            delay = policy.delay_ns
    return delay


@dataclass(frozen=True, slots=True)
class RescheduleDecision:
    eligible: bool
    at_ns: int = 0
    delay_ns: int = 0


def fail_time_ns(alloc: Allocation) -> int:
    """When the alloc failed: its tasks' latest finish, else its last modification."""
    finished = max((ts.finished_at_ns for ts in alloc.task_states.values()), default=0)
    return finished or alloc.modify_time_ns


def _attempts_in_interval(policy: ReschedulePolicy, events: Iterable[RescheduleEvent], fail_ns: int) -> int:
    if policy.interval_ns <= 0:
        return sum(1 for _ in events)  # no interval: attempts are a lifetime total
    return sum(1 for e in events if fail_ns - e.reschedule_time_ns < policy.interval_ns)


def next_reschedule(alloc: Allocation, policy: ReschedulePolicy | None) -> RescheduleDecision:
    """Whether ``alloc`` (failed) may be rescheduled under ``policy``, and when."""
    if policy is None or not (policy.unlimited or policy.attempts > 0):
        return RescheduleDecision(False)
    fail_ns = fail_time_ns(alloc)
    events = alloc.reschedule_events
    delay = next_delay(policy, events, fail_ns)
    if policy.unlimited or not events:
        eligible = True
    else:
        attempted = _attempts_in_interval(policy, events, fail_ns)
        eligible = attempted < policy.attempts and (policy.interval_ns <= 0 or delay < policy.interval_ns)
    return RescheduleDecision(eligible, fail_ns + delay, delay)


def _tasks_changed(alloc: Allocation, job: Job, group: TaskGroup, versions: Mapping[int, Job]) -> bool:
    """Whether ``alloc`` runs tasks other than ``job``'s: a version we no longer know counts
    as changed, as it does for updates."""
    return alloc.job_version != job.version and tasks_updated(
        versions.get(alloc.job_version), job, group.name
    )


def _replacement_events(
    alloc: Allocation,
    policy: ReschedulePolicy,
    decision: RescheduleDecision,
    now_ns: int,
    *,
    fresh: bool = False,
) -> tuple[RescheduleEvent, ...]:
    """The reschedule tracker a replacement of ``alloc`` carries: the attempts still inside
    the interval plus this one. ``fresh``: the job's tasks changed since ``alloc`` was placed,
    so its earlier failures say nothing about the new tasks and the count starts over, as
    Nomad resets the tracker on a job update."""
    event = RescheduleEvent(
        reschedule_time_ns=now_ns,
        prev_alloc_id=alloc.id,
        prev_node_id=alloc.node_id,
        delay_ns=decision.delay_ns,
    )
    past = () if fresh else alloc.reschedule_events
    if policy.unlimited:
        past = past[-(MAX_PAST_RESCHEDULE_EVENTS - 1) :] if MAX_PAST_RESCHEDULE_EVENTS > 1 else ()
    elif policy.interval_ns > 0:
        past = tuple(e for e in past if now_ns - e.reschedule_time_ns < policy.interval_ns)
    return (*past, event)


# ---------------------------------------------------------------------------------------
# The classification ladder


@dataclass(frozen=True, slots=True)
class AllocFacts:
    """What the ladder knows about one alloc, computed once before the rules run."""

    alloc: Allocation
    batch: bool
    node_gone: bool  # its node is down or deregistered
    node_disconnected: bool
    node_draining: bool
    replaced: bool  # some alloc names it as previous_allocation (or next_allocation is set)
    live_successor: bool  # a replacement down its chain is live (on any node)
    superseded: bool  # an alloc up its chain is live on a healthy node
    expired: bool  # unknown on a disconnected node for longer than lost_after

    @property
    def client_live(self) -> bool:
        return self.alloc.client_status in _LIVE_CLIENT

    @property
    def status(self) -> str:
        return self.alloc.client_status


@dataclass(frozen=True, slots=True)
class Rule:
    category: str
    applies: Callable[[AllocFacts], bool]
    why: str


CLASSIFICATION_RULES: Final[tuple[Rule, ...]] = (
    Rule(
        LOST,
        lambda f: f.node_gone and f.client_live,
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
        lambda f: f.node_disconnected and f.status == ALLOC_CLIENT_PENDING,
        "Never started on a node that stopped answering: nothing worth waiting for.",
    ),
    Rule(
        DISCONNECTING,
        lambda f: f.node_disconnected and f.status == ALLOC_CLIENT_RUNNING,
        "Running as far as we know on a node that missed heartbeats: mark it unknown and keep "
        "it, it may come back (docs/field-reports.md#field-report-3); replace it if "
        "disconnect.replace allows.",
    ),
    Rule(
        UNKNOWN,
        lambda f: f.node_disconnected,
        "Already unknown on a disconnected node: wait for reconnect, expiry or down. Before "
        "'migrate', so draining a disconnected node does not migrate what nobody can stop "
        "(Nomad #12469).",
    ),
    Rule(
        MIGRATE,
        lambda f: f.node_draining,
        "The operator drains its node: stop it and place it elsewhere.",
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


def classify(facts: AllocFacts) -> Rule:
    """The first rule of ``CLASSIFICATION_RULES`` that applies."""
    for rule in CLASSIFICATION_RULES:
        if rule.applies(facts):
            return rule
    raise AssertionError("the last classification rule matches everything")  # pragma: no cover


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
    (_MOVE_DISCONNECT, "Its node is away; stopping it costs nothing that runs for us."),
    (_MOVE_RESCHEDULE, "A failed alloc that would be replaced: skip the replacement."),
    (_FAILED_HELD, "Failed and not (yet) replaced: it serves nothing."),
    (_STAY, "Live and healthy: the highest indexes go, as the operator expects on scale-down."),
    (_STAY_UNKNOWN, "Unknown: may still be running; stopping it is a last resort."),
    (_DONE, "Finished batch work is progress: giving it up would re-run it on scale-up."),
)
_REMOVAL_RANK: Final[Mapping[str, int]] = {kind: i for i, (kind, _) in enumerate(REMOVAL_ORDER)}


@dataclass(slots=True)
class _Holder:
    alloc: Allocation
    kind: str
    decision: RescheduleDecision | None = None


@dataclass(slots=True)
class _Acc:
    """The buckets under construction."""

    place: list[Placement] = field(default_factory=list)
    stop: list[Stop] = field(default_factory=list)
    inplace: list[Allocation] = field(default_factory=list)
    destructive: list[Allocation] = field(default_factory=list)
    migrate: list[Allocation] = field(default_factory=list)
    lost: list[Allocation] = field(default_factory=list)
    ignore: list[Allocation] = field(default_factory=list)
    reschedule_now: list[Allocation] = field(default_factory=list)
    reschedule_later: list[DelayedReschedule] = field(default_factory=list)
    disconnecting: list[Allocation] = field(default_factory=list)
    reconnecting: list[Allocation] = field(default_factory=list)

    def result(self, group: str, rolling_followup_ns: int = 0) -> GroupResult:
        return GroupResult(
            group=group,
            place=tuple(self.place),
            stop=tuple(self.stop),
            inplace=tuple(self.inplace),
            destructive=tuple(self.destructive),
            migrate=tuple(self.migrate),
            lost=tuple(self.lost),
            ignore=tuple(self.ignore),
            reschedule_now=tuple(self.reschedule_now),
            reschedule_later=tuple(self.reschedule_later),
            disconnecting=tuple(self.disconnecting),
            reconnecting=tuple(self.reconnecting),
            rolling_followup_ns=rolling_followup_ns,
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


def _facts(
    alloc: Allocation,
    group: TaskGroup,
    batch: bool,
    tainted: Mapping[str, Node | None],
    lineage: _Lineage,
    now_ns: int,
) -> AllocFacts:
    in_tainted = alloc.node_id in tainted
    node = tainted.get(alloc.node_id)
    disconnected = node is not None and node.status == NODE_STATUS_DISCONNECTED
    lost_after = group.disconnect.lost_after_ns if group.disconnect is not None else 0
    since = last_unknown_ns(alloc)
    return AllocFacts(
        alloc=alloc,
        batch=batch,
        node_gone=in_tainted and (node is None or node.status == NODE_STATUS_DOWN),
        node_disconnected=disconnected,
        node_draining=node is not None and node.drain_strategy is not None,
        replaced=lineage.replaced(alloc),
        live_successor=bool(lineage.live_successors(alloc)) if not in_tainted else False,
        superseded=lineage.has_healthy_live_ancestor(alloc, tainted),
        expired=(
            disconnected
            and alloc.client_status == ALLOC_CLIENT_UNKNOWN
            and lost_after > 0
            and since > 0
            and since + lost_after <= now_ns
        ),
    )


# ---------------------------------------------------------------------------------------
# The reconciler


def reconcile_group(
    job: Job,
    group: TaskGroup,
    allocs: Iterable[Allocation],
    tainted_nodes: Mapping[str, Node | None],
    now_ns: int,
    *,
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
    ``tainted_nodes``: nodes holding allocs that are down, disconnected or draining; a
    deregistered node maps to None. Any other node is healthy.
    ``deployment_paused``: place only replacements (lost, reschedule, migrate, disconnect);
    no new slots, no destructive updates.
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
    versions = job_versions or {}
    score = score or _no_score
    mine = sorted((a for a in allocs if a.task_group == group.name), key=_sort_key)
    lineage = _Lineage(mine)
    batch = job.type == JOB_TYPE_BATCH
    disconnect = group.disconnect or DisconnectStrategy()

    # 1. Classify.
    by_category: dict[str, list[Allocation]] = defaultdict(list)
    for alloc in mine:
        facts = _facts(alloc, group, batch, tainted_nodes, lineage, now_ns)
        by_category[classify(facts).category].append(alloc)

    acc = _Acc()
    for alloc in by_category[LOST]:
        node = tainted_nodes.get(alloc.node_id)
        if node is None or node.status == NODE_STATUS_DOWN:
            desc = DESC_LOST
        elif alloc.client_status == ALLOC_CLIENT_UNKNOWN:
            desc = DESC_EXPIRED
        else:
            desc = DESC_NEVER_STARTED
        acc.stop.append(Stop(alloc, desc, client_status=ALLOC_CLIENT_LOST))
        acc.lost.append(alloc)

    for alloc in by_category[SUPERSEDED]:
        acc.stop.append(Stop(alloc, DESC_RECONNECT_LOSER))

    # 2. A stopped job: stop everything live, place nothing.
    if _job_stopped(job):
        for category in (UNTAINTED, MIGRATE, DISCONNECTING, UNKNOWN, RECONNECTING):
            for alloc in by_category[category]:
                acc.stop.append(Stop(alloc, DESC_JOB_STOPPED))
        acc.ignore.extend((*by_category[FAILED], *by_category[DONE]))
        return acc.result(group.name)

    # 3. Reconnects: the original against every live replacement down its chain. A
    #    replacement on a tainted node always loses (it is lost, away or leaving anyway).
    stopped_ids: set[str] = set()
    lost_ids = {a.id for a in by_category[LOST]}
    kept_reconnecting: list[Allocation] = []

    def lose(alloc: Allocation, description: str) -> None:
        stopped_ids.add(alloc.id)
        if alloc.id not in lost_ids:  # a lost one is stopped already, as lost
            acc.stop.append(Stop(alloc, description))

    for original in by_category[RECONNECTING]:
        if original.id in stopped_ids:
            continue
        rivals = [p for p in lineage.live_successors(original) if p.id not in stopped_ids]
        winners = [
            p
            for p in rivals
            if p.node_id not in tainted_nodes and _replacement_wins(disconnect, original, p, score)
        ]
        best = max(
            winners, key=lambda p: (p.job_version, score(p) or 0.0, p.create_index, p.id), default=None
        )
        if best is None:
            kept_reconnecting.append(original)
        else:
            lose(original, DESC_NOT_NEEDED)
        for p in rivals:
            if best is None or p.id != best.id:
                lose(p, DESC_RECONNECT_LOSER)
    acc.reconnecting.extend(kept_reconnecting)

    # 4. Slot holders.
    holders: list[_Holder] = []
    for alloc in by_category[LOST]:
        if (
            alloc.desired_status == ALLOC_DESIRED_RUN
            and not lineage.replaced(alloc)
            and alloc.id not in stopped_ids
        ):
            holders.append(_Holder(alloc, _MOVE_LOST))
    for alloc in by_category[MIGRATE]:
        if alloc.id not in stopped_ids:
            holders.append(_Holder(alloc, _MOVE_MIGRATE))
    for alloc in by_category[FAILED]:
        decision = next_reschedule(alloc, group.reschedule)
        due = decision.eligible and (
            (bool(eval_id) and alloc.followup_eval_id == eval_id)
            or decision.at_ns - now_ns <= RESCHEDULE_WINDOW_NS
        )
        holders.append(_Holder(alloc, _MOVE_RESCHEDULE if due else _FAILED_HELD, decision))
    disconnecting_ids = {a.id for a in by_category[DISCONNECTING]}
    for alloc in by_category[DISCONNECTING] + by_category[UNKNOWN]:
        if alloc.id in stopped_ids:
            continue
        if lineage.replaced(alloc):
            # Its replacement (or that one's successor) holds the slot; it waits for its node.
            if alloc.id not in disconnecting_ids:
                acc.ignore.append(alloc)
            continue
        holders.append(_Holder(alloc, _MOVE_DISCONNECT if disconnect.replace else _STAY_UNKNOWN))
    for alloc in by_category[UNTAINTED] + kept_reconnecting:
        if alloc.id not in stopped_ids:
            holders.append(_Holder(alloc, _STAY))
    for alloc in by_category[DONE]:
        holders.append(_Holder(alloc, _DONE))

    # Too many: REMOVAL_ORDER, then highest index, then the older version, then the newest.
    removed: list[_Holder] = []
    excess = len(holders) - max(group.count, 0)
    if excess > 0:
        ranked = sorted(
            holders,
            key=lambda h: (
                _REMOVAL_RANK[h.kind],
                -h.alloc.index,
                h.alloc.job_version,
                -h.alloc.create_index,
                h.alloc.id,
            ),
        )
        removed = ranked[:excess]
        removed_ids = {h.alloc.id for h in removed}
        holders = [h for h in holders if h.alloc.id not in removed_ids]
    for h in removed:
        if h.kind in (_MOVE_MIGRATE, _MOVE_DISCONNECT, _STAY, _STAY_UNKNOWN):
            acc.stop.append(Stop(h.alloc, DESC_NOT_NEEDED))
            stopped_ids.add(h.alloc.id)
        elif h.kind != _MOVE_LOST:  # a lost one is already stopped as lost
            acc.ignore.append(h.alloc)
    acc.reconnecting[:] = [a for a in acc.reconnecting if a.id not in stopped_ids]
    acc.disconnecting.extend(a for a in by_category[DISCONNECTING] if a.id not in stopped_ids)
    # Allocs whose bucket already says what happens to them: not also "ignore".
    reported = {a.id for a in (*acc.reconnecting, *acc.disconnecting)}

    # 5. Movers take their own slot again; free slots are filled lowest index first.
    update_candidates: list[_Holder] = []
    for h in holders:
        a = h.alloc
        if h.kind == _MOVE_LOST:
            acc.place.append(Placement(a.name, a.index, PLACE_LOST, previous=a))
        elif h.kind == _MOVE_MIGRATE:
            acc.stop.append(Stop(a, DESC_MIGRATING))
            acc.migrate.append(a)
            acc.place.append(Placement(a.name, a.index, PLACE_MIGRATE, previous=a))
        elif h.kind == _MOVE_DISCONNECT:
            acc.place.append(Placement(a.name, a.index, PLACE_DISCONNECT, previous=a))
        elif h.kind == _MOVE_RESCHEDULE:
            assert h.decision is not None and group.reschedule is not None
            acc.reschedule_now.append(a)
            acc.place.append(
                Placement(
                    a.name,
                    a.index,
                    PLACE_RESCHEDULE,
                    previous=a,
                    reschedule_events=_replacement_events(
                        a, group.reschedule, h.decision, now_ns, fresh=_tasks_changed(a, job, group, versions)
                    ),
                    stop_previous=Stop(a, DESC_RESCHEDULED),
                    penalty_node_ids=frozenset({a.node_id}),
                )
            )
        elif h.kind in (_STAY, _FAILED_HELD):
            update_candidates.append(h)
        elif a.id not in reported:
            acc.ignore.append(a)
    if not deployment_paused:
        used = {h.alloc.index for h in holders}
        free = (i for i in range(len(used) + group.count) if i not in used)
        for _ in range(group.count - len(holders)):
            index = next(free)
            acc.place.append(Placement(alloc_name(job.id, group.name, index), index, PLACE_NEW))

    # 6. Updates.
    destructive: list[_Holder] = []
    for h in update_candidates:
        a = h.alloc
        stale = a.job_version != job.version
        if stale and (
            a.node_id in infeasible_node_ids or tasks_updated(versions.get(a.job_version), job, group.name)
        ):
            destructive.append(h)
        elif stale and h.kind == _STAY and a.node_id not in unplaceable_node_ids:
            acc.inplace.append(a)
        else:
            _hold(acc, h, now_ns, reported)
    # The ones serving nothing first (failed, then pending), then by index.
    destructive.sort(
        key=lambda h: (
            h.kind != _FAILED_HELD,
            h.alloc.client_status != ALLOC_CLIENT_PENDING,
            h.alloc.index,
            h.alloc.id,
        )
    )
    budget, in_flight_until = _rolling_budget(job, group, mine, lineage, now_ns, deployment_paused)
    admitted, deferred = destructive[:budget], destructive[budget:]
    for h in admitted:
        a = h.alloc
        acc.stop.append(Stop(a, DESC_UPDATING))
        acc.destructive.append(a)
        acc.place.append(Placement(a.name, a.index, PLACE_DESTRUCTIVE, previous=a))
    for h in deferred:
        _hold(acc, h, now_ns, reported)
    rolling_followup_ns = 0
    if deferred and not deployment_paused:
        times = list(in_flight_until)
        if admitted:
            times.append(now_ns + stagger_ns(job, group))
        rolling_followup_ns = min(times)  # non-empty: a zero budget means replacements in flight

    acc.place.sort(key=lambda p: (p.index, p.reason, p.previous.id if p.previous is not None else ""))
    return acc.result(group.name, rolling_followup_ns)


def _hold(acc: _Acc, h: _Holder, now_ns: int, reported: set[str]) -> None:
    """A holder left as it is; a failed one may still need its follow-up eval."""
    decision = h.decision
    if (
        h.kind == _FAILED_HELD
        and decision is not None
        and decision.eligible
        and not h.alloc.followup_eval_id
        and decision.at_ns > now_ns
    ):
        acc.reschedule_later.append(DelayedReschedule(h.alloc, decision.at_ns))
    elif h.alloc.id not in reported:
        acc.ignore.append(h.alloc)


def _rolling_budget(
    job: Job,
    group: TaskGroup,
    allocs: list[Allocation],
    lineage: _Lineage,
    now_ns: int,
    paused: bool,
) -> tuple[int, list[int]]:
    """(destructive updates allowed now, when each in-flight rollout replacement expires).

    In flight: a live alloc of the current version that replaced an older-version alloc less
    than ``stagger`` ago. Only service jobs roll (Nomad ignores ``update`` for batch jobs).
    """
    if paused:
        return 0, []
    limit = max_parallel(job, group) if job.type == JOB_TYPE_SERVICE else 0
    if limit == 0:
        return len(allocs) + 1, []  # unlimited
    stagger = stagger_ns(job, group)
    until: list[int] = []
    for a in allocs:
        if a.terminal() or a.job_version != job.version or not a.previous_allocation:
            continue
        prev = lineage.get(a.previous_allocation)
        if prev is None or prev.job_version == job.version:
            continue
        if a.create_time_ns + stagger > now_ns:
            until.append(a.create_time_ns + stagger)
    return max(0, limit - len(until)), until
