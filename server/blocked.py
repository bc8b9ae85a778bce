"""Blocked evals: evaluations that could not place everything, parked until capacity appears.

One blocked eval per job (per job and node for system jobs, whose evals are per node): a
newer one replaces an older one, which is returned to be cancelled. Any capacity change
(a node became ready or eligible, an alloc stopped or finished, a job was stopped) releases
every blocked eval to the broker. Nomad narrows this by computed node class; we release all,
which is simpler and bounded (one eval per job) at the cost of some extra scheduling passes.
"""

from __future__ import annotations

import threading
from collections import Counter

from drover.scheduler.structs import JOB_TYPE_SYSBATCH, JOB_TYPE_SYSTEM, Evaluation

BlockKey = tuple[str, str, str]


def _key(ev: Evaluation) -> BlockKey:
    node = ev.node_id if ev.type in (JOB_TYPE_SYSTEM, JOB_TYPE_SYSBATCH) else ""
    return (ev.namespace, ev.job_id, node)


class BlockedEvals:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._enabled = False
        self._blocked: dict[BlockKey, Evaluation] = {}
        # The state index of the last capacity change that released blocked evals.
        self._last_unblock_index = 0

    def set_enabled(self, enabled: bool) -> None:
        with self._lock:
            self._enabled = enabled
            self._blocked.clear()
            self._last_unblock_index = 0

    def block(self, ev: Evaluation) -> list[Evaluation]:
        """Park ``ev``; returns an older blocked eval of the same job it replaces (to cancel)."""
        with self._lock:
            if not self._enabled:
                return []
            key = _key(ev)
            old = self._blocked.get(key)
            if old is not None and old.id != ev.id:
                if (old.create_index, old.id) > (ev.create_index, ev.id):
                    return [ev]
                self._blocked[key] = ev
                return [old]
            self._blocked[key] = ev
            return []

    def missed_unblock(self, ev: Evaluation) -> bool:
        """Capacity changed after the eval's snapshot: blocking it now would miss that change."""
        with self._lock:
            return ev.snapshot_index < self._last_unblock_index

    def untrack(self, eval_id: str) -> None:
        with self._lock:
            for key, ev in list(self._blocked.items()):
                if ev.id == eval_id:
                    del self._blocked[key]

    def unblock_all(self, index: int = 0) -> list[Evaluation]:
        """Release every blocked eval (capacity changed at ``index``); the caller enqueues them."""
        with self._lock:
            self._last_unblock_index = max(self._last_unblock_index, index)
            released = list(self._blocked.values())
            self._blocked.clear()
            return released

    def counts_by_type(self) -> dict[tuple[str, str], int]:
        """Blocked evals by ("blocked", scheduler type), as ``EvalBroker.counts_by_type``."""
        with self._lock:
            counts = Counter(("blocked", ev.type) for ev in self._blocked.values())
        return dict(counts)

    def __len__(self) -> int:
        with self._lock:
            return len(self._blocked)
