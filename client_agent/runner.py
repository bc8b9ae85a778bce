"""AllocRunner: the tasks of one alloc, its local record, and the status it reports.

Every task change arrives in ``_task_changed``. Under the runner's lock it takes one
snapshot of every task, writes the alloc record (``state.StateDB``), derives the alloc's
client status from all task states together (``taskstate.alloc_status``), and hands that
to ``on_update``, in this order, so what the servers hear is never ahead of the disk and
updates leave in the order they happened.

Deployment health: while the alloc belongs to a deployment whose group asks the client
(``health.health_policy``), a ``health.HealthTracker`` watches it, poked on every task
change. Its verdict is kept per ``deployment_id`` (``_verdict``), written into the local
record's copy of the alloc (so a restarted agent does not decide twice) and sent with every
status from then on. A new ``deployment_id`` from the servers (an in-place update into a
newer deployment) cancels the tracker and starts a fresh one; a verdict the servers already
hold for the current deployment (an operator's, or ours from before a restart) is final.

Task order: which task may start, and when the others must be stopped (a prestart task
first, the leader's exit, a failed sibling, only sidecars left), is decided by
``lifecycle.plan_steps`` from all task states after every change (``_advance_locked``), and
in which order they stop by ``lifecycle.stop_wave`` (the leader, then the main tasks, then
the sidecars, each wave once the one before is dead); done here: a task is started at most
once, a stop is sent at most once per task.

Lifecycle: ``start()`` runs the tasks; ``stop(reason)`` kills them in that order (dead, not
failed: the alloc ends ``complete``), then runs the poststop tasks; ``detach()`` leaves them
running for the next agent, which builds the runner again from the record
(``AllocRunner(..., record=record)``); ``destroy()`` forgets the alloc (the servers
garbage-collected it, or forgot it without a stop first) and stops its tasks as ``stop``
does, in the same waves and so within the same budget (``longest_kill_timeout_ns``),
reporting nothing more.
"""

from __future__ import annotations

import random
import signal
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

import structlog

from drover.client.checks import check_specs
from drover.client.checkwatch import CheckWatcher, reported_statuses, with_statuses
from drover.client.clock import Clock
from drover.client.drivers.base import Driver, TaskHandle, TaskSpec, parse_config_json
from drover.client.errors import DriverConfigError, StateError
from drover.client.health import (
    CheckStreak,
    DeploymentHealth,
    HealthTracker,
    health_policy,
    recorded_health,
    streaks_of,
    with_health,
)
from drover.client.interpolate import interpolate_config
from drover.client.lifecycle import HOOK_POSTSTOP, TaskRole, plan_steps, roles_of, stop_wave
from drover.client.restarts import RestartPolicy, default_restart_policy
from drover.client.servicewatch import AllocServices
from drover.client.state import AllocRecord, StateDB, TaskRecord
from drover.client.taskenv import dir_env, node_values, task_env
from drover.client.taskrunner import TaskRunner
from drover.client.taskstate import CLIENT_FAILED, AllocStatus, alloc_status
from drover.client.templates import TaskFiles, change_action, splay_delay_ns
from drover.common.taskstate import (
    EVENT_RECEIVED,
    EVENT_RECONNECTED,
    EVENT_RESTART_SIGNALED,
    TASK_RUNNING,
    TaskEvent,
    TaskState,
)
from drover.v1 import structs_pb2

__all__ = ["AllocRunner", "job_key", "restart_policy_of"]

DEFAULT_KILL_TIMEOUT_NS: Final = 5_000_000_000
# The task event of an alloc stopped by its group's max_run_duration.
EVENT_MAX_RUN_DURATION: Final = "Max Run Duration Exceeded"

log = structlog.get_logger("drover.client.alloc")


def job_key(alloc: structs_pb2.Allocation) -> str:
    """The key of the alloc's job in ``ClientAllocsResponse.jobs``."""
    return f"{alloc.job_id}@{alloc.job_version}"


