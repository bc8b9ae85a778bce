"""Deployment health of one alloc, decided by the client once per deployment.

Theory of operation
-------------------
The servers roll a deployment forward only on the clients' word: an alloc placed (or
updated in place) into a deployment is "healthy" or "unhealthy" when its client says so
(docs/deployments-health.md). The word is given once per ``deployment_id``; the first
answer wins and is never taken back by the client.

Three layers, from pure to threaded:

- ``health_policy(alloc, job)``: whether the client decides at all (a service or system
  job, a deployment, an update block with ``max_parallel > 0`` and a ``health_check`` other
  than ``manual``) and with which timings; ``None`` means "not ours to decide".
- ``decide_health(policy, tasks, checks, tracking_since_ns, now_ns)``: the verdict as a pure
  function of the task states, the checks' passing streaks and the times. Unhealthy when a
  task is dead (failed, or a service task that finished) or ``healthy_deadline`` has passed
  since tracking began; healthy when every task has been running since its latest start
  (a restart starts it anew) and, with ``health_check = "checks"``, every check has passed
  without a failure, both for ``min_healthy_time``; otherwise "not yet", with the moment
  the answer could change.
- ``HealthTracker``: one thread per alloc and deployment. Each ``tick()`` takes the
  checks' ``CheckStreak`` values (any failure resets a streak) and asks ``decide_health``;
  the verdict goes to ``on_health``. The streaks come from the alloc's check watcher
  (client_agent/checkwatch.py: the same results the servers see, so a deployment and the
  registrations never judge the same check differently, and no check runs twice), each
  counted from no earlier than the tracking began; without one (``streaks`` None) the
  tracker runs the checks that are due itself (``checks.run_check``). The thread waits
  between ticks on an event that task and check changes set (``poke``), so a failure is
  seen at once.

Times are wall-clock nanoseconds from the injected ``Clock``: task start times are stamped
with it, and the verdict's timestamp is sent to the servers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import structlog

from drover.client.checks import CHECK_PASSING, CheckOutcome, CheckSpec, CheckStatus, run_check
from drover.client.clock import Clock
from drover.client.threads import join_thread
from drover.common.taskstate import TASK_RUNNING, TaskState
from drover.v1 import structs_pb2

__all__ = [
    "HEALTH_HEALTHY",
    "HEALTH_UNHEALTHY",
    "CheckStreak",
    "DeploymentHealth",
    "HealthPolicy",
    "HealthTracker",
    "Verdict",
    "decide_health",
    "health_policy",
    "streaks_of",
]

HEALTH_HEALTHY: Final = "healthy"
HEALTH_UNHEALTHY: Final = "unhealthy"
HEALTH_CHECK_TASK_STATES: Final = "task_states"
HEALTH_CHECK_CHECKS: Final = "checks"
HEALTH_CHECK_MANUAL: Final = "manual"
# Jobs whose allocs run until stopped; only their updates are deployments.
_DEPLOYMENT_JOB_TYPES: Final = frozenset({"service", "system"})
# However far the next event is, look again this often: a lost poke costs at most this.
MAX_WAIT_S: Final = 1.0

log = structlog.get_logger("drover.client.health")


@dataclass(frozen=True, slots=True)
class DeploymentHealth:
    """The client's verdict for one deployment, as sent in ``Allocation.deployment_status``.
    ``canary`` is the server's flag, echoed back unchanged."""

    deployment_id: str
    health: str
    timestamp_ns: int
    canary: bool = False

    def to_proto(self) -> structs_pb2.AllocDeploymentStatus:
        return structs_pb2.AllocDeploymentStatus(
            health=self.health, timestamp_ns=self.timestamp_ns, canary=self.canary
        )


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """What the group's update block asks of this alloc's health."""

    deployment_id: str
    min_healthy_time_ns: int
    healthy_deadline_ns: int
    use_checks: bool


@dataclass(frozen=True, slots=True)
class CheckStreak:
    """One check's recent history: ``passing_since_ns`` is the first pass of the current
    unbroken run of passes (0: failing, or not run yet)."""

    passing_since_ns: int = 0
    last_run_ns: int = 0
    output: str = ""

    def after(self, outcome: CheckOutcome, now_ns: int) -> CheckStreak:
        if not outcome.passed:
            return CheckStreak(0, now_ns, outcome.output)
        return CheckStreak(self.passing_since_ns or now_ns, now_ns, outcome.output)


@dataclass(frozen=True, slots=True)
class Verdict:
    """``health`` is "" while undecided; then ``recheck_at_ns`` is when, with no other
    change, the answer could be different (0: only a change can decide)."""

    health: str
    reason: str
    recheck_at_ns: int = 0


