"""The live invariant checker: docs/design.md's state invariants as one pure function over ``Tables``.

``check_invariants(tables)`` returns every violation it finds in one frozen state; an
empty list means the state is sound. It reads nothing but its argument (no clock, no I/O),
so the same function serves the leader's timer, the ``Operator.Invariants`` RPC (any
server, over its own state), the chaos checker (over a saved snapshot) and unit tests.

What one state can tell:

* docs/design.md#invariant-1 -- at most ``count`` live, desired-running allocs per (system or sysbatch
  job, group, node);
* running-on-node -- after a snapshot restore and its grace period, no alloc the state holds
  as running is unconfirmed on a node that registered since (needs the server's restore
  mark and the time, so only the leader's timer and ``Operator.Invariants`` check it);
* docs/design.md#invariant-2 -- every job summary counter equals a recount from the allocs (queued
  excluded: it comes from evals) and the children counts equal a recount of the child
  jobs; no counter is negative; every job has a summary and every summary a job. Counts
  are of what exists (Nomad's rule): garbage collection removes a child or an alloc and
  its count together (server/fsm.py ``apply_gc``).

What it cannot tell, and who checks it instead: digests equal across servers (invariant 3:
``drover operator state``, the chaos checker), acknowledged writes present (4: the chaos
history), alloc identity across a reconnect (5: the client tests), bounded plan
rejections (6: the applier's rejection tracker and its log lines), evals stuck pending
(needs a clock: the chaos checker after settling).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields
from typing import Final

from drover.scheduler.structs import (
    ALLOC_DESIRED_RUN,
    JOB_STATUS_DEAD,
    JOB_STATUS_PENDING,
    JOB_STATUS_RUNNING,
    JOB_TYPE_SYSBATCH,
    JOB_TYPE_SYSTEM,
    JobChildrenSummary,
    TaskGroupSummary,
)
from drover.server.restore_followup import RESTORE_GRACE_NS, RestoreMark, unconfirmed_allocs
from drover.server.snapshot import recount_summaries
from drover.server.state_store import JobKey, Tables

__all__ = [
    "INVARIANTS",
    "INVARIANT_RUNNING_ON_NODE",
    "INVARIANT_SUMMARIES",
    "INVARIANT_SYSTEM_ALLOCS",
    "Violation",
    "check_invariants",
]

INVARIANT_SYSTEM_ALLOCS: Final = "system-allocs-per-node"
INVARIANT_SUMMARIES: Final = "job-summaries"
INVARIANT_RUNNING_ON_NODE: Final = "running-on-node"
INVARIANTS: Final = (INVARIANT_SYSTEM_ALLOCS, INVARIANT_SUMMARIES, INVARIANT_RUNNING_ON_NODE)

_GROUP_COUNTERS: Final = tuple(f.name for f in fields(TaskGroupSummary))
_CHILD_BUCKETS: Final = (JOB_STATUS_PENDING, JOB_STATUS_RUNNING, JOB_STATUS_DEAD)


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant: which one, the object it is about, and what is wrong."""

    invariant: str
    subject: str
    message: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.subject}: {self.message}"


def check_invariants(tables: Tables, restore: RestoreMark | None = None, now_ns: int = 0) -> list[Violation]:
    """Every system/sysbatch group with more than ``count`` live allocs on a node, and every job
    summary that differs from a recount or is negative, in a stable order; with ``restore``
    (this server's last snapshot restore) and the time, every alloc held running that its
    node does not run."""
    found = [*_system_allocs(tables), *_summaries(tables)]
    if restore is not None:
        found.extend(_running_on_node(tables, restore, now_ns))
    return found


