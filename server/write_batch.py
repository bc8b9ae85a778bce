"""Group commit: writes that reach the leader together go to raft as one entry.

Theory of operation
-------------------
Each write was one raft entry, and pysyncobj sends one append_entries round to every
follower per entry (``appendEntriesUseBatch=False``, tuning.py): at a few hundred
microseconds of pickling, sealing and journalling per round, the leader's tick thread was
the ceiling, not the network. ``WriteBatcher`` keeps at most ``max_in_flight`` entries of
its own between proposal and apply. A write that finds room is proposed at once, on the
caller's thread, alone (a lone write costs what it did). A write that finds none waits in
``pending``; when an in-flight entry is applied, the callback (on raft's tick thread, before
that tick takes new commands) proposes everything pending as one ``ENTRY_TYPE_BATCH`` entry.
So the more writes arrive together, the more each entry carries, and no thread of its own
is added: the caller's thread, raft's tick thread, and the caller woken by its future.

What a batched write reports. Every request of a batch entry reports the batch entry's raft
index: its state is the state at that index, and the store commits the whole batch at
once (server/fsm.py), so a blocking query or ``wait_for_index`` at that index sees every
request of it. Inside the entry the requests apply in the order the leader took them
here (first submitted, first applied), each in its own transaction: one refused request
gets its own error and leaves its neighbours applied, exactly as separate entries at that
index would. Nomad batches its clients' alloc updates into one raft entry the same way
(``Node.UpdateAlloc``): every caller gets that entry's index.

Futures. ``submit`` returns a ``concurrent.futures.Future`` of the request's
``ApplyResult``, so a thread waits with ``result(timeout)`` and a grpc.aio handler awaits
``asyncio.wrap_future``. A future cancelled before its batch is taken is left out (it is
then certainly not written); once taken it can no longer be cancelled.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Final

from drover.server.errors import RaftError
from drover.server.fsm import ApplyResult, BatchApplied, batchable, encode_batch
from drover.server.telemetry.metrics import RAFT_BATCH_REQUESTS

__all__ = ["Append", "Done", "WriteBatcher"]

# What pysyncobj's apply callback is reduced to: the entry's result, or why it failed.
Done = Callable[[ApplyResult | None, BaseException | None], None]
# Appends one encoded entry to the raft log; ``done`` runs once it is applied (or failed),
# on raft's thread or, for an immediate refusal, on the caller's.
Append = Callable[[bytes, Done], None]

DEFAULT_MAX_IN_FLIGHT: Final = 1
DEFAULT_MAX_REQUESTS: Final = 256
# A BatchEntry adds a tag and a length to each request, the LogEntry around it a few bytes.
_PER_REQUEST_OVERHEAD: Final = 6
_ENTRY_OVERHEAD: Final = 16


@dataclass(frozen=True, slots=True)
class _Batch:
    requests: list[_Request]
    # The batcher's generation when the batch took its slot (see ``reset``).
    generation: int


@dataclass(frozen=True, slots=True)
class _Request:
    data: bytes
    future: Future[ApplyResult]
    # False for a snapshot restore: it is proposed as an entry of its own.
    batchable: bool


class WriteBatcher:
    """Combines concurrent writes into raft entries; thread-safe.

    ``max_bytes`` bounds an entry (RaftNode's ``max_entry_bytes``): a request is never
    split, and a request alone is always proposed as it is.
    """

    def __init__(
        self,
        append: Append,
        *,
        max_bytes: int,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_requests: int = DEFAULT_MAX_REQUESTS,
    ) -> None:
        if max_in_flight < 1 or max_requests < 1:
            raise ValueError("max_in_flight and max_requests must be >= 1")
        self._append = append
        self._max_bytes = max_bytes
        self._max_in_flight = max_in_flight
        self._max_requests = max_requests
        self._lock = threading.Lock()
        self._pending: deque[_Request] = deque()
        self._in_flight = 0
        # Bumped by ``reset``: an entry proposed before it no longer holds a slot.
        self._generation = 0

    def submit(self, data: bytes) -> Future[ApplyResult]:
        """Propose ``data`` (one encoded LogEntry) with whatever else is waiting."""
        future: Future[ApplyResult] = Future()
        with self._lock:
            self._pending.append(_Request(data, future, batchable(data)))
            batch = self._take_locked()
        if batch is not None:
            self._propose(batch)
        return future

    def pending(self) -> int:
        """Requests waiting for an in-flight entry to be applied (a gauge)."""
        return len(self._pending)

    def reset(self, error: BaseException) -> None:
        """Leadership changed: fail what waits with ``error`` and free every slot.

        Entries already proposed still answer their callers when raft resolves them (applied,
        or discarded by the new leader's log); they just no longer hold back new ones."""
        with self._lock:
            dropped = list(self._pending)
            self._pending.clear()
            self._in_flight = 0
            self._generation += 1
        for request in dropped:
            _fail(request.future, error)

    # -- internals -------------------------------------------------------------------------
    def _take_locked(self) -> _Batch | None:
        """The next entry's requests if a slot is free (holding the lock); None otherwise."""
        if self._in_flight >= self._max_in_flight:
            return None
        batch: list[_Request] = []
        size = _ENTRY_OVERHEAD
        while self._pending and len(batch) < self._max_requests:
            request = self._pending[0]
            cost = len(request.data) + _PER_REQUEST_OVERHEAD
            if batch and (size + cost > self._max_bytes or not request.batchable):
                break
            self._pending.popleft()
            if not request.future.set_running_or_notify_cancel():
                continue  # its caller gave up before it was taken: never written
            batch.append(request)
            size += cost
            if not request.batchable:
                break
        if not batch:
            return None
        self._in_flight += 1
        return _Batch(batch, self._generation)

    def _propose(self, batch: _Batch) -> None:
        requests = batch.requests
        data = requests[0].data if len(requests) == 1 else encode_batch([r.data for r in requests])
        RAFT_BATCH_REQUESTS.observe(len(requests))

        def done(result: ApplyResult | None, error: BaseException | None) -> None:
            with self._lock:
                if batch.generation == self._generation:
                    self._in_flight -= 1
                following = self._take_locked()
            # The next entry first: raft takes it in this same tick, while callers wake.
            if following is not None:
                self._propose(following)
            _resolve(requests, result, error)

        try:
            self._append(data, done)
        except Exception as exc:  # the append itself failed: free the slot, tell the callers
            done(None, RaftError(f"raft refused the write: {exc}"))


def _resolve(batch: list[_Request], result: ApplyResult | None, error: BaseException | None) -> None:
    if error is not None or result is None:
        for request in batch:
            _fail(request.future, error or RaftError("raft gave no result"))
        return
    if len(batch) == 1:
        _succeed(batch[0].future, result)
        return
    results = result.value.results if isinstance(result.value, BatchApplied) else ()
    if len(results) != len(batch):
        # The batch entry itself was refused (undecodable: a bug), so no request applied.
        for request in batch:
            _succeed(
                request.future, ApplyResult(index=result.index, error=result.error or "batch not applied")
            )
        return
    for request, own in zip(batch, results, strict=True):
        _succeed(request.future, own)


def _succeed(future: Future[ApplyResult], result: ApplyResult) -> None:
    try:
        future.set_result(result)
    except InvalidStateError:  # already resolved (a reset raced the apply)
        pass


def _fail(future: Future[ApplyResult], error: BaseException) -> None:
    try:
        future.set_exception(error)
    except InvalidStateError:
        pass
