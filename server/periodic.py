"""The periodic dispatcher: the leader launches periodic jobs' children when their cron says.

Theory of operation
-------------------
Only the leader's dispatcher is enabled (``LeaderServices`` enables it last on establish and
disables it first on revoke). It keeps, per active periodic job (periodic, enabled, not
stopped, not parameterized), the time of its last launch and its next slot, and is driven
by ``tick(now)``: from its own thread in a server, directly from tests with any clock.

Each tick re-reads the state when jobs or launch records changed, then, for every job whose
next slot has come, launches **one** child: for the latest slot at or before ``now``. A
leader that was down across several slots therefore launches one catch-up child, not one
per missed slot, and a slow tick coalesces slots the same way.

A launch is one raft entry (``JobRegisterEntry`` with ``launch`` set): the child job, its
evaluation and the parent's launch record, stamped with the slot time. The FSM applies all
three or none, and refuses a launch whose slot is not after the recorded one. That is the
whole "never launch a slot twice" argument: it holds whichever server leads, across leader
changes, and even while pysyncobj briefly reports two leaders, because both would propose
the same slot and only the first commit wins.

Where a job's last launch comes from: the launch record in the state, or the job's
submit time if that is later (a job registered or changed at t has no slot before t to
catch up on; Nomad likewise recomputes the next launch from "now" on registration).

``prohibit_overlap``: a slot whose parent still has a pending or running child is skipped
(no child, no launch record, logged). Job status is derived by the FSM from allocations
and evaluations (never from a submitted value), so the check cannot be fooled by a stale
status. A new leader may later find that skipped slot "missed" and launch it, unless a child
is still running then (Nomad >= 1.5.4 does the same).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

import structlog

from drover.scheduler.periodic import SECOND_NS, derive_periodic_child, due_launch, next_periodic_launch
from drover.scheduler.structs import (
    JOB_STATUS_DEAD,
    TRIGGER_PERIODIC_JOB,
    Job,
    PeriodicConfig,
    PeriodicLaunch,
    job_eval,
)
from drover.server.clock import Clock, IdSource
from drover.server.codec import to_proto
from drover.server.errors import RaftError
from drover.server.fsm import ApplyResult, encode_entry
from drover.server.state_store import JobKey, Snapshot, StateStore
from drover.v1 import raft_pb2

__all__ = [
    "ALREADY_LAUNCHED",
    "FAILED",
    "LAUNCHED",
    "REFUSED",
    "SKIPPED_OVERLAP",
    "LaunchOutcome",
    "PeriodicDispatcher",
    "force_launch_ns",
    "has_live_children",
    "is_active_periodic",
    "launch_entry",
]

log = structlog.get_logger("drover.periodic")

ET = raft_pb2.EntryType

# The loop wakes at a job's next slot, and at least this often to notice new jobs; never
# more often than MIN_SLEEP_S, so a launch that cannot happen does not spin.
MAX_SLEEP_S: Final = 0.25
MIN_SLEEP_S: Final = 0.01
PROPOSE_TIMEOUT_S: Final = 10.0

# Outcomes of one launch attempt, as ``tick`` reports them.
LAUNCHED: Final = "launched"
SKIPPED_OVERLAP: Final = "skipped-overlap"
ALREADY_LAUNCHED: Final = "already-launched"
REFUSED: Final = "refused"
FAILED: Final = "failed"


class Propose(Protocol):
    def __call__(self, data: bytes, timeout: float) -> ApplyResult: ...


@dataclass(frozen=True, slots=True)
class LaunchOutcome:
    namespace: str
    job_id: str
    launch_ns: int
    outcome: str
    child_id: str = ""
    eval_id: str = ""
    index: int = 0
    error: str = ""


@dataclass(slots=True)
class _Tracked:
    periodic: PeriodicConfig
    last_ns: int
    next_ns: int | None


def is_active_periodic(job: Job) -> bool:
    """Nomad's IsPeriodicActive: the dispatcher launches children for this job."""
    return job.is_periodic_active()


