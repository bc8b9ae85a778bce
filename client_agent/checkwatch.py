"""The checks of one running alloc, for its whole life: the statuses its client reports,
and the ``check_restart``s they trigger.

Theory of operation
-------------------
Deployment health (client_agent/health.py) looks at the checks only until it has a
verdict. The servers need more: each registration's health is its checks' latest
statuses (server/services/registrations.py), so that ``nomadService`` hands out only the
instances that answer; and a check with a ``check_restart`` restarts its task when it keeps
failing. One ``CheckWatcher`` thread per alloc runs every check at its ``interval``.

- A check runs only while the task it is about runs (the check's ``task``, the service's
  task, or any task of a group service's group): before that first start it has no status
  (the servers call it "pending"); once that task stops running it is "critical" (nothing
  answers) until it runs again.
- A status change calls ``on_change`` (the alloc runner reports the alloc) at once. A run
  that gives the same status with another output keeps the new output (``statuses()``,
  and so any report, carries it) but reports it by itself at most once per
  ``OUTPUT_REPORT_INTERVAL_S`` per check: each report is a raft write, and a check whose
  output changes every run (a timestamp, a counter) would otherwise cost one per interval
  per alloc. A run that changes neither costs the servers nothing.
- ``count_failures`` (pure: the time is an argument) folds each result of a check with a
  ``check_restart`` into a ``FailureCount``, as Nomad's check watcher does: a passing
  result (or a warning, with ``ignore_warnings``) resets the count; a failing one inside
  ``grace`` of the task's latest start is not counted; the ``limit``-th failure in a row
  asks for one restart of that run of the task. A new start (the restart, or any other)
  begins a new count and a new grace. The restart goes through the task's restart policy
  as a failure (``restart(task, reason)``; the alloc runner's ``TaskRunner.restart(...,
  failure=True)``), so a task that never gets healthy uses up its attempts and fails.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import structlog

from drover.client.checks import (
    CHECK_CRITICAL,
    CHECK_PASSING,
    CHECK_WARNING,
    CheckOutcome,
    CheckRestartPolicy,
    CheckSpec,
    CheckStatus,
    run_check,
)
from drover.client.clock import Clock
from drover.client.threads import join_thread
from drover.v1 import structs_pb2

__all__ = [
    "OUTPUT_REPORT_INTERVAL_S",
    "CheckWatcher",
    "FailureCount",
    "count_failures",
    "reported_statuses",
    "with_statuses",
]

# However far the next check is, look again this often: a stop waits at most this.
MAX_WAIT_S: Final = 1.0
NOT_RUNNING: Final = "the task is not running"
# The least time between two reports of one check whose status stayed the same and whose
# output changed. Every report is an alloc update, so a raft write on the servers: a check
# whose output differs on every run (it prints a timestamp) at a 1s interval would make
# one per second per alloc. An operator reading ``service info -verbose`` is served well
# enough by an output at most a minute old; a status change is never held back.
OUTPUT_REPORT_INTERVAL_S: Final = 60.0

log = structlog.get_logger("drover.client.checks")


@dataclass(frozen=True, slots=True)
class FailureCount:
    """A check's failing results in a row, for one run of its task (``run_started_ns``,
    the task's start time); ``restart_asked``: this run was already told to restart."""

    run_started_ns: int = 0
    failures: int = 0
    restart_asked: bool = False


def count_failures(
    policy: CheckRestartPolicy, count: FailureCount, status: str, task_started_ns: int, now_ns: int
) -> tuple[FailureCount, bool]:
    """The count after one result with ``status`` at ``now_ns`` of a check of the task run
    that started at ``task_started_ns`` (0: not running), and whether to restart it now."""
    if task_started_ns <= 0 or policy.limit <= 0:
        return FailureCount(), False
    if count.run_started_ns != task_started_ns:
        count = FailureCount(run_started_ns=task_started_ns)
    if count.restart_asked:
        return count, False
    if status == CHECK_PASSING or (status == CHECK_WARNING and policy.ignore_warnings):
        return replace(count, failures=0), False
    if now_ns < task_started_ns + policy.grace_ns:
        return count, False
    failures = count.failures + 1
    if failures >= policy.limit:
        return replace(count, failures=failures, restart_asked=True), True
    return replace(count, failures=failures), False


