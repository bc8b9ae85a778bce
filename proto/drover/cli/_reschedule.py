"""What the CLI says about a failed allocation's rescheduling, in Nomad's words.

``alloc status`` shows "Reschedule Attempts" (attempts inside the policy's interval out of
the attempts allowed) and, while a delayed evaluation waits, "Reschedule Eligibility" (when
the next attempt is due); ``job status`` lists the failed allocations still waiting for
their replacement. The due time is the follow-up evaluation's ``wait_until``, which the
scheduler stamped on the alloc: the CLI asks for that evaluation, it never recomputes the
policy's delay itself, so what it prints is what the broker will do.
"""

from __future__ import annotations

from collections.abc import Iterable

from drover.cli._format import fmt_duration, fmt_time
from drover.sdk import DroverClient, DroverError
from drover.v1 import structs_pb2

__all__ = ["attempts_text", "awaiting_rows", "eligibility_text"]

_SECOND = 1_000_000_000


def _policy(job: structs_pb2.Job | None, group: str) -> structs_pb2.ReschedulePolicy | None:
    if job is None:
        return None
    for tg in job.groups:
        if tg.name == group and tg.HasField("reschedule"):
            return tg.reschedule
    return None


def attempts_text(alloc: structs_pb2.Allocation, job: structs_pb2.Job | None, now_ns: int) -> str:
    """ "2/3": attempts made inside the interval, of those allowed; "4 (unlimited)"."""
    events = list(alloc.reschedule_events)
    policy = _policy(job, alloc.task_group)
    if policy is None:
        return str(len(events))
    if policy.unlimited:
        return f"{len(events)} (unlimited)"
    if policy.interval_ns > 0:
        events = [e for e in events if now_ns - e.reschedule_time_ns < policy.interval_ns]
    return f"{len(events)}/{policy.attempts}"


def _due_ns(client: DroverClient, alloc: structs_pb2.Allocation) -> int | None:
    """When the follow-up evaluation of ``alloc`` runs; None: none pending."""
    if not alloc.followup_eval_id:
        return None
    try:
        ev = client.get_eval(alloc.followup_eval_id).eval
    except DroverError:
        return None  # collected meanwhile: nothing pending
    if ev.status != "pending":
        return None
    return ev.wait_until_ns


def eligibility_text(client: DroverClient, alloc: structs_pb2.Allocation, now_ns: int) -> str | None:
    """ "in 25s (2026-12-01 10:00:00 UTC)" while a delayed reschedule waits; None otherwise."""
    due = _due_ns(client, alloc)
    if due is None:
        return None
    if due <= now_ns:
        return "now (its evaluation is queued)"
    wait = due - now_ns
    return f"in {fmt_duration(wait) if wait >= _SECOND else 'under 1s'} ({fmt_time(due)})"


def awaiting_rows(
    client: DroverClient, allocs: Iterable[structs_pb2.Allocation], now_ns: int, *, short: bool
) -> list[list[str]]:
    """Failed allocs whose replacement is scheduled but not placed yet: ID, name, node, when."""
    rows = []
    for alloc in allocs:
        if alloc.client_status != "failed" or alloc.desired_status != "run" or alloc.next_allocation:
            continue
        when = eligibility_text(client, alloc, now_ns)
        if when is None:
            continue
        rows.append([alloc.id[:8] if short else alloc.id, alloc.name, alloc.node_name, when])
    return rows