def has_live_children(snap: Snapshot, parent: Job) -> bool:
    """A child that is pending or running (statuses the FSM derives from allocs and evals)."""
    return any(child.status != JOB_STATUS_DEAD for child in snap.children(parent.namespace, parent.id))


def force_launch_ns(snap: Snapshot, parent: Job, now_ns: int) -> int:
    """The slot a forced launch takes: now, on a whole second (the child ID's resolution),
    and after the recorded launch, so a force never collides with a launched child."""
    slot = now_ns - now_ns % SECOND_NS
    recorded = snap.periodic_launch(parent.namespace, parent.id)
    if recorded is not None and slot <= recorded.launch_ns:
        slot = recorded.launch_ns - recorded.launch_ns % SECOND_NS + SECOND_NS
    return slot


def launch_entry(parent: Job, launch_ns: int, now_ns: int, eval_id: str) -> raft_pb2.JobRegisterEntry:
    """The one entry of a launch: the fresh child, its eval, and the parent's launch record."""
    child = derive_periodic_child(parent, launch_ns, now_ns)
    entry = raft_pb2.JobRegisterEntry()
    to_proto(child, entry.job)
    to_proto(job_eval(eval_id, child, TRIGGER_PERIODIC_JOB, now_ns), entry.eval)
    to_proto(PeriodicLaunch(job_id=parent.id, namespace=parent.namespace, launch_ns=launch_ns), entry.launch)
    return entry


