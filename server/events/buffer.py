"""The bounded buffer of recent events that streams read from, on every server.

Theory of operation
-------------------
The raft apply thread is the one writer: after each entry it calls ``entry_applied``
(derive.py turns the entry's writes into events) and the events of that index go in as one
batch. Subscribers (the ``Events.Stream`` handlers, coroutines on the API loop) read whole
batches from an index on (``read_async``; ``read`` waits on the condition variable in a
thread, for in-process readers), so a stream never splits an index:
having seen index N means having seen every event of N, and a resume from N+1 is exact.

Bounds. The buffer holds at most ``max_events`` events (the ``event_buffer_size`` server
setting, default ``DEFAULT_MAX_EVENTS``), dropping the oldest batches first, but always the
newest whole batch, however large (a 2,000-alloc plan is one batch). ``floor`` is the
highest index whose events may be gone: a stream may start at any index above it, and
asking for one at or below it is ``EventsOutOfRangeError`` naming ``floor + 1``. A
subscriber that falls behind the buffer meets the same error on its next read instead of
holding memory: the buffer keeps nothing per subscriber.

Resets. When the state is replaced wholesale (``Operator.SnapshotRestore``'s entry, a raft
snapshot installed on a lagging follower, the snapshot loaded at start) nothing says which
objects changed, so the buffer empties and its floor moves to the new state's index: every
open stream gets ``EventsOutOfRangeError`` on its next read (it must re-read the state and
subscribe from ``floor + 1``), and new streams start there. At start a server therefore
holds the events of the entries it replays after its snapshot: ``floor`` is the
snapshot's index (0 without one), the same on every server that has not compacted.

A derivation that fails (a bug) resets the buffer at that index too, rather than leave a
silent gap; the FSM's apply is not affected.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Final

import structlog

from drover.server.events._model import Event, EventsOutOfRangeError
from drover.server.events.derive import derive_events
from drover.server.loop_wakers import LoopWakers, woken_within
from drover.server.state_store import Tables

__all__ = ["DEFAULT_MAX_EVENTS", "Batch", "EventBuffer"]

log = structlog.get_logger("drover.events")

# Nomad keeps 100 batches by default (event_buffer_size); drover counts events, so that
# the bound is on memory whatever the size of the entries: 4,096 events are a few
# thousand objects the state already holds (payloads are shared, not copied).
DEFAULT_MAX_EVENTS: Final = 4096

Batch = tuple[int, tuple[Event, ...]]


class EventBuffer:
    """The events of the last applied entries, as batches by raft index; thread-safe."""

    def __init__(self, max_events: int = DEFAULT_MAX_EVENTS) -> None:
        if max_events < 1:
            raise ValueError(f"event_buffer_size: must be >= 1, got {max_events}")
        self.max_events = max_events
        self._changed = threading.Condition(threading.Lock())
        self._batches: deque[Batch] = deque()
        self._count = 0
        # Every event at an index above this is held.
        self._floor = 0
        # The newest index published or reset at: no event at or below it will be added.
        self._newest = 0
        self._closed = False
        # Coroutines waiting in ``read_async``, by the loop they wait on: whatever wakes the
        # condition's waiters sets their events too (on their loop, from the raft thread).
        self._async_waiters = LoopWakers()

    # -- the FSM's side (server/fsm.py), on the raft apply thread ----------------------

    def entry_applied(
        self,
        entry_type: int,
        index: int,
        before: Tables,
        after: Tables,
        written: Mapping[str, Mapping[Any, None]],
    ) -> None:
        try:
            events = derive_events(entry_type, index, before, after, written)
        except Exception:  # a bug: say so, and make the gap an error rather than silent
            log.exception("events.derive_failed", index=index, entry_type=entry_type)
            self.reset(index)
            return
        self.publish(index, events)

    def batch_applied(
        self,
        index: int,
        requests: Sequence[tuple[int, Tables, Tables, Mapping[str, Mapping[Any, None]]]],
    ) -> None:
        """A batch entry's applied requests, each as (entry type, before, after, written),
        in order: their events go in as the one batch of ``index``, so a resume from
        ``index + 1`` still misses nothing of it."""
        try:
            events = [
                event
                for entry_type, before, after, written in requests
                for event in derive_events(entry_type, index, before, after, written)
            ]
        except Exception:  # a bug: say so, and make the gap an error rather than silent
            log.exception("events.derive_failed", index=index, entry_type="batch")
            self.reset(index)
            return
        self.publish(index, events)

    def state_replaced(self, index: int) -> None:
        """The whole state was replaced at ``index`` (see the module docstring)."""
        self.reset(index)

    def publish(self, index: int, events: Sequence[Event]) -> None:
        with self._changed:
            if index <= self._newest:
                # Never expected (entries apply in order); a duplicate would break resumes.
                log.error("events.index_not_increasing", index=index, newest=self._newest)
                return
            self._newest = index
            if not events:
                return
            self._batches.append((index, tuple(events)))
            self._count += len(events)
            while self._count > self.max_events and len(self._batches) > 1:
                dropped_index, dropped = self._batches.popleft()
                self._count -= len(dropped)
                self._floor = dropped_index
            self._changed.notify_all()
            self._async_waiters.wake_all()

    def reset(self, index: int) -> None:
        with self._changed:
            self._batches.clear()
            self._count = 0
            self._floor = max(self._floor, index)
            self._newest = max(self._newest, index)
            self._changed.notify_all()
            self._async_waiters.wake_all()
        log.info("events.buffer_reset", floor=index)

    def close(self) -> None:
        """Wake every waiting reader now: the server is stopping."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            self._async_waiters.wake_all()

    # -- the readers' side ---------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def bounds(self) -> tuple[int, int]:
        """(floor, newest): events above ``floor`` are held; ``newest`` is the last index seen."""
        with self._changed:
            return self._floor, self._newest

    def start_index(self, requested: int) -> int:
        """Where a stream asking for ``requested`` starts: 0 means the next index from now.

        Checked here, so a stream asking for events that are gone fails before it is open."""
        with self._changed:
            if requested == 0:
                return self._newest + 1
            self._check(requested)
            return requested

    def read(self, from_index: int, timeout: float, *, max_events: int = 1024) -> tuple[list[Batch], int]:
        """Whole batches at ``from_index`` and after, waiting up to ``timeout`` for the first;
        and the index the reader has then covered (every event up to it was returned or
        is at an index that made none), so ``covered + 1`` is where it resumes.

        Returns at least one batch if there is any, then more while they fit in
        ``max_events`` (the first batch always goes, however large); no batch on timeout.
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                self._check(from_index)
                if self._batches and self._batches[-1][0] >= from_index:
                    batches = self._collect(from_index, max_events)
                    covered = self._newest if batches[-1] is self._batches[-1] else batches[-1][0]
                    return batches, covered
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    return [], max(from_index - 1, self._newest)
                self._changed.wait(remaining)

    async def read_async(
        self, from_index: int, timeout: float, *, max_events: int = 1024
    ) -> tuple[list[Batch], int]:
        """``read``, as a coroutine: the same answer, with no thread held while it waits, so
        ten thousand open streams cost a server an event each, not a thread each."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        with self._async_waiters.waiting(self._changed) as woken:
            while True:
                # Cleared before the look: a publish landing after it sets the event again.
                woken.clear()
                batches, covered = self.read(from_index, 0.0, max_events=max_events)
                left = deadline - loop.time()
                if batches or left <= 0 or self.closed:
                    return batches, covered
                await woken_within(woken, left)

    def _check(self, from_index: int) -> None:
        if from_index <= self._floor:
            raise EventsOutOfRangeError(
                f"index {from_index} is older than this server's event buffer: the oldest index it can"
                f" stream from is {self._floor + 1} (re-read the state, then stream from there)",
                oldest=self._floor + 1,
            )

    def _collect(self, from_index: int, max_events: int) -> list[Batch]:
        # Readers keep up, so the batches they want are at the end: walk back to the first.
        start = len(self._batches)
        for i in range(len(self._batches) - 1, -1, -1):
            if self._batches[i][0] < from_index:
                break
            start = i
        out: list[Batch] = []
        count = 0
        for i in range(start, len(self._batches)):
            batch = self._batches[i]
            if out and count + len(batch[1]) > max_events:
                break
            out.append(batch)
            count += len(batch[1])
        return out
