"""Which status updates to send, and what to do while the servers cannot hear us.

``PendingUpdates`` coalesces per alloc: only the newest status of an alloc is kept (Nomad's
``pendingUpdates``), so an alloc that changed ten times while the servers were away is
sent once, as it is now. ``take()`` removes the batch to send; ``restore()`` puts a batch
that failed back *under* anything newer that arrived meanwhile.

The pure helpers decide the heartbeat cadence and the ``stop_on_client_after`` deadline.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable, Mapping
from typing import Final

from drover.client.taskstate import AllocStatus

__all__ = [
    "Backoff",
    "PendingUpdates",
    "allocs_to_stop_after_disconnect",
    "heartbeat_interval_s",
    "heartbeat_timeout_s",
]

# Never heartbeat more often than this, whatever TTL a server sends.
MIN_HEARTBEAT_S: Final = 0.05


class PendingUpdates:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, AllocStatus] = {}
        self._changed = threading.Event()

    def put(self, status: AllocStatus) -> None:
        with self._lock:
            self._pending[status.alloc_id] = status
            self._changed.set()

    def discard(self, alloc_id: str) -> None:
        with self._lock:
            self._pending.pop(alloc_id, None)

    def take(self) -> list[AllocStatus]:
        with self._lock:
            batch = list(self._pending.values())
            self._pending.clear()
            self._changed.clear()
            return batch

    def restore(self, batch: Iterable[AllocStatus]) -> None:
        """Put back a batch that was not delivered; newer updates already queued win."""
        with self._lock:
            for status in batch:
                self._pending.setdefault(status.alloc_id, status)
            if self._pending:
                self._changed.set()

    def snapshot(self) -> dict[str, AllocStatus]:
        with self._lock:
            return dict(self._pending)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)


def heartbeat_interval_s(ttl_ns: int, default_ttl_ns: int) -> float:
    """Heartbeat every half TTL: one lost heartbeat still leaves time for the next."""
    ttl = ttl_ns if ttl_ns > 0 else default_ttl_ns
    return max(MIN_HEARTBEAT_S, ttl / 2e9)


def heartbeat_timeout_s(ttl_left_s: float, rpc_timeout_s: float) -> float:
    """How long one heartbeat waits for its answer: the RPC timeout, or longer while the
    TTL the servers last granted leaves room for one more attempt after it.

    A heartbeat that times out is sent again as a new call, which joins the back of the
    server's queue (or goes to another server, which forwards it to the same leader): on a
    leader slow to take calls a short deadline turns every slow answer into a missed
    heartbeat and a retry that adds to the queue, while waiting keeps the call's place and
    the node alive. One RPC timeout of the TTL is kept for a try elsewhere, for a server
    that does not answer at all."""
    return max(rpc_timeout_s, ttl_left_s - rpc_timeout_s)


def allocs_to_stop_after_disconnect(
    now_ns: int, last_heartbeat_ok_ns: int, allocs: Mapping[str, int]
) -> list[str]:
    """The allocs whose group's ``stop_on_client_after`` has passed since the last good
    heartbeat. ``allocs`` maps alloc ID to that duration (0: the group has none)."""
    silent_for = now_ns - last_heartbeat_ok_ns
    return sorted(a for a, after in allocs.items() if after > 0 and silent_for > after)


class Backoff:
    """Exponential backoff with full jitter: ``uniform(base, min(cap, base * 2**n))``."""

    def __init__(self, base_s: float, cap_s: float, rng: random.Random) -> None:
        self._base = base_s
        self._cap = cap_s
        self._rng = rng
        self._attempt = 0

    def next(self) -> float:
        upper = min(self._cap, self._base * (2**self._attempt))
        self._attempt = min(self._attempt + 1, 32)
        return self._rng.uniform(self._base, max(self._base, upper))

    def reset(self) -> None:
        self._attempt = 0