def _running_on_node(tables: Tables, restore: RestoreMark, now_ns: int) -> list[Violation]:
    """An alloc the state holds as running is running on its node: after a restore, once the
    grace period is over, no alloc the restored state held running may still be unconfirmed
    on a node whose client has registered (and so resent everything it runs) since. The
    leader marks such allocs lost at the end of the grace period; one left over means that
    follow-up did not happen (server/restore_followup.py)."""
    if restore.age_ns(now_ns) < RESTORE_GRACE_NS:
        return []
    return [
        Violation(
            INVARIANT_RUNNING_ON_NODE,
            f"alloc {alloc.id!r} (job {alloc.job_id!r})",
            f"{alloc.client_status} in the state restored at index {restore.index}, but node "
            f"{alloc.node_id!r} registered since and does not report it",
        )
        for alloc in unconfirmed_allocs(tables, restore)
    ]


def _subject(key: JobKey) -> str:
    namespace, job_id = key
    return f"job {job_id!r} ({namespace})"


def _system_allocs(tables: Tables) -> list[Violation]:
    out: list[Violation] = []
    for job_type in (JOB_TYPE_SYSTEM, JOB_TYPE_SYSBATCH):
        for key in sorted(tables.jobs_by_type.get(job_type, {})):
            job = tables.jobs.get(key)
            if job is None:
                continue
            counts = {group.name: max(1, group.count) for group in job.groups}
            live: Counter[tuple[str, str]] = Counter()
            for alloc_id in tables.allocs_by_job.get(key, {}):
                alloc = tables.allocs.get(alloc_id)
                if alloc is None or alloc.desired_status != ALLOC_DESIRED_RUN or alloc.client_terminal():
                    continue
                live[(alloc.task_group, alloc.node_id)] += 1
            for (group, node_id), n in sorted(live.items()):
                allowed = counts.get(group, 1)
                if n > allowed:
                    out.append(
                        Violation(
                            INVARIANT_SYSTEM_ALLOCS,
                            _subject(key),
                            f"group {group!r} has {n} live desired-running allocs on node {node_id!r}"
                            f" (at most {allowed})",
                        )
                    )
    return out


def _children_recount(tables: Tables, key: JobKey) -> JobChildrenSummary:
    counts = dict.fromkeys(_CHILD_BUCKETS, 0)
    for child_key in tables.children_by_parent.get(key, {}):
        child = tables.jobs.get(child_key)
        if child is not None:
            status = child.status or JOB_STATUS_PENDING
            counts[status] = counts.get(status, 0) + 1
    return JobChildrenSummary(**{b: counts[b] for b in _CHILD_BUCKETS})


def _summaries(tables: Tables) -> list[Violation]:
    out: list[Violation] = []
    for key in sorted(set(tables.jobs.keys()) ^ set(tables.job_summaries.keys())):
        what = "has no summary" if key in tables.jobs else "has a summary but no job"
        out.append(Violation(INVARIANT_SUMMARIES, _subject(key), what))
    recount = recount_summaries(tables)
    for key in sorted(tables.job_summaries.keys()):
        summary = tables.job_summaries[key]
        counted = recount.get(key, {})
        for group in sorted(set(summary.summary) | set(counted)):
            have = summary.summary.get(group, TaskGroupSummary())
            want = counted.get(group)
            for name in _GROUP_COUNTERS:
                value = getattr(have, name)
                if value < 0:
                    out.append(
                        Violation(INVARIANT_SUMMARIES, _subject(key), f"{group}.{name} is negative ({value})")
                    )
                expected = getattr(want, name) if want is not None else 0
                if name != "queued" and value != expected:
                    out.append(
                        Violation(
                            INVARIANT_SUMMARIES,
                            _subject(key),
                            f"{group}.{name} is {value}, a recount of the allocs gives {expected}",
                        )
                    )
        have_children = summary.children or JobChildrenSummary()
        want_children = _children_recount(tables, key)
        for bucket in _CHILD_BUCKETS:
            value = getattr(have_children, bucket)
            expected = getattr(want_children, bucket)
            if value < 0:
                out.append(
                    Violation(INVARIANT_SUMMARIES, _subject(key), f"children.{bucket} is negative ({value})")
                )
            if value != expected:
                out.append(
                    Violation(
                        INVARIANT_SUMMARIES,
                        _subject(key),
                        f"children.{bucket} is {value}, a recount of the child jobs gives {expected}",
                    )
                )
    return out
