"""Rescheduling a failed alloc: whether its group's policy allows another attempt, when,
and the attempt history its replacement carries. Pure functions of the policy, the alloc's
reschedule tracker and the time; ``reconciler.generic`` decides what to do with the answer
(replace it now, or have the scheduler create a follow-up eval for ``at_ns``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from drover.scheduler.structs import (
    DELAY_CONSTANT,
    DELAY_EXPONENTIAL,
    DELAY_FIBONACCI,
    Allocation,
    RescheduleEvent,
    ReschedulePolicy,
)

__all__ = [
    "DELAY_FUNCTIONS",
    "MAX_PAST_RESCHEDULE_EVENTS",
    "RESCHEDULE_WINDOW_NS",
    "RescheduleDecision",
    "fail_time_ns",
    "next_delay",
    "next_reschedule",
    "replacement_events",
]

# A failed alloc due within this window is rescheduled now rather than by a follow-up eval
# (Nomad's rescheduleWindowSize): the follow-up would fire before the plan even commits.
RESCHEDULE_WINDOW_NS: Final = 1_000_000_000
# Past reschedule events kept on a replacement under an unlimited policy (only the last
# two matter for the delay functions; the rest is history for `alloc status`).
MAX_PAST_RESCHEDULE_EVENTS: Final = 5


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


def replacement_events(
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
