"""The leader's garbage collector: select (server/gc/select.py), then propose GC entries.

One thread per leadership term, started and stopped with the other leader services
(server/leader.py); ``collect`` is also what ``drover system gc`` calls on the leader, with
every threshold 0. A run and a forced run never interleave (one lock), though they could:
apply keeps anything that changed since it was selected.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from drover.common.duration import parse_duration
from drover.server.clock import Clock
from drover.server.config import ServerConfig
from drover.server.endpoints import Proposer, propose_write
from drover.server.gc.select import Garbage, Thresholds, batches, select_garbage
from drover.server.state_store import StateStore
from drover.v1 import raft_pb2

log = structlog.get_logger("drover.gc")

KINDS = ("evals", "allocs", "jobs", "nodes", "deployments")


@dataclass(frozen=True, slots=True)
class GCSettings:
    thresholds: Thresholds
    interval_ns: int


def gc_settings(cfg: ServerConfig) -> GCSettings:
    """The agent's GC knobs in nanoseconds (server/config.py checked them at load)."""
    return GCSettings(
        thresholds=Thresholds(
            eval_ns=parse_duration(cfg.eval_gc_threshold),
            batch_eval_ns=parse_duration(cfg.batch_eval_gc_threshold),
            job_ns=parse_duration(cfg.job_gc_threshold),
            node_ns=parse_duration(cfg.node_gc_threshold),
            deployment_ns=parse_duration(cfg.deployment_gc_threshold),
        ),
        interval_ns=parse_duration(cfg.gc_interval),
    )


def gc_entry(garbage: Garbage) -> raft_pb2.GCEntry:
    entry = raft_pb2.GCEntry()
    for job in garbage.jobs:
        entry.jobs.add(id=job.job_id, namespace=job.namespace, modify_index=job.modify_index)
    for kind in ("evals", "allocs", "nodes", "deployments"):
        refs = getattr(entry, kind)
        for ref in getattr(garbage, kind):
            refs.add(id=ref.id, modify_index=ref.modify_index)
    return entry


class GarbageCollector:
    def __init__(self, store: StateStore, raft: Proposer, clock: Clock, settings: GCSettings) -> None:
        self._store = store
        self._raft = raft
        self._clock = clock
        self.settings = settings
        self._lock = threading.Lock()

    def collect(self, thresholds: Thresholds) -> tuple[dict[str, int], int]:
        """One run: what was deleted by kind, and the index of the last entry (0: none)."""
        with self._lock:
            garbage = select_garbage(self._store.snapshot(), self._clock.now_ns(), thresholds)
            deleted = dict.fromkeys(KINDS, 0)
            last_index = 0
            for piece in batches(garbage):
                result = propose_write(self._raft, raft_pb2.ENTRY_TYPE_GC, gc_entry(piece))
                last_index = result.index
                for kind, count in (result.value or {}).items():
                    deleted[kind] += count
        if last_index:
            log.info("gc.collected", index=last_index, **deleted)
        return deleted, last_index

    def run(self, still_leader: Callable[[], bool], stop: threading.Event) -> None:
        """Collect every interval while this server leads in the term it started in."""
        while not stop.wait(self.settings.interval_ns / 1e9):
            if not still_leader():
                return
            try:
                self.collect(self.settings.thresholds)
            except Exception as exc:  # leadership moved under a write, or a refused entry
                log.warning("gc.run_failed", reason=str(exc))