def streaks_of(statuses: Mapping[str, CheckStatus]) -> dict[str, CheckStreak]:
    """The check watcher's statuses (by check key) as streaks: a passing status passes since
    it became passing (any failure since would have changed it)."""
    return {
        key: CheckStreak(s.timestamp_ns if s.status == CHECK_PASSING else 0, s.timestamp_ns, s.output)
        for key, s in statuses.items()
    }


def health_policy(alloc: structs_pb2.Allocation, job: structs_pb2.Job | None) -> HealthPolicy | None:
    """How the client decides this alloc's health, or None when it does not decide."""
    if job is None or job.type not in _DEPLOYMENT_JOB_TYPES or not alloc.deployment_id:
        return None
    group = next((g for g in job.groups if g.name == alloc.task_group), None)
    if group is None or not group.HasField("update"):
        return None
    update = group.update
    mode = update.health_check or HEALTH_CHECK_TASK_STATES
    if update.max_parallel <= 0 or mode == HEALTH_CHECK_MANUAL:
        return None
    return HealthPolicy(
        deployment_id=alloc.deployment_id,
        min_healthy_time_ns=max(0, update.min_healthy_time_ns),
        healthy_deadline_ns=max(0, update.healthy_deadline_ns),
        use_checks=mode == HEALTH_CHECK_CHECKS,
    )


def decide_health(
    policy: HealthPolicy,
    tasks: Mapping[str, TaskState],
    checks: Mapping[str, CheckStreak],
    tracking_since_ns: int,
    now_ns: int,
) -> Verdict:
    """The verdict on an alloc at ``now_ns`` (see the module docstring); pure."""
    for name in sorted(tasks):
        state = tasks[name]
        if state.is_dead:
            why = "failed" if state.failed else "finished (a service task must keep running)"
            return Verdict(HEALTH_UNHEALTHY, f"task {name!r} {why}")
    deadline_ns = tracking_since_ns + policy.healthy_deadline_ns
    if now_ns >= deadline_ns:
        return Verdict(
            HEALTH_UNHEALTHY, f"not healthy by the healthy_deadline ({policy.healthy_deadline_ns / 1e9:g}s)"
        )
    waiting = [n for n in sorted(tasks) if tasks[n].state != TASK_RUNNING]
    if not tasks or waiting:
        return Verdict("", f"tasks not running: {', '.join(waiting) or 'none yet'}", deadline_ns)
    healthy_since_ns = max(state.started_at_ns for state in tasks.values())
    if policy.use_checks:
        failing = [key for key in sorted(checks) if not checks[key].passing_since_ns]
        if failing:
            return Verdict("", f"checks not passing: {', '.join(failing)}", deadline_ns)
        healthy_since_ns = max([healthy_since_ns, *(c.passing_since_ns for c in checks.values())])
    healthy_at_ns = healthy_since_ns + policy.min_healthy_time_ns
    if now_ns >= healthy_at_ns:
        return Verdict(
            HEALTH_HEALTHY, f"healthy for min_healthy_time ({policy.min_healthy_time_ns / 1e9:g}s)"
        )
    return Verdict("", "waiting for min_healthy_time", min(healthy_at_ns, deadline_ns))


