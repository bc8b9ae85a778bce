"""Scheduling workers: take an eval from the broker, plan, commit through the applier.

A worker is the imperative shell around the pure schedulers: it waits until its state
has caught up with the eval, runs ``compute`` on a snapshot, submits the plan, and on a
partial commit refreshes and plans again, giving up after a bounded number of attempts
that made no progress. Eval status and follow-up evals are written in one raft entry, then
the eval is acked; any failure nacks it (the broker redelivers, then fails it).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Final

import structlog

from drover.scheduler.interfaces import SchedulerContext, SchedulerResult, seed_from
from drover.scheduler.structs import (
    EVAL_STATUS_BLOCKED,
    EVAL_STATUS_CANCELED,
    EVAL_STATUS_FAILED,
    JOB_TYPE_BATCH,
    JOB_TYPE_SERVICE,
    JOB_TYPE_SYSBATCH,
    JOB_TYPE_SYSTEM,
    Evaluation,
)
from drover.server.broker import BrokerDisabledError, EvalBroker
from drover.server.clock import Clock, IdSource
from drover.server.codec import to_proto
from drover.server.fsm import encode_entry
from drover.server.plan_apply import PlanQueue
from drover.server.state_store import Snapshot, StateStore
from drover.server.telemetry.metrics import WORKER_EVALS, WORKER_SCHEDULE_SECONDS
from drover.v1 import raft_pb2

log = structlog.get_logger("drover.worker")

MAX_ATTEMPTS_WITHOUT_PROGRESS: Final = 10
WAIT_FOR_INDEX_S: Final = 5.0
PLAN_RESULT_TIMEOUT_S: Final = 60.0

SchedulerFn = Callable[[Evaluation, Snapshot, SchedulerContext], SchedulerResult]


def scheduler_for(job_type: str) -> SchedulerFn:
    from drover.scheduler.generic import compute_generic
    from drover.scheduler.system import compute_system

    table: dict[str, SchedulerFn] = {
        JOB_TYPE_SERVICE: compute_generic,
        JOB_TYPE_BATCH: compute_generic,
        JOB_TYPE_SYSTEM: compute_system,
        JOB_TYPE_SYSBATCH: compute_system,
    }
    return table[job_type]


def write_evals(propose: Callable[[bytes, float], object], evals: list[Evaluation]) -> None:
    if not evals:
        return
    entry = raft_pb2.EvalUpdateEntry()
    for ev in evals:
        to_proto(ev, entry.evals.add())
    propose(encode_entry(raft_pb2.ENTRY_TYPE_EVAL_UPDATE, entry), 10.0)


def reblocked(ev: Evaluation, result: SchedulerResult) -> SchedulerResult:
    """A released blocked eval that still can not place stays blocked as itself.

    Without this every capacity change would mint a new blocked eval per job.
    """
    if ev.status != EVAL_STATUS_BLOCKED or not result.eval_update.blocked_eval:
        return result
    new_blocked = [e for e in result.created_evals if e.id == result.eval_update.blocked_eval]
    if not new_blocked:
        return result
    update = replace(
        result.eval_update,
        status=EVAL_STATUS_BLOCKED,
        blocked_eval="",
        queued_allocations=new_blocked[0].queued_allocations or result.eval_update.queued_allocations,
    )
    others = tuple(e for e in result.created_evals if e.id != result.eval_update.blocked_eval)
    return replace(result, eval_update=update, created_evals=others)


def _same_eval(update: Evaluation, current: Evaluation) -> bool:
    """Equal but for the bookkeeping a rewrite would change."""
    return (
        replace(
            update,
            modify_time_ns=current.modify_time_ns,
            snapshot_index=current.snapshot_index,
            modify_index=current.modify_index,
            create_index=current.create_index,
        )
        == current
    )


class Worker:
    def __init__(
        self,
        name: str,
        broker: EvalBroker,
        plan_queue: PlanQueue,
        store: StateStore,
        clock: Clock,
        ids: IdSource,
        propose: Callable[[bytes, float], object],
        reblock: Callable[[Evaluation], None] | None = None,
    ) -> None:
        self.name = name
        self._reblock = reblock
        self._broker = broker
        self._plans = plan_queue
        self._store = store
        self._clock = clock
        self._ids = ids
        self._propose = propose
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"worker-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = self._broker.dequeue(self._clock.now_ns(), timeout=0.5)
            except BrokerDisabledError:
                self._stop.wait(0.1)
                continue
            if item is None:
                continue
            ev, token = item
            bound = log.bind(eval_id=ev.id, job_id=ev.job_id, worker=self.name)
            try:
                outcome = self._process(ev, token, bound)
            except Exception as exc:
                WORKER_EVALS.labels(ev.type, "nacked").inc()
                bound.warning("worker.eval_nacked", error=str(exc))
                try:
                    self._broker.nack(ev.id, token, self._clock.now_ns())
                except Exception:
                    pass
                continue
            WORKER_EVALS.labels(ev.type, outcome).inc()
            try:
                cancelled = self._broker.ack(ev.id, token)
            except Exception as exc:
                bound.warning("worker.ack_failed", error=str(exc))
                continue
            if cancelled:
                now = self._clock.now_ns()
                write_evals(
                    self._propose,
                    [
                        replace(
                            c,
                            status=EVAL_STATUS_CANCELED,
                            status_description="superseded by a newer eval",
                            modify_time_ns=now,
                        )
                        for c in cancelled
                    ],
                )

    def _process(self, ev: Evaluation, token: str, bound: structlog.typing.FilteringBoundLogger) -> str:
        """Schedule ``ev`` and write its outcome; the eval status written (the metric's
        ``outcome``: complete, blocked, failed...)."""
        if not self._store.wait_for_index(ev.modify_index, WAIT_FOR_INDEX_S):
            raise TimeoutError(f"state did not reach index {ev.modify_index}")
        scheduler = scheduler_for(ev.type)
        no_progress = 0
        attempts = 0
        while True:
            attempts += 1
            snap = self._store.snapshot()
            seed = seed_from(ev.id, snap.index)
            ctx = SchedulerContext(
                now_ns=self._clock.now_ns(), new_id=self._ids.new, seed=seed, rng=random.Random(seed)
            )
            started = time.perf_counter()
            result = scheduler(ev, snap, ctx)
            WORKER_SCHEDULE_SECONDS.labels(ev.type).observe(time.perf_counter() - started)
            if result.plan is None:
                break
            plan = replace(
                result.plan, eval_id=ev.id, eval_token=token, priority=ev.priority, snapshot_index=snap.index
            )
            outcome = self._plans.enqueue(plan).result(timeout=PLAN_RESULT_TIMEOUT_S)
            if not outcome.rejected_nodes:
                break
            progressed = bool(outcome.node_allocation or outcome.node_update)
            no_progress = 0 if progressed else no_progress + 1
            bound.info("worker.plan_partial", rejected=len(outcome.rejected_nodes), attempt=attempts)
            if no_progress >= MAX_ATTEMPTS_WITHOUT_PROGRESS:
                result = replace(
                    result,
                    eval_update=replace(
                        result.eval_update,
                        status=EVAL_STATUS_FAILED,
                        status_description=f"gave up after {attempts} plan attempts without progress",
                    ),
                )
                bound.warning("worker.eval_failed_no_progress", attempts=attempts)
                break
            self._store.wait_for_index(outcome.refresh_index, WAIT_FOR_INDEX_S)
        result = reblocked(ev, result)
        now = self._clock.now_ns()
        update = replace(result.eval_update, snapshot_index=snap.index, modify_time_ns=now)
        created = [
            e if e.snapshot_index else replace(e, snapshot_index=snap.index) for e in result.created_evals
        ]
        if not created and _same_eval(update, ev) and self._reblock is not None:
            # A released blocked eval that is still blocked for the same reasons: writing it
            # again would only churn the log (every leader change and capacity change), so
            # it goes straight back to the blocked tracker instead.
            self._reblock(update)
            bound.info("worker.eval_unchanged", status=update.status, attempts=attempts)
            return update.status
        write_evals(self._propose, [update, *created])
        bound.info(
            "worker.eval_done", status=update.status, attempts=attempts, created=len(result.created_evals)
        )
        return update.status
