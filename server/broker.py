"""The eval broker: hands pending evaluations to workers, at least once, one job at a time.

Theory of operation
-------------------
Leader only. Evals arrive from the state (every pending eval the FSM writes) and leave when
a worker acks them. Rules:

* Ready evals are served by priority, then age (create index).
* One outstanding eval per job: while a job's eval is with a worker (or ready), later
  evals of that job wait. On ack only the newest waiting eval survives; the others are
  returned to the caller to be written as ``canceled`` (they would redo the same work).
* ``dequeue`` hands out a token; ``ack``/``nack`` must present it. An eval not acked within
  ``nack_timeout`` is nacked. A nacked eval is redelivered after a delay; after
  ``delivery_limit`` deliveries it goes to the ``failed`` queue, from which the leader marks
  it failed and creates a delayed follow-up eval.
* Evals with ``wait_until`` in the future sit in a delay queue until then.

* Paused (the scheduler config's ``pause_eval_broker``), it keeps taking evals in but
  hands none to workers; what was handed out before may still be acked or nacked. Evals
  stay pending in the state meanwhile, and go out in order once it is unpaused.

Time comes in as ``now`` arguments (from an injected clock), so tests drive it directly.
Disabled (on a follower) the broker holds nothing: ``set_enabled(False)`` flushes it, and a
new leader rebuilds it from state.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Final

from drover.scheduler.structs import Evaluation
from drover.server.telemetry.metrics import BROKER_EVALS_FAILED

JobKey = tuple[str, str]

DEFAULT_NACK_TIMEOUT_NS: Final = 60_000_000_000
DEFAULT_DELIVERY_LIMIT: Final = 3
INITIAL_NACK_DELAY_NS: Final = 1_000_000_000
SUBSEQUENT_NACK_DELAY_NS: Final = 20_000_000_000


class BrokerDisabledError(Exception):
    """The broker is off: this server is not (or no longer) the leader."""


class TokenMismatchError(Exception):
    """Ack or nack with a token that is not the eval's current one (it was redelivered)."""


@dataclass(order=True, slots=True)
class _Ready:
    sort_key: tuple[int, int, int]
    ev: Evaluation = field(compare=False)


@dataclass(slots=True)
class _Unacked:
    ev: Evaluation
    token: str
    deadline_ns: int


@dataclass(frozen=True, slots=True)
class BrokerStats:
    ready: int
    unacked: int
    waiting: int
    delayed: int
    failed: int