def reported_statuses(alloc: structs_pb2.Allocation) -> tuple[CheckStatus, ...]:
    """The statuses the servers hold for ``alloc`` (what its client last reported)."""
    return tuple(
        CheckStatus(c.task, c.service, c.check, c.status, c.output, c.timestamp_ns)
        for c in alloc.check_statuses
    )


def with_statuses(alloc: structs_pb2.Allocation, statuses: Sequence[CheckStatus]) -> structs_pb2.Allocation:
    """A copy of ``alloc`` carrying ``statuses``, for the local record: a restarted agent's
    watcher starts from them (``reported_statuses``), so its first report says what the
    last one did instead of nothing."""
    copy = structs_pb2.Allocation()
    copy.CopyFrom(alloc)
    del copy.check_statuses[:]
    for s in statuses:
        copy.check_statuses.add(
            task=s.task,
            service=s.service,
            check=s.check,
            status=s.status,
            output=s.output,
            timestamp_ns=s.timestamp_ns,
        )
    return copy


class CheckWatcher:
    """The thread that runs one alloc's checks until ``stop()``.

    ``task_starts`` returns the start time of each task now running (a task not running
    is absent); ``on_change`` runs after a status changed, or an output (at most once per
    ``OUTPUT_REPORT_INTERVAL_S`` for a check: ``statuses()`` has it);
    ``restart(task, reason)`` restarts a task for a failing check. ``run`` performs one
    check (``checks.run_check`` in production; tests pass their own). ``known`` are the
    statuses already reported (by the agent before a restart, or by the watcher of the
    job's previous version): a check keeps its status until a run changes it, so the
    servers see no needless "pending" in between.
    """

    def __init__(
        self,
        specs: Sequence[CheckSpec],
        *,
        clock: Clock,
        task_starts: Callable[[], Mapping[str, int]],
        on_change: Callable[[], None],
        restart: Callable[[str, str], None],
        log_fields: Mapping[str, Any],
        run: Callable[[CheckSpec], CheckOutcome] = run_check,
        known: Sequence[CheckStatus] = (),
    ) -> None:
        self.specs = tuple(specs)
        self._specs = {spec.key: spec for spec in specs}
        self._clock = clock
        self._task_starts = task_starts
        self._on_change = on_change
        self._restart = restart
        self._run = run
        self._log = log.bind(**log_fields)
        self._lock = threading.Lock()
        by_name = {(s.task, s.service, s.check): s for s in known}
        self._statuses: dict[str, CheckStatus] = {
            spec.key: by_name[(spec.task, spec.service, spec.check)]
            for spec in specs
            if (spec.task, spec.service, spec.check) in by_name
        }
        self._counts: dict[str, FailureCount] = {key: FailureCount() for key in self._specs}
        self._next_run_ns: dict[str, int] = {}
        # (task, start) runs already told to restart, so two checks ask once.
        self._restarted: set[tuple[str, int]] = set()
        # Whether a run's results went out yet: the first always does, whatever ``known``
        # said, so the servers converge on what the checks say now.
        self._reported = False
        # Per check, the output the last report carried and when (monotonic) that report
        # went out: what throttles output-only reports.
        self._sent_output: dict[str, str] = {key: s.output for key, s in self._statuses.items()}
        self._output_sent_ns: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None or not self._specs:
            return
        self._log.info("checks.watching", checks=sorted(self._specs))
        self._thread = threading.Thread(target=self._loop, name="alloc-checks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout_s: float) -> bool:
        self._stop.set()
        return join_thread(self._thread, timeout_s)

    def statuses(self) -> tuple[CheckStatus, ...]:
        """Every check's latest status, in a stable order (none for a check not run yet)."""
        with self._lock:
            return tuple(self._statuses[key] for key in sorted(self._statuses))

    def statuses_by_key(self) -> dict[str, CheckStatus]:
        """The latest statuses by ``CheckSpec.key`` (deployment health reads them)."""
        with self._lock:
            return dict(self._statuses)

    def tick(self) -> float:
        """Run the checks that are due; seconds until the next one is."""
        starts = self._task_starts()
        changed = False
        ran = False
        for key in sorted(self._specs):
            if self._stop.is_set():
                return 0.0
            spec = self._specs[key]
            now = self._clock.now_ns()
            if not any(task in starts for task in spec.runs_in):
                changed = self._not_running(key, spec, now) or changed
                continue
            if now < self._next_run_ns.get(key, 0):
                continue
            try:
                outcome = self._run(spec)
            except Exception as exc:
                # A check that cannot run is a failing check, not the end of the watcher.
                outcome = CheckOutcome(False, f"the check could not run: {exc}")
            ran_at = self._clock.now_ns()
            ran = True
            self._next_run_ns[key] = ran_at + spec.interval_ns
            changed = self._record(key, spec, outcome.status, outcome.output, ran_at) or changed
            if spec.restart is not None:
                self._count(key, spec, spec.restart, outcome.status, starts.get(spec.restart_task, 0), ran_at)
        if changed or (ran and not self._reported) or self._output_due():
            self._reported = True
            self._note_sent()
            self._on_change()
        now = self._clock.now_ns()
        due = [t for k, t in self._next_run_ns.items() if k in self._specs]
        next_ns = min(due, default=now + int(MAX_WAIT_S * 1e9))
        return min(MAX_WAIT_S, max(0.0, (next_ns - now) / 1e9))

    def _output_due(self) -> bool:
        """A check's output changed since the last report, which is at least
        ``OUTPUT_REPORT_INTERVAL_S`` old for that check."""
        now = self._clock.monotonic_ns()
        interval_ns = int(OUTPUT_REPORT_INTERVAL_S * 1e9)
        with self._lock:
            return any(
                status.output != self._sent_output.get(key)
                and (key not in self._output_sent_ns or now - self._output_sent_ns[key] >= interval_ns)
                for key, status in self._statuses.items()
            )

    def _note_sent(self) -> None:
        """A report is going out with every check's current output."""
        now = self._clock.monotonic_ns()
        with self._lock:
            for key, status in self._statuses.items():
                self._sent_output[key] = status.output
                self._output_sent_ns[key] = now

    def _not_running(self, key: str, spec: CheckSpec, now_ns: int) -> bool:
        """Its task stopped: the check is critical (if it ever ran), and runs as soon as the
        task runs again."""
        self._next_run_ns.pop(key, None)
        with self._lock:
            if key not in self._statuses:
                return False
        return self._record(key, spec, CHECK_CRITICAL, NOT_RUNNING, now_ns)

    def _record(self, key: str, spec: CheckSpec, status: str, output: str, now_ns: int) -> bool:
        """Keep the result; True if the status changed. The same status keeps its
        timestamp (when it became this status: deployment health counts from it) and takes
        the new output, which ``_output_due`` reports when its turn comes."""
        with self._lock:
            before = self._statuses.get(key)
            if before is not None and before.status == status:
                if before.output != output:
                    self._statuses[key] = replace(before, output=output)
                return False
            self._statuses[key] = CheckStatus(spec.task, spec.service, spec.check, status, output, now_ns)
        self._log.info(
            "checks.status",
            check=key,
            status=status,
            was=before.status if before else "",
            output=output[:200],
        )
        return True

    def _count(
        self, key: str, spec: CheckSpec, policy: CheckRestartPolicy, status: str, started_ns: int, now_ns: int
    ) -> None:
        count, restart = count_failures(policy, self._counts[key], status, started_ns, now_ns)
        self._counts[key] = count
        if not restart or (spec.restart_task, started_ns) in self._restarted:
            return
        self._restarted.add((spec.restart_task, started_ns))
        reason = (
            f"check {spec.check!r} of service {spec.service!r} unhealthy ({count.failures} failures in a row)"
        )
        self._log.info("checks.restart", check=key, task=spec.restart_task, reason=reason)
        try:
            self._restart(spec.restart_task, reason)
        except Exception:
            self._log.exception("checks.restart_failed", task=spec.restart_task)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._stop.wait(self.tick())
        except Exception:
            # Without the watcher the servers keep the last statuses: say so.
            self._log.exception("checks.watcher_crashed")