class PeriodicDispatcher:
    """Leader-only: launches periodic children. ``tick(now)`` is the whole behaviour."""

    def __init__(
        self,
        store: StateStore,
        propose: Propose,
        clock: Clock,
        ids: IdSource,
        still_leader: Callable[[], bool] = lambda: True,
    ) -> None:
        self._store = store
        self._propose = propose
        self._clock = clock
        self._ids = ids
        self._still_leader = still_leader
        self._lock = threading.Lock()
        self._enabled = False
        self._tracked: dict[JobKey, _Tracked] = {}
        self._synced_index = -1
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def set_enabled(self, enabled: bool, *, run_loop: bool = True) -> None:
        """Enable (rebuild from state on the first tick, start the loop) or disable (stop
        the loop, forget everything). ``run_loop=False``: tests call ``tick`` themselves."""
        if not enabled:
            self._stop.set()
            self._wake.set()
            thread, self._thread = self._thread, None
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=PROPOSE_TIMEOUT_S + 5)
        with self._lock:
            self._enabled = enabled
            self._tracked.clear()
            self._synced_index = -1
        if enabled and run_loop:
            self._stop.clear()
            self._wake.clear()
            self._thread = threading.Thread(target=self._run, name="periodic-dispatcher", daemon=True)
            self._thread.start()

    @property
    def enabled(self) -> bool:
        return self._enabled

    def next_launches(self) -> dict[JobKey, int | None]:
        """The next slot of every tracked job (for status output and tests)."""
        with self._lock:
            return {key: t.next_ns for key, t in self._tracked.items()}

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick(self._clock.now_ns())
            except Exception:
                log.exception("periodic.tick_failed")
            wait = MAX_SLEEP_S
            soonest = min((n for n in self.next_launches().values() if n is not None), default=None)
            if soonest is not None:
                wait = min(wait, max(MIN_SLEEP_S, (soonest - self._clock.now_ns()) / 1e9))
            self._wake.wait(wait)
            self._wake.clear()

    # -- the behaviour -----------------------------------------------------------------
    def tick(self, now_ns: int) -> list[LaunchOutcome]:
        """Launch every job whose next slot is at or before ``now_ns`` (one launch each)."""
        with self._lock:
            if not self._enabled:
                return []
            snap = self._store.snapshot()
            self._sync(snap)
            due = [
                key
                for key, t in sorted(self._tracked.items())
                if t.next_ns is not None and t.next_ns <= now_ns
            ]
            outcomes: list[LaunchOutcome] = []
            for key in due:
                if not self._still_leader():
                    log.info("periodic.not_leader", pending=len(due))
                    break
                outcome = self._launch(key, now_ns)
                if outcome is not None:
                    outcomes.append(outcome)
            return outcomes

    def _sync(self, snap: Snapshot) -> None:
        """Track exactly the active periodic jobs, with last launches from the state."""
        index = snap.table_index("jobs", "periodic_launches")
        if index == self._synced_index:
            return
        self._synced_index = index
        seen: set[JobKey] = set()
        for job in snap.periodic_jobs():
            if not is_active_periodic(job):
                continue
            key = (job.namespace, job.id)
            seen.add(key)
            assert job.periodic is not None
            last = _baseline(snap, job)
            tracked = self._tracked.get(key)
            if tracked is None or tracked.periodic != job.periodic:
                self._tracked[key] = _Tracked(job.periodic, last, _next(job.periodic, last))
            elif last > tracked.last_ns:
                tracked.last_ns = last
                # The next slot after ``last`` is still the one computed, unless ``last``
                # reached it: slots are fixed instants. A re-registered job moves its
                # baseline on every write, and croniter costs ~100 us a call.
                if tracked.next_ns is not None and last >= tracked.next_ns:
                    tracked.next_ns = _next(job.periodic, last)
        for key in [k for k in self._tracked if k not in seen]:
            del self._tracked[key]

    def _launch(self, key: JobKey, now_ns: int) -> LaunchOutcome | None:
        tracked = self._tracked[key]
        snap = self._store.snapshot()
        job = snap.job(*key)
        if job is None or not is_active_periodic(job):
            del self._tracked[key]
            return None
        slot = due_launch(tracked.periodic, tracked.last_ns, now_ns)
        if slot is None:
            tracked.next_ns = _next(tracked.periodic, max(tracked.last_ns, now_ns))
            return None
        # Whatever happens below, this slot is done here: the next one is after it.
        tracked.last_ns = slot
        tracked.next_ns = _next(tracked.periodic, slot)
        recorded = snap.periodic_launch(*key)
        if recorded is not None and recorded.launch_ns >= slot:
            return LaunchOutcome(key[0], key[1], slot, ALREADY_LAUNCHED)
        if tracked.periodic.prohibit_overlap and has_live_children(snap, job):
            log.info("periodic.skipped_overlap", job_id=job.id, launch_ns=slot)
            return LaunchOutcome(key[0], key[1], slot, SKIPPED_OVERLAP)
        eval_id = self._ids.new()
        entry = launch_entry(job, slot, now_ns, eval_id)
        child_id = entry.job.id
        try:
            result = self._propose(encode_entry(ET.ENTRY_TYPE_JOB_REGISTER, entry), PROPOSE_TIMEOUT_S)
        except RaftError as exc:
            # Not committed (or unknown): the FSM's launch record decides if it ever applies.
            log.warning("periodic.launch_failed", job_id=job.id, child_id=child_id, error=str(exc))
            return LaunchOutcome(key[0], key[1], slot, FAILED, child_id=child_id, error=str(exc))
        if result.error:
            log.warning("periodic.launch_refused", job_id=job.id, child_id=child_id, error=result.error)
            return LaunchOutcome(key[0], key[1], slot, REFUSED, child_id=child_id, error=result.error)
        log.info("periodic.launched", job_id=job.id, child_id=child_id, eval_id=eval_id, index=result.index)
        return LaunchOutcome(key[0], key[1], slot, LAUNCHED, child_id, eval_id, result.index)


def _baseline(snap: Snapshot, job: Job) -> int:
    recorded = snap.periodic_launch(job.namespace, job.id)
    return max(recorded.launch_ns if recorded is not None else 0, job.submit_time_ns)


def _next(periodic: PeriodicConfig, after_ns: int) -> int | None:
    try:
        return next_periodic_launch(periodic, after_ns)
    except ValueError:  # validated at registration; a bad spec in old state must not kill the loop
        log.exception("periodic.bad_schedule", specs=periodic.schedules())
        return None