class EvalBroker:
    def __init__(
        self,
        *,
        nack_timeout_ns: int = DEFAULT_NACK_TIMEOUT_NS,
        delivery_limit: int = DEFAULT_DELIVERY_LIMIT,
        initial_nack_delay_ns: int = INITIAL_NACK_DELAY_NS,
        subsequent_nack_delay_ns: int = SUBSEQUENT_NACK_DELAY_NS,
    ) -> None:
        self.nack_timeout_ns = nack_timeout_ns
        self.delivery_limit = delivery_limit
        self.initial_nack_delay_ns = initial_nack_delay_ns
        self.subsequent_nack_delay_ns = subsequent_nack_delay_ns
        self._cond = threading.Condition()
        self._enabled = False
        self._paused = False
        self._seq = itertools.count()
        self._tokens = itertools.count(1)
        self._reset()

    def _reset(self) -> None:
        self._ready: list[_Ready] = []
        self._unacked: dict[str, _Unacked] = {}
        # The job's eval that is ready or with a worker; others of the job wait.
        self._job_outstanding: dict[JobKey, str] = {}
        self._waiting: dict[JobKey, list[Evaluation]] = {}
        self._delayed: list[tuple[int, int, Evaluation]] = []
        self._deliveries: dict[str, int] = {}
        self._known: set[str] = set()
        self._failed: list[Evaluation] = []
        # Waiting evals made obsolete when their job's eval failed: written as canceled.
        self._cancelable: list[Evaluation] = []
        # Evals enqueued again while a worker still holds them: admitted again on ack.
        self._requeue: dict[str, Evaluation] = {}

    # -- lifecycle ---------------------------------------------------------------------
    def set_enabled(self, enabled: bool) -> None:
        with self._cond:
            self._enabled = enabled
            if not enabled:
                self._reset()
            self._cond.notify_all()

    @property
    def enabled(self) -> bool:
        return self._enabled

    def set_paused(self, paused: bool) -> None:
        """Hold every ready eval back from workers (True) or let them go again (False);
        kept across enable/disable, as it follows the replicated scheduler config."""
        with self._cond:
            self._paused = paused
            self._cond.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused

    # -- intake ------------------------------------------------------------------------
    def enqueue(self, ev: Evaluation, now_ns: int) -> bool:
        """Track ``ev``; False if it is already known (evals arrive once per write)."""
        with self._cond:
            if not self._enabled:
                return False
            if ev.id in self._unacked:
                self._requeue[ev.id] = ev
                return True
            if ev.id in self._known:
                return False
            self._known.add(ev.id)
            if ev.wait_until_ns > now_ns:
                heapq.heappush(self._delayed, (ev.wait_until_ns, next(self._seq), ev))
                return True
            self._admit(ev)
            return True

    def _admit(self, ev: Evaluation) -> None:
        key = (ev.namespace, ev.job_id)
        if ev.job_id and key in self._job_outstanding:
            self._waiting.setdefault(key, []).append(ev)
            return
        if ev.job_id:
            self._job_outstanding[key] = ev.id
        heapq.heappush(self._ready, _Ready((-ev.priority, ev.create_index, next(self._seq)), ev))
        self._cond.notify()

    # -- workers -----------------------------------------------------------------------
    def dequeue(self, now_ns: int, timeout: float) -> tuple[Evaluation, str] | None:
        """The next ready eval and its token, waiting up to ``timeout`` seconds."""
        with self._cond:
            if not self._ready or self._paused:
                self._cond.wait(timeout)
            if not self._enabled:
                raise BrokerDisabledError("eval broker disabled")
            if not self._ready or self._paused:
                return None
            ev = heapq.heappop(self._ready).ev
            token = f"{next(self._tokens)}"
            self._unacked[ev.id] = _Unacked(ev, token, now_ns + self.nack_timeout_ns)
            self._deliveries[ev.id] = self._deliveries.get(ev.id, 0) + 1
            return ev, token

    def outstanding(self, eval_id: str, token: str) -> bool:
        """Whether ``token`` is the live delivery of ``eval_id`` (plans are checked with this)."""
        with self._cond:
            unacked = self._unacked.get(eval_id)
            return unacked is not None and unacked.token == token

    def _check_token(self, eval_id: str, token: str) -> _Unacked:
        unacked = self._unacked.get(eval_id)
        if unacked is None or unacked.token != token:
            raise TokenMismatchError(f"eval {eval_id} is not outstanding with token {token}")
        return unacked

    def ack(self, eval_id: str, token: str) -> list[Evaluation]:
        """Done with ``eval_id``; returns the job's waiting evals made obsolete (to cancel)."""
        with self._cond:
            if not self._enabled:
                raise BrokerDisabledError("eval broker disabled")
            unacked = self._check_token(eval_id, token)
            del self._unacked[eval_id]
            self._deliveries.pop(eval_id, None)
            self._known.discard(eval_id)
            cancelled = self._release_job(unacked.ev)
            again = self._requeue.pop(eval_id, None)
            if again is not None:
                self._known.add(again.id)
                self._admit(again)
            return cancelled

    def _release_job(self, ev: Evaluation) -> list[Evaluation]:
        key = (ev.namespace, ev.job_id)
        if self._job_outstanding.get(key) != ev.id:
            return []
        del self._job_outstanding[key]
        waiting = self._waiting.pop(key, [])
        if not waiting:
            return []
        waiting.sort(key=lambda e: (e.create_index, e.modify_index, e.id))
        newest, cancelled = waiting[-1], waiting[:-1]
        for old in cancelled:
            self._known.discard(old.id)
        self._admit(newest)
        return cancelled

    def nack(self, eval_id: str, token: str, now_ns: int) -> None:
        with self._cond:
            if not self._enabled:
                raise BrokerDisabledError("eval broker disabled")
            unacked = self._check_token(eval_id, token)
            self._requeue_nacked(unacked.ev, now_ns)

    def _requeue_nacked(self, ev: Evaluation, now_ns: int) -> None:
        del self._unacked[ev.id]
        deliveries = self._deliveries.get(ev.id, 0)
        if deliveries >= self.delivery_limit:
            self._deliveries.pop(ev.id, None)
            self._known.discard(ev.id)
            self._failed.append(ev)
            BROKER_EVALS_FAILED.labels(ev.type).inc()
            self._cancelable.extend(self._release_job(ev))
            self._cond.notify_all()
            return
        delay = self.initial_nack_delay_ns if deliveries <= 1 else self.subsequent_nack_delay_ns
        # Redelivered after the delay; it keeps its place as the job's outstanding eval.
        heapq.heappush(self._delayed, (now_ns + delay, next(self._seq), ev))

    def take_failed(self) -> list[Evaluation]:
        """Evals past the delivery limit, for the leader to mark failed with a follow-up."""
        with self._cond:
            failed, self._failed = self._failed, []
            return failed

    def take_cancelable(self) -> list[Evaluation]:
        """Waiting evals superseded when their job's eval failed, to be written as canceled."""
        with self._cond:
            cancelable, self._cancelable = self._cancelable, []
            return cancelable

    # -- time --------------------------------------------------------------------------
    def tick(self, now_ns: int) -> None:
        """Nack what timed out, release what waited long enough."""
        with self._cond:
            if not self._enabled:
                return
            for unacked in [u for u in self._unacked.values() if u.deadline_ns <= now_ns]:
                self._requeue_nacked(unacked.ev, now_ns)
            while self._delayed and self._delayed[0][0] <= now_ns:
                _, _, ev = heapq.heappop(self._delayed)
                key = (ev.namespace, ev.job_id)
                if self._job_outstanding.get(key) == ev.id:
                    # A redelivery: the job slot is still this eval's.
                    heapq.heappush(self._ready, _Ready((-ev.priority, ev.create_index, next(self._seq)), ev))
                    self._cond.notify()
                else:
                    self._admit(ev)

    def untrack(self, eval_id: str) -> None:
        """Forget an eval that became terminal elsewhere (e.g. cancelled by an operator)."""
        with self._cond:
            # A re-enqueue recorded while a worker held it must not bring it back on ack.
            self._requeue.pop(eval_id, None)
            if eval_id not in self._known or eval_id in self._unacked:
                return
            self._known.discard(eval_id)
            self._ready = [r for r in self._ready if r.ev.id != eval_id]
            heapq.heapify(self._ready)
            self._delayed = [d for d in self._delayed if d[2].id != eval_id]
            heapq.heapify(self._delayed)
            for key, evs in list(self._waiting.items()):
                self._waiting[key] = [e for e in evs if e.id != eval_id]
            for key, outstanding in list(self._job_outstanding.items()):
                if outstanding == eval_id:
                    del self._job_outstanding[key]
                    waiting = self._waiting.pop(key, [])
                    if waiting:
                        waiting.sort(key=lambda e: (e.create_index, e.id))
                        self._admit(waiting.pop())
                        for other in waiting:
                            self._waiting.setdefault(key, []).append(other)

    def stats(self) -> BrokerStats:
        with self._cond:
            return BrokerStats(
                ready=len(self._ready),
                unacked=len(self._unacked),
                waiting=sum(len(v) for v in self._waiting.values()),
                delayed=len(self._delayed),
                failed=len(self._failed),
            )

    def counts_by_type(self) -> dict[tuple[str, str], int]:
        """Evals held, by (state, scheduler type): the metrics' breakdown of ``stats``."""
        counts: Counter[tuple[str, str]] = Counter()
        with self._cond:
            counts.update(("ready", r.ev.type) for r in self._ready)
            counts.update(("unacked", u.ev.type) for u in self._unacked.values())
            counts.update(("waiting", ev.type) for evs in self._waiting.values() for ev in evs)
            counts.update(("delayed", ev.type) for _, _, ev in self._delayed)
            counts.update(("failed", ev.type) for ev in self._failed)
        return dict(counts)

    def deliveries(self, eval_id: str) -> int:
        with self._cond:
            return self._deliveries.get(eval_id, 0)