class HealthTracker:
    """The thread that watches one alloc for one deployment until it has a verdict.

    ``tasks`` returns the alloc's current task states; ``on_health`` receives the verdict
    once (never after ``cancel()``). ``run`` performs one check (``checks.run_check`` in
    production; tests pass their own).
    """

    def __init__(
        self,
        policy: HealthPolicy,
        specs: Sequence[CheckSpec],
        *,
        clock: Clock,
        tasks: Callable[[], Mapping[str, TaskState]],
        on_health: Callable[[str, int, str], None],
        log_fields: Mapping[str, Any],
        run: Callable[[CheckSpec], CheckOutcome] = run_check,
        streaks: Callable[[], Mapping[str, CheckStreak]] | None = None,
    ) -> None:
        self.policy = policy
        self._specs = {spec.key: spec for spec in specs} if policy.use_checks else {}
        self._source = streaks
        self._clock = clock
        self._tasks = tasks
        self._on_health = on_health
        self._run = run
        self._log = log.bind(**log_fields, deployment_id=policy.deployment_id)
        self._since_ns = clock.now_ns()
        self._streaks: dict[str, CheckStreak] = {key: CheckStreak() for key in self._specs}
        self._next_run_ns: dict[str, int] = (
            {key: self._since_ns for key in self._specs} if streaks is None else {}
        )
        self._wake = threading.Event()
        self._cancelled = threading.Event()
        self._done = False
        self._last_reason = ""
        self._thread: threading.Thread | None = None

    @property
    def done(self) -> bool:
        return self._done

    def start(self) -> None:
        self._log.info(
            "health.watching",
            min_healthy_time_s=self.policy.min_healthy_time_ns / 1e9,
            healthy_deadline_s=self.policy.healthy_deadline_ns / 1e9,
            checks=sorted(self._specs),
        )
        self._thread = threading.Thread(target=self._loop, name="alloc-health", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """Something changed (a task started, restarted or died): look now."""
        self._wake.set()

    def cancel(self) -> None:
        """Stop watching and never report (the alloc is stopping, or moved deployments)."""
        self._cancelled.set()
        self._wake.set()

    def join(self, timeout_s: float) -> bool:
        return join_thread(self._thread, timeout_s)

    def tick(self) -> float | None:
        """One look: run the due checks, decide, report a verdict. Seconds until the next
        look, or None when there is nothing more to do (decided or cancelled)."""
        if self._done or self._cancelled.is_set():
            return None
        if self._source is not None:
            self._take_streaks(self._source())
        for key in sorted(self._next_run_ns):
            if self._cancelled.is_set():
                return None
            if self._clock.now_ns() < self._next_run_ns[key]:
                continue
            spec = self._specs[key]
            try:
                outcome = self._run(spec)
            except Exception as exc:
                # A check that cannot run is a failing check, not the end of the tracker.
                outcome = CheckOutcome(False, f"the check could not run: {exc}")
            ran_at = self._clock.now_ns()
            before = self._streaks[key]
            after = before.after(outcome, ran_at)
            self._streaks[key] = after
            self._next_run_ns[key] = ran_at + spec.interval_ns
            if bool(before.passing_since_ns) != bool(after.passing_since_ns) or not before.last_run_ns:
                self._log.info("health.check", check=key, passing=outcome.passed, output=outcome.output[:200])
        now = self._clock.now_ns()
        verdict = decide_health(self.policy, self._tasks(), self._streaks, self._since_ns, now)
        if verdict.health:
            if self._cancelled.is_set():
                return None
            self._done = True
            self._log.info("health.decided", health=verdict.health, reason=verdict.reason)
            self._on_health(verdict.health, now, verdict.reason)
            return None
        if verdict.reason != self._last_reason:
            self._last_reason = verdict.reason
            self._log.debug("health.waiting", reason=verdict.reason)
        wake_at = [t for t in (verdict.recheck_at_ns, *self._next_run_ns.values()) if t > 0]
        next_ns = min(wake_at, default=now + int(MAX_WAIT_S * 1e9))
        return min(MAX_WAIT_S, max(0.0, (next_ns - now) / 1e9))

    def _take_streaks(self, current: Mapping[str, CheckStreak]) -> None:
        """The watcher's streaks, a pass counted from no earlier than tracking began (a
        check that passed before this deployment has yet to pass for min_healthy_time in it)."""
        for key in self._specs:
            streak = current.get(key, CheckStreak())
            if streak.passing_since_ns:
                streak = replace(streak, passing_since_ns=max(streak.passing_since_ns, self._since_ns))
            before = self._streaks[key]
            self._streaks[key] = streak
            if bool(before.passing_since_ns) != bool(streak.passing_since_ns):
                self._log.info("health.check", check=key, passing=bool(streak.passing_since_ns))

    def _loop(self) -> None:
        try:
            while True:
                delay = self.tick()
                if delay is None:
                    return
                if self._wake.wait(delay):
                    self._wake.clear()
        except Exception:
            # A dead tracker would hold the deployment until its progress deadline: say so.
            self._log.exception("health.tracker_crashed")


def with_health(alloc: structs_pb2.Allocation, health: DeploymentHealth) -> structs_pb2.Allocation:
    """A copy of ``alloc`` carrying the verdict, for the local record (so a restarted agent
    does not decide a second time)."""
    copy = structs_pb2.Allocation()
    copy.CopyFrom(alloc)
    copy.deployment_status.health = health.health
    copy.deployment_status.timestamp_ns = health.timestamp_ns
    return copy


def recorded_health(alloc: structs_pb2.Allocation) -> DeploymentHealth | None:
    """The verdict already given for the alloc's current deployment, by this client (in its
    record) or as the servers hold it."""
    if not alloc.deployment_id or not alloc.HasField("deployment_status"):
        return None
    status = alloc.deployment_status
    if status.health not in (HEALTH_HEALTHY, HEALTH_UNHEALTHY):
        return None
    return DeploymentHealth(alloc.deployment_id, status.health, status.timestamp_ns, status.canary)
