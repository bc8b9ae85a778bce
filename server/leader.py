"""Leader-only services, started and stopped from one place (Nomad's leader.go).

``establish`` runs only after the local FSM has applied every entry of earlier terms (the
new leader's no-op is applied), then enables, in order: broker, blocked evals, plan queue,
plan applier, the eval watcher (which first rebuilds broker and blocked evals from state),
the broker ticker and the workers. ``revoke`` stops them in reverse. Both run on one
"leadership" thread, never on raft's tick thread. Every side effect checks that this
server still leads in the term it was established in. The periodic dispatcher comes last
(it rebuilds itself from state on its first tick) and goes first. The deployment watcher
(server/deployments/watcher.py) is one more of the threads; it keeps nothing of its own,
so a new leader's watcher carries every deployment on from the state, as does the garbage
collector (server/gc/), which selects from the state each interval.
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Final

import structlog
from prometheus_client import Gauge

from drover.scheduler.structs import (
    EVAL_STATUS_BLOCKED,
    EVAL_STATUS_FAILED,
    EVAL_STATUS_PENDING,
    NODE_STATUS_DOWN,
    TRIGGER_FAILED_FOLLOW_UP,
    Evaluation,
    follow_up_eval,
)
from drover.server.blocked import BlockedEvals
from drover.server.broker import EvalBroker
from drover.server.deployments.actions import DeploymentActions
from drover.server.deployments.watcher import DeploymentWatcher
from drover.server.endpoints import propose_write
from drover.server.errors import ConflictError, NotFoundError, RaftError
from drover.server.invariants import INVARIANTS, check_invariants
from drover.server.periodic import PeriodicDispatcher
from drover.server.plan_apply import PlanApplier, PlanQueue
from drover.server.restore_followup import followup, followup_entry
from drover.server.worker import Worker, write_evals
from drover.v1 import raft_pb2

if TYPE_CHECKING:
    from drover.server.core import ServerCore
    from drover.server.fsm import ApplyResult

log = structlog.get_logger("drover.leader")

# A failed eval's follow-up waits this long (Nomad: about a minute), so a persistent
# problem does not spin.
FAILED_FOLLOW_UP_DELAY_NS: Final = 60_000_000_000
# How often the drainer looks for drains with nothing left to move.
DRAIN_CHECK_S: Final = 0.5
TICK_S: Final = 0.05
# The leader checks its state this often for system allocs over count and job summaries that
# differ from a recount (docs/design.md#invariant-1 and #invariant-2, server/invariants.py).
INVARIANT_CHECK_S: Final = 30.0
INVARIANT_LOG_LIMIT: Final = 20
# How often the leader looks for a snapshot restore to follow up (server/restore_followup.py).
RESTORE_CHECK_S: Final = 0.5
INVARIANT_VIOLATIONS = Gauge(
    "drover_invariant_violations",
    "Violations of a design invariant in the leader's state at its last periodic check",
    ["invariant"],
)


class LeaderServices:
    def __init__(self, core: ServerCore, num_workers: int) -> None:
        self.core = core
        self.num_workers = num_workers
        self.broker = EvalBroker()
        self.blocked = BlockedEvals()
        self.plan_queue = PlanQueue()
        self.periodic = PeriodicDispatcher(
            core.store, self._propose_sync, core.clock, core.ids, still_leader=self.still_leader
        )
        self._events: queue.Queue[bool | None] = queue.Queue()
        self._thread = threading.Thread(target=self._leadership_loop, name="leadership", daemon=True)
        self._running: list[threading.Thread] = []
        self._applier: PlanApplier | None = None
        self._workers: list[Worker] = []
        self._stop_services = threading.Event()
        self._term = -1
        self.established = threading.Event()

    # -- wiring ------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        self._events.put(None)
        self._thread.join(timeout=15)

    def on_leadership_change(self, is_leader: bool) -> None:
        """Called on raft's tick thread: hand off and return at once."""
        self._events.put(is_leader)

    def still_leader(self) -> bool:
        raft = self.core.raft
        return raft.is_leader() and raft.term() == self._term

    def _reblock(self, ev: Evaluation) -> None:
        """A still-blocked eval back to the tracker (its snapshot is the worker's, so a
        capacity change after that snapshot releases it again at once)."""
        if self.blocked.missed_unblock(ev):
            self.broker.enqueue(ev, self.core.clock.now_ns())
        else:
            self.blocked.block(ev)

    def _propose(self, data: bytes, timeout: float) -> object:
        return self.core.raft.propose(data, timeout)

    def _propose_sync(self, data: bytes, timeout: float) -> ApplyResult:
        return self.core.raft.propose(data, timeout)

    def _leadership_loop(self) -> None:
        leading = False
        while True:
            event = self._events.get()
            if event is None:
                if leading:
                    self._revoke()
                return
            # Only the latest state matters; collapse a burst of flips.
            while not self._events.empty():
                nxt = self._events.get()
                if nxt is None:
                    if leading:
                        self._revoke()
                    return
                event = nxt
            if event and not leading:
                leading = self._establish()
            elif not event and leading:
                self._revoke()
                leading = False

    # -- establish / revoke ------------------------------------------------------------
    def _establish(self) -> bool:
        raft = self.core.raft
        waited_from = self.core.clock.now_ns()
        next_warning = waited_from + 10_000_000_000
        # Leader services start only once every entry of earlier terms is applied here; a
        # leader that never gets there must say so, not sit as a leader without a scheduler.
        while not raft.leader_ready():
            if not raft.is_leader() or not self._events.empty():
                return False
            now = self.core.clock.now_ns()
            if now > next_warning:
                log.warning(
                    "leader.still_catching_up",
                    server=self.core.name,
                    term=raft.term(),
                    waited_s=round((now - waited_from) / 1e9, 1),
                    applied=raft.applied_index(),
                    commit=raft.commit_index(),
                )
                next_warning = now + 10_000_000_000
            threading.Event().wait(0.01)
        self._term = raft.term()
        self._stop_services.clear()
        self.broker.set_enabled(True)
        self._follow_scheduler_config()
        self.blocked.set_enabled(True)
        self.plan_queue.set_enabled(True)
        heartbeats = self.core.heartbeats
        heartbeats.set_enabled(True)
        live = [n.id for n in self.core.store.snapshot().nodes() if n.status != NODE_STATUS_DOWN]
        heartbeats.initialize(live, self.core.clock.now_ns())
        self._applier = PlanApplier(
            self.plan_queue,
            self.core.store,
            raft.propose_async,
            self.broker.outstanding,
            self.core.clock.now_ns,
            self.still_leader,
        )
        self._applier.start()
        for target, name in (
            (self._watch_evals, "eval-watcher"),
            (self._tick_broker, "broker-ticker"),
            (self._reap_heartbeats, "heartbeat-reaper"),
            (self._check_invariants, "invariant-checker"),
            (self._complete_drains, "drainer"),
            (self._watch_deployments, "deployment-watcher"),
            (self._collect_garbage, "garbage-collector"),
            (self._follow_restores, "restore-follower"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._running.append(thread)
        self._workers = [
            Worker(
                f"{i}",
                self.broker,
                self.plan_queue,
                self.core.store,
                self.core.clock,
                self.core.ids,
                self._propose,
                self._reblock,
            )
            for i in range(self.num_workers)
        ]
        for worker in self._workers:
            worker.start()
        self.periodic.set_enabled(True)
        self.established.set()
        log.info("leader.established", server=self.core.name, term=self._term, workers=self.num_workers)
        return True

    def _revoke(self) -> None:
        self.established.clear()
        self.periodic.set_enabled(False)
        self._stop_services.set()
        for worker in self._workers:
            worker.stop()
        self.plan_queue.set_enabled(False)
        self.broker.set_enabled(False)
        self.blocked.set_enabled(False)
        self.core.heartbeats.set_enabled(False)
        for worker in self._workers:
            worker.join(5)
        if self._applier is not None:
            self._applier.stop()
            self._applier = None
        for thread in self._running:
            thread.join(timeout=5)
        self._running.clear()
        self._workers.clear()
        log.info("leader.revoked", server=self.core.name, term=self._term)

    # -- services ----------------------------------------------------------------------
    def _track(self, eval_ids: set[str] | None) -> None:
        """Route evals to the broker or the blocked tracker; ``None`` means every eval."""
        snap = self.core.store.snapshot()
        now = self.core.clock.now_ns()
        evals = snap.evals() if eval_ids is None else (snap.eval(i) for i in eval_ids)
        cancelled = []
        for ev in evals:
            if ev is None:
                continue
            if ev.status == EVAL_STATUS_PENDING:
                self.broker.enqueue(ev, now)
            elif ev.status == EVAL_STATUS_BLOCKED:
                if self.blocked.missed_unblock(ev):
                    self.broker.enqueue(ev, now)
                else:
                    cancelled.extend(self.blocked.block(ev))
            else:
                self.broker.untrack(ev.id)
                self.blocked.untrack(ev.id)
        if cancelled and self.still_leader():
            write_evals(
                self._propose,
                [
                    replace(c, status="canceled", status_description="superseded by a newer blocked eval")
                    for c in cancelled
                ],
            )

    def _follow_scheduler_config(self) -> None:
        """The broker hands out evals only while the replicated scheduler config does not
        pause it (``operator scheduler set-config -pause-eval-broker``); checked at each
        state change, so it takes effect at the entry that sets it."""
        paused = self.core.store.snapshot().scheduler_config().pause_eval_broker
        if paused != self.broker.paused:
            self.broker.set_paused(paused)
            log.info(
                "leader.eval_broker_paused" if paused else "leader.eval_broker_resumed", server=self.core.name
            )

    def _watch_evals(self) -> None:
        store = self.core.store
        seen = store.index
        self._track(None)  # rebuild from state
        # Capacity may have changed while no leader was watching (between the old leader's
        # last look and now): give every blocked eval one more pass.
        now = self.core.clock.now_ns()
        for ev in self.blocked.unblock_all(seen):
            self.broker.enqueue(ev, now)
        while not self._stop_services.is_set():
            if not store.wait_for_index(seen + 1, 0.2):
                continue
            changes, newest = store.changes_since(seen)
            seen = newest
            self._follow_scheduler_config()
            try:
                if any(c.rescan for c in changes):
                    self._track(None)
                    capacity = True
                else:
                    ids: set[str] = set()
                    for change in changes:
                        ids |= change.evals
                    if ids:
                        self._track(ids)
                    capacity = any(c.capacity for c in changes)
                if capacity:
                    now = self.core.clock.now_ns()
                    for ev in self.blocked.unblock_all(newest):
                        self.broker.enqueue(ev, now)
            except RaftError as exc:
                # A cancel of superseded blocked evals not committed (leadership moved):
                # the next leader rebuilds its trackers from the state and cancels them.
                log.warning("leader.eval_watch_not_committed", reason=str(exc))
            except Exception:
                log.exception("leader.eval_watch_failed")

    def _reap_heartbeats(self) -> None:
        """Nodes whose heartbeat timer ran out become disconnected or down (with evals)."""
        heartbeats = self.core.heartbeats
        while not self._stop_services.wait(0.1):
            for node_id in heartbeats.expired(self.core.clock.now_ns()):
                if not self.still_leader():
                    return
                try:
                    status = self.core.endpoints.heartbeat_missed(node_id)
                except RaftError as exc:
                    # Leadership moved (or the commit timed out) under the write: expected
                    # during a failover, and the next leader's own timers judge the node.
                    log.warning("leader.heartbeat_missed_not_committed", node_id=node_id, reason=str(exc))
                    heartbeats.reset(node_id, self.core.clock.now_ns())
                    continue
                except Exception:
                    log.exception("leader.heartbeat_missed_failed", node_id=node_id)
                    heartbeats.reset(node_id, self.core.clock.now_ns())
                    continue
                log.warning("leader.heartbeat_missed", node_id=node_id, status=status)

    def _complete_drains(self) -> None:
        """End each drain that has nothing left to move (server/drainer.py), as Nomad's
        drainer marks a node's drain complete."""
        while not self._stop_services.wait(DRAIN_CHECK_S):
            draining = [n.id for n in self.core.store.snapshot().nodes() if n.drain_strategy is not None]
            for node_id in draining:
                if not self.still_leader():
                    return
                try:
                    if self.core.endpoints.complete_drain(node_id):
                        log.info("leader.drain_complete", node_id=node_id)
                except (ConflictError, NotFoundError, RaftError) as exc:
                    # An operator's change raced ours and the FSM refused the entry, the node
                    # is gone, or leadership moved: looked at again on the next pass (by
                    # whichever server leads then).
                    log.info("leader.drain_complete_refused", node_id=node_id, reason=str(exc))
                except Exception:
                    log.exception("leader.drain_complete_failed", node_id=node_id)

    def _watch_deployments(self) -> None:
        """Fail, revert and promote deployments (server/deployments/watcher.py); rebuilt
        from the state each time this server becomes the leader."""
        core = self.core
        actions = DeploymentActions(core.raft, core.store, core.clock, core.ids)
        DeploymentWatcher(core.store, actions, core.clock, self.still_leader, self._stop_services).run()

    def _collect_garbage(self) -> None:
        """Every gc interval, collect what has been terminal longer than its threshold."""
        self.core.gc.run(self.still_leader, self._stop_services)

    def _follow_restores(self) -> None:
        """After a snapshot restore: every live node's heartbeat timer is re-armed (a node
        the restored state holds as ready may be long gone), and once the grace period has
        passed the unconfirmed allocs are marked lost and the restored jobs evaluated
        (server/restore_followup.py). Done once per restore by the leader that sees it."""
        core = self.core
        armed = done = 0
        while not self._stop_services.wait(RESTORE_CHECK_S):
            mark = core.restore_watch.mark()
            if mark is None or mark.index <= done:
                continue
            tables = core.store.snapshot().tables
            now = core.clock.now_ns()
            if mark.index != armed:
                live = [n.id for n in tables.nodes.values() if n.status != NODE_STATUS_DOWN]
                core.heartbeats.initialize(live, now)
                armed = mark.index
            plan = followup(tables, mark, now)
            if plan is None:
                continue
            if not self.still_leader():
                return
            if not plan.empty:
                try:
                    propose_write(
                        core.raft,
                        raft_pb2.ENTRY_TYPE_ALLOC_CLIENT_UPDATE,
                        followup_entry(tables, plan, core.ids, now),
                    )
                except RaftError as exc:
                    log.warning("leader.restore_followup_not_committed", reason=str(exc))
                    continue
            log.info(
                "leader.restore_followed_up",
                restore_index=mark.index,
                lost=len(plan.lost),
                evaluated=len(plan.evaluate),
            )
            done = mark.index

    def _check_invariants(self) -> None:
        """Every INVARIANT_CHECK_S, check the state; violations are logged at ERROR and
        counted in the ``drover_invariant_violations`` gauge."""
        while not self._stop_services.wait(INVARIANT_CHECK_S):
            if not self.still_leader():
                return
            tables = self.core.store.snapshot().tables
            try:
                violations = check_invariants(
                    tables, self.core.restore_watch.mark(), self.core.clock.now_ns()
                )
            except Exception:
                log.exception("leader.invariant_check_failed", index=tables.index)
                continue
            counts = Counter(v.invariant for v in violations)
            for name in INVARIANTS:
                INVARIANT_VIOLATIONS.labels(name).set(counts.get(name, 0))
            for v in violations[:INVARIANT_LOG_LIMIT]:
                log.error(
                    "leader.invariant_violated",
                    invariant=v.invariant,
                    subject=v.subject,
                    violation=v.message,
                    index=tables.index,
                )
            if len(violations) > INVARIANT_LOG_LIMIT:
                log.error("leader.invariant_violations_truncated", total=len(violations), index=tables.index)

    def _tick_broker(self) -> None:
        while not self._stop_services.wait(TICK_S):
            now = self.core.clock.now_ns()
            self.broker.tick(now)
            failed = self.broker.take_failed()
            cancelable = self.broker.take_cancelable()
            if not (failed or cancelable) or not self.still_leader():
                continue
            updates = [
                replace(
                    c, status="canceled", status_description="superseded by a newer eval", modify_time_ns=now
                )
                for c in cancelable
            ]
            for ev in failed:
                follow_up = follow_up_eval(
                    ev,
                    self.core.ids.new(),
                    TRIGGER_FAILED_FOLLOW_UP,
                    now,
                    wait_until_ns=now + FAILED_FOLLOW_UP_DELAY_NS,
                )
                updates.append(
                    replace(
                        ev,
                        status=EVAL_STATUS_FAILED,
                        status_description=f"evaluation reached delivery limit ({self.broker.delivery_limit})",
                        next_eval=follow_up.id,
                        modify_time_ns=now,
                    )
                )
                updates.append(follow_up)
                log.warning(
                    "leader.eval_failed_delivery_limit",
                    eval_id=ev.id,
                    job_id=ev.job_id,
                    follow_up=follow_up.id,
                )
            try:
                write_evals(self._propose, updates)
            except RaftError as exc:
                # Not committed because leadership moved: the evals stay as they were in the
                # state, and the next leader's broker redelivers them.
                log.warning("leader.failed_eval_write_not_committed", reason=str(exc))
            except Exception:
                log.exception("leader.failed_eval_write_failed")
