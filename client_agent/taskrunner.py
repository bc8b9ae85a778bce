"""One task of one alloc, on its own thread: start, watch, restart by policy, kill, detach.

Theory of operation. The thread loops over "start (or re-attach), wait for the exit,
decide". Every change of the task's state goes through ``_set``, which stores it and then
calls ``on_change`` (the alloc runner persists the alloc record and reports its status from
all tasks at once). Three flags steer the thread from outside, and each also wakes it:

- ``kill()``: stop the task (wait its shutdown_delay, send its kill_signal (SIGTERM by
  default), then SIGKILL after kill_timeout); the task ends dead and not failed, and is
  never restarted. A task killed before it was ever started (its lifecycle kept it
  waiting: client_agent/lifecycle.py) ends dead once ``start()`` is called.
- ``detach()``: leave the task running and end the thread, for an agent restart or
  upgrade. The driver handle stays in the record so the next agent can re-attach.
- restart delays wait on the same wake-up, so a kill during a delay is immediate.
- ``restart()``: an operator's ``alloc restart``: stop the running task and start it again
  at once, without asking the restart policy (its attempts are not used up, as Nomad's
  restart-triggered path skips the policy's count).

``set_policy(policy)``: an in-place update of the job changed the restart block: the next
exit is judged by the new policy, against the attempts already counted in the current
window (Nomad's task runner hands the update to its restart tracker's ``SetPolicy``, which
keeps the count), so an update cannot hand a crash-looping task a fresh set of attempts.

``signal(signum)`` passes an operator's signal to the running task's handle (its process
group for raw_exec); it changes no state beyond a task event.

Exits are judged by ``restarts.decide_restart`` (a pure function); the jitter it needs
comes from the injected ``random.Random``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from drover.client.clock import Clock
from drover.client.drivers.base import Driver, ExitResult, SignalableHandle, TaskHandle, TaskSpec
from drover.client.errors import DriverConfigError, TaskStartError
from drover.client.metrics import DRIVER_START_SECONDS, TASK_RESTARTS
from drover.client.restarts import RestartPolicy, RestartWindow, decide_restart
from drover.client.state import TaskRecord
from drover.client.threads import join_thread
from drover.common.taskstate import (
    EVENT_DRIVER_FAILURE,
    EVENT_KILLED,
    EVENT_KILLING,
    EVENT_NOT_RESTARTING,
    EVENT_RESTART_SIGNALED,
    EVENT_SIGNALING,
    EVENT_TERMINATED,
    TaskEvent,
    TaskState,
)

__all__ = ["TaskRunner"]

# How often the thread looks at its flags while a task runs: the latency of a stop.
POLL_S: Final = 0.1


class TaskRunner:
    def __init__(
        self,
        *,
        spec: TaskSpec,
        driver: Driver | None,
        job_type: str,
        policy: RestartPolicy,
        task_dir: Path,
        clock: Clock,
        rng: random.Random,
        on_change: Callable[[str], None],
        log: Any,
        record: TaskRecord,
        recovered: TaskHandle | None = None,
        setup_error: str = "",
        prepare: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        """``record`` is the task's last persisted record (a fresh one for a new task).

        ``prepare`` runs before each start (artifacts, templates: client_agent/templates.py)
        and returns variables to add to the task's environment; a ``TaskStartError`` from it
        fails that start as the driver's own would.

        If the record has a driver handle, ``recovered`` is what the driver re-attached to:
        None means the task ended while no agent watched it. ``setup_error`` (unknown driver,
        bad config) fails the task at once, without restarts.
        """
        self.spec = spec
        self.name = spec.name
        self._driver = driver
        self._job_type = job_type
        self._policy = policy
        self._task_dir = task_dir
        self._clock = clock
        self._rng = rng
        self._on_change = on_change
        self._log = log.bind(task=spec.name)
        self._setup_error = setup_error
        self._prepare = prepare
        self._lock = threading.Lock()
        self._state = record.state
        self._handle_state = record.handle
        self._window = record.window
        self._initial_handle = recovered
        self._initial_exit: _Exit | None = None
        if record.handle is not None and recovered is None and not record.state.is_dead:
            self._initial_exit = _Exit(
                ExitResult(None, message="the task ended while the agent was not running"), ran=True
            )
        self._kill = threading.Event()
        self._detach = threading.Event()
        self._wake = threading.Event()
        self._restart = threading.Event()
        self._restart_reason = "User requested restart"
        self._restart_failure = False
        # The running task's handle (None while it is not running), for restart and signal.
        self._handle: TaskHandle | None = None
        self._thread: threading.Thread | None = None

    # -- outside interface -----------------------------------------------------------

    def start(self) -> None:
        if self._state.is_dead or self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, name=f"task-{self.spec.alloc_id[:8]}-{self.name}", daemon=True
        )
        self._thread.start()

    def kill(self) -> None:
        self._kill.set()
        self._wake.set()

    def detach(self) -> None:
        self._detach.set()
        self._wake.set()

    @property
    def running(self) -> bool:
        """True while a started task runs (and is not being stopped)."""
        with self._lock:
            return self._handle is not None and not self._kill.is_set()

    def restart(self, reason: str = "User requested restart", *, failure: bool = False) -> bool:
        """Ask for a restart in place; False (nothing asked) if the task is not running.
        ``reason`` is what the task's state says it is restarting for. ``failure`` (a
        check_restart: client_agent/checkwatch.py) stops the task as a failed exit, which
        the restart policy judges and counts, as Nomad's failure restarts are."""
        if not self.running:
            return False
        self._restart_reason = reason
        self._restart_failure = failure
        self._restart.set()
        self._wake.set()
        return True

    def signal(self, signum: int, name: str) -> bool:
        """Send ``signum`` to the running task; False if it is not running. Raises
        ``DriverConfigError`` if its driver takes no signals."""
        with self._lock:
            handle = self._handle if not self._kill.is_set() else None
        if handle is None:
            return False
        if not isinstance(handle, SignalableHandle):
            raise DriverConfigError(f"driver {self.spec.driver!r} can not signal its tasks")
        self.add_event(TaskEvent(EVENT_SIGNALING, f"Task being sent signal {name}", self._now()))
        handle.signal(signum)
        return True

    def set_policy(self, policy: RestartPolicy) -> None:
        with self._lock:
            if policy == self._policy:
                return
            self._policy = policy
        self._log.info("task.restart_policy_updated", attempts=policy.attempts, mode=policy.mode)

    @property
    def task_dir(self) -> Path:
        """Where the driver runs the task, so a script check of it can run there too."""
        return self._task_dir

    def join(self, timeout_s: float) -> bool:
        return join_thread(self._thread, timeout_s)

    def snapshot(self) -> TaskRecord:
        with self._lock:
            return TaskRecord(state=self._state, handle=self._handle_state, window=self._window)

    def add_event(self, event: TaskEvent) -> None:
        self._set(lambda s: s.with_event(event))

    # -- the thread ------------------------------------------------------------------

    def _set(
        self,
        change: Callable[[TaskState], TaskState],
        *,
        handle: dict[str, Any] | bool | None = False,
        window: RestartWindow | None = None,
    ) -> None:
        """Apply ``change``; ``handle`` False keeps the recorded handle, None clears it."""
        with self._lock:
            self._state = change(self._state)
            if handle is not False:
                self._handle_state = handle if isinstance(handle, dict) else None
            if window is not None:
                self._window = window
        self._on_change(self.name)

    def _now(self) -> int:
        return self._clock.now_ns()

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:
            self._log.exception("task.runner_crashed")
            now = self._now()
            event = TaskEvent(EVENT_DRIVER_FAILURE, f"task runner error: {exc}", now)
            self._set(lambda s: s.with_event(event).dead(now, failed=True), handle=None)

    def _loop(self) -> None:
        if self._setup_error:
            self._fail_now(self._setup_error)
            return
        handle, exit_ = self._initial_handle, self._initial_exit
        if handle is not None:
            self._log.info("task.reattached", pid=handle.pid)
        while True:
            if exit_ is None:
                exit_ = self._run_once(handle)
                if exit_ is None:
                    return  # detached, or done for good
            handle = None
            if self._kill.is_set():
                self._finish_killed(exit_)
                return
            if exit_.user_restart:
                self._record_user_restart(exit_)
            elif not self._after_exit(exit_):
                return
            exit_ = None

    def _run_once(self, handle: TaskHandle | None) -> _Exit | None:
        """Start the task (unless re-attached) and wait for its exit.

        None: nothing more to do (detached, stopped before it started, or failed for good).
        """
        if handle is None:
            if self._detach.is_set():
                return None
            if self._kill.is_set():
                self._finish_killed(None)
                return None
            started = self._start()
            if started is None or isinstance(started, _Exit):
                return started
            handle = started
        with self._lock:
            self._handle = handle
        try:
            result = self._wait(handle)
        finally:
            with self._lock:
                self._handle = None
        if result is None:
            self._log.info("task.detached", pid=handle.pid)
            return None
        restarted = self._restart.is_set() and not self._restart_failure
        self._restart.clear()
        self._restart_failure = False
        return _Exit(result, ran=True, user_restart=restarted and not self._kill.is_set())

    def _fail_now(self, message: str) -> None:
        """Dead and failed at once, with no restart: retrying cannot help (bad config)."""
        now = self._now()
        event = TaskEvent(EVENT_DRIVER_FAILURE, message, now)
        self._log.warning("task.setup_failed", error=message)
        self._set(lambda s: s.with_event(event).dead(now, failed=True), handle=None)

    def _start(self) -> TaskHandle | _Exit | None:
        """A handle; or the start failure as an exit (restartable); or None: failed for good."""
        if self._driver is None:
            self._fail_now(f"driver {self.spec.driver!r} is not available on this node")
            return None
        started = time.perf_counter()
        try:
            spec = self.spec
            if self._prepare is not None:
                spec = replace(spec, env={**spec.env, **self._prepare()})
            handle = self._driver.start(spec, self._task_dir)
        except DriverConfigError as exc:
            self._fail_now(str(exc))
            return None
        except TaskStartError as exc:
            now = self._now()
            event = TaskEvent(EVENT_DRIVER_FAILURE, str(exc), now)
            self._log.warning("task.start_failed", error=str(exc))
            self._set(lambda s: s.with_event(event), handle=None)
            return _Exit(ExitResult(None, message=f"failed to start: {exc}"), ran=False)
        finally:
            DRIVER_START_SECONDS.labels(self.spec.driver).observe(time.perf_counter() - started)
        now = self._now()
        self._log.info("task.started", pid=handle.pid)
        self._set(lambda s: s.started(now, handle.pid), handle=handle.state())
        return handle

    def _wait(self, handle: TaskHandle) -> ExitResult | None:
        """The task's exit, or None once detached (the task keeps running)."""
        while True:
            if self._detach.is_set():
                return None
            if self._kill.is_set():
                delay_s = max(self.spec.shutdown_delay_ns, 0) / 1e9
                if delay_s > 0:
                    self.add_event(
                        TaskEvent(EVENT_KILLING, f"Waiting for shutdown_delay of {delay_s:g}s", self._now())
                    )
                    # The task may end by itself meanwhile: then that is how it ended.
                    early = handle.wait(delay_s)
                    if early is not None:
                        return early
                timeout_s = max(self.spec.kill_timeout_ns, 0) / 1e9
                now = self._now()
                event = TaskEvent(
                    EVENT_KILLING, f"Sent interrupt. Waiting {timeout_s:g}s before force killing", now
                )
                self.add_event(event)
                return handle.stop(timeout_s, self.spec.kill_signal)
            if self._restart.is_set():
                timeout_s = max(self.spec.kill_timeout_ns, 0) / 1e9
                if not self._restart_failure:  # (a failure restart's caller says why)
                    self.add_event(
                        TaskEvent(EVENT_RESTART_SIGNALED, "User requested task to restart", self._now())
                    )
                return handle.stop(timeout_s, self.spec.kill_signal)
            result = handle.wait(POLL_S)
            if result is not None:
                return result

    def _finish_killed(self, exit_: _Exit | None) -> None:
        now = self._now()
        with self._lock:
            ever_started = self._state.started_at_ns > 0
        events = []
        if exit_ is not None and exit_.ran:
            events.append(_terminated_event(exit_.result, now))
        message = "Task successfully killed" if ever_started else "Task stopped before it started"
        events.append(TaskEvent(EVENT_KILLED, message, now))

        def change(s: TaskState) -> TaskState:
            for ev in events:
                s = s.with_event(ev)
            return s.dead(now, failed=False)

        self._log.info("task.killed")
        self._set(change, handle=None)

    def _record_user_restart(self, exit_: _Exit) -> None:
        """An operator's restart: record the exit and start again at once; the restart
        window is left as it was, so the policy's attempts are not used up."""
        now = self._now()
        terminated = _terminated_event(exit_.result, now)
        self._log.info("task.restart_requested", exit_code=exit_.result.exit_code)

        def change(s: TaskState) -> TaskState:
            return s.with_event(terminated).restarting(now, 0, self._restart_reason)

        self._set(change, handle=None)

    def _after_exit(self, exit_: _Exit) -> bool:
        """Record the exit and apply the restart policy; True if the task starts again."""
        now = self._now()
        with self._lock:
            window = self._window
            policy = self._policy
        result = exit_.result
        decision, window = decide_restart(
            policy,
            window,
            job_type=self._job_type,
            exit_code=result.exit_code,
            now_ns=now,
            jitter=self._rng.random(),
        )
        terminated = _terminated_event(result, now) if exit_.ran else None
        self._log.info(
            "task.exited",
            exit_code=result.exit_code,
            signal=result.signal,
            restart=decision.restart,
            delay_s=decision.delay_ns / 1e9,
            reason=decision.reason,
        )

        def record_exit(s: TaskState) -> TaskState:
            if terminated is not None:
                s = s.with_event(terminated)
            if decision.restart:
                return s.restarting(now, decision.delay_ns, decision.reason)
            if decision.failed:
                s = s.with_event(TaskEvent(EVENT_NOT_RESTARTING, decision.reason, now))
            return s.dead(now, failed=decision.failed)

        self._set(record_exit, handle=None, window=window)
        if decision.restart:
            TASK_RESTARTS.labels(self.spec.driver).inc()
            # A kill or detach wakes this early; the loop then sees which one it was.
            self._wake.wait(decision.delay_ns / 1e9)
        return decision.restart


@dataclass(frozen=True, slots=True)
class _Exit:
    """How one run of the task ended; ``ran`` is False when it never started."""

    result: ExitResult
    ran: bool
    # Stopped for an operator's restart: start again without asking the restart policy.
    user_restart: bool = False


def _terminated_event(result: ExitResult, now: int) -> TaskEvent:
    code = -1 if result.exit_code is None else result.exit_code
    text = result.message or f"Exit Code: {result.exit_code}"
    return TaskEvent(EVENT_TERMINATED, text, now, exit_code=code)
