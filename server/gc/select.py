"""What may be garbage collected: a pure function of a snapshot, the time and the thresholds.

The rules are Nomad's (nomad/core_sched.go: evalGC, jobGC, nodeGC, deploymentGC), with
drover's times in place of Nomad's raft-index timetable: every object below carries the
time the leader stamped on its last change (``modify_time_ns``; a node's
``status_updated_at_ns``; a job's newest of its submit time and its evals' and allocs'
times), and "older than the threshold" is ``time <= now - threshold``. ``now`` is the
leader's clock read once by the caller; the raft entry carries IDs only, so apply never
reads a clock (server/fsm.py ``apply_gc``).

- **Evals**: terminal, older than ``eval`` (``batch_eval`` for batch jobs' evals), and every
  alloc of the eval collectable too; the eligible allocs of an eval that stays are collected
  anyway, as Nomad's gcEval returns them. A batch eval of a live batch job keeps its
  current version's allocs (without them the scheduler would run the batch work again):
  only the finished allocs of older versions go, and the eval once it has no other. Evals of
  a dead job are left to job GC, which takes the job with them (Nomad lets eval GC take a
  stopped one's; here deleting them alone could turn the dead job pending in the store's
  status rule, which has no "evals were reaped" case).
- **Allocs** (Nomad's allocGCEligible): terminal, older than the threshold, not running on
  the client; and if the job is still live and not stopped, a failed alloc the group would
  reschedule only once replaced (``next_allocation``) or, with limited attempts, once its
  last reschedule is older than the policy's interval.
- **Jobs**: dead (stopped with nothing running, or every alloc terminal), older than
  ``job``, every eval terminal and every alloc collectable, no active deployment. Periodic
  and parameterized parents only once stopped: their children are what runs. Dead periodic
  and dispatched children are ordinary dead batch jobs here. A job goes with its evals,
  allocs, deployments, versions, summary and launch record (one raft entry holds them all).
- **Nodes**: down for longer than ``node`` with no alloc that is not terminal.
- **Deployments**: terminal, older than ``deployment``, no live alloc of the job in it, and
  not the newest deployment of a job that stays (the scheduler reads it).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from drover.scheduler.structs import (
    ALLOC_CLIENT_FAILED,
    ALLOC_CLIENT_RUNNING,
    ALLOC_DESIRED_RUN,
    JOB_STATUS_DEAD,
    JOB_TYPE_BATCH,
    NODE_STATUS_DOWN,
    Allocation,
    Evaluation,
    Job,
)
from drover.server.state_store import Snapshot

__all__ = [
    "FORCE",
    "Garbage",
    "JobGarbage",
    "Ref",
    "Thresholds",
    "alloc_collectable",
    "batches",
    "select_garbage",
]

HOUR_NS: Final = 3_600_000_000_000
# Objects per raft entry: an entry of this many IDs stays far below raft's message size and
# applies in milliseconds, so a large backlog never stalls the apply loop.
MAX_OBJECTS_PER_ENTRY: Final = 2_000


@dataclass(frozen=True, slots=True)
class Thresholds:
    """How long an object stays after it became terminal, in nanoseconds (Nomad's defaults)."""

    eval_ns: int = HOUR_NS
    batch_eval_ns: int = 24 * HOUR_NS
    job_ns: int = 4 * HOUR_NS
    node_ns: int = 24 * HOUR_NS
    deployment_ns: int = HOUR_NS


# `drover system gc`: everything eligible now, as Nomad's forced GC uses the newest index.
FORCE: Final = Thresholds(eval_ns=0, batch_eval_ns=0, job_ns=0, node_ns=0, deployment_ns=0)


@dataclass(frozen=True, slots=True)
class Ref:
    """One object as selected; apply deletes it only if its modify index is still this."""

    id: str
    modify_index: int


@dataclass(frozen=True, slots=True)
class JobGarbage:
    """A dead job, collected whole; the counts say how much goes with it (for batching)."""

    namespace: str
    job_id: str
    modify_index: int
    evals: int = 0
    allocs: int = 0
    deployments: int = 0

    @property
    def weight(self) -> int:
        return 1 + self.evals + self.allocs + self.deployments


@dataclass(frozen=True, slots=True)
class Garbage:
    evals: tuple[Ref, ...] = ()
    allocs: tuple[Ref, ...] = ()
    jobs: tuple[JobGarbage, ...] = ()
    nodes: tuple[Ref, ...] = ()
    deployments: tuple[Ref, ...] = ()

    @property
    def size(self) -> int:
        return (
            len(self.evals)
            + len(self.allocs)
            + sum(j.weight for j in self.jobs)
            + len(self.nodes)
            + len(self.deployments)
        )

    def empty(self) -> bool:
        return not (self.evals or self.allocs or self.jobs or self.nodes or self.deployments)


def select_garbage(snap: Snapshot, now_ns: int, thresholds: Thresholds) -> Garbage:
    """Everything collectable in ``snap`` at ``now_ns``, each kind sorted (the same state
    gives the same entries on any leader)."""
    jobs = _dead_jobs(snap, now_ns - thresholds.job_ns, now_ns)
    collected = {(j.namespace, j.job_id) for j in jobs}
    evals, allocs = _evals_and_allocs(snap, now_ns, thresholds, collected)
    return Garbage(
        evals=tuple(sorted(evals, key=lambda r: r.id)),
        allocs=tuple(sorted(allocs, key=lambda r: r.id)),
        jobs=tuple(sorted(jobs, key=lambda j: (j.namespace, j.job_id))),
        nodes=_down_nodes(snap, now_ns - thresholds.node_ns),
        deployments=_deployments(snap, now_ns - thresholds.deployment_ns, collected),
    )


def batches(garbage: Garbage, limit: int = MAX_OBJECTS_PER_ENTRY) -> Iterator[Garbage]:
    """``garbage`` cut into pieces of at most ``limit`` objects (a job counts with what goes
    with it and is never cut: a job larger than ``limit`` is a piece of its own)."""
    piece = _Piece()
    for job in garbage.jobs:
        if piece.size and piece.size + job.weight > limit:
            yield piece.done()
            piece = _Piece()
        piece.jobs.append(job)
        piece.size += job.weight
    for kind in ("evals", "allocs", "nodes", "deployments"):
        for ref in getattr(garbage, kind):
            if piece.size >= limit:
                yield piece.done()
                piece = _Piece()
            getattr(piece, kind).append(ref)
            piece.size += 1
    if piece.size:
        yield piece.done()


@dataclass(slots=True)
class _Piece:
    evals: list[Ref] = field(default_factory=list)
    allocs: list[Ref] = field(default_factory=list)
    jobs: list[JobGarbage] = field(default_factory=list)
    nodes: list[Ref] = field(default_factory=list)
    deployments: list[Ref] = field(default_factory=list)
    size: int = 0

    def done(self) -> Garbage:
        return Garbage(
            evals=tuple(self.evals),
            allocs=tuple(self.allocs),
            jobs=tuple(self.jobs),
            nodes=tuple(self.nodes),
            deployments=tuple(self.deployments),
        )


# ---------------------------------------------------------------------------------------


def alloc_collectable(alloc: Allocation, job: Job | None, cutoff_ns: int, now_ns: int) -> bool:
    """Nomad's allocGCEligible: terminal and old, and not a failed alloc the rescheduler
    still reads (its reschedule history is carried forward only to its replacement)."""
    if not alloc.terminal() or alloc.modify_time_ns > cutoff_ns:
        return False
    if alloc.client_status == ALLOC_CLIENT_RUNNING:
        return False  # told to stop, still stopping on its node
    if job is None or job.stop or job.status == JOB_STATUS_DEAD:
        return True
    group = job.lookup_group(alloc.task_group)
    if group is None:
        return True
    if alloc.desired_status != ALLOC_DESIRED_RUN or alloc.client_status != ALLOC_CLIENT_FAILED:
        return True
    policy = group.reschedule
    if policy is None or (not policy.unlimited and policy.attempts == 0):
        return True  # never rescheduled
    if alloc.next_allocation:
        return True  # replaced: the history went with it
    if policy.unlimited or not alloc.reschedule_events:
        return False
    return now_ns - alloc.reschedule_events[-1].reschedule_time_ns > policy.interval_ns


def _older_version_terminal(allocs: list[Allocation], job: Job, cutoff_ns: int) -> list[Allocation]:
    """Nomad's olderVersionTerminalAllocs: a live batch job's finished allocs of versions
    before its current one (the current version's must stay, or they would run again)."""
    return [
        a
        for a in allocs
        if a.create_index < job.job_modify_index and a.modify_time_ns <= cutoff_ns and a.terminal()
    ]


def _eval_collectable(ev: Evaluation, cutoff_ns: int) -> bool:
    return ev.terminal() and ev.modify_time_ns <= cutoff_ns


def _evals_and_allocs(
    snap: Snapshot, now_ns: int, thresholds: Thresholds, collected: set[tuple[str, str]]
) -> tuple[list[Ref], list[Ref]]:
    evals: list[Ref] = []
    allocs: list[Ref] = []
    for ev in snap.evals():
        key = (ev.namespace, ev.job_id)
        if key in collected:
            continue
        cutoff = now_ns - (thresholds.batch_eval_ns if ev.type == JOB_TYPE_BATCH else thresholds.eval_ns)
        if not _eval_collectable(ev, cutoff):
            continue
        job = snap.job(*key) if ev.job_id else None
        if job is not None and job.status == JOB_STATUS_DEAD:
            continue
        eval_allocs = snap.allocs_by_eval(ev.id)
        if job is not None and ev.type == JOB_TYPE_BATCH:
            older = _older_version_terminal(eval_allocs, job, cutoff)
            allocs.extend(Ref(a.id, a.modify_index) for a in older)
            if len(older) == len(eval_allocs):
                evals.append(Ref(ev.id, ev.modify_index))
            continue
        whole = True
        for alloc in eval_allocs:
            if alloc_collectable(alloc, job, cutoff, now_ns):
                allocs.append(Ref(alloc.id, alloc.modify_index))
            else:
                whole = False
        if whole:
            evals.append(Ref(ev.id, ev.modify_index))
    return evals, allocs


def _dead_jobs(snap: Snapshot, cutoff_ns: int, now_ns: int) -> list[JobGarbage]:
    found: list[JobGarbage] = []
    for job in snap.jobs():
        if job.status != JOB_STATUS_DEAD or (job.is_template() and not job.stop):
            continue
        if job.submit_time_ns > cutoff_ns:
            continue
        evals = snap.evals_by_job(job.namespace, job.id)
        if not all(_eval_collectable(ev, cutoff_ns) for ev in evals):
            continue
        allocs = snap.allocs_by_job(job.namespace, job.id)
        if not all(alloc_collectable(a, job, cutoff_ns, now_ns) for a in allocs):
            continue
        deployments = snap.deployments_by_job(job.namespace, job.id)
        if any(d.active() for d in deployments):
            continue
        found.append(
            JobGarbage(
                job.namespace,
                job.id,
                job.modify_index,
                evals=len(evals),
                allocs=len(allocs),
                deployments=len(deployments),
            )
        )
    return found


def _down_nodes(snap: Snapshot, cutoff_ns: int) -> tuple[Ref, ...]:
    return tuple(
        Ref(node.id, node.modify_index)
        for node in sorted(snap.nodes(), key=lambda n: n.id)
        if node.status == NODE_STATUS_DOWN
        and node.status_updated_at_ns <= cutoff_ns
        and all(a.terminal() for a in snap.allocs_by_node(node.id))
    )


def _deployments(snap: Snapshot, cutoff_ns: int, collected: set[tuple[str, str]]) -> tuple[Ref, ...]:
    refs: list[Ref] = []
    for d in snap.deployments():
        key = (d.namespace, d.job_id)
        if key in collected or d.active() or d.modify_time_ns > cutoff_ns:
            continue
        if snap.job(*key) is not None:
            newest = snap.latest_deployment(*key)
            if newest is not None and newest.id == d.id:
                continue
        if any(a.deployment_id == d.id and not a.terminal() for a in snap.allocs_by_job(*key)):
            continue
        refs.append(Ref(d.id, d.modify_index))
    return tuple(sorted(refs, key=lambda r: r.id))
