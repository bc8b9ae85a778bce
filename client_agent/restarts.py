"""The group restart policy, as a pure decision over (policy, window, exit, now).

Nomad's ``RestartTracker``: every exit that is not a batch success counts one attempt in
the current window of ``interval``; a window older than ``interval`` starts over. Within
``attempts`` the task restarts after ``delay`` plus up to 25% jitter. Beyond them, mode
``fail`` makes the task dead and failed; mode ``delay`` waits until the window is over and
then starts a fresh one.

A batch/sysbatch task that exits 0 is complete and never restarted; a service/system task
that exits (with any code) is restarted, as it is meant to run until stopped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "MODE_DELAY",
    "MODE_FAIL",
    "RestartDecision",
    "RestartPolicy",
    "RestartWindow",
    "decide_restart",
    "default_restart_policy",
]

MODE_FAIL: Final = "fail"
MODE_DELAY: Final = "delay"
_SECOND: Final = 1_000_000_000
_JITTER_FRACTION: Final = 0.25
_BATCH_TYPES: Final = frozenset({"batch", "sysbatch"})


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    attempts: int
    interval_ns: int
    delay_ns: int
    mode: str = MODE_FAIL


def default_restart_policy(job_type: str) -> RestartPolicy:
    """The job type's default, for a group the server sent without one (as the server's)."""
    if job_type in _BATCH_TYPES:
        return RestartPolicy(attempts=3, interval_ns=24 * 3600 * _SECOND, delay_ns=15 * _SECOND)
    return RestartPolicy(attempts=2, interval_ns=1800 * _SECOND, delay_ns=15 * _SECOND)


@dataclass(frozen=True, slots=True)
class RestartWindow:
    """Attempts counted since ``start_ns`` (wall clock: it survives agent restarts)."""

    start_ns: int = 0
    count: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"start_ns": self.start_ns, "count": self.count}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> RestartWindow:
        if not data:
            return cls()
        return cls(start_ns=int(data.get("start_ns", 0)), count=int(data.get("count", 0)))


@dataclass(frozen=True, slots=True)
class RestartDecision:
    restart: bool
    delay_ns: int
    # Dead and failed (only meaningful when not restarting).
    failed: bool
    reason: str


def decide_restart(
    policy: RestartPolicy,
    window: RestartWindow,
    *,
    job_type: str,
    exit_code: int | None,
    now_ns: int,
    jitter: float,
) -> tuple[RestartDecision, RestartWindow]:
    """Whether (and when) to restart a task that exited; ``exit_code`` None means unknown.

    ``jitter`` is a random number in [0, 1) drawn by the caller, so this stays replayable.
    """
    success = exit_code == 0
    if success and job_type in _BATCH_TYPES:
        return RestartDecision(False, 0, False, "Task completed successfully"), window
    if window.start_ns == 0 or now_ns - window.start_ns > policy.interval_ns:
        window = RestartWindow(start_ns=now_ns, count=0)
    window = RestartWindow(start_ns=window.start_ns, count=window.count + 1)
    why = "Task exited successfully" if success else _exit_reason(exit_code)
    if window.count > policy.attempts:
        if policy.mode == MODE_DELAY:
            delay = max(0, window.start_ns + policy.interval_ns - now_ns)
            reason = f"{why}; exceeded {policy.attempts} attempts in the interval, mode is delay"
            return RestartDecision(True, delay, False, reason), RestartWindow(
                start_ns=now_ns + delay, count=0
            )
        reason = (
            f"Exceeded allowed attempts {policy.attempts} in interval "
            f"{policy.interval_ns / _SECOND:g}s and mode is fail"
        )
        return RestartDecision(False, 0, True, reason), window
    delay = policy.delay_ns + int(policy.delay_ns * _JITTER_FRACTION * min(max(jitter, 0.0), 1.0))
    return RestartDecision(True, delay, False, why), window


def _exit_reason(exit_code: int | None) -> str:
    if exit_code is None:
        return "Task exited with an unknown exit code"
    return f"Task exited with code {exit_code}"