def find_group(job: structs_pb2.Job | None, name: str) -> structs_pb2.TaskGroup | None:
    if job is None:
        return None
    return next((g for g in job.groups if g.name == name), None)


def restart_policy_of(
    job: structs_pb2.Job, group: structs_pb2.TaskGroup, task: structs_pb2.Task | None = None
) -> RestartPolicy:
    """The task's own restart block (the jobspec laid it over the group's), else the group's."""
    if task is not None and task.HasField("restart"):
        r = task.restart
    elif group.HasField("restart"):
        r = group.restart
    else:
        return default_restart_policy(job.type)
    return RestartPolicy(
        attempts=r.attempts, interval_ns=r.interval_ns, delay_ns=r.delay_ns, mode=r.mode or "fail"
    )


class AllocRunner:
    def __init__(
        self,
        alloc: structs_pb2.Allocation,
        job: structs_pb2.Job | None,
        *,
        drivers: Mapping[str, Driver],
        store: StateDB,
        clock: Clock,
        rng: random.Random,
        on_update: Callable[[AllocStatus], None],
        record: AllocRecord | None = None,
        node: structs_pb2.Node | None = None,
        services: Callable[[], AllocServices] | None = None,
    ) -> None:
        """A runner for a new alloc, or (with ``record``) for one a previous agent ran.

        ``node`` is this agent's node as registered: its names are what a task's config and
        env may interpolate (``${node.unique.name}``, ``${attr.*}``, ``${meta.*}``).
        ``services`` subscribes the alloc to the agent's service watch
        (client_agent/servicewatch.py), for templates' ``nomadService``; called only when a
        task has templates (None: every service resolves to none)."""
        self._alloc = alloc
        self._node = node
        self._job = job
        self._drivers = drivers
        self._store = store
        self._clock = clock
        self._rng = rng
        self._on_update = on_update
        self._lock = threading.RLock()
        self._stop_requested = record.stop_requested if record else False
        self._stop_reason = record.stop_reason if record else ""
        self._destroyed = False
        self._started = False
        self._log = log.bind(node_id=alloc.node_id, alloc_id=alloc.id, job_id=alloc.job_id)
        self._error = ""
        self._tasks: dict[str, TaskRunner] = {}
        self._roles: tuple[TaskRole, ...] = ()
        # Tasks already told to stop by their siblings' fate (each is told once), and the
        # tasks already sent their kill (each once, in lifecycle.stop_wave's order).
        self._told_to_stop: set[str] = set()
        self._killed: set[str] = set()
        self._verdict: DeploymentHealth | None = recorded_health(alloc)
        self._tracker: HealthTracker | None = None
        # Cancelled trackers whose thread may still finish a check: joined by join().
        self._old_trackers: list[HealthTracker] = []
        # Templates, artifacts and payloads by task, and the services templates read.
        self._files: dict[str, TaskFiles] = {}
        has_templates = job is not None and any(
            t.templates for g in job.groups if g.name == alloc.task_group for t in g.tasks
        )
        self._services = services() if services is not None and has_templates else None
        # The group's max_run_duration: the timer that ends the alloc, and whether it did.
        self._run_timer: threading.Timer | None = None
        self._run_limit_hit = ""
        # Templates' wait and splay: the timer of the next due re-render, and per task the
        # action held by its splay (the templates it covers) and that timer.
        self._rerender_timer: threading.Timer | None = None
        self._splay_pending: dict[str, list[structs_pb2.Template]] = {}
        self._splay_timers: dict[str, threading.Timer] = {}
        # The alloc's checks, run for its whole life (client_agent/checkwatch.py), and the
        # watchers of its job's older versions, stopped, for join().
        self._checks: CheckWatcher | None = None
        self._old_checks: list[CheckWatcher] = []
        group = find_group(job, alloc.task_group)
        if job is None:
            self._error = f"job {job_key(alloc)} was not sent with the alloc"
        elif group is None:
            self._error = f"task group {alloc.task_group!r} not in job {job_key(alloc)}"
        else:
            self._build_tasks(job, group, record)

    def _build_tasks(
        self, job: structs_pb2.Job, group: structs_pb2.TaskGroup, record: AllocRecord | None
    ) -> None:
        now = self._clock.now_ns()
        node_names = node_values(self._node)
        self._roles = roles_of(group.tasks)
        for task in group.tasks:
            policy = restart_policy_of(job, group, task)
            task_dir = self._store.alloc_dirs_root / self._alloc.id / task.name
            env = task_env(self._alloc, job, group, task, node=self._node, task_dir=task_dir)
            setup_error = ""
            config: dict[str, Any] = {}
            try:
                config = interpolate_config(parse_config_json(task.config_json, task.name), env, node_names)
            except DriverConfigError as exc:
                setup_error = str(exc)
            driver = self._drivers.get(task.driver)
            files: TaskFiles | None = None
            if task.templates or task.artifacts or task.HasField("dispatch_payload"):
                files = TaskFiles(
                    task,
                    payload=job.payload,
                    task_dir=task_dir,
                    env=env,
                    node_names=node_names,
                    services=self._services.lookup if self._services else lambda name: (),
                )
                self._files[task.name] = files
            spec = TaskSpec(
                alloc_id=self._alloc.id,
                name=task.name,
                driver=task.driver,
                config=config,
                env=env,
                kill_timeout_ns=task.kill_timeout_ns or DEFAULT_KILL_TIMEOUT_NS,
                job_id=job.id,
                group=group.name,
                kill_signal=_signal_number(task.kill_signal),
                shutdown_delay_ns=max(task.shutdown_delay_ns, 0),
                user=task.user,
            )
            previous = record.tasks.get(task.name) if record else None
            recovered: TaskHandle | None = None
            if previous is None:
                previous = TaskRecord(
                    state=TaskState().with_event(TaskEvent(EVENT_RECEIVED, "Task received by client", now))
                )
            elif previous.handle is not None and not previous.state.is_dead and driver is not None:
                recovered = driver.recover(previous.handle)
                self._log.info(
                    "alloc.task_recover",
                    task=task.name,
                    pid=previous.state.pid,
                    recovered=recovered is not None,
                )
            self._tasks[task.name] = TaskRunner(
                spec=spec,
                driver=driver,
                job_type=job.type,
                policy=policy,
                task_dir=task_dir,
                clock=self._clock,
                rng=self._rng,
                on_change=self._task_changed,
                log=self._log,
                record=previous,
                recovered=recovered,
                setup_error=setup_error,
                prepare=files.prepare if files is not None else None,
            )

    # -- what the agent reads ----------------------------------------------------------

    @property
    def alloc_id(self) -> str:
        return self._alloc.id

    @property
    def alloc(self) -> structs_pb2.Allocation:
        with self._lock:
            return self._alloc

    @property
    def stop_requested(self) -> bool:
        with self._lock:
            return self._stop_requested

    @property
    def stop_on_client_after_ns(self) -> int:
        """The group's ``disconnect.stop_on_client_after`` (0: never stop on disconnect)."""
        with self._lock:
            group = find_group(self._job, self._alloc.task_group)
        if group is None or not group.HasField("disconnect"):
            return 0
        return max(0, group.disconnect.stop_on_client_after_ns)

    def status(self) -> AllocStatus:
        with self._lock:
            return self._status_locked()

    def _status_locked(self) -> AllocStatus:
        if self._error:
            return AllocStatus(self._alloc.id, CLIENT_FAILED, self._error, {})
        status = alloc_status(self._alloc.id, {n: t.snapshot().state for n, t in self._tasks.items()})
        if self._run_limit_hit and status.client_status == "complete":
            # Killed for running too long: a failure (the reschedule policy decides).
            return AllocStatus(status.alloc_id, CLIENT_FAILED, self._run_limit_hit, status.task_states)
        description = status.description
        if self._stop_requested and self._stop_reason and status.client_status == "complete":
            description = self._stop_reason
        return AllocStatus(
            status.alloc_id,
            status.client_status,
            description,
            status.task_states,
            self._health_locked(),
            self._checks.statuses() if self._checks is not None else (),
        )

    def _health_locked(self) -> DeploymentHealth | None:
        """The verdict for the alloc's current deployment, with the servers' canary flag."""
        verdict = self._verdict
        if verdict is None or verdict.deployment_id != self._alloc.deployment_id:
            return None
        canary = self._alloc.HasField("deployment_status") and self._alloc.deployment_status.canary
        return DeploymentHealth(verdict.deployment_id, verdict.health, verdict.timestamp_ns, canary)

    @property
    def deployment_health(self) -> DeploymentHealth | None:
        with self._lock:
            return self._health_locked()

    @property
    def health_watched_deployment(self) -> str:
        """The deployment whose verdict a tracker is deciding now ("": none)."""
        with self._lock:
            tracker = self._tracker
            return tracker.policy.deployment_id if tracker is not None and not tracker.done else ""

    def is_finished(self) -> bool:
        """Every task is dead (or the alloc could not run at all)."""
        with self._lock:
            return bool(self._error) or all(t.snapshot().state.is_dead for t in self._tasks.values())

    def longest_kill_timeout_ns(self) -> int:
        """The longest a stop of the alloc may take: its waves (leader, main tasks,
        sidecars: lifecycle.stop_wave) stop one after the other, each as long as its slowest
        task's shutdown_delay and kill_timeout."""

        def slowest(roles: list[TaskRole]) -> int:
            return max(
                (
                    self._tasks[r.name].spec.kill_timeout_ns + self._tasks[r.name].spec.shutdown_delay_ns
                    for r in roles
                    if r.name in self._tasks
                ),
                default=0,
            )

        stopped = [r for r in self._roles if r.hook != HOOK_POSTSTOP]
        leaders = [r for r in stopped if r.leader]
        main = [r for r in stopped if not r.leader and not r.sidecar]
        sidecars = [r for r in stopped if not r.leader and r.sidecar]
        return slowest(leaders) + slowest(main) + slowest(sidecars)

    def task_runners(self) -> dict[str, TaskRunner]:
        """The alloc's tasks by name, for what an operator asks of one (logs, restart,
        signal: client_agent/tunnel.py); empty when the alloc could not run at all."""
        return dict(self._tasks)

    def task_records(self) -> dict[str, TaskRecord]:
        with self._lock:
            return {n: t.snapshot() for n, t in self._tasks.items()}

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
            # First, so the first report carries the checks' statuses the servers already
            # hold (an agent restarted), not none: a check keeps its status until it runs.
            self._watch_checks_locked()
            self._persist_and_report()
            # Tasks a previous agent started are re-attached (or judged) whatever their
            # hook: the plan below only gates the first start, and orders the stop of an
            # alloc that was being stopped.
            for task in self._tasks.values():
                if task.snapshot().state.started_at_ns > 0:
                    task.start()
            self._advance_locked()
            self._watch_health_locked()
            if self._services is not None:
                if self._stop_requested:
                    self._services.stop()  # nothing will re-render: leave the agent's watch
                else:
                    self._services.watch(self._services_changed)
            self._limit_run_locked()

    def update(self, alloc: structs_pb2.Allocation, job: structs_pb2.Job | None) -> None:
        """The server changed the alloc (an in-place update): keep the newer copy. The
        running tasks take the new version's restart policy (``TaskRunner.set_policy``):
        an update that changes only ``restart`` is in place, so nothing else would."""
        with self._lock:
            self._alloc = alloc
            if job is not None:
                self._job = job
                self._update_policies_locked(job)
            held = recorded_health(alloc)
            if held is not None:
                self._verdict = held
            elif self._verdict is not None and self._verdict.deployment_id != alloc.deployment_id:
                self._verdict = None
            self._persist()
            self._watch_health_locked()
            self._watch_checks_locked()

    def _update_policies_locked(self, job: structs_pb2.Job) -> None:
        group = find_group(job, self._alloc.task_group)
        if group is None:
            return
        for task in group.tasks:
            runner = self._tasks.get(task.name)
            if runner is not None:
                runner.set_policy(restart_policy_of(job, group, task))

    def stop(self, reason: str) -> None:
        """Kill every task (each with its kill_timeout). Idempotent."""
        with self._lock:
            if self._stop_requested and self._started:
                return
            self._stop_requested = True
            self._stop_reason = reason
            self._log.info("alloc.stopping", reason=reason)
            self._end_watches_locked()
            # Tasks killed on purpose say nothing about the version's health.
            self._cancel_tracker_locked()
            self._persist()
            if self._started:
                self._advance_locked()

    def _advance_locked(self) -> None:
        """Start what the lifecycle now allows, and stop what must stop (the siblings' fate,
        or every task but the poststop ones once the alloc is being stopped) in
        ``stop_wave``'s order: each wave once the one before it is dead. A task that never
        started is started only to end it at once (dead, not pending)."""
        if not self._started or self._error:
            return
        stopping = self._stop_requested or self._destroyed
        states = {n: t.snapshot().state for n, t in self._tasks.items()}
        steps = plan_steps(self._roles, states, stopping=stopping)
        now = self._clock.now_ns()
        for name in steps.stop:
            if name in self._told_to_stop:
                continue
            self._told_to_stop.add(name)
            self._log.info("alloc.task_stopped_by_siblings", task=name, reason=steps.stop_reason)
            self._tasks[name].add_event(TaskEvent(steps.stop_reason, steps.stop_message, now))
        to_stop = set(self._told_to_stop)
        if stopping:
            to_stop |= {r.name for r in self._roles if r.hook != HOOK_POSTSTOP}
        for name in stop_wave(self._roles, states, to_stop):
            if name in self._killed:
                continue
            self._killed.add(name)
            task = self._tasks[name]
            task.kill()
            task.start()
        for name in steps.start:
            if name not in to_stop:
                self._tasks[name].start()

    def reconnect(self) -> None:
        """The servers saw this alloc as unknown while disconnected: note it, report again."""
        now = self._clock.now_ns()
        self._log.info("alloc.reconnected")
        tasks = list(self._tasks.values())
        for task in tasks:
            task.add_event(TaskEvent(EVENT_RECONNECTED, "Client reconnected", now))
        if not tasks:
            with self._lock:
                self._persist_and_report()

    def detach(self) -> None:
        """Stop watching the tasks and leave them running (agent restart or upgrade)."""
        with self._lock:
            self._cancel_tracker_locked()
            self._end_watches_locked()
        for task in self._tasks.values():
            task.detach()

    def destroy(self) -> None:
        """The servers forgot the alloc: stop its tasks in ``stop``'s waves (the leader,
        the main tasks, the sidecars, then the poststop tasks run: ``_advance_locked`` goes
        on after each task's end) and remove its record. Idempotent."""
        with self._lock:
            if self._destroyed:
                return
            self._destroyed = True
            self._log.info("alloc.destroying", stop_requested=self._stop_requested)
            self._cancel_tracker_locked()
            self._end_watches_locked()
            self._advance_locked()
            try:
                self._store.delete_alloc(self._alloc.id)
            except StateError as exc:
                self._log.error("alloc.destroy_failed", error=str(exc))

    def join(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s`` in all) for every task thread to end."""
        deadline = self._clock.monotonic_ns() + int(timeout_s * 1e9)
        ok = True
        for task in list(self._tasks.values()):
            remaining = (deadline - self._clock.monotonic_ns()) / 1e9
            ok = task.join(remaining) and ok
        with self._lock:
            trackers = [*self._old_trackers, *([self._tracker] if self._tracker else [])]
        for tracker in trackers:
            remaining = (deadline - self._clock.monotonic_ns()) / 1e9
            ok = tracker.join(remaining) and ok
        if self._services is not None:
            ok = self._services.join((deadline - self._clock.monotonic_ns()) / 1e9) and ok
        for checks in [*self._old_checks, *([self._checks] if self._checks else [])]:
            ok = checks.join((deadline - self._clock.monotonic_ns()) / 1e9) and ok
        return ok

    # -- templates and max_run_duration ----------------------------------------------

    def _services_changed(self) -> None:
        """The services a template reads changed: each template renders once its ``wait``
        allows (at once without one: ``_rerender_due``)."""
        with self._lock:
            if self._stop_requested or self._destroyed:
                return
            files = list(self._files.values())
        now = self._clock.monotonic_ns()
        for task_files in files:
            task_files.note_change(now)
        self._rerender_due()

    def _rerender_due(self) -> None:
        """Render what is due now, act on what changed, and set the timer for the next due
        template (one timer for the alloc: each call sets it for the earliest)."""
        with self._lock:
            if self._stop_requested or self._destroyed:
                return
            targets = [
                (self._tasks[name], files) for name, files in self._files.items() if name in self._tasks
            ]
        now = self._clock.monotonic_ns()
        next_due: int | None = None
        for task, files in targets:
            changed, due = files.rerender_due(now)
            if due is not None:
                next_due = due if next_due is None else min(next_due, due)
            if changed:
                self._act_on_templates(task, changed)
        with self._lock:
            if self._rerender_timer is not None:
                self._rerender_timer.cancel()
                self._rerender_timer = None
            if next_due is not None and not self._stop_requested and not self._destroyed:
                self._rerender_timer = threading.Timer(max(0, next_due - now) / 1e9, self._rerender_due)
                self._rerender_timer.daemon = True
                self._rerender_timer.start()

    def _act_on_templates(self, task: TaskRunner, changed: list[structs_pb2.Template]) -> None:
        """Apply the change_mode of ``changed`` after its splay (a random part of it, from
        the runner's injected rng). Changes that come while a task's splay runs join the
        action already waiting, as Nomad's handler holds them until it acts."""
        with self._lock:
            waiting = self._splay_pending.get(task.name)
            if waiting is not None:
                waiting.extend(changed)
                return
            delay_ns = splay_delay_ns(changed, self._rng.random())
            if delay_ns > 0:
                self._splay_pending[task.name] = list(changed)
                timer = threading.Timer(delay_ns / 1e9, self._splay_over, args=(task,))
                timer.daemon = True
                self._splay_timers[task.name] = timer
                self._log.info("alloc.template_splay", task=task.name, delay_s=delay_ns / 1e9)
                timer.start()
                return
        self._apply_change_mode(task, changed)

    def _splay_over(self, task: TaskRunner) -> None:
        with self._lock:
            changed = self._splay_pending.pop(task.name, [])
            self._splay_timers.pop(task.name, None)
            if self._stop_requested or self._destroyed:
                return
        if changed:
            self._apply_change_mode(task, changed)

    def _apply_change_mode(self, task: TaskRunner, changed: list[structs_pb2.Template]) -> None:
        """Restart wins over signal, as in Nomad; an env template can only take effect
        through a restart."""
        restart, signals = change_action(changed)
        self._log.info("alloc.template_rerendered", task=task.name, restart=restart, signals=signals)
        if restart:
            message = "Template with change_mode restart re-rendered"
            task.add_event(TaskEvent(EVENT_RESTART_SIGNALED, message, self._clock.now_ns()))
            task.restart(message)
            return
        for name in signals:
            try:
                task.signal(_signal_number(name), name)
            except DriverConfigError as exc:
                self._log.warning("alloc.template_signal_failed", task=task.name, error=str(exc))

    def _limit_run_locked(self) -> None:
        """Start the max_run_duration timer, counted from the alloc's first task start
        (a restored runner counts from the start a previous agent recorded)."""
        group = find_group(self._job, self._alloc.task_group)
        limit = group.max_run_duration_ns if group is not None else 0
        if limit <= 0 or self._stop_requested or self._run_timer is not None:
            return
        starts = [t.snapshot().state.started_at_ns for t in self._tasks.values()]
        started = min((s for s in starts if s > 0), default=self._clock.now_ns())
        delay_s = max(0.0, (started + limit - self._clock.now_ns()) / 1e9)
        self._run_timer = threading.Timer(delay_s, self._run_limit_reached, args=(limit,))
        self._run_timer.daemon = True
        self._run_timer.start()

    def _run_limit_reached(self, limit_ns: int) -> None:
        with self._lock:
            if self._stop_requested or self._destroyed or self.is_finished():
                return
            self._run_limit_hit = f"max_run_duration of {limit_ns / 1e9:g}s exceeded"
            now = self._clock.now_ns()
            for task in self._tasks.values():
                task.add_event(TaskEvent(EVENT_MAX_RUN_DURATION, self._run_limit_hit, now))
        self.stop(self._run_limit_hit)

    def _end_watches_locked(self) -> None:
        if self._checks is not None:
            self._checks.stop()
        if self._services is not None:
            self._services.stop()
        if self._run_timer is not None:
            self._run_timer.cancel()
        if self._rerender_timer is not None:
            self._rerender_timer.cancel()
        for timer in self._splay_timers.values():
            timer.cancel()
        self._splay_timers.clear()
        self._splay_pending.clear()

    # -- deployment health -------------------------------------------------------------

    def _watch_health_locked(self) -> None:
        """Keep exactly one tracker on the alloc's current deployment, while one is needed."""
        current = self._alloc.deployment_id
        if self._verdict is not None and self._verdict.deployment_id == current:
            # Decided, by this tracker or by the servers (an operator): nothing left to watch.
            self._cancel_tracker_locked()
            return
        if self._tracker is not None and self._tracker.policy.deployment_id == current:
            return
        self._cancel_tracker_locked()
        if not self._started or self._stop_requested or self._destroyed or self._error or self._job is None:
            return
        policy = health_policy(self._alloc, self._job)
        if policy is None:
            return

        def decided(health: str, timestamp_ns: int, reason: str) -> None:
            self._health_decided(tracker, health, timestamp_ns, reason)

        tracker = HealthTracker(
            policy,
            check_specs(self._alloc, self._job, self._task_envs()) if policy.use_checks else (),
            clock=self._clock,
            tasks=self._task_states,
            on_health=decided,
            streaks=self._check_streaks,
            log_fields={
                "alloc_id": self._alloc.id,
                "job_id": self._alloc.job_id,
                "node_id": self._alloc.node_id,
            },
        )
        self._tracker = tracker
        tracker.start()

    def _cancel_tracker_locked(self) -> None:
        if self._tracker is not None:
            self._tracker.cancel()
            self._old_trackers = [t for t in self._old_trackers if not t.join(0)]
            self._old_trackers.append(self._tracker)
            self._tracker = None

    def _task_envs(self) -> dict[str, tuple[dict[str, str], str]]:
        """What a script check runs with: the task's environment and directory, as its driver sets them."""
        envs: dict[str, tuple[dict[str, str], str]] = {}
        for name, task in self._tasks.items():
            task_dir = task.task_dir
            envs[name] = ({**dir_env(str(task_dir.parent), str(task_dir)), **task.spec.env}, str(task_dir))
        return envs

    def _task_states(self) -> dict[str, TaskState]:
        # No runner lock: the tracker's thread must not wait on a runner that waits on it.
        return {name: task.snapshot().state for name, task in self._tasks.items()}

    # -- service checks ----------------------------------------------------------------

    def _watch_checks_locked(self) -> None:
        """Run the alloc's checks for as long as it runs: their statuses go out with the
        alloc's, and a check_restart restarts its task (client_agent/checkwatch.py). An
        in-place update that changes the checks gets a new watcher, which keeps the
        statuses of the checks it still has."""
        if not self._started or self._stop_requested or self._destroyed or self._error:
            return
        specs = check_specs(self._alloc, self._job, self._task_envs()) if self._job is not None else []
        old = self._checks
        if old is not None and old.specs == tuple(specs):
            return
        known = old.statuses() if old is not None else reported_statuses(self._alloc)
        if old is not None:
            old.stop()
            self._old_checks = [w for w in self._old_checks if not w.join(0)]
            self._old_checks.append(old)
            self._checks = None
        if not specs:
            return
        self._checks = CheckWatcher(
            specs,
            clock=self._clock,
            task_starts=self._running_task_starts,
            on_change=self._checks_changed,
            restart=self._restart_for_check,
            known=known,
            log_fields={
                "alloc_id": self._alloc.id,
                "job_id": self._alloc.job_id,
                "node_id": self._alloc.node_id,
            },
        )
        self._checks.start()

    def _running_task_starts(self) -> dict[str, int]:
        # No runner lock, as for _task_states.
        states = self._task_states()
        return {name: s.started_at_ns for name, s in states.items() if s.state == TASK_RUNNING}

    def _checks_changed(self) -> None:
        with self._lock:
            if not self._destroyed:
                self._persist_and_report()
            if self._tracker is not None:
                self._tracker.poke()

    def _check_streaks(self) -> dict[str, CheckStreak]:
        """What deployment health judges the checks by: the watcher's results (no lock, as
        for _task_states)."""
        watcher = self._checks
        return streaks_of(watcher.statuses_by_key()) if watcher is not None else {}

    def _restart_for_check(self, name: str, reason: str) -> None:
        """A check_restart's limit reached: restart the task as a failure (its restart
        policy decides whether and when it starts again)."""
        with self._lock:
            task = self._tasks.get(name)
            if task is None or self._stop_requested or self._destroyed:
                return
        task.add_event(TaskEvent(EVENT_RESTART_SIGNALED, f"Restart signaled: {reason}", self._clock.now_ns()))
        task.restart(reason, failure=True)

    def _health_decided(self, tracker: HealthTracker, health: str, timestamp_ns: int, reason: str) -> None:
        with self._lock:
            if tracker is not self._tracker:
                # Cancelled (stop, detach, destroy, the servers' word first) or replaced by
                # the tracker of a newer deployment, after its last look: not ours to record.
                return
            self._verdict = DeploymentHealth(tracker.policy.deployment_id, health, timestamp_ns)
            self._log.info(
                "alloc.deployment_health",
                deployment_id=tracker.policy.deployment_id,
                health=health,
                reason=reason,
            )
            self._persist_and_report()

    # -- task changes ------------------------------------------------------------------

    def _task_changed(self, _name: str) -> None:
        with self._lock:
            if self._destroyed:
                # Forgotten by the servers: nothing to record or report, but the stop's
                # next wave waits for this task's end.
                self._advance_locked()
                return
            self._persist_and_report()
            self._advance_locked()
            if self._tracker is not None:
                self._tracker.poke()

    def _record(self) -> AllocRecord:
        verdict = self._health_locked()
        held = recorded_health(self._alloc)
        alloc = self._alloc if verdict is None or held is not None else with_health(self._alloc, verdict)
        if self._checks is not None:
            alloc = with_statuses(alloc, self._checks.statuses())
        return AllocRecord(
            alloc=alloc,
            job=self._job,
            tasks={n: t.snapshot() for n, t in self._tasks.items()},
            stop_requested=self._stop_requested,
            stop_reason=self._stop_reason,
        )

    def _persist(self) -> None:
        if self._destroyed:
            return
        try:
            self._store.put_alloc(self._record())
        except StateError as exc:
            # Keep running: the tasks matter more than the record; the next change retries.
            self._log.error("alloc.persist_failed", error=str(exc))

    def _persist_and_report(self) -> None:
        self._persist()
        self._on_update(self._status_locked())


def _signal_number(name: str) -> int:
    """A validated kill_signal name ("SIGINT") as this OS's number; "" is SIGTERM."""
    if not name:
        return signal.SIGTERM
    try:
        return int(signal.Signals[name])
    except KeyError:
        return signal.SIGTERM
