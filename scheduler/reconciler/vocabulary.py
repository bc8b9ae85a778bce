"""The words both reconcilers use: buckets, node situations, rules, plan descriptions, and
the update and reconnect questions they both ask (scheduler/README.md defines each word).

A reconciler reads every alloc of a job, asks the same few questions of each (where does
its node stand, is it outdated, does the change need a restart, has its disconnect lasted
too long) and answers with a bucket. The generic reconciler (``reconciler.generic``, one
task group of a service or batch job) and the system one (``reconciler.system``, every
node of a system or sysbatch job) ask them in different orders, so each keeps its own
ladder, but both write it with this module's ``Rule``, put allocs in this module's buckets
and describe stops with this module's descriptions.

*Tainted* means one thing everywhere, as in Nomad's ``taintedNodes``: the node is down,
disconnected or draining, or was deregistered. Its allocs must move, wait or be marked.
A node that is merely not taking this job's allocs now (ineligible, initializing, outside
the job's datacenters or constraints) is not tainted: its allocs stay until an update
moves them (``AT_UNPLACEABLE``, ``AT_ELSEWHERE``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from drover.scheduler.structs import (
    ALLOC_CLIENT_UNKNOWN,
    NODE_STATUS_DISCONNECTED,
    NODE_STATUS_DOWN,
    Allocation,
    Job,
    NetworkResource,
    Node,
    Resources,
    Task,
    TaskGroup,
)

__all__ = [
    "AT_DISCONNECTED",
    "AT_DOWN",
    "AT_DRAINING",
    "AT_ELSEWHERE",
    "AT_MISSING",
    "AT_READY",
    "AT_UNPLACEABLE",
    "DEFERRED",
    "DESC_DUPLICATE",
    "DESC_EXPIRED",
    "DESC_JOB_STOPPED",
    "DESC_LOST",
    "DESC_MIGRATING",
    "DESC_NEVER_STARTED",
    "DESC_NODE_NOT_ELIGIBLE",
    "DESC_NODE_TAINTED",
    "DESC_NOT_NEEDED",
    "DESC_RECONNECT_LOSER",
    "DESC_RESCHEDULED",
    "DESC_UNKNOWN",
    "DESC_UPDATING",
    "DESTRUCTIVE_GROUP_FIELDS",
    "DESTRUCTIVE_TASK_FIELDS",
    "DISCONNECTING",
    "GONE_SITUATIONS",
    "IGNORE",
    "LOST",
    "MIGRATE",
    "PLACE",
    "RECONNECTING",
    "RESCHEDULE_LATER",
    "RESCHEDULE_NOW",
    "STOP",
    "UPDATE_DESTRUCTIVE",
    "UPDATE_INPLACE",
    "AllocFacts",
    "Rule",
    "classify",
    "disconnect_expired",
    "last_unknown_ns",
    "max_parallel",
    "stagger_ns",
    "tainted_situation",
    "tasks_updated",
]

# ---------------------------------------------------------------------------------------
# Buckets: where a reconciler puts each alloc (and each open slot). Annotations, `drover
# job plan` and the tests count them by these names.

PLACE: Final = "place"  # a new alloc for a slot
STOP: Final = "stop"
UPDATE_INPLACE: Final = "update_inplace"  # same alloc ID, new job version
UPDATE_DESTRUCTIVE: Final = "update_destructive"  # stop and place the new version
MIGRATE: Final = "migrate"  # leaves a draining node
LOST: Final = "lost"  # its node is down or gone, or stayed disconnected too long
IGNORE: Final = "ignore"  # nothing to do
DISCONNECTING: Final = "disconnecting"  # marked unknown, still desired to run
RECONNECTING: Final = "reconnecting"  # unknown, and its node is back: kept
# Generic only: a failed alloc replaced now, or by a follow-up eval at its reschedule time.
RESCHEDULE_NOW: Final = "reschedule_now"
RESCHEDULE_LATER: Final = "reschedule_later"
# System only: destructive updates over the max_parallel budget, for the next batch. (The
# generic reconciler reports the ones it holds back under ignore.)
DEFERRED: Final = "deferred"

# ---------------------------------------------------------------------------------------
# Where an alloc's node stands for the alloc's group

AT_READY: Final = "ready"  # takes placements of the group: ready, eligible, in its DCs and constraints
AT_ELSEWHERE: Final = "elsewhere"  # ready and eligible, but the group's DCs or constraints reject it
AT_UNPLACEABLE: Final = "unplaceable"  # takes no placements now: ineligible (no drain) or initializing
# Tainted:
AT_DRAINING: Final = "draining"
AT_DISCONNECTED: Final = "disconnected"
AT_DOWN: Final = "down"
AT_MISSING: Final = "missing"  # deregistered: the caller maps its ID to None
# What ran there is gone with the node.
GONE_SITUATIONS: Final = frozenset({AT_DOWN, AT_MISSING})


def tainted_situation(node: Node | None) -> str | None:
    """Where an alloc on a tainted ``node`` stands, or None when the node is not tainted.

    None is a deregistered node. Down comes before disconnected and disconnected before
    draining: a drain cannot move what nobody can reach (Nomad #12469).
    """
    if node is None:
        return AT_MISSING
    if node.status == NODE_STATUS_DOWN:
        return AT_DOWN
    if node.status == NODE_STATUS_DISCONNECTED:
        return AT_DISCONNECTED
    if node.drain_strategy is not None:
        return AT_DRAINING
    return None


# ---------------------------------------------------------------------------------------
# Descriptions the plan writes (desired_description), one per reason

DESC_NOT_NEEDED: Final = "alloc not needed due to job update"
DESC_JOB_STOPPED: Final = "alloc not needed as job is stopped"
DESC_UPDATING: Final = "alloc is being updated due to job update"
DESC_LOST: Final = "alloc is lost since its node is down"
DESC_EXPIRED: Final = "alloc is lost since its node stayed disconnected past lost_after"
DESC_UNKNOWN: Final = "alloc is unknown since its node is disconnected"
# Generic only
DESC_MIGRATING: Final = "alloc is being migrated"
DESC_NEVER_STARTED: Final = "alloc is lost since its node disconnected before it started"
DESC_RESCHEDULED: Final = "alloc was rescheduled because it failed"
DESC_RECONNECT_LOSER: Final = "alloc not needed due to disconnected client reconnect"
# System only (Nomad's wording: a system alloc leaves a draining node by being stopped)
DESC_NODE_TAINTED: Final = "alloc not needed as node is tainted"
DESC_NODE_NOT_ELIGIBLE: Final = "alloc not needed as node is no longer eligible for the job"
DESC_DUPLICATE: Final = "alloc duplicated on node"

# ---------------------------------------------------------------------------------------
# Classification ladders


@dataclass(frozen=True, slots=True)
class AllocFacts:
    """What every ladder knows about an alloc, computed once before its rules run; each
    reconciler's facts add what its own rules ask."""

    alloc: Allocation
    where: str  # an AT_* situation of its node for its group
    expired: bool  # unknown on a disconnected node for longer than the group's lost_after


FactsT = TypeVar("FactsT", bound=AllocFacts)


@dataclass(frozen=True, slots=True)
class Rule(Generic[FactsT]):
    """One row of a ladder: an alloc for which ``applies`` holds goes to ``category`` (a
    bucket, or a reconciler's own step), and ``why`` says so for the reader."""

    category: str
    applies: Callable[[FactsT], bool]
    why: str
    reason: str = ""  # the plan's description, for a category that stops the alloc


def classify(rules: Sequence[Rule[FactsT]], facts: FactsT) -> Rule[FactsT]:
    """The first of ``rules`` that applies (a ladder ends in a rule that always does)."""
    for rule in rules:
        if rule.applies(facts):
            return rule
    raise AssertionError("the last classification rule matches everything")  # pragma: no cover


# ---------------------------------------------------------------------------------------
# Updates: destructive or in place, and how fast


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


def max_parallel(job: Job, group: TaskGroup) -> int:
    """The group's rolling limit: its own update block, else the job's; 0 = unlimited."""
    strategy = group.update or job.update
    return strategy.max_parallel if strategy is not None and strategy.max_parallel > 0 else 0


def stagger_ns(job: Job, group: TaskGroup) -> int:
    """How long a batch of destructive updates settles before the next may start."""
    strategy = group.update or job.update
    return strategy.stagger_ns if strategy is not None else 0


# ---------------------------------------------------------------------------------------
# Disconnects


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


def disconnect_expired(alloc: Allocation, group: TaskGroup | None, where: str, now_ns: int) -> bool:
    """``alloc`` has been unknown on a disconnected node past its group's
    ``disconnect.lost_after`` (0: it never expires by itself; the node going down does it)."""
    if where != AT_DISCONNECTED or alloc.client_status != ALLOC_CLIENT_UNKNOWN or group is None:
        return False
    lost_after = group.disconnect.lost_after_ns if group.disconnect is not None else 0
    since = last_unknown_ns(alloc)
    return lost_after > 0 and since > 0 and since + lost_after <= now_ns
